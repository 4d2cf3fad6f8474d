"""ggml quantization oracles with gguf-py's call shape.

``quantize(x, qtype)``: float32 rows (..., K) -> uint8 block bytes (..., K/QK*type_size);
``dequantize(data, qtype)``: and back. ``qtype`` is a ggml type name ("Q8_K", "Q8_0") or gguf's
``GGMLQuantizationType``. Each format's rules are in its module (``q8_0``, ``q8_k``) with the
upstream source. ``backend="numba"`` (default, fast) and ``backend="numpy"`` (the readable spec)
are byte-identical; ``ftz=True`` models a device compiled with flush-to-zero.
``vec_dot`` (vec_dot_generic.py) is ggml's generic CPU dot product of a weight row with an activation row;
fused.py builds ``matmul_bt_quant`` and the RMSNorm / SiLU*up -> Q8_K epilogues on it.
"""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any, Callable, Literal, NamedTuple

import numpy as np

from qconform.errors import ArgumentError
from qconform.formats.ggml import FORMATS, BlockFormat
from qconform.oracles.ggml import (
    iq4_nl,
    iq4_xs,
    q2_k,
    q3_k,
    q4_0,
    q4_1,
    q4_k,
    q5_0,
    q5_1,
    q5_k,
    q6_k,
    q8_0,
    q8_1,
    q8_k,
)
from qconform.oracles.ggml.fused import matmul_bt_quant, q8_k_stale_mask, rms_norm_q8_k, silu_mul_q8_k
from qconform.oracles.ggml.vec_dot_generic import PAIRS as VEC_DOT_PAIRS
from qconform.oracles.ggml.vec_dot_generic import vec_dot

Backend = Literal["numba", "numpy"]
Variant = Literal["ref", "chunk"]

_MODULES: dict[str, ModuleType] = {
    "Q8_0": q8_0,
    "Q8_K": q8_k,
    "Q4_0": q4_0,
    "Q4_1": q4_1,
    "Q5_0": q5_0,
    "Q5_1": q5_1,
    "Q8_1": q8_1,
    "IQ4_NL": iq4_nl,
    "IQ4_XS": iq4_xs,
    "Q2_K": q2_k,
    "Q3_K": q3_k,
    "Q4_K": q4_k,
    "Q5_K": q5_k,
    "Q6_K": q6_k,
}

__all__ = [
    "ArrayKind",
    "NUMPY",
    "quantize",
    "dequantize",
    "check_quantize_args",
    "check_dequantize_args",
    "resolve_qtype",
    "vec_dot",
    "VEC_DOT_PAIRS",
    "matmul_bt_quant",
    "rms_norm_q8_k",
    "silu_mul_q8_k",
    "q8_k_stale_mask",
]


def resolve_qtype(qtype: object) -> BlockFormat:
    """A ggml type name or anything with ``.name`` (gguf's enum) -> its BlockFormat."""
    name = getattr(qtype, "name", qtype)
    if not isinstance(name, str) or name.upper() not in _MODULES:
        raise ArgumentError(f"qtype: unsupported ggml type {qtype!r}; supported: {', '.join(sorted(_MODULES))}")
    return FORMATS[name.upper()]


class ArrayKind(NamedTuple):
    """What the argument checks accept: numpy arrays here; the device launchers pass CuPy's."""

    type: type
    type_name: str
    may_share_memory: Callable[[Any, Any], bool]


NUMPY = ArrayKind(np.ndarray, "numpy.ndarray", np.may_share_memory)


def _check_array(name: str, a: object, dtype: np.dtype, kind: ArrayKind = NUMPY) -> Any:
    if not isinstance(a, kind.type):
        raise ArgumentError(f"{name}: must be a {kind.type_name}, got {type(a).__name__}")
    if a.dtype != dtype:
        raise ArgumentError(f"{name}: dtype must be {dtype}, got {a.dtype}")
    if a.ndim < 1:
        raise ArgumentError(f"{name}: must have at least one dimension (rows of values), got a scalar")
    if not a.flags.c_contiguous:
        raise ArgumentError(f"{name}: must be C-contiguous (got strides {a.strides})")
    return a


def _check_out(out: object, shape: tuple[int, ...], dtype: np.dtype, src: Any, kind: ArrayKind) -> None:
    if out is None:
        return
    _check_array("out", out, dtype, kind)
    if out.shape != shape:
        raise ArgumentError(f"out: shape must be {shape}, got {out.shape}")
    if not getattr(out.flags, "writeable", True):
        raise ArgumentError("out: must be writeable")
    if kind.may_share_memory(out, src):
        raise ArgumentError("out: must not overlap the input")


def _check_rows(name: str, a: object, dtype: type, multiple: int, what: str, kind: ArrayKind) -> Any:
    a = _check_array(name, a, np.dtype(dtype), kind)
    n = a.shape[-1]
    if n == 0 or n % multiple:
        raise ArgumentError(f"{name}: the last dimension ({what}) must be a positive multiple of {multiple}, got {n}")
    return a


def check_quantize_args(
    x: object, qtype: object, out: object = None, kind: ArrayKind = NUMPY
) -> tuple[BlockFormat, tuple[int, ...]]:
    """Validate ``quantize`` arguments; return the format and the output shape."""
    fmt = resolve_qtype(qtype)
    what = f"row width; a {fmt.name} block holds {fmt.block_size} values"
    x = _check_rows("x", x, np.float32, fmt.block_size, what, kind)
    shape = (*x.shape[:-1], fmt.n_bytes(x.shape[-1]))
    _check_out(out, shape, np.dtype(np.uint8), x, kind)
    return fmt, shape


def check_dequantize_args(
    data: object, qtype: object, out: object = None, kind: ArrayKind = NUMPY
) -> tuple[BlockFormat, tuple[int, ...]]:
    """Validate ``dequantize`` arguments; return the format and the output shape."""
    fmt = resolve_qtype(qtype)
    what = f"bytes per row; a {fmt.name} block is {fmt.type_size} bytes"
    data = _check_rows("data", data, np.uint8, fmt.type_size, what, kind)
    shape = (*data.shape[:-1], fmt.n_values(data.shape[-1]))
    _check_out(out, shape, np.dtype(np.float32), data, kind)
    return fmt, shape


def quantize(
    x: np.ndarray,
    qtype: object,
    *,
    out: np.ndarray | None = None,
    ftz: bool = False,
    backend: Backend = "numba",
    nudge: tuple[int, int] = (0, 0),
    variant: Variant = "ref",
) -> np.ndarray:
    """Quantize float32 rows to ggml block bytes, bit-exact with ggml's ``quantize_row_*_ref``.
    ``nudge`` (numpy spec only): the block scale's division and reciprocal that many ulp off, as
    an approximate division may return them (the contract's ``division``).
    ``variant="chunk"``: ``ggml_quantize_chunk``'s quantizer (no imatrix) where it is not the ref:
    IQ4_NL's ``quantize_iq4_nl`` (ntry = 7; the ref has ntry = -1)."""
    fmt, shape = check_quantize_args(x, qtype, out)
    mod = _MODULES[fmt.name]
    what = _variant(mod, fmt, variant)
    result = np.empty(shape, np.uint8) if out is None else out
    blocks = fmt.blocks(result)
    values = x.reshape(-1, fmt.block_size)
    if nudge != (0, 0):
        if what != "quantize" or "nudge" not in inspect.signature(mod.quantize_blocks_numpy).parameters:
            raise ArgumentError(f"nudge: not modelled for {fmt.name} (variant {variant!r})")
        mod.quantize_blocks_numpy(values, blocks, ftz, nudge)
    else:
        _pick(mod, what, backend)(values, blocks, ftz)
    return result


def dequantize(
    data: np.ndarray,
    qtype: object,
    *,
    out: np.ndarray | None = None,
    ftz: bool = False,
    backend: Backend = "numba",
) -> np.ndarray:
    """Dequantize ggml block bytes to float32, bit-exact with ggml's ``dequantize_row_*``."""
    fmt, shape = check_dequantize_args(data, qtype, out)
    mod = _MODULES[fmt.name]
    result = np.empty(shape, np.float32) if out is None else out
    _pick(mod, "dequantize", backend)(fmt.blocks(data), result.reshape(-1, fmt.block_size), ftz)
    return result


def _variant(mod: ModuleType, fmt: BlockFormat, variant: str) -> str:
    """The module function family a quantizer variant names: ``quantize`` or ``quantize_chunk``."""
    if variant == "ref":
        return "quantize"
    if variant == "chunk" and hasattr(mod, "quantize_chunk_blocks_numpy"):
        return "quantize_chunk"
    having = sorted(name for name, m in _MODULES.items() if hasattr(m, "quantize_chunk_blocks_numpy"))
    raise ArgumentError(f"variant: must be 'ref', or 'chunk' for {', '.join(having)}; got {variant!r} for {fmt.name}")


def _pick(mod: ModuleType, what: str, backend: str):
    if backend not in ("numba", "numpy"):
        raise ArgumentError(f"backend: must be 'numba' or 'numpy', got {backend!r}")
    return getattr(mod, f"{what}_blocks_{backend}")

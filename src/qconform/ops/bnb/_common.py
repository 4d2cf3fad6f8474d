"""What the bitsandbytes catalogue entries share: the dtypes of their leaves, the argument rules of
their array-level oracles (worded as ``qconform.oracles.bnb`` words them), the conversions to the
output dtype, and the variant a contract selects.

Arrays follow ``qconform.oracles.bnb``: float32, float16, or bfloat16 carried as its uint16 bit
patterns. ``variant`` is the oracle's: "cpu" (the default; bit-exact against bitsandbytes 0.50.2's
CPU backend), "cuda" (csrc built with ``--use_fast_math``), "rocm" (by source only); the catalogue
takes it from the implementation's contract (``--contract variant=cuda``), never from the call.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from qconform.contracts import Contract
from qconform.errors import ArgumentError
from qconform.formats.bf16 import bf16_bits_to_fp32, fp32_to_bf16_bits
from qconform.formats.ftz import F32_MIN_NORMAL
from qconform.ops.spec import Case
from qconform.oracles.bnb import BLOCKSIZES, DTYPES

CARRIER = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": np.dtype(np.uint16)}
QUANT_TYPES = ("nf4", "fp4")
NESTED_BLOCKSIZE = 256  # bitsandbytes nests absmax with blocksize 256 (functional.py quantize_4bit)


def contract_variant(contract: Contract | None) -> str:
    """The bitsandbytes variant a contract selects ("cpu" when it says nothing)."""
    return getattr(contract, "variant", "cpu") or "cpu"


def choice(name: str, value: object, allowed: tuple) -> Any:
    """``value`` must be one of ``allowed`` (no numpy arrays; a bool only where bools are allowed)."""
    bools = any(isinstance(a, bool) for a in allowed)
    if isinstance(value, np.ndarray) or isinstance(value, bool) != bools or value not in allowed:
        raise ArgumentError(f"{name}: must be one of {', '.join(map(repr, allowed))}; got {value!r}")
    return value


def positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ArgumentError(f"{name}: must be a positive int, got {value!r}")
    return int(value)


def input_dtype(name: str, a: object) -> str:
    """The bitsandbytes dtype name of a float array (bfloat16 as uint16 bits or ml_dtypes.bfloat16)."""
    if not isinstance(a, np.ndarray):
        raise ArgumentError(f"{name}: must be a numpy.ndarray, got {type(a).__name__}")
    names = {"float32": "float32", "float16": "float16", "uint16": "bfloat16", "bfloat16": "bfloat16"}
    if a.dtype.name not in names:
        raise ArgumentError(
            f"{name}: dtype must be float32, float16, or bfloat16 (uint16 bit patterns or ml_dtypes.bfloat16), "
            f"got {a.dtype}"
        )
    if a.ndim < 1 or a.size == 0:
        raise ArgumentError(f"{name}: must have at least one dimension and one element, got shape {a.shape}")
    return names[a.dtype.name]


def check_blocksize(blocksize: object) -> int:
    return int(choice("blocksize", blocksize, BLOCKSIZES))


def check_packed(name: str, packed: object, n: int) -> np.ndarray:
    """``packed`` holds the ``n`` nibbles: uint8, ``(n + 1) // 2`` bytes, any shape."""
    if not isinstance(packed, np.ndarray) or packed.dtype != np.uint8:
        raise ArgumentError(f"{name}: must be a uint8 numpy.ndarray, got {getattr(packed, 'dtype', type(packed))}")
    if packed.size != (n + 1) // 2:
        raise ArgumentError(f"{name}: must hold (n + 1) // 2 = {(n + 1) // 2} bytes for {n} values, got {packed.size}")
    return packed


def check_absmax(absmax: object, n: int, blocksize: int) -> np.ndarray:
    """float32 ``(ceil(n / blocksize),)``: one scale per block of the flattened values."""
    nb = -(-n // blocksize)
    if not isinstance(absmax, np.ndarray) or absmax.dtype != np.float32 or absmax.shape != (nb,):
        got = f"{getattr(absmax, 'dtype', type(absmax).__name__)} {getattr(absmax, 'shape', '')}"
        raise ArgumentError(
            f"absmax: must be float32 of shape ({nb},) (one per block of {blocksize} of {n} values), got {got}"
        )
    return absmax


def check_out(out: object, dtype: np.dtype, shape: tuple[int, ...], what: str = "") -> None:
    """``out`` (when given): a C-contiguous array of the output's dtype and shape."""
    if out is None:
        return
    want = f"{'bfloat16 as uint16' if what == 'bfloat16' else dtype.name}{shape}"
    if not isinstance(out, np.ndarray) or out.dtype != dtype or out.shape != shape:
        got = f"{getattr(out, 'dtype', type(out).__name__)}{getattr(out, 'shape', '')}"
        raise ArgumentError(f"out: must be {want} (its dtype and shape), got {got}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ArgumentError(f"out: must be a writeable C-contiguous array, got strides {out.strides}")


def deliver(y: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    if out is None:
        return y
    out[...] = y
    return out


def to_values(a: np.ndarray, dtype: str) -> np.ndarray:
    """A float array of a bitsandbytes dtype -> float32 values (exact)."""
    if dtype == "bfloat16":
        return bf16_bits_to_fp32(np.ascontiguousarray(a).view(np.uint16))
    return np.asarray(a).astype(np.float32)


def from_f32(v: np.ndarray, dtype: str) -> np.ndarray:
    """float32 -> the dtype's carrier, round to nearest even (bfloat16: NaN -> 0x7FC0)."""
    if dtype == "float32":
        return np.asarray(v, np.float32)
    if dtype == "float16":
        with np.errstate(over="ignore", invalid="ignore"):
            return np.asarray(v, np.float32).astype(np.float16)
    return fp32_to_bf16_bits(v, "rne")


def subnormal(v: np.ndarray) -> np.ndarray:
    return (np.abs(v) < F32_MIN_NORMAL) & (v != 0)


def flush_carrier(a: np.ndarray, dtype: str) -> np.ndarray:
    """Inputs as a flush-to-zero device reads them: fp32 / bf16 subnormals become zeros of their sign
    (an fp16 subnormal widens to a normal fp32 and is kept)."""
    if dtype == "float16":
        return a
    v = to_values(a, dtype)
    zero = np.copysign(np.float32(0), v)
    return from_f32(np.where(subnormal(v), zero, v).astype(np.float32), dtype).reshape(a.shape)


__all__ = [
    "CARRIER",
    "DTYPES",
    "NESTED_BLOCKSIZE",
    "QUANT_TYPES",
    "check_absmax",
    "check_blocksize",
    "check_out",
    "check_packed",
    "choice",
    "contract_variant",
    "deliver",
    "flush_carrier",
    "from_f32",
    "input_dtype",
    "positive_int",
    "subnormal",
    "to_values",
]


# (rows, cols, blocksize) of the kernel-shaped core cases of quantize and decode (the first one only
# at coverage 1): 1..64 rows of weights, blocksizes 64..256
CORE_SHAPES = [(4, 128, 64)] + [
    (1, 4096, 64), (2, 2048, 128), (3, 1024, 256), (5, 512, 64), (6, 768, 128),
    (7, 256, 256), (8, 4096, 64), (16, 512, 128), (32, 256, 64), (64, 256, 256),
]  # fmt: skip


def with_shape(case: Case) -> Case:
    """rows and cols in the params (left out of the id): the decoder and locator need n."""
    rows, cols = case.shape
    return Case(case.op, case.leaf, case.seed, case.shape, case.pattern, {**case.params, "rows": rows, "cols": cols})


def shape_strategy(op: str, leaf: str, patterns: tuple[str, ...]) -> Any:
    """Structure and a seed from hypothesis, the values from numpy (docs/device-tooling.md D3)."""
    return st.builds(
        lambda pattern, rows, cols, bs, seed: with_shape(
            Case(op, leaf, seed, (rows, cols), pattern, {"blocksize": bs})
        ),
        pattern=st.sampled_from(patterns),
        rows=st.integers(1, 4),
        cols=st.integers(1, 600),
        bs=st.sampled_from(BLOCKSIZES[:4]),
        seed=st.integers(0, 2**32 - 1),
    )

"""bitsandbytes 4-bit (NF4/FP4) and 8-bit blockwise oracles with bitsandbytes' argument names.

Source: bitsandbytes-foundation/bitsandbytes (0.50.x) bitsandbytes/functional.py ``quantize_4bit``,
``dequantize_4bit``, ``quantize_blockwise``, ``dequantize_blockwise``; the per-backend kernels are named
in ``fourbit``, ``blockwise``, ``codes`` and ``gemm``. The semantics are those of docs/bnb-4bit.md
(sections 2-5); section 7 lists the parameters this module exposes.

Arrays: ``A`` is a numpy float32 or float16 array, or bfloat16 given as its uint16 bit patterns (an
``ml_dtypes.bfloat16`` array is read the same way); bfloat16 results come back as uint16 bit patterns.
``dtype`` arguments are the names "float32", "float16", "bfloat16". Packed 4-bit data is uint8 of shape
``((n + 1) // 2, 1)`` as bitsandbytes returns it (any uint8 array of that size is accepted).

``variant`` picks whose arithmetic is reproduced:
- ``"cpu"``: bitsandbytes' CPU backend on x86-64 without AVX-512: 4-bit quantize is the default (torch)
  path, nested statistics use the C++ 65536-entry LUT quantizer, dequantize the C++ scalar kernel (FP4
  code 8 is -0, bf16 by bit trick), or the default path when the last dimension is odd (code 8 +0).
  Cross-checked bit for bit against bitsandbytes 0.50.2 on CPU in tests/test_upstream_bnb.py.
- ``"cpu-avx512"``: the same backend on a CPU with AVX-512 (and AVX512-BF16): dequantize takes the
  AVX-512 kernel when the last dimension is a multiple of 16 (FP4 code 8 is +0, bf16 by
  ``vcvtneps2bf16``, and absmax indexed per row as ``row*(ncols//bs) + col//bs``, which is wrong for
  ``ncols % bs != 0``), and the default path for blocksize >= 2048. Cross-checked like "cpu" on an
  AVX-512 machine (the tests pick the variant from ``torch.backends.cpu.get_cpu_capability()``).
- ``"default"``: the pure-torch path (no native library): 4-bit as "cpu", nested statistics by
  ``torch.bucketize``, dequantize in torch (code 8 is +0). Its 8-bit quantizer is cross-checked.
- ``"cuda"``: csrc/kernels.cu as built with ``--use_fast_math``: decision trees on the float32 literal
  thresholds, NaN skipped by ``fmaxf``, flush-to-zero, and the reciprocal ``1.0f/absmax`` exact IEEE by
  default or ``rcp.approx.ftz.f32`` through ``rcp_table`` (see ``rcp``). Not run here: it encodes
  behaviour verified bit for bit against bitsandbytes 0.50.2 on an sm_90 GPU; the tail-block absmax
  (padding zeros take part) is read from the source.
- ``"rocm"``: "cuda" without flush-to-zero and with the IEEE reciprocal (HIP builds without fast-math);
  from the source only, unverified on AMD hardware.
Nested statistics (``compress_statistics``): ``offset = mean(absmax)`` is computed by torch with an
order qconform does not model; the oracle uses the float64 mean rounded to float32 unless ``offset`` is
given (pass bitsandbytes' ``quant_state.offset`` to reproduce a state exactly).
``backend="numba"`` (default, fast) and ``"numpy"`` (the readable spec) give identical bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from qconform.errors import ArgumentError
from qconform.formats.bf16 import bf16_bits_to_fp32, fp32_to_bf16_bits
from qconform.formats.fp16 import fp32_to_fp16_bits
from qconform.formats.ftz import flush
from qconform.oracles.bnb import fourbit, gemm
from qconform.oracles.bnb.blockwise import dequantize_blockwise_numpy, quantize_blockwise_numpy
from qconform.oracles.bnb.codes import (
    DYNAMIC_MAP,
    create_dynamic_map,
    get_4bit_type,
    native_4bit_table,
)
from qconform.oracles.bnb.gemm import ORDERS, fma_f32
from qconform.oracles.bnb.rcp import check_rcp_table, load_rcp_table

__all__ = [
    "BLOCKSIZES",
    "DTYPES",
    "QuantState",
    "VARIANTS",
    "create_dynamic_map",
    "dequantize_4bit",
    "dequantize_blockwise",
    "fma_f32",
    "gemm_4bit",
    "gemv_4bit",
    "get_4bit_type",
    "load_rcp_table",
    "nested_absmax",
    "ORDERS",
    "quantize_4bit",
    "quantize_blockwise",
]

Variant = Literal["cpu", "cpu-avx512", "default", "cuda", "rocm"]
Backend = Literal["numba", "numpy"]
VARIANTS = ("cpu", "cpu-avx512", "default", "cuda", "rocm")
DTYPES = ("float32", "float16", "bfloat16")
BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
NESTED_BLOCKSIZE = 256
_BLOCKWISE_VARIANT = {"cpu": "cpu", "cpu-avx512": "cpu", "default": "default", "cuda": "cuda", "rocm": "rocm"}


@dataclass
class QuantState:
    """bitsandbytes' ``QuantState`` as numpy: ``absmax`` is float32 per block, or uint8 codes when
    nested (then ``offset``, ``state2_absmax``, ``state2_code`` and ``state2_blocksize`` are set)."""

    absmax: np.ndarray
    shape: tuple[int, ...]
    dtype: str
    blocksize: int
    code: np.ndarray
    quant_type: str | None = None
    offset: np.float32 | None = None
    state2_absmax: np.ndarray | None = None
    state2_code: np.ndarray | None = field(default=None, repr=False)
    state2_blocksize: int = NESTED_BLOCKSIZE

    @property
    def nested(self) -> bool:
        return self.offset is not None


# ---- argument checks -------------------------------------------------------------------------------


def _choice(name: str, value: object, allowed: tuple) -> None:
    bools_allowed = any(isinstance(a, bool) for a in allowed)
    if isinstance(value, np.ndarray) or isinstance(value, bool) != bools_allowed or value not in allowed:
        raise ArgumentError(f"{name}: must be one of {', '.join(map(repr, allowed))}; got {value!r}")


def _input_dtype(A: object) -> str:
    if not isinstance(A, np.ndarray):
        raise ArgumentError(f"A: must be a numpy.ndarray, got {type(A).__name__}")
    names = {"float32": "float32", "float16": "float16", "uint16": "bfloat16", "bfloat16": "bfloat16"}
    if A.dtype.name not in names:
        raise ArgumentError(
            f"A: dtype must be float32, float16, or bfloat16 (uint16 bit patterns or ml_dtypes.bfloat16), got {A.dtype}"
        )
    if A.ndim < 1 or A.size == 0:
        raise ArgumentError(f"A: must have at least one dimension and one element, got shape {A.shape}")
    return names[A.dtype.name]


def _widen(A: np.ndarray, dtype: str) -> np.ndarray:
    flat = np.ascontiguousarray(A).reshape(-1)
    if dtype == "bfloat16":
        return bf16_bits_to_fp32(flat.view(np.uint16))
    return flat.astype(np.float32)


def _check_common(variant: object, backend: object, rcp_table: object) -> None:
    _choice("variant", variant, VARIANTS)
    _choice("backend", backend, ("numba", "numpy"))
    check_rcp_table(rcp_table)
    if rcp_table is not None and variant != "cuda":
        raise ArgumentError(f"rcp_table: only the 'cuda' variant uses an approximate reciprocal, not {variant!r}")


def _check_state(quant_state: object, four_bit: bool) -> QuantState:
    if not isinstance(quant_state, QuantState):
        raise ArgumentError(f"quant_state: must be a QuantState, got {type(quant_state).__name__}")
    qs = quant_state
    if four_bit:
        _choice("quant_state.blocksize", qs.blocksize, BLOCKSIZES)
        _choice("quant_state.quant_type", qs.quant_type, ("nf4", "fp4"))
    elif isinstance(qs.blocksize, bool) or not isinstance(qs.blocksize, (int, np.integer)) or qs.blocksize <= 0:
        raise ArgumentError(f"quant_state.blocksize: must be a positive int, got {qs.blocksize!r}")
    _choice("quant_state.dtype", qs.dtype, DTYPES)
    if not isinstance(qs.shape, tuple) or len(qs.shape) < 1 or any(int(d) < 0 for d in qs.shape):
        raise ArgumentError(f"quant_state.shape: must be a non-empty tuple of sizes, got {qs.shape!r}")
    n = int(np.prod(qs.shape))
    nb = -(-n // qs.blocksize)
    want = np.uint8 if qs.nested else np.float32
    if not isinstance(qs.absmax, np.ndarray) or qs.absmax.dtype != want or qs.absmax.shape != (nb,):
        what = "uint8 codes (nested)" if qs.nested else "float32"
        got = f"{getattr(qs.absmax, 'dtype', type(qs.absmax).__name__)} {getattr(qs.absmax, 'shape', '')}"
        raise ArgumentError(f"quant_state.absmax: must be {what} of shape ({nb},) for {n} values, got {got}")
    if qs.nested:
        b2 = qs.state2_blocksize
        if isinstance(b2, bool) or not isinstance(b2, (int, np.integer)) or b2 <= 0:
            raise ArgumentError(f"quant_state.state2_blocksize: must be a positive int, got {b2!r}")
        nb2 = -(-nb // b2)
        a2 = qs.state2_absmax
        if not isinstance(a2, np.ndarray) or a2.dtype != np.float32 or a2.shape != (nb2,):
            raise ArgumentError(f"quant_state.state2_absmax: must be float32 of shape ({nb2},) when nested")
        _check_code("quant_state.state2_code", qs.state2_code)
    return qs


def _check_code(name: str, code: object) -> np.ndarray:
    if not isinstance(code, np.ndarray) or code.dtype != np.float32 or code.shape != (256,):
        raise ArgumentError(f"{name}: must be a float32 array of shape (256,), got {getattr(code, 'shape', code)!r}")
    if np.isnan(code).any() or (np.diff(code) < 0).any():
        raise ArgumentError(f"{name}: must be sorted ascending without NaN (every bitsandbytes backend assumes it)")
    return code


def _check_packed(packed: object, n: int, name: str = "packed") -> np.ndarray:
    if not isinstance(packed, np.ndarray) or packed.dtype != np.uint8:
        raise ArgumentError(f"{name}: must be a uint8 numpy.ndarray, got {getattr(packed, 'dtype', type(packed))}")
    if packed.size != (n + 1) // 2:
        raise ArgumentError(f"{name}: must hold (n + 1) // 2 = {(n + 1) // 2} bytes for {n} values, got {packed.size}")
    return np.ascontiguousarray(packed).reshape(-1)


# ---- 8-bit blockwise ------------------------------------------------------------------------------


def quantize_blockwise(
    A: np.ndarray,
    code: np.ndarray | None = None,
    blocksize: int = 4096,
    variant: Variant = "cpu",
    *,
    rcp_table: np.ndarray | None = None,
) -> tuple[np.ndarray, QuantState]:
    """8-bit blockwise quantization (functional.py ``quantize_blockwise``; the code defaults to the
    dynamic map). Returns uint8 codes of ``A.shape`` and the state. Rounding: see ``blockwise``."""
    dtype = _input_dtype(A)
    _check_common(variant, "numpy", rcp_table)
    code = DYNAMIC_MAP if code is None else _check_code("code", code)
    if isinstance(blocksize, bool) or not isinstance(blocksize, (int, np.integer)) or blocksize <= 0:
        raise ArgumentError(f"blocksize: must be a positive int, got {blocksize!r}")
    q, absmax = quantize_blockwise_numpy(_widen(A, dtype), code, int(blocksize), _BLOCKWISE_VARIANT[variant], rcp_table)
    state = QuantState(absmax=absmax, shape=tuple(A.shape), dtype=dtype, blocksize=int(blocksize), code=code.copy())
    return q.reshape(A.shape), state


def dequantize_blockwise(
    A: np.ndarray,
    quant_state: QuantState | None = None,
    absmax: np.ndarray | None = None,
    code: np.ndarray | None = None,
    blocksize: int = 4096,
    dtype: str | None = None,
    variant: Variant = "cpu",
) -> np.ndarray:
    """8-bit blockwise dequantization (functional.py ``dequantize_blockwise``):
    ``T(fl32(code[A_i] * absmax[i // blocksize]))``, flushed to zero on cuda; ``T`` is ``dtype``
    (default the state's, float32 without one), rounded as the variant's kernel rounds."""
    if not isinstance(A, np.ndarray) or A.dtype != np.uint8:
        raise ArgumentError(f"A: must be a uint8 numpy.ndarray, got {getattr(A, 'dtype', type(A).__name__)}")
    _check_common(variant, "numpy", None)
    if quant_state is None:
        if absmax is None:
            raise ArgumentError("absmax: required when quant_state is not given")
        code = DYNAMIC_MAP if code is None else code
        shape = tuple(A.shape) if A.ndim else (1,)
        quant_state = QuantState(absmax, shape, "float32", blocksize, code)
    qs = _check_state(quant_state, four_bit=False)
    _check_code("code", qs.code)
    if A.size != int(np.prod(qs.shape)):
        raise ArgumentError(f"A: must hold {int(np.prod(qs.shape))} codes (quant_state.shape), got {A.size}")
    dtype = qs.dtype if dtype is None else dtype
    _choice("dtype", dtype, DTYPES)
    v = dequantize_blockwise_numpy(A.reshape(-1), qs.absmax, qs.code, qs.blocksize, variant == "cuda")
    rule = {"cpu": "bit_trick", "cpu-avx512": "bit_trick"}.get(variant, "rne")
    return _to_dtype(v, dtype, rule).reshape(A.shape)


# ---- 4-bit ----------------------------------------------------------------------------------------


def quantize_4bit(
    A: np.ndarray,
    blocksize: int = 64,
    compress_statistics: bool = False,
    quant_type: str = "fp4",
    variant: Variant = "cpu",
    *,
    offset: float | None = None,
    rcp_table: np.ndarray | None = None,
    backend: Backend = "numba",
) -> tuple[np.ndarray, QuantState]:
    """4-bit quantization (functional.py ``quantize_4bit``; default quant_type "fp4" as upstream).
    Returns the packed bytes, shape ((n+1)//2, 1), and the state. Rounding: see ``fourbit``; nested
    statistics quantize ``fl32(absmax - offset)`` with the dynamic map at blocksize 256."""
    dtype = _input_dtype(A)
    _choice("blocksize", blocksize, BLOCKSIZES)
    _choice("compress_statistics", compress_statistics, (False, True))
    _choice("quant_type", quant_type, ("nf4", "fp4"))
    _check_common(variant, backend, rcp_table)
    if offset is not None and not compress_statistics:
        raise ArgumentError("offset: only applies with compress_statistics=True")
    x = _widen(A, dtype)
    rule = "cuda" if variant in ("cuda", "rocm") else "cpu"
    quantize = fourbit.quantize_numba if backend == "numba" else fourbit.quantize_numpy
    packed, absmax = quantize(x, int(blocksize), quant_type, rule, variant == "cuda", rcp_table)
    state = QuantState(
        absmax=absmax, shape=tuple(A.shape), dtype=dtype, blocksize=int(blocksize),
        code=get_4bit_type(quant_type), quant_type=quant_type,
    )  # fmt: skip
    if compress_statistics:
        if offset is None:
            offset = np.float32(np.mean(absmax, dtype=np.float64))
        state.offset = np.float32(offset)
        with np.errstate(invalid="ignore", over="ignore"):
            centred = (absmax - state.offset).astype(np.float32)
        q8, absmax2 = quantize_blockwise_numpy(
            centred, DYNAMIC_MAP, NESTED_BLOCKSIZE, _BLOCKWISE_VARIANT[variant], rcp_table
        )
        state.absmax, state.state2_absmax, state.state2_code = q8, absmax2, DYNAMIC_MAP.copy()
    return packed.reshape(-1, 1), state


def nested_absmax(quant_state: QuantState, variant: Variant = "cpu", mode: str = "two_round") -> np.ndarray:
    """The float32 per-block absmax of a state; when nested, ``fl32(fl32(code8[q] * absmax2[j // 256])
    + offset)`` (``two_round``: functional.py ``dequantize_4bit`` and every Python path) or
    ``fmaf(code8[q], absmax2[j // 256], offset)`` (``fma``: the fused CUDA SIMT GEMM)."""
    qs = _check_state(quant_state, four_bit=True)
    _choice("variant", variant, VARIANTS)
    _choice("mode", mode, ("two_round", "fma"))
    if not qs.nested:
        return qs.absmax
    ftz = variant == "cuda"
    if mode == "fma":
        a2 = np.repeat(qs.state2_absmax, qs.state2_blocksize)[: qs.absmax.size]
        return flush(fma_f32(qs.state2_code[qs.absmax.astype(np.int64)], a2, np.float32(qs.offset)), ftz)
    prod = dequantize_blockwise_numpy(qs.absmax, qs.state2_absmax, qs.state2_code, qs.state2_blocksize, ftz)
    with np.errstate(invalid="ignore", over="ignore"):
        return (prod + np.float32(qs.offset)).astype(np.float32)


def _dequantize_path(variant: str, blocksize: int, ncols: int, avx512bf16: bool) -> tuple[str, str, str, bool]:
    """(table: "native" FP4 code 8 -0 or "python" +0, absmax index, bf16 rule, ftz) of the kernel that
    ``variant`` runs for this blocksize and last dimension (backends/cpu/ops.py ``dequantize_4bit``)."""
    if variant in ("cuda", "rocm"):
        return "native", "flat", "rne", variant == "cuda"  # kernels.cu dDequantizeFP4Tree gives -0
    if variant == "default" or ncols % 2 or (variant == "cpu-avx512" and blocksize >= 2048):
        return "python", "flat", "rne", False  # backends/default/ops.py _dequantize_4bit_compute
    if variant == "cpu-avx512" and ncols % 16 == 0:
        return "python", "rows", "cvtne" if avx512bf16 else "rne_ffff", False  # cpu_ops.cpp AVX-512; set_fp4_lut +0
    return "native", "flat", "bit_trick", False  # cpu_ops.cpp scalar branch; fp4_lut has -0


def dequantize_4bit(
    packed: np.ndarray,
    quant_state: QuantState,
    dtype: str | None = None,
    variant: Variant = "cpu",
    *,
    avx512bf16: bool = True,
    backend: Backend = "numba",
) -> np.ndarray:
    """4-bit dequantization (functional.py ``dequantize_4bit``): ``T(fl32(code[q_i] * absmax[block]))``
    with one rounding to ``T`` = ``dtype`` (default the state's) as the variant's kernel rounds; the
    result has ``quant_state.shape`` (bfloat16 as uint16 bits). ``avx512bf16`` ("cpu-avx512" only): the
    CPU has AVX512-BF16, so the AVX-512 kernel narrows to bf16 with ``vcvtneps2bf16``."""
    _check_common(variant, backend, None)
    qs = _check_state(quant_state, four_bit=True)
    dtype = qs.dtype if dtype is None else dtype
    _choice("dtype", dtype, DTYPES)
    n = int(np.prod(qs.shape))
    p = _check_packed(packed, n)
    absmax = nested_absmax(qs, variant)
    ncols = int(qs.shape[-1])
    _choice("avx512bf16", avx512bf16, (False, True))
    which, index, bf16_rule, ftz = _dequantize_path(variant, qs.blocksize, ncols, avx512bf16)
    table = native_4bit_table(qs.quant_type) if which == "native" else get_4bit_type(qs.quant_type)
    dequantize = fourbit.dequantize_numba if backend == "numba" else fourbit.dequantize_numpy
    v = dequantize(p, absmax, qs.blocksize, table, n, max(ncols, 1), index, ftz)
    return _to_dtype(v, dtype, bf16_rule).reshape(qs.shape)


def _to_dtype(v: np.ndarray, dtype: str, bf16_rule: str) -> np.ndarray:
    """float32 -> the output dtype, round to nearest even (fp16 NaN -> sign|0x7E00)."""
    if dtype == "float32":
        return v
    if dtype == "float16":
        return fp32_to_fp16_bits(v).view(np.float16)
    return fp32_to_bf16_bits(v, bf16_rule)


# ---- GEMV / GEMM ----------------------------------------------------------------------------------


def _check_matmul(A: object, B: object, quant_state: object, bias: object, order: object, one_row: bool):
    dtype = _input_dtype(A)
    qs = _check_state(quant_state, four_bit=True)
    _choice("order", order, ORDERS)
    if len(qs.shape) != 2:
        raise ArgumentError(f"quant_state.shape: the weight must be 2-D [N, K] (nn.Linear), got {qs.shape}")
    N, K = (int(d) for d in qs.shape)
    if A.shape[-1] != K:
        raise ArgumentError(f"A: the last dimension must be K = {K} (quant_state.shape[1]), got {A.shape[-1]}")
    if one_row and A.size != K:
        raise ArgumentError(f"A: gemv_4bit takes one row (A.size == K = {K}), got shape {A.shape}")
    if order == "naive_gemv" and K % 32:
        raise ArgumentError(f"quant_state.shape: naive_gemv needs K % 32 == 0 (16-byte row loads), got K = {K}")
    if order == "simt" and K % qs.blocksize:
        raise ArgumentError(f"quant_state.shape: simt needs K % blocksize == 0 ({K} % {qs.blocksize})")
    p = _check_packed(B, N * K, "B")
    if bias is not None:
        if not isinstance(bias, np.ndarray) or _input_dtype_or_none(bias) != dtype or bias.shape != (N,):
            raise ArgumentError(f"bias: must be None or an array of A's dtype ({dtype}) and shape ({N},)")
    return dtype, qs, p, N, K


def _input_dtype_or_none(a: np.ndarray) -> str | None:
    try:
        return _input_dtype(a)
    except ArgumentError:
        return None


def _matmul(A, B, quant_state, bias, order, one_row) -> np.ndarray:
    dtype, qs, p, N, K = _check_matmul(A, B, quant_state, bias, order, one_row)
    a = _widen(A, dtype).reshape(-1, K)
    b = None if bias is None else _widen(bias, dtype)
    fused = nested_absmax(qs, "cuda", "fma") if qs.nested and order == "simt" else None
    absmax = nested_absmax(qs, "cuda" if order != "float64" else "cpu")
    out = gemm.gemm(a, p, absmax, fused, (N, K), qs.blocksize, qs.quant_type, dtype, b, order)
    out = out.reshape(*A.shape[:-1], N)
    if order == "float64":
        return out
    if dtype == "bfloat16":
        return fp32_to_bf16_bits(out, "rne")
    return out.astype(np.float16) if dtype == "float16" else out


def gemv_4bit(
    A: np.ndarray, B: np.ndarray, quant_state: QuantState, bias: np.ndarray | None = None, order: str = "naive_gemv"
) -> np.ndarray:
    """One row ``A`` (size K) times the packed 4-bit weight ``B`` [N, K] (functional.py ``gemv_4bit``):
    the CUDA ``kgemm_4bit_inference_naive`` order by default; see ``gemm`` for the orders and roundings.
    Returns A's dtype (bfloat16 as uint16 bits), or float64 for ``order="float64"``."""
    return _matmul(A, B, quant_state, bias, order, one_row=True)


def gemm_4bit(
    A: np.ndarray, B: np.ndarray, quant_state: QuantState, bias: np.ndarray | None = None, order: str = "simt"
) -> np.ndarray:
    """``A`` [..., K] times the packed 4-bit weight ``B`` [N, K] plus ``bias`` (the ``gemm_4bit`` op that
    ``bnb.matmul_4bit`` calls from 0.50): the CUDA ``gemm_4bit_simt`` order by default; see ``gemm``."""
    return _matmul(A, B, quant_state, bias, order, one_row=False)

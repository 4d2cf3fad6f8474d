"""Fused-epilogue references: a quantized mat-mul, RMSNorm -> Q8_K and SiLU*up -> Q8_K, as ggml's CPU
backend computes the unfused chain of ops, bit for bit.

``matmul_bt_quant``: ggml-org/llama.cpp ggml/src/ggml-cpu/ggml-cpu.c ``ggml_compute_forward_mul_mat``
quantizes each activation row with ``type_traits_cpu[vec_dot_type].from_float`` and makes every output
one ``vec_dot`` of a weight row with an activation row (``vec_dot_generic.py``). The activation quantizer used
here is the reference one: ``quantize_row_q8_K_ref`` for Q8_K on every architecture, and
``quantize_row_q8_0_ref`` / ``quantize_row_q8_1_ref`` for Q8_0 / Q8_1, which is what a build without
SIMD runs (ggml-cpu/quants.c ``quantize_row_q8_0_generic``), the build whose vec_dot is the generic
one. x86 AVX/AVX2 and ARM NEON builds quantize Q8_0/Q8_1 activations with ties to even
(docs/ggml-formats.md 5.1), which differs on exact .5 ties.

``rms_norm_q8_k`` (ggml-cpu/ops.cpp ``ggml_compute_forward_rms_norm_f32``, then ``ggml_mul``):
  sum   = sum over i, in order, of (double)f32(x_i*x_i)      (ggml_float accumulator)
  mean  = (float)(sum / K)                                  (double division, one rounding to fp32)
  scale = f32(1.0f / f32(sqrtf(f32(mean + eps))))
  y_i   = f32(f32(x_i * scale) * gamma_i)                   (ggml_vec_scale_f32, then ggml_mul; the
                                                             CPU's RMS_NORM+MUL fusion computes
                                                             ``x[i00] * scale * w[i00]``, the same value)
``silu_mul_q8_k`` (ggml-cpu/vec.cpp ``ggml_vec_swiglu_f32``, the same values as ``ggml_vec_silu_f32``
then ``ggml_mul``): h_i = f32(silu(g_i) * up_i), silu(x) = f32(x / f32(1 + v_expf(f32(0 - x)))), with
``v_expf`` the vector exp of ggml-cpu/vec.h ``ggml_v_expf`` (rows are multiples of 256 values, so no
element reaches the libm ``expf`` tail). MADD(a, b, c) = a*b + c and NMADD(a, b, c) = c - a*b:
  z = MADD(x, 0x1.715476p+0, 0x1.8p23); n = f32(z - 0x1.8p23)          (n = x*log2(e) rounded to an integer)
  b = NMADD(n, 0x1.7f7d1cp-20, NMADD(n, 0x1.62e4p-1, x)); u = f32(b*b)
  j = MADD(MADD(MADD(C7, b, C6), u, MADD(C4, b, C3)), u, f32(C5*b))     (C3..C7 the polynomial constants)
  |n| <= 126: MADD(k, j, k) with k = 2^n (the bits (bits(z) << 23) + bits(1.0f));
  126 < |n| <= 192: f32(MADD(s2, j, s2) * s1), s1 = 2^-125 and s2 = 2^(n+125) for n <= 0, s1 = 2^127 and
  s2 = 2^(n-127) for n > 0 (so that a tiny or huge 2^n never forms); |n| > 192: f32(s1*s1) = +0 or +inf.
``simd`` picks the build's branch:
  "sse2"   x86-64 without FMA (SSE2 is baseline, so the build that runs the generic vec_dot): ``__m128``
           with MADD128 = f32(f32(a*b) + c), NMADD128 = f32(c - f32(a*b));
  "avx2"   AVX2+FMA (``__m256``), also SSE2 with ``__FMA__`` and AArch64 NEON: the same with every MADD and
           NMADD one fmaf;
  "avx512" AVX512F+DQ: j = fmaf(fmaf(fmaf(C7, b, C6), u, fmaf(C4, b, C3)), u, fmaf(C5, b, 1)), then
           ``_mm512_scalef_ps(j, n)`` = f32(j * 2^n) (one rounding); |n| > 192: +0 (n <= 0) or +inf.
Then, both ops: the fp32 row is stored in ``out_dtype`` ("float32", or "bfloat16" rounded by ggml-impl.h
``ggml_compute_fp32_to_bf16`` = ggml-cpu.c ``ggml_cpu_fp32_to_bf16``: round to nearest even, a NaN keeps
its top 16 bits with the quiet bit set), read back (bf16 -> fp32 is exact) and quantized with
``quantize_row_q8_K_ref`` (q8_k.py; its d is negative when the max-|x| value is positive).
Checked bit for bit (rows, bf16 bits, Q8_K bytes) against ggml's own C: the CPU graph ops
(mul_mat, rms_norm, mul, silu, swiglu, cpy to bf16) of a build without SIMD, and ggml_vec_swiglu_f32
compiled for each ``simd`` branch.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from numba import njit, prange

from qconform.errors import ArgumentError
from qconform.formats.bf16 import bf16_bits_to_fp32, fp32_to_bf16_bits
from qconform.formats.ggml import Q8_K
from qconform.oracles.ggml import q8_0, q8_1, q8_k
from qconform.oracles.ggml.fma import fmaf, fmaf_nb
from qconform.oracles.ggml.vec_dot_generic import check_vec_dot_args, vec_dot, vec_dot_formats

Backend = Literal["numba", "numpy"]
OutDtype = Literal["float32", "bfloat16"]
Simd = Literal["sse2", "avx2", "avx512"]
OUT_DTYPES = ("float32", "bfloat16")
SIMDS = ("sse2", "avx2", "avx512")
_QUANTIZERS = {"Q8_0": q8_0, "Q8_1": q8_1, "Q8_K": q8_k}

# ggml_v_expf's constants (ggml-cpu/vec.h), all exact fp32 values
_R = np.float32(float.fromhex("0x1.8p23"))
_LOG2E = np.float32(float.fromhex("0x1.715476p+0"))
_LN2_HI = np.float32(float.fromhex("0x1.62e4p-1"))
_LN2_LO = np.float32(float.fromhex("0x1.7f7d1cp-20"))
_C3 = np.float32(float.fromhex("0x1.fffdb6p-2"))
_C4 = np.float32(float.fromhex("0x1.555e66p-3"))
_C5 = np.float32(float.fromhex("0x1.ffffecp-1"))
_C6 = np.float32(float.fromhex("0x1.573e2ep-5"))
_C7 = np.float32(float.fromhex("0x1.0e4020p-7"))
ONE = np.float32(1.0)
ZERO = np.float32(0.0)
ONE_BITS = np.uint32(0x3F800000)


def _check_f32_rows(name: str, a: object, multiple: int, what: str) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise ArgumentError(f"{name}: must be a numpy.ndarray, got {type(a).__name__}")
    if a.dtype != np.float32:
        raise ArgumentError(f"{name}: dtype must be float32, got {a.dtype}")
    if a.ndim < 1 or a.shape[-1] == 0 or a.shape[-1] % multiple:
        raise ArgumentError(
            f"{name}: the last dimension ({what}) must be a positive multiple of {multiple}, got shape {a.shape}"
        )
    return np.ascontiguousarray(a)


def _check_common(out_dtype: object, backend: object) -> None:
    if out_dtype not in OUT_DTYPES:
        raise ArgumentError(f"out_dtype: must be one of {', '.join(OUT_DTYPES)}, got {out_dtype!r}")
    if backend not in ("numba", "numpy"):
        raise ArgumentError(f"backend: must be 'numba' or 'numpy', got {backend!r}")


def matmul_bt_quant(
    W_blocks: np.ndarray,
    qtype: object,
    A_fp32: np.ndarray,
    *,
    fma: bool = False,
    backend: Backend = "numba",
) -> np.ndarray:
    """``y[m, n] = vec_dot(W row n, quantize(A row m, vec_dot_type))``: ggml's CPU ``mul_mat(W, A)``
    with the generic vec_dot and the reference activation quantizer (module docstring).

    ``W_blocks``: uint8 (N, nb * type_size(qtype)); ``A_fp32``: float32 (M, nb * block_size). Returns
    float32 (M, N). ``fma`` and ``backend`` as ``vec_dot``."""
    wfmt, afmt = vec_dot_formats(qtype)
    if not isinstance(W_blocks, np.ndarray) or W_blocks.ndim != 2:
        raise ArgumentError(f"W_blocks: must be a 2-D numpy.ndarray (N rows of {wfmt.name} block bytes)")
    if W_blocks.dtype != np.uint8:
        raise ArgumentError(f"W_blocks: dtype must be uint8 ({wfmt.name} block bytes), got {W_blocks.dtype}")
    if not isinstance(A_fp32, np.ndarray) or A_fp32.ndim != 2:
        raise ArgumentError("A_fp32: must be a 2-D numpy.ndarray (M rows of float32 activations)")
    what = f"row width; a {afmt.name} block holds {afmt.block_size} values"
    a = _check_f32_rows("A_fp32", A_fp32, afmt.block_size, what)
    nb = a.shape[1] // afmt.block_size
    if W_blocks.shape[1] != nb * wfmt.type_size:
        raise ArgumentError(
            f"W_blocks: rows must hold {nb} {wfmt.name} blocks ({nb * wfmt.type_size} bytes) to match "
            f"A_fp32's {a.shape[1]} columns, got {W_blocks.shape[1]} bytes"
        )
    check_vec_dot_args(qtype, W_blocks, np.zeros((1, nb * afmt.type_size), np.uint8), fma, backend)
    a_blocks = np.empty((a.shape[0], nb * afmt.type_size), np.uint8)
    mod = _QUANTIZERS[afmt.name]
    quant = mod.quantize_blocks_numpy if backend == "numpy" else mod.quantize_blocks_numba
    quant(a.reshape(-1, afmt.block_size), afmt.blocks(a_blocks), False)
    return vec_dot(qtype, W_blocks[None, :, :], a_blocks[:, None, :], fma=fma, backend=backend)


def _store_reread(y: np.ndarray, out_dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """fp32 -> (the row stored in out_dtype, the fp32 value read back)."""
    if out_dtype == "float32":
        return y, y
    u = y.view(np.uint32)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    bits = np.where(nan, ((u >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16), fp32_to_bf16_bits(y, "bit_trick"))
    return bits.astype(np.uint16), bf16_bits_to_fp32(bits)


def _q8_k(x: np.ndarray, backend: str) -> np.ndarray:
    out = np.empty((*x.shape[:-1], Q8_K.n_bytes(x.shape[-1])), np.uint8)
    quant = q8_k.quantize_blocks_numpy if backend == "numpy" else q8_k.quantize_blocks_numba
    quant(np.ascontiguousarray(x).reshape(-1, Q8_K.block_size), Q8_K.blocks(out), False)
    return out


def q8_k_stale_mask(x: np.ndarray) -> np.ndarray:
    """The bytes of ``quantize(x, "Q8_K")`` that ggml leaves unwritten: True on the 32 ``bsums`` bytes
    of every block whose 256 values are all +-0 or NaN (amax == 0). ggml-quants.c
    ``quantize_row_q8_K_ref`` sets d = 0 and qs = 0 there and ``continue``s before the bsums loop, so
    the C's output holds whatever the buffer held; qconform writes zeros (q8_k.py). Compare a C build
    or a kernel with ``ours[~mask] == theirs[~mask]``, or zero-fill its buffer first.
    ``x``: float32 (..., K), K a multiple of 256; returns bool (..., K / 256 * 292)."""
    x = _check_f32_rows("x", x, Q8_K.block_size, "row width; a Q8_K block holds 256 values")
    blocks = x.reshape(-1, Q8_K.block_size)
    with np.errstate(invalid="ignore"):
        unwritten = ~(np.abs(blocks) > 0).any(axis=1)  # NaN compares false, as in the C's scan
    mask = np.zeros((len(blocks), Q8_K.type_size), bool)
    mask[:, Q8_K.type_size - 32 :] = unwritten[:, None]
    return mask.reshape(*x.shape[:-1], -1)


# ---------------------------------------------------------------- RMSNorm


def _rms_scale_numpy(x: np.ndarray, eps: np.float32) -> np.ndarray:
    sq = np.multiply(x, x, dtype=np.float32).astype(np.float64)
    total = np.cumsum(sq, axis=-1)[..., -1]  # sequential, left to right, in double
    mean = (total / np.float64(x.shape[-1])).astype(np.float32)
    return np.divide(ONE, np.sqrt(np.add(mean, eps, dtype=np.float32)), dtype=np.float32)


@njit(cache=True, parallel=True)
def _rms_norm_nb(x, gamma, eps, y):
    k = x.shape[1]
    for r in prange(x.shape[0]):
        total = 0.0
        for i in range(k):
            total += np.float64(np.float32(x[r, i] * x[r, i]))
        mean = np.float32(total / np.float64(k))
        scale = np.float32(ONE / np.float32(math.sqrt(np.float32(mean + eps))))
        for i in range(k):
            y[r, i] = np.float32(np.float32(x[r, i] * scale) * gamma[i])


def rms_norm_q8_k(
    x: np.ndarray,
    gamma: np.ndarray,
    eps: float,
    out_dtype: OutDtype = "float32",
    *,
    backend: Backend = "numba",
) -> tuple[np.ndarray, np.ndarray]:
    """RMSNorm then multiply by ``gamma``, stored in ``out_dtype``, then that stored row quantized to Q8_K.

    ``x``: float32 (..., K), K a multiple of 256; ``gamma``: float32 (K,); ``eps`` >= 0 (fp32, as ggml's
    op param). Returns (the row: float32, or bfloat16 as uint16 bits; its Q8_K bytes (..., K/256*292)).
    The order and every rounding are in the module docstring (ggml-cpu/ops.cpp
    ``ggml_compute_forward_rms_norm_f32``, binary-ops.cpp ``ggml_compute_forward_mul``)."""
    xs = _check_f32_rows("x", x, Q8_K.block_size, "row width; Q8_K blocks hold 256 values")
    k = xs.shape[-1]
    if not isinstance(gamma, np.ndarray) or gamma.dtype != np.float32 or gamma.shape != (k,):
        raise ArgumentError(f"gamma: must be a float32 numpy.ndarray of shape ({k},), one weight per column of x")
    if not isinstance(eps, (int, float, np.floating)) or not np.float32(eps) >= 0:
        raise ArgumentError(f"eps: must be a number >= 0 (ggml asserts eps >= 0.0f), got {eps!r}")
    _check_common(out_dtype, backend)
    e32 = np.float32(eps)
    g = np.ascontiguousarray(gamma)
    rows = xs.reshape(-1, k)
    with np.errstate(all="ignore"):
        if backend == "numpy":
            scale = _rms_scale_numpy(rows, e32)
            y = np.multiply(np.multiply(rows, scale[:, None], dtype=np.float32), g, dtype=np.float32)
        else:
            y = np.empty_like(rows)
            _rms_norm_nb(rows, g, e32, y)
        stored, back = _store_reread(y.reshape(xs.shape), out_dtype)
    return stored, _q8_k(back, backend)


# ---------------------------------------------------------------- SiLU * up


def _madd(a, b, c, fused: bool):
    """ggml's MADD(a, b, c) = a*b + c: one fmaf under FMA, else two roundings."""
    return fmaf(a, b, c) if fused else np.add(np.multiply(a, b, dtype=np.float32), c, dtype=np.float32)


def _nmadd(a, b, c, fused: bool):
    """ggml's NMADD(a, b, c) = c - a*b."""
    return fmaf(-a, b, c) if fused else np.subtract(c, np.multiply(a, b, dtype=np.float32), dtype=np.float32)


def _f32(u: np.ndarray) -> np.ndarray:
    return u.astype(np.uint32).view(np.float32)


def _v_expf(x: np.ndarray, simd: str) -> np.ndarray:
    """ggml-cpu/vec.h ``ggml_v_expf``, one lane per element (the lanes never mix)."""
    fused = simd != "sse2"
    z = _madd(x, _LOG2E, _R, fused)
    n = np.subtract(z, _R, dtype=np.float32)
    b = _nmadd(n, _LN2_LO, _nmadd(n, _LN2_HI, x, fused), fused)
    u = np.multiply(b, b, dtype=np.float32)
    an = np.abs(n)
    if simd == "avx512":
        j = fmaf(fmaf(fmaf(_C7, b, _C6), u, fmaf(_C4, b, _C3)), u, fmaf(_C5, b, ONE))
        m = np.where(an > 192, 0, np.nan_to_num(n)).astype(np.int64)  # n is integral where it is used
        res = np.ldexp(j.astype(np.float64), m).astype(np.float32)  # _mm512_scalef_ps(j, n): one rounding
        res = np.where(np.isnan(n), np.float32(np.nan), res)
        alt = np.where(n <= 0, ZERO, np.float32(np.inf))
        return np.where(an > 192, alt, res).astype(np.float32)
    e = z.view(np.uint32) << np.uint32(23)
    k = _f32(e + ONE_BITS)
    j = _madd(
        _madd(_madd(_C7, b, _C6, fused), u, _madd(_C4, b, _C3, fused), fused),
        u,
        np.multiply(_C5, b, dtype=np.float32),
        fused,
    )
    g = np.where(n <= 0, np.uint32(0x82000000), np.uint32(0))
    s1 = _f32(g + np.uint32(0x7F000000))
    s2 = _f32(e - g)
    big = np.multiply(s1, s1, dtype=np.float32)
    mid = np.multiply(_madd(s2, j, s2, fused), s1, dtype=np.float32)
    small = _madd(k, j, k, fused)  # the all-small shortcut MADD(j, k, k) is the same value
    return np.where(an > 192, big, np.where(an > 126, mid, small))


def silu_numpy(x: np.ndarray, simd: str) -> np.ndarray:
    """``ggml_v_silu``: x / (1 + v_expf(0 - x)), fp32."""
    with np.errstate(all="ignore"):
        neg = np.subtract(ZERO, x, dtype=np.float32)
        return np.divide(x, np.add(ONE, _v_expf(neg, simd), dtype=np.float32), dtype=np.float32)


@njit(cache=True, inline="always")
def _madd_nb(a, b, c, fused):
    if fused:
        return fmaf_nb(a, b, c)
    return np.float32(np.float32(a * b) + c)


@njit(cache=True, inline="always")
def _nmadd_nb(a, b, c, fused):
    if fused:
        return fmaf_nb(-a, b, c)
    return np.float32(c - np.float32(a * b))


@njit(cache=True, inline="always")
def _v_expf_nb(x, simd):
    """``_v_expf`` of one value (simd 0 = sse2, 1 = avx2, 2 = avx512). The bit tricks are written as
    the powers of two they make for |n| <= 192, where z lies in [2^23, 2^24) and bits(z) << 23 is
    (n mod 512) << 23: k = 2^n (|n| <= 126); s1 = 2^-125, s2 = 2^(n+125) for n <= 0, and s1 = 2^127,
    s2 = 2^(n-127) for n > 0; |n| > 192 gives s1*s1 = +0 or +inf."""
    fused = simd != 0
    z = _madd_nb(x, _LOG2E, _R, fused)
    n = np.float32(z - _R)
    b = _nmadd_nb(n, _LN2_LO, _nmadd_nb(n, _LN2_HI, x, fused), fused)
    u = np.float32(b * b)
    if n != n:
        return np.float32(np.nan)
    if abs(n) > 192:
        return ZERO if n <= 0 else np.float32(np.inf)
    m = int(n)
    if simd == 2:
        j = fmaf_nb(fmaf_nb(fmaf_nb(_C7, b, _C6), u, fmaf_nb(_C4, b, _C3)), u, fmaf_nb(_C5, b, ONE))
        return np.float32(np.float64(j) * math.ldexp(1.0, m))  # _mm512_scalef_ps: one rounding
    j = _madd_nb(
        _madd_nb(_madd_nb(_C7, b, _C6, fused), u, _madd_nb(_C4, b, _C3, fused), fused), u, np.float32(_C5 * b), fused
    )
    if abs(n) > 126:
        if n <= 0:
            s1, s2 = np.float32(2.0**-125), np.float32(math.ldexp(1.0, m + 125))
        else:
            s1, s2 = np.float32(2.0**127), np.float32(math.ldexp(1.0, m - 127))
        return np.float32(_madd_nb(s2, j, s2, fused) * s1)
    k = np.float32(math.ldexp(1.0, m))
    return _madd_nb(k, j, k, fused)


@njit(cache=True, parallel=True)
def _silu_mul_nb(gate, up, simd, h):
    for r in prange(gate.shape[0]):
        for i in range(gate.shape[1]):
            x = gate[r, i]
            s = np.float32(x / np.float32(ONE + _v_expf_nb(np.float32(ZERO - x), simd)))
            h[r, i] = np.float32(s * up[r, i])


def silu_mul_q8_k(
    gate: np.ndarray,
    up: np.ndarray,
    out_dtype: OutDtype = "float32",
    *,
    simd: Simd = "sse2",
    backend: Backend = "numba",
) -> tuple[np.ndarray, np.ndarray]:
    """SiLU(gate) * up, stored in ``out_dtype``, then that stored row quantized to Q8_K.

    ``gate``, ``up``: float32 of one shape (..., K), K a multiple of 256. ``simd`` names the CPU
    build's ``ggml_v_expf`` branch ("sse2", "avx2", "avx512"; module docstring). Returns (the row:
    float32, or bfloat16 as uint16 bits; its Q8_K bytes (..., K/256*292))."""
    g = _check_f32_rows("gate", gate, Q8_K.block_size, "row width; Q8_K blocks hold 256 values")
    if not isinstance(up, np.ndarray) or up.dtype != np.float32 or up.shape != g.shape:
        raise ArgumentError(f"up: must be a float32 numpy.ndarray of gate's shape {g.shape}")
    if simd not in SIMDS:
        raise ArgumentError(f"simd: must be one of {', '.join(SIMDS)}, got {simd!r}")
    _check_common(out_dtype, backend)
    u = np.ascontiguousarray(up)
    with np.errstate(all="ignore"):
        if backend == "numpy":
            h = np.multiply(silu_numpy(g, simd), u, dtype=np.float32)
        else:
            k = g.shape[-1]
            h = np.empty((g.size // k, k), np.float32)
            _silu_mul_nb(g.reshape(-1, k), u.reshape(-1, k), SIMDS.index(simd), h)
            h = h.reshape(g.shape)
        stored, back = _store_reread(h, out_dtype)
    return stored, _q8_k(back, backend)

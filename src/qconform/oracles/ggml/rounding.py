"""The scalar rules ggml's reference C applies, as numpy (spec) and numba (fast) helpers.

Source: ggml-org/ggml src/ggml-quants.c built for x86-64 without FMA (ggml-base gets no -march).
- ``nearest_int(f)`` (ggml-quants.c:621): ``v = f + 12582912.0f`` in fp32, reinterpret as int,
  ``(i & 0x7FFFFF) - 0x400000``: round half to even for |f| < 2^22; +-inf gives -4194304.
  A NaN keeps its payload through the fp32 multiply and add (x86 SSE quiets it by setting bit 22),
  so an input NaN with bits ``b`` gives ``b & 0x3FFFFF``; a NaN the arithmetic creates (0*inf) is
  x86's default NaN 0xFFC00000 and gives 0.
- ``roundf`` (libm): nearest integer, ties away from zero.
- ``(int8_t)float``: gcc emits cvttss2si (32-bit) and keeps the low byte; NaN, +-inf and
  |v| >= 2^31 give INT_MIN, i.e. byte 0.
- ``(int8_t)int``: two's-complement wrap (low byte).
- ftz: flush-to-zero with denormals-are-zero, as CuPy compiles device code on both vendors.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from qconform.formats.ftz import F32_MIN_NORMAL

MAGIC = np.float32(12582912.0)  # 1.5 * 2^23
TWO31 = np.float32(2147483648.0)
JUST_BELOW_HALF = np.nextafter(np.float32(0.5), np.float32(0))


def nearest_int(f: np.ndarray, src: np.ndarray) -> np.ndarray:
    """ggml ``nearest_int`` of fp32 ``f = scale * src`` (src decides the NaN payload) -> int32."""
    f = np.asarray(f, dtype=np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        val = (f + MAGIC).astype(np.float32)
    i = (val.view(np.int32) & 0x7FFFFF) - 0x400000
    src_nan = np.isnan(src)
    payload = np.asarray(src, dtype=np.float32).view(np.int32) & 0x3FFFFF
    i = np.where(np.isnan(f), np.where(src_nan, payload, 0), i)
    return i.astype(np.int32)


def roundf_to_int8(v: np.ndarray) -> np.ndarray:
    """``(int8_t)roundf(v)`` for fp32 ``v`` on x86-64: ties away from zero, then cvttss2si's low byte."""
    v64 = np.asarray(v, dtype=np.float32).astype(np.float64)
    with np.errstate(invalid="ignore"):
        r = np.sign(v64) * np.floor(np.abs(v64) + 0.5)
        ok = np.abs(r) < 2.0**31
    i32 = np.where(ok, np.nan_to_num(r), -(2.0**31)).astype(np.int64)
    return i32.astype(np.int8)  # wraps: keeps the low byte


def int_to_int8(v: np.ndarray) -> np.ndarray:
    """``(int8_t)v`` for an int: two's-complement wrap."""
    return np.asarray(v, dtype=np.int64).astype(np.int8)


@njit(cache=True, inline="always")
def flush_nb(v: np.float32, ftz: bool) -> np.float32:
    if ftz and v != 0 and abs(v) < F32_MIN_NORMAL:
        return np.float32(math.copysign(0.0, v))
    return v


@njit(cache=True, inline="always")
def nearest_int_nb(f: np.float32, src_is_nan: bool, src_bits: np.int32) -> np.int32:
    if f != f:
        if src_is_nan:
            return np.int32(src_bits & np.int32(0x3FFFFF))
        return np.int32(0)
    if math.isinf(f):
        return np.int32(-0x400000)
    val = np.float32(f + MAGIC)
    if abs(f) < np.float32(4194304.0):  # val in [2^23, 2^24): its mantissa is the integer
        return np.int32(val - MAGIC)
    m, e = math.frexp(val)  # |val| = m * 2^e, 0.5 <= m < 1: mantissa field = m*2^24 - 2^23
    mant = np.int64(abs(m) * 16777216.0) - np.int64(8388608)
    return np.int32(mant - 0x400000)


@njit(cache=True, inline="always")
def roundf_to_int8_nb(v: np.float32) -> np.uint8:
    """``(int8_t)roundf(v)`` as its byte, branch-free so loops vectorize: truncating
    ``v + copysign(0.49999997f, v)`` in fp32 is roundf for every float below 2^31 (checked over
    all of them); NaN, inf and |v| >= 2^31 give 0, cvttss2si's INT_MIN low byte."""
    q = np.int32(v + np.float32(math.copysign(JUST_BELOW_HALF, v))) if abs(v) < TWO31 else np.int32(0)
    return np.uint8(q & 0xFF)


CHUNK = 256  # blocks per parallel task: a task per block would cost more than the block


@njit(cache=True, parallel=True)
def scale_blocks_nb(d, qs, y, ftz):
    """``y[i, j] = d[i] * (float)qs[i, j]`` in fp32, per block: the ggml dequantizers of the
    8-bit formats (the C writes ``qs*d`` or ``d*qs``: fp32 multiplication is commutative)."""
    n = qs.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        for i in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
            di = flush_nb(d[i], ftz)
            for j in range(qs.shape[1]):
                y[i, j] = flush_nb(np.float32(di * np.float32(qs[i, j])), ftz)


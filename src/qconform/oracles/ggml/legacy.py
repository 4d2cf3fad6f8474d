"""The 4- and 5-bit block quantizers of 32 values (Q4_0/Q5_0 symmetric, Q4_1/Q5_1 affine): shared rules.

Source: ggml-org/ggml src/ggml-quants.c ``quantize_row_q4_0_ref``, ``quantize_row_q5_0_ref``,
``quantize_row_q4_1_ref``, ``quantize_row_q5_1_ref`` and the ``dequantize_row_*`` of each, built
for x86-64 without FMA (ggml-base gets no -march): every fp32 operation rounds on its own.
- The code of element j is ``(int8_t)(v)`` or ``(uint8_t)(v)`` of an fp32 ``v``: gcc emits
  cvttss2si (truncation toward zero, 32-bit) and keeps the low byte; NaN, +-inf and |v| >= 2^31
  give INT_MIN, whose low byte is 0 (the C leaves them undefined; this is what x86-64 does).
- Nibble order: element j is the low nibble of qs[j], element j+16 its high nibble; Q5 keeps bit 4
  of element j in bit j of the little-endian uint32 ``qh``.
The per-format rules (scale, offset, clamp) are in q4_0, q5_0, q4_1 and q5_1.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from qconform.formats.ftz import flush
from qconform.oracles.ggml.rounding import TWO31, flush_nb

QK = 32
HALF = QK // 2
ONE = np.float32(1.0)
ZERO = np.float32(0.0)
POINT5 = np.float32(0.5)
FLT_MAX = np.float32(np.finfo(np.float32).max)


def trunc_byte(v: np.ndarray) -> np.ndarray:
    """``(int8_t)v`` / ``(uint8_t)v`` of fp32 ``v`` on x86-64, as the byte (0..255, int64):
    truncation toward zero, then the low byte; NaN, +-inf and |v| >= 2^31 give 0."""
    v = np.asarray(v, dtype=np.float32)
    with np.errstate(invalid="ignore"):
        ok = np.abs(v) < TWO31
    return np.trunc(np.where(ok, v, ZERO)).astype(np.int64) & 0xFF


def as_int8(b: np.ndarray) -> np.ndarray:
    """A byte (0..255) read as int8."""
    return (b ^ 0x80) - 0x80


def symmetric_codes(x: np.ndarray, bits: int, ftz: bool) -> tuple[np.ndarray, np.ndarray]:
    """Q4_0 (bits=4) / Q5_0 (bits=5) of (n, 32) float32: fp32 ``d`` (n,) and the codes ``xi``
    (n, 32), the uint8 values the reference packs."""
    half = np.float32(1 << (bits - 1))
    qmax = (1 << bits) - 1
    x = flush(x, ftz)
    a = np.abs(x)
    amax = np.zeros(len(x), np.float32)
    mx = np.zeros(len(x), np.float32)
    for j in range(QK):  # if (amax < fabsf(v)) {amax = fabsf(v); max = v;}: first wins, NaN never
        upd = a[:, j] > amax
        amax = np.where(upd, a[:, j], amax)
        mx = np.where(upd, x[:, j], mx)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        d = flush(mx / -half, ftz)  # max / -8 (-16): +0 gives -0.0
        idd = np.where(d != 0, flush(ONE / np.where(d != 0, d, ONE), ftz), ZERO)
        v = flush(flush(x * idd[:, None], ftz) + (half + POINT5), ftz)  # x*id + 8.5f (16.5f)
    q = np.minimum(qmax, as_int8(trunc_byte(v))) & 0xFF  # MIN(15, (int8_t)v) stored in a uint8_t
    return d, q


def affine_codes(x: np.ndarray, bits: int, clamp: bool, ftz: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_1 (bits=4, clamp) / Q5_1 (bits=5, no clamp) of (n, 32) float32: fp32 ``d`` and ``min``
    (n,) and the codes ``xi`` (n, 32)."""
    nmax = (1 << bits) - 1
    x = flush(x, ftz)
    mn = np.full(len(x), FLT_MAX, np.float32)
    mx = np.full(len(x), -FLT_MAX, np.float32)
    for j in range(QK):  # if (v < min) min = v; if (v > max) max = v;  (first wins, NaN never)
        mn = np.where(x[:, j] < mn, x[:, j], mn)
        mx = np.where(x[:, j] > mx, x[:, j], mx)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        d = flush(flush(mx - mn, ftz) / np.float32(nmax), ftz)
        idd = np.where(d != 0, flush(ONE / np.where(d != 0, d, ONE), ftz), ZERO)
        v = flush(flush(flush(x - mn[:, None], ftz) * idd[:, None], ftz) + POINT5, ftz)  # (x-min)*id + 0.5f
    b = trunc_byte(v)
    q = np.minimum(nmax, as_int8(b)) & 0xFF if clamp else b  # Q4_1: MIN(15, (int8_t)v); Q5_1: (uint8_t)v
    return d, mn, q


def pack_nibbles(q: np.ndarray, bits: int) -> np.ndarray:
    """qs[j] = xi[j] | xi[j+16] << 4 (Q4; a uint8 store) or (xi[j] & 15) | (xi[j+16] & 15) << 4 (Q5)."""
    if bits == 4:
        return ((q[:, :HALF] | (q[:, HALF:] << 4)) & 0xFF).astype(np.uint8)
    return ((q[:, :HALF] & 15) | ((q[:, HALF:] & 15) << 4)).astype(np.uint8)


def pack_qh(q: np.ndarray) -> np.ndarray:
    """qh bit j = bit 4 of xi[j] (Q5)."""
    return (((q >> 4) & 1) << np.arange(QK)).sum(axis=1).astype(np.uint32)


def unpack_codes(qs: np.ndarray, qh: np.ndarray | None) -> np.ndarray:
    """(n, 16) qs (+ (n,) qh for Q5) -> (n, 32) unsigned codes."""
    q = np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.int32)
    if qh is not None:
        q |= ((qh.astype(np.uint32)[:, None] >> np.arange(QK, dtype=np.uint32)) & 1).astype(np.int32) << 4
    return q


def dequantize_symmetric(q: np.ndarray, d: np.ndarray, offset: int, ftz: bool) -> np.ndarray:
    """``y = (float)(q - offset) * d``."""
    with np.errstate(invalid="ignore", over="ignore"):
        return flush((q - offset).astype(np.float32) * flush(d, ftz)[:, None], ftz)


def dequantize_affine(q: np.ndarray, d: np.ndarray, m: np.ndarray, ftz: bool) -> np.ndarray:
    """``y = (float)q * d + m``, a separate multiply and add; a NaN product is the sum (x86's addss
    returns its first operand's NaN when both are NaN)."""
    with np.errstate(invalid="ignore", over="ignore"):
        p = flush(q.astype(np.float32) * flush(d, ftz)[:, None], ftz)
        return np.where(np.isnan(p), p, flush(p + flush(m, ftz)[:, None], ftz))


CHUNK = 512  # blocks per parallel task


@njit(cache=True, inline="always")
def trunc_byte_nb(v):
    """The numba twin of ``trunc_byte`` for one fp32 value."""
    t = np.int32(v) if abs(v) < TWO31 else np.int32(0)
    return t & 0xFF


@njit(cache=True, inline="always")
def _symmetric_code(v, idd, bias, qmax, ftz):
    """MIN(qmax, (int8_t)(x*id + bias)) as the stored uint8."""
    p = flush_nb(np.float32(flush_nb(v, ftz) * idd), ftz)
    b = trunc_byte_nb(flush_nb(np.float32(p + bias), ftz))
    return min(qmax, (b ^ 0x80) - 0x80) & 0xFF


@njit(cache=True, inline="always")
def _affine_code(v, mn, idd, nmax, clamp, ftz):
    """MIN(nmax, (int8_t)((x-min)*id + 0.5f)) (Q4_1), or (uint8_t)((x-min)*id + 0.5f) (Q5_1)."""
    s = flush_nb(np.float32(flush_nb(v, ftz) - mn), ftz)
    p = flush_nb(np.float32(s * idd), ftz)
    b = trunc_byte_nb(flush_nb(np.float32(p + POINT5), ftz))
    return min(nmax, (b ^ 0x80) - 0x80) & 0xFF if clamp else b


@njit(cache=True, inline="always")
def _store_nibbles(raw, i, off, bits, j, q0, q1):
    if bits == 4:
        raw[i, off + j] = np.uint8((q0 | (q1 << 4)) & 0xFF)
    else:
        raw[i, off + j] = np.uint8((q0 & 15) | ((q1 & 15) << 4))


@njit(cache=True, inline="always")
def _store_qh(raw, i, off, qh):
    for k in range(4):
        raw[i, off + k] = np.uint8((qh >> (8 * k)) & 0xFF)


@njit(cache=True, inline="always")
def symmetric_scale_nb(x, i, half, ftz):
    """(d, 1/d) of block i: the reference's first strict max of |x| (a NaN never wins), d =
    max / -half, and 0 for 1/d when d is 0."""
    amax = ZERO
    mx = ZERO
    for j in range(QK):
        v = flush_nb(x[i, j], ftz)
        if abs(v) > amax:
            amax = abs(v)
            mx = v
    d = flush_nb(np.float32(mx / -half), ftz)
    return d, (flush_nb(np.float32(ONE / d), ftz) if d != 0 else ZERO)


@njit(cache=True, parallel=True)
def symmetric_nb(x, raw, d_out, bits, qs_off, ftz):
    """Q4_0/Q5_0 into ``raw`` (n, type_size) bytes, qh at 2 for Q5; fp32 d into ``d_out``."""
    n = x.shape[0]
    half = np.float32(1 << (bits - 1))
    bias = np.float32(half + POINT5)
    qmax = (1 << bits) - 1
    for c in prange((n + CHUNK - 1) // CHUNK):
        for i in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
            d, idd = symmetric_scale_nb(x, i, half, ftz)
            qh = 0
            for j in range(HALF):
                q0 = _symmetric_code(x[i, j], idd, bias, qmax, ftz)
                q1 = _symmetric_code(x[i, j + HALF], idd, bias, qmax, ftz)
                _store_nibbles(raw, i, qs_off, bits, j, q0, q1)
                qh |= (((q0 >> 4) & 1) << j) | (((q1 >> 4) & 1) << (j + HALF))
            if bits == 5:
                _store_qh(raw, i, 2, qh)
            d_out[i] = d


@njit(cache=True, parallel=True)
def affine_nb(x, raw, d_out, m_out, bits, clamp, qs_off, ftz):
    """Q4_1/Q5_1 into ``raw`` (n, type_size) bytes, qh at 4 for Q5; fp32 d and min into the outs."""
    n = x.shape[0]
    nmax = (1 << bits) - 1
    for c in prange((n + CHUNK - 1) // CHUNK):
        for i in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
            mn = FLT_MAX
            mx = -FLT_MAX
            for j in range(QK):
                v = flush_nb(x[i, j], ftz)
                if v < mn:
                    mn = v
                if v > mx:
                    mx = v
            d = flush_nb(np.float32(flush_nb(np.float32(mx - mn), ftz) / np.float32(nmax)), ftz)
            idd = flush_nb(np.float32(ONE / d), ftz) if d != 0 else ZERO
            qh = 0
            for j in range(HALF):
                q0 = _affine_code(x[i, j], mn, idd, nmax, clamp, ftz)
                q1 = _affine_code(x[i, j + HALF], mn, idd, nmax, clamp, ftz)
                _store_nibbles(raw, i, qs_off, bits, j, q0, q1)
                qh |= (((q0 >> 4) & 1) << j) | (((q1 >> 4) & 1) << (j + HALF))
            if bits == 5:
                _store_qh(raw, i, 4, qh)
            d_out[i] = d
            m_out[i] = mn


@njit(cache=True, parallel=True)
def dequantize_nb(qs, qh, d, m, y, offset, affine, ftz):
    """The dequantizers: ``(float)(q - offset) * d``, or ``(float)q * d + m`` when ``affine``;
    ``qh`` (n,) uint32 holds bit 4 of each code (zeros for Q4)."""
    n = qs.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        for i in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
            di = flush_nb(d[i], ftz)
            mi = flush_nb(m[i], ftz)
            h = np.int64(qh[i])
            for j in range(HALF):
                for t in range(2):
                    e = j + HALF * t
                    q = ((np.int64(qs[i, j]) >> (4 * t)) & 15) | (((h >> e) & 1) << 4)
                    if affine:
                        p = flush_nb(np.float32(np.float32(q) * di), ftz)
                        y[i, e] = p if p != p else flush_nb(np.float32(p + mi), ftz)
                    else:
                        y[i, e] = flush_nb(np.float32(np.float32(q - offset) * di), ftz)

"""IQ4_NL: 32 values -> fp16 ``d`` + 32 4-bit indices into the non-linear table ``kvalues_iq4nl``.

Source: ggml-org/ggml src/ggml-quants.c ``quantize_row_iq4_nl_impl`` (shared with IQ4_XS, which
imports it from here), ``quantize_row_iq4_nl_ref`` (``ntry = -1``), ``quantize_iq4_nl``
(``ntry = 7``), ``best_index_int8`` and ``dequantize_row_iq4_nl``; src/ggml-common.h
``kvalues_iq4nl``. Without quant_weights (imatrix), all fp32 (no FMA):
  best_index(v): 0 if v <= kv[0]; 15 if v >= kv[15]; else a binary search (ml=0, mu=15; while
                 mu-ml > 1: mav = (ml+mu)/2; v < kv[mav] ? mu=mav : ml=mav), then
                 mu-1 if (v - kv[mu-1]) < (kv[mu] - v) else mu     (ties go up; a NaN gives 15)
  per 32-value sub-block: w[j] = x[j]*x[j]; first strict max (amax, signed max)
    amax < 1e-15f: scale 0, L not written
    d = ntry > 0 ? -max/-127 : max/-127; id = 1/d
    L[j] = best_index(id*x[j]); q = kv[L[j]]; sumqx += (w*q)*x[j]; sumq2 += (w*q)*q  (in order)
    d = sumq2 > 0 ? sumqx/sumq2 : 0; best = d*sumqx
    for itry = -ntry..ntry: id = (float)(itry - 127)/max; the sums again (L not stored);
                            if sumq2 > 0 && sumqx*sumqx > best*sumq2: d = sumqx/sumq2; best = d*sumqx
  IQ4_NL: d stored as fp16; ntry > 0 recomputes L[j] = best_index(id*x[j]), id = d ? 1/d : 0
  qs[j] = L[j] | L[j+16] << 4
ggml's two quantizers differ: ``variant="ref"`` is ``quantize_row_iq4_nl_ref`` (the CPU backend's
from_float, ``ntry = -1``: the itry loop is empty and L comes from the first pass);
``variant="chunk"`` is ``quantize_iq4_nl`` (what ``ggml_quantize_chunk``, llama-quantize and
test-backend-ops use, ``ntry = 7``).
A NaN scale only ever comes from an invalid operation, inf/inf (an inf input, or |x| above ~1.5e17
overflowing both sums; a NaN input makes sumq2 NaN and so d = 0): it is x86's default NaN,
0xFFC00000, so d stores as 0xFE00.
The ref leaves the qs of a block with amax < 1e-15 unwritten (ggml reuses the previous block's L,
uninitialised for a row's first block); qconform requires what ``quantize_iq4_nl`` writes there,
best_index(0*x[j]): 8 (0x88 bytes), or 15 for a NaN.
Dequantize: y = fp16_to_fp32(d) * (float)kv[index].
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from qconform.formats.fp16 import fp16_bits_to_fp32, fp32_to_fp16_bits
from qconform.formats.ftz import flush
from qconform.formats.ggml import IQ4_NL
from qconform.oracles.ggml.rounding import flush_nb

QK = IQ4_NL.block_size
KVALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)
KV = KVALUES.astype(np.float32)
EPS = np.float32(1e-15)  # GROUP_MAX_EPS
M127 = np.float32(-127.0)  # (float)kvalues_iq4nl[0]
ONE = np.float32(1.0)
ZERO = np.float32(0.0)
X86_DEFAULT_NAN = np.array([0xFFC00000], np.uint32).view(np.float32)[0]
NTRY = {"ref": -1, "chunk": 7}


def best_index(v: np.ndarray) -> np.ndarray:
    """ggml ``best_index_int8(16, kvalues_iq4nl, v)`` elementwise on fp32 ``v`` -> int64 indices.
    (``v - kv`` is never subnormal -- kv are nonzero integers -- so it needs no ftz flush.)"""
    v = np.asarray(v, dtype=np.float32)
    ml = np.zeros(v.shape, np.int64)
    mu = np.full(v.shape, 15, np.int64)
    while (open_ := mu - ml > 1).any():
        mav = (ml + mu) // 2
        below = v < KV[mav]
        mu = np.where(open_ & below, mav, mu)
        ml = np.where(open_ & ~below, mav, ml)
    with np.errstate(invalid="ignore"):
        lower = (v - KV[mu - 1]) < (KV[mu] - v)
        idx = np.where(lower, mu - 1, mu)
        return np.where(v <= KV[0], 0, np.where(v >= KV[15], 15, idx))


def _sums(x: np.ndarray, w: np.ndarray, idx: np.ndarray, ftz: bool) -> tuple[np.ndarray, np.ndarray]:
    """sumqx += w*q*x, sumq2 += w*q*q over the 32 values in order; (m, 32) -> two (m,)."""
    q = KV[idx]
    sumqx = np.zeros(len(x), np.float32)
    sumq2 = np.zeros(len(x), np.float32)
    for j in range(x.shape[1]):
        wq = flush(w[:, j] * q[:, j], ftz)
        sumqx = flush(sumqx + flush(wq * x[:, j], ftz), ftz)
        sumq2 = flush(sumq2 + flush(wq * q[:, j], ftz), ftz)
    return sumqx, sumq2


def subblock_scales(x: np.ndarray, ntry: int, ftz: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The per-sub-block search of ``quantize_row_iq4_nl_impl`` on (m, 32) flushed values:
    the scales (m,), the first pass's L (m, 32) and which sub-blocks have amax < 1e-15."""
    a = np.abs(x)
    amax = np.zeros(len(x), np.float32)
    mx = np.zeros(len(x), np.float32)
    for j in range(x.shape[1]):  # first strict max; NaN compares false and never wins
        upd = a[:, j] > amax
        amax = np.where(upd, a[:, j], amax)
        mx = np.where(upd, x[:, j], mx)
    small = amax < EPS
    mx = np.where(small, ONE, mx)  # those rows' results are discarded below
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        w = flush(x * x, ftz)
        d = flush((-mx if ntry > 0 else mx) / M127, ftz)
        idd = flush(ONE / d, ftz)
        first = best_index(flush(idd[:, None] * x, ftz))
        sumqx, sumq2 = _sums(x, w, first, ftz)
        d = np.where(sumq2 > 0, flush(sumqx / sumq2, ftz), ZERO)
        best = flush(d * sumqx, ftz)
        for itry in range(-ntry, ntry + 1):
            idd = flush(np.float32(itry - 127) / mx, ftz)
            sqx, sq2 = _sums(x, w, best_index(flush(idd[:, None] * x, ftz)), ftz)
            better = (sq2 > 0) & (flush(sqx * sqx, ftz) > flush(best * sq2, ftz))
            d = np.where(better, flush(sqx / sq2, ftz), d)
            best = np.where(better, flush(d * sqx, ftz), best)
    d = np.where(small, ZERO, np.where(np.isnan(d), X86_DEFAULT_NAN, d))
    return d.astype(np.float32), first, small


def pack_indices(idx: np.ndarray) -> np.ndarray:
    """(m, 32) indices -> (m, 16) bytes: L[j] | L[j+16] << 4."""
    return (idx[:, :16] | (idx[:, 16:] << 4)).astype(np.uint8)


def _quantize_numpy(x: np.ndarray, out: np.ndarray, ftz: bool, ntry: int) -> None:
    x = flush(x, ftz)
    d, idx, small = subblock_scales(x, ntry, ftz)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        idd = np.where(d != 0, flush(ONE / np.where(d != 0, d, ONE), ftz), ZERO)  # 0 for the small ones
        again = best_index(flush(idd[:, None] * x, ftz))
    redo = small if ntry < 0 else np.ones(len(x), bool)
    idx = np.where(redo[:, None], again, idx)
    out["d"] = fp32_to_fp16_bits(d)
    out["qs"] = pack_indices(idx)


def quantize_blocks_numpy(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 32) float32 -> ``out``, (n,) IQ4_NL structs: ``quantize_row_iq4_nl_ref``. The readable spec."""
    _quantize_numpy(x, out, ftz, NTRY["ref"])


def quantize_chunk_blocks_numpy(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 32) float32 -> ``out``, (n,) IQ4_NL structs: ``quantize_iq4_nl`` (ntry = 7). The readable spec."""
    _quantize_numpy(x, out, ftz, NTRY["chunk"])


def dequantize_blocks_numpy(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    """(n,) IQ4_NL structs -> ``y``, (n, 32) float32."""
    qs = blocks["qs"]
    idx = np.concatenate([qs & 15, qs >> 4], axis=1)
    d = flush(fp16_bits_to_fp32(blocks["d"]), ftz)
    with np.errstate(invalid="ignore", over="ignore"):
        y[...] = flush(d[:, None] * KV[idx], ftz)


CHUNK = 64  # blocks per parallel task


@njit(cache=True, inline="always")
def best_index_nb(v):
    """The numba twin of ``best_index`` for one fp32 value."""
    if v <= KV[0]:
        return 0
    if v >= KV[15]:
        return 15
    ml, mu = 0, 15
    while mu - ml > 1:
        mav = (ml + mu) // 2
        if v < KV[mav]:
            mu = mav
        else:
            ml = mav
    return mu - 1 if np.float32(v - KV[mu - 1]) < np.float32(KV[mu] - v) else mu


@njit(cache=True, inline="always")
def _pass_nb(xb, idd, L, store, ftz):
    """One pass over a sub-block at ``id``: (sumqx, sumq2), the indices into ``L`` if ``store``."""
    sumqx = ZERO
    sumq2 = ZERO
    for j in range(xb.shape[0]):
        v = xb[j]
        w = flush_nb(np.float32(v * v), ftz)
        k = best_index_nb(flush_nb(np.float32(idd * v), ftz))
        if store:
            L[j] = k
        q = KV[k]
        wq = flush_nb(np.float32(w * q), ftz)
        sumqx = flush_nb(np.float32(sumqx + flush_nb(np.float32(wq * v), ftz)), ftz)
        sumq2 = flush_nb(np.float32(sumq2 + flush_nb(np.float32(wq * q), ftz)), ftz)
    return sumqx, sumq2


@njit(cache=True)
def subblock_scale_nb(xb, L, ntry, ftz):
    """The numba twin of ``subblock_scales`` for one sub-block of flushed values ``xb`` (32,):
    returns (scale, small) and writes the first pass's indices into ``L`` unless small."""
    amax = ZERO
    mx = ZERO
    for j in range(xb.shape[0]):
        if abs(xb[j]) > amax:
            amax = abs(xb[j])
            mx = xb[j]
    if amax < EPS:
        return ZERO, True
    d = flush_nb(np.float32((-mx if ntry > 0 else mx) / M127), ftz)
    idd = flush_nb(np.float32(ONE / d), ftz)
    sumqx, sumq2 = _pass_nb(xb, idd, L, True, ftz)
    d = flush_nb(np.float32(sumqx / sumq2), ftz) if sumq2 > 0 else ZERO
    best = flush_nb(np.float32(d * sumqx), ftz)
    for itry in range(-ntry, ntry + 1):
        idd = flush_nb(np.float32(np.float32(itry - 127) / mx), ftz)
        sqx, sq2 = _pass_nb(xb, idd, L, False, ftz)
        if sq2 > 0 and flush_nb(np.float32(sqx * sqx), ftz) > flush_nb(np.float32(best * sq2), ftz):
            d = flush_nb(np.float32(sqx / sq2), ftz)
            best = flush_nb(np.float32(d * sqx), ftz)
    if d != d:
        d = X86_DEFAULT_NAN
    return d, False


@njit(cache=True, parallel=True)
def _quantize_nb(x, raw, d_out, ntry, ftz):
    n = x.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        xb = np.empty(QK, np.float32)
        L = np.empty(QK, np.int64)
        for i in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
            for j in range(QK):
                xb[j] = flush_nb(x[i, j], ftz)
            d, small = subblock_scale_nb(xb, L, ntry, ftz)
            if small or ntry > 0:
                idd = flush_nb(np.float32(ONE / d), ftz) if d != 0 else ZERO
                for j in range(QK):
                    L[j] = best_index_nb(flush_nb(np.float32(idd * xb[j]), ftz))
            for j in range(QK // 2):
                raw[i, 2 + j] = np.uint8(L[j] | (L[j + QK // 2] << 4))
            d_out[i] = d


def _quantize_numba(x: np.ndarray, out: np.ndarray, ftz: bool, ntry: int) -> None:
    d = np.empty(len(x), np.float32)
    _quantize_nb(x, out.view(np.uint8).reshape(len(x), IQ4_NL.type_size), d, ntry, ftz)
    out["d"] = fp32_to_fp16_bits(d)


def quantize_blocks_numba(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 32) float32 -> ``out``, (n,) IQ4_NL structs (ref); the fast twin of the numpy spec."""
    _quantize_numba(x, out, ftz, NTRY["ref"])


def quantize_chunk_blocks_numba(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 32) float32 -> ``out``, (n,) IQ4_NL structs (``quantize_iq4_nl``); the fast twin."""
    _quantize_numba(x, out, ftz, NTRY["chunk"])


@njit(cache=True, parallel=True)
def _dequantize_nb(d, qs, y, ftz):
    n = qs.shape[0]
    for c in prange((n + CHUNK * 4 - 1) // (CHUNK * 4)):
        for i in range(c * CHUNK * 4, min(n, (c + 1) * CHUNK * 4)):
            di = flush_nb(d[i], ftz)
            for j in range(QK // 2):
                y[i, j] = flush_nb(np.float32(di * KV[qs[i, j] & 15]), ftz)
                y[i, j + QK // 2] = flush_nb(np.float32(di * KV[qs[i, j] >> 4]), ftz)


def dequantize_blocks_numba(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    _dequantize_nb(fp16_bits_to_fp32(blocks["d"]), blocks["qs"], y, ftz)

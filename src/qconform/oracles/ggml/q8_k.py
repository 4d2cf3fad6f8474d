"""Q8_K: 256 values -> fp32 ``d`` + 256 int8 + 16 int16 ``bsums``, ties to even.

Source: ggml-org/ggml src/ggml-quants.c ``quantize_row_q8_K_ref`` (line 2768) and
``dequantize_row_q8_K``. Quantize, all fp32 (no FMA):
  first strict max: if (fabsf(x[j]) > amax) {amax = fabsf(x[j]); max = x[j];}  (first index wins
                    on equal |x|; a NaN never wins)
  amax == 0 (all +-0 or all NaN): d = 0, qs = 0, bsums left stale by ggml -- qconform requires 0
  iscale = -127.0f / max                         (sign flip: the max-|x| element maps to -127)
  qs[j] = MIN(127, nearest_int(iscale * x[j]))   (round half to even; no lower clamp; int8 wrap)
  bsums[g] = sum of qs[16g .. 16g+15]            (int, stored int16)
  d = 1 / iscale                                 (negative when the max-|x| element is positive)
Dequantize: y = d * (float)qs.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from qconform.formats.ftz import flush
from qconform.formats.ggml import Q8_K
from qconform.formats.ulp import nudge_ulp
from qconform.oracles.ggml.rounding import (
    MAGIC,
    flush_nb,
    int_to_int8,
    nearest_int,
    nearest_int_nb,
    scale_blocks_nb,
)
from qconform.oracles.ggml.scan import INF_BITS, abs_bits_max_nb, first_index_of_nb

QK = Q8_K.block_size
GROUP = 16
M127 = np.float32(-127.0)
ONE = np.float32(1.0)
# |max| below 127/FLT_MAX (3.7e-37) overflows iscale to inf: such blocks (and zero, inf and NaN
# blocks) take the general path
TINY_MAX_BITS = np.int32(np.array([2 * 127.0 / np.finfo(np.float32).max], np.float32).view(np.int32)[0])


def quantize_blocks_numpy(x: np.ndarray, out: np.ndarray, ftz: bool = False, nudge: tuple[int, int] = (0, 0)) -> None:
    """(n, 256) float32 -> ``out``, (n,) Q8_K structs. The readable spec. ``nudge`` = (i, j): the
    division -127/max returns i ulp off and the reciprocal 1/iscale j ulp off (approximate
    division, the contract's ``division``)."""
    src = x
    x = flush(x, ftz)
    a = np.abs(x)
    amax = np.zeros(len(x), np.float32)
    mx = np.zeros(len(x), np.float32)
    for j in range(QK):  # first strict max; NaN compares false and never wins
        upd = a[:, j] > amax
        amax = np.where(upd, a[:, j], amax)
        mx = np.where(upd, x[:, j], mx)
    zero = amax == 0
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        iscale = flush(nudge_ulp(M127 / np.where(zero, ONE, mx), nudge[0]), ftz)
        prod = flush(iscale[:, None] * x, ftz)
        d = flush(nudge_ulp(ONE / iscale, nudge[1]), ftz)
    qs = int_to_int8(np.minimum(127, nearest_int(prod, src)))
    qs[zero] = 0
    out["d"] = np.where(zero, np.float32(0), d)
    out["qs"] = qs
    out["bsums"] = qs.reshape(len(x), QK // GROUP, GROUP).astype(np.int32).sum(axis=2).astype(np.int16)


def dequantize_blocks_numpy(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    """(n,) Q8_K structs -> ``y``, (n, 256) float32."""
    d = flush(blocks["d"], ftz)
    with np.errstate(invalid="ignore", over="ignore"):
        y[...] = flush(d[:, None] * blocks["qs"].astype(np.float32), ftz)


QS = 4  # byte offset of qs in the block
BSUMS = 4 + QK  # byte offset of bsums
CHUNK = 128  # blocks per parallel task


@njit(cache=True, inline="always")
def _store_bsum(raw, i, g, s):
    raw[i, BSUMS + 2 * g] = np.uint8(s & 0xFF)
    raw[i, BSUMS + 2 * g + 1] = np.uint8((s >> 8) & 0xFF)


@njit(cache=True, inline="always")
def _quantize_block_general(x, bits, i, raw, ftz):
    """The reference loop, line by line (NaN payloads, inf, ftz). Returns d."""
    amax = np.float32(0.0)
    mx = np.float32(0.0)
    for j in range(QK):
        v = flush_nb(x[i, j], ftz)
        if abs(v) > amax:
            amax = abs(v)
            mx = v
    if amax == 0:
        for j in range(QK + 2 * (QK // GROUP)):
            raw[i, QS + j] = 0
        return np.float32(0.0)
    iscale = flush_nb(np.float32(M127 / mx), ftz)
    for g in range(QK // GROUP):
        s = 0
        for k in range(GROUP):
            j = g * GROUP + k
            p = flush_nb(np.float32(iscale * flush_nb(x[i, j], ftz)), ftz)
            q = np.int8(min(127, nearest_int_nb(p, x[i, j] != x[i, j], bits[i, j])) & 0xFF)
            raw[i, QS + j] = np.uint8(q & 0xFF)
            s += q
        _store_bsum(raw, i, g, s)
    return flush_nb(np.float32(ONE / iscale), ftz)


@njit(cache=True, inline="always")
def _quantize_block(x, bits, i, raw, ftz):
    """One block; finite blocks with a finite iscale and no ftz take a branch-free path. Returns d."""
    top = abs_bits_max_nb(bits, i)
    if ftz or not (TINY_MAX_BITS <= top < INF_BITS):
        return _quantize_block_general(x, bits, i, raw, ftz)
    iscale = np.float32(M127 / x[i, first_index_of_nb(bits, i, top)])
    for g in range(QK // GROUP):
        s = 0
        for t in range(GROUP):
            j = g * GROUP + t
            v = np.int32(np.float32(np.float32(iscale * x[i, j]) + MAGIC) - MAGIC)  # |p| <= 127.x
            q = min(127, v)
            raw[i, QS + j] = np.uint8(q & 0xFF)
            s += q
        _store_bsum(raw, i, g, s)
    return np.float32(ONE / iscale)


@njit(cache=True, parallel=True)
def _quantize_nb(x, bits, raw, d_out, ftz):
    n = x.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        for i in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
            d_out[i] = _quantize_block(x, bits, i, raw, ftz)


def quantize_blocks_numba(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 256) float32 -> ``out``, (n,) Q8_K structs; the fast twin of the numpy spec."""
    d = np.empty(len(x), np.float32)
    _quantize_nb(x, x.view(np.int32), out.view(np.uint8).reshape(len(x), Q8_K.type_size), d, ftz)
    out["d"] = d


def dequantize_blocks_numba(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    scale_blocks_nb(blocks["d"], blocks["qs"], y, ftz)

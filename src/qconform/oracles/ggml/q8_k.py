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

from qconform.formats.ggml import Q8_K
from qconform.oracles.ggml.rounding import flush, flush_nb, int_to_int8, nearest_int, nearest_int_nb

QK = Q8_K.block_size
GROUP = 16
M127 = np.float32(-127.0)
ONE = np.float32(1.0)


def quantize_blocks_numpy(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 256) float32 -> ``out``, (n,) Q8_K structs. The readable spec."""
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
        iscale = flush(M127 / np.where(zero, ONE, mx), ftz)
        prod = flush(iscale[:, None] * x, ftz)
        d = flush(ONE / iscale, ftz)
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


@njit(cache=True, parallel=True)
def _quantize_nb(x, bits, d_out, qs_out, bsums_out, ftz):
    for i in prange(x.shape[0]):
        amax = np.float32(0.0)
        mx = np.float32(0.0)
        for j in range(QK):
            v = flush_nb(x[i, j], ftz)
            a = abs(v)
            if a > amax:
                amax = a
                mx = v
        if amax == 0:
            d_out[i] = np.float32(0.0)
            for j in range(QK):
                qs_out[i, j] = 0
            for g in range(QK // GROUP):
                bsums_out[i, g] = 0
            continue
        iscale = flush_nb(np.float32(M127 / mx), ftz)
        for g in range(QK // GROUP):
            s = 0
            for k in range(GROUP):
                j = g * GROUP + k
                src = x[i, j]
                p = flush_nb(np.float32(iscale * flush_nb(src, ftz)), ftz)
                v = nearest_int_nb(p, src != src, bits[i, j])
                q = np.int8(min(127, v) & 0xFF)
                qs_out[i, j] = q
                s += q
            bsums_out[i, g] = s
        d_out[i] = flush_nb(np.float32(ONE / iscale), ftz)


@njit(cache=True, parallel=True)
def _dequantize_nb(d, qs, y, ftz):
    for i in prange(qs.shape[0]):
        di = flush_nb(d[i], ftz)
        for j in range(QK):
            y[i, j] = flush_nb(np.float32(di * np.float32(qs[i, j])), ftz)


def quantize_blocks_numba(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 256) float32 -> ``out``, (n,) Q8_K structs; the fast twin of the numpy spec."""
    _quantize_nb(x, x.view(np.int32), out["d"], out["qs"], out["bsums"], ftz)


def dequantize_blocks_numba(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    _dequantize_nb(blocks["d"], blocks["qs"], y, ftz)

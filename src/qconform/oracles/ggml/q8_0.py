"""Q8_0: 32 values -> fp16 ``d`` + 32 int8, symmetric, ties away from zero.

Source: ggml-org/ggml src/ggml-quants.c ``quantize_row_q8_0_ref`` and ``dequantize_row_q8_0``.
Quantize, all fp32 (no FMA):
  amax = 0; for each v: amax = MAX(amax, fabsf(v))   (MAX(a,b) = a > b ? a : b, so a NaN sets
                                                      amax to NaN and the next value replaces it)
  d = amax / 127; id = d ? 1.0f/d : 0.0f             (reciprocal of the fp32 d, not 127/amax)
  d stored as fp16 (RNE, NaN -> 0x7E00); qs[j] = (int8_t)roundf(x[j]*id)   (ties away from zero)
Dequantize: y = (float)qs * fp16_to_fp32(d).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from qconform.formats.fp16 import fp16_bits_to_fp32, fp32_bits_to_fp16_bits_nb, fp32_to_fp16_bits
from qconform.formats.ftz import flush
from qconform.formats.ggml import Q8_0
from qconform.formats.ulp import nudge_ulp
from qconform.oracles.ggml.rounding import (
    flush_nb,
    roundf_to_int8,
    roundf_to_int8_nb,
    scale_blocks_nb,
)
from qconform.oracles.ggml.scan import INF_BITS, abs_bits_max_nb, f32_from_abs_bits_nb

QK = Q8_0.block_size
F127 = np.float32(127.0)
ONE = np.float32(1.0)


def quantize_blocks_numpy(x: np.ndarray, out: np.ndarray, ftz: bool = False, nudge: tuple[int, int] = (0, 0)) -> None:
    """(n, 32) float32 -> ``out``, (n,) Q8_0 structs. The readable spec. ``nudge`` = (i, j): the
    division amax/127 returns i ulp off and the reciprocal 1/d j ulp off (approximate division,
    the contract's ``division``)."""
    x = flush(x, ftz)
    a = np.abs(x)
    amax = np.zeros(len(x), np.float32)
    for j in range(QK):  # the reference's sequential MAX, NaN behaviour included
        amax = np.where(amax > a[:, j], amax, a[:, j])
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        d = flush(nudge_ulp(amax / F127, nudge[0]), ftz)
        idd = np.where(d != 0, flush(nudge_ulp(ONE / np.where(d != 0, d, ONE), nudge[1]), ftz), np.float32(0))
        prod = flush(x * idd[:, None], ftz)
    out["d"] = fp32_to_fp16_bits(d)
    out["qs"] = roundf_to_int8(prod)


def dequantize_blocks_numpy(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    """(n,) Q8_0 structs -> ``y``, (n, 32) float32."""
    d = flush(fp16_bits_to_fp32(blocks["d"]), ftz)
    with np.errstate(invalid="ignore", over="ignore"):
        y[...] = flush(blocks["qs"].astype(np.float32) * d[:, None], ftz)


QS = 2  # byte offset of qs in the block
CHUNK = 1024  # blocks per parallel task: one task per block costs more than the block


@njit(cache=True, inline="always")
def _quantize_block_general(x, i, raw, ftz):
    """The reference loop, line by line: NaN-aware MAX and the ftz flushes. Returns d."""
    amax = np.float32(0.0)
    for j in range(QK):
        a = abs(flush_nb(x[i, j], ftz))
        amax = amax if amax > a else a
    d = flush_nb(np.float32(amax / F127), ftz)
    idd = flush_nb(np.float32(ONE / d), ftz) if d != 0 else np.float32(0.0)
    for j in range(QK):
        raw[i, QS + j] = roundf_to_int8_nb(flush_nb(np.float32(flush_nb(x[i, j], ftz) * idd), ftz))
    return d


@njit(cache=True, inline="always")
def _quantize_block(x, xbits, i, raw, ftz):
    """One block; NaN-free blocks without ftz take a branch-free path that vectorizes. Returns d."""
    top = abs_bits_max_nb(xbits, i)  # without NaN, MAX(amax, |x|) is the plain max
    if ftz or top > INF_BITS:
        return _quantize_block_general(x, i, raw, ftz)
    d = np.float32(f32_from_abs_bits_nb(top) / F127)
    idd = np.float32(ONE / d) if d != 0 else np.float32(0.0)
    for j in range(x.shape[1]):
        raw[i, QS + j] = roundf_to_int8_nb(np.float32(x[i, j] * idd))
    return d


@njit(cache=True, inline="always")
def store_fp16_d_nb(raw, lo, hi, dbits):
    """Blocks lo..hi-1's fp32 d (bit patterns dbits[i - lo]) as fp16 (RNE) into bytes 0, 1 of raw."""
    for i in range(lo, hi):
        h = fp32_bits_to_fp16_bits_nb(dbits[i - lo])
        raw[i, 0] = np.uint8(h & 0xFF)
        raw[i, 1] = np.uint8(h >> 8)


@njit(cache=True, parallel=True)
def _quantize_nb(x, xbits, raw, ftz):
    n = x.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        lo, hi = c * CHUNK, min(n, (c + 1) * CHUNK)
        d = np.empty(hi - lo, np.float32)
        dbits = d.view(np.uint32)
        for i in range(lo, hi):
            d[i - lo] = _quantize_block(x, xbits, i, raw, ftz)
        store_fp16_d_nb(raw, lo, hi, dbits)


def quantize_blocks_numba(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 32) float32 -> ``out``, (n,) Q8_0 structs; the fast twin of the numpy spec."""
    _quantize_nb(x, x.view(np.int32), out.view(np.uint8).reshape(len(x), Q8_0.type_size), ftz)


def dequantize_blocks_numba(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    scale_blocks_nb(fp16_bits_to_fp32(blocks["d"]), blocks["qs"], y, ftz)

"""Q8_1: 32 values -> fp16 ``d``, fp16 ``s`` = d * sum(qs), 32 int8; symmetric, ties away from zero.

Source: ggml-org/ggml src/ggml-quants.c ``quantize_row_q8_1_ref`` (Q8_0's algorithm plus the sum).
Quantize, all fp32 (no FMA):
  amax = 0; for each v: amax = MAX(amax, fabsf(v))   (MAX(a,b) = a > b ? a : b, so a NaN sets
                                                      amax to NaN and the next value replaces it)
  d = amax / 127; id = d ? 1.0f/d : 0.0f             (reciprocal of the fp32 d, not 127/amax)
  qs[j] = (int8_t)roundf(x[j]*id)                    (ties away from zero; x86-64 cvttss2si byte)
  sum = the int sum of the stored int8 qs; s = fp16((float)sum * d)   (the fp32 d, not fp16(d))
ggml has no ``dequantize_row_q8_1`` (Q8_1 is only ever a vec_dot operand); qconform's dequantize
is ``y = (float)qs * fp16_to_fp32(d)``, as Q8_0's, with ``s`` unused.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from qconform.formats.fp16 import fp16_bits_to_fp32, fp32_to_fp16_bits
from qconform.formats.ftz import flush
from qconform.formats.ggml import Q8_1
from qconform.oracles.ggml.rounding import flush_nb, roundf_to_int8, roundf_to_int8_nb, scale_blocks_nb

QK = Q8_1.block_size
F127 = np.float32(127.0)
ONE = np.float32(1.0)
ZERO = np.float32(0.0)


def quantize_blocks_numpy(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 32) float32 -> ``out``, (n,) Q8_1 structs. The readable spec."""
    x = flush(x, ftz)
    a = np.abs(x)
    amax = np.zeros(len(x), np.float32)
    for j in range(QK):  # the reference's sequential MAX, NaN behaviour included
        amax = np.where(amax > a[:, j], amax, a[:, j])
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        d = flush(amax / F127, ftz)
        idd = np.where(d != 0, flush(ONE / np.where(d != 0, d, ONE), ftz), ZERO)
        qs = roundf_to_int8(flush(x * idd[:, None], ftz))
        s = flush(qs.astype(np.int32).sum(axis=1).astype(np.float32) * d, ftz)
    out["d"] = fp32_to_fp16_bits(d)
    out["s"] = fp32_to_fp16_bits(s)
    out["qs"] = qs


def dequantize_blocks_numpy(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    """(n,) Q8_1 structs -> ``y``, (n, 32) float32: ``qs * d`` (no upstream dequantizer)."""
    d = flush(fp16_bits_to_fp32(blocks["d"]), ftz)
    with np.errstate(invalid="ignore", over="ignore"):
        y[...] = flush(blocks["qs"].astype(np.float32) * d[:, None], ftz)


QS = 4  # byte offset of qs in the block
CHUNK = 512  # blocks per parallel task


@njit(cache=True, parallel=True)
def _quantize_nb(x, raw, d_out, s_out, ftz):
    n = x.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        for i in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
            amax = ZERO
            for j in range(QK):
                a = abs(flush_nb(x[i, j], ftz))
                amax = amax if amax > a else a
            d = flush_nb(np.float32(amax / F127), ftz)
            idd = flush_nb(np.float32(ONE / d), ftz) if d != 0 else ZERO
            total = 0
            for j in range(QK):
                b = roundf_to_int8_nb(flush_nb(np.float32(flush_nb(x[i, j], ftz) * idd), ftz))
                raw[i, QS + j] = b
                total += (np.int32(b) ^ 0x80) - 0x80
            d_out[i] = d
            s_out[i] = flush_nb(np.float32(np.float32(total) * d), ftz)


def quantize_blocks_numba(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 32) float32 -> ``out``, (n,) Q8_1 structs; the fast twin of the numpy spec."""
    d, s = np.empty(len(x), np.float32), np.empty(len(x), np.float32)
    _quantize_nb(x, out.view(np.uint8).reshape(len(x), Q8_1.type_size), d, s, ftz)
    out["d"] = fp32_to_fp16_bits(d)
    out["s"] = fp32_to_fp16_bits(s)


def dequantize_blocks_numba(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    scale_blocks_nb(fp16_bits_to_fp32(blocks["d"]), blocks["qs"], y, ftz)

"""Q5_K: 256 values -> 8 sub-blocks of 32, x ~ d*sc*q - dmin*m, 5-bit q, 6-bit sc and m.

Source: ggml-org/ggml src/ggml-quants.c ``quantize_row_q5_K_ref`` and ``dequantize_row_q5_K``
(layout: src/ggml-common.h ``block_q5_K``). Quantize: Q4_K's steps (q4_k.py; all fp32, no FMA,
nearest_int = round half to even) with make_qkx2_quants(32, 31, x, w, rmin=-0.5, rdelta=0.1,
nstep=15, use_mad=false) and the final levels clamped to [0, 31]; then, element e = 64c + 32t + l:
  qs[32c + l] nibble t = L & 15; L > 15 sets qh[l] bit 2c + t (= bit e/32 of qh[e % 32])
Dequantize: q = nibble + 16*bit; y = (h2f(d)*sc)*q - h2f(dmin)*m.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from qconform.formats.fp16 import fp16_bits_to_fp32
from qconform.formats.ftz import flush
from qconform.formats.ggml import Q5_K
from qconform.oracles.ggml.kquant_search import get_scale_min_k4_nb, mul_nb, sub_nb
from qconform.oracles.ggml.q4_k import SCALES, dequantize_from, quantize_scales_nb, quantize_scales_numpy

QK = Q5_K.block_size
BITS = np.arange(8)


def quantize_blocks_numpy(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 256) float32 -> ``out``, (n,) Q5_K structs. The readable spec."""
    n = len(x)
    d16, dmin16, packed, big_l = quantize_scales_numpy(flush(x, ftz), 31, -0.5, 15, ftz)
    high = (big_l >> 4).reshape(n, 8, 32)  # [e // 32, e % 32]
    lv = (big_l & 0xF).reshape(n, 4, 2, 32)  # [c, t, l]
    out["d"] = d16
    out["dmin"] = dmin16
    out["scales"] = packed
    out["qh"] = (high << BITS[None, :, None]).sum(axis=1)
    out["qs"] = (lv[:, :, 0] | lv[:, :, 1] << 4).reshape(n, 128)


def dequantize_blocks_numpy(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    """(n,) Q5_K structs -> ``y``, (n, 256) float32."""
    n = len(blocks)
    low = (blocks["qs"].reshape(n, 4, 1, 32) >> np.array([0, 4], np.uint8)[None, None, :, None]) & 0xF
    high = (blocks["qh"][:, None, :] >> BITS[None, :, None]) & 1  # [e // 32, e % 32]
    q = low.reshape(n, QK).astype(np.int64) + 16 * high.reshape(n, QK)
    d, dmin = fp16_bits_to_fp32(blocks["d"]), fp16_bits_to_fp32(blocks["dmin"])
    y[...] = dequantize_from(d, dmin, blocks["scales"], q, ftz)


QH, QS = 16, 48  # byte offsets in the block
CHUNK = 32  # blocks per parallel task


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_nb(x, raw, ftz):
    n = x.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        big_l = np.empty(QK, np.int32)
        laux = np.empty(32, np.int32)
        w = np.empty(32, np.float32)
        scales = np.empty(8, np.float32)
        mins = np.empty(8, np.float32)
        ls = np.empty(8, np.int32)
        lm = np.empty(8, np.int32)
        scratch = np.empty(1, np.float32)
        for i in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
            quantize_scales_nb(x[i], raw[i], big_l, laux, w, scales, mins, ls, lm, scratch, 31, -0.5, 15, ftz)
            for k in range(32):
                raw[i, QH + k] = 0
            for cc in range(4):
                for k in range(32):
                    l1 = big_l[64 * cc + k]
                    if l1 > 15:
                        l1 -= 16
                        raw[i, QH + k] |= np.uint8(1 << (2 * cc))
                    l2 = big_l[64 * cc + 32 + k]
                    if l2 > 15:
                        l2 -= 16
                        raw[i, QH + k] |= np.uint8(2 << (2 * cc))
                    raw[i, QS + 32 * cc + k] = np.uint8(l1 | (l2 << 4))


def quantize_blocks_numba(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 256) float32 -> ``out``, (n,) Q5_K structs; the fast twin of the numpy spec."""
    _quantize_nb(flush(x, ftz), out.view(np.uint8).reshape(len(x), Q5_K.type_size), ftz)


@njit(cache=True, parallel=True, error_model="numpy")
def _dequantize_nb(raw, d, dmin, y, ftz):
    n = raw.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        for i in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
            for j in range(8):
                sc, m = get_scale_min_k4_nb(j, raw[i], SCALES)
                d1 = mul_nb(d[i], sc, ftz)
                m1 = mul_nb(dmin[i], m, ftz)
                for k in range(32):
                    q = (np.int32(raw[i, QS + 32 * (j >> 1) + k]) >> (4 * (j & 1))) & 0xF
                    q += 16 * ((np.int32(raw[i, QH + k]) >> j) & 1)
                    y[i, 32 * j + k] = sub_nb(mul_nb(d1, q, ftz), m1, ftz)


def dequantize_blocks_numba(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    """(n,) Q5_K structs -> ``y``, (n, 256) float32; the fast twin."""
    raw = blocks.view(np.uint8).reshape(len(blocks), Q5_K.type_size)
    _dequantize_nb(raw, fp16_bits_to_fp32(blocks["d"]), fp16_bits_to_fp32(blocks["dmin"]), y, ftz)

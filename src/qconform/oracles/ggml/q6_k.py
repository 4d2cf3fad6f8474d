"""Q6_K: 256 values -> 16 sub-blocks of 16, x ~ d*sc*q, 6-bit q in [-32, 31], int8 sc.

Source: ggml-org/ggml src/ggml-quants.c ``quantize_row_q6_K_ref`` and ``dequantize_row_q6_K``
(layout: src/ggml-common.h ``block_q6_K``). Quantize, all fp32 (no FMA), nearest_int = round half
to even:
  per sub-block g: scales[g], L = make_qx_quants(16, 32, x, rmse_type=1, qw=NULL)
  max_scale: the signed scale of the first strict max of |scales[g]|; max |scale| < 1e-15: the
             whole block is zero bytes
  iscale = -128/max_scale; d = fp16(1/iscale); sc[g] = (int8_t)MIN(127, nearest_int(iscale*scales[g]))
  per g: dd = h2f(d)*sc; dd == 0 keeps make_qx_quants' L, else L = clamp(nearest_int(x/dd), -32, 31) + 32
  element e = 128h + 32k + l: ql[64h + l + 32*(k & 1)] nibble k >> 1 = L & 15,
                              qh[32h + l] bits 2k, 2k+1 = L >> 4
Dequantize: q = (lo4 | hi2 << 4) - 32; y = (h2f(d)*sc[e/16])*q.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from qconform.formats.fp16 import fp16_bits_to_fp32, fp32_to_fp16_bits
from qconform.formats.ftz import flush
from qconform.formats.ggml import Q6_K
from qconform.oracles.ggml.kquant_search import (
    GROUP_MAX_EPS,
    clamp,
    clamp_nb,
    div,
    div_nb,
    first_strict_max,
    fp16_bits_to_fp32_nb,
    fp32_to_fp16_bits_nb,
    make_qx_quants,
    make_qx_quants_nb,
    mul,
    mul_nb,
    nearest_int_k,
    nearest_int_k_nb,
)
from qconform.oracles.ggml.q4_k import F16_TO_F32
from qconform.oracles.ggml.rounding import int_to_int8

QK = Q6_K.block_size
SHIFTS = np.array([0, 2, 4, 6])


def quantize_blocks_numpy(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 256) float32 -> ``out``, (n,) Q6_K structs. The readable spec."""
    n = len(x)
    x = flush(x, ftz)
    scales, big_l = make_qx_quants(x.reshape(n * 16, 16), 32, ftz)
    scales, big_l = scales.reshape(n, 16), big_l.reshape(n, 16, 16)
    max_abs, max_scale = first_strict_max(scales)
    zero = max_abs < GROUP_MAX_EPS
    iscale = div(np.float32(-128), np.where(zero, 1, max_scale), ftz)
    d16 = np.where(zero, 0, fp32_to_fp16_bits(div(np.float32(1), iscale, ftz)))
    sc = int_to_int8(np.minimum(127, nearest_int_k(mul(iscale[:, None], scales, ftz))))
    dd = mul(fp16_bits_to_fp32(d16)[:, None], sc, ftz)
    requant = clamp(nearest_int_k(div(x.reshape(n, 16, 16), dd[..., None], ftz)), -32, 31) + 32
    lv = np.where((dd != 0)[..., None], requant, big_l).reshape(n, 2, 4, 32)  # [h, k, l]
    ql = np.stack([lv[:, :, 0] & 0xF | (lv[:, :, 2] & 0xF) << 4, lv[:, :, 1] & 0xF | (lv[:, :, 3] & 0xF) << 4], 2)
    qh = ((lv >> 4) << SHIFTS[None, None, :, None]).sum(axis=2)
    keep = ~zero[:, None]
    out["ql"] = np.where(keep, ql.reshape(n, 128), 0)
    out["qh"] = np.where(keep, qh.reshape(n, 64), 0)
    out["scales"] = np.where(keep, sc, 0)
    out["d"] = d16


def dequantize_blocks_numpy(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    """(n,) Q6_K structs -> ``y``, (n, 256) float32."""
    n = len(blocks)
    ql = blocks["ql"].reshape(n, 2, 2, 32)  # [h, k & 1, l]
    lo4 = (ql[:, :, None, :, :] >> np.array([0, 4], np.uint8)[None, None, :, None, None]) & 0xF  # [h, k >> 1, k & 1, l]
    hi2 = (blocks["qh"].reshape(n, 2, 1, 32) >> SHIFTS[None, None, :, None]) & 3  # [h, k, l]
    q = (lo4.reshape(n, 2, 4, 32) | hi2 << 4).astype(np.int64) - 32
    dl = mul(fp16_bits_to_fp32(blocks["d"])[:, None], blocks["scales"], ftz)
    y[...] = mul(dl[..., None], q.reshape(n, 16, 16), ftz).reshape(n, QK)


QL, QH, SCALES, D = 0, 128, 192, 208  # byte offsets in the block
CHUNK = 64  # blocks per parallel task (quantize)


@njit(cache=True, error_model="numpy")
def _quantize_block_nb(x, raw, big_l, scales, scratch, ftz):
    max_abs = np.float32(0.0)
    max_scale = np.float32(0.0)
    for g in range(16):
        scales[g] = make_qx_quants_nb(x, 16 * g, 16, 32, big_l, ftz)
        if abs(scales[g]) > max_abs:
            max_abs = abs(scales[g])
            max_scale = scales[g]
    if max_abs < GROUP_MAX_EPS:
        for k in range(raw.shape[0]):
            raw[k] = 0
        return
    iscale = div_nb(-128, max_scale, ftz)
    hd = fp32_to_fp16_bits_nb(div_nb(1, iscale, ftz), scratch)
    raw[D], raw[D + 1] = hd & 0xFF, hd >> 8
    df = fp16_bits_to_fp32_nb(hd)
    for g in range(16):
        sc = ((min(127, nearest_int_k_nb(mul_nb(iscale, scales[g], ftz))) + 128) & 0xFF) - 128  # (int8_t)
        raw[SCALES + g] = np.uint8(sc & 0xFF)
        dd = mul_nb(df, sc, ftz)
        if dd == 0:
            continue
        for k in range(16):
            big_l[16 * g + k] = clamp_nb(nearest_int_k_nb(div_nb(x[16 * g + k], dd, ftz)), -32, 31) + 32
    for h in range(2):
        for k in range(32):
            e = 128 * h + k
            q1, q2, q3, q4 = big_l[e], big_l[e + 32], big_l[e + 64], big_l[e + 96]
            raw[QL + 64 * h + k] = np.uint8((q1 & 0xF) | ((q3 & 0xF) << 4))
            raw[QL + 64 * h + 32 + k] = np.uint8((q2 & 0xF) | ((q4 & 0xF) << 4))
            raw[QH + 32 * h + k] = np.uint8((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6))


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_nb(x, raw, ftz):
    n = x.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        big_l = np.empty(QK, np.int32)
        scales = np.empty(16, np.float32)
        scratch = np.empty(1, np.float32)
        for i in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
            _quantize_block_nb(x[i], raw[i], big_l, scales, scratch, ftz)


def quantize_blocks_numba(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 256) float32 -> ``out``, (n,) Q6_K structs; the fast twin of the numpy spec."""
    _quantize_nb(flush(x, ftz), out.view(np.uint8).reshape(len(x), Q6_K.type_size), ftz)


@njit(cache=True, inline="always")
def _scale_nb(raw, i, at, d, ftz):
    """d * (int8_t)scales[at - SCALES], in fp32."""
    sc = np.int32(raw[i, at])
    return mul_nb(d, sc - 256 if sc > 127 else sc, ftz)


@njit(cache=True, parallel=True, error_model="numpy")
def _dequantize_nb(raw, f16, y, ftz):
    """Per block, half h and group t of 16: the four elements 128h + 32k + 16t + u (k = 0..3,
    u < 16) share qh[32h + 16t + u] and one of two ql bytes; y = (d*sc)*q. Without ftz the
    inner loop is plain fp32 arithmetic (no contraction without fastmath), which LLVM vectorizes."""
    for i in prange(raw.shape[0]):
        di = f16[np.int32(raw[i, D]) | (np.int32(raw[i, D + 1]) << 8)]
        for h in range(2):
            for t in range(2):
                g = SCALES + 8 * h + t
                d0, d1 = _scale_nb(raw, i, g, di, ftz), _scale_nb(raw, i, g + 2, di, ftz)
                d2, d3 = _scale_nb(raw, i, g + 4, di, ftz), _scale_nb(raw, i, g + 6, di, ftz)
                e, a, b, m = 128 * h + 16 * t, QL + 64 * h + 16 * t, QL + 64 * h + 32 + 16 * t, QH + 32 * h + 16 * t
                if ftz:
                    for u in range(16):
                        lo, hi, qh = np.int32(raw[i, a + u]), np.int32(raw[i, b + u]), np.int32(raw[i, m + u])
                        y[i, e + u] = mul_nb(d0, ((lo & 0xF) | ((qh & 3) << 4)) - 32, ftz)
                        y[i, e + 32 + u] = mul_nb(d1, ((hi & 0xF) | (((qh >> 2) & 3) << 4)) - 32, ftz)
                        y[i, e + 64 + u] = mul_nb(d2, ((lo >> 4) | (((qh >> 4) & 3) << 4)) - 32, ftz)
                        y[i, e + 96 + u] = mul_nb(d3, ((hi >> 4) | ((qh >> 6) << 4)) - 32, ftz)
                else:
                    for u in range(16):
                        lo, hi, qh = np.int32(raw[i, a + u]), np.int32(raw[i, b + u]), np.int32(raw[i, m + u])
                        y[i, e + u] = d0 * np.float32(((lo & 0xF) | ((qh & 3) << 4)) - 32)
                        y[i, e + 32 + u] = d1 * np.float32(((hi & 0xF) | (((qh >> 2) & 3) << 4)) - 32)
                        y[i, e + 64 + u] = d2 * np.float32(((lo >> 4) | (((qh >> 4) & 3) << 4)) - 32)
                        y[i, e + 96 + u] = d3 * np.float32(((hi >> 4) | ((qh >> 6) << 4)) - 32)


def dequantize_blocks_numba(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    """(n,) Q6_K structs -> ``y``, (n, 256) float32; the fast twin."""
    raw = blocks.view(np.uint8).reshape(len(blocks), Q6_K.type_size)
    _dequantize_nb(raw, F16_TO_F32, y, ftz)

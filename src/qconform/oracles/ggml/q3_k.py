"""Q3_K: 256 values -> 16 sub-blocks of 16, x ~ d*sc*q, 3-bit q in [-4, 3], 6-bit sc - 32.

Source: ggml-org/ggml src/ggml-quants.c ``quantize_row_q3_K_ref`` and ``dequantize_row_q3_K``
(layout: src/ggml-common.h ``block_q3_K``). Quantize, all fp32 (no FMA), nearest_int = round half
to even:
  per sub-block g: scales[g], L = make_q3_quants(16, 4, x, do_rmse=true)
  max_scale: the signed scale of the first strict max of |scales[g]|
  max_scale != 0: iscale = -32/max_scale; l = clamp((int8_t)nearest_int(iscale*scales[g]), -32, 31)
                  + 32, packed: low nibble into byte g (g < 8) or the high nibble of byte g-8,
                  l >> 4 into byte 8 + g%4 at bit 2*(g/4); d = fp16(1/iscale)   (else bytes 0, d = 0)
  per g: sc = unpacked - 32; dd = h2f(d)*sc; dd == 0 keeps make_q3_quants' L, else
         L = clamp(nearest_int(x/dd), -4, 3) + 4
  L > 3: hmask[e % 32] bit e/32 set and L -= 4; qs packed as Q2_K's
Dequantize: q = low2 - (hmask bit ? 0 : 4); y = (h2f(d)*sc)*q.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from qconform.formats.fp16 import fp16_bits_to_fp32, fp32_to_fp16_bits
from qconform.formats.ftz import flush
from qconform.formats.ggml import Q3_K
from qconform.oracles.ggml.kquant_search import (
    clamp,
    clamp_nb,
    div,
    div_nb,
    first_strict_max,
    fp16_bits_to_fp32_nb,
    fp32_to_fp16_bits_nb,
    make_q3_quants,
    make_q3_quants_nb,
    mul,
    mul_nb,
    nearest_int_k,
    nearest_int_k_nb,
)
from qconform.oracles.ggml.q2_k import pack_q2, unpack_q2
from qconform.oracles.ggml.rounding import int_to_int8

QK = Q3_K.block_size
BITS = np.arange(8)


def pack_scales(lv: np.ndarray) -> np.ndarray:
    """(n, 16) 6-bit levels -> (n, 12) bytes: low nibbles into bytes 0..7, two bits each into 8..11."""
    out = np.zeros((len(lv), 12), np.int64)
    out[:, 0:8] = (lv[:, 0:8] & 0xF) | ((lv[:, 8:16] & 0xF) << 4)
    hi = (lv >> 4).reshape(-1, 4, 4)  # [g // 4, g % 4]
    out[:, 8:12] = hi[:, 0] | hi[:, 1] << 2 | hi[:, 2] << 4 | hi[:, 3] << 6
    return out.astype(np.uint8)


def unpack_scales(s: np.ndarray) -> np.ndarray:
    """(n, 12) bytes -> (n, 16) signed scales (6-bit level - 32)."""
    s = s.astype(np.int64)
    lo4 = np.concatenate([s[:, 0:8] & 0xF, s[:, 0:8] >> 4], axis=1)
    hi2 = (s[:, None, 8:12] >> (2 * np.arange(4))[None, :, None]) & 3  # [g // 4, g % 4]
    return (lo4 | hi2.reshape(-1, 16) << 4) - 32


def quantize_blocks_numpy(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 256) float32 -> ``out``, (n,) Q3_K structs. The readable spec."""
    n = len(x)
    x = flush(x, ftz)
    scales, big_l = make_q3_quants(x.reshape(n * 16, 16), 4, ftz)
    scales, big_l = scales.reshape(n, 16), big_l.reshape(n, 16, 16)
    _, max_scale = first_strict_max(scales)
    nz = max_scale != 0
    iscale = div(np.float32(-32), np.where(nz, max_scale, 1), ftz)
    lv = clamp(int_to_int8(nearest_int_k(mul(iscale[:, None], scales, ftz))).astype(np.int64), -32, 31) + 32
    packed = pack_scales(np.where(nz[:, None], lv, 0))
    d16 = fp32_to_fp16_bits(np.where(nz, div(np.float32(1), iscale, ftz), np.float32(0)))
    dd = mul(fp16_bits_to_fp32(d16)[:, None], unpack_scales(packed), ftz)
    requant = clamp(nearest_int_k(div(x.reshape(n, 16, 16), dd[..., None], ftz)), -4, 3) + 4
    big_l = np.where((dd != 0)[..., None], requant, big_l).reshape(n, QK)
    high = big_l > 3
    out["hmask"] = (high.reshape(n, 8, 32) << BITS[None, :, None]).sum(axis=1)
    out["qs"] = pack_q2(np.where(high, big_l - 4, big_l))
    out["scales"] = packed
    out["d"] = d16


def dequantize_blocks_numpy(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    """(n,) Q3_K structs -> ``y``, (n, 256) float32."""
    n = len(blocks)
    dl = mul(fp16_bits_to_fp32(blocks["d"])[:, None], unpack_scales(blocks["scales"]), ftz)
    hbit = (blocks["hmask"][:, None, :] >> BITS[None, :, None]) & 1  # [e // 32, e % 32]
    q = unpack_q2(blocks["qs"]).astype(np.int64) - np.where(hbit.reshape(n, QK) != 0, 0, 4)
    y[...] = mul(dl[..., None], q.reshape(n, 16, 16), ftz).reshape(n, QK)


HMASK, QS, SCALES, D = 0, 32, 96, 108  # byte offsets in the block
CHUNK = 64  # blocks per parallel task


@njit(cache=True)
def _scale_nb(raw, j):
    lo4 = np.int32(raw[SCALES + j]) & 0xF if j < 8 else np.int32(raw[SCALES + j - 8]) >> 4
    return (lo4 | (((np.int32(raw[SCALES + 8 + j % 4]) >> (2 * (j // 4))) & 3) << 4)) - 32


@njit(cache=True, error_model="numpy")
def _quantize_block_nb(x, raw, big_l, scales, scratch, ftz):
    amax = np.float32(0.0)
    max_scale = np.float32(0.0)
    for j in range(16):
        scales[j] = make_q3_quants_nb(x, 16 * j, 16, 4, big_l, ftz)
        if abs(scales[j]) > amax:
            amax = abs(scales[j])
            max_scale = scales[j]
    for k in range(12):
        raw[SCALES + k] = 0
    d = np.float32(0.0)
    if max_scale != 0:
        iscale = div_nb(-32, max_scale, ftz)
        for j in range(16):
            lv = ((nearest_int_k_nb(mul_nb(iscale, scales[j], ftz)) + 128) & 0xFF) - 128  # (int8_t)
            lv = clamp_nb(lv, -32, 31) + 32
            if j < 8:
                raw[SCALES + j] = np.uint8(lv & 0xF)
            else:
                raw[SCALES + j - 8] |= np.uint8((lv & 0xF) << 4)
            raw[SCALES + 8 + j % 4] |= np.uint8((lv >> 4) << (2 * (j // 4)))
        d = div_nb(1, iscale, ftz)
    hd = fp32_to_fp16_bits_nb(d, scratch)
    raw[D], raw[D + 1] = hd & 0xFF, hd >> 8
    df = fp16_bits_to_fp32_nb(hd)
    for j in range(16):
        dd = mul_nb(df, _scale_nb(raw, j), ftz)
        if dd == 0:
            continue
        for k in range(16):
            big_l[16 * j + k] = clamp_nb(nearest_int_k_nb(div_nb(x[16 * j + k], dd, ftz)), -4, 3) + 4
    for k in range(32):
        raw[HMASK + k] = 0
    for e in range(QK):
        if big_l[e] > 3:
            raw[HMASK + e % 32] |= np.uint8(1 << (e // 32))
            big_l[e] -= 4
    for h in range(2):
        for k in range(32):
            e = 128 * h + k
            raw[QS + 32 * h + k] = np.uint8(
                big_l[e] | (big_l[e + 32] << 2) | (big_l[e + 64] << 4) | (big_l[e + 96] << 6)
            )


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
    """(n, 256) float32 -> ``out``, (n,) Q3_K structs; the fast twin of the numpy spec."""
    _quantize_nb(flush(x, ftz), out.view(np.uint8).reshape(len(x), Q3_K.type_size), ftz)


@njit(cache=True, parallel=True, error_model="numpy")
def _dequantize_nb(raw, d, y, ftz):
    n = raw.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        for i in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
            for g in range(16):
                dl = mul_nb(d[i], _scale_nb(raw[i], g), ftz)
                for t in range(16):
                    e = 16 * g + t
                    low2 = (np.int32(raw[i, QS + 32 * (e >> 7) + (e & 31)]) >> (2 * ((e >> 5) & 3))) & 3
                    hbit = (np.int32(raw[i, HMASK + (e & 31)]) >> (e >> 5)) & 1
                    y[i, e] = mul_nb(dl, low2 - (0 if hbit else 4), ftz)


def dequantize_blocks_numba(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    """(n,) Q3_K structs -> ``y``, (n, 256) float32; the fast twin."""
    raw = blocks.view(np.uint8).reshape(len(blocks), Q3_K.type_size)
    _dequantize_nb(raw, fp16_bits_to_fp32(blocks["d"]), y, ftz)

"""Q2_K: 256 values -> 16 sub-blocks of 16, x ~ d*sc*q - dmin*m, 2-bit q, 4-bit sc and m.

Source: ggml-org/ggml src/ggml-quants.c ``quantize_row_q2_K_ref`` and ``dequantize_row_q2_K``
(layout: src/ggml-common.h ``block_q2_K``). Quantize, all fp32 (no FMA), nearest_int = round half
to even:
  per sub-block g: w = |x|; scales[g], L, mins[g] = make_qkx2_quants(16, 3, x, w, rmin=-0.5,
                   rdelta=0.1, nstep=15, use_mad=true)
  max_scale, max_min: strict ``>`` maxima from 0
  max_scale > 0: iscale = 15/max_scale; scales byte = (uint8)nearest_int(iscale*scales[g]);
                 d = fp16(max_scale/15)                        (else bytes 0, d = 0)
  max_min > 0:   byte |= nearest_int((15/max_min)*mins[g]) << 4; dmin = fp16(max_min/15) (else 0)
  per g: dd = h2f(d)*(byte & 15); dd == 0 keeps make_qkx2's L; else dm = h2f(dmin)*(byte >> 4),
         L = clamp(nearest_int((x + dm)/dd), 0, 3)
  qs[32h + l] = L[128h + l] | L[128h + 32 + l] << 2 | L[128h + 64 + l] << 4 | L[128h + 96 + l] << 6
Dequantize: y = (h2f(d)*(sc & 15))*q - h2f(dmin)*(sc >> 4).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from qconform.formats.fp16 import fp16_bits_to_fp32, fp32_to_fp16_bits
from qconform.formats.ftz import flush
from qconform.formats.ggml import Q2_K
from qconform.oracles.ggml.kquant_search import (
    add,
    add_nb,
    clamp,
    clamp_nb,
    div,
    div_nb,
    fp16_bits_to_fp32_nb,
    fp32_to_fp16_bits_nb,
    make_qkx2_quants,
    make_qkx2_quants_nb,
    mul,
    mul_nb,
    nearest_int_k,
    nearest_int_k_nb,
    strict_max,
    sub,
    sub_nb,
)

QK = Q2_K.block_size
F15 = np.float32(15.0)
SHIFTS = np.array([0, 2, 4, 6], np.uint8)


def unpack_q2(qs: np.ndarray) -> np.ndarray:
    """(n, 64) qs -> (n, 256) 2-bit levels in element order e = 128h + 32s + l."""
    return ((qs.reshape(-1, 2, 1, 32) >> SHIFTS[None, None, :, None]) & 3).reshape(-1, QK)


def pack_q2(big_l: np.ndarray) -> np.ndarray:
    """(n, 256) 2-bit levels -> (n, 64) qs (the inverse of ``unpack_q2``)."""
    lv = big_l.reshape(-1, 2, 4, 32).astype(np.uint8)
    return (lv[:, :, 0] | lv[:, :, 1] << 2 | lv[:, :, 2] << 4 | lv[:, :, 3] << 6).reshape(-1, 64)


def quantize_blocks_numpy(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 256) float32 -> ``out``, (n,) Q2_K structs. The readable spec."""
    n = len(x)
    x = flush(x, ftz)
    xs = x.reshape(n * 16, 16)
    scales, big_l, mins = make_qkx2_quants(xs, np.abs(xs), 3, -0.5, 0.1, 15, True, ftz)
    scales, mins, big_l = scales.reshape(n, 16), mins.reshape(n, 16), big_l.reshape(n, 16, 16)
    max_scale, max_min = strict_max(scales), strict_max(mins)
    has_s, has_m = max_scale > 0, max_min > 0
    iscale = div(F15, np.where(has_s, max_scale, 1), ftz)
    sc = np.where(has_s[:, None], nearest_int_k(mul(iscale[:, None], scales, ftz)) & 0xFF, 0)
    imin = div(F15, np.where(has_m, max_min, 1), ftz)
    sc = np.where(has_m[:, None], sc | (nearest_int_k(mul(imin[:, None], mins, ftz)) << 4) & 0xFF, sc)
    d16 = fp32_to_fp16_bits(np.where(has_s, div(max_scale, F15, ftz), np.float32(0)))
    dmin16 = fp32_to_fp16_bits(np.where(has_m, div(max_min, F15, ftz), np.float32(0)))
    dd = mul(fp16_bits_to_fp32(d16)[:, None], sc & 0xF, ftz)
    dm = mul(fp16_bits_to_fp32(dmin16)[:, None], sc >> 4, ftz)
    xg = x.reshape(n, 16, 16)
    requant = clamp(nearest_int_k(div(add(xg, dm[..., None], ftz), dd[..., None], ftz)), 0, 3)
    big_l = np.where((dd != 0)[..., None], requant, big_l)
    out["scales"] = sc
    out["qs"] = pack_q2(big_l.reshape(n, QK))
    out["d"] = d16
    out["dmin"] = dmin16


def dequantize_blocks_numpy(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    """(n,) Q2_K structs -> ``y``, (n, 256) float32."""
    n = len(blocks)
    sc = blocks["scales"]
    dl = mul(fp16_bits_to_fp32(blocks["d"])[:, None], sc & 0xF, ftz)
    ml = mul(fp16_bits_to_fp32(blocks["dmin"])[:, None], sc >> 4, ftz)
    q = unpack_q2(blocks["qs"]).reshape(n, 16, 16)
    y[...] = sub(mul(dl[..., None], q, ftz), ml[..., None], ftz).reshape(n, QK)


SCALES, QS, D, DMIN = 0, 16, 80, 82  # byte offsets in the block
CHUNK = 64  # blocks per parallel task


@njit(cache=True, error_model="numpy")
def _quantize_block_nb(x, raw, big_l, laux, w, scales, mins, scratch, ftz):
    max_scale = np.float32(0.0)
    max_min = np.float32(0.0)
    for j in range(16):
        o = 16 * j
        for k in range(16):
            w[k] = abs(x[o + k])
        scales[j], mins[j] = make_qkx2_quants_nb(x, o, 16, w, 3, -0.5, 0.1, 15, True, big_l, laux, ftz)
        if scales[j] > max_scale:
            max_scale = scales[j]
        if mins[j] > max_min:
            max_min = mins[j]
    d = np.float32(0.0)
    dmin = np.float32(0.0)
    for j in range(16):
        raw[SCALES + j] = 0
    if max_scale > 0:
        iscale = div_nb(15, max_scale, ftz)
        for j in range(16):
            raw[SCALES + j] = np.uint8(nearest_int_k_nb(mul_nb(iscale, scales[j], ftz)) & 0xFF)
        d = div_nb(max_scale, 15, ftz)
    if max_min > 0:
        iscale = div_nb(15, max_min, ftz)
        for j in range(16):
            raw[SCALES + j] |= np.uint8((nearest_int_k_nb(mul_nb(iscale, mins[j], ftz)) << 4) & 0xFF)
        dmin = div_nb(max_min, 15, ftz)
    hd = fp32_to_fp16_bits_nb(d, scratch)
    hm = fp32_to_fp16_bits_nb(dmin, scratch)
    raw[D], raw[D + 1], raw[DMIN], raw[DMIN + 1] = hd & 0xFF, hd >> 8, hm & 0xFF, hm >> 8
    df = fp16_bits_to_fp32_nb(hd)
    mf = fp16_bits_to_fp32_nb(hm)
    for j in range(16):
        sc = np.int32(raw[SCALES + j])
        dd = mul_nb(df, sc & 0xF, ftz)
        if dd == 0:
            continue
        dm = mul_nb(mf, sc >> 4, ftz)
        for k in range(16):
            big_l[16 * j + k] = clamp_nb(nearest_int_k_nb(div_nb(add_nb(x[16 * j + k], dm, ftz), dd, ftz)), 0, 3)
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
        laux = np.empty(16, np.int32)
        w = np.empty(16, np.float32)
        scales = np.empty(16, np.float32)
        mins = np.empty(16, np.float32)
        scratch = np.empty(1, np.float32)
        for i in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
            _quantize_block_nb(x[i], raw[i], big_l, laux, w, scales, mins, scratch, ftz)


def quantize_blocks_numba(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 256) float32 -> ``out``, (n,) Q2_K structs; the fast twin of the numpy spec."""
    _quantize_nb(flush(x, ftz), out.view(np.uint8).reshape(len(x), Q2_K.type_size), ftz)


@njit(cache=True, parallel=True, error_model="numpy")
def _dequantize_nb(raw, d, dmin, y, ftz):
    n = raw.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        for i in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
            for g in range(16):
                sc = np.int32(raw[i, SCALES + g])
                dl = mul_nb(d[i], sc & 0xF, ftz)
                ml = mul_nb(dmin[i], sc >> 4, ftz)
                for t in range(16):
                    e = 16 * g + t
                    q = (np.int32(raw[i, QS + 32 * (e >> 7) + (e & 31)]) >> (2 * ((e >> 5) & 3))) & 3
                    y[i, e] = sub_nb(mul_nb(dl, q, ftz), ml, ftz)


def dequantize_blocks_numba(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    """(n,) Q2_K structs -> ``y``, (n, 256) float32; the fast twin."""
    raw = blocks.view(np.uint8).reshape(len(blocks), Q2_K.type_size)
    _dequantize_nb(raw, fp16_bits_to_fp32(blocks["d"]), fp16_bits_to_fp32(blocks["dmin"]), y, ftz)

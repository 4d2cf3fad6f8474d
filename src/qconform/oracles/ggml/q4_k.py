"""Q4_K: 256 values -> 8 sub-blocks of 32, x ~ d*sc*q - dmin*m, 4-bit q, 6-bit sc and m.

Source: ggml-org/ggml src/ggml-quants.c ``quantize_row_q4_K_ref``, ``dequantize_row_q4_K`` and
``get_scale_min_k4`` (layout: src/ggml-common.h ``block_q4_K``, K_SCALE_SIZE = 12). Quantize, all
fp32 (no FMA), nearest_int = round half to even:
  per sub-block j: sum_x2 = sum of x*x in order; av_x = sqrtf(sum_x2/32); w = av_x + |x|
                   scales[j], L, mins[j] = make_qkx2_quants(32, 15, x, w, rmin=-1, rdelta=0.1,
                   nstep=20, use_mad=false)
  max_scale, max_min: strict ``>`` maxima from 0; inv_scale = max_scale > 0 ? 63/max_scale : 0
  ls = MIN(63, (uint8_t)nearest_int(inv_scale*scales[j])), lm likewise, packed 6+6 bits into 12
  bytes; d = fp16(max_scale/63), dmin = fp16(max_min/63)
  per j: dd = h2f(d)*sc; dd == 0 keeps make_qkx2's L; else dm = h2f(dmin)*m,
         L = clamp(nearest_int((x + dm)/dd), 0, 15)
  qs[32c + l] = L[64c + l] | L[64c + 32 + l] << 4
Dequantize: y = (h2f(d)*sc)*q - h2f(dmin)*m.
Q5_K (q5_k.py) is this with 5-bit levels: the shared steps take ``nmax``, ``rmin`` and ``nstep``.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from qconform.formats.fp16 import fp16_bits_to_fp32, fp32_to_fp16_bits
from qconform.formats.ftz import flush
from qconform.formats.ggml import Q4_K
from qconform.oracles.ggml.kquant_search import (
    add,
    add_nb,
    clamp,
    clamp_nb,
    div,
    div_nb,
    fp16_bits_to_fp32_nb,
    fp32_to_fp16_bits_nb,
    get_scale_min_k4,
    get_scale_min_k4_nb,
    make_qkx2_quants,
    make_qkx2_quants_nb,
    mul,
    mul_nb,
    nearest_int_k,
    nearest_int_k_nb,
    pack_scale_min_k4,
    pack_scale_min_k4_nb,
    sqrt_nb,
    strict_max,
    sub,
    sub_nb,
)

QK = Q4_K.block_size
F63 = np.float32(63.0)


def quantize_scales_numpy(
    x: np.ndarray, nmax: int, rmin: float, nstep: int, ftz: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The steps Q4_K and Q5_K share, on flushed (n, 256) x -> (d, dmin fp16 bits, the 12 scale
    bytes, the final levels L (n, 256) in [0, nmax])."""
    n = len(x)
    xs = x.reshape(n * 8, 32)
    sum_x2 = np.zeros(len(xs), np.float32)
    for k in range(32):
        sum_x2 = add(sum_x2, mul(xs[:, k], xs[:, k], ftz), ftz)
    av_x = flush(np.sqrt(div(sum_x2, np.float32(32), ftz)), ftz)
    w = add(av_x[:, None], np.abs(xs), ftz)
    scales, big_l, mins = make_qkx2_quants(xs, w, nmax, rmin, 0.1, nstep, False, ftz)
    scales, mins = scales.reshape(n, 8), mins.reshape(n, 8)
    max_scale, max_min = strict_max(scales), strict_max(mins)
    inv_scale = np.where(max_scale > 0, div(F63, np.where(max_scale > 0, max_scale, 1), ftz), np.float32(0))
    inv_min = np.where(max_min > 0, div(F63, np.where(max_min > 0, max_min, 1), ftz), np.float32(0))
    ls = np.minimum(63, nearest_int_k(mul(inv_scale[:, None], scales, ftz)) & 0xFF)  # (uint8_t), then MIN
    lm = np.minimum(63, nearest_int_k(mul(inv_min[:, None], mins, ftz)) & 0xFF)
    packed = pack_scale_min_k4(ls, lm)
    d16 = fp32_to_fp16_bits(div(max_scale, F63, ftz))
    dmin16 = fp32_to_fp16_bits(div(max_min, F63, ftz))
    sc, m = get_scale_min_k4(packed)
    dd = mul(fp16_bits_to_fp32(d16)[:, None], sc, ftz)
    dm = mul(fp16_bits_to_fp32(dmin16)[:, None], m, ftz)
    xg = x.reshape(n, 8, 32)
    requant = clamp(nearest_int_k(div(add(xg, dm[..., None], ftz), dd[..., None], ftz)), 0, nmax)
    big_l = np.where((dd != 0)[..., None], requant, big_l.reshape(n, 8, 32))
    return d16, dmin16, packed, big_l.reshape(n, QK)


def quantize_blocks_numpy(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 256) float32 -> ``out``, (n,) Q4_K structs. The readable spec."""
    d16, dmin16, packed, big_l = quantize_scales_numpy(flush(x, ftz), 15, -1.0, 20, ftz)
    lv = big_l.reshape(-1, 4, 2, 32)  # [c, t, l] for element 64c + 32t + l
    out["d"] = d16
    out["dmin"] = dmin16
    out["scales"] = packed
    out["qs"] = (lv[:, :, 0] | lv[:, :, 1] << 4).reshape(-1, 128)


def dequantize_from(d: np.ndarray, dmin: np.ndarray, scales: np.ndarray, q: np.ndarray, ftz: bool) -> np.ndarray:
    """y (n, 256) = (d*sc)*q - dmin*m per sub-block of 32, from fp32 d, dmin (n,), the 12 scale
    bytes and levels q (n, 256): the dequantizer Q4_K and Q5_K share."""
    n = len(q)
    sc, m = get_scale_min_k4(scales)
    d1 = mul(d[:, None], sc, ftz)
    m1 = mul(dmin[:, None], m, ftz)
    return sub(mul(d1[..., None], q.reshape(n, 8, 32), ftz), m1[..., None], ftz).reshape(n, QK)


def dequantize_blocks_numpy(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    """(n,) Q4_K structs -> ``y``, (n, 256) float32."""
    qs = blocks["qs"].reshape(-1, 4, 1, 32)
    q = (qs >> np.array([0, 4], np.uint8)[None, None, :, None]) & 0xF
    d, dmin = fp16_bits_to_fp32(blocks["d"]), fp16_bits_to_fp32(blocks["dmin"])
    y[...] = dequantize_from(d, dmin, blocks["scales"], q.reshape(-1, QK), ftz)


D, DMIN, SCALES, QS = 0, 2, 4, 16  # byte offsets in the block (Q5_K's first three are the same)
CHUNK = 32  # blocks per parallel task (quantize)
# every fp16 bit pattern's float32 (fp16_bits_to_fp32, NaN payloads kept): the numba dequantizers'
# d and dmin, as ggml's CPU backend reads them from ggml_table_f32_f16
F16_TO_F32 = fp16_bits_to_fp32(np.arange(1 << 16, dtype=np.uint16))


@njit(cache=True, error_model="numpy")
def quantize_scales_nb(x, raw, big_l, laux, w, scales, mins, ls, lm, scratch, nmax, rmin, nstep, ftz):
    """The steps Q4_K and Q5_K share, for one block: d, dmin and scales into raw[0:16], the final
    levels into big_l."""
    max_scale = np.float32(0.0)
    max_min = np.float32(0.0)
    for j in range(8):
        o = 32 * j
        sum_x2 = np.float32(0.0)
        for k in range(32):
            sum_x2 = add_nb(sum_x2, mul_nb(x[o + k], x[o + k], ftz), ftz)
        av_x = sqrt_nb(div_nb(sum_x2, 32, ftz), ftz)
        for k in range(32):
            w[k] = add_nb(av_x, abs(x[o + k]), ftz)
        scales[j], mins[j] = make_qkx2_quants_nb(x, o, 32, w, nmax, rmin, 0.1, nstep, False, big_l, laux, ftz)
        if scales[j] > max_scale:
            max_scale = scales[j]
        if mins[j] > max_min:
            max_min = mins[j]
    inv_scale = div_nb(63, max_scale, ftz) if max_scale > 0 else np.float32(0.0)
    inv_min = div_nb(63, max_min, ftz) if max_min > 0 else np.float32(0.0)
    for j in range(8):
        ls[j] = min(63, nearest_int_k_nb(mul_nb(inv_scale, scales[j], ftz)) & 0xFF)
        lm[j] = min(63, nearest_int_k_nb(mul_nb(inv_min, mins[j], ftz)) & 0xFF)
    pack_scale_min_k4_nb(ls, lm, raw, SCALES)
    hd = fp32_to_fp16_bits_nb(div_nb(max_scale, 63, ftz), scratch)
    hm = fp32_to_fp16_bits_nb(div_nb(max_min, 63, ftz), scratch)
    raw[D], raw[D + 1], raw[DMIN], raw[DMIN + 1] = hd & 0xFF, hd >> 8, hm & 0xFF, hm >> 8
    df = fp16_bits_to_fp32_nb(hd)
    mf = fp16_bits_to_fp32_nb(hm)
    for j in range(8):
        sc, m = get_scale_min_k4_nb(j, raw, SCALES)
        dd = mul_nb(df, sc, ftz)
        if dd == 0:
            continue
        dm = mul_nb(mf, m, ftz)
        for k in range(32):
            big_l[32 * j + k] = clamp_nb(nearest_int_k_nb(div_nb(add_nb(x[32 * j + k], dm, ftz), dd, ftz)), 0, nmax)


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
            quantize_scales_nb(x[i], raw[i], big_l, laux, w, scales, mins, ls, lm, scratch, 15, -1.0, 20, ftz)
            for cc in range(4):
                for k in range(32):
                    raw[i, QS + 32 * cc + k] = np.uint8(big_l[64 * cc + k] | (big_l[64 * cc + 32 + k] << 4))


def quantize_blocks_numba(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 256) float32 -> ``out``, (n,) Q4_K structs; the fast twin of the numpy spec."""
    _quantize_nb(flush(x, ftz), out.view(np.uint8).reshape(len(x), Q4_K.type_size), ftz)


@njit(cache=True, parallel=True, error_model="numpy")
def _dequantize_nb(raw, f16, y, ftz):
    """Per block, per pair of sub-blocks 2c, 2c+1 (the low and high nibbles of qs[32c:32c+32]):
    y = (d*sc)*q - dmin*m. Without ftz the inner loop is plain fp32 arithmetic (no contraction:
    numba does not fuse without fastmath), which LLVM vectorizes."""
    for i in prange(raw.shape[0]):
        di = f16[np.int32(raw[i, D]) | (np.int32(raw[i, D + 1]) << 8)]
        mi = f16[np.int32(raw[i, DMIN]) | (np.int32(raw[i, DMIN + 1]) << 8)]
        for c in range(4):
            sc0, m0 = get_scale_min_k4_nb(2 * c, raw[i], SCALES)
            sc1, m1 = get_scale_min_k4_nb(2 * c + 1, raw[i], SCALES)
            d0, d1 = mul_nb(di, sc0, ftz), mul_nb(di, sc1, ftz)
            n0, n1 = mul_nb(mi, m0, ftz), mul_nb(mi, m1, ftz)
            if ftz:
                for k in range(32):
                    b = np.int32(raw[i, QS + 32 * c + k])
                    y[i, 64 * c + k] = sub_nb(mul_nb(d0, b & 0xF, ftz), n0, ftz)
                    y[i, 64 * c + 32 + k] = sub_nb(mul_nb(d1, b >> 4, ftz), n1, ftz)
            else:
                for k in range(32):
                    b = raw[i, QS + 32 * c + k]
                    y[i, 64 * c + k] = d0 * np.float32(b & np.uint8(0xF)) - n0
                    y[i, 64 * c + 32 + k] = d1 * np.float32(b >> np.uint8(4)) - n1


def dequantize_blocks_numba(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    """(n,) Q4_K structs -> ``y``, (n, 256) float32; the fast twin."""
    raw = blocks.view(np.uint8).reshape(len(blocks), Q4_K.type_size)
    _dequantize_nb(raw, F16_TO_F32, y, ftz)

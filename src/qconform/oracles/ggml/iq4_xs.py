"""IQ4_XS: 256 values -> fp16 ``d`` + eight 6-bit sub-block scales + 256 indices into ``kvalues_iq4nl``.

Source: ggml-org/ggml src/ggml-quants.c ``quantize_iq4_xs`` (which ``quantize_row_iq4_xs_ref``
calls; ``ntry = 7``, no quant_weights) through ``quantize_row_iq4_nl_impl(QK_K, 32, ...)``, and
``dequantize_row_iq4_xs``. The per-sub-block search and ``best_index`` are IQ4_NL's (``iq4_nl``).
Then, all fp32 (no FMA):
  first strict max of |scale| over the 8 sub-blocks (signed max_scale; a NaN scale never wins)
  d = -max_scale/32 (an all-zero superblock: -0.0, 0x8000); d stored as fp16; id = d ? 1/d : 0
  per sub-block ib: l = MAX(-32, MIN(31, nearest_int(id*scale[ib])))   (round half to even)
                    dl = d*(float)l (the fp32 d, not fp16(d)); idl = dl ? 1/dl : 0
                    L[j] = best_index(idl*x[j])
                    l += 32:   scales_l[ib/2] |= (l & 15) << 4*(ib%2); scales_h |= (l >> 4) << 2*ib
  qs[16*ib + j] = L[32*ib + j] | L[32*ib + 16 + j] << 4
  (an all-zero superblock: d = 0x8000, scales_h = 0xAAAA, scales_l = 0, qs = 0x88)
A NaN scale is x86's default NaN (see ``iq4_nl``): nearest_int gives 0 for it.
Dequantize: dl = fp16_to_fp32(d) * (float)(ls - 32); y = dl * (float)kv[index].
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from qconform.formats.fp16 import fp16_bits_to_fp32, fp32_to_fp16_bits
from qconform.formats.ftz import flush
from qconform.formats.ggml import IQ4_XS
from qconform.oracles.ggml.iq4_nl import KV, best_index, best_index_nb, pack_indices, subblock_scale_nb, subblock_scales
from qconform.oracles.ggml.rounding import flush_nb, nearest_int, nearest_int_nb

QK = IQ4_XS.block_size
SUB = 32
NSUB = QK // SUB
NTRY = 7
ONE = np.float32(1.0)
ZERO = np.float32(0.0)
F32 = np.float32(32.0)


def quantize_blocks_numpy(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 256) float32 -> ``out``, (n,) IQ4_XS structs. The readable spec."""
    n = len(x)
    xs = flush(x, ftz).reshape(n * NSUB, SUB)
    scales = subblock_scales(xs, NTRY, ftz)[0].reshape(n, NSUB)
    amax = np.zeros(n, np.float32)
    max_scale = np.zeros(n, np.float32)
    for ib in range(NSUB):  # first strict max of |scale|; NaN never wins
        a = np.abs(scales[:, ib])
        upd = a > amax
        amax = np.where(upd, a, amax)
        max_scale = np.where(upd, scales[:, ib], max_scale)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        d = flush(-max_scale / F32, ftz)
        idd = np.where(d != 0, flush(ONE / np.where(d != 0, d, ONE), ftz), ZERO)
        li = np.clip(nearest_int(flush(idd[:, None] * scales, ftz), scales), -32, 31)
        dl = flush(d[:, None] * li.astype(np.float32), ftz)
        idl = np.where(dl != 0, flush(ONE / np.where(dl != 0, dl, ONE), ftz), ZERO)
        idx = best_index(flush(idl.reshape(-1, 1) * xs, ftz))
    ls = (li + 32).astype(np.int64)
    out["d"] = fp32_to_fp16_bits(d)
    out["scales_h"] = ((ls >> 4) << (2 * np.arange(NSUB))).sum(axis=1).astype(np.uint16)
    out["scales_l"] = ((ls[:, 0::2] & 15) | ((ls[:, 1::2] & 15) << 4)).astype(np.uint8)
    out["qs"] = pack_indices(idx).reshape(n, QK // 2)


def dequantize_blocks_numpy(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    """(n,) IQ4_XS structs -> ``y``, (n, 256) float32."""
    n = len(blocks)
    ib = np.arange(NSUB)
    lo = (blocks["scales_l"][:, ib // 2].astype(np.int32) >> (4 * (ib % 2))) & 15
    hi = (blocks["scales_h"][:, None].astype(np.int32) >> (2 * ib)) & 3
    d = flush(fp16_bits_to_fp32(blocks["d"]), ftz)
    qs = blocks["qs"].reshape(n * NSUB, SUB // 2)
    idx = np.concatenate([qs & 15, qs >> 4], axis=1).reshape(n, NSUB, SUB)
    with np.errstate(invalid="ignore", over="ignore"):
        dl = flush(d[:, None] * ((lo | (hi << 4)) - 32).astype(np.float32), ftz)
        y[...] = flush(dl[:, :, None] * KV[idx], ftz).reshape(n, QK)


CHUNK = 16  # superblocks per parallel task


@njit(cache=True, parallel=True)
def _quantize_nb(x, raw, d_out, ftz):
    n = x.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        xb = np.empty(QK, np.float32)
        L = np.empty(QK, np.int64)
        scales = np.empty(NSUB, np.float32)
        for i in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
            for j in range(QK):
                xb[j] = flush_nb(x[i, j], ftz)
            amax = ZERO
            max_scale = ZERO
            for ib in range(NSUB):
                s = subblock_scale_nb(xb[ib * SUB : (ib + 1) * SUB], L[ib * SUB : (ib + 1) * SUB], NTRY, ftz)[0]
                scales[ib] = s
                if abs(s) > amax:
                    amax = abs(s)
                    max_scale = s
            d = flush_nb(np.float32(-max_scale / F32), ftz)
            idd = flush_nb(np.float32(ONE / d), ftz) if d != 0 else ZERO
            sh = 0
            for ib in range(NSUB):
                # a NaN scale is x86's default NaN (payload 0): nearest_int gives 0 either way
                p = flush_nb(np.float32(idd * scales[ib]), ftz)
                li = max(-32, min(31, nearest_int_nb(p, False, np.int32(0))))
                dl = flush_nb(np.float32(d * np.float32(li)), ftz)
                idl = flush_nb(np.float32(ONE / dl), ftz) if dl != 0 else ZERO
                for j in range(SUB // 2):
                    k0 = best_index_nb(flush_nb(np.float32(idl * xb[ib * SUB + j]), ftz))
                    k1 = best_index_nb(flush_nb(np.float32(idl * xb[ib * SUB + SUB // 2 + j]), ftz))
                    raw[i, 8 + ib * (SUB // 2) + j] = np.uint8(k0 | (k1 << 4))
                ls = li + 32
                if ib % 2 == 0:
                    raw[i, 4 + ib // 2] = np.uint8(ls & 15)
                else:
                    raw[i, 4 + ib // 2] |= np.uint8((ls & 15) << 4)
                sh |= (ls >> 4) << (2 * ib)
            raw[i, 2] = np.uint8(sh & 0xFF)
            raw[i, 3] = np.uint8(sh >> 8)
            d_out[i] = d


def quantize_blocks_numba(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 256) float32 -> ``out``, (n,) IQ4_XS structs; the fast twin of the numpy spec."""
    d = np.empty(len(x), np.float32)
    _quantize_nb(x, out.view(np.uint8).reshape(len(x), IQ4_XS.type_size), d, ftz)
    out["d"] = fp32_to_fp16_bits(d)


@njit(cache=True, parallel=True)
def _dequantize_nb(d, scales_h, scales_l, qs, y, ftz):
    n = qs.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        for i in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
            di = flush_nb(d[i], ftz)
            for ib in range(NSUB):
                ls = ((scales_l[i, ib // 2] >> (4 * (ib % 2))) & 15) | (((np.int32(scales_h[i]) >> (2 * ib)) & 3) << 4)
                dl = flush_nb(np.float32(di * np.float32(ls - 32)), ftz)
                for j in range(SUB // 2):
                    b = qs[i, ib * (SUB // 2) + j]
                    y[i, ib * SUB + j] = flush_nb(np.float32(dl * KV[b & 15]), ftz)
                    y[i, ib * SUB + SUB // 2 + j] = flush_nb(np.float32(dl * KV[b >> 4]), ftz)


def dequantize_blocks_numba(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    d = fp16_bits_to_fp32(blocks["d"])
    _dequantize_nb(d, np.ascontiguousarray(blocks["scales_h"]), blocks["scales_l"], blocks["qs"], y, ftz)

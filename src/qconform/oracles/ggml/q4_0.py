"""Q4_0: 32 values -> fp16 ``d`` + 32 4-bit codes, symmetric, offset 8, round half up.

Source: ggml-org/ggml src/ggml-quants.c ``quantize_row_q4_0_ref`` and ``dequantize_row_q4_0``.
Quantize, all fp32 (no FMA):
  first strict max: if (amax < fabsf(x[j])) {amax = fabsf(x[j]); max = x[j];}  (first index wins
                    on equal |x|; a NaN never wins)
  d = max / -8; id = d ? 1.0f/d : 0.0f               (an all-zero block: d = -0.0, 0x8000)
  d stored as fp16 (RNE, NaN -> 0x7E00)
  xi = MIN(15, (int8_t)(x[j]*id + 8.5f))             (truncation after an fp32 add: half up)
  qs[j] = xi[j] | xi[j+16] << 4
Dequantize: y = (float)((qs nibble) - 8) * fp16_to_fp32(d).
The shared rules (float -> int8 on x86-64, nibble order) are in ``legacy``.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from qconform.formats.fp16 import fp16_bits_to_fp32, fp32_to_fp16_bits
from qconform.formats.ggml import Q4_0
from qconform.oracles.ggml import legacy
from qconform.oracles.ggml.q8_0 import store_fp16_d_nb
from qconform.oracles.ggml.scan import INF_BITS, abs_bits_max_nb, first_index_of_nb

BITS = 4
QK = Q4_0.block_size
HALF = QK // 2
QS = 2  # byte offset of qs in the block
CHUNK = 1024  # blocks per parallel task
EIGHT = np.float32(8.0)
NEG8 = np.float32(-8.0)
BIAS = np.float32(8.5)
ONE = np.float32(1.0)
ZERO = np.float32(0.0)


def quantize_blocks_numpy(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 32) float32 -> ``out``, (n,) Q4_0 structs. The readable spec."""
    d, q = legacy.symmetric_codes(x, BITS, ftz)
    out["d"] = fp32_to_fp16_bits(d)
    out["qs"] = legacy.pack_nibbles(q, BITS)


def dequantize_blocks_numpy(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    """(n,) Q4_0 structs -> ``y``, (n, 32) float32."""
    q = legacy.unpack_codes(blocks["qs"], None)
    y[...] = legacy.dequantize_symmetric(q, fp16_bits_to_fp32(blocks["d"]), 8, ftz)


@njit(cache=True, inline="always")
def _code_nb(v, idd):
    """MIN(15, (int8_t)(v*id + 8.5f)) as the stored byte (no ftz): fp32 ops, branch-free."""
    b = legacy.trunc_byte_nb(np.float32(np.float32(v * idd) + BIAS))
    return min(15, (b ^ 0x80) - 0x80) & 0xFF


@njit(cache=True, inline="always")
def _quantize_block_general(x, i, raw, ftz):
    """The reference loop (legacy.symmetric_nb at 4 bits): NaN-aware first strict max, the ftz
    flushes. Returns d."""
    d, idd = legacy.symmetric_scale_nb(x, i, EIGHT, ftz)
    for j in range(HALF):
        q0 = legacy._symmetric_code(x[i, j], idd, BIAS, 15, ftz)
        q1 = legacy._symmetric_code(x[i, j + HALF], idd, BIAS, 15, ftz)
        raw[i, QS + j] = np.uint8((q0 | (q1 << 4)) & 0xFF)
    return d


@njit(cache=True, parallel=True)
def _quantize_nb(x, xbits, raw, ftz):
    """NaN-free blocks without ftz: the max |x| as an integer max of the bit patterns and its first
    index (scan.py; all-zero blocks keep max = +0 as the reference's loop does), then a code loop
    that vectorizes; other blocks take the reference's loop. d goes in as fp16 bits."""
    n = x.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        lo, hi = c * CHUNK, min(n, (c + 1) * CHUNK)
        d = np.empty(hi - lo, np.float32)
        dbits = d.view(np.uint32)
        for i in range(lo, hi):
            top = abs_bits_max_nb(xbits, i)
            if ftz or top > INF_BITS:
                d[i - lo] = _quantize_block_general(x, i, raw, ftz)
                continue
            mx = x[i, first_index_of_nb(xbits, i, top)] if top != 0 else ZERO
            di = np.float32(mx / NEG8)
            idd = np.float32(ONE / di) if di != 0 else ZERO
            for j in range(HALF):
                raw[i, QS + j] = np.uint8((_code_nb(x[i, j], idd) | (_code_nb(x[i, j + HALF], idd) << 4)) & 0xFF)
            d[i - lo] = di
        store_fp16_d_nb(raw, lo, hi, dbits)


def quantize_blocks_numba(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 32) float32 -> ``out``, (n,) Q4_0 structs; the fast twin of the numpy spec."""
    _quantize_nb(x, x.view(np.int32), out.view(np.uint8).reshape(len(x), Q4_0.type_size), ftz)


def dequantize_blocks_numba(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    d = fp16_bits_to_fp32(blocks["d"])
    legacy.dequantize_nb(blocks["qs"], np.zeros(len(blocks), np.uint32), d, d, y, 8, False, ftz)

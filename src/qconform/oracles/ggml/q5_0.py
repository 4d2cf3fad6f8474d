"""Q5_0: 32 values -> fp16 ``d`` + 32 5-bit codes, symmetric, offset 16, round half up.

Source: ggml-org/ggml src/ggml-quants.c ``quantize_row_q5_0_ref`` and ``dequantize_row_q5_0``.
Quantize, all fp32 (no FMA):
  first strict max as Q4_0; d = max / -16; id = d ? 1.0f/d : 0.0f; d stored as fp16
  xi = MIN(31, (int8_t)(x[j]*id + 16.5f))
  qs[j] = (xi[j] & 15) | (xi[j+16] & 15) << 4; qh bit j = bit 4 of xi[j]
  (an all-zero block: d = 0x8000, qh = 0xFFFFFFFF, qs = 0)
Dequantize: y = (float)(((qs nibble) | (qh bit) << 4) - 16) * fp16_to_fp32(d).
The shared rules (float -> int8 on x86-64, nibble and qh order) are in ``legacy``.
"""

from __future__ import annotations

import numpy as np

from qconform.formats.fp16 import fp16_bits_to_fp32, fp32_to_fp16_bits
from qconform.formats.ggml import Q5_0
from qconform.oracles.ggml import legacy

BITS = 5


def quantize_blocks_numpy(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 32) float32 -> ``out``, (n,) Q5_0 structs. The readable spec."""
    d, q = legacy.symmetric_codes(x, BITS, ftz)
    out["d"] = fp32_to_fp16_bits(d)
    out["qh"] = legacy.pack_qh(q)
    out["qs"] = legacy.pack_nibbles(q, BITS)


def dequantize_blocks_numpy(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    """(n,) Q5_0 structs -> ``y``, (n, 32) float32."""
    q = legacy.unpack_codes(blocks["qs"], blocks["qh"])
    y[...] = legacy.dequantize_symmetric(q, fp16_bits_to_fp32(blocks["d"]), 16, ftz)


def quantize_blocks_numba(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 32) float32 -> ``out``, (n,) Q5_0 structs; the fast twin of the numpy spec."""
    d = np.empty(len(x), np.float32)
    legacy.symmetric_nb(x, out.view(np.uint8).reshape(len(x), Q5_0.type_size), d, BITS, 6, ftz)
    out["d"] = fp32_to_fp16_bits(d)


def dequantize_blocks_numba(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    d = fp16_bits_to_fp32(blocks["d"])
    legacy.dequantize_nb(blocks["qs"], np.ascontiguousarray(blocks["qh"]), d, d, y, 16, False, ftz)

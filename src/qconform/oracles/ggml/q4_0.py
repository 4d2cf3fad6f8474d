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

from qconform.formats.fp16 import fp16_bits_to_fp32, fp32_to_fp16_bits
from qconform.formats.ggml import Q4_0
from qconform.oracles.ggml import legacy

BITS = 4


def quantize_blocks_numpy(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 32) float32 -> ``out``, (n,) Q4_0 structs. The readable spec."""
    d, q = legacy.symmetric_codes(x, BITS, ftz)
    out["d"] = fp32_to_fp16_bits(d)
    out["qs"] = legacy.pack_nibbles(q, BITS)


def dequantize_blocks_numpy(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    """(n,) Q4_0 structs -> ``y``, (n, 32) float32."""
    q = legacy.unpack_codes(blocks["qs"], None)
    y[...] = legacy.dequantize_symmetric(q, fp16_bits_to_fp32(blocks["d"]), 8, ftz)


def quantize_blocks_numba(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 32) float32 -> ``out``, (n,) Q4_0 structs; the fast twin of the numpy spec."""
    d = np.empty(len(x), np.float32)
    legacy.symmetric_nb(x, out.view(np.uint8).reshape(len(x), Q4_0.type_size), d, BITS, 2, ftz)
    out["d"] = fp32_to_fp16_bits(d)


def dequantize_blocks_numba(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    d = fp16_bits_to_fp32(blocks["d"])
    legacy.dequantize_nb(blocks["qs"], np.zeros(len(blocks), np.uint32), d, d, y, 8, False, ftz)

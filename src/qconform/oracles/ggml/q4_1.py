"""Q4_1: 32 values -> fp16 ``d`` and ``m`` + 32 4-bit codes, affine (x = d*q + m), round half up.

Source: ggml-org/ggml src/ggml-quants.c ``quantize_row_q4_1_ref`` and ``dequantize_row_q4_1``.
Quantize, all fp32 (no FMA):
  min = FLT_MAX, max = -FLT_MAX; for each v: if (v < min) min = v; if (v > max) max = v;
                                        (NaN never wins; an all-NaN block keeps the start values)
  d = (max - min) / 15; id = d ? 1.0f/d : 0.0f; d and min stored as fp16
  xi = MIN(15, (int8_t)((x[j] - min)*id + 0.5f))
  qs[j] = xi[j] | xi[j+16] << 4
Dequantize: y = (float)(qs nibble) * d + m   (a separate multiply and add).
The shared rules (float -> int8 on x86-64, nibble order) are in ``legacy``.
"""

from __future__ import annotations

import numpy as np

from qconform.formats.fp16 import fp16_bits_to_fp32, fp32_to_fp16_bits
from qconform.formats.ggml import Q4_1
from qconform.oracles.ggml import legacy

BITS = 4


def quantize_blocks_numpy(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 32) float32 -> ``out``, (n,) Q4_1 structs. The readable spec."""
    d, mn, q = legacy.affine_codes(x, BITS, True, ftz)
    out["d"] = fp32_to_fp16_bits(d)
    out["m"] = fp32_to_fp16_bits(mn)
    out["qs"] = legacy.pack_nibbles(q, BITS)


def dequantize_blocks_numpy(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    """(n,) Q4_1 structs -> ``y``, (n, 32) float32."""
    d, m = fp16_bits_to_fp32(blocks["d"]), fp16_bits_to_fp32(blocks["m"])
    y[...] = legacy.dequantize_affine(legacy.unpack_codes(blocks["qs"], None), d, m, ftz)


def quantize_blocks_numba(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 32) float32 -> ``out``, (n,) Q4_1 structs; the fast twin of the numpy spec."""
    d, mn = np.empty(len(x), np.float32), np.empty(len(x), np.float32)
    legacy.affine_nb(x, out.view(np.uint8).reshape(len(x), Q4_1.type_size), d, mn, BITS, True, 4, ftz)
    out["d"] = fp32_to_fp16_bits(d)
    out["m"] = fp32_to_fp16_bits(mn)


def dequantize_blocks_numba(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    d, m = fp16_bits_to_fp32(blocks["d"]), fp16_bits_to_fp32(blocks["m"])
    legacy.dequantize_nb(blocks["qs"], np.zeros(len(blocks), np.uint32), d, m, y, 0, True, ftz)

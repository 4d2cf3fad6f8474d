"""Q5_1: 32 values -> fp16 ``d`` and ``m`` + 32 5-bit codes, affine (x = d*q + m), round half up.

Source: ggml-org/ggml src/ggml-quants.c ``quantize_row_q5_1_ref`` and ``dequantize_row_q5_1``.
Quantize, all fp32 (no FMA): min, max, d = (max - min) / 31, id and the stores as Q4_1, then
  xi = (uint8_t)((x[j] - min)*id + 0.5f)          (no clamp, unlike Q4_1)
  qs[j] = (xi[j] & 15) | (xi[j+16] & 15) << 4; qh bit j = bit 4 of xi[j]
Dequantize: y = (float)((qs nibble) | (qh bit) << 4) * d + m   (a separate multiply and add).
The shared rules (float -> uint8 on x86-64, nibble and qh order) are in ``legacy``.
"""

from __future__ import annotations

import numpy as np

from qconform.formats.fp16 import fp16_bits_to_fp32, fp32_to_fp16_bits
from qconform.formats.ggml import Q5_1
from qconform.oracles.ggml import legacy

BITS = 5


def quantize_blocks_numpy(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 32) float32 -> ``out``, (n,) Q5_1 structs. The readable spec."""
    d, mn, q = legacy.affine_codes(x, BITS, False, ftz)
    out["d"] = fp32_to_fp16_bits(d)
    out["m"] = fp32_to_fp16_bits(mn)
    out["qh"] = legacy.pack_qh(q)
    out["qs"] = legacy.pack_nibbles(q, BITS)


def dequantize_blocks_numpy(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    """(n,) Q5_1 structs -> ``y``, (n, 32) float32."""
    d, m = fp16_bits_to_fp32(blocks["d"]), fp16_bits_to_fp32(blocks["m"])
    y[...] = legacy.dequantize_affine(legacy.unpack_codes(blocks["qs"], blocks["qh"]), d, m, ftz)


def quantize_blocks_numba(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
    """(n, 32) float32 -> ``out``, (n,) Q5_1 structs; the fast twin of the numpy spec."""
    d, mn = np.empty(len(x), np.float32), np.empty(len(x), np.float32)
    legacy.affine_nb(x, out.view(np.uint8).reshape(len(x), Q5_1.type_size), d, mn, BITS, False, 8, ftz)
    out["d"] = fp32_to_fp16_bits(d)
    out["m"] = fp32_to_fp16_bits(mn)


def dequantize_blocks_numba(blocks: np.ndarray, y: np.ndarray, ftz: bool = False) -> None:
    d, m = fp16_bits_to_fp32(blocks["d"]), fp16_bits_to_fp32(blocks["m"])
    legacy.dequantize_nb(blocks["qs"], np.ascontiguousarray(blocks["qh"]), d, m, y, 0, True, ftz)

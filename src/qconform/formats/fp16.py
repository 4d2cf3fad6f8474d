"""IEEE binary16 conversions as ggml does them.

Source: ggml-org/ggml src/ggml-impl.h, ``ggml_compute_fp32_to_fp16`` (the software routine used by
``GGML_FP32_TO_FP16`` in ggml-quants.c): round to nearest even, subnormals rounded correctly,
overflow to +-inf, and every NaN becomes ``sign | 0x7E00`` (payload dropped).
fp16 -> fp32 is exact.
"""

from __future__ import annotations

import numpy as np
from numba import njit

F16_QNAN = np.uint16(0x7E00)


def fp32_to_fp16_bits(x: np.ndarray) -> np.ndarray:
    """float32 array -> uint16 fp16 bit patterns (RNE; NaN -> sign|0x7E00 as ggml)."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        bits = x.astype(np.float16).view(np.uint16)
    sign = ((x.view(np.uint32) >> 16) & 0x8000).astype(np.uint16)
    return np.where(np.isnan(x), sign | F16_QNAN, bits).astype(np.uint16)


def fp16_bits_to_fp32(h: np.ndarray) -> np.ndarray:
    """uint16 fp16 bit patterns -> float32 (exact; NaN payloads shifted, not changed)."""
    return np.asarray(h, dtype=np.uint16).view(np.float16).astype(np.float32)


@njit(cache=True, inline="always")
def fp32_bits_to_fp16_bits_nb(u: np.uint32) -> np.uint16:
    """fp32 bit pattern -> fp16 bits with integer ops only (RNE, NaN -> sign|0x7E00), for numba
    loops; the tests prove it equal to ``fp32_to_fp16_bits``."""
    sign = (u >> np.uint32(16)) & np.uint32(0x8000)
    a = u & np.uint32(0x7FFFFFFF)
    if a > np.uint32(0x7F800000):  # NaN: ggml drops the payload
        return np.uint16(sign | np.uint32(0x7E00))
    if a >= np.uint32(0x477FF000):  # >= 65520, half-way above 65504: rounds to inf
        return np.uint16(sign | np.uint32(0x7C00))
    if a >= np.uint32(0x38800000):  # fp16 normal: rebias the exponent, round off 13 bits
        r = a - np.uint32(0x38000000)
        q = r >> np.uint32(13)
        rem = r & np.uint32(0x1FFF)
        if rem > np.uint32(0x1000) or (rem == np.uint32(0x1000) and (q & np.uint32(1)) != 0):
            q += np.uint32(1)  # a carry runs into the exponent, up to 0x7C00
        return np.uint16(sign | q)
    if a < np.uint32(0x33000000):  # below 2^-25, and 2^-25 itself (a tie to 0): zero
        return np.uint16(sign)
    shift = np.uint32(126) - (a >> np.uint32(23))  # value = m * 2^(e-150); fp16 unit 2^-24
    m = (a & np.uint32(0x007FFFFF)) | np.uint32(0x00800000)
    q = m >> shift
    rem = m & ((np.uint32(1) << shift) - np.uint32(1))
    half = np.uint32(1) << (shift - np.uint32(1))
    if rem > half or (rem == half and (q & np.uint32(1)) != 0):
        q += np.uint32(1)
    return np.uint16(sign | q)

"""IEEE binary16 conversions as ggml does them.

Source: ggml-org/ggml src/ggml-impl.h, ``ggml_compute_fp32_to_fp16`` (the software routine used by
``GGML_FP32_TO_FP16`` in ggml-quants.c): round to nearest even, subnormals rounded correctly,
overflow to +-inf, and every NaN becomes ``sign | 0x7E00`` (payload dropped).
fp16 -> fp32 is exact.
"""

from __future__ import annotations

import numpy as np

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


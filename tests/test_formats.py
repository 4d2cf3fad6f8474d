"""Block layouts and the fp16 helpers."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from qconform.formats.fp16 import fp16_bits_to_fp32, fp32_bits_to_fp16_bits_nb, fp32_to_fp16_bits
from qconform.formats.ggml import Q8_0, Q8_K


def test_layouts_match_ggml_common_h() -> None:
    # ggml-common.h: block_q8_0 {ggml_half d; int8_t qs[32];} = 34 bytes;
    # block_q8_K {float d; int8_t qs[256]; int16_t bsums[16];} = 4 + 256 + 32 = 292 bytes.
    assert (Q8_0.block_size, Q8_0.type_size) == (32, 34)
    assert {k: v[1] for k, v in Q8_0.dtype.fields.items()} == {"d": 0, "qs": 2}
    assert (Q8_K.block_size, Q8_K.type_size) == (256, 292)
    assert {k: v[1] for k, v in Q8_K.dtype.fields.items()} == {"d": 0, "qs": 4, "bsums": 260}


def test_fp16_nan_is_ggml_canonical() -> None:
    # ggml_compute_fp32_to_fp16 drops NaN payloads: sign | 0x7E00
    x = np.array([0x7FC00001, 0xFF800001, 0x7F800001, 0xFFFFFFFF], np.uint32).view(np.float32)
    assert fp32_to_fp16_bits(x).tolist() == [0x7E00, 0xFE00, 0x7E00, 0xFE00]


def test_fp16_edges() -> None:
    # 65504 is the largest finite half; 65519.996 rounds down to it, 65520 (the midpoint) to inf;
    # 2^-25 is the midpoint between 0 and the smallest subnormal 2^-24 and ties to 0 (even).
    x = np.array([65504, 65519.996, 65520, 2.0**-25, 2.0**-25 * 1.0000001, 2.0**-24, -0.0], np.float32)
    assert fp32_to_fp16_bits(x).tolist() == [0x7BFF, 0x7BFF, 0x7C00, 0x0000, 0x0001, 0x0001, 0x8000]


@njit(cache=True)
def _convert_all(bits: np.ndarray) -> np.ndarray:
    out = np.empty(bits.size, np.uint16)
    for i in range(bits.size):
        out[i] = fp32_bits_to_fp16_bits_nb(bits[i])
    return out


@pytest.mark.parametrize("region", ["all", "half_range", "ties"])
def test_numba_fp16_equals_numpy(region: str) -> None:
    rng = np.random.default_rng(7)
    if region == "all":
        bits = rng.integers(0, 2**32, size=1_000_000, dtype=np.uint64).astype(np.uint32)
    elif region == "half_range":  # 2^-31 .. 2^17, both signs: subnormal, normal and overflow halves
        bits = rng.integers(0x30000000, 0x48000000, size=1_000_000, dtype=np.uint64).astype(np.uint32)
        bits |= rng.integers(0, 2, size=bits.size, dtype=np.uint64).astype(np.uint32) << np.uint32(31)
    else:  # every midpoint between adjacent finite halves: the round-half-to-even cases
        h = np.arange(0x7BFF, dtype=np.uint16)
        mid = (h.view(np.float16).astype(np.float64) + (h + 1).view(np.float16).astype(np.float64)) / 2
        bits = np.concatenate([mid, -mid]).astype(np.float32).view(np.uint32)
    assert np.array_equal(_convert_all(bits), fp32_to_fp16_bits(bits.view(np.float32)))


def test_fp16_round_trip_is_exact() -> None:
    h = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    finite = (h & 0x7C00) != 0x7C00
    back = fp32_to_fp16_bits(fp16_bits_to_fp32(h))
    assert np.array_equal(back[finite], h[finite])

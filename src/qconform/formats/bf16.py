"""bfloat16 bit patterns (uint16) <-> float32, and the fp32 -> bf16 roundings upstream libraries use.

bf16 is the top half of an fp32, so widening is exact (``bits << 16``). Narrowing, four rules:
- ``rne``: round to nearest even, every NaN -> ``0x7FC0`` (PyTorch c10 ``round_to_nearest_even``,
  pytorch/pytorch c10/util/BFloat16.h, used by a scalar ``Tensor.to(torch.bfloat16)``);
- ``rne_ffff``: the same with every NaN -> ``0xFFFF`` (the AVX-512 ``cvtfp32_bf16`` of PyTorch's
  vectorized conversion and of bitsandbytes csrc/cpu_ops.cpp ``cvt_fp32_to_bf16`` without AVX512-BF16);
- ``bit_trick``: ``(bits + 0x7FFF + ((bits >> 16) & 1)) >> 16`` on the raw bits with no NaN guard
  (bitsandbytes csrc/cpu_ops.h ``float_to_bf16``), so a NaN may come out as an inf or a zero;
- ``cvtne``: x86 AVX512-BF16 ``vcvtneps2bf16``: fp32 subnormal inputs become a zero of the same sign,
  then the bit trick; a NaN keeps its top 16 bits with the quiet bit set.
"""

from __future__ import annotations

import numpy as np

BF16_RULES = ("rne", "rne_ffff", "bit_trick", "cvtne")
BF16_QNAN = np.uint16(0x7FC0)


def bf16_bits_to_fp32(h: np.ndarray) -> np.ndarray:
    """uint16 bf16 bit patterns -> float32 (exact)."""
    return (np.asarray(h, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def fp32_to_bf16_bits(x: np.ndarray, rule: str = "rne") -> np.ndarray:
    """float32 array -> uint16 bf16 bit patterns by one of ``BF16_RULES`` (see the module docstring)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32)
    if rule == "cvtne":
        subnormal = (u & np.uint32(0x7F800000)) == 0
        u = np.where(subnormal, u & np.uint32(0x80000000), u)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    if rule == "bit_trick":
        return rounded
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if rule in ("rne", "rne_ffff"):
        return np.where(nan, BF16_QNAN if rule == "rne" else np.uint16(0xFFFF), rounded).astype(np.uint16)
    if rule == "cvtne":
        return np.where(nan, ((u >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16), rounded).astype(np.uint16)
    raise ValueError(f"rule: must be one of {BF16_RULES}, got {rule!r}")


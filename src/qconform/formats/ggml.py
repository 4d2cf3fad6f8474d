"""ggml block layouts: one class per format, its byte layout in one place.

Source: ggml-org/ggml src/ggml-common.h (``block_q8_0``, ``block_q8_K``; ``QK8_0 = 32``, ``QK_K = 256``).
All multi-byte fields are little-endian and the structs have no padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BlockFormat:
    """A ggml block: ``block_size`` values stored in ``type_size`` bytes laid out as ``dtype``."""

    name: str
    type_id: int
    block_size: int
    dtype: np.dtype

    @property
    def type_size(self) -> int:
        return self.dtype.itemsize

    def blocks(self, data: np.ndarray) -> np.ndarray:
        """View uint8 block bytes (any leading shape, last axis a multiple of type_size) as structs."""
        flat = np.ascontiguousarray(data).reshape(-1)
        return flat.view(self.dtype)

    def n_bytes(self, n_values: int) -> int:
        return n_values // self.block_size * self.type_size

    def n_values(self, n_bytes: int) -> int:
        return n_bytes // self.type_size * self.block_size


# block_q8_0: fp16 d (offset 0), int8 qs[32] (offset 2)  -> 34 bytes
Q8_0 = BlockFormat(
    "Q8_0",
    8,
    32,
    np.dtype([("d", "<u2"), ("qs", "i1", (32,))]),
)

# block_q8_K: float32 d (offset 0), int8 qs[256] (offset 4), int16 bsums[16] (offset 260) -> 292 bytes
Q8_K = BlockFormat(
    "Q8_K",
    15,
    256,
    np.dtype([("d", "<f4"), ("qs", "i1", (256,)), ("bsums", "<i2", (16,))]),
)

FORMATS: dict[str, BlockFormat] = {f.name: f for f in (Q8_0, Q8_K)}

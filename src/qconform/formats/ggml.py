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

# block_q4_0: fp16 d (0), qs[16] (2): element j = qs[j] & 15, element j+16 = qs[j] >> 4 -> 18 bytes
Q4_0 = BlockFormat("Q4_0", 2, 32, np.dtype([("d", "<u2"), ("qs", "u1", (16,))]))

# block_q4_1: fp16 d (0), fp16 m (2), qs[16] (4) -> 20 bytes
Q4_1 = BlockFormat("Q4_1", 3, 32, np.dtype([("d", "<u2"), ("m", "<u2"), ("qs", "u1", (16,))]))

# block_q5_0: fp16 d (0), uint8_t qh[4] read as a LE uint32 (2): bit j = bit 4 of element j, qs[16] (6) -> 22
Q5_0 = BlockFormat("Q5_0", 6, 32, np.dtype([("d", "<u2"), ("qh", "<u4"), ("qs", "u1", (16,))]))

# block_q5_1: fp16 d (0), fp16 m (2), qh as in Q5_0 (4), qs[16] (8) -> 24 bytes
Q5_1 = BlockFormat("Q5_1", 7, 32, np.dtype([("d", "<u2"), ("m", "<u2"), ("qh", "<u4"), ("qs", "u1", (16,))]))

# block_q8_1: fp16 d (0), fp16 s = d * sum(qs) (2), int8 qs[32] (4) -> 36 bytes
Q8_1 = BlockFormat("Q8_1", 9, 32, np.dtype([("d", "<u2"), ("s", "<u2"), ("qs", "i1", (32,))]))

# block_iq4_nl: fp16 d (0), qs[16] (2), nibbles as Q4_0 indexing kvalues_iq4nl -> 18 bytes
IQ4_NL = BlockFormat("IQ4_NL", 20, 32, np.dtype([("d", "<u2"), ("qs", "u1", (16,))]))

# block_iq4_xs: fp16 d (0), uint16 scales_h (2), scales_l[4] (4), qs[128] (8) -> 136 bytes
IQ4_XS = BlockFormat(
    "IQ4_XS",
    23,
    256,
    np.dtype([("d", "<u2"), ("scales_h", "<u2"), ("scales_l", "u1", (4,)), ("qs", "u1", (128,))]),
)

# block_q2_K: scales[16] (0: low nibble sc, high nibble m), qs[64] (16), fp16 d (80), fp16 dmin (82) -> 84 bytes
Q2_K = BlockFormat(
    "Q2_K",
    10,
    256,
    np.dtype([("scales", "u1", (16,)), ("qs", "u1", (64,)), ("d", "<u2"), ("dmin", "<u2")]),
)

# block_q3_K: hmask[32] (0), qs[64] (32), scales[12] (96: 6-bit sc - 32), fp16 d (108) -> 110 bytes
Q3_K = BlockFormat(
    "Q3_K",
    11,
    256,
    np.dtype([("hmask", "u1", (32,)), ("qs", "u1", (64,)), ("scales", "u1", (12,)), ("d", "<u2")]),
)

# block_q4_K: fp16 d (0), fp16 dmin (2), scales[12] (4: 6-bit sc and m, get_scale_min_k4), qs[128] (16) -> 144
Q4_K = BlockFormat(
    "Q4_K",
    12,
    256,
    np.dtype([("d", "<u2"), ("dmin", "<u2"), ("scales", "u1", (12,)), ("qs", "u1", (128,))]),
)

# block_q5_K: fp16 d (0), fp16 dmin (2), scales[12] (4), qh[32] (16), qs[128] (48) -> 176 bytes
Q5_K = BlockFormat(
    "Q5_K",
    13,
    256,
    np.dtype([("d", "<u2"), ("dmin", "<u2"), ("scales", "u1", (12,)), ("qh", "u1", (32,)), ("qs", "u1", (128,))]),
)

# block_q6_K: ql[128] (0), qh[64] (128), int8 scales[16] (192), fp16 d (208) -> 210 bytes
Q6_K = BlockFormat(
    "Q6_K",
    14,
    256,
    np.dtype([("ql", "u1", (128,)), ("qh", "u1", (64,)), ("scales", "i1", (16,)), ("d", "<u2")]),
)

FORMATS: dict[str, BlockFormat] = {f.name: f for f in (Q8_0, Q8_K)}
FORMATS.update({f.name: f for f in (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)})
FORMATS.update({f.name: f for f in (Q4_0, Q4_1, Q5_0, Q5_1, Q8_1, IQ4_NL, IQ4_XS)})

"""Sub-byte packing as ONNX Runtime stores it: along the last axis, low bits first.

Element ``j`` of a packed row sits at bit offset ``j * bits`` of the row's little-endian bit
stream: for bits 2/4/8 that is byte ``j // (8 // bits)``, bit ``(j % (8 // bits)) * bits``
(docs/ort-ops.md 1.2: MatMulNBits B and zero points, GatherBlockQuantized uint8 data; ONNX int4/uint4
flat packing is the same rule on the flattened tensor). bits = 3 follows the same stream rule
(elements may straddle bytes). The last byte is padded; the padding is ignored on unpack.
"""

from __future__ import annotations

import numpy as np

from qconform.errors import ArgumentError

SUPPORTED_BITS = (2, 3, 4, 8)


def _check_bits(bits: int) -> None:
    if bits not in SUPPORTED_BITS:
        raise ArgumentError(f"bits: must be one of {SUPPORTED_BITS}, got {bits!r}")


def packed_size(count: int, bits: int) -> int:
    """Bytes holding ``count`` elements of ``bits`` bits."""
    return -(-count * bits // 8)


def unpack_bits(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """uint8 ``(..., ceil(count*bits/8))`` -> uint8 values ``(..., count)``."""
    _check_bits(bits)
    packed = np.asarray(packed)
    if packed.dtype != np.uint8:
        raise ArgumentError(f"packed: dtype must be uint8, got {packed.dtype}")
    if packed.shape[-1] < packed_size(count, bits):
        raise ArgumentError(
            f"packed: the last dimension holds {packed.shape[-1]} bytes, {count} {bits}-bit values need "
            f"{packed_size(count, bits)}"
        )
    if bits == 8:
        return packed[..., :count].copy()
    stream = np.unpackbits(packed, axis=-1, bitorder="little")[..., : count * bits]
    fields = stream.reshape(*packed.shape[:-1], count, bits).astype(np.uint8)
    weights = (1 << np.arange(bits)).astype(np.uint8)
    return (fields * weights).sum(axis=-1, dtype=np.uint8)


def pack_bits(values: np.ndarray, bits: int) -> np.ndarray:
    """uint8 values ``(..., n)``, each below ``2**bits`` -> packed uint8 ``(..., ceil(n*bits/8))``."""
    _check_bits(bits)
    values = np.asarray(values)
    if values.dtype != np.uint8:
        raise ArgumentError(f"values: dtype must be uint8, got {values.dtype}")
    if values.size and int(values.max()) >= 1 << bits:
        raise ArgumentError(f"values: every value must be below 2**{bits}, got {int(values.max())}")
    if bits == 8:
        return values.copy()
    n = values.shape[-1]
    fields = (values[..., None] >> np.arange(bits, dtype=np.uint8)) & 1
    stream = fields.reshape(*values.shape[:-1], n * bits)
    pad = packed_size(n, bits) * 8 - n * bits
    if pad:
        stream = np.concatenate([stream, np.zeros((*values.shape[:-1], pad), np.uint8)], axis=-1)
    return np.packbits(stream, axis=-1, bitorder="little")

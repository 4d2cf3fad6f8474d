"""com.microsoft.GatherBlockQuantized: gather rows of a blockwise-quantized table, dequantized.

Source: docs/ort-ops.md section 2 (ORT 1.31 schema; gather_block_quantized.cc;
experiments, all exact).
- uint8 data, bits 2/4/8: values packed along the last axis, low bits first; quantize_axis must
  be the last axis and gather_axis 0; zero points packed per row along the blocks, default
  2**(bits-1).
- int4 / uint4 data: ONNX flat sub-byte packing (low nibble = even flat index), int4 sign-extended;
  any quantize_axis; zero points an int4/uint4 tensor of the scales' shape, default **0 for both**.
- out = T2(fp32(float(d - zp) * float(scale[block]))), block = index // block_size along
  quantize_axis (other axes index scales directly); T2 = the scales' type (fp16: one RNE rounding).
- float8e4m3fn / float8e5m2 data (ORT 1.31+): out = T2(float(data) * float(scale)); no zero
  points; block_size 0 means the whole quantize axis is one block; a scales dim of 1 broadcasts.
- indices int32/int64; negative indices wrap (+dim); out of range gives an all-zero slice (ORT
  1.31+; 1.30 raised) -- ``out_of_range="error"`` raises instead.
Here ``data`` is always the raw bytes as numpy uint8 and ``data_type`` names what they hold.
"""

from __future__ import annotations

import numpy as np

from qconform.errors import ArgumentError
from qconform.formats.fp8 import FP8_TABLES
from qconform.oracles.ort._out import check_out, deliver, flushed
from qconform.oracles.ort.packing import packed_size, unpack_bits

DATA_TYPES = ("uint8", "int4", "uint4", "float8e4m3fn", "float8e5m2")
FLOAT_TYPES = (np.dtype(np.float32), np.dtype(np.float16))


def _logical(raw: np.ndarray, data_type: str, shape: tuple[int, ...], bits: int) -> np.ndarray:
    """Integer (or fp8 -> fp32) values of the logical tensor."""
    if data_type == "uint8":
        return unpack_bits(raw, bits, raw.shape[-1] * 8 // bits).astype(np.int32)
    if data_type in FP8_TABLES:
        return FP8_TABLES[data_type][raw]
    flat = unpack_bits(raw.reshape(-1), 4, int(np.prod(shape))).astype(np.int32)
    if data_type == "int4":
        flat = np.where(flat >= 8, flat - 16, flat)
    return flat.reshape(shape)


def check_gather_args(
    data, indices, scales, zero_points, bits, block_size, gather_axis, quantize_axis, data_type, data_shape
):
    if data_type not in DATA_TYPES:
        raise ArgumentError(f"data_type: must be one of {DATA_TYPES}, got {data_type!r}")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8:
        raise ArgumentError("data: must be a numpy uint8 array of the raw bytes")
    if not isinstance(indices, np.ndarray) or indices.dtype not in (np.int32, np.int64):
        raise ArgumentError("indices: must be a numpy int32 or int64 array")
    if not isinstance(scales, np.ndarray) or scales.dtype not in FLOAT_TYPES:
        raise ArgumentError("scales: must be a float32 or float16 numpy array")
    if data_type in ("int4", "uint4"):
        if data_shape is None:
            raise ArgumentError("data_shape: int4/uint4 data needs its logical shape")
        shape = tuple(int(d) for d in data_shape)
        if data.size != packed_size(int(np.prod(shape)), 4):
            raise ArgumentError(f"data: {shape} int4 values pack into {packed_size(int(np.prod(shape)), 4)} bytes")
        if bits != 4:
            raise ArgumentError(f"bits: must be 4 for {data_type}, got {bits}")
    elif data_type == "uint8":
        if bits not in (2, 4, 8):
            raise ArgumentError(f"bits: must be 2, 4 or 8 for uint8 data, got {bits}")
        shape = (*data.shape[:-1], data.shape[-1] * 8 // bits)
    else:
        shape = data.shape
    rank = len(shape)
    if rank < 1 or not (-rank <= gather_axis < rank and -rank <= quantize_axis < rank):
        raise ArgumentError(f"gather_axis/quantize_axis: must be axes of the rank-{rank} data")
    gax, qax = gather_axis % rank, quantize_axis % rank
    if data_type == "uint8" and (gax != 0 or qax != rank - 1 or gax == qax):
        raise ArgumentError("uint8 data: gather_axis must be 0 and quantize_axis the last axis (and differ)")
    fp8 = data_type in FP8_TABLES
    if not fp8 and (block_size < 16 or block_size & (block_size - 1)):
        raise ArgumentError(f"block_size: must be a power of two >= 16, got {block_size}")
    if fp8 and zero_points is not None:
        raise ArgumentError("zero_points: not allowed with float8 data")
    blocks = 1 if (fp8 and block_size == 0) else -(-shape[qax] // block_size)
    want = tuple(blocks if i == qax else d for i, d in enumerate(shape))
    ok = scales.shape == want or (
        fp8 and len(scales.shape) == rank and all(s in (w, 1) for s, w in zip(scales.shape, want, strict=True))
    )
    if not ok:
        raise ArgumentError(f"scales: shape must be {want}, got {scales.shape}")
    return shape, gax, qax, blocks


def gather_block_quantized(
    data: np.ndarray,
    indices: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None = None,
    *,
    bits: int = 4,
    block_size: int = 128,
    gather_axis: int = 0,
    quantize_axis: int = 1,
    data_type: str = "uint8",
    data_shape: tuple[int, ...] | None = None,
    out_of_range: str = "zero",
    out: np.ndarray | None = None,
    ftz: bool = False,
) -> np.ndarray:
    """Gather then dequantize (see the module docstring); output dtype = scales.dtype."""
    shape, gax, qax, blocks = check_gather_args(
        data, indices, scales, zero_points, bits, block_size, gather_axis, quantize_axis, data_type, data_shape
    )
    if out_of_range not in ("zero", "error"):
        raise ArgumentError(f"out_of_range: must be 'zero' or 'error', got {out_of_range!r}")
    check_out(out, (*shape[:gax], *indices.shape, *shape[gax + 1 :]), scales.dtype, data, indices, scales, zero_points)
    dim = shape[gax]
    idx = indices.astype(np.int64)
    idx = np.where(idx < 0, idx + dim, idx)
    bad = (idx < 0) | (idx >= dim)
    if bad.any() and out_of_range == "error":
        raise ArgumentError(f"indices: {int(indices[bad][0])} is out of range for a gather axis of {dim}")
    safe = np.where(bad, 0, idx)
    values = _logical(data, data_type, shape, bits)
    bsz = shape[qax] if blocks == 1 else block_size
    block_of = np.arange(shape[qax]) // bsz
    s = np.take(scales.astype(np.float32), np.minimum(block_of, scales.shape[qax] - 1), axis=qax)
    s = np.broadcast_to(s, shape)
    if data_type in FP8_TABLES:
        deq = (values * s).astype(np.float32)
    else:
        z = _zero_points(zero_points, data_type, bits, scales.shape, block_of, qax, shape)
        deq = ((values - z).astype(np.float32) * s).astype(np.float32)
    result = np.take(deq, safe, axis=gax)
    if bad.any():
        mask_shape = (1,) * gax + bad.shape + (1,) * (len(shape) - gax - 1)
        result = np.where(bad.reshape(mask_shape), np.float32(0), result)
    return deliver(flushed(result, ftz).astype(scales.dtype), out)


def _zero_points(zero_points, data_type, bits, scales_shape, block_of, qax, shape) -> np.ndarray:
    """Zero points broadcast to the data's logical shape (int32)."""
    if zero_points is None:
        return np.int32(1 << (bits - 1)) if data_type == "uint8" else np.int32(0)
    if not isinstance(zero_points, np.ndarray) or zero_points.dtype != np.uint8:
        raise ArgumentError("zero_points: must be the raw uint8 bytes of the zero-point tensor")
    n_blocks = scales_shape[qax]
    if data_type == "uint8":
        want = (*scales_shape[:-1], packed_size(n_blocks, bits))
        if zero_points.shape != want:
            raise ArgumentError(f"zero_points: packed shape must be {want}, got {zero_points.shape}")
        z = unpack_bits(zero_points, bits, n_blocks).astype(np.int32)
    else:
        if zero_points.size != packed_size(int(np.prod(scales_shape)), 4):
            raise ArgumentError(
                f"zero_points: {scales_shape} 4-bit values pack into {packed_size(int(np.prod(scales_shape)), 4)} bytes"
            )
        z = _logical(zero_points, data_type, tuple(scales_shape), 4)
    return np.broadcast_to(np.take(z, block_of, axis=qax), shape)

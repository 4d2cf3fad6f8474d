"""Launcher of gather_block_quantized (kernel ``ort/gather_block_quantized.hip``), the oracle's call
shape on CuPy arrays, bit-identical to ``qconform.oracles.ort.gather_block_quantized``."""

from __future__ import annotations

import cupy
import numpy as np

from qconform.device.ort._common import contiguous, launch, out_buffer, shadow
from qconform.errors import ArgumentError
from qconform.oracles.ort.gather_block_quantized import check_gather_args

DT_CODES = {"uint8": 0, "int4": 1, "uint4": 2, "float8e4m3fn": 3, "float8e5m2": 4}


def gather_block_quantized(
    data,
    indices,
    scales,
    zero_points=None,
    *,
    bits=4,
    block_size=128,
    gather_axis=0,
    quantize_axis=1,
    data_type="uint8",
    data_shape=None,
    out_of_range="zero",
    out=None,
):
    """Gather then dequantize, bit-identical to the oracle, for 2-D tables gathered along axis 0."""
    contiguous(data=data, indices=indices, scales=scales, zero_points=zero_points)
    shape, gax, qax, blocks = check_gather_args(
        shadow(data),
        shadow(indices),
        shadow(scales),
        shadow(zero_points),
        bits,
        block_size,
        gather_axis,
        quantize_axis,
        data_type,
        data_shape,
    )
    if len(shape) != 2 or gax != 0 or qax != 1:
        raise ArgumentError("data: the device kernel gathers rows of a 2-D table (gather_axis 0, quantize_axis 1)")
    if scales.shape != (shape[0], blocks):
        raise ArgumentError(f"scales: the device kernel needs one scale per block, shape {(shape[0], blocks)}")
    if out_of_range != "zero":
        raise ArgumentError("out_of_range: the device kernel gives zeros (ORT >= 1.31)")
    rows, cols = shape
    idx = indices.astype(cupy.int64)
    y = out_buffer(out, (*indices.shape, cols), scales.dtype, data, indices, scales, zero_points)
    bsz = cols if blocks == 1 and block_size == 0 else block_size
    launch(
        "gather_block_quantized",
        "gather_block_quantized.hip",
        "qk_gather_block_quantized",
        idx.size * cols,
        (
            data,
            idx,
            scales,
            data if zero_points is None else zero_points,
            y,
            np.int32(rows),
            np.int32(cols),
            np.int32(idx.size),
            np.int32(bits),
            np.int32(bsz),
            np.int32(blocks),
            np.int32(DT_CODES[data_type]),
            np.int32(zero_points is not None),
            np.int32(scales.dtype == np.float16),
            np.int32(data.shape[-1] if data.ndim == 2 else 0),
            np.int32(zero_points.shape[-1] if zero_points is not None and zero_points.ndim == 2 else 0),
        ),
    )
    return y

"""Launcher of fake_quantize (kernel ``ort/fake_quantize.hip``), the oracle's call shape on CuPy
arrays, bit-identical to ``qconform.oracles.ort.fake_quantize``."""

from __future__ import annotations

import cupy
import numpy as np

from qconform.device.ort._common import contiguous, launch, out_buffer, shadow
from qconform.errors import ArgumentError
from qconform.oracles.ort.qdq import QTYPES, check_fake_quantize_args


def fake_quantize(x, scale, zero_point=None, *, axis=1, block_size=0, dtype=None, out=None):
    """DQ(Q(x)) bit-identical to the oracle, for 2-D x quantized along axis 1."""
    contiguous(x=x, scale=scale, zero_point=zero_point)
    xs, ss, dtype = check_fake_quantize_args(shadow(x), shadow(scale), shadow(zero_point), axis, block_size, dtype)
    _, lo, hi = QTYPES[dtype]
    if xs.ndim != 2 or axis % 2 != 1:
        raise ArgumentError("x: the device kernel takes 2-D x quantized along axis 1")
    if ss.dtype != xs.dtype:
        raise ArgumentError(f"scale: dtype must be x's {xs.dtype} on the device, got {ss.dtype}")
    gran = 0 if ss.ndim == 0 or (ss.shape == (1,) and block_size == 0) else (1 if block_size == 0 else 2)
    y = out_buffer(out, xs.shape, ss.dtype, x, scale, zero_point)
    zp = cupy.zeros(1, cupy.int32) if zero_point is None else zero_point.astype(cupy.int32).ravel()
    rows, cols = xs.shape
    launch(
        "fake_quantize",
        "fake_quantize.hip",
        "qk_fake_quantize",
        rows * cols,
        (
            x,
            scale,
            zp,
            y,
            np.int32(rows),
            np.int32(cols),
            np.int32(gran),
            np.int32(max(block_size, 1)),
            np.int32(lo),
            np.int32(hi),
            np.int32(xs.dtype == np.float16),
            np.int32(zero_point is not None),
        ),
    )
    return y

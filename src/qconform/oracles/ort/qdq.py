"""ONNX QuantizeLinear / DequantizeLinear (opset 21+) and fake quantization, as ORT's CPU computes.

Source: docs/ort-ops.md section 3 (onnx Operators.md v21-v25, ORT CPU experiments).
  Q:  y = clip(rint(fp32(x) / fp32(scale)) + zp, lo, hi)   true fp32 division (not a multiply by
      the reciprocal), rint = round half to even; before opset 23 fp16 x and scale are computed in
      fp32. From opset 23 the division is in the ``precision`` attribute's type, the scale's by
      default: with fp16, x and the scale are rounded to fp16 and the quotient is rounded to fp16
      before rint (ORT 1.32's CPU kernel, microsoft/onnxruntime core/providers/cpu/quantization/
      quantize_linear.cc; fp8 outputs likewise). ``opset`` defaults to the first opset that has the
      output type: 21, and 25 for int2 / uint2, so an fp16 scale divides in fp16 for those.
  DQ: y = fp32(q - zp) * fp32(scale), rounded once to the scale's type.
  fake_quantize(x) = DQ(Q(x)) with the same scale and zero point.
Granularity from the scale's shape: a scalar -> per tensor; 1-D of length D[axis] -> per axis;
the rank of x with ceil(D[axis]/block_size) along axis -> blocked (the last block may be partial).
Values are logical: uint4 as uint8 in [0, 15], int4 as int8 in [-8, 7], uint2 as uint8 in
[0, 3], int2 as int8 in [-2, 1] (the 2-bit types are ONNX opset 25; ONNX Runtime 1.32 runs them
on the CPU; a 4- or 2-bit tensor packs as ``packing.pack_bits`` on the flattened values). A NaN
input has no integer image in the spec; the oracle maps it to the zero point.
float8e4m3fn / float8e5m2 / float8e4m3fnuz / float8e5m2fnuz (opset 19+; microsoft/onnxruntime core/util/qmath.h
``ParQuantizeLinearSat``): Q = the fp8 code of fp32(x / scale) (``formats.fp8.fp32_to_fp8``, the
``saturate`` attribute, default 1), the zero point ignored (ONNX requires it 0); DQ = fp32(fp8 value
* scale). Their values travel as the uint8 codes.
DequantizeLinear also takes int32 (a bias, an accumulator): fp32(q - zp) * scale with q - zp in
int32 arithmetic (ORT's subtraction wraps at the ends of the range).
"""

from __future__ import annotations

import numpy as np

from qconform.errors import ArgumentError
from qconform.formats.fp8 import FP8_TABLES, fp32_to_fp8
from qconform.formats.ulp import nudge_ulp
from qconform.oracles.ort._out import check_out, deliver, flushed

QTYPES: dict[str, tuple[np.dtype, int, int]] = {
    "uint8": (np.dtype(np.uint8), 0, 255),
    "int8": (np.dtype(np.int8), -128, 127),
    "uint16": (np.dtype(np.uint16), 0, 65535),
    "int16": (np.dtype(np.int16), -32768, 32767),
    "uint4": (np.dtype(np.uint8), 0, 15),
    "int4": (np.dtype(np.int8), -8, 7),
    "uint2": (np.dtype(np.uint8), 0, 3),
    "int2": (np.dtype(np.int8), -2, 1),
}
FLOAT_TYPES = (np.dtype(np.float32), np.dtype(np.float16))
TWO_BIT = ("int2", "uint2")  # ONNX opset 25's types
FP8_TYPES = tuple(FP8_TABLES)  # codes as uint8, over the whole byte range
DQ_ONLY = {"int32": (np.dtype(np.int32), -(2**31), 2**31 - 1)}  # DequantizeLinear's extra input type


def _qtype(name: str) -> tuple[np.dtype, int, int]:
    if name in FP8_TYPES:
        return np.dtype(np.uint8), 0, 255
    if name not in QTYPES:
        raise ArgumentError(f"dtype: must be one of {', '.join((*QTYPES, *FP8_TYPES))}, got {name!r}")
    return QTYPES[name]


def _dq_type(name: str) -> tuple[np.dtype, int, int]:
    """A DequantizeLinear input type (the quantized types, and int32)."""
    return DQ_ONLY[name] if name in DQ_ONLY else _qtype(name)


def expand_param(p: np.ndarray, x_shape: tuple[int, ...], axis: int, block_size: int, name: str) -> np.ndarray:
    """A scale or zero point broadcast to x's shape by the ONNX granularity rules."""
    p = np.asarray(p)
    ndim = len(x_shape)
    if p.ndim <= 1 and p.size == 1 and block_size > 0:  # ORT: a scalar or a 1-element vector is per-tensor
        raise ArgumentError(f"block_size: must be 0 for a per-tensor {name} (one element), got {block_size}")
    if p.ndim == 0 or (p.shape == (1,) and block_size == 0):
        return np.broadcast_to(p.reshape(()), x_shape)
    if not -ndim <= axis < ndim:
        raise ArgumentError(f"axis: must be in [{-ndim}, {ndim}) for a rank-{ndim} input, got {axis}")
    axis %= ndim
    d = x_shape[axis]
    if block_size == 0:
        if p.shape != (d,):
            raise ArgumentError(f"{name}: per-axis shape must be ({d},) (x.shape[{axis}]), got {p.shape}")
        shape = [1] * ndim
        shape[axis] = d
        return np.broadcast_to(p.reshape(shape), x_shape)
    if block_size < 0:
        raise ArgumentError(f"block_size: must be >= 0, got {block_size}")
    want = tuple(-(-d // block_size) if i == axis else s for i, s in enumerate(x_shape))
    if p.shape != want:
        raise ArgumentError(
            f"{name}: blocked shape must be {want} (block_size {block_size} along axis {axis}), got {p.shape}"
        )
    return np.repeat(p, block_size, axis=axis).take(np.arange(d), axis=axis)


def _check_float(name: str, a: object) -> np.ndarray:
    """A float32/float16 numpy array or numpy scalar, as an array."""
    if isinstance(a, np.generic):
        a = np.asarray(a)
    if not isinstance(a, np.ndarray) or a.dtype not in FLOAT_TYPES:
        got = a.dtype if isinstance(a, np.ndarray) else type(a).__name__
        raise ArgumentError(f"{name}: must be a float32 or float16 numpy array or scalar, got {got}")
    return a


def _zero_point(zp: object, dtype: str) -> np.ndarray | None:
    if zp is None:
        return None
    np_dtype, lo, hi = _dq_type(dtype)
    z = np.asarray(zp)
    if z.dtype != np_dtype:
        raise ArgumentError(f"zero_point: dtype must be {np_dtype} for {dtype}, got {z.dtype}")
    if z.size and (int(z.min()) < lo or int(z.max()) > hi):
        raise ArgumentError(f"zero_point: values must be in [{lo}, {hi}] for {dtype}")
    if dtype in FP8_TYPES and np.any(FP8_TABLES[dtype][z] != 0):
        raise ArgumentError(f"zero_point: must be a code of 0 for {dtype}")
    return z


def _infer_dtype(dtype: str | None, zero_point: object) -> str:
    """ONNX: the quantized type is the zero point's (uint8 without one) unless given; a 4-bit or
    2-bit type must be named, since its logical values travel as int8/uint8, and so must an fp8
    type (its codes travel as uint8)."""
    if dtype is not None:
        return dtype
    return "uint8" if zero_point is None else str(np.asarray(zero_point).dtype)


def division_type(
    x: np.ndarray, y_scale: np.ndarray, output_dtype: str, opset: int | None, precision: str | None
) -> np.dtype:
    """The float type QuantizeLinear divides in (module docstring): fp32 before opset 23, where x and
    the scale must share a type; from opset 23 the ``precision`` attribute's, the scale's by default
    (ORT's CPU takes float32 and float16 only). ``opset`` None: the first opset that has the output
    type (21; 25 for the 2-bit types)."""
    if opset is None:
        opset = 25 if output_dtype in TWO_BIT else 21
    if opset < 21:
        raise ArgumentError(f"opset: must be 21 or later (the QuantizeLinear rules modelled here), got {opset}")
    if output_dtype in TWO_BIT and opset < 25:
        raise ArgumentError(f"opset: {output_dtype} exists from opset 25, got {opset}")
    if opset < 23:
        if precision is not None:
            raise ArgumentError(f"precision: an attribute from opset 23, got {precision!r} at opset {opset}")
        if x.dtype != y_scale.dtype:
            raise ArgumentError(f"y_scale: must have x's dtype {x.dtype} before opset 23, got {y_scale.dtype}")
        return np.dtype(np.float32)
    if precision is None:
        return y_scale.dtype
    if precision not in ("float32", "float16"):
        raise ArgumentError(f"precision: must be 'float32' or 'float16' (ORT's CPU kernel), got {precision!r}")
    return np.dtype(precision)


def quantize_linear(
    x: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    output_dtype: str | None = None,
    opset: int | None = None,
    precision: str | None = None,
    out: np.ndarray | None = None,
    ftz: bool = False,
    nudge: int = 0,
    saturate: bool = True,
) -> np.ndarray:
    """ONNX QuantizeLinear: fp32/fp16 x -> logical integer values of ``output_dtype`` (fp8: codes;
    ``saturate`` only applies to them). ``opset`` / ``precision``: the type of the division
    (``division_type``). ``nudge``: each fp32 quotient x/scale that many ulp off before the rounding
    (an approximate division, the contract's ``division``)."""
    x = flushed(_check_float("x", x), ftz)
    y_scale = _check_float("y_scale", y_scale)
    output_dtype = _infer_dtype(output_dtype, y_zero_point)
    np_dtype, lo, hi = _qtype(output_dtype)
    div = division_type(x, y_scale, output_dtype, opset, precision)
    check_out(out, x.shape, np_dtype, x, y_scale, y_zero_point)
    z = _zero_point(y_zero_point, output_dtype)
    s = expand_param(y_scale, x.shape, axis, block_size, "y_scale").astype(div).astype(np.float32)
    zz = 0 if z is None else expand_param(z, x.shape, axis, block_size, "y_zero_point").astype(np.int64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # fp16: both operands to fp16, the fp32 quotient rounded to fp16 (one rounding: fp32 carries
        # more than twice fp16's bits, so the division's double rounding is innocuous)
        quotient = nudge_ulp((x.astype(div, copy=False).astype(np.float32) / s).astype(np.float32), nudge)
        if div != np.float32:
            quotient = quotient.astype(div).astype(np.float32)
    if output_dtype in FP8_TYPES:
        return deliver(fp32_to_fp8(flushed(quotient, ftz), output_dtype, bool(saturate)), out)
    r = np.rint(quotient).astype(np.float64)
    r = np.where(np.isnan(r), 0.0, np.clip(r, -(2.0**40), 2.0**40))
    return deliver(np.clip(r.astype(np.int64) + zz, lo, hi).astype(np_dtype), out)


def dequantize_linear(
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray | None = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    x_dtype: str | None = None,
    out: np.ndarray | None = None,
    ftz: bool = False,
) -> np.ndarray:
    """ONNX DequantizeLinear: logical integers (fp8 codes; int32 too) -> the scale's float type."""
    if not isinstance(x, np.ndarray):
        raise ArgumentError(f"x: must be a numpy.ndarray, got {type(x).__name__}")
    name = x_dtype or str(x.dtype)
    np_dtype, lo, hi = _dq_type(name)
    if x.dtype != np_dtype:
        raise ArgumentError(f"x: dtype must be {np_dtype} for {name}, got {x.dtype}")
    if x.size and (int(x.min()) < lo or int(x.max()) > hi):
        raise ArgumentError(f"x: values must be in [{lo}, {hi}] for {name}")
    scale = _check_float("x_scale", x_scale)
    check_out(out, x.shape, scale.dtype, x, x_scale, x_zero_point)
    z = _zero_point(x_zero_point, name)
    s = expand_param(scale, x.shape, axis, block_size, "x_scale").astype(np.float32)
    zz = 0 if z is None else expand_param(z, x.shape, axis, block_size, "x_zero_point").astype(np.int64)
    with np.errstate(over="ignore", invalid="ignore"):
        if name in FP8_TYPES:
            y = (FP8_TABLES[name][x] * s).astype(np.float32)
        else:
            diff = x.astype(np.int64) - zz
            if name in DQ_ONLY:  # int32 - int32 in int32: ORT's subtraction wraps
                diff = (diff + 2**31) % 2**32 - 2**31
            y = (diff.astype(np.float32) * s).astype(np.float32)
        y = flushed(y, ftz).astype(scale.dtype)
    return deliver(y, out)


def check_fake_quantize_args(
    x: object, scale: object, zero_point: object, axis: int, block_size: int, dtype: str | None
) -> tuple[np.ndarray, np.ndarray, str]:
    """(x, scale, quantized type) after every rule of ``fake_quantize`` on its inputs (the device
    launcher passes stand-ins with its arrays' dtypes and shapes)."""
    x = _check_float("x", x)
    scale = _check_float("scale", scale)
    dtype = _infer_dtype(dtype, zero_point)
    _qtype(dtype)
    expand_param(scale, x.shape, axis, block_size, "scale")
    if zero_point is not None:
        expand_param(_zero_point(zero_point, dtype), x.shape, axis, block_size, "zero_point")
    return x, scale, dtype


def fake_quantize(
    x: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | None = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    dtype: str | None = None,
    opset: int | None = None,
    precision: str | None = None,
    out: np.ndarray | None = None,
    ftz: bool = False,
    nudge: int = 0,
    saturate: bool = True,
) -> np.ndarray:
    """DQ(Q(x)) in one call: ``(clip(rint(x/s) + zp, lo, hi) - zp) * s`` with ONNX's roundings, for
    fp8 ``fp8(x/s) * s`` (``opset``, ``precision``, ``nudge``, ``saturate``: as ``quantize_linear``)."""
    x, scale, dtype = check_fake_quantize_args(x, scale, zero_point, axis, block_size, dtype)
    check_out(out, x.shape, scale.dtype, x, scale, zero_point)
    q = quantize_linear(
        x, scale, zero_point, axis=axis, block_size=block_size, output_dtype=dtype, opset=opset,
        precision=precision, ftz=ftz, nudge=nudge, saturate=saturate,
    )
    return dequantize_linear(q, scale, zero_point, axis=axis, block_size=block_size, x_dtype=dtype, out=out, ftz=ftz)

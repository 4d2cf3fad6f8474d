"""fp8 bit patterns -> float32, exact: OCP/ONNX float8e4m3fn and float8e5m2.

Source: onnx/onnx docs/Operators.md (Cast, "float 8 types") and the OCP 8-bit floating point
spec. e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits, no infinities, NaN = S.1111.111,
max 448. e5m2: 1 sign, 5 exponent (bias 15), 2 mantissa bits, IEEE-style inf (S.11111.00) and NaN.
Every value is exactly representable in float32, so a 256-entry table decodes bit for bit.
"""

from __future__ import annotations

import numpy as np


def _table(exp_bits: int, man_bits: int, bias: int, ieee_special: bool) -> np.ndarray:
    codes = np.arange(256, dtype=np.int64)
    sign = np.where(codes >> 7, -1.0, 1.0)
    e = (codes >> man_bits) & ((1 << exp_bits) - 1)
    m = codes & ((1 << man_bits) - 1)
    frac = m / float(1 << man_bits)
    normal = (1.0 + frac) * np.exp2(e - bias)
    subnormal = frac * np.exp2(1 - bias)
    v = sign * np.where(e == 0, subnormal, normal)
    top = e == (1 << exp_bits) - 1
    if ieee_special:
        v = np.where(top & (m == 0), sign * np.inf, v)
        v = np.where(top & (m != 0), np.nan, v)
    else:
        v = np.where(top & (m == (1 << man_bits) - 1), np.nan, v)
    return v.astype(np.float32)


E4M3FN = _table(4, 3, 7, ieee_special=False)
E5M2 = _table(5, 2, 15, ieee_special=True)
FP8_TABLES = {"float8e4m3fn": E4M3FN, "float8e5m2": E5M2}


def fp8_to_fp32(bits: np.ndarray, fmt: str) -> np.ndarray:
    """uint8 fp8 bit patterns -> float32 values (``fmt``: float8e4m3fn or float8e5m2)."""
    return FP8_TABLES[fmt][np.asarray(bits, dtype=np.uint8)]

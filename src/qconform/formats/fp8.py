"""fp8 bit patterns <-> float32: OCP/ONNX float8e4m3fn and float8e5m2, and the fnuz pair.

Source: onnx/onnx docs/Operators.md (Cast, "float 8 types") and the OCP 8-bit floating point
spec. e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits, no infinities, NaN = S.1111.111,
max 448. e5m2: 1 sign, 5 exponent (bias 15), 2 mantissa bits, IEEE-style inf (S.11111.00) and NaN.
e4m3fnuz / e5m2fnuz (the fp8 of AMD's MI300): biases 8 / 16, no infinities, no -0, the one NaN
0x80; max 240 / 57344. Every value is exactly representable in float32, so a 256-entry table
decodes bit for bit.

Encoding (``fp32_to_fp8``) is ONNX Runtime's CPU conversion, microsoft/onnxruntime
include/onnxruntime/core/common/float8.h ``Float8E4M3FN(float, saturate)`` / ``Float8E5M2`` /
``Float8E4M3FNUZ`` / ``Float8E5M2FNUZ``: truncate the fp32 bits to the format, then round half
to even on the dropped bits (fnuz: a zero result is +0, NaN and unsaturated overflow are 0x80);
fp32 subnormals give a signed zero (fnuz: +0); NaN gives S.1111111 (fnuz: 0x80). Its edges (checked against onnxruntime
1.32 on every fp32 exponent, tests/test_upstream_ort.py): e4m3fn values in [480, 512) first
truncate to 448 (the NaN pattern is never built by truncation), so without saturation 480 gives
448 and only a round-up past 448 gives NaN; e5m2 without saturation gives NaN (S.1111111), not
inf, for a round-up past 57344 from [57344, 65536), and inf from 65536 up; with saturation inf
and every finite overflow give +-max (448, 57344).
"""

from __future__ import annotations

import numpy as np


def _table(exp_bits: int, man_bits: int, bias: int, special: str) -> np.ndarray:
    """The 256 codes' float32 values. ``special``: "ieee" (all-ones exponent: inf, NaN), "fn" (only
    S.1111.111 is NaN) or "fnuz" (only 0x80, the would-be -0, is NaN)."""
    codes = np.arange(256, dtype=np.int64)
    sign = np.where(codes >> 7, -1.0, 1.0)
    e = (codes >> man_bits) & ((1 << exp_bits) - 1)
    m = codes & ((1 << man_bits) - 1)
    frac = m / float(1 << man_bits)
    normal = (1.0 + frac) * np.exp2(e - bias)
    subnormal = frac * np.exp2(1 - bias)
    v = sign * np.where(e == 0, subnormal, normal)
    top = e == (1 << exp_bits) - 1
    if special == "ieee":
        v = np.where(top & (m == 0), sign * np.inf, v)
        v = np.where(top & (m != 0), np.nan, v)
    elif special == "fn":
        v = np.where(top & (m == (1 << man_bits) - 1), np.nan, v)
    else:
        v = np.where(codes == 0x80, np.nan, v)
    return v.astype(np.float32)


E4M3FN = _table(4, 3, 7, "fn")
E5M2 = _table(5, 2, 15, "ieee")
E4M3FNUZ = _table(4, 3, 8, "fnuz")
E5M2FNUZ = _table(5, 2, 16, "fnuz")
FP8_TABLES = {
    "float8e4m3fn": E4M3FN,
    "float8e5m2": E5M2,
    "float8e4m3fnuz": E4M3FNUZ,
    "float8e5m2fnuz": E5M2FNUZ,
}


def _subnormal(m: np.ndarray, d: np.ndarray, top: int, shift: int) -> np.ndarray:
    """The subnormal code of an fp32 mantissa ``m`` ``d`` binades below the smallest normal, rounded
    half to even on the dropped bits (``top``: the code's implicit-one bit at d = 0)."""
    val = np.where(d < top, (np.int64(1) << np.maximum(top - 1 - d, 0)) | (m >> (shift + d)), (m > 0).astype(np.int64))
    mask = np.int64(1) << (shift - 1 + d)
    rest = m & (mask - 1)
    up = ((m & mask) != 0) & (((val & 1) != 0) | (rest > 0) | (((m & (mask << 1)) != 0) & (rest == 0)))
    return val + up


# per format: mantissa bits, the fp32 exponent field of its smallest normal, the field from which
# every value overflows (float8.h's thresholds)
_LAYOUT = {
    "float8e4m3fn": (3, 121, 136),
    "float8e5m2": (2, 113, 143),
    "float8e4m3fnuz": (3, 120, 135),
    "float8e5m2fnuz": (2, 112, 143),
}


def fp32_to_fp8(v: np.ndarray, fmt: str, saturate: bool = True) -> np.ndarray:
    """float32 -> uint8 fp8 codes, as ONNX Runtime's CPU converts (see the module docstring)."""
    if fmt not in _LAYOUT:
        raise ValueError(f"fmt: must be one of {tuple(FP8_TABLES)}, got {fmt!r}")
    man, first, hi = _LAYOUT[fmt]
    b = np.asarray(v, np.float32).view(np.uint32).astype(np.int64)
    sign = (b >> 24) & 0x80
    e, m = (b >> 23) & 0xFF, b & 0x7FFFFF
    shift = 23 - man  # the fp32 mantissa bits a normal code drops
    lo = first - 1 - man  # below it: zero
    sub = _subnormal(m, np.clip(first - 1 - e, 0, man), man, shift + 1)
    norm = ((e - (first - 1)) << man) | (m >> shift)
    half = (((m >> (shift - 1)) & 1) != 0) & ((((m >> shift) & 1) != 0) | ((m & ((1 << (shift - 1)) - 1)) != 0))
    if fmt.endswith("fnuz"):  # 0x80 the only NaN, no -0: a zero is +0; -1 marks NaN below
        over = 0x7F if saturate else -1
        norm = np.where(half, np.where(norm < 0x7F, norm + 1, over), norm)
        mag = np.where(e < lo, 0, np.where(e < first, sub, np.where(e < hi, norm, over)))
        mag = np.where(e == 0xFF, np.where(m == 0, over, -1), mag)
        return np.where(mag < 0, 0x80, np.where(mag == 0, 0, sign | mag)).astype(np.uint8)
    if fmt == "float8e4m3fn":
        top, over = 0x7E, 0x7E if saturate else 0x7F
        norm = np.where(norm == 0x7F, 0x7E, norm)  # truncation never builds the NaN code
        past = norm if saturate else norm | 0x7F
    else:
        top, over = 0x7B, 0x7B if saturate else 0x7C
        past = norm | over  # OR-ed into 0x7B: NaN (0x7F) without saturation
    norm = np.where(half, np.where(norm < top, norm + 1, past), norm)
    code = np.where(e < lo, 0, np.where(e < first, sub, np.where(e < hi, norm, over)))
    code = np.where(e == 0xFF, np.where(m == 0, over, 0x7F), code)
    return (sign | code).astype(np.uint8)


def fp8_to_fp32(bits: np.ndarray, fmt: str) -> np.ndarray:
    """uint8 fp8 bit patterns -> float32 values (``fmt``: float8e4m3fn or float8e5m2)."""
    return FP8_TABLES[fmt][np.asarray(bits, dtype=np.uint8)]

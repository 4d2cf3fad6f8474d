"""Deliberately broken drop-in implementations; each must be caught by the suite.

Every mutant is ``fn(x_or_data, qtype, out=None)`` like the oracle, and declares the op it
replaces in ``__qconform_ops__``. The Q8_K mutants are one knob away from ``q8_k_spec``, which
``test_mutants.py`` proves equal to the oracle with every knob at its reference setting, so each
mutant differs from ggml in exactly the one rule its name says.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np

import qconform.oracles.ort as ort
from qconform.errors import ArgumentError
from qconform.formats.ggml import Q8_0, Q8_K
from qconform.oracles.ggml import check_quantize_args, dequantize, quantize

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))  # in a worker process too
# the README's Q8_K drop-ins (examples/my_kernels.py), each one knob of the same spec
from my_kernels import (  # noqa: E402
    _mutant,
    q8_k_last_on_equal_abs,  # noqa: F401
    q8_k_no_clamp,  # noqa: F401
    q8_k_reference_knobs,  # noqa: F401
    q8_k_spec,  # noqa: F401
    q8_k_ties_away,  # noqa: F401
)

q8_k_last_block_unwritten = _mutant(skip_last_block=True)
q8_k_accepts_bad_width = _mutant(check_width=False)

_calls = itertools.count()


def q8_k_nondeterministic(x: np.ndarray, qtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """Right on most calls; every fifth call (like a tuner's trial) flips one quant of block 0."""
    y = quantize(x, qtype, out=out)
    if next(_calls) % 5 == 4:
        y.reshape(-1)[4] ^= 1
    return y


q8_k_nondeterministic.__qconform_ops__ = ("q8_k_quant",)


def q8_0_ties_to_even(x: np.ndarray, qtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """ggml's AVX2 ``quantize_row_q8_0`` rounding: 127/amax and ties to even, not the reference."""
    fmt, shape = check_quantize_args(x, qtype, out)
    if fmt.name != "Q8_0":
        raise NotImplementedError(f"this mutant only quantizes Q8_0, not {qtype}")
    y = np.empty(shape, np.uint8) if out is None else out
    blocks = y.reshape(-1).view(Q8_0.dtype)
    xb = x.reshape(-1, 32)
    with np.errstate(all="ignore"):
        amax = np.abs(xb).max(axis=1)
        d = (amax / np.float32(127)).astype(np.float32)
        idd = np.where(amax != 0, np.float32(127) / np.where(amax != 0, amax, 1), 0).astype(np.float32)
        blocks["d"] = d.astype(np.float16).view(np.uint16)
        blocks["qs"] = np.nan_to_num(np.rint(xb * idd[:, None])).astype(np.int8)
    return y


q8_0_ties_to_even.__qconform_ops__ = ("q8_0_quant",)


def ieee_max(x: np.ndarray, qtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """A block max by IEEE ``fmaxf`` (a NaN never wins) where ggml's Q8_0 ``MAX`` macro lets a NaN
    reset the running max, NaN elements quantized as 0: the rest of the reference unchanged (what
    ``nan=ieee`` accepts; Q8_K's strict compare already skips NaN, so there only the NaN bytes differ)."""
    check_quantize_args(x, qtype, out)
    y = quantize(np.where(np.isnan(x), np.float32(0), x), qtype)
    return y if out is None else np.copyto(out, y) or out


def q8_0_ieee_max(x: np.ndarray, qtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """``ieee_max`` for Q8_0, the format whose reference it breaks."""
    fmt, _ = check_quantize_args(x, qtype, out)
    if fmt.name != "Q8_0":
        raise NotImplementedError(f"this mutant only quantizes Q8_0, not {qtype}")
    return ieee_max(x, qtype, out)


q8_0_ieee_max.__qconform_ops__ = ("q8_0_quant",)


def q8_0_approx_reciprocal(x: np.ndarray, qtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """``id = 1/d`` one ulp off (a fast reciprocal such as rcp.approx: within an ulp, not
    correctly rounded): the fp32 neighbour on the other side of the exact 1/d, wherever 1/d is not
    an fp32 value (a power-of-two d keeps its exact reciprocal). The named case that sees it:
    ``ties_npot`` (tests/test_ties_npot.py); ``ties`` has only power-of-two d."""
    from qconform.oracles.ggml.rounding import roundf_to_int8

    fmt, _ = check_quantize_args(x, qtype, out)
    if fmt.name != "Q8_0":
        raise NotImplementedError(f"this mutant only quantizes Q8_0, not {qtype}")
    y = quantize(x, qtype, out=out)  # d, and every block this mutant leaves alone
    blocks = y.reshape(-1).view(Q8_0.dtype)
    xb = x.reshape(-1, 32)
    with np.errstate(all="ignore"):
        amax = np.abs(xb).max(axis=1)
        d = amax / np.float32(127)
        idd = np.float32(1) / d
        err = idd.astype(np.float64) * d.astype(np.float64) - 1.0  # exact: 24 x 24 bits
        other = np.nextafter(idd, np.where(err > 0, np.float32(0), np.float32(np.inf)))
        qs = roundf_to_int8(xb * other[:, None])
    hit = np.isfinite(xb).all(axis=1) & (d != 0) & np.isfinite(idd) & (err != 0)
    blocks["qs"][hit] = qs[hit]
    return y


q8_0_approx_reciprocal.__qconform_ops__ = ("q8_0_quant",)


def q8_0_dequant_fp16_math(data: np.ndarray, qtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """Multiplies in fp16 and widens the product: off by fp16 rounding."""
    y = dequantize(data, qtype, out=out)
    blocks = data.reshape(-1).view(Q8_0.dtype)
    with np.errstate(all="ignore"):
        prod = blocks["qs"].astype(np.float16) * blocks["d"].view(np.float16)[:, None]
    y.reshape(-1, 32)[...] = prod.astype(np.float32)
    return y


q8_0_dequant_fp16_math.__qconform_ops__ = ("q8_0_dequant",)


def _declare(fn, op: str):
    fn.__qconform_ops__ = (op,)
    return fn


def q8_k_modifies_input(x: np.ndarray, qtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """Right bytes, but scales its input in place and back: one value does not round-trip."""
    y = quantize(x, qtype, out=out)
    x.reshape(-1)[0] = np.float32(x.reshape(-1)[0] * np.float32(3.0)) / np.float32(3.0) + np.float32(1e-3)
    return y


def q8_k_writes_before_checking(x: np.ndarray, qtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """Zeroes ``out`` first and validates after: a rejected call leaves a clobbered buffer."""
    if out is not None:
        out.reshape(-1)[:4] = 0
    return quantize(x, qtype, out=out)


def q8_k_asserts_width(x: np.ndarray, qtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """Crashes on a bad width with an assert (what a C port's assert becomes), not a clear error."""
    assert x.ndim >= 1 and x.shape[-1] % 256 == 0
    return quantize(x, qtype, out=out)


def q8_k_rejects_for_wrong_reason(x: np.ndarray, qtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """Rejects every bad call, and leaves every buffer alone, but always for the same unrelated
    reason (a validator that checks one flag for everything): the message names ``x`` whatever
    the call broke, and never the rule."""
    try:
        check_quantize_args(x, qtype, out)
    except (ValueError, TypeError):
        raise ArgumentError("x: something unrelated") from None
    return quantize(x, qtype, out=out)


for _fn in (q8_k_modifies_input, q8_k_writes_before_checking, q8_k_asserts_width, q8_k_rejects_for_wrong_reason):
    _declare(_fn, "q8_k_quant")


def q8_k_allocates_and_skips_last_block(x: np.ndarray, qtype: str) -> np.ndarray:
    """No ``out=``: fills a fresh np.empty buffer except its last block."""
    _, shape = check_quantize_args(x, qtype)
    y = np.empty(shape, np.uint8)
    rows = y.reshape(-1, shape[-1])
    full = quantize(x, qtype).reshape(rows.shape)
    flat_full, flat_y = full.reshape(-1), rows.reshape(-1)
    flat_y[: -Q8_K.type_size] = flat_full[: -Q8_K.type_size]
    return y


_declare(q8_k_allocates_and_skips_last_block, "q8_k_quant")


# ----------------------------------------------------------------- ONNX Runtime family mutants
# Each is the oracle with one rule broken; ``__qconform_leaf__`` names the leaf it is run on.


def _for(op: str, leaf: str):
    def mark(fn):
        fn.__qconform_ops__ = (op,)
        fn.__qconform_leaf__ = leaf
        return fn

    return mark


@_for("dequantize_nbits", "Wu2_Yfp32")
def nbits_unpack_high_bits_first(B, scales, zero_points=None, g_idx=None, *, K, N, bits, block_size, out=None, **kw):
    """Reads the 2-bit fields of each byte from the high end: element 0 in bits 6-7."""
    ort.check_nbits_args(B, scales, zero_points, g_idx, K=K, N=N, bits=bits, block_size=block_size)
    per = 8 // bits
    mask = (1 << bits) - 1
    fields = [(B >> (bits * i)) & mask for i in range(per)]
    flipped = sum((f << (bits * (per - 1 - i))) for i, f in enumerate(fields)).astype(np.uint8)
    return ort.dequantize_nbits(
        flipped, scales, zero_points, g_idx, K=K, N=N, bits=bits, block_size=block_size, out=out, **kw
    )


@_for("dequantize_nbits", "Wu2_Yfp32")
def nbits_u2_default_zero_point_8(B, scales, zero_points=None, g_idx=None, *, K, N, bits, block_size, out=None, **kw):
    """Takes the 4-bit default zero point 8 for 2-bit weights (ORT's default is 2**(bits-1) = 2)."""
    if zero_points is None:
        zero_points, kw = np.float32(8), {**kw, "form": "kernel"}
    return ort.dequantize_nbits(
        B, scales, zero_points, g_idx, K=K, N=N, bits=bits, block_size=block_size, out=out, **kw
    )


@_for("dequantize_nbits", "Wu4_Yfp32")
def nbits_float_zp_one_rounding(B, scales, zero_points=None, g_idx=None, *, K, N, bits, block_size, out=None, **kw):
    """Applies a float zero point as (q - z) * s where ORT rounds q*s and -s*z separately."""
    return ort.dequantize_nbits(
        B, scales, zero_points, g_idx, K=K, N=N, bits=bits, block_size=block_size, out=out, **{**kw, "form": "kernel"}
    )


@_for("dequantize_nbits", "Wu4_Yfp32")
def nbits_blames_the_wrong_argument(B, scales, zero_points=None, g_idx=None, *, out=None, **kw):
    """Rejects every bad call with the oracle's own rule, but blames ``K`` for it whatever
    argument broke it (a C port that reports every failed check under one name)."""
    try:
        return ort.dequantize_nbits(B, scales, zero_points, g_idx, out=out, **kw)
    except ArgumentError as exc:
        raise ArgumentError(f"K: {str(exc).partition(': ')[2]}") from None


@_for("fake_quantize", "Xfp32_Qu8_Yfp32")
def fake_quantize_half_away(x, scale, zero_point=None, *, axis=1, block_size=0, dtype="uint8", out=None):
    """Rounds x/s half away from zero (C roundf) instead of half to even."""
    from qconform.oracles.ort.qdq import QTYPES, expand_param

    np_dtype, lo, hi = QTYPES[dtype]
    s = expand_param(scale, x.shape, axis, block_size, "scale").astype(np.float32)
    z = 0 if zero_point is None else expand_param(zero_point, x.shape, axis, block_size, "zero_point").astype(int)
    v = (x.astype(np.float32) / s).astype(np.float64)
    q = np.clip(np.sign(v) * np.floor(np.abs(v) + 0.5) + z, lo, hi)
    y = ((q - z).astype(np.float32) * s).astype(np.float32).astype(scale.dtype)
    if out is not None:
        out[...] = y
        return out
    return y


@_for("fake_quantize", "Xfp32_Qu8_Yfp32")
def fake_quantize_times_reciprocal(x, scale, zero_point=None, *, axis=1, block_size=0, dtype="uint8", out=None):
    """Quantizes rint(x * fp32(1/s)) where ONNX divides, rint(x / s): the same wherever 1/s is
    exact (power-of-two scales, pattern ``ties``), not at the ties of ``ties_npot``."""
    from qconform.oracles.ort.qdq import QTYPES, expand_param

    y = ort.fake_quantize(x, scale, zero_point, axis=axis, block_size=block_size, dtype=dtype, out=out)  # the checks
    _, lo, hi = QTYPES[dtype]
    s = expand_param(scale, x.shape, axis, block_size, "scale").astype(np.float32)
    z = 0 if zero_point is None else expand_param(zero_point, x.shape, axis, block_size, "zero_point").astype(int)
    with np.errstate(all="ignore"):
        v = (x.astype(np.float32) * (np.float32(1) / s)).astype(np.float32).astype(np.float64)
    v = np.where(np.isnan(v), 0.0, np.clip(np.rint(v), -(2.0**40), 2.0**40))
    q = np.clip(v.astype(np.int64) + z, lo, hi)
    y[...] = ((q - z).astype(np.float32) * s).astype(np.float32).astype(y.dtype)
    return y


def _matmul_with_weights(A, W, bias, out):
    y = A.astype(np.float64) @ W.astype(np.float64).T + (0 if bias is None else bias.astype(np.float64))
    y = y.astype(np.float32).astype(A.dtype)
    if out is not None:
        out[...] = y
        return out
    return y


@_for("matmul_nbits", "Xfp32_Wu4_Yfp32")
def matmul_skips_last_partial_block(
    A, B, scales, zero_points=None, g_idx=None, bias=None, *, K, N, bits, block_size, out=None, **kw
):
    """Leaves the last K block out of the sum when it is partial (K % block_size != 0)."""
    W = ort.dequantize_nbits(B, scales, zero_points, g_idx, K=K, N=N, bits=bits, block_size=block_size)
    if K % block_size:
        W[:, K - K % block_size :] = 0
    return _matmul_with_weights(A, W, bias, out)


@_for("matmul_nbits", "Xfp32_Wu2_Yfp32")
def matmul_last_block_wrong_scale(
    A, B, scales, zero_points=None, g_idx=None, bias=None, *, K, N, bits, block_size, out=None, **kw
):
    """A GEMV that reads the scale of the block before for the last block."""
    s = scales.copy()
    if s.shape[-1] > 1:
        s[:, -1] = s[:, -2]
    W = ort.dequantize_nbits(B, s, zero_points, g_idx, K=K, N=N, bits=bits, block_size=block_size)
    return _matmul_with_weights(A, W, bias, out)


def _gather_read_as(given: str, read_as: str, leaf: str, doc: str):
    """A gather that decodes ``given`` data as ``read_as`` (after the oracle's own checks)."""

    def gather(data, indices, scales, zero_points=None, *, data_type="uint8", **kw):
        ort.gather_block_quantized(data, indices, scales, zero_points, data_type=data_type, **kw)  # its checks
        table = read_as if data_type == given else data_type
        return ort.gather_block_quantized(data, indices, scales, zero_points, data_type=table, **kw)

    gather.__doc__ = doc
    return _for("gather_block_quantized", leaf)(gather)


gather_int4_not_sign_extended = _gather_read_as(
    "int4", "uint4", "Xi64_Wi4_Yfp16", "Reads int4 codes as unsigned (no sign extension): 0x8..0xF become 8..15."
)
gather_e5m2_read_as_e4m3 = _gather_read_as(
    "float8e5m2", "float8e4m3fn", "Xi64_Wfp8e5m2_Yfp16", "Decodes float8e5m2 bytes with the e4m3fn table."
)


@_for("gather_block_quantized", "Xi64_Wuint4_Yfp16")
def gather_uint4_default_zero_point_8(data, indices, scales, zero_points=None, *, data_type="uint8", **kw):
    """Takes 8 as uint4's default zero point (uint8 data's 2^(bits-1) rule); ORT's is 0."""
    if data_type == "uint4" and zero_points is None:
        zero_points = np.full(-(-scales.size // 2), 0x88, np.uint8)
    return ort.gather_block_quantized(data, indices, scales, zero_points, data_type=data_type, **kw)


@_for("fake_quantize", "Xfp32_Qi2_Yfp32")
def fake_quantize_int2_wraps(x, scale, zero_point=None, *, axis=1, block_size=0, dtype="uint8", out=None):
    """Keeps the low 2 bits of an out-of-range int2 code (a bit-field store) where ONNX saturates."""
    from qconform.oracles.ort.qdq import expand_param

    y = ort.fake_quantize(x, scale, zero_point, axis=axis, block_size=block_size, dtype=dtype, out=out)  # the checks
    if dtype != "int2":
        return y
    s = expand_param(scale, x.shape, axis, block_size, "scale").astype(np.float32)
    z = 0 if zero_point is None else expand_param(zero_point, x.shape, axis, block_size, "zero_point").astype(int)
    with np.errstate(all="ignore"):
        r = np.rint((x.astype(np.float32) / s).astype(np.float32)).astype(np.float64)
    q = np.where(np.isnan(r), 0, np.clip(r, -(2.0**40), 2.0**40)).astype(np.int64) + z
    q = ((q + 2) & 3) - 2  # two's complement in 2 bits: 2 -> -2, -3 -> 1
    y[...] = ((q - z).astype(np.float32) * s).astype(np.float32).astype(y.dtype)
    return y

"""Deliberately broken drop-in implementations; each must be caught by the suite.

Every mutant is ``fn(x_or_data, qtype, out=None)`` like the oracle, and declares the op it
replaces in ``__qconform_ops__``. The Q8_K mutants are one knob away from ``q8_k_spec``, which
``test_mutants.py`` proves equal to the oracle with every knob at its reference setting, so each
mutant differs from ggml in exactly the one rule its name says.
"""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import numpy as np

import qconform.oracles.ort as ort
from qconform.errors import ArgumentError
from qconform.formats.bf16 import bf16_bits_to_fp32
from qconform.formats.fp16 import fp16_bits_to_fp32, fp32_to_fp16_bits
from qconform.formats.ggml import Q8_0, Q8_1, Q8_K
from qconform.oracles.ggml import check_dequantize_args, check_quantize_args, dequantize, quantize
from qconform.oracles.ggml.fma import fmaf
from qconform.oracles.ort import packing as _ort_packing
from qconform.oracles.ort.packing import unpack_bits

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

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the kernel models beside this file, in a worker too
from mutants_ggml import (  # noqa: E402, F401  (the ggml format and kernel rules, one each)
    _only,  # the shared helpers: a mutant's argument checks, its op declaration (_for)
    iq4_nl_best_index_ties_down,
    iq4_nl_chunk_quantizer,
    iq4_xs_dequant_scales_h_reversed,
    iq4_xs_dl_from_fp16_d,
    iq4_xs_zero_block_positive_d,
    matmul_iq4_xs_dx_times_l_first,
    matmul_q4_0_scales_multiplied_first,
    matmul_q4_1_s_from_fp16_d,
    matmul_q4_k_mins_after_lanes,
    matmul_q6_k_lanes_pairwise,
    q2_k_dequant_min_added,
    q2_k_fit_min_positive,
    q2_k_nstep_off_by_one,
    q2_k_requant_by_reciprocal,
    q2_k_requant_when_dd_zero,
    q2_k_start_min_positive,
    q3_k_dequant_hmask_inverted,
    q3_k_requant_by_reciprocal,
    q4_1_minmax_from_x0,
    q4_k_dequant_min_high_bits_wrong_byte,
    q4_k_requant_by_reciprocal,
    q4_k_rmin_of_q5_k,
    q4_k_start_min_positive,
    q5_0_dequant_qh_big_endian,
    q5_0_last_on_equal_abs,
    q5_0_zero_block_positive_d,
    q5_k_fit_min_positive,
    q5_k_requant_by_reciprocal,
    q5_k_rmin_of_q4_k,
    q6_k_qx_steps_8,
    q6_k_requant_by_reciprocal,
    q8_1_divides_by_d,
    q8_1_s_is_sum_x,
    q8_k_fma_nearest_int,
    rms_norm_q8_k_fp32_sum,
    rms_norm_q8_k_rsqrt,
    silu_mul_q8_k_libm_expf,
)
from mutants_ggml import _op as _for  # noqa: E402
from nbits_mma_model import drop_in  # noqa: E402

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
def fake_quantize_times_reciprocal(x, scale, zero_point=None, *, axis=1, block_size=0, dtype="uint8", out=None, **kw):
    """Quantizes rint(x * fp32(1/s)) where ONNX divides, rint(x / s): the same wherever 1/s is
    exact (power-of-two scales, pattern ``ties``), not at the ties of ``ties_npot`` (fp8: the code of
    x * fp32(1/s))."""
    from qconform.oracles.ort.qdq import FP8_TABLES, QTYPES, expand_param, fp32_to_fp8

    y = ort.fake_quantize(x, scale, zero_point, axis=axis, block_size=block_size, dtype=dtype, out=out, **kw)
    s = expand_param(scale, x.shape, axis, block_size, "scale").astype(np.float32)
    with np.errstate(all="ignore"):
        v = (x.astype(np.float32) * (np.float32(1) / s)).astype(np.float32)
        if dtype in FP8_TABLES:
            y[...] = (FP8_TABLES[dtype][fp32_to_fp8(v, dtype, kw.get("saturate", True))] * s).astype(y.dtype)
            return y
    _, lo, hi = QTYPES[dtype]
    z = 0 if zero_point is None else expand_param(zero_point, x.shape, axis, block_size, "zero_point").astype(int)
    v = v.astype(np.float64)
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


# the fp16-A matrix-unit kernel's session-3 arithmetic (tests/nbits_mma_model.py, sum_form): the
# zero point through sum(a), which cancels beside a 65504 activation on weights q = z (the fp16
# spike cases, coverage 2: tests/test_nbits_mma_model.py runs it there, not test_mutants.py)
matmul_fp16_zero_point_through_sum_a = drop_in(True, "Xfp16_Wu4_Yfp16")
matmul_fp16_zero_point_through_sum_a.__doc__ = "s sum(a q) + fp32(-s z) sum(a) per 64-wide chunk (cancels)."


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


# ------------------------------------------------------------------ bitsandbytes family mutants
# Each is the catalogue's oracle (qconform.ops.bnb) with one rule broken, run on the leaf it names;
# a mutant of the CUDA rules declares ``variant=cuda``, the reading it is checked against.

import qconform.ops.bnb.decode as bnb_decode  # noqa: E402
import qconform.ops.bnb.gemm as bnb_gemm  # noqa: E402
import qconform.ops.bnb.nested as bnb_nested  # noqa: E402
import qconform.ops.bnb.quantize as bnb_quantize  # noqa: E402
from qconform.ops.bnb._common import deliver, from_f32, to_values  # noqa: E402
from qconform.oracles.bnb.blockwise import TINY, cuda_scale, default_scale  # noqa: E402
from qconform.oracles.bnb.codes import CPU_BOUNDS, NF4, create_dynamic_map  # noqa: E402
from qconform.oracles.bnb.fourbit import pack_nibbles  # noqa: E402


@_for("nf4_decode", "Xnf4_Yfp16")
def nf4_decode_low_nibble_first(packed, absmax, *, out=None, **kw):
    """Reads element 2j from the low nibble of byte j (bitsandbytes puts it in the high one)."""
    swapped = ((packed << 4) | (packed >> 4)).astype(np.uint8)
    bnb_decode.nf4_decode(packed, absmax, **kw)  # the checks, on the caller's arrays
    return bnb_decode.nf4_decode(swapped, absmax, out=out, **kw)


@_for("nf4_decode", "Xnf4_Yfp16")
def nf4_decode_one_rounding(packed, absmax, *, out=None, **kw):
    """fp16 output rounded once from the exact product code * absmax (bitsandbytes rounds the fp32
    product to fp16: two roundings)."""
    y = bnb_decode.nf4_decode(packed, absmax, out=out, **kw)
    if kw.get("dtype") == "float16":
        n = kw["rows"] * kw["cols"]
        q = np.stack([packed.reshape(-1) >> 4, packed.reshape(-1) & 15], axis=1).reshape(-1)[:n]
        with np.errstate(over="ignore", invalid="ignore"):  # inf / NaN absmax: the products as they fall
            exact = NF4[q].astype(np.float64) * np.repeat(absmax.astype(np.float64), kw["blocksize"])[:n]
            y[...] = exact.astype(np.float16).reshape(y.shape)
    return y


def _nf4_from_codes(A, blocksize, out, nibbles, variant: str = "cpu") -> np.ndarray:
    """nf4_quantize's output with the codes ``nibbles(x, blocksize)`` and the variant's absmax."""
    bnb_quantize.check_quantize_args(A, blocksize, out)
    y = bnb_quantize.nf4_quantize(A, blocksize, variant=variant)
    absmax, _ = bnb_quantize.split(y, A.size, blocksize)
    x = A.reshape(-1).astype(np.float32)
    q = nibbles(x, blocksize)
    return deliver(np.concatenate([absmax.astype("<f4").view(np.uint8), pack_nibbles(q.astype(np.uint8))]), out)


def _cpu_nf4_codes(scale=default_scale, side="left"):
    """bitsandbytes' CPU NF4 codes of ``scale(x, bs)``, ``torch.bucketize`` with a tie to ``side``."""

    def nibbles(x, bs):
        s, _ = scale(x, bs)
        s = np.append(s, np.float32(0)) if x.size % 2 else s
        return np.where(np.isnan(s), 15, np.searchsorted(CPU_BOUNDS["nf4"], s, side=side))

    return nibbles


@_for("nf4_quantize", "Xfp32_Ynf4")
def nf4_quantize_ties_up(A, blocksize=64, *, out=None):
    """bitsandbytes' CPU rule with a scaled value on a midpoint going to the upper code (torch.bucketize
    with right=True) where bitsandbytes' ``bucketize`` sends it to the lower one."""
    return _nf4_from_codes(A, blocksize, out, _cpu_nf4_codes(side="right"))


def _tail_by_reciprocal(x, bs):
    """default_scale with the tail block scaled as x * fl32(1/absmax) like the full ones."""
    s, absmax = default_scale(x, bs)
    full = x.size - x.size % bs
    if full < x.size:
        with np.errstate(all="ignore"):
            s[full:] = np.clip(x[full:] * (np.float32(1) / absmax[-1]), -1, 1).astype(np.float32)
    return s, absmax


def _full_blocks_divided(x, bs):
    """default_scale with the full blocks scaled as x / absmax like the tail."""
    s, absmax = default_scale(x, bs)
    full = x.size - x.size % bs
    with np.errstate(all="ignore"):
        am = np.maximum(absmax[: full // bs], TINY)[:, None]
        s[:full] = np.clip(x[:full].reshape(-1, bs) / am, -1, 1).astype(np.float32).reshape(-1)
    return s, absmax


def _tail_unclamped(x, bs):
    """default_scale without the 1e-38 clamp on the tail's absmax (an all-zero tail: 0 / 0 = NaN)."""
    s, absmax = default_scale(x, bs)
    full = x.size - x.size % bs
    if full < x.size:
        with np.errstate(all="ignore"):
            s[full:] = np.clip(x[full:] / np.max(np.abs(x[full:])), -1, 1).astype(np.float32)
    return s, absmax


@_for("nf4_quantize", "Xfp32_Ynf4")
def nf4_quantize_zero_tail_unclamped(A, blocksize=64, *, out=None):
    """bitsandbytes' CPU rule, but the partial last block divided by its bare absmax: an all-zero tail
    gives NaN codes (15) where bitsandbytes' clamp(min=1e-38) gives the code of 0."""
    return _nf4_from_codes(A, blocksize, out, _cpu_nf4_codes(_tail_unclamped))


@_for("nf4_quantize", "Xfp16_Ynf4")
def nf4_quantize_fp16_subnormals_flushed(A, blocksize=64, *, out=None):
    """fp16 subnormal inputs read as zeros (a device flushing half-precision denormals); bitsandbytes
    widens them to normal fp32 values."""
    if isinstance(A, np.ndarray) and A.dtype == np.float16:
        A = np.where(np.abs(A) < np.float16(2.0**-14), np.float16(0), A).astype(np.float16)
    return bnb_quantize.nf4_quantize(A, blocksize, out=out)


@_for("nf4_quantize", "Xfp32_Ynf4")
def nf4_quantize_tail_by_reciprocal(A, blocksize=64, *, out=None):
    """bitsandbytes' CPU rule, but the partial last block multiplied by the reciprocal of its absmax
    (bitsandbytes divides it: backends/default/ops.py ``quantize_4bit``'s remainder)."""
    return _nf4_from_codes(A, blocksize, out, _cpu_nf4_codes(_tail_by_reciprocal))


@_for("nf4_quantize", "Xfp32_Ynf4")
def nf4_quantize_full_blocks_divided(A, blocksize=64, *, out=None):
    """bitsandbytes' CPU rule, but every block divided by its absmax (bitsandbytes multiplies the full
    blocks by the reciprocal)."""
    return _nf4_from_codes(A, blocksize, out, _cpu_nf4_codes(_full_blocks_divided))


@_for("nf4_quantize", "Xfp32_Ynf4")
def nf4_quantize_midpoint_thresholds(A, blocksize=64, *, out=None):
    """bitsandbytes' CUDA rule (strict ``>`` trees, NaN -> 0, flush-to-zero) on the exact midpoints of
    the NF4 table where csrc/kernels.cu ``dQuantizeNF4`` compares with its float32 literals."""
    code = NF4.astype(np.float64)
    exact = (code[:-1] + code[1:]) / 2

    def nibbles(x, bs):
        t, _ = cuda_scale(x, bs, True, None)
        t = t.reshape(-1)[: x.size + x.size % 2].astype(np.float64)
        return np.where(np.isnan(t), 0, np.searchsorted(exact, t, side="left"))

    return _nf4_from_codes(A, blocksize, out, nibbles, "cuda")


nf4_quantize_midpoint_thresholds.__qconform_contract__ = "variant=cuda"


@_for("nested_absmax", "Xu8_Yfp32")
def nested_offset_before_dequant(qabsmax, absmax2, offset, *, mode="two_round", out=None):
    """``code8[q] * fl32(absmax2 + offset)``: the offset added to the 8-bit scale before the dequant,
    where bitsandbytes adds it to the dequantized value."""
    bnb_nested.check_nested_args(qabsmax, absmax2, offset, mode, out)
    with np.errstate(invalid="ignore", over="ignore"):
        scale = (np.repeat(absmax2, 256)[: qabsmax.size] + offset.reshape(-1)[0]).astype(np.float32)
        y = (create_dynamic_map()[qabsmax.astype(np.int64)] * scale).astype(np.float32)
    return deliver(y, out)


@_for("gemm_4bit", "Xfp16_W4_Yfp16")
def gemm_bias_after_rounding(A, B, absmax, bias=None, *, out=None, **kw):
    """Rounds the sum to fp16 and then adds the bias and rounds again (bitsandbytes <= 0.49's
    ``out += bias`` after ``gemv_4bit``), where the 0.50 op rounds ``sum + bias`` once."""
    dtype, _, _ = bnb_gemm.check_gemm_args(A, B, absmax, bias, out=out, **kw)
    y = bnb_gemm.gemm_4bit(A, B, absmax, None, **kw)
    if bias is not None:
        with np.errstate(over="ignore", invalid="ignore"):
            y = from_f32((to_values(y, dtype) + to_values(bias, dtype)).astype(np.float32), dtype).reshape(y.shape)
    return deliver(y, out)


# ----------------------------------------------------------------- ggml keep-quant GEMV and fused Q8_K producers
# Each is the catalogue's call shape (qconform.ops.ggml.keep_quant) with one rule broken.

import qconform.ops.ggml.keep_quant as keep_quant  # noqa: E402
from qconform.formats.ggml import Q4_0, Q4_K  # noqa: E402
from qconform.oracles.ggml import vec_dot  # noqa: E402
from qconform.oracles.ggml.kquant_search import get_scale_min_k4, pack_scale_min_k4  # noqa: E402


def _keep_quant_out(y: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    if out is None:
        return y
    out[...] = y
    return out


def _q4_k_next_subblock_scales(data: np.ndarray) -> np.ndarray:
    """Q4_K block bytes (rows, bytes) with sub-block j's 6-bit scale replaced by sub-block (j + 1) % 8's,
    the mins unchanged."""
    w = Q4_K.blocks(data.copy())
    sc, m = get_scale_min_k4(w["scales"])
    w["scales"] = pack_scale_min_k4(np.roll(sc, -1, axis=1), m)
    return w.view(np.uint8).reshape(data.shape)


@_for("matmul_bt_quant", "Wq4_K_Aq8_K_Yfp32")
def matmul_q4_k_scale_of_next_subblock(W_blocks, qtype, A_fp32, *, fma=False, out=None):
    """Multiplies sub-block j of each Q4_K block by the 6-bit scale of sub-block (j + 1) % 8 (the
    mins as ggml reads them): get_scale_min_k4 indexed one off."""
    wfmt, _, _ = keep_quant.check_matmul_args(W_blocks, qtype, A_fp32, out)
    if wfmt is not Q4_K:
        raise NotImplementedError(f"this mutant only reads Q4_K weights, not {qtype}")
    y = keep_quant.matmul_bt_quant(_q4_k_next_subblock_scales(W_blocks), qtype, A_fp32, fma=fma)
    return _keep_quant_out(y, out)


@_for("matmul_bt_quant", "Wq4_0_Aq8_0_Yfp32")
def matmul_q4_0_nibbles_swapped(W_blocks, qtype, A_fp32, *, fma=False, out=None):
    """Takes element j of each Q4_0 block from the high nibble of qs[j] and element j + 16 from the
    low one (ggml: low nibble first)."""
    wfmt, _, _ = keep_quant.check_matmul_args(W_blocks, qtype, A_fp32, out)
    if wfmt is not Q4_0:
        raise NotImplementedError(f"this mutant only reads Q4_0 weights, not {qtype}")
    w = Q4_0.blocks(W_blocks.copy())
    w["qs"] = (w["qs"] << 4) | (w["qs"] >> 4)
    y = keep_quant.matmul_bt_quant(w.view(np.uint8).reshape(W_blocks.shape), qtype, A_fp32, fma=fma)
    return _keep_quant_out(y, out)


@_for("matmul_bt_quant", "Wq8_0_Aq8_0_Yfp32")
def matmul_blocks_reversed(W_blocks, qtype, A_fp32, *, fma=False, out=None):
    """Sums the blocks of each row from the last to the first: every term as ggml forms it, fp32
    sums in another order (caught by the strict contract; what ``order=any`` accepts)."""
    wfmt, afmt, _ = keep_quant.check_matmul_args(W_blocks, qtype, A_fp32, out)
    nb = A_fp32.shape[1] // afmt.block_size
    a = quantize(A_fp32, afmt.name)
    w_rev = np.ascontiguousarray(W_blocks.reshape(len(W_blocks), nb, -1)[:, ::-1]).reshape(W_blocks.shape)
    a_rev = np.ascontiguousarray(a.reshape(len(a), nb, -1)[:, ::-1]).reshape(a.shape)
    y = vec_dot(qtype, w_rev[None, :, :], a_rev[:, None, :], fma=fma)
    return _keep_quant_out(y, out)


@_for("rms_norm_q8_k", "Xfp32_Yfp32_Aq8_K")
def rms_norm_q8_k_positive_d(x, gamma, eps, out_dtype="float32", *, out=None):
    """Quantizes the row with iscale = 127/max: d = max/127, positive where ggml's is negative, and
    every code (and block sum) negated -- the same values, other bytes (ggml maps the max-|x| value
    to -127)."""
    y, q = keep_quant.rms_norm_q8_k(x, gamma, eps, out_dtype, out=out)
    b = Q8_K.blocks(q)
    b["d"] = np.where(b["d"] == 0, b["d"], -b["d"])  # an all-zero block keeps d = 0
    b["qs"] = -b["qs"]
    b["bsums"] = -b["bsums"]
    q[...] = b.view(np.uint8).reshape(q.shape)
    return y, q


@_for("silu_mul_q8_k", "Xfp32_Ybf16_Aq8_K")
def silu_mul_q8_k_quantizes_fp32(gate, up, out_dtype="float32", *, out=None):
    """Stores the row in bfloat16 but quantizes the fp32 value before that rounding, where ggml
    quantizes the stored row read back."""
    y, q = keep_quant.silu_mul_q8_k(gate, up, out_dtype, out=out)
    _, q32 = keep_quant.silu_mul_q8_k(gate, up, "float32")
    q[...] = q32
    return y, q


# ------------------------------------------------------ GroupQueryAttention and QMoE mutants
# Each calls the ORT oracle with one of its rules broken (a module function swapped for the call).

import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import importlib  # noqa: E402

from qconform.ops.abi import call_arguments  # noqa: E402
from qconform.oracles.ort.kv_cache import dequantize_kv, expand_kv_scale, quantize_kv  # noqa: E402

_gqa = importlib.import_module("qconform.oracles.ort.group_query_attention")  # the module, not the function
_moe = importlib.import_module("qconform.oracles.ort.qmoe")
_key_mask, _scores, _apply_rotary = _gqa._key_mask, _gqa._scores, _gqa.apply_rotary
_route, _activation = _moe.route, _moe.expert_activation


@contextlib.contextmanager
def _swapped(module, **names):
    saved = {n: getattr(module, n) for n in names}
    try:
        for n, f in names.items():
            setattr(module, n, f)
        yield
    finally:
        for n, f in saved.items():
            setattr(module, n, f)


def _gqa_with(op: str, leaf: str, doc: str, **swaps):
    def gqa(*args, **kw):
        with _swapped(_gqa, **swaps):
            return _gqa.group_query_attention(*args, **kw)

    gqa.__doc__ = doc
    return _for(op, leaf)(gqa)


def _mask_one_ahead(lay, window):
    return _key_mask(dataclasses.replace(lay, past_lengths=tuple(p + 1 if p else 0 for p in lay.past_lengths)), window)


def _softcap_after_bias(q, k, alpha, softcap, bias, exact):
    x = _scores(q, k, alpha, 0.0, bias, exact)
    return x if softcap <= 0 else softcap * np.tanh(x / softcap)


gqa_causal_off_by_one_with_past = _gqa_with(
    "gqa_prefill",
    "Xfp16_Wfp16_Yfp16",
    "With a past, query s of a chunk sees key past + s + 1 too (the causal end one key ahead).",
    _key_mask=_mask_one_ahead,
)
gqa_window_of_w_plus_1 = _gqa_with(
    "gqa_decode",
    "Xfp16_Wfp16_Yfp16",
    "local_window_size W attends W + 1 keys (ORT before PR#25927).",
    _key_mask=lambda lay, window: _key_mask(lay, window + 1 if window > 0 else window),
)
gqa_rotary_interleaving_swapped = _gqa_with(
    "gqa_decode",
    "Xfp32_Wfp32_Yfp32",
    "Rotates interleaved pairs where half-split ones are asked, and the reverse.",
    apply_rotary=lambda x, c, s, p, inter, form: _apply_rotary(x, c, s, p, not inter, form),
)
gqa_softcap_after_bias = _gqa_with(
    "gqa_prefill",
    "Xfp16_Wi8_Yfp16",
    "Adds attention_bias before the softcap (ORT caps the scaled scores, then adds the bias).",
    _scores=_softcap_after_bias,
)


@_for("gqa_decode", "Xfp16_Wi8_Yfp16")
def gqa_k_quantized_before_rotary(*args, **kw):
    """Rounds the new K to the cache's grid first, then rotates and stores it (ORT quantizes after rotary)."""
    a = call_arguments(_gqa.group_query_attention, args, kw)
    _gqa.check_gqa_args(**{k: v for k, v in a.items() if k != "out"})  # the oracle's rules first
    key, bits = a["key"], a["kv_cache_bit_width"]
    if key is not None and bits and a["do_rotary"]:
        B, S, D = key.shape
        Nk = a["kv_num_heads"]
        scale = expand_kv_scale("k_scale", a["k_scale"], a["k_quant_type"], Nk, D // Nk)
        heads = key.reshape(B, S, Nk, D // Nk).transpose(0, 2, 1, 3)
        grid = dequantize_kv(quantize_kv(heads, scale, bits), scale, bits)
        a["key"] = grid.transpose(0, 2, 1, 3).reshape(B, S, D).astype(key.dtype)
    return _gqa.group_query_attention(**a)


def _qmoe_with(op: str, leaf: str, doc: str, **swaps):
    def qmoe(*args, **kw):
        with _swapped(_moe, **swaps):
            return _moe.qmoe(*args, **kw)

    qmoe.__doc__ = doc
    return _for(op, leaf)(qmoe)


def _normalize_honoured(router_probs, k, tie_break="higher", *, op="qmoe", normalize_routing_weights=0, **kw):
    if op == "qmoe" and kw.get("router_weights") is None and not normalize_routing_weights:
        op = "moe"  # the full softmax's probabilities of the selected experts, not renormalized
    return _route(router_probs, k, tie_break, op=op, normalize_routing_weights=normalize_routing_weights, **kw)


def _router_weights_normalized(router_probs, k, tie_break="higher", *, normalize_routing_weights=0, **kw):
    if kw.get("router_weights") is not None:
        normalize_routing_weights = 1  # the given router_weights renormalized whatever the attribute says
    return _route(router_probs, k, tie_break, normalize_routing_weights=normalize_routing_weights, **kw)


def _gelu_erf(h, activation_type, alpha=1.0, beta=0.0, limit=None, precision="reference"):
    if activation_type != "gelu" or precision == "float64":
        return _activation(h, activation_type, alpha, beta, limit, precision)
    h = h.astype(np.float32)
    erf = np.vectorize(math.erf)((h.astype(np.float64) / math.sqrt(2)).astype(np.float32)).astype(np.float32)
    return ((np.float32(0.5) * h).astype(np.float32) * (np.float32(1) + erf).astype(np.float32)).astype(np.float32)


qmoe_router_weights_always_normalized = _qmoe_with(
    "qmoe_decode",
    "Xfp32_Wu4_Yfp32",
    "Renormalizes the given router_weights of the selected experts with normalize_routing_weights=0.",
    route=_router_weights_normalized,
)
qmoe_gelu_erf = _qmoe_with(
    "qmoe_decode",
    "Xfp32_Wu4_Yfp32",
    "gelu as 0.5 h (1 + erf(h / sqrt 2)) (ORT's MoE takes the tanh form).",
    expert_activation=_gelu_erf,
)


def _swiglu_broken(kind: str):
    def activation(h, activation_type, alpha=1.0, beta=0.0, limit=None, precision="reference"):
        if activation_type != "swiglu":
            return _activation(h, activation_type, alpha, beta, limit, precision)
        h = np.array(h, copy=True)
        if kind == "concatenated":  # gate = the first half, linear = the second: interleave them for the real one
            n = h.shape[1] // 2
            h = np.stack([h[:, :n], h[:, n:]], axis=2).reshape(h.shape)
        if kind == "no beta":
            beta = 0.0
        if kind == "limit on the linear half" and limit is not None:
            h[:, 1::2] = np.clip(h[:, 1::2], -np.float32(limit), np.float32(limit))
            limit = None
        return _activation(h, activation_type, alpha, beta, limit, precision)

    return activation


TUNING_CALLS = 100  # the seed's autotuner sampled tilings on about the first 100 calls of a process
_tuning_calls = itertools.count()
_fp32_reference = _moe._fp32_product


def _split_k_product(parts: int, a32: np.ndarray, w32: np.ndarray) -> np.ndarray:
    """a32 @ w32.T with K split into ``parts`` tiles, each tile's sum rounded to fp32 and the tiles
    added in fp32 (a split-K tiling)."""
    edges = np.linspace(0, a32.shape[1], parts + 1).astype(int)
    acc = np.zeros((a32.shape[0], w32.shape[0]), np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for lo, hi in zip(edges[:-1], edges[1:], strict=True):
            acc = (acc + _fp32_reference(a32[:, lo:hi], w32[:, lo:hi])).astype(np.float32)
    return acc


@_for("qmoe_decode", "Xfp32_Wu4_Yfp32")
def qmoe_tuner_samples_first_calls(*args, **kw):
    """An autotuner that tries a tiling on each of the first 100 calls of the process: each splits the
    fp32 products' K into 2, 3 or 4 tiles (values within tolerance, bits not the same call to call)."""
    call = next(_tuning_calls)
    if call >= TUNING_CALLS:
        return _moe.qmoe(*args, **kw)
    with _swapped(_moe, _fp32_product=lambda a32, w32: _split_k_product(2 + call % 3, a32, w32)):
        return _moe.qmoe(*args, **kw)


@_for("qmoe_decode", "Xfp32_Wu4_Yfp32")
def qmoe_block_scales_read_transposed(*args, **kw):
    """Block-wise scales (E, N, blocks) read block-major: the scale of row n, block b from
    [e][b][n] (ORT's are row-major [e][n][b])."""
    a = call_arguments(_moe.qmoe, args, kw)
    for name in ("fc1_scales", "fc2_scales"):
        s = a[name]
        if s is not None and s.ndim == 3 and s.shape[2] > 1:
            E, N, nb = s.shape
            a[name] = np.ascontiguousarray(s.reshape(E, nb, N).transpose(0, 2, 1))
    return _moe.qmoe(**a)


@_for("qmoe_ragged_mm", "Xfp16_Wu4_Yfp16")
def qmoe_ties_to_lower_expert(*args, **kw):
    """Breaks equal logits toward the lower expert index (ORT's CUDA rule; its CPU takes the higher)."""
    return _moe.qmoe(*args, **{**kw, "tie_break": "lower"})


qmoe_normalize_honoured = _qmoe_with(
    "qmoe_decode",
    "Xfp32_Wu4_Yfp32",
    "Honours normalize_routing_weights=0 (the full softmax's probabilities, not renormalized) where QMoE "
    "takes a softmax over the k selected logits whatever it says.",
    route=_normalize_honoured,
)
qmoe_swiglu_concatenated = _qmoe_with(
    "qmoe_decode",
    "Xfp16_Wu8_Yfp16",
    "Reads SwiGLU's gate and linear halves as fc1's first and second half (ORT interleaves them).",
    expert_activation=_swiglu_broken("concatenated"),
)
qmoe_swiglu_missing_beta = _qmoe_with(
    "qmoe_ragged_mm",
    "Xfp32_Wu4_Yfp32",
    "Drops activation_beta: g sigmoid(alpha g) l instead of g sigmoid(alpha g) (l + beta).",
    expert_activation=_swiglu_broken("no beta"),
)
qmoe_limit_on_linear_only = _qmoe_with(
    "qmoe_decode",
    "Xfp16_Wu4_Yfp16",
    "Clamps only the linear half by swiglu_limit (ORT also caps the gate: min(g, limit)).",
    expert_activation=_swiglu_broken("limit on the linear half"),
)


# ------------------------------------------------------ one mutant per stated rounding / layout rule
# Each breaks exactly one line of its oracle's docstring, as a wrapper: a knob, a swapped module
# function, or the oracle's output changed precisely where that rule applies.

_fused = importlib.import_module("qconform.oracles.ggml.fused")
_rotary = importlib.import_module("qconform.oracles.ort.rotary")
_store_reread = _fused._store_reread


def q4_0_zero_block_positive_d(x: np.ndarray, qtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """Stores an all-zero block's d as +0.0 (0x0000), where ggml's ``d = max / -8`` with max = 0.0f
    gives -0.0 (0x8000); every code the same."""
    _only("Q4_0", x, qtype, out)
    y = quantize(x, qtype, out=out)
    blocks = y.reshape(-1).view(Q4_0.dtype)
    zero = (x.reshape(-1, 32) == 0).all(axis=1)
    blocks["d"][zero] = 0
    return y


def q8_1_sum_times_fp16_d(x: np.ndarray, qtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """``s = fp16((float)sum * h2f(d))``: the block sum times the stored fp16 d, where ggml multiplies
    by the fp32 d before rounding it (two fp16 roundings instead of one)."""
    _only("Q8_1", x, qtype, out)
    y = quantize(x, qtype, out=out)
    blocks = y.reshape(-1).view(Q8_1.dtype)
    d16 = fp16_bits_to_fp32(blocks["d"])
    total = blocks["qs"].astype(np.int64).sum(axis=1).astype(np.float32)
    with np.errstate(all="ignore"):
        s = (total * d16).astype(np.float32)
    hit = np.isfinite(d16) & np.isfinite(s)
    blocks["s"][hit] = fp32_to_fp16_bits(s[hit])
    return y


_declare(q4_0_zero_block_positive_d, "q4_0_quant")
_declare(q8_1_sum_times_fp16_d, "q8_1_quant")


@_for("matmul_bt_quant", "Wq2_K_Aq8_K_Yfp32")
def matmul_q2_k_contracted(W_blocks, qtype, A_fp32, *, fma=False, out=None):
    """Contracts ``sumf += dall*isum - dmin*summs`` into fmaf as GCC's ``-mfma`` does, whatever ``fma``
    says: the reference build (ggml-base without -mfma) rounds each product on its own."""
    return keep_quant.matmul_bt_quant(W_blocks, qtype, A_fp32, fma=True, out=out)


def _bf16_truncated(x: np.ndarray, rule: str = "rne") -> np.ndarray:
    return (np.asarray(x, np.float32).view(np.uint32) >> np.uint32(16)).astype(np.uint16)


def _store_canonical_nan(y: np.ndarray, out_dtype: str) -> tuple[np.ndarray, np.ndarray]:
    stored, back = _store_reread(y, out_dtype)
    if out_dtype == "float32":
        return stored, back
    bits = np.where(np.isnan(back), np.uint16(0x7FC0), stored).astype(np.uint16)
    return bits, bf16_bits_to_fp32(bits)


@_for("rms_norm_q8_k", "Xfp32_Ybf16_Aq8_K")
def rms_norm_q8_k_bf16_truncated(x, gamma, eps, out_dtype="float32", *, out=None):
    """Stores the row in bfloat16 by dropping the low 16 bits (round toward zero, ``__float2bfloat16_rz``)
    where ggml's ``ggml_compute_fp32_to_bf16`` rounds to nearest even; quantizes that stored row."""
    with _swapped(_fused, fp32_to_bf16_bits=_bf16_truncated):
        return keep_quant.rms_norm_q8_k(x, gamma, eps, out_dtype, out=out)


@_for("silu_mul_q8_k", "Xfp32_Ybf16_Aq8_K")
def silu_mul_q8_k_bf16_canonical_nan(gate, up, out_dtype="float32", *, out=None):
    """Stores every NaN of the row as the canonical bfloat16 NaN 0x7FC0 (PyTorch's ``rne``), where ggml
    keeps a NaN's top 16 bits with the quiet bit set (its sign and payload); quantizes that stored row."""
    with _swapped(_fused, _store_reread=_store_canonical_nan):
        return keep_quant.silu_mul_q8_k(gate, up, out_dtype, out=out)


@_for("nested_absmax", "Xu8_Yfp32")
def nested_absmax_one_rounding(qabsmax, absmax2, offset, *, mode="two_round", out=None, **kw):
    """``fmaf(code8[q], absmax2, offset)`` (one rounding) where the two_round mode asked for rounds the
    product and then the sum (bitsandbytes' Python ``dequantize_4bit``)."""
    bnb_nested.check_nested_args(qabsmax, absmax2, offset, mode, out)
    return bnb_nested.nested_absmax(qabsmax, absmax2, offset, mode="fma", out=out, **kw)


def _rotate_fusing_b(a, b, c, t, form):
    if form != "fma":
        return _rotary_pairs(a, b, c, t, form)
    a, b, c, t = (np.asarray(v, np.float64) for v in (a, b, c, t))
    ac = (a * c).astype(np.float32).astype(np.float64)
    at = (a * t).astype(np.float32).astype(np.float64)
    return _rotary._fp32_sum(ac, -(b * t)).astype(np.float64), _rotary._fp32_sum(at, b * c).astype(np.float64)


_rotary_pairs = _rotary.rotate_pairs


@_for("gqa_decode", "Xfp32_Wfp32_Yfp32")
def gqa_rotary_fuses_the_b_product(*args, **kw):
    """fp32 rotary with the product of ``a`` rounded and the one of ``b`` fused:
    a' = fp32(fp32(a*c) - b*t), b' = fp32(fp32(a*t) + b*c), where ORT's AVX2 kernel rounds the
    product with b and fuses the other (a' = fp32(a*c - fp32(b*t)))."""
    with _swapped(_rotary, rotate_pairs=_rotate_fusing_b):
        return _gqa.group_query_attention(*args, **kw)


def q4_0_ties_to_even(x: np.ndarray, qtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """Q4_0 codes with exact .5 ties of ``x * id`` rounded to even (``rint``), where ggml truncates
    ``x * id + 8.5f`` (ties up); every other code, d and the first strict max as the reference."""
    _only("Q4_0", x, qtype, out)
    y = quantize(x, qtype, out=out)
    blocks = y.reshape(-1).view(Q4_0.dtype)
    xb = x.reshape(-1, 32)
    with np.errstate(all="ignore"):
        first = np.argmax(np.abs(np.nan_to_num(xb, nan=0.0)), axis=1)  # the first largest |x|
        d = (xb[np.arange(len(xb)), first] / np.float32(-8)).astype(np.float32)
        idd = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
        v = (xb * idd[:, None]).astype(np.float32)
        tie = np.isfinite(v) & (v - np.floor(v) == np.float32(0.5)) & ~np.isnan(xb).any(axis=1)[:, None]
        codes = np.minimum(np.rint(v) + 8, 15)
    lo, hi = blocks["qs"] & 0xF, blocks["qs"] >> 4
    lo = np.where(tie[:, :16], codes[:, :16], lo).astype(np.uint8)
    hi = np.where(tie[:, 16:], codes[:, 16:], hi).astype(np.uint8)
    blocks["qs"] = lo | (hi << 4)
    return y


_declare(q4_0_ties_to_even, "q4_0_quant")


_legacy = importlib.import_module("qconform.oracles.ggml.legacy")
_symmetric_codes, _affine_codes = _legacy.symmetric_codes, _legacy.affine_codes


def _inverse(d: np.ndarray) -> np.ndarray:
    """The reference's fp32 ``id = d ? 1/d : 0``."""
    with np.errstate(all="ignore"):
        return np.where(d != 0, np.float32(1) / np.where(d != 0, d, np.float32(1)), np.float32(0)).astype(np.float32)


def _symmetric_codes_fused(x, bits, ftz):
    d, _ = _symmetric_codes(x, bits, ftz)
    c = np.full(x.shape, (1 << (bits - 1)) + 0.5, np.float32)
    with np.errstate(all="ignore"):
        v = fmaf(x, np.broadcast_to(_inverse(d)[:, None], x.shape), c)  # x * id + 8.5f in one rounding
    return d, np.minimum((1 << bits) - 1, _legacy.as_int8(_legacy.trunc_byte(v))) & 0xFF


def _affine_codes_fused(x, bits, clamp, ftz):
    d, mn, _ = _affine_codes(x, bits, clamp, ftz)
    with np.errstate(all="ignore"):
        u = (x - mn[:, None]).astype(np.float32)
        v = fmaf(u, np.broadcast_to(_inverse(d)[:, None], x.shape), np.full(x.shape, 0.5, np.float32))
    b = _legacy.trunc_byte(v)
    return d, mn, (np.minimum((1 << bits) - 1, _legacy.as_int8(b)) & 0xFF if clamp else b)


def _legacy_fused(name: str):
    def fused(x: np.ndarray, qtype: str, out: np.ndarray | None = None) -> np.ndarray:
        _only(name, x, qtype, out)
        with _swapped(_legacy, symmetric_codes=_symmetric_codes_fused, affine_codes=_affine_codes_fused):
            return quantize(x, qtype, out=out, backend="numpy")

    fused.__doc__ = (
        f"{name} with the code's multiply-add contracted into one fmaf (nvcc's default -fmad=true), "
        "where quantize_row_*_ref rounds the product and the sum apart."
    )
    return _declare(fused, f"{name.lower()}_quant")


q4_0_code_fused_multiply_add = _legacy_fused("Q4_0")
q5_0_code_fused_multiply_add = _legacy_fused("Q5_0")
q4_1_code_fused_multiply_add = _legacy_fused("Q4_1")
q5_1_code_fused_multiply_add = _legacy_fused("Q5_1")


def q4_k_dequant_scale_of_next_subblock(data: np.ndarray, qtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """Dequantizes sub-block j of each Q4_K block with the 6-bit scale of sub-block (j + 1) % 8 (the
    mins as ggml reads them): get_scale_min_k4 indexed one off."""
    fmt, _ = check_dequantize_args(data, qtype, out)
    if fmt is not Q4_K:
        raise NotImplementedError(f"this mutant only dequantizes Q4_K, not {qtype}")
    y = dequantize(_q4_k_next_subblock_scales(data), qtype)
    return y if out is None else np.copyto(out, y) or out


_declare(q4_k_dequant_scale_of_next_subblock, "q4_k_dequant")


# ------------------------------------------------ MatMulNBits, Q/DQ, gather and QSwiGLU: one rule each

_mn = importlib.import_module("qconform.oracles.ort.matmul_nbits")
_qdq = importlib.import_module("qconform.oracles.ort.qdq")
_sw = importlib.import_module("qconform.oracles.ort.qswiglu")
_mn_zero_points, _mn_dequantize, _mn_unpack = _mn._zero_points, _mn._dequantize, _mn.unpack_weights


def _nbits_with(leaf: str, doc: str, **swaps):
    def deq(*args, **kw):
        with _swapped(_mn, **swaps):
            return ort.dequantize_nbits(*args, **kw)

    deq.__doc__ = doc
    return _for("dequantize_nbits", leaf)(deq)


def _zp_high_field_first(zero_points, lay, ignore_packed):
    z = None if zero_points is None else np.asarray(zero_points)
    if z is not None and z.dtype == np.uint8 and lay.bits in (2, 4):
        per, mask = 8 // lay.bits, (1 << lay.bits) - 1
        fields = [(z >> (lay.bits * i)) & mask for i in range(per)]
        z = sum(f << (lay.bits * (per - 1 - i)) for i, f in enumerate(fields)).astype(np.uint8)
    return _mn_zero_points(z, lay, ignore_packed)


def _zp_flat_stream(zero_points, lay, ignore_packed):
    z = None if zero_points is None else np.asarray(zero_points)
    if z is None or z.dtype != np.uint8 or ignore_packed:
        return _mn_zero_points(zero_points, lay, ignore_packed)
    n = lay.N * lay.k_blocks
    flat = unpack_bits(np.concatenate([z.reshape(-1), np.zeros(n, np.uint8)]), lay.bits, n)
    return flat.reshape(lay.N, lay.k_blocks).astype(np.int32), False


def _u3_straddle_low_byte_only(B, lay):
    if lay.bits != 3:
        return _mn_unpack(B, lay)
    j = np.arange(lay.block_size)
    blob = B.reshape(lay.N, lay.k_blocks, lay.blob_size)
    q = (blob[:, :, (3 * j) // 8].astype(np.int32) >> ((3 * j) % 8)) & 7
    return q.reshape(lay.N, -1)[:, : lay.K]


def _float_zp_fma(B, scales, zero_points, g_idx, lay, form, ort_quirks):
    z = None if zero_points is None else np.asarray(zero_points)
    if form != "ort" or z is None or z.dtype == np.uint8 or g_idx is not None:
        return _mn_dequantize(B, scales, zero_points, g_idx, lay, form, ort_quirks)
    kb = np.arange(lay.K) // lay.block_size
    s = scales.astype(np.float32).reshape(lay.N, -1)[:, kb]
    neg_sz = (-s * z.astype(np.float32).reshape(lay.N, -1)[:, kb]).astype(np.float32)
    return (_mn.unpack_weights(B, lay) * s.astype(np.float64) + neg_sz).astype(np.float32)  # one rounding


nbits_zp_high_field_first = _nbits_with(
    "Wu4_Yfp32", "Reads packed zero points high nibble first (block 0 in bits 4-7).", _zero_points=_zp_high_field_first
)
nbits_zp_without_row_padding = _nbits_with(
    "Wu4_Yfp32",
    "Reads packed zero points as one stream over N * k_blocks (no per-row padding byte).",
    _zero_points=_zp_flat_stream,
)
nbits_u3_straddle_low_byte_only = _nbits_with(
    "Wu3_Yfp32", "A 3-bit field that straddles two bytes keeps only the first byte's bits.",
    unpack_weights=_u3_straddle_low_byte_only,
)
nbits_float_zp_fma = _nbits_with(
    "Wu4_Yfp32", "Float zero point as fma(q, s, fp32(-s*z)): ORT rounds q*s before the add.", _dequantize=_float_zp_fma
)


@_for("dequantize_nbits", "Wu4_Yfp32")
def nbits_scale_stride_floor(B, scales, zero_points=None, g_idx=None, *, K, N, bits, block_size, **kw):
    """Steps the scales' rows by floor(K / block_size): a partial last block not counted."""
    kb, kbf = -(-K // block_size), max(K // block_size, 1)
    flat = scales.reshape(-1)
    s = flat[np.minimum(np.arange(N)[:, None] * kbf + np.arange(kb), flat.size - 1)].reshape(scales.shape)
    return ort.dequantize_nbits(B, s, zero_points, g_idx, K=K, N=N, bits=bits, block_size=block_size, **kw)


@_for("dequantize_nbits", "Wu4_Yfp32")
def nbits_uniform_zp_in_ort_form(B, scales, zero_points=None, g_idx=None, *, N, **kw):
    """A scalar zero point (form 'kernel') applied in ORT's two-rounding form fp32(q*s) + fp32(-s*z)."""
    z = None if zero_points is None else np.asarray(zero_points)
    if kw.get("form") == "kernel" and z is not None and z.size == 1:
        zero_points, kw = np.full(scales.reshape(N, -1).shape, z.reshape(()), scales.dtype), {**kw, "form": "ort"}
    return ort.dequantize_nbits(B, scales, zero_points, g_idx, N=N, **kw)


@_for("matmul_nbits", "Xfp16_Wu4_Yfp16")
def matmul_bias_after_fp16_rounding(A, B, scales, zero_points=None, g_idx=None, bias=None, *, out=None, **kw):
    """Adds the bias to Y already rounded to fp16 (ORT adds it in fp32 and rounds once)."""
    y = ort.matmul_nbits(A, B, scales, zero_points, g_idx, bias, out=out, **kw)  # the checks
    if bias is not None:
        y[...] = ort.matmul_nbits(A, B, scales, zero_points, g_idx, None, **kw) + bias
    return y


def _q_clamp_before_zero_point(x, y_scale, y_zero_point=None, *, axis=1, block_size=0, output_dtype=None, **kw):
    _, lo, hi = _qdq.QTYPES[output_dtype]
    s = _qdq.expand_param(y_scale, x.shape, axis, block_size, "y_scale").astype(np.float32)
    z = 0 if y_zero_point is None else _qdq.expand_param(y_zero_point, x.shape, axis, block_size, "zp").astype(int)
    with np.errstate(all="ignore"):
        r = np.rint((x.astype(np.float32) / s).astype(np.float32))
    r = np.where(np.isnan(r), 0, np.clip(r, lo, hi)).astype(np.int64)  # clamped before + zp
    return np.clip(r + z, lo, hi).astype(_qdq.QTYPES[output_dtype][0])


def _q_fp16_division(x, y_scale, y_zero_point=None, **kw):
    if x.dtype == np.float16 and y_scale.dtype == np.float16:  # x / s rounded to fp16, then to fp32 for rint
        with np.errstate(over="ignore"):
            s = _qdq.expand_param(y_scale, x.shape, kw.get("axis", 1), kw.get("block_size", 0), "y_scale")
            x, y_scale = (x / s).astype(np.float16).astype(np.float32), np.float32(1)
        kw = {**kw, "axis": 1, "block_size": 0}
    return _qdq_quantize(x, y_scale, y_zero_point, **kw)


_qdq_quantize = _qdq.quantize_linear


_qdq_dequantize = _qdq.dequantize_linear


def _fq_swapped(leaf: str, doc: str, **swaps):
    def fq(*args, **kw):
        with _swapped(_qdq, **swaps):
            return ort.fake_quantize(*args, **kw)

    fq.__doc__ = doc
    return _for("fake_quantize", leaf)(fq)


fake_quantize_clamp_before_zero_point = _fq_swapped(
    "Xfp32_Qu8_Yfp32", "clip(clip(rint(x/s), lo, hi) + zp): clamps before adding the zero point.",
    quantize_linear=_q_clamp_before_zero_point,
)
fake_quantize_fp16_division = _fq_swapped(
    "Xfp16_Qu8_Yfp16", "Divides fp16 x by an fp16 scale in fp16 (ORT computes fp32(x) / fp32(s)).",
    quantize_linear=_q_fp16_division,
)
_fp32_to_fp8 = _qdq.fp32_to_fp8


def _fp8_ties_away(v, fmt, saturate=True):
    """The reference's fp8 code, but a value exactly half-way between two codes takes the larger
    magnitude (ORT rounds half to even)."""
    code = _fp32_to_fp8(v, fmt, saturate)
    table = _qdq.FP8_TABLES[fmt].astype(np.float64)
    up = (code & 0x80) | np.minimum((code & 0x7F) + 1, 0x7F)
    a, lo, hi = np.abs(np.asarray(v, np.float64)), np.abs(table[code]), np.abs(table[up])
    with np.errstate(invalid="ignore"):
        tie = np.isfinite(hi) & (a > lo) & (a - lo == hi - a)
    return np.where(tie, up, code).astype(np.uint8)


fake_quantize_fp8_ties_away = _fq_swapped(
    "Xfp32_Qfp8e4m3_Yfp32", "fp8: a quotient half-way between two codes goes away from zero (ORT: to even).",
    fp32_to_fp8=_fp8_ties_away,
)
fake_quantize_fp8_always_saturates = _fq_swapped(
    "Xfp32_Qfp8e5m2_Yfp32", "fp8: saturate=0 ignored (overflow to +-max instead of inf / NaN).",
    fp32_to_fp8=lambda v, fmt, saturate=True: _fp32_to_fp8(v, fmt, True),
)
def _fp8_ieee_overflow(v, fmt, saturate=True):
    """The reference's fp8 code, but without saturation every finite value past the top code's
    half-way point is NaN (e4m3fn) or inf (e5m2), as a round-to-nearest-even converter gives;
    ONNX Runtime truncates e4m3fn's [480, 496) to 448 and gives NaN for e5m2's round-up."""
    code = _fp32_to_fp8(v, fmt, saturate)
    if saturate:
        return code
    top = np.nanmax(np.abs(_qdq.FP8_TABLES[fmt][np.isfinite(_qdq.FP8_TABLES[fmt])]))
    half = top * (1 + 2.0 ** -(4 if fmt == "float8e4m3fn" else 3))  # top + half its ulp
    a = np.abs(np.asarray(v, np.float32))
    past = np.isfinite(a) & (a >= half)
    over = 0x7F if fmt == "float8e4m3fn" else 0x7C
    return np.where(past, (code & 0x80) | over, code).astype(np.uint8)


fake_quantize_fp8_ieee_overflow = _fq_swapped(
    "Xfp32_Qfp8e4m3_Yfp32", "fp8, saturate=0: overflow as a round-to-nearest-even converter gives it.",
    fp32_to_fp8=_fp8_ieee_overflow,
)
_expand_param = _qdq.expand_param


def _expand_ragged_row_block_previous(p, x_shape, axis, block_size, name):
    """The oracle's broadcast, but the ragged last block along axis 0 takes the block before it."""
    e = _expand_param(p, x_shape, axis, block_size, name)
    d = x_shape[0]
    if block_size and np.ndim(p) and axis % len(x_shape) == 0 and d % block_size and d > block_size:
        e = e.copy()
        e[d - d % block_size :] = e[d - d % block_size - 1]
    return e


fake_quantize_row_blocks_ragged_previous_scale = _fq_swapped(
    "Xfp32_Qi8_Yfp32", "Blocks along axis 0: the rows of a ragged last block use the previous block's scale.",
    expand_param=_expand_ragged_row_block_previous,
)


@_for("gather_block_quantized", "Xi64_Wu4_Yfp16")
def gather_negative_index_not_wrapped(data, indices, scales, zero_points=None, **kw):
    """A negative index gives the zero row of an out-of-range one instead of wrapping (+ rows)."""
    y = ort.gather_block_quantized(data, indices, scales, zero_points, **kw)
    y[indices < 0] = 0
    return y


@_for("gather_block_quantized", "Xi64_Wu4_Yfp16")
def gather_int32_indices_zero_extended(data, indices, scales, zero_points=None, **kw):
    """int32 indices widened as unsigned (a negative one lands out of range: a zero row) instead of
    sign-extended (ORT wraps it: + rows)."""
    if indices.dtype == np.int32:
        indices = indices.view(np.uint32).astype(np.int64)
    return ort.gather_block_quantized(data, indices, scales, zero_points, **kw)


@_for("gather_block_quantized", "Xi64_Wi4_Yfp16")
def gather_int4_zero_points_column_major(data, indices, scales, zero_points=None, **kw):
    """int4 zero points of a table blocked along its rows read column by column (nibble c * blocks + b
    for block b of column c; ONNX packs the (blocks, cols) tensor row-major)."""
    if zero_points is not None and kw.get("quantize_axis", 1) % 2 == 0 and kw.get("data_type") == "int4":
        nb, cols = scales.shape
        z = unpack_bits(zero_points, 4, nb * cols).reshape(cols, nb).T
        zero_points = _ort_packing.pack_bits(z.reshape(-1), 4)
    return ort.gather_block_quantized(data, indices, scales, zero_points, **kw)


@_for("gather_block_quantized", "Xi64_Wu8_Yfp16")
def gather_u8_default_zero_point_0(data, indices, scales, zero_points=None, *, data_type="uint8", bits=4, **kw):
    """8-bit uint8 data without zero points taken as zero point 0 (ORT: 2^(bits-1) = 128)."""
    if data_type == "uint8" and bits == 8 and zero_points is None:
        zero_points = np.zeros(scales.shape, np.uint8)
    return ort.gather_block_quantized(data, indices, scales, zero_points, data_type=data_type, bits=bits, **kw)


@_for("qswiglu", "Xu16_Yu16")
def qswiglu_sigmoid_held_in_fp16(gate_q, up_q, **kw):
    """Rounds Sigmoid(g) to fp16 before its QuantizeLinear (an fp16 activation buffer)."""
    sig = _sw.sigmoid_fp32
    with _swapped(_sw, sigmoid_fp32=lambda g: sig(g).astype(np.float16).astype(np.float32)):
        return _sw.qswiglu(gate_q, up_q, **kw)


@_for("qswiglu", "Xu16_Yu16")
def qswiglu_sigmoid_zero_point_ignored(gate_q, up_q, **kw):
    """The Sigmoid's QuantizeLinear / DequantizeLinear without its zero point (a kernel that assumes
    the sigmoid's codes start at 0)."""
    return _sw.qswiglu(gate_q, up_q, **{**kw, "sig_zp": np.zeros_like(kw["sig_zp"])})


def _q_default_zero_point_mid(x, y_scale, y_zero_point=None, *, output_dtype=None, **kw):
    if y_zero_point is None and output_dtype in ("uint8", "uint16", "uint4", "uint2"):
        np_dtype, _, hi = _qdq.QTYPES[output_dtype]
        y_zero_point = np.array((hi + 1) // 2, np_dtype)
    return _qdq_quantize(x, y_scale, y_zero_point, output_dtype=output_dtype, **kw)


def _dq_default_zero_point_mid(x, x_scale, x_zero_point=None, *, x_dtype=None, **kw):
    if x_zero_point is None and x_dtype in ("uint8", "uint16", "uint4", "uint2"):
        np_dtype, _, hi = _qdq.QTYPES[x_dtype]
        x_zero_point = np.array((hi + 1) // 2, np_dtype)
    return _qdq_dequantize(x, x_scale, x_zero_point, x_dtype=x_dtype, **kw)


def _q_nan_to_lowest(x, y_scale, y_zero_point=None, **kw):
    q = _qdq_quantize(x, y_scale, y_zero_point, **kw)
    lo = _qdq.QTYPES[_qdq._infer_dtype(kw.get("output_dtype"), y_zero_point)][1]
    return np.where(np.isnan(x), lo, q).astype(q.dtype)


def _q_int32_overflow(x, y_scale, y_zero_point=None, *, axis=1, block_size=0, output_dtype=None, **kw):
    name = _qdq._infer_dtype(output_dtype, y_zero_point)
    np_dtype, lo, hi = _qdq.QTYPES[name]
    s = _qdq.expand_param(y_scale, x.shape, axis, block_size, "y_scale").astype(np.float32)
    z = 0 if y_zero_point is None else _qdq.expand_param(y_zero_point, x.shape, axis, block_size, "z").astype(np.int64)
    with np.errstate(all="ignore"):
        r = np.rint((x.astype(np.float32) / s).astype(np.float32)).astype(np.float64)
    r = np.where(np.isnan(r), 0.0, r)
    r = np.where(np.abs(r) >= 2.0**31, -(2.0**31), r)  # x86's (int)rintf: INT_MIN past the int32 range
    return np.clip(r.astype(np.int64) + z, lo, hi).astype(np_dtype)


fake_quantize_unsigned_default_zero_point_mid = _fq_swapped(
    "Xfp32_Qu8_Yfp32",
    "No zero point taken as the unsigned range's middle (128 for uint8); ONNX's default is 0.",
    quantize_linear=_q_default_zero_point_mid,
    dequantize_linear=_dq_default_zero_point_mid,
)
fake_quantize_nan_to_lowest = _fq_swapped(
    "Xfp32_Qu8_Yfp32", "NaN quantized to the type's lowest code; ORT's rint(NaN) -> 0 gives the zero point.",
    quantize_linear=_q_nan_to_lowest,
)
fake_quantize_int32_overflow = _fq_swapped(
    "Xfp32_Qi8_Yfp32",
    "rint(x / s) converted to int32 before the clamp: +-inf and |x / s| >= 2^31 wrap to INT_MIN (ORT saturates).",
    quantize_linear=_q_int32_overflow,
)


@_for("gather_block_quantized", "Xi64_Wu4_Yfp16")
def gather_out_of_range_index_clamped(data, indices, scales, zero_points=None, **kw):
    """An index outside [-rows, rows) clamped into range (a bounds-safe load); ORT gives a zero row."""
    shape, *_ = ort.check_gather_args(
        data, indices, scales, zero_points, kw.get("bits", 4), kw.get("block_size", 128), 0,
        kw.get("quantize_axis", 1), kw.get("data_type", "uint8"), kw.get("data_shape"),
    )
    idx = indices.astype(np.int64)
    fixed = np.clip(np.where(idx < 0, idx + shape[0], idx), 0, shape[0] - 1).astype(indices.dtype)
    return ort.gather_block_quantized(data, fixed, scales, zero_points, **kw)


@_for("matmul_nbits", "Xfp32_Wu4_Yfp32")
def matmul_g_idx_ignored(A, B, scales, zero_points=None, g_idx=None, bias=None, **kw):
    """K position k in block k // block_size whatever g_idx says (act-order weights read in order)."""
    return ort.matmul_nbits(A, B, scales, zero_points, None, bias, **kw)


def _int8_activations_ties_away(a, block_size):
    prod, sa = _mn._activation_products(a, block_size)
    qa = np.clip(np.sign(prod) * np.floor(np.abs(prod) + 0.5), -128, 127)
    return qa.astype(np.int32).reshape(len(a), -1), sa


@_for("matmul_nbits", "Xfp32_Wu4_Yfp32")
def matmul_int8_activations_ties_away(A, B, scales, zero_points=None, g_idx=None, bias=None, **kw):
    """ORT's int8 activation path (accuracy_level 4) with a .5 code rounded away from zero (ORT: rint,
    half to even); declares that path (contract level4=int8)."""
    with _swapped(_mn, quantize_activations_int8=_int8_activations_ties_away):
        return ort.matmul_nbits(A, B, scales, zero_points, g_idx, bias, **kw)


matmul_int8_activations_ties_away.__qconform_contract__ = "level4=int8"


# ------------------------------------------------------ GroupQueryAttention and QMoE: one rule each

_check_gqa, _softmax_gqa, _bias_full = _gqa.check_gqa_args, _gqa._softmax, _gqa._bias_full
_rotary_positions = _gqa.rotary_positions
_gqa_quantize, _gqa_dequantize = _gqa.quantize_kv, _gqa.dequantize_kv
_moe_zero_points, _moe_ffn, _unpack_bits = _moe._zero_points, _moe._ffn, _moe.unpack_bits


class _TiledHeads:  # the module's numpy with repeat -> tile: query head n reads KV head n % Nk
    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def repeat(a, group, axis):
        return np.tile(a, [group if i == axis else 1 for i in range(a.ndim)])


gqa_kv_head_modulo = _gqa_with(
    "gqa_decode", "Xfp16_Wfp16_Yfp16",
    "Query head n reads KV head n % Nk (ORT: n // (N / Nk)).", np=_TiledHeads(),
)


def _seqlens_as_total(*a, **kw):
    lay = _check_gqa(*a, **kw)
    S = lay.sequence_length
    totals = tuple(max(t - 1, 1 if lay.first_prompt else S) for t in lay.total_lengths)
    pasts = lay.past_lengths if lay.first_prompt else tuple(t - S for t in totals)
    return dataclasses.replace(lay, total_lengths=totals, past_lengths=pasts)


gqa_seqlens_read_as_total = _gqa_with(
    "gqa_decode", "Xfp16_Wfp16_Yfp16",
    "Reads seqlens_k as the total length (ORT: total - 1): the new row lands one early.",
    check_gqa_args=_seqlens_as_total,
)
gqa_rotary_first_prompt_off_by_one = _gqa_with(
    "gqa_prefill", "Xfp32_Wfp32_Yfp32",
    "Rotates token s of a first prompt at position s + 1.",
    rotary_positions=lambda b, s, p, first, pid: _rotary_positions(b, s, p, first, pid) + int(first),
)


@_for("gqa_decode", "Xfp16_Wu4_Yfp16")
def gqa_position_ids_ignored(*args, **kw):
    """Ignores position_ids (rotates at s on a first prompt, past_b + s later); the arguments checked first."""
    a = call_arguments(_gqa.group_query_attention, args, kw)
    _check_gqa(**{k: v for k, v in a.items() if k != "out"})
    return _gqa.group_query_attention(**{**a, "position_ids": None})


def _rotary_tail_zeroed(x, cos, sin, pos, inter, form):
    y = _apply_rotary(x, cos, sin, pos, inter, form)
    y[..., 2 * cos.shape[1]:] = 0
    return y


def _rotary_partner_at_half_head(x, cos, sin, pos, inter, form):
    half, H = cos.shape[1], x.shape[-1]
    if inter or 2 * half == H:
        return _apply_rotary(x, cos, sin, pos, inter, form)
    c, t = (np.asarray(v, np.float64)[pos][:, None] for v in (cos, sin))
    y = np.array(x, np.float64, copy=True)
    y[..., :half], y[..., H // 2: H // 2 + half] = _rotary.rotate_pairs(x[..., :half], x[..., H // 2: H // 2 + half],
                                                                          c, t, form)
    return y


gqa_partial_rotary_tail_zeroed = _gqa_with(
    "gqa_decode", "Xfp32_Wfp32_Yfp32",
    "Partial rotary: zeroes channels >= rotary_dim (ORT copies them).", apply_rotary=_rotary_tail_zeroed,
)
gqa_partial_rotary_partner_at_half_head = _gqa_with(
    "gqa_decode", "Xfp32_Wfp32_Yfp32",
    "Partial half-split rotary pairs channel i with i + head_size/2 (ORT: i + rotary_dim/2).",
    apply_rotary=_rotary_partner_at_half_head,
)
gqa_window_of_w_minus_1 = _gqa_with(
    "gqa_decode", "Xfp16_Wfp16_Yfp16",
    "local_window_size W attends W - 1 keys (the current token not counted).",
    _key_mask=lambda lay, window: _key_mask(lay, window - 1 if window > 1 else window),
)


def _scale_after_softcap(q, k, alpha, softcap, bias, exact):
    if softcap <= 0:
        return _scores(q, k, alpha, softcap, bias, exact)
    x = _scores(q, k, 1.0, softcap, None, exact) * alpha
    return x if bias is None else x + bias


gqa_scale_after_softcap = _gqa_with(
    "gqa_prefill", "Xfp16_Wfp16_Yfp16",
    "Caps the unscaled q.k and scales after (ORT: c tanh(scale q.k / c)).", _scores=_scale_after_softcap,
)


@_for("gqa_decode", "Xfp16_Wfp16_Yfp16")
def gqa_sink_of_kv_head(*args, **kw):
    """Reads head_sink[n // (N / Nk)] (a KV head's) where ORT reads head_sink[n]."""
    a = call_arguments(_gqa.group_query_attention, args, kw)
    g = a["num_heads"] // a["kv_num_heads"]

    def softmax(x, mask, sink, exact):
        if sink is not None and a["head_sink"] is not None:
            sink = np.repeat(sink[::g], g)
        return _softmax_gqa(x, mask, sink, exact)

    with _swapped(_gqa, _softmax=softmax):
        return _gqa.group_query_attention(**a)


@_for("gqa_decode", "Xfp16_Wfp16_Yfp16")
def gqa_bias_of_kv_head(*args, **kw):
    """Reads a per-head attention_bias at the KV head's index (bias[:, n // (N / Nk)])."""
    a = call_arguments(_gqa.group_query_attention, args, kw)
    g = a["num_heads"] // a["kv_num_heads"]

    def bias_full(bias, lay):
        if bias is not None and bias.shape[1] > 1:
            bias = np.repeat(bias[:, ::g], g, axis=1)
        return _bias_full(bias, lay)

    with _swapped(_gqa, _bias_full=bias_full):
        return _gqa.group_query_attention(**a)


@_for("gqa_decode", "Xfp16_Wfp16_Yfp16")
def gqa_smooth_softmax_ignored(*args, **kw):
    """Drops smooth_softmax's zero sink when no head_sink is given."""
    a = call_arguments(_gqa.group_query_attention, args, kw)
    _check_gqa(**{k: v for k, v in a.items() if k != "out"})
    return _gqa.group_query_attention(**{**a, "smooth_softmax": -1})


def _kv_quantizer(rounding="even", nibbles="low first", lo4=-8):
    def quantize_kv(x, scale, bits, form="ort"):
        if form != "ort":
            return _gqa_quantize(x, scale, bits, form)
        s = scale[None, :, None, :].astype(np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            v = (np.asarray(x, np.float32) * (np.float32(1) / s).astype(np.float32)).astype(np.float64)
            r = np.sign(v) * np.floor(np.abs(v) + 0.5) if rounding == "away" else np.rint(v)
        q = np.clip(np.nan_to_num(r), -128 if bits == 8 else lo4, 127 if bits == 8 else 7).astype(np.int64)
        if bits == 8:
            return q.astype(np.int8)
        nib = (q + 8).astype(np.uint8)
        first, second = (nib[..., 0::2], nib[..., 1::2]) if nibbles == "low first" else (nib[..., 1::2], nib[..., 0::2])
        return (first | (second << 4)).astype(np.uint8)

    return quantize_kv


def _dequantize_high_first(q, scale, bits, exact=False):
    if bits == 4:
        q = ((q >> 4) | (q << 4)).astype(np.uint8)
    return _gqa_dequantize(q, scale, bits, exact)


gqa_kv_cache_ties_away = _gqa_with(
    "gqa_decode", "Xfp16_Wi8_Yfp16",
    "Quantizes the cache with round half away from zero (ORT: half to even).", quantize_kv=_kv_quantizer("away"),
)
gqa_u4_cache_high_nibble_first = _gqa_with(
    "gqa_decode", "Xfp16_Wu4_Yfp16",
    "4-bit cache: element 2i in the high nibble (ORT: low), written and read that way.",
    quantize_kv=_kv_quantizer(nibbles="high first"), dequantize_kv=_dequantize_high_first,
)
gqa_u4_cache_symmetric_range = _gqa_with(
    "gqa_decode", "Xfp16_Wu4_Yfp16",
    "4-bit cache clamped to [-7, 7] (ORT: [-8, 7]).", quantize_kv=_kv_quantizer(lo4=-7),
)


@_for("gqa_decode", "Xfp16_Wi8_Yfp16")
def gqa_attends_unquantized_new_kv(*args, **kw):
    """Quantized cache: stores the new K / V rows quantized but attends to them unquantized (ORT
    attends to the dequantized cache)."""
    a = call_arguments(_gqa.group_query_attention, args, kw)
    lay, new = _check_gqa(**{k: v for k, v in a.items() if k != "out"}), []

    def quantize_kv(x, scale, bits, form="ort"):
        new.append(np.asarray(x, np.float64))
        return _gqa_quantize(x, scale, bits, form)

    def dequantize_kv(q, scale, bits, exact=False):
        v, x = _gqa_dequantize(q, scale, bits, exact), new.pop(0)
        for b, pb in enumerate(lay.past_lengths):
            v[b, :, pb: pb + lay.sequence_length] = x[b]
        return v

    with _swapped(_gqa, quantize_kv=quantize_kv, dequantize_kv=dequantize_kv):
        return _gqa.group_query_attention(**a)


def _rotate_in_half_precision(a, b, c, t, form):
    if form != "fp16":
        return _rotary_pairs(a, b, c, t, form)
    h = lambda v: np.asarray(v, np.float64).astype(np.float16).astype(np.float64)  # noqa: E731
    return h(h(a * c) - h(b * t)), h(h(a * t) + h(b * c))


@_for("gqa_decode", "Xfp16_Wfp16_Yfp16")
def gqa_fp16_rotary_in_half(*args, **kw):
    """fp16 rotary in half arithmetic, fp16(fp16(a c) - fp16(b t)) (ORT: fp32, rounded once to fp16)."""
    with _swapped(_rotary, rotate_pairs=_rotate_in_half_precision):
        return _gqa.group_query_attention(*args, **kw)


_write_present_ref = _gqa._write_present


def _padding_rows_unwritten(past, new, lay, shared):
    present = _write_present_ref(past, new, lay, shared)
    if lay.first_prompt:
        for b, t in enumerate(lay.total_lengths):
            present[b, :, t: lay.sequence_length] = past[b, :, t: lay.sequence_length] if shared else 0
    return present


gqa_first_prompt_padding_unwritten = _gqa_with(
    "gqa_prefill", "Xfp16_Wfp16_Yfp16",
    "A right-padded first prompt writes only its total_b rows (ORT writes all S, padding included).",
    _write_present=_padding_rows_unwritten,
)


@_for("gqa_decode", "Xfp16_Wfp16_Yfp16")
def gqa_default_scale_of_rotary_dim(*args, **kw):
    """scale = 0 read as 1/sqrt(rotary_dim) (ORT: 1/sqrt(head_size); differs with partial rotary)."""
    a = call_arguments(_gqa.group_query_attention, args, kw)
    if a["scale"] == 0 and a["cos_cache"] is not None:
        a["scale"] = float(1 / np.sqrt(2 * a["cos_cache"].shape[1]))
    return _gqa.group_query_attention(**a)


def _unpack_high_first(packed, bits, count):
    if bits == 8:
        return _unpack_bits(packed, bits, count)
    per = 8 // bits
    v = _unpack_bits(packed, bits, packed.shape[-1] * per)
    return v.reshape(*v.shape[:-1], -1, per)[..., ::-1].reshape(v.shape)[..., :count].copy()


def _codes_high_first(w, z, lay, e):
    q = _unpack_high_first(w[e], lay.bits, lay.K).astype(np.int32).reshape(lay.N, lay.blocks, -1)
    return q - _moe._zero_points(z, lay, e)[:, :, None]


def _zero_points_broken(kind):
    def zero_points(z, lay, e):
        if z is None:
            return np.full((lay.N, lay.blocks), 8 if kind == "default 8" else 1 << (lay.bits - 1), np.int32)
        if kind == "high first":
            count = lay.blocks if lay.block_size is not None else lay.N
            zp = _unpack_high_first(z[e], lay.bits, count).astype(np.int32)
            return zp if lay.block_size is not None else zp[:, None]
        if kind == "rows unpadded" and lay.block_size is not None:
            flat = _unpack_bits(z[e].reshape(-1), lay.bits, lay.N * lay.blocks)
            return flat.reshape(lay.N, lay.blocks).astype(np.int32)
        return _moe_zero_points(z, lay, e)

    return zero_points


qmoe_weights_high_bits_first = _qmoe_with(
    "qmoe_decode", "Xfp32_Wu4_Yfp32",
    "Unpacks the weight codes high bits first (ORT: low bits first).", expert_codes=_codes_high_first,
)
qmoe_u8_zero_point_default_8 = _qmoe_with(
    "qmoe_decode", "Xfp16_Wu8_Yfp16",
    "Default zero point 8 whatever the bits (ORT: 2^(bits-1), 128 for 8-bit).",
    _zero_points=_zero_points_broken("default 8"),
)
qmoe_zero_points_high_first = _qmoe_with(
    "qmoe_decode", "Xfp32_Wu4_Yfp32",
    "Unpacks the packed zero points high bits first.", _zero_points=_zero_points_broken("high first"),
)
qmoe_block_zero_points_rows_unpadded = _qmoe_with(
    "qmoe_decode", "Xfp32_Wu4_Yfp32",
    "Reads block-wise zero points as one stream over all rows (ORT pads each row to a byte).",
    _zero_points=_zero_points_broken("rows unpadded"),
)


def _swiglu_variant(kind):
    def activation(h, activation_type, alpha=1.0, beta=0.0, limit=None, precision="reference"):
        if activation_type != "swiglu":
            return _activation(h, activation_type, alpha, beta, limit, precision)
        h = np.array(h, np.float32, copy=True)
        if kind == "halves swapped":  # gate = odd columns, linear = even
            return _activation(h.reshape(len(h), -1, 2)[..., ::-1].reshape(h.shape), "swiglu", alpha, beta, limit,
                               precision)
        g, lin = h[:, 0::2].astype(np.float64), h[:, 1::2].astype(np.float64)
        lim = None if limit is None else float(np.float32(limit))
        if lim is not None:
            g = np.clip(g, -lim, lim) if kind == "gate clamped both sides" else np.minimum(g, lim)
            lin = np.clip(lin, -lim, lim)
        al, be = float(np.float32(alpha)), float(np.float32(beta))
        if kind == "alpha on linear":
            return (g / (1 + np.exp(-g)) * (al * lin + be)).astype(np.float32)
        return (g / (1 + np.exp(-al * g)) * (lin + be)).astype(np.float32)

    return activation


qmoe_swiglu_halves_swapped = _qmoe_with(
    "qmoe_decode", "Xfp32_Wu4_Yfp32",
    "SwiGLU gate = odd fc1 rows, linear = even (ORT: gate even).", expert_activation=_swiglu_variant("halves swapped"),
)
qmoe_swiglu_gate_clamped_both_sides = _qmoe_with(
    "qmoe_decode", "Xfp32_Wu4_Yfp32",
    "Clamps the gate to [-limit, limit] (ORT: min(g, limit) only).",
    expert_activation=_swiglu_variant("gate clamped both sides"),
)
qmoe_swiglu_alpha_on_linear = _qmoe_with(
    "qmoe_decode", "Xfp32_Wu4_Yfp32",
    "g sigmoid(g) (alpha l + beta) (ORT: g sigmoid(alpha g) (l + beta)).",
    expert_activation=_swiglu_variant("alpha on linear"),
)


@_for("qmoe_decode", "Xfp32_Wu4_Yfp32")
def qmoe_fc1_bias_deinterleaved(*args, **kw):
    """SwiGLU: reads fc1's bias as [gate | linear] halves (the weights' rows interleave, so does the bias)."""
    a = call_arguments(_moe.qmoe, args, kw)
    b = a["fc1_experts_bias"]
    if b is not None and a["activation_type"] == "swiglu":
        half, mixed = b.shape[1] // 2, np.empty_like(b)
        mixed[:, 0::2], mixed[:, 1::2] = b[:, :half], b[:, half:]
        a["fc1_experts_bias"] = mixed
    return _moe.qmoe(**a)


def _ffn_fc2_bias_unweighted(x, idx, w, skip, fc1, fc2, act, precision, r):
    if fc2.bias is None:
        return _moe_ffn(x, idx, w, skip, fc1, fc2, act, precision, r)
    no_bias = _moe._Fc(fc2.w, fc2.s, fc2.z, None, fc2.lay, fc2.int8)
    terms = _moe_ffn(x, idx, w, skip, fc1, no_bias, act, precision, r)
    for t, j in zip(*np.nonzero(w > skip), strict=True):
        terms[t] += fc2.bias[idx[t, j]].astype(np.float32)
    return terms


qmoe_fc2_bias_unweighted = _qmoe_with(
    "qmoe_decode", "Xfp32_Wu4_Yfp32",
    "Adds each expert's fc2 bias after the routing weight (w y + b; ORT: w (y + b)).", _ffn=_ffn_fc2_bias_unweighted,
)


def _route_variant(kind):
    def route(router_probs, k, tie_break="higher", *, router_weights=None, normalize_routing_weights=0, **kw):
        if kind == "router_weights ignored":
            router_weights = None
        if kind == "router_weights never normalized":
            normalize_routing_weights = 0
        if kind == "selected by router_weights" and router_weights is not None:
            router_probs = router_weights
        idx, w = _route(router_probs, k, tie_break, router_weights=router_weights,
                        normalize_routing_weights=normalize_routing_weights, **kw)
        if kind == "weights in fp16":
            w = w.astype(np.float16).astype(w.dtype)
        return idx, w

    return route


qmoe_router_weights_ignored = _qmoe_with(
    "qmoe_decode", "Xfp32_Wu4_Yfp32",
    "Ignores router_weights (mixes with the softmax of the selected logits).",
    route=_route_variant("router_weights ignored"),
)
qmoe_router_weights_never_normalized = _qmoe_with(
    "qmoe_decode", "Xfp32_Wu4_Yfp32",
    "Never renormalizes router_weights (ORT does with normalize_routing_weights = 1).",
    route=_route_variant("router_weights never normalized"),
)
qmoe_selects_by_router_weights = _qmoe_with(
    "qmoe_ragged_mm", "Xfp32_Wu4_Yfp32",
    "Selects the experts by router_weights (ORT: by router_probs, weights from router_weights).",
    route=_route_variant("selected by router_weights"),
)
qmoe_routing_weights_fp16 = _qmoe_with(
    "qmoe_decode", "Xfp32_Wu4_Yfp32",
    "Rounds the routing weights to fp16 (ORT keeps them fp32).", route=_route_variant("weights in fp16"),
)
qmoe_int8_activations_at_level_0 = _qmoe_with(
    "qmoe_decode", "Xfp32_Wu4_Yfp32",
    "Quantizes the activations to int8 for 4-bit block-wise weights at accuracy_level 0 (ORT: level 4 only).",
    uses_int8_activations=lambda lay, level, constant=True: constant and lay.block_size is not None,
)


# ------------------------------------------------------ bitsandbytes 4-bit: one rule each
from qconform.ops.bnb._common import input_dtype  # noqa: E402
from qconform.oracles.bnb.codes import (  # noqa: E402
    CPU_ORDER,
    FP4,
    FP4_CUDA_MAGNITUDE_CODES,
    FP4_CUDA_THRESHOLDS,
    FP4_NATIVE,
    NF4_CUDA_THRESHOLDS,
)


def _q4_from_codes(A, blocksize, out, nibbles, variant="cpu"):
    """The quantize output with the codes ``nibbles(x, blocksize)`` and the variant's absmax (which
    does not depend on the quant type)."""
    bnb_quantize.check_quantize_args(A, blocksize, out)
    y = bnb_quantize.nf4_quantize(A, blocksize, variant=variant)
    absmax, _ = bnb_quantize.split(y, A.size, blocksize)
    x = to_values(A, input_dtype("A", A)).reshape(-1)
    q = nibbles(x, blocksize)
    return deliver(np.concatenate([absmax.astype("<f4").view(np.uint8), pack_nibbles(q.astype(np.uint8))]), out)


def _cpu_s(x, bs):
    s, _ = default_scale(x, bs)
    return np.append(s, np.float32(0)) if x.size % 2 else s


def _cuda_t(x, bs):
    t, _ = cuda_scale(x, bs, True, None)
    return t.reshape(-1)[: x.size + x.size % 2]


@_for("nf4_quantize", "Xfp16_Ynf4")
def nf4_quantize_low_nibble_first(A, blocksize=64, *, out=None):
    """Packs element 2j in the low nibble of byte j (bitsandbytes puts it in the high one)."""
    y = bnb_quantize.nf4_quantize(A, blocksize, out=out)
    nb = -(-A.size // blocksize)
    p = y[4 * nb :]
    p[...] = (p << 4) | (p >> 4)
    return y


@_for("fp4_quantize", "Xfp32_Yfp4")
def fp4_quantize_sorted_index(A, blocksize=64, *, out=None):
    """Stores the index of the nearest value in the sorted FP4 table, where bitsandbytes stores its
    sign-exponent-mantissa code ``order[q]`` (backends/default/ops.py)."""
    return _q4_from_codes(A, blocksize, out, lambda x, bs: np.searchsorted(CPU_BOUNDS["fp4"], _cpu_s(x, bs)))


@_for("fp4_quantize", "Xfp32_Yfp4")
def fp4_quantize_zero_keeps_sign(A, blocksize=64, *, out=None):
    """Sends 0 < s <= 1/384 to code 0 (+0) and -1/384 < s < 0 to code 8 (-0), where the CPU's
    bucketize on the sorted table gives the opposite slots (docs/bnb-4bit.md 2.3)."""

    def nibbles(x, bs):
        s = _cpu_s(x, bs)
        q = CPU_ORDER["fp4"][np.searchsorted(CPU_BOUNDS["fp4"], s)]
        tiny = (np.abs(s) <= np.float32(1 / 384)) & (s != 0)
        return np.where(tiny, np.where(s > 0, 0, 8), q)

    return _q4_from_codes(A, blocksize, out, nibbles)


@_for("fp4_quantize", "Xfp32_Yfp4")
def fp4_quantize_ties_up(A, blocksize=64, *, out=None):
    """FP4 on the CPU rule with a tie going to the upper value (bucketize right=True)."""

    def nibbles(x, bs):
        s = _cpu_s(x, bs)
        return CPU_ORDER["fp4"][np.where(np.isnan(s), 15, np.searchsorted(CPU_BOUNDS["fp4"], s, side="right"))]

    return _q4_from_codes(A, blocksize, out, nibbles)


@_for("nf4_quantize", "Xfp32_Ynf4")
def nf4_quantize_nan_skipped(A, blocksize=64, *, out=None):
    """The CPU rule with NaN skipped in the block max (as CUDA's fmaxf), where torch's max propagates
    it (absmax NaN, the whole block code 15)."""
    bnb_quantize.check_quantize_args(A, blocksize, out)
    x = to_values(A, input_dtype("A", A)).reshape(-1)
    clean = np.where(np.isnan(x), np.float32(0), x).astype(np.float32)
    s, absmax = default_scale(clean, blocksize)
    s = np.where(np.isnan(x), np.float32(np.nan), s)
    s = np.append(s, np.float32(0)) if x.size % 2 else s
    q = np.searchsorted(CPU_BOUNDS["nf4"], s)
    return deliver(np.concatenate([absmax.astype("<f4").view(np.uint8), pack_nibbles(q.astype(np.uint8))]), out)


@_for("nf4_quantize", "Xfp32_Ynf4")
def nf4_quantize_pad_nibble_zero(A, blocksize=64, *, out=None):
    """Leaves the pad nibble of an odd n at 0, where bitsandbytes stores the code of 0.0 (NF4 7)."""
    y = bnb_quantize.nf4_quantize(A, blocksize, out=out)
    if A.size % 2:
        y[-1] &= 0xF0
    return y


@_for("nf4_quantize", "Xfp32_Ynf4")
def nf4_quantize_zero_block_absmax_clamped(A, blocksize=64, *, out=None):
    """Returns the clamped absmax 1e-38 for a full all-zero block, where the CPU path returns 0 there
    (only the partial last block's absmax is the clamped value)."""
    y = bnb_quantize.nf4_quantize(A, blocksize, out=out)
    nb = -(-A.size // blocksize)
    a = y[: 4 * nb].view("<f4")
    a[a == 0] = np.float32(1e-38)
    return y


@_for("fp4_quantize", "Xbf16_Yfp4")
def fp4_quantize_cuda_midpoint_thresholds(A, blocksize=64, *, out=None):
    """CUDA's FP4 tree on the float32 midpoints of the table, where dQuantizeFP4 compares with its
    literals (T0 14 ulp above, T2/T3/T5/T6 1-6 ulp below their midpoints)."""
    mag = np.unique(np.abs(FP4))
    mid = ((mag[:-1].astype(np.float64) + mag[1:]) / 2).astype(np.float32)

    def nibbles(x, bs):
        t = _cuda_t(x, bs)
        k = np.where(np.isnan(t), 0, np.searchsorted(mid, np.abs(t)))
        return FP4_CUDA_MAGNITUDE_CODES[k] | np.where(t < 0, 8, 0)

    return _q4_from_codes(A, blocksize, out, nibbles, "cuda")


fp4_quantize_cuda_midpoint_thresholds.__qconform_contract__ = "variant=cuda"


@_for("fp4_quantize", "Xfp32_Yfp4")
def fp4_quantize_cuda_signbit(A, blocksize=64, *, out=None):
    """CUDA's FP4 sign from the sign bit (so -0.0 gets code 8), where dQuantizeFP4 tests ``s < 0``."""

    def nibbles(x, bs):
        t = _cuda_t(x, bs)
        k = np.where(np.isnan(t), 0, np.searchsorted(FP4_CUDA_THRESHOLDS, np.abs(t)))
        return FP4_CUDA_MAGNITUDE_CODES[k] | np.where(np.signbit(t) & ~np.isnan(t), 8, 0)

    return _q4_from_codes(A, blocksize, out, nibbles, "cuda")


fp4_quantize_cuda_signbit.__qconform_contract__ = "variant=cuda"


@_for("nf4_quantize", "Xfp32_Ynf4")
def nf4_quantize_cuda_zero_block_guarded(A, blocksize=64, *, out=None):
    """CUDA's rule with ``r = absmax == 0 ? 0 : 1/absmax``: a zero block gets NF4 7, where the kernel's
    0 * inf = NaN gives code 0 (value -1.0 times 0)."""

    def nibbles(x, bs):
        t, am = cuda_scale(x, bs, True, None)
        t = np.where((am == 0)[:, None], np.float32(0), t).reshape(-1)[: x.size + x.size % 2]
        return np.where(np.isnan(t), 0, np.searchsorted(NF4_CUDA_THRESHOLDS, t))

    return _q4_from_codes(A, blocksize, out, nibbles, "cuda")


nf4_quantize_cuda_zero_block_guarded.__qconform_contract__ = "variant=cuda"


@_for("fp4_decode", "Xfp4_Yfp32")
def fp4_decode_native_table_on_odd_width(packed, absmax, *, out=None, **kw):
    """Decodes FP4 code 8 as -0 (the C++ table) for every width, where bitsandbytes' CPU backend takes
    its Python path, whose code 8 is +0, when the last dimension is odd."""
    y = bnb_decode.fp4_decode(packed, absmax, out=out, **kw)
    rows, cols, dtype = kw["rows"], kw["cols"], kw.get("dtype", "float32")
    if cols % 2:
        n = rows * cols
        p = packed.reshape(-1)
        q = np.stack([p >> 4, p & 0x0F], axis=1).reshape(-1)[:n]
        with np.errstate(all="ignore"):
            v = (FP4_NATIVE[q] * np.repeat(absmax, kw["blocksize"])[:n]).astype(np.float32)
        y[...] = from_f32(v, dtype).reshape(rows, cols)
    return y


@_for("fp4_decode", "Xfp4_Yfp16")
def fp4_decode_sign_in_bit_0(packed, absmax, *, out=None, **kw):
    """Reads FP4's sign from bit 0 and the magnitude from bits 3..1 (an E2M1-style layout), where
    bitsandbytes' FP4 has the sign in bit 3."""
    p = packed.reshape(-1)
    hi, lo = p >> 4, p & 0x0F
    perm = lambda q: (((q & 1) << 3) | (q >> 1)).astype(np.uint8)  # noqa: E731
    moved = ((perm(hi) << 4) | perm(lo)).astype(np.uint8).reshape(packed.shape)
    bnb_decode.fp4_decode(packed, absmax, **kw)  # the checks, on the caller's arrays
    return bnb_decode.fp4_decode(moved, absmax, out=out, **kw)


@_for("nf4_decode", "Xnf4_Ybf16")
def nf4_decode_bf16_truncated(packed, absmax, *, out=None, **kw):
    """Narrows the float32 product to bfloat16 by dropping its low 16 bits, where bitsandbytes rounds
    to nearest even."""
    v = bnb_decode.nf4_decode(packed, absmax, **{**kw, "dtype": "float32"})
    y = (v.view(np.uint32) >> 16).astype(np.uint16)
    bnb_decode.check_decode_args(packed, absmax, kw["rows"], kw["cols"], kw["blocksize"], kw["dtype"], out)
    return deliver(y, out)


@_for("nf4_decode", "Xnf4_Yfp16")
def nf4_decode_code_cast_first(packed, absmax, *, out=None, **kw):
    """``T(fl32(T(code) * absmax))``: the table rounded to the output type before the multiply
    (bitsandbytes 0.49's default path), where 0.50 multiplies with the float32 table."""
    n, dtype = kw["rows"] * kw["cols"], kw["dtype"]
    bnb_decode.check_decode_args(packed, absmax, kw["rows"], kw["cols"], kw["blocksize"], dtype, out)
    p = packed.reshape(-1)
    q = np.stack([p >> 4, p & 0x0F], axis=1).reshape(-1)[:n]
    code = to_values(from_f32(NF4, dtype), dtype)
    with np.errstate(all="ignore"):
        v = (code[q] * np.repeat(absmax, kw["blocksize"])[:n]).astype(np.float32)
    return deliver(from_f32(v, dtype).reshape(kw["rows"], kw["cols"]), out)


@_for("nf4_decode", "Xnf4_Yfp32")
def nf4_decode_last_block_previous_scale(packed, absmax, *, out=None, **kw):
    """Scales a partial last block by the previous block's absmax (an off-by-one block index for
    the tail), where bitsandbytes uses the tail's own absmax."""
    n, bs = kw["rows"] * kw["cols"], kw["blocksize"]
    bnb_decode.nf4_decode(packed, absmax, **kw)  # the checks
    shifted = absmax.copy()
    if n % bs and absmax.size > 1:
        shifted[-1] = absmax[-2]
    return bnb_decode.nf4_decode(packed, shifted, out=out, **kw)


@_for("nested_absmax", "Xu8_Yfp32_fma")
def nested_fma_mode_two_roundings(qabsmax, absmax2, offset, *, mode="two_round", out=None, **kw):
    """The two_round result (product rounded, then the sum) where the fma mode asked for rounds once."""
    bnb_nested.check_nested_args(qabsmax, absmax2, offset, mode, out)
    return bnb_nested.nested_absmax(qabsmax, absmax2, offset, mode="two_round", out=out, **kw)


@_for("nested_absmax", "Xu8_Yfp32")
def nested_dynamic_map_from_numpy_linspace(qabsmax, absmax2, offset, *, mode="two_round", out=None):
    """The dynamic map regenerated with numpy's float32 linspace (22 entries 1 ulp off), where
    bitsandbytes' table comes from torch.linspace (codes.DYNAMIC_MAP)."""
    bnb_nested.check_nested_args(qabsmax, absmax2, offset, mode, out)
    data = []
    for i in range(7):
        b = np.linspace(0.1, 1, 2**i + 1, dtype=np.float32)
        mean = ((b[:-1] + b[1:]) / np.float32(2)).astype(np.float32)
        v = (np.float32(10) ** np.float32(i - 6) * mean).astype(np.float32)
        data += [*v, *(-v)]
    code = np.sort(np.array(data + [0.0, 1.0], np.float32))
    with np.errstate(all="ignore"):
        p = (code[qabsmax.astype(np.int64)] * np.repeat(absmax2, 256)[: qabsmax.size]).astype(np.float32)
        y = (p + offset.reshape(-1)[0]).astype(np.float32)
    return deliver(y, out)


def _gemm_with(A, B, absmax, bias, out, kw, *, low_first=False, round_w=True, per_row=False, trunc=False):
    """The cpu reading (weights T(fl32(code * absmax)), exact products, one rounding) with knobs."""
    dtype, M, N = bnb_gemm.check_gemm_args(A, B, absmax, bias, out=out, **kw)
    K, bs = kw["K"], kw["blocksize"]
    p = B.reshape(-1)
    q = (np.stack([p & 0x0F, p >> 4], 1) if low_first else np.stack([p >> 4, p & 0x0F], 1)).reshape(-1)[: N * K]
    i = np.arange(N * K)
    blk = np.minimum((i // K) * -(-K // bs) + (i % K) // bs, absmax.size - 1) if per_row else i // bs
    code = NF4 if kw["quant_type"] == "nf4" else FP4
    w = (code[q] * absmax[blk]).astype(np.float32)
    w = to_values(from_f32(w, dtype), dtype) if round_w else w
    ref = to_values(A, dtype).reshape(M, K).astype(np.float64) @ w.reshape(N, K).T.astype(np.float64)
    if bias is not None:
        ref += to_values(bias, dtype)
    v = ref.astype(np.float32)
    y = (v.view(np.uint32) >> 16).astype(np.uint16) if trunc and dtype == "bfloat16" else from_f32(v, dtype)
    return deliver(y.reshape(*A.shape[:-1], N), out)


@_for("gemm_4bit", "Xfp32_W4_Yfp32")
def gemm_low_nibble_first(A, B, absmax, bias=None, *, out=None, **kw):
    """Reads weight element 2j from the low nibble of byte j."""
    return _gemm_with(A, B, absmax, bias, out, kw, low_first=True)


@_for("gemm_4bit", "Xbf16_W4_Ybf16")
def gemm_weights_kept_fp32(A, B, absmax, bias=None, *, out=None, **kw):
    """Multiplies by the float32 weights ``fl32(code * absmax)``, where the CPU path (dequantize_4bit to
    A's dtype, then F.linear) rounds each weight to bf16 first."""
    return _gemm_with(A, B, absmax, bias, out, kw, round_w=False)


@_for("gemm_4bit", "Xfp16_W4_Yfp16")
def gemm_absmax_indexed_per_row(A, B, absmax, bias=None, *, out=None, **kw):
    """Indexes absmax as ``n * ceil(K / bs) + k // bs`` (blocks restart at each weight row), where
    bitsandbytes' blocks run over the flattened weight: differs when K % blocksize != 0."""
    return _gemm_with(A, B, absmax, bias, out, kw, per_row=True)


@_for("gemm_4bit", "Xbf16_W4_Ybf16")
def gemm_bf16_output_truncated(A, B, absmax, bias=None, *, out=None, **kw):
    """Narrows the fp32 sum to bf16 by truncation, where bitsandbytes rounds to nearest even."""
    return _gemm_with(A, B, absmax, bias, out, kw, trunc=True)


# the three GQA rules the cases could not tell apart before: per-row position_ids on a first prompt,
# a dividing cache quantizer, head_sink given with smooth_softmax = 1
_rotary_positions_ref = _gqa.rotary_positions
_quantize_kv_ref = _gqa.quantize_kv


def _positions_per_row(batch, seq, pasts, first, position_ids):
    if first and position_ids is not None:
        return np.asarray(position_ids, np.int64)[:, :seq].copy()
    return _rotary_positions_ref(batch, seq, pasts, first, position_ids)


gqa_first_prompt_position_ids_per_row = _gqa_with(
    "gqa_prefill", "Xfp16_Wfp16_Yfp16",
    "A first prompt rotated at position_ids[b, s] (ORT: position_ids[0, 0] + s for every b).",
    rotary_positions=_positions_per_row,
)


def _quantize_kv_dividing(x, scale, bit_width, form="ort"):
    if form != "ort":
        return _quantize_kv_ref(x, scale, bit_width, form)
    lo, hi = (-128, 127) if bit_width == 8 else (-8, 7)
    with np.errstate(over="ignore", invalid="ignore"):
        r = np.rint((np.asarray(x, np.float32) / scale[None, :, None, :].astype(np.float32)).astype(np.float32))
    q = np.clip(np.nan_to_num(r), lo, hi).astype(np.int64)
    if bit_width == 8:
        return q.astype(np.int8)
    nib = (q + 8).astype(np.uint8)
    return (nib[..., 0::2] | (nib[..., 1::2] << 4)).astype(np.uint8)


gqa_kv_cache_divides = _gqa_with(
    "gqa_decode", "Xfp16_Wi8_Yfp16",
    "Quantizes the cache as rint(fp32(x / s)) (ORT: rint(x * fp32(1 / s)); they differ beside ties).",
    quantize_kv=_quantize_kv_dividing,
)


@_for("gqa_decode", "Xfp16_Wfp16_Yfp16")
def gqa_packed_kv_swapped(*args, **kw):
    """Packed QKV read as Q, V, K (ORT packs Q, K, V along the last axis)."""
    a = call_arguments(_gqa.group_query_attention, args, kw)
    if a["key"] is None:
        n, nk = a["num_heads"], a["kv_num_heads"]
        q = a["query"]
        h = q.shape[2] // (n + 2 * nk)
        a["query"] = np.concatenate([q[..., : n * h], q[..., (n + nk) * h :], q[..., n * h : (n + nk) * h]], -1)
    return _gqa.group_query_attention(**a)


@_for("gqa_decode", "Xfp16_Wfp16_Yfp16")
def gqa_scale_attribute_ignored(*args, **kw):
    """The scale attribute ignored: always 1/sqrt(head_size)."""
    return _gqa.group_query_attention(**{**call_arguments(_gqa.group_query_attention, args, kw), "scale": 0.0})


def _kv_scale_transposed(name, scale, quant_type, kv_num_heads, head_size):
    """A PER_CHANNEL scale read as (head_size, kv_num_heads): channel h of KV head n from scale[h * Nk + n]."""
    s = expand_kv_scale(name, scale, quant_type, kv_num_heads, head_size)
    return s.reshape(head_size, kv_num_heads).T.copy() if quant_type == "PER_CHANNEL" else s


gqa_per_channel_scale_transposed = _gqa_with(
    "gqa_decode", "Xfp16_Wi8_Yfp16",
    "PER_CHANNEL k/v scales read head-minor (ORT: [kv head][channel], Nk * H floats row-major).",
    expand_kv_scale=_kv_scale_transposed,
)


@_for("gqa_decode", "Xfp16_Wfp16_Yfp16")
def gqa_smooth_and_head_sink_both(*args, **kw):
    """head_sink given with smooth_softmax = 1 adds both sinks, exp(sink - m) + exp(-m), to the
    denominator (ORT's CPU takes head_sink alone)."""
    a = call_arguments(_gqa.group_query_attention, args, kw)
    if a["head_sink"] is None or a["smooth_softmax"] != 1:
        return _gqa.group_query_attention(**a)

    def softmax(x, mask, sink, exact):
        xm = np.where(mask, x, -np.inf)
        m = np.maximum(np.maximum(xm.max(-1, keepdims=True), sink[None, :, None, None]), 0.0)
        e = np.where(mask, np.exp(xm - m), 0.0)
        return e / (e.sum(-1, keepdims=True) + np.exp(sink[None, :, None, None] - m) + np.exp(-m))

    with _swapped(_gqa, _softmax=softmax):
        return _gqa.group_query_attention(**a)


@_for("nested_absmax", "Xu8_Yfp32")
def nested_last_group_previous_scale(qabsmax, absmax2, offset, *, mode="two_round", out=None, **kw):
    """A partial last group of 256 codes scaled by the previous group's absmax2 (an off-by-one group
    index for the tail), where bitsandbytes uses group j // 256's own."""
    bnb_nested.check_nested_args(qabsmax, absmax2, offset, mode, out)
    a2 = absmax2.copy()
    if qabsmax.size % 256 and a2.size > 1:
        a2[-1] = a2[-2]
    return bnb_nested.nested_absmax(qabsmax, a2, offset, mode=mode, out=out, **kw)

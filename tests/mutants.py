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
from qconform.formats.bf16 import bf16_bits_to_fp32
from qconform.formats.fp16 import fp16_bits_to_fp32, fp32_to_fp16_bits
from qconform.formats.ggml import Q8_0, Q8_1, Q8_K
from qconform.oracles.ggml import check_dequantize_args, check_quantize_args, dequantize, quantize

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
from qconform.oracles.bnb.blockwise import cuda_scale, default_scale  # noqa: E402
from qconform.oracles.bnb.codes import CPU_BOUNDS, NF4, create_dynamic_map  # noqa: E402
from qconform.oracles.bnb.fourbit import pack_nibbles  # noqa: E402


@_for("nf4_decode", "Xnf4_Yfp16")
def nf4_decode_low_nibble_first(packed, absmax, *, out=None, **kw):
    """Reads element 2j from the low nibble of byte j (bitsandbytes puts it in the high one)."""
    swapped = ((packed << 4) | (packed >> 4)).astype(np.uint8)
    bnb_decode.nf4_decode(packed, absmax, **kw)  # the checks, on the caller's arrays
    return bnb_decode.nf4_decode(swapped, absmax, out=out, **kw)


def _nf4_from_codes(A, blocksize, out, nibbles, variant: str = "cpu") -> np.ndarray:
    """nf4_quantize's output with the codes ``nibbles(x, blocksize)`` and the variant's absmax."""
    bnb_quantize.check_quantize_args(A, blocksize, out)
    y = bnb_quantize.nf4_quantize(A, blocksize, variant=variant)
    absmax, _ = bnb_quantize.split(y, A.size, blocksize)
    x = A.reshape(-1).astype(np.float32)
    q = nibbles(x, blocksize)
    return deliver(np.concatenate([absmax.astype("<f4").view(np.uint8), pack_nibbles(q.astype(np.uint8))]), out)


@_for("nf4_quantize", "Xfp32_Ynf4")
def nf4_quantize_ties_up(A, blocksize=64, *, out=None):
    """bitsandbytes' CPU rule with a scaled value on a midpoint going to the upper code (torch.bucketize
    with right=True) where bitsandbytes' ``bucketize`` sends it to the lower one."""

    def nibbles(x, bs):
        s, _ = default_scale(x, bs)
        s = np.append(s, np.float32(0)) if x.size % 2 else s
        return np.where(np.isnan(s), 15, np.searchsorted(CPU_BOUNDS["nf4"], s, side="right"))

    return _nf4_from_codes(A, blocksize, out, nibbles)


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


def _only(fmt_name: str, x, qtype: str, out):
    fmt, _ = check_quantize_args(x, qtype, out)
    if fmt.name != fmt_name:
        raise NotImplementedError(f"this mutant only quantizes {fmt_name}, not {qtype}")


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


def q4_k_dequant_scale_of_next_subblock(data: np.ndarray, qtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """Dequantizes sub-block j of each Q4_K block with the 6-bit scale of sub-block (j + 1) % 8 (the
    mins as ggml reads them): get_scale_min_k4 indexed one off."""
    fmt, _ = check_dequantize_args(data, qtype, out)
    if fmt is not Q4_K:
        raise NotImplementedError(f"this mutant only dequantizes Q4_K, not {qtype}")
    y = dequantize(_q4_k_next_subblock_scales(data), qtype)
    return y if out is None else np.copyto(out, y) or out


_declare(q4_k_dequant_scale_of_next_subblock, "q4_k_dequant")

"""Broken ggml drop-ins, each the oracle with exactly one rule its docstring or docs/ggml-formats.md
states changed (re-exported by ``mutants.py``, where ``test_mutants.py`` runs each)."""

from __future__ import annotations

import functools
import importlib
from unittest import mock

import numpy as np

import qconform.ops.ggml.keep_quant as keep_quant
import qconform.ops.ggml.requant_ties as requant_ties
from qconform.formats.fp16 import fp16_bits_to_fp32, fp32_to_fp16_bits
from qconform.formats.ggml import FORMATS
from qconform.oracles.ggml import check_dequantize_args, check_quantize_args, dequantize, legacy, quantize
from qconform.oracles.ggml.fma import fmaf
from qconform.oracles.ggml.rounding import nearest_int

kq = importlib.import_module("qconform.oracles.ggml.kquant_search")
q2k = importlib.import_module("qconform.oracles.ggml.q2_k")
q3k = importlib.import_module("qconform.oracles.ggml.q3_k")
q4k = importlib.import_module("qconform.oracles.ggml.q4_k")
q6k = importlib.import_module("qconform.oracles.ggml.q6_k")
iq4nl = importlib.import_module("qconform.oracles.ggml.iq4_nl")
iq4xs = importlib.import_module("qconform.oracles.ggml.iq4_xs")
vdg = importlib.import_module("qconform.oracles.ggml.vec_dot_generic")
fused = importlib.import_module("qconform.oracles.ggml.fused")

swapped = mock.patch.multiple  # module attributes replaced inside the block, restored after


def _op(op: str, leaf: str | None = None):
    """Declare the op a mutant replaces (and the leaf its test runs, where given)."""

    def mark(fn):
        fn.__qconform_ops__ = (op,)
        if leaf:
            fn.__qconform_leaf__ = leaf
        return fn

    return mark


def _only(name, x, qtype, out, check=check_quantize_args):
    """The oracle's argument checks; a format other than ``name`` is not this mutant's (declined)."""
    fmt, _ = check(x, qtype, out)
    if fmt.name != name:
        raise NotImplementedError(f"this mutant only takes {name}, not {qtype}")
    return fmt


def _oracle_blocks(name, x, qtype, out):
    """The reference's output for a ``name`` mutant to edit: (its bytes, their block structs)."""
    _only(name, x, qtype, out)
    y = quantize(x, qtype, out=out)
    return y, FORMATS[name].blocks(y.reshape(-1))


def _quant_with(name, mod, **swaps):
    """A ``<name>_quant`` mutant: ``quantize`` through the numpy spec with functions of ``mod`` swapped."""

    def f(x, qtype, out=None):
        _only(name, x, qtype, out)
        with swapped(mod, **swaps):
            return quantize(x, qtype, out=out, backend="numpy")

    f.__qconform_ops__ = (f"{name.lower()}_quant",)
    return f


# ------------------------------------------------------------------ legacy: FMA contraction of the code
ONE, ZERO, POINT5 = np.float32(1), np.float32(0), np.float32(0.5)


def _symmetric_codes_last(x, bits, ftz):
    """>= in the max scan: the LAST of equal |x| wins."""
    half = np.float32(1 << (bits - 1))
    qmax = (1 << bits) - 1
    a = np.abs(x)
    amax = np.zeros(len(x), np.float32)
    mx = np.zeros(len(x), np.float32)
    for j in range(32):
        upd = (a[:, j] >= amax) & (a[:, j] > 0)  # ONE CHANGE (keeps max=+0 on all-zero blocks)
        amax = np.where(upd, a[:, j], amax)
        mx = np.where(upd, x[:, j], mx)
    with np.errstate(all="ignore"):
        d = (mx / -half).astype(np.float32)
        idd = np.where(d != 0, ONE / np.where(d != 0, d, ONE), ZERO).astype(np.float32)
        v = ((x * idd[:, None]).astype(np.float32) + (half + POINT5)).astype(np.float32)
    q = np.minimum(qmax, legacy.as_int8(legacy.trunc_byte(v))) & 0xFF
    return d, q


q5_0_last_on_equal_abs = _quant_with("Q5_0", legacy, symmetric_codes=_symmetric_codes_last)


def _affine_codes_x0(x, bits, clamp, ftz):
    """min/max initialised from x[0] (not FLT_MAX / -FLT_MAX)."""
    nmax = (1 << bits) - 1
    mn = x[:, 0].copy()  # ONE CHANGE
    mx = x[:, 0].copy()
    for j in range(1, 32):
        mn = np.where(x[:, j] < mn, x[:, j], mn)
        mx = np.where(x[:, j] > mx, x[:, j], mx)
    with np.errstate(all="ignore"):
        d = ((mx - mn) / np.float32(nmax)).astype(np.float32)
        idd = np.where(d != 0, ONE / np.where(d != 0, d, ONE), ZERO).astype(np.float32)
        v = (((x - mn[:, None]).astype(np.float32) * idd[:, None]).astype(np.float32) + POINT5).astype(np.float32)
    b = legacy.trunc_byte(v)
    q = np.minimum(nmax, legacy.as_int8(b)) & 0xFF if clamp else b
    return d, mn, q


q4_1_minmax_from_x0 = _quant_with("Q4_1", legacy, affine_codes=_affine_codes_x0)


# ------------------------------------------------------------------ zero blocks: +0.0 d
@_op("q5_0_quant")
def q5_0_zero_block_positive_d(x, qtype, out=None):
    y, b = _oracle_blocks("Q5_0", x, qtype, out)
    b["d"][(x.reshape(-1, 32) == 0).all(axis=1)] = 0
    return y


@_op("iq4_xs_quant")
def iq4_xs_zero_block_positive_d(x, qtype, out=None):
    y, b = _oracle_blocks("IQ4_XS", x, qtype, out)
    b["d"][b["d"] == 0x8000] = 0
    return y


# ------------------------------------------------------------------ Q8_1: CUDA's s = sum(x)
@_op("q8_1_quant")
def q8_1_s_is_sum_x(x, qtype, out=None):
    """s = fp16(sum of the fp32 x) (CUDA quantize_q8_1) instead of fp16(d * sum(qs))."""
    y, b = _oracle_blocks("Q8_1", x, qtype, out)
    with np.errstate(all="ignore"):
        s = np.zeros(len(b), np.float32)
        for j in range(32):
            s = (s + x.reshape(-1, 32)[:, j]).astype(np.float32)
    ok = np.isfinite(s)
    b["s"][ok] = fp32_to_fp16_bits(s[ok])
    return y


# ------------------------------------------------------------------ K-quant searches: loop bounds / constants
_orig_qkx2 = kq.make_qkx2_quants


def _qkx2_with(nstep_delta=0, rmin=None):
    def f(x, w, nmax, rmin_, rdelta, nstep, use_mad, ftz=False):
        return _orig_qkx2(x, w, nmax, rmin_ if rmin is None else rmin, rdelta, nstep + nstep_delta, use_mad, ftz)

    return f


# for (is = 0; is < nstep; ...)
q2_k_nstep_off_by_one = _quant_with("Q2_K", q2k, make_qkx2_quants=_qkx2_with(nstep_delta=-1))
q4_k_rmin_of_q5_k = _quant_with("Q4_K", q4k, make_qkx2_quants=_qkx2_with(rmin=-0.5))
q5_k_rmin_of_q4_k = _quant_with("Q5_K", q4k, make_qkx2_quants=_qkx2_with(rmin=-1.0))


# the final requantisation: "dd == 0 keeps make_qkx2's L"


@_op("q2_k_quant")
def q2_k_requant_when_dd_zero(x, qtype, out=None):
    """Requantizes every sub-block, also those whose dd = d*sc is 0 ((x+dm)/0 -> +-inf -> nearest_int -> 0)."""
    n = x.size // 256
    y, b = _oracle_blocks("Q2_K", x, qtype, out)
    dd, _ = requant_ties.stored_scales("Q2_K", y)
    requant = kq.clamp(kq.nearest_int_k(requant_ties.quotients("Q2_K", x, y)), 0, 3)
    L = q2k.unpack_q2(b["qs"]).reshape(n, 16, 16)
    L = np.where((dd == 0)[..., None], requant, L)
    b["qs"] = q2k.pack_q2(L.reshape(n, 256))
    return y


def _div_requant_by_reciprocal(a, b, ftz):
    """The module's fp32 division, but the final requantisation (its only one on (blocks,
    sub-blocks, values) arrays) as (x + dm) * (1/dd)."""
    if np.ndim(a) == 3:
        return kq.mul(a, kq.div(np.float32(1), b, ftz), ftz)
    return kq.div(a, b, ftz)


q2_k_requant_by_reciprocal = _quant_with("Q2_K", q2k, div=_div_requant_by_reciprocal)
q3_k_requant_by_reciprocal = _quant_with("Q3_K", q3k, div=_div_requant_by_reciprocal)
q4_k_requant_by_reciprocal = _quant_with("Q4_K", q4k, div=_div_requant_by_reciprocal)
q5_k_requant_by_reciprocal = _quant_with("Q5_K", q4k, div=_div_requant_by_reciprocal)
q6_k_requant_by_reciprocal = _quant_with("Q6_K", q6k, div=_div_requant_by_reciprocal)
# make_qx_quants' scale search over is = -8 .. 8 instead of ggml's -9 .. 9
q6_k_qx_steps_8 = _quant_with("Q6_K", q6k, make_qx_quants=functools.partial(kq.make_qx_quants, steps=8))

# make_qkx2_quants (kquant_search) without one of its rules on a positive min
q4_k_start_min_positive = _quant_with("Q4_K", kq, min_not_positive=lambda mn: mn)
q2_k_start_min_positive = _quant_with("Q2_K", kq, min_not_positive=lambda mn: mn)
q5_k_fit_min_positive = _quant_with("Q5_K", kq, refit_positive_min=lambda sc, mn, *_: (sc, mn))
q2_k_fit_min_positive = _quant_with("Q2_K", kq, refit_positive_min=lambda sc, mn, *_: (sc, mn))


# ------------------------------------------------------------------ IQ4_NL / IQ4_XS


_best_index_ref = iq4nl.best_index


def _best_index_ties_down(v):
    """The oracle's best_index, but a v exactly half-way between two table values (in fp32) takes the
    lower one; ggml's ``best_index_int8`` compares with < and takes the upper."""
    idx = _best_index_ref(v)
    v = np.asarray(v, dtype=np.float32)
    up = np.clip(idx, 1, 15)
    with np.errstate(invalid="ignore"):
        tie = (idx >= 1) & (v > iq4nl.KV[0]) & (v < iq4nl.KV[15]) & ((v - iq4nl.KV[up - 1]) == (iq4nl.KV[up] - v))
    return np.where(tie, idx - 1, idx)


iq4_nl_best_index_ties_down = _quant_with("IQ4_NL", iq4nl, best_index=_best_index_ties_down)


@_op("iq4_nl_quant")
def iq4_nl_chunk_quantizer(x, qtype, out=None):
    """quantize_iq4_nl (ntry = 7, what llama-quantize uses) where the op is quantize_row_iq4_nl_ref (ntry = -1)."""
    _only("IQ4_NL", x, qtype, out)
    y = quantize(x, qtype, variant="chunk")
    return y if out is None else (np.copyto(out, y) or out)


@_op("iq4_xs_quant")
def iq4_xs_dl_from_fp16_d(x, qtype, out=None):
    """dl = h2f(fp16(d)) * l instead of the fp32 d."""
    _only("IQ4_XS", x, qtype, out)
    orig_flush = iq4xs.flush
    calls = {"n": 0}

    def flush_hook(a, ftz):
        calls["n"] += 1
        a = orig_flush(a, ftz)
        if calls["n"] == 2:  # the second flush in quantize_blocks_numpy is d = flush(-max_scale / 32)
            with np.errstate(all="ignore"):
                return fp16_bits_to_fp32(fp32_to_fp16_bits(a)).astype(np.float32)
        return a

    with swapped(iq4xs, flush=flush_hook):
        return quantize(x, qtype, out=out, backend="numpy")


# ------------------------------------------------------------------ dequant NaN bits


@_op("q5_0_dequant")
def q5_0_dequant_qh_big_endian(data, qtype, out=None):
    """qh read as a big-endian uint32."""
    _only("Q5_0", data, qtype, out, check_dequantize_args)
    d = data.copy()
    b = FORMATS["Q5_0"].blocks(d)
    b["qh"] = b["qh"].byteswap()
    y = dequantize(d, qtype)
    return y if out is None else (np.copyto(out, y) or out)


# ------------------------------------------------------------------ vec_dot order / terms
def _mm_with(name, leaf, fn):
    def mm(W_blocks, qtype, A_fp32, *, fma=False, out=None):
        keep_quant.check_matmul_args(W_blocks, qtype, A_fp32, out)
        with swapped(vdg, _NUMPY={**vdg._NUMPY, name: fn}):
            return keep_quant.matmul_bt_quant(W_blocks, qtype, A_fp32, fma=fma, out=out, backend="numpy")

    mm.__qconform_ops__ = ("matmul_bt_quant",)
    mm.__qconform_leaf__ = leaf
    return mm


def _dot_q4_1_s_recomputed(w, a, fused_):
    """min term mx * (dy * sum(qs)) in fp32 instead of mx * s (the activation's stored fp16 s)."""
    a2 = a.copy()
    s = (vdg._h2f(a["d"]) * a["qs"].astype(np.int32).sum(-1).astype(np.float32)).astype(np.float32)
    a2["s"] = fp32_to_fp16_bits(s.reshape(-1)).reshape(s.shape)  # still fp16, but of the fp16 d
    return vdg._dot_affine(w, a2, fused_, 4)


matmul_q4_1_s_from_fp16_d = _mm_with("Q4_1", "Wq4_1_Aq8_1_Yfp32", _dot_q4_1_s_recomputed)


def _dot_q4_0_scales_first(w, a, fused_):
    """q4_0: sumf += (dx*dy) * sumi (q5_0's order) instead of (sumi*dx) * dy."""
    sumi = vdg._legacy_sym(w, a, 4)
    dx, dy = vdg._h2f(w["d"]), vdg._h2f(a["d"])
    sumf = np.zeros(len(w), np.float32)
    for ib in range(w.shape[1]):
        sumf = vdg._acc(sumf, vdg._mul(dx[:, ib], dy[:, ib]), vdg._i2f(sumi[:, ib]), fused_)
    return sumf


matmul_q4_0_scales_multiplied_first = _mm_with("Q4_0", "Wq4_0_Aq8_0_Yfp32", _dot_q4_0_scales_first)


def _dot_q4_k_mins_after_lanes(w, a, fused_):
    """q4_K: the mins term accumulated in its own fp32 sum and subtracted after the 8 lanes."""
    scale, sumi = vdg._k4_scales(w, a)
    q = vdg._k4_levels(w["qs"])
    p, nb = w.shape
    aux32 = (scale * (a["qs"].astype(np.int32) * q)).reshape(p, nb, 32, 8).sum(2)
    dx, dm = vdg._h2f(w["d"]), vdg._h2f(w["dmin"])
    sums = np.zeros((p, 8), np.float32)
    summ = np.zeros(p, np.float32)
    for i in range(nb):
        d = vdg._mul(dx[:, i], a["d"][:, i])
        sums = vdg._acc(sums, d[:, None], vdg._i2f(aux32[:, i]), fused_)
        summ = vdg._add(summ, vdg._mul(vdg._mul(dm[:, i], a["d"][:, i]), vdg._i2f(sumi[:, i])))
    sumf = np.zeros(p, np.float32)
    for lane in range(8):
        sumf = vdg._add(sumf, sums[:, lane])
    return vdg._sub(sumf, summ)


matmul_q4_k_mins_after_lanes = _mm_with("Q4_K", "Wq4_K_Aq8_K_Yfp32", _dot_q4_k_mins_after_lanes)


def _dot_q6_k_lanes_tree(w, a, fused_):
    """q6_K: the 8 lanes summed pairwise ((0+1)+(2+3))+((4+5)+(6+7)) instead of in order."""

    def eight(w, a, q, scale, mins_sum, fused_):
        p, nb = w.shape
        aux32 = (scale * (a["qs"].astype(np.int32) * q)).reshape(p, nb, 32, 8).sum(2)
        dx = vdg._h2f(w["d"])
        sums = np.zeros((p, 8), np.float32)
        for i in range(nb):
            d = vdg._mul(dx[:, i], a["d"][:, i])
            sums = vdg._acc(sums, d[:, None], vdg._i2f(aux32[:, i]), fused_)
        s = sums
        s = vdg._add(s[:, 0::2], s[:, 1::2])
        s = vdg._add(s[:, 0::2], s[:, 1::2])
        return vdg._add(np.zeros(p, np.float32), vdg._add(s[:, 0], s[:, 1]))

    with swapped(vdg, _eight_lanes=eight):
        return vdg._dot_q6_k(w, a, fused_)


matmul_q6_k_lanes_pairwise = _mm_with("Q6_K", "Wq6_K_Aq8_K_Yfp32", _dot_q6_k_lanes_tree)


def _dot_iq4_xs_ls_first(w, a, fused_):
    """iq4_xs: dl = dx * f32(yd * (ls-32)) instead of f32(dx*yd) * (ls-32)."""
    p, nb = w.shape
    ib = np.arange(8)
    ls = ((w["scales_l"][..., ib // 2].astype(np.int32) >> (4 * (ib % 2))) & 15) | (
        ((w["scales_h"][..., None].astype(np.int32) >> (2 * ib)) & 3) << 4
    )
    qs = w["qs"].astype(np.int32).reshape(p, nb, 8, 16)
    y = a["qs"].reshape(p, nb, 8, 32)
    sumi = vdg._sumi_halves(vdg.KV32[qs & 15], vdg.KV32[qs >> 4], y)
    dx = vdg._h2f(w["d"])
    sumf = np.zeros(p, np.float32)
    for i in range(nb):
        for j in range(8):
            dl = vdg._mul(vdg._mul(dx[:, i], vdg._i2f(ls[:, i, j] - 32)), a["d"][:, i])  # (dx*l)*yd
            sumf = vdg._acc(sumf, dl, vdg._i2f(sumi[:, i, j]), fused_)
    return sumf


matmul_iq4_xs_dx_times_l_first = _mm_with("IQ4_XS", "Wiq4_xs_Aq8_K_Yfp32", _dot_iq4_xs_ls_first)


# ------------------------------------------------------------------ fused producers
def _rms_scale_f32_sum(x, eps):
    sq = np.multiply(x, x, dtype=np.float32)
    total = np.zeros(len(x), np.float32)
    for i in range(x.shape[1]):
        total = (total + sq[:, i]).astype(np.float32)  # ONE CHANGE: fp32 accumulator
    mean = (total.astype(np.float64) / np.float64(x.shape[-1])).astype(np.float32)
    return np.divide(ONE, np.sqrt(np.add(mean, eps, dtype=np.float32)), dtype=np.float32)


def _rms_scale_rsqrt(x, eps):
    sq = np.multiply(x, x, dtype=np.float32).astype(np.float64)
    total = np.cumsum(sq, axis=-1)[..., -1]
    mean = (total / np.float64(x.shape[-1])).astype(np.float32)
    with np.errstate(all="ignore"):
        one = 1.0 / np.sqrt(np.add(mean, eps, dtype=np.float32).astype(np.float64))
        return one.astype(np.float32)  # one rounding


def _rms_with(scale_fn, leaf):
    def f(x, gamma, eps, out_dtype="float32", *, out=None):
        with swapped(fused, _rms_scale_numpy=scale_fn):
            return keep_quant.rms_norm_q8_k(x, gamma, eps, out_dtype, out=out, backend="numpy")

    f.__qconform_ops__ = ("rms_norm_q8_k",)
    f.__qconform_leaf__ = leaf
    return f


rms_norm_q8_k_fp32_sum = _rms_with(_rms_scale_f32_sum, "Xfp32_Yfp32_Aq8_K")
rms_norm_q8_k_rsqrt = _rms_with(_rms_scale_rsqrt, "Xfp32_Yfp32_Aq8_K")


def _expf_libm(x, simd):
    with np.errstate(all="ignore"):
        return np.exp(np.asarray(x, np.float64)).astype(np.float32)  # correctly rounded (nearly always)


def _silu_with(leaf):
    def f(gate, up, out_dtype="float32", *, out=None):
        with swapped(fused, _v_expf=_expf_libm):
            return keep_quant.silu_mul_q8_k(gate, up, out_dtype, out=out, backend="numpy")

    f.__qconform_ops__ = ("silu_mul_q8_k",)
    f.__qconform_leaf__ = leaf
    return f


silu_mul_q8_k_libm_expf = _silu_with("Xfp32_Yfp32_Aq8_K")


# ------------------------------------------------------------------ make_qkx2_quants: the min branches


# ------------------------------------------------------------------ Q8_K / Q8_1 activation rounding
q8k_mod = importlib.import_module("qconform.oracles.ggml.q8_k")


@_op("q8_k_quant")
def q8_k_fma_nearest_int(x, qtype, out=None):
    """nearest_int(iscale*x) with the magic add contracted: fmaf(iscale, x, 12582912.0f) (nvcc -fmad)."""
    from qconform.oracles.ggml.rounding import MAGIC

    def ni(prod, src):
        return nearest_int(prod, src)

    y, b = _oracle_blocks("Q8_K", x, qtype, out)
    xb = x.reshape(-1, 256)
    a = np.abs(xb)
    amax = np.zeros(len(xb), np.float32)
    mx = np.zeros(len(xb), np.float32)
    for j in range(256):
        upd = a[:, j] > amax
        amax = np.where(upd, a[:, j], amax)
        mx = np.where(upd, xb[:, j], mx)
    ok = (amax > 0) & np.isfinite(xb).all(axis=1)
    with np.errstate(all="ignore"):
        iscale = (np.float32(-127) / np.where(ok, mx, 1)).astype(np.float32)
        v = fmaf(np.broadcast_to(iscale[:, None], xb.shape), xb, np.full(xb.shape, MAGIC, np.float32))
    q = (v.view(np.int32) & 0x7FFFFF) - 0x400000
    q = np.minimum(127, q).astype(np.int64).astype(np.int8)
    qs = np.where(ok[:, None], q, b["qs"])
    b["qs"] = qs
    b["bsums"] = qs.reshape(-1, 16, 16).astype(np.int32).sum(axis=2).astype(np.int16)
    return y


@_op("q8_1_quant")
def q8_1_divides_by_d(x, qtype, out=None):
    """qs = roundf(x / d) (CUDA quantize_q8_1's division) instead of roundf(x * (1/d))."""
    from qconform.oracles.ggml.rounding import roundf_to_int8

    y, b = _oracle_blocks("Q8_1", x, qtype, out)
    xb = x.reshape(-1, 32)
    with np.errstate(all="ignore"):
        amax = np.zeros(len(xb), np.float32)
        for j in range(32):
            amax = np.where(amax > np.abs(xb[:, j]), amax, np.abs(xb[:, j]))
        d = (amax / np.float32(127)).astype(np.float32)
        qs = roundf_to_int8((xb / d[:, None]).astype(np.float32))
    hit = (d != 0) & np.isfinite(xb).all(axis=1) & np.isfinite(d)
    b["qs"][hit] = qs[hit]
    with np.errstate(all="ignore"):  # s as it falls (inf past fp32); a non-finite block's is not stored
        s = (b["qs"].astype(np.int32).sum(axis=1).astype(np.float32) * d).astype(np.float32)
    b["s"][hit] = fp32_to_fp16_bits(s[hit])
    return y


# ------------------------------------------------------------------ dequant layout (random_bytes should see these)
def _deq_from_bytes(name, transform):
    def f(data, qtype, out=None):
        fmt = _only(name, data, qtype, out, check_dequantize_args)
        d = data.copy()
        transform(fmt.blocks(d))
        y = dequantize(d, qtype)
        return y if out is None else (np.copyto(out, y) or out)

    f.__qconform_ops__ = (f"{name.lower()}_dequant",)
    return f


def _inv_hmask(b):
    b["hmask"] = ~b["hmask"]


def _rev_scales_h(b):
    h = b["scales_h"].astype(np.uint32)
    r = np.zeros_like(h)
    for ib in range(8):
        r |= ((h >> (2 * ib)) & 3) << (2 * (7 - ib))
    b["scales_h"] = r.astype(np.uint16)


q3_k_dequant_hmask_inverted = _deq_from_bytes("Q3_K", _inv_hmask)  # subtract 4 where the bit is SET
iq4_xs_dequant_scales_h_reversed = _deq_from_bytes("IQ4_XS", _rev_scales_h)


def _gsm_k4_min_hi_from_j_minus_4(q):
    """get_scale_min_k4 for j >= 4 taking the min's high bits from q[j-4] >> 6 (the scale's source)
    instead of q[j] >> 6."""
    q = q.astype(np.int64)
    lo, mid, hi = q[:, 0:4], q[:, 4:8], q[:, 8:12]
    sc = np.concatenate([lo & 63, (hi & 0xF) | ((lo >> 6) << 4)], axis=1)
    m = np.concatenate([mid & 63, (hi >> 4) | ((lo >> 6) << 4)], axis=1)  # ONE CHANGE: lo, not mid
    return sc, m


@_op("q4_k_dequant")
def q4_k_dequant_min_high_bits_wrong_byte(data, qtype, out=None):
    _only("Q4_K", data, qtype, out, check_dequantize_args)
    with swapped(q4k, get_scale_min_k4=_gsm_k4_min_hi_from_j_minus_4):
        return dequantize(data, qtype, out=out, backend="numpy")


@_op("q2_k_dequant")
def q2_k_dequant_min_added(data, qtype, out=None):
    """y = dl*q + ml (the min added, not subtracted)."""
    _only("Q2_K", data, qtype, out, check_dequantize_args)
    with swapped(q2k, sub=kq.add):
        return dequantize(data, qtype, out=out, backend="numpy")

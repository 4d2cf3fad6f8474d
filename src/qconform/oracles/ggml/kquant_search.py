"""The K-quant scale searches of ggml, as numpy (spec) and numba (fast) twins.

Source: ggml-org/ggml src/ggml-quants.c ``nearest_int``, ``make_qx_quants`` (rmse_type 1, no
weights: Q6_K), ``make_q3_quants`` (do_rmse: Q3_K), ``make_qkx2_quants`` (Q2_K, Q4_K, Q5_K) and
``get_scale_min_k4``; ggml-base is built without -mfma, so every fp32 operation rounds on its own
(no contraction) and C evaluates ``a*b*c`` as ``(a*b)*c``. Sums accumulate in element order from 0.

The numpy twins take sub-blocks as rows, ``x`` (m, n), and run the C loops over the n elements
(and over the candidate scales), each step vectorized across the m rows; the numba twins run one
sub-block, ``x[o:o+n]`` of a block, exactly as the C does. ``ftz``: inputs arrive already flushed
and every fp32 result is flushed (a device compiled with flush-to-zero).

NaN: ``nearest_int(NaN)`` is 0 here -- ggml's value for every quiet NaN without payload bits
(``np.nan``, and the NaN x86 creates for 0*inf or inf-inf), of either sign. A NaN *input* that
carries payload bits reaches ``nearest_int`` with its payload on x86, which these oracles do not
model (which payload survives an operation on two NaNs is the compiler's operand order).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit
from numpy.typing import ArrayLike

from qconform.formats.fp16 import fp32_bits_to_fp16_bits_nb
from qconform.formats.ftz import flush
from qconform.oracles.ggml.rounding import flush_nb, nearest_int, nearest_int_nb

GROUP_MAX_EPS = np.float32(1e-15)
F32 = np.float32


# --------------------------------------------------------------------------- numpy: fp32 steps


def mul(a: ArrayLike, b: ArrayLike, ftz: bool) -> np.ndarray:
    """``f32(a*b)`` (integers converted to float first, as C does), flushed under ftz."""
    with np.errstate(all="ignore"):
        return flush(np.multiply(a, b, dtype=F32), ftz)


def add(a: ArrayLike, b: ArrayLike, ftz: bool) -> np.ndarray:
    """``f32(a + b)``, flushed under ftz."""
    with np.errstate(all="ignore"):
        return flush(np.add(a, b, dtype=F32), ftz)


def sub(a: ArrayLike, b: ArrayLike, ftz: bool) -> np.ndarray:
    """``f32(a - b)``, flushed under ftz."""
    with np.errstate(all="ignore"):
        return flush(np.subtract(a, b, dtype=F32), ftz)


def div(a: ArrayLike, b: ArrayLike, ftz: bool) -> np.ndarray:
    """``f32(a / b)`` (IEEE: x/0 is +-inf or NaN), flushed under ftz."""
    with np.errstate(all="ignore"):
        return flush(np.divide(a, b, dtype=F32), ftz)


def nearest_int_k(f: np.ndarray) -> np.ndarray:
    """ggml ``nearest_int`` (round half to even through the 1.5*2^23 trick) -> int64; NaN -> 0."""
    f = np.asarray(f, F32)
    return nearest_int(f, np.zeros(f.shape, F32)).astype(np.int64)


def clamp(v: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """``MAX(lo, MIN(hi, v))`` on ints."""
    return np.minimum(np.maximum(v, lo), hi)


def first_strict_max(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: ``if (fabsf(x[i]) > amax) {amax = fabsf(x[i]); max = x[i];}`` from 0 -> (amax, max).
    The first index wins on equal |x|; NaN never wins."""
    amax = np.zeros(len(x), F32)
    mx = np.zeros(len(x), F32)
    for i in range(x.shape[1]):
        a = np.abs(x[:, i])
        upd = a > amax
        amax = np.where(upd, a, amax)
        mx = np.where(upd, x[:, i], mx)
    return amax, mx


def strict_max(v: np.ndarray) -> np.ndarray:
    """Per row: ``if (v[j] > m) m = v[j];`` from 0 (NaN never wins)."""
    m = np.zeros(len(v), F32)
    for j in range(v.shape[1]):
        m = np.where(v[:, j] > m, v[:, j], m)
    return m


# --------------------------------------------------------------------------- numpy: the searches


def _qx_levels(x: np.ndarray, iscale: np.ndarray, nmax: int, ftz: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One pass of make_qx_quants: l = clamp(nearest_int(iscale*x)), sumlx, suml2 (w = x*x)."""
    lv = clamp(nearest_int_k(mul(iscale[:, None], x, ftz)), -nmax, nmax - 1)
    w = mul(x, x, ftz)
    sumlx = np.zeros(len(x), F32)
    suml2 = np.zeros(len(x), F32)
    for i in range(x.shape[1]):
        sumlx = add(sumlx, mul(mul(w[:, i], x[:, i], ftz), lv[:, i], ftz), ftz)
        suml2 = add(suml2, mul(mul(w[:, i], lv[:, i], ftz), lv[:, i], ftz), ftz)
    return lv, sumlx, suml2


QX_STEPS = 9  # make_qx_quants tries iscale = -(nmax + 0.1 is) / max for is = -9 .. 9 (ggml-quants.c)


def make_qx_quants(x: np.ndarray, nmax: int, ftz: bool = False, steps: int = QX_STEPS) -> tuple[np.ndarray, np.ndarray]:
    """``make_qx_quants(n, nmax, x, L, rmse_type=1, qw=NULL)`` per row of ``x`` (m, n) float32
    -> (scale (m,) float32, L (m, n) in [0, 2*nmax)). A row with max |x| < 1e-15 gives 0, L = 0.
    ``steps``: the search's is = -steps .. steps (ggml's 9)."""
    amax, mx = first_strict_max(x)
    zero = amax < GROUP_MAX_EPS
    mx = np.where(zero, F32(1), mx)
    iscale = div(F32(-nmax), mx, ftz)
    lv, sumlx, suml2 = _qx_levels(x, iscale, nmax, ftz)
    big_l = lv + nmax
    scale = np.where(suml2 != 0, div(sumlx, suml2, ftz), F32(0))
    best = mul(scale, sumlx, ftz)
    for step in range(-steps, steps + 1):
        if step == 0:
            continue
        iscale = div(-add(F32(nmax), mul(F32(0.1), step, ftz), ftz), mx, ftz)
        lv, sumlx, suml2 = _qx_levels(x, iscale, nmax, ftz)
        take = (suml2 > 0) & (mul(sumlx, sumlx, ftz) > mul(best, suml2, ftz))
        big_l = np.where(take[:, None], lv + nmax, big_l)
        scale = np.where(take, div(sumlx, suml2, ftz), scale)
        best = np.where(take, mul(scale, sumlx, ftz), best)
    return np.where(zero, F32(0), scale).astype(F32), np.where(zero[:, None], 0, big_l)


def make_q3_quants(x: np.ndarray, nmax: int, ftz: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``make_q3_quants(n, nmax, x, L, do_rmse=true)`` per row of ``x`` (m, n) float32 -> (scale,
    L in [0, 2*nmax)): a start at iscale = -nmax/max, then up to 5 passes of coordinate descent,
    each element's level moved to the best for the others' fit. A row with max |x| < 1e-15 gives
    0 and L = 0 (not nmax: the C returns before its final ``L += nmax``)."""
    m, n = x.shape
    amax, mx = first_strict_max(x)
    zero = amax < GROUP_MAX_EPS
    iscale = div(F32(-nmax), np.where(zero, F32(1), mx), ftz)
    big_l, sumlx, suml2 = _qx_levels(x, iscale, nmax, ftz)
    w = mul(x, x, ftz)
    active = np.ones(m, bool)  # the C breaks out of a row after a pass without change
    for _ in range(5):
        changed = np.zeros(m, bool)
        for i in range(n):
            xi, wi, li = x[:, i], w[:, i], big_l[:, i]
            slx = sub(sumlx, mul(mul(wi, xi, ftz), li, ftz), ftz)
            sl2 = sub(suml2, mul(mul(wi, li, ftz), li, ftz), ftz)
            new_l = clamp(nearest_int_k(div(mul(xi, sl2, ftz), slx, ftz)), -nmax, nmax - 1)
            new_slx = add(slx, mul(mul(wi, xi, ftz), new_l, ftz), ftz)
            new_sl2 = add(sl2, mul(mul(wi, new_l, ftz), new_l, ftz), ftz)
            better = mul(mul(new_slx, new_slx, ftz), suml2, ftz) > mul(mul(sumlx, sumlx, ftz), new_sl2, ftz)
            take = active & (slx > 0) & (new_l != li) & (new_sl2 > 0) & better
            big_l[:, i] = np.where(take, new_l, li)
            sumlx = np.where(take, new_slx, sumlx)
            suml2 = np.where(take, new_sl2, suml2)
            changed |= take
        active &= changed
        if not active.any():
            break
    scale = np.where(suml2 > 0, div(sumlx, suml2, ftz), F32(0))
    return np.where(zero, F32(0), scale).astype(F32), np.where(zero[:, None], 0, big_l + nmax)


def _qkx2_error(
    x: np.ndarray, w: np.ndarray, scale: np.ndarray, the_min: np.ndarray, lv: np.ndarray, use_mad: bool, ftz: bool
) -> np.ndarray:
    """Σ w * |scale*L + min - x| (use_mad) or Σ w * (scale*L + min - x)^2, in element order."""
    diff = sub(add(mul(scale[:, None], lv, ftz), the_min[:, None], ftz), x, ftz)
    diff = np.abs(diff) if use_mad else mul(diff, diff, ftz)
    err = np.zeros(len(x), F32)
    for i in range(x.shape[1]):
        err = add(err, mul(w[:, i], diff[:, i], ftz), ftz)
    return err


def min_not_positive(mn: np.ndarray) -> np.ndarray:
    """``if (min > 0) min = 0``: the start of make_qkx2_quants' fit never has a positive min."""
    return np.where(mn > 0, F32(0), mn)


def refit_positive_min(
    this_scale: np.ndarray, this_min: np.ndarray, sum_xl: np.ndarray, sum_l2: np.ndarray, ftz: bool
) -> tuple[np.ndarray, np.ndarray]:
    """``if (this_min > 0) { this_min = 0; this_scale = sum_xl / sum_l2; }``: a candidate fit with a
    positive min is redone through the origin."""
    pos = this_min > 0
    return np.where(pos, div(sum_xl, sum_l2, ftz), this_scale), np.where(pos, F32(0), this_min)


def make_qkx2_quants(
    x: np.ndarray,
    w: np.ndarray,
    nmax: int,
    rmin: float,
    rdelta: float,
    nstep: int,
    use_mad: bool,
    ftz: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``make_qkx2_quants(n, nmax, x, weights, L, &the_min, Laux, rmin, rdelta, nstep, use_mad)``
    per row of ``x`` (m, n) with weights ``w`` -> (scale, L in [0, nmax], the_min): an affine fit
    x ~ scale*L - the_min, trying iscale = (rmin + rdelta*is + nmax)/(max - min) for is = 0..nstep
    and keeping a candidate whose weighted error is strictly lower. ``min`` is the current best:
    a candidate taken changes the range and offset the later candidates use (as in the C)."""
    mn = x[:, 0].copy()
    mx = x[:, 0].copy()
    sum_w = w[:, 0].copy()
    sum_x = mul(sum_w, x[:, 0], ftz)
    for i in range(1, x.shape[1]):
        mn = np.where(x[:, i] < mn, x[:, i], mn)
        mx = np.where(x[:, i] > mx, x[:, i], mx)
        sum_w = add(sum_w, w[:, i], ftz)
        sum_x = add(sum_x, mul(w[:, i], x[:, i], ftz), ftz)
    mn = min_not_positive(mn)
    flat = mx == mn
    iscale = div(F32(nmax), sub(mx, mn, ftz), ftz)
    scale = div(F32(1), iscale, ftz)
    big_l = clamp(nearest_int_k(mul(iscale[:, None], sub(x, mn[:, None], ftz), ftz)), 0, nmax)
    best = _qkx2_error(x, w, scale, mn, big_l, use_mad, ftz)
    for step in range(nstep + 1):
        iscale = div(add(add(F32(rmin), mul(F32(rdelta), step, ftz), ftz), F32(nmax), ftz), sub(mx, mn, ftz), ftz)
        laux = clamp(nearest_int_k(mul(iscale[:, None], sub(x, mn[:, None], ftz), ftz)), 0, nmax)
        sum_l = np.zeros(len(x), F32)
        sum_l2 = np.zeros(len(x), F32)
        sum_xl = np.zeros(len(x), F32)
        for i in range(x.shape[1]):
            wl = mul(w[:, i], laux[:, i], ftz)
            sum_l = add(sum_l, wl, ftz)
            sum_l2 = add(sum_l2, mul(wl, laux[:, i], ftz), ftz)
            sum_xl = add(sum_xl, mul(wl, x[:, i], ftz), ftz)
        big_d = sub(mul(sum_w, sum_l2, ftz), mul(sum_l, sum_l, ftz), ftz)
        this_scale = div(sub(mul(sum_w, sum_xl, ftz), mul(sum_x, sum_l, ftz), ftz), big_d, ftz)
        this_min = div(sub(mul(sum_l2, sum_x, ftz), mul(sum_l, sum_xl, ftz), ftz), big_d, ftz)
        this_scale, this_min = refit_positive_min(this_scale, this_min, sum_xl, sum_l2, ftz)
        cur = _qkx2_error(x, w, this_scale, this_min, laux, use_mad, ftz)
        take = ~flat & (big_d > 0) & (cur < best)
        big_l = np.where(take[:, None], laux, big_l)
        best = np.where(take, cur, best)
        scale = np.where(take, this_scale, scale)
        mn = np.where(take, this_min, mn)
    scale = np.where(flat, F32(0), scale).astype(F32)
    return scale, np.where(flat[:, None], 0, big_l), (-mn).astype(F32)


def get_scale_min_k4(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``get_scale_min_k4`` for j = 0..7 of (n, 12) packed bytes -> (sc, m), each (n, 8) in [0, 63]."""
    q = q.astype(np.int64)
    lo, mid, hi = q[:, 0:4], q[:, 4:8], q[:, 8:12]
    sc = np.concatenate([lo & 63, (hi & 0xF) | ((lo >> 6) << 4)], axis=1)
    m = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=1)
    return sc, m


def pack_scale_min_k4(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """The 12-byte packing of eight 6-bit (scale, min) pairs (quantize_row_q4_K_ref), (n, 8) -> (n, 12)."""
    out = np.zeros((len(ls), 12), np.int64)
    out[:, 0:4] = ls[:, 0:4] | ((ls[:, 4:8] >> 4) << 6)
    out[:, 4:8] = lm[:, 0:4] | ((lm[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (ls[:, 4:8] & 0xF) | ((lm[:, 4:8] & 0xF) << 4)
    return out.astype(np.uint8)


# --------------------------------------------------------------------------- numba: fp32 steps


@njit(cache=True)
def mul_nb(a, b, ftz):
    return flush_nb(np.float32(np.float32(a) * np.float32(b)), ftz)


@njit(cache=True)
def add_nb(a, b, ftz):
    return flush_nb(np.float32(np.float32(a) + np.float32(b)), ftz)


@njit(cache=True)
def sub_nb(a, b, ftz):
    return flush_nb(np.float32(np.float32(a) - np.float32(b)), ftz)


@njit(cache=True, error_model="numpy")
def div_nb(a, b, ftz):
    return flush_nb(np.float32(np.float32(a) / np.float32(b)), ftz)


@njit(cache=True)
def nearest_int_k_nb(f):
    """ggml ``nearest_int``; NaN -> 0."""
    return nearest_int_nb(f, False, np.int32(0))


@njit(cache=True)
def clamp_nb(v, lo, hi):
    return max(lo, min(hi, v))


@njit(cache=True)
def sqrt_nb(v, ftz):
    """``sqrtf``: the float64 root rounded once to fp32 is the correctly rounded fp32 root."""
    return flush_nb(np.float32(math.sqrt(np.float64(v))), ftz)


@njit(cache=True)
def fp16_bits_to_fp32_nb(h):
    """fp16 bit pattern -> float32, exactly (NaN for any NaN pattern)."""
    h = np.int32(h)
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0:
        v = m * 5.960464477539063e-08  # m * 2^-24
    elif e == 31:
        v = math.inf if m == 0 else math.nan
    else:
        v = (m + 1024) * 2.0 ** (e - 25)
    return np.float32(-v if h & 0x8000 else v)


@njit(cache=True)
def fp32_to_fp16_bits_nb(v, scratch):
    """float32 -> fp16 bits, ggml's rounding, through a 1-element float32 scratch array."""
    scratch[0] = v
    return fp32_bits_to_fp16_bits_nb(scratch.view(np.uint32)[0])


# --------------------------------------------------------------------------- numba: the searches


@njit(cache=True, error_model="numpy")
def _qx_pass_nb(x, o, n, iscale, nmax, ftz):
    sumlx = np.float32(0.0)
    suml2 = np.float32(0.0)
    for i in range(n):
        xi = x[o + i]
        lv = clamp_nb(nearest_int_k_nb(mul_nb(iscale, xi, ftz)), -nmax, nmax - 1)
        w = mul_nb(xi, xi, ftz)
        sumlx = add_nb(sumlx, mul_nb(mul_nb(w, xi, ftz), lv, ftz), ftz)
        suml2 = add_nb(suml2, mul_nb(mul_nb(w, lv, ftz), lv, ftz), ftz)
    return sumlx, suml2


@njit(cache=True, error_model="numpy")
def _first_strict_max_nb(x, o, n):
    amax = np.float32(0.0)
    mx = np.float32(0.0)
    for i in range(n):
        a = abs(x[o + i])
        if a > amax:
            amax = a
            mx = x[o + i]
    return amax, mx


@njit(cache=True, error_model="numpy")
def make_qx_quants_nb(x, o, n, nmax, big_l, ftz):
    """make_qx_quants(rmse_type=1) on x[o:o+n]; L into big_l[o:o+n]; returns the scale."""
    amax, mx = _first_strict_max_nb(x, o, n)
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            big_l[o + i] = 0
        return np.float32(0.0)
    iscale = div_nb(-nmax, mx, ftz)
    sumlx, suml2 = _qx_pass_nb(x, o, n, iscale, nmax, ftz)
    for i in range(n):
        big_l[o + i] = clamp_nb(nearest_int_k_nb(mul_nb(iscale, x[o + i], ftz)), -nmax, nmax - 1) + nmax
    scale = div_nb(sumlx, suml2, ftz) if suml2 != 0 else np.float32(0.0)
    best = mul_nb(scale, sumlx, ftz)
    for step in range(-QX_STEPS, QX_STEPS + 1):
        if step == 0:
            continue
        iscale = div_nb(-add_nb(nmax, mul_nb(np.float32(0.1), step, ftz), ftz), mx, ftz)
        sumlx, suml2 = _qx_pass_nb(x, o, n, iscale, nmax, ftz)
        if suml2 > 0 and mul_nb(sumlx, sumlx, ftz) > mul_nb(best, suml2, ftz):
            for i in range(n):
                big_l[o + i] = clamp_nb(nearest_int_k_nb(mul_nb(iscale, x[o + i], ftz)), -nmax, nmax - 1) + nmax
            scale = div_nb(sumlx, suml2, ftz)
            best = mul_nb(scale, sumlx, ftz)
    return scale


@njit(cache=True, error_model="numpy")
def make_q3_quants_nb(x, o, n, nmax, big_l, ftz):
    """make_q3_quants(do_rmse=true) on x[o:o+n]; L into big_l[o:o+n]; returns the scale."""
    amax, mx = _first_strict_max_nb(x, o, n)
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            big_l[o + i] = 0
        return np.float32(0.0)
    iscale = div_nb(-nmax, mx, ftz)
    sumlx = np.float32(0.0)
    suml2 = np.float32(0.0)
    for i in range(n):
        xi = x[o + i]
        lv = clamp_nb(nearest_int_k_nb(mul_nb(iscale, xi, ftz)), -nmax, nmax - 1)
        big_l[o + i] = lv
        w = mul_nb(xi, xi, ftz)
        sumlx = add_nb(sumlx, mul_nb(mul_nb(w, xi, ftz), lv, ftz), ftz)
        suml2 = add_nb(suml2, mul_nb(mul_nb(w, lv, ftz), lv, ftz), ftz)
    for _ in range(5):
        n_changed = 0
        for i in range(n):
            xi = x[o + i]
            li = big_l[o + i]
            w = mul_nb(xi, xi, ftz)
            slx = sub_nb(sumlx, mul_nb(mul_nb(w, xi, ftz), li, ftz), ftz)
            if slx > 0:
                sl2 = sub_nb(suml2, mul_nb(mul_nb(w, li, ftz), li, ftz), ftz)
                new_l = clamp_nb(nearest_int_k_nb(div_nb(mul_nb(xi, sl2, ftz), slx, ftz)), -nmax, nmax - 1)
                if new_l != li:
                    slx = add_nb(slx, mul_nb(mul_nb(w, xi, ftz), new_l, ftz), ftz)
                    sl2 = add_nb(sl2, mul_nb(mul_nb(w, new_l, ftz), new_l, ftz), ftz)
                    if sl2 > 0 and mul_nb(mul_nb(slx, slx, ftz), suml2, ftz) > mul_nb(
                        mul_nb(sumlx, sumlx, ftz), sl2, ftz
                    ):
                        big_l[o + i] = new_l
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    for i in range(n):
        big_l[o + i] += nmax
    return div_nb(sumlx, suml2, ftz) if suml2 > 0 else np.float32(0.0)


@njit(cache=True, error_model="numpy")
def _qkx2_error_nb(x, o, n, w, scale, the_min, lv, use_mad, ftz):
    err = np.float32(0.0)
    for i in range(n):
        diff = sub_nb(add_nb(mul_nb(scale, lv[i], ftz), the_min, ftz), x[o + i], ftz)
        diff = abs(diff) if use_mad else mul_nb(diff, diff, ftz)
        err = add_nb(err, mul_nb(w[i], diff, ftz), ftz)
    return err


@njit(cache=True, error_model="numpy")
def make_qkx2_quants_nb(x, o, n, w, nmax, rmin, rdelta, nstep, use_mad, big_l, laux, ftz):
    """make_qkx2_quants on x[o:o+n] with weights w[:n]; L into big_l[o:o+n] (laux: n ints of
    scratch); returns (scale, the_min)."""
    mn = x[o]
    mx = x[o]
    sum_w = w[0]
    sum_x = mul_nb(sum_w, x[o], ftz)
    for i in range(1, n):
        xi = x[o + i]
        if xi < mn:
            mn = xi
        if xi > mx:
            mx = xi
        sum_w = add_nb(sum_w, w[i], ftz)
        sum_x = add_nb(sum_x, mul_nb(w[i], xi, ftz), ftz)
    if mn > 0:
        mn = np.float32(0.0)
    if mx == mn:
        for i in range(n):
            big_l[o + i] = 0
        return np.float32(0.0), np.float32(-mn)
    iscale = div_nb(nmax, sub_nb(mx, mn, ftz), ftz)
    scale = div_nb(1, iscale, ftz)
    for i in range(n):
        laux[i] = clamp_nb(nearest_int_k_nb(mul_nb(iscale, sub_nb(x[o + i], mn, ftz), ftz)), 0, nmax)
        big_l[o + i] = laux[i]
    best = _qkx2_error_nb(x, o, n, w, scale, mn, laux, use_mad, ftz)
    for step in range(nstep + 1):
        iscale = div_nb(add_nb(add_nb(rmin, mul_nb(rdelta, step, ftz), ftz), nmax, ftz), sub_nb(mx, mn, ftz), ftz)
        sum_l = np.float32(0.0)
        sum_l2 = np.float32(0.0)
        sum_xl = np.float32(0.0)
        for i in range(n):
            lv = clamp_nb(nearest_int_k_nb(mul_nb(iscale, sub_nb(x[o + i], mn, ftz), ftz)), 0, nmax)
            laux[i] = lv
            wl = mul_nb(w[i], lv, ftz)
            sum_l = add_nb(sum_l, wl, ftz)
            sum_l2 = add_nb(sum_l2, mul_nb(wl, lv, ftz), ftz)
            sum_xl = add_nb(sum_xl, mul_nb(wl, x[o + i], ftz), ftz)
        big_d = sub_nb(mul_nb(sum_w, sum_l2, ftz), mul_nb(sum_l, sum_l, ftz), ftz)
        if big_d > 0:
            this_scale = div_nb(sub_nb(mul_nb(sum_w, sum_xl, ftz), mul_nb(sum_x, sum_l, ftz), ftz), big_d, ftz)
            this_min = div_nb(sub_nb(mul_nb(sum_l2, sum_x, ftz), mul_nb(sum_l, sum_xl, ftz), ftz), big_d, ftz)
            if this_min > 0:
                this_min = np.float32(0.0)
                this_scale = div_nb(sum_xl, sum_l2, ftz)
            cur = _qkx2_error_nb(x, o, n, w, this_scale, this_min, laux, use_mad, ftz)
            if cur < best:
                for i in range(n):
                    big_l[o + i] = laux[i]
                best = cur
                scale = this_scale
                mn = this_min
    return scale, np.float32(-mn)


@njit(cache=True)
def get_scale_min_k4_nb(j, q, o):
    """``get_scale_min_k4(j, q + o)`` -> (sc, m)."""
    if j < 4:
        return np.int32(q[o + j] & 63), np.int32(q[o + j + 4] & 63)
    sc = (np.int32(q[o + j + 4]) & 0xF) | ((np.int32(q[o + j - 4]) >> 6) << 4)
    m = (np.int32(q[o + j + 4]) >> 4) | ((np.int32(q[o + j]) >> 6) << 4)
    return sc, m


@njit(cache=True)
def pack_scale_min_k4_nb(ls, lm, q, o):
    """The 12-byte packing of eight 6-bit (scale, min) pairs into q[o:o+12]."""
    for j in range(4):
        q[o + j] = np.uint8(ls[j] | ((ls[j + 4] >> 4) << 6))
        q[o + j + 4] = np.uint8(lm[j] | ((lm[j + 4] >> 4) << 6))
        q[o + j + 8] = np.uint8((ls[j + 4] & 0xF) | ((lm[j + 4] & 0xF) << 4))

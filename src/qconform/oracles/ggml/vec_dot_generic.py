"""ggml's generic (scalar C) vec_dot of a weight row with an activation row, bit for bit.

Source: ggml-org/llama.cpp ggml/src/ggml-cpu/quants.c, the ``ggml_vec_dot_<type>_<vec_dot_type>_generic``
functions (docs/ggml-formats.md 4); the pairs are ggml-cpu.c ``type_traits_cpu[type].vec_dot_type``.
The result is one fp32 per row pair. Integer parts are exact (int, no overflow for any bytes); every
float operation below is an fp32 operation rounded on its own, evaluated in the C's order (f32(..)
marks each rounding; dx/dy, mx/sy are the fp16 fields, exact in fp32; yd is Q8_K's fp32 d):

  q4_0.q8_0  sumf += f32(f32((float)sumi*dx) * dy)              sumi = sum (q-8)*y over the block
  q5_0.q8_0  sumf += f32(f32(dx*dy) * (float)sumi)               q-16
  q4_1.q8_1, q5_1.q8_1
             sumf += f32(f32(f32(dx*dy)*(float)sumi) + f32(mx*sy))
  q8_0.q8_0  sumf += f32((float)sumi * f32(dx*dy))
  iq4_nl.q8_0  d = f32(dy*dx); sumf += f32(d * (float)sumi)     sumi = sum y*kvalues_iq4nl[q]
  iq4_xs.q8_K  per sub-block ib = 0..7: dl = f32(f32(dx*yd) * (float)(ls-32)); sumf += f32(dl*(float)sumi)
  q2_K.q8_K  dall = f32(yd*dx), dmin = f32(yd*dmx); summs = sum_g bsums[g]*(sc[g]>>4);
             isum = sum_g (sc[g]&15) * sum_{e in g} q8*q; sumf += f32(f32(dall*isum) - f32(dmin*summs))
  q3_K, q4_K, q5_K, q6_K . q8_K (8 lanes): aux32[e%8] += scale(e) * (q8[e]*a[e]) over e = 0..255;
             d = f32(dx*yd); sums[l] += f32(d*(float)aux32[l]) for l = 0..7 (the lanes live across
             superblocks); q4_K/q5_K also sumf -= f32(f32(dmx*yd) * (float)sum_g bsums[g]*m[g/2]);
             after the last superblock sumf += sums[0], ..., sumf += sums[7] in order.

Sums over blocks start from 0 at block 0 and go in block order; the sum is never split or reordered.

``fma=True``: the same C compiled by GCC with ``-mfma`` and GNU C's default ``-ffp-contract=fast`` (ggml
builds with ``C_STANDARD 11`` and CMake's default extensions, i.e. ``-std=gnu11``). GCC fuses a
multiplication whose only use is an addition or subtraction; when both operands of ``+``/``-`` are
products, the first in evaluation order (the left one) is fused and the other stays a rounded product.
The contracted forms, checked in the objdump of GCC 12.2 ``-O3 -mfma -mavx2`` of quants.c:

  q4_0       sumf = fmaf(f32((float)sumi*dx), dy, sumf)                       (vfmadd231ss)
  q5_0       sumf = fmaf(f32(dx*dy), (float)sumi, sumf)
  q4_1, q5_1 sumf = f32(sumf + fmaf(f32(dx*dy), (float)sumi, f32(mx*sy)))    (vfmadd132ss, vaddss)
  q8_0       sumf = fmaf((float)sumi, f32(dx*dy), sumf)
  iq4_nl     sumf = fmaf(d, (float)sumi, sumf);  iq4_xs: sumf = fmaf(dl, (float)sumi, sumf)
  q2_K       sumf = f32(sumf + fmaf(dall, (float)isum, -f32(dmin*summs)))   (vfmsub132ss, vaddss)
  q3_K..q6_K sums[l] = fmaf(d, (float)aux32[l], sums[l])                      (vfmadd231ps, per lane)
             q4_K/q5_K sumf = fmaf(-dmin, (float)sumi, sumf)                  (vfnmadd231ss)

Products feeding another product (``(float)sumi*dx`` in q4_0, ``dx*dy``, ``d4d8*(ls-32)``, the
scale products ``dall``, ``dmin``, ``d``) stay rounded: a product is contracted only into an add. The
final lane sum has no product and is unchanged. Vectorizing the 8-lane update (``vfmadd231ps``)
fuses each lane separately, the same value as the scalar fmaf. Both modes are bit-exact against
quants.c built with GCC 12.2 ``-O3 -std=gnu11``, without and with ``-mfma -mavx2``
(tests/test_ggml_vec_dot.py, tests/test_upstream_ggml_c.py).

Not modelled: a tuning that avoids FMA chains (GCC's ``--param avoid-fma-max-bits``, set by
``-march``/``-mtune`` = znver*, alderlake, sapphirerapids, e.g. ``GGML_NATIVE=ON`` on such a CPU)
keeps some loop-carried ``sumf += a*b`` unfused. With GCC 12.2 ``-march=znver3`` each pair still
equals one mode (200 rows each): q4_0, q5_0, q8_0, iq4_nl, q3_K, q6_K, iq4_xs equal ``fma=False``;
q4_1, q5_1, q2_K, q4_K, q5_K equal ``fma=True``. Clang (``-ffp-contract=on``) contracts only within
one expression. A NaN result is returned as 0x7FC00000 (see ``vec_dot``).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from numba import njit, prange

from qconform.errors import ArgumentError
from qconform.formats.fp16 import fp16_bits_to_fp32
from qconform.formats.ggml import FORMATS, BlockFormat
from qconform.oracles.ggml.fma import fmaf, fmaf_nb
from qconform.oracles.ggml.iq4_nl import KVALUES
from qconform.oracles.ggml.kquant_search import get_scale_min_k4
from qconform.oracles.ggml.q2_k import unpack_q2
from qconform.oracles.ggml.q3_k import unpack_scales as unpack_q3_scales

Backend = Literal["numba", "numpy"]

# weight type -> vec_dot_type (ggml-cpu.c type_traits_cpu)
PAIRS: dict[str, str] = {
    "Q4_0": "Q8_0",
    "Q4_1": "Q8_1",
    "Q5_0": "Q8_0",
    "Q5_1": "Q8_1",
    "Q8_0": "Q8_0",
    "IQ4_NL": "Q8_0",
    "Q2_K": "Q8_K",
    "Q3_K": "Q8_K",
    "Q4_K": "Q8_K",
    "Q5_K": "Q8_K",
    "Q6_K": "Q8_K",
    "IQ4_XS": "Q8_K",
}

ZERO = np.float32(0.0)
KV32 = KVALUES.astype(np.int32)
PAIR_CHUNK_VALUES = 1 << 21  # numpy spec: decoded values held at once (pairs x row length)


def vec_dot_formats(qtype: object) -> tuple[BlockFormat, BlockFormat]:
    """A weight type (ggml name or gguf enum) -> (its BlockFormat, its vec_dot_type's BlockFormat)."""
    name = getattr(qtype, "name", qtype)
    key = name.upper() if isinstance(name, str) else None
    if key not in PAIRS:
        raise ArgumentError(
            f"qtype: no generic vec_dot modelled for {qtype!r}; supported weight types: {', '.join(PAIRS)}"
        )
    return FORMATS[key], FORMATS[PAIRS[key]]


def _check_blocks(name: str, a: object, fmt: BlockFormat) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise ArgumentError(f"{name}: must be a numpy.ndarray of {fmt.name} block bytes, got {type(a).__name__}")
    if a.dtype != np.uint8:
        raise ArgumentError(f"{name}: dtype must be uint8 ({fmt.name} block bytes), got {a.dtype}")
    if a.ndim < 1:
        raise ArgumentError(f"{name}: must have at least one dimension (rows of block bytes), got a scalar")
    n = a.shape[-1]
    if n == 0 or n % fmt.type_size:
        raise ArgumentError(
            f"{name}: the last dimension (bytes per row) must be a positive multiple of {fmt.type_size}, "
            f"the size of a {fmt.name} block; got {n}"
        )
    return a


def check_vec_dot_args(
    qtype: object, w_blocks: object, a_blocks: object, fma: object = False, backend: object = "numba"
) -> tuple[BlockFormat, BlockFormat, tuple[int, ...], int]:
    """Validate ``vec_dot``'s arguments; return (weight format, activation format, result shape, blocks per row)."""
    wfmt, afmt = vec_dot_formats(qtype)
    w = _check_blocks("w_blocks", w_blocks, wfmt)
    a = _check_blocks("a_blocks", a_blocks, afmt)
    nw, na = w.shape[-1] // wfmt.type_size, a.shape[-1] // afmt.type_size
    if nw != na:
        raise ArgumentError(
            f"a_blocks: a row holds {na} {afmt.name} blocks but a w_blocks row holds {nw} {wfmt.name} blocks; "
            f"the block counts must match (both rows cover {nw * wfmt.block_size} values)"
        )
    try:
        shape = np.broadcast_shapes(w.shape[:-1], a.shape[:-1])
    except ValueError:
        raise ArgumentError(
            f"w_blocks, a_blocks: the leading shapes {w.shape[:-1]} and {a.shape[:-1]} do not broadcast"
        ) from None
    if not isinstance(fma, (bool, np.bool_)):
        raise ArgumentError(f"fma: must be a bool, got {fma!r}")
    if backend not in ("numba", "numpy"):
        raise ArgumentError(f"backend: must be 'numba' or 'numpy', got {backend!r}")
    return wfmt, afmt, shape, nw


def vec_dot(
    qtype: object,
    w_blocks: np.ndarray,
    a_blocks: np.ndarray,
    *,
    fma: bool = False,
    backend: Backend = "numba",
) -> np.ndarray:
    """``ggml_vec_dot_<qtype>_<vec_dot_type>_generic`` of each weight row with each activation row.

    ``w_blocks``: uint8 (..., nb * type_size(qtype)); ``a_blocks``: uint8 (..., nb * type_size(vec_dot_type))
    (Q8_0 for Q4_0/Q5_0/Q8_0/IQ4_NL, Q8_1 for Q4_1/Q5_1, Q8_K for Q2_K..Q6_K and IQ4_XS); the leading
    dimensions broadcast. Returns float32 of the broadcast leading shape, each value the C's fp32 result
    with every operation rounded separately (``fma=False``), or with GCC's ``-mfma`` contractions
    (``fma=True``; see the module docstring). ``backend="numpy"`` is the readable spec, ``"numba"`` the
    fast twin; they are byte-identical. A NaN result is returned as 0x7FC00000: which NaN the C returns
    (operand order, sign) is not modelled, only where NaN results are."""
    wfmt, afmt, shape, nb = check_vec_dot_args(qtype, w_blocks, a_blocks, fma, backend)
    w = wfmt.blocks(w_blocks).reshape(-1, nb)
    a = afmt.blocks(a_blocks).reshape(-1, nb)
    wi = np.broadcast_to(np.arange(len(w)).reshape(w_blocks.shape[:-1]), shape).ravel()
    ai = np.broadcast_to(np.arange(len(a)).reshape(a_blocks.shape[:-1]), shape).ravel()
    out = np.empty(wi.size, np.float32)
    if backend == "numpy":
        step = max(1, PAIR_CHUNK_VALUES // (nb * afmt.block_size))
        for lo in range(0, len(out), step):
            hi = min(len(out), lo + step)
            with np.errstate(all="ignore"):
                out[lo:hi] = _NUMPY[wfmt.name](w[wi[lo:hi]], a[ai[lo:hi]], bool(fma))
    else:
        _NUMBA[wfmt.name](w, a, wi, ai, bool(fma), out)
    out[np.isnan(out)] = np.float32(np.nan)  # one NaN: the C's NaN bits follow GCC's operand order
    return out.reshape(shape)


# ---------------------------------------------------------------- numpy: the readable spec


def _h2f(h: np.ndarray) -> np.ndarray:
    return fp16_bits_to_fp32(h)


def _i2f(i: np.ndarray) -> np.ndarray:
    """``(float)int``: round to nearest even (exact below 2^24)."""
    return i.astype(np.float32)


def _mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.multiply(a, b, dtype=np.float32)


def _add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.add(a, b, dtype=np.float32)


def _sub(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.subtract(a, b, dtype=np.float32)


def _acc(s: np.ndarray, a: np.ndarray, b: np.ndarray, fused: bool) -> np.ndarray:
    """``s += a*b``: fmaf(a, b, s) when contracted, else f32(s + f32(a*b))."""
    return fmaf(a, b, s) if fused else _add(s, _mul(a, b))


def _sumi_halves(lo: np.ndarray, hi: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``sum_j lo_j*y_j + sum_j hi_j*y_{j+16}`` over each 32-value block (int): (P, nb, 16) x2, (P, nb, 32)."""
    y = y.astype(np.int32)
    return (lo * y[..., :16]).sum(-1) + (hi * y[..., 16:]).sum(-1)


def _q5_high(qh: np.ndarray) -> np.ndarray:
    """Q5 ``qh`` (P, nb) -> bit 4 of each of the 32 values, (P, nb, 32) in {0, 16}."""
    return ((qh.astype(np.uint32)[..., None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int32) << 4


def _legacy_sym(w: np.ndarray, a: np.ndarray, bits: int) -> np.ndarray:
    qs = w["qs"].astype(np.int32)
    lo, hi = qs & 15, qs >> 4
    if bits == 5:
        h = _q5_high(w["qh"])
        lo, hi = lo | h[..., :16], hi | h[..., 16:]
    off = 1 << (bits - 1)
    return _sumi_halves(lo - off, hi - off, a["qs"])


def _dot_q4_0(w: np.ndarray, a: np.ndarray, fused: bool) -> np.ndarray:
    sumi = _legacy_sym(w, a, 4)
    dx, dy = _h2f(w["d"]), _h2f(a["d"])
    sumf = np.zeros(len(w), np.float32)
    for ib in range(w.shape[1]):  # sumf += sumi*dx*dy  ==  sumf + (sumi*dx)*dy
        sumf = _acc(sumf, _mul(_i2f(sumi[:, ib]), dx[:, ib]), dy[:, ib], fused)
    return sumf


def _dot_q5_0(w: np.ndarray, a: np.ndarray, fused: bool) -> np.ndarray:
    sumi = _legacy_sym(w, a, 5)
    dx, dy = _h2f(w["d"]), _h2f(a["d"])
    sumf = np.zeros(len(w), np.float32)
    for ib in range(w.shape[1]):  # sumf += (dx*dy) * sumi
        sumf = _acc(sumf, _mul(dx[:, ib], dy[:, ib]), _i2f(sumi[:, ib]), fused)
    return sumf


def _dot_affine(w: np.ndarray, a: np.ndarray, fused: bool, bits: int) -> np.ndarray:
    qs = w["qs"].astype(np.int32)
    lo, hi = qs & 15, qs >> 4
    if bits == 5:
        h = _q5_high(w["qh"])
        lo, hi = lo | h[..., :16], hi | h[..., 16:]
    sumi = _sumi_halves(lo, hi, a["qs"])
    dx, mx, dy, sy = _h2f(w["d"]), _h2f(w["m"]), _h2f(a["d"]), _h2f(a["s"])
    sumf = np.zeros(len(w), np.float32)
    for ib in range(w.shape[1]):  # sumf += (dx*dy)*sumi + mx*sy
        dd, ms = _mul(dx[:, ib], dy[:, ib]), _mul(mx[:, ib], sy[:, ib])
        t = fmaf(dd, _i2f(sumi[:, ib]), ms) if fused else _add(_mul(dd, _i2f(sumi[:, ib])), ms)
        sumf = _add(sumf, t)
    return sumf


def _dot_q4_1(w: np.ndarray, a: np.ndarray, fused: bool) -> np.ndarray:
    return _dot_affine(w, a, fused, 4)


def _dot_q5_1(w: np.ndarray, a: np.ndarray, fused: bool) -> np.ndarray:
    return _dot_affine(w, a, fused, 5)


def _dot_q8_0(w: np.ndarray, a: np.ndarray, fused: bool) -> np.ndarray:
    sumi = (w["qs"].astype(np.int32) * a["qs"].astype(np.int32)).sum(-1)
    dx, dy = _h2f(w["d"]), _h2f(a["d"])
    sumf = np.zeros(len(w), np.float32)
    for ib in range(w.shape[1]):  # sumf += sumi*(dx*dy)
        sumf = _acc(sumf, _i2f(sumi[:, ib]), _mul(dx[:, ib], dy[:, ib]), fused)
    return sumf


def _dot_iq4_nl(w: np.ndarray, a: np.ndarray, fused: bool) -> np.ndarray:
    qs = w["qs"].astype(np.int32)
    sumi = _sumi_halves(KV32[qs & 15], KV32[qs >> 4], a["qs"])
    dx, dy = _h2f(w["d"]), _h2f(a["d"])
    sumf = np.zeros(len(w), np.float32)
    for ib in range(w.shape[1]):  # d = dy*dx; sumf += d * (sumi1 + sumi2)
        sumf = _acc(sumf, _mul(dy[:, ib], dx[:, ib]), _i2f(sumi[:, ib]), fused)
    return sumf


def _dot_iq4_xs(w: np.ndarray, a: np.ndarray, fused: bool) -> np.ndarray:
    p, nb = w.shape
    ib = np.arange(8)
    ls = ((w["scales_l"][..., ib // 2].astype(np.int32) >> (4 * (ib % 2))) & 15) | (
        ((w["scales_h"][..., None].astype(np.int32) >> (2 * ib)) & 3) << 4
    )  # (P, nb, 8)
    qs = w["qs"].astype(np.int32).reshape(p, nb, 8, 16)
    y = a["qs"].reshape(p, nb, 8, 32)
    sumi = _sumi_halves(KV32[qs & 15], KV32[qs >> 4], y)  # (P, nb, 8)
    dx = _h2f(w["d"])
    sumf = np.zeros(p, np.float32)
    for i in range(nb):
        d4d8 = _mul(dx[:, i], a["d"][:, i])
        for j in range(8):  # dl = d4d8*(ls - 32); sumf += dl * (sumi1 + sumi2)
            dl = _mul(d4d8, _i2f(ls[:, i, j] - 32))
            sumf = _acc(sumf, dl, _i2f(sumi[:, i, j]), fused)
    return sumf


def _dot_q2_k(w: np.ndarray, a: np.ndarray, fused: bool) -> np.ndarray:
    p, nb = w.shape
    q = unpack_q2(w["qs"].reshape(p * nb, 64)).reshape(p, nb, 16, 16).astype(np.int32)
    sc = w["scales"].astype(np.int32)
    prod = (a["qs"].astype(np.int32).reshape(p, nb, 16, 16) * q).sum(-1)
    isum = ((sc & 15) * prod).sum(-1)
    summs = (a["bsums"].astype(np.int32) * (sc >> 4)).sum(-1)
    dx, dm = _h2f(w["d"]), _h2f(w["dmin"])
    sumf = np.zeros(p, np.float32)
    for i in range(nb):  # sumf += dall*isum - dmin*summs
        yd = a["d"][:, i]
        dall, dmin = _mul(yd, dx[:, i]), _mul(yd, dm[:, i])
        ms = _mul(dmin, _i2f(summs[:, i]))
        t = fmaf(dall, _i2f(isum[:, i]), -ms) if fused else _sub(_mul(dall, _i2f(isum[:, i])), ms)
        sumf = _add(sumf, t)
    return sumf


def _eight_lanes(w: np.ndarray, a: np.ndarray, q: np.ndarray, scale: np.ndarray, mins_sum, fused: bool):
    """The 8-lane scheme of q3_K..q6_K: q (P, nb, 256) int, scale (P, nb, 256) per element,
    ``mins_sum`` (P, nb) int for q4_K/q5_K or None."""
    p, nb = w.shape
    aux16 = a["qs"].astype(np.int32) * q  # int16 in the C: |q8*a| <= 4096
    aux32 = (scale * aux16).reshape(p, nb, 32, 8).sum(2)  # lane l gets e = 8k + l
    dx = _h2f(w["d"])
    dm = _h2f(w["dmin"]) if mins_sum is not None else None
    sums = np.zeros((p, 8), np.float32)
    sumf = np.zeros(p, np.float32)
    for i in range(nb):
        d = _mul(dx[:, i], a["d"][:, i])
        sums = _acc(sums, d[:, None], _i2f(aux32[:, i]), fused)
        if mins_sum is not None:  # sumf -= dmin * sumi
            dmin = _mul(dm[:, i], a["d"][:, i])
            si = _i2f(mins_sum[:, i])
            sumf = fmaf(-dmin, si, sumf) if fused else _sub(sumf, _mul(dmin, si))
    for lane in range(8):
        sumf = _add(sumf, sums[:, lane])
    return sumf


def _dot_q3_k(w: np.ndarray, a: np.ndarray, fused: bool) -> np.ndarray:
    p, nb = w.shape
    low = unpack_q2(w["qs"].reshape(p * nb, 64)).reshape(p, nb, 256).astype(np.int32)
    hbit = (w["hmask"][..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1  # [e // 32, e % 32]
    q = low - 4 * (1 - hbit.reshape(p, nb, 256).astype(np.int32))
    sc = unpack_q3_scales(w["scales"].reshape(p * nb, 12)).reshape(p, nb, 16)
    return _eight_lanes(w, a, q, np.repeat(sc, 16, axis=-1), None, fused)


def _k4_levels(qs: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K qs (P, nb, 128) -> nibbles in element order e = 64c + 32t + l, (P, nb, 256)."""
    p, nb = qs.shape[:2]
    q = qs.astype(np.int32).reshape(p, nb, 4, 1, 32) >> np.array([0, 4])[:, None]
    return (q & 15).reshape(p, nb, 256)


def _k4_scales(w: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(per-element 6-bit scale (P, nb, 256), sum_g bsums[g]*m[g/2] (P, nb)): the C's utmp/kmask
    unpacking is get_scale_min_k4 for j = 0..7."""
    p, nb = w.shape
    sc, m = get_scale_min_k4(w["scales"].reshape(p * nb, 12))
    sc, m = sc.reshape(p, nb, 8), m.reshape(p, nb, 8)
    sumi = (a["bsums"].astype(np.int64) * np.repeat(m, 2, axis=-1)).sum(-1)
    return np.repeat(sc, 32, axis=-1), sumi


def _dot_q4_k(w: np.ndarray, a: np.ndarray, fused: bool) -> np.ndarray:
    scale, sumi = _k4_scales(w, a)
    return _eight_lanes(w, a, _k4_levels(w["qs"]), scale, sumi, fused)


def _dot_q5_k(w: np.ndarray, a: np.ndarray, fused: bool) -> np.ndarray:
    p, nb = w.shape
    high = (w["qh"][..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1  # [e // 32, e % 32]
    q = _k4_levels(w["qs"]) + 16 * high.reshape(p, nb, 256).astype(np.int32)
    scale, sumi = _k4_scales(w, a)
    return _eight_lanes(w, a, q, scale, sumi, fused)


def _dot_q6_k(w: np.ndarray, a: np.ndarray, fused: bool) -> np.ndarray:
    p, nb = w.shape
    ql = w["ql"].astype(np.int32).reshape(p, nb, 2, 1, 2, 32)  # [h, ., k & 1, l]
    lo4 = (ql >> np.array([0, 4])[:, None, None]) & 15  # [h, k >> 1, k & 1, l]
    qh = w["qh"].astype(np.int32).reshape(p, nb, 2, 1, 32)
    hi2 = (qh >> np.array([0, 2, 4, 6])[:, None]) & 3  # [h, k, l]
    q = (lo4.reshape(p, nb, 2, 4, 32) | hi2 << 4).reshape(p, nb, 256) - 32
    scale = np.repeat(w["scales"].astype(np.int32), 16, axis=-1)
    return _eight_lanes(w, a, q, scale, None, fused)


_NUMPY = {
    "Q4_0": _dot_q4_0,
    "Q4_1": _dot_q4_1,
    "Q5_0": _dot_q5_0,
    "Q5_1": _dot_q5_1,
    "Q8_0": _dot_q8_0,
    "IQ4_NL": _dot_iq4_nl,
    "Q2_K": _dot_q2_k,
    "Q3_K": _dot_q3_k,
    "Q4_K": _dot_q4_k,
    "Q5_K": _dot_q5_k,
    "Q6_K": _dot_q6_k,
    "IQ4_XS": _dot_iq4_xs,
}


# ---------------------------------------------------------------- numba: the fast twin, the C loops


@njit(cache=True, inline="always")
def _acc_nb(s, a, b, fused):
    if fused:
        return fmaf_nb(a, b, s)
    return np.float32(s + np.float32(a * b))


@njit(cache=True, parallel=True)
def _legacy_nb(kind, dx, mx, qh, qs, dy, sy, ys, wi, ai, fused, out):
    """q4_0 (kind 0), q5_0 (1), q4_1 (2), q5_1 (3), iq4_nl (4) against Q8_0/Q8_1 rows."""
    for p in prange(len(out)):
        r, t = wi[p], ai[p]
        sumf = ZERO
        for ib in range(qs.shape[1]):
            qhb = np.int64(qh[r, ib])
            sumi0 = 0
            sumi1 = 0
            for j in range(16):
                b = np.int64(qs[r, ib, j])
                v0, v1 = b & 15, b >> 4
                if kind == 1 or kind == 3:
                    v0 |= ((qhb >> j) & 1) << 4
                    v1 |= ((qhb >> (j + 16)) & 1) << 4
                if kind == 0:
                    v0, v1 = v0 - 8, v1 - 8
                elif kind == 1:
                    v0, v1 = v0 - 16, v1 - 16
                elif kind == 4:
                    v0, v1 = KV32[v0], KV32[v1]
                sumi0 += v0 * np.int64(ys[t, ib, j])
                sumi1 += v1 * np.int64(ys[t, ib, j + 16])
            fi = np.float32(sumi0 + sumi1)
            if kind == 0:
                sumf = _acc_nb(sumf, np.float32(fi * dx[r, ib]), dy[t, ib], fused)
            elif kind == 1:
                sumf = _acc_nb(sumf, np.float32(dx[r, ib] * dy[t, ib]), fi, fused)
            elif kind == 4:
                sumf = _acc_nb(sumf, np.float32(dy[t, ib] * dx[r, ib]), fi, fused)
            else:
                dd = np.float32(dx[r, ib] * dy[t, ib])
                ms = np.float32(mx[r, ib] * sy[t, ib])
                tt = fmaf_nb(dd, fi, ms) if fused else np.float32(np.float32(dd * fi) + ms)
                sumf = np.float32(sumf + tt)
        out[p] = sumf


@njit(cache=True, parallel=True)
def _q8_0_nb(dx, xs, dy, ys, wi, ai, fused, out):
    for p in prange(len(out)):
        r, t = wi[p], ai[p]
        sumf = ZERO
        for ib in range(xs.shape[1]):
            sumi = 0
            for j in range(32):
                sumi += np.int64(xs[r, ib, j]) * np.int64(ys[t, ib, j])
            sumf = _acc_nb(sumf, np.float32(sumi), np.float32(dx[r, ib] * dy[t, ib]), fused)
        out[p] = sumf


@njit(cache=True, parallel=True)
def _iq4_xs_nb(dx, sh, sl, qs, yd, ys, wi, ai, fused, out):
    for p in prange(len(out)):
        r, t = wi[p], ai[p]
        sumf = ZERO
        for i in range(qs.shape[1]):
            d4d8 = np.float32(dx[r, i] * yd[t, i])
            h = np.int64(sh[r, i])
            for ib in range(8):
                ls = ((np.int64(sl[r, i, ib // 2]) >> (4 * (ib % 2))) & 15) | (((h >> (2 * ib)) & 3) << 4)
                dl = np.float32(d4d8 * np.float32(ls - 32))
                sumi1 = 0
                sumi2 = 0
                for j in range(16):
                    b = np.int64(qs[r, i, 16 * ib + j])
                    sumi1 += np.int64(ys[t, i, 32 * ib + j]) * KV32[b & 15]
                    sumi2 += np.int64(ys[t, i, 32 * ib + 16 + j]) * KV32[b >> 4]
                sumf = _acc_nb(sumf, dl, np.float32(sumi1 + sumi2), fused)
        out[p] = sumf


@njit(cache=True, parallel=True)
def _q2_k_nb(dx, dm, sc, q2, yd, ys, bsums, wi, ai, fused, out):
    for p in prange(len(out)):
        r, t = wi[p], ai[p]
        sumf = ZERO
        for i in range(q2.shape[1]):
            summs = 0
            for j in range(16):
                summs += np.int64(bsums[t, i, j]) * (np.int64(sc[r, i, j]) >> 4)
            dall = np.float32(yd[t, i] * dx[r, i])
            dmin = np.float32(yd[t, i] * dm[r, i])
            isum = 0
            for g in range(16):  # g = 8k + 2j + half: elements 16g .. 16g+15
                k, s = g // 8, (g % 8) // 2
                isuml = 0
                for l16 in range(16):
                    e = 16 * g + l16
                    lq = 32 * k + (e % 32)
                    isuml += np.int64(ys[t, i, e]) * ((np.int64(q2[r, i, lq]) >> (2 * s)) & 3)
                isum += (np.int64(sc[r, i, g]) & 15) * isuml
            ms = np.float32(dmin * np.float32(summs))
            if fused:
                tt = fmaf_nb(dall, np.float32(isum), -ms)
            else:
                tt = np.float32(np.float32(dall * np.float32(isum)) - ms)
            sumf = np.float32(sumf + tt)
        out[p] = sumf


@njit(cache=True, inline="always")
def _level_nb(kind, x0, x1, i, e):
    """a[e] of superblock i: kind 3 = Q3_K (x0 = qs, x1 = hmask), 4 = Q4_K (x0 = qs), 5 = Q5_K (x0 = qs,
    x1 = qh), 6 = Q6_K (x0 = ql, x1 = qh)."""
    if kind == 3:
        low = (np.int64(x0[i, 32 * (e // 128) + e % 32]) >> (2 * ((e // 32) % 4))) & 3
        return low - (0 if (np.int64(x1[i, e % 32]) >> (e // 32)) & 1 else 4)
    if kind == 4 or kind == 5:
        v = (np.int64(x0[i, 32 * (e // 64) + e % 32]) >> (4 * ((e // 32) % 2))) & 15
        if kind == 5:
            v += 16 * ((np.int64(x1[i, e % 32]) >> (e // 32)) & 1)
        return v
    h, k, ll = e // 128, (e // 32) % 4, e % 32
    lo4 = (np.int64(x0[i, 64 * h + 32 * (k % 2) + ll]) >> (4 * (k // 2))) & 15
    hi2 = (np.int64(x1[i, 32 * h + ll]) >> (2 * k)) & 3
    return (lo4 | (hi2 << 4)) - 32


@njit(cache=True, inline="always")
def _scale_nb(kind, sc, i, e):
    """The integer scale of element e (kind as ``_level_nb``); sc: Q3_K the (n, nb, 12) bytes,
    Q4_K/Q5_K the (n, nb, 12) bytes, Q6_K the int8 scales given as their bytes."""
    if kind == 3:
        g = e // 16
        lo4 = (np.int64(sc[i, g]) & 15) if g < 8 else (np.int64(sc[i, g - 8]) >> 4)
        hi2 = (np.int64(sc[i, 8 + g % 4]) >> (2 * (g // 4))) & 3
        return (lo4 | (hi2 << 4)) - 32
    if kind == 6:
        v = np.int64(sc[i, e // 16])
        return v - 256 if v > 127 else v  # int8
    j = e // 32
    if j < 4:
        return np.int64(sc[i, j]) & 63
    return (np.int64(sc[i, j + 4]) & 15) | ((np.int64(sc[i, j - 4]) >> 6) << 4)


@njit(cache=True, inline="always")
def _min_nb(sc, i, j):
    """get_scale_min_k4's m for sub-block j of Q4_K/Q5_K."""
    if j < 4:
        return np.int64(sc[i, j + 4]) & 63
    return (np.int64(sc[i, j + 4]) >> 4) | ((np.int64(sc[i, j]) >> 6) << 4)


@njit(cache=True, parallel=True)
def _eight_lanes_nb(kind, dx, dm, x0, x1, sc, yd, ys, bsums, wi, ai, fused, out):
    for p in prange(len(out)):
        r, t = wi[p], ai[p]
        sums = np.zeros(8, np.float32)
        aux32 = np.zeros(8, np.int64)
        sumf = ZERO
        for i in range(x0.shape[1]):
            aux32[:] = 0
            for e in range(256):
                aux16 = np.int64(ys[t, i, e]) * _level_nb(kind, x0[r], x1[r], i, e)
                aux32[e % 8] += _scale_nb(kind, sc[r], i, e) * aux16
            d = np.float32(dx[r, i] * yd[t, i])
            for lane in range(8):
                sums[lane] = _acc_nb(sums[lane], d, np.float32(aux32[lane]), fused)
            if kind == 4 or kind == 5:
                sumi = 0
                for g in range(16):
                    sumi += np.int64(bsums[t, i, g]) * _min_nb(sc[r], i, g // 2)
                dmin = np.float32(dm[r, i] * yd[t, i])
                if fused:
                    sumf = fmaf_nb(-dmin, np.float32(sumi), sumf)
                else:
                    sumf = np.float32(sumf - np.float32(dmin * np.float32(sumi)))
        for lane in range(8):
            sumf = np.float32(sumf + sums[lane])
        out[p] = sumf


def _c(a: np.ndarray) -> np.ndarray:
    """A struct field as a C-contiguous array: every kernel then compiles once, for one layout."""
    return np.ascontiguousarray(a)


def _legacy_numba(kind: int):
    def run(w, a, wi, ai, fused, out):
        n, nb = w.shape
        qh = _c(w["qh"]) if "qh" in w.dtype.names else np.zeros((n, nb), np.uint32)
        mx = _h2f(w["m"]) if "m" in w.dtype.names else np.zeros((n, nb), np.float32)
        sy = _h2f(a["s"]) if "s" in a.dtype.names else np.zeros(a.shape, np.float32)
        _legacy_nb(kind, _h2f(w["d"]), mx, qh, _c(w["qs"]), _h2f(a["d"]), sy, _c(a["qs"]), wi, ai, fused, out)

    return run


def _q8_0_numba(w, a, wi, ai, fused, out):
    _q8_0_nb(_h2f(w["d"]), _c(w["qs"]), _h2f(a["d"]), _c(a["qs"]), wi, ai, fused, out)


def _iq4_xs_numba(w, a, wi, ai, fused, out):
    x = (_h2f(w["d"]), _c(w["scales_h"]), _c(w["scales_l"]), _c(w["qs"]))
    _iq4_xs_nb(*x, _c(a["d"]), _c(a["qs"]), wi, ai, fused, out)


def _q2_k_numba(w, a, wi, ai, fused, out):
    x = (_h2f(w["d"]), _h2f(w["dmin"]), _c(w["scales"]), _c(w["qs"]))
    _q2_k_nb(*x, _c(a["d"]), _c(a["qs"]), _c(a["bsums"]), wi, ai, fused, out)


def _eight_lanes_numba(kind: int):
    def run(w, a, wi, ai, fused, out):
        dm = _h2f(w["dmin"]) if kind in (4, 5) else np.zeros(w.shape, np.float32)
        x0, x1 = {3: ("qs", "hmask"), 4: ("qs", "qs"), 5: ("qs", "qh"), 6: ("ql", "qh")}[kind]
        sc = _c(w["scales"]).view(np.uint8)  # Q6_K's int8 scales as bytes: one signature for all four
        x = (_h2f(w["d"]), dm, _c(w[x0]), _c(w[x1]), sc)
        _eight_lanes_nb(kind, *x, _c(a["d"]), _c(a["qs"]), _c(a["bsums"]), wi, ai, fused, out)

    return run


_NUMBA = {
    "Q4_0": _legacy_numba(0),
    "Q5_0": _legacy_numba(1),
    "Q4_1": _legacy_numba(2),
    "Q5_1": _legacy_numba(3),
    "IQ4_NL": _legacy_numba(4),
    "Q8_0": _q8_0_numba,
    "IQ4_XS": _iq4_xs_numba,
    "Q2_K": _q2_k_numba,
    "Q3_K": _eight_lanes_numba(3),
    "Q4_K": _eight_lanes_numba(4),
    "Q5_K": _eight_lanes_numba(5),
    "Q6_K": _eight_lanes_numba(6),
}

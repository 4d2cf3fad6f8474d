"""Quantizer inputs on the K-quants' last step: values at the .5 ties of the stored scales.

Source: ggml-org/ggml src/ggml-quants.c ``quantize_row_q{2,3,4,5,6}_K_ref``. After the scales are
stored, each sub-block is requantized with them as the dequantizer will read them, every fp32
operation rounded on its own and ``nearest_int`` rounding half to even:

- Q2_K, Q4_K, Q5_K: ``dd = fp16(d) * sc``, ``dm = fp16(dmin) * m``, ``L = nearest_int((x + dm) / dd)``;
- Q3_K, Q6_K: ``dd = fp16(d) * sc`` (signed sc), ``L = nearest_int(x / dd)``;

a quotient, not ``x * (1/dd)``. Inputs that reach that step's rounding: blocks built on a grid
``x = l * s - mm`` whose search recovers ``s = dd`` and ``mm = dm`` exactly (one sub-block per
block holds the largest scale and offset, so ``d`` and ``dmin`` are those of the design), with the
other sub-blocks' values partly moved to the ties ``(k + 0.5) * dd`` (exact in fp32: every value is
a multiple of ``d / 2`` under 2^24 of them) and half of those one to eight ulps off, to the nearest
value whose quotient and reciprocal product round to different integers. A sub-block whose stored
scales the reference quantizer does not return as designed is redrawn, and after three draws kept
on its grid (tests/test_requant_ties.py: the share of values on ties of the stored scales).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

import numpy as np

from qconform.formats.fp16 import fp16_bits_to_fp32
from qconform.formats.ggml import FORMATS
from qconform.oracles.ggml import quantize

kq = importlib.import_module("qconform.oracles.ggml.kquant_search")
q3k = importlib.import_module("qconform.oracles.ggml.q3_k")
F32 = np.float32
DRAWS = 3
TIE_SHARE = 0.5  # of the values of a sub-block that are not its extremes
EDGE_SHARE = 0.5  # of the ties, moved next to the tie where a reciprocal rounds apart


def _fp16(bits: np.ndarray) -> np.ndarray:
    return fp16_bits_to_fp32(bits).astype(F32)


def _scales_q2_k(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    sc = b["scales"].astype(np.int64)  # low nibble the scale, high nibble the min (block_q2_K)
    return kq.mul(_fp16(b["d"])[:, None], sc & 0xF, False), kq.mul(_fp16(b["dmin"])[:, None], sc >> 4, False)


def _scales_q3_k(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    dd = kq.mul(_fp16(b["d"])[:, None], q3k.unpack_scales(b["scales"]), False)
    return dd, np.zeros_like(dd)


def _scales_q4_k(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    sc, m = kq.get_scale_min_k4(b["scales"])
    return kq.mul(_fp16(b["d"])[:, None], sc, False), kq.mul(_fp16(b["dmin"])[:, None], m, False)


def _scales_q6_k(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    dd = kq.mul(_fp16(b["d"])[:, None], b["scales"].astype(np.int64), False)
    return dd, np.zeros_like(dd)


@dataclass(frozen=True)
class Requant:
    """One K-quant's final requantisation: ``L = clamp(nearest_int((x + dm) / dd), lo, hi)``."""

    sub: int  # values per sub-block
    lo: int  # the clamp, in signed levels (Q6_K: -32..31, stored + 32)
    hi: int
    anchor: int  # the stored sub-scale of the block's largest |scale| (and min, where affine)
    affine: bool  # an offset dm (Q2_K, Q4_K, Q5_K)
    dmin_over_d: int  # the design's dmin / d: a min's rounding bin wider than a tie's pull on the fit,
    # and offsets near the ties' size (a sum x + dm far above the tie cannot land next to it)
    stored: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]  # blocks -> (dd, dm), (n, 256 // sub)


REQUANT = {
    "Q2_K": Requant(16, 0, 3, 15, True, 1, _scales_q2_k),
    "Q3_K": Requant(16, -4, 3, -32, False, 0, _scales_q3_k),
    "Q4_K": Requant(32, 0, 15, 63, True, 16, _scales_q4_k),
    "Q5_K": Requant(32, 0, 31, 63, True, 16, _scales_q4_k),
    "Q6_K": Requant(16, -32, 31, -128, False, 0, _scales_q6_k),
}


def stored_scales(qtype: str, data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(dd, dm) per sub-block of quantized bytes, fp32 as the reference's last step computes them."""
    return REQUANT[qtype].stored(FORMATS[qtype].blocks(data))


def quotients(qtype: str, x: np.ndarray, data: np.ndarray, reciprocal: bool = False) -> np.ndarray:
    """``(x + dm) / dd`` in fp32 per value (n, 256 // sub, sub); ``reciprocal``: ``(x + dm) * (1/dd)``."""
    r = REQUANT[qtype]
    dd, dm = stored_scales(qtype, data)
    s = kq.add(x.reshape(*dd.shape, r.sub), dm[..., None], False)
    if reciprocal:
        return kq.mul(s, kq.div(F32(1), dd, False)[..., None], False)
    return kq.div(s, dd[..., None], False)


def _random_fp16(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Normal fp16 values of random mantissa in [2^-10, 2^4), as fp32."""
    m = rng.integers(0, 1024, shape)
    return ((1 + m / 1024.0) * 2.0 ** rng.integers(-10, 4, shape)).astype(F32)


def _reciprocal_off(s: np.ndarray) -> np.ndarray:
    """|fp32(1/s) * s - 1| >= 2^-26 (exact in float64): a quarter ulp or more, so that some x near a
    tie has a reciprocal product that rounds apart from its quotient."""
    rcp = (F32(1) / s.astype(F32)).astype(np.float64)
    return np.abs(rcp * s - 1) >= 2.0**-26


def _design(r: Requant, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per sub-block scale s = d*sc and offset mm = dmin*m (n, ns), and which is the anchor: it
    holds sc = anchor (and m = anchor); the others |sc|, m <= |anchor| / 4, so that their fits
    stay below the anchor's and a tie moves their rounding, not d's, with |sc| among those whose
    s has a reciprocal off by a quarter ulp or more (d drawn again where none has)."""
    ns = 256 // r.sub
    a = abs(r.anchor)
    mags = np.arange(1, a // 4 + 1)
    d = _random_fp16(rng, (n,))
    for _ in range(8):
        none = ~_reciprocal_off(d[:, None].astype(np.float64) * mags).any(axis=1)
        d[none] = _random_fp16(rng, (int(none.sum()),))
    ok = _reciprocal_off(d[:, None].astype(np.float64) * mags)
    ok[~ok.any(axis=1)] = True
    cdf = np.cumsum(ok / ok.sum(axis=1, keepdims=True), axis=1)
    sc = mags[(rng.random((n, ns))[..., None] > cdf[:, None, :]).sum(axis=-1)]
    anchor = (np.arange(n), rng.integers(ns, size=n))
    if r.affine:
        m = rng.integers(0, a // 4 + 1, (n, ns))
        sc[anchor], m[anchor] = a, a
        mm = kq.mul((d * F32(r.dmin_over_d))[:, None], m, False)
    else:
        d *= rng.choice(np.array([-1, 1], F32), n)
        sc *= rng.choice(np.array([-1, 1]), (n, ns))
        sc[anchor] = r.anchor
        mm = np.zeros((n, ns), F32)
    is_anchor = np.zeros((n, ns), bool)
    is_anchor[anchor] = True
    return kq.mul(d[:, None], sc, False), mm, is_anchor


def _ties(r: Requant, rng: np.random.Generator, s: np.ndarray, mm: np.ndarray, grid: np.ndarray, ends: np.ndarray):
    """The grid with random values other than the sub-block's two ends moved to ties ``(k + 0.5) *
    s - mm``, half of them to the nearest fp32 value (within 8 ulps) whose quotient and reciprocal
    product round apart."""
    shape = grid.shape
    tie = rng.random(shape) < TIE_SHARE
    np.put_along_axis(tie, ends, False, axis=-1)
    k = rng.integers(r.lo, r.hi, shape)
    t = ((k + 0.5) * s[..., None].astype(np.float64)).astype(F32)  # exact: a multiple of d / 2
    x = np.where(tie, kq.sub(t, mm[..., None], False), grid)
    steps = np.arange(-8, 9, dtype=np.int32)
    cand = (x.view(np.int32)[..., None] + np.where(x[..., None] < 0, -steps, steps)).view(F32)
    summed = kq.add(cand, mm[..., None, None], False)
    apart = kq.nearest_int_k(kq.div(summed, s[..., None, None], False)) != kq.nearest_int_k(
        kq.mul(summed, kq.div(F32(1), s, False)[..., None, None], False)
    )
    score = np.where(apart, np.abs(steps), np.iinfo(np.int32).max)
    best = score.argmin(axis=-1)[..., None]
    edge = tie & (rng.random(shape) < EDGE_SHARE) & np.take_along_axis(apart, best, axis=-1)[..., 0]
    return np.where(edge, np.take_along_axis(cand, best, axis=-1)[..., 0], x)


def requant_ties(qtype: str, rng: np.random.Generator, rows: int, width: int) -> np.ndarray:
    """float32 (rows, width) for ``quantize_row_<qtype>_ref`` (width a multiple of 256)."""
    r = REQUANT[qtype]
    n = rows * width // 256
    s, mm, is_anchor = _design(r, rng, n)
    levels = rng.integers(r.lo, r.hi + 1, (*s.shape, r.sub))
    ends = np.argsort(rng.random(levels.shape), axis=-1)[..., :2]  # each sub-block spans its whole range
    np.put_along_axis(levels, ends, np.array([r.lo, r.hi]), axis=-1)
    grid = kq.sub(kq.mul(levels, s[..., None], False), mm[..., None], False)
    x = grid.copy()
    redraw = ~is_anchor
    for _ in range(DRAWS):
        x = np.where(redraw[..., None], _ties(r, rng, s, mm, grid, ends), x)
        dd, dm = stored_scales(qtype, quantize(x.reshape(-1, 256), qtype))
        redraw = (dd != s) | (dm != mm)
    x = np.where(redraw[..., None], grid, x)
    return x.reshape(rows, width)

"""Float32 input patterns for block quantizers: bulk data from a seed, specials placed per block.

Every pattern is a function ``(rng, rows, width, block) -> float32 (rows, width)``. The special
patterns put in each block what a quantizer's edge rules are about: exact .5 ties after scaling
(``ties``: power-of-two scales; ``ties_npot``: scales that are not, with values on and next to
the ties of the reference's own fp32 products), equal |x| with opposite signs (first-occurrence
rule), all-zero and -0.0 blocks, a single outlier, +-FLT_MAX, subnormals, NaN and +-inf, NaN
payloads (which reach ggml's ``nearest_int`` and its 127 clamp). ``FORMAT_PATTERNS`` are about one
format's own arithmetic: ``ties_4bit`` (Q4_0's power-of-two scales), ``fma_edges_*`` (the legacy
quantizers' code edges where a fused multiply-add truncates differently), ``one_sign`` (blocks of
one sign: the K-quant searches' offset rules) and ``requant_ties_*`` (the K-quants' last step).
"""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np

F32_MAX = np.finfo(np.float32).max
Pattern = Callable[[np.random.Generator, int, int, int], np.ndarray]


def _blocks(x: np.ndarray, block: int) -> np.ndarray:
    return x.reshape(-1, block)


def normal(rng: np.random.Generator, rows: int, width: int, block: int) -> np.ndarray:
    scale = 10.0 ** rng.uniform(-3, 3, size=(rows, 1))
    return (rng.standard_normal((rows, width)) * scale).astype(np.float32)


def uniform(rng: np.random.Generator, rows: int, width: int, block: int) -> np.ndarray:
    return rng.uniform(-1, 1, size=(rows, width)).astype(np.float32)


def zero_block(rng: np.random.Generator, rows: int, width: int, block: int) -> np.ndarray:
    x = normal(rng, rows, width, block)
    b = _blocks(x, block)
    pick = rng.random(len(b)) < 0.5
    pick[rng.integers(len(b))] = True
    b[pick] = 0.0
    neg = np.flatnonzero(pick)[:1]
    b[neg, ::2] = -0.0  # a block of mixed +0/-0 is still all-zero
    return x


def _ties_at(top: int, rng: np.random.Generator, rows: int, width: int, block: int) -> np.ndarray:
    """|max| = top * 2^e and every other value (k + 0.5) * 2^e, -top <= k < top: with d = max / top
    a power of two, every x / d lands on an exact .5 tie."""
    x = np.empty((rows, width), np.float32)
    b = _blocks(x, block)
    e = rng.integers(-20, 20, size=(len(b), 1)).astype(np.float64)
    k = rng.integers(-top, top, size=b.shape).astype(np.float64)
    b[...] = ((k + 0.5) * 2.0**e).astype(np.float32)
    pos = rng.integers(block, size=len(b))
    sign = rng.choice([-1.0, 1.0], size=len(b))
    b[np.arange(len(b)), pos] = (sign * top * 2.0 ** e[:, 0]).astype(np.float32)
    return x


def ties(rng: np.random.Generator, rows: int, width: int, block: int) -> np.ndarray:
    """|max| = 127 * 2^e and every other value (k + 0.5) * 2^e: exact .5 ties after 8-bit scaling."""
    return _ties_at(127, rng, rows, width, block)


def ties_4bit(rng: np.random.Generator, rows: int, width: int, block: int) -> np.ndarray:
    """|max| = 8 * 2^e and every other value (k + 0.5) * 2^e, k in -8..7: Q4_0's d = max / -8 is a
    power of two and every x * id an exact .5 tie (ggml truncates x * id + 8.5: ties up)."""
    return _ties_at(8, rng, rows, width, block)


F32_127_OVER_64_MANTISSA = 0x7E0000  # fp32 mantissa field of 127/64: amax = 127 * 2^e, a power-of-two d


def _bits_step(v: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Positive normal fp32 ``v`` moved by ``steps`` ulps (adjacent floats have adjacent bits)."""
    return (v.view(np.int32) + steps.astype(np.int32)).view(np.float32)


def ties_npot(rng: np.random.Generator, rows: int, width: int, block: int) -> np.ndarray:
    """Rounding ties under scales that are not powers of two.

    Each block's max |x| is ``m * 2^e`` with a random fp32 mantissa that is never 127/64, so no
    scale of the block is a power of two: ``d = amax/127`` and ``id = 1/d`` (Q8_0,
    ``quantize_row_q8_0_ref``) and ``iscale = -127/max`` (Q8_K, ``quantize_row_q8_K_ref``) are
    rounded quotients, not exact ones (``ties`` has only exact ones, where an approximate
    division or reciprocal that errs by less than one ulp returns the same value). Every other
    value is placed against the fp32 product the reference computes, even positions for Q8_0's
    ``x * id`` (roundf: ties away from zero), odd ones for Q8_K's ``iscale * x`` (nearest_int:
    ties to even): a tie ``t = k + 0.5`` (0 <= k <= 126) and the point where the fp32 product
    stops rounding to the integer the tie rounds to (half an ulp from ``t``, below it for roundf
    and for the ties nearest_int rounds up, above it for those it rounds down); ``x`` is the fp32
    value whose exact product lies nearest that point on a random side, so the fp32 product is
    the tie itself or one or two ulps from it (an x step moves the product by half an ulp to two).
    A scale off by an ulp or two moves such products across the point: a quantizer with an
    approximate ``amax/127``, ``1/d`` or ``-127/max`` rounds some of them to another integer
    (tests/test_ties_npot.py)."""
    x = np.empty((rows, width), np.float32)
    b = _blocks(x, block)
    n = len(b)
    amax = (rng.uniform(1.0, 2.0, n) * 2.0 ** rng.integers(-10, 11, n)).astype(np.float32)
    pot = (amax.view(np.int32) & 0x7FFFFF) == F32_127_OVER_64_MANTISSA
    amax[pot] = np.nextafter(amax[pot], np.float32(np.inf))
    # the scales as the references compute them, in fp32 (numpy float32 ops round once each)
    idd = np.float32(1.0) / (amax / np.float32(127.0))  # Q8_0: 1/fp32(amax/127)
    iscale = np.float32(127.0) / amax  # |Q8_K iscale| = |-127/max| (the sign only flips the product)
    scale = np.where(np.arange(block) % 2 == 0, idd[:, None], iscale[:, None]).astype(np.float64)
    t = rng.integers(0, 127, size=b.shape) + 0.5  # |tie|: k + 0.5 is exact in fp32
    t32 = t.astype(np.float32)
    # roundf sends every tie up (away from zero); nearest_int sends k + 0.5 up when k is odd
    up = (np.arange(block) % 2 == 0) | (np.floor(t).astype(np.int64) % 2 == 1)
    other = np.where(up, np.nextafter(t32, np.float32(0)), np.nextafter(t32, np.float32(np.inf)))
    edge = (t + other.astype(np.float64)) / 2  # where the fp32 product stops rounding to the tie's integer
    below = rng.random(b.shape) < 0.5
    x0 = (edge / scale).astype(np.float32)
    cand = np.stack([_bits_step(x0, np.full(b.shape, i)) for i in range(-2, 3)], axis=-1)
    prod = cand.astype(np.float64) * scale[..., None]  # exact: 24 x 24 bits fit a float64
    side = np.where(below[..., None], prod < edge[..., None], prod > edge[..., None])
    near = np.where(side, np.abs(prod - edge[..., None]), np.inf).argmin(axis=-1)
    mag = np.take_along_axis(cand, near[..., None], axis=-1)[..., 0]
    b[...] = mag * rng.choice(np.array([-1.0, 1.0], np.float32), size=b.shape)
    pos = rng.integers(block, size=n)
    b[np.arange(n), pos] = amax * rng.choice(np.array([-1.0, 1.0], np.float32), size=n)
    return x


def _near_code_edges(
    rng: np.random.Generator,
    base: np.ndarray,
    idd: np.ndarray,
    c: float,
    edges: np.ndarray,
    bounds: tuple[np.ndarray, np.ndarray],
    count: int,
) -> np.ndarray:
    """Per block ``i``, ``count`` fp32 values ``x`` with ``(x - base[i]) * idd[i]`` next to a random
    one of ``edges`` (the products where the code ``trunc(product + c)`` changes), strictly between
    ``bounds[0][i]`` and ``bounds[1][i]``: of 81 fp32 values around each edge,
    one whose code differs between the reference's ``f32(f32(f32(x - base) * idd) + c)`` and a
    fused multiply-add's ``f32(f32(x - base) * idd + c)`` where one does, else the nearest. The
    exact sum is a float64: products of 24-bit mantissas under 2^6 plus ``c`` < 2^5 fit 53 bits."""
    n = len(base)
    t = edges[rng.integers(len(edges), size=(n, count))]
    x0 = (base[:, None] + t / idd[:, None]).astype(np.float32)
    steps = np.arange(-40, 41, dtype=np.int32)
    cand = (x0.view(np.int32)[..., None] + np.where(x0[..., None] < 0, -steps, steps)).view(np.float32)
    p = (cand - base[:, None, None]).astype(np.float64) * idd[:, None, None].astype(np.float64)  # exact
    two = np.trunc((p.astype(np.float32) + np.float32(c)).astype(np.float64))
    one = np.trunc((p + c).astype(np.float32).astype(np.float64))
    inside = (cand > bounds[0][:, None, None]) & (cand < bounds[1][:, None, None])
    score = np.where(inside, np.where(two != one, 0.0, 1.0 + np.abs(p - t[..., None])), np.inf)
    return np.take_along_axis(cand, score.argmin(axis=-1)[..., None], axis=-1)[..., 0]


def _place(rng: np.random.Generator, b: np.ndarray, fixed: list[np.ndarray], rest: np.ndarray) -> None:
    """Block i of ``b`` gets the values ``fixed[j][i]`` at random distinct places, ``rest[i]`` elsewhere."""
    for i in range(len(b)):
        where = rng.permutation(b.shape[1])
        b[i, where[: len(fixed)]] = [f[i] for f in fixed]
        b[i, where[len(fixed) :]] = rest[i]


def _random_amax(rng: np.random.Generator, n: int) -> np.ndarray:
    return (rng.uniform(1.0, 2.0, n) * 2.0 ** rng.integers(-10, 11, n)).astype(np.float32)


def fma_edges_symmetric(half: int, rng: np.random.Generator, rows: int, width: int, block: int) -> np.ndarray:
    """Q4_0 (half 8) / Q5_0 (half 16), ``quantize_row_q4_0_ref``: d = max / -half, id = 1 / d, code
    = (int8)(x id + half + 0.5f) with the product and the sum rounded apart. Each block: its max |x|
    at a random place and sign, with a mantissa that is not 1 (d and id rounded quotients), the
    others next to the code edges x id = k + 0.5 (-half <= k < half) where a build that fuses the
    multiply-add (nvcc's default -fmad=true) truncates to another code."""
    x = np.empty((rows, width), np.float32)
    b = _blocks(x, block)
    n = len(b)
    amax = _random_amax(rng, n)
    amax[(amax.view(np.int32) & 0x7FFFFF) == 0] *= np.float32(1.5)
    mx = amax * rng.choice(np.array([-1.0, 1.0], np.float32), size=n)
    idd = np.float32(1.0) / (mx / np.float32(-half))
    edges = np.arange(-half, half) + 0.5
    rest = _near_code_edges(rng, np.zeros(n, np.float32), idd, half + 0.5, edges, (-amax, amax), block - 1)
    _place(rng, b, [mx], rest)
    return x


def fma_edges_affine(nmax: int, rng: np.random.Generator, rows: int, width: int, block: int) -> np.ndarray:
    """Q4_1 (nmax 15) / Q5_1 (nmax 31), ``quantize_row_q4_1_ref``: d = (max - min) / nmax, id = 1 / d,
    code = trunc((x - min) id + 0.5f), each operation rounded apart. Each block: its min and max at
    random places (d not a power of two), the others strictly between them next to the code edges
    (x - min) id = k + 0.5 where a fused multiply-add truncates to another code."""
    x = np.empty((rows, width), np.float32)
    b = _blocks(x, block)
    n = len(b)
    scale = _random_amax(rng, n)
    mn = (-rng.uniform(0.0, 0.05, n) * scale).astype(np.float32)  # x - min then rounds little past x
    mx = (mn + rng.uniform(0.5, 2.0, n).astype(np.float32) * scale).astype(np.float32)
    pot = (((mx - mn) / np.float32(nmax)).view(np.int32) & 0x7FFFFF) == 0
    mx[pot] = np.nextafter(mx[pot], np.float32(np.inf))
    idd = np.float32(1.0) / ((mx - mn) / np.float32(nmax))
    edges = 2.0 ** np.arange(nmax.bit_length()) - 0.5  # k + 1 a power of two: the sum leaves the product's binade
    rest = _near_code_edges(rng, mn, idd, 0.5, edges, (mn, mx), block - 2)
    _place(rng, b, [mn, mx], rest)
    return x


def one_sign(rng: np.random.Generator, rows: int, width: int, block: int) -> np.ndarray:
    """Blocks of one sign: |normal| (a post-ReLU or SiLU activation), -|normal|, or a positive
    offset with a narrower spread (every value far from 0). ggml's ``make_qkx2_quants`` (Q2_K,
    Q4_K, Q5_K) is about them: ``if (min > 0) min = 0``, and a fit whose offset comes out positive
    is redone without one; Q4_1 / Q5_1 keep a positive min (no such rule)."""
    x = np.abs(normal(rng, rows, width, block))
    b = _blocks(x, block)
    kind = rng.integers(3, size=len(b))
    b[kind == 1] *= np.float32(-1)
    far = kind == 2
    lift = b[far].max(axis=1, keepdims=True) * rng.uniform(0.5, 4.0, (int(far.sum()), 1))
    b[far] = (lift + b[far]).astype(np.float32)
    return x


def _requant_ties(qtype: str) -> Pattern:
    def pattern(rng: np.random.Generator, rows: int, width: int, block: int) -> np.ndarray:
        from qconform.ops.ggml.requant_ties import requant_ties  # built with ggml's reference quantizer

        return requant_ties(qtype, rng, rows, width)

    pattern.__doc__ = f"{qtype}: values on the .5 ties of the stored scales (qconform.ops.ggml.requant_ties)."
    return pattern


def equal_abs(rng: np.random.Generator, rows: int, width: int, block: int) -> np.ndarray:
    """The largest |x| occurs two or three times with both signs, in random order."""
    x = uniform(rng, rows, width, block)
    b = _blocks(x, block)
    for i in range(len(b)):
        m = np.float32(rng.uniform(1.5, 4.0))
        n = int(rng.integers(2, 4))
        where = rng.choice(block, size=n, replace=False)
        signs = rng.permutation(np.array([1, -1] + [int(rng.choice([-1, 1]))] * (n - 2), np.float32))
        b[i, where] = signs * m
    return x


def outlier(rng: np.random.Generator, rows: int, width: int, block: int) -> np.ndarray:
    x = normal(rng, rows, width, block)
    cols = rng.integers(width, size=rows)
    x[np.arange(rows), cols] *= np.float32(1000.0 * rng.choice([-1, 1]))
    return x


def extreme(rng: np.random.Generator, rows: int, width: int, block: int) -> np.ndarray:
    """+-FLT_MAX and large magnitudes (fp16 overflow of a Q8_0 d starts near 8.3e6)."""
    x = uniform(rng, rows, width, block)
    b = _blocks(x, block)
    mag = rng.choice(np.array([F32_MAX, 1e38, 8.4e6, 8.3e6, 1e6], np.float32), size=len(b))
    b *= mag[:, None]
    pos = rng.integers(block, size=len(b))
    b[np.arange(len(b)), pos] = rng.choice([-1, 1], size=len(b)) * F32_MAX
    return x


def subnormal(rng: np.random.Generator, rows: int, width: int, block: int) -> np.ndarray:
    """Blocks of fp32 subnormals, or tiny normals with subnormals mixed in."""
    x = (rng.standard_normal((rows, width)) * 1e-39).astype(np.float32)
    b = _blocks(x, block)
    mixed = rng.random(len(b)) < 0.5
    b[mixed] = (b[mixed] * 1e5).astype(np.float32)
    b[mixed, ::3] = (rng.standard_normal(b[mixed, ::3].shape) * 1e-42).astype(np.float32)
    return x


def nan(rng: np.random.Generator, rows: int, width: int, block: int) -> np.ndarray:
    """Default NaNs: inside a block, as its last value, and a whole-NaN block."""
    x = normal(rng, rows, width, block)
    b = _blocks(x, block)
    for i in range(len(b)):
        kind = rng.integers(4)
        if kind == 0:
            b[i, rng.integers(block)] = np.nan
        elif kind == 1:
            b[i, -1] = np.nan
        elif kind == 2:
            b[i] = np.nan
        else:
            b[i, rng.integers(block)] = -np.nan
    return x


def inf(rng: np.random.Generator, rows: int, width: int, block: int) -> np.ndarray:
    x = normal(rng, rows, width, block)
    b = _blocks(x, block)
    pos = rng.integers(block, size=len(b))
    b[np.arange(len(b)), pos] = rng.choice([-np.inf, np.inf], size=len(b))
    return x


def nan_payload(rng: np.random.Generator, rows: int, width: int, block: int) -> np.ndarray:
    """NaNs with random payloads and signs, quiet and signalling, beside finite values."""
    x = normal(rng, rows, width, block)
    bits = x.reshape(-1, block).view(np.uint32)
    n = max(1, block // 16)
    for i in range(len(bits)):
        where = rng.choice(block, size=n, replace=False)
        payload = rng.integers(1, 1 << 22, size=n, dtype=np.uint32)
        payload[0] = rng.integers(128, 4096)  # lands above the 127 clamp after nearest_int
        quiet = rng.integers(0, 2, size=n, dtype=np.uint32) << np.uint32(22)
        sign = rng.integers(0, 2, size=n, dtype=np.uint32) << np.uint32(31)
        bits[i, where] = sign | np.uint32(0x7F800000) | quiet | payload
    return x


def mixed(rng: np.random.Generator, rows: int, width: int, block: int) -> np.ndarray:
    """Each block drawn from a randomly chosen pattern."""
    x = np.empty((rows, width), np.float32)
    b = _blocks(x, block)
    # the patterns mixed has drawn from since it was written: a new pattern stays out, so that
    # the mixed cases (and the golden sets storing them) keep their values
    choices = [PATTERNS[name] for name in MIXED_FROM]
    for i in range(len(b)):
        b[i] = choices[rng.integers(len(choices))](rng, 1, block, block)[0]
    return x


PATTERNS: dict[str, Pattern] = {
    "normal": normal,
    "uniform": uniform,
    "zero_block": zero_block,
    "ties": ties,
    "ties_npot": ties_npot,
    "equal_abs": equal_abs,
    "outlier": outlier,
    "extreme": extreme,
    "subnormal": subnormal,
    "nan": nan,
    "inf": inf,
    "nan_payload": nan_payload,
    "mixed": mixed,
}
FORMAT_PATTERNS: dict[str, Pattern] = {
    "ties_4bit": ties_4bit,
    "fma_edges_q4_0": functools.partial(fma_edges_symmetric, 8),
    "fma_edges_q5_0": functools.partial(fma_edges_symmetric, 16),
    "fma_edges_q4_1": functools.partial(fma_edges_affine, 15),
    "fma_edges_q5_1": functools.partial(fma_edges_affine, 31),
    "one_sign": one_sign,
    **{f"requant_ties_{q.lower()}": _requant_ties(q) for q in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")},
}
"""Patterns about one format's own scale (outside ``PATTERNS``: only the ops that name them use them)."""
MIXED_FROM = (
    "normal",
    "uniform",
    "zero_block",
    "ties",
    "equal_abs",
    "outlier",
    "extreme",
    "subnormal",
    "nan",
    "inf",
    "nan_payload",
)


def make_values(pattern: str, seed: int, rows: int, width: int, block: int) -> np.ndarray:
    """Deterministic float32 (rows, width) for a named pattern."""
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore", invalid="ignore"):
        x = (PATTERNS.get(pattern) or FORMAT_PATTERNS[pattern])(rng, rows, width, block)
    return np.ascontiguousarray(x, dtype=np.float32)

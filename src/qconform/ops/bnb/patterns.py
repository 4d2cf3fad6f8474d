"""Input patterns of the bitsandbytes catalogue entries: every array is built with numpy from a seed.

Values to quantize (``values``): the shared block patterns of ``qconform.ops.patterns`` (normal,
zero_block, nan, inf, subnormal, ...) over the flattened input, and ``midpoints``, where the rules of
the bitsandbytes backends disagree (docs/bnb-4bit.md 2.3): each block's max |x| is a power of two
2^e, so ``x * (1/absmax)`` and ``x / absmax`` are exact, and every other value is 2^e times one of
the thresholds a backend compares the scaled value with -- the float32 midpoints of the CPU path
(``torch.bucketize``: a tie goes to the lower code), the float32 literal thresholds of the CUDA
trees (strict ``>``), the two float32 values around each exact midpoint -- or one step of the input
type beside it. fp16/bf16 inputs round these values to their type first (their significands are too
short to hold most thresholds), so exact ties occur in the float32 leaves. ``midpoints_npot``: the
same under an absmax that is not a power of two, next to the midpoints where ``x * fl32(1/absmax)``
(the CPU path's full blocks) and ``x / absmax`` (its tail) pick different codes.

Packed weights and scales (``weights``): ``random`` (random bytes: every code, FP4's -0 code 8 and
the pad nibble; scales 10^U(-3, 3)), ``quantized`` (a normal weight quantized by the oracle), and
``special_absmax`` (random codes under scales that separate the backends: 0, -0, NaN, +-inf, fp32
subnormals and products that are (flush-to-zero), 1e5 (fp16 overflow), bf16 rounding ties).

Nested statistics (``nested``): ``quantized`` (a realistic absmax nested by the oracle), ``random``
(random 8-bit codes) and ``special`` (second-level scales 0, NaN, inf, subnormal, huge;
offset 0, so that a subnormal product is the output and flush-to-zero shows).
"""

from __future__ import annotations

import numpy as np

from qconform.ops.bnb._common import from_f32, to_values
from qconform.ops.patterns import PATTERNS, make_values
from qconform.oracles.bnb import quantize_4bit, quantize_blockwise
from qconform.oracles.bnb.codes import CODES, CPU_BOUNDS, FP4_CUDA_THRESHOLDS, NF4_CUDA_THRESHOLDS

VALUE_PATTERNS = (*PATTERNS, "midpoints", "midpoints_npot", "zero_tail", "subnormal_f16")
WEIGHT_PATTERNS = ("random", "quantized", "special_absmax", "double_rounding")
NESTED_PATTERNS = ("quantized", "random", "special")
F32 = np.float32


def thresholds(quant_type: str) -> np.ndarray:
    """Every threshold some backend compares a scaled value in [-1, 1] with, float32, sorted."""
    code = np.sort(CODES[quant_type].astype(np.float64))
    exact = (code[:-1] + code[1:]) / 2
    below = exact.astype(F32)
    above = np.nextafter(below, np.where(below < exact, F32(np.inf), F32(-np.inf))).astype(F32)
    cuda = NF4_CUDA_THRESHOLDS if quant_type == "nf4" else np.concatenate([FP4_CUDA_THRESHOLDS, -FP4_CUDA_THRESHOLDS])
    t = np.unique(np.concatenate([CPU_BOUNDS[quant_type], cuda, below, above]).astype(F32))
    return t[np.abs(t) < 1]


def _step(carrier: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Move each element of a float carrier by ``steps`` representable values (zeros stay)."""
    bits = carrier.view(f"u{carrier.dtype.itemsize}")
    moved = (bits.astype(np.int64) + np.where(carrier != 0, steps, 0)).astype(bits.dtype)
    return moved.view(carrier.dtype)


def _with_absmax(rng: np.random.Generator, x: np.ndarray, n: int, absmax: np.ndarray, dtype: str) -> np.ndarray:
    """Blocks ``x`` (nb, bs) of the carrier with +-absmax[b] at a random place among block b's first
    n values -> the flat n values."""
    nb, bs = x.shape
    sizes = np.minimum(bs, n - np.arange(nb) * bs)
    where = (rng.random(nb) * sizes).astype(np.int64)
    x[np.arange(nb), where] = from_f32((absmax * rng.choice(np.array([-1, 1], F32), size=nb)).astype(F32), dtype)
    return x.reshape(-1)[:n]


def midpoints(rng: np.random.Generator, n: int, bs: int, quant_type: str, dtype: str) -> np.ndarray:
    """See the module docstring: blocks of 2^e times the thresholds (and a step beside them)."""
    nb = -(-n // bs)
    t = thresholds(quant_type)
    scale = np.ldexp(F32(1), rng.integers(-8, 9, size=(nb, 1))).astype(F32)
    v = (t[rng.integers(len(t), size=(nb, bs))] * scale).astype(F32)
    x = from_f32(v, dtype).reshape(nb, bs)
    x = _step(x, rng.integers(-1, 2, size=(nb, bs)))
    return _with_absmax(rng, x, n, scale[:, 0], dtype)


def midpoints_npot(rng: np.random.Generator, n: int, bs: int, quant_type: str, dtype: str) -> np.ndarray:
    """Blocks whose absmax is not a power of two (so ``fl32(1/absmax)`` is rounded), every other
    value next to absmax times a CPU midpoint: of the values up to four steps of the input type
    around it, the nearest whose code differs between ``x * fl32(1/absmax)`` (the CPU path's full
    blocks) and ``x / absmax`` (its tail block), where one does. A path that divides a full block
    or multiplies the tail by the reciprocal picks another code for those."""
    nb = -(-n // bs)
    bounds = CPU_BOUNDS[quant_type]
    inner = bounds[np.abs(bounds) < 1]
    am = to_values(from_f32(rng.uniform(1.0, 2.0, nb) * 2.0 ** rng.integers(-8, 9, nb), dtype), dtype)
    pot = (am.view(np.uint32) & 0x7FFFFF) == 0
    am[pot] = to_values(from_f32(am[pot] * F32(1.375), dtype), dtype)
    x0 = from_f32((inner[rng.integers(len(inner), size=(nb, bs))] * am[:, None]).astype(F32), dtype)
    steps = np.array([0, 1, -1, 2, -2, 3, -3, 4, -4])  # nearest first
    cand = np.stack([_step(x0, np.full(x0.shape, k)) for k in steps], axis=-1)
    v = to_values(cand.reshape(-1), dtype).reshape(cand.shape)
    with np.errstate(over="ignore", invalid="ignore"):
        by_rcp = np.clip(v * (F32(1) / am)[:, None, None], -1, 1).astype(F32)
        by_div = np.clip(v / am[:, None, None], -1, 1).astype(F32)
    apart = np.searchsorted(bounds, by_rcp, side="left") != np.searchsorted(bounds, by_div, side="left")
    first = np.where(apart.any(axis=-1), apart.argmax(axis=-1), 0)
    x = np.take_along_axis(cand, first[..., None], axis=-1)[..., 0]
    return _with_absmax(rng, x, n, am, dtype)


def subnormal_f16(rng: np.random.Generator, n: int, bs: int) -> np.ndarray:
    """Blocks of fp16 subnormal magnitudes (below 2^-14; normal in fp32), some with fp16 normals
    mixed in: a device that flushes half-precision inputs reads zeros there."""
    nb = -(-n // bs)
    x = (rng.uniform(-1, 1, (nb, bs)) * 2.0**-14).astype(F32)
    mixed = rng.random(nb) < 0.5
    x[mixed, ::5] *= F32(2.0**8)
    return x.reshape(-1)[:n]


def values(pattern: str, seed: int, n: int, bs: int, quant_type: str, dtype: str) -> np.ndarray:
    """``n`` values of ``dtype``'s carrier (flat) for a pattern; blocks of ``bs`` over the flattening.
    ``zero_tail``: normal values with the last block (a partial one where bs does not divide n) all
    zeros; ``subnormal_f16``: see that function."""
    rng = np.random.default_rng(seed)
    if pattern in ("midpoints", "midpoints_npot"):
        make = midpoints if pattern == "midpoints" else midpoints_npot
        return make(rng, n, bs, quant_type, dtype)
    if pattern == "subnormal_f16":
        return from_f32(subnormal_f16(rng, n, bs), dtype)
    nb = -(-n // bs)
    x = make_values("normal" if pattern == "zero_tail" else pattern, seed, 1, nb * bs, bs).reshape(-1)[:n]
    if pattern == "zero_tail":
        x[(nb - 1) * bs :] = 0
    return from_f32(x, dtype)


def _scales(rng: np.random.Generator, nb: int) -> np.ndarray:
    return (10.0 ** rng.uniform(-3, 3, nb)).astype(F32)


SPECIAL_ABSMAX = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 3e-39, 1e-38, 2e-38, 1e5, -2.5, np.finfo(F32).max], F32)


def _double_rounding_absmax(rng: np.random.Generator, code: np.ndarray, half: bool) -> np.ndarray:
    """Per code value c (float32), an absmax a with fl32(c * a) exactly half-way between two fp16
    (``half``) or bf16 values while c * a itself is not: rounding the fp32 product to the output
    type (round half to even) and rounding the exact product once go different ways."""
    mbits = 10 if half else 7
    out = np.zeros(len(code), F32)
    for i, c in enumerate(code.astype(np.float64)):
        for _ in range(10_000):  # about one target in ten has such an absmax
            step = 2.0 ** (int(rng.integers(-6, 6)) - mbits)  # one unit in the last place of the target
            m = (2.0 ** mbits + int(rng.integers(0, 2**mbits)) + 0.5) * step  # a midpoint: fp32-exact
            a0 = np.float32(m / abs(c))
            cand = a0.view(np.int32) + np.arange(-8, 9, dtype=np.int32)
            a = cand.view(F32).astype(np.float64)
            p = abs(c) * a  # exact: 24 x 24 bits
            on = (p.astype(F32) == m) & (p != m)
            even_up = int(m / step) % 2 == 1  # the even neighbour is above m when floor(m / step) is odd
            apart = on & ((p > m) != even_up)
            if apart.any():
                out[i] = a[np.flatnonzero(apart)[0]]
                break
        else:
            raise ValueError(f"no double-rounding absmax for the code {c}")
    return out


def weights(pattern: str, seed: int, n: int, bs: int, quant_type: str) -> tuple[np.ndarray, np.ndarray]:
    """(packed uint8 ``(n + 1) // 2``, float32 absmax ``(ceil(n / bs),)``) for a pattern.
    ``double_rounding``: per block a code (half of the block's codes) and an absmax that put
    fl32(code * absmax) on an fp16 (even blocks) or bf16 (odd blocks) midpoint, see
    ``_double_rounding_absmax``."""
    rng = np.random.default_rng(seed)
    nb = -(-n // bs)
    if pattern == "double_rounding":
        table = CODES[quant_type].astype(F32)
        nonzero = np.flatnonzero((table.view(np.uint32) & 0x7FFFFF) != 0)  # not a power of two (nor 0)
        k = nonzero[rng.integers(len(nonzero), size=nb)]
        absmax = np.empty(nb, F32)
        for parity in (0, 1):
            absmax[parity::2] = _double_rounding_absmax(rng, table[k[parity::2]], half=parity == 0)
        codes = rng.integers(0, 16, nb * bs)
        take = rng.random(nb * bs) < 0.5
        codes[take] = np.repeat(k, bs)[take]
        codes = codes[:n] if n % 2 == 0 else np.append(codes[:n], 0)
        return ((codes[0::2] << 4) | codes[1::2]).astype(np.uint8), absmax
    if pattern == "quantized":
        w = (rng.standard_normal(n) * 10.0 ** rng.uniform(-2, 1)).astype(F32)
        packed, state = quantize_4bit(w, bs, False, quant_type)
        return packed.reshape(-1), state.absmax
    packed = rng.integers(0, 256, (n + 1) // 2, dtype=np.uint8)
    absmax = _scales(rng, nb)
    if pattern == "special_absmax":
        pick = rng.random(nb) < 0.6
        absmax[pick] = SPECIAL_ABSMAX[rng.integers(len(SPECIAL_ABSMAX), size=int(pick.sum()))]
        ties = rng.random(nb) < 0.2  # bf16 rounding ties: low 16 bits 0x8000 (any code times 1.0 keeps them)
        bits = absmax.view(np.uint32)
        bits[ties] = (rng.integers(0x3C00, 0x4400, int(ties.sum())).astype(np.uint32) << 16) | np.uint32(0x8000)
    return packed, absmax


def nested(pattern: str, seed: int, n_blocks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(uint8 codes ``(n_blocks,)``, float32 absmax2 ``(ceil(n_blocks / 256),)``, float32 0-d offset)."""
    rng = np.random.default_rng(seed)
    nb2 = -(-n_blocks // 256)
    if pattern == "quantized":
        absmax = (np.abs(rng.standard_normal(n_blocks)) * 2.5 + 0.5).astype(F32) * F32(10.0 ** rng.uniform(-3, 1))
        offset = F32(np.mean(absmax, dtype=np.float64))
        q8, state = quantize_blockwise((absmax - offset).astype(F32), blocksize=256)
        return q8, state.absmax, np.array(offset, F32)
    q8 = rng.integers(0, 256, n_blocks, dtype=np.uint8)
    absmax2 = _scales(rng, nb2)
    offset = F32(rng.standard_normal() * 10.0 ** rng.uniform(-3, 1))
    if pattern == "special":
        absmax2 = np.resize(np.array([0.0, 3e-33, np.nan, np.inf, 1e-39, 3e38, -1.5, 0.25], F32), nb2)
        absmax2 = rng.permutation(absmax2).astype(F32)
        absmax2[0] = F32(3e-33)  # the codes nearest 0 times it are subnormal: with offset 0 flush-to-zero shows
        q8[:4] = np.array([126, 128, 127, 125], np.uint8)[: min(4, n_blocks)]
        offset = F32(0.0)
    return q8, absmax2, np.array(offset, F32)

"""Float32 input patterns for block quantizers: bulk data from a seed, specials placed per block.

Every pattern is a function ``(rng, rows, width, block) -> float32 (rows, width)``. The special
patterns put in each block what a quantizer's edge rules are about: exact .5 ties after scaling,
equal |x| with opposite signs (first-occurrence rule), all-zero and -0.0 blocks, a single outlier,
+-FLT_MAX, subnormals, NaN and +-inf, NaN payloads (which reach ggml's ``nearest_int`` and its
127 clamp).
"""

from __future__ import annotations

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


def ties(rng: np.random.Generator, rows: int, width: int, block: int) -> np.ndarray:
    """|max| = 127 * 2^e and every other value (k + 0.5) * 2^e: exact .5 ties after scaling."""
    x = np.empty((rows, width), np.float32)
    b = _blocks(x, block)
    e = rng.integers(-20, 20, size=(len(b), 1)).astype(np.float64)
    k = rng.integers(-127, 127, size=b.shape).astype(np.float64)
    b[...] = ((k + 0.5) * 2.0**e).astype(np.float32)
    pos = rng.integers(block, size=len(b))
    sign = rng.choice([-1.0, 1.0], size=len(b))
    b[np.arange(len(b)), pos] = (sign * 127.0 * 2.0 ** e[:, 0]).astype(np.float32)
    return x


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
    choices = [p for name, p in PATTERNS.items() if name != "mixed"]
    for i in range(len(b)):
        b[i] = choices[rng.integers(len(choices))](rng, 1, block, block)[0]
    return x


PATTERNS: dict[str, Pattern] = {
    "normal": normal,
    "uniform": uniform,
    "zero_block": zero_block,
    "ties": ties,
    "equal_abs": equal_abs,
    "outlier": outlier,
    "extreme": extreme,
    "subnormal": subnormal,
    "nan": nan,
    "inf": inf,
    "nan_payload": nan_payload,
    "mixed": mixed,
}


def make_values(pattern: str, seed: int, rows: int, width: int, block: int) -> np.ndarray:
    """Deterministic float32 (rows, width) for a named pattern."""
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore", invalid="ignore"):
        x = PATTERNS[pattern](rng, rows, width, block)
    return np.ascontiguousarray(x, dtype=np.float32)

"""qk_moe_fc2m's input split (``qk_moe_bf16x3`` in ``kernels/ort/qmoe.hip``): fc1's fp32 output a as three
bf16 parts b1 + b2 + b3 = a, restated in numpy with the kernel's fp32 subtractions (flushed to zero as
the kernels are built, ``-ftz=true``, or not), so the exactness its comment states is checked on the
values where it holds and shown to fail below them. Offline (no CuPy)."""

from __future__ import annotations

import numpy as np
import pytest

HI = np.uint32(0xFFFF0000)


def _fsub(a: np.ndarray, b: np.ndarray, ftz: bool) -> np.ndarray:
    """fp32 a - b, round to nearest even; a subnormal result flushed to a zero of its sign where ``ftz``."""
    with np.errstate(invalid="ignore"):  # inf - inf: the kernel's special case overrides these lanes
        d = (a - b).astype(np.float32)
    if ftz:
        d = np.where(np.abs(d) < np.float32(2.0**-126), np.copysign(np.float32(0.0), d), d).astype(np.float32)
    return d


def bf16x3(a: np.ndarray, ftz: bool = True, parts: int = 3) -> np.ndarray:
    """The kernel's parts of fp32 ``a`` as bf16 bit patterns, shape (..., 3): b1 = a's upper 16 bits,
    r = a - b1, b2 = r's upper 16 bits, b3 = the upper 16 bits of r - b2; a not finite: (a as bf16 with
    a NaN kept quiet, 0, 0). ``parts`` < 3 zeroes the last ones (the mutants)."""
    a = np.asarray(a, np.float32)
    ab = a.view(np.uint32)
    r = _fsub(a, (ab & HI).view(np.float32), ftz)
    rb = r.view(np.uint32)
    r2 = _fsub(r, (rb & HI).view(np.float32), ftz)
    out = np.stack([ab >> 16, rb >> 16, r2.view(np.uint32) >> 16], axis=-1).astype(np.uint32)
    special = (ab & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
    quiet = np.where((ab & np.uint32(0x007FFFFF)) != 0, np.uint32(0x40), np.uint32(0))
    out[special] = np.stack([(ab >> 16) | quiet, 0 * ab, 0 * ab], axis=-1)[special]
    out[..., parts:] = 0
    return out.astype(np.uint16)


def _value(parts: np.ndarray) -> np.ndarray:
    """b1 + b2 + b3 exactly (float64 holds the sum of three bf16 values of one fp32's bits)."""
    f = (parts.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return f.sum(axis=-1)


def _samples(rng: np.random.Generator, lo: int, hi: int, n: int) -> np.ndarray:
    """n fp32 values of either sign, exponents uniform in [lo, hi), mantissas uniform."""
    e = rng.integers(lo, hi, n)
    m = rng.integers(0, 1 << 23, n, dtype=np.uint32)
    bits = ((e + 127).astype(np.uint32) << 23) | m | (rng.integers(0, 2, n, dtype=np.uint32) << 31)
    return bits.view(np.float32)


@pytest.mark.parametrize("ftz", [True, False])
def test_three_parts_carry_every_normal_value_from_the_stated_floor(ftz: bool) -> None:
    # flushed (the kernels' build): exact from 2^-103 (a's last bit, 2^(e - 23), stays a normal fp32 in
    # r - b2); not flushed: from 2^-110 (that bit is >= 2^-133, bf16's smallest subnormal)
    rng = np.random.default_rng(20)
    a = _samples(rng, -103 if ftz else -110, 128, 200_000)
    got = _value(bf16x3(a, ftz))
    assert np.array_equal(got, a.astype(np.float64))


def test_below_the_floor_the_flushed_split_loses_at_most_the_subnormal_range() -> None:
    rng = np.random.default_rng(21)
    a = _samples(rng, -126, -103, 200_000)
    err = np.abs(_value(bf16x3(a, ftz=True)) - a.astype(np.float64))
    assert err.max() < 2.0**-126
    assert (err > 0).any()  # the floor is where the flushed split stops being exact, not lower


@pytest.mark.parametrize("parts", [1, 2])
def test_fewer_parts_are_not_exact(parts: int) -> None:
    rng = np.random.default_rng(22)
    a = _samples(rng, -20, 20, 10_000)
    assert not np.array_equal(_value(bf16x3(a, parts=parts)), a.astype(np.float64))


def test_zero_infinity_and_nan() -> None:
    a = np.array([0.0, -0.0, np.inf, -np.inf, np.nan], np.float32)
    nan_bits = np.array([0x7F800001, 0xFFC00000], np.uint32).view(np.float32)  # a signalling and a quiet NaN
    p = bf16x3(np.concatenate([a, nan_bits]))
    assert p[:2].tolist() == [[0, 0, 0], [0x8000, 0, 0]]
    assert p[2:4].tolist() == [[0x7F80, 0, 0], [0xFF80, 0, 0]]
    for row in p[[4, 5, 6]]:  # NaN stays NaN in bf16 (a payload only in the low 16 bits sets the quiet bit)
        assert (row[0] & 0x7F80) == 0x7F80 and (row[0] & 0x7F) != 0 and row[1] == row[2] == 0

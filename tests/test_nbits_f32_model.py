"""The fp32-activation ring decode's error model (tests/nbits_f32_model.py) against the suite's
own per-element bound (strict contract, flush-to-zero as built): the split is within 2^-23 of
each activation near its row's maximum, the modelled kernel order stays far inside the bound on
the catalogue's cases it takes, the input family that breaks it (a spike 2^35..2^50 above the
rest of its row, on weights that are zero) is flagged by the split, and the flagged groups'
path (qk_nbits_f32_tile: fp32 from A) is within the bound on it."""

from __future__ import annotations

import numpy as np
import pytest
from nbits_f32_model import (
    LO_SHIFT,
    SPLIT_FLOOR,
    flagged,
    group_flags,
    per_output,
    ring_f32,
    split,
    tile_f32,
    warp_chunks,
)

from qconform.contracts import STRICT
from qconform.ops import CATALOGUE
from qconform.oracles.ort import dequantize_nbits
from qconform.properties.bounds import budget

OP = CATALOGUE["matmul_nbits"]


def _worst(inputs: dict, params: dict, kernel=ring_f32, **kw) -> float:
    got = kernel(
        inputs["A"],
        inputs["B"],
        inputs["scales"],
        inputs.get("bias"),
        K=params["K"],
        bits=params["bits"],
        block_size=params["block_size"],
        **kw,
    )
    (exp,) = OP.numerics(inputs, params, STRICT, True)
    bound = budget(exp.model, STRICT, True).bound(exp.model)
    return float((np.abs(got.astype(np.float64) - exp.model.ref) / bound).max())


def test_split_carries_each_activation_to_one_fp32_ulp() -> None:
    """Within 2^28 of its row's maximum an activation is back to 2^-23 of itself; below, the
    floor is half of lo's smallest subnormal, 2^-25 2^-12 in the prescaled row."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((4, 4096)) * 2.0 ** rng.uniform(-28, 0, (4, 4096)) * 10.0 ** np.arange(4)[:, None]
    a = a.astype(np.float32)
    hi, lo, e = split(a)
    unit = np.ldexp(1.0, -e)[:, None]
    back = (hi.astype(np.float64) + lo.astype(np.float64) * 2.0**-LO_SHIFT) * unit
    err, mag = np.abs(back - a), np.abs(a.astype(np.float64))
    near = mag * 2.0**28 >= mag.max(axis=1, keepdims=True)
    assert np.all(err[near] <= 2.0**-23 * mag[near])
    assert np.all(err <= 2.0**-23 * mag + 2.0**-37 * unit)
    assert (~near).any() and np.all(np.isfinite(hi)) and np.all(np.isfinite(lo))


@pytest.mark.parametrize("bits", [2, 4])
def test_model_within_the_strict_bound_on_catalogue_cases(bits: int) -> None:
    leaf = f"Xfp32_Wu{bits}_Yfp32"
    cases = [
        c
        for c in OP.cases(leaf, 2)
        if c.params.get("zp", "none") == "none"
        and c.params["block_size"] % 64 == 0
        and c.shape[0] <= 8
        and c.shape[1] >= 64
        and c.params.get("accuracy_level", 0) != 4
    ]
    assert len(cases) >= 4
    for case in cases:
        params = {**case.params, "bits": bits}
        inputs = OP.make_inputs(case)
        if case.pattern == "spike":  # its flagged group in fp32 from A; the ring the others
            assert list(group_flags(inputs["A"])) == [True] * 4 + [False] * 2
            assert _worst(inputs, params, kernel=_device) < 0.02
            continue
        assert not flagged(inputs["A"]).any(), case
        # an outlier channel (2^10 above its row) dominates its chains: truncating at its product's
        # ulp costs a few of those ulps, against a bound of 8 sqrt(K) u of the row's sum |a w|, so
        # the share grows as K shrinks (0.0205 at K 1024, u4, truncating sums; 0.0058 at K 4160)
        margin = 0.05 if case.pattern == "outlier" else 0.02
        for extra in (0, None):  # the tensor core truncating at the largest addend's ulp; IEEE sums
            for strided in (False, True):  # either order of the warps' superchunks (u4 ships strided)
                assert _worst(inputs, params, extra=extra, wk_n=3, strided=strided) < margin, (case, strided)


def test_the_warps_superchunk_orders() -> None:
    """Each order gives every chunk to one warp once; they differ with more than one warp (so the
    strided case above is not the contiguous one again), and the shipped order is strided for u4 only."""
    for n_super, wk_n in ((10, 3), (7, 4), (1, 2)):
        for strided in (False, True):
            parts = [warp_chunks(wk, wk_n, n_super, 4, 4 * n_super - 1, strided) for wk in range(wk_n)]
            assert sorted(c for p in parts for c in p) == list(range(4 * n_super - 1))
    assert warp_chunks(0, 3, 10, 4, 40, False) == list(range(12))
    assert warp_chunks(0, 3, 10, 4, 40, True) == [0, 1, 2, 3, 12, 13, 14, 15, 24, 25, 26, 27, 36, 37, 38, 39]
    rng = np.random.default_rng(3)
    K, N = 64 * 4 * 6, 16
    A = rng.standard_normal((1, K)).astype(np.float32)
    scales = rng.uniform(0.5, 2, (N, K // 64)).astype(np.float32)
    outs = {}
    for bits in (2, 4):
        B = rng.integers(0, 256, (N, K // 64, 64 * bits // 8), dtype=np.uint8)
        kw = {"K": K, "bits": bits, "block_size": 64, "wk_n": 4}
        outs[bits] = [ring_f32(A, B, scales, None, **kw, strided=st) for st in (None, False, True)]
        assert not np.array_equal(outs[bits][1], outs[bits][2]), bits
    assert np.array_equal(outs[2][0], outs[2][1]) and np.array_equal(outs[4][0], outs[4][2])


def _device(A, B, scales, bias, **kw) -> np.ndarray:
    """What the launcher answers: the ring kernel's outputs for unflagged groups of 4 rows, the
    fp32 tile path's for flagged ones."""
    return np.where(group_flags(A)[:, None], tile_f32(A, B, scales, bias, **kw), ring_f32(A, B, scales, bias, **kw))


def test_every_activation_at_or_above_the_floor_is_carried_to_one_fp32_ulp() -> None:
    """The flag's rule: a prescaled |x| >= 2^-14 is carried to 2^-23 |x| (hi normal or its last
    subnormal binade, lo's rounding within its range), for x at the floor, in the binades above
    and up to the row maximum's [2^14, 2^15); so an unflagged row keeps every activation."""
    rng = np.random.default_rng(5)
    x = np.ldexp(rng.uniform(1, 2, 200_000), rng.integers(-14, 15, 200_000)) * rng.choice([-1, 1], 200_000)
    x = np.concatenate([x, [SPLIT_FLOOR, -SPLIT_FLOOR, np.nextafter(np.float32(2.0**15), 0)]]).astype(np.float32)
    row = np.concatenate([[np.float32(2.0**14)], x])[None, :]  # e = 0: x is its own prescaled value
    hi, lo, e = split(row)
    assert e[0] == 0 and not flagged(row)[0]
    back = hi.astype(np.float64) + lo.astype(np.float64) * 2.0**-LO_SHIFT
    assert np.all(np.abs(back - row) <= 2.0**-23 * np.abs(row.astype(np.float64)))
    below = row.copy()
    below[0, 1] = np.nextafter(np.float32(SPLIT_FLOOR), 0)
    assert flagged(below)[0]


def _spike_inputs(rng, K: int, N: int, bits: int) -> tuple[np.ndarray, np.ndarray]:
    B = rng.integers(0, 256, (N, K // 64, 64 * bits // 8), dtype=np.uint8)
    B[:, 0, 0] = (B[:, 0, 0] & (0xFF ^ ((1 << bits) - 1))) | (1 << (bits - 1))  # k = 0: q = z in every row
    scales = (rng.uniform(0.5, 2.0, (N, K // 64)) * 2.0 ** -(bits + 2)).astype(np.float32)
    return B, scales


@pytest.mark.parametrize("bits", [2, 4])
def test_rows_the_split_loses_are_flagged_and_the_answer_stays_in_the_bound(bits: int) -> None:
    """A spike 2^35 / 2^40 / 2^50 above the rest of its row on weights q = z breaks the ring kernel
    alone (2^40 and up: outside the bound); 1e30 beside activations ~1; per-element magnitudes
    2^+-60. Each such row is flagged, its group of 4 goes to the fp32 tile path, and what the
    launcher answers is within the bound; rows of normal activations stay on the ring."""
    rng = np.random.default_rng(3)
    K, N = 512, 16
    B, scales = _spike_inputs(rng, K, N, bits)
    params = {"K": K, "bits": bits, "block_size": 64}
    for spike in (2.0**35, 2.0**40, 2.0**50, 1e30, None):
        A = rng.standard_normal((6, K)).astype(np.float32)
        if spike is None:
            A[2] *= np.ldexp(1.0, rng.integers(-60, 61, K)).astype(np.float32)
        else:
            A[2, 0] = spike
        assert list(flagged(A)) == [False, False, True, False, False, False], spike
        assert list(group_flags(A)) == [True] * 4 + [False] * 2
        inputs = {"A": A, "B": B, "scales": scales}
        if spike is not None and spike >= 2.0**40:
            assert _worst({"A": A[2:3], "B": B, "scales": scales}, params) > 1, spike  # the hole closed
        assert _worst(inputs, params, kernel=_device) < 0.05, spike


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("zp", ["none", "packed", "float", "scalar"])
def test_per_output_kernel_on_a_spike_row_within_the_bound(bits: int, zp: str) -> None:
    """The per-output kernel (fp32 A at M > 8, K < 64, zero points, the F32_PER_OUTPUT build) chains
    fmaf(a, w) with the dequantized weights: a 1e30 activation on weights q = z beside activations
    ~1 (M 12, K 200: a tail word) stays within the bound for every zero-point kind."""
    rng = np.random.default_rng(7)
    K, N, M, bs = 200, 24, 12, 64
    kb = -(-K // bs)
    B = rng.integers(0, 256, (N, kb, bs * bits // 8), dtype=np.uint8)
    scales = (rng.uniform(0.5, 2.0, (N, kb)) * 2.0 ** -(bits + 2)).astype(np.float32)
    z = {"none": None, "packed": np.full((N, -(-kb * bits // 8)), 0x11 * (1 << (bits - 1)) & 0xFF, np.uint8)}
    z["float"] = np.full((N, kb), 2 ** (bits - 1), np.float32)
    z["scalar"] = np.array([2 ** (bits - 1)], np.float32)
    if bits == 2:
        z["packed"] = np.full((N, -(-kb * bits // 8)), 0xAA, np.uint8)  # every 2-bit zero point 2
    B[:, 0, 0] = (B[:, 0, 0] & (0xFF ^ ((1 << bits) - 1))) | (1 << (bits - 1))  # k = 0: q = z (= 2^(bits - 1))
    A = rng.standard_normal((M, K)).astype(np.float32)
    A[3, 0] = 1e30
    bias = rng.standard_normal(N).astype(np.float32)
    form = "kernel" if zp == "scalar" else "ort"
    kw = {"K": K, "N": N, "bits": bits, "block_size": bs, "form": form}
    W = dequantize_nbits(B, scales, z[zp], **kw)
    assert np.all(W[:, 0] == 0)
    got = per_output(A, W, bias, bits=bits)
    inputs = {"A": A, "B": B, "scales": scales, "bias": bias, **({} if z[zp] is None else {"zero_points": z[zp]})}
    params = {"K": K, "bits": bits, "block_size": bs, "zp": zp}
    (exp,) = OP.numerics(inputs, params, STRICT, True)
    bound = budget(exp.model, STRICT, True).bound(exp.model)
    assert float((np.abs(got.astype(np.float64) - exp.model.ref) / bound).max()) < 0.05

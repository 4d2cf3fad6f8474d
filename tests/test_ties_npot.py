"""Ties under scales that are not powers of two (pattern ``ties_npot``): a quantizer whose scale
arithmetic is approximate -- ``amax/127``, ``1/d`` (Q8_0) or ``-127/max`` (Q8_K) off by an ulp or
two, or ``x * (1/s)`` for ONNX's ``x / s`` -- is caught by that named case on every seed, where the
power-of-two ``ties`` pattern cannot catch it.

Why ``ties`` cannot: its scales are powers of two, so ``amax/127``, ``1/d``, ``-127/max`` and
``1/s`` are exact fp32 values, and an approximation that errs by less than one ulp (a faithful one:
what fast division and reciprocal instructions promise) returns an exact value unchanged. The
perturbed quantizers below therefore move a scale by one or two ulps only where the exact quotient
is not an fp32 value; they are written here in numpy, apart from the oracle."""

from __future__ import annotations

import itertools

import mutants
import numpy as np
import pytest

from qconform.formats.ggml import Q8_0, Q8_K
from qconform.impls import load_impl
from qconform.ops import get_op
from qconform.ops.patterns import make_values
from qconform.oracles.ggml import quantize
from qconform.properties import Prepared, run_leaf

F32 = np.float32
SEEDS = list(range(1000, 1008)) + list(range(40))  # the catalogue's edge seeds (coverage 3) and more
PERTURBATIONS = list(itertools.product((1, -1), (1, 2)))  # (direction, ulps)


def _off(v: np.ndarray, direction: int, ulps: int, exact: np.ndarray) -> np.ndarray:
    """``v`` moved ``ulps`` ulps towards ``direction * inf`` where the exact result is not ``v``."""
    moved = v
    for _ in range(ulps):
        moved = np.nextafter(moved, F32(direction * np.inf))
    return np.where(exact, v, moved).astype(F32)


def _roundf(v: np.ndarray) -> np.ndarray:
    """C roundf (ties away from zero) of finite fp32 values."""
    v = v.astype(np.float64)
    return (np.sign(v) * np.floor(np.abs(v) + 0.5)).astype(np.int64)


def q8_0_qs(x: np.ndarray, where: str, direction: int, ulps: int) -> np.ndarray:
    """Q8_0 quants of finite ``x`` with an approximate division (``where="div"``: d = amax/127) or
    reciprocal (``"rcp"``: id = 1/d), fp32 otherwise as ``quantize_row_q8_0_ref``."""
    xb = x.reshape(-1, Q8_0.block_size)
    amax = np.abs(xb).max(axis=1)
    d = amax / F32(127)
    if where == "div":
        d = _off(d, direction, ulps, d.astype(np.float64) * 127 == amax.astype(np.float64))
    idd = F32(1) / d
    if where == "rcp":
        idd = _off(idd, direction, ulps, idd.astype(np.float64) * d.astype(np.float64) == 1.0)
    return _roundf(xb * idd[:, None])


def q8_k_qs(x: np.ndarray, direction: int, ulps: int) -> np.ndarray:
    """Q8_K quants of finite ``x`` (first strict max, no value above 127 here) with an approximate
    ``iscale = -127/max``; nearest_int is round half to even."""
    xb = x.reshape(-1, Q8_K.block_size)
    mx = xb[np.arange(len(xb)), np.abs(xb).argmax(axis=1)]
    iscale = F32(-127) / mx
    iscale = _off(iscale, direction, ulps, iscale.astype(np.float64) * mx.astype(np.float64) == -127.0)
    return np.minimum(127, np.rint(iscale[:, None] * xb).astype(np.int64))


def _oracle_qs(x: np.ndarray, qtype: str) -> np.ndarray:
    fmt = {"Q8_0": Q8_0, "Q8_K": Q8_K}[qtype]
    return quantize(x, qtype).reshape(-1).view(fmt.dtype)["qs"].astype(np.int64)


def test_the_numpy_quantizers_are_the_oracle_unperturbed() -> None:
    for pattern, seed in itertools.product(("ties", "ties_npot", "normal"), SEEDS[:8]):
        x = make_values(pattern, seed, 2, 512, 32)
        assert np.array_equal(q8_0_qs(x, "rcp", 1, 0), _oracle_qs(x, "Q8_0")), (pattern, seed)
        x = make_values(pattern, seed, 2, 512, 256)
        assert np.array_equal(q8_k_qs(x, 1, 0), _oracle_qs(x, "Q8_K")), (pattern, seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_ties_npot_catches_approximate_scales_and_ties_does_not(seed: int) -> None:
    """Every perturbation (up or down, one or two ulps; Q8_0's division and its reciprocal, Q8_K's
    division) changes some quant of the ``ties_npot`` case (2 x 512, as the catalogue's) and none
    of the ``ties`` case of the same seed."""
    for direction, ulps in PERTURBATIONS:
        for where in ("div", "rcp"):
            npot, ties = (make_values(p, seed, 2, 512, Q8_0.block_size) for p in ("ties_npot", "ties"))
            assert not np.array_equal(q8_0_qs(npot, where, direction, ulps), _oracle_qs(npot, "Q8_0")), where
            assert np.array_equal(q8_0_qs(ties, where, direction, ulps), _oracle_qs(ties, "Q8_0")), where
        npot, ties = (make_values(p, seed, 2, 512, Q8_K.block_size) for p in ("ties_npot", "ties"))
        assert not np.array_equal(q8_k_qs(npot, direction, ulps), _oracle_qs(npot, "Q8_K"))
        assert np.array_equal(q8_k_qs(ties, direction, ulps), _oracle_qs(ties, "Q8_K"))


def test_ties_npot_values_sit_on_and_beside_ties_of_the_references_products() -> None:
    """No block scale is a power of two; every value's fp32 product with its block's scale (Q8_0's
    id at even positions, Q8_K's iscale at odd ones) is a .5 tie or one or two ulps from one, and
    each of those five occurs. ``ties`` by contrast: d a power of two, every product a tie."""
    for seed in SEEDS[:8]:
        for block in (Q8_0.block_size, Q8_K.block_size):
            xb = make_values("ties_npot", seed, 4, 1024, block).reshape(-1, block)
            i = np.abs(xb).argmax(axis=1)
            amax = np.abs(xb)[np.arange(len(xb)), i]
            d = amax / F32(127)
            idd = F32(1) / d
            iscale = F32(-127) / xb[np.arange(len(xb)), i]
            for scale in (d, idd, iscale):
                assert np.all(scale.view(np.int32) & 0x7FFFFF), "a power-of-two scale"
            others = np.ones(xb.shape, bool)
            others[np.arange(len(xb)), i] = False
            p = np.concatenate([np.abs(xb * s[:, None])[:, j::2][others[:, j::2]] for j, s in ((0, idd), (1, iscale))])
            tie = (np.floor(p) + 0.5).astype(F32)
            ulps = p.view(np.int32).astype(np.int64) - tie.view(np.int32)  # positive floats: bits in order
            assert np.abs(ulps).max() <= 2 and {-2, -1, 0, 1, 2} <= set(ulps.tolist())
    xb = make_values("ties", 1000, 2, 512, 32).reshape(-1, 32)
    d = np.abs(xb).max(axis=1) / F32(127)
    assert not np.any(d.view(np.int32) & 0x7FFFFF)
    p = np.abs(xb * (F32(1) / d)[:, None])
    assert np.all((p == np.floor(p) + 0.5) | (p == 127))


def test_an_id_moved_off_a_power_of_two_would_show_on_ties() -> None:
    """The model's point: ``ties`` passes the approximations above because they are exact at powers
    of two, not because its values are insensitive. Pushed off its exact value by hand, id = 2^-e
    loses every tie of the block (x * id rounds just below k + 0.5, and roundf to k)."""
    x = make_values("ties", 1000, 2, 512, 32)
    xb = x.reshape(-1, 32)
    idd = F32(1) / (np.abs(xb).max(axis=1) / F32(127))
    pushed = np.nextafter(idd, F32(0))
    assert not np.array_equal(_roundf(xb * pushed[:, None]), _oracle_qs(x, "Q8_0"))


@pytest.mark.parametrize("name", ["q8_0_approx_reciprocal", "fake_quantize_times_reciprocal"])
def test_the_mutants_fail_the_named_case_and_pass_ties(name: str, in_tests_dir) -> None:
    """tests/mutants.py's approximate-reciprocal mutants fail matches_oracle on ``ties_npot``
    cases at coverage 1, and on no ``ties`` case; the fake_quantize one on every ``ties_npot``
    case of every leaf (coverage 2) and on no ``ties`` case."""
    impl = load_impl(f"py:mutants:{name}")
    (op_name,) = impl.ops
    op = get_op(op_name)
    leaf = getattr(impl.fn, "__qconform_leaf__", op.leaves[0].name)
    cases = op.cases(leaf, 1)
    result = run_leaf(impl, op, leaf, [Prepared.from_case(op, c) for c in cases])
    failed = {o.case for o in result.failed if o.prop == "matches_oracle"}
    assert any(c.startswith("ties_npot-") for c in failed), failed
    assert not any(c.startswith("ties-") for c in failed), failed
    if op_name != "fake_quantize":
        return
    for lf in op.leaves:
        for case in op.cases(lf.name, 2):
            args, kw = op.call_args(op.make_inputs(case), op.params(case))
            got, want = mutants.fake_quantize_times_reciprocal(*args, **kw), op.oracle(*args, **kw)
            same = np.array_equal(got.view(np.uint8), want.view(np.uint8))
            if case.pattern in ("ties", "ties_npot"):  # (the other patterns are about other rules)
                assert same == (case.pattern == "ties"), (lf.name, case.id)

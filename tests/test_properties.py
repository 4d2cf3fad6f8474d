"""The property engine parametrized over (op, leaf, implementation): both oracle twins, plus any
implementations named in ``QCONFORM_IMPL`` (comma-separated ``--impl`` strings), so a kernel
author can run ``QCONFORM_IMPL=py:my_kernels:my_q8_k pytest tests/test_properties.py``."""

from __future__ import annotations

import inspect
import os

import numpy as np
import pytest

from qconform.impls import load_impl
from qconform.ops import CATALOGUE
from qconform.properties import Prepared, run_leaf

LEAVES = [(op, lf.name) for op in CATALOGUE.values() for lf in op.leaves]
IMPLS = ["oracle", "oracle-numpy"] + [s for s in os.environ.get("QCONFORM_IMPL", "").split(",") if s]


def has_twins(op) -> bool:
    """The op's oracle has a numba twin and a numpy spec (a ``backend`` parameter). Otherwise
    ``oracle-numpy`` runs the very function the reference outputs come from: comparing it with
    itself could not fail, so it is not run."""
    return "backend" in inspect.signature(op.oracle).parameters


RUNS = [(impl, op, leaf) for impl in IMPLS for op, leaf in LEAVES if impl != "oracle-numpy" or has_twins(op)]


@pytest.mark.parametrize("impl_name,op,leaf", RUNS, ids=[f"{op.name}-{leaf}-{impl}" for impl, op, leaf in RUNS])
def test_implementations_pass_every_property(impl_name: str, op, leaf: str) -> None:
    impl = load_impl(impl_name)
    if not impl.applies_to(op):
        pytest.skip(f"{impl_name} does not implement {op.name}")
    # the registered oracle is the function the reference outputs come from: its matches_oracle cannot
    # fail at any coverage, so it runs coverage 1 (every property once on every leaf); the numpy specs
    # (compared with their numba twins) also coverage 1, coverage 3 in test_twins; an implementation
    # named in QCONFORM_IMPL coverage 2
    coverage = 1 if impl_name in ("oracle", "oracle-numpy") else 2
    prepared = [Prepared.from_case(op, c) for c in op.cases(leaf, coverage)]
    result = run_leaf(impl, op, leaf, prepared)
    if result.skipped:
        pytest.skip(result.skipped)
    assert result.verdict == "PASS", [o.detail for o in result.failed]
    props = {o.prop for o in result.checked}
    assert props == {"matches_oracle", "repeatable", "writes_every_output", "rejects_bad_arguments"}
    assert [o.ok for o in result.outcomes if o.prop == "survives_pending_error"] == [None]


def test_the_oracle_numpy_runs_compare_two_twins_and_can_fail(monkeypatch) -> None:
    """What is left of the ``oracle-numpy`` runs compares the numpy spec with the numba twin the
    reference outputs come from: with the spec broken (Q8_0's qs[0] of every first block flipped)
    the same run fails."""
    assert "q8_0_quant" in {op.name for impl, op, _ in RUNS if impl == "oracle-numpy"}
    from qconform.oracles.ggml import q8_0

    real = q8_0.quantize_blocks_numpy

    def broken(x: np.ndarray, out: np.ndarray, ftz: bool = False) -> None:
        real(x, out, ftz)
        out["qs"][0, 0] ^= 1

    monkeypatch.setattr(q8_0, "quantize_blocks_numpy", broken)
    op = CATALOGUE["q8_0_quant"]
    leaf = op.leaves[0].name
    prepared = [Prepared.from_case(op, c) for c in op.cases(leaf, 1)]
    assert run_leaf(load_impl("oracle"), op, leaf, prepared).verdict == "PASS"
    result = run_leaf(load_impl("oracle-numpy"), op, leaf, prepared)
    assert result.verdict == "FAIL"
    assert {"matches_oracle", "writes_every_output"} <= {o.prop for o in result.failed}


@pytest.mark.parametrize("op", list(CATALOGUE.values()), ids=lambda op: op.name)
def test_cases_are_deterministic_and_cover_the_edges(op) -> None:
    leaf = op.leaves[0].name
    for cov in (1, 2, 3):
        a, b = op.cases(leaf, cov), op.cases(leaf, cov)
        assert a == b
        assert len({c.id for c in a}) == len(a), "case ids must be unique within a leaf"
    first = op.cases(leaf, 1)[min(3, len(op.cases(leaf, 1)) - 1)]
    x1, x2 = op.make_inputs(first), op.make_inputs(first)
    assert all(x1[k].tobytes() == x2[k].tobytes() for k in x1)
    if op.family == "ort":
        _ort_cases_cover_the_edges(op, leaf)
        return
    if op.family == "bnb":  # what the bitsandbytes issue asks of its cases: tests/test_bnb_catalogue.py
        return
    widths = {c.shape[-1] for c in op.cases(leaf, 2)}
    assert {2048, 2560, 4096, 5120, 8192, 14336} <= widths
    patterns = {c.pattern for c in op.cases(leaf, 1)}
    assert {
        "ties",
        "zero_block",
        "equal_abs",
        "outlier",
        "extreme",
        "subnormal",
        "nan",
        "inf",
        "nan_payload",
    } <= patterns


def _ort_cases_cover_the_edges(op, leaf: str) -> None:
    """What the ORT issue asks the cases to hold, per op."""
    cov1, cov2, cov3 = (op.cases(leaf, c) for c in (1, 2, 3))
    if op.name in ("matmul_nbits", "dequantize_nbits"):
        kinds = {"none", "packed", "float", "uniform"} | ({"scalar"} if op.name == "matmul_nbits" else set())
        assert {c.params["zp"] for c in cov1} == kinds
        assert any(c.params["K"] % c.params["block_size"] for c in cov1), "K not a multiple of the block"
        assert {16, 32, 64, 128, 256} <= {c.params["block_size"] for c in cov2}
        if op.name == "matmul_nbits":
            assert 1 in {c.shape[0] for c in cov1} and 2048 in {c.shape[0] for c in cov3}
            assert {(5120, 17920), (17920, 5120), (5120, 5120), (5120, 100352)} <= {c.shape[1:] for c in cov3}
            assert any(c.params.get("accuracy_level") == 4 for c in cov2)
    if op.name == "fake_quantize":
        assert {c.params["granularity"] for c in cov1} == {"tensor", "axis", "block", "axis0", "block0"}
        assert any(c.shape[1] % 32 for c in cov1), "a ragged last block"
    if op.name == "gather_block_quantized":
        assert {c.params["zp"] for c in cov1} == {False, True}
    if op.name in ("gqa_decode", "gqa_prefill"):
        for knob in ("window", "softcap", "sink", "shared", "bias", "rd", "pos_ids"):  # on and off at coverage 1
            assert any(knob in c.params for c in cov1) and any(knob not in c.params for c in cov1), knob
        heads = {c.shape[3:] for c in cov2}
        assert {(32, 8, 128), (40, 10, 128), (64, 8, 128), (24, 8, 64)} <= heads
        assert any(c.shape[3:] == (24, 8, 64) and c.params.get("rd") == 32 for c in cov2), "partial rotary"
        assert {1, 2, 3, 4} <= {c.shape[0] for c in cov2}

        def context(c) -> int:  # total_sequence_length: a fixed buffer holds at most P; a first prompt S
            S, P = c.shape[1:3]
            return P if c.params.get("fixed") else S if c.params.get("phase") == "first" else P + S

        assert max(context(c) for c in cov3) == 4096, "prompts / contexts of 4096"
        if op.name == "gqa_prefill":
            assert {c.params["phase"] for c in cov1} == {"first", "chunk"}
    if op.name in ("qmoe_decode", "qmoe_ragged_mm"):
        assert {c.params.get("bs", 0) for c in cov2} == {0, 32, 64, 128}
        for knob in ("zp", "bias"):
            assert {c.params.get(knob, False) for c in cov1} == {False, True}, knob
        assert {"skew", "ties"} <= {c.pattern for c in cov1}
        tokens = {c.shape[0] for c in cov3}
        assert tokens == {1} if op.name == "qmoe_decode" else max(tokens) >= 256


@pytest.mark.parametrize("op,leaf", LEAVES, ids=[f"{op.name}-{leaf}" for op, leaf in LEAVES])
def test_oracle_rejects_bad_arguments_naming_the_argument(op, leaf: str) -> None:
    """Each bad call breaks the one rule it says: the oracle raises ``"<arg>: <rule>"`` for it, with
    ``arg`` the argument the BadArgument names, and the message matches its pattern."""
    from qconform.errors import ArgumentError

    named = set(op.input_names) | {"out", "qtype"} | {k for bad in op.bad_arguments(leaf) for k in bad.params}
    for bad in op.bad_arguments(leaf):
        assert bad.arg in named, (bad.rule, bad.arg)
        assert (bad.arg == "out") == (bad.bad_out is not None), bad.rule
        args, kwargs = op.call_args(bad.inputs, bad.params)
        with pytest.raises(ArgumentError) as err:
            op.oracle(*args, **kwargs, out=bad.bad_out)
        assert str(err.value).startswith(f"{bad.arg}: "), (bad.rule, str(err.value))
        assert bad.mismatch(str(err.value)) is None, (bad.rule, str(err.value))
        assert bad.mismatch(f"{bad.arg}: something unrelated") is not None, bad.rule


def test_compare_exact_float_rules() -> None:
    """Exact float comparison: bits must match (so -0.0 != +0.0), NaN payloads may differ, NaN
    positions may not."""
    from qconform.properties import compare

    op = CATALOGUE["q8_0_dequant"]
    params = {"qtype": "Q8_0"}
    want = np.array([[1.0, -0.0, np.nan] + [0.0] * 29], np.float32)
    other_nan = want.copy()
    other_nan.view(np.uint32)[0, 2] = 0x7FC00123
    assert compare(op, params, other_nan, want).ok
    plus_zero = want.copy()
    plus_zero[0, 1] = 0.0
    assert not compare(op, params, plus_zero, want).ok
    moved_nan = want.copy()
    moved_nan[0, 2], moved_nan[0, 3] = 0.0, np.nan
    c = compare(op, params, moved_nan, want)
    assert not c.ok and np.isnan(c.rel_l2)
    assert "block 0, value 2" in c.detail
    assert not compare(op, params, want.astype(np.float64), want).ok
    assert not compare(op, params, want[:, :16], want).ok


def test_repeatable_compares_the_defined_elements_only() -> None:
    """GroupQueryAttention's present rows past the valid length are the caller's buffer: repeat
    calls that leave fresh garbage there are repeatable; a change of one defined element is not."""
    from qconform.properties.checks import defined_elements, repeatable

    op = CATALOGUE["gqa_decode"]
    preps = [Prepared.from_case(op, c) for c in op.cases("Xfp32_Wfp32_Yfp32", 1)]
    p = next(q for q in preps if any(m is not None and not m.all() for m in defined_elements(q) or ()))
    rng = np.random.default_rng(0)

    class Fake:
        """The oracle's outputs, fresh noise on the undefined elements each call; ``flip``: the
        third call also changes the first output element."""

        def __init__(self, flip: bool) -> None:
            self.flip, self.calls = flip, 0

        def stage(self, op, leaf, inputs, params):
            def call():
                self.calls += 1
                outs = [np.array(w, copy=True) for w in p.want]
                for o, m in zip(outs, defined_elements(p), strict=True):
                    if m is not None:
                        o[~m] = rng.standard_normal(int((~m).sum()))
                if self.flip and self.calls == 3:
                    outs[0].reshape(-1)[0] += 1
                return tuple(outs)

            return call

    assert repeatable(Fake(False), op, [p], calls=6).ok
    assert repeatable(Fake(True), op, [p], calls=6).ok is False


@pytest.mark.parametrize("op", list(CATALOGUE.values()), ids=lambda op: op.name)
def test_case_inputs_are_c_contiguous(op) -> None:
    """Every input the catalogue makes is C-contiguous: device launchers take pointers and refuse
    other layouts (a broadcast view's astype keeps its own memory order)."""
    for lf in op.leaves:
        for case in op.cases(lf.name, 1):
            for name, a in op.make_inputs(case).items():
                assert not isinstance(a, np.ndarray) or a.flags.c_contiguous, (case.id, name)

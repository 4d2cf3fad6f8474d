"""The fp16-activation matrix-unit kernel's error model (tests/nbits_mma_model.py) against the
suite's own per-element bound (strict contract, flush-to-zero as built): on the catalogue's fp16
spike cases (a 65504 activation on weights q = z beside activations ~1e-3) the session-3 form
(zero point through sum(a)) is far outside the bound for every zero-point kind, the session-10
form (the integer part of z folded into exact fp16 weights) is inside it, and so is the oracle;
the new form also stays inside the bound on the catalogue cases the kernel takes."""

from __future__ import annotations

import numpy as np
import pytest
from nbits_mma_model import mma_fp16

from qconform.contracts import STRICT
from qconform.ops import CATALOGUE
from qconform.properties.bounds import budget

OP = CATALOGUE["matmul_nbits"]


def _ratio(got: np.ndarray, inputs: dict, params: dict) -> np.ndarray:
    """|got - ref| / bound per element (the strict contract's fp32 reading)."""
    (exp,) = OP.numerics(inputs, params, STRICT, True)
    bound = budget(exp.model, STRICT, True).bound(exp.model)
    return np.abs(got.astype(np.float64) - exp.model.ref) / bound


def _sum_ratio(y32: np.ndarray, inputs: dict, params: dict) -> float:
    """The worst |y - ref| / (e_acc sum|a||w| + tiny) of an fp32 value before the output rounding:
    how much of the accumulation part of the bound the sums take."""
    (exp,) = OP.numerics(inputs, params, STRICT, True)
    b = budget(exp.model, STRICT, True)
    return float((np.abs(y32.astype(np.float64) - exp.model.ref) / (b.e_acc * exp.model.mag + b.tiny)).max())


def _model(inputs: dict, params: dict, **kw) -> np.ndarray:
    return mma_fp16(
        inputs["A"],
        inputs["B"],
        inputs["scales"],
        inputs.get("zero_points"),
        inputs.get("bias"),
        K=params["K"],
        bits=params["bits"],
        block_size=params["block_size"],
        **kw,
    )


def _cases(bits: int, spike: bool) -> list:
    leaf = f"Xfp16_Wu{bits}_Yfp16"
    return [
        (c, {**c.params, "bits": bits})
        for c in OP.cases(leaf, 2)
        if (c.pattern == "spike") == spike
        and c.params["block_size"] % 64 == 0
        and c.params.get("accuracy_level", 0) != 4
    ]


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_fp16_spike_cases_and_the_oracle_within_the_bound(bits: int) -> None:
    """Every fp16 leaf has a spike case per zero-point kind (decode M 6, prefill M 40); row 1's
    small activations matter (its outputs are ~1e-3 of the other rows'); the oracle itself is
    within the strict bound on them."""
    cases = _cases(bits, spike=True)
    kinds = {c.params["zp"] for c, _ in cases}
    assert kinds == {"none", "packed", "float", "uniform", "scalar"}
    assert {c.shape[0] for c, _ in cases} == {6, 40}
    for case, params in cases:
        inputs = OP.make_inputs(case)
        assert inputs["A"].dtype == np.float16 and inputs["A"][1, 1] == 65504
        (exp,) = OP.numerics(inputs, params, STRICT, True)
        assert float(_ratio(exp.want, inputs, params).max()) < 1, case


@pytest.mark.parametrize("bits", [2, 4])
def test_sum_form_cancels_and_the_folded_form_does_not(bits: int) -> None:
    """On the spike row the session-3 arithmetic (sum(a) form) is outside the bound by orders of
    magnitude for every zero-point kind; the folded form is inside it (tensor-core truncation or
    IEEE sums, one or two K-split warps)."""
    for case, params in _cases(bits, spike=True):
        inputs = OP.make_inputs(case)
        old = _ratio(_model(inputs, params, sum_form=True), inputs, params)
        assert float(old[1].max()) > 1000 and float(np.delete(old, 1, axis=0).max()) < 1, case
        for extra in (0, None):
            for wk_n in (1, 2):
                assert float(_ratio(_model(inputs, params, extra=extra, wk_n=wk_n), inputs, params).max()) < 1, case
                y32 = _model(inputs, params, extra=extra, wk_n=wk_n, rounded=False)
                assert _sum_ratio(y32, inputs, params) < 0.1, (case, extra, wk_n)


@pytest.mark.parametrize("bits", [2, 4])
def test_folded_form_within_the_bound_on_catalogue_cases(bits: int) -> None:
    """The catalogue's coverage-2 cases the kernel takes (bits 2 / 4, blocks of 64 x 2^j, not the
    int8 path), every zero-point kind: inside the bound, the sums well inside its accumulation part."""
    cases = [(c, p) for c, p in _cases(bits, spike=False) if c.params["block_size"] in (64, 128, 256)]
    assert {c.params.get("zp", "none") for c, _ in cases} == {"none", "packed", "float", "uniform", "scalar"}
    for case, params in cases:
        inputs = OP.make_inputs(case)
        for extra in (0, None):
            assert float(_ratio(_model(inputs, params, extra=extra, wk_n=2), inputs, params).max()) < 1, case
            assert _sum_ratio(_model(inputs, params, extra=extra, wk_n=2, rounded=False), inputs, params) < 0.1, case


@pytest.mark.parametrize(
    "name,verdict",
    [("mutants:matmul_fp16_zero_point_through_sum_a", "FAIL"), ("nbits_mma_model:matmul_fp16_mma_folded", "PASS")],
)
def test_suite_catches_the_sum_form_on_the_spike_cases(name: str, verdict: str, in_tests_dir) -> None:
    """The offline mutant (the session-3 arithmetic as a drop-in) fails matches_oracle on the
    fp16 spike cases (coverage 2), every one of them; control: the session-10 arithmetic passes."""
    from qconform.impls import load_impl
    from qconform.properties import Prepared, run_leaf

    impl = load_impl(f"py:{name}")
    leaf = impl.fn.__qconform_leaf__
    cases = [c for c in OP.cases(leaf, 2) if c.pattern == "spike"]
    result = run_leaf(impl, OP, leaf, [Prepared.from_case(OP, c, impl) for c in cases])
    assert result.verdict == verdict, [o.detail for o in result.failed][:2]
    if verdict == "FAIL":
        assert "matches_oracle" in {o.prop for o in result.failed}
        caught = {o.case for o in result.failed if o.prop == "matches_oracle"}
        assert {c.id for c in cases} <= caught, sorted(caught)

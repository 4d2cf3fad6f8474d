"""The property engine on the built-in implementations: every property holds for both twins."""

from __future__ import annotations

import pytest

from qconform.impls import load_impl
from qconform.ops import CATALOGUE
from qconform.properties import Prepared, run_leaf

LEAVES = [(op, lf.name) for op in CATALOGUE.values() for lf in op.leaves]


@pytest.mark.parametrize("impl_name", ["oracle", "oracle-numpy"])
@pytest.mark.parametrize("op,leaf", LEAVES, ids=[f"{op.name}-{leaf}" for op, leaf in LEAVES])
def test_builtin_impls_pass_every_property(impl_name: str, op, leaf: str) -> None:
    impl = load_impl(impl_name)
    coverage = 2 if impl_name == "oracle" else 1
    prepared = [Prepared.from_case(op, c) for c in op.cases(leaf, coverage)]
    result = run_leaf(impl, op, leaf, prepared)
    assert result.verdict == "PASS", [o.detail for o in result.failed]
    props = {o.prop for o in result.checked}
    assert props == {"matches_oracle", "repeatable", "writes_every_output", "rejects_bad_arguments"}
    assert [o.ok for o in result.outcomes if o.prop == "survives_pending_error"] == [None]


@pytest.mark.parametrize("op", list(CATALOGUE.values()), ids=lambda op: op.name)
def test_cases_are_deterministic_and_cover_the_edges(op) -> None:
    leaf = op.leaves[0].name
    for cov in (1, 2, 3):
        a, b = op.cases(leaf, cov), op.cases(leaf, cov)
        assert a == b
        assert len({c.id for c in a}) == len(a), "case ids must be unique within a leaf"
    widths = {c.shape[-1] for c in op.cases(leaf, 2)}
    assert {2048, 2560, 4096, 5120, 8192, 14336} <= widths
    patterns = {c.pattern for c in op.cases(leaf, 1)}
    assert {"ties", "zero_block", "equal_abs", "outlier", "extreme", "subnormal", "nan", "inf", "nan_payload"} <= patterns
    first = op.cases(leaf, 1)[3]
    x1, x2 = op.make_inputs(first), op.make_inputs(first)
    assert all(x1[k].tobytes() == x2[k].tobytes() for k in x1)


@pytest.mark.parametrize("op", list(CATALOGUE.values()), ids=lambda op: op.name)
def test_oracle_rejects_bad_arguments_naming_the_argument(op) -> None:
    from qconform.errors import ArgumentError

    leaf = op.leaves[0].name
    for bad in op.bad_arguments(leaf):
        args, kwargs = op.call_args(bad.inputs, bad.params)
        with pytest.raises(ArgumentError) as err:
            op.oracle(*args, **kwargs, out=bad.bad_out)
        named = {"out"} if bad.bad_out is not None else set(op.input_names) | {"qtype"}
        assert any(str(err.value).startswith(f"{n}:") for n in named), str(err.value)

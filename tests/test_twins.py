"""The numpy spec and the numba twin are byte-identical, on the catalogue's strategies (every
special pattern) and with flush-to-zero on and off (where the oracle models it: an ``ftz`` parameter)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from qconform.ops import CATALOGUE, Case
from qconform.ops.spec import result_bytes

OPS = [op for op in CATALOGUE.values() if op.family == "ggml"]  # the ORT oracles have one backend


def _bits(a: np.ndarray | tuple[np.ndarray, ...]) -> bytes:
    return result_bytes(a)


def _ftz(op, ftz: bool) -> dict[str, bool]:
    """``ftz=`` for an oracle that models flush-to-zero; an oracle without it runs as it is."""
    return {"ftz": ftz} if "ftz" in inspect.signature(op.oracle).parameters else {}


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
@given(data=st.data(), ftz=st.booleans())
def test_twins_byte_identical(op, data, ftz: bool) -> None:
    leaf = op.leaves[0].name
    case: Case = data.draw(op.strategy(leaf))
    note(case.to_json())
    inputs = op.make_inputs(case)
    args, _ = op.call_args(inputs, op.params(case))
    spec = op.oracle(*args, backend="numpy", **_ftz(op, ftz))
    fast = op.oracle(*args, backend="numba", **_ftz(op, ftz))
    assert _bits(spec) == _bits(fast)


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_twins_on_coverage_3(op) -> None:
    leaf = op.leaves[0].name
    for case in op.cases(leaf, 3):
        inputs = op.make_inputs(case)
        args, _ = op.call_args(inputs, op.params(case))
        for ftz in (False, True) if _ftz(op, True) else (False,):
            assert _bits(op.oracle(*args, backend="numpy", **_ftz(op, ftz))) == _bits(
                op.oracle(*args, backend="numba", **_ftz(op, ftz))
            ), case.id

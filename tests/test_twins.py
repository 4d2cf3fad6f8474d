"""The numpy spec and the numba twin are byte-identical, on the catalogue's strategies (every
special pattern) and with flush-to-zero on and off."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from qconform.ops import CATALOGUE, Case

OPS = [op for op in CATALOGUE.values() if op.family == "ggml"]  # the ORT oracles have one backend


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
@given(data=st.data(), ftz=st.booleans())
def test_twins_byte_identical(op, data, ftz: bool) -> None:
    leaf = op.leaves[0].name
    case: Case = data.draw(op.strategy(leaf))
    note(case.to_json())
    inputs = op.make_inputs(case)
    args, _ = op.call_args(inputs, op.params(case))
    spec = op.oracle(*args, backend="numpy", ftz=ftz)
    fast = op.oracle(*args, backend="numba", ftz=ftz)
    assert _bits(spec) == _bits(fast)


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_twins_on_coverage_3(op) -> None:
    leaf = op.leaves[0].name
    for case in op.cases(leaf, 3):
        inputs = op.make_inputs(case)
        args, _ = op.call_args(inputs, op.params(case))
        for ftz in (False, True):
            assert _bits(op.oracle(*args, backend="numpy", ftz=ftz)) == _bits(
                op.oracle(*args, backend="numba", ftz=ftz)
            ), case.id

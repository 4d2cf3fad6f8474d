"""The check a bench makes before timing a baseline's fast form (qconform.bench.agreement): agreeing
forms pass with their bit-identical count; a fast form that computes something else (another set's
replay, a scaled output, a NaN) is stopped; another rounding of a few elements is not."""

import numpy as np
import pytest

from qconform.bench.agreement import REL_LIMIT, agreement, check_agreement


def _outputs(n: int = 4, seed: int = 3) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, 64)).astype(np.float16) for _ in range(n)]


def test_identical_forms_agree_bit_for_bit() -> None:
    want = _outputs()
    got = [w.copy() for w in want]
    assert agreement(got, want) == (4, 0.0)
    assert "4 of 4 bit-identical" in check_agreement(got, want, "graphs")


def test_another_rounding_of_one_element_passes_but_is_counted() -> None:
    want = _outputs()
    got = [w.copy() for w in want]
    bits = got[2].view(np.uint16)
    bits[0, 5] += 1  # one fp16 ulp
    same, worst = agreement(got, want)
    assert same == 3 and 0.0 < worst < REL_LIMIT
    check_agreement(got, want, "graphs")


def test_signed_zero_is_not_bit_identical_but_no_difference() -> None:
    want = [np.zeros((1, 8), np.float16)]
    got = [np.full((1, 8), -0.0, np.float16)]
    assert agreement(got, want) == (0, 0.0)


@pytest.mark.parametrize(
    "break_it",
    [
        lambda got: got.insert(0, got.pop()),  # each replay another set's graph
        lambda got: got.__setitem__(1, (got[1].astype(np.float32) * 1.05).astype(np.float16)),
        lambda got: got[3].__setitem__((0, 7), np.nan),
    ],
    ids=["another set's replay", "output scaled by 1.05", "a NaN"],
)
def test_a_fast_form_that_computes_something_else_is_stopped(break_it) -> None:
    want = _outputs()
    got = [w.copy() for w in want]
    break_it(got)
    with pytest.raises(ValueError, match="computes something else"):
        check_agreement(got, want, "graphs")


def test_any_difference_from_an_all_zero_output_is_stopped() -> None:
    zero = [np.zeros((1, 8), np.float32)]
    check_agreement([z.copy() for z in zero], zero, "graphs")
    with pytest.raises(ValueError, match="computes something else"):
        check_agreement([np.full((1, 8), 1e-30, np.float32)], zero, "graphs")


def test_mismatched_outputs_are_named() -> None:
    want = _outputs(2)
    with pytest.raises(ValueError, match=r"got\[1\]"):
        agreement([want[0], want[1].astype(np.float32)], want)
    with pytest.raises(ValueError, match="1 outputs for 2"):
        agreement(want[:1], want)

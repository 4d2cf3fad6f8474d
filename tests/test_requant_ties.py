"""The ``requant_ties_*`` patterns reach the K-quants' last rounding: many values sit on the .5 ties
of the scales the reference stores, and some where a reciprocal product rounds apart from the
quotient (mutants ``*_requant_by_reciprocal`` in mutants_ggml.py are caught by them)."""

from __future__ import annotations

import numpy as np
import pytest

from qconform.ops.ggml.requant_ties import REQUANT, quotients
from qconform.ops.patterns import make_values
from qconform.oracles.ggml import quantize
from qconform.oracles.ggml.kquant_search import nearest_int_k


@pytest.mark.parametrize("qtype", sorted(REQUANT))
def test_values_sit_on_ties_of_the_stored_scales(qtype: str) -> None:
    for seed in range(10):
        x = make_values(f"requant_ties_{qtype.lower()}", seed, 2, 512, 256)
        y = quantize(x, qtype)
        q = quotients(qtype, x, y)
        apart = nearest_int_k(q) != nearest_int_k(quotients(qtype, x, y, reciprocal=True))  # ggml's rounding
        assert (q - np.floor(q) == 0.5).mean() >= 0.2, (qtype, seed)
        assert apart.sum() >= 3, (qtype, seed)


def test_a_normal_input_has_next_to_no_ties() -> None:
    """The control: the share above is the pattern's, not the format's."""
    x = make_values("normal", 0, 2, 512, 256)
    for qtype in REQUANT:
        q = quotients(qtype, x, quantize(x, qtype))
        assert (q - np.floor(q) == 0.5).mean() < 0.01, qtype

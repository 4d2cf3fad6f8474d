"""The fp32-activation ring decode's error model (tests/nbits_f32_model.py) against the suite's
own per-element bound (strict contract, flush-to-zero as built): the split is within 2^-23 of
each activation near its row's maximum, the modelled kernel order stays far inside the bound on
the catalogue's cases it takes, and the one input family that breaks it (a spike 2^50 above the
rest of its row, on weights that are zero) is named."""

from __future__ import annotations

import numpy as np
import pytest
from nbits_f32_model import LO_SHIFT, ring_f32, split

from qconform.contracts import STRICT
from qconform.ops import CATALOGUE
from qconform.properties.bounds import budget

OP = CATALOGUE["matmul_nbits"]


def _worst(inputs: dict, params: dict, **kw) -> float:
    got = ring_f32(
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
        for extra in (0, None):  # the tensor core truncating at the largest addend's ulp; IEEE sums
            assert _worst(OP.make_inputs(case), params, extra=extra, wk_n=2) < 0.02, case


def test_a_spike_far_above_its_row_on_zero_weights_breaks_the_bound() -> None:
    """The split's absolute floor is 2^-25 of the prescaled row (max in [2^14, 2^15)): an element
    2^50 above the rest, on weights q = z, leaves outputs whose magnitude the floor exceeds."""
    rng = np.random.default_rng(3)
    K, N, bits = 1024, 16, 2
    B = rng.integers(0, 256, (N, K // 64, 16), dtype=np.uint8)
    B[:, 0, 0] = (B[:, 0, 0] & 0xFC) | 2  # k = 0: q = 2 = the default zero point in every row
    scales = (rng.uniform(0.5, 2.0, (N, K // 64)) * 2.0**-4).astype(np.float32)
    params = {"K": K, "bits": bits, "block_size": 64}
    for spike, broken in ((2.0**30, False), (2.0**50, True)):
        A = rng.standard_normal((1, K)).astype(np.float32)
        A[0, 0] = spike
        assert (_worst({"A": A, "B": B, "scales": scales}, params) > 1) == broken

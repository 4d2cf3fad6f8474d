"""gemm_4bit's matrix-unit kernel (``bnb/gemm_mma.hip``) modelled in numpy (tests/bnb_mma_model.py:
its per-lane loads and fragments, PTX's mma fragment layout, the K split and the warp-order
reduction) passes the suite's own check (the op's bound, default contract) on the fp16 and bf16
catalogue cases the kernel takes (K % blocksize == 0, M <= 16), and each of the device
catalogue's "bnb mma" mutants, modelled the same way, fails it."""

from __future__ import annotations

import numpy as np
import pytest
from bnb_mma_model import MUTANTS, gemm_mma

from qconform.contracts import STRICT
from qconform.ops import CATALOGUE
from qconform.ops.bnb._common import from_f32, to_values
from qconform.properties.compare import compare
from qconform.properties.expect import expectations
from qconform.readings import Expected

OP = CATALOGUE["gemm_4bit"]
LEAVES = ("Xfp16_W4_Yfp16", "Xbf16_W4_Ybf16")


def _taken(leaf: str, coverage: int, max_k: int) -> list:
    """The leaf's cases the kernel takes, K at most max_k (the model loops per lane)."""
    return [
        c for c in OP.cases(leaf, coverage) if c.shape[0] <= 16 and c.params["K"] % c.params["blocksize"] == 0
        and c.params["K"] <= max_k and c.shape[2] <= 128
    ]  # fmt: skip


def _verdict(case, mutant: str | None = None, build: str = "prmt") -> tuple[bool, str]:
    inputs, params = OP.make_inputs(case), OP.params(case)
    dtype, (M, K, N) = params["dtype"], case.shape
    bias = inputs.get("bias")
    got = gemm_mma(
        to_values(inputs["A"], dtype).reshape(M, K), inputs["B"], inputs["absmax"],
        None if bias is None else to_values(bias, dtype), N, K, params["blocksize"], params["quant_type"], dtype,
        mutant, build,
    )  # fmt: skip
    got = from_f32(got, dtype)
    details = []
    e: Expected
    for e in expectations(OP, inputs, params, STRICT, None):
        c = compare(OP, params, got, e.want, e, STRICT)
        if c.ok:
            return True, ""
        details.append(c.detail)
    return False, details[0]


@pytest.mark.parametrize("build", ["prmt", "tab16"])
@pytest.mark.parametrize("leaf", LEAVES)
def test_model_within_the_bound(leaf: str, build: str) -> None:
    cases = _taken(leaf, 2, 4096)
    assert {c.shape[0] for c in cases} >= {1, 2, 3, 4, 5, 6, 7, 8, 12, 16}, "M = 1..16, one and two n-tiles"
    for c in cases:
        ok, detail = _verdict(c, build=build)
        assert ok, (c.id, detail)


@pytest.mark.parametrize("mutant", MUTANTS)
def test_model_mutants_caught(mutant: str) -> None:
    """Each mutant fails on some case the kernel takes (the second n-half only exists for M > 8)."""
    cases = [c for c in _taken("Xfp16_W4_Yfp16", 2, 4096) if mutant != "second n-half dropped" or c.shape[0] > 8]
    assert cases
    assert any(not _verdict(c, mutant)[0] for c in cases), mutant


def test_model_matches_exactly_rounded_sums_somewhere() -> None:
    """A sanity check of the model itself: on a case with K = 256 most outputs equal the oracle's
    exactly rounded reference (the fp32 sums of 256 terms rarely move the rounding to T)."""
    (c,) = [c for c in OP.cases("Xfp16_W4_Yfp16", 1) if c.shape == (1, 256, 16)]
    inputs, params = OP.make_inputs(c), OP.params(c)
    (e, *_) = expectations(OP, inputs, params, STRICT, None)
    got = gemm_mma(
        to_values(inputs["A"], "float16").reshape(1, 256), inputs["B"], inputs["absmax"],
        to_values(inputs["bias"], "float16"), 16, 256, params["blocksize"], params["quant_type"], "float16",
    )  # fmt: skip
    assert np.mean(from_f32(got, "float16") == e.want) >= 0.75


def test_both_tables_decode_the_same_weights() -> None:
    """The CUDA build's 32-copy table (PRMT offsets) and the 16-copy one (shift and mask) give the same
    output bits on a two n-tile case; the PRMT mutant's do not."""
    (c,) = [c for c in _taken("Xfp16_W4_Yfp16", 2, 4096) if c.shape[0] == 12][:1]
    inputs, params = OP.make_inputs(c), OP.params(c)
    (M, K, N), bias = c.shape, inputs.get("bias")
    bias = None if bias is None else to_values(bias, "float16")
    args = (to_values(inputs["A"], "float16").reshape(M, K), inputs["B"], inputs["absmax"], bias, N, K,
            params["blocksize"], params["quant_type"], "float16")  # fmt: skip
    prmt, tab16 = gemm_mma(*args, build="prmt"), gemm_mma(*args, build="tab16")
    assert np.array_equal(prmt, tab16)
    assert not np.array_equal(gemm_mma(*args, mutant="PRMT offset of the byte beside"), prmt)

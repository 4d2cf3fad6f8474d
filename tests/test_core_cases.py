"""Kernel-shaped "core" cases: every leaf's case list holds, beside its edge shapes, shapes that
production kernels accept (seeds 400..499; pattern ``core`` where an op's pattern is only a
label), a few at coverage 1 and more from coverage 2, as the case lists' docstrings say."""

from __future__ import annotations

import pytest

from qconform.ops import CATALOGUE

TOKENS = {1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64}  # M: decode rows and small prefill tiles
LEAVES = [(op, lf.name) for op in CATALOGUE.values() for lf in op.leaves]


def core(op, leaf: str, coverage: int) -> list:
    return [c for c in op.cases(leaf, coverage) if 400 <= c.seed < 500]


@pytest.mark.parametrize("op,leaf", LEAVES, ids=[f"{op.name}-{leaf}" for op, leaf in LEAVES])
def test_every_leaf_has_a_core_set_that_grows_with_coverage(op, leaf: str) -> None:
    c1, c2, c3 = ({c.id for c in core(op, leaf, c)} for c in (1, 2, 3))
    assert c1 and len(c2) > len(c1), (len(c1), len(c2))
    assert c1 <= c2 <= c3
    assert {c.id for c in op.cases(leaf, 2)} - c2, "the edge cases are kept"
    if op.name not in ("dequantize_nbits", "gather_block_quantized"):  # shape[0]: rows of A / tokens
        assert all(c.shape[0] in TOKENS for c in core(op, leaf, 2))


def _gemv_accepts(M: int, K: int, N: int, bs: int) -> bool:
    """The shape rules of ONNX Runtime's CUDA MatMulNBits GEMVs (microsoft/onnxruntime
    contrib_ops/cuda/quantization: matmul_4bits.cu TryMatMul4Bits refuses n % 8 or k % 8 and
    dispatches blocks 16..128; matmul_8bits.cu TryMatMul8Bits also wants 256 % block_size == 0
    and k % block_size == 0), without their M limit (M = 1 there; the batched kernels take more)."""
    return N % 8 == 0 and K % 8 == 0 and K % bs == 0 and 256 % bs == 0


def test_matmul_nbits_core_is_kernel_shaped_and_covers_the_knobs() -> None:
    op = CATALOGUE["matmul_nbits"]
    for leaf in op.leaves:
        cov2 = core(op, leaf.name, 2)
        assert len(core(op, leaf.name, 1)) == 3 and len(cov2) == 22
        for c in cov2:
            M, K, N = c.shape
            bs = c.params["block_size"]
            assert c.pattern == "core" and _gemv_accepts(M, K, N, bs) and K % 128 == 0 and N % 16 == 0, c.id
        assert {c.shape[0] for c in cov2} == TOKENS
        assert {c.params["block_size"] for c in cov2} == {16, 32, 64, 128, 256}
        assert {c.params["zp"] for c in cov2} == {"none", "packed", "float", "uniform", "scalar"}
        assert any(c.params.get("bias") for c in core(op, leaf.name, 1))
        level4 = [c for c in cov2 if c.params.get("accuracy_level") == 4]
        assert level4 and all(c.params["zp"] in ("none", "packed") for c in level4)  # ORT's int8 path
    dq = CATALOGUE["dequantize_nbits"]
    for c in core(dq, dq.leaves[0].name, 2):
        K, N = c.shape
        assert _gemv_accepts(1, K, N, c.params["block_size"]) and "bias" not in c.params, c.id


def test_the_other_ops_core_shapes() -> None:
    g = CATALOGUE["gather_block_quantized"]
    for c in core(g, "Xi64_Wu4_Yfp16", 2):
        rows, cols, n = c.shape
        bs = c.params["block_size"]
        assert rows % 16 == 0 and cols % 128 == 0 and cols % bs == 0 and bs in (16, 32, 64, 128) and n in TOKENS
    for c in core(CATALOGUE["qswiglu"], "Xu8_Yu8", 2):
        assert c.shape[1] % 128 == 0
    fq = CATALOGUE["fake_quantize"]
    for leaf in fq.leaves:
        for c in core(fq, leaf.name, 2):
            assert c.pattern == "ties" and c.shape[1] % 128 == 0
        assert {c.pattern for c in fq.cases(leaf.name, 1)} == {"ties", "ties_npot", "any_scale", "specials"}
    for name in ("q8_0_quant", "q8_k_quant", "q8_0_dequant", "q8_k_dequant"):
        op = CATALOGUE[name]
        leaf = op.leaves[0].name
        assert all(c.shape[1] % 256 == 0 for c in core(op, leaf, 2))
        assert "ties_npot-2x512-s1000" in {c.id for c in op.cases(leaf, 1)}

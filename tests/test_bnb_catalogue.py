"""The bitsandbytes catalogue entries (qconform.ops.bnb): what their cases hold, the size of the
coverage-1 cases (the golden set), the variant a contract selects, the numpy/numba twins through
the catalogue's strategies, and the ABI's C prototype."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from qconform.cli import main
from qconform.contracts import parse_contract
from qconform.impls import CallableImpl
from qconform.ops import CATALOGUE
from qconform.oracles.bnb import BLOCKSIZES
from qconform.properties import Prepared, run_leaf

OPS = [op for op in CATALOGUE.values() if op.family == "bnb"]
LEAVES = [(op, lf.name) for op in OPS for lf in op.leaves]
GOLDEN_LEAF_BUDGET = 40_000  # bytes of inputs and outputs per leaf at coverage 1 (the committed golden set)


def _n_and_bs(case) -> tuple[int, int]:
    """(values the blocks run over, blocksize) of a quantize / decode / nested case."""
    return int(np.prod(case.shape)), case.params["blocksize"]


def test_the_family_is_registered() -> None:
    assert [op.name for op in OPS] == [
        "nf4_quantize",
        "fp4_quantize",
        "nf4_decode",
        "fp4_decode",
        "nested_absmax",
        "gemm_4bit",
    ]


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_cases_cover_what_the_issue_asks(op) -> None:
    for leaf in op.leaves:
        cov1, cov2, cov3 = (op.cases(leaf.name, c) for c in (1, 2, 3))
        assert {c.id for c in cov1} <= {c.id for c in cov2} <= {c.id for c in cov3}
        if op.name == "gemm_4bit":
            assert {1, 2, 4, 8, 16, 64} <= {c.shape[0] for c in cov2}
            assert set(BLOCKSIZES) <= {c.params["blocksize"] for c in cov2}
            assert any(c.params["K"] % c.params["blocksize"] for c in cov1), "K not a multiple of the blocksize"
            assert {c.params["quant_type"] for c in cov1} == {"nf4", "fp4"}
            assert any(c.params.get("bias") for c in cov1) and any(not c.params.get("bias") for c in cov1)
            assert {(4096, 512), (2048, 768)} <= {c.shape[1:] for c in cov2}
            assert (4096, 14336) in {c.shape[1:] for c in cov3}
            continue
        assert set(BLOCKSIZES) <= {c.params["blocksize"] for c in cov2}
        assert any(n % bs for n, bs in map(_n_and_bs, cov1)), "a partial block"
        shapes2, shapes3 = {c.shape for c in cov2}, {c.shape for c in cov3}
        assert {(4096, 512), (2048, 768)} <= shapes2 and (4096, 14336) in shapes3 | shapes2
        if op.name.endswith("_quantize"):
            assert {"midpoints", "zero_block", "nan"} <= {c.pattern for c in cov1}
            assert {"inf", "subnormal", "extreme", "nan_payload"} <= {c.pattern for c in cov2}
            assert any(n % 2 for n, _ in map(_n_and_bs, cov1)), "an odd n: the pad nibble"
        if op.name.endswith("_decode"):
            assert {"random", "special_absmax", "quantized"} <= {c.pattern for c in cov1}
            assert any(c.shape[1] % 2 for c in cov1), "an odd last dimension: the CPU backend's Python path"
        if op.name == "nested_absmax":
            assert {"quantized", "random", "special"} <= {c.pattern for c in cov1}
            assert any(-(-n // bs) % 256 for n, bs in map(_n_and_bs, cov1)), "a partial 256-block of absmax2"


@pytest.mark.parametrize("op,leaf", LEAVES, ids=[f"{op.name}-{leaf}" for op, leaf in LEAVES])
def test_coverage_1_is_small_enough_for_the_golden_set(op, leaf: str) -> None:
    total = 0
    for case in op.cases(leaf, 1):
        p = Prepared.from_case(op, case)
        total += sum(np.asarray(v).nbytes for v in p.inputs.values()) + p.want.nbytes
    assert total < GOLDEN_LEAF_BUDGET, total


def _variant_impl(op, computes: str) -> CallableImpl:
    """The oracle computing ``computes``, declared to follow bitsandbytes' CUDA kernels."""
    impl = CallableImpl(f"oracle-{computes}", functools.partial(op.oracle, variant=computes), (op.name,))
    impl.contract = parse_contract("variant=cuda")
    return impl


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_variant_cuda_is_selected_by_the_contract(op) -> None:
    """Under ``variant=cuda`` the oracle's cuda variant passes every leaf; the cpu one fails where the
    backends disagree (docs/bnb-4bit.md 2.3: NaN, zero blocks, the thresholds; FP4's -0; the SIMT
    kernel's double rounding; flush-to-zero of the nested product)."""
    disagree = {
        "nf4_quantize": {"nan", "zero_block", "zero_tail", "midpoints"},
        "fp4_quantize": {"nan", "zero_block", "zero_tail", "midpoints"},
        "nf4_decode": {"special_absmax"},
        "fp4_decode": {"random"},
        "nested_absmax": {"special"},
        "gemm_4bit": {"normal"},
    }[op.name]
    for leaf in op.leaves:
        for computes in ("cuda", "cpu"):
            impl = _variant_impl(op, computes)
            prepared = [Prepared.from_case(op, c, impl) for c in op.cases(leaf.name, 1)]
            r = run_leaf(impl, op, leaf.name, prepared, repeat_calls=3)
            failed = {o.case.split("-")[0] for o in r.failed if o.prop == "matches_oracle"}
            if computes == "cuda":
                assert r.verdict == "PASS", [o.detail for o in r.failed]
            elif op.name == "nf4_quantize" and leaf.name != "Xfp32_Ynf4":
                assert failed == {"nan", "zero_block", "zero_tail"}, failed  # fp16/bf16 cannot hold NF4's thresholds
            elif op.name == "nf4_decode" and leaf.name == "Xnf4_Yfp16":
                assert not failed  # an fp16 output hides flush-to-zero and bf16's NaN rule
            elif op.name == "gemm_4bit" and leaf.name == "Xfp32_W4_Yfp32":
                assert not failed  # fp32: the SIMT kernel's weights are the CPU path's, its FMA within the bound
            else:
                assert disagree <= failed, (leaf.name, failed)


def test_the_strict_contract_reads_the_cpu_variant() -> None:
    op = CATALOGUE["nf4_quantize"]
    case = next(c for c in op.cases("Xfp32_Ynf4", 1) if c.pattern == "nan")
    strict = Prepared.from_case(op, case)
    assert strict.expected[0].plain and strict.expected[0].label == "bitsandbytes cpu"
    assert np.array_equal(strict.want, op.oracle(strict.inputs["A"], case.params["blocksize"], variant="cpu"))
    cuda = Prepared.from_case(op, case, _variant_impl(op, "cuda"))
    assert not cuda.expected[0].plain and not np.array_equal(cuda.want, strict.want)


TWINS = [(op, lf.name) for op in OPS if op.name.endswith(("_quantize", "_decode")) for lf in op.leaves]


@pytest.mark.parametrize("op,leaf", TWINS, ids=[f"{op.name}-{leaf}" for op, leaf in TWINS])
@settings(max_examples=25, deadline=None)
@given(data=st.data(), variant=st.sampled_from(("cpu", "cuda")), ftz=st.booleans())
def test_twins_byte_identical_through_the_catalogue(op, leaf: str, data, variant: str, ftz: bool) -> None:
    case = data.draw(op.strategy(leaf))
    note(case.to_json())
    args, kw = op.call_args(op.make_inputs(case), op.params(case))
    spec = op.oracle(*args, **kw, variant=variant, ftz=ftz, backend="numpy")
    fast = op.oracle(*args, **kw, variant=variant, ftz=ftz, backend="numba")
    assert spec.tobytes() == fast.tobytes()


@pytest.mark.parametrize("op,leaf", LEAVES, ids=[f"{op.name}-{leaf}" for op, leaf in LEAVES])
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_every_drawn_case_builds_and_binds(op, leaf: str, data) -> None:
    """The strategies draw only cases the inputs can be built for (the smallest shapes included), and
    each binds to the ABI with the oracle's output shape."""
    case = data.draw(op.strategy(leaf))
    note(case.to_json())
    p = Prepared.from_case(op, case)
    b = op.abi.bind(*op.call_args(p.inputs, p.params))
    assert tuple(b.out_shape) == p.want.shape and np.dtype(b.out_dtype) == p.want.dtype


def test_quantize_output_layout_and_decoding() -> None:
    """y = the float32 absmax of every block, then the codes; decoding it gives what nf4_decode gives."""
    q, d = CATALOGUE["nf4_quantize"], CATALOGUE["nf4_decode"]
    A = np.linspace(-3, 5, 3 * 333, dtype=np.float32).reshape(3, 333)
    y = q.oracle(A, 128)
    nb = -(-A.size // 128)
    assert y.dtype == np.uint8 and y.shape == (4 * nb + (A.size + 1) // 2,)
    absmax = y[: 4 * nb].view("<f4")
    assert np.array_equal(absmax, np.abs(np.pad(A.reshape(-1), (0, nb * 128 - A.size))).reshape(nb, 128).max(axis=1))
    params = {"rows": 3, "cols": 333, "blocksize": 128}
    back = d.oracle(y[4 * nb :], absmax.copy(), **params, dtype="float32")
    assert np.array_equal(q.decode(y, params)[: A.size].astype(np.float32), back.reshape(-1))  # exact products


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_cli_abi_prints_the_prototype(op, capsys) -> None:
    assert main(["abi", op.name]) == 0
    out = capsys.readouterr().out
    assert 'extern "C" __global__ void symbol(' in out
    for arg in op.abi.args:
        assert arg.name in out, arg.name

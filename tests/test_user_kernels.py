"""The worked user kernels of examples/ (tests/user_kernels.py): offline, the PyTorch drop-in's
dequantization against the oracle (on numpy: no torch, no GPU), the twins broken in exactly one
marked place, the table's specs well formed, and a tolerance failure naming its element; with a
GPU (marker ``device``), every entry of the table through the whole suite."""

from __future__ import annotations

import difflib
import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from user_kernels import ENTRIES, GEMV_REQUIRES, NAMES_ELEMENT, REPO, UserKernel, build_all, run_entry, verdict

from qconform.ops import get_op
from qconform.oracles.ort import dequantize_nbits
from qconform.properties.checks import Prepared
from qconform.properties.compare import compare

TORCH_DIR = REPO / "examples/torch_dropin"


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"user_kernel_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _weights(op_name: str, coverage: int = 2) -> list[tuple[str, str, tuple, dict[str, Any]]]:
    """(leaf, case id, (B, scales, zero_points), dequantize kwargs) of every case of the op."""
    op = get_op(op_name)
    out = []
    for leaf in op.leaves:
        for case in op.cases(leaf.name, coverage):
            args, kw = op.call_args(op.make_inputs(case), op.params(case))
            weights = args[1:4] if op_name == "matmul_nbits" else args[:3]
            keep = {k: kw[k] for k in ("K", "N", "bits", "block_size", "form") if k in kw}
            out.append((leaf.name, case.id, weights, keep))
    return out


@pytest.mark.parametrize("op_name", ["matmul_nbits", "dequantize_nbits"])
def test_torch_dropin_dequantizes_as_the_oracle(op_name: str) -> None:
    """The drop-in's dequantize() (framework-agnostic, here on numpy) is the oracle's W bit for bit
    on every case: every bit width, zero-point kind and form, K not a multiple of the block."""
    example = _load(TORCH_DIR / "matmul_nbits_torch.py")
    cases = _weights(op_name)
    assert {kw.get("form", "ort") for *_, kw in cases} == {"ort", "kernel"}
    for leaf, case_id, (B, scales, zp), kw in cases:
        want = dequantize_nbits(B, scales, zp, **kw)
        got = example.dequantize(example.NumpyOps, B, scales, zp, **kw)
        assert got.dtype == np.float32 and got.shape == want.shape, (leaf, case_id)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (leaf, case_id)


def test_torch_dropin_product_within_the_ops_bound() -> None:
    """Y = A @ W^T (+ bias) in fp32 from that W, rounded once to A's dtype (what the drop-in does
    in torch), passes the op's own comparison on the coverage-1 cases of every leaf."""
    example = _load(TORCH_DIR / "matmul_nbits_torch.py")
    op = get_op("matmul_nbits")
    for leaf in op.leaves:
        for case in op.cases(leaf.name, 1):
            if case.params.get("g_idx"):
                continue  # (the drop-in declines g_idx)
            p = Prepared.from_case(op, case)
            (A, B, scales, zp, _, bias), kw = op.call_args(p.inputs, p.params)
            keep = {k: kw[k] for k in ("K", "N", "bits", "block_size", "form") if k in kw}
            W = example.dequantize(example.NumpyOps, B, scales, zp, **keep)
            y = A.reshape(-1, kw["K"]).astype(np.float32) @ W.T
            if bias is not None:
                y = y + bias.astype(np.float32)
            got = y.astype(A.dtype).reshape(p.want.shape)
            c = p.verify(op, got)
            assert c.ok, (leaf.name, case.id, c.detail)


def test_torch_twin_is_wrong_where_its_docstring_says() -> None:
    """The twin's W differs from the oracle's exactly on the cases without zero points whose bit
    width is not 4, and the twin's table entry selects only leaves where it does."""
    twin = _load(TORCH_DIR / "matmul_nbits_torch_wrong.py")
    differs = set()
    for leaf, case_id, (B, scales, zp), kw in _weights("matmul_nbits", 1):
        want = dequantize_nbits(B, scales, zp, **kw)
        got = twin.dequantize(twin.NumpyOps, B, scales, zp, **kw)
        same = np.array_equal(got.view(np.uint32), want.view(np.uint32))
        assert same == (zp is not None or kw["bits"] == 4), (leaf, case_id)
        if not same:
            differs.add(leaf)
    (entry,) = [e for e in ENTRIES if e.source.endswith("matmul_nbits_torch_wrong.py")]
    assert set(entry.leaves) <= differs


@pytest.mark.parametrize(
    "correct,twin",
    [
        ("examples/hip_kernel/matmul_nbits_u2_gemv.hip", "examples/hip_kernel/matmul_nbits_u2_gemv_wrong.hip"),
        ("examples/hip_kernel/q4_0_dequant.hip", "examples/hip_kernel/q4_0_dequant_wrong.hip"),
        ("examples/hip_kernel/gqa_decode_naive.hip", "examples/hip_kernel/gqa_decode_naive_wrong.hip"),
        (
            "examples/so_launcher/gather_block_quantized_launcher.cu",
            "examples/so_launcher/gather_block_quantized_launcher_wrong.cu",
        ),
        ("examples/so_launcher/qmoe_launcher.cu", "examples/so_launcher/qmoe_launcher_wrong.cu"),
    ],
)
def test_twin_source_differs_in_one_marked_line(correct: str, twin: str) -> None:
    """A twin is its kernel plus a leading comment, with exactly one line changed, marked BUG."""
    a = (REPO / correct).read_text().splitlines()
    b = (REPO / twin).read_text().splitlines()
    header = next(i for i, line in enumerate(b) if line.endswith("*/")) + 1
    assert b[0].startswith("/* WRONG TWIN of ")
    removed = [x for x in difflib.ndiff(a, b[header:]) if x.startswith("- ")]
    added = [x for x in difflib.ndiff(a, b[header:]) if x.startswith("+ ")]
    assert len(removed) == 1 and len(added) == 1, (removed, added)
    assert "BUG" in added[0] and "BUG" not in removed[0]


def test_table_is_well_formed() -> None:
    """Every entry's source exists, its op and leaves are in the catalogue, each correct kernel
    has a twin on the same op; requires= is true on a plain u2 case and false at accuracy_level 4."""
    for e in ENTRIES:
        assert (REPO / e.source).is_file(), e.source
        op = get_op(e.op)
        assert set(e.leaves) <= {leaf.name for leaf in op.leaves}, e.name
        assert e.expect in ("PASS", "matches_oracle", "survives_pending_error")
        spec = e.impl_spec({e.source: Path("/lib.so")})
        assert spec.startswith(f"{e.kind}:") and f":{e.symbol}" in spec
    passes = [e for e in ENTRIES if e.expect == "PASS"]
    twins = [e for e in ENTRIES if e.expect != "PASS"]
    assert len(passes) == len(twins) == 7
    for e in passes:
        assert any(t.op == e.op and t.kind == e.kind for t in twins), e.name
    op = get_op("matmul_nbits")
    seen = set()
    for case in op.cases("Xfp16_Wu2_Yfp16", 2):
        params = op.params(case)
        if params.get("g_idx"):
            continue  # (the ABI declines g_idx)
        scalars = op.abi.bind(*op.call_args(op.make_inputs(case), params)).scalars
        ok = eval(GEMV_REQUIRES, {"__builtins__": {}}, dict(scalars))  # noqa: S307 - our own expression
        assert ok == (params.get("accuracy_level", 0) < 4)
        seen.add(ok)
    assert seen == {True, False}


def test_tolerance_failure_names_its_element() -> None:
    """A bound failure (matmul_nbits) names the output furthest out of its bound, in the form the
    table's twin check looks for; an exact failure (gather) names its first differing element."""
    op = get_op("matmul_nbits")
    p = Prepared.from_case(op, op.cases("Xfp32_Wu2_Yfp32", 1)[0])
    got = p.want.copy()
    got[0, 2] += 100.0
    c = p.verify(op, got)
    assert not c.ok and "worst at [0, 2]" in c.detail and NAMES_ELEMENT.search(c.detail), c.detail
    assert not NAMES_ELEMENT.search(p.verify(op, p.want.copy()).detail)
    gather = get_op("gather_block_quantized")
    q = Prepared.from_case(gather, gather.cases("Xi64_Wu4_Yfp16", 1)[0])
    bad = q.want.copy()
    bad[1, 5] = 0
    c = compare(gather, q.params, bad, q.want)
    assert not c.ok and re.search(r"first at \[1, 5\]", c.detail) and NAMES_ELEMENT.search(c.detail), c.detail


def test_pending_error_twin_needs_the_planted_error() -> None:
    """A twin expected to fail survives_pending_error is as expected only when that property fails
    about the foreign error the suite planted; a pass, or a failure for another reason, is not."""
    from qconform.properties.checks import Outcome
    from qconform.properties.suite import LeafResult

    (twin, *_) = [e for e in ENTRIES if e.expect == "survives_pending_error"]
    leaf = twin.leaves[0]

    def result(ok: bool, detail: str) -> LeafResult:
        r = LeafResult(twin.op, leaf, "sm_90", "so:lib.so:qmoe_launcher")
        r.outcomes += [Outcome("matches_oracle", twin.op, leaf, "c0", True, "exact")]
        r.outcomes += [Outcome("survives_pending_error", twin.op, leaf, "fresh", ok, detail)]
        return r

    planted = "with a foreign cudaErrorInvalidConfiguration pending (libcudart.so.13) the call failed: DeviceError"
    assert verdict(twin, result(False, planted))[0]
    assert not verdict(twin, result(True, "status and output unaffected by a foreign error pending"))[0]
    assert not verdict(twin, result(False, "a deliberately bad call reported success: status 0"))[0]


# ------------------------------------------------------------------------------- with a GPU


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return build_all(tmp_path_factory.mktemp("user-so"))


@pytest.mark.device
@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_user_kernel(entry: UserKernel, built: dict) -> None:
    if entry.kind == "py":
        pytest.importorskip("torch")
    results = run_entry(entry, built)
    outcomes = [(leaf, *verdict(entry, r)) for leaf, r in zip(entry.leaves, results, strict=True)]
    assert all(ok for _, ok, _ in outcomes), [f"{leaf}: {what}" for leaf, ok, what in outcomes if not ok]

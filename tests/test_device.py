"""Device suite (marker ``device``; skipped without a GPU): every device kernel through every
property, the launchers' argument rules, the device mutants caught and the controls passing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from device_catalogue import ALL, DeviceMutant, build_all, context_lost, run_in_fresh_process, run_mutant, verdict

from qconform.device.registry import GGML_KERNELS, KERNELS
from qconform.errors import ArgumentError
from qconform.ops import CATALOGUE, get_op
from qconform.ops.ort.fake_quantize import ALONG_ROWS
from qconform.oracles.ort.qdq import FP8_TYPES
from qconform.properties.checks import Prepared
from qconform.properties.suite import run_leaf

pytestmark = pytest.mark.device


def _own_kernels() -> list[tuple[str, str, str]]:
    """(impl, op, leaf) for every leaf of every op qconform ships a kernel for (from the registry
    and the catalogue: a new op is picked up by being registered); ``cupy:<variant>`` for ops with
    several kernels of their ABI."""
    out = []
    for op in CATALOGUE.values():
        specs = [k for k in KERNELS if k.op == op.name]
        if not specs:
            continue
        covered = set().union(*(k.leaves or [lf.name for lf in op.leaves] for k in specs))
        variants = sorted({k.variant for k in GGML_KERNELS if k.op == op.name})
        for impl in ["cupy", *(f"cupy:{v}" for v in variants[1:] if len(variants) > 1)]:
            out += [(impl, op.name, lf.name) for lf in op.leaves if lf.name in covered]
    return out


OWN = _own_kernels()


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return build_all(tmp_path_factory.mktemp("so"))


@pytest.mark.parametrize("impl_name,op_name,leaf", OWN, ids=[f"{get_op(x[1]).family}-" + "-".join(x) for x in OWN])
def test_own_kernel_passes_every_property(impl_name: str, op_name: str, leaf: str) -> None:
    """Every property at coverage 2 (1 for the ONNX Runtime family: its cases are larger), cold
    input sets on each cold op's first leaf (the others share its kernels)."""
    from qconform.impls import load_impl

    impl = load_impl(impl_name)
    op = get_op(op_name)
    cold = op.cold_repeat and leaf == op.leaves[0].name
    prepared = [Prepared.from_case(op, c, impl) for c in op.cases(leaf, 2 if op.family == "ggml" else 1)]
    result = run_leaf(impl, op, leaf, prepared, repeat_calls=129 if cold else 33, cold=cold)
    assert result.verdict == "PASS", [o.detail for o in result.failed][:3]
    declined = {o.case for o in result.declined}
    assert declined == {c.case.id for c in prepared if not _handles(op_name, c.case)}, "declined only its stated limits"
    props = {o.prop: o for o in result.outcomes}
    assert props["survives_pending_error"].ok is not False, props["survives_pending_error"].detail
    assert "WARNING" not in props["survives_pending_error"].detail
    if cold:
        sized = {c.id for c in op.cases(leaf, 2)}
        extra = [o for o in result.outcomes if o.prop == "matches_oracle" and o.case not in sized]
        assert len(extra) >= 3, "the cold input sets were checked against the oracle"


def _passes_at_coverage_2(op_name: str, leaf: str, contract: str = "") -> tuple[Any, list[Prepared]]:
    """Every property of ``leaf`` at coverage 2 with qconform's kernels (``--impl cupy``, under
    ``contract`` if given), 9 repeat calls bit-identical; the leaf's result and its prepared cases."""
    from qconform.impls import load_impl

    impl = load_impl("cupy", contract=contract) if contract else load_impl("cupy")
    op = get_op(op_name)
    prepared = [Prepared.from_case(op, c, impl) for c in op.cases(leaf, 2)]
    result = run_leaf(impl, op, leaf, prepared, repeat_calls=9, cold=False)
    assert result.verdict == "PASS", [o.detail for o in result.failed][:3]
    return result, prepared


def _launches(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[list, Any]:
    """The launches one call of ``fn`` makes, in order, and its output buffers (never written: the
    launches are recorded instead of run, ``qconform.device.launch.record``)."""
    from qconform.device.launch import record

    return record(fn, *args, **kwargs)


def _recorded(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[list, Any]:
    """The kernels one call of ``fn`` launches, in order (recorded, not run), and its output buffers."""
    launches, out = _launches(fn, *args, **kwargs)
    return [launch.kernel for launch in launches], out


def _device(inputs: dict[str, np.ndarray]) -> dict[str, Any]:
    """A case's inputs copied to the device (fresh copies: a call may write into its inputs)."""
    import cupy

    return {k: cupy.asarray(v) for k, v in inputs.items()}


def _launched(fn: Callable[..., Any], op_name: str, case: Prepared, **extra: Any) -> tuple[list, Any]:
    """The kernels ``fn`` launches on ``case``'s inputs (copied to the device), and its output
    buffers (recorded, not run: never written)."""
    args, kwargs = get_op(op_name).call_args(_device(case.inputs), case.params)
    return _recorded(fn, *args, **extra, **kwargs)


def _nbits_call(case: Any, bits: int) -> tuple[dict, dict, tuple, dict]:
    """A matmul_nbits case's inputs and params (with ``bits``), and its call's arguments on the device."""
    import cupy

    op = get_op("matmul_nbits")
    inputs, params = op.make_inputs(case), {**case.params, "bits": bits}
    args, kwargs = op.call_args({k: cupy.asarray(v) for k, v in inputs.items()}, params)
    return inputs, params, args, kwargs


def _spike(leaf: str, bits: int, keep: Callable[[Any], bool]) -> tuple[Any, dict, dict, tuple, dict]:
    """matmul_nbits's one coverage-2 ``spike`` case of ``leaf`` that ``keep`` picks: the case, its
    inputs and params, and its call's arguments on the device."""
    (case,) = [c for c in get_op("matmul_nbits").cases(leaf, 2) if c.pattern == "spike" and keep(c)]
    return case, *_nbits_call(case, bits)


def _repeatable_within_bound(
    fn: Callable[..., Any], args: tuple, kwargs: dict, inputs: dict, params: dict, contract: str = "strict"
) -> None:
    """Three calls bit-identical, the answer within matmul_nbits's bound under ``contract`` (the
    strict one unless said) element by element."""
    import cupy

    from qconform.contracts import parse_contract
    from qconform.properties.bounds import budget

    rule = parse_contract(contract)
    got = [cupy.asnumpy(fn(*args, **kwargs)) for _ in range(3)]
    assert all(g.tobytes() == got[0].tobytes() for g in got[1:])
    (exp,) = get_op("matmul_nbits").numerics(inputs, params, rule, True)
    bound = budget(exp.model, rule, True).bound(exp.model)
    err = np.abs(got[0].astype(np.float64) - exp.model.ref)
    assert np.all(err <= bound), float((err / bound).max())


def _handles(op_name: str, case) -> bool:
    """The cases qconform's own kernels take: all, but gemm_4bit's K % blocksize != 0, the
    MatMulNBits cases with g_idx, fake_quantize along axis 0 or to fp8 and gather_block_quantized on other
    axes or with one row of scales (the ABIs have none of them: declined)."""
    if op_name in ("matmul_nbits", "dequantize_nbits") and case.params.get("g_idx"):
        return False
    if op_name == "fake_quantize" and (case.params["granularity"] in ALONG_ROWS or "fp8" in case.leaf):
        return False
    if op_name == "gather_block_quantized":
        p = case.params
        return (p.get("gather_axis", 0), p.get("quantize_axis", 1)) == (0, 1) and not p.get("scale_rows_1")
    if op_name == "gemm_4bit":
        from qconform.device.bnb.gemm import handles

        return handles(case.params["K"], case.params["blocksize"])
    return True


@pytest.mark.parametrize("leaf", [lf.name for lf in get_op("gqa_prefill").leaves])
def test_own_kernel_gqa_prefill_flash_under_storage_fp16(leaf: str) -> None:
    """The flash prefill (``--impl cupy --contract storage=fp16``, qconform.device.ort.gqa_flash):
    every property at coverage 2 (head sizes 16..128, windows, softcap, sinks, biases, chunks with
    a past, the kernel-shaped cases), none declined, and the flash kernel is what ran: the
    session-10 kernel qk_gqa_prefill2_h<H> on the last case (head_size 128, a window, a chunk over
    a past; no softcap, no bias), the session-8 kernels on the softcap / bias / small-head cases."""
    from qconform.device.launchers import kernel_of
    from qconform.device.ort.gqa_flash import SOURCE, gqa_prefill

    result, prepared = _passes_at_coverage_2("gqa_prefill", leaf, "storage=fp16")
    assert not result.declined
    ran, _ = _launched(gqa_prefill, "gqa_prefill", prepared[-1], storage="fp16")
    H = prepared[-1].case.shape[5]
    assert kernel_of(SOURCE, f"qk_gqa_prefill2_h{H}") in ran


KEEP_QUANT_FAST = ("Wq4_K_Aq8_K_Yfp32", "Wq5_K_Aq8_K_Yfp32", "Wq6_K_Aq8_K_Yfp32", "Wq8_0_Aq8_0_Yfp32")


@pytest.mark.parametrize("leaf", KEEP_QUANT_FAST)
def test_own_kernel_matmul_bt_quant_fast_under_order_any(leaf: str) -> None:
    """The fast keep-quant GEMV (``--impl cupy --contract order=any``, ggml/keep_quant_fast.hip):
    every property at coverage 2 within the contract's per-output bound, none declined, and the fast
    kernel is what ran (its M tile for the last case)."""
    from qconform.device.ggml.keep_quant import FAST_SOURCE, FAST_TILES, FAST_TYPES, act_tile, matmul_bt_quant
    from qconform.device.launchers import kernel_of

    result, prepared = _passes_at_coverage_2("matmul_bt_quant", leaf, "order=any")
    assert not result.declined
    ran, y = _launched(matmul_bt_quant, "matmul_bt_quant", prepared[-1], order="any")
    qtype = leaf[1:5].upper()
    symbol = f"qk_kq_fast_{FAST_TYPES[qtype]}_m{act_tile(y.shape[0], FAST_TILES)}"
    assert kernel_of(FAST_SOURCE, symbol) in ran, symbol


def test_keep_quant_order_must_be_a_contract_order() -> None:
    """An ``order`` that is no contract order is an error naming the argument, before any launch."""
    import cupy

    from qconform.device.ggml.keep_quant import matmul_bt_quant

    W = cupy.zeros((4, 144), cupy.uint8)
    A = cupy.zeros((1, 256), cupy.float32)
    with pytest.raises(ArgumentError, match="order"):
        matmul_bt_quant(W, "Q4_K", A, order="fast")


@pytest.mark.parametrize("leaf", [lf.name for lf in get_op("qmoe_ragged_mm").leaves])
def test_own_kernel_qmoe_ragged_mm_grouped_under_storage_fp16(leaf: str) -> None:
    """The grouped-GEMM prefill (``--impl cupy --contract storage=fp16``, qconform.device.ort.qmoe):
    every property of qmoe_ragged_mm at coverage 2 (the scaled models, skew and ties routing, zero
    points, biases, every activation, per-row and block scales, accuracy_level 4), none declined,
    and the grouped kernels are what ran."""
    from qconform.device.launchers import kernel_of
    from qconform.device.ort.qmoe import SOURCE, qmoe_ragged_mm

    result, prepared = _passes_at_coverage_2("qmoe_ragged_mm", leaf, "storage=fp16")
    assert not result.declined
    ran, _ = _launched(qmoe_ragged_mm, "qmoe_ragged_mm", prepared[-1], storage="fp16")
    bits = int(leaf.split("_Wu")[1].split("_")[0])  # the leaf's weight bits: Xfp16_Wu8_Yfp16 -> 8
    for name in ("qk_moe_gscatter", f"qk_moe_gemm1_u{bits}", f"qk_moe_gemm2_u{bits}", "qk_moe_combine"):
        assert kernel_of(SOURCE, name) in ran, name
    assert kernel_of(SOURCE, "qk_moe_fc1v") not in ran


def _grouped_vs_model(inputs: dict, params: dict, calls: int) -> None:
    """The grouped path's first call within relL2 1e-4 of the numpy model of its arithmetic
    (tests/test_qmoe_grouped_model.py: the same fp16 roundings; it rounds each 32-value chunk's sum
    once where the mma sums in its own order, so fp32 sums differ by about sqrt(32) u relative and
    an fp16 fc1 output may step one spacing (2^-11 relative) where they straddle a rounding
    boundary: orders of magnitude under 1e-4 in relL2), then ``calls`` more calls bit-identical."""
    import cupy
    from test_qmoe_grouped_model import grouped_model

    from qconform.device.ort.qmoe import qmoe_ragged_mm
    from qconform.ops.ort.qmoe import qmoe_call
    from qconform.properties.compare import rel_l2

    op = get_op("qmoe_ragged_mm")
    args, kwargs = qmoe_call(inputs, params)
    want = grouped_model(args, kwargs)
    dev_args, dev_kwargs = op.call_args({k: cupy.asarray(v) for k, v in inputs.items()}, params)
    first = cupy.asnumpy(qmoe_ragged_mm(*dev_args, **dev_kwargs, storage="fp16"))
    assert rel_l2(first, want) <= 1e-4, rel_l2(first, want)
    for call in range(calls):
        again = cupy.asnumpy(qmoe_ragged_mm(*dev_args, **dev_kwargs, storage="fp16"))
        assert again.tobytes() == first.tobytes(), f"call {call + 2} differs from the first"


def test_qmoe_grouped_first_call_of_a_fresh_shape_then_128_identical() -> None:
    """The issue's repeat property on the grouped path: the first call of a shape this process has
    not run (21 experts of Qwen3-30B-A3B's layer, 64 tokens, k 8, blocks of 128) against the model,
    then 128 more calls bit-identical to it (no atomics, the tiling a function of the routing)."""
    from qconform.ops.ort._common import leaf_params
    from qconform.ops.ort.qmoe import LEAVES

    op = get_op("qmoe_ragged_mm")
    leaf = "Xfp32_Wu4_Yfp32"
    case = op.sized_case(leaf, 21, 7152)
    _grouped_vs_model(op.make_inputs(case), {**leaf_params(LEAVES, leaf), **case.params}, 128)


SKEWED = [(4, 32, False, 192, 160), (8, 0, True, 200, 104), (2, 64, True, 320, 192)]


@pytest.mark.parametrize("bits,bs,zp,H,inter", SKEWED)
def test_qmoe_grouped_skewed_routing(bits: int, bs: int, zp: bool, H: int, inter: int) -> None:
    """Every token routed to one expert (its logit 30 above the rest: the other slots' weights are
    below 1e-8 and skipped), so one expert takes all 300 pairs (5 tiles, the last partial) and the
    others none; a second expert with every token's second slot (k 2, both weights live) beside
    experts with none: the output against the model, 9 more calls bit-identical. Sizes not a multiple
    of the tiles (per-row 8-bit: rows of 200 and 104 values, a stage's last chunk partly past K)."""
    from qconform.ops.ort.qmoe import random_qmoe_case

    rng = np.random.default_rng(1500 + bits)
    for second in (False, True):
        d = random_qmoe_case(rng, tokens=300, hidden=H, inter=inter, experts=6, bits=bits, block_size=bs or None,
                             dtype=np.float16, zero_points=zp, bias=True)  # fmt: skip
        logits = rng.standard_normal((300, 6)).astype(np.float32)
        logits[:, 4] += 30.0
        if second:
            logits[:, 1] += 29.0
        d["router_probs"] = logits.astype(np.float16)
        params = {"k": 2, "bits": bits, "bs": bs, "swiglu": "oss"}  # the catalogue's knobs (ops.ort.qmoe)
        _grouped_vs_model(d, params, 9)


@pytest.mark.parametrize("leaf", ["Xfp16_Wfp16_Yfp16", "Xfp16_Wi8_Yfp16"])
def test_gqa_mma_decode_folds_are_the_three_launches(leaf: str) -> None:
    """The mma decode with its new rows appended by the attention's CTAs (qk_gqa_mma_append: the
    default build, which folds the combine in up to FOLD_MAX_SPLITS splits), with the combine always
    folded in (-DQK_GQA_COMBINE_FOLD: the CTA that completes a block of splits combines it,
    qk_gqa_mma_combine) and always launched (-DQK_GQA_COMBINE_LAUNCH), against session 10's three
    launches (qk_gqa_append, the same mma kernel, qk_gqa_combine: -DQK_GQA_APPEND_V1
    -DQK_GQA_COMBINE_LAUNCH): on every coverage-2 case of the leaf that runs an mma kernel (sinks,
    smooth softmax, windows, rotary of both kinds, packed QKV, ragged batches, one split and many),
    output and present caches bit-identical where defined (the op's masks), the folded combine twice
    in a row (its tickets are back at zero after a call), and the launches each build makes. The
    launches are recorded in one call (recorded, not run) and the outputs taken from another."""
    import cupy

    from qconform.device.launchers import compile_options, kernel_of
    from qconform.device.ort.group_query_attention import (
        APPEND_V1,
        COMBINE_FOLD,
        COMBINE_LAUNCH,
        FOLD_MAX_SPLITS,
        MMA_HEADS,
        SOURCE,
        gqa_decode,
    )
    from qconform.ops.ort.group_query_attention import _masks

    op = get_op("gqa_decode")

    def run(case: Prepared, *options: str) -> tuple[list | None, int, tuple]:
        """(the build's append and combine launches, or None without an mma kernel; its splits; its outputs)"""
        with compile_options(*options):
            args, kwargs = op.call_args(_device(case.inputs), case.params)
            launches, _ = _launches(gqa_decode, *args, **kwargs)
            ran = [k for k, *_ in launches]
            names = [n for n in ("qk_gqa_append", "qk_gqa_append8", "qk_gqa_combine") if kernel_of(SOURCE, n) in ran]
            mmas = [kernel_of(SOURCE, f"qk_gqa_mma_{k}_h{h}") for k in ("f16", "i8t") for h in MMA_HEADS]
            grids = [grid for k, grid, *_ in launches if k in mmas]
            args, kwargs = op.call_args(_device(case.inputs), case.params)
            out = tuple(cupy.asnumpy(a) for a in gqa_decode(*args, **kwargs))
        B, S = case.inputs["query"].shape[:2]
        return (names, grids[0][0] // (B * S), out) if grids else (None, 0, out)

    compared = 0
    for c in op.cases(leaf, 2):  # inputs and params only (no oracle run)
        case = Prepared(c, op.make_inputs(c), op.params(c), None)
        ran, splits, default = run(case)
        if ran is None:  # not an mma case
            continue
        assert ran == ([] if splits <= FOLD_MAX_SPLITS else ["qk_gqa_combine"]), (c.id, splits, ran)
        ran_f, _, folded = run(case, COMBINE_FOLD)
        assert ran_f == [], (c.id, ran_f)
        _, _, again = run(case, COMBINE_FOLD)
        ran_c, _, launched = run(case, COMBINE_LAUNCH)
        assert ran_c == ["qk_gqa_combine"], (c.id, ran_c)
        ran_l, _, session10 = run(case, APPEND_V1, COMBINE_LAUNCH)
        assert ran_l == ["qk_gqa_append", "qk_gqa_combine"], (c.id, ran_l)
        for mask, *outs in zip(_masks(case.inputs, session10), default, folded, again, launched, session10,
                               strict=True):  # fmt: skip
            *others, w = (np.where(mask, 0, v.view(f"u{v.itemsize}")) for v in outs)  # the defined elements only
            assert all(np.array_equal(x, w) for x in others), c.id
        compared += 1
    assert compared >= 3, f"only {compared} coverage-2 cases ran the mma kernels"


@pytest.mark.parametrize("chunk", [1, 3, 4, 64])
def test_gqa_prefill_flash_launch_order(chunk: int) -> None:
    """qk_gqa_prefill2's launch order (bands of ``chunk`` row blocks, the kernel's comment; the
    launcher's pick, ``row_chunk``, is 1 or all of them): every band width, a short last band
    included, writes every (row block, head) once: the output bit-identical to the launcher's
    default order, and the catalogue's check under storage=fp16 passes. The coverage-2 first
    prompt of 128 tokens, 32 query / 8 KV heads of 128, batch 2 (hpc 4: 4 row blocks of 32 rows,
    8 head blocks; chunk 3 leaves a last band of 1, 64 is clipped to 4: the head-major order)."""
    import cupy

    from qconform.device.ort import gqa_flash
    from qconform.impls import load_impl

    impl = load_impl("cupy", contract="storage=fp16")
    op = get_op("gqa_prefill")
    leaf = "Xfp16_Wfp16_Yfp16"
    case = next(c for c in op.cases(leaf, 2) if c.shape == (2, 128, 0, 32, 8, 128))
    prepared = Prepared.from_case(op, case, impl)
    args, kwargs = op.call_args({k: cupy.asarray(v) for k, v in prepared.inputs.items()}, prepared.params)
    kept = gqa_flash.gqa_prefill(*args, **kwargs, storage="fp16")  # held: its memory is not handed to the next call
    want = tuple(cupy.asnumpy(a) for a in kept)
    gqa_flash.CHUNK = chunk
    try:
        args, kwargs = op.call_args({k: cupy.asarray(v) for k, v in prepared.inputs.items()}, prepared.params)
        got = tuple(cupy.asnumpy(a) for a in gqa_flash.gqa_prefill(*args, **kwargs, storage="fp16"))
    finally:
        gqa_flash.CHUNK = None
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True)), "the order changed the output"
    del kept
    check = prepared.verify(op, got)
    assert check.ok, check.detail


BNB_READINGS = ("nf4_quantize", "fp4_quantize", "gemm_4bit")  # launchers with a cuda reading (variant)
CUDA_READING = [(op, lf.name) for op in BNB_READINGS for lf in get_op(op).leaves]


@pytest.mark.parametrize("op_name,leaf", CUDA_READING, ids=["-".join(x) for x in CUDA_READING])
def test_own_kernel_bnb_passes_under_variant_cuda(op_name: str, leaf: str) -> None:
    """The bitsandbytes kernels' second reading: ``--impl cupy --contract variant=cuda`` runs the
    CUDA reading (quantize: the literal-threshold trees; gemm_4bit: gemm_4bit_simt's order) and
    passes every property against that reading, at coverage 2."""
    result, prepared = _passes_at_coverage_2(op_name, leaf, "variant=cuda")
    assert {o.case for o in result.declined} == {p.case.id for p in prepared if not _handles(op_name, p.case)}


@pytest.mark.parametrize("leaf", [lf.name for lf in get_op("gemm_4bit").leaves])
def test_own_kernel_bnb_gemm_simt_is_bit_exact(leaf: str) -> None:
    """The op checks gemm_4bit within a bound; our SIMT reading must be more: byte for byte the
    oracle's order "simt" (qconform.oracles.bnb.gemm_4bit, bitsandbytes' gemm_4bit_simt) on every
    coverage-2 case it takes, M = 1..64 (row tiles of 1..16), with and without bias."""
    import cupy

    from qconform.device.bnb import gemm_4bit as launch
    from qconform.ops.bnb.gemm import gemm_4bit

    op = get_op("gemm_4bit")
    cases = [c for c in op.cases(leaf, 2) if _handles("gemm_4bit", c)]
    assert len(cases) >= 20
    for c in cases:
        x = op.make_inputs(c)
        kw = {k: c.params[k] for k in ("K", "blocksize", "quant_type")}
        want = gemm_4bit(x["A"], x["B"], x["absmax"], x.get("bias"), **kw, variant="cuda")
        bias = None if x.get("bias") is None else cupy.asarray(x["bias"])
        args = (cupy.asarray(x["A"]), cupy.asarray(x["B"]), cupy.asarray(x["absmax"]), bias)
        got = cupy.asnumpy(launch(*args, **kw, variant="cuda"))
        assert got.tobytes() == want.tobytes(), (c.id, int((got != want).sum()), got.size)


@pytest.mark.parametrize("rt", [0, 2])
@pytest.mark.parametrize("leaf", ["Xfp16_W4_Yfp16", "Xbf16_W4_Ybf16"])
def test_own_kernel_bnb_gemm_mma_default_reading(leaf: str, rt: int, monkeypatch) -> None:
    """The default (cpu) reading with fp16 / bf16 activations and M <= 16 runs the matrix-unit kernel
    (``bnb/gemm_mma.hip``): every property at coverage 2 (M = 1..8 on one n-tile of tokens, 12 and 16
    on two, M 32 / 64 on the SIMT kernel), declined only K % blocksize != 0, repeat calls
    bit-identical; and the mma kernel is what ran, n1 for M <= 8 and n2 for 9..16. The cases' N
    leave the launcher's rule at one 16-row tile a warp step for M <= 8 (``_n1_r1``); ``rt`` 2 forces
    the two-tile kernel there (what large layers run)."""
    from qconform.device.bnb import gemm as launcher
    from qconform.device.bnb.gemm import MMA_SOURCE, gemm_4bit
    from qconform.device.launchers import kernel_of

    if rt:
        monkeypatch.setattr(launcher, "mma_row_tiles", lambda M, N: rt)
    result, prepared = _passes_at_coverage_2("gemm_4bit", leaf)
    assert {o.case for o in result.declined} == {p.case.id for p in prepared if not _handles("gemm_4bit", p.case)}
    n1 = "qk_gemm_4bit_mma_n1" if rt == 2 else "qk_gemm_4bit_mma_n1_r1"
    for M, symbol in ((4, n1), (12, "qk_gemm_4bit_mma_n2")):
        p = next(p for p in prepared if p.case.shape[0] == M and _handles("gemm_4bit", p.case))
        ran, _ = _launched(gemm_4bit, "gemm_4bit", p)
        assert ran == [kernel_of(MMA_SOURCE, symbol)], (M, symbol)


BNB_ABI = (
    ("nf4_quantize", "qk_nf4_quantize", ""),
    ("fp4_quantize", "qk_fp4_quantize_cuda", "variant=cuda"),
    ("nested_absmax", "qk_nested_absmax", ""),
    ("gemm_4bit", "qk_gemm_4bit_m16:requires=K % blocksize == 0", ""),
    ("gemm_4bit", "qk_gemm_4bit_simt_m16:requires=K % blocksize == 0", "variant=cuda"),
)


@pytest.mark.parametrize("op_name,symbol,contract", BNB_ABI, ids=[f"{o}-{s.split(':')[0]}" for o, s, _ in BNB_ABI])
def test_own_kernel_bnb_loads_as_hip_user_kernel(op_name: str, symbol: str, contract: str) -> None:
    """The bitsandbytes kernels take their ops' declared ABI: through ``hip:`` with the op's default
    geometry (gemm_4bit: M * N groups of 32 lanes, more than the kernel needs; its shapes declined
    by the user's own predicate) every leaf passes under the reading the symbol computes."""
    from qconform.device.registry import KERNEL_DIR
    from qconform.impls import load_impl

    source = {"nf4_quantize": "quantize", "fp4_quantize": "quantize", "nested_absmax": "nested"}.get(
        op_name, "gemm_simt"
    )
    impl = load_impl(f"hip:{KERNEL_DIR / 'bnb' / source}.hip:{symbol}", [op_name], contract or None)
    op = get_op(op_name)
    for lf in op.leaves:
        prepared = [Prepared.from_case(op, c, impl) for c in op.cases(lf.name, 1)]
        result = run_leaf(impl, op, lf.name, prepared, repeat_calls=9, cold=False)
        assert result.verdict == "PASS", (lf.name, [o.detail for o in result.failed][:3])


@pytest.mark.parametrize("m", ALL, ids=[m.name for m in ALL])
def test_device_mutant(m: DeviceMutant, built: dict) -> None:
    """The row caught by its property (a control: passing), never in a device context an earlier row
    left unusable (a fault's sticky error would "catch" every later row): where this worker's context
    is lost, the row runs in a fresh process (``device_catalogue.py --rows``)."""
    if why := context_lost():
        fresh, out = run_in_fresh_process([m])
        assert fresh == 1, f"{m.name} (in a fresh process, this worker's context lost: {why}): {out.strip()}"
        return
    ok, what = verdict(m, run_mutant(m, built))
    assert ok, f"{m.name}: expected {m.caught_by or 'pass'}, {what}"


def test_launcher_rejects_before_launch() -> None:
    import cupy

    from qconform.device.ggml import q8_quant as launch

    x = cupy.ones((2, 300), cupy.float32)
    out = cupy.full((2, 2 * 292), 0xA5, cupy.uint8)
    with pytest.raises(ArgumentError, match="multiple of 256"):
        launch.quantize(x, "Q8_K", out=out)
    with pytest.raises(ArgumentError, match="dtype must be float32"):
        launch.quantize(cupy.ones((2, 512), cupy.float64), "Q8_K", out=out)
    with pytest.raises(ArgumentError, match="cupy.ndarray"):
        launch.quantize(np.ones((2, 512), np.float32), "Q8_K")
    with pytest.raises(ArgumentError, match="shape must be"):
        launch.quantize(cupy.ones((2, 512), cupy.float32), "Q8_K", out=cupy.zeros((2, 583), cupy.uint8))
    flat = cupy.ones(2 * 512 + 1, cupy.float32)
    with pytest.raises(ArgumentError, match="16-byte aligned"):
        launch.quantize(flat[1:].reshape(2, 512), "Q8_K")
    with pytest.raises(ArgumentError, match="variant"):
        launch.quantize(cupy.ones((2, 512), cupy.float32), "Q8_K", variant="nope")
    assert bool((out == 0xA5).all()), "a rejected call wrote into out"


def test_launcher_uses_the_callers_stream() -> None:
    import cupy

    from qconform.device.ggml import q8_quant as launch
    from qconform.oracles.ggml import quantize

    x = np.random.default_rng(3).standard_normal((64, 4096)).astype(np.float32)
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        dx = cupy.asarray(x)
        y = launch.quantize(dx, "Q8_K")
    s.synchronize()
    assert cupy.asnumpy(y).tobytes() == quantize(x, "Q8_K", ftz=True).tobytes()


def test_zero_rows_launch_nothing() -> None:
    import cupy

    from qconform.device.ggml import q8_quant as launch

    assert launch.quantize(cupy.ones((0, 256), cupy.float32), "Q8_K").shape == (0, 292)


@pytest.mark.parametrize("dtype", ["uint16", "uint8"])
def test_qswiglu_fused_equals_unfused_and_counts_steps(dtype: str) -> None:
    import cupy

    from qconform.device import ort as ort_launch
    from qconform.ops import Case
    from qconform.ops.ort.qswiglu import _swiglu_call, _swiglu_inputs
    from qconform.oracles.ort import qswiglu

    leaf = "Xu16_Yu16" if dtype == "uint16" else "Xu8_Yu8"
    inputs = _swiglu_inputs(Case("qswiglu", leaf, 5, (64, 14336), "normal"))
    (g, u), kw = _swiglu_call(inputs, {"dtype": dtype})
    dev = {k: v for k, v in kw.items() if k != "dtype"}
    fused = ort_launch.qswiglu(cupy.asarray(g), cupy.asarray(u), dtype=dtype, **dev)
    unfused = ort_launch.qswiglu(cupy.asarray(g), cupy.asarray(u), dtype=dtype, fused=False, **dev)
    assert cupy.asnumpy(fused).tobytes() == cupy.asnumpy(unfused).tobytes()
    want = qswiglu(g, u, **kw)
    diff = np.abs(cupy.asnumpy(fused).astype(np.int64) - want.astype(np.int64))
    moved = int((diff > 0).sum())
    print(f"qswiglu {dtype}: {moved} of {diff.size} elements one step from the oracle")
    assert diff.max() <= 1
    # Where they may differ. Everything but Sigmoid is exact in the chain (the oracle's docstring),
    # so an output may move only where the device's fp32 sigmoid, 1 / (1 + expf(-g)), and the
    # correctly rounded one fall on opposite sides of a .5 rounding boundary of Q(Sigmoid). expf is
    # within 2 ulp (CUDA's bound): a relative error of at most 2^-22 in e = exp(-g), which moves
    # 1 / (1 + e) by at most sig * (1 - sig) * 2^-22, i.e. at most 4 ulp of sig; the rounded add and
    # division add one ulp each: at most 6 ulp. So every moved output has its correctly rounded
    # sigmoid within 6 ulp of a boundary.
    from qconform.oracles.ort import dequantize_linear, quantize_linear, sigmoid_fp32

    sig = sigmoid_fp32(dequantize_linear(g, kw["gate_scale"], kw["gate_zp"], x_dtype=dtype))
    lo, hi = sig.copy(), sig.copy()
    for _ in range(6):
        lo, hi = np.nextafter(lo, np.float32(-np.inf)), np.nextafter(hi, np.float32(np.inf))
    near = quantize_linear(lo, kw["sig_scale"], kw["sig_zp"], output_dtype=dtype) != quantize_linear(
        hi, kw["sig_scale"], kw["sig_zp"], output_dtype=dtype
    )
    assert not (diff.astype(bool) & ~near).any(), "an output moved that no sigmoid error within 6 ulp explains"
    # How many may differ. With sigmoid(g) / sig_scale spread evenly mod 1, a sigmoid error of E
    # (absolute) moves s by one step for a fraction E / sig_scale of the elements. A one-step move
    # of s moves g * sd by |g| * sig_scale = |g| / 16 silu steps (g spans [-8, 8]: h follows for
    # E|g| / 16 = 1/4 of them) and a one-step move of h moves hd * u by |u| * silu_scale / out_scale
    # = |u| / 4 output steps (u spans [-4, 4]: y follows for 1/2): y moves for E / sig_scale / 8.
    # Asserted with E = 1.2e-7 as the mean error, the *largest* error of ORT's MLAS sigmoid (README;
    # 14 of 65536 uint16 outputs one step off there), which a sigmoid within expf's 2 ulp (mostly
    # exact after rounding) stays far below: a fraction under 1.2e-7 * 65535 / 8 < 1e-3 for uint16
    # (the H200 measures 105 of 917504 = 1.1e-4) and under 1.2e-7 * 255 / 8 = 3.8e-6 for uint8, i.e.
    # at most 3 of 917504 elements (the H200 measures 0).
    limit = 1.2e-7 / float(kw["sig_scale"]) / 8
    assert limit < (1e-3 if dtype == "uint16" else 4e-6)
    assert moved <= limit * diff.size, f"{moved} of {diff.size} outputs one step off: more than sigmoid error explains"


def _device_py(fn, ops):
    """A device ``py:`` implementation around ``fn`` (CuPy arrays in and out)."""
    from qconform.impls.device import load_device_impl

    fn.__qconform_device__ = True
    return load_device_impl(f"py:{fn.__name__}", tuple(ops), False, fn)


def test_device_py_dropin_gets_every_device_property() -> None:
    """Our own gather launcher as a device py: drop-in passes every property (device arrays in and
    out, poisoned out on the device, repeat calls, pending error); a twin that leaves the last
    output row unwritten fails writes_every_output, one that returns a host array is a FAIL."""
    import cupy

    from qconform.device.ort import gather_block_quantized

    def gather_ok(*args, **kwargs):
        return gather_block_quantized(*args, **kwargs)

    def gather_partial(*args, out=None, **kwargs):
        full = gather_block_quantized(*args, **kwargs)
        out[:-1] = full[:-1]
        return out

    def gather_host(*args, **kwargs):
        return cupy.asnumpy(gather_block_quantized(*args, **kwargs))

    op = get_op("gather_block_quantized")
    leaf = op.leaves[0].name
    for fn, broken in ((gather_ok, None), (gather_partial, "writes_every_output"), (gather_host, "matches_oracle")):
        impl = _device_py(fn, [op.name])
        prepared = [Prepared.from_case(op, c, impl) for c in op.cases(leaf, 1)]
        result = run_leaf(impl, op, leaf, prepared, repeat_calls=9)
        failed = {o.prop for o in result.failed}
        if broken is None:
            assert result.verdict == "PASS", [o.detail for o in result.failed][:3]
        else:
            assert broken in failed, (fn.__name__, failed)


@pytest.mark.parametrize("op_name", [op.name for op in CATALOGUE.values() if op.family == "ort"])
def test_own_abi_kernels_load_as_hip_user_kernels(op_name: str) -> None:
    """Every ONNX Runtime op through ``hip:``: the kernels of ours that take their op's declared
    ABI pass as user kernels; matmul_nbits (whose own kernels take launcher arguments) runs the
    worked example. Either way the generic binder and launch geometry are what is checked. A leaf
    the ABI's binder declines (fake_quantize's fp8 types) runs no case: every one declined, naming
    the argument."""
    from qconform.device.registry import KERNELS
    from qconform.impls import load_impl

    op = get_op(op_name)
    abi_kernels = {
        "dequantize_nbits": "qk_nbits_dequant",
        "gather_block_quantized": "qk_gather_block_quantized",
        "fake_quantize": "qk_fake_quantize",
        "qswiglu": "qk_qswiglu_fused",
    }
    if op_name not in abi_kernels:
        pytest.skip("no kernel of ours takes this op's ABI: the worked example covers it (tests/user_kernels.py)")
    k = next(k for k in KERNELS if k.symbol == abi_kernels[op_name])
    impl = load_impl(f"hip:{k.path}:{k.symbol}", [op_name])
    for lf in op.leaves:
        prepared = [Prepared.from_case(op, c, impl) for c in op.cases(lf.name, 1)]
        result = run_leaf(impl, op, lf.name, prepared, repeat_calls=9, cold=False)
        if lf.params.get("dtype") in FP8_TYPES:
            assert result.ran == 0 and len(result.declined) == len(prepared), lf.name
            assert all("dtype: the ABI takes the integer types" in o.detail for o in result.declined)
            continue
        assert result.verdict == "PASS", (lf.name, [o.detail for o in result.failed][:3])


def test_rcp_table_rule_and_sm90_table() -> None:
    """The device's approximate reciprocal is what the oracle computes from the measured table on
    values of every exponent and the special values (one table of mantissas scales by 2^k), no
    difference overflows the table's int8, and on sm_90 the table is the shipped one."""
    import cupy

    from qconform.device.bnb.rcp import measure

    m = measure()
    assert not m.overflow
    assert m.mismatches == 0, f"{m.mismatches} of {m.sampled} values differ from the table's rule"
    if cupy.cuda.Device().compute_capability == "90":
        assert m.is_shipped, m.sha256


@pytest.mark.parametrize("zp", [False, True])
def test_qmoe_decode_mma_tasks_in_rounds_keep_the_bits(zp: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """qk_moe_fc1m and qk_moe_fc2m with several tasks a warp: fc1m's 192 tasks (4 parts: 2 a CTA) on
    1 and 5 CTAs (96 and 20 rounds, the last partial) and fc2m at 4 parts (a warp takes 2 (slot, part)
    pairs of k 4); K of 576 and 384 (a partial last step; parts of 0 and 1 steps): the output bits of
    the default grid (each task sums in an order fixed by the shape, whichever warp and round take it),
    and that grid's output within the catalogue's bound."""
    import cupy

    import qconform.device.ort.qmoe as Q
    from qconform.contracts import STRICT
    from qconform.device.launchers import kernel_of
    from qconform.ops.ort.qmoe import qmoe_numerics, random_qmoe_case
    from qconform.properties.bounds import check_bound

    op = get_op("qmoe_decode")
    rng = np.random.default_rng(1700 + zp)
    inputs = random_qmoe_case(rng, tokens=1, hidden=576, inter=384, experts=6, bits=4, block_size=32,
                              dtype=np.float16, zero_points=zp, bias=True)  # fmt: skip
    params = {"act": "fp16", "k": 4, "bits": 4, "bs": 32, "swiglu": "oss"}
    dev_args, dev_kwargs = op.call_args(_device(inputs), params)
    ran, _ = _recorded(Q.qmoe_decode, *dev_args, **dev_kwargs)
    suffix = "_z" if zp else ""
    fcs = (1,) if cupy.cuda.runtime.is_hip else (1, 2)  # qk_moe_fc2m is built for NVIDIA only (qmoe.hip)
    assert {kernel_of(Q.SOURCE, f"qk_moe_fc{i}m{suffix}") for i in fcs} <= set(ran)
    want = cupy.asnumpy(Q.qmoe_decode(*dev_args, **dev_kwargs))
    readings = qmoe_numerics(inputs, params, STRICT, True)
    assert any(check_bound(want, ex.want, ex.model, STRICT, True, str).ok for ex in readings)
    monkeypatch.setattr(Q, "fc2m_parts", lambda k, K: 4)
    for ctas in (1, 5):
        monkeypatch.setattr(Q, "mma_ctas", lambda tasks, warps, tokens, sms, c=ctas: c)
        got = cupy.asnumpy(Q.qmoe_decode(*dev_args, **dev_kwargs))
        assert got.tobytes() == want.tobytes(), f"{ctas} CTAs: {np.flatnonzero(got != want)[:8]}"


@pytest.mark.parametrize("op_name", ["qmoe_decode", "qmoe_ragged_mm"])
def test_qmoe_first_call_of_a_fresh_shape_then_128_identical(op_name: str) -> None:
    """The issue's property on our QMoE kernels: the first call of a shape this process has not run
    (21 experts of Qwen3-30B-A3B's layer: H 2048, I 768, k 8, blocks of 128) within relL2 1e-4 of
    the kernel-shaped oracle (fp32 intermediates, as the kernels hold them; fp32 sums in another
    order: about lambda sqrt(K) u = 2e-5 of sum |terms| per projection at worst, far less in relL2),
    then 128 more calls bit-identical to it (no tiling is sampled on a call)."""
    import cupy

    from qconform.device.ort import DEVICE_FUNCTIONS
    from qconform.ops.ort._common import leaf_params
    from qconform.ops.ort.qmoe import LEAVES
    from qconform.oracles.ort import qmoe
    from qconform.properties.compare import rel_l2

    op = get_op(op_name)
    leaf = "Xfp32_Wu4_Yfp32"
    case = op.sized_case(leaf, 21, 7151)
    params = {**leaf_params(LEAVES, leaf), **case.params}
    inputs = op.make_inputs(case)
    args, kwargs = op.call_args(inputs, params)
    dev_args, dev_kwargs = op.call_args({k: cupy.asarray(v) for k, v in inputs.items()}, params)
    fn = DEVICE_FUNCTIONS[op_name]
    first = cupy.asnumpy(fn(*dev_args, **dev_kwargs))
    fp32 = {"fc1_out": "fp32", "act_out": "fp32", "int8_activations": False, "weights": "fp32"}
    want = qmoe(*args, **kwargs, precision="kernel", rounding=fp32)
    assert rel_l2(first, want) <= 1e-4
    for call in range(128):
        again = cupy.asnumpy(fn(*dev_args, **dev_kwargs))
        assert again.tobytes() == first.tobytes(), f"call {call + 2} differs from the first"


def test_compile_options_nest() -> None:
    """A block's compile options add to an enclosing block's: a bench helper's own
    ``compile_options()`` (no options) inside a caller's keeps the caller's build (session 13: it
    replaced them, so three "side by side" builds timed the default one)."""
    from qconform.device import launchers

    with launchers.compile_options("-DQK_A"):
        with launchers.compile_options():
            assert launchers.OPTIONS == ("-DQK_A",)
        with launchers.compile_options("-DQK_B", "-DQK_A"):
            assert launchers.OPTIONS == ("-DQK_A", "-DQK_B")
        assert launchers.OPTIONS == ("-DQK_A",)
    assert launchers.OPTIONS == ()


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("zp", ["none", "packed"])
def test_own_kernel_matmul_nbits_f32_spike_rows(bits: int, zp: str) -> None:
    """fp32 A with a row holding 1e30 on weights q = z beside normal activations (the catalogue's
    spike cases, coverage 2): default zero point, M 6: the split and the ring kernel, whose CTAs of
    the flagged group take the fp32 tile path; packed zero points, M 12: the per-output kernel.
    Each answer within the strict bound and bit-identical call to call."""
    from qconform.device.launchers import kernel_of, sm_count
    from qconform.device.ort.matmul_nbits import GEMV, MMA, matmul_nbits
    from qconform.device.registry import decode_shape

    case, inputs, params, args, kwargs = _spike(f"Xfp32_Wu{bits}_Yfp32", bits, lambda c: c.params["zp"] == zp)
    ran, _ = _recorded(matmul_nbits, *args, **kwargs)
    N = case.shape[2]
    ring = [kernel_of(MMA, "qk_nbits_split_a"), kernel_of(MMA, decode_shape(N, sm_count()).symbol_f32(bits))]
    assert ran == (ring if zp == "none" else [kernel_of(GEMV, "qk_nbits_gemv")])
    _repeatable_within_bound(matmul_nbits, args, kwargs, inputs, params)


TAIL_WAVE = [(b, x, m) for b in (2, 4) for x in ("fp16", "fp32") for m in (1, 5)]


@pytest.mark.parametrize("bits,x,M", TAIL_WAVE, ids=[f"u{b}-{x}-M{m}" for b, x, m in TAIL_WAVE])
def test_own_kernel_matmul_nbits_tail_wave_split(bits: int, x: str, M: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ring decode with ``fewer_warps`` (3) a CTA where 4 would leave a tail wave, on a small
    layer: the launcher told the device has 2 SMs, N one 32-row CTA more than decode's 4-warp CTAs
    fill (from the kernel's registers); the launch has 96 threads a CTA (fp32 A: the split, then
    the ring kernel), the answer within the strict bound and bit-identical call to call."""
    import importlib
    from types import SimpleNamespace

    from qconform.device.registry import MMA_SHAPES, fewer_warps
    from qconform.ops.spec import Case

    launcher = importlib.import_module("qconform.device.ort.matmul_nbits")  # the module, not its function
    monkeypatch.setattr(launcher, "sm_count", lambda: 2)
    K, f32 = 2048, x == "fp32"
    act_rows, groups = (2 * min(M, 4), -(-M // 4)) if f32 else (M, 1)
    trial = launcher._shape_plan(MMA_SHAPES["decode"], bits, SimpleNamespace(K=K, N=32 * 64), act_rows, groups, f32)
    assert trial is not None and trial.wk == 4
    N = 32 * (launcher._slots(trial) // groups + 1)
    leaf = f"X{x}_Wu{bits}_Y{x}"
    case = Case("matmul_nbits", leaf, 7, (M, K, N), "normal", {"block_size": 64, "zp": "none", "K": K})
    inputs, params, args, kwargs = _nbits_call(case, bits)
    launches, _ = _launches(launcher.matmul_nbits, *args, **kwargs)
    threads = [launch[2] for launch in launches]
    assert threads == ([launcher.SPLIT_THREADS] if f32 else []) + [32 * fewer_warps(4)], (N, threads)
    _repeatable_within_bound(launcher.matmul_nbits, args, kwargs, inputs, params)


PREFILL_GEMM = [  # (bits, M, K, N, block, bias, zero points): tiles exact; every tail; N below a tile, not % 8
    (2, 16, 512, 96, 64, True, "none"),
    (2, 64, 1024, 256, 64, False, "none"),
    (4, 100, 1000, 300, 128, True, "none"),
    (2, 130, 2048, 520, 256, True, "none"),
    (4, 64, 4104, 72, 64, False, "none"),
    (2, 200, 640, 17, 64, True, "none"),
    (4, 257, 576, 264, 64, True, "none"),
    (2, 70, 1344, 136, 64, False, "packed"),  # 21 blocks: 6 zero-point bytes a row (not a multiple of 4)
    (4, 150, 2112, 330, 64, True, "packed"),  # 33 blocks: 17 bytes a row
    (4, 40, 1024, 264, 128, False, "packed"),
    # the wgmma GEMM (M >= WGMMA_MIN_M, default or packed zero points): K chunks in whole groups of 4
    # and not (3 chunks: none; 17; 83), token and row tails, N not % 8, blocks 64..256
    (2, 260, 1344, 136, 64, True, "packed"),  # 21 blocks: 6 zero-point bytes a row
    (4, 384, 4160, 264, 128, False, "packed"),  # 33 blocks of 128: 17 bytes a row, a half block last
    (2, 256, 192, 136, 64, True, "none"),
    (4, 300, 1088, 256, 64, True, "none"),
    (2, 384, 5312, 1024, 64, False, "none"),
    (4, 260, 2048, 100, 256, True, "none"),
    (2, 513, 1000, 264, 128, False, "none"),
    # the storage=fp16 form too from WGMMA_FOLD_MIN_M (above: 3 K chunks an iteration, 0 / 1 / 2 left
    # over, the few tiles split by K; here a single chunk, unsplit, and two); 140 tiles: a whole wave of
    # 132 SMs, then 8 tiles split over 8 parts of one chunk
    (4, 272, 64, 136, 64, False, "packed"),
    (2, 257, 128, 40, 64, True, "none"),
    (4, 300, 512, 8960, 64, True, "packed"),
]


@pytest.mark.parametrize(
    "bits,M,K,N,block,bias,zp", PREFILL_GEMM, ids=[f"u{c[0]}-M{c[1]}-K{c[2]}-N{c[3]}-{c[6]}" for c in PREFILL_GEMM]
)
def test_own_kernel_matmul_nbits_prefill_gemm(
    bits: int, M: int, K: int, N: int, block: int, bias: bool, zp: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prefill GEMM (fp16 A, the default zero point or packed ones, M >= GEMM_MIN_M: qk_nbits_wgmma
    from WGMMA_MIN_M rows where the device has wgmma, else qk_nbits_gemm with gemm_shape's tiles;
    packed zero points through either's _z twin) is the one launch; every output
    written (an out buffer of NaN), the answer within the strict bound and bit-identical call to call;
    qk_nbits_gemm's bit-identical to the previous prefill kernel (qk_nbits_mma's prefill shape: the
    same sums, the kernel's comment). Under storage=fp16 from WGMMA_FOLD_MIN_M rows, qk_nbits_wgmma_fold
    (qk_nbits_wgmma_fold_split where registry.fold_tail_split splits the last wave's tiles) the same
    way, within that contract's bound."""
    import importlib

    import cupy

    from qconform.device.launchers import kernel_of, sm_count
    from qconform.device.loader import arch_specific_options
    from qconform.device.registry import (
        MMA_SHAPES,
        WGMMA_FOLD_MIN_M,
        WGMMA_MIN_M,
        fold_launch_split,
        gemm_shape,
        wgmma_symbol,
    )
    from qconform.ops.spec import Case

    launcher = importlib.import_module("qconform.device.ort.matmul_nbits")  # the module, not its function
    params = {"block_size": block, "zp": zp, "K": K, "bias": bias}
    case = Case("matmul_nbits", f"Xfp16_Wu{bits}_Yfp16", 11, (M, K, N), "normal", params)
    inputs, params, args, kwargs = _nbits_call(case, bits)
    wgmma = M >= WGMMA_MIN_M and launcher.has_wgmma()
    gemm = kernel_of(launcher.MMA, gemm_shape(M).symbol(bits, zp == "packed"))
    ran, _ = _recorded(launcher.matmul_nbits, *args, **kwargs)
    mine = kernel_of(launcher.WGMMA, wgmma_symbol(bits, zp == "packed"), arch_specific_options()) if wgmma else gemm
    assert ran == [mine]
    out = cupy.full((M, N), np.nan, cupy.float16)
    got = cupy.asnumpy(launcher.matmul_nbits(*args, **kwargs, out=out))
    assert not np.isnan(got).any(), int(np.isnan(got).sum())
    _repeatable_within_bound(launcher.matmul_nbits, args, kwargs, inputs, params)
    if wgmma and M >= WGMMA_FOLD_MIN_M:  # the storage=fp16 form on the same call
        fold = {**kwargs, "storage": "fp16"}
        split = fold_launch_split(M, N, K, sm_count())[2] > 1
        symbol = wgmma_symbol(bits, zp == "packed", fold=True, split=split)  # split but where K is one chunk
        folded = kernel_of(launcher.WGMMA, symbol, arch_specific_options())
        assert _recorded(launcher.matmul_nbits, *args, **fold)[0] == [folded]
        out = cupy.full((M, N), np.nan, cupy.float16)
        assert not np.isnan(cupy.asnumpy(launcher.matmul_nbits(*args, **fold, out=out))).any()
        _repeatable_within_bound(launcher.matmul_nbits, args, fold, inputs, params, "storage=fp16")
    if wgmma:  # then qk_nbits_gemm on the same call, checked the same way
        monkeypatch.setattr(launcher, "WGMMA_MIN_M", 1 << 62)
        assert _recorded(launcher.matmul_nbits, *args, **kwargs)[0] == [gemm]
        _repeatable_within_bound(launcher.matmul_nbits, args, kwargs, inputs, params)
        got = cupy.asnumpy(launcher.matmul_nbits(*args, **kwargs))
    monkeypatch.setattr(launcher, "GEMM_MIN_M", 1 << 62)
    ran_old, _ = _recorded(launcher.matmul_nbits, *args, **kwargs)
    assert ran_old == [kernel_of(launcher.MMA, MMA_SHAPES["prefill"].symbol(bits))]
    old = cupy.asnumpy(launcher.matmul_nbits(*args, **kwargs))
    assert old.tobytes() == got.tobytes(), int((old.view(np.uint16) != got.view(np.uint16)).sum())


def test_own_kernel_matmul_nbits_rejects_an_unknown_storage() -> None:
    """The launcher's ``storage`` (the contract's, which picks the fold kernel) must be one the
    contracts know: anything else is an ArgumentError naming it, the out buffer untouched."""
    import importlib

    import cupy

    from qconform.errors import ArgumentError
    from qconform.ops.spec import Case

    launcher = importlib.import_module("qconform.device.ort.matmul_nbits")  # the module, not its function
    M, K, N = 300, 1088, 136
    case = Case("matmul_nbits", "Xfp16_Wu4_Yfp16", 11, (M, K, N), "normal", {"block_size": 64, "zp": "none", "K": K})
    _, _, args, kwargs = _nbits_call(case, 4)
    out = cupy.full((M, N), 7, cupy.float16)
    with pytest.raises(ArgumentError, match="storage: must be one of exact, fp16, bf16, got 'fp8'"):
        launcher.matmul_nbits(*args, **kwargs, out=out, storage="fp8")
    assert bool((out == 7).all())


def test_tensor_maps_are_made_only_for_what_the_tensor_copy_accepts() -> None:
    """qconform.device.tensormap.tiled_2d (the fold kernel's activation and weight maps): 128 bytes for a
    16-byte aligned fp16 matrix; None where the driver refuses the map (cuda.h: an address not 16-byte
    aligned, a row stride not a multiple of 16 bytes, a box side past 256), so that the launcher takes
    another kernel instead of launching a copy of a bad map."""
    import cupy

    from qconform.device.tensormap import FLOAT16, SWIZZLE_128B, tiled_2d

    a = cupy.zeros((300, 1088), cupy.float16)
    made = tiled_2d(a.data.ptr, FLOAT16, (1088, 300), 2176, (64, 256), SWIZZLE_128B)
    assert made is not None and made.nbytes == 128 and made["opaque"].any()
    assert tiled_2d(a.data.ptr + 2, FLOAT16, (1088, 300), 2176, (64, 256), SWIZZLE_128B) is None
    assert tiled_2d(a.data.ptr, FLOAT16, (1080, 300), 2168, (64, 256), SWIZZLE_128B) is None
    assert tiled_2d(a.data.ptr, FLOAT16, (1088, 300), 2176, (64, 512), SWIZZLE_128B) is None


def test_own_kernel_matmul_nbits_without_an_sm_90a_build_takes_the_gemm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where NVRTC refuses the build with the architecture-specific option (an older toolkit; here
    an architecture NVRTC does not know), a call the wgmma kernel would take runs qk_nbits_gemm, within
    the strict bound, instead of failing."""
    import importlib

    from qconform.device.launchers import kernel_of
    from qconform.device.registry import gemm_shape
    from qconform.ops.spec import Case

    launcher = importlib.import_module("qconform.device.ort.matmul_nbits")  # the module, not its function
    monkeypatch.setattr(launcher, "arch_specific_options", lambda: ("-arch=sm_9999",))
    M, K, N = 300, 1088, 256
    case = Case("matmul_nbits", "Xfp16_Wu4_Yfp16", 11, (M, K, N), "normal", {"block_size": 64, "zp": "none", "K": K})
    inputs, params, args, kwargs = _nbits_call(case, 4)
    assert not launcher.has_wgmma()
    assert _recorded(launcher.matmul_nbits, *args, **kwargs)[0] == [kernel_of(launcher.MMA, gemm_shape(M).symbol(4))]
    _repeatable_within_bound(launcher.matmul_nbits, args, kwargs, inputs, params)


FP16_SPIKES = [
    (b, zp, m)
    for b in (2, 4)
    for zp, m in (*((z, 6) for z in ("packed", "float", "uniform", "scalar")), ("none", 40), ("float", 40))
]


@pytest.mark.parametrize("bits,zp,M", FP16_SPIKES, ids=[f"u{b}-{zp}-M{m}" for b, zp, m in FP16_SPIKES])
def test_own_kernel_matmul_nbits_fp16_spike_rows(bits: int, zp: str, M: int) -> None:
    """fp16 A with a row holding 65504 on weights q = z beside activations ~1e-3 (the catalogue's
    fp16 spike cases, coverage 2): zero points at M 6 on the decode kernel (qk_nbits_mma, decode_zp
    shape), M 40 on the prefill shape, or the prefill GEMM for default / packed ones; the zero
    point's integer part folded into the weights, so the row's small products survive. Each answer
    within the strict bound and bit-identical call to call."""
    from qconform.device.launchers import kernel_of
    from qconform.device.ort.matmul_nbits import MMA, matmul_nbits
    from qconform.device.registry import GEMM_MIN_M, MMA_SHAPES, gemm_shape

    leaf = f"Xfp16_Wu{bits}_Yfp16"
    _, inputs, params, args, kwargs = _spike(leaf, bits, lambda c: c.params["zp"] == zp and c.shape[0] == M)
    ran, _ = _recorded(matmul_nbits, *args, **kwargs)
    if zp in ("none", "packed") and M >= GEMM_MIN_M:
        assert ran == [kernel_of(MMA, gemm_shape(M).symbol(bits, zp == "packed"))]
    else:
        assert ran == [kernel_of(MMA, MMA_SHAPES["decode_zp" if M <= 8 else "prefill"].symbol(bits))]
    _repeatable_within_bound(matmul_nbits, args, kwargs, inputs, params)


PDL_PAIR = r"""
#include "qk_portable.h"
extern "C" __global__ void qk_test_primary(volatile int* flag, long long cycles) {
    QK_LAUNCH_DEPENDENTS();
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
    *flag = 1;
}
extern "C" __global__ void qk_test_dependent(volatile int* flag, int* seen) {
    seen[0] = *flag; /* before the wait: 0 where this kernel started while the primary spun */
    QK_WAIT_PRIOR_GRID();
    seen[1] = *flag; /* after it: the primary's write, always */
}
"""


@pytest.mark.parametrize("dependent", [False, True])
def test_dependent_launch_overlaps_and_waits(dependent: bool) -> None:
    """qconform.device.pdl: a kernel launched as a programmatic dependent starts while the kernel before
    it (which let it start, then spins ~10 ms before writing a flag) still runs, and its
    QK_WAIT_PRIOR_GRID() returns only after that write; where the device cannot overlap (not sm_90+,
    HIP) or the launch is in stream order, it starts after the write."""
    import cupy

    from qconform.device import pdl
    from qconform.device.launch import launch_kernel
    from qconform.device.registry import KERNEL_DIR

    module = cupy.RawModule(code=PDL_PAIR, options=(f"-I{KERNEL_DIR / 'common'}",))
    primary, second = (module.get_function(name) for name in ("qk_test_primary", "qk_test_dependent"))
    overlapped = dependent and pdl.available()  # its first call's queries: not while the primary spins
    assert all(k.kernel.ptr for k in (primary, second))  # compiled and loaded before the primary spins
    flag, seen = cupy.zeros(1, cupy.int32), cupy.full(2, -1, cupy.int32)
    launch_kernel("pdl", primary, 1, 32, (flag, np.int64(20_000_000)))  # ~10 ms
    launch_kernel("pdl", second, 1, 32, (flag, seen), dependent=dependent)
    assert cupy.asnumpy(seen).tolist() == ([0, 1] if overlapped else [1, 1])

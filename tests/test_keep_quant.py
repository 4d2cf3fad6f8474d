"""ggml's keep-quant GEMV (matmul_bt_quant) and the fused Q8_K producers (rms_norm_q8_k,
silu_mul_q8_k) in the catalogue: the readings each contract accepts (strict bit-exact, fma, the
float64 bound of order=any / storage, flush-to-zero, nan=ieee), the stale-bytes policy of all-zero
Q8_K blocks, the exactness the bound's operands rest on, and the coverage-1 golden budget."""

from __future__ import annotations

import numpy as np
import pytest

from qconform.contracts import STRICT, parse_contract
from qconform.formats.bf16 import bf16_bits_to_fp32
from qconform.formats.ftz import flush
from qconform.formats.ggml import FORMATS, Q8_K
from qconform.golden.store import encode_leaf
from qconform.impls import CallableImpl, load_impl
from qconform.ops import CATALOGUE, Case
from qconform.ops.ggml import keep_quant
from qconform.ops.ggml.keep_quant import MM_LEAVES, matmul_bt_quant, matmul_numerics, rms_norm_q8_k, silu_mul_q8_k
from qconform.ops.ggml.q8_quant import leaf_qtype
from qconform.ops.spec import output_parts
from qconform.oracles.ggml import VEC_DOT_PAIRS, dequantize, q8_k_stale_mask, quantize, vec_dot
from qconform.properties import Prepared, run_leaf

MM = CATALOGUE["matmul_bt_quant"]
RMS = CATALOGUE["rms_norm_q8_k"]
SILU = CATALOGUE["silu_mul_q8_k"]
FUSED_LEAVES = ("Xfp32_Yfp32_Aq8_K", "Xfp32_Ybf16_Aq8_K")


def _verdict(fn, op, leaf: str, coverage: int = 1, contract: str | None = None, cases=None):
    impl = CallableImpl(getattr(fn, "__name__", "fn"), fn, (op.name,))
    if contract:
        impl.contract = parse_contract(contract)
    prepared = [Prepared.from_case(op, c, impl) for c in (cases or op.cases(leaf, coverage))]
    return run_leaf(impl, op, leaf, prepared)


def test_leaves_carry_ggml_type_names() -> None:
    names = {lf.name: lf.params["qtype"] for lf in MM_LEAVES}
    assert set(names.values()) == set(VEC_DOT_PAIRS)
    assert {"Wq4_K_Aq8_K_Yfp32", "Wq5_K_Aq8_K_Yfp32", "Wq6_K_Aq8_K_Yfp32", "Wq8_0_Aq8_0_Yfp32"} <= set(names)
    assert {"Wq4_0_Aq8_0_Yfp32", "Wq4_1_Aq8_1_Yfp32", "Wiq4_xs_Aq8_K_Yfp32"} <= set(names)
    assert all(leaf_qtype(name) == qtype for name, qtype in names.items())
    for op in (RMS, SILU):
        assert [lf.name for lf in op.leaves] == list(FUSED_LEAVES)
        assert all(leaf_qtype(lf.name) == "Q8_K" == lf.params["qtype"] for lf in op.leaves)


@pytest.mark.parametrize("qtype", list(VEC_DOT_PAIRS))
def test_weight_parts_are_exact(qtype: str) -> None:
    """The bound's weights: scale part + min part, each computed exactly by the fp32 dequantizer,
    round to ggml's own dequantized weight (the one rounding the affine types have; a zero's sign
    may differ, which no sum sees)."""
    leaf = next(lf.name for lf in MM_LEAVES if lf.params["qtype"] == qtype)
    for w in ("valid", "quantized"):
        W = MM.make_inputs(Case(MM.name, leaf, 3, (1, 6, 512), "normal", {"qtype": qtype, "w": w}))["W_blocks"]
        ws, wm = keep_quant._weight_parts(W, FORMATS[qtype])
        total = ws if wm is None else ws + wm
        want = dequantize(W, qtype)
        assert np.array_equal(total.astype(np.float32), want), (qtype, w)
        assert np.array_equal(ws.astype(np.float32), ws) and (wm is None or np.array_equal(wm.astype(np.float32), wm))


@pytest.mark.parametrize("leaf", [lf.name for lf in MM_LEAVES])
def test_generic_order_is_within_the_any_order_bound(leaf: str) -> None:
    """The reference itself is one of the orders order=any accepts, on every coverage-1 case,
    under the probabilistic and the worst-case bound."""
    for contract in ("order=any", "order=any,bound=worst-case"):
        r = _verdict(matmul_bt_quant, MM, leaf, 1, contract)
        assert r.verdict == "PASS", [o.detail for o in r.failed]


def test_a_reordered_gemv_is_caught_strict_and_accepted_under_order_any(in_tests_dir) -> None:
    leaf = "Wq8_0_Aq8_0_Yfp32"
    strict = run_leaf(
        load_impl("py:mutants:matmul_blocks_reversed"), MM, leaf, [Prepared.from_case(MM, c) for c in MM.cases(leaf, 1)]
    )
    assert strict.verdict == "FAIL" and any("bit-exact" in o.detail for o in strict.failed)
    impl = load_impl("py:mutants:matmul_blocks_reversed", contract="order=any")
    for coverage in (1, 2):
        r = run_leaf(impl, MM, leaf, [Prepared.from_case(MM, c, impl) for c in MM.cases(leaf, coverage)])
        assert r.verdict == "PASS", [o.detail for o in r.failed]


@pytest.mark.parametrize(
    "name,leaf",
    [("matmul_q4_k_scale_of_next_subblock", "Wq4_K_Aq8_K_Yfp32"), ("matmul_q4_0_nibbles_swapped", "Wq4_0_Aq8_0_Yfp32")],
)
def test_order_any_still_catches_a_wrong_weight(name: str, leaf: str, in_tests_dir) -> None:
    impl = load_impl(f"py:mutants:{name}", contract="order=any")
    r = run_leaf(impl, MM, leaf, [Prepared.from_case(MM, c, impl) for c in MM.cases(leaf, 1)])
    assert r.verdict == "FAIL"
    detail = next(o.detail for o in r.failed if o.prop == "matches_oracle")
    assert "exceed their bound" in detail and "rule failed: contract order=any" in detail
    assert "activation row" in detail and "weight row" in detail


def _gemv_fma(W_blocks, qtype, A_fp32, *, out=None):
    """The generic vec_dot as GCC -mfma contracts it."""
    return matmul_bt_quant(W_blocks, qtype, A_fp32, fma=True, out=out)


@pytest.mark.parametrize("leaf", ["Wq4_K_Aq8_K_Yfp32", "Wq4_0_Aq8_0_Yfp32", "Wq4_1_Aq8_1_Yfp32", "Wq2_K_Aq8_K_Yfp32"])
def test_fma_contraction_is_a_declared_reading(leaf: str) -> None:
    assert _verdict(_gemv_fma, MM, leaf).verdict == "FAIL"
    for contract in ("fma=on", "fma=either"):
        assert _verdict(_gemv_fma, MM, leaf, contract=contract).verdict == "PASS", contract
    assert _verdict(matmul_bt_quant, MM, leaf, contract="fma=on").verdict == "FAIL"
    assert _verdict(matmul_bt_quant, MM, leaf, contract="fma=either").verdict == "PASS"


def _gemv_fp16_weights(W_blocks, qtype, A_fp32, *, out=None):
    """Weights dequantized to fp16, activations to fp32 (d * q), one fp32 matrix product."""
    _, afmt, _ = keep_quant.check_matmul_args(W_blocks, qtype, A_fp32, out)
    w = dequantize(W_blocks, qtype).astype(np.float16).astype(np.float32)
    a = dequantize(quantize(A_fp32, afmt.name), afmt.name)
    with np.errstate(all="ignore"):
        y = (a @ w.T).astype(np.float32)
    if out is None:
        return y
    out[...] = y
    return out


@pytest.mark.parametrize("leaf", ["Wq4_K_Aq8_K_Yfp32", "Wq8_0_Aq8_0_Yfp32"])
def test_fp16_weights_need_storage_fp16(leaf: str) -> None:
    cases = [
        c
        for c in MM.cases(leaf, 2)
        if (c.params["w"] == "quantized" or c.pattern in ("normal", "uniform")) and c.shape[1] * c.shape[2] <= 1 << 20
    ]
    r = _verdict(_gemv_fp16_weights, MM, leaf, contract="order=any", cases=cases)
    assert r.verdict == "FAIL" and any("storage=fp16" in o.detail for o in r.failed), [o.detail for o in r.failed]
    r = _verdict(_gemv_fp16_weights, MM, leaf, contract="storage=fp16", cases=cases)
    assert r.verdict == "PASS", [o.detail for o in r.failed]


def test_a_positive_q8_k_d_is_invisible_in_the_gemv() -> None:
    """d and every code negated (iscale = 127/max) give the same fp32 products and sums: the
    GEMV output cannot see ggml's sign convention, the fused producers' bytes can
    (mutants.rms_norm_q8_k_positive_d)."""
    for lf in MM_LEAVES:
        qtype = lf.params["qtype"]
        if VEC_DOT_PAIRS[qtype] != "Q8_K":
            continue
        for case in MM.cases(lf.name, 1):
            inputs = MM.make_inputs(case)
            a = quantize(inputs["A_fp32"], "Q8_K")
            b = Q8_K.blocks(a.copy())
            b["d"], b["qs"], b["bsums"] = -b["d"], -b["qs"], -b["bsums"]
            flipped = b.view(np.uint8).reshape(a.shape)
            want = vec_dot(qtype, inputs["W_blocks"][None], a[:, None])
            got = vec_dot(qtype, inputs["W_blocks"][None], flipped[:, None])
            assert np.array_equal(got, want, equal_nan=True), case.id


def _flushing_gemv(W_blocks, qtype, A_fp32, *, out=None):
    """A device that flushes subnormal activations (and its own subnormal intermediates)."""
    keep_quant.check_matmul_args(W_blocks, qtype, A_fp32, out)
    return matmul_bt_quant(W_blocks, qtype, flush(A_fp32, True), out=out)


def test_flush_to_zero_reading() -> None:
    """With flush-to-zero, the activation quantizer flushes as a device does; rows whose Q8_K scales
    reach below 2^-50 (tiny normal activations) are left unchecked, nothing else."""
    leaf = "Wq4_K_Aq8_K_Yfp32"
    tiny = MM.make_inputs(Case(MM.name, leaf, 5, (3, 4, 512), "normal", {"qtype": "Q4_K", "w": "valid"}))
    tiny["A_fp32"][1, 256:] *= np.float32(1e-30)  # one block of row 1 has d ~ 1e-32
    (e,) = matmul_numerics(tiny, {"qtype": "Q4_K"}, STRICT, True)
    assert e.mask is not None and e.mask.tolist() == [[False] * 4, [True] * 4, [False] * 4]
    for leaf in ("Wq4_K_Aq8_K_Yfp32", "Wq4_0_Aq8_0_Yfp32"):
        for case in MM.cases(leaf, 1):
            inputs = MM.make_inputs(case)
            params = MM.params(case)
            (plain,) = matmul_numerics(inputs, params, STRICT, False)
            (flushed,) = matmul_numerics(inputs, params, STRICT, True)
            assert plain.mask is None
            if case.pattern == "subnormal":  # all-subnormal blocks flush to 0 (d = 0: modelled)
                assert flushed.mask is None or flushed.mask.all(), case.id
            else:
                assert flushed.mask is None and np.array_equal(flushed.want, plain.want, equal_nan=True), case.id
        r = _verdict(_flushing_gemv, MM, leaf, contract="ftz=on")
        assert r.verdict == "PASS", [o.detail for o in r.failed]


def _gemv_nan_as_zero(W_blocks, qtype, A_fp32, *, out=None):
    """An IEEE kernel: a NaN activation never wins the block max and quantizes as 0."""
    keep_quant.check_matmul_args(W_blocks, qtype, A_fp32, out)
    return matmul_bt_quant(W_blocks, qtype, np.where(np.isnan(A_fp32), np.float32(0), A_fp32), out=out)


def test_nan_ieee_leaves_rows_with_a_nan_unchecked() -> None:
    leaf = "Wq4_K_Aq8_K_Yfp32"
    assert _verdict(_gemv_nan_as_zero, MM, leaf).verdict == "FAIL"
    assert _verdict(_gemv_nan_as_zero, MM, leaf, contract="nan=ieee").verdict == "PASS"


@pytest.mark.parametrize("op", [RMS, SILU], ids=lambda op: op.name)
def test_stale_bsums_are_unchecked_and_only_they(op) -> None:
    """A kernel may leave the bsums of an all-zero (or all-NaN) Q8_K block as it likes; a wrong
    bsum of any other block fails."""
    zero = [c for c in op.cases(FUSED_LEAVES[0], 2) if c.pattern == "zero_block"]
    stale_somewhere = False
    for case in zero:
        args, _ = op.call_args(op.make_inputs(case), op.params(case))
        y, _ = op.oracle(*args)
        stale = q8_k_stale_mask(y).reshape(-1, Q8_K.type_size).any(axis=1).reshape(len(y), -1)
        stale_somewhere |= bool((stale.any(axis=1) & ~stale.all(axis=1)).any())
    assert stale_somewhere, "a row with both an all-zero and a written Q8_K block"

    def scribble(stale_only: bool):
        def fn(*args, out=None):
            y, q = op.oracle(*args, out=out)
            mask = q8_k_stale_mask(y if y.dtype == np.float32 else bf16_bits_to_fp32(y))
            bsums = np.zeros(q.shape, bool)
            bsums.reshape(-1, Q8_K.type_size)[:, Q8_K.type_size - 32 :] = True
            q[(mask if stale_only else bsums & ~mask)] ^= 0x5A
            return y, q

        return fn

    for leaf in FUSED_LEAVES:
        assert _verdict(scribble(True), op, leaf, cases=zero).verdict == "PASS"
        assert _verdict(scribble(False), op, leaf, cases=zero).verdict == "FAIL"


def test_silu_v_expf_branches_follow_the_fma_contract() -> None:
    def branch(simd: str):
        def fn(gate, up, out_dtype="float32", *, out=None):
            return silu_mul_q8_k(gate, up, out_dtype, simd=simd, out=out)

        return fn

    leaf = FUSED_LEAVES[0]
    for simd in ("avx2", "avx512"):
        assert _verdict(branch(simd), SILU, leaf).verdict == "FAIL", simd
        assert _verdict(branch(simd), SILU, leaf, contract="fma=on").verdict == "PASS", simd
        assert _verdict(branch(simd), SILU, leaf, contract="fma=either").verdict == "PASS", simd
    assert _verdict(silu_mul_q8_k, SILU, leaf, contract="fma=on").verdict == "FAIL"
    assert _verdict(rms_norm_q8_k, RMS, leaf, contract="fma=on").verdict == "PASS"


def test_bf16_rows_may_hold_any_nan_where_the_reference_does() -> None:
    def other_nan(*args, out=None):
        y, q = rms_norm_q8_k(*args, out=out)
        y[(y & 0x7FFF) > 0x7F80] = 0xFFC1
        return y, q

    def nan_as_inf(*args, out=None):
        y, q = rms_norm_q8_k(*args, out=out)
        y[(y & 0x7FFF) > 0x7F80] = 0x7F80
        return y, q

    cases = [c for c in RMS.cases(FUSED_LEAVES[1], 1) if c.pattern in ("nan", "inf", "nan_payload")]
    assert _verdict(other_nan, RMS, FUSED_LEAVES[1], cases=cases).verdict == "PASS"
    assert _verdict(nan_as_inf, RMS, FUSED_LEAVES[1], cases=cases).verdict == "FAIL"


def test_fused_flush_to_zero_rows() -> None:
    """Under flush-to-zero a row whose fp32 intermediates may be subnormal is left unchecked: the
    subnormal pattern's rows, and no row of the other coverage-1 cases."""
    for op in (RMS, SILU):
        for case in op.cases(FUSED_LEAVES[0], 1):
            inputs, params = op.make_inputs(case), op.params(case)
            (e,) = op.numerics(inputs, params, STRICT, True)
            y_mask = e.mask[0]
            if case.pattern == "subnormal":
                assert y_mask is not None and y_mask.all(), (op.name, case.id)
            else:
                assert y_mask is None, (op.name, case.id)


@pytest.mark.parametrize("op", [MM, RMS, SILU], ids=lambda op: op.name)
def test_coverage_1_leaves_fit_the_golden_budget(op) -> None:
    """Inputs and outputs of a leaf's coverage-1 cases stay under 40 KB (they go into a committed
    golden set); the file with its metadata under 50 KB."""
    for lf in op.leaves:
        prepared = [Prepared.from_case(op, c) for c in op.cases(lf.name, 1)]
        raw = sum(a.nbytes for p in prepared for a in (*p.inputs.values(), *output_parts(p.want)))
        assert raw < 40_000, (lf.name, raw)
        assert len(encode_leaf(op, lf.name, prepared)) < 50_000, lf.name


@pytest.mark.parametrize("op", [MM, RMS, SILU], ids=lambda op: op.name)
def test_every_case_binds_to_both_outputs(op) -> None:
    for lf in op.leaves[:2]:
        for case in op.cases(lf.name, 1):
            p = Prepared.from_case(op, case)
            b = op.abi.bind(*op.call_args(p.inputs, p.params))
            assert [(tuple(s), np.dtype(d)) for s, d in b.outs] == [(w.shape, w.dtype) for w in output_parts(p.want)]
            assert b.work == output_parts(p.want)[0].size
            assert [a.name for a, _ in op.abi.values(b)] == [a.name for a in op.abi.scalars]

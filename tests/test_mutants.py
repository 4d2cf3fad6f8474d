"""Every property can fail: each deliberately broken implementation in ``mutants.py`` is caught,
by the property its defect is about, through the same path a user's ``py:`` drop-in takes."""

from __future__ import annotations

import shlex

import mutants
import numpy as np
import pytest

from qconform.cli import main
from qconform.impls import load_impl
from qconform.ops import get_op
from qconform.properties import Prepared, rejects_bad_arguments, run_leaf

VALUE = {"matches_oracle", "writes_every_output"}
CAUGHT_BY = {
    "q8_k_ties_away": VALUE,
    "q8_k_last_on_equal_abs": VALUE,
    "q8_k_no_clamp": VALUE,
    "q8_0_ties_to_even": VALUE,
    "q8_0_ieee_max": VALUE,
    "q8_0_approx_reciprocal": VALUE,
    "q8_0_dequant_fp16_math": VALUE,
    "q8_k_nondeterministic": {"repeatable"},
    "q8_k_last_block_unwritten": {"writes_every_output"},
    "q8_k_accepts_bad_width": {"rejects_bad_arguments"},
    "q8_k_writes_before_checking": {"rejects_bad_arguments"},
    "q8_k_asserts_width": {"rejects_bad_arguments"},
    "q8_k_rejects_for_wrong_reason": {"rejects_bad_arguments"},
    "nbits_blames_the_wrong_argument": {"rejects_bad_arguments"},
    "q8_k_modifies_input": {"matches_oracle"},
    "q8_k_allocates_and_skips_last_block": {"writes_every_output"},
    "nbits_unpack_high_bits_first": VALUE,
    "nbits_u2_default_zero_point_8": VALUE,
    "nbits_float_zp_one_rounding": VALUE,
    "fake_quantize_half_away": VALUE,
    "fake_quantize_times_reciprocal": VALUE,
    "matmul_skips_last_partial_block": VALUE,
    "matmul_last_block_wrong_scale": VALUE,
    "gather_int4_not_sign_extended": VALUE,
    "gather_uint4_default_zero_point_8": VALUE,
    "gather_e5m2_read_as_e4m3": VALUE,
    "fake_quantize_int2_wraps": VALUE,
    "nf4_decode_low_nibble_first": VALUE,
    "nf4_quantize_ties_up": VALUE,
    "nf4_quantize_midpoint_thresholds": VALUE,  # checked against the cuda reading it declares
    "nested_offset_before_dequant": VALUE,
    "gemm_bias_after_rounding": VALUE,
    "matmul_q4_k_scale_of_next_subblock": VALUE,
    "matmul_q4_0_nibbles_swapped": VALUE,
    "matmul_blocks_reversed": VALUE,  # accepted under order=any (tests/test_keep_quant.py)
    "rms_norm_q8_k_positive_d": VALUE,
    "silu_mul_q8_k_quantizes_fp32": VALUE,
    "gqa_causal_off_by_one_with_past": VALUE,
    "gqa_window_of_w_plus_1": VALUE,
    "gqa_rotary_interleaving_swapped": VALUE,
    "gqa_softcap_after_bias": VALUE,
    "gqa_k_quantized_before_rotary": VALUE,
    "qmoe_ties_to_lower_expert": VALUE,
    "qmoe_normalize_honoured": VALUE,
    "qmoe_swiglu_concatenated": VALUE,
    "qmoe_swiglu_missing_beta": VALUE,
    "qmoe_limit_on_linear_only": VALUE,
    "qmoe_tuner_samples_first_calls": {"repeatable"},
    "q4_0_ties_to_even": VALUE,
    "q4_k_dequant_scale_of_next_subblock": VALUE,
    "q4_0_zero_block_positive_d": VALUE,
    "q8_1_sum_times_fp16_d": VALUE,
    "matmul_q2_k_contracted": VALUE,
    "rms_norm_q8_k_bf16_truncated": VALUE,
    "silu_mul_q8_k_bf16_canonical_nan": VALUE,
    "nested_absmax_one_rounding": VALUE,
    "gqa_rotary_fuses_the_b_product": VALUE,
}
EXACTLY = {
    "q8_k_ties_away",
    "q8_k_last_on_equal_abs",
    "q8_k_no_clamp",
    "q8_0_ties_to_even",
    "q8_0_ieee_max",
    "q8_0_approx_reciprocal",
    "q8_0_dequant_fp16_math",
    "fake_quantize_times_reciprocal",
    "q8_k_accepts_bad_width",
    "q8_k_rejects_for_wrong_reason",
    "nbits_blames_the_wrong_argument",
    "nf4_decode_low_nibble_first",
    "nf4_quantize_ties_up",
    "nf4_quantize_midpoint_thresholds",
    "nested_offset_before_dequant",
    "gemm_bias_after_rounding",
    "matmul_q4_k_scale_of_next_subblock",
    "matmul_q4_0_nibbles_swapped",
    "matmul_blocks_reversed",
    "rms_norm_q8_k_positive_d",
    "silu_mul_q8_k_quantizes_fp32",
    "qmoe_tuner_samples_first_calls",
    "q4_0_zero_block_positive_d",
    "q8_1_sum_times_fp16_d",
    "matmul_q2_k_contracted",
    "rms_norm_q8_k_bf16_truncated",
    "silu_mul_q8_k_bf16_canonical_nan",
    "nested_absmax_one_rounding",
    "gqa_rotary_fuses_the_b_product",
}


def test_reference_knobs_equal_the_oracle() -> None:
    """The mutants' base is the reference: each mutant is exactly one rule away from ggml."""
    op = get_op("q8_k_quant")
    for case in op.cases("Xfp32_Yq8_K", 2):
        x = op.make_inputs(case)["x"]
        assert np.array_equal(mutants.q8_k_spec(x, "Q8_K"), op.oracle(x, "Q8_K")), case.id


@pytest.mark.parametrize("name", sorted(CAUGHT_BY))
def test_mutant_is_caught(name: str, in_tests_dir) -> None:
    impl = load_impl(f"py:mutants:{name}")
    (op_name,) = impl.ops
    op = get_op(op_name)
    leaf = getattr(impl.fn, "__qconform_leaf__", op.leaves[0].name)
    result = run_leaf(impl, op, leaf, [Prepared.from_case(op, c, impl) for c in op.cases(leaf, 1)])  # its contract
    failed = {o.prop for o in result.failed}
    assert result.verdict == "FAIL"
    assert CAUGHT_BY[name] <= failed, failed
    if name in EXACTLY:
        assert failed == CAUGHT_BY[name], [o.detail for o in result.failed]


def test_run_exits_1_and_names_the_leaf(in_tests_dir, capsys) -> None:
    assert main(["run", "--impl", "py:mutants:q8_k_ties_away", "--coverage", "1"]) == 1
    out = capsys.readouterr().out
    assert "FAIL q8_k_quant Xfp32_Yq8_K matches_oracle case ties-" in out
    row = next(line for line in out.splitlines() if line.startswith("q8_k_quant"))
    assert row.split()[1] == "Xfp32_Yq8_K" and row.split()[-1] == "FAIL"


def test_py_file_path_and_auto_op_selection(in_tests_dir, capsys) -> None:
    assert main(["run", "--impl", "py:mutants.py:q8_0_ties_to_even", "--coverage", "1"]) == 1
    out = capsys.readouterr().out
    assert "q8_0_quant" in out and "q8_k_quant" not in out


@pytest.mark.parametrize(
    "name,pattern",
    [("q8_k_ties_away", "ties"), ("q8_k_last_on_equal_abs", "equal_abs"), ("q8_k_no_clamp", "nan_payload")],
)
def test_fuzz_shrinks_and_its_replay_fails_the_same_way(
    name: str, pattern: str, in_tests_dir, tmp_path, capsys
) -> None:
    impl = f"py:mutants:{name}"
    assert main(["fuzz", "--op", "q8_k_quant", "--impl", impl, "--examples", "300", "--save", str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    shrunk = next(line for line in out if line.startswith("FAIL (shrunk): case "))
    assert f'"pattern":"{pattern}"' in shrunk and '"shape":[1,256]' in shrunk  # minimal: one block
    prop, _, detail = out[out.index(shrunk) + 1].strip().partition(": ")
    replay = shlex.split(out[-1])
    assert replay[:2] == ["qconform", "run"]
    assert main(replay[1:]) == 1
    assert f"{prop} case {pattern}-1x256-s0: {detail}" in capsys.readouterr().out
    (saved,) = tmp_path.iterdir()
    assert main(["golden", "verify", str(saved), "--impl", impl]) == 1
    assert main(["golden", "verify", str(saved)]) == 0


def test_fuzz_finds_nothing_wrong_with_the_oracle(capsys) -> None:
    assert main(["fuzz", "--op", "q8_0_quant", "--examples", "30"]) == 0
    assert "no failure in 30 examples" in capsys.readouterr().out


@pytest.mark.parametrize(
    "name,prop", [("q8_k_accepts_bad_width", "rejects_bad_arguments"), ("q8_k_nondeterministic", "repeatable")]
)
def test_fuzz_reports_the_other_properties(name: str, prop: str, in_tests_dir, tmp_path, capsys) -> None:
    impl = f"py:mutants:{name}"
    assert main(["fuzz", "--op", "q8_k_quant", "--impl", impl, "--examples", "200", "--save", str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    if name == "q8_k_accepts_bad_width":
        assert any(line.startswith(f"FAIL {prop}: ") for line in out)
    else:  # a corrupted call is seen by whichever check makes it: the replay's 129 calls see it repeat
        assert any(line.startswith("FAIL (shrunk): case ") for line in out)
    assert main(shlex.split(out[-1])[1:]) == 1
    assert f"FAIL q8_k_quant Xfp32_Yq8_K {prop}" in capsys.readouterr().out


@pytest.mark.parametrize(
    "name,words",
    [
        ("q8_k_writes_before_checking", "a caller buffer was modified"),
        ("q8_k_asserts_width", "raised AssertionError"),
        ("q8_k_modifies_input", "modified its inputs"),
    ],
)
def test_mutant_failure_says_why(name: str, words: str, in_tests_dir) -> None:
    impl = load_impl(f"py:mutants:{name}")
    op = get_op("q8_k_quant")
    result = run_leaf(impl, op, "Xfp32_Yq8_K", [Prepared.from_case(op, c) for c in op.cases("Xfp32_Yq8_K", 1)])
    assert any(words in o.detail for o in result.failed), [o.detail for o in result.failed]


@pytest.mark.parametrize(
    "name,words",
    [
        # names the argument but not the rule: the first bad call is a width that is no multiple of 256
        (
            "q8_k_rejects_for_wrong_reason",
            (
                "rejected for another reason",
                "naming 'x'",
                "/multiple of 256/",
                "ArgumentError('x: something unrelated')",
            ),
        ),
        # the rule but not the argument: the first bad call has bits = 5
        (
            "nbits_blames_the_wrong_argument",
            ("rejected for another reason", "naming 'bits'", "ArgumentError('K: must be one of (2, 3, 4, 8), got 5')"),
        ),
    ],
)
def test_rejection_for_the_wrong_reason_names_the_rule_and_quotes_the_error(
    name: str, words: tuple[str, ...], in_tests_dir
) -> None:
    impl = load_impl(f"py:mutants:{name}")
    (op_name,) = impl.ops
    op = get_op(op_name)
    outcome = rejects_bad_arguments(impl, op, getattr(impl.fn, "__qconform_leaf__", op.leaves[0].name))
    assert outcome.ok is False
    assert all(w in outcome.detail for w in words), outcome.detail
    # the oracle's own rejections of the same calls pass
    assert rejects_bad_arguments(load_impl("oracle"), op, op.leaves[0].name).ok

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
    "nf4_decode_one_rounding": VALUE,
    "nf4_quantize_ties_up": VALUE,
    "nf4_quantize_tail_by_reciprocal": VALUE,
    "nf4_quantize_full_blocks_divided": VALUE,
    "nf4_quantize_zero_tail_unclamped": VALUE,
    "nf4_quantize_fp16_subnormals_flushed": VALUE,
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
    "qmoe_block_scales_read_transposed": VALUE,
    "qmoe_router_weights_always_normalized": VALUE,
    "qmoe_gelu_erf": VALUE,
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
    "nbits_zp_high_field_first": VALUE,
    "nbits_zp_without_row_padding": VALUE,
    "nbits_u3_straddle_low_byte_only": VALUE,
    "nbits_float_zp_fma": VALUE,
    "nbits_scale_stride_floor": VALUE,
    "nbits_uniform_zp_in_ort_form": VALUE,
    "matmul_bias_after_fp16_rounding": VALUE,
    "fake_quantize_clamp_before_zero_point": VALUE,
    "fake_quantize_fp16_division": VALUE,
    "fake_quantize_row_blocks_ragged_previous_scale": VALUE,
    "fake_quantize_fp8_ties_away": VALUE,
    "fake_quantize_fp8_always_saturates": VALUE,
    "fake_quantize_fp8_ieee_overflow": VALUE,
    "gather_negative_index_not_wrapped": VALUE,
    "gather_int32_indices_zero_extended": VALUE,
    "gather_int4_zero_points_column_major": VALUE,
    "gather_u8_default_zero_point_0": VALUE,
    "qswiglu_sigmoid_held_in_fp16": VALUE,
    "qswiglu_sigmoid_zero_point_ignored": VALUE,
    "fake_quantize_unsigned_default_zero_point_mid": VALUE,
    "fake_quantize_nan_to_lowest": VALUE,
    "fake_quantize_int32_overflow": VALUE,
    "gather_out_of_range_index_clamped": VALUE,
    "matmul_g_idx_ignored": VALUE,
    "matmul_int8_activations_ties_away": VALUE,
    "nested_last_group_previous_scale": VALUE,
    "gqa_first_prompt_position_ids_per_row": VALUE,
    "gqa_kv_cache_divides": VALUE,
    "gqa_per_channel_scale_transposed": VALUE,
    "gqa_packed_kv_swapped": VALUE,
    "gqa_scale_attribute_ignored": VALUE,
    "gqa_smooth_and_head_sink_both": VALUE,
    "q5_0_last_on_equal_abs": VALUE,
    "q4_1_minmax_from_x0": VALUE,
    "q5_0_zero_block_positive_d": VALUE,
    "iq4_xs_zero_block_positive_d": VALUE,
    "q8_1_s_is_sum_x": VALUE,
    "q8_1_divides_by_d": VALUE,
    "q8_k_fma_nearest_int": VALUE,
    "q2_k_requant_when_dd_zero": VALUE,
    "q2_k_requant_by_reciprocal": VALUE,
    "q3_k_requant_by_reciprocal": VALUE,
    "q4_k_requant_by_reciprocal": VALUE,
    "q5_k_requant_by_reciprocal": VALUE,
    "q6_k_requant_by_reciprocal": VALUE,
    "q6_k_qx_steps_8": VALUE,
    "q4_k_start_min_positive": VALUE,
    "q2_k_start_min_positive": VALUE,
    "q5_k_fit_min_positive": VALUE,
    "q2_k_fit_min_positive": VALUE,
    "q2_k_nstep_off_by_one": VALUE,
    "q4_k_rmin_of_q5_k": VALUE,
    "q5_k_rmin_of_q4_k": VALUE,
    "iq4_nl_best_index_ties_down": VALUE,
    "iq4_nl_chunk_quantizer": VALUE,
    "iq4_xs_dl_from_fp16_d": VALUE,
    "q5_0_dequant_qh_big_endian": VALUE,
    "q3_k_dequant_hmask_inverted": VALUE,
    "q4_k_dequant_min_high_bits_wrong_byte": VALUE,
    "iq4_xs_dequant_scales_h_reversed": VALUE,
    "q2_k_dequant_min_added": VALUE,
    "matmul_q4_1_s_from_fp16_d": VALUE,
    "matmul_q4_0_scales_multiplied_first": VALUE,
    "matmul_q4_k_mins_after_lanes": VALUE,
    "matmul_q6_k_lanes_pairwise": VALUE,
    "matmul_iq4_xs_dx_times_l_first": VALUE,
    "rms_norm_q8_k_fp32_sum": VALUE,
    "rms_norm_q8_k_rsqrt": VALUE,
    "silu_mul_q8_k_libm_expf": VALUE,
    "q4_0_code_fused_multiply_add": VALUE,
    "q5_0_code_fused_multiply_add": VALUE,
    "q4_1_code_fused_multiply_add": VALUE,
    "q5_1_code_fused_multiply_add": VALUE,
    "gqa_kv_head_modulo": VALUE,
    "gqa_seqlens_read_as_total": VALUE,
    "gqa_rotary_first_prompt_off_by_one": VALUE,
    "gqa_partial_rotary_tail_zeroed": VALUE,
    "gqa_partial_rotary_partner_at_half_head": VALUE,
    "gqa_window_of_w_minus_1": VALUE,
    "gqa_scale_after_softcap": VALUE,
    "gqa_kv_cache_ties_away": VALUE,
    "gqa_u4_cache_high_nibble_first": VALUE,
    "gqa_u4_cache_symmetric_range": VALUE,
    "gqa_first_prompt_padding_unwritten": VALUE,
    "qmoe_weights_high_bits_first": VALUE,
    "qmoe_u8_zero_point_default_8": VALUE,
    "qmoe_zero_points_high_first": VALUE,
    "qmoe_block_zero_points_rows_unpadded": VALUE,
    "qmoe_swiglu_halves_swapped": VALUE,
    "qmoe_swiglu_gate_clamped_both_sides": VALUE,
    "qmoe_swiglu_alpha_on_linear": VALUE,
    "qmoe_fc2_bias_unweighted": VALUE,
    "qmoe_router_weights_ignored": VALUE,
    "qmoe_router_weights_never_normalized": VALUE,
    "qmoe_selects_by_router_weights": VALUE,
    "qmoe_routing_weights_fp16": VALUE,
    "qmoe_int8_activations_at_level_0": VALUE,
    "gqa_position_ids_ignored": VALUE,
    "gqa_sink_of_kv_head": VALUE,
    "gqa_bias_of_kv_head": VALUE,
    "gqa_smooth_softmax_ignored": VALUE,
    "gqa_attends_unquantized_new_kv": VALUE,
    "gqa_fp16_rotary_in_half": VALUE,
    "gqa_default_scale_of_rotary_dim": VALUE,
    "qmoe_fc1_bias_deinterleaved": VALUE,
    "nf4_quantize_low_nibble_first": VALUE,
    "fp4_quantize_sorted_index": VALUE,
    "fp4_quantize_zero_keeps_sign": VALUE,
    "fp4_quantize_ties_up": VALUE,
    "nf4_quantize_nan_skipped": VALUE,
    "nf4_quantize_pad_nibble_zero": VALUE,
    "nf4_quantize_zero_block_absmax_clamped": VALUE,
    "fp4_quantize_cuda_midpoint_thresholds": VALUE,
    "fp4_quantize_cuda_signbit": VALUE,
    "nf4_quantize_cuda_zero_block_guarded": VALUE,
    "fp4_decode_native_table_on_odd_width": VALUE,
    "fp4_decode_sign_in_bit_0": VALUE,
    "nf4_decode_bf16_truncated": VALUE,
    "nf4_decode_code_cast_first": VALUE,
    "nf4_decode_last_block_previous_scale": VALUE,
    "nested_fma_mode_two_roundings": VALUE,
    "nested_dynamic_map_from_numpy_linspace": VALUE,
    "gemm_low_nibble_first": VALUE,
    "gemm_weights_kept_fp32": VALUE,
    "gemm_absmax_indexed_per_row": VALUE,
    "gemm_bf16_output_truncated": VALUE,
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
    "q4_0_code_fused_multiply_add",
    "q5_0_code_fused_multiply_add",
    "q4_1_code_fused_multiply_add",
    "q5_1_code_fused_multiply_add",
    "nf4_quantize_low_nibble_first",
    "fp4_quantize_sorted_index",
    "fp4_quantize_zero_keeps_sign",
    "fp4_quantize_ties_up",
    "nf4_quantize_nan_skipped",
    "nf4_quantize_pad_nibble_zero",
    "nf4_quantize_zero_block_absmax_clamped",
    "fp4_quantize_cuda_midpoint_thresholds",
    "fp4_quantize_cuda_signbit",
    "nf4_quantize_cuda_zero_block_guarded",
    "fp4_decode_native_table_on_odd_width",
    "fp4_decode_sign_in_bit_0",
    "nf4_decode_bf16_truncated",
    "nf4_decode_code_cast_first",
    "nf4_decode_last_block_previous_scale",
    "nested_fma_mode_two_roundings",
    "nested_dynamic_map_from_numpy_linspace",
    "gemm_low_nibble_first",
    "gemm_weights_kept_fp32",
    "gemm_absmax_indexed_per_row",
    "gemm_bf16_output_truncated",
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

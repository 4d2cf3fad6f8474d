"""``qconform.oracles.ort.qmoe`` and ``moe_routing`` without onnxruntime: hand-derived tiny cases, the
reference precision within the derived bound of its float64 twin (qconform.ops.ort.moe_bounds), the kernel-shaped
precision's rounding points, argument validation, and deliberately broken variants that the hand-derived
cases catch (ties to the lower index, normalize_routing_weights honoured by QMoE, SwiGLU halves
concatenated instead of interleaved, a missing +beta, the limit on the linear half only).
"""

from __future__ import annotations

import importlib
import math
import zlib

import numpy as np
import pytest
from qmoe_bounds import within

from qconform.errors import ArgumentError
from qconform.ops.ort.moe_bounds import qmoe_bound
from qconform.ops.ort.qmoe import random_qmoe_case
from qconform.oracles.ort.moe_routing import route
from qconform.oracles.ort.packing import pack_bits
from qconform.oracles.ort.qmoe import FcLayout, dequantize_expert, moe, qmoe

qmoe_module = importlib.import_module("qconform.oracles.ort.qmoe")  # the module (the package exports the function)

F32, F16 = np.float32, np.float16


def _sigmoid(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v))


# ---------------------------------------------------------------------------------------------- routing


def test_route_hand_cases() -> None:
    ties = np.array([[1, 2, 2, 0]], F32)
    idx, w = route(ties, 2)
    assert idx.tolist() == [[2, 1]] and w.tolist() == [[0.5, 0.5]]  # equal logits: the higher index first
    assert route(ties, 2, "lower")[0].tolist() == [[1, 2]]
    assert route(ties, 1)[1].tolist() == [[1.0]]  # k = 1: weight 1 whatever the logits
    # softmax over the selected: e = [1, exp(-ln 2) = 0.5], s = 1.5, w = [fp32(1/1.5), fp32(0.5 * fp32(1/1.5))]
    idx, w = route(np.array([[0.0, -math.log(2)]], F32), 2)
    inv = F32(1) / F32(1.5)
    assert idx.tolist() == [[0, 1]] and w.tolist() == [[inv, F32(0.5) * inv]]
    for norm in (0, 1):  # QMoE ignores normalize_routing_weights
        assert route(ties, 2, normalize_routing_weights=norm)[1].tolist() == [[0.5, 0.5]]
    # MoE: the full softmax; renormalized over the selected only with normalize_routing_weights=1
    p = 1 / (2 + math.exp(-1) + math.exp(-2))
    np.testing.assert_allclose(route(ties, 2, op="moe")[1], [[p, p]], rtol=2e-7)
    assert route(ties, 2, op="moe", normalize_routing_weights=1)[1].tolist() == [[0.5, 0.5]]
    assert route(ties, 2, op="moe")[0].tolist() == [[2, 1]]
    # router_weights: selection by the logits, mixing weights gathered (renormalized with normalize=1)
    rw = np.array([[0.2, 0.6, 0.2, 0.0]], F32)
    idx, w = route(ties, 2, router_weights=rw)
    assert idx.tolist() == [[2, 1]] and w.tolist() == [[F32(0.2), F32(0.6)]]
    np.testing.assert_allclose(
        route(ties, 2, normalize_routing_weights=1, router_weights=rw)[1], [[0.25, 0.75]], rtol=2e-7
    )
    f64 = route(np.array([[0.0, 1.0, -1.0]], F32), 2, precision="float64")[1]
    assert f64.dtype == np.float64
    np.testing.assert_allclose(f64, [[_sigmoid(1), _sigmoid(-1)]], rtol=1e-15)


def test_route_fp16_logits_are_widened() -> None:
    lg = np.array([[0.1, 0.3, 0.2]], F16)
    idx, w = route(lg, 2)
    assert idx.tolist() == [[1, 2]]
    np.testing.assert_array_equal(w, route(lg.astype(F32), 2)[1])


# ---------------------------------------------------------------------------------------------- dequantization


def test_dequantize_hand_cases() -> None:
    four = FcLayout(N=1, K=2, bits=4, block_size=None)
    w = np.array([[[0x1F]]], np.uint8)  # low nibble first: q = [15, 1]; default zero point 8
    assert dequantize_expert(w, np.array([[0.5]], F32), None, four, 0).tolist() == [[3.5, -3.5]]
    two = FcLayout(N=1, K=4, bits=2, block_size=None)
    w = np.array([[[0b11_10_01_00]]], np.uint8)  # q = [0, 1, 2, 3]; default zero point 2
    assert dequantize_expert(w, np.array([[1.0]], F32), None, two, 0).tolist() == [[-2, -1, 0, 1]]
    # per-row zero points packed along N: rows 0 and 1 share a byte (row 0 low nibble)
    rows = FcLayout(N=2, K=2, bits=4, block_size=None)
    w = np.array([[[0x99], [0x99]]], np.uint8)
    out = dequantize_expert(w, np.ones((1, 2), F32), np.array([[0x73]], np.uint8), rows, 0)
    assert out.tolist() == [[6, 6], [2, 2]]
    # block-wise zero points packed along the blocks: K=32, block 16; byte 0x53 -> zp 3, then 5
    blocks = FcLayout(N=1, K=32, bits=4, block_size=16)
    w = np.full((1, 1, 16), 0x99, np.uint8)
    out = dequantize_expert(w, np.array([[[1.0, 2.0]]], F32), np.array([[[0x53]]], np.uint8), blocks, 0)
    assert out.tolist() == [[6.0] * 16 + [8.0] * 16]
    # 8-bit: one byte per value, default 128; fp32((q - z) * s) rounded once
    eight = FcLayout(N=1, K=2, bits=8, block_size=None)
    s = np.array([[0.1]], F32)
    assert dequantize_expert(np.array([[[255, 0]]], np.uint8), s, None, eight, 0).tolist() == [
        [F32(127) * F32(0.1), F32(-128) * F32(0.1)]
    ]


# ---------------------------------------------------------------------------------------------- tiny QMoE


def _code(v: int) -> int:
    return 128 + v  # 8-bit, default zero point 128, scale 1: the code of the integer weight v


def _tiny(logits, **attrs) -> tuple[dict, dict]:
    """E=3, H=2, I=2, 8-bit per-row, SwiGLU (alpha 1, beta 1, limit 2). x = [1, 2].
    Expert 0: fc1 rows (gate0, lin0, gate1, lin1) = [1, 1], [0, -2], [-1, 0], [1, 0] -> h = [3, -4, -1, 1];
    clamped: g0 = 2, l0 = -2, g1 = -1, l1 = 1; a = [2 s(2) (-2 + 1), -1 s(-1) (1 + 1)];
    fc2 rows [1, 0], [1, -1] -> y0 = [a0, a0 - a1]. Expert 1: zero weights, fc2 bias [7, 7] -> y1 = [7, 7].
    Expert 2: zero weights, fc2 bias [-1, 3] -> y2 = [-1, 3]."""
    fc1 = np.full((3, 4, 2), _code(0), np.uint8)
    fc1[0] = [[_code(1), _code(1)], [_code(0), _code(-2)], [_code(-1), _code(0)], [_code(1), _code(0)]]
    fc2 = np.full((3, 2, 2), _code(0), np.uint8)
    fc2[0] = [[_code(1), _code(0)], [_code(1), _code(-1)]]
    arrays = dict(
        input=np.array([[1, 2]], F32),
        router_probs=np.array(logits, F32),
        fc1_experts_weights=fc1,
        fc1_scales=np.ones((3, 4), F32),
        fc2_experts_weights=fc2,
        fc2_scales=np.ones((3, 2), F32),
        fc2_experts_bias=np.array([[0, 0], [7, 7], [-1, 3]], F32),
    )
    a = dict(
        k=1, activation_type="swiglu", expert_weight_bits=8, activation_alpha=1.0, activation_beta=1.0, swiglu_limit=2.0
    )
    return arrays, {**a, **attrs}


A0 = 2 * _sigmoid(2) * (-2 + 1)
A1 = -1 * _sigmoid(-1) * (1 + 1)
Y0, Y1, Y2 = [A0, A0 - A1], [7.0, 7.0], [-1.0, 3.0]
TINY = {  # name: (logits, attrs, expected output, derived by hand above)
    "expert 0": ([[5, 0, 0]], {}, Y0),
    "tie to the higher index": ([[0, 5, 5]], {}, Y2),
    "normalize ignored": ([[2, 2, -3]], dict(k=2), [(a + b) / 2 for a, b in zip(Y1, Y0, strict=True)]),
}


@pytest.mark.parametrize("name", list(TINY))
def test_tiny_qmoe_hand_derived(name: str) -> None:
    logits, attrs, expected = TINY[name]
    arrays, attrs = _tiny(logits, **attrs)
    np.testing.assert_allclose(qmoe(**arrays, **attrs), [expected], rtol=2e-6)
    np.testing.assert_allclose(qmoe(**arrays, **attrs, precision="float64"), [expected], rtol=1e-14)
    if attrs["k"] == 2:
        np.testing.assert_allclose(qmoe(**arrays, **attrs, normalize_routing_weights=1), [expected], rtol=2e-6)


def test_tiny_moe_differs_at_normalize_0() -> None:
    """The same experts through MoE (fp32 weights): at normalize_routing_weights=0 the weights are the
    full-softmax probabilities 1 / (2 + e^-5), not 1/2."""
    arrays, attrs = _tiny([[2, 2, -3]], k=2)
    w1 = np.stack(
        [
            dequantize_expert(arrays["fc1_experts_weights"], arrays["fc1_scales"], None, FcLayout(4, 2, 8, None), e)
            for e in range(3)
        ]
    )
    w2 = np.stack(
        [
            dequantize_expert(arrays["fc2_experts_weights"], arrays["fc2_scales"], None, FcLayout(2, 2, 8, None), e)
            for e in range(3)
        ]
    )
    m = dict(
        input=arrays["input"],
        router_probs=arrays["router_probs"],
        fc1_experts_weights=w1,
        fc2_experts_weights=w2,
        fc2_experts_bias=arrays["fc2_experts_bias"],
    )
    ma = dict(k=2, activation_type="swiglu", activation_alpha=1.0, activation_beta=1.0, swiglu_limit=2.0)
    p = 1 / (2 + math.exp(-5))
    np.testing.assert_allclose(moe(**m, **ma), [[p * (a + b) for a, b in zip(Y1, Y0, strict=True)]], rtol=2e-6)
    np.testing.assert_allclose(moe(**m, **ma, normalize_routing_weights=1), [TINY["normalize ignored"][2]], rtol=2e-6)


def test_skipped_expert_is_not_evaluated() -> None:
    """A selected expert with weight <= 1e-8 is skipped: its NaN-producing weights (scale inf times a zero
    code) never reach the output."""
    arrays, attrs = _tiny([[0, -30, 5]], k=3)
    arrays["fc1_scales"] = arrays["fc1_scales"].copy()
    arrays["fc1_scales"][1] = np.inf
    out = qmoe(**arrays, **attrs)
    assert np.isfinite(out).all()
    arrays["router_probs"] = np.array([[0, -10, 5]], F32)
    assert np.isnan(qmoe(**arrays, **attrs)).all()


# ---------------------------------------------------------------------------------------------- broken variants


def _lower_ties(real):
    def mutant(router_probs, k, tie_break="higher", **kw):
        return real(router_probs, k, "lower", **kw)

    return mutant


def _normalize_honoured(real):
    def mutant(
        router_probs,
        k,
        tie_break="higher",
        *,
        op="qmoe",
        normalize_routing_weights=0,
        router_weights=None,
        precision="reference",
    ):
        if op == "qmoe" and router_weights is None and not normalize_routing_weights:
            op = "moe"  # the full-softmax probabilities of the selected experts, not renormalized
        return real(
            router_probs,
            k,
            tie_break,
            op=op,
            normalize_routing_weights=normalize_routing_weights,
            router_weights=router_weights,
            precision=precision,
        )

    return mutant


def _swiglu_mutant(kind: str):
    real = qmoe_module.expert_activation

    def mutant(h, activation_type, alpha=1.0, beta=0.0, limit=None, precision="reference"):
        if activation_type != "swiglu":
            return real(h, activation_type, alpha, beta, limit, precision)
        h = np.asarray(h, np.float64)
        n = h.shape[1] // 2
        g, lin = (h[:, :n], h[:, n:]) if kind == "concatenated" else (h[:, 0::2], h[:, 1::2])
        if limit is not None:
            if kind != "limit on linear only":
                g = np.minimum(g, limit)
            lin = np.clip(lin, -limit, limit)
        b = 0.0 if kind == "no beta" else beta
        return (g / (1 + np.exp(-alpha * g)) * (lin + b)).astype(np.float32)

    return mutant


MUTANTS = {  # name: (module attribute, replacement factory, the hand case that catches it)
    "ties to the lower index": ("route", lambda: _lower_ties(route), "tie to the higher index"),
    "normalize honoured by QMoE": ("route", lambda: _normalize_honoured(route), "normalize ignored"),
    "SwiGLU halves concatenated": ("expert_activation", lambda: _swiglu_mutant("concatenated"), "expert 0"),
    "SwiGLU without +beta": ("expert_activation", lambda: _swiglu_mutant("no beta"), "expert 0"),
    "limit on the linear half only": ("expert_activation", lambda: _swiglu_mutant("limit on linear only"), "expert 0"),
}


@pytest.mark.parametrize("name", list(MUTANTS))
def test_broken_variant_is_caught(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    attr, factory, case = MUTANTS[name]
    logits, attrs, expected = TINY[case]
    arrays, attrs = _tiny(logits, **attrs)
    np.testing.assert_allclose(qmoe(**arrays, **attrs), [expected], rtol=2e-6)
    monkeypatch.setattr(qmoe_module, attr, factory())
    broken = qmoe(**arrays, **attrs)
    assert not np.allclose(broken, [expected], rtol=1e-3), f"the hand case {case!r} misses the mutant {name!r}"


# ---------------------------------------------------------------------------------------------- float64 twin

TWIN = [
    (F32, 4, None, "swiglu", 0),
    (F32, 2, 16, "swiglu", 0),
    (F32, 8, 32, "swiglu", 0),  # int8 activations
    (F32, 4, 64, "silu", 4),  # int8 activations
    (F32, 4, 32, "gelu", 0),
    (F32, 8, None, "relu", 0),
    (F16, 4, 32, "swiglu", 0),
    (F16, 8, 64, "identity", 0),
    (F16, 2, None, "swiglu", 0),
]


@pytest.mark.parametrize("dtype,bits,block_size,activation_type,accuracy_level", TWIN)
def test_reference_within_bound_of_float64(dtype, bits: int, block_size, activation_type: str, accuracy_level) -> None:
    """The reference precision within the derived bound (qconform.ops.ort.moe_bounds, vs="float64") of the
    float64 twin, zero points and biases on, SwiGLU with gpt-oss attributes; the twin returns float64."""
    rng = np.random.default_rng(zlib.crc32(repr((np.dtype(dtype).name, bits, block_size, activation_type)).encode()))
    d = random_qmoe_case(
        rng,
        tokens=6,
        hidden=128,
        inter=64,
        experts=4,
        bits=bits,
        block_size=block_size,
        dtype=dtype,
        zero_points=True,
        bias=True,
        activation_type=activation_type,
    )
    attrs = dict(
        k=3,
        activation_type=activation_type,
        expert_weight_bits=bits,
        block_size=block_size,
        swiglu_fusion=1 if activation_type == "swiglu" else 0,
        accuracy_level=accuracy_level,
    )
    if activation_type == "swiglu":
        attrs.update(activation_alpha=1.702, activation_beta=1.0, swiglu_limit=7.0)
    ref = qmoe(**d, **attrs)
    f64 = qmoe(**d, **attrs, precision="float64")
    assert f64.dtype == np.float64 and ref.dtype == dtype and f64.shape == ref.shape
    ok, frac = within(f64, ref, qmoe_bound(d, attrs, "float64"))
    assert ok, frac
    assert not np.array_equal(f64.astype(dtype), ref) or dtype == F16


# ---------------------------------------------------------------------------------------------- kernel precision


def _one_expert(x, w1_scale: float, activation_type: str = "identity") -> tuple[dict, dict]:
    """E=1, H=2, I=2, 8-bit per-row; fc1 = diag(w1_scale, 1) (codes 129/128), fc2 = identity."""
    eye = np.array([[[129, 128], [128, 129]]], np.uint8)
    arrays = dict(
        input=np.array([x], F32),
        router_probs=np.zeros((1, 1), F32),
        fc1_experts_weights=eye,
        fc1_scales=np.array([[w1_scale, 1.0]], F32),
        fc2_experts_weights=eye,
        fc2_scales=np.ones((1, 2), F32),
    )
    return arrays, dict(k=1, activation_type=activation_type, expert_weight_bits=8, swiglu_fusion=0)


def test_kernel_rounding_points_hand_cases() -> None:
    h = 1 + 3 * 2**-12  # fp32-exact; fp16 neighbours 1 and 1 + 2**-10, the upper one nearer
    arrays, attrs = _one_expert([1.0, 0.0], h)
    fp32_only = dict(fc1_out="fp32", act_out="fp32", int8_activations=False)
    assert qmoe(**arrays, **attrs)[0, 0] == F32(h)
    assert qmoe(**arrays, **attrs, precision="kernel", rounding=fp32_only)[0, 0] == F32(h)
    for point in ("fc1_out", "act_out"):
        r = {**fp32_only, point: "fp16"}
        assert qmoe(**arrays, **attrs, precision="kernel", rounding=r)[0, 0] == 1 + 2**-10
    # int8 activations, per row of 32 (one partial block): amax 1, codes rint([127, 63.5]) = [127, 64]
    arrays, attrs = _one_expert([1.0, 0.5], 1.0)
    r = dict(fc1_out="fp32", act_out="fp32", int8_activations=True)
    sa = F32(1) / F32(127)
    y = qmoe(**arrays, **attrs, precision="kernel", rounding=r)
    assert y[0].tolist() == [F32(127 * float(sa)), F32(64 * float(sa))]


def test_kernel_at_reference_knobs_is_the_reference() -> None:
    rng = np.random.default_rng(5)
    d = random_qmoe_case(rng, tokens=5, hidden=128, inter=64, experts=4, bits=8, block_size=32, zero_points=True)
    attrs = dict(
        k=2,
        activation_type="swiglu",
        expert_weight_bits=8,
        block_size=32,
        activation_alpha=1.702,
        activation_beta=1.0,
        swiglu_limit=7.0,
    )
    r = dict(fc1_out="fp32", act_out="fp32", int8_activations=True, act_block=32)
    np.testing.assert_array_equal(qmoe(**d, **attrs, precision="kernel", rounding=r), qmoe(**d, **attrs))
    r = dict(fc1_out="fp32", act_out="fp32", int8_activations=False)
    np.testing.assert_array_equal(
        qmoe(**d, **attrs, precision="kernel", rounding=r), qmoe(**d, **attrs, constant_weights=False)
    )
    kernel = qmoe(**d, **attrs, precision="kernel")  # fp16 intermediates, int8 per 32 values
    assert kernel.dtype == F32 and not np.array_equal(kernel, qmoe(**d, **attrs))
    f64 = qmoe(**d, **attrs, precision="float64")
    assert np.abs(kernel - f64).max() <= 0.05 * np.abs(f64).max()


# ---------------------------------------------------------------------------------------------- validation


def _base(block_size=32, **kw) -> tuple[dict, dict]:
    rng = np.random.default_rng(1)
    d = random_qmoe_case(rng, tokens=3, hidden=128, inter=64, experts=4, bits=4, block_size=block_size, **kw)
    return d, dict(k=2, activation_type="swiglu", expert_weight_bits=4, block_size=block_size)


def _bad_cases() -> dict:
    d, a = _base()
    per_row, ar = _base(None)
    odd = random_qmoe_case(np.random.default_rng(2), tokens=3, hidden=128, inter=96, experts=4, bits=4, block_size=None)
    return {
        "block_size 8": (per_row, {**ar, "block_size": 8}, "block_size"),
        "block_size 48": (per_row, {**ar, "block_size": 48}, "block_size"),
        "block_size not dividing inter_size": (odd, {**ar, "block_size": 64}, "block_size"),
        "block_size bool": (per_row, {**ar, "block_size": True}, "block_size"),
        "bits 3": (d, {**a, "expert_weight_bits": 3}, "expert_weight_bits"),
        "k 0": (d, {**a, "k": 0}, "k"),
        "k > experts": (d, {**a, "k": 5}, "k"),
        "activation": (d, {**a, "activation_type": "gelu_new"}, "activation_type"),
        "swiglu_fusion 2": (d, {**a, "swiglu_fusion": 2}, "swiglu_fusion"),
        "swiglu_fusion with relu": (d, {**a, "activation_type": "relu"}, "swiglu_fusion"),
        "swiglu_limit negative": (d, {**a, "swiglu_limit": -1.0}, "swiglu_limit"),
        "swiglu_limit nan": (d, {**a, "swiglu_limit": float("nan")}, "swiglu_limit"),
        "normalize 2": (d, {**a, "normalize_routing_weights": 2}, "normalize_routing_weights"),
        "accuracy_level 5": (d, {**a, "accuracy_level": 5}, "accuracy_level"),
        "tie_break": (d, {**a, "tie_break": "lowest"}, "tie_break"),
        "precision": (d, {**a, "precision": "fp16"}, "precision"),
        "constant_weights": (d, {**a, "constant_weights": "yes"}, "constant_weights"),
        "rounding without kernel": (d, {**a, "rounding": {"fc1_out": "fp16"}}, "rounding"),
        "rounding key": (d, {**a, "precision": "kernel", "rounding": {"fc3_out": "fp16"}}, "rounding"),
        "rounding act_block": (d, {**a, "precision": "kernel", "rounding": {"act_block": 24}}, "act_block"),
        "rounding dtype": (d, {**a, "precision": "kernel", "rounding": {"act_out": "bf16"}}, "act_out"),
        "input dtype": ({**d, "input": d["input"].astype(np.float64)}, a, "input"),
        "input rank": ({**d, "input": d["input"][0]}, a, "input"),
        "router_probs rows": ({**d, "router_probs": d["router_probs"][:2]}, a, "router_probs"),
        "router_probs dtype": ({**d, "router_probs": d["router_probs"].astype(F16)}, a, "router_probs"),
        "router_probs nan": ({**d, "router_probs": np.full_like(d["router_probs"], np.nan)}, a, "router_probs"),
        "router_weights": ({**d, "router_weights": np.ones((3, 5), F32)}, a, "router_weights"),
        "fc1 weights": ({**d, "fc1_experts_weights": d["fc1_experts_weights"][:, :64]}, a, "fc1_experts_weights"),
        "fc2 weights": ({**d, "fc2_experts_weights": None}, a, "fc2_experts_weights"),
        "fc1 scales dtype": ({**d, "fc1_scales": d["fc1_scales"].astype(F16)}, a, "fc1_scales"),
        "fc2 scales per row": ({**d, "fc2_scales": d["fc2_scales"][:, :, 0]}, a, "fc2_scales"),
        "fc1 zero points": ({**d, "fc1_zero_points": np.zeros((4, 64), np.uint8)}, a, "fc1_zero_points"),
        "fc2 zero points dtype": ({**d, "fc2_zero_points": np.zeros((4, 128, 1), np.int8)}, a, "fc2_zero_points"),
        "fc1 bias": ({**d, "fc1_experts_bias": np.zeros((4, 64), F32)}, a, "fc1_experts_bias"),
        "per-row zero points": ({**per_row, "fc2_zero_points": np.zeros((4, 128, 1), np.uint8)}, ar, "fc2_zero_points"),
    }


@pytest.mark.parametrize("name", list(_bad_cases()))
def test_argument_errors_name_the_argument(name: str) -> None:
    arrays, attrs, argument = _bad_cases()[name]
    with pytest.raises(ArgumentError, match=argument):
        qmoe(**arrays, **attrs)


def test_route_and_moe_argument_errors() -> None:
    lg = np.zeros((2, 4), F32)
    for kw, argument in (
        (dict(k=5), "k"),
        (dict(k=1, tie_break="x"), "tie_break"),
        (dict(k=1, op="x"), "op"),
        (dict(k=1, op="moe", router_weights=lg), "router_weights"),
    ):
        with pytest.raises(ArgumentError, match=argument):
            route(lg, **kw)
    x = np.zeros((2, 8), F16)
    w1, w2 = np.zeros((4, 4, 8), F16), np.zeros((4, 8, 4), F16)
    with pytest.raises(ArgumentError, match="input"):
        moe(x, lg.astype(F16), w1, None, w2, k=1, activation_type="relu")
    with pytest.raises(ArgumentError, match="precision"):
        moe(x.astype(F32), lg, w1.astype(F32), None, w2.astype(F32), k=1, activation_type="relu", precision="kernel")


def test_3d_input_keeps_its_shape() -> None:
    rng = np.random.default_rng(3)
    d = random_qmoe_case(rng, tokens=6, hidden=64, inter=32, experts=4, bits=4, block_size=None, dtype=F16)
    flat = qmoe(**d, k=2, activation_type="swiglu")
    d["input"] = d["input"].reshape(2, 3, 64)
    out = qmoe(**d, k=2, activation_type="swiglu")
    assert out.shape == (2, 3, 64) and out.dtype == F16
    np.testing.assert_array_equal(out.reshape(6, 64), flat)


def test_zero_points_packing_matches_pack_bits() -> None:
    """Per-row zero points for N=3 4-bit rows: two bytes, the last one padded."""
    zp = pack_bits(np.array([[1, 2, 3]], np.uint8), 4)
    assert zp.tolist() == [[0x21, 0x03]]
    lay = FcLayout(N=3, K=2, bits=4, block_size=None)
    w = np.full((1, 3, 1), 0x44, np.uint8)
    assert dequantize_expert(w, np.ones((1, 3), F32), zp, lay, 0).tolist() == [[3, 3], [2, 2], [1, 1]]

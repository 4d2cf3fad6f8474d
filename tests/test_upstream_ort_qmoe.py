"""Cross-check ``qconform.oracles.ort.qmoe`` and ``moe_routing`` against onnxruntime's CPU QMoE and MoE.

Each test builds a one-node com.microsoft.QMoE or MoE model with ``onnx.helper`` (weights, scales, zero
points and biases as initializers, as exported models have them; graph optimizations off; one intra-op
thread) and runs it on the CPU execution provider. Written and run against onnxruntime 1.32.0 on an x86-64
CPU with AVX-512 VNNI; skipped when onnx or onnxruntime is missing, or older than 1.31 (1.30 has no
accuracy_level, runs 8-bit block-wise experts on fp32 activations, and mis-reads block-wise zero points
when K / block_size is not a multiple of 8 / bits -- fixed in 1.31, "zero-point rows padded to a whole
byte"; ``test_zero_point_rows_padded_to_a_byte`` pins the fixed behaviour).

Routing is compared exactly: a probe model with all-zero weights (scales 0), the identity activation and
fc2 bias e_j (one-hot) outputs out[t, j] = routing weight of expert j for token t, so the selected set
(ties included) must be identical and the weights equal to the last bit, except where glibc's expf is one
ulp from the correctly rounded exp (the oracle's): ``qconform.ops.ort.moe_bounds`` step 1 bounds those. Outputs of
the full FFN are compared within the per-element bound derived in ``qconform.ops.ort.moe_bounds`` from the
roundings on both sides (fp32 sums in any order, int8 activation codes that may step, fp16 output rounding).
"""

from __future__ import annotations

import zlib
from dataclasses import replace

import numpy as np
import pytest
from qmoe_bounds import random_moe_case, within

from qconform.errors import ArgumentError
from qconform.impls import CallableImpl
from qconform.ops import get_op
from qconform.ops.ort.moe_bounds import ORT, U, lut_path, moe_bound, qmoe_bound
from qconform.ops.ort.qmoe import random_qmoe_case
from qconform.oracles.ort.moe_routing import SKIP_QMOE, route
from qconform.oracles.ort.packing import pack_bits, packed_size
from qconform.oracles.ort.qmoe import check_qmoe_args, moe, qmoe
from qconform.properties import Prepared, matches_oracle

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
helper, numpy_helper, TP = onnx.helper, onnx.numpy_helper, onnx.TensorProto

ORT_VERSION = tuple(int(p) for p in ort.__version__.split(".")[:2])
if ORT_VERSION < (1, 31):
    pytest.skip(f"onnxruntime {ort.__version__} < 1.31 (see the module docstring)", allow_module_level=True)

pytestmark = pytest.mark.upstream

F32, F16 = np.float32, np.float16
QMOE_INPUTS = (
    "input",
    "router_probs",
    "fc1_experts_weights",
    "fc1_scales",
    "fc1_experts_bias",
    "fc2_experts_weights",
    "fc2_scales",
    "fc2_experts_bias",
    "fc3_experts_weights",
    "fc3_scales",
    "fc3_experts_bias",
    "fc1_zero_points",
    "fc2_zero_points",
    "fc3_zero_points",
    "router_weights",
)
MOE_INPUTS = (
    "input",
    "router_probs",
    "fc1_experts_weights",
    "fc1_experts_bias",
    "fc2_experts_weights",
    "fc2_experts_bias",
)
FEEDS = ("input", "router_probs", "router_weights")
ORACLE_ONLY = ("tie_break", "precision", "rounding")


def _session(op: str, arrays: dict, attrs: dict, constant: bool = True):
    """A CPU session for one QMoE/MoE node; weights are initializers (``constant``) or graph inputs."""
    names = QMOE_INPUTS if op == "QMoE" else MOE_INPUTS
    last = max(i for i, n in enumerate(names) if arrays.get(n) is not None)
    slots = [n if arrays.get(n) is not None else "" for n in names[: last + 1]]
    onnx_attrs = {k: v for k, v in attrs.items() if k not in ORACLE_ONLY and v is not None}
    node = helper.make_node(op, slots, ["out"], domain="com.microsoft", **onnx_attrs)
    inputs, inits = [], []
    for n in filter(None, slots):
        a = np.ascontiguousarray(arrays[n])
        if n in FEEDS or not constant:
            inputs.append(helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape))
        else:
            inits.append(numpy_helper.from_array(a, n))
    elem = helper.np_dtype_to_tensor_dtype(arrays["input"].dtype)
    out = helper.make_tensor_value_info("out", elem, None)
    graph = helper.make_graph([node], "g", inputs, [out], initializer=inits)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _run(op: str, arrays: dict, attrs: dict, constant: bool = True) -> np.ndarray:
    feeds = {n: arrays[n] for n in FEEDS if arrays.get(n) is not None}
    if not constant:
        feeds = {n: a for n, a in arrays.items() if a is not None}
    return _session(op, arrays, attrs, constant).run(None, feeds)[0]


def _seed(*parts: object) -> int:
    return zlib.crc32(repr(parts).encode())


def _check_qmoe(arrays: dict, attrs: dict, constant: bool = True) -> float:
    """ORT's QMoE output within the derived bound of the oracle's; returns the used fraction of the bound."""
    got = _run("QMoE", arrays, attrs, constant)
    ref = qmoe(**arrays, **attrs, constant_weights=constant)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    ok, frac = within(got, ref, qmoe_bound(arrays, attrs, "ort", constant))
    diff = np.abs(got.astype(np.float64) - ref.astype(np.float64)).max()
    assert ok, f"ORT differs from the oracle beyond the bound ({frac:.3g} of it; max |diff| {diff:.3g})"
    return frac


def _attrs(bits: int, block_size: int | None, activation_type: str = "swiglu", k: int = 2, **more) -> dict:
    a = dict(k=k, activation_type=activation_type, expert_weight_bits=bits, block_size=block_size)
    a["swiglu_fusion"] = 1 if activation_type == "swiglu" else 0
    return {**a, **more}


# ---------------------------------------------------------------------------------------------- routing


def _probe_arrays(logits: np.ndarray, op: str, router_weights: np.ndarray | None = None) -> dict:
    """Zero expert weights, fc2 bias e_j: the output row is the token's routing weight per expert."""
    tokens, experts = logits.shape
    dtype = logits.dtype
    hidden = max(16, experts)
    onehot = np.eye(experts, hidden, dtype=dtype)
    if op == "MoE":
        zeros = np.zeros((experts, 16, hidden), dtype)
        return dict(
            input=np.ones((tokens, hidden), dtype),
            router_probs=logits,
            fc1_experts_weights=zeros,
            fc2_experts_weights=np.zeros((experts, hidden, 16), dtype),
            fc2_experts_bias=onehot,
        )
    return dict(
        input=np.ones((tokens, hidden), dtype),
        router_probs=logits,
        fc1_experts_weights=np.zeros((experts, 16, hidden // 2), np.uint8),
        fc1_scales=np.zeros((experts, 16), dtype),
        fc2_experts_weights=np.zeros((experts, hidden, 8), np.uint8),
        fc2_scales=np.zeros((experts, hidden), dtype),
        fc2_experts_bias=onehot,
        router_weights=router_weights,
    )


def _routing_logits(rng, tokens: int, experts: int, dtype) -> np.ndarray:
    """Random logits with rows of deliberate ties (integers, all equal, a tie across the k-th place)."""
    lg = rng.standard_normal((tokens, experts)) * 3
    lg[: tokens // 4] = np.round(lg[: tokens // 4])
    lg[tokens // 4] = 0.5
    lg[tokens // 4 + 1] = [3, 1, 1, 1, 1, 1, 1, 0][:experts]
    return lg.astype(dtype)


def _dense(idx: np.ndarray, w: np.ndarray, experts: int, skip: float) -> np.ndarray:
    out = np.zeros((len(idx), experts), np.float64)
    rows = np.arange(len(idx))[:, None]
    np.add.at(out, (np.broadcast_to(rows, idx.shape), idx), np.where(w > skip, w, 0).astype(np.float64))
    return out


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("router_weights", [False, True])
def test_qmoe_routing_is_exact(dtype, k: int, router_weights: bool) -> None:
    """Selected experts exactly (equal logits: the higher expert index first), weights to the last bit
    (or one expf ulp), normalize_routing_weights ignored without router_weights, honoured with them."""
    rng = np.random.default_rng(10 + k)
    experts = 8
    logits = _routing_logits(rng, 96, experts, dtype)
    rw = rng.random(logits.shape).astype(dtype) if router_weights else None
    if rw is not None:
        rw[:4] = 0  # zero weights: the experts are selected but skipped
    outs = []
    for norm in (0, 1):
        got = _run(
            "QMoE",
            _probe_arrays(logits, "QMoE", rw),
            dict(k=k, activation_type="identity", normalize_routing_weights=norm),
        )[:, :experts].astype(np.float64)
        idx, w = route(logits, k, op="qmoe", normalize_routing_weights=norm, router_weights=rw)
        exp = _dense(idx, w, experts, float(SKIP_QMOE))
        sel = exp != 0
        if dtype == F32:
            assert np.array_equal(got != 0, sel), "the selected experts differ"
            assert np.mean(got[sel] == exp[sel]) >= 0.98, "the weights are not ORT's fp32 roundings"
            allow = (8 + 2 * k) * U * np.abs(exp)
        else:
            exp = exp.astype(F16).astype(np.float64)
            assert np.array_equal(got != 0, exp != 0), "the selected experts differ"
            allow = (8 + 2 * k) * U * np.abs(exp) + np.spacing(np.abs(exp).astype(F16)).astype(np.float64)
        assert (np.abs(got - exp) <= allow).all()
        outs.append(got)
        lower = _dense(
            *route(logits, k, "lower", op="qmoe", normalize_routing_weights=norm, router_weights=rw),
            experts,
            float(SKIP_QMOE),
        )
        assert not np.array_equal(got != 0, lower != 0), "the tie rows do not tell the tie rules apart"
    if rw is None:
        assert np.array_equal(outs[0], outs[1]), "QMoE's weights depend on normalize_routing_weights"
    elif k > 1:
        assert not np.array_equal(outs[0], outs[1])


def test_qmoe_skips_weights_below_1e_8() -> None:
    """A selected expert whose softmax weight is <= 1e-8 contributes nothing (ORT's skip threshold)."""
    logits = np.array([[0, -17, -18.5, -30], [0, -18.0, -18.5, -19], [3, 3, -15.0, -25]], F32)
    idx, w = route(logits, 3)
    assert ((w > 0) & (w <= SKIP_QMOE)).any() and ((w > SKIP_QMOE) & (w < 1e-7)).any()
    got = _run("QMoE", _probe_arrays(logits, "QMoE"), dict(k=3, activation_type="identity"))[:, :4]
    exp = _dense(idx, w, 4, float(SKIP_QMOE))
    assert np.array_equal(got != 0, exp != 0)
    assert (np.abs(got - exp) <= 14 * U * exp).all()


@pytest.mark.parametrize("k", [1, 2, 3])
def test_moe_routing_is_exact_and_differs_from_qmoe(k: int) -> None:
    """MoE: full softmax, top k of the probabilities (ties: the higher index), renormalized only with
    normalize_routing_weights=1; at 0 the weights are the full-softmax probabilities, unlike QMoE's."""
    rng = np.random.default_rng(20 + k)
    experts = 8
    logits = _routing_logits(rng, 96, experts, F32)
    for norm in (0, 1):
        got = _run(
            "MoE", _probe_arrays(logits, "MoE"), dict(k=k, activation_type="identity", normalize_routing_weights=norm)
        )[:, :experts].astype(np.float64)
        idx, w = route(logits, k, op="moe", normalize_routing_weights=norm)
        exp = _dense(idx, w, experts, 0.0)
        assert np.array_equal(got != 0, exp != 0)
        assert np.mean(got[exp != 0] == exp[exp != 0]) >= 0.98
        assert (np.abs(got - exp) <= (8 + 2 * (experts + k)) * U * np.abs(exp)).all()
        q = _run(
            "QMoE", _probe_arrays(logits, "QMoE"), dict(k=k, activation_type="identity", normalize_routing_weights=norm)
        )[:, :experts].astype(np.float64)
        assert np.array_equal(q != 0, got != 0), "MoE and QMoE select different experts"
        if norm == 0:
            assert np.abs(q - got).max() > 0.05, "MoE and QMoE agree at normalize_routing_weights=0"
        else:
            assert np.abs(q - got).max() <= 4 * 2**-23


# ---------------------------------------------------------------------------------------------- QMoE FFN

GRID = [
    (dtype, bits, bs, zp)
    for dtype in (F32, F16)
    for bits in (2, 4, 8)
    for bs in (None, 16, 32, 64, 128)
    for zp in (False, True)
    if bs != 16 or bits == 2
]


@pytest.mark.parametrize("dtype,bits,block_size,zero_points", GRID)
def test_qmoe_matches_ort(dtype, bits: int, block_size, zero_points: bool) -> None:
    """fp32/fp16, 2/4/8-bit, per-row and block-wise scales (H=256, I=128: bs 128 leaves fc2 one block per
    row), zero points or the default 2**(bits-1), with and without biases, SwiGLU with gpt-oss attributes;
    4-bit block-wise runs at accuracy_level 4 (int8 activations) with zero points, 0 without."""
    rng = np.random.default_rng(_seed(np.dtype(dtype).name, bits, block_size, zero_points))
    bias = zero_points != (block_size in (None, 64))
    d = random_qmoe_case(
        rng,
        tokens=6,
        hidden=256,
        inter=128,
        experts=4,
        bits=bits,
        block_size=block_size,
        dtype=dtype,
        zero_points=zero_points,
        bias=bias,
    )
    acc = 4 if (bits == 4 and block_size and zero_points) else 0
    attrs = _attrs(bits, block_size, activation_alpha=1.702, activation_beta=1.0, swiglu_limit=7.0, accuracy_level=acc)
    _check_qmoe(d, attrs)


@pytest.mark.parametrize("hidden,block_size,lut", [(128, 128, True), (64, 64, False)])
def test_qmoe_2bit_lut_path_follows_mlas_rule(hidden: int, block_size: int, lut: bool) -> None:
    """2-bit block-wise: ORT takes MLAS's LUT GEMM (int8 tables of activation sums) where the block size and
    K are multiples of 32 and N of 128, one block per row included (moe_bounds.lut_path). N = 128: the LUT,
    ORT ~1e-2 off the fp32 reference (beyond the fp32-activation bound); N = 64: fp32 activations, ~1e-7."""
    d = random_qmoe_case(np.random.default_rng(1), tokens=2, hidden=hidden, inter=hidden, experts=1, bits=2,
                         block_size=block_size, activation_type="identity")  # fmt: skip
    attrs = _attrs(2, block_size, "identity", k=1)
    lay = check_qmoe_args(**d, **attrs)
    assert lay.fc1.blocks == lay.fc2.blocks == 1 and lut_path(lay.fc1) == lut_path(lay.fc2) == lut
    _check_qmoe(d, attrs)
    if lut:
        fp32_only = replace(ORT, lut=False)
        assert not within(_run("QMoE", d, attrs), qmoe(**d, **attrs), qmoe_bound(d, attrs, fp32_only))[0]


@pytest.mark.parametrize("activation_type", ["relu", "gelu", "silu", "identity"])
@pytest.mark.parametrize("dtype,bits,block_size", [(F32, 8, 32), (F16, 4, None)])
def test_qmoe_activations(activation_type: str, dtype, bits: int, block_size) -> None:
    rng = np.random.default_rng(_seed(activation_type, bits))
    d = random_qmoe_case(
        rng,
        tokens=5,
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
    _check_qmoe(d, _attrs(bits, block_size, activation_type, k=3))


SWIGLU = [(1.0, 0.0, None), (1.702, 1.0, 7.0), (1.702, 1.0, 0.25), (0.5, -0.5, 2.0)]


@pytest.mark.parametrize("alpha,beta,limit", SWIGLU)
def test_qmoe_swiglu_attributes(alpha: float, beta: float, limit) -> None:
    """Interleaved gate/linear with alpha, beta and the optional limit (0.25 clamps most values); the
    bound tells a missing limit or beta apart."""
    rng = np.random.default_rng(7)
    d = random_qmoe_case(rng, tokens=6, hidden=128, inter=64, experts=4, bits=4, block_size=32, bias=True)
    attrs = _attrs(4, 32, activation_alpha=alpha, activation_beta=beta, swiglu_limit=limit)
    _check_qmoe(d, attrs)
    if limit == 0.25:
        got = _run("QMoE", d, attrs)
        for wrong in ({**attrs, "swiglu_limit": None}, {**attrs, "activation_beta": 0.0}):
            assert not within(got, qmoe(**d, **wrong), qmoe_bound(d, wrong))[0]


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_qmoe_k(k: int) -> None:
    rng = np.random.default_rng(30 + k)
    d = random_qmoe_case(rng, tokens=8, hidden=128, inter=64, experts=8, bits=8, block_size=64, zero_points=True)
    _check_qmoe(d, _attrs(8, 64, k=k))


@pytest.mark.parametrize("k", [1, 2])
def test_qmoe_all_tokens_to_one_expert(k: int) -> None:
    """Routing skew: every token's largest logit is expert 5 (one expert gets the whole batch)."""
    rng = np.random.default_rng(40 + k)
    d = random_qmoe_case(rng, tokens=16, hidden=128, inter=64, experts=8, bits=4, block_size=32, dtype=F16)
    d["router_probs"] = (d["router_probs"].astype(F32) + 10 * (np.arange(8) == 5)).astype(F16)
    assert (route(d["router_probs"], k)[0][:, 0] == 5).all()
    _check_qmoe(d, _attrs(4, 32, k=k, accuracy_level=4))


REAL = {  # small versions of real models' MoE layers (hidden and inter scaled down; E, k, layout kept)
    "gpt-oss-20b": dict(
        experts=32,
        k=4,
        hidden=256,
        inter=256,
        bits=4,
        block_size=32,
        dtype=F16,
        bias=True,
        attrs=dict(activation_alpha=1.702, activation_beta=1.0, swiglu_limit=7.0),
    ),
    "qwen3-30b-a3b": dict(
        experts=64,
        k=8,
        hidden=256,
        inter=96,
        bits=4,
        block_size=32,
        dtype=F16,
        zp=True,
        attrs=dict(normalize_routing_weights=1),
    ),
    "phi-3.5-moe": dict(experts=16, k=2, hidden=256, inter=384, bits=8, block_size=None, dtype=F32, attrs={}),
    "mixtral-8x7b": dict(
        experts=8, k=2, hidden=256, inter=512, bits=4, block_size=128, dtype=F16, attrs=dict(accuracy_level=4)
    ),
    "deepseek-style router_weights": dict(
        experts=16,
        k=4,
        hidden=128,
        inter=64,
        bits=8,
        block_size=64,
        dtype=F32,
        zp=True,
        rw=True,
        attrs=dict(normalize_routing_weights=1),
    ),
}


@pytest.mark.parametrize("name", list(REAL))
def test_qmoe_real_shapes(name: str) -> None:
    c = REAL[name]
    rng = np.random.default_rng(len(name))
    d = random_qmoe_case(
        rng,
        tokens=5,
        hidden=c["hidden"],
        inter=c["inter"],
        experts=c["experts"],
        bits=c["bits"],
        block_size=c["block_size"],
        dtype=c["dtype"],
        zero_points=c.get("zp", False),
        bias=c.get("bias", False),
        router_weights=c.get("rw", False),
    )
    _check_qmoe(d, _attrs(c["bits"], c["block_size"], k=c["k"], **c["attrs"]))


def test_qmoe_3d_input() -> None:
    rng = np.random.default_rng(50)
    d = random_qmoe_case(rng, tokens=6, hidden=128, inter=64, experts=4, bits=4, block_size=None, bias=True)
    d["input"] = d["input"].reshape(2, 3, 128)
    _check_qmoe(d, _attrs(4, None))


def test_int8_activations_only_with_constant_weights() -> None:
    """8-bit block-wise experts take ORT's int8 activation path when the weights are initializers (the bound
    rejects the fp32 reading there) and stay on fp32 activations when they are graph inputs."""
    rng = np.random.default_rng(60)
    d = random_qmoe_case(rng, tokens=6, hidden=128, inter=64, experts=4, bits=8, block_size=32, zero_points=True)
    attrs = _attrs(8, 32)
    got = _run("QMoE", d, attrs)
    assert not within(got, qmoe(**d, **attrs, constant_weights=False), qmoe_bound(d, attrs, "ort", False))[0]
    _check_qmoe(d, attrs)
    _check_qmoe(d, attrs, constant=False)


@pytest.mark.parametrize("bits,inter", [(4, 16), (4, 48), (2, 48), (8, 48)])
def test_zero_point_rows_padded_to_a_byte(bits: int, inter: int) -> None:
    """Block-wise zero points with K / block_size = 1 or 3 blocks per row: each row padded to a whole byte
    (wrong in onnxruntime 1.30, right since 1.31); the padding bits hold junk and are never read."""
    rng = np.random.default_rng(70 + bits + inter)
    d = random_qmoe_case(
        rng, tokens=6, hidden=64, inter=inter, experts=4, bits=bits, block_size=16, zero_points=True, bias=True
    )
    for name, n, k in (("fc1", 2 * inter, 64), ("fc2", 64, inter)):
        nb = k // 16
        codes = rng.integers(0, 1 << bits, (4, n, nb), dtype=np.uint8)
        junk = rng.integers(0, 256, (4, n, packed_size(nb, bits)), dtype=np.uint8)
        used = pack_bits(np.full((4, n, nb), (1 << bits) - 1, np.uint8), bits)
        d[f"{name}_zero_points"] = pack_bits(codes, bits) | (junk & ~used)
    _check_qmoe(d, _attrs(bits, 16, accuracy_level=4))


def test_validation_agrees_with_ort() -> None:
    """Arguments ORT's CPU rejects, the oracle rejects too (ArgumentError naming the argument). A negative
    swiglu_limit is not run here: it aborts onnxruntime 1.32 (std::clamp with hi < lo)."""
    rng = np.random.default_rng(80)
    base = random_qmoe_case(rng, tokens=4, hidden=128, inter=64, experts=4, bits=4, block_size=None)
    blocked = random_qmoe_case(rng, tokens=4, hidden=128, inter=64, experts=4, bits=4, block_size=32)
    cases = {
        "k": (base, _attrs(4, None, k=5)),
        "swiglu_fusion": (base, {**_attrs(4, None), "swiglu_fusion": 2}),
        "expert_weight_bits": (base, _attrs(3, None)),
        "fc1_scales": ({**base, "fc1_scales": base["fc1_scales"].astype(F16)}, _attrs(4, None)),
        "fc2_zero_points": ({**blocked, "fc2_zero_points": np.zeros((4, 64), np.uint8)}, _attrs(4, 32)),
    }
    for bs in (8, 48):
        cases[f"block_size {bs}"] = (
            {
                **blocked,
                "fc1_scales": blocked["fc1_scales"][:, :, :1].repeat(128 // bs, 2),
                "fc2_scales": blocked["fc2_scales"][:, :, :1].repeat(64 // bs, 2),
            },
            _attrs(4, bs),
        )
    for what, (arrays, attrs) in cases.items():
        try:
            _run("QMoE", arrays, attrs)
        except Exception as e:  # onnxruntime's Fail / InvalidArgument / InvalidGraph / RuntimeException
            assert type(e).__module__.startswith("onnxruntime"), e
        else:
            raise AssertionError(f"onnxruntime accepted the bad {what}")
        with pytest.raises(ArgumentError, match=what.split()[0]):
            qmoe(**arrays, **attrs)


# ---------------------------------------------------------------------------------------------- MoE


@pytest.mark.parametrize("activation_type", ["relu", "gelu", "silu", "identity", "swiglu"])
@pytest.mark.parametrize("normalize", [0, 1])
def test_moe_matches_ort(activation_type: str, normalize: int) -> None:
    rng = np.random.default_rng(_seed(activation_type, normalize))
    d = random_moe_case(rng, tokens=6, hidden=64, inter=32, experts=6, activation_type=activation_type, bias=True)
    attrs = dict(k=2 + normalize, activation_type=activation_type, normalize_routing_weights=normalize)
    if activation_type == "swiglu":
        attrs.update(swiglu_fusion=1, activation_alpha=1.702, activation_beta=1.0, swiglu_limit=7.0)
    got = _run("MoE", d, attrs)
    ref = moe(**d, **attrs)
    ok, frac = within(got, ref, moe_bound(d, attrs))
    assert ok, frac


# ---------------------------------------------------------------------------------------------- catalogue


def ort_qmoe(*args, out=None, **attrs):
    """ORT's CPU provider as a ``py:`` implementation of the catalogue's qmoe_decode / qmoe_ragged_mm
    (weights as initializers; the oracle's argument rules first)."""
    qmoe(*args, out=out, **attrs)
    names = ("input", "router_probs", "fc1_experts_weights", "fc1_scales", "fc1_experts_bias", "fc2_experts_weights")
    names += ("fc2_scales", "fc2_experts_bias", "fc1_zero_points", "fc2_zero_points", "router_weights")
    got = _run("QMoE", dict(zip(names, args, strict=True)), attrs)
    if out is None:
        return got
    out[...] = got
    return out


@pytest.mark.parametrize("op_name", ["qmoe_decode", "qmoe_ragged_mm"])
def test_ort_passes_the_catalogue(op_name: str) -> None:
    """Every coverage-2 case of every leaf of the catalogue entry within the bound of
    qconform.ops.ort.moe_bounds (strict contract: ORT's int8 activations are one accepted reading)."""
    op = get_op(op_name)
    impl = CallableImpl("ort", ort_qmoe, (op_name,))
    for leaf in op.leaves:
        for case in op.cases(leaf.name, 2):
            outcome = matches_oracle(impl, op, Prepared.from_case(op, case, impl))
            assert outcome.ok, (leaf.name, case.id, outcome.detail)

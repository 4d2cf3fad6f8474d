"""Catalogue entries qmoe_decode and qmoe_ragged_mm (com.microsoft.QMoE; oracle:
``qconform.oracles.ort.qmoe``, routing ``moe_routing``; semantics in docs/ort-ops.md section 5).

Shape (tokens, H, I, E): tokens, hidden size, intermediate size, experts. ``qmoe_decode``: one
token; ``qmoe_ragged_mm``: several, so each expert's GEMM takes a ragged group of them (a prefill).
Weights per expert row-major (N, K) packed along K, low bits first; fc1 holds 2I rows with SwiGLU
(gate and linear interleaved, ``swiglu_fusion`` 1) and I otherwise; scales per row or per block
of ``bs`` (32, 64, 128: block_size; 0: per row), zero points (``zp``) packed, default 2^(bits-1);
biases (``bias``) in the input's dtype; router_probs raw logits.

Check "bound" (``qconform.ops.ort.moe_bounds``): routing is exact (the experts an implementation
picks are the oracle's: top-k of the fp32 logits, ties to the higher expert index as ORT's CPU
breaks them); the output element by element within the propagated bound of its reading:
|got - ref| <= u_out |ref| + (1 + u_out) slack, ref the reading's fp32 value (the oracle's
reference before its one rounding of the output; fp16 inputs widened exactly to fp32), slack the
bound on two fp32 implementations' distance (``moe_bounds``, ``kernel_side`` of the contract):
the routing weights' softmax (exp within 4 ulp), each projection's K products and bias summed in
any order (the contract's accumulation: fp32 by default, lambda sqrt(n) u; fp16 / bf16 chains of
a quantization block), the activation (its slopes and roundings), the k weighted expert outputs,
and with ``storage`` fp16 / bf16 weights, fc inputs and fc1's output held in that type.
Readings (the contract's ``level4`` picks, "either" both): where ORT's CPU quantizes the fc
inputs to int8 (block-wise weights, 8-bit at any accuracy_level or 4-bit at 4: ORT's CompInt8
activations, block = block_size), "int8 activations (ORT CPU)" (codes from any round-to-nearest
of ORT's fp32 scale), and always "fp32 activations". The oracle's "kernel" precision (fp16 h and
activation, int8 activations) passes with storage=fp16. No case holds a subnormal value.

Case knobs (params): k, bs, zp, bias, act_type (swiglu, silu, gelu, relu, identity), swiglu (oss:
gpt-oss's alpha 1.702, beta 1, limit 7; plain: 1, 0, no limit; clamp: 1.702, 1, 0.5, a limit
inside unit-size activations), rw (router_weights: plain or
norm, i.e. renormalized), level (accuracy_level). An ONNX attribute named in the params
overrides (bad arguments). Patterns: normal (logits 2 N(0,1)), skew (one expert per token 30
above the rest: the others' weights < 1e-8, skipped; some tokens only 8 above), ties (logits
on 0, 0.5, 1, every token with an unselected logit equal to the k-th largest: which expert is
taken is the tie rule's, the higher index), core (kernel-shaped).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from qconform.contracts import Contract
from qconform.errors import Declined
from qconform.ops.abi import DTYPE, F32, I64, Abi, Bound, Enum, In, Out, call_arguments, dtype_code
from qconform.ops.ort._common import ACTS, leaf_params, validating
from qconform.ops.ort.moe_bounds import kernel_side, qmoe_bound
from qconform.ops.spec import BadArgument, Case, Check, Leaf, OpSpec
from qconform.oracles.ort import check_qmoe_args, qmoe
from qconform.oracles.ort.packing import pack_bits
from qconform.oracles.ort.qmoe import ACTIVATIONS, uses_int8_activations
from qconform.readings import ErrorModel, Expected

LEAVES = (
    Leaf("Xfp16_Wu4_Yfp16", {"act": "fp16", "bits": 4}),
    Leaf("Xfp16_Wu8_Yfp16", {"act": "fp16", "bits": 8}),
    Leaf("Xfp32_Wu4_Yfp32", {"act": "fp32", "bits": 4}),
)
INPUTS = (
    "input",
    "router_probs",
    "fc1_experts_weights",
    "fc1_scales",
    "fc1_experts_bias",
    "fc2_experts_weights",
    "fc2_scales",
    "fc2_experts_bias",
    "fc1_zero_points",
    "fc2_zero_points",
    "router_weights",
)
ATTRIBUTES = (
    "k",
    "activation_type",
    "normalize_routing_weights",
    "expert_weight_bits",
    "block_size",
    "swiglu_fusion",
    "activation_alpha",
    "activation_beta",
    "swiglu_limit",
    "accuracy_level",
)
# (alpha, beta, limit); clamp: a limit inside unit-size activations, so the gate's and the linear half's bite
SWIGLU = {"oss": (1.702, 1.0, 7.0), "plain": (1.0, 0.0, None), "clamp": (1.702, 1.0, 0.5)}
DECODE, RAGGED = "qmoe_decode", "qmoe_ragged_mm"
KNOB_DEFAULTS = {"bs": 0, "zp": False, "bias": False, "act_type": "swiglu", "swiglu": "plain", "rw": "none", "level": 0}

# ------------------------------------------------------------------------------------------ inputs


def random_qmoe_case(
    rng: np.random.Generator,
    *,
    tokens: int,
    hidden: int,
    inter: int,
    experts: int,
    bits: int,
    block_size: int | None,
    dtype: type = np.float32,
    zero_points: bool = False,
    bias: bool = False,
    activation_type: str = "swiglu",
    router_weights: bool = False,
    logit_scale: float = 2.0,
) -> dict:
    """QMoE inputs with every code value drawn uniformly (packed low bits first), scales near
    2 / (2**bits sqrt(K)) so each layer keeps unit-size activations, optional zero points (uniform
    codes, the block-wise layout even with one block per row) and biases."""
    f = 2 if activation_type == "swiglu" else 1
    d = {
        "input": rng.standard_normal((tokens, hidden)).astype(dtype),
        "router_probs": (rng.standard_normal((tokens, experts)) * logit_scale).astype(dtype),
    }
    for name, n, k in (("fc1", f * inter, hidden), ("fc2", hidden, inter)):
        d[f"{name}_experts_weights"] = pack_bits(rng.integers(0, 1 << bits, (experts, n, k), dtype=np.uint8), bits)
        nb = 1 if block_size is None else k // block_size
        s = (rng.uniform(0.5, 1.5, (experts, n, nb)) * 2.0 / ((1 << bits) * np.sqrt(k))).astype(dtype)
        d[f"{name}_scales"] = s[:, :, 0] if block_size is None else s
        if zero_points:
            shape = (experts, n) if block_size is None else (experts, n, nb)
            d[f"{name}_zero_points"] = pack_bits(rng.integers(0, 1 << bits, shape, dtype=np.uint8), bits)
        if bias:
            d[f"{name}_experts_bias"] = (rng.standard_normal((experts, n)) * 0.1).astype(dtype)
    if router_weights:
        d["router_weights"] = rng.random((tokens, experts)).astype(dtype)
    return d


def make_inputs(case: Case) -> dict[str, np.ndarray]:
    """``random_qmoe_case`` for the case's shape and knobs; the pattern's logits (module docstring)."""
    p = {**leaf_params(LEAVES, case.leaf), **case.params}
    rng = np.random.default_rng(case.seed)
    T, hidden, inter, E = case.shape
    d = random_qmoe_case(
        rng,
        tokens=T,
        hidden=hidden,
        inter=inter,
        experts=E,
        bits=p["bits"],
        block_size=p.get("bs") or None,
        dtype=ACTS[p["act"]],
        zero_points=p.get("zp", False),
        bias=p.get("bias", False),
        activation_type=p.get("act_type", "swiglu"),
        router_weights=p.get("rw", "none") != "none",
    )
    logits = d["router_probs"].astype(np.float64)
    if case.pattern == "skew":
        top = rng.integers(0, E, T)
        logits[np.arange(T), top] += np.where(rng.random(T) < 0.75, 30.0, 8.0)
    elif case.pattern == "ties":  # every token: an unselected expert's logit equal to the k-th largest
        logits = rng.integers(0, 3, (T, E)) * 0.5
        for row in logits:
            kth = np.sort(row)[::-1][min(p["k"], E) - 1]
            below = np.flatnonzero(row < kth)
            if below.size:
                row[rng.choice(below)] = kth
    d["router_probs"] = logits.astype(d["router_probs"].dtype)
    return d


def attributes(params: dict[str, Any]) -> dict[str, Any]:
    """The ONNX attributes of a case (an attribute given by name in the params overrides)."""
    act = params.get("act_type", "swiglu")
    alpha, beta, limit = SWIGLU[params.get("swiglu", "plain")]
    attrs: dict[str, Any] = {
        "k": params["k"],
        "activation_type": act,
        "normalize_routing_weights": int(params.get("rw") == "norm"),
        "expert_weight_bits": params["bits"],
        "block_size": params.get("bs") or None,
        "swiglu_fusion": int(act == "swiglu"),
        "activation_alpha": alpha,
        "activation_beta": beta,
        "swiglu_limit": limit,
        "accuracy_level": params.get("level", 0),
    }
    attrs.update({k: params[k] for k in ATTRIBUTES if k in params})
    return attrs


def qmoe_call(inputs: dict[str, Any], params: dict[str, Any]) -> tuple[tuple, dict]:
    """``qmoe(*args, **kwargs)`` for the inputs (ORT's input names) and params."""
    return tuple(inputs.get(name) for name in INPUTS), attributes(params)


# ------------------------------------------------------------------------------------------- cases


def _case(op: str, leaf: str, seed: int, shape: tuple[int, ...], pattern: str = "normal", **knobs: Any) -> Case:
    """A case with the knobs that are on (the rest default: per-row scales, no zero points or
    bias, SwiGLU plain, no router_weights, accuracy_level 0)."""
    params = {k: v for k, v in knobs.items() if v != KNOB_DEFAULTS.get(k)}
    return Case(op, leaf, seed, shape, pattern, params)


def _cases(op: str, leaf: str, coverage: int) -> list[Case]:
    """coverage 1 (small: H, I 16..96, 2..4 experts): block 32 (one and several blocks a row) and
    per row, zero points and biases on and off, SwiGLU with gpt-oss's attributes, plain and a tight
    limit, gelu with plain router_weights, the patterns skew and ties.
    coverage 2: the real models scaled (H and I an eighth to a sixteenth, E a quarter; k, the
    activation, the block and the H : I ratio kept, so a ragged case's oracle, which touches every
    expert, takes about a second): Mixtral-8x7B (H 4096 -> 256, I 14336 -> 896, 8 experts, k 2,
    block 128), Qwen3-30B-A3B (2048 -> 256, 768 -> 96, 128 -> 32 experts, k 8, block 32),
    gpt-oss-20b (2880 -> 384, I 384, 32 -> 8 experts, k 4, block 32, SwiGLU 1.702 / 1 / 7, biases),
    DeepSeek-V2-Lite (2048 -> 256, 1408 -> 176, 64 -> 16 experts, k 6, per-row scales); silu,
    gelu, relu and identity; router_weights plain and renormalized; accuracy_level 4 (ORT's int8
    activations for 4-bit block-wise weights); block 64 with 128-wide layers; a router of 256
    experts (k 2, ties; a fused routing may take another road when E^2 is large against k).
    coverage 3: the models' own sizes.

    core: kernel-shaped (pattern ``core``, seeds 400..; 1 at coverage 1, 5 from coverage 2): H and
    I multiples of 32 (of 128 from coverage 2), blocks 32..128, E 2..64, k 1..8; tokens 1 (decode)
    or 1..64 (ragged)."""
    rag = op == RAGGED

    def t(n: int) -> int:
        return n if rag else 1

    out = [
        _case(op, leaf, 1, (t(4), 32, 32, 3), k=2, bs=32, zp=True, bias=True, swiglu="oss"),
        _case(op, leaf, 2, (t(3), 32, 16, 4), "ties", k=2),
        _case(op, leaf, 3, (t(5), 32, 16, 4), "skew", k=3, zp=True, rw="norm", swiglu="clamp"),
        _case(op, leaf, 4, (t(2), 64, 96, 3), k=2, bs=32, zp=True),  # 2 and 3 scale blocks a row
        _case(op, leaf, 5, (t(3), 32, 32, 4), k=2, act_type="gelu", rw="plain"),
        _case(op, leaf, 400, (t(8), 32, 32, 2), "core", k=1, bs=32, bias=True),
    ]
    if coverage >= 2:
        out += [
            _case(op, leaf, 10, (t(16), 256, 896, 8), k=2, bs=128),  # Mixtral-8x7B
            _case(op, leaf, 11, (t(64), 256, 96, 32), k=8, bs=32, zp=True),  # Qwen3-30B-A3B
            _case(op, leaf, 12, (t(32), 384, 384, 8), k=4, bs=32, bias=True, swiglu="oss"),  # gpt-oss-20b
            _case(op, leaf, 13, (t(7), 256, 176, 16), k=6, zp=True),  # DeepSeek-V2-Lite
            _case(op, leaf, 14, (t(6), 128, 128, 4), k=2, bs=64, act_type="silu", bias=True),
            _case(op, leaf, 15, (t(5), 128, 64, 4), "skew", k=2, act_type="gelu", zp=True),
            _case(op, leaf, 16, (t(9), 64, 64, 6), "ties", k=3, bs=32, act_type="relu", rw="plain"),
            _case(op, leaf, 17, (t(3), 64, 32, 3), k=3, act_type="identity", bias=True),
            _case(op, leaf, 18, (t(12), 256, 128, 8), k=2, bs=32, zp=True, level=4),
            _case(op, leaf, 19, (t(10), 128, 64, 5), "skew", k=5, bs=64, rw="norm", swiglu="clamp"),
            _case(op, leaf, 24, (t(3), 32, 32, 256), "ties", k=2, bs=32),  # a wide router (256 experts)
        ]
        core = [
            ((t(1), 256, 512, 8), {"k": 2, "bs": 128}),
            ((t(16), 256, 256, 16), {"k": 4, "bs": 64, "zp": True}),
            ((t(32), 256, 128, 16), {"k": 8, "bs": 32, "bias": True, "swiglu": "oss"}),
            ((t(64), 128, 256, 32), {"k": 6, "bs": 128, "level": 4}),
        ]
        out += [_case(op, leaf, 401 + i, shape, "core", **kw) for i, (shape, kw) in enumerate(core)]
    if coverage >= 3:
        out += [
            _case(op, leaf, 20, (t(64), 4096, 14336, 8), k=2, bs=128),
            _case(op, leaf, 21, (t(512), 2048, 768, 128), k=8, bs=128),
            _case(op, leaf, 22, (t(128), 2880, 2880, 32), k=4, bs=32, bias=True, swiglu="oss"),
            _case(op, leaf, 23, (t(64), 2048, 1408, 64), k=6, zp=True),
        ]
    return out


def _strategy(op: str, leaf: str) -> Any:
    """Seed, shape and knobs drawn; a block that does not divide H and I becomes per-row."""

    def build(seed, tokens, hidden, inter, experts, k, bs, zp, bias, act, pattern, rw):
        if hidden % max(bs, 1) or inter % max(bs, 1):
            bs = 0
        shape = (tokens if op == RAGGED else 1, hidden, inter, experts)
        return _case(op, leaf, seed, shape, pattern, k=min(k, experts), bs=bs, zp=zp, bias=bias, act_type=act, rw=rw)

    return st.builds(
        build,
        seed=st.integers(0, 2**32 - 1),
        tokens=st.integers(2, 16),
        hidden=st.sampled_from([32, 64, 128]),
        inter=st.sampled_from([16, 32, 64]),
        experts=st.integers(1, 8),
        k=st.integers(1, 4),
        bs=st.sampled_from([0, 32, 64]),
        zp=st.booleans(),
        bias=st.booleans(),
        act=st.sampled_from(ACTIVATIONS),
        pattern=st.sampled_from(["normal", "skew", "ties"]),
        rw=st.sampled_from(["none", "plain", "norm"]),
    )


# --------------------------------------------------------------------------------------- numerics

PATHS = {"int8": "int8 activations (ORT CPU)", "float": "fp32 activations"}


def _widened(arrays: tuple) -> tuple:
    """fp16 arrays widened to fp32 (exact): the oracle then returns its fp32 value before the
    output's one rounding to fp16."""
    return tuple(a.astype(np.float32) if isinstance(a, np.ndarray) and a.dtype == np.float16 else a for a in arrays)


def qmoe_numerics(inputs: dict[str, Any], params: dict[str, Any], contract: Contract, ftz: bool) -> list[Expected]:
    """The readings the contract accepts (module docstring), each with its error model."""
    args, attrs = qmoe_call(inputs, params)
    lay = check_qmoe_args(*args, **attrs)
    level = attrs["accuracy_level"]
    int8 = any(uses_int8_activations(fc, level) for fc in (lay.fc1, lay.fc2))
    paths = {"either": ("int8", "float"), "int8": ("int8",), "float": ("float",)}[contract.level4] if int8 else ()
    paths = paths or ("float",)
    chain = attrs["block_size"] or 32
    other = kernel_side(contract, chain)
    named = dict(zip(INPUTS, args, strict=True))
    out = []
    for path in paths:
        constant = path == "int8"
        want = qmoe(*args, **attrs, constant_weights=constant)
        ref = qmoe(*_widened(args), **attrs, constant_weights=constant).astype(np.float64)
        slack = qmoe_bound({k: v for k, v in named.items() if v is not None}, attrs, other, constant)
        model = ErrorModel(
            ref=ref,
            mag=np.zeros(ref.shape),
            store_mag=np.zeros(ref.shape),
            n_terms=max(lay.hidden, lay.inter),
            chain=chain,
            out_dtype=want.dtype,
            path=PATHS[path],
            diagnose=lambda at, diff: f"token {at[0]}, hidden column {at[-1]}",
            slack=slack,
            slack_label=f"routing, fc1, activation, fc2 and the expert sum (moe_bounds, contract {contract})",
        )
        out.append(Expected(PATHS[path], want, model, plain=constant or not int8))
    return out


# ---------------------------------------------------------------------------------- bad arguments


def _bad(op: str, leaf: str) -> list[BadArgument]:
    """One call per rule of ``check_qmoe_args`` (and ``out``), from a valid small call with
    block-wise scales, zero points, biases and router_weights."""
    case = _case(op, leaf, 6, (3 if op == RAGGED else 1, 32, 32, 4), k=2, bs=32, zp=True, bias=True, rw="plain")
    good = make_inputs(case)
    p = {**leaf_params(LEAVES, leaf), **case.params}
    act = good["input"].dtype
    other = np.float32 if act == np.float16 else np.float16
    T = good["input"].shape[0]

    def bad(rule: str, arg: str, match: str, params: dict | None = None, bad_out: Any = None, **changed: Any):
        return BadArgument(rule, {**good, **changed}, {**p, **(params or {})}, bad_out, arg=arg, match=match)

    return [
        bad("k must be <= num_experts", "k", "num_experts", {"k": 5}),
        bad("activation_type must be relu, gelu, silu, identity or swiglu", "activation_type", "one of",
            {"activation_type": "tanh"}),
        bad("swiglu_fusion must be 1 with swiglu", "swiglu_fusion", "only 1|interleaved", {"swiglu_fusion": 0}),
        bad("normalize_routing_weights must be 0 or 1", "normalize_routing_weights", "0 or 1",
            {"normalize_routing_weights": 2}),
        bad("accuracy_level must be 0..4", "accuracy_level", "0..4", {"accuracy_level": 5}),
        bad("expert_weight_bits must be 2, 4 or 8", "expert_weight_bits", "one of", {"expert_weight_bits": 3}),
        bad("block_size must be a power of two >= 16", "block_size", "power of two", {"block_size": 24}),
        bad("block_size must divide hidden_size and inter_size", "block_size", "divide", {"block_size": 64}),
        bad("swiglu_limit must be >= 0", "swiglu_limit", ">= 0", {"swiglu_limit": -1.0}),
        bad("input must be float32 or float16", "input", "float32 or float16|float64",
            input=good["input"].astype(np.float64)),
        bad("router_probs must be (tokens, num_experts)", "router_probs", "shape",
            router_probs=np.concatenate([good["router_probs"], good["router_probs"]])),
        bad("fc1_experts_weights must be (E, 2 I, H bits / 8)", "fc1_experts_weights", "shape",
            fc1_experts_weights=good["fc1_experts_weights"][:, :-2].copy()),
        bad("fc2_experts_weights must be uint8", "fc2_experts_weights", "uint8",
            fc2_experts_weights=good["fc2_experts_weights"].view(np.int8)),
        bad("fc1_scales must be (E, N, K / block_size)", "fc1_scales", "shape",
            fc1_scales=good["fc1_scales"][:, :-1].copy()),
        bad("fc2_scales must have the input's dtype", "fc2_scales", "dtype",
            fc2_scales=good["fc2_scales"].astype(other)),
        bad("fc1_zero_points must be (E, N, ceil(blocks bits / 8))", "fc1_zero_points", "shape",
            fc1_zero_points=good["fc1_zero_points"][:, :-1].copy()),
        bad("fc2_experts_bias must be (E, H)", "fc2_experts_bias", "shape",
            fc2_experts_bias=good["fc2_experts_bias"][:, :-1].copy()),
        bad("router_weights must have router_probs' shape", "router_weights", "shape",
            router_weights=good["router_weights"][:, :-1].copy()),
        bad("out must have the input's shape", "out", rf"shape|\({T}, 32\)",
            bad_out=np.zeros((T, 31), act)),
        bad("out must have the input's dtype", "out", act.name, bad_out=np.zeros((T, 32), np.float64)),
    ]  # fmt: skip


# -------------------------------------------------------------------------------------- device ABI

ACTIVATION = Enum(
    "moe_activation",
    (
        ("relu", 0, "max(h, 0)"),
        ("gelu", 1, "the tanh form"),
        ("silu", 2, "h sigmoid(h)"),
        ("identity", 3, "h"),
        ("swiglu", 4, "g sigmoid(alpha g) (l + beta), (g, l) = (h[2i], h[2i+1]), clamped by swiglu_limit"),
    ),
)


def _qmoe_bind(args: tuple, kwargs: Any) -> Bound:
    c = call_arguments(qmoe, args, kwargs)
    if c["precision"] != "reference" or c["rounding"] is not None:
        raise Declined("precision / rounding: the ABI computes ORT's reference op")
    if c["tie_break"] != "higher":
        raise Declined("tie_break: the ABI's routing breaks ties toward the higher expert index (ORT CPU)")
    attrs = {k: c[k] for k in ATTRIBUTES}
    lay = check_qmoe_args(*(c[name] for name in INPUTS), **attrs, tie_break=c["tie_break"])
    dt = lay.dtype
    u8 = np.dtype(np.uint8)
    tensors: dict[str, tuple[str, np.dtype] | None] = {}
    for name in INPUTS:
        kind = u8 if name.endswith(("_weights", "_zero_points")) and name != "router_weights" else dt
        tensors[name] = (name, kind) if c[name] is not None else None
    limit = c["swiglu_limit"]
    scalars: dict[str, int | float] = {
        "tokens": lay.tokens,
        "hidden_size": lay.hidden,
        "inter_size": lay.inter,
        "num_experts": lay.experts,
        "k": int(c["k"]),
        "expert_weight_bits": lay.fc1.bits,
        "block_size": lay.fc1.block_size or 0,
        "activation_type": ACTIVATION[c["activation_type"]],
        "normalize_routing_weights": int(c["normalize_routing_weights"]),
        "accuracy_level": int(c["accuracy_level"]),
        "dtype": dtype_code(dt),
        "activation_alpha": float(np.float32(c["activation_alpha"])),
        "activation_beta": float(np.float32(c["activation_beta"])),
        "swiglu_limit": float("inf") if limit is None else float(np.float32(limit)),
    }
    return Bound(tensors, lay.shape, dt, scalars, lay.tokens * lay.hidden)


QMOE_ABI = Abi(
    (
        In("input", "void", "dtype", "(tokens, H)"),
        In("router_probs", "void", "dtype", "(tokens, E)", "raw logits"),
        In("fc1_experts_weights", "unsigned char", "uint8", "(E, f*I, H*bits/8)", "f = 2 with swiglu"),
        In("fc1_scales", "void", "dtype", "(E, f*I) or (E, f*I, H/block_size)"),
        In("fc1_experts_bias", "void", "dtype", "(E, f*I)", optional=True),
        In("fc2_experts_weights", "unsigned char", "uint8", "(E, H, I*bits/8)"),
        In("fc2_scales", "void", "dtype", "(E, H) or (E, H, I/block_size)"),
        In("fc2_experts_bias", "void", "dtype", "(E, H)", optional=True),
        In(
            "fc1_zero_points",
            "unsigned char",
            "uint8",
            "(E, ceil(f*I*bits/8)) or (E, f*I, ceil(blocks*bits/8))",
            optional=True,
        ),
        In(
            "fc2_zero_points",
            "unsigned char",
            "uint8",
            "(E, ceil(H*bits/8)) or (E, H, ceil(blocks*bits/8))",
            optional=True,
        ),
        In("router_weights", "void", "dtype", "(tokens, E)", "mixing weights (selection still by the logits)", True),
        Out("output", "void", "dtype", "(tokens, H)"),
        I64("tokens", "rows of input"),
        I64("hidden_size", "H"),
        I64("inter_size", "I"),
        I64("num_experts", "E"),
        I64("k", "experts per token"),
        I64("expert_weight_bits", "2, 4 or 8"),
        I64("block_size", "0: per-row scales; else a power of two >= 16 dividing H and I"),
        I64("activation_type", "the expert activation", ACTIVATION),
        I64("normalize_routing_weights", "1: router_weights renormalized over the k selected (QMoE: only then)"),
        I64("accuracy_level", "0..4 (4: ORT CPU's int8 activations for 4-bit block-wise weights)"),
        I64("dtype", "input, router_probs, scales, biases, router_weights and output", DTYPE),
        F32("activation_alpha", "SwiGLU's alpha"),
        F32("activation_beta", "SwiGLU's beta"),
        F32("swiglu_limit", "inf: no clamp"),
    ),  # fmt: skip
    _qmoe_bind,
    "com.microsoft.QMoE: sum over the top-k experts of w * fc2(act(fc1(x))) (docs/ort-ops.md section 5)",
    "tokens * H outputs",
    lanes=32,
    notes=(
        "routing: the k largest logits per token, ties to the higher expert index; w = softmax over the k selected "
        "logits (whatever normalize_routing_weights says), or router_weights (renormalized when it is 1); an "
        "expert with w <= 1e-8 is skipped",
        "W[e, n, k] = fp32((q - z) * s), q field k of row n packed low bits first, z = 2^(bits-1) by default; "
        "zero points packed along N (per row) or along the blocks, each row padded to a byte",
        "output: each element within its bound (qconform.ops.ort.moe_bounds, docs/contracts.md)",
    ),
)


# ------------------------------------------------------------------------------------------ entries


def _sized(op: str) -> Any:
    """Cold sets for a device: Qwen3-30B-A3B's layer (H 2048, I 768, k 8); the experts grow with ``size``."""

    def sized(leaf: str, size: int, seed: int) -> Case:
        return _case(op, leaf, seed, (64 if op == RAGGED else 1, 2048, 768, size), k=min(8, size), bs=128)

    return sized


def _entry(op: str) -> OpSpec:
    return OpSpec(
        name=op,
        family="ort",
        leaves=LEAVES,
        oracle=qmoe,
        call_args=qmoe_call,
        make_inputs=make_inputs,
        cases=lambda leaf, coverage: _cases(op, leaf, coverage),
        strategy=lambda leaf: _strategy(op, leaf),
        validate=validating(qmoe, qmoe_call),
        bad_arguments=lambda leaf: _bad(op, leaf),
        decode=lambda y, params: y,
        abi=QMOE_ABI,
        check=Check("bound", 0.0, "each element within its propagated bound (moe_bounds); routing exact"),
        input_names=INPUTS,
        output_name="output",
        logical_dtypes={
            "fc1_experts_weights": "uint{bits} packed along K, low bits first",
            "fc2_experts_weights": "uint{bits} packed along K, low bits first",
            "fc1_zero_points": "uint{bits} packed",
            "fc2_zero_points": "uint{bits} packed",
            "router_probs": "{act} logits",
        },
        sized_case=_sized(op),
        numerics=qmoe_numerics,
    )


QMOE_DECODE = _entry(DECODE)
QMOE_RAGGED_MM = _entry(RAGGED)

"""Catalogue entries gqa_decode and gqa_prefill (com.microsoft.GroupQueryAttention; oracle:
``qconform.oracles.ort.group_query_attention``, semantics in docs/ort-ops.md section 4).

Shape (B, S, P, N, Nk, H): batch, new tokens, past rows in the cache buffer, query heads, KV
heads, head size. ``gqa_decode``: one new token per sequence, a ragged batch (total_b =
seqlens_k[b] + 1, past_b = total_b - 1), the cache growing (T = P + 1) or a fixed-size buffer of P
rows (``fixed``: T <= P). ``gqa_prefill``: a first prompt (``phase`` first: S = T, a ragged batch
right-padded, no past or a fixed buffer whose past is ignored) or a chunk of a chunked prefill
(``phase`` chunk: B = 1, past_b = T - S).

Outputs (output, present_key, present_value), the oracle's tuple:
- present_key / present_value exactly (bit for bit), on ``defined_present_rows`` only: rows
  [0, past_b + S) of batch b (on a first prompt all S rows, padding included); later rows are the
  caller's buffer policy (zero-filled by ORT with separate buffers, untouched with a shared one)
  and are never compared.
- output within a bound per element (Check "bound", ``attention_bounds.error_model``): against
  the exact (float64) attention of the caches as stored and Q rotated exactly, |got - ref| <=
  u_out |ref| + (1 + u_out) (e_acc sum_j p_j |v_jh| + e_store store + slack), where slack is the
  derivation of ``qconform.ops.ort.attention_bounds`` (fp32 scores, softcap, bias, exp within 8 ulp,
  softmax, an online softmax's rescaling, ORT's rotary rounding of Q and K: fp32 2u, fp16 2^-11 +
  2u of the rotation's magnitudes), e_acc the contract's accumulation of the L = total_b + 1 P V
  products (fp32 in any order by default; fp16/bf16 chains of a 64-key block), e_store the
  contract's storage of Q, K, V and P (fp16 scratch as a flash kernel keeps it: declare
  storage=fp16). Rows of right-padding tokens (a first prompt's s >= total_b) are padding, not
  compared (ORT defines them only without a local window, and two of its own paths disagree there).
ORT's CPU provider meets the bound (tests/test_upstream_ort_gqa.py); so do the oracle's reference
and its "kernel" precision with storage=fp16. The slack's terms in L are worst case (an online
softmax may rescale at every key: 12 u L), so at 4096 keys the bound is about 3e-3 of
sum_j p_j |v_jh|: a defect worth one key's weight hides at long contexts, the small cases see it.
No case holds a subnormal value (ftz changes nothing).

Leaves (``W`` is the cache): Xfp16_Wfp16_Yfp16, Xfp32_Wfp32_Yfp32, Xfp16_Wi8_Yfp16 (int8 cache,
8-bit), Xfp16_Wu4_Yfp16 (4-bit cache, two codes a byte); quantized caches per tensor or per
channel (``quant``), K quantized after rotary.

Case knobs (params; the ORT attributes follow from them, an attribute named in the params
overrides, as a bad argument does): rope none / half / inter (interleaved) and rd (a partial
rotary dimension), window (local_window_size W: W keys including the query's own), softcap,
sink (smooth: smooth_softmax = 1; head: a head_sink input), bias (full (B, N, S, T) or bcast
(1, 1, S, T)), shared (shared_buffer), fixed (a fixed-size cache buffer), packed (QKV in query),
pos_ids (explicit position_ids), scale, quant. Patterns: normal, peaky (Q scaled by 4: nearly
one-hot softmax), ties (quantized leaves: new K / V on exact half steps of a power-of-two scale,
rounded half to even), recip (quantized leaves: a per-tensor scale that is not a power of two and
new K / V among the fp16 values whose x * fp32(1 / s), ORT's form, and fp32(x / s) round to different
codes), core (kernel-shaped: B <= 4, H 64 or 128, N / Nk 1..8). A first prompt's position_ids differ
per batch row (ORT reads [0, 0] + s for every row).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from qconform.contracts import Contract
from qconform.errors import Declined
from qconform.ops.abi import DTYPE, F32, I64, Abi, Bound, Enum, In, Out, call_arguments, dtype_code
from qconform.ops.ort._common import ACTS, leaf_params, validating
from qconform.ops.ort.attention_bounds import INPUTS, error_model
from qconform.ops.spec import BadArgument, Case, Check, Leaf, OpSpec
from qconform.oracles.ort import check_gqa_args, defined_output_rows, defined_present_rows, group_query_attention
from qconform.oracles.ort.group_query_attention import output_shapes
from qconform.readings import Expected

LEAVES = (
    Leaf("Xfp16_Wfp16_Yfp16", {"act": "fp16", "bits": 0}),
    Leaf("Xfp32_Wfp32_Yfp32", {"act": "fp32", "bits": 0}),
    Leaf("Xfp16_Wi8_Yfp16", {"act": "fp16", "bits": 8}),
    Leaf("Xfp16_Wu4_Yfp16", {"act": "fp16", "bits": 4}),
)
ATTRIBUTES = (
    "num_heads",
    "kv_num_heads",
    "scale",
    "softcap",
    "local_window_size",
    "do_rotary",
    "rotary_interleaved",
    "smooth_softmax",
    "k_quant_type",
    "v_quant_type",
    "kv_cache_bit_width",
    "shared_buffer",
)
QUANT = {"tensor": "PER_TENSOR", "channel": "PER_CHANNEL"}
SCALES = {8: 4.0 / 127, 4: 0.5}  # per-tensor cache scales: unit-normal K / V mostly in range
TIE_SCALES = {8: 2.0**-4, 4: 0.5}  # powers of two: x * fp32(1/s) is exact, so half steps are ties
_F16 = np.arange(65536, dtype=np.uint16).view(np.float16)
FINITE_FP16 = _F16[np.isfinite(_F16)].astype(np.float32)


def reciprocal_edges(rng: np.random.Generator, bits: int) -> tuple[np.float32, np.ndarray]:
    """A cache scale ``s`` near ``SCALES[bits]`` and the fp16 values whose codes ORT's
    ``rint(x * fp32(1/s))`` and a division's ``rint(fp32(x / s))`` round apart (inside the code range)."""
    top = 127.5 if bits == 8 else 7.5
    while True:
        s = np.float32(rng.uniform(0.5, 1.5) * SCALES[bits])
        times = (FINITE_FP16 * (np.float32(1) / s)).astype(np.float32)
        apart = (np.abs(times) <= top) & (np.rint(times) != np.rint((FINITE_FP16 / s).astype(np.float32)))
        if apart.any():
            return s, FINITE_FP16[apart]
DECODE, PREFILL = "gqa_decode", "gqa_prefill"

# ------------------------------------------------------------------------------------------ inputs


def _lengths(op: str, case: Case, rng: np.random.Generator) -> tuple[int, np.ndarray, str]:
    """(total_sequence_length T, the totals total_b, phase) of a case, from its shape and seed."""
    B, S, P = case.shape[:3]
    p = case.params
    phase = "decode" if op == DECODE else p.get("phase", "first")
    fixed = p.get("fixed", False)
    if phase == "chunk":
        T = int(rng.integers(S + 1, P + 1)) if fixed else P + S
        return T, np.array([T]), phase
    if phase == "first":
        T = S
    else:
        T = int(rng.integers(max(1, P // 2), P + 1)) if fixed else P + 1
    totals = np.concatenate([[T], rng.integers(1, T + 1, B - 1)]) if B > 1 else np.array([T])
    return T, totals, phase


def _rotary(rd: int, rows: int, act: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """cos / sin caches (rows, rd / 2) of the usual RoPE frequencies 10000^(-2i/rd), in ``act``."""
    ang = np.arange(rows)[:, None] * 10000.0 ** (-np.arange(rd // 2) * 2.0 / rd)[None, :]
    return np.cos(ang).astype(act), np.sin(ang).astype(act)


def make_inputs(op: str, case: Case) -> dict[str, np.ndarray]:
    """Q, K, V unit-normal (``peaky``: Q times 4); past caches unit-normal, or random codes for a
    quantized cache (given with zero rows when P = 0, as a graph must); seqlens_k /
    total_sequence_length from the lengths above (int32); RoPE cos / sin caches; bias and sink
    unit-normal; cache scales of ``SCALES`` (per channel: times 0.5..1.5)."""
    p = {**leaf_params(LEAVES, case.leaf), **case.params}
    rng = np.random.default_rng(case.seed)
    B, S, P, N, Nk, H = case.shape
    act, bits = ACTS[p["act"]], p["bits"]
    T, totals, phase = _lengths(op, case, rng)
    pasts = np.zeros(B, np.int64) if phase == "first" else totals - S
    inp: dict[str, np.ndarray] = {
        "query": (rng.standard_normal((B, S, N * H)) * (4 if case.pattern == "peaky" else 1)).astype(act),
        "key": rng.standard_normal((B, S, Nk * H)).astype(act),
        "value": rng.standard_normal((B, S, Nk * H)).astype(act),
        "seqlens_k": (totals - 1).astype(np.int32),
        "total_sequence_length": np.array([T], np.int32),
    }
    if bits:
        quant = p.get("quant", "tensor")
        base = TIE_SCALES[bits] if case.pattern == "ties" else SCALES[bits]
        for name in ("k_scale", "v_scale"):
            factor = np.ones(1) if quant == "tensor" else rng.uniform(0.5, 1.5, (1, Nk, 1, H))
            inp[name] = (factor * base).astype(np.float32)
        if case.pattern == "ties":  # half steps of the scale: every new code is a tie
            lo, hi = (-100, 100) if bits == 8 else (-8, 7)
            for name in ("key", "value"):
                inp[name] = ((rng.integers(lo, hi, (B, S, Nk * H)) + 0.5) * base).astype(act)
        if case.pattern == "recip":
            s, xs = reciprocal_edges(rng, bits)
            inp["k_scale"] = inp["v_scale"] = np.full(inp["k_scale"].shape, s, np.float32)
            for name in ("key", "value"):
                inp[name] = rng.choice(xs, (B, S, Nk * H)).astype(act)
    if P or bits:  # a quantized cache always has a past (zero rows): ORT takes the cache type from it
        for name in ("past_key", "past_value"):
            if bits == 8:
                inp[name] = rng.integers(-128, 128, (B, Nk, P, H)).astype(np.int8)
            elif bits == 4:
                inp[name] = rng.integers(0, 256, (B, Nk, P, H // 2)).astype(np.uint8)
            else:
                inp[name] = rng.standard_normal((B, Nk, P, H)).astype(act)
    rope = p.get("rope", "none")
    if rope != "none":
        offset = int(rng.integers(0, 4)) if p.get("pos_ids") else 0
        inp["cos_cache"], inp["sin_cache"] = _rotary(p.get("rd", H), T + offset + B, act)
        if p.get("pos_ids"):
            first = np.arange(S)[None, :] + (offset if phase == "first" else pasts[:, None] + offset)
            if phase == "first":  # rows other than [0, 0] + s, which ORT never reads on a first prompt
                first = first + np.arange(B)[:, None]
            # C order: astype of a broadcast view keeps its memory order (strides (8, 8 B) here)
            inp["position_ids"] = np.ascontiguousarray(np.broadcast_to(first, (B, S)), dtype=np.int64)
    bias = p.get("bias", "none")
    if bias != "none":
        shape = (B, N, S, T) if bias == "full" else (1, 1, S, T)
        inp["attention_bias"] = rng.standard_normal(shape).astype(act)
    if p.get("sink") == "head":
        inp["head_sink"] = rng.standard_normal(N).astype(act)
    if p.get("packed"):
        inp["query"] = np.concatenate([inp["query"], inp.pop("key"), inp.pop("value")], axis=-1)
    return inp


def attributes(params: dict[str, Any]) -> dict[str, Any]:
    """The ONNX attributes of a case (an attribute given by name in the params overrides)."""
    rope = params.get("rope", "none")
    attrs: dict[str, Any] = {
        "num_heads": params["num_heads"],
        "kv_num_heads": params["kv_num_heads"],
        "scale": params.get("scale", 0.0),
        "softcap": params.get("softcap", 0.0),
        "local_window_size": params.get("window", -1),
        "do_rotary": int(rope != "none"),
        "rotary_interleaved": int(rope == "inter"),
        "smooth_softmax": 1 if params.get("sink") == "smooth" else -1,
        "shared_buffer": bool(params.get("shared", False)),
    }
    if params.get("bits"):
        quant = QUANT[params.get("quant", "tensor")]
        attrs.update(k_quant_type=quant, v_quant_type=quant, kv_cache_bit_width=params["bits"])
    attrs.update({k: params[k] for k in ATTRIBUTES if k in params})
    return attrs


def gqa_call(inputs: dict[str, Any], params: dict[str, Any]) -> tuple[tuple, dict]:
    """``group_query_attention(*args, **kwargs)`` for the inputs (ORT's input names) and params."""
    return tuple(inputs.get(name) for name in INPUTS), attributes(params)


# ------------------------------------------------------------------------------------------- cases

# real models' heads (N, Nk, H[, partial rotary dim]): Llama-3-8B / Mistral-7B 32/8x128, a 40/10x128
# grouping (5 query heads a KV head), Llama-3-70B 64/8x128, and 24/8x64 with a half rotary dimension
LLAMA8, G40, LLAMA70, PARTIAL = (32, 8, 128), (40, 10, 128), (64, 8, 128), (24, 8, 64)


def _case(op: str, leaf: str, seed: int, shape: tuple[int, ...], pattern: str = "normal", **knobs: Any) -> Case:
    """A case with the heads of ``shape`` as params and the knobs that are on (the rest default)."""
    params = {"num_heads": shape[3], "kv_num_heads": shape[4]}
    params.update({k: v for k, v in knobs.items() if v not in (None, False, "none", -1, 0.0)})
    if leaf_params(LEAVES, leaf)["bits"] and "quant" not in params:
        params["quant"] = "tensor"
    return Case(op, leaf, seed, shape, pattern, params)


def _quantized(leaf: str) -> bool:
    return bool(leaf_params(LEAVES, leaf)["bits"])


def decode_cases(leaf: str, coverage: int) -> list[Case]:
    """coverage 1: small heads (4/2, 4/1, 2/2, 16 or 32 channels), a ragged batch, the growing
    cache and the fixed buffer, rotary half / interleaved / partial, window, softcap, sink (smooth
    and per head), bias (full and broadcast), shared buffer, position ids, packed QKV with an
    explicit scale, each on and off; the quantized leaves also per-channel scales (of one and of
    two KV heads) and ties. coverage 2: the real models' heads
    (32/8x128, 40/10x128, 64/8x128, 24/8x64 with partial rotary) with 100..600 keys, batch 1..4
    ragged, packed QKV, an explicit scale, window 1, no past (one token), peaky scores.
    coverage 3: 2048..4096-key contexts (the numpy oracle holds K and V in float64 per query head:
    B * N * T * H * 8 bytes each, about 0.5 GB at 4 x 32 heads x 4096 keys).

    core: kernel-shaped decode (pattern ``core``, seeds 400..; 1 at coverage 1, 6 from coverage 2):
    batch 1..4, H 64 or 128, 1..8 query heads a KV head, P a multiple of 8."""
    q = _quantized(leaf)
    out = [
        _case(DECODE, leaf, 1, (2, 1, 5, 4, 2, 16), rope="half"),
        _case(DECODE, leaf, 2, (3, 1, 8, 4, 1, 16), rope="inter", window=4, softcap=2.0, sink="head", bias="full",
              fixed=True, shared=True, quant="channel" if q else None),
        _case(DECODE, leaf, 3, (1, 1, 4, 2, 2, 32), rope="half", rd=16, sink="smooth", bias="bcast", pos_ids=True),
    ]  # fmt: skip
    # head_sink and smooth_softmax = 1 together: ORT's CPU takes head_sink alone
    out.append(_case(DECODE, leaf, 6, (2, 1, 5, 4, 2, 16), rope="half", sink="head", smooth_softmax=1))
    out.append(_case(DECODE, leaf, 8, (2, 1, 4, 4, 2, 16), rope="inter", packed=True, scale=0.3))
    if q:
        out.append(_case(DECODE, leaf, 4, (2, 1, 3, 2, 1, 16), "ties", window=2))
        out.append(_case(DECODE, leaf, 5, (2, 1, 3, 2, 1, 16), "recip"))
        out.append(_case(DECODE, leaf, 7, (2, 1, 6, 4, 2, 16), rope="half", quant="channel"))  # scales of 2 KV heads
    out.append(_case(DECODE, leaf, 400, (1, 1, 8, 2, 1, 64), "core", rope="half"))
    if coverage >= 2:
        out += [
            _case(DECODE, leaf, 10, (1, 1, 255, *LLAMA8), rope="half", sink="head"),
            _case(DECODE, leaf, 11, (2, 1, 300, *G40), rope="inter", window=128, bias="full"),
            _case(
                DECODE, leaf, 12, (3, 1, 200, *LLAMA70), rope="half", softcap=30.0, bias="full", fixed=True, shared=True
            ),
            _case(DECODE, leaf, 13, (4, 1, 150, *PARTIAL), rope="half", rd=32, sink="smooth", pos_ids=True),
            _case(DECODE, leaf, 14, (2, 1, 40, 8, 2, 32), "peaky", rope="inter", packed=True, scale=0.125),
            _case(DECODE, leaf, 15, (3, 1, 0, 4, 2, 16), rope="half"),  # one token, no past
            _case(DECODE, leaf, 16, (2, 1, 30, 4, 1, 32), window=1, bias="bcast"),
            _case(DECODE, leaf, 17, (4, 1, 64, 4, 4, 16), "peaky", rope="inter", sink="head", fixed=True),
        ]
        if q:
            out.append(_case(DECODE, leaf, 18, (4, 1, 33, 8, 2, 32), "ties", quant="channel"))
        core = [
            ((1, 1, 128, 8, 1, 128), {"rope": "half"}),
            ((4, 1, 256, 4, 1, 64), {"rope": "inter", "window": 64}),
            ((3, 1, 64, 8, 8, 64), {"sink": "head"}),
            ((2, 1, 512, 16, 2, 128), {"rope": "half", "bias": "full"}),
            ((1, 1, 1024, 8, 2, 128), {"rope": "half", "softcap": 50.0}),
        ]
        out += [_case(DECODE, leaf, 401 + i, shape, "core", **kw) for i, (shape, kw) in enumerate(core)]
    if coverage >= 3:
        out += [
            _case(DECODE, leaf, 20, (1, 1, 4095, *LLAMA8), rope="half"),
            _case(DECODE, leaf, 21, (4, 1, 4096, *LLAMA8), rope="half", window=1024, fixed=True),
            _case(DECODE, leaf, 22, (1, 1, 4000, *LLAMA70), rope="half", sink="head", softcap=50.0),
            _case(DECODE, leaf, 23, (2, 1, 4000, *G40), rope="inter", sink="smooth"),
            _case(DECODE, leaf, 24, (4, 1, 2048, *PARTIAL), rope="half", rd=32, bias="full"),
        ]
    return out


def prefill_cases(leaf: str, coverage: int) -> list[Case]:
    """coverage 1: small heads; a ragged first prompt (right padding), a chunk of a chunked prefill
    (past 5), a first prompt into a fixed buffer (its past ignored) with a shared buffer; rotary
    half / interleaved / partial, window, softcap, sinks, bias, position ids; quantized leaves
    per-channel scales and ties. coverage 2: the real models' heads with 48..128-token prompts
    and chunks over 100..300 past rows, batch 1..4 ragged, packed QKV, peaky scores. coverage 3:
    prompts of 4096 tokens (chunks of 128..512 at T = 4096: the oracle's scores are B*N*S*T
    float64, so a whole 4096-token first prompt of 32 heads would take 4.3 GB a temporary) and
    first prompts of 512..1024 tokens.

    core: kernel-shaped prefill (pattern ``core``, seeds 400..; 1 at coverage 1, 5 from coverage
    2): batch 1..4, S a multiple of 4, H 64 or 128."""
    q = _quantized(leaf)
    out = [
        _case(PREFILL, leaf, 1, (2, 4, 0, 4, 2, 16), rope="half", phase="first"),
        _case(PREFILL, leaf, 2, (1, 4, 5, 2, 1, 16), rope="inter", window=3, softcap=2.0, sink="head", bias="full",
              phase="chunk", quant="channel" if q else None),
        _case(PREFILL, leaf, 3, (2, 3, 4, 2, 1, 32), rope="half", rd=16, sink="smooth", bias="bcast", pos_ids=True,
              phase="first", fixed=True, shared=True),
    ]  # fmt: skip
    out.append(_case(PREFILL, leaf, 6, (1, 4, 5, 4, 2, 16), rope="half", phase="chunk", sink="head", smooth_softmax=1))
    if q:
        out.append(_case(PREFILL, leaf, 4, (1, 3, 2, 2, 1, 16), "ties", phase="chunk", window=2))
        out.append(_case(PREFILL, leaf, 5, (1, 3, 2, 2, 1, 16), "recip", phase="chunk"))
    out.append(_case(PREFILL, leaf, 400, (1, 4, 0, 2, 1, 64), "core", rope="half", phase="first"))
    if coverage >= 2:
        out += [
            _case(PREFILL, leaf, 10, (2, 128, 0, *LLAMA8), rope="half", phase="first", sink="head"),
            _case(PREFILL, leaf, 11, (1, 64, 192, *LLAMA70), rope="half", phase="chunk", window=128, softcap=30.0,
                  bias="bcast"),
            _case(PREFILL, leaf, 12, (3, 96, 0, *G40), rope="inter", phase="first", bias="full"),
            _case(PREFILL, leaf, 13, (4, 48, 0, *PARTIAL), rope="half", rd=32, phase="first", sink="smooth",
                  pos_ids=True),
            _case(PREFILL, leaf, 14, (1, 32, 300, *G40), rope="half", phase="chunk", fixed=True, shared=True,
                  pos_ids=True),
            _case(PREFILL, leaf, 15, (2, 20, 24, 8, 2, 32), "peaky", rope="inter", phase="first", fixed=True,
                  packed=True, window=5),
            _case(PREFILL, leaf, 16, (1, 7, 9, 4, 4, 16), phase="chunk", bias="bcast", scale=0.3),
        ]  # fmt: skip
        if q:
            out.append(_case(PREFILL, leaf, 17, (3, 9, 0, 4, 2, 32), "ties", phase="first", quant="channel"))
        core = [
            ((2, 32, 0, 8, 1, 128), {"rope": "half", "phase": "first"}),
            ((1, 64, 128, 4, 1, 64), {"rope": "inter", "phase": "chunk"}),
            ((4, 16, 0, 8, 8, 64), {"phase": "first", "sink": "head"}),
            ((1, 32, 256, 16, 2, 128), {"rope": "half", "phase": "chunk", "window": 64}),
        ]
        out += [_case(PREFILL, leaf, 401 + i, shape, "core", **kw) for i, (shape, kw) in enumerate(core)]
    if coverage >= 3:
        out += [
            _case(PREFILL, leaf, 20, (1, 256, 3840, *LLAMA8), rope="half", phase="chunk"),
            _case(PREFILL, leaf, 21, (1, 128, 3968, *LLAMA70), rope="half", phase="chunk", window=4096, sink="head"),
            _case(PREFILL, leaf, 22, (1, 512, 3584, *PARTIAL), rope="half", rd=32, phase="chunk", bias="full"),
            _case(PREFILL, leaf, 23, (1, 1024, 0, *LLAMA8), rope="half", phase="first", softcap=50.0),
            _case(PREFILL, leaf, 24, (2, 512, 0, *G40), rope="inter", phase="first", window=256),
        ]
    return out


def _strategy(op: str, leaf: str) -> Any:
    """Seed, shape and knobs drawn; a draw the op cannot take is mended (a fixed buffer grown to
    hold T, a chunk given batch 1, ties without rotary)."""
    q = _quantized(leaf)

    def build(seed, batch, new, past, heads, H, rope, window, softcap, sink, bias, fixed, shared, pattern, quant):
        N, Nk = heads
        phase = "decode" if op == DECODE else ("chunk" if new > 1 and past and not fixed else "first")
        S = 1 if op == DECODE else new
        B = 1 if phase == "chunk" else batch
        if op == PREFILL and fixed:
            past = max(past, S + 1)
        if op == DECODE and fixed:
            past = max(past, 1)
        if phase == "first" and not fixed:
            past = 0
        if pattern == "ties" and not q:
            pattern = "normal"
        knobs = {"rope": "none" if pattern == "ties" else rope, "window": window, "softcap": softcap, "sink": sink,
                 "bias": bias, "fixed": fixed, "shared": shared and fixed, "quant": quant if q else None}  # fmt: skip
        if op == PREFILL:
            knobs["phase"] = phase
        return _case(op, leaf, seed, (B, S, past, N, Nk, H), pattern, **knobs)

    return st.builds(
        build,
        seed=st.integers(0, 2**32 - 1),
        batch=st.integers(1, 4),
        new=st.integers(2, 12),
        past=st.integers(0, 40),
        heads=st.sampled_from([(2, 1), (4, 2), (4, 4), (8, 2)]),
        H=st.sampled_from([16, 32, 64]),
        rope=st.sampled_from(["none", "half", "inter"]),
        window=st.sampled_from([-1, 1, 2, 5]),
        softcap=st.sampled_from([0.0, 2.0]),
        sink=st.sampled_from(["none", "smooth", "head"]),
        bias=st.sampled_from(["none", "full", "bcast"]),
        fixed=st.booleans(),
        shared=st.booleans(),
        pattern=st.sampled_from(["normal", "peaky", "ties"]),
        quant=st.sampled_from(["tensor", "channel"]),
    )


# --------------------------------------------------------------------------------------- numerics


def _masks(inputs: dict[str, Any], want: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """Elements left unchecked: padding rows of the output, cache rows past the defined ones."""
    output, pk, _ = want
    B, S = output.shape[:2]
    T = inputs["total_sequence_length"]
    rows = ~defined_output_rows(inputs["seqlens_k"], T, S)
    cache = ~defined_present_rows(inputs["seqlens_k"], T, S, pk.shape[2])
    return (
        np.broadcast_to(rows[:, :, None], output.shape),
        np.broadcast_to(cache[:, None, :, None], pk.shape),
        np.broadcast_to(cache[:, None, :, None], pk.shape),
    )


def gqa_numerics(inputs: dict[str, Any], params: dict[str, Any], contract: Contract, ftz: bool) -> list[Expected]:
    """One reading: the oracle's reference (ORT CPU's roundings) for the exact caches, and the
    output's error model (module docstring); ftz changes nothing (no case holds a subnormal)."""
    args, attrs = gqa_call(inputs, params)
    want = group_query_attention(*args, **attrs)
    named = dict(zip(INPUTS, args, strict=True))
    model = error_model(named, attrs, want[1], want[2], want[0].dtype)
    return [Expected("ORT CPU reference", want, model, mask=_masks(inputs, want), plain=True)]


# ---------------------------------------------------------------------------------- bad arguments


def _bad(op: str, leaf: str) -> list[BadArgument]:
    """One call per rule of ``check_gqa_args`` (and ``out``), each from a valid small call with
    rotary, bias, sink and position ids: a decode (growing cache) or a chunk of a prefill."""
    bits = leaf_params(LEAVES, leaf)["bits"]
    shape = (2, 1, 5, 4, 2, 16) if op == DECODE else (1, 3, 4, 4, 2, 16)
    knobs = {"rope": "half", "bias": "full", "sink": "head", "pos_ids": True}
    case = _case(op, leaf, 5, shape, phase=None if op == DECODE else "chunk", **knobs)
    good = make_inputs(op, case)
    p = {**leaf_params(LEAVES, leaf), **case.params}
    act = good["query"].dtype
    other = np.float32 if act == np.float16 else np.float16
    T = int(good["total_sequence_length"][0])
    B, S = good["query"].shape[:2]
    outs = [np.zeros(s, d) for s, d in output_shapes(check_gqa_args(*gqa_call(good, p)[0], **attributes(p)))]

    def bad(rule: str, arg: str, match: str, params: dict | None = None, bad_out: Any = None, **changed: Any):
        return BadArgument(rule, {**good, **changed}, {**p, **(params or {})}, bad_out, arg=arg, match=match)

    out = [
        bad("num_heads must be a multiple of kv_num_heads", "num_heads", "multiple of kv_num_heads",
            {"num_heads": 6, "kv_num_heads": 4}),
        bad("local_window_size must be -1 or >= 1", "local_window_size", ">= 1", {"local_window_size": 0}),
        bad("softcap must be >= 0", "softcap", ">= 0", {"softcap": -1.0}),
        bad("smooth_softmax must be -1, 0 or 1", "smooth_softmax", "-1, 0 or 1", {"smooth_softmax": 2}),
        bad("do_rotary must be 0 or 1", "do_rotary", "0 or 1", {"do_rotary": 2}),
        bad("query must be float32 or float16", "query", "float32 or float16|float64",
            query=good["query"].astype(np.float64)),
        bad("query's last dimension must be num_heads * head_size", "query", "num_heads",
            query=good["query"][..., :-1].copy()),
        bad("head_size must be a multiple of 8", "query", "multiple of 8", query=good["query"][..., :48].copy(),
            key=good["key"][..., :24].copy(), value=good["value"][..., :24].copy()),
        bad("key must be (B, S, kv_num_heads * head_size)", "key", "shape", key=good["key"][..., :16].copy()),
        bad("value must have query's dtype", "value", "dtype", value=good["value"].astype(other)),
        bad("past_key must have the cache's dtype", "past_key", "dtype",
            past_key=good["past_key"].astype(np.float64)),
        bad("past_key must be (B, kv_num_heads, P, cache head size)", "past_key", "shape",
            past_key=good["past_key"][:, :1].copy()),
        bad("past_value must have past_key's shape", "past_value", "past_key",
            past_value=good["past_value"][:, :, :-1].copy()),
        bad("seqlens_k must be (B,)", "seqlens_k", "shape", seqlens_k=np.repeat(good["seqlens_k"], 2)),
        bad("seqlens_k must be integers", "seqlens_k", "integer", seqlens_k=good["seqlens_k"].astype(np.float32)),
        bad("seqlens_k[b] must be < total_sequence_length", "seqlens_k", r"total_sequence_length - 1",
            seqlens_k=np.full(B, T, np.int32)),
        bad("total_sequence_length must be P + S (growing) or <= P", "total_sequence_length", "past_sequence_length",
            total_sequence_length=np.array([T + 3], np.int32)),
        bad("cos_cache is required with do_rotary", "cos_cache", "required", cos_cache=None, sin_cache=None),
        bad("cos_cache's dimension 1 must be a multiple of 8 <= head_size / 2", "cos_cache", "multiple of 8",
            cos_cache=np.ones((64, 12), act), sin_cache=np.ones((64, 12), act)),
        bad("cos_cache's dimension 0 must be >= total_sequence_length", "cos_cache", "dimension 0",
            cos_cache=good["cos_cache"][: T - 1].copy(), sin_cache=good["sin_cache"][: T - 1].copy()),
        bad("sin_cache must have cos_cache's shape", "sin_cache", "cos_cache", sin_cache=good["sin_cache"][:-1].copy()),
        bad("position_ids must be (B, >= S)", "position_ids", "shape", position_ids=good["position_ids"][:, :0].copy()),
        bad("rotary positions must be rows of cos_cache", "position_ids", "rotary positions",
            position_ids=good["position_ids"] + len(good["cos_cache"])),
        bad("attention_bias must be (B or 1, N or 1, S, T)", "attention_bias", "shape",
            attention_bias=good["attention_bias"][..., :-1].copy()),
        bad("head_sink must be (num_heads,)", "head_sink", "shape", head_sink=good["head_sink"][:-1].copy()),
        bad("shared_buffer needs a past of >= total_sequence_length rows", "shared_buffer", "total_sequence_length",
            {"shared_buffer": True}),
        bad("out must be a tuple (output, present_key, present_value)", "out", "tuple", bad_out=outs[0]),
        bad("out's output must have the output shape", "out", rf"shape|\({B}, {S}", bad_out=(outs[0][:, :, :-1].copy(),
            *outs[1:])),
        bad("out's present_key must have the cache dtype", "out", str(outs[1].dtype),
            bad_out=(outs[0], outs[1].astype(np.float64), outs[2])),
    ]  # fmt: skip
    if op == PREFILL:
        tiled = {k: np.concatenate([v, v]) for k, v in good.items() if k in ("query", "key", "value", "position_ids")}
        tiled.update({k: np.concatenate([good[k], good[k]]) for k in ("past_key", "past_value", "seqlens_k")})
        out.append(bad("a chunk of a prefill (S > 1, S != T) needs batch 1", "query", "batch size 1",
                       attention_bias=good["attention_bias"][:1].copy(), **tiled))  # fmt: skip
    if bits:
        out += [
            bad("kv_cache_bit_width must be 4 or 8", "kv_cache_bit_width", "4 or 8", {"kv_cache_bit_width": 3}),
            bad("v_quant_type must equal k_quant_type", "v_quant_type", "k_quant_type",
                {"v_quant_type": "PER_CHANNEL"}),
            bad("k_scale must be float32", "k_scale", "float32", k_scale=good["k_scale"].astype(np.float16)),
            bad("a PER_TENSOR scale has one element", "k_scale", "element", k_scale=np.ones(2, np.float32)),
            bad("cache scales must be finite and nonzero", "v_scale", "nonzero", v_scale=np.zeros(1, np.float32)),
        ]  # fmt: skip
    else:
        out.append(bad("k_scale only with a quantized cache", "k_scale", "quantized", k_scale=np.ones(1, np.float32)))
    return out


# -------------------------------------------------------------------------------------- device ABI

KV_QUANT = Enum(
    "kv_quant",
    (
        ("none", 0, "float caches of the query's dtype"),
        ("per_tensor", 1, "k_scale / v_scale: one float32 each"),
        ("per_channel", 2, "k_scale / v_scale: kv_num_heads * head_size float32 each"),
    ),
)


def _gqa_bind(args: tuple, kwargs: Any) -> Bound:
    c = call_arguments(group_query_attention, args, kwargs)
    if c["precision"] != "reference" or c["output_qk"]:
        raise Declined("precision / output_qk: the ABI computes the reference outputs only (no output_qk)")
    named = [c[name] for name in INPUTS]
    attrs = {k: c[k] for k in ATTRIBUTES}
    lay = check_gqa_args(*named, **attrs)
    dt = lay.dtype
    cache = lay.cache_dtype
    given = {name: c[name] is not None for name in INPUTS}
    tensors: dict[str, tuple[str, np.dtype] | None] = {
        "query": ("query", dt),
        "key": ("key", dt) if given["key"] else None,
        "value": ("value", dt) if given["value"] else None,
        "past_key": ("past_key", cache) if given["past_key"] else None,
        "past_value": ("past_value", cache) if given["past_value"] else None,
        "seqlens_k": ("seqlens_k", np.dtype(np.int32)),
        "cos_cache": ("cos_cache", dt) if given["cos_cache"] else None,
        "sin_cache": ("sin_cache", dt) if given["sin_cache"] else None,
        "position_ids": ("position_ids", np.dtype(np.int64)) if given["position_ids"] else None,
        "attention_bias": ("attention_bias", dt) if given["attention_bias"] else None,
        "head_sink": ("head_sink", dt) if given["head_sink"] else None,
        "k_scale": ("k_scale", np.dtype(np.float32)) if lay.bit_width else None,
        "v_scale": ("v_scale", np.dtype(np.float32)) if lay.bit_width else None,
    }
    bias = c["attention_bias"]
    scalars: dict[str, int | float] = {
        "batch": lay.batch,
        "sequence_length": lay.sequence_length,
        "num_heads": lay.num_heads,
        "kv_num_heads": lay.kv_num_heads,
        "head_size": lay.head_size,
        "past_sequence_length": lay.past_sequence_length,
        "total_sequence_length": lay.total_sequence_length,
        "present_sequence_length": lay.present_sequence_length,
        "first_prompt": int(lay.first_prompt),
        "packed_qkv": int(lay.packed),
        "rotary_dim": lay.rotary_dim if attrs["do_rotary"] else 0,
        "rotary_interleaved": int(attrs["rotary_interleaved"]),
        "bias_batch": 0 if bias is None else bias.shape[0],
        "bias_heads": 0 if bias is None else bias.shape[1],
        "local_window_size": int(attrs["local_window_size"]),
        "smooth_softmax": int(attrs["smooth_softmax"]),
        "kv_cache_bit_width": lay.bit_width,
        "kv_quant": KV_QUANT[attrs["k_quant_type"].lower()],
        "shared_buffer": int(attrs["shared_buffer"]),
        "dtype": dtype_code(dt),
        "scale": float(np.float32(attrs["scale"])),
        "softcap": float(np.float32(attrs["softcap"])),
    }
    (out_shape, out_dtype), *caches = output_shapes(lay)
    work = lay.batch * lay.sequence_length * lay.num_heads * lay.head_size
    return Bound(tensors, out_shape, out_dtype, scalars, work, tuple(caches))


GQA_ABI = Abi(
    (
        In("query", "void", "dtype", "(B, S, N*H), or packed (B, S, (N + 2 Nk)*H)"),
        In("key", "void", "dtype", "(B, S, Nk*H)", "null with packed QKV", optional=True),
        In("value", "void", "dtype", "(B, S, Nk*H)", "null with packed QKV", optional=True),
        In("past_key", "void", "dtype | int8 | uint8 (kv_cache_bit_width)", "(B, Nk, P, H or H/2)", optional=True),
        In("past_value", "void", "like past_key", "(B, Nk, P, H or H/2)", optional=True),
        In("seqlens_k", "int", "int32", "(B,)", "total_b - 1 per batch entry"),
        In("cos_cache", "void", "dtype", "(rows, rotary_dim/2)", optional=True),
        In("sin_cache", "void", "dtype", "(rows, rotary_dim/2)", optional=True),
        In("position_ids", "long long", "int64", "(B, S)", "rotary positions (a first prompt: [0, 0] + s)", True),
        In("attention_bias", "void", "dtype", "(bias_batch, bias_heads, S, T)", optional=True),
        In("head_sink", "void", "dtype", "(N,)", "a sink logit per head", optional=True),
        In("k_scale", "float", "float32", "1 or Nk*H (kv_quant)", optional=True),
        In("v_scale", "float", "float32", "1 or Nk*H (kv_quant)", optional=True),
        Out("output", "void", "dtype", "(B, S, N*H)"),
        Out("present_key", "void", "past_key's", "(B, Nk, present_sequence_length, H or H/2)"),
        Out("present_value", "void", "past_key's", "(B, Nk, present_sequence_length, H or H/2)"),
        I64("batch", "B"),
        I64("sequence_length", "S: new tokens per sequence"),
        I64("num_heads", "N query heads"),
        I64("kv_num_heads", "Nk KV heads (query head n reads KV head n / (N / Nk))"),
        I64("head_size", "H"),
        I64("past_sequence_length", "P: rows of past_key (0 without a past)"),
        I64("total_sequence_length", "T: the batch's longest total length"),
        I64("present_sequence_length", "max(T, P): rows of present_key"),
        I64("first_prompt", "1: S == T, the past (if any) ignored, past_b = 0"),
        I64("packed_qkv", "1: key and value are columns of query"),
        I64("rotary_dim", "0: no rotary; else the rotated channels (channels >= it copied)"),
        I64("rotary_interleaved", "1: pairs (2i, 2i+1); 0: (i, i + rotary_dim/2)"),
        I64("bias_batch", "attention_bias's dimension 0 (B or 1), 0 without a bias"),
        I64("bias_heads", "attention_bias's dimension 1 (N or 1), 0 without a bias"),
        I64("local_window_size", "-1: off; W: the W keys up to and including the query's own"),
        I64("smooth_softmax", "1: a zero sink logit when head_sink is null"),
        I64("kv_cache_bit_width", "0, 8 (int8 cache) or 4 (uint8, two codes a byte)"),
        I64("kv_quant", "how k_scale / v_scale are given", KV_QUANT),
        I64("shared_buffer", "1: the caller's present rows past the written ones are its own (left as they are)"),
        I64("dtype", "query, key, value, caches (unquantized), bias, sink and output", DTYPE),
        F32("scale", "0: 1/sqrt(H)"),
        F32("softcap", "0: off; c: c * tanh(x / c) before the bias"),
    ),
    _gqa_bind,
    "com.microsoft.GroupQueryAttention: output and the present KV caches (docs/ort-ops.md section 4)",
    "B * S * N * H outputs",
    notes=(
        "present rows [0, past_b) of batch b copied from the past, rows [past_b, past_b + S) the new K "
        "(after rotary, then quantized) and V; later rows are never compared (the caller's buffer policy)",
        "past_b = seqlens_k[b] + 1 - S, 0 on a first prompt; query s attends keys [lo, L), L = min(past_b + s + 1, "
        "total_b), lo = L - W with a window",
        "quantized caches: q = clamp(rint(fp32(x * fp32(1/scale)))), half to even; 4-bit: the nibble q + 8, "
        "element 2i in the low nibble",
        "output: each element within its bound (qconform.ops.ort.attention_bounds, docs/contracts.md); "
        "caches bit-exact",
    ),
)


# ------------------------------------------------------------------------------------------ entries


def _sized(op: str) -> Any:
    """Cold sets for a device: Llama-3-8B's heads; the past (the cache read) grows with ``size``."""

    def sized(leaf: str, size: int, seed: int) -> Case:
        if op == DECODE:
            return _case(op, leaf, seed, (1, 1, size, *LLAMA8), rope="half")
        return _case(op, leaf, seed, (1, 16, size, *LLAMA8), rope="half", phase="chunk")

    return sized


def _entry(op: str) -> OpSpec:
    cases = decode_cases if op == DECODE else prefill_cases
    return OpSpec(
        name=op,
        family="ort",
        leaves=LEAVES,
        oracle=group_query_attention,
        call_args=gqa_call,
        make_inputs=lambda case: make_inputs(op, case),
        cases=cases,
        strategy=lambda leaf: _strategy(op, leaf),
        validate=validating(group_query_attention, gqa_call),
        bad_arguments=lambda leaf: _bad(op, leaf),
        decode=lambda y, params: y,
        abi=GQA_ABI,
        check=Check("bound", 0.0, "output within its bound (attention_bounds); present caches exact on defined rows"),
        input_names=INPUTS,
        output_name="output",
        outputs=("output", "present_key", "present_value"),
        logical_dtypes={
            "past_key": "{act} | int8 | uint4 codes packed two a byte (low nibble: even channel)",
            "past_value": "{act} | int8 | uint4 codes packed two a byte (low nibble: even channel)",
            "seqlens_k": "int32: total length - 1",
        },
        sized_case=_sized(op),
        numerics=gqa_numerics,
    )


GQA_DECODE = _entry(DECODE)
GQA_PREFILL = _entry(PREFILL)

"""Cross-check ``qconform.oracles.ort.group_query_attention`` against onnxruntime's CPU provider.

Each case builds a one-node com.microsoft.GroupQueryAttention model and runs it on the CPU
execution provider (graph optimizations off, one intra-op thread; a shared KV buffer through IO
binding). What is compared:
- present_key / present_value: bit for bit on ``defined_present_rows``, and then the whole buffer
  (ORT zero-fills the later rows of separate buffers and leaves a shared buffer's untouched);
- output and output_qk: within the per-element bound of qconform.ops.ort.attention_bounds, derived from fp32
  rounding, the head size and the number of keys (plus one fp16 spacing for fp16 outputs). ORT
  accumulates in MLAS's order with MLAS's exp / tanh, so outputs are not bit-exact.
Semantics: docs/ort-ops.md section 4. Skipped without onnx / onnxruntime.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from mlas_host import mlas_x86_kernel

from qconform.errors import ArgumentError
from qconform.impls import CallableImpl
from qconform.ops import get_op
from qconform.ops.ort.attention_bounds import attention_terms, fp16_spacing, output_bound, qk_bound, to_bnsh, to_bsnh
from qconform.oracles.ort import defined_output_rows, defined_present_rows, group_query_attention
from qconform.oracles.ort.kv_cache import quantize_kv
from qconform.oracles.ort.rotary import apply_rotary
from qconform.properties import Prepared, matches_oracle

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
helper, TP = onnx.helper, onnx.TensorProto

pytestmark = pytest.mark.upstream

F32, F16 = np.float32, np.float16
ELEM = {
    np.dtype(np.float32): TP.FLOAT,
    np.dtype(np.float16): TP.FLOAT16,
    np.dtype(np.int8): TP.INT8,
    np.dtype(np.uint8): TP.UINT8,
    np.dtype(np.int32): TP.INT32,
    np.dtype(np.int64): TP.INT64,
}
INPUTS = (
    "query key value past_key past_value seqlens_k total_sequence_length cos_cache sin_cache position_ids "
    "attention_bias head_sink k_scale v_scale"
).split()


# ---------------------------------------------------------------------------------------------- ORT


def run_ort(inp: dict, attrs: dict, *, qk: int = 0, shared: bool = False) -> list[np.ndarray]:
    """ORT's (output, present_key, present_value[, output_qk]); ``shared``: present bound to the past's
    buffer (IO binding), so ORT runs with past_present_share_buffer."""
    given = [n for n in INPUTS if inp.get(n) is not None]
    names = [n if inp.get(n) is not None else "" for n in INPUTS]
    while names[-1] == "":
        names.pop()
    outs = ["output", "present_key", "present_value"] + (["output_qk"] if qk else [])
    node = helper.make_node(
        "GroupQueryAttention", names, outs, domain="com.microsoft", **attrs, **({"qk_output": qk} if qk else {})
    )
    t = inp["query"].dtype
    ct = inp["past_key"].dtype if inp.get("past_key") is not None else t
    vi = [helper.make_tensor_value_info(n, ELEM[inp[n].dtype], list(inp[n].shape)) for n in given]
    ovi = [helper.make_tensor_value_info(o, ELEM[ct if o.startswith("present") else t], None) for o in outs]
    graph = helper.make_graph([node], "gqa", vi, ovi)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 4
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feeds = {n: inp[n] for n in given}
    if not shared:
        return sess.run(None, feeds)
    kbuf, vbuf = inp["past_key"].copy(), inp["past_value"].copy()  # alive while ORT writes into them
    kval, vval = ort.OrtValue.ortvalue_from_numpy(kbuf), ort.OrtValue.ortvalue_from_numpy(vbuf)
    io = sess.io_binding()
    for n, a in feeds.items():
        if n == "past_key":
            io.bind_ortvalue_input(n, kval)
        elif n == "past_value":
            io.bind_ortvalue_input(n, vval)
        else:
            io.bind_cpu_input(n, a)
    io.bind_output("output")
    io.bind_ortvalue_output("present_key", kval)
    io.bind_ortvalue_output("present_value", vval)
    if qk:
        io.bind_output("output_qk")
    sess.run_with_iobinding(io)
    res = io.copy_outputs_to_cpu()
    return [res[0], kbuf.copy(), vbuf.copy()] + res[3:]


def run_oracle(inp: dict, attrs: dict, *, qk: int = 0, shared: bool = False, precision: str = "reference"):
    a = dict(inp)
    pos = [a.pop(n, None) for n in INPUTS[:7]]
    return group_query_attention(*pos, **a, **attrs, output_qk=qk, shared_buffer=shared, precision=precision)


# ---------------------------------------------------------------------------------------------- cases


def rope_tables(max_pos: int, rot_dim: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    inv = 1.0 / 10000.0 ** (np.arange(0, rot_dim, 2) / rot_dim)
    ang = np.arange(max_pos)[:, None] * inv[None, :]
    return np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)


def make_inputs(c: dict, dtype, seed: int) -> tuple[dict, dict]:
    """(inputs, attributes) of a case dict (see CASES)."""
    rng = np.random.default_rng(seed)
    B, S, N, Nk, H, P, T = (c[k] for k in ("B", "S", "N", "Nk", "H", "P", "T"))
    rnd = lambda *shape: rng.standard_normal(shape).astype(dtype)  # noqa: E731
    inp: dict = {}
    if c.get("packed"):
        inp["query"] = rnd(B, S, (N + 2 * Nk) * H)
    else:
        inp["query"], inp["key"], inp["value"] = rnd(B, S, N * H), rnd(B, S, Nk * H), rnd(B, S, Nk * H)
    attrs: dict = {"num_heads": N, "kv_num_heads": Nk}
    bits, qt = c.get("bits", 0), c.get("quant", "NONE")
    if bits:
        attrs.update(k_quant_type=qt, v_quant_type=qt, kv_cache_bit_width=bits)
        shape = (1,) if qt == "PER_TENSOR" else (1, Nk, 1, H)
        inp["k_scale"] = rng.uniform(0.015, 0.04, shape).astype(F32)
        inp["v_scale"] = rng.uniform(0.015, 0.04, shape).astype(F32)
    if P is not None:
        if bits:
            lo, hi, hs, dt = (-128, 128, H, np.int8) if bits == 8 else (0, 256, H // 2, np.uint8)
            inp["past_key"], inp["past_value"] = (rng.integers(lo, hi, (B, Nk, P, hs), dtype=dt) for _ in "kv")
        else:
            inp["past_key"], inp["past_value"] = rnd(B, Nk, P, H), rnd(B, Nk, P, H)
    inp["seqlens_k"] = np.asarray(c["seqlens"], np.int32)
    inp["total_sequence_length"] = np.asarray([T], np.int32)
    if c.get("rotary"):
        attrs.update(do_rotary=1, rotary_interleaved=int(c["rotary"] == "interleaved"))
        inp["cos_cache"], inp["sin_cache"] = rope_tables(c.get("max_pos", T + 16), c.get("rd", H), dtype)
    if c.get("pos") is not None:
        inp["position_ids"] = np.asarray(c["pos"], np.int64)
    if c.get("window"):
        attrs["local_window_size"] = c["window"]
    if c.get("softcap"):
        attrs["softcap"] = c["softcap"]
    if c.get("scale"):
        attrs["scale"] = c["scale"]
    if c.get("bias"):
        inp["attention_bias"] = (rng.standard_normal((*c["bias"], S, T)) * 2).astype(dtype)
    if c.get("sink"):
        inp["head_sink"] = (rng.standard_normal(N) * 2).astype(dtype)
    if c.get("smooth"):
        attrs["smooth_softmax"] = 1
    return inp, attrs


def _case(name: str, **kw) -> tuple[str, dict]:
    return name, kw


CASES = dict(
    [
        # first prompts (S == T; past ignored), right padding when seqlens_k + 1 < S
        _case("prompt_b1_gqa4_h64", B=1, S=7, N=8, Nk=2, H=64, P=None, T=7, seqlens=[6]),
        _case("prompt_b3_ragged_h128_rot", B=3, S=6, N=4, Nk=1, H=128, P=None, T=6, seqlens=[5, 2, 3], rotary="half"),
        _case("prompt_b2_interleaved_pos00", B=2, S=5, N=8, Nk=2, H=64, P=None, T=5, seqlens=[4, 4],
              rotary="interleaved", pos=[[3, 4, 5, 6, 7], [0, 9, 9, 9, 9]]),
        _case("prompt_past_ignored", B=2, S=5, N=4, Nk=1, H=64, P=9, T=5, seqlens=[4, 2], rotary="half"),
        _case("prompt_window3", B=2, S=8, N=8, Nk=2, H=64, P=None, T=8, seqlens=[7, 5], window=3),
        _case("prompt_packed_rot", B=2, S=4, N=8, Nk=2, H=64, P=None, T=4, seqlens=[3, 3], packed=True,
              rotary="half"),
        # decode (S == 1) with a past, ragged batches
        _case("decode_b4_ragged_interleaved", B=4, S=1, N=8, Nk=2, H=64, P=11, T=12, seqlens=[11, 3, 7, 0],
              rotary="interleaved"),
        _case("decode_full_32_8_h128", B=2, S=1, N=32, Nk=8, H=128, P=23, T=24, seqlens=[23, 17], rotary="half"),
        _case("decode_full_40_10_partial_rot", B=2, S=1, N=40, Nk=10, H=64, P=15, T=16, seqlens=[15, 9],
              rotary="half", rd=32),
        _case("decode_posids", B=3, S=1, N=4, Nk=1, H=64, P=9, T=10, seqlens=[9, 4, 6], rotary="half",
              pos=[[30], [4], [17]], max_pos=40),
        _case("decode_window_L_eq_W", B=1, S=1, N=8, Nk=2, H=64, P=4, T=5, seqlens=[4], window=5),
        _case("decode_window_L_eq_W_plus_1", B=1, S=1, N=8, Nk=2, H=64, P=5, T=6, seqlens=[5], window=5),
        _case("decode_window_ragged", B=3, S=1, N=8, Nk=2, H=64, P=12, T=13, seqlens=[12, 2, 5], window=4),
        _case("decode_softcap_bias", B=2, S=1, N=8, Nk=2, H=64, P=9, T=10, seqlens=[9, 6], softcap=3.0,
              bias=(2, 8)),
        _case("decode_bias_broadcast_scale", B=2, S=1, N=4, Nk=2, H=64, P=9, T=10, seqlens=[9, 6], bias=(1, 1),
              scale=0.2),
        _case("decode_negative_scale", B=2, S=1, N=4, Nk=2, H=64, P=9, T=10, seqlens=[9, 6], scale=-0.2, qk=1),
        _case("decode_head_sink", B=2, S=1, N=8, Nk=2, H=64, P=9, T=10, seqlens=[9, 3], sink=True, rotary="half"),
        _case("decode_smooth_softmax", B=2, S=1, N=8, Nk=2, H=64, P=9, T=10, seqlens=[9, 3], smooth=True),
        _case("decode_sink_wins_over_smooth", B=2, S=1, N=8, Nk=2, H=64, P=9, T=10, seqlens=[9, 3], smooth=True,
              sink=True),
        _case("decode_packed", B=2, S=1, N=8, Nk=2, H=64, P=6, T=7, seqlens=[6, 2], packed=True,
              rotary="interleaved"),
        # subsequent prompt (chunked prefill, B = 1)
        _case("chunk_growing", B=1, S=4, N=8, Nk=2, H=64, P=9, T=13, seqlens=[12], rotary="half"),
        _case("chunk_posids_window", B=1, S=3, N=8, Nk=2, H=128, P=6, T=9, seqlens=[8], rotary="interleaved",
              pos=[[6, 7, 8]], window=4),
        # shared past/present buffer (present is the past buffer, P >= T)
        _case("shared_decode", B=3, S=1, N=8, Nk=2, H=64, P=16, T=10, seqlens=[9, 4, 6], shared=True,
              rotary="half"),
        _case("shared_chunk", B=1, S=3, N=8, Nk=2, H=64, P=16, T=11, seqlens=[10], shared=True, rotary="half"),
        _case("shared_prompt", B=2, S=4, N=4, Nk=1, H=64, P=8, T=4, seqlens=[3, 1], shared=True),
        # output_qk (1: scores, 2: probabilities); masked columns 0
        _case("qk_scores_prompt", B=2, S=5, N=4, Nk=2, H=64, P=None, T=5, seqlens=[4, 2], qk=1, window=2,
              softcap=2.5, bias=(2, 1)),
        _case("qk_probs_decode", B=2, S=1, N=4, Nk=2, H=64, P=7, T=8, seqlens=[7, 3], qk=2, sink=True),
        # quantized caches: K quantized after rotary
        _case("int8_tensor_decode", B=2, S=1, N=8, Nk=2, H=64, P=9, T=10, seqlens=[9, 5], bits=8,
              quant="PER_TENSOR", rotary="half"),
        _case("int8_channel_prompt", B=2, S=6, N=8, Nk=2, H=64, P=0, T=6, seqlens=[5, 3], bits=8,
              quant="PER_CHANNEL", rotary="interleaved"),
        _case("int4_tensor_decode_window", B=2, S=1, N=4, Nk=1, H=128, P=9, T=10, seqlens=[9, 5], bits=4,
              quant="PER_TENSOR", rotary="half", window=4),
        _case("int4_channel_chunk", B=1, S=3, N=8, Nk=2, H=64, P=6, T=9, seqlens=[8], bits=4, quant="PER_CHANNEL",
              rotary="half"),
        _case("int8_shared_softcap_qk", B=2, S=1, N=8, Nk=2, H=64, P=12, T=10, seqlens=[9, 5], bits=8,
              quant="PER_CHANNEL", shared=True, softcap=2.0, qk=2),
        _case("int4_sink_bias", B=2, S=1, N=8, Nk=2, H=64, P=9, T=10, seqlens=[9, 4], bits=4, quant="PER_TENSOR",
              sink=True, bias=(1, 8)),
    ]
)  # fmt: skip


def _assert_exact(ours: np.ndarray, theirs: np.ndarray, what: str) -> None:
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, (what, ours.dtype, theirs.dtype, ours.shape)
    bad = np.argwhere(ours != theirs)
    assert bad.size == 0, f"{what}: {len(bad)} elements differ, first at {bad[0].tolist()}"


def _assert_within(ours: np.ndarray, theirs: np.ndarray, bound: np.ndarray, what: str) -> None:
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, (what, ours.dtype, theirs.dtype, ours.shape)
    err = np.abs(ours.astype(np.float64) - theirs.astype(np.float64))
    ratio = err / np.maximum(bound, 1e-300)
    worst = np.unravel_index(np.argmax(ratio), ratio.shape)
    assert (err <= bound).all(), (
        f"{what}: error {err[worst]:.3g} at {list(worst)} exceeds the bound {bound[worst]:.3g} "
        f"(oracle {ours[worst]!r}, ort {theirs[worst]!r})"
    )


@pytest.mark.parametrize("dtype", [F32, F16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("name", list(CASES))
def test_gqa_matches_ort(name: str, dtype) -> None:
    """Present caches bit-exact (defined rows, then the tail policy), output and output_qk within the
    derived bound (qconform.ops.ort.attention_bounds)."""
    c = CASES[name]
    inp, attrs = make_inputs(c, dtype, seed=zlib.crc32(name.encode()))
    qk, shared = c.get("qk", 0), c.get("shared", False)
    theirs = run_ort(inp, attrs, qk=qk, shared=shared)
    ours = run_oracle(inp, attrs, qk=qk, shared=shared)
    T = c["T"]
    rows = defined_present_rows(inp["seqlens_k"], T, c["S"], ours[1].shape[2])
    for i, what in ((1, "present_key"), (2, "present_value")):
        for b in range(c["B"]):
            _assert_exact(ours[i][b][:, rows[b]], theirs[i][b][:, rows[b]], f"{what}[{b}] defined rows")
        _assert_exact(ours[i], theirs[i], f"{what} (later rows: {'untouched' if shared else 'zero'})")
    terms = attention_terms(inp, attrs, ours[1], ours[2])
    o, _, _, p = run_oracle(inp, attrs, qk=2, shared=shared, precision="float64")
    bound = to_bsnh(output_bound(terms, p, to_bnsh(o, c["N"])))
    if dtype == F16:
        bound = bound + fp16_spacing(np.maximum(np.abs(ours[0]), np.abs(theirs[0])))
    if c.get("window"):  # padded prompt rows: path-dependent in ORT (test_padded_rows_with_a_window)
        real = defined_output_rows(inp["seqlens_k"], T, c["S"])[..., None]
        bound = np.where(real, bound, np.inf)
    _assert_within(ours[0], theirs[0], bound, "output")
    if qk:
        # masked columns (probability 0 in float64; a real key's exp(x - m) >= e^-745 never is): exactly 0 in
        # both; a real score may be 0 in one and not the other (a cancelling dot summed in another order)
        masked = p[..., : ours[3].shape[-1]] == 0
        qb = np.where(masked, 0.0, qk_bound(terms, qk, p))
        if dtype == F16:
            qb = qb + np.where(masked, 0.0, fp16_spacing(np.maximum(np.abs(ours[3]), np.abs(theirs[3]))))
        _assert_within(ours[3], theirs[3], qb, "output_qk")


@pytest.mark.parametrize("flash", ["0", "1"], ids=["flash", "no_flash"])
def test_padded_rows_with_a_window(flash: str, monkeypatch) -> None:
    """Right-padded first-prompt rows s >= total_b with a local window W: ORT's default fp32 path (the
    MLAS flash kernel) attends keys [s + 1 - W, total_b), its other path (ORT_GQA_DISABLE_FLASH_ATTENTION=1,
    and every fp16 / softcap / sink / output_qk call) and the oracle [total_b - W, total_b). Rows of real
    tokens agree in both."""
    monkeypatch.setenv("ORT_GQA_DISABLE_FLASH_ATTENTION", flash)
    c = CASES["prompt_window3"]
    inp, attrs = make_inputs(c, F32, seed=5)
    theirs = run_ort(inp, attrs)[0]
    ours = run_oracle(inp, attrs)
    o, _, _, p = run_oracle(inp, attrs, qk=2, precision="float64")
    bound = to_bsnh(output_bound(attention_terms(inp, attrs, ours[1], ours[2]), p, to_bnsh(o, c["N"])))
    real = defined_output_rows(inp["seqlens_k"], c["T"], c["S"])[..., None]
    _assert_within(ours[0], theirs, np.where(real, bound, np.inf), "output, real rows")
    padded_agree = (np.abs(ours[0] - theirs) <= bound)[~real[..., 0]]
    assert padded_agree.all() == (flash == "1")


def test_cases_cover_every_feature() -> None:
    """The case list exercises each feature the issue names (a guard against dropping one)."""
    keys = {k for c in CASES.values() for k, v in c.items() if v}
    assert set("rotary rd pos window softcap bias sink smooth packed bits shared qk".split()) <= keys
    assert {c["rotary"] for c in CASES.values() if c.get("rotary")} == {"half", "interleaved"}
    assert {(c["bits"], c["quant"]) for c in CASES.values() if c.get("bits")} == {
        (b, q) for b in (4, 8) for q in ("PER_TENSOR", "PER_CHANNEL")
    }
    assert {c["H"] for c in CASES.values()} == {64, 128} and {1, 2, 3, 4} <= {c["B"] for c in CASES.values()}
    assert {(c["N"], c["Nk"]) for c in CASES.values()} >= {(32, 8), (40, 10), (8, 2), (4, 1)}


@pytest.mark.parametrize("dtype", [F32, F16], ids=["fp32", "fp16"])
def test_a_real_score_of_zero_is_not_a_masked_column(dtype) -> None:
    """q . k_0 cancels exactly (products +-2^25 and +-1 in fp32; +-2^23 and +-128 in fp16): the oracle's
    score is 0, ORT's fp32 GEMM sums in another order. Key 0 is attended, so its bound is the score's
    (no exact-zero rule for it); the check passes only where ORT lands within that bound."""
    H = 64
    c = dict(B=1, S=1, N=1, Nk=1, H=H, P=1, T=2, seqlens=[1])
    inp, attrs = make_inputs(c, dtype, seed=0)
    big, small = (64.0, 2.0**19) if dtype == F32 else (256.0, 2.0**15)
    q, k0 = np.ones(H), np.zeros(H)
    q[0] = q[32] = big
    k0[0], k0[32], k0[16], k0[48] = small, -small, 0.5, -0.5
    inp["query"] = q.astype(dtype).reshape(1, 1, H)
    inp["past_key"] = k0.astype(dtype).reshape(1, 1, 1, H)
    ours, theirs = run_oracle(inp, attrs, qk=1)[3], run_ort(inp, attrs, qk=1)[3]
    assert ours[0, 0, 0, 0] == 0
    o, _, _, p = run_oracle(inp, attrs, qk=2, precision="float64")
    assert (p[..., :2] > 0).all()  # both keys attended: no column of this call is masked
    qb = qk_bound(attention_terms(inp, attrs, *run_oracle(inp, attrs)[1:3]), 1, p)
    if dtype == F16:
        qb = qb + fp16_spacing(np.maximum(np.abs(ours), np.abs(theirs)))
    _assert_within(ours, theirs, qb, "output_qk")
    assert qb[0, 0, 0, 0] > 0


def test_probabilities_in_the_subnormals_are_bounded() -> None:
    """Scores -87.5 .. -103 below the new key's 0 (fp32, output_qk 2): their probabilities fall in fp32's
    subnormals, where ORT and the oracle may round one spacing (2^-149) apart, which no relative bound
    covers; the bound's absolute underflow term (eta / 2 a rounding, two roundings, two sides) does, and
    rejects three spacings. That is ORT on a host where MLAS runs its AVX-512 softmax kernels
    (tests/mlas_host.py). Its AVX2 (FMA3) exp kernel gives 0 for part of the subnormal range instead
    (measured with ORT 1.32 on an AVX2 host: the first 4 of 255 kept, 7.8e-39 and below 0), which the
    oracle does not model: there the probabilities ORT keeps are within the bound, and it must flush
    some, else the host runs a kernel this test does not know."""
    H, L = 16, 256
    c = dict(B=1, S=1, N=1, Nk=1, H=H, P=L - 1, T=L, seqlens=[L - 1])
    inp, attrs = make_inputs(c, F32, seed=0)
    attrs["scale"] = 1.0
    inp["query"] = np.zeros((1, 1, H), F32)
    inp["query"][0, 0, 0] = 1.0
    inp["past_key"] = np.zeros((1, 1, L - 1, H), F32)
    inp["past_key"][0, 0, :, 0] = -np.linspace(87.5, 103.0, L - 1, dtype=F32)
    inp["key"] = np.zeros((1, 1, H), F32)
    ours, theirs = run_oracle(inp, attrs, qk=2)[3], run_ort(inp, attrs, qk=2)[3]
    _, _, _, p = run_oracle(inp, attrs, qk=2, precision="float64")
    qb = qk_bound(attention_terms(inp, attrs, *run_oracle(inp, attrs)[1:3]), 2, p)
    tiny = (np.abs(ours) < 2.0**-126) & (ours != 0)
    assert tiny.sum() > 100, "the case has no subnormal probabilities"
    kept = np.ones(ours.shape, bool)
    if mlas_x86_kernel() == "avx2":
        kept = ~tiny | (theirs != 0)
        assert (~kept).any(), "ORT kept every subnormal probability: not the AVX2 exp kernel this test knows"
    _assert_within(np.where(kept, ours, 0), np.where(kept, theirs, 0), qb, "output_qk")
    off = ours.astype(np.float64) + 3 * 2.0**-149 * tiny
    assert (np.abs(off - np.where(kept, theirs, ours)) > qb).any(), "three subnormal spacings pass the bound"


def test_fp32_rotary_rounds_like_the_avx2_kernel() -> None:
    """ORT's fp32 rotary (MLAS AVX2 kernel) fuses one product: fp32(a*c - fp32(b*t)); two roundings
    (fp32(fp32(a*c) - fp32(b*t)), the scalar fallback) differ from ORT, the fused form does not."""
    c = dict(B=2, S=1, N=8, Nk=8, H=128, P=40, T=41, seqlens=[40, 40], rotary="half", max_pos=200)
    inp, attrs = make_inputs(c, F32, seed=7)
    inp["position_ids"] = np.asarray([[137], [71]], np.int64)
    theirs = run_ort(inp, attrs)[1][:, :, 40]
    ours = run_oracle(inp, attrs)[1][:, :, 40]
    _assert_exact(ours, theirs, "rotated key")
    k = inp["key"].reshape(2, 1, 8, 128).transpose(0, 2, 1, 3).astype(np.float64)
    cos = inp["cos_cache"][inp["position_ids"]][:, None].astype(np.float64)
    sin = inp["sin_cache"][inp["position_ids"]][:, None].astype(np.float64)
    a, b = k[..., :64], k[..., 64:]
    f32 = lambda x: x.astype(F32).astype(np.float64)  # noqa: E731
    two = np.concatenate([f32(f32(a * cos) - f32(b * sin)), f32(f32(a * sin) + f32(b * cos))], axis=-1)
    assert (two[:, :, 0].astype(F32) != theirs).any(), "the case does not tell one rounding from two"


def _tie_values(scale: float, bits: int) -> np.ndarray:
    """Values at and next to the rounding ties k + 0.5 of x / scale, inside the range and at its ends."""
    lo, hi = (-128, 127) if bits == 8 else (-8, 7)
    k = np.arange(lo - 1, hi + 1, dtype=np.float64) + 0.5
    x = (k * np.float64(scale)).astype(F32)
    return np.concatenate([x, np.nextafter(x, np.inf), np.nextafter(x, -np.inf), (k * scale / 1.0000001).astype(F32)])


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("scale", [0.5, 0.1, 0.0375])
def test_cache_quantization_ties_match_ort(bits: int, scale: float) -> None:
    """int8 / 4-bit caches at exact ties of x / scale: rint(fp32(x * fp32(1/scale))) half to even, as ORT
    (no rotary, so the cache holds the raw K / V). With a scale whose reciprocal is inexact, a true division
    rounds some ties the other way: that form is checked to disagree with ORT."""
    vals = _tie_values(scale, bits)
    H = 64
    n = -(-vals.size // H) * H
    vals = np.resize(vals, n).reshape(1, n // H, H)  # S = n / H tokens, one KV head
    S = vals.shape[1]
    inp = {
        "query": np.zeros((1, S, H), F32),
        "key": vals,
        "value": vals[:, ::-1].copy(),
        "past_key": np.zeros((1, 1, 0, H if bits == 8 else H // 2), np.int8 if bits == 8 else np.uint8),
        "past_value": np.zeros((1, 1, 0, H if bits == 8 else H // 2), np.int8 if bits == 8 else np.uint8),
        "seqlens_k": np.asarray([S - 1], np.int32),
        "total_sequence_length": np.asarray([S], np.int32),
        "k_scale": np.asarray([scale], F32),
        "v_scale": np.asarray([scale], F32),
    }
    attrs = dict(num_heads=1, kv_num_heads=1, k_quant_type="PER_TENSOR", v_quant_type="PER_TENSOR")
    attrs["kv_cache_bit_width"] = bits
    theirs = run_ort(inp, attrs)
    ours = run_oracle(inp, attrs)
    _assert_exact(ours[1], theirs[1], "present_key")
    _assert_exact(ours[2], theirs[2], "present_value")
    x = vals.reshape(1, 1, S, H)
    by_division = quantize_kv(x, np.full((1, H), scale, F32), bits, form="float64")
    if scale == 0.1:
        assert (by_division != theirs[1]).any(), "no tie where division and the reciprocal multiply disagree"


def test_first_prompt_position_ids_use_only_the_first_element() -> None:
    """On the first prompt ORT rotates every batch entry with position_ids[0, 0] + s (docs/ort-ops.md 4.4)."""
    c = dict(B=2, S=4, N=4, Nk=1, H=64, P=None, T=4, seqlens=[3, 3], rotary="half", max_pos=40)
    inp, attrs = make_inputs(c, F32, seed=3)
    inp["position_ids"] = np.asarray([[20, 21, 22, 23], [1, 2, 3, 4]], np.int64)
    theirs = run_ort(inp, attrs)[1]
    k = inp["key"].reshape(2, 4, 1, 64).transpose(0, 2, 1, 3).astype(np.float64)
    pos = np.asarray([[20, 21, 22, 23]] * 2)
    want = apply_rotary(k, inp["cos_cache"], inp["sin_cache"], pos, False, "fma").astype(F32)
    _assert_exact(want, theirs, "present_key")


REJECTED = {
    "chunk_with_batch_2": (dict(B=2, S=3, P=6, T=9, seqlens=[8, 8]), "query"),
    "total_not_past_plus_s": (dict(P=5, T=8, seqlens=[5, 5]), "total_sequence_length"),
    "seqlens_beyond_present": (dict(seqlens=[9, 12]), "seqlens_k"),
    "rotary_head_size_8": (dict(H=8, rotary="half"), "cos_cache"),
    "v_quant_type_differs": (dict(bits=8, quant="PER_TENSOR", vq="PER_CHANNEL"), "v_quant_type"),
    "kv_heads_do_not_divide": (dict(N=6, Nk=4), "num_heads"),
}


@pytest.mark.parametrize("name", list(REJECTED))
def test_ort_and_the_oracle_reject_the_same_calls(name: str) -> None:
    """Calls ORT's CPU kernel refuses raise ArgumentError naming the argument in the oracle."""
    change, arg = REJECTED[name]
    c = dict(B=2, S=1, N=8, Nk=2, H=64, P=9, T=10, seqlens=[9, 5])
    c.update({k: v for k, v in change.items() if k != "vq"})
    inp, attrs = make_inputs(c, F32, seed=1)
    if "vq" in change:
        attrs["v_quant_type"] = change["vq"]
    with pytest.raises(Exception):  # noqa: B017 - ORT raises its own Fail / InvalidArgument types
        run_ort(inp, attrs)
    with pytest.raises(ArgumentError, match=f"^{arg}:"):
        run_oracle(inp, attrs)


def ort_gqa(*args, out=None, shared_buffer: bool = False, **attrs):
    """ORT's CPU provider as a ``py:`` implementation of the catalogue's gqa_decode / gqa_prefill
    (the oracle's argument rules first, as a drop-in must reject bad calls itself)."""
    group_query_attention(*args, out=out, shared_buffer=shared_buffer, **attrs)
    inp = {n: a for n, a in zip(INPUTS, args, strict=True) if a is not None}
    got = tuple(run_ort(inp, attrs, shared=shared_buffer))
    if out is None:
        return got
    for buf, a in zip(out, got, strict=True):
        buf[...] = a
    return out


@pytest.mark.parametrize("op_name", ["gqa_decode", "gqa_prefill"])
def test_ort_passes_the_catalogue(op_name: str) -> None:
    """Every coverage-2 case of every leaf of the catalogue entry: ORT's output within the bound of
    qconform.ops.ort.attention_bounds (strict contract), its caches exact on the defined rows."""
    op = get_op(op_name)
    impl = CallableImpl("ort", ort_gqa, (op_name,))
    for leaf in op.leaves:
        for case in op.cases(leaf.name, 2):
            outcome = matches_oracle(impl, op, Prepared.from_case(op, case, impl))
            assert outcome.ok, (leaf.name, case.id, outcome.detail)

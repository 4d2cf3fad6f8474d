"""The GroupQueryAttention oracle on its own (no onnxruntime): hand-derived cases, its precisions
against each other, argument validation, and deliberately broken local variants that the hand
cases must catch. Semantics: docs/ort-ops.md section 4; tests/test_upstream_ort_gqa.py checks the
same oracle against onnxruntime."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from collections.abc import Callable, Iterator
from fractions import Fraction

import numpy as np
import pytest

from qconform.errors import ArgumentError
from qconform.ops.ort.attention_bounds import U16, attention_terms, fp16_spacing, output_bound, to_bnsh, to_bsnh
from qconform.oracles.ort import defined_output_rows, defined_present_rows, group_query_attention
from qconform.oracles.ort.kv_cache import dequantize_kv, expand_kv_scale, quantize_kv
from qconform.oracles.ort.rotary import _fp32_sum, apply_rotary

gqa_mod = importlib.import_module("qconform.oracles.ort.group_query_attention")  # the package re-exports the function

F32, F16 = np.float32, np.float16
Gqa = Callable[..., tuple]


def call(gqa: Gqa, inp: dict, **attrs) -> tuple:
    a = dict(inp)
    names = ("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length")
    return gqa(*[a.pop(n, None) for n in names], **a, **attrs)


def zeros_query(B: int, S: int, N: int, H: int, dtype=F32) -> np.ndarray:
    """q = 0: every score 0, so attention is the plain mean of the attended V rows."""
    return np.zeros((B, S, N * H), dtype)


def ramp_values(B: int, rows: int, Nk: int, H: int, dtype=F32) -> np.ndarray:
    """V rows whose means identify the attended set: row j of batch b = 2^j + b/4 in every channel."""
    v = (2.0 ** np.arange(rows))[None, :, None] + np.arange(B)[:, None, None] / 4
    return np.broadcast_to(v, (B, rows, Nk * H)).astype(dtype)


def bnsh(x: np.ndarray, heads: int) -> np.ndarray:
    B, S, D = x.shape
    return x.reshape(B, S, heads, D // heads).transpose(0, 2, 1, 3)


# ---------------------------------------------------------------------------------------------- hand cases
# Each takes the implementation under test and raises AssertionError when it disagrees with the
# value derived by hand (in the comment). Mutants below must fail at least the one aimed at them.


def check_single_key(gqa: Gqa) -> None:
    """One token, no past: p = 1, so output = v and present = (k, v) exactly."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, n * 16)).astype(F32) for n in (2, 1, 1))
    out, pk, pv = call(gqa, dict(query=q, key=k, value=v, seqlens_k=np.array([0]), total_sequence_length=1),
                       num_heads=2, kv_num_heads=1)  # fmt: skip
    np.testing.assert_array_equal(out, np.concatenate([v, v], axis=-1))
    np.testing.assert_array_equal(pk, bnsh(k, 1))
    np.testing.assert_array_equal(pv, bnsh(v, 1))


def check_causal_prompt(gqa: Gqa) -> None:
    """First prompt, q = 0: row s is the mean of V rows 0..s; a right-padded row s >= total_b the mean of
    rows 0..total_b-1."""
    B, S, H = 2, 4, 16
    v = ramp_values(B, S, 1, H)
    inp = dict(query=zeros_query(B, S, 2, H), key=v.copy(), value=v, seqlens_k=np.array([3, 1]),
               total_sequence_length=S)  # fmt: skip
    out = call(gqa, inp, num_heads=2, kv_num_heads=1, precision="float64")[0]
    for b, total in enumerate((4, 2)):
        for s in range(S):
            want = v[b, : min(s + 1, total), 0].astype(np.float64).mean()
            np.testing.assert_allclose(out[b, s], want, rtol=1e-13, err_msg=f"b={b} s={s}")


def check_causal_with_past(gqa: Gqa) -> None:
    """Subsequent prompt, P = 4 past rows + S = 3: row s sees rows 0..4+s; ragged decode: batch b sees
    rows 0..seqlens_k[b]."""
    H = 16
    past = ramp_values(1, 4, 1, H)
    new = ramp_values(1, 7, 1, H)[:, 4:]
    inp = dict(query=zeros_query(1, 3, 2, H), key=new.copy(), value=new, past_key=bnsh(past, 1).copy(),
               past_value=bnsh(past, 1).copy(), seqlens_k=np.array([6]), total_sequence_length=7)  # fmt: skip
    out = call(gqa, inp, num_heads=2, kv_num_heads=1, precision="float64")[0]
    for s in range(3):
        np.testing.assert_allclose(out[0, s], (2.0 ** np.arange(5 + s)).mean(), rtol=1e-13, err_msg=f"chunk s={s}")
    allv = ramp_values(2, 7, 1, H)
    inp = dict(query=zeros_query(2, 1, 2, H), key=allv[:, 6:].copy(), value=allv[:, 6:].copy(),
               past_key=bnsh(allv[:, :6], 1).copy(), past_value=bnsh(allv[:, :6], 1).copy(),
               seqlens_k=np.array([6, 3]), total_sequence_length=7)  # fmt: skip
    out = call(gqa, inp, num_heads=2, kv_num_heads=1, precision="float64")[0]
    np.testing.assert_allclose(out[0, 0], allv[0, :7, 0].mean(dtype=np.float64), rtol=1e-13)
    # batch 1: past rows 0..2, the new token written at row 3 (its past length is seqlens_k - S + 1 = 3)
    np.testing.assert_allclose(out[1, 0], np.r_[allv[1, :3, 0], allv[1, 6, 0]].mean(dtype=np.float64), rtol=1e-13)


def check_window(gqa: Gqa) -> None:
    """local_window_size = W: the last W keys including the query's own. Decode with L = W keys (no
    effect), L = W + 1 (drops key 0) and a ragged batch; a prompt: row s sees rows max(0, s-W+1)..s."""
    H, W = 16, 3
    for L in (W, W + 1):
        allv = ramp_values(1, L, 1, H)
        inp = dict(query=zeros_query(1, 1, 2, H), key=allv[:, -1:].copy(), value=allv[:, -1:].copy(),
                   past_key=bnsh(allv[:, :-1], 1).copy(), past_value=bnsh(allv[:, :-1], 1).copy(),
                   seqlens_k=np.array([L - 1]), total_sequence_length=L)  # fmt: skip
        out = call(gqa, inp, num_heads=2, kv_num_heads=1, local_window_size=W, precision="float64")[0]
        np.testing.assert_allclose(out[0, 0], allv[0, L - W :, 0].mean(dtype=np.float64), rtol=1e-13, err_msg=f"L={L}")
    S = 6
    v = ramp_values(1, S, 1, H)
    inp = dict(query=zeros_query(1, S, 2, H), key=v.copy(), value=v, seqlens_k=np.array([S - 1]),
               total_sequence_length=S)  # fmt: skip
    out = call(gqa, inp, num_heads=2, kv_num_heads=1, local_window_size=W, precision="float64")[0]
    for s in range(S):
        np.testing.assert_allclose(out[0, s], v[0, max(0, s - W + 1) : s + 1, 0].mean(dtype=np.float64), rtol=1e-13)


def check_sinks(gqa: Gqa) -> None:
    """q = 0, L keys of V = 1: smooth_softmax gives L / (L + 1); head_sink sigma_n gives L / (L + e^sigma_n)
    (m = max(0, sigma) cancels)."""
    H, L = 16, 3
    allv = np.ones((1, L, 16), F32)
    base = dict(query=zeros_query(1, 1, 2, H), key=allv[:, -1:].copy(), value=allv[:, -1:].copy(),
                past_key=bnsh(allv[:, :-1], 1).copy(), past_value=bnsh(allv[:, :-1], 1).copy(),
                seqlens_k=np.array([L - 1]), total_sequence_length=L)  # fmt: skip
    out = call(gqa, base, num_heads=2, kv_num_heads=1, smooth_softmax=1, precision="float64")[0]
    np.testing.assert_allclose(out, L / (L + 1), rtol=1e-13)
    sink = np.array([-1.0, 2.0], F32)
    out = call(gqa, dict(base, head_sink=sink), num_heads=2, kv_num_heads=1, precision="float64")[0]
    for n in range(2):
        np.testing.assert_allclose(out[0, 0, n * H : (n + 1) * H], L / (L + np.exp(np.float64(sink[n]))), rtol=1e-13)


def check_softcap_then_bias(gqa: Gqa) -> None:
    """Two keys, x0 = alpha q.k0 = 0.25 * 4 * 3 = 3, x1 = 0; softcap c = 2 then bias (1, 0):
    x0' = 2 tanh(1.5) + 1, so p0 = sigmoid(x0') and with v0 = 1, v1 = 0 the output is p0. output_qk 1
    returns (x0', 0)."""
    H = 16
    q = np.zeros((1, 1, H), F32)
    q[0, 0, 0] = 4
    k0 = np.zeros((1, 1, H), F32)
    k0[0, 0, 0] = 3
    inp = dict(query=q, key=np.zeros((1, 1, H), F32), value=np.zeros((1, 1, H), F32),
               past_key=k0[:, None].copy(), past_value=np.ones((1, 1, 1, H), F32), seqlens_k=np.array([1]),
               total_sequence_length=2, attention_bias=np.array([[[[1.0, 0.0]]]], F32))  # fmt: skip
    out, _, _, qk = call(gqa, inp, num_heads=1, kv_num_heads=1, softcap=2.0, precision="float64", output_qk=1)
    x0 = 2 * np.tanh(1.5) + 1
    np.testing.assert_allclose(qk[0, 0, 0], [x0, 0.0], rtol=1e-13)
    np.testing.assert_allclose(out[0, 0], 1 / (1 + np.exp(-x0)), rtol=1e-13)


def _quarter_turn(max_pos: int, half: int) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables: identity at position 0, a quarter turn (cos 0, sin 1) at every later position."""
    cos = np.zeros((max_pos, half), F32)
    sin = np.ones((max_pos, half), F32)
    cos[0], sin[0] = 1, 0
    return cos, sin


def check_rotary_layouts(gqa: Gqa) -> None:
    """A quarter turn at position 1: half split y[i] = -x[i + rd/2], y[i + rd/2] = x[i]; interleaved
    y[2i] = -x[2i+1], y[2i+1] = x[2i]; with rd = 16 < H = 32 channels 16..31 are copied."""
    H, rd = 32, 16
    x = np.arange(1, H + 1, dtype=F32)
    cos, sin = _quarter_turn(4, rd // 2)
    inp = dict(query=x[None, None].copy(), key=x[None, None].copy(), value=x[None, None].copy(),
               past_key=np.zeros((1, 1, 1, H), F32), past_value=np.zeros((1, 1, 1, H), F32),
               seqlens_k=np.array([1]), total_sequence_length=2, cos_cache=cos, sin_cache=sin)  # fmt: skip
    half = np.r_[-x[8:16], x[:8], x[16:]]
    inter = np.r_[np.stack([-x[1:16:2], x[0:16:2]], axis=1).reshape(-1), x[16:]]
    for interleaved, want in ((0, half), (1, inter)):
        pk = call(gqa, inp, num_heads=1, kv_num_heads=1, do_rotary=1, rotary_interleaved=interleaved)[1]
        np.testing.assert_array_equal(pk[0, 0, 1], want, err_msg=f"interleaved={interleaved}")


def check_quantized_caches(gqa: Gqa) -> None:
    """int8, scale 0.5: x * 2 rounded half to even and clamped; 4-bit, scale 1: nibble q + 8, element 2i
    low. The attention reads the dequantized cache (q = 0: output = mean of the dequantized V)."""
    H = 16
    x8 = np.array([0.25, 0.75, -0.25, -0.75, 63.75, 64, -64.5, 100, 1.25, -1.25, 0, 0.3, 2.2, -70, 5, 5.25], F32)
    q8 = np.array([0, 2, 0, -2, 127, 127, -128, 127, 2, -2, 0, 1, 4, -128, 10, 10], np.int8)
    x4 = np.array([0.5, 1.5, 2.5, -0.5, 7.5, -8.5, 3, -3, 6.4, -7.6, 0, 100, 1.49, -1.5, 4.5, -4.5], F32)
    q4 = np.array([0, 2, 2, 0, 7, -8, 3, -3, 6, -8, 0, 7, 1, -2, 4, -4])
    for bits, x, scale, want in ((8, x8, 0.5, q8), (4, x4, 1.0, ((q4[0::2] + 8) | ((q4[1::2] + 8) << 4)))):
        hs = H if bits == 8 else H // 2
        dt = np.int8 if bits == 8 else np.uint8
        inp = dict(query=np.zeros((1, 1, H), F32), key=x[None, None].copy(), value=x[None, None].copy(),
                   past_key=np.zeros((1, 1, 0, hs), dt), past_value=np.zeros((1, 1, 0, hs), dt),
                   seqlens_k=np.array([0]), total_sequence_length=1, k_scale=np.array([scale], F32),
                   v_scale=np.array([scale], F32))  # fmt: skip
        out, pk, pv = call(gqa, inp, num_heads=1, kv_num_heads=1, k_quant_type="PER_TENSOR",
                           v_quant_type="PER_TENSOR", kv_cache_bit_width=bits)  # fmt: skip
        np.testing.assert_array_equal(pk[0, 0, 0], np.asarray(want).astype(dt), err_msg=f"{bits}-bit K")
        np.testing.assert_array_equal(pv, pk)
        deq = (q8.astype(np.float64) * scale) if bits == 8 else q4.astype(np.float64)
        np.testing.assert_array_equal(out[0, 0], deq.astype(F32))


def check_quantized_after_rotary(gqa: Gqa) -> None:
    """cos = sin = 1 at position 1, K = 0.4 everywhere: y[i] = 0.4 - 0.4 = 0, y[i + 8] = 0.8; int8 scale 1
    stores 0 and 1 (quantizing first would round 0.4 to 0 and store 0 and 0)."""
    H = 16
    cos = np.ones((4, 8), F32)
    sin = np.ones((4, 8), F32)
    cos[0], sin[0] = 1, 0
    k = np.full((1, 1, H), 0.4, F32)
    inp = dict(query=np.zeros((1, 1, H), F32), key=k, value=k.copy(), past_key=np.zeros((1, 1, 1, H), np.int8),
               past_value=np.zeros((1, 1, 1, H), np.int8), seqlens_k=np.array([1]), total_sequence_length=2,
               cos_cache=cos, sin_cache=sin, k_scale=np.array([1.0], F32), v_scale=np.array([1.0], F32))  # fmt: skip
    pk = call(gqa, inp, num_heads=1, kv_num_heads=1, do_rotary=1, k_quant_type="PER_TENSOR",
              v_quant_type="PER_TENSOR", kv_cache_bit_width=8)[1]  # fmt: skip
    np.testing.assert_array_equal(pk[0, 0, 1], np.r_[np.zeros(8), np.ones(8)].astype(np.int8))


def check_present_buffers(gqa: Gqa) -> None:
    """Decode, P = 5 >= T = 4, seqlens_k = (3, 1): rows [0, past_b) copied, row past_b the new token;
    separate buffers zero the rest, a shared buffer keeps the past's rows."""
    rng = np.random.default_rng(1)
    H = 16
    past = rng.standard_normal((2, 1, 5, H)).astype(F32)
    new = rng.standard_normal((2, 1, H)).astype(F32)
    inp = dict(query=np.zeros((2, 1, H), F32), key=new, value=new.copy(), past_key=past, past_value=past.copy(),
               seqlens_k=np.array([3, 1]), total_sequence_length=4)  # fmt: skip
    for shared in (False, True):
        pk = call(gqa, inp, num_heads=1, kv_num_heads=1, shared_buffer=shared)[1]
        want = past.copy() if shared else np.zeros_like(past)
        for b, pb in enumerate((3, 1)):
            want[b, :, :pb] = past[b, :, :pb]
            want[b, 0, pb] = new[b, 0]
        np.testing.assert_array_equal(pk, want, err_msg=f"shared={shared}")


def check_first_prompt_ignores_past(gqa: Gqa) -> None:
    """S == T: a past buffer changes nothing (past_b = 0); rotary positions are position_ids[0, 0] + s
    for every batch entry."""
    rng = np.random.default_rng(2)
    B, S, H = 2, 3, 16
    q, k, v = (rng.standard_normal((B, S, H)).astype(F32) for _ in range(3))
    ang = np.arange(16)[:, None] * 0.3 ** np.arange(8)[None, :]
    cos, sin = np.cos(ang).astype(F32), np.sin(ang).astype(F32)
    base = dict(query=q, key=k, value=v, seqlens_k=np.array([2, 1]), total_sequence_length=S, cos_cache=cos,
                sin_cache=sin, position_ids=np.array([[5, 6, 7], [5, 6, 7]]))  # fmt: skip
    ref = call(gqa, base, num_heads=1, kv_num_heads=1, do_rotary=1)
    past = rng.standard_normal((B, 1, 4, H)).astype(F32)
    other = dict(base, past_key=past, past_value=past.copy(), position_ids=np.array([[5, 0, 0], [9, 9, 9]]))
    got = call(gqa, other, num_heads=1, kv_num_heads=1, do_rotary=1)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1][:, :, :S], ref[1])
    np.testing.assert_array_equal(got[1][:, :, S:], 0)


CHECKS = [
    check_single_key,
    check_causal_prompt,
    check_causal_with_past,
    check_window,
    check_sinks,
    check_softcap_then_bias,
    check_rotary_layouts,
    check_quantized_caches,
    check_quantized_after_rotary,
    check_present_buffers,
    check_first_prompt_ignores_past,
]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_hand_derived_case(check) -> None:
    check(group_query_attention)


# ---------------------------------------------------------------------------------------------- mutants
# Local variants, each one rule away from the oracle (module functions patched for the duration).


@contextlib.contextmanager
def _patched(**names) -> Iterator[Gqa]:
    saved = {n: getattr(gqa_mod, n) for n in names}
    try:
        for n, f in names.items():
            setattr(gqa_mod, n, f)
        yield gqa_mod.group_query_attention
    finally:
        for n, f in saved.items():
            setattr(gqa_mod, n, f)


_key_mask, _scores, _apply_rotary = gqa_mod._key_mask, gqa_mod._scores, gqa_mod.apply_rotary


def causal_off_by_one_with_past():
    """The causal end computed from a past length one too long once there is a past."""

    def mask(lay, window):
        pasts = tuple(p + 1 if p else 0 for p in lay.past_lengths)
        return _key_mask(dataclasses.replace(lay, past_lengths=pasts), window)

    return _patched(_key_mask=mask)


def window_of_w_plus_1():
    """The pre-PR#25927 window: W + 1 keys."""
    return _patched(_key_mask=lambda lay, window: _key_mask(lay, window + 1 if window > 0 else window))


def rotary_interleaving_swapped():
    """Half split where interleaved is asked, and the reverse."""
    return _patched(apply_rotary=lambda x, c, s, p, inter, form: _apply_rotary(x, c, s, p, not inter, form))


def softcap_after_bias():
    """The bias added before the softcap."""

    def scores(q, k, alpha, softcap, bias, exact):
        x = _scores(q, k, alpha, 0.0, bias, exact)
        return x if softcap <= 0 else softcap * np.tanh(x / softcap)

    return _patched(_scores=scores)


@contextlib.contextmanager
def k_quantized_before_rotary() -> Iterator[Gqa]:
    """K rounded to the cache's grid first, then rotated and stored."""

    def gqa(query, key, value, *args, **kw):
        k_scale = args[10] if len(args) > 10 else kw.get("k_scale")
        if kw.get("kv_cache_bit_width") and kw.get("do_rotary"):
            B, S, D = key.shape
            Nk = kw["kv_num_heads"]
            sc = expand_kv_scale("k_scale", k_scale, kw["k_quant_type"], Nk, D // Nk)
            kq = dequantize_kv(quantize_kv(bnsh(key, Nk), sc, kw["kv_cache_bit_width"]), sc, kw["kv_cache_bit_width"])
            key = kq.transpose(0, 2, 1, 3).reshape(B, S, D).astype(key.dtype)
        return group_query_attention(query, key, value, *args, **kw)

    yield gqa


MUTANTS = {
    "causal_off_by_one_with_past": (causal_off_by_one_with_past, check_causal_with_past),
    "window_of_w_plus_1": (window_of_w_plus_1, check_window),
    "rotary_interleaving_swapped": (rotary_interleaving_swapped, check_rotary_layouts),
    "softcap_after_bias": (softcap_after_bias, check_softcap_then_bias),
    "k_quantized_before_rotary": (k_quantized_before_rotary, check_quantized_after_rotary),
}


@pytest.mark.parametrize("name", list(MUTANTS))
def test_mutant_is_caught(name: str) -> None:
    """Each broken variant fails the hand case aimed at it (and the real oracle passes them all)."""
    make, aimed = MUTANTS[name]
    failed = []
    with make() as gqa:
        for check in CHECKS:
            try:
                check(gqa)
            except AssertionError:
                failed.append(check.__name__)
    assert aimed.__name__ in failed, f"{name} passes {aimed.__name__} (failed only {failed})"


# ---------------------------------------------------------------------------------------------- precisions


def _random_case(dtype, *, bits: int = 0, rotary: bool = True, window: int = -1, seed: int = 0) -> tuple[dict, dict]:
    """A ragged decode (B = 3, P = 20) with rotary, bias and a sink: the precisions' test bed."""
    rng = np.random.default_rng(seed)
    B, N, Nk, H, P, T = 3, 8, 2, 64, 20, 21
    rnd = lambda *s: rng.standard_normal(s).astype(dtype)  # noqa: E731
    inp = dict(query=rnd(B, 1, N * H), key=rnd(B, 1, Nk * H), value=rnd(B, 1, Nk * H),
               seqlens_k=np.array([20, 7, 13]), total_sequence_length=T,
               attention_bias=rnd(B, 1, 1, T), head_sink=rnd(N))  # fmt: skip
    attrs = dict(num_heads=N, kv_num_heads=Nk, local_window_size=window, softcap=4.0)
    if bits:
        inp["past_key"] = rng.integers(-100, 100, (B, Nk, P, H)).astype(np.int8)
        inp["past_value"] = rng.integers(-100, 100, (B, Nk, P, H)).astype(np.int8)
        inp["k_scale"], inp["v_scale"] = np.array([0.03], F32), np.array([0.02], F32)
        attrs.update(k_quant_type="PER_TENSOR", v_quant_type="PER_TENSOR", kv_cache_bit_width=8)
    else:
        inp["past_key"], inp["past_value"] = rnd(B, Nk, P, H), rnd(B, Nk, P, H)
    if rotary:
        ang = np.arange(64)[:, None] / 10000 ** (np.arange(32) / 32)[None, :]
        inp["cos_cache"], inp["sin_cache"] = np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)
        attrs["do_rotary"] = 1
    return inp, attrs


PRECISION_CASES = [(F32, 0, -1), (F32, 8, 5), (F16, 0, 5), (F16, 8, -1)]


@pytest.mark.parametrize("dtype,bits,window", PRECISION_CASES)
def test_reference_is_within_the_bound_of_float64(dtype, bits: int, window: int) -> None:
    """reference vs the float64 twin: within attention_bounds' single-implementation bound (fp16 inputs: the
    rotary output is rounded to fp16 in the reference only, u_op = 2^-11, plus the fp16 output rounding)."""
    inp, attrs = _random_case(dtype, bits=bits, window=window)
    ref = call(group_query_attention, inp, **attrs)
    o, _, _, p = call(group_query_attention, inp, **attrs, precision="float64", output_qk=2)
    u_op = U16 if dtype == F16 else 0.0
    bound = to_bsnh(output_bound(attention_terms(inp, attrs, ref[1], ref[2]), p, to_bnsh(o, 8), both=False, u_op=u_op))
    if dtype == F16:
        bound = bound + fp16_spacing(o) / 2
    err = np.abs(ref[0].astype(np.float64) - o)
    assert (err <= bound).all(), float((err / bound).max())
    assert o.dtype == np.float64 and ref[0].dtype == dtype


@pytest.mark.parametrize("dtype,bits,window", PRECISION_CASES)
def test_kernel_form_is_within_the_fp16_bound_of_float64(dtype, bits: int, window: int) -> None:
    """precision="kernel" (fp16 Q/K/V/P scratch, fp32 online softmax): within the bound with u_op = 2^-11
    plus one fp16 rounding of the output; and it differs from the reference (it models other roundings)."""
    inp, attrs = _random_case(dtype, bits=bits, window=window, seed=1)
    ker = call(group_query_attention, inp, **attrs, precision="kernel")
    o, _, _, p = call(group_query_attention, inp, **attrs, precision="float64", output_qk=2)
    ref = call(group_query_attention, inp, **attrs)
    terms = attention_terms(inp, attrs, ref[1], ref[2])
    bound = to_bsnh(output_bound(terms, p, to_bnsh(o, 8), both=False, u_op=U16)) + fp16_spacing(o) / 2
    err = np.abs(ker[0].astype(np.float64) - o)
    assert (err <= bound).all(), float((err / bound).max())
    assert ker[0].dtype == dtype and (ker[0].astype(F16) == ker[0]).all()
    np.testing.assert_array_equal(ker[1], ref[1])
    assert (ker[0] != ref[0]).any()


def test_kernel_blocks_match_one_pass() -> None:
    """With more keys than KERNEL_KV_BLOCK the online rescaling runs; it stays within the fp16 bound."""
    rng = np.random.default_rng(3)
    B, N, H, P = 1, 2, 64, 150
    inp = dict(query=rng.standard_normal((B, 1, N * H)).astype(F16), key=rng.standard_normal((B, 1, H)).astype(F16),
               value=rng.standard_normal((B, 1, H)).astype(F16), past_key=rng.standard_normal((B, 1, P, H)).astype(F16),
               past_value=rng.standard_normal((B, 1, P, H)).astype(F16), seqlens_k=np.array([P]),
               total_sequence_length=P + 1)  # fmt: skip
    attrs = dict(num_heads=N, kv_num_heads=1, scale=0.5)
    assert P + 1 > 2 * gqa_mod.KERNEL_KV_BLOCK
    ker = call(group_query_attention, inp, **attrs, precision="kernel")[0]
    o, pk, pv, p = call(group_query_attention, inp, **attrs, precision="float64", output_qk=2)
    bound = to_bsnh(output_bound(attention_terms(inp, attrs, pk, pv), p, to_bnsh(o, N), both=False, u_op=U16))
    assert (np.abs(ker.astype(np.float64) - o) <= bound + fp16_spacing(o) / 2).all()


def test_fp32_sum_is_correctly_rounded() -> None:
    """rotary's fused step: fp32(a + b) for float64 a (an exact fp32 product) and fp32 b, checked against
    exact rational rounding (half to even) on random and near-tie values."""
    rng = np.random.default_rng(4)
    x, c = rng.standard_normal(4000).astype(F32), rng.standard_normal(4000).astype(F32)
    a = x.astype(np.float64) * c.astype(np.float64)
    b = -np.concatenate([a[:2000].astype(F32), rng.standard_normal(2000).astype(F32)]).astype(np.float64)
    b[:1000] = np.nextafter(b[:1000].astype(F32), np.inf).astype(np.float64)
    got = _fp32_sum(a, b)
    for ai, bi, gi in zip(a, b, got, strict=True):
        exact = Fraction(float(ai)) + Fraction(float(bi))
        cand = np.float32(float(exact))
        near = [np.nextafter(cand, -np.inf), cand, np.nextafter(cand, np.inf)]
        best = min(near, key=lambda f: (abs(Fraction(float(f)) - exact), int(np.array(f).view(np.uint32)) & 1))
        assert gi == best, (ai, bi, gi, best)


def test_rotary_forms() -> None:
    """fma: one product rounded; fp16: exact products, the result rounded to fp16; float64: no rounding."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 1, 4, 32))
    cos, sin = rng.standard_normal((8, 16)).astype(F32), rng.standard_normal((8, 16)).astype(F32)
    pos = np.array([[1, 3, 5, 7]])
    exact = apply_rotary(x.astype(F32).astype(np.float64), cos, sin, pos, False, "float64")
    fma = apply_rotary(x.astype(F32).astype(np.float64), cos, sin, pos, False, "fma")
    assert (fma.astype(F32) == fma).all()
    xa = np.abs(x.astype(F32).astype(np.float64))
    c, t = np.abs(cos[pos][:, None].astype(np.float64)), np.abs(sin[pos][:, None].astype(np.float64))
    mag = np.tile(xa[..., :16] * c + xa[..., 16:] * t, 2) + np.tile(xa[..., :16] * t + xa[..., 16:] * c, 2)
    assert (np.abs(fma - exact) <= 2**-23 * mag).all()  # one rounded product and the final rounding
    h = apply_rotary(x.astype(F16).astype(np.float64), cos.astype(F16), sin.astype(F16), pos, True, "fp16")
    e16 = apply_rotary(x.astype(F16).astype(np.float64), cos.astype(F16), sin.astype(F16), pos, True, "float64")
    np.testing.assert_array_equal(h, e16.astype(F32).astype(F16))  # fp16 products are exact in fp32
    assert (np.abs(h - e16) <= fp16_spacing(e16)).all()


# ---------------------------------------------------------------------------------------------- rows, validation


def test_defined_rows() -> None:
    """Decode: rows [0, seqlens_k + 1); first prompt: all S rows (padding included) of the cache and the
    real-token rows of the output; the oracle's cache is zero beyond the defined rows."""
    m = defined_present_rows(np.array([4, 1]), 5, 1, 7)
    np.testing.assert_array_equal(m.sum(axis=1), [5, 2])
    m = defined_present_rows(np.array([3, 1]), 4, 4, 6)
    np.testing.assert_array_equal(m.sum(axis=1), [4, 4])
    np.testing.assert_array_equal(defined_output_rows(np.array([3, 1]), 4, 4).sum(axis=1), [4, 2])
    np.testing.assert_array_equal(defined_output_rows(np.array([8]), 9, 3).sum(axis=1), [3])
    inp, attrs = _random_case(F32)
    pk = call(group_query_attention, inp, **attrs)[1]
    rows = defined_present_rows(inp["seqlens_k"], 21, 1, pk.shape[2])
    assert (pk.transpose(0, 2, 1, 3)[~rows] == 0).all()


def _valid() -> tuple[dict, dict]:
    inp, attrs = _random_case(F32, rotary=True)
    return inp, attrs


BAD = {
    "heads_not_divisible": (lambda i, a: a.update(num_heads=6, kv_num_heads=4), "num_heads"),
    "query_rank": (lambda i, a: i.update(query=i["query"][0]), "query"),
    "query_dtype": (lambda i, a: i.update(query=i["query"].astype(np.float64)), "query"),
    "key_without_value": (lambda i, a: i.update(value=None), "key, value"),
    "key_width": (lambda i, a: i.update(key=i["key"][..., :64]), "key"),
    "head_size_not_multiple_of_8": (lambda i, a: a.update(num_heads=128, kv_num_heads=32), "query"),
    "past_dtype": (lambda i, a: i.update(past_key=i["past_key"].astype(F16)), "past_key"),
    "past_heads": (lambda i, a: i.update(past_key=i["past_key"][:, :1]), "past_key"),
    "seqlens_shape": (lambda i, a: i.update(seqlens_k=np.array([20, 7])), "seqlens_k"),
    "seqlens_beyond_total": (lambda i, a: i.update(seqlens_k=np.array([21, 7, 13])), "seqlens_k"),
    "seqlens_negative": (lambda i, a: i.update(seqlens_k=np.array([20, -1, 13])), "seqlens_k"),
    "total_not_past_plus_s": (lambda i, a: i.update(total_sequence_length=25), "total_sequence_length"),
    "decode_with_s_2": (lambda i, a: i.update(query=np.tile(i["query"], (1, 2, 1))), "key"),
    "rotary_without_cache": (lambda i, a: i.update(cos_cache=None, sin_cache=None), "cos_cache"),
    "rotary_cache_too_wide": (lambda i, a: i.update(cos_cache=np.ones((64, 40), F32), sin_cache=np.ones((64, 40), F32)),
                              "cos_cache"),
    "rotary_cache_too_short": (lambda i, a: i.update(cos_cache=i["cos_cache"][:20], sin_cache=i["sin_cache"][:20]),
                               "cos_cache"),
    "position_out_of_cache": (lambda i, a: i.update(position_ids=np.array([[70], [1], [2]])), "position_ids"),
    "bias_shape": (lambda i, a: i.update(attention_bias=i["attention_bias"][..., :20]), "attention_bias"),
    "sink_shape": (lambda i, a: i.update(head_sink=i["head_sink"][:4]), "head_sink"),
    "window_zero": (lambda i, a: a.update(local_window_size=0), "local_window_size"),
    "negative_softcap": (lambda i, a: a.update(softcap=-1.0), "softcap"),
    "quant_types_differ": (lambda i, a: a.update(k_quant_type="PER_TENSOR", v_quant_type="PER_CHANNEL",
                                                 kv_cache_bit_width=8), "v_quant_type"),
    "bit_width_without_quant": (lambda i, a: a.update(kv_cache_bit_width=8), "kv_cache_bit_width"),
    "bit_width_3": (lambda i, a: a.update(k_quant_type="PER_TENSOR", v_quant_type="PER_TENSOR",
                                          kv_cache_bit_width=3), "kv_cache_bit_width"),
    "scale_without_quant": (lambda i, a: i.update(k_scale=np.array([1.0], F32)), "k_scale"),
    "shared_needs_long_past": (lambda i, a: a.update(shared_buffer=True), "shared_buffer"),
    "unknown_precision": (lambda i, a: a.update(precision="fp8"), "precision"),
    "qk_with_kernel": (lambda i, a: a.update(precision="kernel", output_qk=1), "output_qk"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(BAD))
def test_bad_arguments_are_named(name: str) -> None:
    inp, attrs = _valid()
    change, arg = BAD[name]
    change(inp, attrs)
    with pytest.raises(ArgumentError, match=f"^{arg}:"):
        call(group_query_attention, inp, **attrs)


def test_quantized_cache_arguments() -> None:
    """A quantized cache: int8 (8-bit) / packed uint8 (4-bit, H/2) past, fp32 scales of the right size."""
    inp, attrs = _random_case(F32, bits=8)
    call(group_query_attention, inp, **attrs)
    for change, arg in (
        (dict(past_key=inp["past_key"].view(np.uint8)), "past_key"),
        (dict(k_scale=np.array([0.03, 0.03], F32)), "k_scale"),
        (dict(v_scale=np.array([0.0], F32)), "v_scale"),
        (dict(k_scale=np.array([0.03])), "k_scale"),
        (dict(k_scale=None), "k_scale"),
    ):
        with pytest.raises(ArgumentError, match=f"^{arg}:"):
            call(group_query_attention, dict(inp, **change), **attrs)
    four = dict(attrs, kv_cache_bit_width=4)
    past4 = np.zeros((3, 2, 20, 32), np.uint8)
    call(group_query_attention, dict(inp, past_key=past4, past_value=past4.copy()), **four)
    with pytest.raises(ArgumentError, match="^past_key:"):
        call(group_query_attention, dict(inp, past_key=past4.view(np.int8), past_value=past4.view(np.int8)), **four)

"""Error bounds for GroupQueryAttention outputs, shared by tests/test_gqa_oracle.py and
tests/test_upstream_ort_gqa.py.

Derivation (first order in u, Higham's gamma_n = n u / (1 - n u); u = 2^-24 for fp32). For one
query row (b, n, s), key j (j < total_b), with the exact values p_j, o_h and
  a_j = alpha * sum_i |q_i| |k_ji|        (bounds |x_j| before softcap and bias)
  y_j = a_j + |bias_j|,  M = max(max_j y_j, |sigma|)
1. Score x_j: an fp32 dot of H terms scaled by alpha, one element of K possibly dequantized
   (fp32(code * scale)): error <= gamma_{H+2} a_j. Softcap c*tanh(x/c) has slope <= 1 and adds
   its divide, tanh (taken as accurate to 4 ulp) and multiply: <= 6u y_j; the bias add u y_j.
   So |dx_j| <= e_j := gamma_{H+2} a_j + 8u y_j.
2. exp(x_j - m): the subtraction rounds (u (y_j + M)), exp is taken as accurate to 8 ulp (MLAS's
   polynomial; deliberately loose), so each exponential carries a relative error
   r_j = e_j + u (y_j + M) + 8u; the sink's r_sigma = u (|sigma| + M) + 8u. The shift m itself
   cancels between numerator and denominator.
3. Normalisation: p^_j = p_j (1 + r_j) / (1 + rbar) with rbar = sum_k p_k r_k + r_sigma, so
   p^_j - p_j = p_j (r_j - rbar) plus the rounding of the sum (gamma_L) and of the division (u).
4. Output o_h = sum_j p_j v_jh: |o^_h - o_h| <= sum_j p_j r_j |v_jh| + rbar |o_h|
   + (2 gamma_L + 2u) sum_j p_j |v_jh| (the sum of p, the division, the fp32 accumulation of L
   products), + 12 u L sum_j p_j |v_jh| for an online softmax (ORT's fp32 flash path rescales its
   running sum and accumulator at most once per key, 2u + 8u each).
   L = total_b + 1 (the keys and the sink). Second-order terms (r^2 ~ 1e-9) are covered by 1%.
``u_op``: fp16 scratch of Q and K (relative 2 u_op on each score: + 2 u_op a_j in e_j), V and P
(+ 2 u_op sum_j p_j |v_jh|). Two implementations that each satisfy the bound differ by at most
twice it (``both``); fp16 outputs: both round once to fp16, so they differ by at most one more
fp16 spacing of the result.
On the cases of these tests (H = 64 / 128, up to 24 keys, unit-normal data) the bound is about
1e-4 of |v|, an order below ORT's own test tolerance (1e-3 absolute + 1e-3 relative) and far below
what a wrong mask, window, softcap order or rotary layout changes.
"""

from __future__ import annotations

import numpy as np

from qconform.oracles.ort.kv_cache import dequantize_kv, expand_kv_scale
from qconform.oracles.ort.rotary import apply_rotary, rotary_positions

U32 = 2.0**-24
U16 = 2.0**-11


def gamma(n: int | np.ndarray, u: float = U32) -> np.ndarray:
    return n * u / (1 - n * u)


def _heads(x: np.ndarray, heads: int, head_size: int) -> np.ndarray:
    b, s, _ = x.shape
    return x.reshape(b, s, heads, head_size).transpose(0, 2, 1, 3).astype(np.float64)


def attention_terms(inp: dict, attrs: dict, present_k: np.ndarray, present_v: np.ndarray) -> dict:
    """a (B, N, S, T), y (B, N, S, T), |sigma| (1, N, 1), |v| (B, N, T, H) and L (B, 1, 1) of the
    derivation, from the inputs and the caches an oracle returned (columns j >= total_b are 0)."""
    N, Nk = attrs["num_heads"], attrs["kv_num_heads"]
    query = inp["query"]
    H = query.shape[2] // (N + 2 * Nk) if inp.get("key") is None else query.shape[2] // N
    B, S = query.shape[:2]
    T = int(np.asarray(inp["total_sequence_length"]).reshape(-1)[0])
    q = _heads(query[..., : N * H], N, H)
    totals = np.asarray(inp["seqlens_k"], np.int64) + 1
    if attrs.get("do_rotary"):
        pos = rotary_positions(B, S, totals - S, S == T, inp.get("position_ids"))
        q = apply_rotary(q, inp["cos_cache"], inp["sin_cache"], pos, bool(attrs.get("rotary_interleaved")), "float64")
    bits = attrs.get("kv_cache_bit_width", 0)
    if bits:
        qt = attrs["k_quant_type"]
        k = dequantize_kv(present_k, expand_kv_scale("k_scale", inp["k_scale"], qt, Nk, H), bits)
        v = dequantize_kv(present_v, expand_kv_scale("v_scale", inp["v_scale"], qt, Nk, H), bits)
    else:
        k, v = present_k.astype(np.float64), present_v.astype(np.float64)
    k, v = np.repeat(k[:, :, :T], N // Nk, axis=1), np.repeat(v[:, :, :T], N // Nk, axis=1)
    scale = attrs.get("scale", 0.0)
    alpha = float(np.float32(scale)) if scale else 1.0 / np.sqrt(H)
    valid = (np.arange(T)[None, :] < totals[:, None])[:, None, None, :]
    a = np.where(valid, np.einsum("bnsh,bnth->bnst", np.abs(q), np.abs(k)) * alpha, 0.0)
    y = a.copy()
    if inp.get("attention_bias") is not None:
        y += np.where(valid, np.abs(inp["attention_bias"].astype(np.float64)), 0.0)
    sink = np.zeros(N) if inp.get("head_sink") is None else np.abs(inp["head_sink"].astype(np.float64))
    return {"a": a, "y": y, "sink": sink[None, :, None], "v": np.abs(v), "L": (totals + 1)[:, None, None], "H": H}


def _relative(t: dict, u_op: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(e_j, r_j, r_sigma) of steps 1-2."""
    a, y, sink = t["a"], t["y"], t["sink"]
    M = np.maximum(y.max(axis=-1), sink)
    e = gamma(t["H"] + 2) * a + 8 * U32 * y + 2 * u_op * a
    r = e + U32 * (y + M[..., None]) + 8 * U32
    return e, r, U32 * (sink + M) + 8 * U32


def output_bound(t: dict, p: np.ndarray, o: np.ndarray, *, both: bool = True, u_op: float = 0.0) -> np.ndarray:
    """Per-element bound (B, N, S, H) on |output - exact|; ``p`` (B, N, S, T) and ``o`` (B, N, S, H)
    the exact (float64) probabilities and output."""
    _, r, r_sink = _relative(t, u_op)
    pv = np.einsum("bnst,bnth->bnsh", p, t["v"])
    rbar = (p * r).sum(axis=-1) + r_sink
    L = t["L"][..., None]
    first = np.einsum("bnst,bnth->bnsh", p * r, t["v"]) + rbar[..., None] * np.abs(o)
    rest = (2 * gamma(L) + 2 * U32 + 12 * U32 * L + 2 * u_op) * pv
    return (2.0 if both else 1.0) * 1.01 * (first + rest)


def qk_bound(t: dict, mode: int, p: np.ndarray, *, both: bool = True) -> np.ndarray:
    """Per-element bound on output_qk (B, N, S, T): mode 1 the score error e_j, mode 2
    p_j (r_j + rbar + gamma_L + u)."""
    e, r, r_sink = _relative(t, 0.0)
    if mode == 1:
        b = e
    else:
        rbar = (p * r).sum(axis=-1, keepdims=True) + r_sink[..., None]
        b = p * (r + rbar + gamma(t["L"][..., None]) + U32)
    return (2.0 if both else 1.0) * 1.01 * b


def to_bsnh(x: np.ndarray) -> np.ndarray:
    """(B, N, S, H) -> the output layout (B, S, N*H)."""
    B, N, S, H = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, S, N * H)


def to_bnsh(x: np.ndarray, num_heads: int) -> np.ndarray:
    """The output layout (B, S, N*H) -> (B, N, S, H)."""
    B, S, NH = x.shape
    return x.reshape(B, S, num_heads, NH // num_heads).transpose(0, 2, 1, 3)


def fp16_spacing(x: np.ndarray) -> np.ndarray:
    """One fp16 spacing at |x| (the most two roundings of nearby values to fp16 can differ by)."""
    return np.spacing(np.abs(np.asarray(x, np.float64)).astype(np.float16)).astype(np.float64)

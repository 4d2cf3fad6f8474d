"""Per-element error bounds of GroupQueryAttention outputs (oracle: ``qconform.oracles.ort.group_query_attention``).

Used by the catalogue (``qconform.ops.ort.group_query_attention``: an implementation against the
exact output) and by tests/test_gqa_oracle.py and tests/test_upstream_ort_gqa.py (the oracle's
precisions, onnxruntime's CPU provider).

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
   Underflow: a rounding into fp32's subnormals errs by up to eta / 2 absolutely (eta = 2^-149), which
   no relative term covers: + (H + 4) eta on each score, + eta on each probability (the exponential
   and the division), + eta (2 sum_j |v_jh| + 2 L) on each output.
``u_op``: fp16 scratch of Q and K (relative 2 u_op on each score: + 2 u_op a_j in e_j), V and P
(+ 2 u_op sum_j p_j |v_jh|). Two implementations that each satisfy the bound differ by at most
twice it (``both``); fp16 outputs: both round once to fp16, so they differ by at most one more
fp16 spacing of the result.

The catalogue's reading (``error_model``) compares an implementation with the exact output
computed from the present caches it must store bit for bit (``exact_attention``: rotary in
float64, the caches dequantized exactly). Beyond the steps above it adds the rotary's own rounding
``u_rot`` of Q and K (relative to the rotation's magnitudes |x c| + |x' t|, not to |q|, which a
rotation can cancel: fp32 2u, ORT's fma form; fp16 2^-11 + 2u, the result rounded to fp16), and
one fp32 rounding of each dequantized V element (u |v|). The accumulation of the L products p v
is left to the contract (``mag`` = sum_j p_j |v_jh|, n = L), the storage of Q, K, V and P in a
declared type to the contract's ``storage`` (``store_mag`` = the bound's derivative in u_op).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from qconform.oracles.ort import check_gqa_args
from qconform.oracles.ort.group_query_attention import _bias_full, _key_mask, _scores, _softmax
from qconform.oracles.ort.kv_cache import dequantize_kv, expand_kv_scale
from qconform.oracles.ort.rotary import apply_rotary, rotary_positions
from qconform.readings import ErrorModel

U32 = 2.0**-24
ETA32 = 2.0**-149  # fp32's subnormal spacing: a rounding below 2^-126 errs by up to half of it, absolutely
U16 = 2.0**-11
KV_BLOCK = 64  # the natural fp16/bf16 accumulation chain of P V: a flash kernel's key block
INPUTS = (
    "query",
    "key",
    "value",
    "past_key",
    "past_value",
    "seqlens_k",
    "total_sequence_length",
    "cos_cache",
    "sin_cache",
    "position_ids",
    "attention_bias",
    "head_sink",
    "k_scale",
    "v_scale",
)


def gamma(n: int | np.ndarray, u: float = U32) -> np.ndarray:
    """Higham's gamma_n = n u / (1 - n u), elementwise over n."""
    return n * u / (1 - n * u)


def _heads(x: np.ndarray, heads: int, head_size: int) -> np.ndarray:
    b, s, _ = x.shape
    return x.reshape(b, s, heads, head_size).transpose(0, 2, 1, 3).astype(np.float64)


def _operands(inp: dict, attrs: dict, present_k: np.ndarray, present_v: np.ndarray) -> dict[str, Any]:
    """q (B, N, S, H) rotated in float64, |q| as the rotation's magnitudes, k and v (B, N, Tp, H)
    dequantized exactly from the caches, alpha and sizes."""
    N, Nk = attrs["num_heads"], attrs["kv_num_heads"]
    query = inp["query"]
    H = query.shape[2] // (N + 2 * Nk) if inp.get("key") is None else query.shape[2] // N
    B, S = query.shape[:2]
    T = int(np.asarray(inp["total_sequence_length"]).reshape(-1)[0])
    q = _heads(query[..., : N * H], N, H)
    qmag = np.abs(q)
    totals = np.asarray(inp["seqlens_k"], np.int64) + 1
    if attrs.get("do_rotary"):
        pos = rotary_positions(B, S, totals - S, S == T, inp.get("position_ids"))
        inter = bool(attrs.get("rotary_interleaved"))
        c, t = np.abs(inp["cos_cache"].astype(np.float64)), np.abs(inp["sin_cache"].astype(np.float64))
        q = apply_rotary(q, inp["cos_cache"], inp["sin_cache"], pos, inter, "float64")
        # the rotation's magnitudes |a| c + |b| t (first of a pair) and |a| t + |b| c (second): the
        # larger of the rotations of |x| by (c, t) and by (c, -t), channel by channel
        qmag = np.maximum(*(apply_rotary(qmag, c, sign * t, pos, inter, "float64") for sign in (1, -1)))
    bits = attrs.get("kv_cache_bit_width", 0)
    if bits:
        qt = attrs["k_quant_type"]
        k = dequantize_kv(present_k, expand_kv_scale("k_scale", inp["k_scale"], qt, Nk, H), bits, exact=True)
        v = dequantize_kv(present_v, expand_kv_scale("v_scale", inp["v_scale"], qt, Nk, H), bits, exact=True)
    else:
        k, v = present_k.astype(np.float64), present_v.astype(np.float64)
    k, v = np.repeat(k, N // Nk, axis=1), np.repeat(v, N // Nk, axis=1)
    scale = attrs.get("scale", 0.0)
    alpha = float(np.float32(scale)) if scale else 1.0 / np.sqrt(H)
    return {"q": q, "qmag": qmag, "k": k, "v": v, "alpha": alpha, "totals": totals, "T": T, "H": H, "N": N}


def attention_terms(inp: dict, attrs: dict, present_k: np.ndarray, present_v: np.ndarray) -> dict:
    """a (B, N, S, T), y (B, N, S, T), |sigma| (1, N, 1), |v| (B, N, T, H), L (B, 1, 1) of the
    derivation, and arot (a with the rotation's magnitudes for |q|), from the inputs and the caches
    an implementation returned (columns j >= total_b are 0)."""
    op = _operands(inp, attrs, present_k, present_v)
    T, N, totals = op["T"], op["N"], op["totals"]
    k, v = op["k"][:, :, :T], op["v"][:, :, :T]
    valid = (np.arange(T)[None, :] < totals[:, None])[:, None, None, :]
    absk = np.abs(k)
    alpha = abs(op["alpha"])  # a magnitude: a negative scale flips the scores' signs, not their error
    a = np.where(valid, np.einsum("bnsh,bnth->bnst", np.abs(op["q"]), absk) * alpha, 0.0)
    arot = np.where(valid, np.einsum("bnsh,bnth->bnst", op["qmag"], absk) * alpha, 0.0)
    y = a.copy()
    if inp.get("attention_bias") is not None:
        y += np.where(valid, np.abs(inp["attention_bias"].astype(np.float64)), 0.0)
    sink = np.zeros(N) if inp.get("head_sink") is None else np.abs(inp["head_sink"].astype(np.float64))
    return {
        "a": a,
        "arot": arot,
        "y": y,
        "sink": sink[None, :, None],
        "v": np.abs(v),
        "L": (totals + 1)[:, None, None],
        "H": op["H"],
    }


def exact_attention(inp: dict, attrs: dict, present_k: np.ndarray, present_v: np.ndarray) -> tuple:
    """(p (B, N, S, Tp), o (B, N, S, H)) in float64: the oracle's float64 arithmetic (its masks,
    softcap, bias and sink) on the present caches as stored (dequantized exactly) and Q rotated
    exactly: the reference an implementation that stores those caches is bounded against."""
    args = [inp.get(name) for name in INPUTS]
    keys = ("num_heads", "kv_num_heads", "scale", "softcap", "local_window_size", "do_rotary", "rotary_interleaved")
    keys += ("smooth_softmax", "k_quant_type", "v_quant_type", "kv_cache_bit_width")
    lay = check_gqa_args(*args, **{k: attrs[k] for k in keys if k in attrs})
    op = _operands(inp, attrs, present_k, present_v)
    softcap = float(np.float32(attrs.get("softcap", 0.0)))
    bias = _bias_full(inp.get("attention_bias"), lay)
    x = _scores(op["q"], op["k"], op["alpha"], softcap, bias, exact=True)
    sink = inp.get("head_sink")
    sink = None if sink is None else sink.astype(np.float64)
    if sink is None and attrs.get("smooth_softmax", -1) == 1:
        sink = np.zeros(lay.num_heads)
    p = _softmax(x, _key_mask(lay, attrs.get("local_window_size", -1)), sink, exact=True)
    return p, np.einsum("bnst,bnth->bnsh", p, op["v"])


def _relative(t: dict, u_op: float, u_rot: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(e_j, r_j, r_sigma) of steps 1-2."""
    a, y, sink = t["a"], t["y"], t["sink"]
    M = np.maximum(y.max(axis=-1), sink)
    e = gamma(t["H"] + 2) * a + 8 * U32 * y + 2 * u_op * a + 2 * u_rot * t["arot"] + (t["H"] + 4) * ETA32
    r = e + U32 * (y + M[..., None]) + 8 * U32
    return e, r, U32 * (sink + M) + 8 * U32


def bound_parts(t: dict, p: np.ndarray, o: np.ndarray, u_rot: float = 0.0, dequantized_v: bool = False) -> dict:
    """The single-implementation bound (B, N, S, H) in parts, each with the 1% second-order margin:
    ``fixed`` (every step but the fp32 accumulation of P V, with the rotary rounding ``u_rot`` and,
    for a quantized V, its fp32 dequantization), ``pv`` = sum_j p_j |v_jh| (what an accumulation
    error of the L products multiplies) and ``store`` (the bound's derivative in u_op). So
    ``output_bound(both=False)`` = fixed (u_rot = 0) + gamma_L pv + u_op store."""
    _, r, r_sink = _relative(t, 0.0, u_rot)
    pv = np.einsum("bnst,bnth->bnsh", p, t["v"])
    rbar = (p * r).sum(axis=-1) + r_sink
    L = t["L"][..., None]
    first = np.einsum("bnst,bnth->bnsh", p * r, t["v"]) + rbar[..., None] * np.abs(o)
    fixed = first + (gamma(L) + 2 * U32 + 12 * U32 * L + (U32 if dequantized_v else 0.0)) * pv
    fixed = fixed + ETA32 * (2 * t["v"].sum(axis=2)[:, :, None, :] + 2 * L)  # p and p v in fp32's subnormals
    pa = 2 * p * t["a"]
    store = np.einsum("bnst,bnth->bnsh", pa, t["v"]) + pa.sum(axis=-1)[..., None] * np.abs(o) + 2 * pv
    return {"fixed": 1.01 * fixed, "pv": 1.01 * pv, "store": 1.01 * store, "L": L}


def output_bound(t: dict, p: np.ndarray, o: np.ndarray, *, both: bool = True, u_op: float = 0.0) -> np.ndarray:
    """Per-element bound (B, N, S, H) on |output - exact|; ``p`` (B, N, S, T) and ``o`` (B, N, S, H)
    the exact (float64) probabilities and output."""
    parts = bound_parts(t, p, o)
    single = parts["fixed"] + gamma(parts["L"]) * parts["pv"] + u_op * parts["store"]
    return (2.0 if both else 1.0) * single


def qk_bound(t: dict, mode: int, p: np.ndarray, *, both: bool = True) -> np.ndarray:
    """Per-element bound on output_qk (B, N, S, T): mode 1 the score error e_j, mode 2
    p_j (r_j + rbar + gamma_L + u)."""
    e, r, r_sink = _relative(t, 0.0)
    if mode == 1:
        b = e
    else:
        rbar = (p * r).sum(axis=-1, keepdims=True) + r_sink[..., None]
        b = p * (r + rbar + gamma(t["L"][..., None]) + U32) + ETA32  # exp and division below 2^-126: eta / 2 each
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


def error_model(inp: dict, attrs: dict, present_k: np.ndarray, present_v: np.ndarray, out_dtype: Any) -> ErrorModel:
    """The bound of an implementation's output against the exact output of the caches it stores
    (module docstring): ``ref`` the exact output, ``slack`` every step but the P V accumulation
    (strict fp32 arithmetic, ORT's rotary rounding), ``mag`` the P V products' magnitudes for the
    contract's accumulation (n = the longest row's keys + the sink, chains of a ``KV_BLOCK`` key
    block), ``store_mag`` what storing Q, K, V and P in the declared type moves."""
    p, o = exact_attention(inp, attrs, present_k, present_v)
    t = attention_terms(inp, attrs, present_k, present_v)
    T = t["a"].shape[-1]
    u_rot = 0.0
    if attrs.get("do_rotary"):
        u_rot = U16 + 2 * U32 if np.dtype(inp["query"].dtype) == np.float16 else 2 * U32
    parts = bound_parts(t, p[..., :T], o, u_rot, bool(attrs.get("kv_cache_bit_width", 0)))
    return ErrorModel(
        ref=to_bsnh(o),
        mag=to_bsnh(parts["pv"]),
        store_mag=to_bsnh(parts["store"]),
        n_terms=int(t["L"].max()),
        chain=KV_BLOCK,
        out_dtype=np.dtype(out_dtype),
        path="fp32 softmax and P V (ORT CPU)",
        diagnose=_where(attrs["num_heads"], o.shape[-1]),
        slack=to_bsnh(parts["fixed"]),
        slack_label="scores, softmax and rotary in fp32 (the derivation of qconform.ops.ort.attention_bounds)",
    )


def _where(num_heads: int, head_size: int) -> Any:
    def where(at: tuple[int, ...], diff: float) -> str:
        b, s, c = at
        return f"batch {b}, token {s}, head {c // head_size}, channel {c % head_size}"

    return where

"""Expert routing of com.microsoft.MoE and com.microsoft.QMoE, as ONNX Runtime's CPU computes it.

Sources (microsoft/onnxruntime): onnxruntime/contrib_ops/cpu/moe/moe_quantization_cpu.cc
(``QMoECPU::ComputeCommon``, the routing loop), onnxruntime/contrib_ops/cpu/moe/moe_cpu.cc
(``MoE::ComputeMoE``); docs/ort-ops.md 5.2. Checked against onnxruntime 1.32.0 on the CPU
(tests/test_upstream_ort_qmoe.py): the same experts always, the same weights bit for bit except
where glibc's expf is an ulp off the correctly rounded exp (a few weights in 10^4).

router_probs holds raw logits, one row per token; fp16 logits are widened to fp32 first (exact).

Selection: the k largest keys of a row, in descending order, from ``std::partial_sort`` over
(key, expert index) pairs with ``std::greater``: among equal keys the **higher expert index comes
first** (tie_break="higher"). ORT's CUDA provider breaks ties toward the lower index
(tie_break="lower"). The key is the logit for QMoE and the full-softmax probability (below) for
MoE: MoE ranks rounded fp32 probabilities, so two logits whose probabilities land within an ulp
of each other may rank differently in ORT (its expf can be an ulp off the oracle's).

QMoE weights (op="qmoe"), every step fp32:
- without router_weights: a softmax over the k selected logits only, **whatever
  normalize_routing_weights says**: e_j = fp32(exp(fp32(l_j - l_max))), s = e_0 + ... + e_{k-1}
  summed left to right in fp32, w_j = fp32(e_j * fp32(1 / s)). For k = 1 the weight is 1.
- with router_weights rw: w_j = rw[sel_j] (fp16 widened); normalize_routing_weights=1 rescales
  them: s = sum in selection order (fp32), w_j = fp32(rw_j * fp32(1 / s)), and 0 when s == 0.
- the expert FFN skips a selected expert whose w_j <= fp32(1e-8) (``SKIP_QMOE``).

MoE weights (op="moe"): the full softmax over all E logits, p_j = fp32(e_j * fp32(1 / s)) with
e_j = fp32(exp(fp32(l_j - max))) and s summed over j = 0..E-1 in fp32; the k largest p are
selected (ties of p as above); normalize_routing_weights=1: w_j = fp32(p_j * fp32(1 / t)) with t
the fp32 sum of the selected p, normalize_routing_weights=0: w_j = p_j (not renormalized, so MoE
and QMoE disagree there). The FFN skips w_j <= 0.

exp is the correctly rounded fp32 exponential (float64 exp rounded once); glibc's expf, which ORT
calls, is within 1 ulp of it.
precision="float64": the same selection (on the same fp32 keys), weights in float64 exactly as
the formulas above without the fp32 roundings.
"""

from __future__ import annotations

import numpy as np

from qconform.errors import ArgumentError

TIE_BREAKS = ("higher", "lower")
OPS = ("qmoe", "moe")
PRECISIONS = ("reference", "float64")
SKIP_QMOE = np.float32(1e-8)  # QMoE: an expert with weight <= this is not evaluated
FLOAT_TYPES = (np.dtype(np.float32), np.dtype(np.float16))


def exp_fp32(x: np.ndarray) -> np.ndarray:
    """fp32(exp(x)) for fp32 x, correctly rounded (float64 exp, one rounding)."""
    with np.errstate(over="ignore", under="ignore"):
        return np.exp(np.asarray(x, np.float32).astype(np.float64)).astype(np.float32)


def _logits(name: str, a: object) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise ArgumentError(f"{name}: must be a numpy.ndarray, got {type(a).__name__}")
    if a.dtype not in FLOAT_TYPES:
        raise ArgumentError(f"{name}: dtype must be float32 or float16, got {a.dtype}")
    if a.ndim != 2 or a.shape[1] < 1:
        raise ArgumentError(f"{name}: must be 2-D (tokens, num_experts), got shape {a.shape}")
    return a


def check_route_args(
    router_probs: object,
    k: object,
    tie_break: str,
    op: str,
    normalize_routing_weights: object,
    router_weights: object,
    precision: str,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Validate routing arguments; return the fp32 logits and fp32 router weights (or None)."""
    logits = _logits("router_probs", router_probs)
    n_experts = logits.shape[1]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= n_experts:
        raise ArgumentError(f"k: must be an integer in [1, num_experts = {n_experts}], got {k!r}")
    if tie_break not in TIE_BREAKS:
        raise ArgumentError(f"tie_break: must be one of {TIE_BREAKS}, got {tie_break!r}")
    if op not in OPS:
        raise ArgumentError(f"op: must be one of {OPS}, got {op!r}")
    if normalize_routing_weights not in (0, 1):
        raise ArgumentError(f"normalize_routing_weights: must be 0 or 1, got {normalize_routing_weights!r}")
    if precision not in PRECISIONS:
        raise ArgumentError(f"precision: must be one of {PRECISIONS}, got {precision!r}")
    l32 = logits.astype(np.float32)
    if np.isnan(l32).any():
        raise ArgumentError("router_probs: must not contain NaN (ORT's ordering of NaN is undefined)")
    rw = None
    if router_weights is not None:
        if op == "moe":
            raise ArgumentError("router_weights: the MoE op has no router_weights input (QMoE only)")
        rw_arr = _logits("router_weights", router_weights)
        if rw_arr.shape != logits.shape:
            raise ArgumentError(f"router_weights: shape must be router_probs' {logits.shape}, got {rw_arr.shape}")
        if rw_arr.dtype != logits.dtype:
            raise ArgumentError(f"router_weights: dtype must be router_probs' {logits.dtype}, got {rw_arr.dtype}")
        rw = rw_arr.astype(np.float32)
    return l32, rw


def select(keys: np.ndarray, k: int, tie_break: str = "higher") -> np.ndarray:
    """Indices (tokens, k) int64 of the k largest keys per row, largest first; equal keys in
    ``tie_break`` order of the expert index ("higher": ORT CPU, "lower": ORT CUDA)."""
    n = keys.shape[1]
    idx = np.broadcast_to(np.arange(n), keys.shape)
    # lexsort sorts ascending by the last key first: by value, then by the index as the tie rule says
    secondary = -idx if tie_break == "higher" else idx
    order = np.lexsort((secondary, -keys.astype(np.float64)), axis=1)
    return order[:, :k].astype(np.int64)


def _fsum_rows(v: np.ndarray) -> np.ndarray:
    """Row sums of fp32 values, left to right, each addition rounded to fp32."""
    s = np.zeros(v.shape[0], np.float32)
    for j in range(v.shape[1]):
        s = (s + v[:, j]).astype(np.float32)
    return s


def _inverse(s: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(s == 0, np.float32(0), (np.float32(1) / s).astype(np.float32)).astype(np.float32)


def _softmax_fp32(v: np.ndarray, vmax: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        e = exp_fp32((v - vmax[:, None]).astype(np.float32))
    return (e * _inverse(_fsum_rows(e))[:, None]).astype(np.float32)


def _softmax64(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(v - v.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)


def route(
    router_probs: np.ndarray,
    k: int,
    tie_break: str = "higher",
    *,
    op: str = "qmoe",
    normalize_routing_weights: int = 0,
    router_weights: np.ndarray | None = None,
    precision: str = "reference",
) -> tuple[np.ndarray, np.ndarray]:
    """(expert indices (tokens, k) int64, mixing weights (tokens, k)) of ``op``'s CPU routing, in
    selection order; weights fp32 (precision="reference") or float64 ("float64"). See the module
    docstring for the rules and roundings; the FFN's skip thresholds are not applied here."""
    l32, rw = check_route_args(router_probs, k, tie_break, op, normalize_routing_weights, router_weights, precision)
    k = int(k)
    rows = np.arange(len(l32))[:, None]
    if op == "qmoe":
        idx = select(l32, k, tie_break)
        if rw is not None:
            w = rw[rows, idx]
            if precision == "float64":
                w = w.astype(np.float64)
                if normalize_routing_weights:
                    s = w.sum(axis=1, keepdims=True)
                    with np.errstate(divide="ignore", invalid="ignore"):
                        w = np.where(s == 0, 0.0, w / np.where(s == 0, 1.0, s))
                return idx, w
            if normalize_routing_weights:
                w = (w * _inverse(_fsum_rows(w))[:, None]).astype(np.float32)
            return idx, w
        sel = l32[rows, idx]
        if precision == "float64":
            return idx, _softmax64(sel)
        return idx, _softmax_fp32(sel, sel[:, 0])
    p = _softmax_fp32(l32, l32.max(axis=1))
    idx = select(p, k, tie_break)
    if precision == "float64":
        p64 = _softmax64(l32)[rows, idx]
        if normalize_routing_weights:
            p64 = p64 / p64.sum(axis=1, keepdims=True)
        return idx, p64
    w = p[rows, idx]
    if normalize_routing_weights:
        with np.errstate(divide="ignore", invalid="ignore"):
            w = (w * (np.float32(1) / _fsum_rows(w)).astype(np.float32)[:, None]).astype(np.float32)
    return idx, w

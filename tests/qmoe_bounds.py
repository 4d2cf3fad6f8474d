"""Test helpers for comparing QMoE / MoE outputs with ``qconform.oracles.ort.qmoe``: ``within`` (a
per-element bound plus one fp16 spacing of fp16 outputs) and ``random_moe_case`` (MoE inputs). The
bounds themselves (``qmoe_bound``, ``moe_bound``, their derivation) are ``qconform.ops.ort.moe_bounds``,
QMoE inputs ``qconform.ops.ort.qmoe.random_qmoe_case``: the catalogue uses both."""

from __future__ import annotations

import numpy as np


def within(other: np.ndarray, oracle: np.ndarray, bound: np.ndarray) -> tuple[bool, float]:
    """(every |other - oracle| <= bound (+ one spacing of fp16 outputs), the largest used fraction)."""
    o64, r64 = other.astype(np.float64), oracle.astype(np.float64)
    allow = bound.copy()
    if oracle.dtype == np.float16:
        big = np.maximum(np.abs(o64), np.abs(r64)).astype(np.float16)
        allow = allow + np.spacing(big).astype(np.float64)
    diff = np.abs(o64 - r64)
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(diff > 0, diff / allow, 0.0)
    return bool((diff <= allow).all()), float(frac.max(initial=0.0))


def random_moe_case(
    rng: np.random.Generator, *, tokens: int, hidden: int, inter: int, experts: int, activation_type: str, bias: bool
) -> dict:
    """MoE inputs (fp32), weights scaled by 1 / sqrt(K)."""
    f = 2 if activation_type == "swiglu" else 1
    d = {
        "input": rng.standard_normal((tokens, hidden)).astype(np.float32),
        "router_probs": (rng.standard_normal((tokens, experts)) * 2).astype(np.float32),
        "fc1_experts_weights": (rng.standard_normal((experts, f * inter, hidden)) / np.sqrt(hidden)).astype(np.float32),
        "fc2_experts_weights": (rng.standard_normal((experts, hidden, inter)) / np.sqrt(inter)).astype(np.float32),
    }
    if bias:
        d["fc1_experts_bias"] = (rng.standard_normal((experts, f * inter)) * 0.1).astype(np.float32)
        d["fc2_experts_bias"] = (rng.standard_normal((experts, hidden)) * 0.1).astype(np.float32)
    return d

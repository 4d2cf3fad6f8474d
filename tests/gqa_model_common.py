"""What the numpy models of the GQA device kernels share: the call's layout from the oracle's own
argument check (``check_gqa_args``: batch, heads, phase, per-entry total and past lengths) and the
query as the kernels see it, rotated in ONNX Runtime's CPU rounding (fp16 queries through fp16,
fp32 ones fused)."""

from __future__ import annotations

import numpy as np

from qconform.oracles.ort.group_query_attention import GQALayout, check_gqa_args
from qconform.oracles.ort.rotary import apply_rotary, rotary_positions


def layout_and_query(args: tuple, attrs: dict) -> tuple[GQALayout, np.ndarray]:
    """(layout, query (B, N, S, H) float64 values after rotary) of a call ``(args, attrs)`` in the
    oracle's argument order."""
    lay = check_gqa_args(*args, **attrs)
    query, cos, sin, pos_ids = args[0], args[7], args[8], args[9]
    B, S, N, H = lay.batch, lay.sequence_length, lay.num_heads, lay.head_size
    q = query[..., : N * H].reshape(B, S, N, H).transpose(0, 2, 1, 3).astype(np.float64)
    if attrs.get("do_rotary"):
        pos = rotary_positions(B, S, np.asarray(lay.past_lengths), lay.first_prompt, pos_ids)
        form = "fp16" if query.dtype == np.float16 else "fma"
        q = apply_rotary(q, cos, sin, pos, bool(attrs.get("rotary_interleaved")), form)
    return lay, q


def combine_splits(parts: list, sink: float | None, H: int) -> np.ndarray:
    """The kernels' combine of one output row (``qk_gqa_combine``): the splits' (max, sum, acc) in
    split order, each rescaled by exp(max - M) to the overall max M (the sink's logit included), the
    sums and accumulators added in fp32 one rounding at a time, the sink's exp added to the sum, then
    acc / sum. Empty splits (max -inf) are skipped."""
    f32, neg_inf = np.float32, np.float32(-np.inf)
    M = max(pm for pm, _, _ in parts)
    if sink is not None:
        M = max(M, sink)
    lsum, a = f32(0), np.zeros(H, f32)
    for pm, pl, pacc in parts:
        if pm != neg_inf:
            f = f32(np.exp(f32(pm - M)))
            lsum = f32(lsum + f32(pl * f))
            a = (a + (pacc * f).astype(f32)).astype(f32)
    if sink is not None:
        lsum = f32(lsum + f32(np.exp(f32(sink - M))))
    with np.errstate(invalid="ignore", divide="ignore"):
        return (a / lsum).astype(f32)

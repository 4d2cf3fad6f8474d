"""Whether a baseline's fast form computes what its plain form does before a bench times it: the same
inputs through both, the outputs compared (bench/qmoe.py: PyTorch's CUDA-graph replays against its eager
calls). Counts the bit-identical outputs and takes the worst difference as a fraction of the plain
output's max |y|; a NaN, or any difference from an all-zero output, is the worst there is."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

REL_LIMIT = 1e-2  # of max |y|: past it the fast form computes something else, not another rounding


def _rel_diff(got: np.ndarray, want: np.ndarray) -> float:
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    diff = float(np.max(np.abs(g - w))) if g.size else 0.0
    scale = float(np.max(np.abs(w))) if w.size else 0.0
    if np.isnan(diff):
        return float("inf")
    if scale == 0.0:
        return 0.0 if diff == 0.0 else float("inf")
    return diff / scale


def agreement(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> tuple[int, float]:
    """(outputs bit-identical, worst difference / max |want|) over pairs of equal shape and dtype."""
    if len(got) != len(want):
        raise ValueError(f"got: {len(got)} outputs for {len(want)} wanted")
    same, worst = 0, 0.0
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        g, w = np.ascontiguousarray(g), np.ascontiguousarray(w)
        if g.shape != w.shape or g.dtype != w.dtype:
            raise ValueError(f"got[{i}]: {g.dtype}{list(g.shape)}, want {w.dtype}{list(w.shape)}")
        same += bool(np.array_equal(g.view(np.uint8), w.view(np.uint8)))
        worst = max(worst, _rel_diff(g, w))
    return same, worst


def check_agreement(got: Sequence[np.ndarray], want: Sequence[np.ndarray], what: str, limit: float = REL_LIMIT) -> str:
    """A line saying how ``what``'s fast form agrees with its plain form; ValueError past ``limit``."""
    same, worst = agreement(got, want)
    line = f"{what}: {same} of {len(want)} bit-identical, max |diff| {worst:.1e} of max |y|"
    if not worst <= limit:
        raise ValueError(f"{line}: past {limit:g}, so it computes something else")
    return line

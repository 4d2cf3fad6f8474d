"""Units in the last place of fp32: what an approximate division or reciprocal may return."""

from __future__ import annotations

import numpy as np


def nudge_ulp(v: np.ndarray, steps: int) -> np.ndarray:
    """``v`` moved ``steps`` fp32 ulp (up when positive), finite nonzero values only: what an
    approximate division or reciprocal may return instead of the correctly rounded one (an
    approximate 0/x is still 0; inf and NaN stay). ``steps`` = 0: ``v`` unchanged."""
    out = np.asarray(v, np.float32).copy()
    move = np.isfinite(out) & (out != 0)
    toward = np.float32(np.inf if steps > 0 else -np.inf)
    for _ in range(abs(steps)):
        out = np.where(move, np.nextafter(out, toward), out).astype(np.float32)
    return out

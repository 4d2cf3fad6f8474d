"""Flush-to-zero of fp32 subnormals (with denormals-are-zero), as CuPy compiles device code on
both vendors (NVRTC ``-ftz=true``, hiprtc ``-fcuda-flush-denormals-to-zero``)."""

from __future__ import annotations

import numpy as np

F32_MIN_NORMAL = np.float32(1.1754943508222875e-38)


def flush(v: np.ndarray, ftz: bool) -> np.ndarray:
    """Flush fp32 subnormals to a zero of the same sign when ``ftz``; identity otherwise."""
    v = np.asarray(v, dtype=np.float32)
    if not ftz:
        return v
    tiny = (np.abs(v) < F32_MIN_NORMAL) & (v != 0)
    return np.where(tiny, np.copysign(np.float32(0), v), v).astype(np.float32)

"""``out=`` and ``ftz`` for the ORT oracles: validate ``out`` before anything is computed, copy
the result into it; flush-to-zero of float inputs and outputs for device comparisons (the ORT
catalogue generates no subnormal values, so ftz changes nothing on its cases)."""

from __future__ import annotations

import numpy as np

from qconform.errors import ArgumentError
from qconform.formats.ftz import flush


def check_out(out: object, shape: tuple[int, ...], dtype: np.dtype, *inputs: object) -> None:
    if out is None:
        return
    if not isinstance(out, np.ndarray):
        raise ArgumentError(f"out: must be a numpy.ndarray, got {type(out).__name__}")
    if out.dtype != dtype:
        raise ArgumentError(f"out: dtype must be {dtype}, got {out.dtype}")
    if out.shape != shape:
        raise ArgumentError(f"out: shape must be {shape}, got {out.shape}")
    if not out.flags.writeable or not out.flags.c_contiguous:
        raise ArgumentError("out: must be writeable and C-contiguous")
    if any(isinstance(a, np.ndarray) and np.may_share_memory(out, a) for a in inputs):
        raise ArgumentError("out: must not overlap an input")


def deliver(result: np.ndarray, out: np.ndarray | None, ftz: bool = False) -> np.ndarray:
    if ftz and result.dtype == np.float32:
        result = flush(result, True)
    if out is None:
        return result
    out[...] = result
    return out


def flushed(a: np.ndarray, ftz: bool) -> np.ndarray:
    return flush(a, True).astype(a.dtype) if ftz and a.dtype == np.float32 else a

"""8-bit blockwise quantization with a 256-entry code (bitsandbytes ``quantize_blockwise``), three ways
(docs/bnb-4bit.md 4.3).

Used for the nested absmax of 4-bit weights (blocksize 256, the dynamic map). ``x`` is a flat float32
array, block b is ``x[b*bs : min((b+1)*bs, n)]``. Which code runs (bitsandbytes-foundation/bitsandbytes):

- ``cpu``: csrc/cpu_ops.cpp ``quantize_cpu_impl`` (the CPU backend whenever the native library loads).
  ``absmax = std::max(absmax, fabs(x))`` from 0.0, so a NaN is skipped. A zero block gives all 0.
  Otherwise ``t = fl32(x * fl32(1.0f / absmax))`` and ``q = lut[idx]`` with
  ``idx = (uint16)(fl32(fl32(fl32(clamp(t, -1, 1) + 1) * 0.5f) * 65535.0f) + 0.5f)`` (truncation; NaN
  gives 0) and ``lut[i]`` = the first k with ``mid_k >= fl32(-1 + fl32(2i) / 65535)``, else 255, where
  ``mid_k = fl32(0.5f * fl32(code[k] + code[k+1]))`` (``build_quantize_lut``). Not exact nearest.
- ``default``: bitsandbytes/backends/default/ops.py ``quantize_blockwise`` (no native library): full
  blocks ``absmax = max|x|`` (NaN propagates), ``s = clamp(x * fl32(1 / clamp(absmax, min=1e-38)), -1, 1)``;
  the tail block ``am = clamp(max|x|, min=1e-38)`` (returned as its absmax), ``s = clamp(x / am, -1, 1)``;
  then ``bucketize`` on the float32 midpoints ``(code[:-1] + code[1:]) / 2``: ties to the lower index,
  NaN to 255.
- ``cuda``: csrc/kernels.cu ``kQuantizeBlockwise<..., General8bit>`` + ``dQuantize<0>``: ``fmaxf`` from
  -FLT_MAX (NaN skipped; the tail block also sees its zero padding, so its max is >= 0), flush-to-zero,
  ``r = 1.0f / absmax`` (see ``rcp``), ``t = fl32(x * r)``, then a 7-step binary search from pivot 127
  with steps 64..1 and one midpoint test ``(a + b) * 0.5f``: nearest code, a tie to the even (final
  pivot) index, NaN -> 0. ``rocm`` is the same without flush-to-zero and with the IEEE reciprocal
  (by source only: csrc builds for HIP without fast-math).
Dequantize: ``out = fl32(code[q] * absmax[i // bs])`` (flushed on cuda), then the output rounding.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from qconform.formats.ftz import flush
from qconform.oracles.bnb.rcp import reciprocal

BLOCKWISE_VARIANTS = ("cpu", "default", "cuda", "rocm")
F32_MAX = np.float32(np.finfo(np.float32).max)
TINY = np.float32(1e-38)  # torch's clamp(min=1e-38) in float32: a subnormal, 0x006CE3EE
ONE, HALF = np.float32(1.0), np.float32(0.5)
LUT_SIZE = 65536


def _blocks(x: np.ndarray, bs: int, fill: float) -> np.ndarray:
    """Flat ``x`` -> (blocks, bs), the tail padded with ``fill``."""
    nb = -(-x.size // bs)
    out = np.full(nb * bs, fill, np.float32)
    out[: x.size] = x
    return out.reshape(nb, bs)


def default_scale(x: np.ndarray, bs: int) -> tuple[np.ndarray, np.ndarray]:
    """bitsandbytes' default (torch) path: per-block absmax and ``s`` clamped to [-1, 1], flat."""
    n = x.size
    full = n - n % bs
    xf = x[:full].reshape(-1, bs)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        absmax = np.max(np.abs(xf), axis=1) if full else np.zeros(0, np.float32)
        r = (ONE / np.maximum(absmax, TINY)).astype(np.float32)
        s = np.clip((xf * r[:, None]).astype(np.float32), -ONE, ONE).reshape(-1)
        if full < n:
            am = np.maximum(np.max(np.abs(x[full:])), TINY).astype(np.float32)
            absmax = np.append(absmax, am)
            s = np.append(s, np.clip((x[full:] / am).astype(np.float32), -ONE, ONE))
    return s.astype(np.float32), absmax.astype(np.float32)


def cuda_scale(x: np.ndarray, bs: int, ftz: bool, rcp_table: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """bitsandbytes' CUDA kernels: per-block ``fmaxf`` absmax and ``t = x * rcp(absmax)`` (unclamped), as
    (blocks, bs) with the tail's zero padding (which also yields the odd-n pad nibble)."""
    xb = flush(_blocks(x, bs, 0.0), ftz)
    a = np.abs(xb)
    a = np.where(np.isnan(a), -F32_MAX, a)
    absmax = np.max(a, axis=1).astype(np.float32)  # the tail's padding zeros take part
    r = reciprocal(absmax, ftz, rcp_table)
    with np.errstate(invalid="ignore", over="ignore"):
        t = flush((xb * r[:, None]).astype(np.float32), ftz)
    return t, absmax


@lru_cache(maxsize=8)
def _lut(code_bytes: bytes) -> np.ndarray:
    code = np.frombuffer(code_bytes, np.float32)
    mid = (HALF * (code[:-1] + code[1:]).astype(np.float32)).astype(np.float32)
    i = np.arange(LUT_SIZE, dtype=np.float32)
    val = (np.float32(-1) + ((np.float32(2) * i).astype(np.float32) / np.float32(LUT_SIZE - 1)).astype(np.float32))
    return np.searchsorted(mid, val.astype(np.float32), side="left").astype(np.uint8)  # first k: mid_k >= val


def cpu_lut_index(t: np.ndarray) -> np.ndarray:
    """csrc/cpu_ops.cpp ``norm_to_lut_index``: the LUT slot of a scaled value (NaN -> 0)."""
    c = np.clip(t, -ONE, ONE)
    v = ((((c + ONE).astype(np.float32) * HALF).astype(np.float32) * np.float32(LUT_SIZE - 1)).astype(np.float32)
         + HALF).astype(np.float32)  # fmt: skip
    return np.where(np.isnan(v), 0, np.trunc(np.nan_to_num(v))).astype(np.int64)


def _cuda_search(code: np.ndarray, t: np.ndarray) -> np.ndarray:
    """csrc/kernels.cu ``dQuantize<0>`` on every element of ``t``."""
    pivot = np.full(t.shape, 127, np.int64)
    lower_pivot = np.zeros(t.shape, np.int64)
    upper_pivot = np.full(t.shape, 255, np.int64)
    lower = np.full(t.shape, -ONE, np.float32)
    upper = np.full(t.shape, ONE, np.float32)
    val = code[pivot]
    step = 64
    while step > 0:
        up = t > val
        lower_pivot = np.where(up, pivot, lower_pivot)
        lower = np.where(up, val, lower)
        upper_pivot = np.where(up, upper_pivot, pivot)
        upper = np.where(up, upper, val)
        pivot = np.where(up, pivot + step, pivot - step)
        val = code[pivot]
        step >>= 1
    upper = np.where(upper_pivot == 255, code[255], upper)
    lower = np.where(lower_pivot == 0, code[0], lower)
    with np.errstate(invalid="ignore", over="ignore"):
        mid_up = ((upper + val).astype(np.float32) * HALF).astype(np.float32)
        mid_lo = ((lower + val).astype(np.float32) * HALF).astype(np.float32)
    q = np.where(t > val, np.where(t > mid_up, upper_pivot, pivot), np.where(t < mid_lo, lower_pivot, pivot))
    return q.astype(np.uint8)


def quantize_blockwise_numpy(
    x: np.ndarray, code: np.ndarray, bs: int, variant: str, rcp_table: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Flat float32 ``x`` -> (uint8 codes, float32 absmax per block) as ``variant`` computes them."""
    n = x.size
    if variant == "default":
        s, absmax = default_scale(x, bs)
        mid = ((code[:-1] + code[1:]).astype(np.float32) / np.float32(2)).astype(np.float32)
        return np.searchsorted(mid, s, side="left").astype(np.uint8), absmax
    if variant == "cpu":
        xb = _blocks(x, bs, 0.0)
        a = np.abs(xb)
        absmax = np.max(np.where(np.isnan(a), np.float32(0), a), axis=1).astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            r = (ONE / absmax).astype(np.float32)
            t = (xb * r[:, None]).astype(np.float32)
        q = _lut(np.ascontiguousarray(code, np.float32).tobytes())[cpu_lut_index(t)]
        q = np.where(absmax[:, None] == 0, np.uint8(0), q)
        return q.reshape(-1)[:n].astype(np.uint8), absmax
    t, absmax = cuda_scale(x, bs, variant == "cuda", rcp_table if variant == "cuda" else None)
    return _cuda_search(code, t).reshape(-1)[:n], absmax


def dequantize_blockwise_numpy(q: np.ndarray, absmax: np.ndarray, code: np.ndarray, bs: int, ftz: bool) -> np.ndarray:
    """``fl32(code[q] * absmax[i // bs])`` for flat ``q``, float32 (the output rounding is the caller's)."""
    scale = np.repeat(absmax.astype(np.float32), bs)[: q.size]
    with np.errstate(invalid="ignore", over="ignore"):
        return flush((code[q.astype(np.int64)] * scale).astype(np.float32), ftz)

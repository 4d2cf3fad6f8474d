"""Rotary embedding as ONNX Runtime's GroupQueryAttention applies it on the x86 CPU.

Sources: docs/ort-ops.md 4.4 and 4.6; microsoft/onnxruntime
onnxruntime/contrib_ops/cpu/bert/group_query_attention.cc (position ids),
onnxruntime/contrib_ops/cpu/bert/rotary_embedding.cc (``RunRotaryEmbedding``: channels >= rd copied),
onnxruntime/core/mlas/lib/rotary_embedding.cpp (fp16 fallback) and
onnxruntime/core/mlas/lib/rotary_embedding_kernel_avx2_fp32.cpp (fp32 AVX2 kernel).

For a pair (a, b) = (x[i], x[i + rd/2]) (half split) or (x[2i], x[2i+1]) (interleaved) and
c = cos[pos, i], t = sin[pos, i]:
  a' = a*c - b*t        b' = a*t + b*c
Rounding, form "fma" (fp32, the AVX2 kernel): the product with b is rounded to fp32, the other is
fused: a' = fp32(a*c - fp32(b*t)), b' = fp32(a*t + fp32(b*c)).
Form "fp16" (fp16, MLAS's scalar fallback; x86 has no fp16 rotary kernel): every product of two
fp16 values is exact in fp32, so a' = fp16(fp32(a*c - b*t)), b' = fp16(fp32(a*t + b*c)).
Form "float64": the same formula in float64, no rounding.
"""

from __future__ import annotations

import numpy as np

FORMS = ("fma", "fp16", "float64")


def _fp32_sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """fp32(a + b), correctly rounded, for float64 a, b whose exact sum the float64 addition may
    round: the sum is rounded to odd in float64 (TwoSum error term), which rounds to fp32 correctly
    (53 >= 24 + 2 bits)."""
    s = a + b
    bb = s - a
    err = (a - (s - bb)) + (b - bb)
    odd = (s.view(np.int64) & 1).astype(bool)
    fix = (err != 0) & ~odd & np.isfinite(s)
    s = np.where(fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def rotate_pairs(
    a: np.ndarray, b: np.ndarray, c: np.ndarray, t: np.ndarray, form: str
) -> tuple[np.ndarray, np.ndarray]:
    """(a', b') of one rotation step, rounded as ``form`` says (float64 in and out, values of the
    storage type: fp32 values for "fma", fp16 values for "fp16")."""
    a, b, c, t = (np.asarray(v, np.float64) for v in (a, b, c, t))
    if form == "float64":
        return a * c - b * t, a * t + b * c
    if form == "fp16":
        return (
            (a * c - b * t).astype(np.float32).astype(np.float16).astype(np.float64),
            (a * t + b * c).astype(np.float32).astype(np.float16).astype(np.float64),
        )
    bt = (b * t).astype(np.float32).astype(np.float64)
    bc = (b * c).astype(np.float32).astype(np.float64)
    return _fp32_sum(a * c, -bt).astype(np.float64), _fp32_sum(a * t, bc).astype(np.float64)


def rotary_positions(
    batch: int, sequence_length: int, past_lengths: np.ndarray, first_prompt: bool, position_ids: np.ndarray | None
) -> np.ndarray:
    """(B, S) int64 cache rows: position_ids[b, s] (first prompt: position_ids[0, 0] + s for every
    b, ORT reads only the first element), else s on the first prompt and past_b + s later."""
    s = np.arange(sequence_length, dtype=np.int64)
    if position_ids is not None:
        pid = np.asarray(position_ids, np.int64)
        if first_prompt:
            return np.broadcast_to(pid.reshape(-1)[0] + s, (batch, sequence_length)).copy()
        return pid[:, :sequence_length].copy()
    if first_prompt:
        return np.broadcast_to(s, (batch, sequence_length)).copy()
    return np.asarray(past_lengths, np.int64)[:, None] + s[None, :]


def apply_rotary(
    x: np.ndarray, cos_cache: np.ndarray, sin_cache: np.ndarray, positions: np.ndarray, interleaved: bool, form: str
) -> np.ndarray:
    """Rotate x (B, heads, S, H) (float64 values) at ``positions`` (B, S); channels >= rd = 2 *
    cos_cache.shape[1] are copied. Returns float64 values rounded as ``form`` says."""
    half = cos_cache.shape[1]
    rd = 2 * half
    c = np.asarray(cos_cache, np.float64)[positions][:, None, :, :]
    t = np.asarray(sin_cache, np.float64)[positions][:, None, :, :]
    out = np.array(x, dtype=np.float64, copy=True)
    if interleaved:
        a, b = x[..., 0:rd:2], x[..., 1:rd:2]
        out[..., 0:rd:2], out[..., 1:rd:2] = rotate_pairs(a, b, c, t, form)
    else:
        a, b = x[..., :half], x[..., half:rd]
        out[..., :half], out[..., half:rd] = rotate_pairs(a, b, c, t, form)
    return out

"""The int8 / 4-bit KV cache of ONNX Runtime's GroupQueryAttention (CPU): symmetric, per tensor or
per channel, fp32 scales.

Sources: docs/ort-ops.md 4.7; microsoft/onnxruntime onnxruntime/core/mlas/lib/qkv_quant.cpp
(``QuantizeInt8``, ``QuantizeRowInt4``, ``DequantInt8``, ``DequantInt4FromByte``) and
onnxruntime/contrib_ops/cpu/bert/gqa_attention_base.h (``ConcatQuantStateChunkGQA``).

Quantize (form "ort"): inv = fp32(1 / scale); q = clamp(rint(fp32(x * inv)), lo, hi), rint half to
even; 8-bit: int8 in [-128, 127]; 4-bit: [-8, 7] stored as the nibble q + 8, element 2i in the low
nibble and 2i+1 in the high nibble of byte i (uint8, last dimension H/2). Form "float64": the
accuracy twin rounds the float64 quotient x / scale instead.
Dequantize: fp32(q * scale) (exact in float64, rounded once to fp32).
Scales: PER_TENSOR one fp32 value; PER_CHANNEL Nk*H values (any shape of that size, e.g.
(1, Nk, 1, H)), channel (g, h) of KV head g.
"""

from __future__ import annotations

import numpy as np

from qconform.errors import ArgumentError

QUANT_TYPES = ("NONE", "PER_TENSOR", "PER_CHANNEL")
RANGES = {8: (-128, 127), 4: (-8, 7)}


def cache_dtype(bit_width: int) -> np.dtype:
    """int8 for 8-bit caches, uint8 (packed nibbles) for 4-bit."""
    return np.dtype(np.int8) if bit_width == 8 else np.dtype(np.uint8)


def stored_head_size(head_size: int, bit_width: int) -> int:
    """Last dimension of a cache: H, or H/2 bytes for 4-bit."""
    return head_size // 2 if bit_width == 4 else head_size


def expand_kv_scale(name: str, scale: object, quant_type: str, kv_num_heads: int, head_size: int) -> np.ndarray:
    """The (Nk, H) float32 scale of every cache channel, after checking the scale's dtype and size."""
    if not isinstance(scale, np.ndarray):
        raise ArgumentError(f"{name}: must be a float32 numpy.ndarray when the cache is quantized, got {scale!r}")
    if scale.dtype != np.float32:
        raise ArgumentError(f"{name}: dtype must be float32, got {scale.dtype}")
    want = 1 if quant_type == "PER_TENSOR" else kv_num_heads * head_size
    if scale.size != want:
        raise ArgumentError(
            f"{name}: {quant_type} needs {want} element(s) (PER_CHANNEL: kv_num_heads * head_size), got {scale.size}"
        )
    if not np.all(np.isfinite(scale)) or np.any(scale == 0):
        raise ArgumentError(f"{name}: every scale must be finite and nonzero")
    if quant_type == "PER_TENSOR":
        return np.full((kv_num_heads, head_size), scale.reshape(-1)[0], np.float32)
    return scale.reshape(kv_num_heads, head_size).copy()


def quantize_kv(x: np.ndarray, scale: np.ndarray, bit_width: int, form: str = "ort") -> np.ndarray:
    """x (B, Nk, rows, H) float values -> the cache rows (int8, or uint8 (..., H/2) for 4-bit);
    ``scale`` (Nk, H) float32."""
    lo, hi = RANGES[bit_width]
    s = scale[None, :, None, :]
    with np.errstate(over="ignore", invalid="ignore"):
        if form == "float64":
            r = np.rint(np.asarray(x, np.float64) / s.astype(np.float64))
        else:
            inv = (np.float32(1) / s.astype(np.float32)).astype(np.float32)
            r = np.rint((np.asarray(x, np.float32) * inv).astype(np.float32)).astype(np.float64)
    q = np.clip(np.nan_to_num(r, nan=0.0), lo, hi).astype(np.int64)
    if bit_width == 8:
        return q.astype(np.int8)
    nib = (q + 8).astype(np.uint8)
    return (nib[..., 0::2] | (nib[..., 1::2] << 4)).astype(np.uint8)


def dequantize_kv(q: np.ndarray, scale: np.ndarray, bit_width: int, exact: bool = False) -> np.ndarray:
    """Cache rows -> float64 values of fp32(q * scale) (``exact``: q * scale unrounded), (B, Nk, rows, H)."""
    if bit_width == 8:
        vals = q.astype(np.float64)
    else:
        lo = (q & 0x0F).astype(np.int64) - 8
        hi = (q >> 4).astype(np.int64) - 8
        vals = np.stack([lo, hi], axis=-1).reshape(*q.shape[:-1], 2 * q.shape[-1]).astype(np.float64)
    vals = vals * scale[None, :, None, :].astype(np.float64)
    return vals if exact else vals.astype(np.float32).astype(np.float64)

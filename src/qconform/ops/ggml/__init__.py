"""The ggml family's catalogue entries (llama.cpp block formats)."""

from __future__ import annotations

from qconform.ops.ggml.q8_quant import OPS

__all__ = ["OPS"]

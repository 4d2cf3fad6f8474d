"""The ggml family's catalogue entries (llama.cpp block formats)."""

from __future__ import annotations

from qconform.ops.ggml.keep_quant import OPS as KEEP_QUANT_OPS
from qconform.ops.ggml.q8_quant import OPS as QUANT_OPS

OPS = (*QUANT_OPS, *KEEP_QUANT_OPS)

__all__ = ["OPS"]

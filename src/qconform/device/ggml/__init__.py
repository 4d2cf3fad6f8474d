"""The ggml family's launchers (CuPy arrays, the oracles' call shapes)."""

from __future__ import annotations

from qconform.device.ggml.q8_quant import dequantize, quantize

__all__ = ["dequantize", "quantize"]

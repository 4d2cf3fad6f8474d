"""The ggml family's launchers (CuPy arrays, the oracles' call shapes): the block-format kernels
through their op's ABI (``q8_quant``), the others as functions (``DEVICE_FUNCTIONS``)."""

from __future__ import annotations

from typing import Any, Callable

from qconform.device.ggml.fused import rms_norm_q8_k, silu_mul_q8_k
from qconform.device.ggml.keep_quant import matmul_bt_quant
from qconform.device.ggml.q8_quant import dequantize, quantize

DEVICE_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "matmul_bt_quant": matmul_bt_quant,
    "rms_norm_q8_k": rms_norm_q8_k,
    "silu_mul_q8_k": silu_mul_q8_k,
}

__all__ = ["DEVICE_FUNCTIONS", "dequantize", "matmul_bt_quant", "quantize", "rms_norm_q8_k", "silu_mul_q8_k"]

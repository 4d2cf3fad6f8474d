"""The ONNX Runtime family's launchers, one module per op (siblings share one): the oracles'
call shapes on CuPy arrays."""

from __future__ import annotations

from typing import Any, Callable

from qconform.device.launchers import bound, compile_options, source_override
from qconform.device.ort.fake_quantize import fake_quantize
from qconform.device.ort.gather_block_quantized import gather_block_quantized
from qconform.device.ort.gqa_flash import gqa_prefill  # the split-K kernels unless storage=fp16
from qconform.device.ort.group_query_attention import gqa_decode
from qconform.device.ort.matmul_nbits import dequantize_nbits, matmul_nbits
from qconform.device.ort.qmoe import qmoe_decode, qmoe_ragged_mm
from qconform.device.ort.qswiglu import qswiglu

DEVICE_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "dequantize_nbits": dequantize_nbits,
    "matmul_nbits": matmul_nbits,
    "gather_block_quantized": gather_block_quantized,
    "fake_quantize": fake_quantize,
    "qswiglu": qswiglu,
    "gqa_decode": gqa_decode,
    "gqa_prefill": gqa_prefill,
    "qmoe_decode": qmoe_decode,
    "qmoe_ragged_mm": qmoe_ragged_mm,
}

__all__ = [
    "DEVICE_FUNCTIONS",
    "bound",
    "compile_options",
    "dequantize_nbits",
    "fake_quantize",
    "gather_block_quantized",
    "gqa_decode",
    "gqa_prefill",
    "matmul_nbits",
    "qmoe_decode",
    "qmoe_ragged_mm",
    "qswiglu",
    "source_override",
]

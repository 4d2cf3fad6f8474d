"""The bitsandbytes family's launchers (CuPy arrays, the oracles' call shapes)."""

from __future__ import annotations

from typing import Any, Callable

from qconform.device.bnb.decode import fp4_decode, nf4_decode
from qconform.device.bnb.gemm import gemm_4bit
from qconform.device.bnb.nested import nested_absmax
from qconform.device.bnb.quantize import fp4_quantize, nf4_quantize

DEVICE_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "nf4_decode": nf4_decode,
    "fp4_decode": fp4_decode,
    "nf4_quantize": nf4_quantize,
    "fp4_quantize": fp4_quantize,
    "gemm_4bit": gemm_4bit,
    "nested_absmax": nested_absmax,
}

__all__ = ["DEVICE_FUNCTIONS", "fp4_decode", "fp4_quantize", "gemm_4bit", "nested_absmax", "nf4_decode", "nf4_quantize"]

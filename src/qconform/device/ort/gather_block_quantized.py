"""Launcher of gather_block_quantized: the kernel ``ort/gather_block_quantized.hip`` takes the op's
declared ABI (``qconform abi gather_block_quantized``); the oracle's call shape on CuPy arrays,
bit-identical to ``qconform.oracles.ort.gather_block_quantized`` for 2-D tables gathered along
axis 0."""

from __future__ import annotations

from typing import Any

from qconform.device.launchers import launch_abi
from qconform.ops.ort.gather_block_quantized import GATHER


def gather_block_quantized(
    data: Any, indices: Any, scales: Any, zero_points: Any = None, *, out: Any = None, **attributes: Any
) -> Any:
    """Gather then dequantize on the device: ``attributes`` are the oracle's (bits, block_size,
    gather_axis, quantize_axis, data_type, data_shape, out_of_range); int32 indices are widened."""
    args = (data, indices, scales, zero_points)
    return launch_abi(GATHER, "ort/gather_block_quantized.hip", "qk_gather_block_quantized", args, attributes, out)

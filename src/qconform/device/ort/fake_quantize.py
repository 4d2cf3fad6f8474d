"""Launcher of fake_quantize: the kernel ``ort/fake_quantize.hip`` takes the op's declared ABI
(``qconform abi fake_quantize``); the oracle's call shape on CuPy arrays, bit-identical to
``qconform.oracles.ort.fake_quantize(..., ftz=True)`` for 2-D x quantized along axis 1."""

from __future__ import annotations

from typing import Any

from qconform.device.launchers import launch_abi
from qconform.ops.ort.fake_quantize import FAKE_QUANTIZE


def fake_quantize(x: Any, scale: Any, zero_point: Any = None, *, out: Any = None, **attributes: Any) -> Any:
    """DQ(Q(x)) on the device: ``attributes`` are the oracle's (axis, block_size, dtype)."""
    args = (x, scale, zero_point)
    return launch_abi(FAKE_QUANTIZE, "ort/fake_quantize.hip", "qk_fake_quantize", args, attributes, out)

"""The bitsandbytes family's launchers (CuPy arrays, the oracles' call shapes)."""

from __future__ import annotations

from typing import Any, Callable

from qconform.device.bnb.decode import fp4_decode, nf4_decode

DEVICE_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "nf4_decode": nf4_decode,
    "fp4_decode": fp4_decode,
}

__all__ = ["DEVICE_FUNCTIONS", "fp4_decode", "nf4_decode"]

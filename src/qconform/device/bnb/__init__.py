"""The bitsandbytes family's launchers (CuPy arrays, the oracles' call shapes)."""

from __future__ import annotations

from typing import Any, Callable

DEVICE_FUNCTIONS: dict[str, Callable[..., Any]] = {}

__all__ = ["DEVICE_FUNCTIONS"]

"""Every family's function launchers by op: the oracles' call shapes on CuPy arrays (``out=``
included), for the ops whose kernels qconform launches itself rather than through one ABI kernel."""

from __future__ import annotations

from typing import Any, Callable

from qconform.device.bnb import DEVICE_FUNCTIONS as BNB
from qconform.device.ggml import DEVICE_FUNCTIONS as GGML
from qconform.device.ort import DEVICE_FUNCTIONS as ORT

DEVICE_FUNCTIONS: dict[str, Callable[..., Any]] = {**GGML, **BNB, **ORT}

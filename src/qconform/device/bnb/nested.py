"""Launcher of nested_absmax: the kernel ``bnb/nested.hip`` takes the op's declared ABI (``qconform abi
nested_absmax``); the oracle's call shape on CuPy arrays, bit-identical (NaN payloads aside) to
``qconform.ops.bnb.nested.nested_absmax(..., ftz=True)`` in either mode, which is every variant's
reading with flush-to-zero (the variants differ only there)."""

from __future__ import annotations

from typing import Any

from qconform.device.launchers import launch_abi
from qconform.ops.bnb.nested import NESTED_ABSMAX


def nested_absmax(qabsmax: Any, absmax2: Any, offset: Any, *, mode: str = "two_round", out: Any = None) -> Any:
    """The float32 absmax of each 4-bit block from bitsandbytes' nested statistics, on the device."""
    return launch_abi(
        NESTED_ABSMAX, "bnb/nested.hip", "qk_nested_absmax", (qabsmax, absmax2, offset), {"mode": mode}, out
    )

"""Launchers of nf4_quantize and fp4_quantize: the kernels ``bnb/quantize.hip`` take the ops' declared
ABI (``qconform abi nf4_quantize``); the oracles' call shape on CuPy arrays. ``variant`` picks the
reading (a ``cupy`` implementation passes its contract's): "cpu" (the default contract, bitsandbytes'
CPU backend: bit-identical to ``qconform.ops.bnb.quantize.nf4_quantize(..., ftz=True)``) or "cuda"
(``--contract variant=cuda``: csrc/kernels.cu's decision trees with the exact IEEE reciprocal, the
oracle's ``variant="cuda"`` without a reciprocal table); other variants are declined."""

from __future__ import annotations

from typing import Any

from qconform.device.launchers import launch_abi
from qconform.errors import Declined
from qconform.ops.bnb.quantize import FP4_QUANTIZE, NF4_QUANTIZE

SOURCE = "bnb/quantize.hip"
READINGS = {"cpu": "", "cuda": "_cuda"}  # variant -> symbol suffix


def _symbol(quant_type: str, variant: str) -> str:
    if variant not in READINGS:
        raise Declined(f"variant: the device quantize kernels read {', '.join(READINGS)}; not {variant!r}")
    return f"qk_{quant_type}_quantize{READINGS[variant]}"


def nf4_quantize(A: Any, blocksize: int = 64, *, variant: str = "cpu", out: Any = None) -> Any:
    """NF4 ``quantize_4bit(A, blocksize)`` on the device: uint8 absmax bytes then packed codes."""
    return launch_abi(NF4_QUANTIZE, SOURCE, _symbol("nf4", variant), (A, blocksize), {}, out)


def fp4_quantize(A: Any, blocksize: int = 64, *, variant: str = "cpu", out: Any = None) -> Any:
    """FP4 ``quantize_4bit(A, blocksize)`` on the device: uint8 absmax bytes then packed codes."""
    return launch_abi(FP4_QUANTIZE, SOURCE, _symbol("fp4", variant), (A, blocksize), {}, out)

"""Launchers of nf4_decode and fp4_decode: the kernels ``bnb/decode.hip`` take the ops' declared ABI
(``qconform abi nf4_decode``); the oracles' call shape on CuPy arrays, bit-identical to
``qconform.ops.bnb.decode.nf4_decode(..., ftz=True)`` (and fp4) in the default reading (variant cpu)."""

from __future__ import annotations

from typing import Any

from qconform.device.launchers import launch_abi
from qconform.ops.bnb.decode import FP4_DECODE, NF4_DECODE


def nf4_decode(
    packed: Any, absmax: Any, *, rows: int, cols: int, blocksize: int, dtype: str = "float32", out: Any = None
) -> Any:
    """NF4 ``dequantize_4bit`` of a (rows, cols) weight to ``dtype`` on the device."""
    kwargs = {"rows": rows, "cols": cols, "blocksize": blocksize, "dtype": dtype}
    return launch_abi(NF4_DECODE, "bnb/decode.hip", "qk_nf4_decode", (packed, absmax), kwargs, out)


def fp4_decode(
    packed: Any, absmax: Any, *, rows: int, cols: int, blocksize: int, dtype: str = "float32", out: Any = None
) -> Any:
    """FP4 ``dequantize_4bit`` of a (rows, cols) weight to ``dtype`` on the device."""
    kwargs = {"rows": rows, "cols": cols, "blocksize": blocksize, "dtype": dtype}
    return launch_abi(FP4_DECODE, "bnb/decode.hip", "qk_fp4_decode", (packed, absmax), kwargs, out)

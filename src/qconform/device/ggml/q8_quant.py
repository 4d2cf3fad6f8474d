"""Launchers of the ggml family's Q8_K / Q8_0 kernels (``kernels/ggml/q8_quant.hip``): validate,
launch on the caller's stream, check that launch's own status (``qconform.device.launch``).

``quantize(x, qtype, out=None, variant=None, stream=None)`` and ``dequantize(...)`` take and return
CuPy arrays with the oracle's call shape and rules (``qconform.oracles.ggml``); every rule is
checked before any launch and a broken one raises ``qconform.ArgumentError`` with nothing written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cupy
import numpy as np

from qconform.device.launch import CUPY, check_aligned, launch_kernel
from qconform.device.loader import get_kernel
from qconform.device.registry import Geometry, check_grid, kernel_for
from qconform.errors import ArgumentError
from qconform.oracles.ggml import check_dequantize_args, check_quantize_args, resolve_qtype


def launch_abi(
    op: str,
    kernel: Any,
    geometry: Geometry,
    src: Any,
    out: Any,
    n_blocks: int,
    stream: Any = None,
) -> None:
    """Launch ``kernel(in, out, n_blocks)`` with the ABI's grid rule on ``stream`` (default: the
    current one). A failed launch raises DeviceError naming ``op``; zero blocks launch nothing."""
    if n_blocks == 0:
        return
    grid = check_grid(op, n_blocks, geometry)
    launch_kernel(op, kernel, grid, geometry.threads, (src, out, np.int64(n_blocks)), stream)


@dataclass(frozen=True)
class AbiCall:
    """An op's arguments bound to the launch ABI: ``in`` pointer, output shape and dtype, blocks."""

    src: Any
    shape: tuple[int, ...]
    dtype: np.dtype
    n_blocks: int


def bind(op: str, inputs: dict[str, Any], params: dict[str, Any], out: Any = None) -> AbiCall:
    """Check every rule of ``op`` on CuPy arguments (ArgumentError, nothing launched) and bind
    them to the ABI."""
    qtype = resolve_qtype(params.get("qtype"))
    if op.rsplit("_", 1)[0] != qtype.name.lower():
        raise ArgumentError(f"qtype: {op} takes {op.rsplit('_', 1)[0].upper()}, got {qtype.name}")
    if op.endswith("_dequant"):
        fmt, shape = check_dequantize_args(inputs["data"], params["qtype"], out, CUPY)
        check_aligned("data", inputs["data"], 4)
        check_aligned("out", out, 16)
        return AbiCall(inputs["data"], shape, np.dtype(np.float32), inputs["data"].size // fmt.type_size)
    if op.endswith("_quant"):
        fmt, shape = check_quantize_args(inputs["x"], params["qtype"], out, CUPY)
        check_aligned("x", inputs["x"], 16)
        return AbiCall(inputs["x"], shape, np.dtype(np.uint8), inputs["x"].size // fmt.block_size)
    raise ArgumentError(f"op: {op!r} has no device launch ABI")


def run_kernel(op: str, kernel: Any, geometry: Geometry, call: AbiCall, out: Any = None, stream: Any = None) -> Any:
    """Launch a bound call into ``out`` (allocated when None) and return it."""
    result = cupy.empty(call.shape, call.dtype) if out is None else out
    launch_abi(op, kernel, geometry, call.src, result, call.n_blocks, stream)
    return result


def run_op(
    op: str,
    inputs: dict[str, Any],
    params: dict[str, Any],
    out: Any = None,
    *,
    variant: str | None = None,
    stream: Any = None,
) -> Any:
    """Run ``op`` with qconform's own kernel for ``variant``."""
    call = bind(op, inputs, params, out)
    spec = kernel_for(op, variant)
    return run_kernel(op, get_kernel(spec.path, spec.symbol), spec.geometry, call, out, stream)


def quantize(x: Any, qtype: object, *, out: Any = None, variant: str | None = None, stream: Any = None) -> Any:
    """float32 rows (CuPy) -> ggml block bytes, byte-identical to ``oracles.ggml.quantize(..., ftz=True)``."""
    fmt = resolve_qtype(qtype)
    return run_op(f"{fmt.name.lower()}_quant", {"x": x}, {"qtype": fmt.name}, out, variant=variant, stream=stream)


def dequantize(data: Any, qtype: object, *, out: Any = None, variant: str | None = None, stream: Any = None) -> Any:
    """ggml block bytes (CuPy) -> float32, bit-identical to ``oracles.ggml.dequantize(..., ftz=True)``."""
    fmt = resolve_qtype(qtype)
    return run_op(
        f"{fmt.name.lower()}_dequant", {"data": data}, {"qtype": fmt.name}, out, variant=variant, stream=stream
    )

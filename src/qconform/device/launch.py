"""Launch one kernel through CuPy (the driver API) on a stream and check that launch's own status.
Launchers never read or clear the runtime's last-error slot (CuPy's launches do not touch it:
docs/device-tooling.md C2), so a caller's pending error stays the caller's."""

from __future__ import annotations

from typing import Any

import cupy

from qconform.errors import ArgumentError, DeviceError
from qconform.oracles.ggml import ArrayKind

CUPY = ArrayKind(cupy.ndarray, "cupy.ndarray", cupy.may_share_memory)


RECORDING: list[list[tuple[Any, tuple[int, ...], int, int, tuple]]] = []
"""Launches recorded instead of run while ``qconform.device.launchers.bound`` binds a call."""


def launch_kernel(
    op: str,
    kernel: Any,
    grid: int | tuple[int, ...],
    threads: int,
    args: tuple,
    stream: Any = None,
    shared_mem: int = 0,
) -> None:
    """One launch on ``stream`` (default: the current one) of ``grid`` CTAs (an int, or (x, y[, z]));
    CuPy's status for this launch, if it failed, becomes a DeviceError naming ``op``. The runtime's
    last-error slot is not touched."""
    if RECORDING:
        RECORDING[-1].append((kernel, grid_dims(grid), threads, shared_mem, args))
        return
    stream = cupy.cuda.get_current_stream() if stream is None else stream
    try:
        with stream:
            kernel(grid_dims(grid), (threads,), args, shared_mem=shared_mem)
    except cupy.cuda.driver.CUDADriverError as exc:
        raise DeviceError(f"{op}: launching {kernel.name}<<<{grid}, {threads}>>> failed: {exc}") from exc


def grid_dims(grid: int | tuple[int, ...]) -> tuple[int, ...]:
    """A launch's grid as CuPy takes it: ``(x,)`` for an int."""
    return grid if isinstance(grid, tuple) else (grid,)


def check_aligned(name: str, a: Any, align: int) -> None:
    """The kernels read and write float4 / 32-bit words: a misaligned view would fault."""
    if a is not None and a.size and a.data.ptr % align:
        raise ArgumentError(f"{name}: device address must be {align}-byte aligned, got 0x{a.data.ptr:x}")

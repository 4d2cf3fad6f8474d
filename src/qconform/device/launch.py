"""Launch one kernel through CuPy (the driver API; ``qconform.device.pdl`` for a dependent launch) on a
stream and check that launch's own status; record launches instead (``record``) and replay them.
Launchers never read or clear the runtime's last-error slot (CuPy's launches do not touch it:
docs/device-tooling.md C2), so a caller's pending error stays the caller's."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, NamedTuple

import cupy

from qconform.device import pdl
from qconform.errors import ArgumentError, DeviceError
from qconform.oracles.ggml import ArrayKind

CUPY = ArrayKind(cupy.ndarray, "cupy.ndarray", cupy.may_share_memory)


DEPENDENT_LAUNCHES = True
"""Launch kernels marked ``dependent`` as programmatic dependents of the kernel before them where the
device allows it (``qconform.device.pdl``); False: every launch in stream order (the bench's control)."""


@contextlib.contextmanager
def stream_order() -> Iterator[None]:
    """Inside the block every launch, recorded ones replayed included, waits for the kernel before it
    (``DEPENDENT_LAUNCHES`` off): the control a benchmark times a dependent launch against."""
    global DEPENDENT_LAUNCHES
    saved, DEPENDENT_LAUNCHES = DEPENDENT_LAUNCHES, False
    try:
        yield
    finally:
        DEPENDENT_LAUNCHES = saved


class Recorded(NamedTuple):
    """One launch recorded instead of run (``RECORDING``), replayable with ``run``."""

    kernel: Any
    grid: tuple[int, ...]
    threads: int
    shared_mem: int
    args: tuple
    dependent: bool = False

    def run(self) -> None:
        _launch(self.kernel, self.grid, self.threads, self.args, cupy.cuda.get_current_stream(), self.shared_mem,
                self.dependent)


RECORDING: list[list[Recorded]] = []
"""Launches recorded instead of run while ``qconform.device.launchers.bound`` binds a call."""


def record(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[list[Recorded], Any]:
    """The launches one call of ``fn`` makes, in order, recorded instead of run (so its output
    buffers are never written), and what it returned."""
    RECORDING.append([])
    try:
        result = fn(*args, **kwargs)
    finally:
        launches = RECORDING.pop()
    return launches, result


def replay(launches: list[Recorded]) -> None:
    """Run recorded launches again, in order, on the current stream."""
    for recorded in launches:
        recorded.run()


def launch_kernel(
    op: str,
    kernel: Any,
    grid: int | tuple[int, ...],
    threads: int,
    args: tuple,
    stream: Any = None,
    shared_mem: int = 0,
    dependent: bool = False,
) -> None:
    """One launch on ``stream`` (default: the current one) of ``grid`` CTAs (an int, or (x, y[, z]));
    CuPy's status for this launch, if it failed, becomes a DeviceError naming ``op``. The runtime's
    last-error slot is not touched. ``dependent``: the kernel waits for the kernel before it with
    ``QK_WAIT_PRIOR_GRID()`` and may be launched to overlap it (``qconform.device.pdl``)."""
    if RECORDING:
        RECORDING[-1].append(Recorded(kernel, grid_dims(grid), threads, shared_mem, args, dependent))
        return
    stream = cupy.cuda.get_current_stream() if stream is None else stream
    try:
        _launch(kernel, grid_dims(grid), threads, args, stream, shared_mem, dependent)
    except cupy.cuda.driver.CUDADriverError as exc:
        raise DeviceError(f"{op}: launching {kernel.name}<<<{grid}, {threads}>>> failed: {exc}") from exc


def _launch(kernel: Any, grid: tuple[int, ...], threads: int, args: tuple, stream: Any, shared_mem: int,
            dependent: bool) -> None:
    if dependent and DEPENDENT_LAUNCHES and pdl.available():
        status = pdl.launch(kernel, grid, threads, args, shared_mem, stream)
        if status:
            raise cupy.cuda.driver.CUDADriverError(status)
        return
    with stream:
        kernel(grid, (threads,), args, shared_mem=shared_mem)


def grid_dims(grid: int | tuple[int, ...]) -> tuple[int, ...]:
    """A launch's grid as CuPy takes it: ``(x,)`` for an int."""
    return grid if isinstance(grid, tuple) else (grid,)


def check_aligned(name: str, a: Any, align: int) -> None:
    """The kernels read and write float4 / 32-bit words: a misaligned view would fault."""
    if a is not None and a.size and a.data.ptr % align:
        raise ArgumentError(f"{name}: device address must be {align}-byte aligned, got 0x{a.data.ptr:x}")

"""Programmatic dependent launch (Hopper and later, CUDA 12.0+): a kernel launched with the
``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`` attribute may start while the kernel before
it on the stream is still running, once every CTA of that kernel has run
``griddepcontrol.launch_dependents`` (``QK_LAUNCH_DEPENDENTS()`` in qk_portable.h) or exited. The
dependent kernel runs ``griddepcontrol.wait`` (``QK_WAIT_PRIOR_GRID()``) before it reads anything the
kernel before wrote or writes anything that kernel touches: the wait returns once that kernel has
finished and its writes are visible (CUDA Programming Guide, "Programmatic Dependent Launch and
Synchronization"; PTX ISA, ``griddepcontrol``). Only the one kernel before is overlapped: it was
itself launched in stream order, so everything earlier on the stream finished before it began.

CuPy's RawKernel call takes no launch attributes, so the launch goes through the driver's
``cuLaunchKernelEx`` (cuda.h: ``CUlaunchConfig``, ``CUlaunchAttribute``, attribute id 6) through
ctypes, with the kernel's ``CUfunction`` from CuPy (``RawKernel.kernel.ptr``). Where the driver lacks
the call, the device is older than compute capability 9.0, or the build is HIP, ``available()`` is
False and the launcher launches in stream order (the kernels' wait is then a no-op). CuPy is imported
where it is used, so the structures' layout is checked against cuda.h without a GPU
(tests/test_device_offline.py)."""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np

from qconform.device import driver

PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID


class _Attribute(ctypes.Structure):
    """CUlaunchAttribute: the id, 4 bytes of padding, a 64-byte value union (its first int here)."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int), ("rest", ctypes.c_char * 60)]


class _Config(ctypes.Structure):
    """CUlaunchConfig."""

    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared_mem", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_Attribute)),
        ("num_attrs", ctypes.c_uint),
    ]


@functools.cache  # looked up on every launch
def _launcher() -> Any:
    """The driver's cuLaunchKernelEx, or None where the library or the call is missing."""
    params = ctypes.POINTER(ctypes.c_void_p)
    return driver.function("cuLaunchKernelEx", (ctypes.POINTER(_Config), ctypes.c_void_p, params, ctypes.c_void_p))


@functools.cache
def _device_ok(device: int) -> bool:
    import cupy

    return cupy.cuda.runtime.getDeviceProperties(device)["major"] >= 9


def available() -> bool:
    """True where a dependent launch can overlap: CUDA (not HIP), compute capability 9.0 or later,
    a driver with cuLaunchKernelEx."""
    import cupy

    return not cupy.cuda.runtime.is_hip and _launcher() is not None and _device_ok(cupy.cuda.Device().id)


def _argument(value: Any) -> Any:
    """A kernel argument's bytes as the driver reads them (kernelParams points at each)."""
    import cupy

    if isinstance(value, cupy.ndarray):
        return ctypes.c_uint64(value.data.ptr)
    if isinstance(value, (np.generic, np.ndarray)):  # scalars and by-value structs (tensor maps)
        return np.ascontiguousarray(value)
    raise TypeError(f"dependent launch: argument of type {type(value).__name__} (numpy scalars and cupy arrays only)")


def launch(kernel: Any, grid: tuple[int, ...], threads: int, args: tuple, shared_mem: int, stream: Any) -> int:
    """``kernel`` (a CuPy RawKernel or Function) on ``stream`` as a programmatic dependent of the kernel before it;
    the driver's status (0: launched)."""
    held = [_argument(a) for a in args]  # alive until the call returns: the driver copies the values
    params = (ctypes.c_void_p * max(len(held), 1))(
        *[h.ctypes.data if isinstance(h, np.ndarray) else ctypes.addressof(h) for h in held]
    )
    attr = _Attribute(id=PROGRAMMATIC_STREAM_SERIALIZATION, value=1)
    dims = (tuple(grid) + (1, 1))[:3]
    config = _Config((ctypes.c_uint * 3)(*dims), (ctypes.c_uint * 3)(threads, 1, 1), shared_mem, stream.ptr,
                     ctypes.pointer(attr), 1)
    function = getattr(kernel, "kernel", kernel)  # a RawKernel's compiled Function on this device (its CUfunction)
    return int(_launcher()(ctypes.byref(config), function.ptr, params, None))

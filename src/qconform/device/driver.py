"""CUDA driver API functions that CuPy does not wrap, called through ctypes from ``libcuda.so.1``
(the tensor maps' ``cuTensorMapEncodeTiled``, the dependent launch's ``cuLaunchKernelEx``)."""

from __future__ import annotations

import ctypes
import functools
from typing import Any


@functools.cache
def function(name: str, argtypes: tuple[Any, ...]) -> Any:
    """The driver's ``name`` returning a CUresult (int), with ``argtypes``; None where the driver
    library or the function is missing (no NVIDIA driver, an older one)."""
    try:
        fn = getattr(ctypes.CDLL("libcuda.so.1"), name)
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = list(argtypes)
    return fn

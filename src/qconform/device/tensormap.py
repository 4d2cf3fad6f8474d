"""CUDA tensor maps, the descriptors of Hopper's tensor copies (``cp.async.bulk.tensor``), made on the
host by the driver API's ``cuTensorMapEncodeTiled`` (cuda.h, CUDA 12.0 and later; the enum values
below are cuda.h's) through ctypes, and returned as a one-element numpy array of the 128 bytes, which
CuPy passes by value as a kernel's ``QkTensorMap`` parameter (``__grid_constant__``)."""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np

from qconform.device import driver

TENSOR_MAP = np.dtype({"names": ["opaque"], "formats": [(np.uint64, 16)], "itemsize": 128})
UINT8, FLOAT16 = 0, 6  # CUtensorMapDataType
SWIZZLE_NONE, SWIZZLE_128B = 0, 3  # CUtensorMapSwizzle
_INTERLEAVE_NONE, _L2_PROMOTION_256B, _OOB_FILL_ZEROS = 0, 3, 0


@functools.cache  # looked up for every map
def _encoder() -> Any:
    """The driver's cuTensorMapEncodeTiled, or None where the driver library or the call is missing."""
    u64p, u32p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
    return driver.function("cuTensorMapEncodeTiled", (ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                           u64p, u64p, u32p, u32p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int))


def tiled_2d(ptr: int, dtype: int, dims: tuple[int, int], row_stride: int, box: tuple[int, int],
             swizzle: int) -> np.ndarray | None:
    """The map of a row-major 2-D tensor at device address ``ptr``: ``dims`` = (elements a row, rows),
    ``row_stride`` bytes between rows, boxes of ``box`` = (elements, rows) copied with ``swizzle``,
    elements outside the tensor read as zeros; None where the driver lacks the call or refuses the map
    (cuda.h: ptr 16-byte aligned, row_stride a multiple of 16, each box side at most 256)."""
    encode = _encoder()
    if encode is None:
        return None
    buf = ctypes.create_string_buffer(2 * TENSOR_MAP.itemsize)  # the map is written 128-byte aligned
    addr = (ctypes.addressof(buf) + 127) & ~127
    rc = encode(addr, dtype, 2, ptr, (ctypes.c_uint64 * 2)(*dims), (ctypes.c_uint64 * 1)(row_stride),
                (ctypes.c_uint32 * 2)(*box), (ctypes.c_uint32 * 2)(1, 1), _INTERLEAVE_NONE, swizzle,
                _L2_PROMOTION_256B, _OOB_FILL_ZEROS)
    if rc != 0:
        return None
    out = np.zeros(1, TENSOR_MAP)
    ctypes.memmove(out.ctypes.data, addr, TENSOR_MAP.itemsize)
    return out

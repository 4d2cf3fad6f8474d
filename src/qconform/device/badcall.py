"""``python -m qconform.device.badcall LIB SYMBOL``: call a ``so:`` launcher once with
``n_blocks = -1`` (valid 4 KiB buffers, the current stream), synchronize, print its status.
Run in a subprocess by the pending-error property, so a launcher that faults cannot poison the
suite's own device context."""

from __future__ import annotations

import ctypes
import sys

import cupy


def main(path: str, symbol: str) -> int:
    cupy.cuda.Device().use()
    fn = getattr(ctypes.CDLL(path), symbol)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    src = cupy.zeros(4096, cupy.uint8)
    out = cupy.zeros(4096, cupy.uint8)
    status = fn(src.data.ptr, out.data.ptr, -1, cupy.cuda.get_current_stream().ptr)
    cupy.cuda.get_current_stream().synchronize()
    print(status)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))

"""``python -m qconform.device.badcall LIB SYMBOL OP``: call a ``so:`` launcher once with the op's
declared ABI (``qconform.ops.abi``), every pointer a valid 4 KiB device buffer, the first size
argument -1 and the others 0, synchronize, print its status. Run in a subprocess by the
pending-error property, so a launcher that faults cannot poison the suite's own device context."""

from __future__ import annotations

import ctypes
import sys

import cupy


def main(path: str, symbol: str, op_name: str) -> int:
    from qconform.device.abi import c_argtypes
    from qconform.ops import get_op

    abi = get_op(op_name).abi
    cupy.cuda.Device().use()
    fn = getattr(ctypes.CDLL(path), symbol)
    fn.argtypes = c_argtypes(abi)
    fn.restype = ctypes.c_int
    buffers = [cupy.zeros(4096, cupy.uint8) for _ in abi.pointers]
    first = next(a.name for a in abi.scalars if a.kind == "i64")
    scalars = [(-1 if a.name == first else 0) if a.kind == "i64" else 0.0 for a in abi.scalars]
    status = fn(*(b.data.ptr for b in buffers), *scalars, cupy.cuda.get_current_stream().ptr)
    cupy.cuda.get_current_stream().synchronize()
    print(status)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3]))

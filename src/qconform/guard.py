"""Guard regions: a tensor handed to an implementation sits inside a larger allocation whose
margins (``MARGIN`` bytes before and after) hold ``GUARD_BYTE``; after the call, a margin byte
that changed is a write outside the tensor, named by side and offset. Works on numpy and CuPy
arrays alike (``xp``): allocators round sizes up, so such writes neither fault nor show anywhere
else. MARGIN keeps the tensor as aligned as the allocation (256 bytes: CuPy's alignment).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from qconform.errors import OutOfBoundsWrite

MARGIN = 256
GUARD_BYTE = 0xC3


def guarded_empty(shape: tuple[int, ...], dtype: Any, xp: Any = np) -> tuple[Any, Any]:
    """(allocation, tensor view): the view C-contiguous, the margins filled with GUARD_BYTE."""
    n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    buf = xp.empty(n + 2 * MARGIN, xp.uint8)
    buf.fill(GUARD_BYTE)
    return buf, buf[MARGIN : MARGIN + n].view(dtype).reshape(shape)


def guarded_copy(a: Any, xp: Any = np) -> tuple[Any, Any]:
    """A C-contiguous copy of ``a`` inside a guarded allocation (``xp``: where it lives)."""
    buf, view = guarded_empty(a.shape, a.dtype, xp)
    view[...] = a if xp is np else xp.asarray(a)
    return buf, view


def guarded_inputs(arrays: dict[str, Any], xp: Any = np) -> dict[str, tuple[Any, Any]]:
    """Guarded copies (``xp``: where they live) of the C-contiguous arrays among ``arrays``; a
    strided one (a bad argument) and a 0-d one are left to be passed as they are."""
    return {
        k: guarded_copy(v, xp)
        for k, v in arrays.items()
        if isinstance(v, np.ndarray) and v.ndim and v.flags.c_contiguous
    }


def violation(buf: Any, view: Any, name: str) -> str | None:
    """What was written into the margins around ``view`` (None: nothing)."""
    n = view.nbytes
    head = np.asarray(_host(buf[:MARGIN]))
    tail = np.asarray(_host(buf[MARGIN + n :]))
    notes = []
    bad = np.flatnonzero(head != GUARD_BYTE)
    if bad.size:
        notes.append(f"{bad.size} bytes before the start of {name} (first at offset {int(bad[0]) - MARGIN})")
    bad = np.flatnonzero(tail != GUARD_BYTE)
    if bad.size:
        notes.append(f"{bad.size} bytes past the end of {name} (first at offset +{int(bad[0])} after its last byte)")
    return "wrote " + " and ".join(notes) if notes else None


def check(guards: dict[str, tuple[Any, Any]]) -> None:
    """Raise OutOfBoundsWrite naming every tensor whose margins changed."""
    found = [v for name, (buf, view) in guards.items() if (v := violation(buf, view, name)) is not None]
    if found:
        raise OutOfBoundsWrite("; ".join(found))


def _host(a: Any) -> Any:
    return a if isinstance(a, np.ndarray) else a.get()

"""Plant, peek at and clear a pending runtime error in the runtime library a launcher shares.

docs/device-tooling.md C: CuPy launches through the driver API and never reads the runtime's last-error
slot; on CUDA it links cudart statically, so a pending error can only be planted through the
``libcudart.so`` a user's ``--cudart shared`` library maps (or a hook the library exports), on ROCm
through ``libamdhip64.so``. ``cudaMalloc(NULL, 1)`` / ``hipMalloc(NULL, 1)`` fails with
invalid-value, a non-sticky error that stays pending until someone calls GetLastError. Sticky
faults are never planted here.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

RUNTIME_NAMES = ("libcudart.so", "libamdhip64.so")
HOOKS = ("qconform_plant_error", "qconform_peek_error", "qconform_clear_error")


@dataclass
class ErrorSlot:
    """One last-error slot: ``plant()`` returns the planted code (non-zero), ``peek()`` reads it
    without clearing, ``clear()`` returns and resets it, ``name(code)`` spells a code."""

    where: str
    plant: Callable[[], int]
    peek: Callable[[], int]
    clear: Callable[[], int]
    name: Callable[[int], str]


def mapped_runtimes(maps: str | None = None) -> list[str]:
    """Paths of the CUDA/HIP runtime libraries mapped into this process (``/proc/self/maps``, or
    the given text in its format), in the order they appear."""
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return []
    found = []
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        path = fields[5] if len(fields) == 6 else ""
        if os.path.basename(path).startswith(RUNTIME_NAMES) and path not in found:
            found.append(path)
    return found


def _runtime_slot(lib: ctypes.CDLL, where: str) -> ErrorSlot:
    hip = hasattr(lib, "hipMalloc")
    pre = "hip" if hip else "cuda"
    malloc, peek, get, name = (
        getattr(lib, pre + f) for f in ("Malloc", "PeekAtLastError", "GetLastError", "GetErrorName")
    )
    malloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    malloc.restype = peek.restype = get.restype = ctypes.c_int
    name.argtypes = [ctypes.c_int]
    name.restype = ctypes.c_char_p

    def spell(code: int) -> str:
        raw = name(code)
        return raw.decode() if raw else f"error {code}"

    return ErrorSlot(where, lambda: malloc(None, 1), peek, get, spell)


def _hook_slot(lib: ctypes.CDLL, where: str) -> ErrorSlot:
    plant, peek, clear = (getattr(lib, h) for h in HOOKS)
    for f in (plant, peek, clear):
        f.restype = ctypes.c_int
        f.argtypes = []
    return ErrorSlot(f"{where} (exported hooks)", plant, peek, clear, lambda code: f"error {code}")


def slot_for_library(lib: ctypes.CDLL, path: str) -> tuple[ErrorSlot | None, str]:
    """The slot a user's loaded library reports through: its exported ``qconform_*_error`` hooks,
    else the one shared runtime library mapped into the process. (None, why) when neither."""
    if all(hasattr(lib, h) for h in HOOKS):
        return _hook_slot(lib, path), ""
    runtimes = mapped_runtimes()
    if not runtimes:
        return None, (
            f"{path} maps no shared CUDA/HIP runtime (static cudart?) and exports no {', '.join(HOOKS)} hooks: "
            "build it with nvcc --cudart shared, or export the hooks"
        )
    # glibc returns the already-loaded object for a path with the same file identity
    return _runtime_slot(ctypes.CDLL(runtimes[0]), runtimes[0]), ""


def _candidates(is_hip: bool) -> list[str]:
    if is_hip:
        rocm = os.environ.get("ROCM_PATH", "/opt/rocm")
        return ["libamdhip64.so", f"{rocm}/lib/libamdhip64.so"]
    names = ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
    dirs = [os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"]
    paths = [f"{d}/lib64/{n}" for d in dirs if d for n in names]
    for site in sys.path:
        for sub in ("nvidia/cu13/lib", "nvidia/cuda_runtime/lib"):
            paths += [str(p) for p in sorted(Path(site, sub).glob("libcudart.so*"))] if Path(site, sub).is_dir() else []
    return [*mapped_runtimes(), *names, *paths]


def process_slot(is_hip: bool) -> tuple[ErrorSlot | None, str]:
    """A shared runtime library's slot for this process (what a ``--cudart shared`` library or any
    HIP code sees). On CUDA, CuPy's own launches use a private static runtime and never see it."""
    tried = []
    for cand in _candidates(is_hip):
        try:
            return _runtime_slot(ctypes.CDLL(cand), cand), ""
        except (OSError, AttributeError) as exc:
            tried.append(f"{cand}: {exc}")
    return None, "no shared runtime library could be loaded (" + "; ".join(tried[:4]) + ")"

"""What every family's function launchers share: checks of device arrays, the ``out`` buffer,
one launch per kernel (recorded instead by ``bound`` for timing), extra compile options and
overriding kernel sources (the device mutants and the bench's diagnostic builds: patched copies of
a shipped kernel, qconform.device.patch).

Every rule is checked before any launch by the oracles' own validators, run on host stand-ins
of the device arrays (``qconform.device.abi.shadow``), plus C-contiguity of every device array
and the ``out`` buffer (``qconform.device.abi.out_buffer``).
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import cupy

from qconform.device.abi import bind_call
from qconform.device.launch import launch_kernel, record, replay
from qconform.device.loader import get_kernel
from qconform.device.registry import KERNEL_DIR, Geometry, Launch, check_grid
from qconform.errors import ArgumentError
from qconform.ops import OpSpec

THREADS = 256


def contiguous(**arrays: Any) -> None:
    """Every given array (None for an absent optional input) is a C-contiguous CuPy array: a
    kernel takes its pointer, so a host array here would be read as a device address."""
    for name, a in arrays.items():
        if a is None:
            continue
        if not isinstance(a, cupy.ndarray):
            raise ArgumentError(f"{name}: must be a cupy.ndarray, got {type(a).__name__}")
        if not a.flags.c_contiguous:
            raise ArgumentError(f"{name}: must be C-contiguous")


OPTIONS: tuple[str, ...] = ()  # extra compile options, set through compile_options()
OVERRIDES: dict[str, Path] = {}  # kernels/<family>/<name> -> the file loaded instead, set through source_override()


@contextlib.contextmanager
def compile_options(*options: str) -> Iterator[None]:
    """Build and launch this module's kernels with extra compile options inside the block (build
    options such as ``-DQK_MMA_DEFAULT_ONLY`` and ``-DQK_MMA_EMULATE``: the device controls, faster
    mutant and diagnostic builds), added to those of an enclosing block: a bench helper's own
    ``compile_options()`` keeps a caller's build options instead of dropping them."""
    global OPTIONS
    saved, OPTIONS = OPTIONS, OPTIONS + tuple(o for o in options if o not in OPTIONS)
    try:
        yield
    finally:
        OPTIONS = saved


@contextlib.contextmanager
def source_override(sources: Mapping[str, Path]) -> Iterator[None]:
    """Inside the block, load ``kernels/<family>/<name>`` from ``sources["<family>/<name>"]``
    instead, e.g. ``source_override({"ort/nbits_mma.hip": path})`` with a patched copy written by
    ``qconform.device.patch.Patch`` (its folder holds copies of the headers beside the original).
    Kernels are cached per path, so a path must name one text for the process."""
    global OVERRIDES
    for name in sources:
        if not (KERNEL_DIR / name).is_file():
            raise ArgumentError(f"source_override: no kernel {name!r} in {KERNEL_DIR}")
    saved, OVERRIDES = OVERRIDES, {**OVERRIDES, **{name: Path(path) for name, path in sources.items()}}
    try:
        yield
    finally:
        OVERRIDES = saved


def launch(op: str, source: str, symbol: str, n_threads: int, args: tuple) -> None:
    """One thread per element: ceil(n_threads / THREADS) CTAs of THREADS."""
    if n_threads == 0:
        return
    launch_grid(op, source, symbol, check_grid(op, n_threads, Geometry(1, THREADS)), THREADS, args)


def launch_grid(
    op: str,
    source: str,
    symbol: str,
    grid: int | tuple[int, ...],
    threads: int,
    args: tuple,
    shared_mem: int = 0,
    options: tuple[str, ...] = (),
    dependent: bool = False,
) -> None:
    launch_kernel(op, kernel_of(source, symbol, options), grid, threads, args, shared_mem=shared_mem,
                  dependent=dependent)


def kernel_of(source: str, symbol: str, options: tuple[str, ...] = ()) -> Any:
    """``symbol`` of ``kernels/<source>`` (``"ort/nbits_mma.hip"``, or its override), built with the
    current extra options and ``options`` (a source's own, e.g. ``loader.arch_specific_options()``)."""
    return get_kernel(OVERRIDES.get(source, KERNEL_DIR / source), symbol, OPTIONS + options)


def bound(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[[], None]:
    """Check and bind one call of a launcher once; the returned function replays its kernel
    launches with nothing else on the host path (for timing: the checks cost more host time than
    a decode GEMV takes on the device)."""
    return functools.partial(replay, record(fn, *args, **kwargs)[0])


@functools.cache
def device_attributes(device: int) -> dict[str, int]:
    """CuPy's ``Device(device).attributes`` (a runtime query per attribute), read once per device:
    the launchers consult them on every call."""
    return dict(cupy.cuda.Device(device).attributes)


@functools.cache
def allow_smem(kernel: Any, n: int) -> bool:
    """Let ``kernel`` take ``n`` bytes of dynamic shared memory (above the 48 KiB default); False where
    the device refuses (beyond its per-CTA limit, counting the kernel's static shared memory) or the
    runtime lacks the attribute."""
    try:
        kernel.max_dynamic_shared_size_bytes = n
    except Exception:
        return False
    return True


_TICKETS: dict[tuple[int, int, int], Any] = {}  # (device, stream, id of the kernel) -> tickets (kernels live on)


def tickets(n: int, kernel: Any) -> Any:
    """``n`` zeroed uint32 tickets of ``kernel``'s cross-CTA counts (GQA's folded combine, the keep-quant
    call in one launch) for the current device and stream (the CTA that takes the last ticket returns it
    to zero, so they are zero between calls; one buffer per stream, so calls on two streams never share
    one, and per kernel build, so a build that leaves them set, such as a device mutant, spoils no other
    build's calls), grown as needed."""
    stream = cupy.cuda.get_current_stream()
    key = (cupy.cuda.Device().id, stream.ptr, id(kernel))
    buf = _TICKETS.get(key)
    if buf is None or buf.size < n:
        buf = cupy.zeros(max(n, 1024), cupy.uint32)
        _TICKETS[key] = buf
    return buf


def sm_count() -> int:
    return int(device_attributes(cupy.cuda.Device().id)["MultiProcessorCount"])


def smem_limits() -> tuple[int, int]:
    """(shared memory one CTA may use, shared memory per SM) of the current device (its attributes
    read once: ``device_attributes``)."""
    attrs = device_attributes(cupy.cuda.Device().id)
    per_cta = attrs.get("MaxSharedMemoryPerBlockOptin", 0) or attrs["MaxSharedMemoryPerBlock"]
    return int(per_cta), int(attrs.get("MaxSharedMemoryPerMultiprocessor", per_cta))


def launch_abi(op: OpSpec, source: str, symbol: str, args: tuple, kwargs: dict[str, Any], out: Any = None) -> Any:
    """One call of ``op`` (the oracle's call shape on CuPy arrays) through our kernel ``symbol``,
    which takes the op's declared ABI (``qconform abi OP``): bound and checked by the same code as
    a user's ``hip:`` kernel, launched with the op's default geometry (recorded by ``bound``)."""
    call = bind_call(op, args, kwargs, out)
    if call.bound.work:
        grid, threads = Launch().shape(op.abi, call.bound.work)
        launch_grid(op.name, source, symbol, grid, threads, call.kernel_args())
    return call.out

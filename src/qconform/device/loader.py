"""Compile kernel sources with CuPy RawModule and describe the device.

NVRTC on NVIDIA, hiprtc on ROCm (CuPy maps ``backend="nvrtc"`` to hiprtc). Modules are cached per
(source hash, options, arch); the hash covers the source, every header in ``kernels/`` and the
headers beside the source, so an edited include recompiles. CuPy adds ``-ftz=true`` (NVIDIA) or
``-fcuda-flush-denormals-to-zero`` (HIP) and it cannot be undone (docs/device-tooling.md A1, 0.5): the
kernels flush explicitly and are compared with the oracles' ``ftz=True``.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cupy

from qconform.device.registry import COMMON_DIR, KERNEL_DIR
from qconform.errors import ArgumentError, CompileError, DeviceError

_MODULES: dict[tuple[str, tuple[str, ...], str], Any] = {}


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    arch: str  # sm_90, gfx90a, gfx1100
    warp_size: int
    sm_count: int
    l2_bytes: int
    is_hip: bool
    runtime: str

    @property
    def label(self) -> str:
        """The report's Arch column: ``sm_90/w32``."""
        return f"{self.arch}/w{self.warp_size}"


@functools.lru_cache(maxsize=None)
def device_info(device: int | None = None) -> DeviceInfo:
    rt = cupy.cuda.runtime
    dev = cupy.cuda.Device().id if device is None else device
    props = rt.getDeviceProperties(dev)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    if rt.is_hip:
        gcn = props.get("gcnArchName", b"")
        arch = (gcn.decode() if isinstance(gcn, bytes) else str(gcn)).split(":")[0] or "gfx?"
    else:
        arch = f"sm_{props['major']}{props['minor']}"
    runtime = (
        f"cupy {cupy.__version__}, {'HIP' if rt.is_hip else 'CUDA'} runtime {rt.runtimeGetVersion()}, "
        f"driver {rt.driverGetVersion()}"
    )
    return DeviceInfo(
        name,
        arch,
        int(props["warpSize"]),
        int(props["multiProcessorCount"]),
        int(props["l2CacheSize"]),
        rt.is_hip,
        runtime,
    )


def arch_specific_options() -> tuple[str, ...]:
    """NVRTC options that let a source use the device's architecture-specific instructions: on an
    sm_90 device ``-arch=sm_90a`` (wgmma; the source tests ``__CUDA_ARCH_FEAT_SM90_ALL``), elsewhere
    none. Measured on the H200 with CuPy 14.2: NVRTC builds the sm_90a features with this option
    beside CuPy's own ``-arch`` (docs/perf-notes.md, session 23); a launcher still asks the built module
    whether they are in (the module's ``qk_nbits_wgmma_built``) before it takes such a kernel."""
    info = device_info()
    return ("-arch=sm_90a",) if not info.is_hip and info.arch == "sm_90" else ()


def _dependencies(source: Path) -> list[Path]:
    """What a source may include: every shipped header and kernel source (``kernels/common``,
    ``kernels/<family>/``: a test source may include a shipped one) and the files beside it."""
    shipped = {*KERNEL_DIR.glob("*/*.h"), *KERNEL_DIR.glob("*/*.hip")}
    return sorted({*shipped, *source.parent.glob("*.h"), *source.parent.glob("*.hip")})


def source_hash(source: Path, code: str) -> str:
    h = hashlib.sha256(code.encode())
    for path in _dependencies(source):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def load_module(source: Path, options: tuple[str, ...] = ()) -> Any:
    """A RawModule for ``source`` (a .hip/.cu file); on the include path: ``kernels/common``
    (``qk_portable.h``, ``qconform_abi.h``), ``kernels/`` (``"ggml/q8_quant.hip"``) and its own folder."""
    source = Path(source).resolve()
    if not source.is_file():
        raise ArgumentError(f"source: no such kernel file {str(source)!r}")
    code = source.read_text()
    opts = (f"-I{COMMON_DIR}", f"-I{KERNEL_DIR}", f"-I{source.parent}", *options)
    key = (source_hash(source, code), opts, device_info().arch)
    if key not in _MODULES:
        module = cupy.RawModule(code=code, options=opts)
        _MODULES[key] = module
    return _MODULES[key]


_KERNELS: dict[tuple[str, str, tuple[str, ...]], Any] = {}


def get_kernel(source: Path, symbol: str, options: tuple[str, ...] = ()) -> Any:
    """The ``extern "C"`` kernel ``symbol`` of ``source``, compiled on first use and then kept for
    the process (a launch path must not re-read and re-hash the sources). A compile error is a
    CompileError (a DeviceError) carrying the compiler's log; a missing symbol a DeviceError."""
    key = (str(source), symbol, options)
    if key not in _KERNELS:
        _KERNELS[key] = _compile_kernel(source, symbol, options)
    return _KERNELS[key]


def _compile_kernel(source: Path, symbol: str, options: tuple[str, ...]) -> Any:
    module = load_module(source, options)
    try:
        return module.get_function(symbol)
    except cupy.cuda.compiler.CompileException as exc:
        raise CompileError(f"compiling {source.name} failed:\n{exc.get_message()}") from exc
    except cupy.cuda.driver.CUDADriverError as exc:
        raise DeviceError(f'{source.name} has no kernel {symbol!r} (extern "C" __global__?): {exc}') from exc

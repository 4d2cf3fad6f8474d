"""Build a ``so:`` launcher library from a CUDA/HIP source, with ``kernels/`` and
``kernels/common`` on the include path.

NVIDIA: ``nvcc --cudart shared`` so the library shares the process's one ``libcudart.so`` (the
pending-error property plants its error there; a static cudart would give the library a private
slot: docs/device-tooling.md C2). AMD: ``hipcc`` (every HIP library shares ``libamdhip64.so``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from qconform.device.registry import COMMON_DIR, KERNEL_DIR
from qconform.errors import ArgumentError


def build_command(source: Path, output: Path, *, vendor: str, arch: str) -> list[str]:
    """The compiler command for ``vendor`` ``"nvidia"`` (arch ``sm_90``) or ``"amd"`` (``gfx90a``)."""
    include = (f"-I{KERNEL_DIR}", f"-I{COMMON_DIR}")
    if vendor == "nvidia":
        nvcc = shutil.which("nvcc")
        rpath = Path(nvcc).resolve().parent.parent / "lib64" if nvcc else None  # find libcudart.so at run time
        return [
            "nvcc",
            *([f"-Xlinker=-rpath={rpath}"] if rpath else []),
            "--cudart",
            "shared",
            "-shared",
            "-Xcompiler",
            "-fPIC",
            f"-arch={arch}",
            "-Werror",
            "all-warnings",
            *include,
            "-o",
            str(output),
            str(source),
        ]
    if vendor == "amd":
        return [
            "hipcc",
            "-shared",
            "-fPIC",
            f"--offload-arch={arch}",
            "-x",
            "hip",
            "-Werror",
            *include,
            "-o",
            str(output),
            str(source),
        ]
    raise ArgumentError(f"vendor: must be 'nvidia' or 'amd', got {vendor!r}")


def build_launcher(source: Path, output: Path, *, vendor: str, arch: str) -> Path:
    """Compile ``source`` into the shared library ``output``; a compiler error raises RuntimeError
    with its log."""
    cmd = build_command(Path(source), Path(output), vendor=vendor, arch=arch)
    if shutil.which(cmd[0]) is None:
        raise RuntimeError(f"{cmd[0]} is not on PATH")
    env = {**os.environ, "HIP_PLATFORM": "amd"} if vendor == "amd" else None
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout}{done.stderr}")
    return Path(output)

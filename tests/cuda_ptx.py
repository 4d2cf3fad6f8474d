"""The sm_90 PTX of a kernel source as the suite builds it (nvcc, -O0): what the CUDA build keeps of a
patch or a build option. A member of a class template or an inline function that no kernel calls is
not in it, nor a branch the preprocessor drops there (AMD, older CUDA, an option's other side). Used
by the offline checks that every device mutant and every bench-only build option changes the code
the device runs (tests/test_device_offline.py, tests/test_build_options.py)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, Iterable, TypeVar

from qconform.device.patch import Patch
from qconform.device.registry import COMMON_DIR, KERNEL_DIR

T = TypeVar("T")
R = TypeVar("R")

HAVE_NVCC = shutil.which("nvcc") is not None


def cuda_ptx(source: Path, defines: tuple[str, ...] = (), patch: Patch | None = None) -> str:
    """The PTX of ``source`` (``patch`` applied when given) for sm_90 (sm_90a where the file has
    sm_90a code) with ``-DQK_MMA_DEFAULT_ONLY`` and ``defines``, at -O0 (~1 s for nbits_mma.hip),
    the file-hashed names of internal functions made equal."""
    arch = "sm_90a" if "__CUDA_ARCH_FEAT_SM90_ALL" in source.read_text() else "sm_90"
    with (
        tempfile.TemporaryDirectory() as tmp,
        patch.materialised() if patch else contextlib.nullcontext(source) as path,
    ):
        ptx = Path(tmp) / "k.ptx"
        command = ["nvcc", "-ptx", f"-arch={arch}", "-Xcicc", "-O0", f"-I{KERNEL_DIR}", f"-I{COMMON_DIR}"]
        command += ["-DQK_MMA_DEFAULT_ONLY", *defines, "-x", "cu", "-o", str(ptx), str(path)]
        run = subprocess.run(command, capture_output=True, text=True)
        assert run.returncode == 0, f"nvcc {path} {' '.join(defines)}: {run.stderr[-2000:]}"
        return re.sub(r"_INTERNAL_[0-9a-f]{8}_", "_INTERNAL_", ptx.read_text())


def parallel_map(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``fn`` over ``items`` on as many threads as the host has cores (nvcc runs are processes)."""
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
        return list(pool.map(fn, items))

"""The sm_90 PTX of a kernel source as the suite builds it (nvcc, -O0): what the CUDA build keeps of a
patch or a build option. A member of a class template or an inline function that no kernel calls is
not in it, nor a branch the preprocessor drops there (AMD, older CUDA, an option's other side). Used
by the offline checks that every device mutant and every bench-only build option changes the code
the device runs (tests/test_device_offline.py, tests/test_build_options.py). ``emitted_lines`` reads
the same build's line table (``-lineinfo``): the lines of the source that code was emitted from."""

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


def _nvcc_ptx(path: Path, defines: tuple[str, ...], extra: tuple[str, ...] = ()) -> str:
    arch = "sm_90a" if "__CUDA_ARCH_FEAT_SM90_ALL" in path.read_text() else "sm_90"
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "k.ptx"
        command = ["nvcc", "-ptx", f"-arch={arch}", "-Xcicc", "-O0", *extra, f"-I{KERNEL_DIR}", f"-I{COMMON_DIR}"]
        command += ["-DQK_MMA_DEFAULT_ONLY", *defines, "-x", "cu", "-o", str(ptx), str(path)]
        run = subprocess.run(command, capture_output=True, text=True)
        assert run.returncode == 0, f"nvcc {path} {' '.join(defines)}: {run.stderr[-2000:]}"
        return ptx.read_text()


def cuda_ptx(source: Path, defines: tuple[str, ...] = (), patch: Patch | None = None) -> str:
    """The PTX of ``source`` (``patch`` applied when given) for sm_90 (sm_90a where the file has
    sm_90a code) with ``-DQK_MMA_DEFAULT_ONLY`` and ``defines``, at -O0 (~1 s for nbits_mma.hip),
    the file-hashed names of internal functions made equal."""
    with patch.materialised() if patch else contextlib.nullcontext(source) as path:
        return re.sub(r"_INTERNAL_[0-9a-f]{8}_", "_INTERNAL_", _nvcc_ptx(path, defines))


def emitted_lines(source: Path, defines: tuple[str, ...] = ()) -> set[int]:
    """The lines of ``source`` that ``cuda_ptx(source, defines)``'s build emits code from: the line
    table (``.loc``) of the same build with ``-lineinfo``, for the ``.file`` that is ``source``. A line
    in a branch the preprocessor drops there, or in a function no kernel calls, is not in it; a line of
    a macro's body is not either (its code is the line that expands it)."""
    text = _nvcc_ptx(source, defines, ("-lineinfo",))
    file_table = re.findall(r'^\s*\.file\s+(\d+)\s+"([^"]+)"', text, re.M)
    files = {n for n, name in file_table if Path(name).resolve() == source.resolve()}
    return {int(line) for n, line in re.findall(r"^\s*\.loc\s+(\d+)\s+(\d+)\b", text, re.M) if n in files}


def _code(text: str) -> str:
    """``text`` without its comments and with its whitespace runs made one space."""
    return " ".join(re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S).split())


def edited_lines(patch: Patch) -> set[int] | None:
    """The lines of ``patch.source`` (as shipped) whose code the patch changes: for each edit that
    changes more than comments and whitespace, the span between the original's and the replacement's
    common prefix and suffix (an insertion: the lines on both sides of it); None where an edit's
    original is not in the shipped text once (it patches an earlier edit's text)."""
    shipped = patch.source.read_text()
    lines: set[int] = set()
    for original, replacement in patch.edits:
        if shipped.count(original) != 1:
            return None
        if _code(original) == _code(replacement):
            continue
        start = shipped.index(original)
        p = len(os.path.commonprefix([original, replacement]))
        s = len(os.path.commonprefix([original[p:][::-1], replacement[p:][::-1]]))
        lo, hi = start + p, start + len(original) - s  # the original's changed characters [lo, hi)
        first = shipped.count("\n", 0, max(lo - 1, 0) if hi == lo else lo) + 1
        last = shipped.count("\n", 0, max(hi - 1, lo)) + 1
        lines.update(range(first, last + 1))
    return lines


def parallel_map(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``fn`` over ``items`` on as many threads as the host has cores (nvcc runs are processes)."""
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
        return list(pool.map(fn, items))

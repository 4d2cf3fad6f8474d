"""The x86-64 kernels ONNX Runtime's MLAS dispatches to on this host, read from the CPU's flags. Where
upstream's own answers differ between those kernels (MatMulNBits accuracy_level 4 on a block below
127 / FLT_MAX; fp32 softmax probabilities in the subnormals), a test compares ORT with the reading of
the kernel this host runs. MLAS (platform.cpp) takes its AVX-512 core kernels where the CPU has
AVX512F, BW, DQ and VL, its AVX2 (FMA3) kernels on other AVX2 hosts."""

from __future__ import annotations

from pathlib import Path

AVX512_CORE = ("avx512f", "avx512bw", "avx512dq", "avx512vl")


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The flags of the first processor in ``cpuinfo`` (/proc/cpuinfo's text; read here when None;
    empty where there is none, e.g. not Linux)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def mlas_x86_kernel(flags: set[str] | None = None) -> str | None:
    """ "avx512" where MLAS runs its AVX-512 core kernels, "avx2" on other hosts with AVX2, None
    elsewhere (no AVX2: MLAS's SSE or non-x86 kernels, which no test here reads)."""
    flags = cpu_flags() if flags is None else flags
    if all(f in flags for f in AVX512_CORE):
        return "avx512"
    return "avx2" if "avx2" in flags else None

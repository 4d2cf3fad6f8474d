"""tests/mlas_host.py: which of MLAS's x86-64 kernels a host's CPU flags select."""

from __future__ import annotations

from mlas_host import cpu_flags, mlas_x86_kernel

CPUINFO = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma {}\n\nprocessor\t: 1\nflags\t\t: fpu\n"


def test_the_first_processors_flags_are_read() -> None:
    assert cpu_flags(CPUINFO.format("avx512f")) == {"fpu", "sse2", "avx2", "fma", "avx512f"}
    assert cpu_flags("processor\t: 0\n") == set()


def test_avx512_core_needs_all_four_extensions() -> None:
    core = "avx512f avx512bw avx512dq avx512vl"
    assert mlas_x86_kernel(cpu_flags(CPUINFO.format(core))) == "avx512"
    for missing in core.split():
        assert mlas_x86_kernel(cpu_flags(CPUINFO.format(core.replace(missing, "")))) == "avx2", missing
    assert mlas_x86_kernel({"sse2", "neon"}) is None

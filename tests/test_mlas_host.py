"""tests/mlas_host.py: which of MLAS's x86-64 kernels a host's CPU flags select; the oracle's reading of
each kernel where their answers differ (docs/ort-ops.md, CompInt8 item 4)."""

from __future__ import annotations

import numpy as np
import pytest
from mlas_host import cpu_flags, mlas_x86_kernel

from qconform.errors import ArgumentError
from qconform.oracles.ort.matmul_nbits import quantize_activations_int8

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


def test_each_quantizer_codes_a_block_below_127_over_flt_max_its_own_way() -> None:
    """Row 0's block has amax 1e-40 (inv = inf: a * inv is +-inf, 0 * inv NaN); row 1's is ordinary. The
    AVX-512 quantizer's codes there are 0, the AVX2 one's -128 for every element, zeros included; the
    ordinary block's codes are the same under both."""
    a = np.zeros((2, 32), np.float32)
    a[0, :2] = 1e-40, -3e-41
    a[1, :3] = 1.0, -0.5, 0.25
    q512, s512 = quantize_activations_int8(a, 32, "avx512")
    q2, s2 = quantize_activations_int8(a, 32, "avx2")
    assert (q512[0] == 0).all() and (q2[0] == -128).all()
    assert np.array_equal(q512[1], q2[1]) and list(q2[1, :4]) == [127, -64, 32, 0]  # -63.5: the tie to even
    assert np.array_equal(s512, s2)
    with pytest.raises(ArgumentError, match="mlas: must be one of avx512, avx2, got 'neon'"):
        quantize_activations_int8(a, 32, "neon")

"""ci/sass_diff.py: a source built twice with nvcc, the kernels whose machine code differs named, and
only those (a build option that changes one kernel of two). Skips where nvcc is not installed."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("sass_diff", ROOT / "ci" / "sass_diff.py")
sass_diff = importlib.util.module_from_spec(spec)
sys.modules["sass_diff"] = sass_diff
spec.loader.exec_module(sass_diff)

SOURCE = r"""
extern "C" __global__ void kept(float* y, const float* x) { y[threadIdx.x] = 2.0f * x[threadIdx.x]; }
extern "C" __global__ void changed(float* y, const float* x) {
#ifdef CHANGE
    float acc[16];
    for (int i = 0; i < 16; ++i) acc[i] = x[threadIdx.x + 32 * i] * (i + 1);
    float s = 0.0f;
    for (int i = 0; i < 16; ++i) s += acc[i] * acc[(i * 7) & 15];
    y[threadIdx.x] = s;
#else
    y[threadIdx.x] = x[threadIdx.x] + 1.0f;
#endif
}
"""


@pytest.fixture(scope="module")
def cubins(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes]:
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed")
    d = tmp_path_factory.mktemp("sass")
    (d / "k.cu").write_text(SOURCE)
    out = []
    for defines in ([], ["-DCHANGE"]):
        cubin = d / f"k{len(defines)}.cubin"
        subprocess.run(["nvcc", "-cubin", "-arch=sm_90", *defines, str(d / "k.cu"), "-o", str(cubin)], check=True)
        out.append(cubin.read_bytes())
    return out[0], out[1]


def _only_the_changed_kernel_differs(reader, cubins: tuple[bytes, bytes]) -> None:
    base, new = (reader(c) for c in cubins)
    assert sorted(base) == ["changed", "kept"]
    rows = dict(sass_diff.compare(base, new))
    assert rows["kept"] == "same"
    assert rows["changed"].startswith("DIFF")
    assert all(base[k][1] > 0 for k in base), base  # every kernel's register count found


def test_the_kernel_a_build_option_changes_and_only_it(cubins: tuple[bytes, bytes]) -> None:
    _only_the_changed_kernel_differs(sass_diff.kernel_code, cubins)
    base = sass_diff.kernel_code(cubins[0])
    assert dict(sass_diff.compare(base, base)) == {"changed": "same", "kept": "same"}


def test_kernels_in_one_build_only() -> None:
    rows = dict(sass_diff.compare({"a": (b"1", 8)}, {"b": (b"1", 8)}))
    assert rows == {"a": "only in base", "b": "only in new"}


def _first_instruction_only(cubin: bytes) -> dict[str, tuple[bytes, int]]:
    """Mutant: each kernel's first 16-byte instruction only (every kernel starts by loading its stack
    pointer, so the changed kernel looks the same)."""
    return {k: (v[0][:16], v[1]) for k, v in sass_diff.kernel_code(cubin).items()}


def _names_swapped(cubin: bytes) -> dict[str, tuple[bytes, int]]:
    """Mutant: the kernels' names matched to the wrong sections (the code list reversed)."""
    code = sass_diff.kernel_code(cubin)
    return dict(zip(sorted(code), [code[k] for k in sorted(code, reverse=True)], strict=True))


@pytest.mark.parametrize("mutant", [_first_instruction_only, _names_swapped])
def test_a_reader_that_misreads_the_sections_is_caught(mutant, cubins: tuple[bytes, bytes]) -> None:
    with pytest.raises(AssertionError):
        _only_the_changed_kernel_differs(mutant, cubins)


def test_not_a_cubin_is_rejected() -> None:
    with pytest.raises(ValueError, match="not an ELF64"):
        sass_diff.kernel_code(b"\x7fELF\x01" + bytes(64))

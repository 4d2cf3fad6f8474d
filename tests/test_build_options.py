"""Every ``-DQK_*`` build option that qconform's launchers, benches, device mutants and CI scripts pass is read
somewhere: by a preprocessor line of a kernel source (``#if defined(X)``, ``#ifdef X``, ...) or by a
launcher that looks for it in ``launchers.OPTIONS``. A misspelt option would otherwise build the
shipped kernel unchanged, and a bench would time the shipped kernel against itself. And every option
a kernel reads is built by the offline compile gate (ci/compile-kernels.sh), so a bench-only or
control build cannot rot unseen between device sessions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GATE = ROOT / "ci/compile-kernels.sh"
KERNELS = ROOT / "src/qconform/device/kernels"
PASSED_BY = [
    *sorted((ROOT / "src/qconform").rglob("*.py")),
    ROOT / "tests/device_catalogue.py",
    *sorted(ROOT.glob("ci/*.sh")),
]
OPTION = re.compile(r"""["' ]-D(QK_[A-Z0-9_]+)(=[A-Za-z0-9_.]+)?(?=["'\s;])""")  # (macro, "=value" or "")
CONSTANT = re.compile(r"""^\s*([A-Z][A-Z0-9_]*)\s*=\s*["']-D(QK_[A-Z0-9_]+)["']""", re.M)


def passed_options(texts: dict[str, str]) -> dict[str, set[str]]:
    """{macro: the files that pass it as a -D option in a string}."""
    found: dict[str, set[str]] = {}
    for name, text in texts.items():
        for macro, _ in OPTION.findall(text):
            found.setdefault(macro, set()).add(name)
    return found


def preprocessor_macros(sources: list[str]) -> set[str]:
    """The identifiers on the preprocessor lines of kernel sources."""
    words: set[str] = set()
    for text in sources:
        for line in text.splitlines():
            if line.lstrip().startswith("#"):
                words.update(re.findall(r"\b[A-Z_][A-Z0-9_]*\b", line))
    return words


def launcher_reads(texts: list[str]) -> set[str]:
    """The macros whose constant (``NAME = "-DX"``) a module tests against ``OPTIONS`` (``NAME in
    launchers.OPTIONS``, ``any(o in launchers.OPTIONS for o in (NAME, ...))``)."""
    read: set[str] = set()
    for text in texts:
        for name, macro in CONSTANT.findall(text):
            uses = [line for line in text.splitlines() if "OPTIONS" in line and re.search(rf"\b{name}\b", line)]
            if any(not re.match(rf"\s*{name}\s*=", line) for line in uses):
                read.add(macro)
    return read


def unread(passed: dict[str, set[str]], pre: set[str], launch: set[str]) -> list[str]:
    return sorted(f"-D{m} (passed by {', '.join(sorted(passed[m]))})" for m in passed if m not in pre | launch)


def ungated(passed: dict[str, set[str]], pre: set[str], gate: str) -> list[str]:
    """The options a kernel reads that the compile gate's commands never pass (``-DX`` or ``-DX=...``;
    its comment lines do not count)."""
    code = "\n".join(line for line in gate.splitlines() if not line.lstrip().startswith("#"))
    return sorted(f"-D{m}" for m in passed if m in pre and not re.search(rf"-D{m}(?![A-Z0-9_])", code))


def _tree() -> tuple[dict[str, set[str]], set[str], set[str]]:
    texts = {str(p.relative_to(ROOT)): p.read_text() for p in PASSED_BY}
    kernels = [p.read_text() for p in sorted(KERNELS.rglob("*")) if p.suffix in (".hip", ".h", ".cu", ".cuh")]
    device_py = [t for n, t in texts.items() if n.startswith("src/qconform/device/")]
    return passed_options(texts), preprocessor_macros(kernels), launcher_reads(device_py)


def test_every_build_option_is_read_by_a_kernel_or_a_launcher():
    passed, pre, launch = _tree()
    assert len(passed) >= 20, sorted(passed)  # the scan finds the options (31 when written)
    assert unread(passed, pre, launch) == []


def test_a_misspelt_option_is_reported():
    """Mutants: an option nobody reads (a typo of a real one), and a real option whose kernel line is gone."""
    passed, pre, launch = _tree()
    typo = passed_options({"bench.py": 'RING = "-DQK_NBITS_RING_CONTIGUOUZ"'})
    assert unread(typo, pre, launch) == ["-DQK_NBITS_RING_CONTIGUOUZ (passed by bench.py)"]
    assert "QK_NBITS_RING_CONTIGUOUS" in passed
    kernel_gone = pre - {"QK_NBITS_RING_CONTIGUOUS"}
    assert unread(passed, kernel_gone, launch) == [
        f"-DQK_NBITS_RING_CONTIGUOUS (passed by {', '.join(sorted(passed['QK_NBITS_RING_CONTIGUOUS']))})"
    ]


def test_a_launcher_reads_its_option_only_through_options():
    """A constant assigned and never compared with OPTIONS is not a read; one compared is."""
    assigned_only = 'X = "-DQK_FOO"\nOPTIONS_DOC = 1\n'
    compared = 'X = "-DQK_FOO"\nif X in launchers.OPTIONS:\n    pass\n'
    grouped = 'X = "-DQK_FOO"\nok = any(o in launchers.OPTIONS for o in (Y, X))\n'
    assert launcher_reads([assigned_only]) == set()
    assert launcher_reads([compared]) == {"QK_FOO"}
    assert launcher_reads([grouped]) == {"QK_FOO"}


def test_every_option_a_kernel_reads_is_compile_gated():
    passed, pre, _ = _tree()
    gate = GATE.read_text()
    assert ungated(passed, pre, gate) == []
    # mutant: the gate's QK_GQA_FLASH_V1 build dropped (and a prefix of a gated option is no match)
    dropped = gate.replace("-DQK_GQA_FLASH_V1", "")
    assert ungated(passed, pre, dropped) == ["-DQK_GQA_FLASH_V1"]
    assert ungated({"QK_NBITS_RING": {"x"}}, {"QK_NBITS_RING"}, gate) == ["-DQK_NBITS_RING"]
    # mutant: named only in a comment of the gate
    assert ungated({"QK_FOO": {"x"}}, {"QK_FOO"}, "  # the -DQK_FOO build\nfront a b\n") == ["-DQK_FOO"]


def option_sources(macro: str) -> list[Path]:
    """The kernel sources a build with ``-D<macro>`` must change: those with a preprocessor line that
    reads it; for a macro only a header reads, the sources that include that header."""

    def reads(p: Path) -> bool:
        return re.search(rf"^\s*#.*\b{macro}\b", p.read_text(), re.M) is not None

    files = [p for p in sorted(KERNELS.rglob("*")) if p.suffix in (".hip", ".cu", ".h", ".cuh") and reads(p)]
    sources = [p for p in files if p.suffix in (".hip", ".cu")]
    headers = [p.name for p in files if p.suffix in (".h", ".cuh")]
    if sources:
        return sources
    return [p for p in sorted(KERNELS.rglob("*.hip")) if any(f'#include "{h}"' in p.read_text() for h in headers)]


def unchanged_builds(options: list[str], ptx, sources_of=option_sources) -> list[str]:
    """The ``-D`` options (``X`` or ``X=v``) whose sm_90 build is the shipped one in every source that
    reads them: a bench column or a control built with one would be the shipped kernel again."""
    from cuda_ptx import parallel_map

    def changes(option: str) -> bool:
        return any(ptx(s, ()) != ptx(s, (f"-D{option}",)) for s in sources_of(option.split("=")[0]))

    return [o for o, ok in zip(options, parallel_map(changes, options), strict=True) if not ok]


def test_every_build_option_changes_the_cuda_build():
    """Each -D option passed with a kernel that reads it changes that kernel's sm_90 PTX (nvcc, -O0)
    in at least one source: an option read only where the CUDA build never goes (an AMD branch, a
    function nothing calls) would time or check the shipped kernel under another name. Mutant: an
    option read only around a device function no kernel calls is reported; the ring's four-reads
    build (-DQK_NBITS_RING_LDS, bench-only since the ldmatrix read shipped) is the live control."""
    from cuda_ptx import HAVE_NVCC, cuda_ptx

    from qconform.device.patch import Patch

    if not HAVE_NVCC:
        pytest.skip("no nvcc (CUDA toolkit)")
    texts = {str(p.relative_to(ROOT)): p.read_text() for p in PASSED_BY}
    _, pre, _ = _tree()
    every = {m + v for t in texts.values() for m, v in OPTION.findall(t) if m in pre}
    options = sorted(every - {"QK_MMA_DEFAULT_ONLY"})  # the suite's own build of nbits_mma.hip, cuda_ptx's too
    assert len(options) >= 20, options
    cache: dict[tuple[Path, tuple[str, ...]], str] = {}

    def ptx(source: Path, defines: tuple[str, ...]) -> str:
        if (source, defines) not in cache:
            cache[(source, defines)] = cuda_ptx(source, defines)
        return cache[(source, defines)]

    assert unchanged_builds(options, ptx) == []
    anchor = "template <int R>\nstruct QkRing {"
    dead = "#if defined(QK_PROBE_DEAD)\n__device__ __forceinline__ int qk_probe_dead() { return 1; }\n#endif\n"
    with Patch(KERNELS / "ort/nbits_mma.hip", ((anchor, dead + anchor),)).materialised() as probe:
        found = unchanged_builds(["QK_PROBE_DEAD", "QK_NBITS_RING_LDS"], ptx, lambda _: [probe])
    assert found == ["QK_PROBE_DEAD"]

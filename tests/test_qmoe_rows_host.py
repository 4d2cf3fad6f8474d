"""qk_moe_rows_dot (the QMoE decode path's inner loop, ``kernels/ort/qmoe.hip``) on the host: the
kernel's text compiled with g++ against stand-ins (tests/kernel_host/qmoe_rows_host.cpp), run on
every lane of 4-row u4 tasks (chunks of 4 / 2 / 1 words, fp16 and fp32 scales, the fc1 and fc2
activation layouts, block and per-row scales, zero points, 16- and 4-byte loads), its partial sums
hashed per shape. The default build (the one-FFMA dequantization, block counters, two register
sets) must give session 9's bits (-DQK_MOE_DECODE_V2); the device mutant "QMoE decode: one-FFMA
dequantization, odd values with the even values' zero term" (tests/device_catalogue.py) must not.
Skipped without g++."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from device_catalogue import QMOE_FMA_ODD_ZERO_TERM, Edits

from qconform.device.registry import KERNEL_DIR

HERE = Path(__file__).parent / "kernel_host"
SLICES = (  # qk_moe_fc and qk_moe_x4; the decode path's helpers up to the int8 product
    ("/* one projection of every expert", "/* this lane's partial dot products of x (K values from xoff)"),
    ("#define QK_MOE_EMAX", "/* the int8 product of rows[]"),
)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")


def _run(tmp: Path, define: str = "", edits: Edits = ()) -> str:
    """The host program's hashes, the kernel's slices patched with ``edits`` and built with ``define``."""
    src = (KERNEL_DIR / "ort" / "qmoe.hip").read_text()
    for old, new in edits:
        assert src.count(old) == 1, old
        src = src.replace(old, new)
    (tmp / "qmoe_rows_slice.inc").write_text("\n".join(src[src.index(a) : src.index(b)] for a, b in SLICES))
    exe = tmp / "qmoe_rows_host"
    cmd = ["g++", "-std=c++17", "-O1", "-ffp-contract=off", "-w", *([define] if define else []), f"-I{tmp}"]
    subprocess.run([*cmd, str(HERE / "qmoe_rows_host.cpp"), "-o", str(exe)], check=True)
    return subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout


def test_rows_dot_gives_session_9s_bits(tmp_path: Path) -> None:
    shipped = _run(tmp_path)
    assert shipped.count("\n") == 10 and shipped == _run(tmp_path, "-DQK_MOE_DECODE_V2")


def test_rows_dot_mutant_differs(tmp_path: Path) -> None:
    assert _run(tmp_path, edits=QMOE_FMA_ODD_ZERO_TERM) != _run(tmp_path, "-DQK_MOE_DECODE_V2")

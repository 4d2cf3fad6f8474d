"""qk_gqa_append8 (the flash prefill's append, ``kernels/ort/gqa.hip``) against qk_gqa_append on the
host: both kernels' text compiled with g++ against a stand-in for the portability layer
(tests/kernel_host/gqa_append_host.cpp), every thread of both launches run, the rotated queries and
both present caches compared byte for byte: fp16 and fp32 inputs, half-split and interleaved rotary
over part of the head or none, packed QKV, position_ids, a chunk over a past, fp16 / fp32 / int8
(per-tensor and per-channel) / 4-bit caches. The device mutant "gqa flash append8: 4-bit pair with
element 2i in the high nibble" (tests/device_catalogue.py) must differ. Skipped without g++."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from device_catalogue import APPEND8_NIBBLES_SWAPPED, Edits

from qconform.device.registry import KERNEL_DIR

HERE = Path(__file__).parent / "kernel_host"
FIRST, LAST = "/* one element of a rotated pair", "/* present rows [0, past_b) of batch b copied"

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")

# B S N Nk H rotary_dim interleaved packed first_prompt bits per_channel is16 position_ids
CONFIGS = (
    (1, 5, 4, 2, 32, 32, 0, 0, 1, 0, 0, 1, 0),
    (2, 3, 6, 2, 64, 32, 1, 0, 0, 0, 0, 1, 1),
    (1, 4, 2, 1, 16, 8, 0, 1, 1, 0, 0, 0, 0),
    (2, 2, 4, 4, 128, 0, 0, 0, 0, 8, 0, 1, 0),
    (1, 3, 4, 2, 64, 64, 1, 0, 1, 8, 1, 0, 1),
    (2, 3, 4, 1, 32, 16, 0, 1, 0, 4, 1, 1, 0),
    (1, 7, 8, 2, 16, 16, 1, 0, 1, 4, 0, 0, 0),
)


def _build(tmp: Path, edits: Edits = ()) -> Path:
    src = (KERNEL_DIR / "ort" / "gqa.hip").read_text()
    for old, new in edits:
        assert src.count(old) == 1, old
        src = src.replace(old, new)
    i, j = src.index(FIRST), src.index(LAST)
    (tmp / "gqa_append_slice.inc").write_text(src[i:j].replace('extern "C" ', ""))
    exe = tmp / "gqa_append_host"
    cmd = ["g++", "-std=c++20", "-O1", "-ffp-contract=off", "-w", f"-I{tmp}", str(HERE / "gqa_append_host.cpp"), "-o"]
    subprocess.run([*cmd, str(exe)], check=True)
    return exe


@pytest.fixture(scope="module")
def exe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("append8"))


@pytest.mark.parametrize("config", CONFIGS, ids=["-".join(map(str, c)) for c in CONFIGS])
def test_append8_writes_what_append_writes(exe: Path, config: tuple[int, ...]) -> None:
    run = subprocess.run([str(exe), *map(str, config)], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "same", run.stdout + run.stderr


def test_append8_nibble_mutant_differs(tmp_path: Path) -> None:
    mutant = _build(tmp_path, APPEND8_NIBBLES_SWAPPED)
    run = subprocess.run([str(mutant), *map(str, CONFIGS[5])], capture_output=True, text=True)
    assert run.returncode == 1 and "present_key" in run.stdout, run.stdout

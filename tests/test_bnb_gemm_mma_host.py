"""The bitsandbytes matrix-unit GEMM's own device code on the host (``kernels/bnb/gemm_mma.hip``
compiled with g++ against tests/kernel_host/qk_portable.h; tests/kernel_host/bnb_gemm_mma_host.cpp runs
every CTA of a launch as 256 host threads, the m16n8k16 op formed per warp from the PTX fragment
layout, the 16-copy pair table that HIP builds): n1, n1_r1 and n2, fp16 and bf16, NF4 and FP4, a bias,
partial row tiles and K steps, fewer CTAs than tiles (the tiles striding over the grid, the next tile's
first loads issued during the reduction). Each output against the op's own check (the cpu reading,
``Prepared.verify``: within the per-element bound), every output written. The device mutants of the
kernel (tests/device_catalogue.py, those the 16-copy table builds) must fail the same check, as
tests/bnb_mma_model.py's model of them does. Skipped without g++ (C++20)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from device_catalogue import (
    BNB_MMA_NIBBLES_SWAPPED,
    BNB_MMA_PREVIOUS_BLOCK,
    BNB_MMA_SECOND_HALF_DROPPED,
    Edits,
)

from qconform.device.bnb_tiling import TOKENS
from qconform.device.patch import apply_edits
from qconform.device.registry import KERNEL_DIR
from qconform.ops import get_op
from qconform.ops.abi import DTYPE
from qconform.ops.bnb.gemm import QUANT_TYPE
from qconform.ops.spec import Case
from qconform.properties.checks import Prepared

HERE = Path(__file__).parent / "kernel_host"
COMMON = KERNEL_DIR / "common"
UNWRITTEN = 0xFFFF  # the driver's fill: a NaN in fp16 and bf16, which no finite case produces

# (M, K, N, blocksize, quant_type, bias, grid, symbol): symbol as mma_geometry picks it (n2 for M > 8;
# n1 where 32-row tiles fill the slots, else n1_r1); grid below the tiles where the tiles must stride
CASES = (
    (1, 256, 64, 64, "nf4", True, 2, "n1"),
    (3, 384, 40, 128, "fp4", False, 1, "n1"),
    (8, 352, 24, 32, "nf4", True, 3, "n1_r1"),
    (5, 1024, 16, 256, "fp4", True, 1, "n1_r1"),
    (12, 352, 40, 32, "fp4", True, 1, "n2"),
    (16, 640, 72, 64, "nf4", False, 2, "n2"),
    (1, 1024, 224, 64, "nf4", True, 3, "n1"),  # 7 tiles on 3 CTAs
    (2, 352, 160, 32, "fp4", True, 4, "n1"),  # 3 steps a tile (a partial step), 5 tiles on 4 CTAs
)
DTYPES = ("float16", "bfloat16")


def _build(tmp: Path, edits: Edits = ()) -> Path:
    (tmp / "gemm_mma.hip").write_text(apply_edits((KERNEL_DIR / "bnb" / "gemm_mma.hip").read_text(), edits))
    shutil.copy(KERNEL_DIR / "bnb" / "gemm_common.h", tmp)
    shutil.copy(COMMON / "qconform_abi.h", tmp)
    shutil.copy(HERE / "qk_portable.h", tmp)
    exe = tmp / "bnb_gemm_mma_host"
    cmd = ["g++", "-std=c++20", "-O1", "-ffp-contract=off", "-w", f"-I{tmp}", str(HERE / "bnb_gemm_mma_host.cpp")]
    subprocess.run([*cmd, "-o", str(exe)], check=True)
    return exe


def _prepared(case: tuple, dtype: str, seed: int) -> Prepared:
    M, K, N, bs, qt, bias = case[:6]
    op = get_op("gemm_4bit")
    leaf = next(lf.name for lf in op.leaves if lf.params["dtype"] == dtype)
    params = {"blocksize": bs, "quant_type": qt, "K": K} | ({"bias": True} if bias else {})
    return Prepared.from_case(op, Case("gemm_4bit", leaf, seed, (M, K, N), "normal", params))


def _run(exe: Path, tmp: Path, case: tuple, dtype: str, p: Prepared) -> tuple[int, np.ndarray]:
    M, K, N, bs, qt, bias, grid, symbol = case
    files = []
    for name in ("A", "B", "absmax", "bias"):
        if name not in p.inputs:
            files.append("-")
            continue
        path = tmp / f"{name}.bin"
        np.ascontiguousarray(p.inputs[name]).tofile(path)
        files.append(str(path))
    codes = (str(QUANT_TYPE[qt]), str(DTYPE[dtype]))
    args = [symbol, str(M), str(N), str(K), str(bs), *codes, str(grid), *files, str(tmp / "C.bin")]
    rc = subprocess.run([str(exe), *args], timeout=300).returncode
    assert rc in (0, 4), rc
    return rc, np.fromfile(tmp / "C.bin", np.uint16).reshape(M, N)


def _failures(exe: Path, tmp: Path, case: tuple, dtype: str) -> list[str]:
    """What is wrong with the kernel's two calls on ``case``: nothing, or the rules they break."""
    p = _prepared(case, dtype, seed=sum(case[:3]))
    rc, words = _run(exe, tmp, case, dtype, p)
    wrong = ["the second call's bits differ from the first's"] if rc == 4 else []
    if (words == UNWRITTEN).any():
        return [*wrong, "outputs left unwritten"]
    c = p.verify(get_op("gemm_4bit"), words.view(np.float16) if dtype == "float16" else words)
    return wrong if c.ok else [*wrong, c.detail]


@pytest.fixture(scope="module")
def exe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("bnbm"))


pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")


def test_cases_take_the_launchers_symbols() -> None:
    """n2 exactly where M passes one n-tile; the grid below the row tiles somewhere (the stride)."""
    assert all((s == "n2") == (c[0] > TOKENS) for *c, s in CASES)
    assert any(grid < -(-N // (32 if s != "n1_r1" else 16)) for _, _, N, _, _, _, grid, s in CASES)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"M{c[0]}_K{c[1]}_N{c[2]}_{c[7]}")
def test_kernel_within_the_bound(exe: Path, tmp_path: Path, case: tuple, dtype: str) -> None:
    assert _failures(exe, tmp_path, case, dtype) == []


@pytest.mark.parametrize(
    "edits",
    (BNB_MMA_NIBBLES_SWAPPED, BNB_MMA_PREVIOUS_BLOCK, BNB_MMA_SECOND_HALF_DROPPED),
    ids=("nibbles_swapped", "previous_block", "second_half_dropped"),
)
def test_device_mutants_fail_on_the_host(tmp_path: Path, edits: Edits) -> None:
    exe = _build(tmp_path, edits)
    # M 12 and 16: the second n-tile's tokens
    assert any(_failures(exe, tmp_path, case, "float16") for case in (CASES[4], CASES[5]))

"""The fast keep-quant GEMV's own device code on the host (``kernels/ggml/keep_quant_fast.hip`` compiled
with g++ against tests/kernel_host/qk_portable.h, a host stand-in for the portability header):
- every thread's ``kf_wload`` + ``kf_block`` term, for every block and slice, summed in float64
  (keep_quant_fast_host.cpp): rows 2 bytes past a word (Q6_K / Q8_0), Q8_K activation blocks at every
  16-byte phase (kf_act16's word shift), M below the 4-row tile;
- the kernels whole, one CTA at a time as 128 host threads (keep_quant_fast_cta.cpp: barriers, the
  width-8 shuffles, the groups' shared sums): M tiles of 1, 2 and 4, partial tiles, N past the last
  CTA's rows, Q8_0's partial last quad of blocks; each CTA's activations stale (another input's) until
  all its threads have waited for the quantize (QK_WAIT_PRIOR_GRID), so a read before the wait shows;
  the bench-only builds too.
Each against the float64 reference of the quantized operands (``matmul_terms``): a thread term is
formed from exact integers and at most two rounded fp32 products and one fmaf per sub-block pair, so
the sum is within gamma_{K+4} mag of the reference (the contract's order=any bound, docs/contracts.md);
a layout error is off by far more. Device mutants of these functions (tests/device_catalogue.py)
must fail the same check. Skipped without g++ (C++20)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from device_catalogue import (
    KF_GROUP0_DROPPED,
    KF_LOADS_FIRST_NO_WAIT,
    KF_MIN_WRONG_HALF,
    KF_NO_REALIGN,
    KF_Q5_HIGH_BIT,
    KF_Q6_HIGH_SHIFT,
    KF_Q6_STAGE_NO_D,
    Edits,
)
from test_keep_quant_fast_model import _q8_0_words

from qconform.device.registry import KERNEL_DIR
from qconform.formats.ggml import FORMATS
from qconform.ops.ggml.keep_quant import matmul_terms
from qconform.ops.ggml.q8_quant import finite_scales
from qconform.oracles.ggml import quantize

HERE = Path(__file__).parent / "kernel_host"
KIND = {"Q4_K": 4, "Q5_K": 5, "Q6_K": 6, "Q8_0": 0}
SHAPES = ((3, 5, 768, "valid"), (4, 7, 2560, "quantized"), (1, 9, 1280, "valid"))  # (M, N, K, weights)
U = 2.0**-24

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")


def _build(tmp: Path, edits: Edits = (), driver: str = "keep_quant_fast_host.cpp", defines: str = "") -> Path:
    src = defines + (KERNEL_DIR / "ggml" / "keep_quant_fast.hip").read_text()
    for old, new in edits:
        assert src.count(old) == 1, old
        src = src.replace(old, new)
    (tmp / "keep_quant_fast.hip").write_text(src)
    shutil.copy(HERE / "qk_portable.h", tmp / "qk_portable.h")
    exe = tmp / Path(driver).stem
    common = KERNEL_DIR / "common"  # qk_phases.h (qk_portable.h is the stand-in beside the source)
    cmd = ["g++", "-O1", "-std=c++20", "-pthread", "-ffp-contract=off", "-w", f"-I{tmp}", f"-I{common}", "-o", str(exe)]
    subprocess.run([*cmd, str(HERE / driver)], check=True, cwd=tmp)
    return exe


def _worst(exe: Path, tmp: Path, qtype: str, M: int, N: int, K: int, w: str, cta: bool = False) -> float:
    """max over outputs of |host result - ref| / (gamma_{K+4} mag); ``cta``: ``exe`` runs the kernels
    whole (keep_quant_fast_cta.cpp: float32 out; the activations stale, another A's, until every
    thread of a CTA has waited for the quantize), else the thread terms (float64 out)"""
    rng = np.random.default_rng(K + M)
    fmt = FORMATS[qtype]
    if w == "valid":
        W = finite_scales(fmt, rng.integers(0, 256, (N, fmt.n_bytes(K)), dtype=np.uint8), rng)
    else:
        W = quantize(rng.standard_normal((N, K)).astype(np.float32), qtype)
    A = rng.standard_normal((M, K)).astype(np.float32)
    afmt = "Q8_0" if qtype == "Q8_0" else "Q8_K"
    a8 = quantize(A, afmt)
    nb = K // FORMATS[afmt].block_size
    words = (lambda q: _q8_0_words(q, nb)) if qtype == "Q8_0" else (lambda q: q)  # Q8_K blocks as quantized
    W.tofile(tmp / "w.bin")
    np.ascontiguousarray(words(a8)).tofile(tmp / "a.bin")
    args = [str(KIND[qtype]), str(M), str(N), str(K // fmt.block_size), "w.bin", "a.bin", "y.bin"]
    if cta:
        stale = quantize(rng.standard_normal((M, K)).astype(np.float32), afmt)
        np.ascontiguousarray(words(stale)).tofile(tmp / "stale.bin")
        args.append("stale.bin")
    subprocess.run([str(exe), *args], check=True, cwd=tmp)
    y = np.fromfile(tmp / "y.bin", np.float32 if cta else np.float64).reshape(M, N).astype(np.float64)
    t = matmul_terms(W, qtype, a8)
    n = K + 4
    return float(np.max(np.abs(y - t["ref"]) / (n * U / (1 - n * U) * t["mag"])))


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("kf")
    return _build(tmp), tmp


@pytest.mark.parametrize("qtype", list(KIND))
def test_fast_kernel_terms_within_the_order_any_bound(shipped: tuple[Path, Path], qtype: str) -> None:
    exe, tmp = shipped
    for M, N, K, w in SHAPES:
        assert _worst(exe, tmp, qtype, M, N, K, w) <= 1.0, (M, N, K, w)


# the whole kernels, CTA by CTA: M tiles of 1, 2, 4 (5: two tiles, the last partial), N not a multiple of
# the 4 rows of a CTA, Q8_0 with K / 32 not a multiple of 4 (the last, partial quad of blocks)
CTA_SHAPES = ((1, 5, 768, "valid"), (2, 4, 512, "quantized"), (3, 9, 1280, "valid"), (5, 6, 2560, "valid"))
# Q4_K / Q5_K (round 2: 16 block columns a CTA, 2 steps a trip at M tile 1): 37 blocks, a partial second
# trip at M = 1 and three steps at M = 2
LONG_SHAPES = ((1, 5, 37 * 256, "valid"), (2, 3, 37 * 256, "quantized"))


@pytest.mark.parametrize("qtype", list(KIND))
def test_fast_kernels_whole_on_host_threads(tmp_path: Path, qtype: str) -> None:
    exe = _build(tmp_path, driver="keep_quant_fast_cta.cpp")
    shapes = CTA_SHAPES + (((2, 6, 2592, "valid"), (1, 3, 96, "valid")) if qtype == "Q8_0" else LONG_SHAPES)
    for M, N, K, w in shapes:
        assert _worst(exe, tmp_path, qtype, M, N, K, w, cta=True) <= 1.0, (M, N, K, w)


BUILT_VARIANTS = [(q, d) for d in ("QK_KQ_FAST_V1", "QK_KF_STEPS_M1 1") for q in ("Q4_K", "Q5_K")]
BUILT_VARIANTS += [(q, "QK_KF_LOADS_FIRST") for q in KIND]


@pytest.mark.parametrize("qtype,define", BUILT_VARIANTS)
def test_built_variants_whole_on_host_threads(tmp_path: Path, qtype: str, define: str) -> None:
    """The kernels the bench's build options select (-DQK_KQ_FAST_V1: Q4_K / Q5_K round 1's;
    -DQK_KF_STEPS_M1=1: round 2 with one step in flight at M tile 1; -DQK_KF_LOADS_FIRST: every type's
    weights loaded before the wait for the quantize), still reachable, still right, no activation read
    before the wait."""
    exe = _build(tmp_path, driver="keep_quant_fast_cta.cpp", defines=f"#define {define}\n")
    long_shapes = ((2, 6, 2592, "valid"),) if qtype == "Q8_0" else LONG_SHAPES[:1]
    for M, N, K, w in CTA_SHAPES + long_shapes:
        assert _worst(exe, tmp_path, qtype, M, N, K, w, cta=True) <= 1.0, (M, N, K, w)


# the wait dropped (the default build: at entry; -DQK_KF_LOADS_FIRST: after the first loads): the stale
# activations are read
WAIT_AT_ENTRY_DROPPED: Edits = (("#define KF_WAIT_AT_ENTRY() QK_WAIT_PRIOR_GRID()", "#define KF_WAIT_AT_ENTRY()  "),)
NO_WAIT_ROWS = [
    ("Q4_K", "", WAIT_AT_ENTRY_DROPPED),
    ("Q8_0", "", WAIT_AT_ENTRY_DROPPED),
    ("Q4_K", "#define QK_KF_LOADS_FIRST\n", KF_LOADS_FIRST_NO_WAIT),
    ("Q6_K", "#define QK_KF_LOADS_FIRST\n", KF_LOADS_FIRST_NO_WAIT),
]


@pytest.mark.parametrize("qtype,define,edits", NO_WAIT_ROWS)
def test_a_kernel_that_does_not_wait_reads_stale_activations(
    tmp_path: Path, qtype: str, define: str, edits: Edits
) -> None:
    exe = _build(tmp_path, edits, driver="keep_quant_fast_cta.cpp", defines=define)
    assert _worst(exe, tmp_path, qtype, 1, 5, 768, "valid", cta=True) > 1.0


@pytest.mark.parametrize("qtype,edits", [("Q4_K", KF_GROUP0_DROPPED), ("Q6_K", KF_Q6_STAGE_NO_D)])
def test_fast_kernel_cta_mutants_fail_on_host_threads(tmp_path: Path, qtype: str, edits: Edits) -> None:
    exe = _build(tmp_path, edits, driver="keep_quant_fast_cta.cpp")
    assert _worst(exe, tmp_path, qtype, 1, 9, 37 * 256, "valid", cta=True) > 1.0


@pytest.mark.parametrize(
    "qtype,edits",
    [("Q4_K", KF_MIN_WRONG_HALF), ("Q5_K", KF_Q5_HIGH_BIT), ("Q6_K", KF_Q6_HIGH_SHIFT), ("Q8_0", KF_NO_REALIGN)],
)
def test_fast_kernel_mutants_fail_on_the_host(tmp_path: Path, qtype: str, edits: Edits) -> None:
    exe = _build(tmp_path, edits)
    M, N, K, w = SHAPES[0]
    assert _worst(exe, tmp_path, qtype, M, N, K, w) > 1.0

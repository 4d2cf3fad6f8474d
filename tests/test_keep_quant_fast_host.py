"""The fast keep-quant GEMV's own device code on the host (``kernels/ggml/keep_quant_fast.hip`` compiled
with g++ against tests/kernel_host/qk_portable.h, a host stand-in for the portability header):
- every thread's ``kf_wload`` + ``kf_block`` term, for every block and slice, summed in float64
  (keep_quant_fast_host.cpp): rows 2 bytes past a word (Q6_K / Q8_0), Q8_K activation blocks at every
  16-byte phase (kf_act16's word shift), M below the 4-row tile;
- the kernels whole, one CTA at a time as 128 host threads (keep_quant_fast_cta.cpp: barriers, the
  width-8 shuffles, the groups' shared sums): M tiles of 1, 2 and 4, partial tiles, N past the last
  CTA's rows, Q8_0's partial last quad of blocks; each CTA's activations stale (another input's) until
  all its threads have waited for the quantize (QK_WAIT_PRIOR_GRID), so a read before the wait shows;
  the bench-only builds too;
- the one-launch M = 1 kernels of Q4_K / Q5_K (qk_kq_one_<t>; keep_quant_one_cta.cpp: the first CTAs
  quantizing the row for the others), bit-identical to the two launches.
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
    KB_NO_RESET,
    KB_ROW_STRIDE,
    KF_GROUP0_DROPPED,
    KF_LOADS_FIRST_NO_WAIT,
    KF_MIN_WRONG_HALF,
    KF_NO_REALIGN,
    KF_Q5_HIGH_BIT,
    KF_Q6_HIGH_SHIFT,
    KF_Q6_STAGE_NO_D,
    ONE_FIRST_GROUP_SKIPPED,
    ONE_LANE_ORDER,
    ROLL_NO_WRAP,
    Edits,
)
from test_keep_quant_fast_model import _q8_0_words

from qconform.device.patch import apply_edits
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


_BUILT: dict[tuple, Path] = {}  # one build a (driver, defines, edits) per process: tests share it (~5 s a g++ build)


def _build(
    tmp: Path, edits: Edits = (), driver: str = "keep_quant_fast_host.cpp", defines: str = "", q8_edits: Edits = ()
) -> Path:
    """``driver`` built against keep_quant_fast.hip with ``edits`` (and ggml/q8_quant.hip, which the
    one-launch build includes, with ``q8_edits``) after ``defines``, in ``tmp`` (or the same build made
    earlier in this process: the executable reads its inputs from its working directory)."""
    key = (driver, defines, edits, q8_edits)
    if key not in _BUILT or not _BUILT[key].exists():
        _BUILT[key] = _compile(tmp, edits, driver, defines, q8_edits)
    return _BUILT[key]


def _compile(tmp: Path, edits: Edits, driver: str, defines: str, q8_edits: Edits) -> Path:
    src = defines + apply_edits((KERNEL_DIR / "ggml" / "keep_quant_fast.hip").read_text(), edits)
    (tmp / "keep_quant_fast.hip").write_text(src)
    (tmp / "ggml").mkdir(exist_ok=True)  # found before kernels/ggml
    q8 = apply_edits((KERNEL_DIR / "ggml" / "q8_quant.hip").read_text(), q8_edits)
    (tmp / "ggml" / "q8_quant.hip").write_text(q8)
    shutil.copy(HERE / "qk_portable.h", tmp / "qk_portable.h")
    exe = tmp / Path(driver).stem
    common = KERNEL_DIR / "common"  # qk_phases.h (qk_portable.h is the stand-in beside the source)
    cmd = ["g++", "-O1", "-std=c++20", "-pthread", "-ffp-contract=off", "-w", f"-I{tmp}", f"-I{common}", "-o", str(exe)]
    subprocess.run([*cmd, str(HERE / driver)], check=True, cwd=tmp)
    return exe


def _worst(exe: Path, tmp: Path, qtype: str, M: int, N: int, K: int, w: str, cta: bool = False, ctas: int = 0) -> float:
    """max over outputs of |host result - ref| / (gamma_{K+4} mag); ``cta``: ``exe`` runs the kernels
    whole (keep_quant_fast_cta.cpp: float32 out; the activations stale, another A's, until every
    thread of a CTA has waited for the quantize), else the thread terms (float64 out); ``ctas``: the
    bulk Q6_K kernel on that many CTAs"""
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
    if ctas:
        args.append(str(ctas))
    subprocess.run([str(exe), *args], check=True, cwd=tmp)
    y = np.fromfile(tmp / "y.bin", np.float32 if cta else np.float64).reshape(M, N)
    return _bound_ratio(y, W, qtype, a8, K)


def _bound_ratio(y: np.ndarray, W: np.ndarray, qtype: str, a8: np.ndarray, K: int) -> float:
    """max over outputs of |y - ref| / (gamma_{K+4} mag), against the float64 reference of the quantized
    operands (``matmul_terms``)"""
    t = matmul_terms(W, qtype, a8)
    n = K + 4
    return float(np.max(np.abs(y.astype(np.float64) - t["ref"]) / (n * U / (1 - n * U) * t["mag"])))


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("kf")
    return _build(tmp), tmp


@pytest.fixture(scope="module")
def shipped_cta(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """the shipped kernels' CTA driver (keep_quant_fast_cta.cpp), built once"""
    return _build(tmp_path_factory.mktemp("kf_cta"), driver="keep_quant_fast_cta.cpp")


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
def test_fast_kernels_whole_on_host_threads(tmp_path: Path, shipped_cta: Path, qtype: str) -> None:
    exe = shipped_cta
    shapes = CTA_SHAPES + (((2, 6, 2592, "valid"), (1, 3, 96, "valid")) if qtype == "Q8_0" else LONG_SHAPES)
    for M, N, K, w in shapes:
        assert _worst(exe, tmp_path, qtype, M, N, K, w, cta=True) <= 1.0, (M, N, K, w)


BUILT_VARIANTS = [(q, "QK_KQ_FAST_V1") for q in ("Q4_K", "Q5_K")]
BUILT_VARIANTS += [(q, "QK_KF_LOADS_FIRST") for q in KIND]


@pytest.mark.parametrize("qtype,define", BUILT_VARIANTS)
def test_built_variants_whole_on_host_threads(tmp_path: Path, qtype: str, define: str) -> None:
    """The kernels the bench's build options select (-DQK_KQ_FAST_V1: Q4_K / Q5_K round 1's;
    -DQK_KF_LOADS_FIRST: every type's
    weights loaded before the wait for the quantize), still reachable, still right, no activation read
    before the wait."""
    exe = _build(tmp_path, driver="keep_quant_fast_cta.cpp", defines=f"#define {define}\n")
    long_shapes = ((2, 6, 2592, "valid"),) if qtype == "Q8_0" else LONG_SHAPES[:1]
    for M, N, K, w in CTA_SHAPES + long_shapes:
        assert _worst(exe, tmp_path, qtype, M, N, K, w, cta=True) <= 1.0, (M, N, K, w)


# the bulk kernels (qk_kq_bulk_<t>, M = 1, nb a multiple of 8): stages of 16 Q6_K / 64 Q8_0 blocks of each
# row, the last one shorter (Q6_K nb 8, 40; Q8_0 nb 24, 72), N past the last group's rows, fewer CTAs than
# row groups (each takes several, so the ring's slots and the sums' reset are reused), more CTAs than groups
BULK_SHAPES = {  # (N, K, CTAs)
    "Q6_K": ((5, 2048, 2), (9, 4096, 1), (13, 10240, 3), (3, 10240, 4), (16, 4096, 2)),
    "Q8_0": ((5, 768, 2), (9, 2048, 1), (13, 2304, 3), (3, 4096, 4), (16, 2304, 2)),
}


@pytest.mark.parametrize("w", ["valid", "quantized"])
@pytest.mark.parametrize("qtype", list(BULK_SHAPES))
def test_bulk_kernels_within_the_order_any_bound(tmp_path: Path, shipped_cta: Path, qtype: str, w: str) -> None:
    for N, K, ctas in BULK_SHAPES[qtype]:
        assert _worst(shipped_cta, tmp_path, qtype, 1, N, K, w, cta=True, ctas=ctas) <= 1.0, (N, K, ctas)


# the device rows' mutants (tests/device_catalogue.py): a Q6_K stage's rows at the full stage's stride,
# the sums not reset between row groups
@pytest.mark.parametrize(
    "qtype,edits",
    [("Q6_K", KB_ROW_STRIDE), ("Q6_K", KB_NO_RESET), ("Q8_0", KB_NO_RESET)],
    ids=["q6_k-row_stride", "q6_k-no_reset", "q8_0-no_reset"],
)
def test_bulk_mutants_caught_on_host(tmp_path: Path, qtype: str, edits: Edits) -> None:
    exe = _build(tmp_path, edits, driver="keep_quant_fast_cta.cpp")
    shapes = BULK_SHAPES[qtype]
    assert max(_worst(exe, tmp_path, qtype, 1, N, K, "valid", cta=True, ctas=c) for N, K, c in shapes) > 1.0


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


# qk_kq_one_<t>: the M = 1 Q4_K / Q5_K call in one launch, its first ceil(nb / 4) CTAs quantizing the fp32
# row for the others. (N, K, CTAs that take row groups): 3 row groups on 2 CTAs (one takes two) and 37
# super-blocks (10 quantizing CTAs, the last with 3 spare warps); 3 super-blocks (threads without a trip:
# the wait before the loads); more CTAs than row groups; 20 super-blocks (every thread one trip); 8 row
# groups on 3 CTAs (two or three each)
ONE_SHAPES = ((9, 37 * 256, 2), (4, 768, 1), (13, 2560, 5), (6, 20 * 256, 2), (29, 768, 3))
# each super-block's quants read in another order than qk_q8_k_quant_w32's; the last quantizing CTA never
# started (its blocks stale); each row-group CTA's first group skipped (never stored); the counts left set
# for the next call
ONE_LAST_PASS_SKIPPED: Edits = (
    (
        "return (unsigned)((nb + pass - 1) / pass);",
        "return (unsigned)(nb / pass);",
    ),
)
ONE_COUNTS_KEPT: Edits = (("        atomicExch(count, 0u);\n", ""),)
# the scale -128 / max instead of the reference's -127 / max (an |x| tie broken the other way, by
# contrast, negates d and every quant together, which no GEMV output shows)
SCALE_128: Edits = (
    (
        "const float iscale = zero ? 0.0f : qk_ftz(QK_FDIV(-127.0f, mx));",
        "const float iscale = zero ? 0.0f : qk_ftz(QK_FDIV(-128.0f, mx));",
    ),
)


def _one_row(K: int, rng: np.random.Generator) -> np.ndarray:
    """an activation row with a tie for the largest |x| in each super-block (signs alternating, so the
    first one's sign is d's), a subnormal in each (flushed) and, past the second super-block, a zero one"""
    x = rng.standard_normal(K).astype(np.float32)
    for b in range(K // 256):
        sign = 1.0 if b % 2 else -1.0
        x[256 * b + 5], x[256 * b + 200] = sign * 9.5, -sign * 9.5
        x[256 * b + 7] = 1e-40
    if K >= 768:
        x[512:768] = 0.0
    return x


def _one_and_two_launch(tmp: Path, qtype: str, N: int, K: int, ctas: int, one: Path, two: Path):
    """(the one-launch kernel's Y (None where its run failed), the two-launch kernel's Y on the oracle's
    activation bytes, W, those bytes); ``ctas``: the one-launch grid's CTAs that take row groups"""
    rng = np.random.default_rng(K + N)
    fmt = FORMATS[qtype]
    W = finite_scales(fmt, rng.integers(0, 256, (N, fmt.n_bytes(K)), dtype=np.uint8), rng)
    x = _one_row(K, rng)
    afmt, per_cta = ("Q8_0", 64) if qtype == "Q8_0" else ("Q8_K", 4)  # the launcher's blocks a quantizing CTA
    a8 = quantize(x[None], afmt, ftz=True)  # the bytes of the device's quantize (flushing subnormals)
    nb = K // FORMATS[afmt].block_size
    W.tofile(tmp / "w.bin")
    x.tofile(tmp / "x.bin")
    (_q8_0_words(a8, nb) if qtype == "Q8_0" else a8).tofile(tmp / "a.bin")
    shutil.copy(tmp / "a.bin", tmp / "stale.bin")
    grid = -(-nb // per_cta) + ctas  # the quantizing CTAs first
    run = subprocess.run([str(one), str(KIND[qtype]), str(N), str(nb), str(grid), "w.bin", "x.bin", "y1.bin"], cwd=tmp)
    bulk = [str(ctas)] if qtype in ("Q6_K", "Q8_0") else []  # their two launches: the bulk kernel on as many CTAs
    subprocess.run(
        [str(two), str(KIND[qtype]), "1", str(N), str(nb), "w.bin", "a.bin", "y2.bin", "stale.bin", *bulk],
        check=True,
        cwd=tmp,
    )
    y1 = np.fromfile(tmp / "y1.bin", np.float32) if run.returncode == 0 else None
    return y1, np.fromfile(tmp / "y2.bin", np.float32), W, a8


ONE_BUILDS = {
    "shipped": "",
    "no_prefetch": "#define QK_KF_ONE_PREFETCH 0\n",
    "wait_first": "#define QK_KF_FIRST_AFTER_WAIT 1\n",
    "wait_first_sm": "#define QK_KF_FIRST_AFTER_WAIT 3\n",
}


@pytest.mark.parametrize("build", list(ONE_BUILDS.values()), ids=list(ONE_BUILDS))
@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K"])
def test_one_launch_kernel_is_the_two_launches_bit_for_bit(
    tmp_path: Path, shipped_cta: Path, qtype: str, build: str
) -> None:
    """Every output of the one-launch kernel (and its bench-only builds' qk_kq_one_<t>) stored, bit-identical
    to the two launches' kernel on the oracle's Q8_K bytes of the row, within the order=any bound, and
    the counts zero after the launch."""
    one = _build(tmp_path, driver="keep_quant_one_cta.cpp", defines=build)
    for N, K, ctas in ONE_SHAPES:
        y1, y2, W, a8 = _one_and_two_launch(tmp_path, qtype, N, K, ctas, one, shipped_cta)
        assert y1 is not None, (N, K, ctas)
        assert not np.any(y1 == -12345.0), (N, K, ctas)
        assert np.array_equal(y1.view(np.uint32), y2.view(np.uint32)), (N, K, ctas)
        assert _bound_ratio(y1[None], W, qtype, a8, K) <= 1.0, (N, K, ctas)


@pytest.mark.parametrize("qtype", ["Q6_K", "Q8_0"])
def test_bulk_one_launch_kernel_is_the_two_launches_bit_for_bit(tmp_path: Path, shipped_cta: Path, qtype: str) -> None:
    """Q6_K's and Q8_0's one launch on the bulk kernel's ring (qk_kq_one_bulk_<t>): every output stored,
    bit-identical to the two launches (the bulk kernel after the quantize), the counts zero after the launch"""
    one = _build(tmp_path, driver="keep_quant_one_cta.cpp")
    for N, K, ctas in BULK_SHAPES[qtype]:
        y1, y2, W, a8 = _one_and_two_launch(tmp_path, qtype, N, K, ctas, one, shipped_cta)
        assert y1 is not None, (N, K, ctas)
        assert not np.any(y1 == -12345.0), (N, K, ctas)
        assert np.array_equal(y1.view(np.uint32), y2.view(np.uint32)), (N, K, ctas)
        assert _bound_ratio(y1[None], W, qtype, a8, K) <= 1.0, (N, K, ctas)


# the one launch's stream of trips (kf_roll_rows: the next trip's words loaded row by row during this trip):
# ROLL_NO_WRAP (device_catalogue); a row's next words loaded before its term of this trip is formed
_ROLL_TERM = "                kf_q45_row<KIND>(raw[rr], c, alo, ahi, bs0, bs1, yd, acc[rr]);\n"
_ROLL_LOAD = (
    "                if (nn < N) kf_wload<KIND>(W + ((nn + rr < N ? nn + rr : N - 1) * nb + nib) * TS, c, raw[rr]);\n"
)
ROLL_LOAD_FIRST: Edits = ((_ROLL_TERM + _ROLL_LOAD, _ROLL_LOAD + _ROLL_TERM),)


@pytest.mark.parametrize(
    "edits,q8_edits",
    [
        (ONE_LANE_ORDER, ()),
        (ONE_LAST_PASS_SKIPPED, ()),
        (ONE_FIRST_GROUP_SKIPPED, ()),
        (ONE_COUNTS_KEPT, ()),
        ((), SCALE_128),
        (ROLL_NO_WRAP, ()),
        (ROLL_LOAD_FIRST, ()),
    ],
    ids=["lane_order", "last_pass_skipped", "first_group_skipped", "counts_kept", "scale_128", "no_wrap", "load_first"],
)
def test_one_launch_kernel_mutants_are_caught(tmp_path: Path, shipped_cta: Path, edits: Edits, q8_edits: Edits) -> None:
    one = _build(tmp_path, edits, driver="keep_quant_one_cta.cpp", q8_edits=q8_edits)
    N, K, ctas = ONE_SHAPES[0]
    y1, y2, _, _ = _one_and_two_launch(tmp_path, "Q4_K", N, K, ctas, one, shipped_cta)
    assert y1 is None or not np.array_equal(y1.view(np.uint32), y2.view(np.uint32))


# Q8_0's one launch (qk_kq_one_bulk_q8_0): its last quantizing CTA never started (K = 2304: 72
# blocks, a second, partial pass of 64), and a quantizing CTA's blocks one pass less one apart (the passes
# overlap by a block, the row's last block never written where the passes are whole: K = 4096)
Q8_0_PASS_STRIDE: Edits = (
    (
        "(qk_i64)blockIdx.x * KF_PASS_Q8_0 + threadIdx.x / 2",
        "(qk_i64)blockIdx.x * (KF_PASS_Q8_0 - 1) + threadIdx.x / 2",
    ),
)


@pytest.mark.parametrize("edits", [ONE_LAST_PASS_SKIPPED, Q8_0_PASS_STRIDE], ids=["last_pass_skipped", "pass_stride"])
def test_q8_0_one_launch_mutants_are_caught(tmp_path: Path, shipped_cta: Path, edits: Edits) -> None:
    one = _build(tmp_path, edits, driver="keep_quant_one_cta.cpp")
    differ = []
    for K in (2304, 4096):  # 72 blocks (a partial second pass), 128 (two whole passes)
        y1, y2, _, _ = _one_and_two_launch(tmp_path, "Q8_0", 13, K, 3, one, shipped_cta)
        differ.append(y1 is None or not np.array_equal(y1.view(np.uint32), y2.view(np.uint32)))
    assert any(differ)

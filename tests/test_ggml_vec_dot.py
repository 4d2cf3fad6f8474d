"""ggml's generic vec_dot and what builds on it (qconform.oracles.ggml vec_dot_generic.py, fused.py).

- Hand-derived vectors (q8_0, q4_1, q4_K, q6_K, RMSNorm, SiLU), each worked out in its comments from
  the ggml-org/llama.cpp C line it models (ggml/src/ggml-cpu/quants.c ``ggml_vec_dot_*_generic``,
  ggml-cpu/ops.cpp, ggml-cpu/vec.h), for both fma modes and both twins;
- the numpy spec and the numba twin byte for byte on every pair, fma on and off, and on the epilogues;
- every pair within a derived bound of a float64 reference built from the dequantize oracles;
- fma=True changes some results of every pair (the mode is not a no-op);
- each rule caught: a local broken variant (block order, lane order, per-superblock lane sums, the q4_K sub-block
  scale unpacking, an epilogue quantizing the fp32 value instead of the bf16-stored one, Q8_K with a
  positive d) fails a check the oracle passes;
- the argument rules (ArgumentError names the argument);
- with ``QCONFORM_GGML_LIB`` (and ``QCONFORM_GGML_LIB_FMA``; ci/ggml-lib.sh builds both): the hand
  vectors through ``ggml_vec_dot_*_generic`` itself, ``matmul_bt_quant`` against ggml's ref activation
  quantizer followed by ggml's vec_dot for every pair, and the Q8_K stale bsums of ``quantize_row_q8_K_ref``.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

import qconform.oracles.ggml.vec_dot_generic as vd
from qconform.errors import ArgumentError
from qconform.formats.bf16 import bf16_bits_to_fp32
from qconform.formats.fp16 import fp16_bits_to_fp32
from qconform.formats.ggml import FORMATS, Q8_K
from qconform.oracles.ggml import (
    VEC_DOT_PAIRS,
    dequantize,
    matmul_bt_quant,
    q8_k_stale_mask,
    quantize,
    rms_norm_q8_k,
    silu_mul_q8_k,
    vec_dot,
)

BACKENDS = ("numba", "numpy")
FMA = (False, True)
SIMDS = ("sse2", "avx2", "avx512")
U = 2.0**-24  # fp32 unit roundoff
LIB = os.environ.get("QCONFORM_GGML_LIB")
LIB_FMA = os.environ.get("QCONFORM_GGML_LIB_FMA")
VP = ctypes.c_void_p


def blocks(name: str, n: int = 1) -> np.ndarray:
    return np.zeros(n, FORMATS[name].dtype)


def row(b: np.ndarray) -> np.ndarray:
    """Structs -> one row of block bytes."""
    return b.view(np.uint8).reshape(-1).copy()


def bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.uint32)


def dot(qtype: str, w: np.ndarray, a: np.ndarray, fma: bool, backend: str) -> float:
    return float(np.asarray(vec_dot(qtype, w, a, fma=fma, backend=backend)).reshape(()))


# ---------------------------------------------------------------- hand-derived vectors


def q8_0_pair() -> tuple[np.ndarray, np.ndarray]:
    """Two Q8_0 blocks. ``sumf += sumi*(dx*dy)`` per block (quants.c ggml_vec_dot_q8_0_q8_0_generic):
    block 0: x = [127, 31], y = [-127, -1], dx = dy = 1 -> sumi = -16129 - 31 = -16160 -> sumf = -16160.
    block 1: x = y = [127], dx = dy = fp16 0x3C01 = 1 + 2^-10 -> sumi = 16129 and
    dx*dy = 1 + 2^-9 + 2^-20 (21 bits, exact in fp32); sumi*(dx*dy) = 16129 * 1050625 / 2^20
    = 16945530625 / 2^20 = 16160.51733493805..."""
    w, a = blocks("Q8_0", 2), blocks("Q8_0", 2)
    w["d"], a["d"] = [0x3C00, 0x3C01], [0x3C00, 0x3C01]
    w["qs"][0, :2], a["qs"][0, :2] = [127, 31], [-127, -1]
    w["qs"][1, 0], a["qs"][1, 0] = 127, 127
    return row(w), row(a)


# fma=False: f32(16160.517334...) in [2^13, 2^14), ulp 2^-10: 16945530625 / 2^10 = 16548369.75 ulps
# -> 16548370 * 2^-10 = 16160.517578125; -16160 + that = 0.517578125 (exact).
# fma=True: fmaf(16129, dx*dy, -16160) = f32(16945530625/2^20 - 16160) = 542465 / 2^20 (exact, 20 bits).
Q8_0_EXPECTED = {False: 0.517578125, True: 542465 / 2**20}


def q4_1_pair() -> tuple[np.ndarray, np.ndarray]:
    """One block. ``sumf += (dx*dy)*sumi + mx*sy`` (ggml_vec_dot_q4_1_q8_1_generic): x: d = 1, m = 0.5,
    nibble q0 = 1 (others 0); y: d = 2, qs[0] = 3 and s = 5 (deliberately not d*sum(qs) = 6: the C
    reads s as stored) -> sumi = 3 -> (1*2)*3 + 0.5*5 = 8.5, exact in both modes."""
    w, a = blocks("Q4_1"), blocks("Q8_1")
    w["d"], w["m"], w["qs"][0, 0] = 0x3C00, 0x3800, 0x01
    a["d"], a["s"], a["qs"][0, 0] = 0x4000, 0x4500, 3
    return row(w), row(a)


def q4_k_pair() -> tuple[np.ndarray, np.ndarray]:
    """One superblock using only sub-block j = 5 (elements 160..191), whose 6-bit scale and min are
    split (get_scale_min_k4, j >= 4): sc = (s[9] & 15) | (s[1] >> 6) << 4, m = (s[9] >> 4) | (s[5] >> 6) << 4.
    s[1] = 0x80, s[9] = 0x35 -> sc = 5 | 2 << 4 = 37, m = 3 (s[5] = 0). Element e = 64c + 32t + l of
    sub-block 5 is c = 2, t = 1: the high nibble of qs[64 + l] = 3. x.d = 1, x.dmin = 0.5.
    Q8_K: d = 0.25, qs[160..191] = 1, bsums[10] = bsums[11] = 16.
    Lanes: aux32[l] = 4 elements * 37 * (1*3) = 444; d = 1*0.25 -> sums[l] = 0.25*444 = 111.
    Mins: sumi = (bsums[10] + bsums[11]) * m = 96; dmin = 0.5*0.25 = 0.125 -> sumf = -12.
    sumf + 8 * 111 = 876 (all exact, both modes). The j < 4 unpack for j = 5 (sc = s[5] & 63 = 0,
    m = s[9] & 63 = 53) gives 0 - 0.125 * 32 * 53 = -212."""
    w, a = blocks("Q4_K"), blocks("Q8_K")
    w["d"], w["dmin"] = 0x3C00, 0x3800
    w["scales"][0, 1], w["scales"][0, 9] = 0x80, 0x35
    w["qs"][0, 64:96] = 0x30
    a["d"], a["qs"][0, 160:192], a["bsums"][0, 10:12] = 0.25, 1, 16
    return row(w), row(a)


def q6_k_pair() -> tuple[np.ndarray, np.ndarray]:
    """Two superblocks whose 8 float lanes sum differently in another order. q = lo4 | hi2 << 4, a = q - 32;
    qh = 0xAA (hi2 = 2) and ql = 0 make every a = 0.
    Superblock 0: element 0 (lane 0): qh[0] = 0xAB -> a = 48 - 32 = 16; scales[0] = 64; q8[0] = 16;
    x.d = fp16 1024 -> aux32[0] = 64 * 16 * 16 = 2^14, sums[0] = 1024 * 2^14 = 2^24.
    Superblock 1: elements 1..7 (lanes 1..7): ql[l] = 1 -> a = 1; scales[0] = 1; q8 = 1; x.d = 1
    -> sums[1..7] = 1 (the lanes live across superblocks).
    End: sumf = 0 + 2^24, then + 1 seven times: 2^24 + 1 is a tie between 2^24 and 2^24 + 2, to even
    2^24 each time -> 16777216. Summing lanes 7..0 instead gives 7 + 2^24 = 16777223, a tie -> 16777224;
    so does adding each superblock's lane sum to sumf."""
    w, a = blocks("Q6_K", 2), blocks("Q8_K", 2)
    w["qh"] = 0xAA
    w["qh"][0, 0] = 0xAB
    w["scales"][:, 0] = [64, 1]
    w["d"] = [0x6400, 0x3C00]
    w["ql"][1, 1:8] = 1
    a["d"] = 1.0
    a["qs"][0, 0], a["qs"][1, 1:8] = 16, 1
    a["bsums"][0, 0], a["bsums"][1, 0] = 16, 7
    return row(w), row(a)


HAND = {
    "Q8_0": (q8_0_pair, Q8_0_EXPECTED),
    "Q4_1": (q4_1_pair, {False: 8.5, True: 8.5}),
    "Q4_K": (q4_k_pair, {False: 876.0, True: 876.0}),
    "Q6_K": (q6_k_pair, {False: 16777216.0, True: 16777216.0}),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fma", FMA)
@pytest.mark.parametrize("qtype", list(HAND))
def test_hand_derived_vectors(qtype: str, fma: bool, backend: str) -> None:
    make, expected = HAND[qtype]
    assert dot(qtype, *make(), fma, backend) == expected[fma]


# RMSNorm, K = 256: x = [3, 4, 0...], gamma = [1, 1.75, 1...], eps = 0 (ops.cpp ggml_compute_forward_rms_norm_f32,
# then ggml_mul): sum = 9 + 16 = 25 (double), mean = f32(25/256) = 0.09765625, sqrtf = 0.3125,
# scale = f32(1/0.3125) = f32(3.2) = 0x404CCCCD = 13421773 * 2^-22.
# y0 = f32(f32(3*scale)*1): 3*scale = 40265319 * 2^-22, in [8, 16) (ulp 2^-20) 10066329.75 ulps -> 10066330
#      -> 9.6000003814697265625 (0x4119999A).
# y1 = f32(f32(4*scale)*1.75): 4*scale is exact; *1.75 = 93952411 * 2^-22, in [16, 32) (ulp 2^-19) 11744051.375
#      ulps -> 11744051 * 2^-19 = 22.399999618530273 (0x41B33333).
# bf16 (round to nearest even on the low 16 bits): 0x4119|999A -> 0x411A = 9.625; 0x41B3|3333 -> 0x41B3 = 22.375.
# Q8_K of the stored row (quantize_row_q8_K_ref): max = y1 > 0 -> iscale = f32(-127/max), qs[1] = -127, d < 0;
#      fp32: -127/22.3999996 = -5.669643, * 9.6000004 = -54.43 -> -54;
#      bf16: -127/22.375 = -5.6759777, * 9.625 = -54.63 -> -55.
def rms_case() -> tuple[np.ndarray, np.ndarray]:
    x = np.zeros((1, 256), np.float32)
    x[0, :2] = [3, 4]
    gamma = np.ones(256, np.float32)
    gamma[1] = 1.75
    return x, gamma


@pytest.mark.parametrize("backend", BACKENDS)
def test_rms_norm_hand_vector(backend: str) -> None:
    x, gamma = rms_case()
    y, q = rms_norm_q8_k(x, gamma, 0.0, "float32", backend=backend)
    assert bits(y[0, :3]).tolist() == [0x4119999A, 0x41B33333, 0]
    b = q.view(Q8_K.dtype)[0, 0]
    assert b["qs"][:3].tolist() == [-54, -127, 0] and b["d"] < 0
    y16, q16 = rms_norm_q8_k(x, gamma, 0.0, "bfloat16", backend=backend)
    assert y16.dtype == np.uint16 and y16[0, :3].tolist() == [0x411A, 0x41B3, 0]
    b16 = q16.view(Q8_K.dtype)[0, 0]
    assert b16["qs"][:3].tolist() == [-55, -127, 0] and b16["d"] < 0
    assert b16["d"] == np.float32(1) / (np.float32(-127) / np.float32(22.375))


# SiLU (vec.h ggml_v_silu = x / (1 + ggml_v_expf(0 - x))), every branch:
# gate 0: v_expf(+0): z = 0*log2e + 0x1.8p23 = 0x1.8p23, n = 0, b = 0, j = 0, k = 2^0 = 1 -> 1*0 + 1 = 1
#   (AVX-512: j = fma(C5, 0, 1) = 1, scalef(1, 0) = 1) -> 0 / (1 + 1) = 0.
# gate 200: v_expf(-200): n = -289 (|n| > 192, n <= 0) -> s1*s1 = 2^-125 * 2^-125 = +0 (AVX-512: the blend's
#   0) -> 200 / 1 = 200.   gate -200: n = 289 > 0 -> 2^127 * 2^127 = +inf -> -200 / inf = -0.
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("simd", SIMDS)
def test_silu_hand_vector(simd: str, backend: str) -> None:
    gate = np.zeros((1, 256), np.float32)
    up = np.ones((1, 256), np.float32)
    gate[0, :3], up[0, :3] = [0, 200, -200], [5, 3, 7]
    h, q = silu_mul_q8_k(gate, up, "float32", simd=simd, backend=backend)
    assert bits(h[0, :4]).tolist() == [0, bits(np.float32(600))[()], 0x80000000, 0]
    b = q.view(Q8_K.dtype)[0, 0]  # max = 600 > 0 -> qs[1] = -127, d = 1/(-127/600) < 0
    assert b["qs"][:3].tolist() == [0, -127, 0] and b["d"] < 0


# ---------------------------------------------------------------- twins, float64 bound, fma mode


def quantized_rows(qtype: str, rows: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Weights and activations from the ref quantizers, row scales spread over 1e-3..1e3."""
    rng = np.random.default_rng(seed)
    scale = 10.0 ** rng.uniform(-3, 3, (rows, 1))
    x = (rng.standard_normal((rows, k)) * scale).astype(np.float32)
    y = (rng.standard_normal((rows, k)) * scale[::-1]).astype(np.float32)
    return quantize(x, qtype), quantize(y, VEC_DOT_PAIRS[qtype])


def random_rows(qtype: str, rows: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random bytes: NaN and inf scales, bsums unrelated to the qs."""
    rng = np.random.default_rng(seed)
    wf, af = FORMATS[qtype], FORMATS[VEC_DOT_PAIRS[qtype]]
    return (
        rng.integers(0, 256, (rows, wf.n_bytes(k)), dtype=np.uint8),
        rng.integers(0, 256, (rows, af.n_bytes(k)), dtype=np.uint8),
    )


@pytest.mark.parametrize("fma", FMA)
@pytest.mark.parametrize("qtype", list(VEC_DOT_PAIRS))
def test_twins_are_byte_identical(qtype: str, fma: bool) -> None:
    for w, a in (quantized_rows(qtype, 24, 512, 1), random_rows(qtype, 24, 512, 2)):
        fast = vec_dot(qtype, w, a, fma=fma)
        spec = vec_dot(qtype, w, a, fma=fma, backend="numpy")
        assert fast.tobytes() == spec.tobytes()
    # broadcasting: weights (N, .) against activations (M, 1, .) -> (M, N), each the 1-row result
    grid = vec_dot(qtype, w[None, :5], a[:3, None], fma=fma)
    assert grid.shape == (3, 5)
    assert grid[2, 4] == vec_dot(qtype, w[4], a[2], fma=fma) or np.isnan(grid[2, 4])


def _additions(qtype: str, nb: int) -> int:
    """fp32 additions in the C (an upper bound on those one term passes through)."""
    if qtype == "IQ4_XS":
        return 8 * nb
    if qtype in ("Q3_K", "Q4_K", "Q5_K", "Q6_K"):
        return 9 * nb + 8  # 8 lanes, the mins, the final lane sum
    return 2 * nb  # legacy: one per block, plus the inner add of the affine and Q2_K forms


def reference64(qtype: str, w: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the C's formula in exact arithmetic, S = the sum of |terms|), float64, from the dequantize
    oracles: weights split into their scale part (mins / m fields zeroed: exact in fp32) and their min
    part (d zeroed: -dmin*m or m, exact), activations d*qs computed in float64 (exact). Q4_1/Q5_1 add
    m*s per block with the activation's stored s, as the C does."""
    wf, af = FORMATS[qtype], FORMATS[VEC_DOT_PAIRS[qtype]]
    wb, ab = w.view(wf.dtype).copy(), a.view(af.dtype)
    d64 = ab["d"].astype(np.float64) if af.name == "Q8_K" else fp16_bits_to_fp32(ab["d"]).astype(np.float64)
    a64 = (d64[..., None] * ab["qs"]).reshape(len(a), -1)
    low = next((f for f in ("dmin", "m") if f in wf.dtype.names), None)
    scale_part = wb.copy()
    if low:
        scale_part[low] = 0
    wd = dequantize(scale_part.view(np.uint8), qtype).astype(np.float64)
    value, total = (wd * a64).sum(1), np.abs(wd * a64).sum(1)
    if low == "dmin":
        min_part = wb.copy()
        min_part["d"] = 0
        wm = dequantize(min_part.view(np.uint8), qtype).astype(np.float64)
        value, total = value + (wm * a64).sum(1), total + np.abs(wm * a64).sum(1)
    elif low == "m":
        ms = fp16_bits_to_fp32(wb["m"]).astype(np.float64) * fp16_bits_to_fp32(ab["s"])
        value, total = value + ms.sum(1), total + np.abs(ms).sum(1)
    return value, total


@pytest.mark.parametrize("qtype", list(VEC_DOT_PAIRS))
def test_within_the_float64_bound(qtype: str) -> None:
    """Every term (a block or sub-block product, or a lane's scaled integer sum) carries at most r = 4
    roundings (the scale products, (float)aux32 once it passes 2^24, the product with the integer sum)
    and then passes through at most A fp32 additions, so |result - exact| <= gamma(A + 4) * S
    (recursive summation, Higham 4.2), gamma(n) = n*u / (1 - n*u). Add u*S for the one fp32 rounding a
    dequantized Q6_K weight may carry (19-bit d*sc times a 6-bit q) and S*K*2^-52 for the float64 sum.
    FMA only drops roundings: both modes stay inside."""
    k = 1024
    w, a = quantized_rows(qtype, 48, k, 3)
    exact, total = reference64(qtype, w, a)
    n = _additions(qtype, k // FORMATS[qtype].block_size) + 4
    bound = (n * U / (1 - n * U) + U + k * 2.0**-52) * total
    for fma in FMA:
        err = np.abs(vec_dot(qtype, w, a, fma=fma).astype(np.float64) - exact)
        assert (err <= bound).all(), (fma, float(np.max(err / bound)))


@pytest.mark.parametrize("qtype", list(VEC_DOT_PAIRS))
def test_fma_mode_changes_some_results(qtype: str) -> None:
    """Contraction is not a no-op for any pair (both modes are within the float64 bound above)."""
    w, a = quantized_rows(qtype, 64, 1024, 4)
    assert (vec_dot(qtype, w, a) != vec_dot(qtype, w, a, fma=True)).any()


@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
def test_epilogue_twins(out_dtype: str) -> None:
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((6, 1024)) * 10.0 ** rng.uniform(-20, 20, (6, 1))).astype(np.float32)
    x[1, :256] = 0  # an all-zero Q8_K block
    x[2, 5] = 1e-41  # subnormal
    gamma = (rng.standard_normal(1024) + 1).astype(np.float32)
    for eps in (0.0, 1e-6):
        ours = [rms_norm_q8_k(x, gamma, eps, out_dtype, backend=b) for b in BACKENDS]
        assert ours[0][0].tobytes() == ours[1][0].tobytes() and ours[0][1].tobytes() == ours[1][1].tobytes()
    gate = (rng.standard_normal((6, 1024)) * rng.uniform(0.1, 120, (6, 1))).astype(np.float32)
    gate[3, :6] = [np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-42]
    up = rng.standard_normal((6, 1024)).astype(np.float32)
    for simd in SIMDS:
        ours = [silu_mul_q8_k(gate, up, out_dtype, simd=simd, backend=b) for b in BACKENDS]
        assert ours[0][0].tobytes() == ours[1][0].tobytes() and ours[0][1].tobytes() == ours[1][1].tobytes()


def test_matmul_twins_and_broadcast() -> None:
    rng = np.random.default_rng(6)
    a = rng.standard_normal((3, 512)).astype(np.float32)
    for qtype in VEC_DOT_PAIRS:
        w = quantize(rng.standard_normal((5, 512)).astype(np.float32), qtype)
        y = matmul_bt_quant(w, qtype, a)
        assert y.shape == (3, 5) and y.dtype == np.float32
        assert y.tobytes() == matmul_bt_quant(w, qtype, a, backend="numpy").tobytes()
        a8 = quantize(a[1:2], VEC_DOT_PAIRS[qtype])  # the ref quantizer of the pair's vec_dot_type
        assert y[1].tobytes() == vec_dot(qtype, w, a8).tobytes()


def test_epilogues_within_float64_bounds() -> None:
    """RMSNorm: mean (1 rounding after an exact-enough double sum), + eps (1), sqrtf (1, and half of the
    2 before it), 1/ (1), x*scale (1), *gamma (1): |y - y64| <= (5u + K*2^-52) |y64| to first order.
    SiLU*up: v_expf's relative error (1.95 ulp documented for the Arm routine ggml adapted; the AVX-512
    association measured up to 2.23 ulp; budget 2.5 * 2^-23), then 1 + e, the division and *up (u each)."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((4, 2048)) * 10.0 ** rng.uniform(-3, 3, (4, 1))).astype(np.float32)
    gamma = (rng.standard_normal(2048) + 1).astype(np.float32)
    y, _ = rms_norm_q8_k(x, gamma, 1e-6, "float32")
    x64 = x.astype(np.float64)
    y64 = x64 / np.sqrt((x64 * x64).mean(1, keepdims=True) + np.float64(np.float32(1e-6))) * gamma
    assert (np.abs(y - y64) <= (5 * U + 2048 * 2.0**-52) * (1 + 1e-6) * np.abs(y64)).all()
    gate = rng.uniform(-80, 80, (4, 2048)).astype(np.float32)
    up = rng.standard_normal((4, 2048)).astype(np.float32)
    g64 = gate.astype(np.float64)
    h64 = g64 / (1 + np.exp(-g64)) * up
    for simd in SIMDS:
        h, _ = silu_mul_q8_k(gate, up, simd=simd)
        assert (np.abs(h - h64) <= (2.5 * 2.0**-23 + 3 * U) * (1 + 1e-6) * np.abs(h64)).all(), simd


def test_silu_branches_differ() -> None:
    """The three ``simd`` branches are three different fp32 functions (so naming the build matters)."""
    gate = np.random.default_rng(8).uniform(-30, 30, (4, 1024)).astype(np.float32)
    h = {s: silu_mul_q8_k(gate, np.ones_like(gate), simd=s)[0] for s in SIMDS}
    assert (h["sse2"] != h["avx2"]).any() and (h["avx2"] != h["avx512"]).any() and (h["sse2"] != h["avx512"]).any()


# ---------------------------------------------------------------- broken variants each rule catches


def _lanes_in_another_order(reverse: bool):
    """``vec_dot_generic._eight_lanes`` with the final lane sum reversed (reverse=True), or with each superblock's
    8 lane products summed and added to sumf at once (reverse=False) instead of 8 lanes living across
    superblocks. Q3_K/Q6_K only (no mins)."""

    def broken(w, a, q, scale, mins_sum, fused):
        p, nb = w.shape
        aux32 = (scale * (a["qs"].astype(np.int32) * q)).reshape(p, nb, 32, 8).sum(2).astype(np.float32)
        d = np.multiply(fp16_bits_to_fp32(w["d"]), a["d"], dtype=np.float32)
        terms = np.multiply(d[..., None], aux32, dtype=np.float32)  # (p, nb, 8)
        sumf = np.zeros(p, np.float32)
        if reverse:
            sums = np.zeros((p, 8), np.float32)
            for i in range(nb):
                sums = np.add(sums, terms[:, i], dtype=np.float32)
            for lane in reversed(range(8)):
                sumf = np.add(sumf, sums[:, lane], dtype=np.float32)
            return sumf
        for i in range(nb):
            block = np.zeros(p, np.float32)
            for lane in range(8):
                block = np.add(block, terms[:, i, lane], dtype=np.float32)
            sumf = np.add(sumf, block, dtype=np.float32)
        return sumf

    return broken


def _k4_scales_simple_unpack(w, a):
    """``vec_dot_generic._k4_scales`` with the j < 4 rule (s[j] & 63, s[j + 4] & 63) for all 8 sub-blocks."""
    p, nb = w.shape
    s = w["scales"].astype(np.int64)
    sc, m = s[..., 0:8] & 63, s[..., 4:12] & 63
    sumi = (a["bsums"].astype(np.int64) * np.repeat(m, 2, axis=-1)).sum(-1)
    return np.repeat(sc, 32, axis=-1), sumi


@pytest.mark.parametrize("reverse", [True, False], ids=["lanes-reversed", "lanes-per-superblock"])
def test_lane_order_is_caught(monkeypatch: pytest.MonkeyPatch, reverse: bool) -> None:
    w, a = q6_k_pair()
    monkeypatch.setattr(vd, "_eight_lanes", _lanes_in_another_order(reverse))
    assert dot("Q6_K", w, a, False, "numpy") == 16777224.0  # the hand vector expects 16777216
    monkeypatch.undo()
    assert dot("Q6_K", w, a, False, "numpy") == 16777216.0


def _q8_0_blocks_reversed(w, a, fused):
    """``vec_dot_generic._dot_q8_0`` adding the blocks last to first."""
    sumi = (w["qs"].astype(np.int32) * a["qs"].astype(np.int32)).sum(-1)
    dd = np.multiply(fp16_bits_to_fp32(w["d"]), fp16_bits_to_fp32(a["d"]), dtype=np.float32)
    sumf = np.zeros(len(w), np.float32)
    for ib in reversed(range(w.shape[1])):
        sumf = vd._acc(sumf, sumi[:, ib].astype(np.float32), dd[:, ib], fused)
    return sumf


def test_block_order_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reversed, the q8_0 hand vector's fused sum is fmaf(-16160, 1, f32(16160.5173...)) = 0.517578125,
    not 542465 / 2^20 (the rounding of block 1's product is no longer absorbed)."""
    w, a = q8_0_pair()
    monkeypatch.setitem(vd._NUMPY, "Q8_0", _q8_0_blocks_reversed)
    assert dot("Q8_0", w, a, True, "numpy") == 0.517578125
    monkeypatch.undo()
    assert dot("Q8_0", w, a, True, "numpy") == 542465 / 2**20


def test_q4_k_sub_block_scale_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    w, a = q4_k_pair()
    monkeypatch.setattr(vd, "_k4_scales", _k4_scales_simple_unpack)
    assert dot("Q4_K", w, a, False, "numpy") == -212.0  # the hand vector expects 876
    x, y = quantized_rows("Q4_K", 16, 1024, 9)
    broken = vec_dot("Q4_K", x, y, backend="numpy")
    monkeypatch.undo()
    assert (broken != vec_dot("Q4_K", x, y, backend="numpy")).any()


def test_quantizing_the_fp32_value_instead_of_the_bf16_one_is_caught() -> None:
    x, gamma = rms_case()
    fp32_row, _ = rms_norm_q8_k(x, gamma, 0.0, "float32")
    broken = quantize(fp32_row, "Q8_K").view(Q8_K.dtype)[0, 0]  # skips the bf16 store and re-read
    assert broken["qs"][0] == -54  # the hand vector's bf16 epilogue gives -55
    _, q16 = rms_norm_q8_k(x, gamma, 0.0, "bfloat16")
    assert q16.view(Q8_K.dtype)[0, 0]["qs"][0] == -55
    rng = np.random.default_rng(10)  # and on ordinary rows
    x = rng.standard_normal((8, 1024)).astype(np.float32)
    stored, q = rms_norm_q8_k(x, np.ones(1024, np.float32), 1e-6, "bfloat16")
    assert q.tobytes() == quantize(bf16_bits_to_fp32(stored), "Q8_K").tobytes()
    assert q.tobytes() != quantize(rms_norm_q8_k(x, np.ones(1024, np.float32), 1e-6)[0], "Q8_K").tobytes()


def _q8_k_positive_d(x: np.ndarray) -> np.ndarray:
    """Q8_K with the textbook sign: iscale = 127/amax, so d = amax/127 > 0 (ggml: -127/max)."""
    out = np.zeros((len(x), Q8_K.type_size), np.uint8)
    b = out.view(Q8_K.dtype)[:, 0]
    iscale = np.float32(127) / np.abs(x).max(1)
    qs = np.minimum(127, np.rint(np.multiply(iscale[:, None], x, dtype=np.float32))).astype(np.int8)
    b["qs"], b["d"] = qs, np.float32(1) / iscale
    b["bsums"] = qs.reshape(len(x), 16, 16).astype(np.int32).sum(2)
    return out


def test_q8_k_with_positive_d_is_caught() -> None:
    """The dequantized values agree (d*qs is the same product with both signs flipped), so only the
    bytes show it: the hand vector's d < 0 and qs[1] = -127."""
    gate = np.zeros((1, 256), np.float32)
    gate[0, :3] = [0, 200, -200]
    h, q = silu_mul_q8_k(gate, np.ones_like(gate))
    broken = _q8_k_positive_d(h)
    assert broken.view(Q8_K.dtype)[0, 0]["d"] > 0 and broken.view(Q8_K.dtype)[0, 0]["qs"][1] == 127
    assert q.tobytes() != broken.tobytes()
    assert (dequantize(q, "Q8_K") == dequantize(broken, "Q8_K")).all()


# ---------------------------------------------------------------- stale bytes, argument rules


def test_q8_k_stale_mask() -> None:
    x = np.ones((2, 768), np.float32)
    x[0, 256:512] = 0
    x[1, :256] = np.nan
    x[1, 512:768] = -0.0
    mask = q8_k_stale_mask(x)
    assert mask.shape == (2, 3 * 292) and mask.sum() == 3 * 32
    per_block = mask.reshape(2, 3, 292)
    assert per_block[0, 1, 260:].all() and per_block[1, 0, 260:].all() and per_block[1, 2, 260:].all()
    assert not per_block[..., :260].any() and not per_block[0, 0].any()
    q = quantize(x, "Q8_K")
    assert not q[mask].any()  # qconform writes zeros where ggml leaves the bytes


def test_argument_rules() -> None:
    w, a = quantized_rows("Q4_0", 2, 64, 11)
    k, k8 = quantized_rows("Q4_K", 2, 256, 12)
    cases = [
        (lambda: vec_dot("Q8_K", k8, k8), "qtype"),
        (lambda: vec_dot("F16", w, a), "qtype"),
        (lambda: vec_dot("Q4_0", w.astype(np.int8), a), "w_blocks: dtype"),
        (lambda: vec_dot("Q4_0", list(w), a), "w_blocks: must be a numpy"),
        (lambda: vec_dot("Q4_0", np.array(w[0, 0]), a[0]), "w_blocks: must have at least one"),
        (lambda: vec_dot("Q4_0", w[:, :-1], a), "w_blocks: the last dimension"),
        (lambda: vec_dot("Q4_0", w, a[:, :34]), "a_blocks: a row holds 1 Q8_0 blocks"),
        (lambda: vec_dot("Q4_0", w, k8), "a_blocks: the last dimension"),
        (lambda: vec_dot("Q4_0", np.stack([w] * 3), np.stack([a] * 2)), "do not broadcast"),
        (lambda: vec_dot("Q4_0", w, a, fma=1), "fma"),
        (lambda: vec_dot("Q4_0", w, a, backend="cuda"), "backend"),
        (lambda: matmul_bt_quant(w[0], "Q4_0", np.zeros((1, 64), np.float32)), "W_blocks: must be a 2-D"),
        (lambda: matmul_bt_quant(w, "Q4_0", np.zeros((1, 64), np.float64)), "A_fp32: dtype"),
        (lambda: matmul_bt_quant(w.astype(np.int16), "Q4_0", np.zeros((1, 64), np.float32)), "W_blocks: dtype"),
        (lambda: matmul_bt_quant(w, "Q4_0", np.zeros((1, 96), np.float32)), "W_blocks: rows must hold 3"),
        (lambda: matmul_bt_quant(w, "Q4_0", np.zeros((1, 40), np.float32)), "A_fp32: the last dimension"),
        (lambda: rms_norm_q8_k(np.zeros((1, 128), np.float32), np.ones(128, np.float32), 0.0), "x: the last"),
        (lambda: rms_norm_q8_k(np.zeros((1, 256), np.float32), np.ones(255, np.float32), 0.0), "gamma"),
        (lambda: rms_norm_q8_k(np.zeros((1, 256), np.float32), np.ones(256, np.float32), -1.0), "eps"),
        (lambda: rms_norm_q8_k(np.zeros((1, 256), np.float32), np.ones(256, np.float32), 0.0, "fp16"), "out_dtype"),
        (lambda: silu_mul_q8_k(np.zeros((1, 256), np.float32), np.zeros((2, 256), np.float32)), "up"),
        (lambda: silu_mul_q8_k(np.zeros((1, 256), np.float32), np.zeros((1, 256), np.float32), simd="neon"), "simd"),
        (lambda: q8_k_stale_mask(np.zeros((1, 100), np.float32)), "x: the last"),
    ]
    for call, match in cases:
        with pytest.raises(ArgumentError, match=match):
            call()


# ---------------------------------------------------------------- against ggml's C


def c_name(qtype: str) -> str:
    """ggml's spelling in function names: q4_0, q8_K, iq4_nl."""
    return qtype.lower().replace("_k", "_K")


def c_vec_dot(lib: ctypes.CDLL, qtype: str, w: np.ndarray, a: np.ndarray) -> np.ndarray:
    """``ggml_vec_dot_<w>_<a>_generic(n, &s, bs, vx, bx, vy, by, nrc=1)`` per row -> float32 (rows,)."""
    fn = getattr(lib, f"ggml_vec_dot_{c_name(qtype)}_{c_name(VEC_DOT_PAIRS[qtype])}_generic")
    fn.argtypes = [ctypes.c_int, VP, ctypes.c_size_t, VP, ctypes.c_size_t, VP, ctypes.c_size_t, ctypes.c_int]
    fn.restype = None
    w, a = np.atleast_2d(w), np.atleast_2d(a)
    n = FORMATS[qtype].n_values(w.shape[1])
    s = np.empty(len(w), np.float32)
    for r in range(len(w)):
        fn(n, s[r:].ctypes.data, 0, w[r].ctypes.data, 0, a[r].ctypes.data, 0, 1)
    return s


def c_quantize_ref(lib: ctypes.CDLL, qtype: str, x: np.ndarray, fill: int = 0) -> np.ndarray:
    """``quantize_row_<t>_ref`` per row, into a buffer filled with ``fill``."""
    fn = getattr(lib, f"quantize_row_{c_name(qtype)}_ref")
    fn.argtypes, fn.restype = [VP, VP, ctypes.c_int64], None
    out = np.full((len(x), FORMATS[qtype].n_bytes(x.shape[1])), fill, np.uint8)
    for r in range(len(x)):
        fn(x[r].ctypes.data, out[r].ctypes.data, x.shape[1])
    return out


def c_libs() -> list:
    libs = [pytest.param(LIB, False, id="nofma")]
    if LIB_FMA:
        libs.append(pytest.param(LIB_FMA, True, id="fma"))
    return libs


needs_c = pytest.mark.skipif(not LIB, reason="set QCONFORM_GGML_LIB (ci/ggml-lib.sh builds it)")


@needs_c
@pytest.mark.parametrize("path,fma", c_libs())
def test_hand_vectors_are_ggml_c(path: str, fma: bool) -> None:
    """The hand derivations above hold for ggml's own ``*_generic`` functions."""
    lib = ctypes.CDLL(path)
    for qtype, (make, expected) in HAND.items():
        assert c_vec_dot(lib, qtype, *make())[0] == expected[fma], qtype


@needs_c
@pytest.mark.parametrize("path,fma", c_libs())
def test_matmul_is_c_ref_quantize_then_c_vec_dot(path: str, fma: bool) -> None:
    """``matmul_bt_quant`` = ggml's ``quantize_row_<vec_dot_type>_ref`` on each activation row, then
    ``ggml_vec_dot_*_generic`` for every (row, weight row), bit for bit, both twins, every pair."""
    lib = ctypes.CDLL(path)
    rng = np.random.default_rng(12)
    k, m, n = 512, 3, 4
    acts = (rng.standard_normal((m, k)) * rng.uniform(0.01, 50, (m, 1))).astype(np.float32)
    acts[0, :32] = np.arange(-16, 16) + 0.5  # exact .5 ties (the ref's roundf, ties away)
    for qtype, act in VEC_DOT_PAIRS.items():
        w = quantize((rng.standard_normal((n, k)) * 0.1).astype(np.float32), qtype)
        a8 = c_quantize_ref(lib, act, acts)
        theirs = np.stack([c_vec_dot(lib, qtype, w, np.repeat(a8[i : i + 1], n, 0)) for i in range(m)])
        for backend in BACKENDS:
            ours = matmul_bt_quant(w, qtype, acts, fma=fma, backend=backend)
            assert ours.tobytes() == theirs.tobytes(), (qtype, backend)


@needs_c
def test_q8_k_stale_bytes_are_ggml_c() -> None:
    """ggml's ``quantize_row_q8_K_ref`` leaves the masked bytes as the buffer held them (0xAB here) and
    writes every other byte as qconform does."""
    x = np.random.default_rng(13).standard_normal((3, 512)).astype(np.float32)
    x[0, :256], x[2, 256:] = 0, np.nan
    theirs = c_quantize_ref(ctypes.CDLL(LIB), "Q8_K", x, fill=0xAB)
    mask = q8_k_stale_mask(x)
    assert (theirs[mask] == 0xAB).all() and mask.sum() == 64
    assert (theirs[~mask] == quantize(x, "Q8_K")[~mask]).all()

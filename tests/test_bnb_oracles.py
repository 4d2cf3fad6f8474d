"""The bitsandbytes oracles without bitsandbytes: tables re-derived from their literals, hand-derived
vectors, numpy-vs-numba twins, argument errors, and broken variants that the vectors must catch.

Every expected code below is worked out from the tables in ``qconform.oracles.bnb.codes`` by hand
(the derivation is in the comment next to it), not read back from the oracle.
"""

from __future__ import annotations

import hashlib
from fractions import Fraction

import numpy as np
import pytest

from qconform.errors import ArgumentError
from qconform.formats.bf16 import fp32_to_bf16_bits
from qconform.oracles import bnb as O
from qconform.oracles.bnb import fma_f32
from qconform.oracles.bnb.codes import (
    CPU_BOUNDS,
    CPU_ORDER,
    DYNAMIC_MAP,
    DYNAMIC_MAP_SHA256,
    FP4,
    FP4_CUDA_LITERALS,
    FP4_CUDA_THRESHOLDS,
    FP4_NATIVE,
    FP4_RAW,
    NF4,
    NF4_CUDA_LITERALS,
    NF4_CUDA_THRESHOLDS,
    NF4_LITERALS,
)
from qconform.oracles.bnb.fourbit import pack_nibbles, unpack_nibbles
from qconform.oracles.bnb.rcp import RCP_TABLE_SIZE, load_rcp_table, reciprocal

BACKENDS = ("numpy", "numba")


def f32(*words: int) -> np.ndarray:
    return np.array(words, np.uint32).view(np.float32)


def bits(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.view({4: np.uint32, 2: np.uint16, 1: np.uint8}[a.itemsize])


def block(values: list[float] | np.ndarray, size: int = 32) -> np.ndarray:
    x = np.zeros(size, np.float32)
    x[: len(values)] = values
    return x


def codes_of(packed: np.ndarray, n: int) -> list[int]:
    return unpack_nibbles(packed, n).tolist()


def nearest_f32(literal: str) -> np.uint32:
    """The float32 nearest to a decimal literal, ties to even, by exact rational arithmetic (what nvcc
    does with ``0.86f``-style literals), not through double."""
    v = Fraction(literal)
    lo = np.float32(float(v))  # within an ulp; then settle exactly
    cands = [np.nextafter(lo, np.float32(-np.inf)), lo, np.nextafter(lo, np.float32(np.inf))]
    dist = [abs(Fraction(float(c)) - v) for c in cands]
    best = min(range(3), key=lambda i: (dist[i], int(cands[i].view(np.uint32)) & 1))
    return cands[best].view(np.uint32)


# ---- tables ---------------------------------------------------------------------------------------


def test_nf4_table_is_the_float32_of_the_python_literals() -> None:
    # get_4bit_type: torch.tensor(python floats) rounds each double to float32; max is 1.0
    assert bits(NF4).tolist() == [int(bits(np.float32(float(s)))) for s in NF4_LITERALS]
    assert np.all(np.diff(NF4) > 0) and NF4[7] == 0 and NF4[0] == -1 and NF4[15] == 1


def test_fp4_tables() -> None:
    # raw / 12 in float32; Python's list holds the int -0 (+0.0) at 8, the C++/CUDA tables -0.0
    expected = (np.array(FP4_RAW, np.float32) / np.float32(12)).astype(np.float32)
    assert bits(FP4).tolist() == bits(expected).tolist()
    assert bits(FP4)[8] == 0 and bits(FP4_NATIVE)[8] == 0x80000000
    assert bits(FP4_NATIVE)[:8].tolist() == bits(FP4)[:8].tolist()
    assert (FP4_NATIVE[9:] == -FP4_NATIVE[1:8]).all()
    assert bits(FP4)[1] == 0x3BAAAAAB  # 0.0625 / 12 = 1/192, not create_fp8_map's 0.0208


def test_cuda_thresholds_are_correctly_rounded_literals() -> None:
    assert bits(NF4_CUDA_THRESHOLDS).tolist() == [int(nearest_f32(s)) for s in NF4_CUDA_LITERALS]
    assert bits(FP4_CUDA_THRESHOLDS).tolist() == [int(nearest_f32(s)) for s in FP4_CUDA_LITERALS]
    # the trap: np.float32(str) rounds through double; for k = 0, 8, 12, 14 that lands on the midpoint
    through_double = bits(np.array([np.float32(s) for s in NF4_CUDA_LITERALS], np.float32))
    assert np.flatnonzero(through_double != bits(NF4_CUDA_THRESHOLDS)).tolist() == [0, 8, 12, 14]
    assert (through_double[[0, 8, 12, 14]] == bits(CPU_BOUNDS["nf4"])[[0, 8, 12, 14]]).all()


def test_cpu_bounds_are_float32_midpoints() -> None:
    # (c[k] + c[k+1]) / 2 in float32 over the sorted code
    nf4_mid = [0xBF591CD8, 0xBF1C5270, 0xBEEB8480, 0xBEADEA76, 0xBE703CEC, 0xBE0D38BC, 0xBD3A7871, 0x3D22FAFF,
               0x3DF64862, 0x3E5067E0, 0x3E9582D4, 0x3EC753F9, 0x3F006D04, 0x3F248DAF, 0x3F5C89DA]  # fmt: skip
    assert bits(CPU_BOUNDS["nf4"]).tolist() == nf4_mid
    assert CPU_ORDER["fp4"].tolist() == [11, 10, 13, 12, 15, 14, 9, 0, 8, 1, 6, 7, 4, 5, 2, 3]
    assert (np.diff(FP4[CPU_ORDER["fp4"]]) >= 0).all() and CPU_BOUNDS["fp4"][7] == 0


def test_dynamic_map() -> None:
    assert hashlib.sha256(DYNAMIC_MAP.astype("<f4").tobytes()).hexdigest() == DYNAMIC_MAP_SHA256
    assert np.all(np.diff(DYNAMIC_MAP) > 0)
    assert DYNAMIC_MAP[127] == 0 and DYNAMIC_MAP[255] == 1 and bits(DYNAMIC_MAP)[0] == 0xBF7E3333
    assert (DYNAMIC_MAP[128:255] == -DYNAMIC_MAP[126::-1]).all()


# ---- hand-derived 4-bit vectors ---------------------------------------------------------------------
# NF4 float32 midpoints (k between codes k, k+1): -0.848 -0.611 -0.460 -0.340 -0.235 -0.138 -0.0455
# 0.0398 0.120 0.204 0.292 0.389 0.502 0.643 0.861. FP4 sorted: -1(11) -2/3(10) -1/2(13) -1/3(12)
# -1/4(15) -1/6(14) -1/192(9) 0(0) 0(8) 1/192(1) 1/6(6) 1/4(7) 1/3(4) 1/2(5) 2/3(2) 1(3), midpoints
# -0.833 -0.583 -0.417 -0.292 -0.208 -0.0859 -1/384 0 1/384 0.0859 0.208 0.292 0.417 0.583 0.833.
NF4_X = [1.0, 0.5, -0.3, 0.0, 0.1, -1.0, 0.9, -0.05]
# absmax 1 -> s = x. q = #midpoints < s: 1.0 -> 15; 0.5 -> 12 (0.389 < 0.5 < 0.502); -0.3 -> 4 (-0.340 <
# -0.3 < -0.235); 0.0 -> 7; 0.1 -> 8 (0.0398 < 0.1 < 0.120); -1.0 -> 0; 0.9 -> 15; -0.05 -> 6 (-0.138 <
# -0.05 < -0.0455). The trees give the same (no value near a threshold). Padding zeros -> 7.
NF4_CODES = [15, 12, 4, 7, 8, 0, 15, 6]
NF4_BYTES = [0xFC, 0x47, 0x80, 0xF6] + [0x77] * 12
FP4_X = [1.0, 0.3, -0.3, 0.001, -0.001, 0.0, 0.7, -0.2]
# cpu: #midpoints < s then order[]: 1.0 -> 15 -> 3; 0.3 -> 12 -> 4 (1/3); -0.3 -> 3 -> 12 (-1/3);
# 0.001 -> 8 -> 8 (the second zero slot); -0.001 -> 7 -> 0; 0.0 -> 7 -> 0; 0.7 -> 14 -> 2 (2/3);
# -0.2 -> 5 -> 14 (-1/6).
FP4_CPU_CODES = [3, 4, 12, 8, 0, 0, 2, 14]
# cuda tree on |s| (T0..T6 = 0.0026 0.0859 0.208 0.292 0.417 0.583 0.833), sign 8 if s < 0: 1.0 -> 3;
# 0.3 -> T3 < a <= T4 -> 4; -0.3 -> 8|4; 0.001 <= T0 -> 0; -0.001 -> 8|0 = 8; 0.7 -> T5 < a <= T6 -> 2;
# -0.2 -> T1 < a <= T2 -> 6, |8 = 14.
FP4_CUDA_CODES = [3, 4, 12, 0, 8, 0, 2, 14]


@pytest.mark.parametrize("backend", BACKENDS)
class TestHandVectors:
    def test_nf4(self, backend: str) -> None:
        for variant in ("cpu", "default", "cuda", "rocm"):
            packed, st = O.quantize_4bit(block(NF4_X), 32, False, "nf4", variant, backend=backend)
            assert packed.shape == (16, 1) and packed[:, 0].tolist() == NF4_BYTES, variant
            assert st.absmax.tolist() == [1.0] and st.quant_type == "nf4" and st.dtype == "float32"

    def test_fp4(self, backend: str) -> None:
        for variant, want in (("cpu", FP4_CPU_CODES), ("cuda", FP4_CUDA_CODES)):
            packed, _ = O.quantize_4bit(block(FP4_X), 32, False, "fp4", variant, backend=backend)
            assert codes_of(packed, 8) == want, variant

    def test_scale_and_dequantize(self, backend: str) -> None:
        # absmax 2 -> r = 0.5 exactly; s = [1, 0.5, -0.25] -> 15, 12, 4 (-0.340 < -0.25 < -0.235).
        # Dequantize: fl32(code * 2) is exact: 2.0, 2*0x3EE1A4B8 = 0x3F61A4B8, 2*0xBE91A24D = 0xBF11A24D
        packed, st = O.quantize_4bit(block([2.0, 1.0, -0.5]), 32, False, "nf4", "cpu", backend=backend)
        assert codes_of(packed, 3) == [15, 12, 4]
        y = O.dequantize_4bit(packed, st, backend=backend)
        assert bits(y[:3]).tolist() == [0x40000000, 0x3F61A4B8, 0xBF11A24D]
        y16 = O.dequantize_4bit(packed, st, "float16", backend=backend)
        assert y16.dtype == np.float16 and y16[0] == 2.0

    def test_midpoint_ties_go_down_on_cpu_up_on_cuda(self, backend: str) -> None:
        # s exactly at the float32 midpoints k = 0, 12, 14: cpu counts bounds strictly below -> lower
        # code; cuda's literals are one ulp nearer zero than those midpoints (0xBF591CD9 < s for k = 0,
        # 0x3F006D03 and 0x3F5C89D9 < s), so s > t_k -> upper code. s = 0x3DF64863 (k = 8 midpoint + 1
        # ulp): cpu 9 (midpoint 0x3DF64862 < s), cuda 8 (t_8 = s, not >).
        s = f32(0xBF591CD8, 0x3F006D04, 0x3F5C89DA, 0x3DF64863)
        x = block(np.concatenate([[1.0], s]))
        cpu, _ = O.quantize_4bit(x, 32, False, "nf4", "cpu", backend=backend)
        cuda, _ = O.quantize_4bit(x, 32, False, "nf4", "cuda", backend=backend)
        assert codes_of(cpu, 5)[1:] == [0, 12, 14, 9]
        assert codes_of(cuda, 5)[1:] == [1, 13, 15, 8]

    def test_fp4_shifted_thresholds(self, backend: str) -> None:
        # s = 0x3E555556 (f32 midpoint of 1/6 and 1/4): cpu tie -> lower value 1/6 (code 6); the cuda T2
        # is 0x3E555555 < s -> 7 (1/4). Negative: cpu -> the lower value -1/4 (15); cuda 8|7 = 15.
        x = block([1.0, *f32(0x3E555556, 0xBE555556, 0x3B2AAAB0)])
        cpu, _ = O.quantize_4bit(x, 32, False, "fp4", "cpu", backend=backend)
        cuda, _ = O.quantize_4bit(x, 32, False, "fp4", "cuda", backend=backend)
        # 0x3B2AAAB0 lies between the midpoint 1/384 (0x3B2AAAAB) and T0 (0x3B2AAAB9): cpu 1, cuda 0
        assert codes_of(cpu, 4)[1:] == [6, 15, 1]
        assert codes_of(cuda, 4)[1:] == [7, 15, 0]

    def test_zero_blocks(self, backend: str) -> None:
        # cpu: absmax 0 -> clamp 1e-38 -> s = 0 -> NF4 7; the tail block returns the clamped 1e-38.
        # cuda: r = 1/0 = inf, 0 * inf = NaN -> NF4 0, dequantized -1 * 0 = -0.0.
        x = np.zeros(33, np.float32)
        cpu, st = O.quantize_4bit(x, 32, False, "nf4", "cpu", backend=backend)
        assert set(codes_of(cpu, 34)) == {7} and bits(st.absmax).tolist() == [0, 0x006CE3EE]
        cuda, st = O.quantize_4bit(x, 32, False, "nf4", "cuda", backend=backend)
        assert set(codes_of(cuda, 34)) == {0} and st.absmax.tolist() == [0, 0]
        y = O.dequantize_4bit(cuda, st, variant="cuda", backend=backend)
        assert bits(y).tolist() == [0x80000000] * 33

    def test_nan(self, backend: str) -> None:
        # cpu: torch max propagates NaN -> absmax NaN, s NaN -> bucketize 15 for every value.
        # cuda: fmaxf skips NaN -> absmax 1; the NaN itself -> NF4 0 -> dequantizes to -absmax.
        x = block([np.nan, 1.0, 0.5])
        cpu, st = O.quantize_4bit(x, 32, False, "nf4", "cpu", backend=backend)
        assert set(codes_of(cpu, 32)) == {15} and np.isnan(st.absmax[0])
        cuda, st = O.quantize_4bit(x, 32, False, "nf4", "cuda", backend=backend)
        assert codes_of(cuda, 3) == [0, 15, 12] and st.absmax[0] == 1
        assert O.dequantize_4bit(cuda, st, variant="cuda", backend=backend)[0] == -1.0
        _, st = O.quantize_4bit(block([np.nan] * 32), 32, False, "nf4", "cuda", backend=backend)
        assert st.absmax[0] == -np.finfo(np.float32).max  # fmaxf from -FLT_MAX over all-NaN
        # an inf: absmax inf, r = 0; inf * 0 = NaN -> cuda 0, cpu 15; finite * 0 = 0 -> 7 on both
        x = block([np.inf, 1.0, -2.0])
        cuda, _ = O.quantize_4bit(x, 32, False, "nf4", "cuda", backend=backend)
        cpu, _ = O.quantize_4bit(x, 32, False, "nf4", "cpu", backend=backend)
        assert codes_of(cuda, 3) == [0, 7, 7] and codes_of(cpu, 3) == [15, 7, 7]

    def test_subnormals(self, backend: str) -> None:
        # cuda flushes fp32 inputs below 2^-126 to 0 (a block of them is a zero block); cpu keeps them,
        # absmax = 2^-140 < 1e-38 -> clamp -> s = 2^-140 * fl32(1/1e-38) ~ 7e-5 -> NF4 7.
        x = block([2.0**-140, 2.0**-141])
        cuda, st = O.quantize_4bit(x, 32, False, "nf4", "cuda", backend=backend)
        assert st.absmax[0] == 0 and set(codes_of(cuda, 2)) == {0}
        cpu, st = O.quantize_4bit(x, 32, False, "nf4", "cpu", backend=backend)
        assert st.absmax[0] == np.float32(2.0**-140) and codes_of(cpu, 2) == [7, 7]

    def test_odd_length_pads_with_a_quantized_zero(self, backend: str) -> None:
        # n = 3: 2 bytes, the last low nibble is quantize(0) with the block's scale: NF4 7, FP4 0
        for qt, pad in (("nf4", 7), ("fp4", 0)):
            packed, _ = O.quantize_4bit(np.array([1.0, -1.0, 0.5], np.float32), 64, False, qt, "cpu", backend=backend)
            assert packed.shape == (2, 1) and codes_of(packed, 4)[3] == pad

    def test_tail_divides_full_blocks_multiply(self, backend: str) -> None:
        # absmax 3: fl32(x / 3) and fl32(x * fl32(1/3)) straddle an NF4 midpoint for these x (found by
        # search): the full block (reciprocal, then multiply) gives the lower code of each pair, the tail
        # block (division) the other one.
        xs = f32(0xBFEA7BA7, 0xBF826FD8, 0xBED3D519, 0x3DF4787F, 0x3F957EFB, 0x3FF6D487)
        row = np.concatenate([[3.0], xs]).astype(np.float32)
        full_and_tail = np.concatenate([block(row, 32), row])
        packed, _ = O.quantize_4bit(full_and_tail, 32, False, "nf4", "cpu", backend=backend)
        q = codes_of(packed, full_and_tail.size)
        assert q[1:7] == [1, 3, 5, 8, 12, 14]  # multiply
        assert q[33:39] == [2, 4, 6, 7, 11, 13]  # divide


@pytest.mark.parametrize("backend", BACKENDS)
def test_dequantize_fp4_code_8_sign(backend: str) -> None:
    # byte 0x88 = codes (8, 8): +0 from the Python table (default path, odd last dim, AVX-512 table),
    # -0 from the C++ scalar and CUDA tables
    st = O.QuantState(np.ones(1, np.float32), (2, 40), "float32", 128, O.get_4bit_type("fp4"), "fp4")
    packed = np.full(40, 0x88, np.uint8)
    for variant, negative in (("cpu", True), ("cpu-avx512", True), ("default", False), ("cuda", True)):
        assert np.signbit(O.dequantize_4bit(packed, st, variant=variant, backend=backend)).all() == negative, variant
    st.shape = (2, 64)  # 64 % 16 == 0: the AVX-512 kernel
    packed = np.full(64, 0x88, np.uint8)
    assert not np.signbit(O.dequantize_4bit(packed, st, variant="cpu-avx512", backend=backend)).any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_dequantize_avx512_indexes_absmax_per_row(backend: str) -> None:
    # shape (2, 48), bs 32: flat blocks [0,32) [32,64) [64,96) -> absmax 1, 2, 3. The AVX-512 kernel uses
    # row*(48//32) + col//32: row 0 cols 32..47 -> slot 1 (=flat), row 1 cols 0..31 -> slot 1 (flat: 1
    # for cols 0..15, 2 for 16..31), row 1 cols 32..47 -> slot 2. Codes all 15 (1.0).
    st = O.QuantState(np.array([1, 2, 3], np.float32), (2, 48), "float32", 32, O.get_4bit_type("nf4"), "nf4")
    packed = np.full(48, 0xFF, np.uint8)
    flat = O.dequantize_4bit(packed, st, variant="cpu", backend=backend).reshape(-1)
    rows = O.dequantize_4bit(packed, st, variant="cpu-avx512", backend=backend).reshape(-1)
    assert flat.tolist() == [1] * 32 + [2] * 32 + [3] * 32
    assert rows.tolist() == [1] * 32 + [2] * 16 + [2] * 32 + [3] * 16


# ---- 8-bit blockwise ------------------------------------------------------------------------------


def test_blockwise_zero_and_tie_rules() -> None:
    # A block [0, 1, 0, ...]: absmax 1, s = 0 or 1. default: #midpoints < 0 = 127 (code[127] = 0);
    # cuda: the search ends on code[127] = 0 exactly -> 127; 1.0 -> 255 everywhere. cpu LUT: 0 -> slot
    # trunc(((0+1)*0.5)*65535 + 0.5) = 32768, val = -1 + 65536/65535 = 1.53e-5; the first midpoint >= val
    # is mid(131, 132) = (2.13e-5 + 4.38e-5)/2 (mid(130, 131) = 1.45e-5 is below) -> 131.
    x = np.zeros(256, np.float32)
    x[1] = 1.0
    for variant, zero in (("cpu", 131), ("default", 127), ("cuda", 127)):
        q, st = O.quantize_blockwise(x, blocksize=256, variant=variant)
        assert q[:3].tolist() == [zero, 255, zero] and st.absmax.tolist() == [1.0], variant
    # all-zero block: C++ writes 0s; default clamps absmax to 1e-38 -> s = 0 -> 127; cuda 0*inf = NaN -> 0
    for variant, want in (("cpu", 0), ("default", 127), ("cuda", 0)):
        q, _ = O.quantize_blockwise(np.zeros(256, np.float32), blocksize=256, variant=variant)
        assert set(q.tolist()) == {want}, variant
    # s exactly at the float32 midpoint of codes 200, 201: default -> lower (200); cuda's last pivot is
    # even -> 200 too; at the midpoint of 201, 202 the even index 202 wins on cuda, 201 on default
    mids = ((DYNAMIC_MAP[200:202] + DYNAMIC_MAP[201:203]) / np.float32(2)).astype(np.float32)
    x = np.zeros(256, np.float32)
    x[:3] = [1.0, *mids]
    for variant, want in (("default", [200, 201]), ("cuda", [200, 202])):
        q, _ = O.quantize_blockwise(x, blocksize=256, variant=variant)
        assert q[1:3].tolist() == want, variant


def test_dequantize_blockwise_rounds_once() -> None:
    # code[255] * 3 = 3.0; code[0] * 3 = fl32(-0.99296874 * 3); bf16 by bit trick on cpu
    q = np.array([255, 0], np.uint8)
    y = O.dequantize_blockwise(q, absmax=np.array([3.0], np.float32), blocksize=4)
    assert y[0] == 3 and y[1] == np.float32(DYNAMIC_MAP[0] * np.float32(3))
    yb = O.dequantize_blockwise(q, absmax=np.array([3.0], np.float32), blocksize=4, dtype="bfloat16")
    assert yb.tolist() == fp32_to_bf16_bits(y, "bit_trick").tolist()


# ---- nested statistics ----------------------------------------------------------------------------


def test_nested_state_and_rounding_modes() -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal(64 * 700).astype(np.float32)
    packed, st = O.quantize_4bit(x, 64, True, "nf4", "cpu")
    assert st.nested and st.absmax.dtype == np.uint8 and st.absmax.shape == (700,)
    assert st.state2_absmax.shape == (3,)  # ceil(700 / 256)
    assert st.offset == np.float32(np.abs(x.reshape(700, 64)).max(1).mean(dtype=np.float64))  # the f64 mean
    two = O.nested_absmax(st, "cpu", "two_round")
    code8, a2 = st.state2_code[st.absmax], np.repeat(st.state2_absmax, 256)[:700]
    assert bits(two).tolist() == bits((code8 * a2).astype(np.float32) + st.offset).tolist()
    fused = O.nested_absmax(st, "cpu", "fma")
    off = Fraction(float(st.offset))
    exact = [Fraction(float(c)) * Fraction(float(a)) + off for c, a in zip(code8, a2, strict=True)]
    assert bits(fused).tolist() == [int(bits(_round_f32(e))) for e in exact]
    assert (two != fused).any()  # one rounding vs two differ on some blocks
    plain = O.dequantize_4bit(packed, st)
    assert plain.shape == (64 * 700,) and np.isfinite(plain).all()
    # the offset can be given (bitsandbytes' torch mean); it changes the centring and so the codes
    _, st2 = O.quantize_4bit(x, 64, True, "nf4", "cpu", offset=np.float32(st.offset) * np.float32(1.01))
    assert not np.array_equal(st2.absmax, st.absmax)


def _round_f32(v: Fraction) -> np.float32:
    """Round an exact rational to the nearest float32, ties to even."""
    lo = np.float32(float(v))
    cands = [np.nextafter(lo, np.float32(-np.inf)), lo, np.nextafter(lo, np.float32(np.inf))]
    return min(cands, key=lambda c: (abs(Fraction(float(c)) - v), int(c.view(np.uint32)) & 1))


def test_fma_f32_is_one_rounding() -> None:
    rng = np.random.default_rng(8)
    a = rng.standard_normal(400).astype(np.float32)
    b = rng.standard_normal(400).astype(np.float32)
    c = rng.standard_normal(400).astype(np.float32)
    # ties: a*b + c exactly halfway between floats, and just off it: 1 + 2^-24 (+- 2^-70 via the product)
    a = np.concatenate([a, f32(0x3F800000, 0x3F800001, 0x3F7FFFFF)])
    b = np.concatenate([b, np.float32([2.0**-24, 2.0**-24, 2.0**-24])])
    c = np.concatenate([c, np.float32([1.0, 1.0, 1.0])])
    got = fma_f32(a, b, c)
    exact = [Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)) for x, y, z in zip(a, b, c, strict=True)]
    want = [_round_f32(e) for e in exact]
    assert bits(got).tolist() == [int(bits(w)) for w in want]
    assert bits(got[-3:]).tolist() == [0x3F800000, 0x3F800001, 0x3F800000]


# ---- reciprocal ----------------------------------------------------------------------------------


def test_reciprocal_ieee_and_table() -> None:
    m = np.float32([1.0, 3.0, 6.0, 0.0, -0.0, np.inf, 3e38, 2.0**-140, -3.0])
    r = reciprocal(m, ftz=True)
    assert bits(r[:3]).tolist() == [0x3F800000, 0x3EAAAAAB, 0x3E2AAAAB]  # 1, fl32(1/3), fl32(1/6)
    assert r[3] == np.inf and r[4] == -np.inf and r[5] == 0 and r[6] == 0 and r[7] == np.inf and r[8] < 0
    assert reciprocal(np.float32([3e38]), ftz=False)[0] > 0  # a subnormal result kept without ftz
    up = np.ones(RCP_TABLE_SIZE, np.int8)  # every mantissa one ulp above IEEE
    rt = reciprocal(m, ftz=True, table=up)
    # 1/1.5 = 0x3F2AAAAB -> 0x3F2AAAAC, scaled by 2^-2 exactly for 6.0; sign kept; specials as IEEE
    assert bits(rt[[0, 1, 2, 8]]).tolist() == [0x3F800001, 0x3EAAAAAC, 0x3E2AAAAC, 0xBEAAAAAC]
    assert rt[3] == np.inf and rt[5] == 0 and rt[6] == 0 and rt[7] == np.inf  # 3e38 -> subnormal -> 0


def test_rcp_table_changes_cuda_codes() -> None:
    # absmax 3: IEEE r = 0x3EAAAAAB; a table entry +1 for the mantissa of 3 (1.5) makes it 0x3EAAAAAC.
    # Scan x up from 3*t_12 to the first x with x*r <= t_12 < x*r': without the table NF4 12, with it 13
    t12 = NF4_CUDA_THRESHOLDS[12]
    r0, r1 = f32(0x3EAAAAAB)[0], f32(0x3EAAAAAC)[0]
    x = np.float32(t12 * np.float32(3))
    while not (np.float32(x * r0) <= t12 < np.float32(x * r1)):
        x = np.nextafter(x, np.float32(np.inf))
    row = block([3.0, x])
    table = np.zeros(RCP_TABLE_SIZE, np.int8)
    table[0x40400000 & 0x7FFFFF] = 1  # 3.0 = 1.5 * 2^1: mantissa field 0x400000
    plain, _ = O.quantize_4bit(row, 32, False, "nf4", "cuda")
    approx, _ = O.quantize_4bit(row, 32, False, "nf4", "cuda", rcp_table=table)
    assert codes_of(plain, 2)[1] == 12 and codes_of(approx, 2)[1] == 13


def test_load_rcp_table(tmp_path) -> None:
    table = np.zeros(RCP_TABLE_SIZE, np.int8)
    path = tmp_path / "rcp.bin"
    table.tofile(path)
    assert load_rcp_table(path, sha256=None).shape == (RCP_TABLE_SIZE,)
    with pytest.raises(ArgumentError, match="rcp_table: .* does not have sha256"):
        load_rcp_table(path)
    np.save(tmp_path / "short.npy", table[:10])
    with pytest.raises(ArgumentError, match=r"rcp_table: must be None or an int8 numpy array of shape \(8388608,\)"):
        load_rcp_table(tmp_path / "short.npy", sha256=None)


def test_bf16_rules() -> None:
    x = f32(0x3F808000, 0x3F818000, 0x7FC00001, 0xFFFFFFFF, 0x7F800001, 0x00400000, 0x807FFFFF, 0xFF800000)
    # ties to even (0x3F80|8000 -> 0x3F80, 0x3F81|8000 -> 0x3F82); NaN: rne 0x7FC0, rne_ffff 0xFFFF, bit
    # trick adds 0x7FFF to the raw bits (0xFFFFFFFF wraps to 0, 0x7F800001 becomes inf), cvtne keeps the
    # top half and sets the quiet bit; subnormal 0x00400000: 0x0040 or flushed to 0 by cvtne
    want = {
        "rne": [0x3F80, 0x3F82, 0x7FC0, 0x7FC0, 0x7FC0, 0x0040, 0x8080, 0xFF80],
        "rne_ffff": [0x3F80, 0x3F82, 0xFFFF, 0xFFFF, 0xFFFF, 0x0040, 0x8080, 0xFF80],
        "bit_trick": [0x3F80, 0x3F82, 0x7FC0, 0x0000, 0x7F80, 0x0040, 0x8080, 0xFF80],
        "cvtne": [0x3F80, 0x3F82, 0x7FC0, 0xFFFF, 0x7FC0, 0x0000, 0x8000, 0xFF80],
    }
    for rule, expected in want.items():
        assert fp32_to_bf16_bits(x, rule).tolist() == expected, rule


# ---- twins --------------------------------------------------------------------------------------------


def _twin_inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(21)
    x = (rng.standard_normal(64 * 300 + 17) * 2).astype(np.float32)
    x[64:128] = 0
    x[200] = np.nan
    x[300:364] = np.nan
    x[500] = np.inf
    x[700:764] = f32(*range(1, 65))
    x[900:964] = np.concatenate([[1.0], CPU_BOUNDS["nf4"], CPU_BOUNDS["fp4"], NF4_CUDA_THRESHOLDS,
                                 FP4_CUDA_THRESHOLDS, -FP4_CUDA_THRESHOLDS, np.zeros(4)])  # fmt: skip
    x[-5:] = 0
    bf16 = (rng.integers(0, 2**16, 4097, dtype=np.uint32)).astype(np.uint16)
    return [x, x.astype(np.float16), bf16, x[:5]]


@pytest.mark.parametrize("variant", O.VARIANTS)
def test_quantize_twins_byte_identical(variant: str) -> None:
    for a in _twin_inputs():
        for bs in (32, 64, 256, 4096):
            for qt in ("nf4", "fp4"):
                with np.errstate(all="ignore"):
                    p1, s1 = O.quantize_4bit(a, bs, True, qt, variant, backend="numpy")
                    p2, s2 = O.quantize_4bit(a, bs, True, qt, variant, backend="numba")
                    y1 = O.dequantize_4bit(p1, s1, "float32", variant, backend="numpy")
                    y2 = O.dequantize_4bit(p1, s1, "float32", variant, backend="numba")
                assert np.array_equal(p1, p2), (variant, a.dtype, bs, qt)
                assert bits(s1.absmax).tolist() == bits(s2.absmax).tolist()
                assert bits(s1.state2_absmax).tolist() == bits(s2.state2_absmax).tolist()
                assert bits(y1).tolist() == bits(y2).tolist()
    if variant == "cuda":
        table = np.random.default_rng(2).integers(-1, 2, RCP_TABLE_SIZE).astype(np.int8)
        a = _twin_inputs()[0]
        p1, _ = O.quantize_4bit(a, 64, False, "nf4", "cuda", rcp_table=table, backend="numpy")
        p2, _ = O.quantize_4bit(a, 64, False, "nf4", "cuda", rcp_table=table, backend="numba")
        assert np.array_equal(p1, p2)


def test_dequantize_twins_on_random_bytes() -> None:
    rng = np.random.default_rng(4)
    for shape, bs in (((3, 4144), 32), ((5, 40), 64), ((7, 33), 128), ((1001,), 2048)):
        n = int(np.prod(shape))
        nb = -(-n // bs)
        absmax = (rng.standard_normal(nb) * 3).astype(np.float32)
        absmax[[0, -1]] = [np.nan, 1e-39]
        absmax[nb // 2] = np.inf if nb > 2 else absmax[nb // 2]
        packed = rng.integers(0, 256, (n + 1) // 2, dtype=np.uint8)
        for qt in ("nf4", "fp4"):
            st = O.QuantState(absmax, shape, "bfloat16", bs, O.get_4bit_type(qt), qt)
            for variant in O.VARIANTS:
                for dtype in O.DTYPES:
                    with np.errstate(all="ignore"):
                        y1 = O.dequantize_4bit(packed, st, dtype, variant, backend="numpy")
                        y2 = O.dequantize_4bit(packed, st, dtype, variant, backend="numba")
                    assert y1.shape == shape and bits(y1).tolist() == bits(y2).tolist(), (shape, variant, dtype)


def test_pack_unpack_round_trip() -> None:
    nib = np.random.default_rng(0).integers(0, 16, 64, dtype=np.uint8)
    assert np.array_equal(unpack_nibbles(pack_nibbles(nib), 64), nib)
    assert pack_nibbles(np.array([1, 2], np.uint8)).tolist() == [0x12]


# ---- broken variants the vectors catch -------------------------------------------------------------


def _cpu_model(x: np.ndarray, quant_type: str, side: str = "left", low_first: bool = False) -> list[int]:
    """A one-block cpu quantizer written from the spec, with switches that break one rule each."""
    s = np.clip(x * (np.float32(1) / np.abs(x).max()), -1, 1).astype(np.float32)
    q = np.searchsorted(CPU_BOUNDS[quant_type], s, side=side)
    q = CPU_ORDER["fp4"][q] if quant_type == "fp4" else q
    pairs = q.reshape(-1, 2)
    return (pairs[:, 1] << 4 | pairs[:, 0] if low_first else pairs[:, 0] << 4 | pairs[:, 1]).tolist()


def _cuda_nf4_model(x: np.ndarray, thresholds: np.ndarray) -> list[int]:
    s = (x * (np.float32(1) / np.abs(x).max())).astype(np.float32)
    q = np.searchsorted(thresholds, s, side="left")
    return (q[0::2] << 4 | q[1::2]).tolist()


TIE_BLOCK = block(np.concatenate([[1.0, 0.5], f32(0xBF591CD8, 0x3F006D04, 0x3F5C89DA, 0x3DF64863)]))


def _oracle_bytes(x: np.ndarray, quant_type: str, variant: str) -> list[int]:
    return O.quantize_4bit(x, 32, False, quant_type, variant)[0][:, 0].tolist()


def test_low_nibble_first_is_caught() -> None:
    assert _cpu_model(block(NF4_X), "nf4") == _oracle_bytes(block(NF4_X), "nf4", "cpu") == NF4_BYTES
    assert _cpu_model(block(NF4_X), "nf4", low_first=True) != NF4_BYTES


def test_ties_to_the_upper_code_on_cpu_are_caught() -> None:
    for qt in ("nf4", "fp4"):
        assert _cpu_model(TIE_BLOCK, qt) == _oracle_bytes(TIE_BLOCK, qt, "cpu")
        assert _cpu_model(TIE_BLOCK, qt, side="right") != _oracle_bytes(TIE_BLOCK, qt, "cpu")


def test_nf4_thresholds_at_exact_midpoints_on_cuda_are_caught() -> None:
    want = _oracle_bytes(TIE_BLOCK, "nf4", "cuda")
    assert _cuda_nf4_model(TIE_BLOCK, NF4_CUDA_THRESHOLDS) == want
    assert _cuda_nf4_model(TIE_BLOCK, CPU_BOUNDS["nf4"]) != want  # the float32 midpoints
    through_double = np.array([np.float32(s) for s in NF4_CUDA_LITERALS], np.float32)
    assert _cuda_nf4_model(TIE_BLOCK, through_double) != want  # np.float32("literal") rounds via double


# ---- argument validation --------------------------------------------------------------------------


def _state() -> O.QuantState:
    return O.quantize_4bit(np.ones(64, np.float32), 64, False, "nf4")[1]


BAD_CALLS = [
    (lambda: O.quantize_4bit([1.0, 2.0]), r"A: must be a numpy.ndarray"),
    (lambda: O.quantize_4bit(np.ones(4, np.float64)), r"A: dtype must be float32, float16, or bfloat16"),
    (lambda: O.quantize_4bit(np.ones(0, np.float32)), r"A: must have at least one dimension and one element"),
    (lambda: O.quantize_4bit(np.array(1.0, np.float32)), r"A: must have at least one dimension"),
    (lambda: O.quantize_4bit(np.ones(4, np.float32), blocksize=16), r"blocksize: must be one of 32, 64"),
    (lambda: O.quantize_4bit(np.ones(4, np.float32), blocksize=True), r"blocksize: must be one of"),
    (lambda: O.quantize_4bit(np.ones(4, np.float32), quant_type="int4"), r"quant_type: must be one of 'nf4', 'fp4'"),
    (lambda: O.quantize_4bit(np.ones(4, np.float32), compress_statistics=1), r"compress_statistics: must be one of"),
    (lambda: O.quantize_4bit(np.ones(4, np.float32), variant="gpu"), r"variant: must be one of 'cpu'"),
    (lambda: O.quantize_4bit(np.ones(4, np.float32), backend="c"), r"backend: must be one of 'numba', 'numpy'"),
    (lambda: O.quantize_4bit(np.ones(4, np.float32), offset=1.0), r"offset: only applies with compress_statistics"),
    (lambda: O.quantize_4bit(np.ones(4, np.float32), rcp_table=np.zeros(8, np.int8)), r"rcp_table: must be None"),
    (
        lambda: O.quantize_4bit(np.ones(4, np.float32), rcp_table=np.zeros(RCP_TABLE_SIZE, np.int8)),
        r"rcp_table: only the 'cuda' variant",
    ),
    (lambda: O.dequantize_4bit(np.zeros(32, np.uint8), "state"), r"quant_state: must be a QuantState"),
    (lambda: O.dequantize_4bit(np.zeros(31, np.uint8), _state()), r"packed: must hold \(n \+ 1\) // 2 = 32 bytes"),
    (lambda: O.dequantize_4bit(np.zeros(32, np.int8), _state()), r"packed: must be a uint8 numpy.ndarray"),
    (lambda: O.dequantize_4bit(np.zeros(32, np.uint8), _state(), "float64"), r"dtype: must be one of 'float32'"),
    (lambda: O.dequantize_4bit(np.zeros(32, np.uint8), _state(), avx512bf16=2), r"avx512bf16: must be one of"),
    (
        lambda: O.dequantize_4bit(np.zeros(32, np.uint8), O.QuantState(np.ones(2, np.float32), (64,), "float32",
                                                                       64, NF4, "nf4")),  # fmt: skip
        r"quant_state.absmax: must be float32 of shape \(1,\) for 64 values",
    ),
    (
        lambda: O.dequantize_4bit(np.zeros(32, np.uint8), O.QuantState(np.ones(1, np.float32), (64,), "float32",
                                                                       48, NF4, "nf4")),  # fmt: skip
        r"quant_state.blocksize: must be one of",
    ),
    (
        lambda: O.dequantize_4bit(np.zeros(32, np.uint8), O.QuantState(np.ones(1, np.uint8), (64,), "float32", 64,
                                                                       NF4, "nf4", offset=np.float32(0))),  # fmt: skip
        r"quant_state.state2_absmax: must be float32 of shape \(1,\) when nested",
    ),
    (lambda: O.quantize_blockwise(np.ones(4, np.float32), blocksize=0), r"blocksize: must be a positive int"),
    (lambda: O.quantize_blockwise(np.ones(4, np.float32), code=np.ones(16, np.float32)), r"code: must be a float32"),
    (lambda: O.quantize_blockwise(np.ones(4, np.float32), code=DYNAMIC_MAP[::-1].copy()), r"code: must be sorted"),
    (lambda: O.dequantize_blockwise(np.zeros(4, np.int8), absmax=np.ones(1, np.float32)), r"A: must be a uint8"),
    (lambda: O.dequantize_blockwise(np.zeros(4, np.uint8)), r"absmax: required when quant_state is not given"),
    (lambda: O.nested_absmax(_state_nested(), mode="fast"), r"mode: must be one of 'two_round', 'fma'"),
]


ERROR_IDS = [f"{m.split(':')[0]}-{i}" for i, (_, m) in enumerate(BAD_CALLS)]


def _state_nested() -> O.QuantState:
    return O.quantize_4bit(np.ones(64, np.float32), 64, True, "nf4")[1]


@pytest.mark.parametrize("call,message", BAD_CALLS, ids=ERROR_IDS)
def test_argument_errors(call, message: str) -> None:
    with pytest.raises(ArgumentError, match=message):
        call()


# ---- GEMV / GEMM ------------------------------------------------------------------------------------


def _t(v: float | np.float32, dtype: str) -> np.float32:
    """Round one float32 value to T and back."""
    v = np.float32(v)
    if dtype == "float16":
        return np.float32(np.float16(v))
    if dtype == "bfloat16":
        return (fp32_to_bf16_bits(np.array([v]), "rne").astype(np.uint32) << np.uint32(16)).view(np.float32)[0]
    return v


def _loop_model(a: np.ndarray, q: np.ndarray, scale: np.ndarray, table: np.ndarray, dtype: str, order: str):
    """The kernels written out lane by lane from docs/bnb-4bit.md 5.1/5.2 (no flush: the values stay
    normal). ``a``: (K,) T values; ``q``: (N, K) codes; ``scale``: (N, K) float32 block scales."""
    N, K = q.shape
    out = []
    for n in range(N):
        lanes = []
        for lane in range(32):
            acc = np.float32(0)
            for k0 in range(32 * lane, K, 1024):
                if order == "naive_gemv":
                    for k in range(k0, k0 + 32):
                        b = _t(_t(table[q[n, k]], dtype) * _t(scale[n, k], dtype), dtype)
                        if dtype == "float32":
                            acc = fma_f32(np.float32(a[k]), b, acc)[()]
                        else:
                            acc = np.float32(acc + _t(np.float32(a[k]) * b, dtype))
                elif dtype == "float32":
                    for sub in range(0, 32, 8):
                        for j in (0, 4, 1, 5, 2, 6, 3, 7):
                            k = k0 + sub + j
                            acc = fma_f32(np.float32(a[k]), np.float32(table[q[n, k]] * scale[n, k]), acc)[()]
                else:
                    for k in range(k0, k0 + 32, 2):
                        b0 = _t(_t(table[q[n, k]], dtype) * _t(scale[n, k], dtype), dtype)
                        b1 = _t(_t(table[q[n, k + 1]], dtype) * _t(scale[n, k + 1], dtype), dtype)
                        acc = np.float32(acc + np.float32(_t(a[k] * b0, dtype) + _t(a[k + 1] * b1, dtype)))
            lanes.append(acc)
        offsets = (1, 2, 4, 8, 16) if order == "naive_gemv" else (16, 8, 4, 2, 1)
        for off in offsets:
            lanes = [np.float32(lanes[i] + (lanes[i + off] if i + off < 32 else np.float32(0))) for i in range(32)]
        out.append(_t(lanes[0], dtype))
    return np.array(out, np.float32)


def _as_t(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return fp32_to_bf16_bits(x, "rne")
    return x.astype(dtype)


def _widen_t(y: np.ndarray) -> np.ndarray:
    return (y.astype(np.uint32) << 16).view(np.float32) if y.dtype == np.uint16 else y.astype(np.float32)


@pytest.mark.parametrize("dtype", O.DTYPES)
def test_gemv_gemm_orders_match_the_lane_model(dtype: str) -> None:
    rng = np.random.default_rng(12)
    N, K = 3, 2112  # two full 1024-steps and a partial third: lanes 0..1 only
    w = rng.standard_normal((N, K)).astype(np.float32)
    a = _as_t(rng.standard_normal(K).astype(np.float32), dtype)
    for qt, nested in (("nf4", False), ("fp4", True)):
        packed, st = O.quantize_4bit(w, 64, nested, qt, "cuda")
        q = unpack_nibbles(packed, N * K).reshape(N, K)
        blk = np.arange(N * K).reshape(N, K) // 64
        two, fused = O.nested_absmax(st, "cuda"), O.nested_absmax(st, "cuda", "fma")
        naive = O.gemv_4bit(a, packed, st, order="naive_gemv")
        simt = O.gemm_4bit(a[None], packed, st, order="simt")[0]
        want_naive = _loop_model(_widen_t(a), q, two[blk], O.get_4bit_type(qt), dtype, "naive_gemv")
        native = FP4_NATIVE if qt == "fp4" else NF4
        want_simt = _loop_model(_widen_t(a), q, fused[blk], native, dtype, "simt")
        assert bits(_widen_t(naive)).tolist() == bits(want_naive).tolist(), (qt, "naive")
        assert bits(_widen_t(simt)).tolist() == bits(want_simt).tolist(), (qt, "simt")


def test_gemm_identity_is_exact_and_orders_agree_with_float64() -> None:
    rng = np.random.default_rng(13)
    eye_packed, eye = O.quantize_4bit(np.eye(64, dtype=np.float32), 64, False, "nf4", "cuda")
    a = rng.standard_normal((3, 64)).astype(np.float32)
    for order in O.ORDERS:  # code 15 * absmax 1 = 1 and code 7 = 0: the product is A exactly
        assert np.array_equal(O.gemm_4bit(a, eye_packed, eye, order=order), a), order
    w = rng.standard_normal((16, 4096)).astype(np.float32)
    packed, st = O.quantize_4bit(w, 128, True, "fp4", "cuda")
    a = rng.standard_normal((2, 4096)).astype(np.float32)
    bias = rng.standard_normal(16).astype(np.float32)
    ref = O.gemm_4bit(a, packed, st, bias, order="float64")
    outs = {order: O.gemm_4bit(a, packed, st, bias, order=order) for order in ("naive_gemv", "simt")}
    for order, y in outs.items():
        assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 1e-6, order
    assert not np.array_equal(outs["naive_gemv"], outs["simt"])  # the reduction orders differ


MATMUL_ERRORS = [
    (dict(order="mma"), r"order: must be one of 'naive_gemv', 'simt', 'float64'"),
    (dict(K=48, order="naive_gemv"), r"quant_state.shape: naive_gemv needs K % 32 == 0"),
    (dict(K=96, order="simt"), r"quant_state.shape: simt needs K % blocksize == 0"),
    (dict(rows=2, gemv=True), r"A: gemv_4bit takes one row"),
    (dict(bias=np.zeros(3, np.float16)), r"bias: must be None or an array of A's dtype \(float32\) and shape \(4,\)"),
    (dict(a_k=32), r"A: the last dimension must be K = 64"),
]


@pytest.mark.parametrize("kw,message", MATMUL_ERRORS, ids=[m.split(":")[0] for _, m in MATMUL_ERRORS])
def test_matmul_argument_errors(kw: dict, message: str) -> None:
    K = kw.get("K", 64)
    packed, st = O.quantize_4bit(np.ones((4, K), np.float32), 64, False, "nf4")
    a = np.ones((kw.get("rows", 1), kw.get("a_k", K)), np.float32)
    call = O.gemv_4bit if kw.get("gemv") else O.gemm_4bit
    with pytest.raises(ArgumentError, match=message):
        call(a, packed, st, kw.get("bias"), order=kw.get("order", "float64"))

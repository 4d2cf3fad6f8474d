"""Hand-derived vectors from ggml's reference C (docs/ggml-formats.md sections 1.2, 3.3, 3.5, 8).

Every expected value below is worked out from the C source line it names, not from the oracle;
both twins must produce it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from numba import njit, prange

from qconform.formats.ggml import Q8_0, Q8_K
from qconform.oracles.ggml import dequantize, quantize
from qconform.oracles.ggml.rounding import roundf_to_int8_nb
from qconform.oracles.ggml.scan import f32_from_abs_bits_nb

BACKENDS = ("numpy", "numba")


def f32(bits: list[int]) -> np.ndarray:
    return np.array(bits, np.uint32).view(np.float32)


def q8_0(x: list[float] | np.ndarray, backend: str, **kw) -> np.ndarray:
    row = np.zeros(32, np.float32)
    row[: len(x)] = x
    return quantize(row[None], "Q8_0", backend=backend, **kw).view(Q8_0.dtype)[0, 0]


def q8_k(x: list[float] | np.ndarray, backend: str, **kw) -> np.ndarray:
    row = np.zeros(256, np.float32)
    row[: len(x)] = x
    return quantize(row[None], "Q8_K", backend=backend, **kw).view(Q8_K.dtype)[0, 0]


@pytest.mark.parametrize("backend", BACKENDS)
class TestQ8_0:
    def test_roundf_ties_away_from_zero(self, backend: str) -> None:
        # amax 127 -> d = 127/127 = 1 (fp16 0x3C00), id = 1: qs = roundf(x), ties away from zero
        b = q8_0([127, 0.5, 1.5, 2.5, -2.5, -0.5, 126.5, -127], backend)
        assert b["d"] == 0x3C00
        assert b["qs"][:8].tolist() == [127, 1, 2, 3, -3, -1, 127, -127]

    def test_zero_block_is_all_zero_bytes(self, backend: str) -> None:
        b = q8_0([0.0, -0.0], backend)
        assert b["d"] == 0 and not b["qs"].any()

    def test_nan_last_makes_d_nan_and_qs_zero(self, backend: str) -> None:
        # MAX(amax, NaN) = NaN when NaN comes last; d = NaN/127 -> fp16 0x7E00; id = 1/NaN;
        # (int8_t)roundf(NaN) is cvttss2si's INT_MIN -> low byte 0
        x = np.arange(1, 33, dtype=np.float32)
        x[-1] = np.nan
        b = q8_0(x, backend)
        assert b["d"] == 0x7E00 and not b["qs"].any()

    def test_nan_is_forgotten_by_the_next_max(self, backend: str) -> None:
        # MAX(NaN, v) = v: a NaN resets amax to the next |x|, so an earlier larger value is lost.
        # amax = 2 -> d = f32(2/127), id = f32(1/d) ~ 63.5: qs[0] = roundf(-5*id) = -318 ->
        # (int8_t) keeps the low byte: -318 + 512 = 194 = 0xC2 -> int8 -62
        b = q8_0([-5, 1, np.nan, 2, -1], backend)
        d = np.float32(2) / np.float32(127)
        assert b["d"] == np.float32(d).astype(np.float16).view(np.uint16)
        assert b["qs"][:5].tolist() == [-62, 64, 0, 127, -64]

    def test_inf_gives_inf_d_and_zero_qs(self, backend: str) -> None:
        # amax = inf -> d = inf (0x7C00), id = 1/inf = 0 -> qs = roundf(x*0) = 0; inf*0 = NaN -> 0
        b = q8_0([np.inf, 1, 2], backend)
        assert b["d"] == 0x7C00 and not b["qs"].any()

    def test_fp16_overflow_of_d_keeps_qs(self, backend: str) -> None:
        # d = 1e7/127 = 78740 > 65504 -> fp16 inf; qs still use the fp32 id
        b = q8_0([1e7, -5e6], backend)
        assert b["d"] == 0x7C00
        assert b["qs"][:2].tolist() == [127, -64]  # -5e6 * 127/1e7 = -63.5 -> away from zero


@pytest.mark.parametrize("backend", BACKENDS)
class TestQ8_K:
    def test_nearest_int_ties_to_even(self, backend: str) -> None:
        # max = -127 (first strict max) -> iscale = -127/-127 = 1 -> q = nearest_int(x), ties to
        # even; d = 1/iscale = 1
        b = q8_k([-127, 2.5, -3.5, 0.5, 126.5, -0.5, 1.5], backend)
        assert b["d"] == np.float32(1)
        assert b["qs"][:7].tolist() == [-127, 2, -4, 0, 126, 0, 2]
        assert b["bsums"][0] == -127 + 2 - 4 + 0 + 126 + 0 + 2

    def test_sign_flip_and_first_occurrence(self, backend: str) -> None:
        # |2| == |-2|: the first (+2) is max -> iscale = -127/2 = -63.5 -> the max maps to -127 and
        # d = 1/-63.5 < 0
        b = q8_k([2, -2, 1], backend)
        assert b["qs"][:3].tolist() == [-127, 127, -64]  # 1 * -63.5 = -63.5 -> even: -64
        assert b["d"] == np.float32(1) / np.float32(-63.5)

    def test_zero_and_all_nan_blocks(self, backend: str) -> None:
        # amax == 0 (all +-0, or every |x| NaN, which never wins '>') -> d = 0, qs = 0; qconform
        # requires bsums = 0 where ggml leaves them stale
        for x in ([0.0, -0.0], np.full(256, np.nan, np.float32)):
            b = q8_k(x, backend)
            assert b["d"].view(np.uint32) == 0 and not b["qs"].any() and not b["bsums"].any()

    def test_nan_payloads_reach_the_127_clamp(self, backend: str) -> None:
        # iscale*NaN keeps the NaN's payload (x86 quiets it: bit 22), nearest_int returns
        # (bits & 0x7FFFFF) - 0x400000 = bits & 0x3FFFFF, then MIN(127, v)
        x = np.zeros(6, np.float32)
        x[0] = 1.0  # max -> iscale = -127
        x[1:] = f32([0x7FC000C8, 0x7FC00005, 0x7FC00000, 0x7FA00000, 0xFFC00064])
        b = q8_k(x, backend)
        assert b["qs"][:6].tolist() == [-127, 127, 5, 0, 127, 100]

    def test_inf_block(self, backend: str) -> None:
        # max = +inf -> iscale = -127/inf = -0 -> d = 1/-0 = -inf; finite x -> -0*x -> 0;
        # inf * -0 = NaN made by the multiply (x86 default NaN) -> nearest_int 0
        b = q8_k([1, np.inf, -3], backend)
        assert b["d"].view(np.uint32) == 0xFF800000 and not b["qs"].any() and not b["bsums"].any()

    def test_tiny_max_overflows_iscale(self, backend: str) -> None:
        # max = 2e-38 -> iscale = -127/2e-38 overflows to -inf -> nearest_int(+-inf) = -4194304,
        # (int8_t) of that is 0; 0 * inf = NaN -> 0; d = 1/-inf = -0
        b = q8_k([2e-38, -1e-38, 0], backend)
        assert b["d"].view(np.uint32) == 0x80000000 and not b["qs"].any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_dequantize_signs_and_nan(backend: str) -> None:
    raw = np.zeros((1, 34 * 2), np.uint8)
    blocks = raw.view(Q8_0.dtype)[0]
    blocks["d"] = [0x3C00, 0xBC00]  # 1.0 and -1.0
    blocks["qs"][0, :3] = [-128, 127, 0]
    y = dequantize(raw, "Q8_0", backend=backend)[0]
    assert y[:3].tolist() == [-128.0, 127.0, 0.0]
    assert np.signbit(y[32])  # -1 * 0 = -0.0
    rawk = np.zeros((1, 292), np.uint8)
    bk = rawk.view(Q8_K.dtype)[0]
    bk["d"] = np.float32(np.nan)
    bk["qs"][0, 0] = 3
    yk = dequantize(rawk, "Q8_K", backend=backend)[0]
    assert np.isnan(yk).all()


@pytest.mark.parametrize("qtype", ["Q8_0", "Q8_K"])
def test_leading_dimensions_are_kept(qtype: str) -> None:
    x = np.random.default_rng(0).standard_normal((2, 3, 512)).astype(np.float32)
    q = quantize(x, qtype)
    fmt = {"Q8_0": Q8_0, "Q8_K": Q8_K}[qtype]
    assert q.shape == (2, 3, 512 // fmt.block_size * fmt.type_size)
    assert np.array_equal(q.reshape(6, -1), quantize(x.reshape(6, 512), qtype))
    assert dequantize(q, qtype).shape == x.shape


@njit(cache=True, parallel=True)
def _roundf_mismatches() -> int:
    """Every fp32 bit pattern, both signs: the branch-free roundf byte against floor(|v| + 0.5)
    in float64 (exact for fp32 v) with C's cvttss2si rule (NaN/inf/|v| >= 2^31 -> byte 0)."""
    bad = 0
    for b in prange(np.int64(0), np.int64(2**31)):
        mag = f32_from_abs_bits_nb(np.int32(b)) if b <= 0x7F800000 else np.float32(np.nan)
        for v in (mag, -mag):
            r = math.floor(abs(np.float64(v)) + 0.5)
            want = 0 if not (r < 2.0**31) else (np.int64(r) if v >= 0 else -np.int64(r)) & 0xFF
            bad += roundf_to_int8_nb(v) != want
    return bad


def test_branch_free_roundf_is_exhaustively_roundf() -> None:
    assert _roundf_mismatches() == 0


@njit(cache=True)
def _from_bits_all(bits: np.ndarray) -> np.ndarray:
    out = np.empty(bits.size, np.float32)
    for k in range(bits.size):
        out[k] = f32_from_abs_bits_nb(bits[k])
    return out


def test_float_from_bits_is_the_bit_view() -> None:
    """The exhaustive roundf test walks every float through this helper: it must be the view."""
    rng = np.random.default_rng(3)
    bits = np.concatenate(
        [np.arange(0, 4096), np.arange(0x7F800000 - 4096, 0x7F800001), rng.integers(0, 0x7F800001, size=1_000_000)]
    ).astype(np.int32)
    assert np.array_equal(_from_bits_all(bits).view(np.int32), bits)

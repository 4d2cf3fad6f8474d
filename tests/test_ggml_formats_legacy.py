"""Q4_0, Q4_1, Q5_0, Q5_1, Q8_1, IQ4_NL (ref and chunk) and IQ4_XS: layouts, hand-derived vectors,
numpy/numba twins and argument rules. ggml's own C checks them in tests/test_upstream_ggml_c.py
(when QCONFORM_GGML_LIB names a build of it, as CI's ci/ggml-lib.sh makes).

gguf-py cross-checks the legacy quantizers and the dequantizers (test_upstream_gguf_legacy.py);
it has no Q8_1 and no IQ4 quantizer, so without the C library those rest on the vectors below. Every expected byte is
worked out from the ggml-org/ggml src/ggml-quants.c function it names, not from the oracle, and
both twins must produce it.
"""

from __future__ import annotations

import numpy as np
import pytest

from qconform.errors import ArgumentError
from qconform.formats.ggml import FORMATS
from qconform.ops.patterns import PATTERNS, make_values
from qconform.oracles.ggml import dequantize, iq4_nl, quantize

BACKENDS = ("numpy", "numba")
KV = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]  # kvalues_iq4nl
IDENTITY_QS = "f0e1d2c3b4a5968778695a4b3c2d1e0f"  # L[j] = j, L[j+16] = 15-j: qs[j] = j | (15-j) << 4
VARIANTS = [("Q4_0", "ref"), ("Q4_1", "ref"), ("Q5_0", "ref"), ("Q5_1", "ref"), ("Q8_1", "ref")]
VARIANTS += [("IQ4_NL", "ref"), ("IQ4_NL", "chunk"), ("IQ4_XS", "ref")]


def block(values: list[float], qtype: str) -> np.ndarray:
    """One block of ``qtype``: ``values`` then zeros, as a (1, block_size) float32 row."""
    row = np.zeros((1, FORMATS[qtype].block_size), np.float32)
    row[0, : len(values)] = values
    return row


def hexbytes(x: np.ndarray, qtype: str, backend: str, **kw) -> str:
    return quantize(x, qtype, backend=backend, **kw).tobytes().hex()


def test_layouts_match_ggml_common_h() -> None:
    # ggml-common.h: block_q4_0 {ggml_half d; uint8_t qs[16];} = 18; block_q4_1 {d, m; qs[16]} = 20;
    # block_q5_0 {d; uint8_t qh[4]; qs[16]} = 22; block_q5_1 {d, m; qh[4]; qs[16]} = 24;
    # block_q8_1 {d, s; int8_t qs[32]} = 36; block_iq4_nl {d; qs[16]} = 18;
    # block_iq4_xs {d; uint16_t scales_h; uint8_t scales_l[4]; uint8_t qs[128]} = 136; the type ids are ggml_type's
    expect = {
        "Q4_0": (2, 32, 18, {"d": 0, "qs": 2}),
        "Q4_1": (3, 32, 20, {"d": 0, "m": 2, "qs": 4}),
        "Q5_0": (6, 32, 22, {"d": 0, "qh": 2, "qs": 6}),
        "Q5_1": (7, 32, 24, {"d": 0, "m": 2, "qh": 4, "qs": 8}),
        "Q8_1": (9, 32, 36, {"d": 0, "s": 2, "qs": 4}),
        "IQ4_NL": (20, 32, 18, {"d": 0, "qs": 2}),
        "IQ4_XS": (23, 256, 136, {"d": 0, "scales_h": 2, "scales_l": 4, "qs": 8}),
    }
    for name, (type_id, qk, size, offsets) in expect.items():
        fmt = FORMATS[name]
        assert (fmt.type_id, fmt.block_size, fmt.type_size) == (type_id, qk, size), name
        assert {k: v[1] for k, v in fmt.dtype.fields.items()} == offsets, name


@pytest.mark.parametrize("backend", BACKENDS)
class TestLegacy:
    def test_zero_blocks(self, backend: str) -> None:
        # quantize_row_q4_0_ref: amax stays 0, max the +0.0 start: d = 0/-8 = -0.0 (0x8000), id = 0,
        # (int8_t)(0 + 8.5f) = 8 -> qs 0x88. Q5_0: (int8_t)(16.5f) = 16: nibbles 0, every qh bit set.
        # quantize_row_q4_1_ref: min = max = x[0] = -0.0 (v < FLT_MAX), d = (-0 - -0)/15 = +0, id = 0,
        # (int8_t)(0*0 + 0.5f) = 0: m = 0x8000, everything else 0. Q5_1 likewise.
        x = block([-0.0, 0.0], "Q4_0")
        assert hexbytes(x, "Q4_0", backend) == "0080" + "88" * 16
        assert hexbytes(x, "Q5_0", backend) == "0080" + "ffffffff" + "00" * 16
        assert hexbytes(x, "Q4_1", backend) == "0000" + "0080" + "00" * 16
        assert hexbytes(x, "Q5_1", backend) == "0000" + "0080" + "00" * 4 + "00" * 16

    def test_q4_0_reciprocal_overflow_gives_code_zero(self, backend: str) -> None:
        # max = 12 * 2^-149 (subnormal): d = max/-8 = -1.5 * 2^-149 rounds (to even) to -2^-148,
        # fp16 -0 (0x8000); id = 1/d = -2^148 overflows to -inf; x*id is -inf or NaN (0*inf),
        # + 8.5f stays so, and (int8_t) of it is cvttss2si's INT_MIN -> byte 0: every code 0.
        # With ftz the subnormals flush to 0 first: the zero block's bytes.
        x = block([12 * 2.0**-149, 0.0, -3 * 2.0**-149], "Q4_0")
        assert hexbytes(x, "Q4_0", backend) == "0080" + "00" * 16
        assert hexbytes(x, "Q4_0", backend, ftz=True) == "0080" + "88" * 16


@pytest.mark.parametrize("backend", BACKENDS)
class TestQ8_1:
    def test_roundf_and_the_sum(self, backend: str) -> None:
        # quantize_row_q8_1_ref: amax = 127 -> d = 1 (0x3C00), id = 1; qs = roundf(x), ties away from
        # zero: 127, -64, 2, 1, -1, 3; sum = 68; s = fp16(68 * 1.0) = 0x5440 (1.0625 * 2^6)
        x = block([127, -63.5, 1.5, 0.5, -0.5, 2.5], "Q8_1")
        assert hexbytes(x, "Q8_1", backend) == "003c" + "4054" + "7fc00201ff03" + "00" * 26

    def test_nan_resets_the_max_and_int8_wraps(self, backend: str) -> None:
        # MAX(254, NaN) = NaN, MAX(NaN, 127) = 127: amax = 127, d = 1, id = 1. roundf(254) = 254 ->
        # (int8_t) keeps the low byte 0xFE = -2; roundf(NaN) -> byte 0; 127. sum = -2 + 0 + 127 = 125
        # (the stored int8s); s = fp16(125) = 0x57D0 (1.953125 * 2^6)
        x = block([254, np.nan, 127], "Q8_1")
        assert hexbytes(x, "Q8_1", backend) == "003c" + "d057" + "fe007f" + "00" * 29

    def test_dequantize_is_qs_times_d(self, backend: str) -> None:
        # no dequantize_row_q8_1 upstream; qconform's is (float)qs * fp16_to_fp32(d), s unused
        raw = bytes.fromhex("0038" + "ffff" + "7f80ff01" + "00" * 28)  # d = 0.5
        y = dequantize(np.frombuffer(raw, np.uint8)[None], "Q8_1", backend=backend)[0]
        assert y[:5].tolist() == [63.5, -64.0, -0.5, 0.5, 0.0]


def tie_block() -> np.ndarray:
    # IQ4_NL: max = -127 (x[0]), x[5] = -4.5 lies midway between kv[7] = -10 and kv[8] = 1.
    return block([-127, 0, 0, 0, 0, -4.5], "IQ4_NL")


TIE_BLOCK_REF = "003c" + "80" + "88" * 15


@pytest.mark.parametrize("backend", BACKENDS)
class TestIQ4_NL:
    def test_ref_tie_goes_to_the_upper_index(self, backend: str) -> None:
        # quantize_row_iq4_nl_ref (ntry = -1): d = max/-127 = 1, id = 1. best_index_int8(-4.5): the
        # search ends at ml = 7, mu = 8; (-4.5 - -10) = 5.5 < (1 - -4.5) = 5.5 is false -> 8. Zeros -> 8
        # (10 < 1 false), x[0] -> 0. L is stored from this pass. d = sumqx/sumq2: over x[0] both sums
        # add 260144641 -> fp32 260144640; x[5] adds -91.125 to sumqx and 20.25 to sumq2 -> d =
        # 260144544/260144656 = 1 - 4.3e-7, which fp16 rounds to 1.0 (0x3C00: its ulp below 1 is 2^-11).
        # qs[0] = L0 | L16 << 4 = 0x80, every other byte 0x88.
        assert hexbytes(tie_block(), "IQ4_NL", backend) == TIE_BLOCK_REF

    def test_ref_and_chunk_differ(self, backend: str) -> None:
        x = block([113, 89, 1, -83], "IQ4_NL")
        # ref: max = 113, d = 113/-127, id = -127/113 ~ -1.1239: id*x = -127, -100.03, -1.12, 93.28
        # -> L = 0, 1 (3.97 < 17.03), 8 (8.88 < 2.12 false), 14 (4.28 < 19.72); zeros -> 8.
        # q = -127, -104, 1, 89, w = x^2: sumqx ~ -307453737, sumq2 ~ 346192507 (exact integers,
        # fp32 sums within 3e-7) -> d ~ -0.888103 = -1818.83 * 2^-11 -> fp16 -1819 * 2^-11 = 0xBB1B.
        assert hexbytes(x, "IQ4_NL", backend) == "1bbb" + "8081888e" + "88" * 12
        # quantize_iq4_nl (ntry = 7): d = -max/-127 = 113/127, id ~ 1.1239: id*x = 127, 100.03, 1.12,
        # -93.28 -> L = 15, 14, 8, 2: q = x exactly, so sumqx and sumq2 add identical terms: d = 1.
        # The itry loop's id = (itry-127)/113 < 0 can only do worse (Cauchy-Schwarz: q = x is the one
        # optimum; the best other is 0.07% below, far above fp32 error). L again from id = 1/1:
        # same L. qs = 15 | 8<<4, 14 | 8<<4, 8 | 8<<4, 2 | 8<<4, then 0x88.
        assert hexbytes(x, "IQ4_NL", backend, variant="chunk") == "003c" + "8f8e8882" + "88" * 12

    def test_inf_gives_the_x86_default_nan_scale(self, backend: str) -> None:
        # max = inf: ref d = inf/-127 = -inf, id = -0: inf*-0 = NaN -> best_index 15, finite -> -0 -> 8.
        # w*q*x for the inf is inf in both sums: d = inf/inf = x86's default NaN 0xFFC00000 -> fp16
        # 0xFE00. ref keeps the first pass's L: qs[0] = 15 | 8<<4. chunk: same d; then id = d ? 1/d : 0
        # = NaN (a NaN is true), best_index(NaN) = 15 everywhere: qs 0xFF.
        x = block([np.inf, 1, 2], "IQ4_NL")
        assert hexbytes(x, "IQ4_NL", backend) == "00fe" + "8f" + "88" * 15
        assert hexbytes(x, "IQ4_NL", backend, variant="chunk") == "00fe" + "ff" * 16

    @pytest.mark.parametrize("variant", ["ref", "chunk"])
    def test_tiny_block(self, backend: str, variant: str) -> None:
        # amax < GROUP_MAX_EPS: scale 0, dh = fp16(0). chunk: id = 0, best_index(0*x) = 8 (0x88), and
        # 0*NaN = NaN -> 15. ref leaves qs unwritten in ggml; qconform requires chunk's bytes.
        x = block([1e-16, -0.0, np.nan], "IQ4_NL")
        assert hexbytes(x, "IQ4_NL", backend, variant=variant) == "0000" + "88" + "88" + "8f" + "88" * 13


@pytest.mark.parametrize("backend", BACKENDS)
class TestIQ4_XS:
    def test_power_of_two_subblocks(self, backend: str) -> None:
        # sub-block ib = c_ib * (kv[0..15], kv[15..0]), c = 1, 2, 4, 8, 16, 32, 0.5, 32. Each max is
        # -127*c (first). quantize_iq4_xs (ntry = 7): at itry = -7, id = 134/(127c) maps c*kv to kv
        # (every kv*1.055 stays nearest kv), q = x/c with c a power of two, so every sumqx term is c
        # times the sumq2 term: scale = c exactly; later equal fits are not strictly better.
        # max_scale = 32 (ib 5, first): d = -32/32 = -1 (0xBC00), id = -1; l = nearest_int(-c):
        # -1, -2, -4, -8, -16, -32, nearest_int(-0.5) = 0 (half to even), -32. dl = d*l = c (ib 6:
        # -0.0 -> idl = 0 -> best_index(0) = 8). ls = l + 32 = 31, 30, 28, 24, 16, 0, 32, 0:
        # scales_l = (15 | 14<<4), (12 | 8<<4), 0, 0; scales_h = 1 | 1<<2 | 1<<4 | 1<<6 | 1<<8 | 2<<12
        # = 0x2155. L = best_index(x/c): the kv index.
        pattern = np.array(KV + KV[::-1], np.float32)
        x = np.concatenate([c * pattern for c in (1, 2, 4, 8, 16, 32, 0.5, 32)]).astype(np.float32)[None]
        qs = IDENTITY_QS * 6 + "88" * 16 + IDENTITY_QS
        assert hexbytes(x, "IQ4_XS", backend) == "00bc" + "5521" + "ef8c0000" + qs

    def test_zero_superblock(self, backend: str) -> None:
        # every scale 0: max_scale 0, d = -0/32 = -0.0 (0x8000), id = 0, l = 0 -> ls 32: low nibble 0,
        # high bits 2 at 2*ib: scales_h 0xAAAA; dl = -0 -> idl = 0 -> best_index(0) = 8: qs 0x88
        x = np.zeros((1, 256), np.float32)
        assert hexbytes(x, "IQ4_XS", backend) == "0080" + "aaaa" + "00" * 4 + "88" * 128


BEST_INDEX = iq4_nl.best_index


def _best_index_ties_down(v: np.ndarray) -> np.ndarray:
    """A broken best_index_int8: ties to the lower index."""
    idx = BEST_INDEX(v)
    kv = iq4_nl.KV
    lower = np.clip(idx - 1, 0, 15)
    tie = (idx > 0) & (np.asarray(v, np.float32) - kv[lower] == kv[idx] - np.asarray(v, np.float32))
    return np.where(tie, lower, idx)


def test_the_hand_vectors_catch_best_index_ties_to_lower(monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken variant (best_index ties to the lower index) fails the tie vector."""
    assert hexbytes(tie_block(), "IQ4_NL", "numpy") == TIE_BLOCK_REF
    monkeypatch.setattr(iq4_nl, "best_index", _best_index_ties_down)
    broken = hexbytes(tie_block(), "IQ4_NL", "numpy")
    assert broken != TIE_BLOCK_REF
    assert broken == "003c" + "80" + "88" * 4 + "87" + "88" * 10  # L5 = 7: qs[5] = 7 | 8 << 4


@pytest.mark.parametrize("qtype,variant", VARIANTS, ids=lambda v: str(v))
@pytest.mark.parametrize("ftz", [False, True])
def test_twins_quantize_byte_identical(qtype: str, variant: str, ftz: bool) -> None:
    block_size = FORMATS[qtype].block_size
    rows = 8 if block_size == 32 else 4
    for i, pattern in enumerate(PATTERNS):
        x = make_values(pattern, 300 + i, rows, 1024, block_size)
        spec = quantize(x, qtype, backend="numpy", ftz=ftz, variant=variant)
        fast = quantize(x, qtype, backend="numba", ftz=ftz, variant=variant)
        assert spec.tobytes() == fast.tobytes(), pattern


@pytest.mark.parametrize("qtype", sorted({q for q, _ in VARIANTS}))
@pytest.mark.parametrize("ftz", [False, True])
def test_twins_dequantize_byte_identical(qtype: str, ftz: bool) -> None:
    data = np.random.default_rng(4).integers(0, 256, size=(64, 8 * FORMATS[qtype].type_size), dtype=np.uint8)
    spec = dequantize(data, qtype, backend="numpy", ftz=ftz)
    fast = dequantize(data, qtype, backend="numba", ftz=ftz)
    assert spec.tobytes() == fast.tobytes()


# where flush-to-zero changes the bytes: subnormal inputs (the legacy formats), a subnormal d =
# amax/127 (Q8_1), subnormal w*q*x terms in the IQ4 scale search (|x| ~ 1e-14)
FTZ_SCALE = {
    "Q4_0": 1e-40,
    "Q4_1": 1e-40,
    "Q5_0": 1e-40,
    "Q5_1": 1e-40,
    "Q8_1": 1e-36,
    "IQ4_NL": 1e-14,
    "IQ4_XS": 1e-14,
}


@pytest.mark.parametrize("qtype,variant", VARIANTS, ids=lambda v: str(v))
def test_ftz_flushes_inputs_and_intermediates(qtype: str, variant: str) -> None:
    rng = np.random.default_rng(1)
    tiny = (rng.standard_normal((2, 256)) * 1e-40).astype(np.float32)  # all subnormal
    flushed = np.copysign(np.float32(0), tiny)
    assert np.array_equal(quantize(tiny, qtype, ftz=True, variant=variant), quantize(flushed, qtype, variant=variant))
    x = (rng.standard_normal((2, 256)) * FTZ_SCALE[qtype]).astype(np.float32)
    assert not np.array_equal(quantize(x, qtype, variant=variant), quantize(x, qtype, ftz=True, variant=variant))


def test_variant_and_nudge_arguments() -> None:
    x = block([1.0], "Q4_0")
    with pytest.raises(ArgumentError, match="variant.*IQ4_NL"):
        quantize(x, "Q4_0", variant="chunk")
    with pytest.raises(ArgumentError, match="variant"):
        quantize(x, "IQ4_NL", variant="fast")  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="nudge"):
        quantize(x, "Q4_0", nudge=(1, 0))
    with pytest.raises(ArgumentError, match="nudge"):
        quantize(x, "IQ4_NL", nudge=(1, 0), variant="chunk")

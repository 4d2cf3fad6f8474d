"""K-quant oracles (Q2_K .. Q6_K): layouts, quantize exactness, numpy/numba twins.

gguf-py has no K-quant quantize (tests/test_upstream_gguf_kquants.py checks the dequantizers
against it), so quantize exactness rests here on
- blocks whose bytes are derived by hand from ggml-org/ggml src/ggml-quants.c (the derivations
  are in the comments), and
- digests of ggml's own output: ``quantize_row_qN_K_ref`` of ggml-org/ggml d99724f2
  (src/ggml-quants.c built alone with gcc 12.2 -O2 -DNDEBUG on x86-64: no FMA, like ggml-base)
  over 12,000 blocks per type -- every input pattern except NaNs with payload bits (``nan_payload``
  and ``mixed``, which draws from it: the oracles treat every NaN as ggml's default NaN, see
  oracles/ggml/kquant_search.py) plus random fp32 bit patterns with NaNs made default;
- a comparison with a built ggml when ``QCONFORM_GGML_LIB`` names one (skipped otherwise; CI builds
  one with ci/ggml-lib.sh): of the oracles in tests/test_upstream_ggml_c.py, of the digests here.
"""

from __future__ import annotations

import ctypes
import hashlib
import os

import numpy as np
import pytest

from qconform.formats.ggml import FORMATS
from qconform.ops.patterns import PATTERNS, make_values
from qconform.oracles.ggml import dequantize, quantize

KTYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
DIGEST_PATTERNS = tuple(p for p in PATTERNS if p not in ("nan_payload", "mixed")) + ("random_bits",)


def test_layouts_are_ggml_common_h() -> None:
    """Sizes and field offsets of block_q2_K .. block_q6_K (src/ggml-common.h, QK_K = 256)."""
    offsets = {
        "Q2_K": (10, 84, {"scales": 0, "qs": 16, "d": 80, "dmin": 82}),
        "Q3_K": (11, 110, {"hmask": 0, "qs": 32, "scales": 96, "d": 108}),
        "Q4_K": (12, 144, {"d": 0, "dmin": 2, "scales": 4, "qs": 16}),
        "Q5_K": (13, 176, {"d": 0, "dmin": 2, "scales": 4, "qh": 16, "qs": 48}),
        "Q6_K": (14, 210, {"ql": 0, "qh": 128, "scales": 192, "d": 208}),
    }
    for name, (type_id, size, fields) in offsets.items():
        fmt = FORMATS[name]
        assert (fmt.type_id, fmt.block_size, fmt.type_size) == (type_id, 256, size)
        assert {k: v[1] for k, v in fmt.dtype.fields.items()} == fields


# Every block below is 256 copies of one value. Common to Q2_K/Q4_K/Q5_K (make_qkx2_quants):
# min = max = c. For c <= 0 (+-0, -1) ``if (min > 0) min = 0`` leaves min = c = max, so it returns
# scale 0, L = 0 and the_min = -c. For c = 1, min becomes 0, iscale = nmax/1,
# L = nearest_int(nmax*1) = nmax everywhere; every candidate then has D = sum_w*sum_l2 - sum_l^2
# = 0 exactly (equal weights and levels, small exact integers), so none is taken and the scale
# stays f32(1/nmax) with the_min = -0.0.
HAND = [
    # all +-0: every searcher returns scale 0 (Q3_K/Q6_K: amax < 1e-15), every max stays 0, so
    # d = dmin = fp16(0.f) = 0x0000 and all levels 0 -> every byte 0 (Q6_K: memset).
    *[(t, c, "00" * FORMATS[t].type_size) for t in KTYPES for c in (0.0, -0.0)],
    # Q2_K, c = 1: scales[g] = f32(1/3) = 0.33333334, mins -0.0 -> max_min 0: dmin 0, no min bits.
    # iscale = 15/0.33333334 = 45.0, byte = nearest_int(45*0.33333334 = 15.0) = 0x0F;
    # d = fp16(0.33333334/15 = 0.022222223) = 0x25B0 (0.022216797); requant: dd = 15*d = 0.33325195,
    # L = nearest_int(1/dd = 3.0007) = 3 -> qs = 3|3<<2|3<<4|3<<6 = 0xFF.
    ("Q2_K", 1.0, "0f" * 16 + "ff" * 64 + "b025" + "0000"),
    # Q2_K, c = -1: flat, scale 0 and the_min 1 -> max_scale 0: scale nibbles 0, d = 0;
    # max_min 1: nibble nearest_int(15/1*1) = 15 -> 0xF0; dmin = fp16(1/15 = 0.06666667) = 0x2C44;
    # dd = 0 -> the flat L = 0 stay: qs 0.
    ("Q2_K", -1.0, "f0" * 16 + "00" * 64 + "0000" + "442c"),
    # Q3_K, c = 1 (make_q3_quants): iscale = -4/1, l = clamp(nearest_int(-4), -4, 3) = -4, sumlx =
    # 16*(1*1*-4) = -64, suml2 = 256; the descent: slx = -64 - (-4) = -60 is not > 0, no change;
    # scale = -64/256 = -0.25 for all 16. max_scale -0.25 -> iscale = -32/-0.25 = 128, level
    # nearest_int(128*-0.25) + 32 = 0 -> scale bytes 0; d = fp16(1/128) = 0x2000. Requant: sc =
    # 0 - 32, dd = 2^-7*-32 = -0.25, L = nearest_int(1/-0.25) + 4 = 0: no hmask bit, qs 0.
    ("Q3_K", 1.0, "00" * 108 + "0020"),
    # Q3_K, c = -1: the same with every sign flipped: scale +0.25, iscale -128, d = fp16(-1/128) = 0xA000.
    ("Q3_K", -1.0, "00" * 108 + "00a0"),
    # Q4_K, c = 1: scales f32(1/15) = 0.06666667, mins -0.0. inv_scale = 63/0.06666667 = 944.99994,
    # ls = nearest_int(944.99994*0.06666667 = 63.0) = 63, lm = 0; d = fp16(0.06666667/63 =
    # 0.0010582011) = 0x1456, dmin = fp16(0) = 0. Packing: j < 4: s[j] = 63, s[j+4] = 0; j >= 4:
    # s[j+4] = 63 & 15 = 0x0F, s[j-4] |= (63 >> 4) << 6 -> s[0..3] = 0xFF. Requant: dd = 63*h2f(d) =
    # 0.066690445, L = nearest_int(1/dd = 14.99) = 15 -> qs = 15 | 15 << 4 = 0xFF.
    ("Q4_K", 1.0, "5614" + "0000" + "ff" * 4 + "00" * 4 + "0f" * 4 + "ff" * 128),
    # Q4_K, c = -1: flat, scale 0, the_min 1 -> inv_scale 0, ls 0; inv_min 63, lm = 63: s[0..3] = 0,
    # s[4..7] = 63 | (63 >> 4) << 6 = 0xFF, s[8..11] = (63 & 15) << 4 = 0xF0; d = 0, dmin =
    # fp16(1/63 = 0.015873017) = 0x2410; dd = 0 -> L = 0.
    ("Q4_K", -1.0, "0000" + "1024" + "00" * 4 + "ff" * 4 + "f0" * 4 + "00" * 128),
    # Q5_K, c = 1: nmax 31: scales f32(1/31) = 0.032258064, inv_scale = 63/that = 1953.0, ls = 63;
    # d = fp16(0.032258064/63 = 0.00051203277) = 0x1032; scale bytes as Q4_K; requant dd = 63*h2f(d) =
    # 0.032263756, L = nearest_int(30.99) = 31 -> bit 4 into qh (all 8 bits: 0xFF), nibbles 15: 0xFF.
    ("Q5_K", 1.0, "3210" + "0000" + "ff" * 4 + "00" * 4 + "0f" * 4 + "ff" * 32 + "ff" * 128),
    # Q5_K, c = -1: as Q4_K's.
    ("Q5_K", -1.0, "0000" + "1024" + "00" * 4 + "ff" * 4 + "f0" * 4 + "00" * 32 + "00" * 128),
    # Q6_K, c = 1 (make_qx_quants, nmax 32): iscale = -32, l = -32, L = 0; sumlx = 16*(1*1*-32) =
    # -512, suml2 = 16384, scale = -0.03125, best = 16. Candidates: is = -9..-6 give l = -31:
    # sumlx^2 = 246016 = best*suml2 = 16*15376, not strictly greater; is = -5 (31.5, a tie to even)
    # and is > 0 give l = -32 again: equal too. So scale -0.03125 everywhere; iscale = -128/-0.03125
    # = 4096, d = fp16(1/4096) = 0x0C00, sc = nearest_int(4096*-0.03125) = -128 = 0x80; requant dd =
    # 2^-12*-128 = -0.03125, L = nearest_int(-32) + 32 = 0 -> ql, qh 0.
    ("Q6_K", 1.0, "00" * 192 + "80" * 16 + "000c"),
    # Q6_K, c = -1: scale +0.03125, iscale -4096, d = fp16(-1/4096) = 0x8C00, sc = -128 again.
    ("Q6_K", -1.0, "00" * 192 + "80" * 16 + "008c"),
]


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize(("qtype", "c", "expected"), HAND, ids=[f"{t}:{c}" for t, c, _ in HAND])
def test_hand_derived_blocks(qtype: str, c: float, expected: str, backend: str) -> None:
    x = np.full((1, 256), c, np.float32)
    assert quantize(x, qtype, backend=backend).tobytes().hex() == expected


# The c = +-1 blocks back, exactly: Q2_K 3*(15*h2f(0x25B0)) - 0 = 3*15*1456/2^16 = 65520/2^16 and
# 0*0 - 15*h2f(0x2C44) = -15*1092/2^14; Q4_K 15*(63*h2f(0x1456)) = 15*63*1110/2^20 and Q5_K
# 31*(63*h2f(0x1032)) = 31*63*1074/2^21; the Q4_K/Q5_K mins -63*h2f(0x2410) = -63*1040/2^16;
# Q3_K (2^-7*-32)*(0 - 4) = 1 and Q6_K (2^-12*-128)*(0 - 32) = 1. The zero blocks give +0, but
# Q6_K's (0*0)*(0 - 32) = -0.0 (Q3_K's (0*-32)*(0 - 4) is +0 again).
HAND_BACK = {
    ("Q6_K", 0.0): -0.0,  # also the -0.0 block's key: 0.0 == -0.0
    ("Q2_K", 1.0): 65520 / 2**16,
    ("Q2_K", -1.0): -16380 / 2**14,
    ("Q3_K", 1.0): 1.0,
    ("Q3_K", -1.0): -1.0,
    ("Q4_K", 1.0): 1048950 / 2**20,
    ("Q4_K", -1.0): -65520 / 2**16,
    ("Q5_K", 1.0): 2097522 / 2**21,
    ("Q5_K", -1.0): -65520 / 2**16,
    ("Q6_K", 1.0): 1.0,
    ("Q6_K", -1.0): -1.0,
}


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_hand_derived_blocks_dequantize(backend: str) -> None:
    for qtype, c, expected in HAND:
        data = np.frombuffer(bytes.fromhex(expected), np.uint8).copy()[None]
        y = dequantize(data, qtype, backend=backend)
        want = np.full(y.shape, HAND_BACK.get((qtype, c), 0.0), np.float32)
        assert y.tobytes() == want.tobytes(), (qtype, c)


def _digest_inputs() -> list[tuple[str, np.ndarray]]:
    """12 x 1,000 blocks: each pattern from its own seed, and random fp32 bits (NaNs made default)."""
    out = [(p, make_values(p, 900 + k, 250, 1024, 256)) for k, p in enumerate(DIGEST_PATTERNS[:-1])]
    bits = np.random.default_rng(901).integers(0, 2**32, size=(250, 1024), dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    return out + [("random_bits", np.where(np.isnan(x), np.float32(np.nan), x))]


# sha256[:16] of quantize_row_qN_K_ref's bytes for _digest_inputs(), in DIGEST_PATTERNS order
C_DIGESTS = {
    "Q2_K": "39f6c2ef8e53ed63 ed88c4dd802ef55d c1d555de5adfe8b4 1051824c44cce03f c0c73d96af555ac3 088125698b8ec1a4 "
    "b241bff28fcdc643 baf902fb3160ddd7 7993ca96aefc1327 2015490865850897 3f01d333e66acb27 78cb2877921003c0",
    "Q3_K": "7f2b7d4d484b9f35 ec23abdf9de6c99d 8b1b0017552e7257 0ed5af1fda92e047 7a95e2e9d49a1f86 874ad1eeecd1c00f "
    "bc31347c46cc9c14 b177dd3e9bb049eb 92321c519ac82edd e0c217e6753e65cd b708c9dc3ac49a8a adc23e1f2281e6d8",
    "Q4_K": "75f3a8d6b90190c4 93410a85686b69ae 2a2c99d3ca487799 e0a73338304fe286 848329f173981dba cecbdce4b75ff571 "
    "30e523cb41f3a9ee 7b0b0d1b862a43f9 341be1db11cea6fa 4302c0ba493d5681 0cc46271ce324713 e7a0f01512f26c1d",
    "Q5_K": "5443bdee6e6c6ba4 d30ade71f5d1652e 519602e89d9596b3 953a5d2cae771ed7 b441d021ee7f5740 f393fdb3aa10e523 "
    "7a4655d698f0bef5 3c940f3ff370b2dc 0e002916a34b1219 3318fe90b3cc2e6a b1f8653b07042552 afda6fb5781fa17d",
    "Q6_K": "7a48eeefab7a7b70 b079566cb199ec97 1c88edc9c35040fe 72d10d2133641322 a23ca9a4fdd41091 b95f1878edc12892 "
    "726a5aebf32bff64 3130becb0c72ec74 39e50a7420c1a63e 65a4acc4c324a47d 347482e6ed815dc0 f3dd5a2498ff600d",
}


def _digest(b: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(b).tobytes()).hexdigest()[:16]


@pytest.fixture(scope="module")
def digest_inputs() -> list[tuple[str, np.ndarray]]:
    return _digest_inputs()


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("qtype", KTYPES)
def test_quantize_matches_ggml_digests(qtype: str, backend: str, digest_inputs) -> None:
    expected = dict(zip(DIGEST_PATTERNS, C_DIGESTS[qtype].split(), strict=True))
    got = {name: _digest(quantize(x, qtype, backend=backend)) for name, x in digest_inputs}
    assert [p for p in DIGEST_PATTERNS if got[p] != expected[p]] == []


def test_digest_check_catches_a_one_level_change(digest_inputs) -> None:
    """A single changed level bit in one block out of 1,000 is a different digest."""
    name, x = digest_inputs[0]
    b = quantize(x, "Q4_K")
    b[17, 40] ^= 1
    assert _digest(b) != dict(zip(DIGEST_PATTERNS, C_DIGESTS["Q4_K"].split(), strict=True))[name]


def _tiny(seed: int) -> np.ndarray:
    """Normal blocks scaled to 1e-20 .. 1e-12: x*x and the searches' products underflow to
    subnormals, where a flush-to-zero device rounds differently."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((16, 1024)) * 10.0 ** rng.uniform(-20, -12, (16, 1))).astype(np.float32)


@pytest.mark.parametrize("qtype", KTYPES)
def test_twins_quantize_byte_identical(qtype: str) -> None:
    """numpy spec == numba, ftz off and on, on every pattern (NaN payloads and mixed included)
    and on tiny blocks whose intermediate products underflow."""
    inputs = [(p, make_values(p, 70 + k, 16, 1024, 256)) for k, p in enumerate(PATTERNS)] + [("tiny", _tiny(7))]
    for name, x in inputs:
        for ftz in (False, True):
            spec = quantize(x, qtype, backend="numpy", ftz=ftz)
            fast = quantize(x, qtype, backend="numba", ftz=ftz)
            assert np.array_equal(spec, fast), (name, ftz)


@pytest.mark.parametrize("qtype", KTYPES)
def test_ftz_is_not_a_no_op(qtype: str) -> None:
    """The ftz twins above are worth something only if ftz changes results: it does on tiny blocks."""
    x = _tiny(8)
    assert not np.array_equal(quantize(x, qtype), quantize(x, qtype, ftz=True))


@pytest.mark.parametrize("qtype", KTYPES)
def test_twins_dequantize_byte_identical(qtype: str) -> None:
    fmt = FORMATS[qtype]
    rng = np.random.default_rng(12)
    data = rng.integers(0, 256, size=(2000, fmt.type_size), dtype=np.uint8)
    for ftz in (False, True):
        spec = dequantize(data, qtype, backend="numpy", ftz=ftz)
        fast = dequantize(data, qtype, backend="numba", ftz=ftz)
        assert spec.tobytes() == fast.tobytes(), ftz


LIB = os.environ.get("QCONFORM_GGML_LIB")


@pytest.mark.skipif(not LIB, reason="set QCONFORM_GGML_LIB (ci/ggml-lib.sh builds one)")
@pytest.mark.parametrize("qtype", KTYPES)
def test_digests_are_the_ggml_reference(qtype: str, digest_inputs) -> None:
    """The digests above, recomputed from ``quantize_row_qN_K_ref`` of a real build. The oracles
    themselves are compared with it (quantize and dequantize, both twins) in test_upstream_ggml_c.py."""
    lib = ctypes.CDLL(LIB)
    quant = getattr(lib, f"quantize_row_{qtype[0].lower() + qtype[1:]}_ref")
    quant.argtypes, quant.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
    fmt = FORMATS[qtype]
    expected = dict(zip(DIGEST_PATTERNS, C_DIGESTS[qtype].split(), strict=True))
    for name, x in digest_inputs:
        theirs = np.zeros((len(x), fmt.n_bytes(x.shape[1])), np.uint8)
        quant(x.ctypes.data, theirs.ctypes.data, x.size)
        assert _digest(theirs) == expected[name], name

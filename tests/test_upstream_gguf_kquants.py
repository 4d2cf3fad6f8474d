"""K-quant cross-checks against gguf-py (``pip install qconform[upstream]``); skipped without it.

gguf-py dequantizes Q2_K .. Q6_K in numpy with the reference C's fp32 operations in the same
order (gguf-py/gguf/quants.py, PR #8939: "the same float32 values as the reference C"), so each
dequantizer is compared byte for byte on 12,000 random-byte blocks: 10,000 with finite fp16
d/dmin and 2,000 fully random ones (inf/NaN scales; NaN compared as NaN), and on blocks the
oracle quantized. gguf-py has no K-quant quantize (it raises NotImplementedError); the quantize
test compares where a gguf-py version has one and skips otherwise, naming where quantize
exactness is checked instead (tests/test_ggml_formats_kquants.py). Its patterns: normal,
uniform, ties, zero_block, equal_abs, outlier, subnormal; left out are nan, nan_payload and inf
(gguf's numpy max/argmax propagate NaN where ggml's strict ``>`` scans skip it, specs 6, 8.5),
extreme (gguf-py warns and overflows where fp16 scales saturate) and mixed (draws from those).
"""

from __future__ import annotations

import numpy as np
import pytest

from qconform.formats.ggml import FORMATS
from qconform.ops.patterns import make_values
from qconform.oracles.ggml import dequantize, quantize
from qconform.oracles.ggml.kquant_search import get_scale_min_k4, mul, sub

gguf = pytest.importorskip("gguf")
KTYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
FP16_FIELDS = {"Q2_K": ("d", "dmin"), "Q3_K": ("d",), "Q4_K": ("d", "dmin"), "Q5_K": ("d", "dmin"), "Q6_K": ("d",)}
QUANT_PATTERNS = ("normal", "uniform", "ties", "zero_block", "equal_abs", "outlier", "subnormal")


def _random_blocks(qtype: str, finite: int, raw: int, seed: int) -> np.ndarray:
    """``finite`` random blocks whose fp16 scales are finite, then ``raw`` fully random ones."""
    fmt = FORMATS[qtype]
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(finite + raw, fmt.type_size), dtype=np.uint8)
    blocks = fmt.blocks(data[:finite])
    for field in FP16_FIELDS[qtype]:
        h = blocks[field]
        blocks[field] = np.where((h & 0x7C00) == 0x7C00, h & 0x83FF, h)  # exponent 31 -> 0: finite
    return data


def _differing(ours: np.ndarray, theirs: np.ndarray) -> int:
    """Values whose bits differ, any NaN matching any NaN."""
    ours, theirs = ours.reshape(-1), np.asarray(theirs, np.float32).reshape(-1)
    same = (ours.view(np.uint32) == theirs.view(np.uint32)) | (np.isnan(ours) & np.isnan(theirs))
    return int((~same).sum())


def _gguf_dequantize(data: np.ndarray, qtype: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return gguf.quants.dequantize(data, getattr(gguf.GGMLQuantizationType, qtype))


@pytest.mark.parametrize("qtype", KTYPES)
def test_dequantize_is_gguf_on_random_bytes(qtype: str) -> None:
    data = _random_blocks(qtype, 10_000, 2_000, seed=KTYPES.index(qtype))
    theirs = _gguf_dequantize(data, qtype)
    assert np.isfinite(theirs[:10_000]).all()  # the finite part really has finite scales
    for backend in ("numba", "numpy"):
        assert _differing(dequantize(data, qtype, backend=backend), theirs) == 0, backend


@pytest.mark.parametrize("qtype", KTYPES)
def test_dequantize_is_gguf_on_quantized_blocks(qtype: str) -> None:
    x = np.concatenate([make_values(p, 30 + k, 64, 1024, 256) for k, p in enumerate(QUANT_PATTERNS)])
    data = quantize(x, qtype)
    assert _differing(dequantize(data, qtype), _gguf_dequantize(data, qtype)) == 0


@pytest.mark.parametrize("qtype", KTYPES)
def test_quantize_is_gguf_where_gguf_has_it(qtype: str) -> None:
    gtype = getattr(gguf.GGMLQuantizationType, qtype)
    try:
        gguf.quants.quantize(np.zeros((1, 256), np.float32), gtype)
    except NotImplementedError:
        pytest.skip(f"gguf-py has no {qtype} quantize: exactness is in tests/test_ggml_formats_kquants.py")
    rows = -(-10_000 // (4 * len(QUANT_PATTERNS)))
    x = np.concatenate([make_values(p, 50 + k, rows, 1024, 256) for k, p in enumerate(QUANT_PATTERNS)])
    with np.errstate(all="ignore"):
        theirs = gguf.quants.quantize(x, gtype)
    size = FORMATS[qtype].type_size
    bad = np.flatnonzero((quantize(x, qtype).reshape(-1, size) != np.asarray(theirs).reshape(-1, size)).any(axis=1))
    assert bad.size == 0, f"{bad.size} of {x.size // 256} blocks differ, first {bad[:3]}"


def _q4_k_dequantize_shifted_scales(data: np.ndarray) -> np.ndarray:
    """A broken Q4_K dequantizer: sub-block j reads the 6-bit scale of sub-block j - 1 (mod 8)."""
    blocks = FORMATS["Q4_K"].blocks(data)
    sc, m = get_scale_min_k4(blocks["scales"])
    sc = np.roll(sc, 1, axis=1)
    d = mul(blocks["d"].view(np.float16).astype(np.float32)[:, None], sc, False)
    dmin = mul(blocks["dmin"].view(np.float16).astype(np.float32)[:, None], m, False)
    q = (blocks["qs"].reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8)[None, None, :, None]) & 0xF
    return sub(mul(d[..., None], q.reshape(-1, 8, 32), False), dmin[..., None], False).reshape(data.shape[0], -1)


def test_the_comparison_catches_a_scale_read_from_the_wrong_sub_block() -> None:
    data = _random_blocks("Q4_K", 2_000, 0, seed=99)
    theirs = _gguf_dequantize(data, "Q4_K")
    assert _differing(dequantize(data, "Q4_K"), theirs) == 0
    assert _differing(_q4_k_dequantize_shifted_scales(data), theirs) > 0

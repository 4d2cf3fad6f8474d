"""Cross-checks against gguf-py (``pip install qconform[upstream]``); skipped without it.

gguf-py has Q8_0 quantize and dequantize, which its source states are bit-exact with ggml's
reference C (gguf-py/gguf/quants.py); it has no Q8_K (ggml_quantize_chunk has no Q8_K either), so
Q8_K rests on the hand-derived vectors of test_oracle_semantics.py and the twins. NaN input is
left out: gguf's numpy max propagates NaN where the C MAX macro does not (specs 6, 8.5).
"""

from __future__ import annotations

import numpy as np
import pytest

from qconform.ops.patterns import make_values
from qconform.oracles.ggml import dequantize, quantize

gguf = pytest.importorskip("gguf")
Q8_0 = gguf.GGMLQuantizationType.Q8_0
FINITE_OR_INF = ("normal", "uniform", "ties", "zero_block", "equal_abs", "outlier", "extreme", "subnormal", "inf")


def test_q8_0_quantize_is_gguf_on_100k_rows() -> None:
    rows, width = 100_000, 128
    per = -(-rows // len(FINITE_OR_INF))
    x = np.concatenate([make_values(p, 40 + i, per, width, 32) for i, p in enumerate(FINITE_OR_INF)])[:rows]
    with np.errstate(all="ignore"):
        theirs = gguf.quants.quantize(x, Q8_0)
    ours = quantize(x, "Q8_0")
    assert ours.shape == theirs.shape == (rows, width // 32 * 34)
    bad = np.flatnonzero((ours != theirs).any(axis=1))
    assert bad.size == 0, f"{bad.size} rows differ, first row {bad[:1]}"
    ties = make_values("ties", 0, 64, width, 32)
    assert np.array_equal(quantize(ties, "Q8_0"), gguf.quants.quantize(ties, Q8_0))


def test_q8_0_dequantize_is_gguf_on_random_bytes() -> None:
    data = np.random.default_rng(1).integers(0, 256, size=(20_000, 34 * 8), dtype=np.uint8)
    with np.errstate(all="ignore"):
        theirs = gguf.quants.dequantize(data, Q8_0)
    ours = dequantize(data, "Q8_0")
    same = (ours.view(np.uint32) == theirs.view(np.uint32)) | (np.isnan(ours) & np.isnan(theirs))
    assert same.all()


def test_q8_0_quantize_accepts_gguf_enum() -> None:
    x = make_values("normal", 3, 2, 64, 32)
    assert np.array_equal(quantize(x, Q8_0), quantize(x, "Q8_0"))


def test_benchmark_reports_a_ratio(capsys) -> None:
    from qconform.bench.ggml_quant import bench_q8_0

    results = bench_q8_0(mb=2, repeats=1)
    assert results["ratio"] > 0
    assert "bytes identical: True" in capsys.readouterr().out

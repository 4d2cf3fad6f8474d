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


@pytest.mark.parametrize("hide_c", [False, True], ids=["c-if-found", "c-hidden"])
def test_benchmark_table_structure_and_agreement(hide_c: bool, monkeypatch, capsys) -> None:
    """The CPU bench at a tiny size (no timing asserted): a row and a BenchRecord per (op, type),
    every side timed ``repeats`` times, and the oracle's output equal to gguf-py's (and to ggml's
    C where ci/ggml-lib.sh's library is found) on the benchmarked input; without the library, a
    line that says how to build it."""
    from qconform.bench import ggml_quant
    from qconform.bench.ggml_quant import GGUF, ROWS, C, bench_ggml

    if hide_c:
        monkeypatch.setattr(ggml_quant, "find_ggml_lib", lambda: None)
    results = bench_ggml(mb=1, repeats=2, width=1024)
    rows, records = results["rows"], results["records"]
    assert [(r["op"], r["qtype"]) for r in rows] == list(ROWS) and len(records) == len(ROWS)
    sides = {GGUF} | ({C} if results["lib"] is not None else set())
    for row, rec in zip(rows, records, strict=True):
        assert row["agree"] == dict.fromkeys(sides, True), (row["qtype"], row["agree"])
        assert set(row["times"]) == {"oracle"} | sides and all(len(t) == 2 for t in row["times"].values())
        assert set(row["ratio"]) == sides and all(lo <= med <= hi for lo, med, hi in row["ratio"].values())
        assert all(lo <= med <= hi for lo, med, hi in row["MBps"].values())
        assert rec.verdict == "PASS" and rec.shape == (256, 1024) and len(rec.times_us) == 2
        assert set(rec.baselines) == sides and rec.kernel.startswith(row["qtype"].lower())
    assert records[0].key == "q4_k_dequant oracle (numba) 256x1024"
    assert records[2].bytes == 2**20 + 2**20 * 34 // 128  # Q8_0: float32 in, 34 bytes per 32 values out
    out = capsys.readouterr().out
    assert out.count("gguf=yes") == len(ROWS) and "gguf=NO" not in out and "C=NO" not in out
    if results["lib"] is None:
        assert "ggml C reference: not found (bash ci/ggml-lib.sh" in out


def test_bench_writes_records_and_compares_them(tmp_path, capsys) -> None:
    """One JSON record per (kernel, shape) with every run's time and gguf-py timed beside it;
    --compare prints each record's change, and calls a change inside the runs' spread so."""
    from qconform.bench.records import BenchRecord, compare, read_records
    from qconform.cli import main

    out = tmp_path / "bench.json"
    assert main(["bench", "--mb", "2", "--repeats", "3", "--json", str(out)]) == 0
    recs = read_records(out)
    assert [r.kernel.split()[0] for r in recs] == ["q4_k_dequant", "q6_k_dequant", "q8_0_quant", "q4_0_quant"]
    rec = recs[2]
    assert rec.verdict == "PASS" and len(rec.times_us) == 3 and rec.bytes == 2 * 2**20 + 2 * 2**20 * 34 // 128
    assert "gguf-py numpy" in rec.ratios() and rec.ratios()["gguf-py numpy"] > 0
    assert main(["bench", "--mb", "2", "--repeats", "3", "--compare", str(out)]) == 0
    assert f"{rec.key}: " in capsys.readouterr().out
    slow = BenchRecord(rec.kernel, rec.shape, rec.device, rec.bytes, 0, (300.0, 310.0), "PASS")
    fast = BenchRecord(rec.kernel, rec.shape, rec.device, rec.bytes, 0, (100.0, 105.0), "FAIL")
    assert compare([slow], [fast]) == [f"{rec.key}: 305.0 -> 102.5 us (-66.4%, faster, verdict PASS -> FAIL)"]
    near = BenchRecord(rec.kernel, rec.shape, rec.device, rec.bytes, 0, (290.0, 320.0), "PASS")
    assert "within the spread" in compare([slow], [near])[0]
    assert main(["bench", "--compare", str(tmp_path / "missing.json")]) == 2


def test_bench_plot_draws_a_png_or_names_the_missing_extra(tmp_path, capsys) -> None:
    import importlib.util

    from qconform.cli import main

    png = tmp_path / "roofline.png"
    code = main(["bench", "--mb", "1", "--repeats", "1", "--plot", str(png)])
    if importlib.util.find_spec("matplotlib") is None:
        assert code == 2 and "pip install 'qconform[plot]'" in capsys.readouterr().err
    else:
        assert code == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

"""The ggml oracle's CPU throughput against gguf-py and ggml's own C, side by side in one run.

Rows: dequantize Q4_K and Q6_K, quantize Q8_0 and Q4_0, all on one float32 input (the dequantize
rows on its quantized bytes). Each row times the numba oracle, gguf-py's numpy
(``gguf.quants.quantize`` / ``dequantize``) and ggml's C reference (``quantize_row_*_ref`` /
``dequantize_row_*`` through ctypes, one call over the whole buffer, from the library that
ci/ggml-lib.sh builds; ``QCONFORM_GGML_LIB`` or build/ggml/libggml-ref.so), the three interleaved
in each repeat so that the machine's load moves them alike, after an untimed warm-up (numba's
compile or cache load, first touch of the buffers). The oracle and C write into preallocated
outputs; gguf-py allocates its own, as its API does. Printed per row: MB/s of float32 values
produced or consumed (min / median / max over the repeats), the speed ratios oracle/gguf-py and
oracle/C (median, and the range from the slowest against the fastest runs), whether the oracle's
bytes (quantize) or float32 bits (dequantize) equal each upstream's on this input, and the row's
verdict against the targets: Q4_K dequantize >= 20x gguf-py, every row within 2x of C (oracle
>= 0.5x C's speed), at the medians. Returns one ``BenchRecord`` per row (every oracle run's time;
gguf-py and C as baselines timed beside it; verdict PASS when the outputs agree with every
upstream that ran). Never a timed test: the suite checks only that it runs and agrees.
"""

from __future__ import annotations

import ctypes
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from qconform.bench.records import BenchRecord
from qconform.formats.ggml import FORMATS
from qconform.oracles.ggml import dequantize, quantize

ROWS = (("dequantize", "Q4_K"), ("dequantize", "Q6_K"), ("quantize", "Q8_0"), ("quantize", "Q4_0"))
GGUF_TARGETS = {("dequantize", "Q4_K"): 20.0}  # oracle / gguf-py speed, at the medians
C_TARGET = 0.5  # oracle / C speed, every row: "within 2x"
GGUF, C = "gguf-py numpy", "ggml C ref"
BUILD_HINT = "bash ci/ggml-lib.sh builds build/ggml/libggml-ref.so; or set QCONFORM_GGML_LIB to a build"


def find_ggml_lib() -> Path | None:
    """ggml's C reference library: ``QCONFORM_GGML_LIB``, else ci/ggml-lib.sh's output under the
    working directory or this checkout."""
    env = os.environ.get("QCONFORM_GGML_LIB")
    if env:
        return Path(env) if Path(env).is_file() else None
    for root in (Path.cwd(), Path(__file__).resolve().parents[3]):
        path = root / "build" / "ggml" / "libggml-ref.so"
        if path.is_file():
            return path
    return None


def _quant_bytes(qtype: str, x: np.ndarray) -> int:
    """Bytes of ``x``'s rows quantized to ``qtype``."""
    return x.shape[0] * FORMATS[qtype].n_bytes(x.shape[1])


def _c_name(qtype: str) -> str:
    return qtype.lower().replace("_k", "_K")  # ggml's spelling: q4_0, q4_K


def _c_fn(lib: ctypes.CDLL, op: str, qtype: str) -> Callable[[np.ndarray, np.ndarray], None]:
    """fn(src, dst): one C row call over the whole buffer (ggml's row functions take any multiple
    of the block)."""
    name = f"quantize_row_{_c_name(qtype)}_ref" if op == "quantize" else f"dequantize_row_{_c_name(qtype)}"
    fn = getattr(lib, name)
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None

    def call(src: np.ndarray, dst: np.ndarray) -> None:
        fn(src.ctypes.data, dst.ctypes.data, (src if op == "quantize" else dst).size)

    return call


def _same(ours: np.ndarray, theirs: np.ndarray) -> bool:
    """Bytes equal (float32 compared by bits)."""
    theirs = np.asarray(theirs)
    return ours.dtype == theirs.dtype and ours.size == theirs.size and ours.tobytes() == theirs.tobytes()


def _mbps(nbytes: int, times: list[float]) -> tuple[float, float, float]:
    """(min, median, max) MB/s of ``nbytes`` over the runs."""
    speeds = [nbytes / t / 1e6 for t in times]
    return min(speeds), statistics.median(speeds), max(speeds)


def _ratio(ours: list[float], theirs: list[float]) -> tuple[float, float, float]:
    """Speed of ours over theirs: (slowest ours against fastest theirs, median, the reverse)."""
    return min(theirs) / max(ours), statistics.median(theirs) / statistics.median(ours), max(theirs) / min(ours)


def _fmt_speed(s: tuple[float, float, float] | None) -> str:
    return "-" if s is None else "/".join(f"{v:.0f}" for v in s)


def _fmt_ratio(r: tuple[float, float, float] | None) -> str:
    return "-" if r is None else f"{r[1]:.2f}x ({r[0]:.2f}-{r[2]:.2f})"


def bench_ggml(
    mb: int = 128, repeats: int = 5, width: int = 4096, lib_path: str | Path | None = None
) -> dict[str, Any]:
    """Run the table on ``mb`` MiB of float32 (rows of ``width``); print it and return
    ``{"rows": [per-row dict], "records": [BenchRecord], "lib": path or None}``. Each row dict:
    op, qtype, MBps (side -> (min, median, max)), ratio (side -> (lo, median, hi)), agree
    (side -> bool), targets (text), targets_met (bool)."""
    import numba

    n = mb * 2**20 // 4 // width * width
    if n == 0:
        raise ValueError(f"mb={mb}: less than one row of {width} values")
    x = np.random.default_rng(0).standard_normal((n // width, width)).astype(np.float32)
    try:
        import gguf
    except ImportError:
        gguf = None
    path = Path(lib_path) if lib_path is not None else find_ggml_lib()
    lib = ctypes.CDLL(str(path)) if path is not None else None
    threads = numba.get_num_threads()
    device = f"cpu-{platform.machine()} ({os.cpu_count()} cores)"
    print(
        f"input: {x.shape[0]} x {width} float32 = {x.nbytes / 2**20:.0f} MiB; MB/s of float32 values"
        f" (min/median/max of {repeats} interleaved repeats); numba oracle on {threads} threads,"
        " gguf-py and C on one"
    )
    if gguf is None:
        print("gguf-py: not installed (pip install 'qconform[upstream]'): no gguf-py column")
    if lib is None:
        print(f"ggml C reference: not found ({BUILD_HINT}): no C column")
    else:
        print(f"ggml C reference: {path}")
    head = f"{'row':13} {'oracle MB/s':>17} {'gguf-py MB/s':>15} {'C MB/s':>17} {'oracle/gguf-py':>20}"
    print(f"{head} {'oracle/C':>18}  agrees     targets")
    rows, records = [], []
    for op, qtype in ROWS:
        row = _bench_row(op, qtype, x, repeats, gguf, lib)
        rows.append(row)
        ratio = row["ratio"]
        agree = " ".join(f"{'gguf' if s == GGUF else 'C'}={'yes' if ok else 'NO'}" for s, ok in row["agree"].items())
        print(
            f"{qtype + ' ' + op.removesuffix('ize'):13} {_fmt_speed(row['MBps']['oracle']):>17}"
            f" {_fmt_speed(row['MBps'].get(GGUF)):>15} {_fmt_speed(row['MBps'].get(C)):>17}"
            f" {_fmt_ratio(ratio.get(GGUF)):>20} {_fmt_ratio(ratio.get(C)):>18}  {agree or '-':10} {row['targets']}"
        )
        agreed = all(row["agree"].values())
        verdict = ("PASS" if agreed else "FAIL") if row["agree"] else "n/a (no upstream)"
        quantized = _quant_bytes(qtype, x)
        records.append(
            BenchRecord(
                kernel=f"{qtype.lower()}_{'quant' if op == 'quantize' else 'dequant'} oracle (numba)",
                shape=x.shape,
                device=device,
                bytes=x.nbytes + quantized,
                flops=0,
                times_us=tuple(t * 1e6 for t in row["times"]["oracle"]),
                verdict=verdict,
                baselines={side: statistics.median(ts) * 1e6 for side, ts in row["times"].items() if side != "oracle"},
            )
        )
    missed = [f"{r['qtype']} {r['op']}" for r in rows if not r["targets_met"]]
    print(f"targets: {'all met' if not missed else 'MISSED by ' + ', '.join(missed)} (at the medians)")
    return {"rows": rows, "records": records, "lib": path}


def _bench_row(op: str, qtype: str, x: np.ndarray, repeats: int, gguf: Any, lib: ctypes.CDLL | None) -> dict:
    """Time one row's sides, interleaved per repeat, after one untimed warm-up call of each."""
    if op == "dequantize":
        src = quantize(x, qtype)  # the oracle's bytes of x, which the agreement columns check against C
        ours = np.empty_like(x)
        run_ours = lambda: dequantize(src, qtype, out=ours)  # noqa: E731
    else:
        src = x
        ours = np.empty((x.shape[0], _quant_bytes(qtype, x) // x.shape[0]), np.uint8)
        run_ours = lambda: quantize(x, qtype, out=ours)  # noqa: E731
    sides: dict[str, Callable[[], Any]] = {"oracle": run_ours}
    outputs: dict[str, Any] = {"oracle": ours}
    if gguf is not None:
        gtype = getattr(gguf.GGMLQuantizationType, qtype)
        gfn = gguf.quants.dequantize if op == "dequantize" else gguf.quants.quantize
        sides[GGUF] = lambda: gfn(src, gtype)
    if lib is not None:
        cfn = _c_fn(lib, op, qtype)
        theirs = np.zeros_like(ours)
        sides[C] = lambda: cfn(src, theirs)
        outputs[C] = theirs
    times: dict[str, list[float]] = {side: [] for side in sides}
    for side, fn in sides.items():  # warm-up: compile / cache load, page faults
        out = fn()
        if side == GGUF:
            outputs[GGUF] = out
    for _ in range(repeats):
        for side, fn in sides.items():
            t0 = time.perf_counter()
            fn()
            times[side].append(time.perf_counter() - t0)
    values = x.nbytes
    mbps = {side: _mbps(values, ts) for side, ts in times.items()}
    ratio = {side: _ratio(times["oracle"], ts) for side, ts in times.items() if side != "oracle"}
    agree = {side: _same(ours, outputs[side]) for side in sides if side != "oracle"}
    notes, met = [], True
    want = GGUF_TARGETS.get((op, qtype))
    if want is not None and GGUF in ratio:
        ok = ratio[GGUF][1] >= want
        met &= ok
        notes.append(f">={want:.0f}x gguf-py {'met' if ok else 'MISSED'}")
    if C in ratio:
        ok = ratio[C][1] >= C_TARGET
        met &= ok
        notes.append(f"within 2x of C {'met' if ok else 'MISSED'}")
    return {
        "op": op,
        "qtype": qtype,
        "times": times,
        "MBps": mbps,
        "ratio": ratio,
        "agree": agree,
        "targets": "; ".join(notes) or "n/a (no upstream)",
        "targets_met": met,
    }

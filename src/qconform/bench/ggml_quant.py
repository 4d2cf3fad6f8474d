"""Q8_0 quantize throughput: the numba oracle against gguf-py's numpy quantizer on one input.

Prints MB/s of float32 input for each, the ratio, and whether the bytes agree; returns the
figures and a ``BenchRecord`` (every run's time, gguf-py as the baseline timed beside it).
"""

from __future__ import annotations

import os
import platform
import time
from typing import Any, Callable

import numpy as np

from qconform.bench.records import BenchRecord
from qconform.oracles.ggml import quantize


def _timed(fn: Callable[[], np.ndarray], repeats: int) -> tuple[list[float], np.ndarray]:
    """(seconds of each run, the last output)."""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return times, out


def bench_q8_0(mb: int = 64, repeats: int = 3, width: int = 4096) -> dict[str, Any]:
    n = mb * 2**20 // 4
    x = np.random.default_rng(0).standard_normal((n // width, width)).astype(np.float32)
    quantize(x[:1], "Q8_0")  # compile / load the numba cache outside the timing
    results: dict[str, Any] = {}
    times_nb, ours = _timed(lambda: quantize(x, "Q8_0"), repeats)
    t_nb = float(np.median(times_nb))
    results["numba_MBps"] = mb * 2**20 / t_nb / 1e6
    print(f"input: {x.shape[0]} x {width} float32 = {x.nbytes / 2**20:.0f} MiB, median of {repeats}")
    print(f"qconform numba oracle : {t_nb * 1e3:9.1f} ms  {results['numba_MBps']:9.1f} MB/s")
    device = f"cpu-{platform.machine()} ({os.cpu_count()} cores)"
    record = dict(kernel="q8_0_quant oracle (numba)", shape=x.shape, device=device, bytes=x.nbytes + ours.nbytes)
    times_us = tuple(t * 1e6 for t in times_nb)
    try:
        import gguf
    except ImportError:
        print("gguf-py not installed (pip install 'qconform[upstream]'): no ratio")
        results["record"] = BenchRecord(**record, flops=0, times_us=times_us, verdict="n/a (no gguf-py)")
        return results
    times_gg, theirs = _timed(lambda: gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0), repeats)
    t_gg = float(np.median(times_gg))
    same = bool(np.array_equal(ours, theirs))
    results["gguf_MBps"] = mb * 2**20 / t_gg / 1e6
    results["ratio"] = t_gg / t_nb
    print(f"gguf-py numpy         : {t_gg * 1e3:9.1f} ms  {results['gguf_MBps']:9.1f} MB/s")
    lo, hi = min(times_gg) / max(times_nb), max(times_gg) / min(times_nb)
    print(
        f"speed-up (gguf / qconform): {results['ratio']:.1f}x ({lo:.1f}x to {hi:.1f}x over the runs)"
        f"   bytes identical: {same}"
    )
    baselines = {"gguf-py numpy": t_gg * 1e6}
    verdict = "PASS" if same else "FAIL"
    results["record"] = BenchRecord(**record, flops=0, times_us=times_us, verdict=verdict, baselines=baselines)
    return results

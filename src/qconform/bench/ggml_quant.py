"""Q8_0 quantize throughput: the numba oracle against gguf-py's numpy quantizer on one input.

Prints MB/s of float32 input for each, the ratio, and whether the bytes agree.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import numpy as np

from qconform.oracles.ggml import quantize


def _median_seconds(fn: Callable[[], np.ndarray], repeats: int) -> tuple[float, np.ndarray]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def bench_q8_0(mb: int = 64, repeats: int = 3, width: int = 4096) -> dict[str, float]:
    n = mb * 2**20 // 4
    x = np.random.default_rng(0).standard_normal((n // width, width)).astype(np.float32)
    quantize(x[:1], "Q8_0")  # compile / load the numba cache outside the timing
    results: dict[str, float] = {}
    t_nb, ours = _median_seconds(lambda: quantize(x, "Q8_0"), repeats)
    results["numba_MBps"] = mb * 2**20 / t_nb / 1e6
    print(f"input: {x.shape[0]} x {width} float32 = {x.nbytes / 2**20:.0f} MiB, median of {repeats}")
    print(f"qconform numba oracle : {t_nb * 1e3:9.1f} ms  {results['numba_MBps']:9.1f} MB/s")
    try:
        import gguf
    except ImportError:
        print("gguf-py not installed (pip install 'qconform[upstream]'): no ratio")
        return results
    t_gg, theirs = _median_seconds(lambda: gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0), repeats)
    results["gguf_MBps"] = mb * 2**20 / t_gg / 1e6
    results["ratio"] = t_gg / t_nb
    print(f"gguf-py numpy         : {t_gg * 1e3:9.1f} ms  {results['gguf_MBps']:9.1f} MB/s")
    print(
        f"speed-up (gguf / qconform): {results['ratio']:.1f}x   bytes identical: {bool(np.array_equal(ours, theirs))}"
    )
    return results

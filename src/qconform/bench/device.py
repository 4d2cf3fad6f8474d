"""Device throughput: each kernel on rows of 4096 x 14336 against the measured device-to-device
copy bandwidth (bytes read + bytes written, both). Cold: the inputs rotate among sets that
together exceed the L2 several times; launches are queued back to back and timed with events
(docs/device-tooling.md F3), the median over repetitions reported."""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass, replace
from typing import Any

import cupy
import numpy as np

from qconform.device import registry
from qconform.device.ggml.q8_quant import bind, run_kernel
from qconform.device.loader import device_info, get_kernel
from qconform.device.registry import GGML_KERNELS, KernelSpec
from qconform.formats.ggml import FORMATS

MEMCPY_DEVICE_TO_DEVICE = 3


def _candidates() -> list[Any]:
    from qconform.device.registry import MMA_DECODE_CANDIDATES

    return [replace(shape, warps_per_sm=w) for shape in MMA_DECODE_CANDIDATES for w in (16, 32, 48)]


@dataclass(frozen=True)
class Timing:
    name: str
    bytes_moved: int
    seconds: float

    @property
    def gbps(self) -> float:
        return self.bytes_moved / self.seconds / 1e9


_SPIN = r"""
extern "C" __global__ void qk_spin(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}
"""


@functools.cache
def _spin_kernel() -> Any:
    return cupy.RawKernel(_SPIN, "qk_spin")


def _spin(cycles: int = 20_000_000) -> None:
    """Keep the GPU busy (~10 ms) while the host queues the timed launches, so that they run back
    to back and the events time the device, not Python's launch path."""
    _spin_kernel()((1,), (1,), (np.int64(cycles),))


def _median_time(launch, n_sets: int, reps: int, batches: int = 5) -> float:
    """The median over ``batches`` of the mean time per launch of ``reps`` back-to-back launches
    (queued behind a spin kernel), the inputs rotating over ``n_sets`` sets."""
    stream = cupy.cuda.get_current_stream()
    for i in range(2 * n_sets):  # warm-up: module load, clocks
        launch(i % n_sets)
    means = []
    for _ in range(batches):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        _spin()
        start.record(stream)
        for i in range(reps):
            launch(i % n_sets)
        end.record(stream)
        end.synchronize()
        means.append(cupy.cuda.get_elapsed_time(start, end) / 1e3 / reps)
    return statistics.median(means)


def copy_bandwidth(n_bytes: int = 1 << 30, reps: int = 20) -> Timing:
    """A device-to-device cudaMemcpyAsync of ``n_bytes``; counts the bytes read plus written."""
    src = [cupy.empty(n_bytes, cupy.uint8) for _ in range(2)]
    dst = cupy.empty(n_bytes, cupy.uint8)
    for s in src:
        s.fill(1)
    stream = cupy.cuda.get_current_stream()

    def launch(i: int) -> None:
        cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src[i].data.ptr, n_bytes, MEMCPY_DEVICE_TO_DEVICE, stream.ptr)

    return Timing("device-to-device copy", 2 * n_bytes, _median_time(launch, 2, reps))


def _inputs(spec: KernelSpec, rows: int, width: int, seed: int):
    rng = cupy.random.default_rng(seed)
    x = rng.standard_normal((rows, width), dtype=cupy.float32)
    if spec.op.endswith("_quant"):
        return {"x": x}, {"qtype": spec.op.split("_quant")[0].upper()}
    qtype = spec.op.split("_dequant")[0].upper()
    q = cupy.empty((rows, FORMATS[qtype].n_bytes(width)), cupy.uint8)
    quant = next(k for k in GGML_KERNELS if k.op == f"{qtype.lower()}_quant")
    run_kernel(
        quant.op, get_kernel(quant.path, quant.symbol), quant.geometry, bind(quant.op, {"x": x}, {"qtype": qtype}), q
    )
    return {"data": q}, {"qtype": qtype}


def kernel_timing(spec: KernelSpec, rows: int, width: int, reps: int) -> Timing:
    l2 = device_info().l2_bytes
    one = rows * width * 4
    n_sets = max(2, -(-4 * l2 // one))
    sets = []
    for i in range(n_sets):
        inputs, params = _inputs(spec, rows, width, i)
        call = bind(spec.op, inputs, params)
        sets.append((call, cupy.empty(call.shape, call.dtype)))
    kernel = get_kernel(spec.path, spec.symbol)

    def launch(i: int) -> None:
        call, out = sets[i]
        run_kernel(spec.op, kernel, spec.geometry, call, out)

    call, out = sets[0]
    moved = call.src.nbytes + out.nbytes
    return Timing(f"{spec.op} {spec.variant}", moved, _median_time(launch, n_sets, reps))


def bench_device(rows: int = 4096, width: int = 14336, reps: int = 30) -> list[tuple[Timing, float]]:
    """Print and return (timing, fraction of copy bandwidth) for every kernel."""
    info = device_info()
    copy = copy_bandwidth()
    print(f"{info.name} {info.label}: copy {copy.gbps:.0f} GB/s (read + write, median of 20 x 1 GiB)")
    rows_out = []
    print(f"| kernel ({rows} x {width}) | MB moved | us (median of {reps}) | GB/s | of copy bandwidth |")
    print("|---|---|---|---|---|")
    for spec in GGML_KERNELS:
        t = kernel_timing(spec, rows, width, reps)
        frac = t.gbps / copy.gbps
        rows_out.append((t, frac))
        print(f"| {t.name} | {t.bytes_moved / 1e6:.1f} | {t.seconds * 1e6:.1f} | {t.gbps:.0f} | {frac:.0%} |")
    return rows_out


def _nbits_sets(K: int, N: int, bits: int, bs: int, n_sets: int, seed: int) -> list[tuple[Any, Any]]:
    rng = cupy.random.default_rng(seed)
    kb = -(-K // bs)
    return [
        (
            rng.integers(0, 256, (N, kb, bs * bits // 8), dtype=cupy.uint8),
            (rng.random((N, kb), dtype=cupy.float32) * 0.01).astype(cupy.float16),
        )
        for _ in range(n_sets)
    ]


def bench_gemv(K: int = 5120, N: int = 17920, reps: int = 50) -> list[tuple[str, Timing, float, float]]:
    """MatMulNBits decode (M = 1, block 64, default zero point) on K x N with cold weights (sets
    rotating over 4x the L2): the GEMV against the copy bandwidth, and against
    dequantize-to-fp16 + cuBLAS (CuPy matmul) on the same sets. fp16 A/Y/scales take the
    matrix-unit kernel, fp32 the per-output one. The decode split (``MMA_SHAPES``) is tuned here:
    each candidate's time is printed first."""
    from qconform.bench.diagnostics import DIAGNOSTICS
    from qconform.device import ort as ort_launch

    copy = copy_bandwidth()
    l2 = device_info().l2_bytes
    bs = 64
    kw = {"K": K, "N": N, "bits": 2, "block_size": bs}
    sets = {bits: _nbits_sets(K, N, bits, bs, max(2, -(-4 * l2 // (N * K * bits // 8))), bits) for bits in (2, 4)}
    rng = cupy.random.default_rng(0)
    a16 = rng.standard_normal((1, K), dtype=cupy.float32).astype(cupy.float16)

    def time_gemv(bits: int, a: Any) -> tuple[Timing, float]:
        y = cupy.empty((1, N), a.dtype)
        calls = [
            ort_launch.bound(ort_launch.matmul_nbits, a, b, s.astype(a.dtype), **{**kw, "bits": bits}, out=y)
            for b, s in sets[bits]
        ]
        t = _median_time(lambda i: calls[i](), len(calls), reps)
        b, s = sets[bits][0]
        timing = Timing(f"u{bits} {a.dtype}", b.nbytes + s.nbytes * a.itemsize // 2 + a.nbytes + y.nbytes, t)
        return timing, timing.gbps / copy.gbps

    default = registry.MMA_SHAPES["decode"]
    print(f"decode split candidates, u2 fp16 M=1 {K}x{N} (r x 16 rows, p chunks in flight, warps/SM): us, of copy")
    for shape in _candidates():
        registry.MMA_SHAPES["decode"] = shape
        t, frac = time_gemv(2, a16)
        wk = f"r={shape.r} p={shape.p} o={shape.o} warps/SM={shape.warps_per_sm}"
        print(f"  {wk}: {t.seconds * 1e6:.1f} us {frac:.0%}")
    registry.MMA_SHAPES["decode"] = default
    print("diagnostics (wrong results, timing only), default shape:")
    for _, what, patch in DIAGNOSTICS:  # patched copies of nbits_mma.hip (qconform.bench.diagnostics)
        with (
            patch.materialised() as source,
            ort_launch.source_override({"nbits_mma.hip": source}),
            ort_launch.compile_options("-DQK_MMA_DEFAULT_ONLY"),
        ):
            t, frac = time_gemv(2, a16)
        print(f"  {what}: {t.seconds * 1e6:.1f} us {frac:.0%}")

    out = []
    print()
    print(f"| MatMulNBits M=1, {K}x{N}, block 64 | MB read | GEMV us | GB/s | of copy | dequant+cuBLAS us | speed-up |")
    print("|---|---|---|---|---|---|---|")
    w32 = cupy.empty((N, K), cupy.float32)
    for bits, a in ((2, a16), (4, a16), (2, a16.astype(cupy.float32))):
        timing, frac = time_gemv(bits, a)
        deqs = [
            ort_launch.bound(ort_launch.dequantize_nbits, b, s, **{**kw, "bits": bits}, out=w32) for b, s in sets[bits]
        ]

        def baseline(i: int, deqs=deqs, a=a) -> None:
            deqs[i]()
            cupy.matmul(w32.astype(a.dtype), a[0])

        tb = _median_time(baseline, len(deqs), 5, batches=3)
        ratio = tb / timing.seconds
        out.append((timing.name, timing, frac, ratio))
        cells = (timing.name, f"{timing.bytes_moved / 1e6:.1f}", f"{timing.seconds * 1e6:.1f}", f"{timing.gbps:.0f}")
        print("| " + " | ".join((*cells, f"{frac:.0%}", f"{tb * 1e6:.1f}", f"{ratio:.1f}x")) + " |")
    return out


def bench_prefill(M: int = 2048, K: int = 5120, N: int = 17920, reps: int = 5) -> tuple[float, float]:
    """MatMulNBits prefill (fp16, u2, block 64) against dequantize-to-fp16 + cuBLAS: TFLOP/s
    and the ratio (warm: weights and activations fit the L2 together)."""
    from qconform.device import ort as ort_launch

    ((b, s),) = _nbits_sets(K, N, 2, 64, 1, 7)
    a = cupy.random.default_rng(1).standard_normal((M, K), dtype=cupy.float32).astype(cupy.float16)
    y = cupy.empty((M, N), cupy.float16)
    kw = {"K": K, "N": N, "bits": 2, "block_size": 64}
    call = ort_launch.bound(ort_launch.matmul_nbits, a, b, s, **kw, out=y)
    w32 = cupy.empty((N, K), cupy.float32)
    deq = ort_launch.bound(ort_launch.dequantize_nbits, b, s, **kw, out=w32)

    def baseline(_: int) -> None:
        deq()
        cupy.matmul(a, w32.astype(cupy.float16).T)

    t = _median_time(lambda _: call(), 1, reps, batches=3)
    tb = _median_time(baseline, 1, reps, batches=3)
    flops = 2 * M * N * K
    print()
    print(f"| MatMulNBits prefill M={M}, {K}x{N}, u2 fp16 | us | TFLOP/s | dequant+cuBLAS us | speed-up |")
    print("|---|---|---|---|---|")
    print(f"| matrix-unit kernel | {t * 1e6:.0f} | {flops / t / 1e12:.0f} | {tb * 1e6:.0f} | {tb / t:.2f}x |")
    return t, tb


if __name__ == "__main__":
    np.seterr(all="ignore")
    bench_device()
    bench_gemv()
    bench_prefill()

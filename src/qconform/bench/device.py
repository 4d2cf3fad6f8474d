"""Device throughput: each kernel on rows of 4096 x 14336 against the measured device-to-device
copy bandwidth (bytes read + bytes written, both). Cold: the inputs rotate among sets that
together exceed the L2 several times; launches are queued back to back and timed with events
(specs/tooling.md F3), the median over repetitions reported."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import cupy
import numpy as np

from qconform.device.launch import bind, run_kernel
from qconform.device.loader import device_info, get_kernel
from qconform.device.registry import KERNELS, KernelSpec
from qconform.formats.ggml import FORMATS

MEMCPY_DEVICE_TO_DEVICE = 3


@dataclass(frozen=True)
class Timing:
    name: str
    bytes_moved: int
    seconds: float

    @property
    def gbps(self) -> float:
        return self.bytes_moved / self.seconds / 1e9


def _median_time(launch, n_sets: int, reps: int) -> float:
    stream = cupy.cuda.get_current_stream()
    for i in range(2 * n_sets):  # warm-up: module load, clocks
        launch(i % n_sets)
    events = [cupy.cuda.Event() for _ in range(reps + 1)]
    events[0].record(stream)
    for i in range(reps):
        launch(i % n_sets)
        events[i + 1].record(stream)
    events[-1].synchronize()
    return statistics.median(cupy.cuda.get_elapsed_time(events[i], events[i + 1]) for i in range(reps)) / 1e3


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
    quant = next(k for k in KERNELS if k.op == f"{qtype.lower()}_quant")
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
    for spec in KERNELS:
        t = kernel_timing(spec, rows, width, reps)
        frac = t.gbps / copy.gbps
        rows_out.append((t, frac))
        print(f"| {t.name} | {t.bytes_moved / 1e6:.1f} | {t.seconds * 1e6:.1f} | {t.gbps:.0f} | {frac:.0%} |")
    return rows_out


def bench_gemv(K: int = 5120, N: int = 17920, reps: int = 30) -> list[tuple[str, Timing, float, float]]:
    """MatMulNBits decode (M = 1, fp16 A/Y/scales, block 64, default zero point) on K x N with
    cold weights (sets rotating over 4x the L2): the GEMV against the copy bandwidth, and against
    dequantize-to-fp16 + cuBLAS (CuPy matmul) on the same sets."""
    from qconform.device import ort_launch

    copy = copy_bandwidth()
    l2 = device_info().l2_bytes
    out = []
    print(f"| MatMulNBits M=1, {K}x{N}, fp16 | MB read | GEMV us | GB/s | of copy | dequant+cuBLAS us | speed-up |")
    print("|---|---|---|---|---|---|---|")
    for bits in (2, 4):
        bs = 64
        kb = K // bs
        one = N * kb * (bs * bits // 8) + N * kb * 2
        n_sets = max(2, -(-4 * l2 // one))
        rng = cupy.random.default_rng(bits)
        sets = [
            (
                rng.integers(0, 256, (N, kb, bs * bits // 8), dtype=cupy.uint8),
                (rng.random((N, kb), dtype=cupy.float32) * 0.01).astype(cupy.float16),
            )
            for _ in range(n_sets)
        ]
        a = rng.standard_normal((1, K), dtype=cupy.float32).astype(cupy.float16)
        y = cupy.empty((1, N), cupy.float16)
        kw = {"K": K, "N": N, "bits": bits, "block_size": bs}

        gemvs = [ort_launch.bound(ort_launch.matmul_nbits, a, b, s, **kw, out=y) for b, s in sets]
        w32 = cupy.empty((N, K), cupy.float32)
        deqs = [ort_launch.bound(ort_launch.dequantize_nbits, b, s, **kw, out=w32) for b, s in sets]

        def gemv(i: int, gemvs=gemvs) -> None:
            gemvs[i]()

        def baseline(i: int, deqs=deqs, a=a, w32=w32) -> None:
            deqs[i]()
            cupy.matmul(w32.astype(cupy.float16), a[0])

        t = _median_time(gemv, n_sets, reps)
        moved = one + a.nbytes + y.nbytes
        timing = Timing(f"u{bits}", moved, t)
        tb = _median_time(baseline, n_sets, max(5, reps // 3))
        frac, ratio = timing.gbps / copy.gbps, tb / t
        out.append((f"u{bits}", timing, frac, ratio))
        cells = (
            f"u{bits}",
            f"{moved / 1e6:.1f}",
            f"{t * 1e6:.1f}",
            f"{timing.gbps:.0f}",
            f"{frac:.0%}",
            f"{tb * 1e6:.1f}",
            f"{ratio:.1f}x",
        )
        print("| " + " | ".join(cells) + " |")
    return out


if __name__ == "__main__":
    np.seterr(all="ignore")
    bench_device()
    bench_gemv()

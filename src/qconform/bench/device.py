"""Device throughput: each kernel on rows of 4096 x 14336 against the measured device-to-device
copy bandwidth (bytes read + bytes written, both). Cold: the inputs rotate among sets that
together exceed the L2 several times; launches are queued back to back and timed with events
(docs/device-tooling.md F3), the median over repetitions reported."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import cupy
import numpy as np

from qconform.bench.baselines import times
from qconform.device.ggml.q8_quant import bind, run_kernel
from qconform.device.loader import device_info, get_kernel
from qconform.device.registry import GGML_KERNELS, KernelSpec
from qconform.formats.ggml import FORMATS
from qconform.ops.ggml.q8_quant import finite_scales

MEMCPY_DEVICE_TO_DEVICE = 3


@dataclass(frozen=True)
class Timing:
    name: str
    bytes_moved: int
    seconds: float

    @property
    def gbps(self) -> float:
        return self.bytes_moved / self.seconds / 1e9


def _median_time(launch, n_sets: int, reps: int, batches: int = 5) -> float:
    """The median over ``batches`` of the mean time per launch (``qconform.bench.baselines.times``)."""
    return statistics.median(times(launch, n_sets, reps, batches))


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
    fmt = FORMATS[qtype]
    quant = next((k for k in GGML_KERNELS if k.op == f"{qtype.lower()}_quant"), None)
    if quant is None:  # a weight format without a device quantizer: random blocks with finite scales
        host = np.random.default_rng(seed)
        data = host.integers(0, 256, (rows, fmt.n_bytes(width)), dtype=np.uint8)
        return {"data": cupy.asarray(finite_scales(fmt, data, host))}, {"qtype": qtype}
    q = cupy.empty((rows, fmt.n_bytes(width)), cupy.uint8)
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


if __name__ == "__main__":
    np.seterr(all="ignore")
    bench_device()

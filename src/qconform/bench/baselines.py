"""What a quantized kernel is measured against on the device, timed the same way as the kernel
(cold inputs rotating over sets that exceed the L2 several times, launches queued back to back
behind a spin kernel, events around each batch; ``times`` returns every batch's mean so that
the spread is reported, not only a median):

- the read-only roofline of the kernel's bytes: a kernel that only reads the same buffers once
  with 16-byte loads (``qk_read_roofline``; the fastest of a few launch shapes);
- fp16 cuBLAS on the unquantized weights (what a user runs without quantization);
- a dequantize-to-fp16 kernel at copy bandwidth followed by cuBLAS (``qk_dequant_u{bits}_f16``:
  MatMulNBits with the default zero point, one 16-byte load of a 64-value block row per thread).

The kernels here are bench-only (not part of the suite's catalogue).
"""

from __future__ import annotations

import contextlib
import functools
import statistics
from typing import Any, Callable

import cupy
import numpy as np

from qconform.bench.records import STREAM_ORDER

_SOURCE = r"""
#include <cuda_fp16.h>
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

/* read n16[i] 16-byte words of each of 3 buffers, 4 loads in flight per thread; nothing is
 * written unless the xor of everything read equals `never` (the loads cannot be dropped) */
extern "C" __global__ void qk_read_roofline(const uint4* a, long long na, const uint4* b, long long nb,
                                            const uint4* c, long long nc, u32 never, u32* out) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long i0 = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    u32 x = 0u;
    const uint4* ps[3] = {a, b, c};
    const long long ns[3] = {na, nb, nc};
#pragma unroll
    for (int s = 0; s < 3; ++s) {
        const uint4* p = ps[s];
        const long long n = ns[s];
        long long i = i0;
        for (; i + 3 * stride < n; i += 4 * stride) {
            const uint4 v0 = p[i], v1 = p[i + stride], v2 = p[i + 2 * stride], v3 = p[i + 3 * stride];
            x ^= v0.x ^ v0.y ^ v0.z ^ v0.w ^ v1.x ^ v1.y ^ v1.z ^ v1.w;
            x ^= v2.x ^ v2.y ^ v2.z ^ v2.w ^ v3.x ^ v3.y ^ v3.z ^ v3.w;
        }
        for (; i < n; i += stride) {
            const uint4 v = p[i];
            x ^= v.x ^ v.y ^ v.z ^ v.w;
        }
    }
    if (x == never) out[0] = x;
}

/* MatMulNBits dequantize to fp16, default zero point 2^(bits-1), block 64: thread i writes the
 * 8 fp16 values 8i..8i+7, s * (q - z) (fp32, rounded to nearest even), from BITS bytes of B and
 * one scale: coalesced loads and 16-byte stores */
template <int BITS>
__device__ void qk_dequant_f16(const u8* B, const u16* scales, uint4* W, long long n8) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n8) return;
    const u32 q = BITS == 2 ? (u32)((const u16*)B)[i] : ((const u32*)B)[i];
    const float s = __half2float(__ushort_as_half(scales[i / 8]));
    const float z = (float)(1 << (BITS - 1));
    u32 h[4];
#pragma unroll
    for (int e = 0; e < 8; e += 2) {
        const float lo = s * ((float)((q >> (BITS * e)) & ((1u << BITS) - 1)) - z);
        const float hi = s * ((float)((q >> (BITS * (e + 1))) & ((1u << BITS) - 1)) - z);
        h[e / 2] = (u32)__half_as_ushort(__float2half_rn(lo)) | (u32)__half_as_ushort(__float2half_rn(hi)) << 16;
    }
    W[i] = make_uint4(h[0], h[1], h[2], h[3]);
}
extern "C" __global__ void qk_dequant_u2_f16(const u8* B, const u16* s, uint4* W, long long n) {
    qk_dequant_f16<2>(B, s, W, n);
}
extern "C" __global__ void qk_dequant_u4_f16(const u8* B, const u16* s, uint4* W, long long n) {
    qk_dequant_f16<4>(B, s, W, n);
}
"""

_SPIN = r"""
extern "C" __global__ void qk_spin(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}
"""


@functools.cache
def _module() -> Any:
    return cupy.RawModule(code=_SOURCE, options=("--std=c++14",), name_expressions=None)


@functools.cache
def _spin_kernel() -> Any:
    return cupy.RawKernel(_SPIN, "qk_spin")


def spin(cycles: int = 20_000_000) -> None:
    """Keep the GPU busy (~10 ms) while the host queues the timed launches, so that they run back
    to back and the events time the device, not Python's launch path."""
    _spin_kernel()((1,), (1,), (np.int64(cycles),))


def times(launch: Callable[[int], Any], n_sets: int, reps: int, batches: int = 5) -> list[float]:
    """Seconds per launch of each of ``batches`` batches of ``reps`` back-to-back launches (queued
    behind a spin kernel), the inputs rotating over ``n_sets`` sets."""
    stream = cupy.cuda.get_current_stream()
    for i in range(2 * n_sets):  # warm-up: module load, clocks
        launch(i % n_sets)
    means = []
    for _ in range(batches):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        spin()
        start.record(stream)
        for i in range(reps):
            launch(i % n_sets)
        end.record(stream)
        end.synchronize()
        means.append(cupy.cuda.get_elapsed_time(start, end) / 1e3 / reps)
    return means


def launch_order(variant: str) -> contextlib.AbstractContextManager[None]:
    """The context to time ``variant`` in: every launch in stream order for ``STREAM_ORDER``."""
    from qconform.device.launch import stream_order

    return stream_order() if variant == STREAM_ORDER else contextlib.nullcontext()


def median(ts: list[float]) -> float:
    return statistics.median(ts)


def read_roofline(sets: list[tuple[Any, ...]], reps: int) -> list[float]:
    """The fastest of a few launch shapes of ``qk_read_roofline`` over each set's buffers (up to
    3, each a multiple of 16 bytes; the rest of a buffer's bytes are not read)."""
    kernel = _module().get_function("qk_read_roofline")
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    out = cupy.zeros(1, cupy.uint32)

    def args(bufs: tuple[Any, ...]) -> tuple:
        flat = [b.reshape(-1).view(cupy.uint8) for b in bufs] + [out.view(cupy.uint8)] * (3 - len(bufs))
        pairs = [(f, np.int64(f.nbytes // 16 if f is not out.view(cupy.uint8) else 0)) for f in flat]
        return (*(x for p in pairs for x in p), np.uint32(0x9E3779B9), out)

    bound = [args(s) for s in sets]
    best: list[float] | None = None
    for ctas_per_sm, threads in ((4, 512), (8, 256), (2, 1024), (16, 128)):
        grid = (sms * ctas_per_sm,)
        ts = times(lambda i, g=grid, t=threads: kernel(g, (t,), bound[i]), len(sets), reps)
        if best is None or median(ts) < median(best):
            best = ts
    assert best is not None
    return best


def dequantize_f16(bits: int) -> Callable[[Any, Any, Any], None]:
    """A launcher (B, scales, W fp16 out) of the bench's copy-bandwidth dequantizer (block 64,
    default zero point)."""
    kernel = _module().get_function(f"qk_dequant_u{bits}_f16")

    def run(B: Any, scales: Any, W: Any) -> None:
        n8 = W.size // 8
        kernel((-(-n8 // 256),), (256,), (B, scales, W, np.int64(n8)))

    return run

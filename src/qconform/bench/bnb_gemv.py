"""bitsandbytes' fused 4-bit GEMV / small-M GEMM (``gemm_4bit``, kernels ``bnb/gemm_simt.hip`` in
the CUDA SIMT reading) on the device against its baselines, side by side in one run: for each layer
shape (K x N: an 8B model's MLP up 4096 x 14336 and down 14336 x 4096), NF4 blocksize 64, fp16 and
bf16 activations and M = 1, 2, 4, 8, 16, the kernel's time spread (min / median / max over batches,
weights cold: sets rotating over more than 4x the L2) beside

- the read-only roofline of its bytes (packed weights, absmax, A read once: ``qk_read_roofline``);
- cuBLAS fp16 / bf16 on the dequantized weights (the same shape in A's dtype: CuPy's matmul for
  fp16, torch's matmul or cublasGemmEx for bf16, which CuPy has no dtype for);
- dequantize (our ``nf4_decode`` kernel, to A's dtype) + that cuBLAS call, timed as one;

and at M = 1 whether the output is bit-identical to the oracle's order "simt" on the same input.
Targets (issue text): at M = 1 the kernel at >= 80% of its roofline and faster than cuBLAS by at
least 0.8 x the ratio of the two read-only rooflines (cuBLAS's fp16/bf16 weights against ours);
M = 2..16 within 1.5x of M = 1. One ``BenchRecord`` per (dtype, shape, M).

``--variants`` (``--variants cpu``): instead, the default (cpu) reading's two kernels side by side in
one process, the same cold-weight rotation: session 8's SIMT kernel (the build option
``-DQK_BNB_CPU_SIMT``) and session 10's matrix-unit kernel (``bnb/gemm_mma.hip``), M = 1, 2, 4, 8, 16:
each one's spread, new x old, the roofline share, new x cuBLAS on the dequantized weights with the
allowed ratio (M = 1), each one's time over its own M = 1 (the M target), and the suite's check
(each output within the op's bound of the oracle, default contract) at M = 1 and 16.
``--variants mma``: the same table for the shipped matrix-unit kernel (old) and its build with the
bench-only options of ``--build-options`` (new; default ``-DQK_BNBM_A_AHEAD=2``: the first two of a
step's four activation pieces loaded a step ahead; ``-DQK_BNBM_FILL_FIRST``: session 19's order, the
pair table filled before the ring's first weight loads; ``-DQK_BNBM_RT1``: M <= 8 on 16-row tiles at every N
(the launcher's choice, the kernels unchanged); ``-DQK_BNBM_NO_TABLE_READS``: a diagnostic without
the pair table's shared-memory reads, whose outputs are wrong: its check fails, its time is what the
table's traffic costs; ``-DQK_BNBM_LOADS_ONLY``: a diagnostic with every load and no decode or mma, also
wrong: its time is the loads' own, against the roofline).
``--variants cuda``: session 7's SIMT kernel (``-DQK_BNB_GEMM_V1``) and the current one in the
"simt" reading, each bit-identical to the oracle's "simt" order at M = 1 and the two outputs
byte-identical at every M. ``--quick``: the first shape, fp16, M = 1 and 16.

``python -m qconform.bench.bnb_gemv [--quick] [--variants [cpu|cuda|mma]] [--build-options=OPTIONS] [--json FILE]``
(``--build-options`` takes its value after ``=``: a value starting with ``-D`` would read as an option.)
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import cupy
import numpy as np

from qconform.bench import baselines as bl
from qconform.bench.nbits import n_sets_for
from qconform.bench.records import BenchRecord, bench_parser, finish
from qconform.device.loader import device_info

SHAPES = ((4096, 14336), (14336, 4096))  # (K, N)
DTYPES = ("float16", "bfloat16")
MS = (1, 2, 4, 8, 16)
BLOCKSIZE = 64
TARGET_ROOFLINE = 0.8
TARGET_CUBLAS = 0.8  # of the ratio of the T and the 4-bit rooflines
TARGET_M = 1.5  # M = 2..16 within this factor of M = 1
CARRIER = {"float16": cupy.float16, "bfloat16": cupy.uint16}
MMA_OPTIONS = "-DQK_BNBM_A_AHEAD=2"  # --variants mma: the new build's default --build-options


def _record(
    name: str, mkn: tuple, device: str, sets: list, a: Any, y: Any, times: Any, verdict: str, extra: dict
) -> BenchRecord:
    """One timed gemm_4bit call of shape (M, K, N): the bytes of the packed weights, absmax, A and the
    output; 2 M K N flops."""
    M, K, N = mkn
    nbytes = sets[0][0].nbytes + sets[0][1].nbytes + a.nbytes + y.nbytes
    return BenchRecord(name, mkn, device, nbytes, 2 * M * K * N, tuple(t * 1e6 for t in times), verdict, extra)


def _activations(M: int, K: int, dtype: str) -> Any:
    a = cupy.random.default_rng(7).standard_normal((M, K), dtype=cupy.float32)
    if dtype == "float16":
        return a.astype(cupy.float16)
    u = a.view(cupy.uint32)  # bf16 bits, nearest even (finite values)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(cupy.uint16)


def _weights(K: int, N: int, n_sets: int) -> list[tuple[Any, Any]]:
    """Random NF4 codes and absmax ~ 1/sqrt(K) (the scale of a normal weight's block max)."""
    out = []
    for i in range(n_sets):
        rng = cupy.random.default_rng(100 + i)
        packed = rng.integers(0, 256, N * K // 2, dtype=cupy.uint8)
        absmax = (rng.random(N * K // BLOCKSIZE, dtype=cupy.float32) + 1.5) / np.float32(np.sqrt(K))
        out.append((packed, absmax))
    return out


def _gemm(dtype: str) -> tuple[str, Callable[[Any, Any, Any], None]]:
    """(name, run): y (M, N) = a (M, K) @ w (N, K)^T in A's dtype with fp32 accumulation: CuPy's
    matmul for fp16; for bf16 (uint16 carriers) torch's matmul where torch is installed, else
    cublasGemmEx through CuPy's handle."""
    if dtype == "float16":
        return "cupy.matmul", lambda a, w, y: cupy.matmul(a, w.T, out=y)
    try:
        import torch

        def run_torch(a: Any, w: Any, y: Any) -> None:
            ta, tw, ty = (torch.from_dlpack(x).view(torch.bfloat16) for x in (a, w, y))
            torch.matmul(ta, tw.t(), out=ty)

        return "torch.matmul", run_torch
    except ImportError:
        pass
    from cupy.cuda import cublas

    bf16, compute_32f, default_algo = 14, 68, -1  # CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)

    def run(a: Any, w: Any, y: Any) -> None:
        (M, K), N = a.shape, w.shape[0]
        handle = cupy.cuda.device.get_cublas_handle()
        cublas.setStream(handle, cupy.cuda.get_current_stream().ptr)
        # column-major: y^T (N x M) = w^T (w read as K x N, transposed) @ a^T (K x M)
        cublas.gemmEx(
            handle, cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, N, M, K, one.ctypes.data,
            w.data.ptr, bf16, K, a.data.ptr, bf16, K, zero.ctypes.data, y.data.ptr, bf16, N,
            compute_32f, default_algo,
        )  # fmt: skip

    return "cublasGemmEx", run


def _exact(a: Any, packed: Any, absmax: Any, y: Any, K: int) -> str:
    """Our output against the oracle's order "simt" (bitsandbytes' gemm_4bit_simt) on this input."""
    from qconform.ops.bnb.gemm import gemm_4bit

    want = gemm_4bit(
        cupy.asnumpy(a), cupy.asnumpy(packed), cupy.asnumpy(absmax), K=K, blocksize=BLOCKSIZE, quant_type="nf4",
        variant="cuda",
    )  # fmt: skip
    got = cupy.asnumpy(y)
    if got.tobytes() == want.tobytes():
        return "PASS"
    return f"FAIL: {int(np.sum(got != want))} of {got.size} outputs differ from the simt order"


def bench(shapes=SHAPES, dtypes=DTYPES, ms=MS, reps: int = 50) -> list[BenchRecord]:
    from qconform.device.bnb import gemm_4bit, nf4_decode
    from qconform.device.launchers import bound

    device = device_info().label
    records = []
    print(
        "| A | K x N | M | us min / med / max | roofline us | of roofline | cuBLAS us | x cuBLAS "
        "| allowed x (0.8 x roofline ratio) | dequant + cuBLAS us | x dequant+cuBLAS | x M=1 | bit-exact | verdict |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for K, N in shapes:
        sets = _weights(K, N, n_sets_for(N * K // 2))
        for dtype in dtypes:
            carrier = CARRIER[dtype]
            gemm_name, gemm = _gemm(dtype)
            dense = [cupy.random.default_rng(i).standard_normal((N, K), dtype=cupy.float32).astype(cupy.float16)
                     for i in range(n_sets_for(N * K * 2))]  # fmt: skip
            dense = [w.view(cupy.uint16) if dtype == "bfloat16" else w for w in dense]  # any finite bf16 bits
            wdq = cupy.empty((N, K), carrier)
            base_m1 = None
            for M in ms:
                a = _activations(M, K, dtype)
                y = cupy.empty((M, N), carrier)
                calls = [
                    bound(gemm_4bit, a, p, s, K=K, blocksize=BLOCKSIZE, quant_type="nf4", variant="cuda", out=y)
                    for p, s in sets
                ]
                ts = bl.times(lambda i, c=calls: c[i](), len(calls), reps)
                exact = "n/a (M=1 checked)"
                if M == 1:
                    calls[0]()
                    exact = _exact(a, *sets[0], y, K)
                roof = bl.median(bl.read_roofline([(p, s, a) for p, s in sets], reps))
                roof_t = bl.median(bl.read_roofline([(w, a) for w in dense], reps))
                yd = cupy.empty((M, N), carrier)
                cub = bl.times(lambda i, g=gemm, a=a, yd=yd, w=dense: g(a, w[i], yd), len(dense), reps)
                decode = [
                    bound(nf4_decode, p, s, rows=N, cols=K, blocksize=BLOCKSIZE, dtype=dtype, out=wdq) for p, s in sets
                ]

                def dq_gemm(i: int, d=decode, g=gemm, a=a, yd=yd, w=wdq) -> None:
                    d[i]()
                    g(a, w, yd)

                dqc = bl.times(dq_gemm, len(decode), reps)
                med, cub_med, dq_med = bl.median(ts), bl.median(cub), bl.median(dqc)
                base_m1 = med if M == 1 else base_m1
                rec = _record(
                    f"gemm_4bit simt nf4 bs{BLOCKSIZE} {dtype}",
                    (M, K, N),
                    device,
                    sets,
                    a,
                    y,
                    ts,
                    exact,
                    {
                        "read-only roofline": roof * 1e6,
                        f"{dtype} {gemm_name}": cub_med * 1e6,
                        f"nf4_decode + {gemm_name}": dq_med * 1e6,
                    },
                )
                records.append(rec)
                of_roof, x_cub, allowed = roof / med, cub_med / med, TARGET_CUBLAS * roof_t / roof
                x_m1 = med / base_m1 if base_m1 else float("nan")
                if M == 1:
                    ok = exact == "PASS" and of_roof >= TARGET_ROOFLINE and x_cub >= allowed
                else:
                    ok = x_m1 <= TARGET_M
                lo, hi = min(ts), max(ts)
                print(
                    f"| {dtype} | {K} x {N} | {M} | {lo * 1e6:.1f} / {med * 1e6:.1f} / {hi * 1e6:.1f} "
                    f"| {roof * 1e6:.1f} | {of_roof:.0%} | {cub_med * 1e6:.1f} | {x_cub:.2f}x | {allowed:.2f}x "
                    f"| {dq_med * 1e6:.1f} | {dq_med / med:.2f}x | {x_m1:.2f}x | {exact} "
                    f"| {'PASS' if ok else 'below target'} |",
                    flush=True,
                )
    return records


def bench_variants(shapes=SHAPES, dtypes=DTYPES, ms=MS, reps: int = 50) -> list[BenchRecord]:
    """Session 7's kernel against the current one (module docstring, ``--variants``)."""
    from qconform.device.bnb import gemm_4bit
    from qconform.device.bnb.gemm import V1_OPTION
    from qconform.device.launchers import bound, compile_options

    device = device_info().label
    variants = {"old (v1)": (V1_OPTION,), "new": ()}
    records = []
    print(
        "| A | K x N | M | old us min / med / max | new us min / med / max | new x old | roofline us "
        "| old of roofline | new of roofline | new x M=1 | old bit-exact | new bit-exact | new == old |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for K, N in shapes:
        sets = _weights(K, N, n_sets_for(N * K // 2))
        for dtype in dtypes:
            new_m1 = None
            for M in ms:
                a = _activations(M, K, dtype)
                ys, ts = {}, {}
                for label, options in variants.items():
                    ys[label] = cupy.empty((M, N), CARRIER[dtype])
                    with compile_options(*options):
                        calls = [
                            bound(gemm_4bit, a, p, s, K=K, blocksize=BLOCKSIZE, quant_type="nf4", variant="cuda",
                                  out=ys[label])
                            for p, s in sets
                        ]  # fmt: skip
                    ts[label] = bl.times(lambda i, c=calls: c[i](), len(calls), reps)
                    calls[0]()
                same = "PASS" if cupy.asnumpy(ys["old (v1)"]).tobytes() == cupy.asnumpy(ys["new"]).tobytes() else "FAIL"
                exact = dict.fromkeys(variants, "n/a (M=1 checked)")
                if M == 1:  # the oracle once where the outputs agree (4096 x 14336 takes seconds)
                    exact["new"] = _exact(a, *sets[0], ys["new"], K)
                    exact["old (v1)"] = exact["new"] if same == "PASS" else _exact(a, *sets[0], ys["old (v1)"], K)
                roof = bl.median(bl.read_roofline([(p, s, a) for p, s in sets], reps))
                old, new = bl.median(ts["old (v1)"]), bl.median(ts["new"])
                new_m1 = new if M == 1 else new_m1
                for label in variants:
                    verdict = exact[label] if M == 1 else same
                    records.append(
                        _record(
                            f"gemm_4bit simt nf4 bs{BLOCKSIZE} {dtype} {label}",
                            (M, K, N),
                            device,
                            sets,
                            a,
                            ys[label],
                            ts[label],
                            verdict if same == "PASS" else f"FAIL: the variants' outputs differ; {verdict}",
                            {"read-only roofline": roof * 1e6},
                        )
                    )
                spread = {k: f"{min(v) * 1e6:.1f} / {bl.median(v) * 1e6:.1f} / {max(v) * 1e6:.1f}"
                          for k, v in ts.items()}  # fmt: skip
                print(
                    f"| {dtype} | {K} x {N} | {M} | {spread['old (v1)']} | {spread['new']} | {old / new:.2f}x "
                    f"| {roof * 1e6:.1f} | {roof / old:.0%} | {roof / new:.0%} | {new / new_m1:.2f}x "
                    f"| {exact['old (v1)']} | {exact['new']} | {same} |",
                    flush=True,
                )
    return records


def _within_bound(a: Any, packed: Any, absmax: Any, ys: dict[str, Any], K: int, dtype: str) -> dict[str, str]:
    """The suite's check of each output (the op's bound of the oracle, default contract), the oracle
    computed once for all of them."""
    from qconform.contracts import STRICT
    from qconform.ops import CATALOGUE
    from qconform.properties.compare import compare
    from qconform.properties.expect import expectations

    op = CATALOGUE["gemm_4bit"]
    inputs = {"A": cupy.asnumpy(a), "B": cupy.asnumpy(packed), "absmax": cupy.asnumpy(absmax)}
    params = {"K": K, "blocksize": BLOCKSIZE, "quant_type": "nf4", "dtype": dtype}
    readings = expectations(op, inputs, params, STRICT, None)
    out = {}
    for label, y in ys.items():
        got, details = cupy.asnumpy(y), []
        for e in readings:
            c = compare(op, params, got, e.want, e, STRICT)
            if c.ok:
                break
            details.append(c.detail)
        out[label] = "PASS" if len(details) < len(readings) else "FAIL: " + details[0]
    return out


def bench_cpu_variants(
    shapes=SHAPES, dtypes=DTYPES, ms=MS, reps: int = 50, variants: dict[str, tuple[str, ...]] | None = None
) -> list[BenchRecord]:
    """The cpu reading in two builds, ``variants`` {label: compile options}, the old one first (module
    docstring, ``--variants``; default: the SIMT kernel and the matrix units)."""
    from qconform.device.bnb import gemm_4bit
    from qconform.device.bnb.gemm import CPU_SIMT_OPTION
    from qconform.device.launchers import bound, compile_options

    device = device_info().label
    variants = variants or {"old (simt)": (CPU_SIMT_OPTION,), "new (mma)": ()}
    old_label, new_label = variants
    checked = (1, 16)
    records = []
    print(
        "| A | K x N | M | old us min / med / max | new us min / med / max | new x old | roofline us "
        "| old of roofline | new of roofline | cuBLAS us | new x cuBLAS | allowed x | old x M=1 | new x M=1 "
        "| old check | new check | verdict |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for K, N in shapes:
        sets = _weights(K, N, n_sets_for(N * K // 2))
        for dtype in dtypes:
            gemm_name, gemm = _gemm(dtype)
            dense = [cupy.random.default_rng(i).standard_normal((N, K), dtype=cupy.float32).astype(cupy.float16)
                     for i in range(n_sets_for(N * K * 2))]  # fmt: skip
            dense = [w.view(cupy.uint16) if dtype == "bfloat16" else w for w in dense]
            m1: dict[str, float] = {}
            for M in ms:
                a = _activations(M, K, dtype)
                ys, ts = {}, {}
                for label, options in variants.items():
                    ys[label] = cupy.empty((M, N), CARRIER[dtype])
                    with compile_options(*options):
                        calls = [
                            bound(gemm_4bit, a, p, s, K=K, blocksize=BLOCKSIZE, quant_type="nf4", out=ys[label])
                            for p, s in sets
                        ]
                    ts[label] = bl.times(lambda i, c=calls: c[i](), len(calls), reps)
                    calls[0]()
                check = dict.fromkeys(variants, "n/a (M=1, 16 checked)")
                if M in checked:
                    check = _within_bound(a, *sets[0], ys, K, dtype)
                roof = bl.median(bl.read_roofline([(p, s, a) for p, s in sets], reps))
                roof_t = bl.median(bl.read_roofline([(w, a) for w in dense], reps))
                yd = cupy.empty((M, N), CARRIER[dtype])
                cub = bl.median(bl.times(lambda i, g=gemm, a=a, yd=yd, w=dense: g(a, w[i], yd), len(dense), reps))
                med = {label: bl.median(t) for label, t in ts.items()}
                if M == 1:
                    m1 = dict(med)
                old, new = med[old_label], med[new_label]
                x_m1 = {label: med[label] / m1[label] if m1 else float("nan") for label in variants}
                allowed = TARGET_CUBLAS * roof_t / roof
                if M == 1:
                    ok = roof / new >= TARGET_ROOFLINE and cub / new >= allowed
                else:
                    ok = x_m1[new_label] <= TARGET_M
                ok = ok and all(v in ("PASS", "n/a (M=1, 16 checked)") for v in check.values())
                for label in variants:
                    records.append(
                        _record(
                            f"gemm_4bit cpu nf4 bs{BLOCKSIZE} {dtype} {label}",
                            (M, K, N),
                            device,
                            sets,
                            a,
                            ys[label],
                            ts[label],
                            check[label],
                            {"read-only roofline": roof * 1e6, f"{dtype} {gemm_name}": cub * 1e6},
                        )
                    )
                spread = {k: f"{min(v) * 1e6:.1f} / {bl.median(v) * 1e6:.1f} / {max(v) * 1e6:.1f}"
                          for k, v in ts.items()}  # fmt: skip
                print(
                    f"| {dtype} | {K} x {N} | {M} | {spread[old_label]} | {spread[new_label]} | {old / new:.2f}x "
                    f"| {roof * 1e6:.1f} | {roof / old:.0%} | {roof / new:.0%} | {cub * 1e6:.1f} | {cub / new:.2f}x "
                    f"| {allowed:.2f}x | {x_m1[old_label]:.2f}x | {x_m1[new_label]:.2f}x "
                    f"| {check[old_label]} | {check[new_label]} | {'PASS' if ok else 'below target'} |",
                    flush=True,
                )
    return records


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("bnb_gemv", "the first shape, fp16, M = 1 and 16, fewer repeats")
    parser.add_argument(
        "--variants", nargs="?", const="cpu", choices=("cpu", "cuda", "mma"),
        help="cpu (the default): the cpu reading's SIMT and mma kernels side by side; cuda: session 7's SIMT "
        "kernel and the current one in the simt reading; mma: the shipped mma kernel and its build with "
        "--build-options",
    )  # fmt: skip
    parser.add_argument(
        "--build-options", default=MMA_OPTIONS, metavar="OPTIONS",
        help=f"--variants mma: the new build's bench-only -D options, space-separated, given with '=' "
        f"(--build-options=-DQK_BNBM_A_AHEAD=1; default {MMA_OPTIONS})",
    )  # fmt: skip
    a = parser.parse_args(argv)
    mma = partial(bench_cpu_variants, variants={"shipped (mma)": (), a.build_options: tuple(a.build_options.split())})
    run = {None: bench, "cpu": bench_cpu_variants, "cuda": bench_variants, "mma": mma}[a.variants]
    records = run(SHAPES[:1], DTYPES[:1], (1, 16), 20) if a.quick else run()
    return finish(records, a.json, ("PASS", "n/a (M=1 checked)", "n/a (M=1, 16 checked)"))


if __name__ == "__main__":
    raise SystemExit(main())

"""MatMulNBits on the device against fair baselines, side by side in one run: for each layer
shape, bit width and M, the kernel's time spread (min / median / max over batches) beside the
read-only roofline of its bytes, fp16 cuBLAS on the unquantized weights and a copy-bandwidth
dequantize + cuBLAS (``qconform.bench.baselines``), and the suite's verdict on the same kernel and
shape (every output within its bound of the oracle, strict contract). One ``BenchRecord`` per
(kernel, shape). Decode: fp16 activations, block 64, default zero point, cold weights.

``python -m qconform.bench.nbits [--tune] [--quick] [--variants] [--json FILE]``: ``--tune`` first
times every decode candidate (``registry.MMA_DECODE_CANDIDATES`` x warps per SM) on the first shape;
``--variants`` times fp32 activations (fp32 scales) on the old per-output kernel (build option
``-DQK_NBITS_F32_PER_OUTPUT``) and on the split ring kernel side by side, same cold weights, M = 1, 2,
4, 8, each output checked; then fp16 activations with packed and float zero points on the
matrix-unit kernel (decode_zp shape) in the session-3 arithmetic (build option
``-DQK_NBITS_ZP_SUM_V1``: the zero point through sum(a)) and the session-10 one (its integer part
folded into the weights) side by side; then the fp16 ring decode kernel as shipped beside its
bench-only builds ``-DQK_NBITS_RING_CONTIGUOUS``, ``-DQK_NBITS_RING_STRIDED``, ``-DQK_NBITS_RING_LDS``,
``-DQK_NBITS_RING_TAIL_SPLIT``, ``-DQK_NBITS_STAGE_BATCH=1`` and ``-DQK_NBITS_RING_LOADS_ONLY`` (``ring_variants``).
``--variants f32`` / ``zp`` / ``ring``: one table only. ``--variants fold`` (apart from ``all``): the
prefill GEMM under storage=fp16 as shipped (the last, part-empty wave's tiles split over CTAs by K) beside
the same launch never split and fp16 cuBLAS, M = 512 .. 4096 (``fold_variants``).
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import cupy
import numpy as np

from qconform.bench import baselines as bl
from qconform.bench.records import BenchRecord, write_records
from qconform.device import registry
from qconform.device.loader import device_info
from qconform.device.ort.matmul_nbits import F32_PER_OUTPUT

# (K, N) of the layers: 5120 x 17920 / 17920 x 5120 (a 14B model's MLP up / down), 4096 x 14336 /
# 14336 x 4096 (an 8B model's), the 100352-row lm_head over 5120
SHAPES = ((5120, 17920), (17920, 5120), (4096, 14336), (14336, 4096), (5120, 100352))
BLOCK = 64


def n_sets_for(nbytes: int) -> int:
    return max(2, -(-4 * device_info().l2_bytes // nbytes))


def weight_sets(K: int, N: int, bits: int, n_sets: int, seed: int) -> list[tuple[Any, Any]]:
    """``n_sets`` random (B, fp16 scales) pairs of a K x N, block-64 MatMulNBits weight (the prefill bench's too)."""
    rng = cupy.random.default_rng(seed)
    kb = -(-K // BLOCK)
    return [
        (
            rng.integers(0, 256, (N, kb, BLOCK * bits // 8), dtype=cupy.uint8),
            (rng.random((N, kb), dtype=cupy.float32) * 0.01).astype(cupy.float16),
        )
        for _ in range(n_sets)
    ]


def _verdict(a: Any, b: Any, s: Any, y: Any, K: int, bits: int, zp: Any = None) -> str:
    """The suite's check of this output: within its bound of the oracle under some reading."""
    from qconform.contracts import STRICT
    from qconform.ops import CATALOGUE
    from qconform.properties.compare import compare
    from qconform.properties.expect import expectations

    op = CATALOGUE["matmul_nbits"]
    inputs = {"A": cupy.asnumpy(a), "B": cupy.asnumpy(b), "scales": cupy.asnumpy(s)}
    if zp is not None:
        inputs["zero_points"] = cupy.asnumpy(zp)
    params = {"K": K, "bits": bits, "block_size": BLOCK}
    got = cupy.asnumpy(y)
    details = []
    for e in expectations(op, inputs, params, STRICT, None):
        c = compare(op, params, got, e.want, e, STRICT)
        if c.ok:
            return "PASS"
        details.append(c.detail)
    return "FAIL: " + details[0]


def _fastest_matmul(a: Any, ws: list[Any], y: Any, reps: int) -> tuple[str, list[float]]:
    """fp16 a @ w.T over the (N, K) fp16 weights ``ws``, rotating over them: CuPy's matmul and
    torch's (where installed), the faster."""
    best = ("cupy.matmul", bl.times(lambda i: cupy.matmul(a, ws[i].T, out=y), len(ws), reps))
    try:
        import torch
    except ImportError:
        return best
    ta, ty, tw = torch.from_dlpack(a), torch.from_dlpack(y), [torch.from_dlpack(w) for w in ws]
    mine = bl.times(lambda i: torch.matmul(ta, tw[i].t(), out=ty), len(ws), reps)
    return ("torch.matmul", mine) if bl.median(mine) < bl.median(best[1]) else best


def cublas_fp16(K: int, N: int, M: int, reps: int) -> tuple[str, list[float]]:
    """fp16 cuBLAS on unquantized (N, K) weights, cold (``_fastest_matmul`` over enough random sets)."""
    sets = [
        cupy.random.default_rng(i).standard_normal((N, K), dtype=cupy.float32).astype(cupy.float16)
        for i in range(n_sets_for(N * K * 2))
    ]
    a = cupy.random.default_rng(9).standard_normal((M, K), dtype=cupy.float32).astype(cupy.float16)
    return _fastest_matmul(a, sets, cupy.empty((M, N), cupy.float16), reps)


def _time_kernel(
    a: Any,
    weights: list[tuple[Any, Any]],
    K: int,
    N: int,
    bits: int,
    reps: int,
    options: tuple[str, ...] = (),
    zero_points: list[Any] | None = None,
) -> tuple[list, Any]:
    from qconform.device import ort as ort_launch

    y = cupy.empty((a.shape[0], N), a.dtype)
    zps = zero_points or [None] * len(weights)
    with ort_launch.compile_options(*options):  # the launches are recorded (and built) with these options
        calls = [
            ort_launch.bound(
                ort_launch.matmul_nbits, a, b, s.astype(a.dtype), z, K=K, N=N, bits=bits, block_size=BLOCK, out=y
            )
            for (b, s), z in zip(weights, zps, strict=True)
        ]
    ts = bl.times(lambda i: calls[i](), len(calls), reps)
    calls[0]()
    return ts, y


def _us(ts: list[float]) -> str:
    return f"{min(ts) * 1e6:.1f} / {bl.median(ts) * 1e6:.1f} / {max(ts) * 1e6:.1f}"


def tune(K: int, N: int, reps: int) -> None:
    """Every decode candidate on one shape, u2 and u4, M = 1: time spread and relL2 against a
    float64 reference of the same weights (a tuning guard, not the suite's check)."""
    from qconform.device import ort as ort_launch

    default = dict(registry.MMA_SHAPES)
    launcher = importlib.import_module("qconform.device.ort.matmul_nbits")  # the module, not its function
    a = cupy.random.default_rng(0).standard_normal((1, K), dtype=cupy.float32).astype(cupy.float16)
    print(f"decode candidates, fp16 M=1 {K}x{N} block {BLOCK}: us min / median / max, relL2 vs float64")
    for bits in (2, 4):
        weights = weight_sets(K, N, bits, n_sets_for(N * K * bits // 8), bits)
        b, s = weights[0]
        w32 = ort_launch.dequantize_nbits(b, s.astype(cupy.float32), K=K, N=N, bits=bits, block_size=BLOCK)
        ref = w32.astype(cupy.float64) @ a[0].astype(cupy.float64)
        staged = launcher.RING_ACT_LIMIT
        for shape, limit in [(c, staged) for c in registry.MMA_DECODE_CANDIDATES] + [
            (c, 0) for c in registry.MMA_DECODE_CANDIDATES if c.ring
        ]:
            launcher.RING_ACT_LIMIT = limit
            for wps in (8, 16, 32):
                slot = "decode" if shape.ring else "decode_zp"
                registry.MMA_SHAPES[slot] = replace(shape, warps_per_sm=wps)
                if shape.ring:  # the candidate also where a tail wave would take decode_wave
                    registry.MMA_SHAPES["decode_wave"] = registry.MMA_SHAPES["decode"]
                else:
                    registry.MMA_SHAPES["decode"] = replace(default["decode"], ring=False)
                try:
                    ts, y = _time_kernel(a, weights, K, N, bits, reps)
                finally:
                    registry.MMA_SHAPES.update(default)
                err = float(cupy.linalg.norm(y[0].astype(cupy.float64) - ref) / cupy.linalg.norm(ref))
                what = f"ring r={shape.r} stages={shape.p}" if shape.ring else f"r={shape.r} p={shape.p}"
                what += f" o={shape.o}"
                what += "" if limit else ", activations from global memory"
                print(f"  u{bits} {what} warps/SM={wps}: {_us(ts)}  relL2 {err:.1e}")
        launcher.RING_ACT_LIMIT = staged
        for M in (2, 4, 8):
            am = cupy.random.default_rng(M).standard_normal((M, K), dtype=cupy.float32).astype(cupy.float16)
            for limit in (staged, 0):
                launcher.RING_ACT_LIMIT = limit
                ts, _ = _time_kernel(am, weights, K, N, bits, reps)
                where = "staged" if limit else "from global memory"
                print(f"  u{bits} default shape, M={M}, activations {where}: {_us(ts)}")
            launcher.RING_ACT_LIMIT = staged


def _table_head(caption: str, columns: tuple[str, ...]) -> str:
    """Print a table's caption (after the device's name) and header; return the device's name."""
    info = device_info()
    device = f"{info.name} {info.label}"
    print(f"{device}; {caption}")
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    return device


def bench(shapes=SHAPES, bits_list=(2, 4), ms=(1,), reps: int = 50, verdicts: bool = True) -> list[BenchRecord]:
    """The decode table (and records) over ``shapes`` x ``bits_list`` x ``ms``."""
    device = _table_head(
        f"times in us as min / median / max of 5 batches of {reps} back-to-back cold launches",
        ("K x N", "M", "bits", "kernel us", "read-only roofline us", "of roofline", "fp16 cuBLAS us", "speed-up")
        + ("dequant + cuBLAS us", "speed-up", "verdict"),
    )
    records: list[BenchRecord] = []
    for K, N in shapes:
        cublas = {M: cublas_fp16(K, N, M, reps) for M in ms}
        for bits in bits_list:
            weights = weight_sets(K, N, bits, n_sets_for(N * K * bits // 8), bits)
            deq = bl.dequantize_f16(bits)
            w16 = cupy.empty((N, K), cupy.float16)
            for M in ms:
                a = cupy.random.default_rng(M).standard_normal((M, K), dtype=cupy.float32).astype(cupy.float16)
                ts, y = _time_kernel(a, weights, K, N, bits, reps)
                roof = bl.read_roofline([(b, s, a) for b, s in weights], reps)
                y16 = cupy.empty((M, N), cupy.float16)

                def deq_cublas(i: int, a=a, y16=y16, deq=deq, weights=weights, w16=w16) -> None:
                    deq(*weights[i], w16)
                    cupy.matmul(a, w16.T, out=y16)

                tdq = bl.times(deq_cublas, len(weights), max(3, reps // 10))
                b, s = weights[0]
                verdict = _verdict(a, b, s, y, K, bits) if verdicts else "not checked"
                name, tcb = cublas[M]
                baselines = {
                    "read-only roofline": bl.median(roof) * 1e6,
                    f"fp16 cuBLAS unquantized ({name})": bl.median(tcb) * 1e6,
                    "copy-bandwidth dequant + cuBLAS": bl.median(tdq) * 1e6,
                }
                nbytes = b.nbytes + s.nbytes + a.nbytes + y.nbytes
                rec = BenchRecord(
                    f"matmul_nbits u{bits} fp16",
                    (M, K, N, BLOCK),
                    device,
                    nbytes,
                    2 * M * K * N,
                    tuple(t * 1e6 for t in ts),
                    verdict.split(":")[0],
                    baselines,
                )
                records.append(rec)
                roofline, cublas_x, dequant_x = rec.ratios().values()  # baseline / kernel, in the order above
                cells = (
                    f"{K} x {N}",
                    str(M),
                    str(bits),
                    _us(ts),
                    _us(roof),
                    f"{roofline:.0%}",
                    _us(tcb),
                    f"{cublas_x:.2f}x",
                    _us(tdq),
                    f"{dequant_x:.2f}x",
                    verdict[:120],
                )
                print("| " + " | ".join(cells) + " |", flush=True)
    return records


def _builds_head(caption: str, columns: tuple[str, ...], builds: tuple[tuple[str, tuple[str, ...]], ...]) -> None:
    """Print a side-by-side table's caption (after the device's name) and header: ``columns``, then a
    time and a share of the roofline per build."""
    info = device_info()
    print(f"{info.name} {info.label}; {caption}; us min / median / max")
    heads = " | ".join(f"{n} us | of roofline" for n, _ in builds)
    print(f"| {' | '.join(columns)} | {heads} |")
    print("|" + "---|" * len(columns) + "---|---|" * len(builds))


F32_SHAPES = SHAPES[:4]
ROOF_COLUMNS = ("K x N", "M", "bits", "read-only roofline us")


F32_BUILDS = (  # (name, build options) of the fp32-A kernels timed side by side
    ("per-output (old)", (F32_PER_OUTPUT,)),
    (bl.STREAM_ORDER, ()),
    ("split ring (shipped)", ()),
)


def variants(
    shapes=F32_SHAPES, bits_list=(2, 4), ms=(1, 2, 4, 8), reps: int = 50, verdicts: bool = True, only=()
) -> bool:
    """fp32 activations and scales: the per-output kernel (old), the split ring kernel with its two
    launches in stream order (``stream_order``) and as shipped (the ring kernel a programmatic
    dependent of the split: qconform.device.pdl), side by side on the same cold weights, against the
    read-only roofline of the fp32 bytes. ``only``: these builds' names (default every one)."""

    builds = [(n, o) for n, o in F32_BUILDS if n in only] if only else F32_BUILDS
    _builds_head(f"fp32 A and scales, block {BLOCK}, default zero point", ROOF_COLUMNS, builds)
    ok = True
    for K, N in shapes:
        for bits in bits_list:
            weights = [(b, s.astype(cupy.float32)) for b, s in weights_for(K, N, bits)]
            for M in ms:
                a = cupy.random.default_rng(M).standard_normal((M, K), dtype=cupy.float32)
                roof = bl.read_roofline([(b, s, a) for b, s in weights], reps)
                cells = [f"{K} x {N}", str(M), str(bits), _us(roof)]
                for name, options in builds:
                    with bl.launch_order(name):
                        ts, y = _time_kernel(a, weights, K, N, bits, reps, options)
                    verdict = _verdict(a, *weights[0], y, K, bits) if verdicts else "not checked"
                    ok = ok and (verdict == "PASS" or not verdicts)
                    cells += [_us(ts), f"{bl.median(roof) / bl.median(ts):.0%} {verdict[:100]}"]
                print("| " + " | ".join(cells) + " |", flush=True)
    return ok


ZP_SUM_V1 = "-DQK_NBITS_ZP_SUM_V1"  # build option: the session-3 zero-point arithmetic (through sum(a))


def zero_point_sets(K: int, N: int, bits: int, kind: str, n: int) -> list[Any]:
    """``n`` zero-point arrays of ``kind``: packed uint8 fields, or fp16 floats in [0, 2^bits - 1]."""
    kb = -(-K // BLOCK)
    rng = cupy.random.default_rng(77)
    if kind == "packed":
        return [rng.integers(0, 256, (N, -(-kb * bits // 8)), dtype=cupy.uint8) for _ in range(n)]
    return [(rng.random((N, kb), dtype=cupy.float32) * (2**bits - 1)).astype(cupy.float16) for _ in range(n)]


def zp_variants(
    shapes=SHAPES[:1], bits_list=(2, 4), ms=(1, 8), kinds=("packed", "float"), reps: int = 50, verdicts: bool = True
) -> bool:
    """fp16 activations and scales with zero points on the matrix-unit kernel (decode_zp shape for
    M <= 8): the session-3 arithmetic (old) and the folded one (new) side by side on the same cold
    weights, against the read-only roofline of the weights, scales and activations."""
    builds = (("sum(a) form (old)", (ZP_SUM_V1,)), ("folded zi (new)", ()))
    columns = ("K x N", "M", "bits", "zero points", "read-only roofline us")
    _builds_head(f"fp16 A and scales with zero points, block {BLOCK}", columns, builds)
    ok = True
    for K, N in shapes:
        for bits in bits_list:
            weights = weights_for(K, N, bits)
            for kind in kinds:
                zps = zero_point_sets(K, N, bits, kind, len(weights))
                for M in ms:
                    a = cupy.random.default_rng(M).standard_normal((M, K), dtype=cupy.float32).astype(cupy.float16)
                    roof = bl.read_roofline([(b, s, a) for b, s in weights], reps)
                    cells = [f"{K} x {N}", str(M), str(bits), kind, _us(roof)]
                    for _, options in builds:
                        ts, y = _time_kernel(a, weights, K, N, bits, reps, options, zps)
                        verdict = _verdict(a, *weights[0], y, K, bits, zps[0]) if verdicts else "not checked"
                        ok = ok and (verdict == "PASS" or not verdicts)
                        cells += [_us(ts), f"{bl.median(roof) / bl.median(ts):.0%} {verdict[:100]}"]
                    print("| " + " | ".join(cells) + " |", flush=True)
    return ok


RING_STRIDED = "-DQK_NBITS_RING_STRIDED"  # build option: each warp's superchunks strided, both widths
RING_CONTIGUOUS = "-DQK_NBITS_RING_CONTIGUOUS"  # build option: each warp's a contiguous range, both widths
RING_LDS = "-DQK_NBITS_RING_LDS"  # build option: the ring's transposed words by 16 shared reads, not 4 ldmatrix.x4
RING_TAIL_SPLIT = "-DQK_NBITS_RING_TAIL_SPLIT"  # build option: unchecked scale copies without the tail test
RING_LOADS_ONLY = "-DQK_NBITS_RING_LOADS_ONLY"  # build option: the ring's copies and waits only (diagnostic)
RING_UNIT_STAGE = "-DQK_NBITS_STAGE_BATCH=1"  # build option: u4 stages its activations a unit at a time (as before)


def ring_variants(shapes=SHAPES, bits_list=(2, 4), ms=(1, 8), reps: int = 50, verdicts: bool = True, only=()) -> bool:
    """The fp16 ring decode kernel as shipped (u2: each warp a contiguous range of superchunks; u4:
    the warps' superchunks strided), with the other order (``RING_CONTIGUOUS`` for u4,
    ``RING_STRIDED`` for u2; each is the shipped build at the other width, not timed twice), with the
    ring's transposed weight words read by four shared reads a 16-row half instead of one ldmatrix.x4
    (``RING_LDS``, the shipped order; the build before session 34), with the unchecked superchunks'
    scale copies free of the tensor-end test in every CTA but the last (``RING_TAIL_SPLIT``), with u4's
    staged activations loaded and stored a unit at a time (``RING_UNIT_STAGE``; u2's always are), and with
    its copies alone (``RING_LOADS_ONLY``, no verdict: its outputs are zeros), side by side on the same
    cold weights and in the shipped build's launch plan, against the read-only roofline of the
    weights, scales and activations. ``only``: these builds' names beside the shipped one (default every one)."""
    from qconform.device import ort as ort_launch

    launcher = importlib.import_module("qconform.device.ort.matmul_nbits")  # the module, not its function
    builds = (
        ("shipped", ()),
        ("contiguous", (RING_CONTIGUOUS,)),
        ("strided", (RING_STRIDED,)),
        ("four reads", (RING_LDS,)),
        ("no tail test", (RING_TAIL_SPLIT,)),
        ("unit staging", (RING_UNIT_STAGE,)),
        ("loads only", (RING_LOADS_ONLY,)),
    )
    builds = tuple(b for b in builds if not only or b[0] in ("shipped", *only))
    _builds_head(f"fp16 A and scales, block {BLOCK}, default zero point", ROOF_COLUMNS, builds)
    ok = True
    for K, N in shapes:
        for bits in bits_list:
            weights = weights_for(K, N, bits)
            for M in ms:
                a = cupy.random.default_rng(M).standard_normal((M, K), dtype=cupy.float32).astype(cupy.float16)
                roof = bl.read_roofline([(b, s, a) for b, s in weights], reps)
                y = cupy.empty((M, N), cupy.float16)
                plans: list[Any] = []

                def shipped_plan(*args: Any, _plan=launcher._ring_plan, _plans=plans, **kw: Any) -> Any:
                    _plans.append(_plan(*args, **kw))
                    return _plans[-1]

                cells = [f"{K} x {N}", str(M), str(bits), _us(roof)]
                for _, options in builds:
                    shipped_order = (RING_CONTIGUOUS,) if bits == 2 else (RING_STRIDED,)
                    if options == shipped_order or (bits == 2 and options == (RING_UNIT_STAGE,)):  # the shipped build
                        cells += ["the shipped build", "-"]
                        continue
                    plan = shipped_plan if not plans else (lambda *args, _p=plans[0], **kw: _p)
                    with ort_launch.compile_options(*options):
                        calls = _bind(a, weights, K, N, bits, y, _ring_plan=plan)
                    ts = bl.times(lambda i, c=calls: c[i](), len(calls), reps)
                    calls[0]()
                    verdict = "not checked"
                    if verdicts and options != (RING_LOADS_ONLY,):
                        verdict = _check_text(a, *weights[0], y, K, N, bits)
                        ok = ok and verdict.startswith("within")
                    cells += [_us(ts), f"{bl.median(roof) / bl.median(ts):.0%} {verdict[:80]}"]
                print("| " + " | ".join(cells) + " |", flush=True)
    return ok


PREFILL_SHAPES = ((5120, 17920), (4096, 14336))
PREFILL_MS = (512, 1024, 2048, 4096)


def _bind(
    a: Any, weights: list[tuple[Any, Any]], K: int, N: int, bits: int, y: Any, storage: str = "exact", **patch: Any
) -> list[Any]:
    """Bound matmul_nbits calls over ``weights`` writing ``y`` under the contract's ``storage``, with
    the launcher module's names in ``patch`` replaced while they bind (``GEMM_MIN_M``, ``gemm_shape``:
    which kernel and tiles)."""
    from qconform.device import ort as ort_launch

    launcher = importlib.import_module("qconform.device.ort.matmul_nbits")  # the module, not its function
    saved = {name: getattr(launcher, name) for name in patch}
    try:
        for name, value in patch.items():
            setattr(launcher, name, value)
        kw = {"K": K, "N": N, "bits": bits, "block_size": BLOCK, "out": y, "storage": storage}
        return [ort_launch.bound(ort_launch.matmul_nbits, a, b, s, **kw) for b, s in weights]
    finally:
        for name, value in saved.items():
            setattr(launcher, name, value)


def _bound_check(a: Any, b: Any, s: Any, y: Any, K: int, N: int, bits: int, contract: str = "strict") -> int:
    """Outputs of Y (fp16, default zero point, block 64, no bias) outside MatMulNBits's bound under
    ``contract`` (``qconform.properties.bounds``), with the float64 reference and magnitudes computed
    on the GPU (exact dequantization, float64 matmuls)."""
    from qconform.contracts import parse_contract
    from qconform.properties.bounds import budget
    from qconform.readings import ErrorModel

    shifts = cupy.arange(0, 8, bits, dtype=cupy.uint8)
    q = ((b.reshape(N, -1)[:, :, None] >> shifts) & ((1 << bits) - 1)).reshape(N, -1)[:, :K]
    s64 = cupy.repeat(s.astype(cupy.float64).reshape(N, -1), BLOCK, 1)[:, :K]
    w = (q.astype(cupy.float64) - 2 ** (bits - 1)) * s64
    a64 = cupy.abs(a.astype(cupy.float64))
    store = a64 @ (2 ** (bits - 1) * cupy.abs(s64) + 2 * cupy.abs(w)).T
    model = ErrorModel(a.astype(cupy.float64) @ w.T, a64 @ cupy.abs(w).T, store, K, BLOCK, np.dtype(np.float16), "fp16")
    bound = budget(model, parse_contract(contract), True).bound(model)
    return int(cupy.count_nonzero(~(cupy.abs(y.astype(cupy.float64) - model.ref) <= bound)))


def _check_text(a: Any, b: Any, s: Any, y: Any, K: int, N: int, bits: int, contract: str = "strict") -> str:
    bad = _bound_check(a, b, s, y, K, N, bits, contract)
    return f"within the {contract} bound" if bad == 0 else f"FAIL: {bad} outputs outside the {contract} bound"


def _prefill_weights(K: int, N: int, bits: int) -> tuple[list[tuple[Any, Any]], Any, list[Any]]:
    """The prefill benches' 2 weight sets, the copy-bandwidth dequantize and each set dequantized to fp16 by it."""
    weights = weight_sets(K, N, bits, 2, bits)
    deq = bl.dequantize_f16(bits)
    w16 = [cupy.empty((N, K), cupy.float16) for _ in weights]
    for (bw, sw), w in zip(weights, w16, strict=True):
        deq(bw, sw, w)
    return weights, deq, w16


def prefill(
    shapes=PREFILL_SHAPES, bits_list=(2, 4), ms=PREFILL_MS, reps: int = 10, candidates: bool = False
) -> list[BenchRecord]:
    """The prefill table: the launcher's GEMM (``qk_nbits_wgmma`` where the device has wgmma, else
    ``qk_nbits_gemm``) against ``qk_nbits_gemm`` (the previous kernel where wgmma runs), fp16 cuBLAS on
    the weights dequantized once (outside the timing) and the copy-bandwidth dequant + cuBLAS; then the
    launcher under the contract storage=fp16 (``qk_nbits_wgmma_fold`` where wgmma runs).
    Check: Y bit-identical to ``qk_nbits_gemm``'s (checked against the oracle by the device tests),
    else within the strict bound (``_bound_check``); storage=fp16: within that contract's bound.
    ``candidates``: the other tiles of ``registry.GEMM_SHAPES`` and ``GEMM_CANDIDATES`` too
    (``qk_nbits_gemm``'s, timed apart)."""
    device = _table_head(
        f"prefill, block {BLOCK}; us as min / median / max of 5 batches of {reps} launches (2 weight sets)",
        ("K x N", "M", "bits", "kernel us", "TFLOP/s", "qk_nbits_gemm us", "fp16 cuBLAS us", "of cuBLAS")
        + ("dequant + cuBLAS us", "speed-up", "check", "storage=fp16 us", "of cuBLAS", "speed-up", "check"),
    )
    records: list[BenchRecord] = []
    for K, N in shapes:
        for bits in bits_list:
            weights, deq, w16 = _prefill_weights(K, N, bits)
            b, s = weights[0]  # what calls[0] reads: the checks' weights
            for M in ms:
                a = cupy.random.default_rng(M).standard_normal((M, K), dtype=cupy.float32).astype(cupy.float16)
                y, y_old, y16 = (cupy.empty((M, N), cupy.float16) for _ in range(3))
                default = registry.gemm_shape(M)
                others = (*registry.GEMM_SHAPES.values(), *registry.GEMM_CANDIDATES) if candidates else ()
                shapes_timed = [None, *(shape for shape in others if shape != default)]
                old = _bind(a, weights, K, N, bits, y_old, WGMMA_MIN_M=1 << 62)
                t_old = bl.times(lambda i, c=old: c[i](), len(old), reps)
                old[0]()
                timed, differ = {}, {}
                for shape in shapes_timed:
                    tiles = {} if shape is None else {"gemm_shape": lambda _, sh=shape: sh, "WGMMA_MIN_M": 1 << 62}
                    calls = _bind(a, weights, K, N, bits, y, **tiles)
                    timed[shape] = bl.times(lambda i, c=calls: c[i](), len(calls), reps)
                    calls[0]()
                    same = bool(cupy.array_equal(y.view(cupy.uint16), y_old.view(cupy.uint16)))
                    differ[shape] = "bit-identical to qk_nbits_gemm" if same else _check_text(a, b, s, y, K, N, bits)
                name, t_cub = _fastest_matmul(a, w16, y16, reps)
                folded = _bind(a, weights, K, N, bits, y_old, storage="fp16")
                t_fold = bl.times(lambda i, c=folded: c[i](), len(folded), reps)
                folded[0]()
                fold_check = _check_text(a, b, s, y_old, K, N, bits, "storage=fp16")

                def deq_cublas(i: int, a=a, y16=y16, deq=deq, weights=weights, w16=w16) -> None:
                    deq(*weights[i], w16[i])
                    cupy.matmul(a, w16[i].T, out=y16)

                t_dq = bl.times(deq_cublas, len(weights), reps)
                check, ts = differ[None], timed[None]
                flops = 2 * M * K * N
                baselines = {
                    f"fp16 cuBLAS, weights dequantized once ({name})": bl.median(t_cub) * 1e6,
                    "copy-bandwidth dequant + cuBLAS": bl.median(t_dq) * 1e6,
                }
                for label, t, verdict in (("", ts, check), (" storage=fp16", t_fold, fold_check)):
                    rec = BenchRecord(
                        f"matmul_nbits prefill u{bits} fp16{label}",
                        (M, K, N, BLOCK),
                        device,
                        b.nbytes + s.nbytes + a.nbytes + y.nbytes,
                        flops,
                        tuple(x * 1e6 for x in t),
                        "PASS" if verdict.startswith(("bit-identical", "within")) else "FAIL",
                        {**baselines, "qk_nbits_gemm (the previous kernel where wgmma runs)": bl.median(t_old) * 1e6},
                    )
                    records.append(rec)
                med = bl.median(ts)
                cells = (
                    f"{K} x {N}",
                    str(M),
                    str(bits),
                    _us(ts),
                    f"{flops / med / 1e12:.0f}",
                    _us(t_old),
                    _us(t_cub),
                    f"{bl.median(t_cub) / med:.2f}x",
                    _us(t_dq),
                    f"{bl.median(t_dq) / med:.2f}x",
                    check,
                    _us(t_fold),
                    f"{bl.median(t_cub) / bl.median(t_fold):.2f}x",
                    f"{bl.median(t_dq) / bl.median(t_fold):.2f}x",
                    fold_check,
                )
                print("| " + " | ".join(cells) + " |", flush=True)
                for shape in shapes_timed[1:]:
                    t, tflops = timed[shape], flops / bl.median(timed[shape]) / 1e12
                    print(f"|  tiles {shape.symbol(bits)} | {M} | {bits} | {_us(t)} | {tflops:.0f} | {differ[shape]} |")
    return records


def _never_split(M: int, N: int, K: int, sms: int) -> tuple[int, int, int]:
    """``registry.fold_launch_split`` that splits nothing: every tile on one CTA (the unsplit fold kernel)."""
    tiles = registry.wgmma_tiles(M, N, fold=True)
    return tiles, tiles, 1


FOLD_LAUNCHES = (  # (name, the launcher's names patched, build options) of the fold launches timed side by side
    ("shipped", {}, ()),
    ("never split", {"fold_launch_split": _never_split}, ()),
)


def fold_variants(shapes=PREFILL_SHAPES, bits_list=(2, 4), ms=PREFILL_MS, reps: int = 10, only=()) -> bool:
    """The prefill GEMM under storage=fp16 (``qk_nbits_wgmma_fold``) in each launch of ``FOLD_LAUNCHES``
    beside fp16 cuBLAS on the weights dequantized once (2 weight sets), with the launch's waves (one fold
    CTA an SM: the time goes by whole waves, docs/perf-notes.md session 53) and the tail split's split
    tiles x parts. Check: each launch's output within the storage=fp16 bound, and bit-identical to the
    first launch's where nothing is split (a split tile sums its parts in part order, so its bits may
    differ there) and where only the build differs (the same fragments, so the same sums). ``only``: these
    launches' names."""
    from qconform.device import ort as ort_launch

    launches = [x for x in FOLD_LAUNCHES if x[0] in only] if only else FOLD_LAUNCHES
    info = device_info()
    print(f"{info.name} {info.label}; prefill under storage=fp16, block {BLOCK}; us min / median / max")
    heads = " | ".join(f"{n} us | of cuBLAS | check" for n, _, _ in launches)
    print(f"| K x N | M | bits | waves (CTAs / SMs) | split tiles x parts | fp16 cuBLAS us | {heads} |")
    print("|---|---|---|---|---|---|" + "---|---|---|" * len(launches))
    ok = True
    for K, N in shapes:
        for bits in bits_list:
            weights, _, w16 = _prefill_weights(K, N, bits)
            b, s = weights[0]
            for M in ms:
                a = cupy.random.default_rng(M).standard_normal((M, K), dtype=cupy.float32).astype(cupy.float16)
                _, t_cub = _fastest_matmul(a, w16, cupy.empty((M, N), cupy.float16), reps)
                tiles, full, parts = registry.fold_launch_split(M, N, K, info.sm_count)
                waves = f"{-(-tiles // info.sm_count)} ({tiles / info.sm_count:.2f})"
                split = f"{tiles - full} x {parts}" if parts > 1 else "none"
                cells, first, first_patch = [f"{K} x {N}", str(M), str(bits), waves, split, _us(t_cub)], None, None
                for _, patch, options in launches:
                    y = cupy.empty((M, N), cupy.float16)
                    with ort_launch.compile_options(*options):
                        calls = _bind(a, weights, K, N, bits, y, storage="fp16", **patch)
                    ts = bl.times(lambda i, c=calls: c[i](), len(calls), reps)
                    calls[0]()
                    check = _check_text(a, b, s, y, K, N, bits, "storage=fp16")
                    ok = ok and check.startswith("within")
                    if first is None:
                        first, first_patch = y, patch
                    elif bool(cupy.array_equal(y.view(cupy.uint16), first.view(cupy.uint16))):
                        check += ", bit-identical to the first"
                    elif parts == 1 or patch == first_patch:  # the same launch: only the build differs
                        check += ", DIFFERS from the first launch"
                        ok = False
                    cells += [_us(ts), f"{bl.median(t_cub) / bl.median(ts):.2f}x", check]
                print("| " + " | ".join(cells) + " |", flush=True)
    return ok


def weights_for(K: int, N: int, bits: int) -> list[tuple[Any, Any]]:
    return weight_sets(K, N, bits, n_sets_for(N * K * bits // 8), bits)


def run_all(quick: bool = False, verdicts: bool = True) -> list[BenchRecord]:
    """Every layer shape at M = 1, then M = 2, 4, 8 on the first (``quick``: the first at M = 1)."""
    records = bench(SHAPES[:1] if quick else SHAPES, ms=(1,), verdicts=verdicts)
    if not quick:
        records += bench(SHAPES[:1], ms=(2, 4, 8), verdicts=verdicts)
    return records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m qconform.bench.nbits")
    p.add_argument("--tune", action="store_true", help="time every decode candidate on the first shape first")
    p.add_argument("--quick", action="store_true", help="the first shape only, M = 1")
    p.add_argument("--no-verdict", action="store_true", help="skip the oracle check of each shape")
    p.add_argument(
        "--variants",
        nargs="?",
        const="all",
        choices=("all", "f32", "zp", "ring", "fold"),
        help="old and new kernels side by side, only: fp32 A (f32), fp16 A with zero points (zp), the ring"
        " decode's build options (ring), or all three; the prefill GEMM under storage=fp16 (fold, apart)",
    )
    p.add_argument("--builds", default="", help="with --variants: these builds' names only (comma-separated)")
    p.add_argument("--prefill", action="store_true", help="the prefill GEMM's table only (M = 512 .. 4096)")
    p.add_argument("--candidates", action="store_true", help="with --prefill: every GEMM tile shape too")
    p.add_argument("--json", help="write the records here")
    args = p.parse_args(argv)
    np.seterr(all="ignore")
    if args.prefill:
        records = prefill(PREFILL_SHAPES[:1] if args.quick else PREFILL_SHAPES, candidates=args.candidates)
        if args.json:
            write_records(Path(args.json), records)
        return 0 if all(r.verdict == "PASS" for r in records) else 1
    if args.variants == "fold":
        only = tuple(b for b in args.builds.split(",") if b)
        ms = (2048,) if args.quick else PREFILL_MS
        return 0 if fold_variants(PREFILL_SHAPES[:1] if args.quick else PREFILL_SHAPES, ms=ms, only=only) else 1
    if args.variants:
        ok, only = True, tuple(b for b in args.builds.split(",") if b)
        if args.variants in ("all", "f32"):
            shapes = F32_SHAPES[:1] if args.quick else F32_SHAPES
            ok = variants(shapes, ms=(1,) if args.quick else (1, 2, 4, 8), verdicts=not args.no_verdict, only=only)
        if args.variants in ("all", "zp"):
            shapes = SHAPES[:1] if args.quick else F32_SHAPES
            ok = zp_variants(shapes, ms=(1,) if args.quick else (1, 8), verdicts=not args.no_verdict) and ok
        if args.variants in ("all", "ring"):
            shapes = SHAPES[:1] if args.quick else SHAPES
            ms = (1,) if args.quick else (1, 8)
            ok = ring_variants(shapes, ms=ms, verdicts=not args.no_verdict, only=only) and ok
        return 0 if ok else 1
    if args.tune:
        tune(*SHAPES[0], reps=50)
    records = run_all(quick=args.quick, verdicts=not args.no_verdict)
    if args.json:
        write_records(Path(args.json), records)
    return 0 if args.no_verdict or all(r.verdict == "PASS" for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())

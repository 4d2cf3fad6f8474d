"""ggml's keep-quant GEMV (``matmul_bt_quant``) on the device against its baselines, side by side in
one run: for each weight type and layer shape at M = 1, both kernels (``exact``: the generic vec_dot
order, ``keep_quant.hip``; ``fast``: the contract order=any, ``keep_quant_fast.hip``, Q4_K / Q5_K /
Q6_K / Q8_0; for the types whose kernel round 2 changed, Q4_K and Q5_K: ``fast-v1``, round 1 of it,
the build option ``-DQK_KQ_FAST_V1``), each one's time spread (min / median / max over
batches; the activation quantization and regrouping included) beside the read-only roofline of its
bytes (weights and activations read once), fp16 cuBLAS on unquantized weights of the same shape and
the read-only roofline of those fp16 weights (``qconform.bench.baselines``). Correctness on the same
input: ``exact`` bit-identical to the oracle (generic order); ``fast`` each output within the
contract's bound (order=any), and for both the relative L2 error against the oracle and against the
float64 reference of the quantized operands (issue 12 item 5). Targets (issue text, item 7): the
kernel at >= 80% of its roofline, and its speed-up over cuBLAS at least 0.8 x the ratio of the two
rooflines. One ``BenchRecord`` per (type, shape, variant); weights are random blocks with finite
scales.

``--variants fast,loads_first``: the fast GEMV with its first trip of weight loads issued before it waits
for the activations' quantize (``-DQK_KF_LOADS_FIRST``, bench-only), so the first wave's weights are in
flight while the quantize runs. (Session 37's ring build, every type at M tile 1 streaming its row
groups through shared memory on the resident CTAs, was measured slower and taken out: docs/perf-notes.md,
session 38.)

``--variants two_launch``: Q4_K / Q5_K at M = 1 as the activations' quantize and the GEMV, two launches
(``-DQK_KF_TWO_LAUNCH``, bench-only), the call before session 40, whose default is one launch: its first
CTAs quantize the row for the others (``qk_kq_one_<t>``). (Session 39's one-launch builds in which every
CTA quantized the row itself were measured slower and taken out: docs/perf-notes.md, session 40.)
``--variants no_prefetch``: the one-launch call without the code of its waiting CTAs asking L2 for their
next row group (``-DQK_KF_ONE_PREFETCH=0``, bench-only; session 40's first one-launch build; the default
keeps that code but runs it on no row length since session 41). ``wait_first``, ``wait_first_sm``
(bench-only diagnostics, sessions 47-48): the one launch's first trip loaded after the wait for the
quantize, by every CTA (``-DQK_KF_FIRST_AFTER_WAIT=1``) or by the CTAs on an SM that a quantizing CTA
published at its entry (``=3``: %smid; each CTA polls those tickets before its first load), so that no
weight load waits in those SMs' queues ahead of the quantize (session 47's ``=2``, a guess at those CTAs
by index, named none of them: taken out, docs/perf-notes.md, session 48). On Q6_K's and Q8_0's one launch
(the bulk kernel, session 51) the same builds issue the first stages' bulk copies after the wait: there the
quantizing CTAs' fence waited 4 us behind their SMs' copies in flight (docs/perf-notes.md, session 51).
(Each CTA's row groups after its first taken from a count instead of the static stride, here and in
Q6_K's and Q8_0's one launch, were measured slower and taken out: docs/perf-notes.md, session 49.)
(The one launch on the fewest row-group CTAs that keep each CTA's most groups, on 8192 x 8192 Q4_K 683
instead of the resident 784 and Q5_K 512 instead of 652, was measured slower on seven of eight rows and
taken out: docs/perf-notes.md, session 51.)
Since session 44 the one launch's CTAs take their row groups as one stream of trips a thread, each row's
next words loaded during this trip (``kf_roll_rows``); the group-at-a-time loop before it was measured
slower and taken out (docs/perf-notes.md, session 44).
(Session 40's prefetch in kernels of its own and round 2's two steps in flight a thread at M tile 1,
the default before session 41, were measured slower and taken out: docs/perf-notes.md, session 41.)

``--variants staged``: Q6_K and Q8_0 at M = 1 as before session 41 (``-DQK_KF_STAGED``, bench-only: each
thread's words staged through shared memory, ``qk_kq_fast_<t>_m1``), where the default brings the weights
into a shared-memory ring by the bulk copy engine (``qk_kq_bulk_<t>``); ``bulk_s2`` that ring with 2 slots
instead of 3 (``-DQK_KF_BULK_STAGES=2``). ``two_launch`` takes Q6_K and Q8_0 too: the quantize, then the bulk
kernel (their one launch on that ring: Q6_K since session 41, Q8_0 since session 42).
(Q4_K and Q5_K on that ring in one launch were measured slower and taken out: docs/perf-notes.md, session 41.)

``--split``: for the fast kernels also the call's launches timed apart, back to back as in the call: the
activation quantize (and Q8_0's regrouping) alone, then the GEMV alone on the activations they wrote.

Each variant's contract order and build options are in ``qconform.bench.ggml_gemv_builds``; the bench
refuses to run while a variant there lacks its build (it would time the shipped one under its name).

``python -m qconform.bench.ggml_gemv [--quick] [--variants exact,fast-v1,two_launch,fast] [--split]
[--types Q4_0,Q2_K,...] [--json FILE]``
"""

from __future__ import annotations

from typing import Any

import cupy
import numpy as np

from qconform.bench import baselines as bl
from qconform.bench.baselines import STREAM_ORDER
from qconform.bench.ggml_gemv_builds import OPTIONS, TRIGGER_AT_EXIT, VARIANT_TYPES, VARIANTS, unbuilt
from qconform.bench.nbits import cublas_fp16, n_sets_for
from qconform.bench.records import BenchRecord, bench_parser, finish
from qconform.device.loader import device_info
from qconform.formats.ggml import FORMATS
from qconform.oracles.ggml.vec_dot_generic import PAIRS

SHAPES = ((8192, 8192), (4096, 14336))  # (K, N): a 70B-class square projection, an 8B model's MLP up
TYPES = ("Q4_K", "Q5_K", "Q6_K", "Q8_0")
TARGET_ROOFLINE = 0.8
TARGET_CUBLAS = 0.8  # of the ratio of the fp16 and the quantized rooflines


def _weights(qtype: str, K: int, N: int, n_sets: int) -> list[Any]:
    from qconform.ops.ggml.q8_quant import finite_scales

    fmt = FORMATS[qtype]
    out = []
    for i in range(n_sets):
        rng = np.random.default_rng(100 + i)
        data = rng.integers(0, 256, (N, fmt.n_bytes(K)), dtype=np.uint8)
        out.append(cupy.asarray(finite_scales(fmt, data, rng)))
    return out


def _rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    ok = np.isfinite(want) & np.isfinite(got)
    den = float(np.linalg.norm(want[ok].astype(np.float64)))
    return float(np.linalg.norm(got[ok].astype(np.float64) - want[ok])) / den if den else 0.0


def _numerics(W: Any, qtype: str, A: Any) -> Any:
    """The contract order=any's reading of one input (``matmul_numerics``): ``want`` the generic order
    (the oracle), ``model.ref`` the float64 reference of the quantized operands, and the bound."""
    from qconform.contracts import parse_contract
    from qconform.ops.ggml.keep_quant import matmul_numerics

    inputs = {"W_blocks": cupy.asnumpy(W), "A_fp32": cupy.asnumpy(A)}
    (e,) = matmul_numerics(inputs, {"qtype": qtype}, parse_contract("order=any"), False)
    return e


def _check(e: Any, y: Any, variant: str) -> tuple[str, float, float]:
    """(verdict, relL2 against the oracle, relL2 against the float64 reference) of the output ``y``
    of the input ``e`` was computed for: ``exact`` must be bit-identical to the generic order,
    ``fast`` within the contract order=any's bound."""
    from qconform.contracts import parse_contract
    from qconform.properties.bounds import check_bound

    got = cupy.asnumpy(y)
    want = np.asarray(e.want, np.float32)
    l2_oracle, l2_ref = _rel_l2(got, want), _rel_l2(got, e.model.ref)
    if variant == "exact":
        if np.array_equal(got.view(np.uint32), want.view(np.uint32)):
            return "PASS", l2_oracle, l2_ref
        bad = int(np.sum(got.view(np.uint32) != want.view(np.uint32)))
        return f"FAIL: {bad} of {got.size} outputs differ from the generic order", l2_oracle, l2_ref
    res = check_bound(got, e.want, e.model, parse_contract("order=any"), False, str, e.mask)
    return ("PASS" if res.ok else f"FAIL: {res.detail}"), l2_oracle, l2_ref


def bench(
    shapes=SHAPES, types=TYPES, reps: int = 50, variants=("exact", "fast"), split: bool = False
) -> list[BenchRecord]:
    from qconform.device.ggml import matmul_bt_quant
    from qconform.device.ggml.keep_quant import FAST_TYPES
    from qconform.device.launch import record, replay
    from qconform.device.launchers import compile_options

    device = device_info().label
    records = []
    print(
        "| type | K x N | variant | us min / med / max | roofline us | of roofline | fp16 cuBLAS us | x cuBLAS "
        "| allowed x (0.8 x roofline ratio) | check | relL2 oracle | relL2 float64 | verdict |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for K, N in shapes:
        A = cupy.asarray(np.random.default_rng(7).standard_normal((1, K)).astype(np.float32))
        fp16 = [
            cupy.random.default_rng(i).standard_normal((N, K), dtype=cupy.float32).astype(cupy.float16)
            for i in range(n_sets_for(N * K * 2))
        ]
        roof16 = bl.median(bl.read_roofline([(w, A) for w in fp16], reps))
        del fp16
        cub_name, cub = cublas_fp16(K, N, 1, reps)
        for qtype in types:
            sets = _weights(qtype, K, N, n_sets_for(N * FORMATS[qtype].n_bytes(K)))
            roof = bl.median(bl.read_roofline([(w, A) for w in sets], reps))
            nbytes = sets[0].nbytes + A.nbytes
            e = _numerics(sets[0], qtype, A)
            for variant in variants:
                if variant != "exact" and qtype not in VARIANT_TYPES.get(variant, FAST_TYPES):
                    continue
                y = cupy.empty((1, N), cupy.float32)
                with compile_options(*OPTIONS.get(variant, ())):
                    # each call's launches, replayable one by one (--split)
                    calls = [record(matmul_bt_quant, W, qtype, A, out=y, order=VARIANTS[variant])[0] for W in sets]
                with bl.launch_order(variant):
                    ts = bl.times(lambda i, c=calls: replay(c[i]), len(calls), reps)
                replay(calls[0])
                check, l2o, l2r = _check(e, y, variant)
                rec = BenchRecord(
                    f"matmul_bt_quant {qtype} {variant}",
                    (1, K, N),
                    device,
                    nbytes,
                    2 * K * N,
                    tuple(t * 1e6 for t in ts),
                    check,
                    {"read-only roofline": roof * 1e6, f"fp16 {cub_name}": bl.median(cub) * 1e6},
                )
                records.append(rec)
                med = bl.median(ts)
                of_roof, x_cub, allowed = roof / med, bl.median(cub) / med, TARGET_CUBLAS * roof16 / roof
                ok = check == "PASS" and of_roof >= TARGET_ROOFLINE and x_cub >= allowed
                lo, hi = min(ts), max(ts)
                print(
                    f"| {qtype} | {K} x {N} | {variant} | {lo * 1e6:.1f} / {med * 1e6:.1f} / {hi * 1e6:.1f} "
                    f"| {roof * 1e6:.1f} | {of_roof:.0%} | {bl.median(cub) * 1e6:.1f} | {x_cub:.2f}x | {allowed:.2f}x "
                    f"| {check} | {l2o:.2e} | {l2r:.2e} | {'PASS' if ok else 'below target'} |",
                    flush=True,
                )
                if split and variant != "exact" and len(calls[0]) > 1:
                    for part, pick in (("activation launches alone", slice(None, -1)), ("GEMV alone", slice(-1, None))):
                        pt = bl.times(lambda i, c=calls, k=pick: replay(c[i][k]), len(calls), reps)
                        pm = bl.median(pt)
                        print(
                            f"| {qtype} | {K} x {N} | {variant}: {part} | {min(pt) * 1e6:.1f} / {pm * 1e6:.1f} / "
                            f"{max(pt) * 1e6:.1f} | {roof * 1e6:.1f} | {roof / pm:.0%} | | | | | | | |",
                            flush=True,
                        )
    return records


def main(argv: list[str] | None = None) -> int:
    p = bench_parser("ggml_gemv", "the first shape, Q4_K and Q8_0, fewer repeats")
    p.add_argument("--types", help=f"comma-separated weight types (default {','.join(TYPES)}; any of the GEMV's)")
    p.add_argument(
        "--variants",
        default="exact,fast-v1,two_launch,fast",
        help="comma-separated kernels: exact (generic order), fast-v1 (round 1), two_launch "
        "(Q4_K, Q5_K: M = 1 as two launches), fast, "
        f"{STREAM_ORDER} (fast, its launches in stream order), {TRIGGER_AT_EXIT} (fast, the quantize not triggering)",
    )
    p.add_argument("--split", action="store_true", help="fast kernels: the activation launches, the GEMV apart")
    a = p.parse_args(argv)
    types = tuple(t.strip().upper() for t in a.types.split(",")) if a.types else None
    if types and (bad := [t for t in types if t not in PAIRS]):
        p.error(f"--types: unknown weight type(s) {', '.join(bad)}")
    variants = tuple(v.strip() for v in a.variants.split(","))
    if bad := unbuilt(VARIANTS, OPTIONS):
        p.error(f"variants without their build (qconform.bench.ggml_gemv_builds): {', '.join(bad)}")
    if bad := [v for v in variants if v not in VARIANTS]:
        p.error(f"--variants: unknown variant(s) {', '.join(bad)}; of {', '.join(VARIANTS)}")
    if a.quick:
        records = bench(SHAPES[:1], types or ("Q4_K", "Q8_0"), 20, variants, a.split)
    else:
        records = bench(types=types or TYPES, variants=variants, split=a.split)
    return finish(records, a.json)


if __name__ == "__main__":
    raise SystemExit(main())

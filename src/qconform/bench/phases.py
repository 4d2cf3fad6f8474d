"""Where a decode call spends its time inside its kernels (a diagnostic, no verdict). The bench-only
build ``-DQK_PHASES`` (``kernels/common/qk_phases.h``) has thread 0 of every CTA of the marked kernels
stamp its SM clock (``clock64``) and a device-wide clock (CUDA ``%globaltimer``, in ns) at numbered
boundaries; the call's launches are replayed back to back on cold sets as the op's bench times them,
and the stamps of the last call are read.

- ``gqa``: GroupQueryAttention decode (``qconform.bench.gqa``'s shape), the mma attention kernel's
  boundaries 0..9: entry; the position known (after ``seqlens_k``); the block's query rotated; the
  folded append done (new rows, barrier); the split's keys and partial slots; the Q fragments; the
  first tile's scores; the loop done; the partials stored; the folded combine done (at once where it
  is launched).
- ``qmoe``: QMoE decode (``qconform.bench.qmoe``'s layers), ``qk_moe_fc1m``'s boundaries 0..3 (entry;
  routing done: logits, input staged, ranks, weights; the first task done; every task done) and
  ``qk_moe_fc2m``'s 12..17 (entry; the wait for fc1 over; sel / wts read; the planes staged; the slots'
  dots; the output stored).
- ``ggml``: ggml's keep-quant GEMV under order=any (``qconform.bench.ggml_gemv``'s shape ``--shape``, M 1), the
  Q4_K / Q5_K kernel's boundaries 0..4: entry; its first weights requested (and the activations'
  quantize waited for); those weights arrived; its (last) row group done but the sums; the end (the sums
  stored); Q6_K's bulk kernel (``qk_kq_one_bulk_q6_k``) the same at 10..14 (its first stages' copies
  issued and the quantize waited for; the first stage arrived). The quantizing CTAs' 5..8 in both. The
  CTAs' entries and ends show how the waves of the default build follow each other; two more tables give
  the row-group CTAs' ends by how many row groups each took and how many its SM's CTAs took.

For each phase (boundary i to i + 1 of one kernel) the table gives the median and maximum over the CTAs
that reached both boundaries (an mma split with no key skips 5..7), in us at the device's nominal SM
clock (the clock may run lower under load), and for each kernel when its CTAs enter and end on the
device-wide clock, after the call's first CTA entered. The stamps cost registers (sm_90: GQA f16 x 128
217 instead of 215, int8 x 128 and fc1m_z spill 4-8 bytes), so each build's call time is printed beside
its phases.

``python -m qconform.bench.phases gqa [--batch 1] [--past 16,4096] [--cache fp16,int8] [--variant flash]``
``python -m qconform.bench.phases qmoe [--layer gpt-oss-20b] [--variant decode]``
``python -m qconform.bench.phases ggml [--qtype Q4_K,Q5_K,Q6_K] [--variant fast] [--shape 0]``
(``--variant``: a build of the op bench's ``--variants``, its options added to the stamps')
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import numpy as np

BUILD = "-DQK_PHASES"
SLOTS = 24  # QK_PHASE_SLOTS
CTAS = 4096  # QK_PHASE_CTAS
CALLS = 40  # back-to-back calls; the stamps are the last one's


@dataclass(frozen=True)
class Marked:
    """One kernel's boundaries: ``first`` .. ``first + len(phases)``, phase i between i and i + 1."""

    kernel: str
    first: int
    phases: tuple[str, ...]

    @property
    def last(self) -> int:
        return self.first + len(self.phases)


GQA = (
    Marked(
        "qk_gqa_mma_*",
        0,
        (
            "position (seqlens_k read)",
            "query rotated (Q, cos, sin read)",
            "append done (new rows, barrier)",
            "split's keys and slots",
            "Q fragments",
            "first tile's scores",
            "rest of the loop",
            "partials stored",
            "folded combine",
        ),
    ),
)
QMOE = (
    Marked("qk_moe_fc1m", 0, ("routing (logits, input staged, ranks, weights)", "first task", "other tasks")),
    Marked(
        "qk_moe_fc2m",
        12,
        ("wait for fc1", "sel / wts read", "planes staged", "slots' dots", "sum and store"),
    ),
)

KQ = (
    Marked(
        "qk_kq_one_q4_k / q5_k (row-group CTAs)",
        0,
        (
            "first weights requested (and the quantize waited for)",
            "first weights arrived",
            "its row groups' trips, to the last group's sums",
            "the last group's sums and store",
        ),
    ),
    Marked(
        "qk_kq_one_q4_k / q5_k (quantizing CTAs)",
        5,
        ("its X arrived", "quantized, act stored", "fence, barrier, count added"),
    ),
)

KQ_BULK = (
    Marked("qk_kq_one_bulk_q6_k (row-group CTAs)", 10, KQ[0].phases),
    Marked("qk_kq_one_bulk_q6_k (quantizing CTAs)", KQ[1].first, KQ[1].phases),
)
# each --qtype's stamped tables (Q8_0's quantize, qk_q8_0_words_lane, has no "X arrived" stamp)
KQ_TABLES = {"Q4_K": KQ, "Q5_K": KQ, "Q6_K": KQ_BULK}
KQ_SM_SLOT = 9  # keep_quant_fast.hip KF_SM_SLOT: each one-launch CTA's SM plus one (QK_PHASE_SM)
KQ_ROWS = 4  # keep_quant_fast.hip KF_ROWS: the weight rows of a row group


def sm_sharing(sm: np.ndarray, producers: int) -> str:
    """Which SMs the one launch's quantizing CTAs ran on (rows 0 .. producers - 1 of ``sm``: each CTA's SM
    plus one, 0 where not stamped) and how many row-group CTAs shared those SMs (the CTAs that the
    ``wait_first_sm`` build makes wait first)."""
    stamped = np.flatnonzero(sm > 0)
    quant_sms = {int(v) - 1 for v in sm[stamped[stamped < producers]]}
    rows = stamped[stamped >= producers]
    shares = np.isin(sm[rows] - 1, sorted(quant_sms))
    return f"quantizing CTAs on {len(quant_sms)} SMs; {int(shares.sum())} of {rows.size} row-group CTAs share those SMs"


def phase_table(clock: np.ndarray, marked: Marked, clock_khz: float) -> list[tuple[str, float, float, int]]:
    """(phase, median us, max us, CTAs) for each phase of ``marked`` from ``clock`` ([CTAs, SLOTS] SM clock
    stamps, 0 where a CTA did not reach a boundary), over the CTAs that reached both of its boundaries."""
    rows = []
    for i, name in enumerate(marked.phases, start=marked.first):
        both = (clock[:, i] > 0) & (clock[:, i + 1] > 0)
        us = (clock[both, i + 1] - clock[both, i]).astype(np.float64) / clock_khz * 1e3
        med, mx = (float(np.median(us)), float(us.max())) if us.size else (float("nan"), float("nan"))
        rows.append((name, med, mx, int(both.sum())))
    return rows


def spread(wall: np.ndarray, marked: Marked, origin: int) -> tuple[float, float, float, float]:
    """(entry median, entry max, end median, end max) in us after ``origin`` (ns) of the CTAs that
    stamped ``marked``'s first and last boundaries, from ``wall`` ([CTAs, SLOTS] device clock, ns)."""
    entry, end = wall[:, marked.first], wall[:, marked.last]
    entry, end = (entry[entry > 0] - origin) / 1e3, (end[end > 0] - origin) / 1e3
    if not entry.size or not end.size:
        return (float("nan"),) * 4
    return float(np.median(entry)), float(entry.max()), float(np.median(end)), float(end.max())


def first_entry(wall: np.ndarray, kernels: tuple[Marked, ...]) -> int:
    """The device clock (ns) at which the call's first CTA of ``kernels`` entered (0 if none stamped)."""
    starts = [wall[:, m.first][wall[:, m.first] > 0] for m in kernels]
    return int(min(s.min() for s in starts if s.size)) if any(s.size for s in starts) else 0


def strided_groups(c: np.ndarray, groups: int, ctas: int) -> np.ndarray:
    """How many of ``groups`` row groups row-group CTA c takes when CTA c takes c, c + C, ... (C = ``ctas``;
    keep_quant_fast.hip kf_roll_rows, kf_bulk_gemv): len(range(c, groups, C))."""
    return np.maximum(-(-(groups - c) // ctas), 0)


def ends_by_load(
    wall: np.ndarray, sm: np.ndarray, marked: Marked, origin: int, producers: int, ctas: int, groups: int
) -> list[str]:
    """Markdown lines: when the one launch's row-group CTAs end (us after ``origin``, ns, median / max), by
    how many row groups each took (row-group CTA c at stamp row ``producers + c``: ``strided_groups``) and by
    how many its SM's row-group CTAs took together; ``sm``: each row's SM plus one."""
    rows = np.flatnonzero(wall[:, marked.last] > 0)
    rows = rows[rows >= producers]
    took = strided_groups(rows - producers, groups, ctas)
    end = (wall[rows, marked.last] - origin) / 1e3
    on_sm = sm[rows]
    sm_load = {int(s): int(took[on_sm == s].sum()) for s in np.unique(on_sm)}
    load = np.array([sm_load[int(s)] for s in on_sm])
    lines = []
    for label, key in (("row groups a CTA", took), ("row groups its SM's CTAs", load)):
        lines += [f"| {label} | CTAs | end us median | end us max |", "|---|---|---|---|"]
        for k in np.unique(key):
            e = end[key == k]
            lines.append(f"| {int(k)} | {e.size} | {float(np.median(e)):.2f} | {float(e.max()):.2f} |")
    return lines


def report(stamps: np.ndarray, kernels: tuple[Marked, ...], clock_khz: float) -> list[str]:
    """Markdown lines: per kernel, its CTAs' entries and ends, then its phase table (``stamps``:
    [CTAs, SLOTS, 2] SM clock, device clock)."""
    clock, wall = stamps[:, :, 0], stamps[:, :, 1]
    origin = first_entry(wall, kernels)
    lines = []
    for m in kernels:
        e50, emax, d50, dmax = spread(wall, m, origin)
        lines += [
            f"{m.kernel}: CTAs enter at {e50:.2f} / {emax:.2f} us (median / max) and end at {d50:.2f} / {dmax:.2f} us "
            "after the call's first CTA entered",
            "| phase | us median | us max | CTAs |",
            "|---|---|---|---|",
        ]
        lines += [f"| {name} | {med:.2f} | {mx:.2f} | {n} |" for name, med, mx, n in phase_table(clock, m, clock_khz)]
    return lines


def _stamps(replays: list[Any], module: Any) -> np.ndarray:
    """[CTAS, SLOTS, 2] (SM clock, device clock) of the last of CALLS back-to-back calls."""
    import cupy

    from qconform.bench import baselines as bl

    stamps = cupy.ndarray((CTAS, SLOTS, 2), cupy.uint64, memptr=module.get_global("qk_phase_clock"))
    stamps.fill(0)
    bl.spin()
    for i in range(CALLS):
        replays[i % len(replays)]()
    cupy.cuda.runtime.deviceSynchronize()
    return cupy.asnumpy(stamps).astype(np.int64)


def _module(source: str, options: tuple[str, ...]) -> Any:
    """The module of ``source`` that the stamped build ``options`` (BUILD, then the variant's) loaded:
    the one whose ``qk_phase_clock`` its kernels write."""
    from qconform.device import launchers
    from qconform.device.loader import load_module

    with launchers.compile_options(BUILD, *options):
        return load_module(launchers.KERNEL_DIR / source, launchers.OPTIONS)


def _khz() -> float:
    import cupy

    return float(cupy.cuda.Device().attributes["ClockRate"])


def run_gqa(batch: int, past: int, bits: int, variant: str = "flash", reps: int = 50) -> str:
    """The phases of one GQA decode shape (Llama-3-8B's heads, as ``qconform.bench.gqa``) in ``variant``'s
    build (a key of ``qconform.bench.gqa.VARIANTS``) with the stamps."""
    from qconform.bench import baselines as bl
    from qconform.bench import gqa
    from qconform.bench.nbits import n_sets_for
    from qconform.device import launchers
    from qconform.device.ort.group_query_attention import SOURCE

    _, Nk, H = gqa.HEADS
    kv_bytes = 2 * batch * Nk * (past + 1) * H * (1 if bits else 2)
    sets = [gqa._inputs(batch, past, bits, 10 + i) for i in range(n_sets_for(kv_bytes))]
    with launchers.compile_options(BUILD):
        ts, calls = gqa._time_variant(sets, bits, variant, reps)
    with bl.launch_order(variant):
        stamps = _stamps([c[0] for c in calls], _module(SOURCE, gqa.VARIANTS[variant]))
    head = (
        f"gqa {variant}: {'int8' if bits else 'fp16'} cache, batch {batch}, past {past}, grid "
        f"{calls[0][0].args[0][0].grid}: call {bl.median(ts) * 1e6:.1f} us (this build)"
    )
    return "\n".join([head, *report(stamps, GQA, _khz())])


def run_qmoe(layer_name: str, variant: str = "decode", reps: int = 50) -> str:
    """The phases of one QMoE decode layer of ``qconform.bench.qmoe.SHAPES`` in ``variant``'s build (a key
    of ``qconform.bench.qmoe.VARIANTS``) with the stamps."""
    from qconform.bench import baselines as bl
    from qconform.bench import qmoe
    from qconform.device import launchers
    from qconform.device.ort.qmoe import SOURCE

    name, H, inter, E, k, bs, swiglu = next(s for s in qmoe.SHAPES if s[0] == layer_name)
    layer = qmoe._layer(H, inter, E, bs, 11)
    params = {"act": "fp16", "bits": qmoe.BITS, "k": k, "bs": bs, "bias": True, "swiglu": swiglu}
    sets = [qmoe._logits(E, k, i) for i in range(E // k * 2)]
    with launchers.compile_options(BUILD):
        calls, _ = qmoe.bind_calls(layer, sets, params, H, variant)
        with bl.launch_order(variant):
            ts = bl.times(lambda i: calls[i](), len(calls), reps)
            stamps = _stamps(calls, _module(SOURCE, qmoe.VARIANTS[variant]))
    head = f"qmoe {variant}: {name} (H {H}, I {inter}, E {E}, k {k}): call {bl.median(ts) * 1e6:.1f} us (this build)"
    return "\n".join([head, *report(stamps, QMOE, _khz())])


def run_ggml(qtype: str, variant: str = "fast", shape: int = 0, reps: int = 50) -> str:
    """The phases of the keep-quant GEMV (``qconform.bench.ggml_gemv``'s shape ``shape``, M 1) of ``qtype``
    (a key of ``KQ_TABLES``) in ``variant``'s build (a key of ``qconform.bench.ggml_gemv_builds.VARIANTS``)
    with the stamps."""
    import cupy

    from qconform.bench import baselines as bl
    from qconform.bench import ggml_gemv
    from qconform.bench.ggml_gemv_builds import OPTIONS, VARIANTS
    from qconform.bench.nbits import n_sets_for
    from qconform.device import launchers
    from qconform.device.ggml import matmul_bt_quant
    from qconform.device.ggml.keep_quant import FAST_SOURCE
    from qconform.device.launch import record, replay
    from qconform.formats.ggml import FORMATS

    K, N = ggml_gemv.SHAPES[shape]
    sets = ggml_gemv._weights(qtype, K, N, n_sets_for(N * FORMATS[qtype].n_bytes(K)))
    A = cupy.asarray(np.random.default_rng(7).standard_normal((1, K)).astype(np.float32))
    y = cupy.empty((1, N), cupy.float32)
    options = OPTIONS.get(variant, ())
    with launchers.compile_options(BUILD, *options):
        calls = [record(matmul_bt_quant, W, qtype, A, out=y, order=VARIANTS[variant])[0] for W in sets]
    replays = [lambda c=c: replay(c) for c in calls]
    with bl.launch_order(variant):
        ts = bl.times(lambda i: replays[i](), len(replays), reps)
        stamps = _stamps(replays, _module(FAST_SOURCE, options))
    grid = calls[0][-1].grid
    head = f"ggml {variant}: {qtype} {K} x {N}, M 1, GEMV grid {grid}: call {bl.median(ts) * 1e6:.1f} us (this build)"
    tables = KQ_TABLES[qtype]
    producers = int((stamps[:, tables[1].first, 0] > 0).sum())
    wall, sm = stamps[:, :, 1], stamps[:, KQ_SM_SLOT, 0]
    origin = first_entry(wall, tables)
    by_load = ends_by_load(wall, sm, tables[0], origin, producers, grid[0] - producers, -(-N // KQ_ROWS))
    return "\n".join([head, sm_sharing(sm, producers), *report(stamps, tables, _khz()), *by_load])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m qconform.bench.phases", description=__doc__.split("\n\n")[0])
    ops = p.add_subparsers(dest="op", required=True)
    g = ops.add_parser("gqa", help="GroupQueryAttention decode")
    g.add_argument("--batch", type=int, default=1)
    g.add_argument("--past", default="16,4096", help="comma-separated past lengths")
    g.add_argument("--cache", default="fp16,int8", help="fp16 and / or int8")
    g.add_argument("--variant", default="flash", help="a build of qconform.bench.gqa's --variants")
    q = ops.add_parser("qmoe", help="QMoE decode")
    q.add_argument("--layer", default="gpt-oss-20b", help="comma-separated layers of qconform.bench.qmoe")
    q.add_argument("--variant", default="decode", help="a build of qconform.bench.qmoe's --variants")
    k = ops.add_parser("ggml", help="ggml keep-quant GEMV (order=any), M 1")
    k.add_argument("--qtype", default="Q4_K", help=f"any of {', '.join(KQ_TABLES)}, comma-separated")
    k.add_argument("--variant", default="fast", help="a build of qconform.bench.ggml_gemv's --variants")
    k.add_argument("--shape", type=int, default=0, help="an index into qconform.bench.ggml_gemv.SHAPES")
    args = p.parse_args(argv)
    if args.op == "ggml":
        from qconform.bench.ggml_gemv_builds import VARIANTS as KQ_VARIANTS

        qtypes = args.qtype.split(",")
        if not set(qtypes) <= set(KQ_TABLES):
            p.error(f"--qtype: any of {', '.join(KQ_TABLES)} (the stamped kernels), got {args.qtype!r}")
        if args.variant not in KQ_VARIANTS or KQ_VARIANTS[args.variant] != "any":
            p.error(f"--variant: one of the order=any builds of {', '.join(KQ_VARIANTS)}, got {args.variant!r}")
        from qconform.bench.ggml_gemv import SHAPES as KQ_SHAPES

        if not 0 <= args.shape < len(KQ_SHAPES):
            p.error(f"--shape: an index below {len(KQ_SHAPES)} into {KQ_SHAPES}, got {args.shape}")
        for qtype in qtypes:
            print(run_ggml(qtype, args.variant, args.shape), flush=True)
        return 0
    if args.op == "gqa":
        pasts = [int(x) for x in args.past.split(",")]
        caches = args.cache.split(",")
        if args.batch < 1 or min(pasts) < 1:
            p.error("--batch and --past: positive integers")
        if not set(caches) <= {"fp16", "int8"}:
            p.error(f"--cache: fp16 and / or int8, got {args.cache!r}")
        from qconform.bench.gqa import VARIANTS

        if args.variant not in VARIANTS:
            p.error(f"--variant: one of {', '.join(VARIANTS)}, got {args.variant!r}")
        for cache in caches:
            for past in pasts:
                print(run_gqa(args.batch, past, 8 if cache == "int8" else 0, args.variant), flush=True)
        return 0
    from qconform.bench.qmoe import SHAPES
    from qconform.bench.qmoe import VARIANTS as QMOE_VARIANTS

    layers = args.layer.split(",")
    known = [s[0] for s in SHAPES]
    if not set(layers) <= set(known):
        p.error(f"--layer: of {', '.join(known)}, got {args.layer!r}")
    if args.variant not in QMOE_VARIANTS:
        p.error(f"--variant: one of {', '.join(QMOE_VARIANTS)}, got {args.variant!r}")
    for layer in layers:
        print(run_qmoe(layer, args.variant), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where a GroupQueryAttention decode call spends its time inside the attention kernel (a diagnostic,
no verdict). The bench-only build ``-DQK_GQA_PHASES`` of ``ort/gqa.hip`` has thread 0 of every mma CTA
stamp its SM clock (``clock64``) and a device-wide clock (CUDA ``%globaltimer``, in ns) at ten
boundaries of the decode (0: entry; 1: the position known, after ``seqlens_k``; 2: the block's query
values rotated; 3: the folded append done (new rows, barrier); 4: the split's keys and partial slots;
5: the Q fragments; 6: the first tile's scores; 7: the loop done; 8: the partials stored; 9: the folded
combine done, or at once where it is launched). The call's launches are replayed back to back on cold
sets as ``qconform.bench.gqa`` times them, and the stamps of the last call are read.

For each phase (boundary i to i + 1) the table gives the median and maximum over the CTAs that reached
both boundaries (a split with no key skips 5..7), in us at the device's nominal SM clock (the clock
may run lower under load), and the spread of the CTAs' entries and ends on the device-wide clock.
The build differs from the shipped one by the stamps only (sm_90: f16 x 128 217 registers instead of
215; int8 x 128 spills 8 bytes at its cap of 168), so its call time is printed beside the phases.

``--variant`` stamps another build of ``qconform.bench.gqa``'s variants (its options added to the stamps').

``python -m qconform.bench.gqa_phases [--batch 1] [--past 16,4096] [--cache fp16,int8] [--variant flash]``
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

BUILD = "-DQK_GQA_PHASES"
BOUNDARIES = 10
PHASES = (
    "position (seqlens_k read)",
    "query rotated (Q, cos, sin read)",
    "append done (new rows, barrier)",
    "split's keys and slots",
    "Q fragments",
    "first tile's scores",
    "rest of the loop",
    "partials stored",
    "folded combine",
)
CALLS = 40  # back-to-back calls; the stamps are the last one's


def phase_table(clock: np.ndarray, clock_khz: float) -> list[tuple[str, float, float, int]]:
    """(phase, median us, max us, CTAs) for each phase of ``clock`` ([CTAs, BOUNDARIES] SM clock
    stamps, 0 where a CTA did not reach a boundary), over the CTAs that reached both of its boundaries."""
    rows = []
    for i, name in enumerate(PHASES):
        both = (clock[:, i] > 0) & (clock[:, i + 1] > 0)
        us = (clock[both, i + 1] - clock[both, i]).astype(np.float64) / clock_khz * 1e3
        med, mx = (float(np.median(us)), float(us.max())) if us.size else (float("nan"), float("nan"))
        rows.append((name, med, mx, int(both.sum())))
    return rows


def spread(wall: np.ndarray) -> tuple[float, float, float, float]:
    """(entry median, entry max, end median, end max) in us after the first CTA's entry, from
    ``wall`` ([CTAs, BOUNDARIES] device-wide clock stamps in ns)."""
    first = wall[:, 0].min()
    entry, end = (wall[:, 0] - first) / 1e3, (wall[:, BOUNDARIES - 1] - first) / 1e3
    return float(np.median(entry)), float(entry.max()), float(np.median(end)), float(end.max())


def _stamps(calls: list, module: Any, n_ctas: int) -> np.ndarray:
    """[n_ctas, BOUNDARIES, 2] (SM clock, device clock) of the last of CALLS back-to-back calls."""
    import cupy

    from qconform.bench import baselines as bl

    ptr = module.get_global("qk_gqa_phase_clock")
    stamps = cupy.ndarray((n_ctas, BOUNDARIES, 2), cupy.uint64, memptr=ptr)
    stamps.fill(0)
    bl.spin()
    for i in range(CALLS):
        calls[i % len(calls)][0]()
    cupy.cuda.runtime.deviceSynchronize()
    return cupy.asnumpy(stamps).astype(np.int64)


def run(batch: int, past: int, bits: int, variant: str = "flash", reps: int = 50) -> str:
    """The phase table of one decode shape (Llama-3-8B's heads, as ``qconform.bench.gqa``) in
    ``variant``'s build (a key of ``qconform.bench.gqa.VARIANTS``) with the stamps."""
    import cupy

    from qconform.bench import baselines as bl
    from qconform.bench import gqa
    from qconform.bench.nbits import n_sets_for
    from qconform.device import launchers
    from qconform.device.loader import load_module
    from qconform.device.ort.group_query_attention import SOURCE

    N, Nk, H = gqa.HEADS
    kv_bytes = 2 * batch * Nk * (past + 1) * H * (1 if bits else 2)
    sets = [gqa._inputs(batch, past, bits, 10 + i) for i in range(n_sets_for(kv_bytes))]
    with launchers.compile_options(BUILD):
        ts, calls = gqa._time_variant(sets, bits, variant, reps)
        module = load_module(launchers.KERNEL_DIR / SOURCE, launchers.OPTIONS)
    attention = calls[0][0].args[0][0]  # the first launch of the call: the mma attention kernel
    grid = attention.grid
    stamps = _stamps(calls, module, min(int(np.prod(grid)), 4096))
    khz = cupy.cuda.Device().attributes["ClockRate"]
    e50, emax, d50, dmax = spread(stamps[:, :, 1])
    lines = [
        f"{variant}: {'int8' if bits else 'fp16'} cache, batch {batch}, past {past}: {attention.kernel.name} "
        f"grid {grid}, call {bl.median(ts) * 1e6:.1f} us (this build); CTAs enter within {e50:.2f} / {emax:.2f} us "
        f"(median / max) of the first and end at {d50:.2f} / {dmax:.2f} us",
        "| phase | us median | us max | CTAs |",
        "|---|---|---|---|",
    ]
    lines += [f"| {name} | {med:.2f} | {mx:.2f} | {n} |" for name, med, mx, n in phase_table(stamps[:, :, 0], khz)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m qconform.bench.gqa_phases", description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--past", default="16,4096", help="comma-separated past lengths")
    p.add_argument("--cache", default="fp16,int8", help="fp16 and / or int8")
    p.add_argument("--variant", default="flash", help="a build of qconform.bench.gqa's --variants")
    args = p.parse_args(argv)
    pasts = [int(x) for x in args.past.split(",")]
    if args.batch < 1 or min(pasts) < 1:
        p.error("--batch and --past: positive integers")
    from qconform.bench.gqa import VARIANTS

    if args.variant not in VARIANTS:
        p.error(f"--variant: one of {', '.join(VARIANTS)}, got {args.variant!r}")
    for cache in args.cache.split(","):
        if cache not in ("fp16", "int8"):
            p.error(f"--cache: fp16 or int8, got {cache!r}")
        for past in pasts:
            print(run(args.batch, past, 8 if cache == "int8" else 0, args.variant), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

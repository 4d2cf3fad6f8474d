"""GroupQueryAttention decode on the device against its baselines, side by side in one run: for
batch 1 / 4 / 16 and a past of 4k / 16k tokens (Llama-3-8B's heads: 32 query / 8 KV heads of
128, half-split rotary, fp16), our kernels' time spread (min / median / max over batches: the
append with rotary, the split-K attention and the combine; the copy of the past into a separate
present buffer is left out, as a serving stack appends into its cache in place) beside the
read-only roofline of the KV-cache bytes (``qconform.bench.baselines``) and PyTorch's
``scaled_dot_product_attention`` on the same fp16 cache (the faster of ``enable_gqa=True`` and
KV heads repeated beforehand, whichever backend torch picks; torch is imported here only). The
int8-cache decode (per-tensor scale) is timed beside the roofline of its own bytes.

Targets (issue text): decode >= 80% of the roofline and faster than SDPA; the int8 cache faster
than the fp16 one. The verdict column is the conformance of the same kernels on the catalogue's
sized case (batch 1, past 4096, the same heads): present caches bit-exact, the output within its
bound (``qconform.ops.ort.group_query_attention``), one check per cache type.

``--variants flash,combine_fold,combine_launch,append_launch,s10`` times beside the default build (the
decode's new rows appended by the mma kernels' CTAs, the combine folded in up to
``FOLD_MAX_SPLITS`` splits, else launched after them) the combine always folded in
(``-DQK_GQA_COMBINE_FOLD``: the CTA that completes a block of splits combines it), always launched
(``-DQK_GQA_COMBINE_LAUNCH``), the rows appended by a qk_gqa_append8 launch first
(``-DQK_GQA_APPEND_LAUNCH``), and session 10's qk_gqa_append and qk_gqa_combine launches
(``-DQK_GQA_APPEND_V1 -DQK_GQA_COMBINE_LAUNCH``, a thread per channel pair).
``--variants flash,loads_first`` times the mma decode with the folded append's reads all issued before
any is used (``-DQK_GQA_APPEND_LOADS_FIRST``: the query's and new rows' before ``seqlens_k``, cos / sin
after the position; the default build waits one latency an element). Bench-only: beside the default's
32-bit index arithmetic it measured level or slower (docs/perf-notes.md, session 36). (Session 36's
``early`` and ``pipe`` builds, each group's first tile copied in before the folded append and every
round of the loop copied a round ahead, measured slower and were taken out: perf-notes, session 38.)
``python -m qconform.bench.phases gqa --variant`` shows where each build's time goes.
``--variants flash,simt`` times the session-9 SIMT flash kernels
(``-DQK_GQA_DECODE_SIMT``) beside
the default ones, which run the attention on the matrix units for this bench's fp16 queries and
fp16 / int8 per-tensor caches (``qk_gqa_mma_*``, session 10); ``--variants flash,flash_v1,legacy``
times the session-8 flash kernels (``-DQK_GQA_FLASH_V1``) and the session-7 attention kernels
(``-DQK_GQA_LEGACY``) beside the default ones on the same cold sets, each variant checked on the
catalogue's case (``flash_i8u8``: int8 tiles of 8 keys).

``python -m qconform.bench.gqa [--quick] [--variants flash,combine_fold,combine_launch,s10,...] [--json FILE]``
"""

from __future__ import annotations

import functools
from typing import Any

import cupy
import numpy as np

from qconform.bench import baselines as bl
from qconform.bench.baselines import STREAM_ORDER
from qconform.bench.nbits import n_sets_for
from qconform.bench.records import BenchRecord, bench_parser, finish
from qconform.device.loader import device_info

HEADS = (32, 8, 128)  # N, Nk, H: Llama-3-8B
BATCHES = (1, 4, 16)
PASTS = (4096, 16384)
TARGET_ROOFLINE = 0.8
INT8_SCALE = np.float32(4.0 / 127)


def _inputs(B: int, P: int, bits: int, seed: int) -> dict[str, Any]:
    """A decode step's device inputs (the catalogue's call: ORT's input names) with a past of P rows."""
    N, Nk, H = HEADS
    rng = cupy.random.default_rng(seed)
    T = P + 1
    inp: dict[str, Any] = {
        "query": rng.standard_normal((B, 1, N * H), dtype=cupy.float32).astype(cupy.float16),
        "key": rng.standard_normal((B, 1, Nk * H), dtype=cupy.float32).astype(cupy.float16),
        "value": rng.standard_normal((B, 1, Nk * H), dtype=cupy.float32).astype(cupy.float16),
        "seqlens_k": cupy.full(B, P, cupy.int32),
        "total_sequence_length": np.array([T], np.int32),
    }
    for name in ("past_key", "past_value"):
        if bits:
            inp[name] = rng.integers(-128, 128, (B, Nk, P, H), dtype=cupy.int8)
        else:
            inp[name] = rng.standard_normal((B, Nk, P, H), dtype=cupy.float32).astype(cupy.float16)
    ang = np.arange(T + 1)[:, None] * 10000.0 ** (-np.arange(H // 2) * 2.0 / H)[None, :]
    inp["cos_cache"], inp["sin_cache"] = (cupy.asarray(f(ang).astype(np.float16)) for f in (np.cos, np.sin))
    if bits:
        inp["k_scale"] = inp["v_scale"] = cupy.asarray(np.array([INT8_SCALE], np.float32))
    return inp


def _attrs(bits: int) -> dict[str, Any]:
    N, Nk, _ = HEADS
    attrs: dict[str, Any] = {"num_heads": N, "kv_num_heads": Nk, "do_rotary": 1}
    if bits:
        attrs.update(k_quant_type="PER_TENSOR", v_quant_type="PER_TENSOR", kv_cache_bit_width=bits)
    return attrs


def _call(inp: dict[str, Any], bits: int) -> tuple[tuple, dict[str, Any]]:
    from qconform.ops.ort.attention_bounds import INPUTS

    return tuple(inp.get(name) for name in INPUTS), _attrs(bits)


def _decode_launches(inp: dict[str, Any], bits: int) -> Any:
    """Run one full call (the past copied into present), then return a replay of its launches
    without the copy (present already holds the past: the in-place append of a serving cache)."""
    from qconform.device.launch import record, replay
    from qconform.device.launchers import kernel_of
    from qconform.device.ort.group_query_attention import SOURCE, gqa_decode

    args, attrs = _call(inp, bits)
    out = gqa_decode(*args, **attrs)
    launches, _ = record(gqa_decode, *args, **attrs, out=out)
    copy = kernel_of(SOURCE, "qk_gqa_copy_past")
    kept = [launch for launch in launches if launch.kernel is not copy]
    return functools.partial(replay, kept), out


def _sdpa(sets: list[tuple[Any, Any, Any]], reps: int) -> tuple[str, list[float]]:
    """The faster of torch's SDPA with enable_gqa and with the KV heads repeated beforehand, on
    the same fp16 query and present caches."""
    import torch
    import torch.nn.functional as F

    N, Nk, _ = HEADS
    views = [
        tuple(torch.as_tensor(a, device="cuda") for a in (q.reshape(q.shape[0], 1, N, -1).swapaxes(1, 2), k, v))
        for q, k, v in sets
    ]
    repeated = [(q, k.repeat_interleave(N // Nk, 1), v.repeat_interleave(N // Nk, 1)) for q, k, v in views]
    with torch.no_grad():
        gqa = bl.times(lambda i: F.scaled_dot_product_attention(*views[i], enable_gqa=True), len(views), reps)
        rep = bl.times(lambda i: F.scaled_dot_product_attention(*repeated[i]), len(repeated), reps)
    torch.cuda.synchronize()
    return ("SDPA enable_gqa", gqa) if bl.median(gqa) <= bl.median(rep) else ("SDPA repeated KV", rep)


def verify(bits: int, past: int = 4096) -> str:
    """The kernels on the catalogue's sized decode case (batch 1, ``past`` rows, Llama-3-8B's
    heads; int8: the per-tensor quantized leaf): caches exact, output within its bound."""
    from qconform.device.ort.group_query_attention import gqa_decode
    from qconform.ops import get_op
    from qconform.properties.checks import Prepared

    op = get_op("gqa_decode")
    leaf = "Xfp16_Wi8_Yfp16" if bits == 8 else "Xfp16_Wfp16_Yfp16"
    case = op.sized_case(leaf, past, 1)
    prepared = Prepared.from_case(op, case)
    args, kwargs = op.call_args({k: cupy.asarray(v) for k, v in prepared.inputs.items()}, prepared.params)
    got = tuple(cupy.asnumpy(a) for a in gqa_decode(*args, **kwargs))
    c = prepared.verify(op, got)
    return "PASS" if c.ok else f"FAIL: {c.detail}"


VARIANTS = {  # build options of each attention kernel
    "flash": (),  # the mma kernels for fp16 queries on fp16 / int8 per-tensor caches (a decode appends: session 11)
    "combine_fold": ("-DQK_GQA_COMBINE_FOLD",),  # the last CTA of a block combines it (no combine launch) always
    "combine_launch": ("-DQK_GQA_COMBINE_LAUNCH",),  # qk_gqa_combine launched after the mma kernel always
    "append_launch": ("-DQK_GQA_APPEND_LAUNCH",),  # qk_gqa_append8 launched before the mma kernel
    "s10": ("-DQK_GQA_APPEND_V1", "-DQK_GQA_COMBINE_LAUNCH"),  # session 10: qk_gqa_append, mma, qk_gqa_combine
    "simt": ("-DQK_GQA_DECODE_SIMT",),  # session 9: the SIMT flash kernels everywhere
    "flash_v1": ("-DQK_GQA_FLASH_V1",),  # session 8: every lane does every (key, head)'s butterfly and softmax
    "flash_i8u8": ("-DQK_GQA_I8T_U8",),  # int8 per-tensor tiles of 8 keys a group (3 CTAs an SM); fp16 as flash
    "legacy": ("-DQK_GQA_LEGACY",),
    "loads_first": ("-DQK_GQA_APPEND_LOADS_FIRST",),  # mma decode: the append's reads issued before any use
    STREAM_ORDER: (),  # the default build with every launch in stream order (the combine not a dependent)
}


def _time_variant(sets: list[dict[str, Any]], bits: int, variant: str, reps: int) -> tuple[list, list]:
    """(seconds per call, the calls' replays and outputs) of ``variant``'s build of the kernels
    (VARIANTS), launched in stream order for ``stream_order``."""
    from qconform.device.launchers import compile_options

    with compile_options(*VARIANTS[variant]):
        calls = [_decode_launches(inp, bits) for inp in sets]
    with bl.launch_order(variant):
        return bl.times(lambda i: calls[i][0](), len(sets), reps), calls


def _spread(ts: list[float]) -> str:
    return f"{min(ts) * 1e6:.1f} / {bl.median(ts) * 1e6:.1f} / {max(ts) * 1e6:.1f}"


def bench(batches=BATCHES, pasts=PASTS, reps: int = 50, variants: tuple[str, ...] = ("flash",)) -> list[BenchRecord]:
    """The decode table; ``variants`` (keys of VARIANTS, the first the one judged against the
    targets) timed side by side on the same cold sets, each checked on the catalogue's case."""
    from qconform.device.launchers import compile_options

    device = device_info().label
    N, Nk, H = HEADS
    checked: dict[tuple[str, int], str] = {}
    for v in variants:
        with compile_options(*VARIANTS[v]):
            for bits in (0, 8):
                checked[(v, bits)] = verify(bits)
        print(
            f"verdict of {v} (the catalogue's sized case, batch 1, past 4096): fp16 cache {checked[(v, 0)]}; "
            f"int8 cache {checked[(v, 8)]}"
        )
    main = variants[0]
    records = []
    others = "".join(f" {v} us min / med / max | {main} vs {v} |" for v in variants[1:])
    print(f"| cache | batch | past | {main} us min / med / max |{others} roofline us | of roofline | SDPA us | x SDPA "
          "| verdict |")  # fmt: skip
    print("|---|---|---|---|" + "---|---|" * (len(variants) - 1) + "---|---|---|---|---|")
    fp16_us: dict[tuple[int, int], float] = {}
    for P in pasts:
        for B in batches:
            for bits in (0, 8):
                kv_bytes = 2 * B * Nk * (P + 1) * H * (1 if bits else 2)
                n_sets = n_sets_for(kv_bytes)
                sets = [_inputs(B, P, bits, 10 + i) for i in range(n_sets)]
                timed = {v: _time_variant(sets, bits, v, reps) for v in variants}
                ts, calls = timed[main]
                roof = bl.median(bl.read_roofline([(c[1][1], c[1][2]) for c in calls], reps))
                base: dict[str, float] = {"read-only roofline": roof * 1e6}
                sdpa = None
                if not bits:
                    pairs = zip(sets, calls, strict=True)
                    name, sdpa_ts = _sdpa([(inp["query"], c[1][1], c[1][2]) for inp, c in pairs], reps)
                    sdpa = bl.median(sdpa_ts)
                    base[name] = sdpa * 1e6
                med = bl.median(ts)
                flops = 4 * B * N * (P + 1) * H
                label = f"gqa_decode {'int8' if bits else 'fp16'} cache"
                for v in variants:
                    vts = timed[v][0]
                    vlabel = label if v == main else f"{label} ({v})"
                    rec = BenchRecord(vlabel, (B, 1, P, N, Nk, H), device, kv_bytes, flops,
                                      tuple(t * 1e6 for t in vts), checked[(v, bits)], base)  # fmt: skip
                    records.append(rec)
                of_roof = roof / med
                ok = checked[(main, bits)] == "PASS" and of_roof >= TARGET_ROOFLINE
                if bits:
                    faster = med < fp16_us[(B, P)]
                    ok = ok and faster
                    vs = f"int8 {'faster' if faster else 'NOT faster'} than fp16 ({fp16_us[(B, P)] * 1e6:.1f} us)"
                    sdpa_cols = f"| - | {vs} "
                else:
                    fp16_us[(B, P)] = med
                    assert sdpa is not None
                    ok = ok and sdpa > med
                    sdpa_cols = f"| {sdpa * 1e6:.1f} ({name}) | {sdpa / med:.2f}x "
                other_cols = "".join(
                    f" {_spread(timed[v][0])} | {bl.median(timed[v][0]) / med:.2f}x |" for v in variants[1:]
                )
                print(
                    f"| {'int8' if bits else 'fp16'} | {B} | {P} | {_spread(ts)} |{other_cols} {roof * 1e6:.1f} | "
                    f"{of_roof:.0%} {sdpa_cols}| {'PASS' if ok else 'below target'} |",
                    flush=True,
                )
                del sets, timed, calls
                cupy.get_default_memory_pool().free_all_blocks()
    return records


def main(argv: list[str] | None = None) -> int:
    p = bench_parser("gqa", "batch 1 and 16, past 4k, fewer repeats")
    p.add_argument(
        "--variants",
        default="flash",
        help=f"comma-separated attention kernels timed side by side, the first judged: {', '.join(VARIANTS)} "
        "(e.g. flash,simt: the session-10 mma kernels beside the session-9 SIMT flash ones)",
    )
    a = p.parse_args(argv)
    variants = tuple(v.strip() for v in a.variants.split(",") if v.strip())
    unknown = [v for v in variants if v not in VARIANTS]
    if not variants or unknown:
        p.error(f"--variants: choose from {', '.join(VARIANTS)}, got {a.variants!r}")
    if a.quick:
        return finish(bench((1, 16), (4096,), 20, variants), a.json)
    return finish(bench(variants=variants), a.json)


if __name__ == "__main__":
    raise SystemExit(main())

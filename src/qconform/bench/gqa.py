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

``python -m qconform.bench.gqa [--quick] [--json FILE]``
"""

from __future__ import annotations

from typing import Any

import cupy
import numpy as np

from qconform.bench import baselines as bl
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
    from qconform.device.launch import RECORDING
    from qconform.device.launchers import kernel_of
    from qconform.device.ort.group_query_attention import SOURCE, gqa_decode

    args, attrs = _call(inp, bits)
    out = gqa_decode(*args, **attrs)
    RECORDING.append([])
    try:
        gqa_decode(*args, **attrs, out=out)
    finally:
        launches = RECORDING.pop()
    copy = kernel_of(SOURCE, "qk_gqa_copy_past")
    kept = [launch for launch in launches if launch[0] is not copy]

    def replay() -> None:
        for kernel, grid, threads, shared_mem, kargs in kept:
            kernel(grid, (threads,), kargs, shared_mem=shared_mem)

    return replay, out


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


def bench(batches=BATCHES, pasts=PASTS, reps: int = 50) -> list[BenchRecord]:
    device = device_info().label
    N, Nk, H = HEADS
    checked = {bits: verify(bits) for bits in (0, 8)}
    records = []
    print(f"verdict (the catalogue's sized case, batch 1, past 4096): fp16 cache {checked[0]}; int8 cache {checked[8]}")
    print("| cache | batch | past | us min / med / max | roofline us | of roofline | SDPA us | x SDPA | verdict |")
    print("|---|---|---|---|---|---|---|---|---|")
    fp16_us: dict[tuple[int, int], float] = {}
    for P in pasts:
        for B in batches:
            for bits in (0, 8):
                kv_bytes = 2 * B * Nk * (P + 1) * H * (1 if bits else 2)
                n_sets = n_sets_for(kv_bytes)
                sets = [_inputs(B, P, bits, 10 + i) for i in range(n_sets)]
                calls = [_decode_launches(inp, bits) for inp in sets]
                ts = bl.times(lambda i, c=calls: c[i][0](), n_sets, reps)
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
                rec = BenchRecord(f"gqa_decode {'int8' if bits else 'fp16'} cache", (B, 1, P, N, Nk, H), device,
                                  kv_bytes, flops, tuple(t * 1e6 for t in ts), checked[bits], base)  # fmt: skip
                records.append(rec)
                of_roof = roof / med
                ok = checked[bits] == "PASS" and of_roof >= TARGET_ROOFLINE
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
                print(
                    f"| {'int8' if bits else 'fp16'} | {B} | {P} | {min(ts) * 1e6:.1f} / {med * 1e6:.1f} / "
                    f"{max(ts) * 1e6:.1f} | {roof * 1e6:.1f} | {of_roof:.0%} {sdpa_cols}"
                    f"| {'PASS' if ok else 'below target'} |",
                    flush=True,
                )
                del sets, calls
                cupy.get_default_memory_pool().free_all_blocks()
    return records


def main(argv: list[str] | None = None) -> int:
    a = bench_parser("gqa", "batch 1 and 16, past 4k, fewer repeats").parse_args(argv)
    return finish(bench((1, 16), (4096,), 20) if a.quick else bench(), a.json)


if __name__ == "__main__":
    raise SystemExit(main())

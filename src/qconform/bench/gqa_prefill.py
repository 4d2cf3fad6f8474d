"""GroupQueryAttention prefill on the device against PyTorch SDPA's flash backend, side by side in
one run: a first prompt of 2k / 16k tokens (batch 1, Llama-3-8B's heads: 32 query / 8 KV heads of
128, half-split rotary, fp16), the flash kernel (``qconform.device.ort.gqa_flash``, contract
storage=fp16) timed as the whole call (append with rotary, attention) and as its attention launch
alone, beside ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)`` under
``sdpa_kernel(FLASH_ATTENTION)`` on the same fp16 query and present caches (KV heads repeated
when the backend refuses ``enable_gqa``). TFLOP/s count the causal work, 2 N H S (S + 1) flops
(Q K^T and P V over the keys each row sees). ``--variants`` also times, in the same process, the
session-8 flash kernels (the build ``-DQK_GQA_PREFILL_V1``) and the split-K kernels (the strict
default, ``storage="exact"``; at prompts up to 4096 under ``--quick``).

Target (issue text): the flash attention >= 0.7x SDPA flash in TFLOP/s. The verdict column is the
flash kernel's conformance on the catalogue's sized prefill case (a chunk of 16 tokens over a past
of 1024, the same heads) under storage=fp16, and the kernel-shaped 2 x 32 x 8/1 x 128 first prompt.

``python -m qconform.bench.gqa_prefill [--quick] [--variants] [--json FILE]`` (``--quick``: 2k and 16k,
fewer repeats).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

import cupy
import numpy as np

from qconform.bench import baselines as bl
from qconform.bench.records import BenchRecord, bench_parser, finish
from qconform.device.loader import device_info

HEADS = (32, 8, 128)  # N, Nk, H: Llama-3-8B
PROMPTS = (2048, 16384)
TARGET_SDPA = 0.7
V1 = "-DQK_GQA_PREFILL_V1"  # qconform.device.ort.gqa_flash.V1_OPTION: the session-8 kernels


def _inputs(S: int, seed: int) -> dict[str, Any]:
    """A first prompt of S tokens (batch 1, no past): the catalogue's input names."""
    N, Nk, H = HEADS
    rng = cupy.random.default_rng(seed)
    inp: dict[str, Any] = {
        name: rng.standard_normal((1, S, n * H), dtype=cupy.float32).astype(cupy.float16)
        for name, n in (("query", N), ("key", Nk), ("value", Nk))
    }
    inp["seqlens_k"] = cupy.full(1, S - 1, cupy.int32)
    inp["total_sequence_length"] = np.array([S], np.int32)
    ang = np.arange(S + 1)[:, None] * 10000.0 ** (-np.arange(H // 2) * 2.0 / H)[None, :]
    inp["cos_cache"], inp["sin_cache"] = (cupy.asarray(f(ang).astype(np.float16)) for f in (np.cos, np.sin))
    return inp


def _launches(inp: dict[str, Any], storage: str, v1: bool = False) -> tuple[Any, Any, Any]:
    """(replay of the whole call, replay of its attention launches, outputs); ``v1``: the call was
    built under -DQK_GQA_PREFILL_V1 (the session-8 kernel must run, else the session-10 one)."""
    from qconform.device.launch import record, replay
    from qconform.device.ort.gqa_flash import SOURCE, gqa_prefill
    from qconform.device.ort.group_query_attention import SOURCE as SPLITK
    from qconform.ops.ort.attention_bounds import INPUTS

    N, Nk, _ = HEADS
    args, attrs = tuple(inp.get(name) for name in INPUTS), {"num_heads": N, "kv_num_heads": Nk, "do_rotary": 1}
    out = gqa_prefill(*args, **attrs, storage=storage)
    launches, _ = record(gqa_prefill, *args, **attrs, out=out, storage=storage)
    from qconform.device.launchers import kernel_of

    appends = (kernel_of(SPLITK, "qk_gqa_append"), kernel_of(SPLITK, "qk_gqa_append8"))
    attention = [launch for launch in launches if all(launch.kernel is not a for a in appends)]
    flash = "qk_gqa_prefill_h128" if v1 else "qk_gqa_prefill2_h128"
    assert storage != "fp16" or any(launch.kernel is kernel_of(SOURCE, flash) for launch in attention)
    return functools.partial(replay, launches), functools.partial(replay, attention), out


def _sdpa(sets: list[tuple[Any, Any, Any]], reps: int) -> tuple[str, list[float]]:
    """SDPA's flash backend, causal, on the fp16 query (B, N, S, H) and present caches."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    N, Nk, H = HEADS
    views = [
        tuple(torch.as_tensor(a, device="cuda") for a in (q.reshape(1, -1, N, H).swapaxes(1, 2).copy(), k, v))
        for q, k, v in sets
    ]
    with torch.no_grad(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        try:
            F.scaled_dot_product_attention(*views[0], is_causal=True, enable_gqa=True)
            name, fn = (
                "SDPA flash enable_gqa",
                lambda i: F.scaled_dot_product_attention(*views[i], is_causal=True, enable_gqa=True),
            )
        except RuntimeError:
            views = [(q, k.repeat_interleave(N // Nk, 1), v.repeat_interleave(N // Nk, 1)) for q, k, v in views]
            name, fn = "SDPA flash repeated KV", lambda i: F.scaled_dot_product_attention(*views[i], is_causal=True)
        ts = bl.times(fn, len(views), reps)
    torch.cuda.synchronize()
    return name, ts


def verify() -> str:
    """The flash kernel under storage=fp16 on the catalogue's sized prefill case and a kernel-shaped one."""
    from qconform.contracts import parse_contract
    from qconform.device.ort.gqa_flash import gqa_prefill
    from qconform.ops import get_op
    from qconform.properties.checks import Prepared

    op = get_op("gqa_prefill")
    leaf = "Xfp16_Wfp16_Yfp16"
    impl = SimpleNamespace(contract=parse_contract("storage=fp16"), ftz=True)
    cases = [op.sized_case(leaf, 1024, 1), *(c for c in op.cases(leaf, 2) if c.seed == 401)]
    for case in cases:
        prepared = Prepared.from_case(op, case, impl)  # type: ignore[arg-type]
        args, kwargs = op.call_args({k: cupy.asarray(v) for k, v in prepared.inputs.items()}, prepared.params)
        got = tuple(cupy.asnumpy(a) for a in gqa_prefill(*args, **kwargs, storage="fp16"))
        c = prepared.verify(op, got)
        if not c.ok:
            return f"FAIL {case.id}: {c.detail}"
    return "PASS"


def bench(prompts=PROMPTS, reps: int = 10, variants: bool = False, splitk_max: int = 1 << 30) -> list[BenchRecord]:
    """The table; ``variants``: the session-8 flash build and the split-K kernels (at prompts up to
    ``splitk_max``) beside the default, each flash build checked on the catalogue's cases."""
    from qconform.device.launchers import compile_options

    device = device_info().label
    N, Nk, H = HEADS
    builds = [("flash (storage=fp16)", "fp16", ())]
    if variants:
        builds += [("flash V1 (storage=fp16)", "fp16", (V1,)), ("split-K (strict)", "exact", ())]
    verdicts = {}
    for label, _, opts in builds[:2]:
        with compile_options(*opts):
            verdicts[label] = verify()
        print(f"verdict of {label} (the catalogue's sized prefill case and a 2x32 first prompt): {verdicts[label]}")
    checked = verdicts[builds[0][0]]
    print("| kernel | prompt | call us min / med / max | attention us min / med / max | TFLOP/s | SDPA flash us "
          "| SDPA TFLOP/s | x SDPA | verdict |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    records = []
    for S in prompts:
        flops = 2 * N * H * S * (S + 1)
        sets = [_inputs(S, 10 + i) for i in range(2)]
        sdpa_name, sdpa_ts = None, None
        for label, storage, opts in builds:
            if storage == "exact" and S > splitk_max:
                continue
            with compile_options(*opts):
                calls = [_launches(inp, storage, bool(opts)) for inp in sets]
            n = reps if storage == "fp16" or S <= 4096 else 1
            whole = bl.times(lambda i, c=calls: c[i][0](), len(sets), n, batches=3)
            att = bl.times(lambda i, c=calls: c[i][1](), len(sets), n, batches=3)
            if sdpa_ts is None:
                sdpa_name, sdpa_ts = _sdpa(
                    [(inp["query"], c[2][1], c[2][2]) for inp, c in zip(sets, calls, strict=True)], reps
                )
            med, sdpa = bl.median(att), bl.median(sdpa_ts)
            ratio = sdpa / med
            checked = verdicts.get(label, verdicts[builds[0][0]])
            ok = checked == "PASS" and (storage != "fp16" or ratio >= TARGET_SDPA)
            records.append(BenchRecord(f"gqa_prefill {label}", (1, S, 0, N, Nk, H), device, 0, flops,
                                       tuple(t * 1e6 for t in att), checked, {str(sdpa_name): sdpa * 1e6}))  # fmt: skip
            print(
                f"| {label} | {S} | {min(whole) * 1e6:.0f} / {bl.median(whole) * 1e6:.0f} / {max(whole) * 1e6:.0f} "
                f"| {min(att) * 1e6:.0f} / {med * 1e6:.0f} / {max(att) * 1e6:.0f} | {flops / med / 1e12:.1f} "
                f"| {sdpa * 1e6:.0f} ({sdpa_name}) | {flops / sdpa / 1e12:.1f} | {ratio:.2f}x "
                f"| {'PASS' if ok else 'below target' if checked == 'PASS' else 'FAIL'} |",
                flush=True,
            )
            del calls
        del sets
        cupy.get_default_memory_pool().free_all_blocks()
    return records


def main(argv: list[str] | None = None) -> int:
    p = bench_parser("gqa_prefill", "fewer repeats, split-K at 2k only")
    p.add_argument("--variants", action="store_true", help="also time the session-8 flash build and split-K")
    a = p.parse_args(argv)
    records = bench(PROMPTS, 5, a.variants, 4096) if a.quick else bench(variants=a.variants)
    return finish(records, a.json)


if __name__ == "__main__":
    raise SystemExit(main())

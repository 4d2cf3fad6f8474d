"""QMoE decode (``qmoe_decode``, kernels ``ort/qmoe.hip``) on the device against its baselines, side by
side in one run: per layer shape, one token per call with cold weights (call i routes the token to
experts i*k .. i*k + k - 1 mod E, so consecutive calls read other experts; the rotation covers
every expert, several times the L2), the kernel's time spread (min / median / max over batches;
routing, fc1 + SwiGLU and fc2 + the expert sum included) beside the read-only roofline of the k
selected experts' bytes (weights, scales and biases read once) and a PyTorch baseline (the same
experts dequantized once to fp16 outside the timing, then per expert fp16 matmuls, SwiGLU and the
weighted sum; timed eager and as one CUDA graph a call, the ratio against the faster), and whether
the kernel's output on the first set is within the catalogue's bound (``qconform.ops.ort.qmoe``,
strict contract). Targets (issue text): >= 70% of the roofline and
faster than the PyTorch baseline. PyTorch is imported here only; without it the column says so.

``python -m qconform.bench.qmoe [--quick] [--json FILE] [--variants decode,decode_simt,decode_fc2v,decode_v1,legacy]``
``python -m qconform.bench.qmoe --prefill [--variants grouped,grouped_v1,per_token]``: qmoe_ragged_mm at
512 and 4096 tokens under storage=fp16 (the grouped GEMMs) against a PyTorch prefill (``bench_prefill``);
``grouped_v1`` (round 1's tile loop, ``-DQK_MOE_GEMM_V1``) must give the same output bits as ``grouped``.
(``--variants``: the decode path, its fc1 or fc2 on the SIMT kernels (``decode_simt``, ``decode_fc2v``),
its session-8 kernels ``-DQK_MOE_DECODE_V1`` and the legacy kernels ``-DQK_MOE_LEGACY``, timed side by
side on the same cold rotation, each output checked against the bound)
"""

from __future__ import annotations

import time
from typing import Any

import cupy
import numpy as np

from qconform.bench import baselines as bl
from qconform.bench.agreement import check_agreement
from qconform.bench.baselines import STREAM_ORDER
from qconform.bench.records import BenchRecord, bench_parser, finish
from qconform.device.loader import device_info

# (name, H, I, E, k, block_size, swiglu attributes): gpt-oss-20b's layer and Qwen3-30B-A3B's
SHAPES = (
    ("gpt-oss-20b", 2880, 2880, 32, 4, 32, "oss"),
    ("Qwen3-30B-A3B", 2048, 768, 128, 8, 128, "plain"),
)
BITS = 4
TARGET_ROOFLINE = 0.7


def _layer(H: int, inter: int, E: int, bs: int, seed: int) -> dict[str, Any]:
    """Random 4-bit experts on the device (every byte uniform: two uniform codes), fp16 scales
    near 2 / (16 sqrt(K)) (unit-size activations), fp16 biases; fc1 interleaves gate and linear."""
    rng = cupy.random.default_rng(seed)
    d: dict[str, Any] = {}
    for name, n, k in (("fc1", 2 * inter, H), ("fc2", H, inter)):
        d[f"{name}_experts_weights"] = rng.integers(0, 256, (E, n, k * BITS // 8), dtype=cupy.uint8)
        s = (rng.random((E, n, k // bs), dtype=cupy.float32) + 0.5) * (2.0 / (16 * np.sqrt(k)))
        d[f"{name}_scales"] = s.astype(cupy.float16)
        d[f"{name}_experts_bias"] = (rng.standard_normal((E, n), dtype=cupy.float32) * 0.1).astype(cupy.float16)
    d["input"] = rng.standard_normal((1, H), dtype=cupy.float32).astype(cupy.float16)
    return d


def _logits(E: int, k: int, call: int) -> Any:
    """One token's logits selecting experts call*k .. call*k + k - 1 (mod E), 6 above the rest."""
    rng = np.random.default_rng(500 + call)
    row = rng.standard_normal(E)
    row[(call * k + np.arange(k)) % E] += 6.0
    return cupy.asarray(row[None].astype(np.float16))


def _experts(E: int, k: int, call: int) -> list[int]:
    return [int(e) for e in (call * k + np.arange(k)) % E]


def _dequantized(layer: dict[str, Any], name: str, e: int, bs: int) -> Any:
    """fp16 W[e] (N, K) = fp16((q - 8) * s), the default zero point, as cupy."""
    w = layer[f"{name}_experts_weights"][e]
    q = cupy.stack([w & 15, w >> 4], axis=-1).reshape(w.shape[0], -1).astype(cupy.float32) - 8.0
    s = layer[f"{name}_scales"][e].astype(cupy.float32)
    return (q.reshape(q.shape[0], -1, bs) * s[:, :, None]).reshape(q.shape).astype(cupy.float16)


def _selected(layer: dict[str, Any], E: int, k: int, call: int) -> tuple[Any, ...]:
    """The roofline's buffers of a call: its k experts' fc1 and fc2 weights (consecutive experts, E
    a multiple of k) and a buffer of their scales' and biases' bytes."""
    lo = (call * k) % E
    sl = slice(lo, lo + k)
    small = sum(layer[f"{n}_{p}"][sl].nbytes for n in ("fc1", "fc2") for p in ("scales", "experts_bias"))
    return layer["fc1_experts_weights"][sl], layer["fc2_experts_weights"][sl], cupy.empty(small, cupy.uint8)


def _torch_baselines(layer, sets, E, k, bs, attrs, reps) -> dict[str, list[float]]:
    """The PyTorch call of each set (its k experts' fp16 matmuls, SwiGLU and weighted sum; the experts
    dequantized once, outside the timing) timed two ways: eager, a dozen launches an expert queued by
    Python (the host's launch rate can bound it), and as a user would serve a decode step, each set's
    call captured once into a CUDA graph (``torch.cuda.graph``; one graph per set, its experts being
    fixed) and replayed, one launch a call. Empty without PyTorch."""
    try:
        import torch
    except ImportError:
        return {}
    t = torch.from_dlpack
    alpha, beta, limit = attrs["activation_alpha"], attrs["activation_beta"], attrs["swiglu_limit"]
    deq = {}
    for e in range(E):  # dequantized once, outside the timing
        deq[e] = tuple(t(_dequantized(layer, n, e, bs)) for n in ("fc1", "fc2"))
    b1, b2 = t(layer["fc1_experts_bias"]), t(layer["fc2_experts_bias"])
    x = t(layer["input"])
    logits = [t(s) for s in sets]

    def call(i: int) -> Any:
        top = torch.topk(logits[i].float(), k, dim=-1)
        w = torch.softmax(top.values, dim=-1).half()
        out = torch.zeros_like(x)
        for j, e in enumerate(_experts(E, k, i)):
            W1, W2 = deq[e]
            h = x @ W1.T + b1[e]
            g, lin = h[:, 0::2], h[:, 1::2]
            if limit is not None:
                g, lin = g.clamp(max=limit), lin.clamp(-limit, limit)
            y = (g * torch.sigmoid(alpha * g) * (lin + beta)) @ W2.T + b2[e]
            out += w[:, j : j + 1] * y
        return out

    timed = {"PyTorch fp16 eager": bl.times(call, len(sets), reps)}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture (cuBLAS handles and workspaces)
        for i in range(len(sets)):
            call(i)
    torch.cuda.current_stream().wait_stream(side)
    graphs, outs = [], []
    for i in range(len(sets)):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=graphs[0].pool() if graphs else None):
            outs.append(call(i))
        graphs.append(g)
    got, want = [], []  # the replays against the eager calls (cuBLAS may pick another kernel in a capture)
    for i in range(len(sets)):
        graphs[i].replay()
        got.append(outs[i].cpu().numpy())
        want.append(call(i).cpu().numpy())
    print(check_agreement(got, want, "PyTorch's CUDA-graph replays against its eager calls"))
    timed["PyTorch fp16 CUDA graph"] = bl.times(lambda i: graphs[i].replay(), len(sets), reps)
    return timed


def _within_bound(layer: dict[str, Any], logits: Any, params: dict[str, Any], y: Any) -> str:
    from qconform.contracts import STRICT
    from qconform.ops.ort.qmoe import qmoe_numerics
    from qconform.properties.bounds import check_bound

    inputs = {name: cupy.asnumpy(v) for name, v in layer.items()}
    inputs["router_probs"] = cupy.asnumpy(logits)
    got = cupy.asnumpy(y)
    for ex in qmoe_numerics(inputs, params, STRICT, True):
        r = check_bound(got, ex.want, ex.model, STRICT, True, str)
        if r.ok:
            return "PASS"
        detail = r.detail
    return f"FAIL: {detail}"


VARIANTS = {  # name -> build options (qconform.device.ort.qmoe)
    "decode": (),
    "decode_simt": ("-DQK_MOE_FC1_SIMT",),  # fc1 of the fp16 input on qk_moe_fc1v (session 9), not qk_moe_fc1m
    "decode_fc2v": ("-DQK_MOE_FC2_SIMT",),  # fc2 of an fp16 layer on qk_moe_fc2v (session 9), not qk_moe_fc2m
    "decode_v1": ("-DQK_MOE_DECODE_V1",),
    "bias_at_end": ("-DQK_MOE_BIAS_AT_END",),  # fc1m / fc2m reading their biases after the sums (before session 52)
    "legacy": ("-DQK_MOE_LEGACY",),
    STREAM_ORDER: (),  # the default build with every launch in stream order (fc2m not a dependent of fc1m)
}


def bind_calls(layer, sets, params, H, variant) -> tuple[list[Any], Any]:
    """One bound decode call per set of router logits (``qconform.device.launchers.bound``: its launches
    replayed) in ``variant``'s build (VARIANTS), all writing the returned output buffer."""
    from qconform.device.launchers import bound, compile_options
    from qconform.device.ort import qmoe_decode
    from qconform.ops.ort.qmoe import qmoe_call

    y = cupy.empty((1, H), cupy.float16)
    calls = []
    with compile_options(*VARIANTS[variant]):
        for logits in sets:
            args, kw = qmoe_call({**layer, "router_probs": logits}, params)
            calls.append(bound(qmoe_decode, *args, **kw, out=y))
    return calls, y


def _time_variant(layer, sets, params, H, variant, reps) -> tuple[list[float], float, str, Any]:
    """The launcher's kernels built and launched as ``variant`` says (VARIANTS; ``stream_order``: every
    launch in stream order): seconds per call over the cold rotation, the
    host's seconds to queue one call (the timing is the device's only while this is shorter),
    whether its output on the first set is within the catalogue's bound, and that output."""
    calls, y = bind_calls(layer, sets, params, H, variant)
    with bl.launch_order(variant):
        ts = bl.times(lambda i, c=calls: c[i](), len(calls), reps)
    cupy.cuda.get_current_stream().synchronize()
    t0 = time.perf_counter()
    for i in range(reps):  # the host's time to queue a call's launches (the spin hides it if shorter)
        calls[i % len(calls)]()
    host = (time.perf_counter() - t0) / reps
    cupy.cuda.get_current_stream().synchronize()
    calls[0]()
    return ts, host, _within_bound(layer, sets[0], params, y), y.copy()


def bench(shapes=SHAPES, reps: int = 50, n_calls: int | None = None, variants=("decode",)) -> list[BenchRecord]:
    from qconform.ops.ort.qmoe import attributes

    device = device_info().label
    records = []
    print(
        "| layer | variant | H / I / E / k | us min / med / max | host us | roofline us | of roofline "
        "| PyTorch us (median) | x PyTorch (the faster) | within bound | verdict |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, H, inter, E, k, bs, swiglu in shapes:
        layer = _layer(H, inter, E, bs, 11)
        params = {"act": "fp16", "bits": BITS, "k": k, "bs": bs, "bias": True, "swiglu": swiglu}
        attrs = attributes(params)
        calls_n = n_calls or E // k * 2  # every expert twice
        sets = [_logits(E, k, i) for i in range(calls_n)]
        timed = {v: _time_variant(layer, sets, params, H, v, reps) for v in variants}

        roof_sets = [_selected(layer, E, k, i) for i in range(calls_n)]
        roof = bl.median(bl.read_roofline(roof_sets, reps))
        nbytes = sum(b.nbytes for b in roof_sets[0])
        del roof_sets
        torch_times = _torch_baselines(layer, sets, E, k, bs, attrs, reps)
        # the faster of PyTorch's two ways is the baseline a user would get
        base_name = min(torch_times, key=lambda n: bl.median(torch_times[n])) if torch_times else None
        base = torch_times[base_name] if base_name else None
        base_us = (
            ", ".join(f"{n.removeprefix('PyTorch fp16 ')} {bl.median(v) * 1e6:.1f}" for n, v in torch_times.items())
            if torch_times
            else "PyTorch not installed"
        )
        ref = timed["decode"][3].view(cupy.uint16) if "decode" in timed else None
        same = [
            v for v in timed if v != "decode" and ref is not None and bool((timed[v][3].view(cupy.uint16) == ref).all())
        ]
        if len(timed) > 1:  # decode_v1 keeps every operation and its order: its output bits are decode's
            print(f"{name}: output on the first set bit-identical to decode's: {', '.join(same) or 'none'}")
        for variant, (ts, host, verdict, _) in timed.items():
            med = bl.median(ts)
            baselines = {"read-only roofline": roof * 1e6}
            baselines.update({n: bl.median(v) * 1e6 for n, v in torch_times.items()})
            us = tuple(t * 1e6 for t in ts)
            label = f"qmoe_decode {name}" + ("" if variant == "decode" else f" [{variant}]")
            flops = 6 * k * H * inter
            records.append(BenchRecord(label, (1, H, inter, E, k), device, nbytes, flops, us, verdict, baselines))
            of_roof = roof / med
            x_base = bl.median(base) / med if base is not None else float("nan")
            ok = verdict == "PASS" and of_roof >= TARGET_ROOFLINE and (base is None or x_base > 1.0)
            print(
                f"| {name} | {variant} | {H} / {inter} / {E} / {k} "
                f"| {min(ts) * 1e6:.1f} / {med * 1e6:.1f} / {max(ts) * 1e6:.1f} | {host * 1e6:.1f} "
                f"| {roof * 1e6:.1f} | {of_roof:.0%} | {base_us} | {x_base:.2f}x | {verdict} "
                f"| {'PASS' if ok else 'below target'} |",
                flush=True,
            )
    return records


# ------------------------------------------------------------------------------------------ prefill

PREFILL_TOKENS = (512, 4096)
PREFILL_VARIANTS = {  # name -> build options of qmoe_ragged_mm under storage=fp16 (qconform.device.ort.qmoe)
    "grouped": (),
    "grouped_v1": ("-DQK_MOE_GEMM_V1",),  # session 10 round 1's tile loop (qmoe_gemm_v1.h): the same bits
    "per_token": ("-DQK_MOE_RAGGED_V1",),  # the decode kernels, each token on its own (timed at <= 512 tokens)
}
PER_TOKEN_MAX = 512
RELL2_VS_TORCH = 5e-3  # module docstring of bench_prefill


def _prefill_logits(T: int, E: int, seed: int) -> Any:
    """(T, E) fp16 logits, each row a random permutation of 0, 0.05, ..., 0.05 (E - 1): distinct
    values (fp16's spacing is below 0.05 up to 32), so no tie rule enters, and every expert gets
    about T k / E pairs."""
    rng = np.random.default_rng(seed)
    rows = np.stack([rng.permutation(E) for _ in range(T)]) * 0.05
    return cupy.asarray(rows.astype(np.float16))


def _torch_prefill(layer, logits, E, k, bs, attrs, reps) -> tuple[str, list[float] | None, Any]:
    """The PyTorch baseline of a prefill: the experts dequantized to fp16 once (outside the timing),
    then per call top-k and the softmax of the k logits, the pairs grouped by expert (a stable
    argsort, one bincount read back), per expert fp16 matmuls over its tokens (index_select), the
    SwiGLU, and index_add_ of the weighted rows. Returns (name, seconds per call, its output)."""
    try:
        import torch
    except ImportError:
        return "PyTorch not installed", None, None
    t = torch.from_dlpack
    alpha, beta, limit = attrs["activation_alpha"], attrs["activation_beta"], attrs["swiglu_limit"]
    deq = [tuple(t(_dequantized(layer, n, e, bs)) for n in ("fc1", "fc2")) for e in range(E)]
    b1, b2 = t(layer["fc1_experts_bias"]), t(layer["fc2_experts_bias"])
    x, lg = t(layer["input"]), t(logits)
    out = torch.empty_like(x)

    def call(_: int) -> None:
        top = torch.topk(lg.float(), k, dim=-1)
        w = torch.softmax(top.values, dim=-1).half().reshape(-1)
        flat = top.indices.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=E).tolist()
        out.zero_()
        start = 0
        for e, c in enumerate(counts):
            if c == 0:
                continue
            idx = order[start : start + c]
            start += c
            tok = idx // k
            W1, W2 = deq[e]
            h = x.index_select(0, tok) @ W1.T + b1[e]
            g, lin = h[:, 0::2], h[:, 1::2]
            if limit is not None:
                g, lin = g.clamp(max=limit), lin.clamp(-limit, limit)
            y = (g * torch.sigmoid(alpha * g) * (lin + beta)) @ W2.T + b2[e]
            out.index_add_(0, tok, y * w[idx, None])

    ts = bl.times(call, 1, reps, batches=3)
    call(0)
    return "PyTorch fp16", ts, cupy.from_dlpack(out).astype(cupy.float32)


def _rel_l2(a: Any, b: Any) -> float:
    a, b = a.astype(cupy.float64), b.astype(cupy.float64)
    return float(cupy.linalg.norm(a - b) / max(float(cupy.linalg.norm(b)), 1e-300))


def bench_prefill(shapes=SHAPES, tokens=PREFILL_TOKENS, reps: int = 10, variants=("grouped",)) -> list[BenchRecord]:
    """qmoe_ragged_mm under storage=fp16 (the grouped GEMMs; ``per_token``: the decode kernels per
    token, at <= 512 tokens) against the PyTorch baseline (``_torch_prefill``) in the same run. The
    weights (every expert of the layer: 300-400 MB, several times the L2) are read cold on every
    call. Verdict: relL2 of the output against PyTorch's <= 5e-3: both hold the fc inputs in fp16;
    PyTorch also rounds the dequantized weights, h, y and its sums to fp16 (2^-11 relative each,
    a relL2 of a few 1e-4 from each rounding), so 5e-3 is ten times what the roundings explain
    and far below a wrong block, tile or expert (relL2 of order 1)."""
    from qconform.device.launchers import bound, compile_options
    from qconform.device.ort import qmoe_ragged_mm
    from qconform.ops.ort.qmoe import attributes, qmoe_call

    device = device_info().label
    records = []
    print(
        "| layer | tokens | variant | us min / med / max | TFLOP/s | PyTorch us min / med | x PyTorch "
        "| relL2 vs PyTorch | verdict |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, H, inter, E, k, bs, swiglu in shapes:
        layer = _layer(H, inter, E, bs, 11)
        params = {"act": "fp16", "bits": BITS, "k": k, "bs": bs, "bias": True, "swiglu": swiglu}
        attrs = attributes(params)
        for T in tokens:
            rng = cupy.random.default_rng(100 + T)
            layer["input"] = rng.standard_normal((T, H), dtype=cupy.float32).astype(cupy.float16)
            logits = _prefill_logits(T, E, 200 + T)
            base_name, base, ref = _torch_prefill(layer, logits, E, k, bs, attrs, reps)
            flops = 6 * T * k * H * inter
            grouped_y = None  # the first grouped variant's output: the others must match it bit for bit
            for variant in variants:
                if variant == "per_token" and T > PER_TOKEN_MAX:
                    continue
                y = cupy.empty((T, H), cupy.float16)
                with compile_options(*PREFILL_VARIANTS[variant]):
                    args, kw = qmoe_call({**layer, "router_probs": logits}, params)
                    call = bound(qmoe_ragged_mm, *args, **kw, storage="fp16", out=y)
                ts = bl.times(lambda _i, c=call: c(), 1, reps, batches=3)
                call()
                med = bl.median(ts)
                rel = _rel_l2(y, ref) if ref is not None else float("nan")
                verdict = "PASS" if ref is None or rel <= RELL2_VS_TORCH else "FAIL"
                if variant.startswith("grouped"):
                    if grouped_y is None:
                        grouped_y = y
                    elif not bool((y.view(cupy.uint16) == grouped_y.view(cupy.uint16)).all()):
                        verdict = "FAIL (bits differ from the first grouped variant)"
                baselines = {base_name: bl.median(base) * 1e6} if base is not None else {}
                us = tuple(t_ * 1e6 for t_ in ts)
                label = f"qmoe_ragged_mm {name}" + ("" if variant == "grouped" else f" [{variant}]")
                records.append(BenchRecord(label, (T, H, inter, E, k), device, 0, flops, us, verdict, baselines))
                base_us = f"{min(base) * 1e6:.0f} / {bl.median(base) * 1e6:.0f}" if base is not None else base_name
                x_base = bl.median(base) / med if base is not None else float("nan")
                print(
                    f"| {name} | {T} | {variant} | {min(ts) * 1e6:.0f} / {med * 1e6:.0f} / {max(ts) * 1e6:.0f} "
                    f"| {flops / med / 1e12:.1f} | {base_us} | {x_base:.2f}x | {rel:.2e} | {verdict} |",
                    flush=True,
                )
            del ref, grouped_y
    return records


def main(argv: list[str] | None = None) -> int:
    p = bench_parser("qmoe", "the first shape, fewer repeats")
    p.add_argument(
        "--variants",
        default="decode",
        help=f"comma-separated kernel builds timed side by side in one run: {', '.join(VARIANTS)} (default decode)",
    )
    p.add_argument(
        "--prefill",
        action="store_true",
        help="qmoe_ragged_mm at 512 and 4096 tokens under storage=fp16 against PyTorch "
        f"(--variants: {', '.join(PREFILL_VARIANTS)}; default grouped)",
    )
    a = p.parse_args(argv)
    known = PREFILL_VARIANTS if a.prefill else VARIANTS
    variants = tuple(v for v in a.variants.split(",") if v)
    if a.prefill and a.variants == "decode":
        variants = ("grouped",)
    unknown = [v for v in variants if v not in known]
    if unknown:
        p.error(f"--variants: unknown {unknown}; known: {', '.join(known)}")
    if a.prefill:
        shapes, tokens = (SHAPES[:1], PREFILL_TOKENS[:1]) if a.quick else (SHAPES, PREFILL_TOKENS)
        return finish(bench_prefill(shapes, tokens, 10, variants), a.json)
    shapes, reps = (SHAPES[:1], 20) if a.quick else (SHAPES, 50)
    return finish(bench(shapes, reps, variants=variants), a.json)


if __name__ == "__main__":
    raise SystemExit(main())

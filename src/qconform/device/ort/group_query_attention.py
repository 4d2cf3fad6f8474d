"""Launcher of GroupQueryAttention (kernels ``ort/gqa.hip``) with the oracle's call shape on CuPy
arrays, for gqa_decode and gqa_prefill: present caches bit-identical to
``qconform.oracles.ort.group_query_attention`` (precision "reference"), the output within the
strict contract's bound (fp32 scores, softmax and P V; ``qconform.ops.ort.attention_bounds``).

Three steps on the current stream: ``qk_gqa_append`` (rotary of the new Q and K, the new K / V
rows into present, quantized for an int8 / 4-bit cache), ``qk_gqa_copy_past`` (present rows
[0, past_b) from the past; skipped when present is the past buffer), ``qk_gqa_attend_*`` (one CTA
per query row, split of the keys, KV head and block of its query heads) and ``qk_gqa_combine``
(the splits merged in split order). The number of splits is a function of the shape alone.
Declined: output_qk, precision other than "reference", head_size > 8 warps' lanes.
"""

from __future__ import annotations

from typing import Any

import cupy
import numpy as np

from qconform.device.abi import bind_call
from qconform.device.launch import check_aligned
from qconform.device.launchers import launch, launch_grid
from qconform.device.loader import device_info
from qconform.errors import Declined
from qconform.ops import OpSpec
from qconform.ops.ort.group_query_attention import GQA_DECODE, GQA_PREFILL

SOURCE = "ort/gqa.hip"
THREADS = 128  # QK_GQA_THREADS
HEADS = 8  # QK_GQA_HEADS: query heads of one KV head per attention CTA
CACHE_KINDS = {(0, "float32"): "f32", (0, "float16"): "f16", (8, ""): "i8", (4, ""): "u4"}
TARGET_CTAS = 1024  # the splits bring a decode launch to about this many CTAs
MAX_CHUNK = 1024  # keys of one split (its scores are held in shared memory)
KEY_ALIGN = 32  # a split's keys start at a multiple of this


def splits_for(rows: int, total: int) -> tuple[int, int]:
    """(keys per split, splits) for ``rows`` CTAs per split and ``total`` keys: a function of the
    shape alone (never of timing), about TARGET_CTAS CTAs, at most MAX_CHUNK keys a split."""
    want = min(max(1, -(-TARGET_CTAS // rows)), -(-total // KEY_ALIGN))
    per_split = -(-total // want)
    chunk = min(MAX_CHUNK, -(-per_split // KEY_ALIGN) * KEY_ALIGN)
    return chunk, -(-total // chunk)


def attend_symbol(bits: int, dtype: Any, head_size: int, warp: int) -> str:
    """The attention kernel for the cache type and head size (SLOTS lanes' worth of channels)."""
    kind = CACHE_KINDS[(bits, np.dtype(dtype).name if bits == 0 else "")]
    for slots in (2, 4, 8):
        if head_size <= slots * warp:
            return f"qk_gqa_attend_{kind}_s{slots}"
    raise Declined(f"query: head_size {head_size} over {8 * warp} (8 lanes' channels of a {warp}-lane warp)")


def _run(op: OpSpec, args: tuple, kwargs: dict[str, Any], out: Any) -> Any:
    call = bind_call(op, args, kwargs, out)
    sc = call.bound.scalars
    (q, k, v, past_k, past_v, seqlens, cos, sin, pid, bias, sink, k_scale, v_scale, output, pres_k, pres_v) = (
        call.pointers
    )
    for name, a in (("past_key", past_k), ("past_value", past_v), ("out", pres_k), ("out", pres_v)):
        check_aligned(name, a, 4)  # the past rows are copied as 32-bit words
    sink_mode = 1 if sink is not None else (2 if sc["smooth_softmax"] == 1 else 0)
    null = np.uint64(0)
    optional = (k, v, cos, sin, bias, sink, k_scale, v_scale)
    k, v, cos, sin, bias, sink, k_scale, v_scale = (null if a is None else a for a in optional)
    pid_stride = 0 if pid is None else int(pid.shape[1])
    pid = null if pid is None else pid
    B, S, N, Nk, H = (int(sc[n]) for n in ("batch", "sequence_length", "num_heads", "kv_num_heads", "head_size"))
    P, T, Tp = (int(sc[n]) for n in ("past_sequence_length", "total_sequence_length", "present_sequence_length"))
    bits, first, is16 = int(sc["kv_cache_bit_width"]), int(sc["first_prompt"]), int(sc["dtype"] == 1)
    warp = device_info().warp_size
    symbol = attend_symbol(bits, np.float16 if is16 else np.float32, H, warp)
    G = N // Nk
    head_blocks = -(-G // HEADS)
    chunk, splits = splits_for(B * S * Nk * head_blocks, T)
    scale = float(sc["scale"])
    alpha = np.float32(scale) if scale != 0 else np.float32(1) / np.sqrt(np.float32(H), dtype=np.float32)
    i64, i32 = np.int64, np.int32

    qrot = cupy.empty(B * S * N * H, cupy.float32)
    per_channel = i32(sc["kv_quant"] == 2)
    append = (q, k, v, seqlens, cos, sin, pid, k_scale, v_scale, qrot, pres_k, pres_v)
    sizes = (i64(B), i64(S), i64(N), i64(Nk), i64(H), i64(Tp), i64(pid_stride))
    flags = (i32(first), i32(sc["packed_qkv"]), i32(sc["rotary_dim"]), i32(sc["rotary_interleaved"]), i32(bits))
    append_args = (*append, *sizes, *flags, per_channel, i32(is16))
    launch(op.name, SOURCE, "qk_gqa_append", B * S * (N + 2 * Nk) * (H // 2), append_args)
    if P and not first:
        words = pres_k.nbytes // (B * Nk * Tp * 4)
        for past, pres in ((past_k, pres_k), (past_v, pres_v)):
            if past.data.ptr != pres.data.ptr:
                copy = (past, pres, seqlens, i64(B), i64(Nk), i64(P), i64(Tp), i64(S), i64(words))
                launch(op.name, SOURCE, "qk_gqa_copy_past", B * Nk * P * words, copy)

    nw = THREADS // warp
    smem = 4 * (HEADS * H + 2 * HEADS + max(HEADS * chunk, nw * HEADS * H))
    part_m = cupy.empty(B * S * N * splits, cupy.float32)
    part_l = cupy.empty(B * S * N * splits, cupy.float32)
    part_acc = cupy.empty(B * S * N * splits * H, cupy.float32)
    attend = (qrot, pres_k, pres_v, seqlens, bias, k_scale, v_scale, part_m, part_l, part_acc)
    dims = (i64(S), i64(N), i64(Nk), i64(H), i64(Tp), i64(T))
    opts = (i32(first), i32(sc["local_window_size"]), i32(sc["bias_batch"]), i32(sc["bias_heads"]), per_channel)
    floats = (i32(is16), alpha, np.float32(sc["softcap"]), i32(chunk), i32(splits))
    grid = (B * S * splits, Nk * head_blocks)
    launch_grid(op.name, SOURCE, symbol, grid, THREADS, (*attend, *dims, *opts, *floats), smem)
    combine = (part_m, part_l, part_acc, sink, output, i64(B * S * N), i64(N), i64(H), i32(splits), i32(sink_mode))
    launch(op.name, SOURCE, "qk_gqa_combine", B * S * N * H, (*combine, i32(is16)))
    return call.out


def _entry(op: OpSpec) -> Any:
    def group_query_attention(*args: Any, out: Any = None, **kwargs: Any) -> Any:
        """The oracle's call (``qconform.oracles.ort.group_query_attention``) on CuPy arrays;
        ``out``: (output, present_key, present_value) buffers. Returns that tuple."""
        return _run(op, args, kwargs, out)

    group_query_attention.__name__ = op.name
    return group_query_attention


gqa_decode = _entry(GQA_DECODE)
gqa_prefill = _entry(GQA_PREFILL)

"""Launcher of GroupQueryAttention (kernels ``ort/gqa.hip``) with the oracle's call shape on CuPy
arrays, for gqa_decode and gqa_prefill: present caches bit-identical to
``qconform.oracles.ort.group_query_attention`` (precision "reference"), the output within the
strict contract's bound (fp32 scores, softmax and P V; ``qconform.ops.ort.attention_bounds``).

Steps on the current stream: ``qk_gqa_append8`` (rotary of the new Q and K, the new K / V rows
into present, quantized for an int8 / 4-bit cache; folded into the mma kernels below for a decode),
``qk_gqa_copy_past`` (present rows
[0, past_b) from the past; skipped when present is the past buffer), ``qk_gqa_flash_*`` (one CTA
per query row, split of the keys, KV head and block of 4 of its query heads: each K / V row read
once for the block, 16-byte loads, the (key, head) dots of a tile reduce-scattered over the lane
group so that each lane finishes its own, an online softmax per lane group; about one wave of
CTAs) and ``qk_gqa_combine``
(one CTA per output row and 16 channels: every split's partial loaded at once, then merged
in split order). The number of splits is a function
of the shape alone.
With fp16 queries and an fp16 or int8 per-tensor cache of head size 16, 32, 64 or 128 (present
16-byte aligned) the attention runs on the matrix units instead (``qk_gqa_mma_*``: one CTA per
query row, split and KV head with up to 8 of its query heads, tiles of 16 keys a 32-lane group,
scores and P V by mma.m16n8k16, P split into fp16 hi + lo halves), and a decode (S = 1) is one
launch before the combine: its CTAs rotate their query heads and the CTA whose split holds the new
key writes the new K / V rows (``qk_gqa_mma_append``, qk_gqa_append's arithmetic);
``-DQK_GQA_APPEND_LAUNCH`` launches qk_gqa_append8 first instead, ``-DQK_GQA_APPEND_V1`` session 10's
qk_gqa_append (the bench's ``s10`` variant). Up to FOLD_MAX_SPLITS splits the combine is folded in
too (``fold_combine``): the CTA that completes a block of splits (a ticket per block, ``tickets``)
combines it with qk_gqa_combine's arithmetic in split order (``qk_gqa_mma_combine``; bit-identical;
measured faster at batch 16, not at batch 1's 33 splits: docs/perf-notes.md);
``-DQK_GQA_COMBINE_FOLD`` / ``-DQK_GQA_COMBINE_LAUNCH`` fold it / launch it whatever the splits;
``-DQK_GQA_DECODE_SIMT`` keeps
the SIMT flash kernels there (the bench's ``simt`` variant). Elsewhere the rows are appended by
qk_gqa_append8 (a thread per 8 channels; qk_gqa_append where H % 8 != 0).
Built with ``-DQK_GQA_LEGACY`` (``qconform.device.launchers.compile_options``) the session-7
attention kernels ``qk_gqa_attend_*`` run instead, with ``-DQK_GQA_FLASH_V1`` the session-8 flash
kernels (``gqa_flash_v1.h``, their splits) and the new combine (the bench's side-by-side timing).
Declined: output_qk, precision other than "reference", head_size > 8 warps' lanes.
"""

from __future__ import annotations

from typing import Any

import cupy
import numpy as np

from qconform.device import launchers
from qconform.device.abi import bind_call
from qconform.device.launch import check_aligned
from qconform.device.launchers import launch, launch_grid
from qconform.device.loader import device_info
from qconform.errors import Declined
from qconform.ops import OpSpec
from qconform.ops.ort.group_query_attention import GQA_DECODE, GQA_PREFILL

SOURCE = "ort/gqa.hip"
LEGACY = "-DQK_GQA_LEGACY"  # the build option selecting the session-7 attention kernels
FLASH_V1 = "-DQK_GQA_FLASH_V1"  # the build option selecting the session-8 flash kernels (gqa_flash_v1.h)
I8T_U8 = "-DQK_GQA_I8T_U8"  # int8 per-tensor flash kernels with tiles of 8 keys a lane group
DECODE_SIMT = "-DQK_GQA_DECODE_SIMT"  # the session-9 SIMT flash kernels where the mma ones would run
COMBINE_FOLD = "-DQK_GQA_COMBINE_FOLD"  # the mma kernels' last CTA of a block combines it, whatever the splits
COMBINE_LAUNCH = "-DQK_GQA_COMBINE_LAUNCH"  # qk_gqa_combine launched after the mma kernels, whatever the splits
FOLD_MAX_SPLITS = 16  # the mma kernels fold the combine up to this many splits (measured: docs/perf-notes.md)
APPEND_V1 = "-DQK_GQA_APPEND_V1"  # decode's rows by qk_gqa_append (a thread a channel pair; before session 11)
APPEND_LAUNCH = "-DQK_GQA_APPEND_LAUNCH"  # decode's rows by a qk_gqa_append8 launch, not by the mma kernels
APPEND_THREADS = 256  # qk_gqa_append8's __launch_bounds__
MMA_HEADS = (16, 32, 64, 128)  # head sizes of the qk_gqa_mma_* kernels
MMA_TILE = 64  # keys an mma CTA takes at once: QK_GQA_MG groups x QK_GQA_MK keys
MMA_HB = 8  # QK_GQA_MH: query heads of one KV head per mma CTA
MMA_RESIDENT = {"f16": {128: 2}, "i8t": {}}  # CTAs per SM (__launch_bounds__) where not 3
THREADS = 128  # QK_GQA_THREADS
HB = 4  # QK_GQA_HB: query heads of one KV head per flash CTA
# flash kernels: cache kind -> (32-bit words a lane loads per row, keys a lane group loads per tile,
# CTAs resident per SM: QK_GQA_FLASH_MIN_CTAS)
FLASH = {
    "f32": (8, 2, 3),
    "f16": (4, 4, 4),
    "i8t": (2, 4, 4),
    "i8c": (2, 4, 4),
    "u4t": (1, 8, 4),
    "u4c": (1, 4, 4),
}
FLASH_V1_TILES = {"f32": 2, "f16": 4, "i8t": 8, "i8c": 4, "u4t": 8, "u4c": 4}  # session 8: 3 CTAs per SM
FLASH_SMS = 132  # an H200's SMs: the splits bring a launch to about one wave (a constant: splits from the shape)
FLASH_CTAS = 384  # session 8 (-DQK_GQA_FLASH_V1): the splits bring a launch to about this many CTAs
MAX_SPLITS = 512  # QK_GQA_MAX_SPLITS: the most splits qk_gqa_combine takes (flash_splits gives no more)
COMBINE_CHANNELS = 16  # QK_GQA_CC: channels of a combine CTA (its dynamic shared memory: splits x 16 floats)
HEADS = 8  # legacy QK_GQA_HEADS
CACHE_KINDS = {(0, "float32"): "f32", (0, "float16"): "f16", (8, ""): "i8", (4, ""): "u4"}
TARGET_CTAS = 1024  # legacy: the splits bring a decode launch to about this many CTAs
MAX_CHUNK = 1024  # legacy: keys of one split (its scores are held in shared memory)
KEY_ALIGN = 32  # legacy: a split's keys start at a multiple of this


def splits_for(rows: int, total: int) -> tuple[int, int]:
    """Legacy kernels: (keys per split, splits) for ``rows`` CTAs per split and ``total`` keys: a
    function of the shape alone (never of timing), about TARGET_CTAS CTAs, at most MAX_CHUNK keys."""
    want = min(max(1, -(-TARGET_CTAS // rows)), -(-total // KEY_ALIGN))
    per_split = -(-total // want)
    chunk = min(MAX_CHUNK, -(-per_split // KEY_ALIGN) * KEY_ALIGN)
    return chunk, -(-total // chunk)


def attend_symbol(bits: int, dtype: Any, head_size: int, warp: int) -> str:
    """Legacy: the attention kernel for the cache type and head size (SLOTS lanes' worth of channels)."""
    kind = CACHE_KINDS[(bits, np.dtype(dtype).name if bits == 0 else "")]
    for slots in (2, 4, 8):
        if head_size <= slots * warp:
            return f"qk_gqa_attend_{kind}_s{slots}"
    raise Declined(f"query: head_size {head_size} over {8 * warp} (8 lanes' channels of a {warp}-lane warp)")


def lane_group(head_size: int) -> int:
    """R: the lanes of a flash lane group (one key row, 8 channels a lane), a power of two."""
    r = 1
    while 8 * r < head_size:
        r *= 2
    return r


def flash_kind(bits: int, dtype: Any, per_channel: bool) -> str:
    """The flash kernels' cache kind: f32 / f16, or i8 / u4 with per-tensor (t) or per-channel (c) scales."""
    if bits == 0:
        return CACHE_KINDS[(0, np.dtype(dtype).name)]
    return f"{'i8' if bits == 8 else 'u4'}{'c' if per_channel else 't'}"


def flash_splits_v1(ctas_per_split: int, total: int, tile: int) -> tuple[int, int]:
    """Session 8 (-DQK_GQA_FLASH_V1): (keys per split, splits) for ``ctas_per_split`` CTAs per
    split, ``total`` keys and ``tile`` keys a CTA loads at once: about FLASH_CTAS CTAs, each split
    a whole number of tiles."""
    want = min(max(1, -(-FLASH_CTAS // ctas_per_split)), -(-total // tile))
    per_split = -(-total // want)
    chunk = -(-per_split // tile) * tile
    return chunk, -(-total // chunk)


def flash_splits(ctas_per_split: int, total: int, tile: int, resident: int) -> tuple[int, int]:
    """(keys per split, splits) of the flash kernels for ``ctas_per_split`` CTAs per split,
    ``total`` keys, ``tile`` keys a CTA loads at once and ``resident`` CTAs per SM: a function of
    the shape alone, at most one wave of FLASH_SMS x resident CTAs (and MAX_SPLITS splits), the
    tiles dealt out evenly, each split a whole number of them."""
    tiles = -(-total // tile)
    want = min(max(1, FLASH_SMS * resident // ctas_per_split), tiles, MAX_SPLITS)
    chunk = -(-tiles // want) * tile
    return chunk, -(-total // chunk)


def flash_tile(kind: str, head_size: int) -> tuple[int, int, int]:
    """(words, keys a CTA loads at once, CTAs per SM) of the current build's flash kernel for a cache kind."""
    words, u, resident = FLASH[kind]
    if FLASH_V1 in launchers.OPTIONS:
        return words, THREADS // lane_group(head_size) * FLASH_V1_TILES[kind], 3
    if kind == "i8t" and I8T_U8 in launchers.OPTIONS:
        u, resident = 8, 3
    return words, THREADS // max(16, lane_group(head_size)) * u, resident


def new_rows(call: Any, sc: dict[str, Any]) -> tuple:
    """The new rows' inputs as the kernels take them: query, key, value, cos, sin and position_ids
    (null where absent), position_ids' row stride, packed_qkv, rotary_dim, rotary_interleaved."""
    (q, k, v, _, _, _, cos, sin, pid, *_) = call.pointers
    null = np.uint64(0)
    k, v, cos, sin = (null if a is None else a for a in (k, v, cos, sin))
    pid_stride = np.int64(0 if pid is None else int(pid.shape[1]))
    pid = null if pid is None else pid
    flags = (sc["packed_qkv"], sc["rotary_dim"], sc["rotary_interleaved"])
    return (q, k, v, cos, sin, pid, pid_stride, *(np.int32(f) for f in flags))


def append(op: OpSpec, call: Any, sc: dict[str, Any], pairs: bool, rows: bool = True) -> Any:
    """The new rows: qk_gqa_append8 (8 channels a thread, a CTA row per token; H % 8 == 0) or, with
    ``pairs``, qk_gqa_append (a thread per pair of channels: the same outputs bit for bit), then
    qk_gqa_copy_past where present is not the past buffer; returns the rotated queries (fp32, (B, S, N, H)).
    ``rows`` False: the copy only (the attention kernel appends; no rotated queries: null)."""
    (_, _, _, past_k, past_v, seqlens, _, _, _, _, _, k_scale, v_scale, _, pres_k, pres_v) = call.pointers
    null = np.uint64(0)
    q, k, v, cos, sin, pid, pid_stride, packed, rotary_dim, interleaved = new_rows(call, sc)
    k_scale, v_scale = (null if a is None else a for a in (k_scale, v_scale))
    B, S, N, Nk, H = (int(sc[n]) for n in ("batch", "sequence_length", "num_heads", "kv_num_heads", "head_size"))
    P, Tp = int(sc["past_sequence_length"]), int(sc["present_sequence_length"])
    bits, first, is16 = int(sc["kv_cache_bit_width"]), int(sc["first_prompt"]), int(sc["dtype"] == 1)
    i64, i32 = np.int64, np.int32
    qrot = cupy.empty(B * S * N * H, cupy.float32) if rows else null
    ptrs = (q, k, v, seqlens, cos, sin, pid, k_scale, v_scale, qrot, pres_k, pres_v)
    sizes = (i64(B), i64(S), i64(N), i64(Nk), i64(H), i64(Tp), pid_stride)
    flags = (i32(first), packed, rotary_dim, interleaved, i32(bits))
    args = (*ptrs, *sizes, *flags, i32(sc["kv_quant"] == 2), i32(is16))
    if rows and pairs:
        launch(op.name, SOURCE, "qk_gqa_append", B * S * (N + 2 * Nk) * (H // 2), args)
    elif rows and B * S:
        grid = (B * S, -(-(N + 2 * Nk) * (H // 8) // APPEND_THREADS), 1)
        launch_grid(op.name, SOURCE, "qk_gqa_append8", grid, APPEND_THREADS, args)
    if P and not first:
        words = pres_k.nbytes // (B * Nk * Tp * 4)
        for past, pres in ((past_k, pres_k), (past_v, pres_v)):
            if past.data.ptr != pres.data.ptr:
                copy = (past, pres, seqlens, i64(B), i64(Nk), i64(P), i64(Tp), i64(S), i64(words))
                launch(op.name, SOURCE, "qk_gqa_copy_past", B * Nk * P * words, copy)
    return qrot


def fold_combine(splits: int) -> bool:
    """Whether the mma kernels combine the splits themselves (the CTA completing a block of splits,
    ``qk_gqa_mma_combine``) rather than a qk_gqa_combine launch after them: up to FOLD_MAX_SPLITS
    splits (a function of the shape alone), or as the build options ask."""
    if COMBINE_FOLD in launchers.OPTIONS or COMBINE_LAUNCH in launchers.OPTIONS:
        return COMBINE_FOLD in launchers.OPTIONS
    return splits <= FOLD_MAX_SPLITS


def mma_kind(kind: str, is16: bool, head_size: int, aligned: bool) -> str | None:
    """The qk_gqa_mma_* kernel's cache kind when it takes the call (fp16 queries, an fp16 or int8
    per-tensor cache, a head size of MMA_HEADS, present buffers 16-byte aligned, the default
    build), else None: the SIMT flash kernels."""
    if not is16 or kind not in MMA_RESIDENT or head_size not in MMA_HEADS or not aligned:
        return None
    if any(o in launchers.OPTIONS for o in (DECODE_SIMT, FLASH_V1, LEGACY)):
        return None
    return kind


def _run(op: OpSpec, args: tuple, kwargs: dict[str, Any], out: Any) -> Any:
    call = bind_call(op, args, kwargs, out)
    sc = call.bound.scalars
    (_, _, _, past_k, past_v, seqlens, _, _, _, bias, sink, k_scale, v_scale, output, pres_k, pres_v) = call.pointers
    for name, a in (("past_key", past_k), ("past_value", past_v), ("out", pres_k), ("out", pres_v)):
        check_aligned(name, a, 4)  # the past rows are copied as 32-bit words
    sink_mode = 1 if sink is not None else (2 if sc["smooth_softmax"] == 1 else 0)
    null = np.uint64(0)
    bias, sink, k_scale, v_scale = (null if a is None else a for a in (bias, sink, k_scale, v_scale))
    B, S, N, Nk, H = (int(sc[n]) for n in ("batch", "sequence_length", "num_heads", "kv_num_heads", "head_size"))
    T, Tp = int(sc["total_sequence_length"]), int(sc["present_sequence_length"])
    bits, first, is16 = int(sc["kv_cache_bit_width"]), int(sc["first_prompt"]), int(sc["dtype"] == 1)
    warp = device_info().warp_size
    dtype = np.float16 if is16 else np.float32
    if lane_group(H) > warp:
        raise Declined(f"query: head_size {H} over {8 * warp} (8 lanes' channels of a {warp}-lane warp)")
    G = N // Nk
    scale = float(sc["scale"])
    alpha = np.float32(scale) if scale != 0 else np.float32(1) / np.sqrt(np.float32(H), dtype=np.float32)
    i64, i32 = np.int64, np.int32

    per_channel = i32(sc["kv_quant"] == 2)
    dims = (i64(S), i64(N), i64(Nk), i64(H), i64(Tp), i64(T))
    opts = (i32(first), i32(sc["local_window_size"]), i32(sc["bias_batch"]), i32(sc["bias_heads"]))
    softcap = np.float32(sc["softcap"])
    mma = None
    if LEGACY in launchers.OPTIONS:
        head_blocks = -(-G // HEADS)
        chunk, splits = splits_for(B * S * Nk * head_blocks, T)
        nw = THREADS // warp
        smem = 4 * (HEADS * H + 2 * HEADS + max(HEADS * chunk, nw * HEADS * H))
        symbol = attend_symbol(bits, dtype, H, warp)
        tail: tuple = (per_channel, i32(is16), alpha, softcap, i32(chunk), i32(splits))
    else:
        kind = flash_kind(bits, dtype, bool(per_channel))
        aligned16 = pres_k.data.ptr % 16 == 0 and pres_v.data.ptr % 16 == 0
        mma = mma_kind(kind, bool(is16), H, aligned16)
        if mma is not None:
            head_blocks = -(-G // MMA_HB)
            chunk, splits = flash_splits(B * S * Nk * head_blocks, T, MMA_TILE, MMA_RESIDENT[mma].get(H, 3))
            symbol = f"qk_gqa_mma_{mma}_h{H}"
        else:
            head_blocks = -(-G // HB)
            words, tile, resident = flash_tile(kind, H)
            align = min(16, 4 * words)
            wide = words > 1 and pres_k.data.ptr % align == 0 and pres_v.data.ptr % align == 0
            if FLASH_V1 in launchers.OPTIONS:
                chunk, splits = flash_splits_v1(B * S * Nk * head_blocks, T, tile)
            else:
                chunk, splits = flash_splits(B * S * Nk * head_blocks, T, tile, resident)
            symbol = f"qk_gqa_flash_{kind}_{'wide' if wide else 'words'}"
        assert splits <= MAX_SPLITS
        smem = 0
        tail = (i32(is16), alpha, softcap, i32(chunk), i32(splits))
    # decode on the mma kernels: the new rows appended by the attention's CTAs (qk_gqa_mma_append)
    fold_rows = mma is not None and S == 1 and not any(o in launchers.OPTIONS for o in (APPEND_V1, APPEND_LAUNCH))
    old_append = H % 8 != 0 or any(o in launchers.OPTIONS for o in (APPEND_V1, LEGACY, FLASH_V1))
    qrot = append(op, call, sc, old_append, rows=not fold_rows)
    part_m = cupy.empty(B * S * N * splits, cupy.float32)
    part_l = cupy.empty(B * S * N * splits, cupy.float32)
    part_acc = cupy.empty(B * S * N * splits * H, cupy.float32)
    grid = (B * S * splits, Nk * head_blocks)
    args = (qrot, pres_k, pres_v, seqlens, bias, k_scale, v_scale, part_m, part_l, part_acc, *dims, *opts, *tail)
    if mma is not None:
        folded = fold_combine(splits)
        ticket = launchers.tickets(B * S * grid[1], launchers.kernel_of(SOURCE, symbol)) if folded else null
        rows = new_rows(call, sc) if fold_rows else (null,) * 6 + (np.int64(0),) + (i32(0),) * 3
        fold = (sink, output, ticket, i32(sink_mode), *rows)
        launch_grid(op.name, SOURCE, symbol, grid, THREADS, (*args, *fold), smem)
        if folded:  # the last CTA of each block combined it (qk_gqa_mma_combine)
            return call.out
    else:
        launch_grid(op.name, SOURCE, symbol, grid, THREADS, args, smem)
    combine = (part_m, part_l, part_acc, sink, output, i64(B * S * N), i64(N), i64(H), i32(splits), i32(sink_mode))
    if LEGACY in launchers.OPTIONS:
        launch(op.name, SOURCE, "qk_gqa_combine_legacy", B * S * N * H, (*combine, i32(is16)))
    else:
        chunks = -(-H // COMBINE_CHANNELS)
        smem = 4 * splits * COMBINE_CHANNELS
        grid = B * S * N * chunks  # a dependent of the attention kernel: waits for its partials
        launch_grid(op.name, SOURCE, "qk_gqa_combine", grid, THREADS, (*combine, i32(is16)), smem, dependent=True)
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

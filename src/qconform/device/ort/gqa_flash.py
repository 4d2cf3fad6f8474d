"""GroupQueryAttention prefill through the flash kernel (``ort/gqa_flash.hip``), the oracle's call
shape on CuPy arrays: present caches bit-identical to ``qconform.oracles.ort.group_query_attention``
(``qk_gqa_append`` / ``qk_gqa_copy_past`` of ``ort/gqa.hip``, unchanged), then a tiled online-softmax
attention on the matrix units with Q, K, V and P held in fp16 (the oracle's precision "kernel").

That rounding is what the contract ``storage=fp16`` declares (``qconform.ops.ort.attention_bounds``:
the strict bound has no room for fp16 operands), so ``storage`` picks the kernel: "fp16" runs the
flash kernel where the case fits it (head_size 16, 32, 64 or 128, present buffers 16-byte aligned),
anything else (and every strict call) the split-K kernels of
``qconform.device.ort.group_query_attention``, which meet the stricter bound too. A ``cupy``
implementation passes its contract's ``storage`` (``qconform.impls.device``).

Steps of the flash path on the current stream: the append (``qk_gqa_append8``: the split-K
path's ``qk_gqa_append`` outputs, 8 channels a thread; and the past's copy, as the split-K path
does), for an fp32 / int8 / 4-bit cache ``qk_gqa_prefill_scratch`` (rows [0, total_b) to fp16,
dequantized as the oracle does), then the attention:

- ``qk_gqa_prefill2_h<H>`` (session 10, the default; FlashAttention-2's forward pass, Dao 2023):
  head_size 64 or 128 without softcap or attention_bias and with a positive scale. One CTA of 256
  threads per (128 / hpc query rows of each of hpc query heads of one KV head, hpc = 4, 2 or 1 as
  the group num_heads / kv_num_heads divides), batch entry, in a 1-D order over (row block, head
  block) that ``row_chunk`` picks (longest row blocks first); exponent base 2 with the scale folded in
  (a rounding inside the storage=fp16 bound: the kernel's comment and docs/perf-notes.md "Session 10").
- ``qk_gqa_prefill_h<H>`` (session 8): every other case the flash path takes (head_size 16 or 32,
  softcap, an attention_bias, a negative scale), one CTA of 128 threads per (64 query rows, query
  head, batch entry). Built with ``-DQK_GQA_PREFILL_V1`` (``qconform.device.launchers.compile_options``)
  the source holds these kernels only and they take every case (the bench's old variant).
"""

from __future__ import annotations

import functools
from typing import Any

import cupy
import numpy as np

from qconform.device import launchers
from qconform.device.abi import bind_call
from qconform.device.launch import check_aligned
from qconform.device.launchers import launch, launch_grid
from qconform.device.ort import group_query_attention as splitk
from qconform.ops import OpSpec
from qconform.ops.ort.group_query_attention import GQA_PREFILL

SOURCE = "ort/gqa_flash.hip"
THREADS = 128  # QK_FL_THREADS
BLOCK_M = 64  # QK_FL_BM: query rows of a CTA
HEAD_SIZES = (16, 32, 64, 128)  # qk_gqa_prefill_h<H>
V1_OPTION = "-DQK_GQA_PREFILL_V1"  # the build holding the session-8 kernels only
THREADS2 = 256  # QK_FL2_THREADS
ROWS2 = 128  # QK_FL2_ROWS: query rows of a qk_gqa_prefill2 CTA, over its heads
HEAD_SIZES2 = (64, 128)  # qk_gqa_prefill2_h<H>
CHUNK: int | None = None  # tests: force qk_gqa_prefill2's band of row blocks (else row_chunk's pick)
SCRATCH_KIND = {(0, "float32"): 0, (8, ""): 2, (4, ""): 3}  # qk_gqa_prefill_scratch's kind; fp16: none


def fits(head_size: int, buffers: tuple[Any, ...]) -> bool:
    """The flash kernel takes the case: a head size it is built for, every present buffer 16-byte
    aligned (asynchronous 16-byte copies of cache rows)."""
    return head_size in HEAD_SIZES and all(b.data.ptr % 16 == 0 for b in buffers)


def heads_per_cta(num_heads: int, kv_num_heads: int) -> int:
    """Query heads of one qk_gqa_prefill2 CTA (128 / that many rows each, the K / V tiles loaded
    once for all of them): 4, 2 or 1, the largest that divides the group of a KV head."""
    group = num_heads // kv_num_heads
    return next(h for h in (4, 2, 1) if group % h == 0)


@functools.cache
def l2_bytes() -> int:
    """The current device's L2 cache size in bytes."""
    return int(cupy.cuda.Device().attributes["L2CacheSize"])


def row_chunk(row_blocks: int, kv_bytes: int, l2: int) -> int:
    """qk_gqa_prefill2's launch order: row blocks of one band (the kernel's comment). 1 (the
    longest row blocks of every head first: the short ones fill the tail) where the K / V rows of
    every KV head of a batch entry, ``kv_bytes``, take at most half of the L2 (``l2`` bytes), all
    of them (one head block after another, its K / V hot in L2) where they do not."""
    return 1 if 2 * kv_bytes <= l2 else row_blocks


def uses_v2(head_size: int, softcap: float, has_bias: bool, alpha: float) -> bool:
    """qk_gqa_prefill2_h<H> takes the case (else qk_gqa_prefill_h<H>): head_size 64 or 128, no
    softcap, no attention_bias, a positive scale (the max of the raw scores is the max of the
    scaled ones), and the default build (not ``-DQK_GQA_PREFILL_V1``)."""
    return (
        V1_OPTION not in launchers.OPTIONS and head_size in HEAD_SIZES2 and softcap == 0 and not has_bias and alpha > 0
    )


def _append(op: OpSpec, call: Any, sc: dict[str, Any]) -> Any:
    """qk_gqa_append8 (qk_gqa_append's outputs bit for bit, 8 channels a thread; qk_gqa_append
    itself under -DQK_GQA_PREFILL_V1) and qk_gqa_copy_past as the split-K path runs them
    (``qconform.device.ort.group_query_attention.append``); returns the rotated queries (fp32, (B, S, N, H))."""
    return splitk.append(op, call, sc, V1_OPTION in launchers.OPTIONS)


def _run(op: OpSpec, args: tuple, kwargs: dict[str, Any], out: Any, storage: str) -> Any:
    call = bind_call(op, args, kwargs, out)
    sc = call.bound.scalars
    B, S, N, Nk, H = (int(sc[n]) for n in ("batch", "sequence_length", "num_heads", "kv_num_heads", "head_size"))
    pres_k, pres_v = call.pointers[-2:]
    if storage != "fp16" or not fits(H, (pres_k, pres_v)):
        return splitk.gqa_prefill(*args, **kwargs, out=call.out)
    for name, a in (("past_key", call.pointers[3]), ("past_value", call.pointers[4]), ("out", pres_k)):
        check_aligned(name, a, 4)  # the past rows are copied as 32-bit words
    seqlens, bias, sink, output = call.pointers[5], call.pointers[9], call.pointers[10], call.pointers[13]
    k_scale = call.pointers[11]
    T, Tp = int(sc["total_sequence_length"]), int(sc["present_sequence_length"])
    bits, is16 = int(sc["kv_cache_bit_width"]), int(sc["dtype"] == 1)
    qrot = _append(op, call, sc)

    i64, i32 = np.int64, np.int32
    kind = SCRATCH_KIND.get((bits, "" if bits else "float16" if is16 else "float32"))
    kc, vc, rows = pres_k, pres_v, Tp
    if kind is not None:  # fp32 / quantized cache: rows [0, total_b) as fp16 scratch (B, Nk, T, H)
        rows = T
        kc, vc = (cupy.empty(B * Nk * T * H, cupy.float16) for _ in range(2))
        v_scale = call.pointers[12]
        for src, dst, scale in ((pres_k, kc, k_scale), (pres_v, vc, v_scale)):
            scr = (src, dst, seqlens, np.uint64(0) if scale is None else scale, i64(B), i64(Nk), i64(Tp), i64(T))
            launch(op.name, SOURCE, "qk_gqa_prefill_scratch", B * Nk * T * H,
                   (*scr, i64(H), i32(kind), i32(sc["kv_quant"] == 2)))  # fmt: skip
    sink_mode = 1 if sink is not None else (2 if sc["smooth_softmax"] == 1 else 0)
    null = np.uint64(0)
    scale = float(sc["scale"])
    alpha = np.float32(scale) if scale != 0 else np.float32(1) / np.sqrt(np.float32(H), dtype=np.float32)
    softcap = np.float32(sc["softcap"])
    if uses_v2(H, float(softcap), bias is not None, float(alpha)):
        hpc = heads_per_cta(N, Nk)
        ptrs = (qrot, kc, vc, i64(rows), seqlens, null if sink is None else sink, output)
        dims = (i32(S), i32(N), i32(Nk), i32(sc["first_prompt"]), i32(sc["local_window_size"]))
        row_blocks = -(-S // (ROWS2 // hpc))
        chunk = row_chunk(row_blocks, 2 * Nk * T * H * 2, l2_bytes()) if CHUNK is None else min(CHUNK, row_blocks)
        grid = (row_blocks * (N // hpc), 1, B)
        args2 = (*ptrs, *dims, i32(sink_mode), i32(is16), alpha, i32(hpc), i32(chunk))
        launch_grid(op.name, SOURCE, f"qk_gqa_prefill2_h{H}", grid, THREADS2, args2)
        return call.out
    dims = (i32(S), i32(N), i32(Nk), i64(T), i32(sc["first_prompt"]), i32(sc["local_window_size"]))
    opts = (i32(sc["bias_batch"]), i32(sc["bias_heads"]), i32(sink_mode), i32(is16), alpha, softcap)
    ptrs = (qrot, kc, vc, i64(rows), seqlens, null if bias is None else bias, null if sink is None else sink, output)
    grid = (-(-S // BLOCK_M), N, B)
    launch_grid(op.name, SOURCE, f"qk_gqa_prefill_h{H}", grid, THREADS, (*ptrs, *dims, *opts))
    return call.out


def _entry(op: OpSpec) -> Any:
    def group_query_attention(*args: Any, out: Any = None, storage: str = "exact", **kwargs: Any) -> Any:
        """The oracle's call (``qconform.oracles.ort.group_query_attention``) on CuPy arrays;
        ``out``: (output, present_key, present_value) buffers; ``storage``: the contract's ("fp16":
        the flash kernel where it fits). Returns that tuple."""
        return _run(op, args, kwargs, out, storage)

    group_query_attention.__name__ = op.name
    return group_query_attention


gqa_prefill = _entry(GQA_PREFILL)

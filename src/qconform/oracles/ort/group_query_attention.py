"""com.microsoft.GroupQueryAttention as ONNX Runtime's CPU provider computes it (x86).

Sources: docs/ort-ops.md section 4 and microsoft/onnxruntime
onnxruntime/contrib_ops/cpu/bert/group_query_attention.cc (``Compute``: rotary, position ids,
quantized-cache and seqlens checks), group_query_attention_helper.h (``CheckInputs``,
``CheckCustomAttentionInputs``), gqa_attention_base.h (``ComputeAttentionProbs``,
``ComputeVxAttentionScore``, ``ConcatStateChunkGQA``, the quantized paths), attention_helper.h
(softcap, softmax); rotary in ``rotary.py``, the int8/4-bit cache in ``kv_cache.py``.

Semantics (B batch, S new tokens, N query heads, Nk KV heads, H head size, P past rows,
T = total_sequence_length):
- phase: S > 1 and S != T is a subsequent prompt (B must be 1); else S == T is the first prompt;
  else S must be 1 (decode). total_b = seqlens_k[b] + 1; past_b = 0 on the first prompt (the
  past is ignored even when given), else total_b - S. T is P + S (a growing cache) or <= P (a
  fixed-size cache), as ORT 1.32's ``CheckInputs`` demands; the oracle also requires
  total_b <= T (T is the batch's maximum) and past_b <= P.
- present (B, Nk, max(T, P), H): rows [0, past_b) copied from the past, rows [past_b, past_b + S)
  the new K (after rotary) / V; every later row zero (separate buffers) or the past's row
  (``shared_buffer``: present is the past buffer, left untouched). ``defined_present_rows``.
- query s of batch b attends to keys j in [lo, L): L = min(past_b + s + 1, total_b) (a padded
  first-prompt row s >= total_b sees [0, total_b)); lo = L - W when local_window_size = W >= 1
  and L > W (W keys including its own), else 0. Query head n reads KV head n // (N / Nk).
  Padded rows are padding (``defined_output_rows``): with a window, ORT's fp32 flash path (no
  softcap, sink or output_qk; ORT_GQA_DISABLE_FLASH_ATTENTION unset) starts their window at
  s + 1 - W instead; the oracle gives the other CPU path's [L - W, L).
- x_j = scale * q.k_j (scale 0: 1/sqrt(H)); softcap c > 0: x_j = c * tanh(x_j / c); then
  x_j += attention_bias[b|0, n|0, s, j]; softmax over [lo, L) with a sink logit sigma =
  head_sink[n] (else 0 with smooth_softmax = 1; the CPU takes head_sink when both are given,
  CUDA refuses the pair) added to the denominator:
  p_j = exp(x_j - m) / (sum exp(x_j - m) + exp(sigma - m)), m = max(x, sigma).
- output (B, S, N*H) = sum_j p_j v_j; output_qk (B, N, S, T): 1 = x after softcap and bias,
  2 = p; every masked column is 0.
- quantized caches (k_quant_type = v_quant_type, kv_cache_bit_width 8 or 4): the new K is
  quantized after rotary, attention reads the dequantized cache (``kv_cache.py``).

Rounding, ``precision``:
- "reference" (ORT's CPU rounding points): fp16 inputs are converted to fp32; rotary rounds as
  ``rotary.py`` says (fp16: to fp16, that value stored and used); every dot product (q.k, p.v,
  the sum of the exponentials) is evaluated in float64 and rounded once to fp32; each elementwise
  step (scale, softcap's divide / tanh / multiply, bias add, x - m, exp, p = e / sum) rounds to
  fp32; the output rounds once to T. ORT accumulates its GEMMs in fp32 in an MLAS-defined order and
  uses MLAS's exp and tanh approximations, so only the caches are bit-exact; outputs need a
  tolerance (tests/test_upstream_ort_gqa.py derives it).
- "float64": the accuracy twin. Every step in float64 from the given inputs (no rotary rounding;
  quantized caches still quantize, by true division). Output and output_qk float64; present
  caches in their storage type.
- "kernel": a flash kernel's rounding points. Q, K, V scratch rounded to fp16 after rotary (and
  after dequantization); s = fp32(fp32(q.k) * scale) with q.k exact then rounded to fp32;
  softcap and bias as "reference"; online softmax over key blocks of ``KERNEL_KV_BLOCK`` keys
  aligned at key 0, state (m, l, acc) in fp32, the sink (if any) as the initial state
  (m = sigma, l = 1, acc = 0); per block m' = max(m, max s), alpha = fp32(exp(fp32(m - m'))),
  p = fp32(exp(fp32(s - m'))), l = fp32(fp32(l * alpha) + fp32(sum p)),
  acc = fp32(fp32(acc * alpha) + fp32(fp16(p) . v)); output fp16(fp32(acc / l)), returned in T.
  Present caches as "reference"; no output_qk.

Not modelled (the oracle has no argument for them): causal = 0, sliding_window_cache = 1, ORT
1.32's query_seqlens input and key/value of length 0 (shared KV), q/k_norm_weight (the CPU
refuses them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qconform.errors import ArgumentError
from qconform.oracles.ort._out import check_out
from qconform.oracles.ort.kv_cache import (
    QUANT_TYPES,
    cache_dtype,
    dequantize_kv,
    expand_kv_scale,
    quantize_kv,
    stored_head_size,
)
from qconform.oracles.ort.rotary import apply_rotary, rotary_positions

PRECISIONS = ("reference", "float64", "kernel")
FLOAT_TYPES = (np.dtype(np.float32), np.dtype(np.float16))
KERNEL_KV_BLOCK = 64


@dataclass(frozen=True)
class GQALayout:
    """Sizes and the phase of one GroupQueryAttention call."""

    batch: int
    sequence_length: int
    num_heads: int
    kv_num_heads: int
    head_size: int
    past_sequence_length: int
    total_sequence_length: int
    present_sequence_length: int
    first_prompt: bool
    packed: bool
    dtype: np.dtype
    rotary_dim: int
    bit_width: int
    total_lengths: tuple[int, ...]
    past_lengths: tuple[int, ...]

    @property
    def cache_dtype(self) -> np.dtype:
        return self.dtype if self.bit_width == 0 else cache_dtype(self.bit_width)

    @property
    def cache_head_size(self) -> int:
        return stored_head_size(self.head_size, self.bit_width) if self.bit_width else self.head_size


def _int(name: str, v: object, lo: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise ArgumentError(f"{name}: must be an integer, got {v!r}")
    if lo is not None and v < lo:
        raise ArgumentError(f"{name}: must be >= {lo}, got {v}")
    return int(v)


def _flag(name: str, v: object) -> bool:
    if v not in (0, 1):
        raise ArgumentError(f"{name}: must be 0 or 1, got {v!r}")
    return bool(v)


def _float_attr(name: str, v: object, nonneg: bool) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)) or not np.isfinite(v):
        raise ArgumentError(f"{name}: must be a finite number, got {v!r}")
    if nonneg and v < 0:
        raise ArgumentError(f"{name}: must be >= 0 (0 = off), got {v}")
    return float(np.float32(v))


def _array(name: str, a: object, dtypes: tuple[np.dtype, ...], ndim: int) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise ArgumentError(f"{name}: must be a numpy.ndarray, got {type(a).__name__}")
    if a.dtype not in dtypes:
        raise ArgumentError(f"{name}: dtype must be {' or '.join(str(d) for d in dtypes)}, got {a.dtype}")
    if a.ndim != ndim:
        raise ArgumentError(f"{name}: must have {ndim} dimensions, got shape {a.shape}")
    return a


def _ints(name: str, a: object, ndim: int) -> np.ndarray:
    if not isinstance(a, np.ndarray) or a.dtype.kind not in "iu":
        raise ArgumentError(f"{name}: must be an integer numpy.ndarray, got {getattr(a, 'dtype', type(a).__name__)}")
    if a.ndim != ndim:
        raise ArgumentError(f"{name}: must have {ndim} dimensions, got shape {a.shape}")
    return a.astype(np.int64)


def _total_length(total_sequence_length: object) -> int:
    if isinstance(total_sequence_length, np.ndarray):
        if total_sequence_length.size != 1 or total_sequence_length.dtype.kind not in "iu":
            raise ArgumentError(
                f"total_sequence_length: must be one integer (a scalar or 1-element array), got "
                f"{total_sequence_length.dtype} shape {total_sequence_length.shape}"
            )
        total_sequence_length = int(total_sequence_length.reshape(-1)[0])
    return _int("total_sequence_length", total_sequence_length, 1)


def _phase(batch: int, sequence_length: int, total: int) -> bool:
    """True on the first prompt (S == T); raises for the shapes ORT refuses."""
    if sequence_length > 1 and sequence_length != total:
        if batch != 1:
            raise ArgumentError(
                f"query: a subsequent prompt (S = {sequence_length} > 1, S != total_sequence_length = {total}) "
                f"needs batch size 1, got {batch}"
            )
        return False
    if sequence_length != total and sequence_length != 1:
        raise ArgumentError(f"query: sequence length must be 1 when it is not a prompt, got {sequence_length}")
    return sequence_length == total


def _check_qkv(query: object, key: object, value: object, num_heads: int, kv_num_heads: int) -> tuple[int, bool]:
    """(head size, packed) after the shape rules of query, key, value."""
    q = _array("query", query, FLOAT_TYPES, 3)
    if (key is None) != (value is None):
        raise ArgumentError("key, value: must be both given or both None (None: packed QKV in query)")
    packed = key is None
    heads = num_heads + 2 * kv_num_heads if packed else num_heads
    if q.shape[2] % heads:
        what = "(num_heads + 2 * kv_num_heads) * head_size (packed QKV)" if packed else "num_heads * head_size"
        raise ArgumentError(f"query: last dimension {q.shape[2]} must be {what}")
    head_size = q.shape[2] // heads
    if head_size == 0 or head_size % 8:
        raise ArgumentError(f"query: head_size must be a positive multiple of 8, got {head_size}")
    if not packed:
        for name, a in (("key", key), ("value", value)):
            a = _array(name, a, (q.dtype,), 3)
            if a.shape != (q.shape[0], q.shape[1], kv_num_heads * head_size):
                raise ArgumentError(
                    f"{name}: shape must be {(q.shape[0], q.shape[1], kv_num_heads * head_size)} "
                    f"(batch, sequence length of query, kv_num_heads * head_size), got {a.shape}"
                )
    return head_size, packed


def _check_quant(k_quant_type: object, v_quant_type: object, bits: object) -> int:
    for name, t in (("k_quant_type", k_quant_type), ("v_quant_type", v_quant_type)):
        if t not in QUANT_TYPES:
            raise ArgumentError(f"{name}: must be one of {QUANT_TYPES}, got {t!r}")
    if k_quant_type != v_quant_type:
        raise ArgumentError(f"v_quant_type: the CPU kernel requires k_quant_type == v_quant_type, got {v_quant_type!r}")
    bits = _int("kv_cache_bit_width", bits)
    if k_quant_type == "NONE" and bits != 0:
        raise ArgumentError(f"kv_cache_bit_width: must be 0 when the cache is not quantized, got {bits}")
    if k_quant_type != "NONE" and bits not in (4, 8):
        raise ArgumentError(f"kv_cache_bit_width: must be 4 or 8 with a quantized cache, got {bits}")
    return bits


def _check_past(past_key: object, past_value: object, batch: int, kv_num_heads: int, dtype: np.dtype, hs: int) -> int:
    """The past length P after the rules of past_key / past_value (cache type ``dtype``, last dim ``hs``)."""
    if (past_key is None) != (past_value is None):
        raise ArgumentError("past_key, past_value: must be both given or both None")
    if past_key is None:
        return 0
    pk = _array("past_key", past_key, (dtype,), 4)
    pv = _array("past_value", past_value, (dtype,), 4)
    for name, a in (("past_key", pk), ("past_value", pv)):
        if a.shape[:2] != (batch, kv_num_heads) or a.shape[3] != hs:
            raise ArgumentError(
                f"{name}: shape must be ({batch}, {kv_num_heads}, past_sequence_length, {hs}) (BNSH; the last "
                f"dimension holds head_size/2 bytes with a 4-bit cache), got {a.shape}"
            )
    if pk.shape != pv.shape:
        raise ArgumentError(f"past_value: shape must equal past_key's {pk.shape}, got {pv.shape}")
    return pk.shape[2]


def _check_rotary(cos_cache, sin_cache, head_size: int, total: int, dtype: np.dtype, do_rotary: bool) -> int:
    if (cos_cache is None) != (sin_cache is None):
        raise ArgumentError("cos_cache, sin_cache: must be both given or both None")
    if cos_cache is None:
        if do_rotary:
            raise ArgumentError("cos_cache: required when do_rotary = 1")
        return 0
    c = _array("cos_cache", cos_cache, (dtype,), 2)
    s = _array("sin_cache", sin_cache, (dtype,), 2)
    if head_size % 16:
        raise ArgumentError(f"cos_cache: rotary needs head_size to be a multiple of 16, got {head_size}")
    if c.shape != s.shape:
        raise ArgumentError(f"sin_cache: shape must equal cos_cache's {c.shape}, got {s.shape}")
    if not 0 < c.shape[1] <= head_size // 16 * 8 or c.shape[1] % 8:
        raise ArgumentError(
            f"cos_cache: dimension 1 (rotary_dim / 2) must be a positive multiple of 8 and <= "
            f"{head_size // 16 * 8} (head_size / 2), got {c.shape[1]}"
        )
    if c.shape[0] < total:
        raise ArgumentError(f"cos_cache: dimension 0 must be >= total_sequence_length = {total}, got {c.shape[0]}")
    return 2 * c.shape[1]


def check_gqa_args(
    query: object,
    key: object,
    value: object,
    past_key: object,
    past_value: object,
    seqlens_k: object,
    total_sequence_length: object,
    cos_cache: object = None,
    sin_cache: object = None,
    position_ids: object = None,
    attention_bias: object = None,
    head_sink: object = None,
    k_scale: object = None,
    v_scale: object = None,
    *,
    num_heads: int,
    kv_num_heads: int,
    scale: float = 0.0,
    softcap: float = 0.0,
    local_window_size: int = -1,
    do_rotary: int = 0,
    rotary_interleaved: int = 0,
    smooth_softmax: int = -1,
    k_quant_type: str = "NONE",
    v_quant_type: str = "NONE",
    kv_cache_bit_width: int = 0,
    shared_buffer: bool = False,
    precision: str = "reference",
    output_qk: int = 0,
) -> GQALayout:
    """Validate every argument of ``group_query_attention`` (ORT's ``CheckInputs`` rules plus the
    value checks of ``Compute``); return the layout. Raises ArgumentError naming the argument."""
    num_heads = _int("num_heads", num_heads, 1)
    kv_num_heads = _int("kv_num_heads", kv_num_heads, 1)
    if num_heads % kv_num_heads:
        raise ArgumentError(f"num_heads: must be a multiple of kv_num_heads = {kv_num_heads}, got {num_heads}")
    if precision not in PRECISIONS:
        raise ArgumentError(f"precision: must be one of {PRECISIONS}, got {precision!r}")
    if output_qk not in (0, 1, 2):
        raise ArgumentError(
            f"output_qk: must be 0/False (none), 1/True (scores before softmax) or 2 (after), got {output_qk!r}"
        )
    if output_qk and precision == "kernel":
        raise ArgumentError("output_qk: not available with precision='kernel' (a flash kernel never forms the scores)")
    do_rotary = _flag("do_rotary", do_rotary)
    _flag("rotary_interleaved", rotary_interleaved)
    if smooth_softmax not in (-1, 0, 1):
        raise ArgumentError(f"smooth_softmax: must be -1, 0 or 1, got {smooth_softmax!r}")
    if not isinstance(shared_buffer, (bool, np.bool_)):
        raise ArgumentError(f"shared_buffer: must be a bool, got {shared_buffer!r}")
    _float_attr("scale", scale, nonneg=False)
    _float_attr("softcap", softcap, nonneg=True)
    window = _int("local_window_size", local_window_size)
    if window == 0 or window < -1:
        raise ArgumentError(f"local_window_size: must be -1 (off) or >= 1, got {window}")

    head_size, packed = _check_qkv(query, key, value, num_heads, kv_num_heads)
    q = query
    batch, seq = q.shape[0], q.shape[1]
    bits = _check_quant(k_quant_type, v_quant_type, kv_cache_bit_width)
    cdtype = q.dtype if bits == 0 else cache_dtype(bits)
    hs = stored_head_size(head_size, bits) if bits else head_size
    past = _check_past(past_key, past_value, batch, kv_num_heads, cdtype, hs)
    if bits:
        expand_kv_scale("k_scale", k_scale, k_quant_type, kv_num_heads, head_size)
        expand_kv_scale("v_scale", v_scale, v_quant_type, kv_num_heads, head_size)
    else:
        for name, sc in (("k_scale", k_scale), ("v_scale", v_scale)):
            if sc is not None:
                raise ArgumentError(f"{name}: only with a quantized cache (k_quant_type != 'NONE')")

    total = _total_length(total_sequence_length)
    present = max(total, past)
    if total != past + seq and total > past:
        raise ArgumentError(
            f"total_sequence_length: must be past_sequence_length + S = {past + seq} (a growing cache) or <= "
            f"past_sequence_length = {past} (a fixed-size cache), got {total}"
        )
    first = _phase(batch, seq, total)
    sk = _ints("seqlens_k", seqlens_k, 1)
    if sk.shape != (batch,):
        raise ArgumentError(f"seqlens_k: shape must be ({batch},) (batch), got {sk.shape}")
    totals = sk + 1
    for b in range(batch):
        if not 1 <= totals[b] <= total:
            raise ArgumentError(
                f"seqlens_k: seqlens_k[{b}] = {sk[b]} must be in [0, total_sequence_length - 1 = {total - 1}] "
                f"(seqlens_k is the total length - 1)"
            )
        if not first and totals[b] < seq:
            raise ArgumentError(f"seqlens_k: seqlens_k[{b}] + 1 = {totals[b]} is below the sequence length {seq}")
        if not first and totals[b] - seq > past:
            raise ArgumentError(
                f"seqlens_k: seqlens_k[{b}] + 1 - S = {totals[b] - seq} past rows needed, the past holds {past}"
            )
    pasts = np.zeros(batch, np.int64) if first else totals - seq
    if shared_buffer and (past_key is None or past < total):
        raise ArgumentError(
            f"shared_buffer: needs past_key/past_value of length >= total_sequence_length = {total} "
            f"(present is the past buffer), got {past}"
        )

    rotary_dim = _check_rotary(cos_cache, sin_cache, head_size, total, q.dtype, do_rotary)
    if position_ids is not None:
        pid = _ints("position_ids", position_ids, 2)
        if pid.shape[0] != batch or pid.shape[1] < seq:
            raise ArgumentError(f"position_ids: shape must be ({batch}, >= {seq}), got {pid.shape}")
    if do_rotary:
        pos = rotary_positions(batch, seq, pasts, first, position_ids)
        if pos.min() < 0 or pos.max() >= cos_cache.shape[0]:
            raise ArgumentError(
                f"position_ids: rotary positions must be in [0, cos_cache.shape[0] = {cos_cache.shape[0]}), "
                f"got [{pos.min()}, {pos.max()}]"
            )
    if attention_bias is not None:
        ab = _array("attention_bias", attention_bias, (q.dtype,), 4)
        if ab.shape[0] not in (1, batch) or ab.shape[1] not in (1, num_heads) or ab.shape[2:] != (seq, total):
            raise ArgumentError(
                f"attention_bias: shape must be ({batch} or 1, {num_heads} or 1, {seq}, {total}), got {ab.shape}"
            )
    if head_sink is not None:
        hk = _array("head_sink", head_sink, (q.dtype,), 1)
        if hk.shape != (num_heads,):
            raise ArgumentError(f"head_sink: shape must be ({num_heads},) (num_heads), got {hk.shape}")
    return GQALayout(
        batch=batch,
        sequence_length=seq,
        num_heads=num_heads,
        kv_num_heads=kv_num_heads,
        head_size=head_size,
        past_sequence_length=past,
        total_sequence_length=total,
        present_sequence_length=present,
        first_prompt=first,
        packed=packed,
        dtype=q.dtype,
        rotary_dim=rotary_dim,
        bit_width=bits,
        total_lengths=tuple(int(t) for t in totals),
        past_lengths=tuple(int(p) for p in pasts),
    )


def defined_present_rows(
    seqlens_k: np.ndarray, total_sequence_length: int, sequence_length: int, present_sequence_length: int
) -> np.ndarray:
    """(B, present_sequence_length) bool: the cache rows the op writes from its inputs, rows
    [0, past_b + S) of batch b (past_b = 0 on the first prompt, S == total_sequence_length, whose
    S rows, right padding included, are all written; else seqlens_k[b] + 1 - S).
    Later rows are ORT's buffer policy, not the op's result: zero-filled with separate past and
    present buffers, untouched with a shared buffer. Compare a (B, Nk, rows, H) cache per batch
    entry as ``cache[b][:, mask[b]]``."""
    totals = np.asarray(seqlens_k, np.int64) + 1
    first = sequence_length == int(np.asarray(total_sequence_length).reshape(-1)[0])
    ends = np.full(totals.shape, sequence_length) if first else totals
    return np.arange(present_sequence_length)[None, :] < ends[:, None]


def defined_output_rows(seqlens_k: np.ndarray, total_sequence_length: int, sequence_length: int) -> np.ndarray:
    """(B, S) bool: the output rows of real tokens. On the first prompt (S == total_sequence_length)
    rows s >= seqlens_k[b] + 1 are right padding, whose output ORT defines only without a local
    window (module docstring); every row of a decode or subsequent prompt is defined."""
    totals = np.asarray(seqlens_k, np.int64) + 1
    first = sequence_length == int(np.asarray(total_sequence_length).reshape(-1)[0])
    ends = totals if first else np.full(totals.shape, sequence_length)
    return np.arange(sequence_length)[None, :] < ends[:, None]


def _heads(x: np.ndarray, batch: int, seq: int, heads: int, head_size: int) -> np.ndarray:
    """(B, S, heads*H) -> (B, heads, S, H) float64 values."""
    return x.reshape(batch, seq, heads, head_size).transpose(0, 2, 1, 3).astype(np.float64)


def _f32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float64).astype(np.float32).astype(np.float64)


def _f16(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.asarray(x, np.float64).astype(np.float32).astype(np.float16).astype(np.float64)


def _key_mask(lay: GQALayout, window: int) -> np.ndarray:
    """(B, 1, S, Tp) bool: key j is attended by query s of batch b."""
    j = np.arange(lay.present_sequence_length)
    s = np.arange(lay.sequence_length)
    totals = np.asarray(lay.total_lengths)[:, None]
    ends = np.minimum(np.asarray(lay.past_lengths)[:, None] + s[None, :] + 1, totals)
    starts = np.maximum(ends - window, 0) if window > 0 else np.zeros_like(ends)
    return ((j[None, None, :] >= starts[..., None]) & (j[None, None, :] < ends[..., None]))[:, None]


def _bias_full(attention_bias: np.ndarray | None, lay: GQALayout) -> np.ndarray | None:
    """The bias broadcast to (B, N, S, Tp) float64 (columns >= T are never attended: zero)."""
    if attention_bias is None:
        return None
    shape = (lay.batch, lay.num_heads, lay.sequence_length, lay.total_sequence_length)
    full = np.zeros(shape[:3] + (lay.present_sequence_length,), np.float64)
    full[..., : lay.total_sequence_length] = np.broadcast_to(attention_bias.astype(np.float64), shape)
    return full


def _scores(q: np.ndarray, k: np.ndarray, alpha: float, softcap: float, bias, exact: bool) -> np.ndarray:
    """x = scale * q.k (+ softcap, + bias) over every key column, rounded as "reference" unless ``exact``."""
    dot = np.einsum("bnsh,bnth->bnst", q, k)
    if exact:
        x = dot * alpha
        if softcap > 0:
            x = softcap * np.tanh(x / softcap)
        return x if bias is None else x + bias
    x = _f32(_f32(dot) * alpha)
    if softcap > 0:
        x = _f32(_f32(np.tanh(_f32(x / softcap))) * softcap)
    return x if bias is None else _f32(x + bias)


def _softmax(x: np.ndarray, mask: np.ndarray, sink: np.ndarray | None, exact: bool) -> np.ndarray:
    """p over the masked-in keys with an optional per-head sink (N,) in the denominator."""
    r = (lambda v: v) if exact else _f32
    xm = np.where(mask, x, -np.inf)
    m = xm.max(axis=-1, keepdims=True)
    if sink is not None:
        m = np.maximum(m, sink[None, :, None, None])
    with np.errstate(invalid="ignore"):
        e = np.where(mask, r(np.exp(r(xm - m))), 0.0)
    tot = e.sum(axis=-1, keepdims=True)
    if sink is not None:
        tot = tot + r(np.exp(r(sink[None, :, None, None] - m)))
    return r(e / r(tot))


def _kernel_attention(q, k, v, mask, alpha: float, softcap: float, bias, sink) -> np.ndarray:
    """The "kernel" form (module docstring): fp16 operands, fp32 online softmax over key blocks."""
    q, k, v = _f16(q), _f16(k), _f16(v)
    shape = q.shape[:3] + (1,)
    m = np.full(shape, -np.inf) if sink is None else np.broadcast_to(sink[None, :, None, None], shape).copy()
    lsum = np.zeros(shape) if sink is None else np.ones(shape)
    acc = np.zeros(q.shape)
    for j0 in range(0, k.shape[2], KERNEL_KV_BLOCK):
        blk = slice(j0, j0 + KERNEL_KV_BLOCK)
        msk = mask[..., blk]
        s = _scores(q, k[:, :, blk], alpha, softcap, None if bias is None else bias[..., blk], exact=False)
        s = np.where(msk, s, -np.inf)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        live = np.isfinite(m_new)
        with np.errstate(invalid="ignore"):
            corr = np.where(live, _f32(np.exp(_f32(m - m_new))), 1.0)
            p = np.where(msk & live, _f32(np.exp(_f32(s - m_new))), 0.0)
        lsum = _f32(_f32(lsum * corr) + _f32(p.sum(axis=-1, keepdims=True)))
        acc = _f32(_f32(acc * corr) + _f32(np.einsum("bnst,bnth->bnsh", _f16(p), v[:, :, blk])))
        m = np.where(live, m_new, m)
    return _f16(_f32(acc / lsum))


def _write_present(past: np.ndarray | None, new: np.ndarray, lay: GQALayout, shared: bool) -> np.ndarray:
    """present (B, Nk, Tp, Hs) in the cache type: ORT's ``ConcatStateChunkGQA`` buffer policy."""
    if shared:
        present = past.copy()
    else:
        shape = (lay.batch, lay.kv_num_heads, lay.present_sequence_length, new.shape[-1])
        present = np.zeros(shape, new.dtype)
    for b, pb in enumerate(lay.past_lengths):
        if pb and not shared:
            present[b, :, :pb] = past[b, :, :pb]
        present[b, :, pb : pb + lay.sequence_length] = new[b]
    return present


def group_query_attention(
    query: np.ndarray,
    key: np.ndarray | None,
    value: np.ndarray | None,
    past_key: np.ndarray | None,
    past_value: np.ndarray | None,
    seqlens_k: np.ndarray,
    total_sequence_length: int | np.ndarray,
    cos_cache: np.ndarray | None = None,
    sin_cache: np.ndarray | None = None,
    position_ids: np.ndarray | None = None,
    attention_bias: np.ndarray | None = None,
    head_sink: np.ndarray | None = None,
    k_scale: np.ndarray | None = None,
    v_scale: np.ndarray | None = None,
    *,
    num_heads: int,
    kv_num_heads: int,
    scale: float = 0.0,
    softcap: float = 0.0,
    local_window_size: int = -1,
    do_rotary: int = 0,
    rotary_interleaved: int = 0,
    smooth_softmax: int = -1,
    k_quant_type: str = "NONE",
    v_quant_type: str = "NONE",
    kv_cache_bit_width: int = 0,
    shared_buffer: bool = False,
    precision: str = "reference",
    output_qk: int = 0,
    out: tuple[np.ndarray, ...] | None = None,
) -> tuple[np.ndarray, ...]:
    """com.microsoft.GroupQueryAttention (module docstring): (output, present_key, present_value)
    plus output_qk when ``output_qk`` is 1/True (scores before softmax) or 2 (after); ``out``: a
    tuple of buffers for them (checked before any work), filled and returned.

    Inputs and attributes carry ONNX Runtime's names; arrays are numpy (query/key/value/caches/
    bias/sink fp32 or fp16, caches int8 / packed uint8 when quantized, seqlens_k and position_ids
    integers, k_scale/v_scale fp32). ``shared_buffer``: present_key/value are the past buffers
    (ORT with IO binding), so rows past the written ones keep the past's content."""
    lay = check_gqa_args(
        query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache, sin_cache,
        position_ids, attention_bias, head_sink, k_scale, v_scale, num_heads=num_heads, kv_num_heads=kv_num_heads,
        scale=scale, softcap=softcap, local_window_size=local_window_size, do_rotary=do_rotary,
        rotary_interleaved=rotary_interleaved, smooth_softmax=smooth_softmax, k_quant_type=k_quant_type,
        v_quant_type=v_quant_type, kv_cache_bit_width=kv_cache_bit_width, shared_buffer=shared_buffer,
        precision=precision, output_qk=output_qk,
    )  # fmt: skip
    B, S, N, Nk, H = lay.batch, lay.sequence_length, lay.num_heads, lay.kv_num_heads, lay.head_size
    _check_outs(out, lay, precision, output_qk, query, key, value, past_key, past_value)
    exact = precision == "float64"
    if lay.packed:
        key, value = query[..., N * H : (N + Nk) * H], query[..., (N + Nk) * H :]
        query = query[..., : N * H]
    q, k_new, v_new = _heads(query, B, S, N, H), _heads(key, B, S, Nk, H), _heads(value, B, S, Nk, H)
    if do_rotary:
        form = "float64" if exact else ("fp16" if lay.dtype == np.float16 else "fma")
        pos = rotary_positions(B, S, np.asarray(lay.past_lengths), lay.first_prompt, position_ids)
        q = apply_rotary(q, cos_cache, sin_cache, pos, bool(rotary_interleaved), form)
        k_new = apply_rotary(k_new, cos_cache, sin_cache, pos, bool(rotary_interleaved), form)

    if lay.bit_width:
        ks = expand_kv_scale("k_scale", k_scale, k_quant_type, Nk, H)
        vs = expand_kv_scale("v_scale", v_scale, v_quant_type, Nk, H)
        qform = "float64" if exact else "ort"
        present_k = _write_present(past_key, quantize_kv(k_new, ks, lay.bit_width, qform), lay, shared_buffer)
        present_v = _write_present(past_value, quantize_kv(v_new, vs, lay.bit_width, qform), lay, shared_buffer)
        k_att = dequantize_kv(present_k, ks, lay.bit_width, exact)
        v_att = dequantize_kv(present_v, vs, lay.bit_width, exact)
    else:
        with np.errstate(over="ignore"):
            present_k = _write_present(past_key, k_new.astype(lay.dtype), lay, shared_buffer)
            present_v = _write_present(past_value, v_new.astype(lay.dtype), lay, shared_buffer)
        k_att, v_att = present_k.astype(np.float64), present_v.astype(np.float64)
        if exact:
            for b, pb in enumerate(lay.past_lengths):
                k_att[b, :, pb : pb + S], v_att[b, :, pb : pb + S] = k_new[b], v_new[b]
    group = N // Nk
    k_att, v_att = np.repeat(k_att, group, axis=1), np.repeat(v_att, group, axis=1)

    alpha = float(np.float32(scale)) if scale != 0 else 1.0 / np.sqrt(H)
    if not exact and scale == 0:
        alpha = float(np.float32(1) / np.sqrt(np.float32(H), dtype=np.float32))
    cap = float(np.float32(softcap))
    mask = _key_mask(lay, local_window_size)
    bias = _bias_full(attention_bias, lay)
    sink = None if head_sink is None else head_sink.astype(np.float64)
    if sink is None and smooth_softmax == 1:
        sink = np.zeros(N)

    if precision == "kernel":
        att = _kernel_attention(q, k_att, v_att, mask, alpha, cap, bias, sink)
        qk = None
    else:
        x = _scores(q, k_att, alpha, cap, bias, exact)
        p = _softmax(x, mask, sink, exact)
        att = np.einsum("bnst,bnth->bnsh", p, v_att)
        att = att if exact else _f32(att)
        qk = None
        if output_qk:
            qk = np.where(mask, x if output_qk == 1 else p, 0.0)[..., : lay.total_sequence_length]
            qk = qk if exact else qk.astype(lay.dtype)
    out_dtype = np.float64 if exact else lay.dtype
    with np.errstate(over="ignore"):
        output = att.transpose(0, 2, 1, 3).reshape(B, S, N * H).astype(out_dtype)
    result = (output, present_k, present_v) + ((qk,) if output_qk else ())
    if out is None:
        return result
    for buf, r in zip(out, result, strict=True):
        buf[...] = r
    return out


def output_shapes(lay: GQALayout, precision: str = "reference", output_qk: int = 0) -> tuple:
    """((shape, dtype), ...) of output, present_key, present_value (and output_qk) for a layout."""
    dtype = np.dtype(np.float64) if precision == "float64" else lay.dtype
    cache = (lay.batch, lay.kv_num_heads, lay.present_sequence_length, lay.cache_head_size)
    shapes = [
        ((lay.batch, lay.sequence_length, lay.num_heads * lay.head_size), dtype),
        (cache, lay.cache_dtype),
        (cache, lay.cache_dtype),
    ]
    if output_qk:
        shapes.append(((lay.batch, lay.num_heads, lay.sequence_length, lay.total_sequence_length), dtype))
    return tuple(shapes)


def _check_outs(out: object, lay: GQALayout, precision: str, output_qk: int, *inputs: object) -> None:
    if out is None:
        return
    shapes = output_shapes(lay, precision, output_qk)
    names = ("output", "present_key", "present_value", "output_qk")[: len(shapes)]
    if not isinstance(out, tuple) or len(out) != len(shapes):
        got = type(out).__name__
        raise ArgumentError(f"out: must be a tuple of {len(shapes)} arrays ({', '.join(names)}), got {got}")
    for i, (buf, (shape, dtype)) in enumerate(zip(out, shapes, strict=True)):
        check_out(buf, shape, dtype, *inputs, *out[:i])

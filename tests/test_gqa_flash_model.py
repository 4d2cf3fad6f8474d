"""A numpy model of the flash prefill kernel's tile loop (src/qconform/device/kernels/ort/gqa_flash.hip,
launcher qconform.device.ort.gqa_flash) checked on the CPU against the GroupQueryAttention oracle:
its CTA / group key ranges cover every row's [lo, L) (the causal limit with a past, the window),
its online softmax (the sink as the initial state, per-lane partial sums, P in fp16) is the
oracle's precision "kernel" up to summation order, and its outputs pass the catalogue's check
under the contract storage=fp16 that the kernel declares (and not all of them under strict)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from gqa_model_common import layout_and_query

from qconform.contracts import parse_contract
from qconform.ops import get_op
from qconform.ops.ort.group_query_attention import gqa_call
from qconform.oracles.ort import group_query_attention
from qconform.oracles.ort.kv_cache import dequantize_kv, expand_kv_scale
from qconform.properties.checks import Prepared

BM, BN, ROWS = 64, 64, 16  # QK_FL_BM, QK_FL_BN, rows of a 32-lane group


def f32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float64).astype(np.float32).astype(np.float64)


def f16(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.asarray(x, np.float64).astype(np.float32).astype(np.float16).astype(np.float64)


def key_range(s: int, S: int, past: int, total: int, window: int) -> tuple[int, int]:
    """qk_fl_range: (lo, L) of query row s; L = 0 past the last row."""
    L = 0 if s >= S else min(past + s + 1, total)
    return (L - window if window >= 1 and L > window else 0), L


def fp16_operands(
    q: np.ndarray, present_k: np.ndarray, present_v: np.ndarray, k_scale, v_scale, attrs: dict, lay
) -> tuple:
    """Q, K and V as the flash kernels hold them: fp16, a quantized cache dequantized first (the fp16
    scratch pass for fp32 and quantized caches)."""
    bits = attrs.get("kv_cache_bit_width", 0)
    if bits:
        qt, Nk, H = attrs["k_quant_type"], lay.kv_num_heads, lay.head_size
        k = dequantize_kv(present_k, expand_kv_scale("k_scale", k_scale, qt, Nk, H), bits)
        v = dequantize_kv(present_v, expand_kv_scale("v_scale", v_scale, qt, Nk, H), bits)
    else:
        k, v = present_k.astype(np.float64), present_v.astype(np.float64)
    return f16(q), f16(k), f16(v)


def flash_model(args: tuple, attrs: dict, present_k: np.ndarray, present_v: np.ndarray) -> np.ndarray:
    """The kernel's output (B, S, N H) in the query's dtype, from the inputs and the present caches
    the append wrote (the oracle's, bit-exact)."""
    bias, sink_in, k_scale, v_scale = args[10:]
    lay, q = layout_and_query(args, attrs)
    B, S, N, Nk, H = lay.batch, lay.sequence_length, lay.num_heads, lay.kv_num_heads, lay.head_size
    T, totals, pasts = lay.total_sequence_length, lay.total_lengths, lay.past_lengths
    q, k, v = fp16_operands(q, present_k, present_v, k_scale, v_scale, attrs, lay)
    scale = attrs.get("scale", 0.0)
    alpha = float(np.float32(scale)) if scale else float(np.float32(1) / np.sqrt(np.float32(H), dtype=np.float32))
    cap = float(np.float32(attrs.get("softcap", 0.0)))
    window = attrs.get("local_window_size", -1)
    sink = None if sink_in is None else sink_in.astype(np.float64)
    if sink is None and attrs.get("smooth_softmax", -1) == 1:
        sink = np.zeros(N)
    lane = (np.arange(BN) % 8) // 2  # lane t of a row's quad holds keys 8 j + 2 t + {0, 1}
    out = np.zeros((B, N, S, H))
    kv_of = np.arange(N) // (N // Nk)
    for b in range(B):
        total, past = int(totals[b]), int(pasts[b])
        for q0 in range(0, S, BM):
            last = min(q0 + BM - 1, S - 1)
            cta_lo, cta_end = key_range(q0, S, past, total, window)[0], key_range(last, S, past, total, window)[1]
            jb0, jb1 = cta_lo // BN, -(-cta_end // BN)
            assert cta_end <= total, "rows of present past the valid length are never read"
            for w in range(BM // ROWS):
                rows = np.arange(q0 + ROWS * w, q0 + ROWS * (w + 1))
                if rows[0] >= S:
                    continue
                rng = np.array([key_range(int(s), S, past, total, window) for s in rows])
                g_lo = key_range(int(rows[0]), S, past, total, window)[0]
                g_end = key_range(min(int(rows[-1]), last), S, past, total, window)[1]
                live_rows = rng[:, 1] > 0
                assert (rng[live_rows, 0] >= g_lo).all() and (rng[:, 1] <= g_end).all()
                assert g_lo >= jb0 * BN and g_end <= jb1 * BN, "the CTA's blocks cover the group's keys"
                qs = q[b][:, np.minimum(rows, S - 1)] * (rows < S)[None, :, None]  # (N, 16, H)
                m = np.full((N, ROWS), -np.inf) if sink is None else np.repeat(sink[:, None], ROWS, 1)
                lpart = np.zeros((N, ROWS, 4))
                if sink is not None:
                    lpart[..., 0] = 1.0
                acc = np.zeros((N, ROWS, H))
                for jb in range(jb0, jb1):
                    j0 = jb * BN
                    if not (j0 < g_end and j0 + BN > g_lo):
                        continue  # the group skips the block (every key of it masked for its rows)
                    keys = j0 + np.arange(BN)
                    kb = np.zeros((N, BN, H))
                    vb = np.zeros((N, BN, H))
                    inside = keys < cta_end  # the staged rows; later rows zero-filled
                    kb[:, inside] = k[b][kv_of][:, keys[inside]]
                    vb[:, inside] = v[b][kv_of][:, keys[inside]]
                    x = f32(f32(np.einsum("nsh,nkh->nsk", qs, kb)) * alpha)
                    if cap > 0:
                        x = f32(f32(np.tanh(f32(x / cap))) * cap)
                    if bias is not None:
                        bb = bias.astype(np.float64)[min(b, bias.shape[0] - 1)]  # (N or 1, S, T)
                        cols = np.minimum(keys, T - 1)
                        x = f32(x + np.broadcast_to(bb[:, np.minimum(rows, S - 1)][..., cols], x.shape))
                    mask = (keys[None, :] >= rng[:, :1]) & (keys[None, :] < rng[:, 1:])
                    x = np.where(mask[None], x, -np.inf)
                    m_new = np.maximum(m, x.max(axis=-1))
                    none = np.isneginf(m_new)
                    with np.errstate(invalid="ignore"):
                        corr = np.where(none, 1.0, f32(np.exp(f32(m - m_new))))
                        p = np.where(none[..., None], 0.0, f32(np.exp(f32(x - m_new[..., None]))))
                    for t in range(4):
                        ps = np.zeros((N, ROWS))
                        for key in np.flatnonzero(lane == t):
                            ps = f32(ps + p[..., key])
                        lpart[..., t] = f32(f32(lpart[..., t] * corr) + ps)
                    m = m_new
                    acc = f32(f32(acc * corr[..., None]) + f32(np.einsum("nsk,nkh->nsh", f16(p), vb)))
                lsum = f32(f32(lpart[..., 0] + lpart[..., 1]) + f32(lpart[..., 2] + lpart[..., 3]))
                keep = rows < S
                with np.errstate(invalid="ignore"):  # rows past S: nothing attended, not written
                    out[b][:, rows[keep]] = f32(acc / lsum[..., None])[:, keep]
    return out.transpose(0, 2, 1, 3).reshape(B, S, N * H).astype(lay.dtype)


def _cases() -> list:
    op = get_op("gqa_prefill")
    picked = []
    for leaf in op.leaves:
        picked += [(op, c) for c in op.cases(leaf.name, 1)]
    big = [c for c in op.cases("Xfp16_Wfp16_Yfp16", 2) if c.seed in (11, 15, 16, 403)]
    big += [c for c in op.cases("Xfp32_Wfp32_Yfp32", 2) if c.seed in (13, 402)]
    return picked + [(op, c) for c in big]


CASES = _cases()
SMALL = sum(len(get_op("gqa_prefill").cases(leaf.name, 1)) for leaf in get_op("gqa_prefill").leaves)
FP16 = SimpleNamespace(contract=parse_contract("storage=fp16"), ftz=True)


@pytest.mark.parametrize("op,case", CASES, ids=[c.id for _, c in CASES])
def test_flash_model_matches_the_oracle_and_its_contract(op, case) -> None:
    inputs = op.make_inputs(case)
    params = op.params(case)
    args, attrs = gqa_call(inputs, params)
    _, pk, pv = group_query_attention(*args, **attrs)
    got = flash_model(args, attrs, pk, pv)
    kernel = group_query_attention(*args, **attrs, precision="kernel")[0].astype(np.float64)
    # the oracle's "kernel" form sums in another order and rounds its output to fp16 (an fp32
    # output too): within a few fp16 spacings of it
    tol = 4 * np.abs(kernel) * 2.0**-11 + 1e-6
    assert (np.abs(got.astype(np.float64) - kernel) <= tol).all(), np.abs(got - kernel).max()
    prepared = Prepared.from_inputs(op, case, inputs, FP16)
    result = prepared.verify(op, (got, pk, pv))
    assert result.ok, result.detail


def test_flash_rounding_needs_the_contract() -> None:
    """The strict bound has no room for fp16 operands: some case's model output fails it, so the
    launcher runs the flash kernel only under storage=fp16."""
    failed = 0
    for op, case in CASES[:SMALL]:
        inputs = op.make_inputs(case)
        args, attrs = gqa_call(inputs, op.params(case))
        _, pk, pv = group_query_attention(*args, **attrs)
        got = flash_model(args, attrs, pk, pv)
        strict = Prepared.from_inputs(op, case, inputs, SimpleNamespace(contract=parse_contract(None), ftz=True))
        failed += not strict.verify(op, (got, pk, pv)).ok
    assert failed

"""A numpy model of the session-10 flash prefill kernel ``qk_gqa_prefill2_h<H>``
(src/qconform/device/kernels/ort/gqa_flash.hip, launcher qconform.device.ort.gqa_flash) checked on
the CPU against the GroupQueryAttention oracle, for the cases the launcher gives it (head_size 64 /
128, no softcap, no bias, a positive scale): its CTAs (128 / hpc rows of each of hpc = 4, 2 or 1
heads of one KV head) cover every row's keys, a block it takes as whole (no mask) is inside
every valid row's [lo, L), and its rounding (the exponent base 2 with the scale folded in:
p = 2^fma(s, fp32(alpha log2 e), -m2), the shift m2 = fp32(max s * c) or fp32(sigma log2 e) from a
sink) passes the catalogue's check under the contract storage=fp16, with exp2 exact then rounded
to fp32, and with every exponential also off by up to ex2.approx's 2 ulp (PTX ISA: a relative
2^-22, random signs)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from gqa_model_common import layout_and_query
from test_gqa_flash_model import f16, f32, fp16_operands, key_range

from qconform.contracts import parse_contract
from qconform.ops import get_op
from qconform.ops.ort.group_query_attention import gqa_call
from qconform.oracles.ort import group_query_attention
from qconform.properties.checks import Prepared

ROWS2, BN, ROWS = 128, 64, 16  # QK_FL2_ROWS, QK_FL_BN, rows of a 32-lane group
LOG2E = 1.4426950408889634


def flash2_model(
    args: tuple, attrs: dict, pk: np.ndarray, pv: np.ndarray, diag_mask: bool = True, ex2_err: bool = False
) -> np.ndarray:
    """The kernel's output (B, S, N H) in the query's dtype; ``diag_mask=False`` models the device
    mutant "diagonal tile unmasked" (every block from the group's first visible one taken whole);
    ``ex2_err``: each 2^x times (1 + d), |d| = 2^-22 (2 ulp), a random sign."""
    rng_err = np.random.default_rng(7)

    def ex2(x: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            y = np.exp2(x)
        if ex2_err:
            y = y * (1 + rng_err.choice([-1.0, 1.0], size=np.shape(y)) * 2.0**-22)
        return f32(y)

    sink_in, k_scale, v_scale = args[11:]
    lay, q = layout_and_query(args, attrs)
    B, S, N, Nk, H = lay.batch, lay.sequence_length, lay.num_heads, lay.kv_num_heads, lay.head_size
    totals, pasts = lay.total_lengths, lay.past_lengths
    q, k, v = fp16_operands(q, pk, pv, k_scale, v_scale, attrs, lay)
    scale = attrs.get("scale", 0.0)
    alpha = float(np.float32(scale)) if scale else float(np.float32(1) / np.sqrt(np.float32(H), dtype=np.float32))
    c2 = float(f32(alpha * LOG2E))
    window = attrs.get("local_window_size", -1)
    sink = None if sink_in is None else sink_in.astype(np.float32).astype(np.float64)
    if sink is None and attrs.get("smooth_softmax", -1) == 1:
        sink = np.zeros(N)
    hpc = next(h for h in (4, 2, 1) if (N // Nk) % h == 0)  # heads_per_cta
    rows_cta, per = ROWS2 // hpc, 8 // hpc
    lane = (np.arange(BN) % 8) // 2
    out = np.zeros((B, N, S, H))
    for b in range(B):
        total, past = int(totals[b]), int(pasts[b])
        for q0 in range(0, S, rows_cta):
            last = min(q0 + rows_cta - 1, S - 1)
            cta_lo, cta_end = key_range(q0, S, past, total, window)[0], key_range(last, S, past, total, window)[1]
            jb0, jb1 = cta_lo // BN, -(-cta_end // BN)
            assert cta_end <= total
            for head0 in range(0, N, hpc):
                assert head0 // (N // Nk) == (head0 + hpc - 1) // (N // Nk), "a CTA's heads share a KV head"
                kvh = head0 // (N // Nk)
                for w in range(8):
                    n = head0 + w // per
                    g_first = q0 + ROWS * (w % per)
                    if g_first >= S:
                        continue
                    g_last = min(g_first + ROWS - 1, last)
                    rows = np.arange(g_first, g_first + ROWS)
                    rng = np.array([key_range(int(s), S, past, total, window) for s in rows])
                    (g_lo, in_end), (in_lo, g_end) = (key_range(r, S, past, total, window) for r in (g_first, g_last))
                    valid = rows < S
                    assert (rng[valid, 0] >= g_lo).all() and (rng[:, 1] <= g_end).all()
                    assert g_lo >= jb0 * BN and g_end <= jb1 * BN
                    qs = q[b][n, np.minimum(rows, S - 1)] * valid[:, None]  # (16, H)
                    m_init = -np.inf if sink is None else float(f32(sink[n] * LOG2E))
                    m2 = np.full(ROWS, m_init)
                    lpart = np.zeros((ROWS, 4))
                    if sink is not None:
                        lpart[:, 0] = 1.0
                    acc = np.zeros((ROWS, H))
                    for jb in range(jb0, jb1):
                        j0 = jb * BN
                        if not (j0 < g_end and j0 + BN > g_lo):
                            continue
                        keys = j0 + np.arange(BN)
                        inside = keys < cta_end
                        kb, vb = np.zeros((BN, H)), np.zeros((BN, H))
                        kb[inside], vb[inside] = k[b][kvh][keys[inside]], v[b][kvh][keys[inside]]
                        s = f32(qs @ kb.T)
                        mask = (keys[None, :] >= rng[:, :1]) & (keys[None, :] < rng[:, 1:])
                        whole = j0 >= in_lo and (j0 + BN <= in_end or not diag_mask)
                        if whole and diag_mask:
                            assert mask[valid].all(), "a block taken whole is inside every valid row's range"
                        if not whole:
                            s = np.where(mask, s, -np.inf)
                        m2_new = np.maximum(m2, f32(s.max(axis=-1) * c2))
                        empty = np.isneginf(m2_new)
                        with np.errstate(invalid="ignore"):
                            rs = np.where(empty, 1.0, ex2(f32(m2 - m2_new)))
                        shift = np.where(empty, 0.0, m2_new)
                        p = ex2(f32(s * c2 - shift[:, None]))
                        for t in range(4):
                            ps = np.zeros(ROWS)
                            for key in np.flatnonzero(lane == t):
                                ps = f32(ps + p[:, key])
                            lpart[:, t] = f32(f32(lpart[:, t] * rs) + ps)
                        m2 = m2_new
                        acc = f32(f32(acc * rs[:, None]) + f32(f16(p) @ vb))
                    lsum = f32(f32(lpart[:, 0] + lpart[:, 1]) + f32(lpart[:, 2] + lpart[:, 3]))
                    with np.errstate(invalid="ignore", divide="ignore"):
                        res = f32(acc / lsum[:, None])
                    out[b][n, rows[valid]] = res[valid]
    return out.transpose(0, 2, 1, 3).reshape(B, S, N * H).astype(lay.dtype)


def _v2_cases() -> list:
    """Every coverage-2 case of every leaf the launcher gives qk_gqa_prefill2 (uses_v2)."""
    op = get_op("gqa_prefill")
    picked = []
    for leaf in op.leaves:
        for c in op.cases(leaf.name, 2):
            p = op.params(c)
            H = c.shape[5]
            if H in (64, 128) and not p.get("softcap", 0.0) and "bias=" not in c.id and p.get("scale", 0.0) >= 0:
                picked.append((op, c))
    return picked


CASES = _v2_cases()
FP16 = SimpleNamespace(contract=parse_contract("storage=fp16"), ftz=True)


@pytest.mark.parametrize("op,case", CASES, ids=[c.id for _, c in CASES])
def test_flash2_model_passes_storage_fp16(op, case) -> None:
    inputs = op.make_inputs(case)
    args, attrs = gqa_call(inputs, op.params(case))
    _, pk, pv = group_query_attention(*args, **attrs)
    prepared = Prepared.from_inputs(op, case, inputs, FP16)
    for ex2_err in (False, True):
        got = flash2_model(args, attrs, pk, pv, ex2_err=ex2_err)
        result = prepared.verify(op, (got, pk, pv))
        assert result.ok, (ex2_err, result.detail)


def test_flash2_model_unmasked_diagonal_fails() -> None:
    """The device mutant "diagonal tile unmasked" fails the check on the coverage-1 case that
    reaches the kernel (a first prompt of 4 tokens, head_size 64)."""
    op = get_op("gqa_prefill")
    case = next(c for c in op.cases("Xfp16_Wfp16_Yfp16", 1) if c.shape[5] == 64)
    inputs = op.make_inputs(case)
    args, attrs = gqa_call(inputs, op.params(case))
    _, pk, pv = group_query_attention(*args, **attrs)
    got = flash2_model(args, attrs, pk, pv, diag_mask=False)
    assert not Prepared.from_inputs(op, case, inputs, FP16).verify(op, (got, pk, pv)).ok


def launch_order(n_row_blocks: int, head_blocks: int, chunk: int) -> list[tuple[int, int]]:
    """(rank of the row block, 0 = the longest; head block) of each blockIdx.x of qk_gqa_prefill2,
    the kernel's integer decode."""
    out = []
    for x in range(n_row_blocks * head_blocks):
        band = x // (chunk * head_blocks)
        rem = x - band * chunk * head_blocks
        width = min(chunk, n_row_blocks - band * chunk)
        out.append((band * chunk + rem % width, rem // width))
    return out


def lpt_makespan(works: list[int], sms: int) -> int:
    """List scheduling in launch order, one CTA an SM (the block scheduler's greedy model)."""
    free = [0] * sms
    for w in works:
        i = free.index(min(free))
        free[i] += w
    return max(free)


@pytest.mark.parametrize("nrb,hb", [(64, 8), (4, 8), (10, 4), (1, 24), (7, 1), (512, 8)])
def test_launch_order_covers_every_block_once(nrb: int, hb: int) -> None:
    """Every band width (1, a short last band, all row blocks) gives every (row block, head
    block) exactly one CTA; chunk 1 launches the row blocks in non-increasing length over all
    heads, chunk = all is the round-1 order (head-major)."""
    everything = {(r, h) for r in range(nrb) for h in range(hb)}
    for chunk in sorted({1, 3, nrb}):
        order = launch_order(nrb, hb, chunk)
        assert len(order) == len(everything) and set(order) == everything
    assert [r for r, _ in launch_order(nrb, hb, 1)] == sorted(r for r, _ in everything)
    assert launch_order(nrb, hb, nrb) == [(r, h) for h in range(hb) for r in range(nrb)]


def test_launch_order_shortens_the_2k_tail() -> None:
    """The bench's 2k prompt (32 / 8 heads, hpc 4: 64 row blocks of 32 rows, 8 head blocks; row
    block i sees ceil(32 (i + 1) / 64) key blocks): 132 SMs, one CTA each, in units of one key
    block: 79 in the round-1 order, 65 with chunk 1 (the ideal 8448 / 132 = 64)."""
    nrb, hb = 64, 8

    def works(chunk: int) -> list[int]:
        return [-(-32 * (nrb - r) // 64) for r, _ in launch_order(nrb, hb, chunk)]

    assert sum(works(1)) == 8448
    assert lpt_makespan(works(nrb), 132) == 79
    assert lpt_makespan(works(1), 132) == 65

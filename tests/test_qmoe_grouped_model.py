"""A numpy model of the grouped-GEMM path of qmoe_ragged_mm (src/qconform/device/kernels/ort/qmoe.hip
qk_moe_gcount / qk_moe_gscatter / qk_moe_gemm1_u* / qk_moe_gemm2_u* / qk_moe_combine, launcher
qconform.device.ort.qmoe under storage=fp16) checked on the CPU: its grouping is the stable order
of the live (token, slot) pairs per expert, its tile count covers every pair, and its arithmetic
(fc inputs and fc1's output in fp16, (q - z) exact, each block's fp32 partial sum times its scale,
fp32 bias / activation / selection-order sum) passes the catalogue's check under the contract
storage=fp16 it declares, and not every case under strict. The mma's fp32 sums of a 32-value chunk
are modelled as one rounding (their order is the hardware's; the contract bounds any order)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from qconform.contracts import parse_contract
from qconform.ops import get_op
from qconform.ops.ort.qmoe import qmoe_call
from qconform.oracles.ort.moe_routing import SKIP_QMOE, route
from qconform.oracles.ort.qmoe import check_qmoe_args, expert_activation, expert_codes
from qconform.properties.checks import Prepared

GM, GK, PER_THREAD, THREADS = 64, 64, 8, 256  # QK_MOE_GM, QK_MOE_GK, QK_MOE_GPER, the scatter's threads
FP16 = SimpleNamespace(contract=parse_contract("storage=fp16"), ftz=True)
STRICT = SimpleNamespace(contract=parse_contract(None), ftz=True)


def f32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float64).astype(np.float32).astype(np.float64)


def f16(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.asarray(x, np.float64).astype(np.float32).astype(np.float16).astype(np.float64)


def scatter_model(sel: np.ndarray, live: np.ndarray, E: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """qk_moe_gcount + qk_moe_gscatter: (order, offs (E + 1), tiles (E + 1)), pass by pass as the
    kernel ranks them (each thread's PER_THREAD pairs, an exclusive scan of the threads' counts)."""
    P = sel.size
    flat, alive = sel.reshape(-1), live.reshape(-1)
    counts = np.array([int(((flat == e) & alive).sum()) for e in range(E)], np.int64)
    offs = np.concatenate([[0], np.cumsum(counts)])
    tiles = np.concatenate([[0], np.cumsum(-(-counts // GM))])
    order = np.full(P, -1, np.int64)
    for e in range(E):
        base = offs[e]
        for p0 in range(0, P, THREADS * PER_THREAD):
            flags = np.zeros(THREADS * PER_THREAD, bool)
            chunk = slice(p0, min(P, p0 + THREADS * PER_THREAD))
            flags[: chunk.stop - p0] = (flat[chunk] == e) & alive[chunk]
            n = flags.reshape(THREADS, PER_THREAD).sum(axis=1)
            excl = np.cumsum(n) - n
            for th in range(THREADS):
                at = base + excl[th]
                for i in range(PER_THREAD):
                    if flags[th * PER_THREAD + i]:
                        order[at] = p0 + th * PER_THREAD + i
                        at += 1
            base += n.sum()
    return order, offs, tiles


def projection(x16: np.ndarray, w: np.ndarray, s: np.ndarray, z: np.ndarray | None, lay, e: int, bias) -> np.ndarray:
    """qk_moe_gemm_tile + the bias: rows x16 (M, K) fp16 values; per chunk of 32 the exact sum
    rounded to fp32 and added to the block's fp32 partial; a block's last chunk folds the partial
    in with fmaf(scale, partial, acc)."""
    codes = expert_codes(w, z, lay, e).reshape(lay.N, lay.K).astype(np.float64)
    scale = f32(s[e].reshape(lay.N, lay.blocks).astype(np.float32))
    bs = lay.block_size or 0
    acc = np.zeros((len(x16), lay.N))
    part = np.zeros_like(acc)
    for kk in range(0, lay.K, 32):
        part = f32(part + f32(x16[:, kk : kk + 32] @ codes[:, kk : kk + 32].T))
        if kk + 32 >= lay.K or (bs and (kk + 32) % bs == 0):
            acc = f32(scale[:, kk // bs if bs else 0][None, :] * part + acc)
            part[:] = 0.0
    if bias is not None:
        acc = f32(acc + f32(bias[e].astype(np.float32))[None, :])
    return acc


def grouped_model(args: tuple, attrs: dict) -> np.ndarray:
    """The grouped path's output for the oracle's call (args, attrs), in the input's dtype."""
    (x, logits, w1, s1, b1, w2, s2, b2, z1, z2, rw) = args
    lay = check_qmoe_args(*args, **attrs)
    T, H, E, k = lay.tokens, lay.hidden, lay.experts, attrs["k"]
    sel, wts = route(logits, k, op="qmoe", normalize_routing_weights=attrs["normalize_routing_weights"],
                     router_weights=rw)  # fmt: skip
    live = wts > SKIP_QMOE
    order, offs, tiles = scatter_model(sel, live, E)
    assert (np.sort(order[: offs[E]]) == np.flatnonzero(live.reshape(-1))).all()
    for e in range(E):  # stable, and each expert's tiles cover its pairs
        mine = order[offs[e] : offs[e + 1]]
        assert (np.diff(mine) > 0).all() and (sel.reshape(-1)[mine] == e).all()
        assert (tiles[e + 1] - tiles[e]) * GM >= len(mine) > (tiles[e + 1] - tiles[e] - 1) * GM
    assert tiles[E] <= -(-T * k // GM) + E  # the launcher's grid bound
    xt = f16(x.reshape(T, H).astype(np.float32))
    act = attrs["activation_type"]
    alpha, beta, limit = attrs["activation_alpha"], attrs["activation_beta"], attrs["swiglu_limit"]
    Y = np.zeros((T * k, H))
    for e in range(E):
        pairs = order[offs[e] : offs[e + 1]]
        if not len(pairs):
            continue
        h = projection(xt[pairs // k], w1, s1, z1, lay.fc1, e, b1)
        a = f16(expert_activation(h.astype(np.float32), act, alpha, beta, limit).astype(np.float64))
        Y[pairs] = projection(a, w2, s2, z2, lay.fc2, e, b2)
    out = np.zeros((T, H))
    wf = wts.astype(np.float32).astype(np.float64)
    for j in range(k):
        keep = live[:, j][:, None]
        out = np.where(keep, f32(out + f32(wf[:, j][:, None] * Y[np.arange(T) * k + j])), out)
    return out.astype(lay.dtype).reshape(lay.shape)


def _cases() -> list:
    op = get_op("qmoe_ragged_mm")
    picked = []
    for leaf in op.leaves:
        picked += [(op, c) for c in op.cases(leaf.name, 1)]
    big = [c for c in op.cases("Xfp16_Wu4_Yfp16", 2) if c.seed in (11, 12, 13, 15, 18, 19, 402)]
    big += [c for c in op.cases("Xfp16_Wu8_Yfp16", 2) if c.seed in (10, 16, 403)]
    big += [c for c in op.cases("Xfp32_Wu4_Yfp32", 2) if c.seed in (14, 17, 401)]
    return picked + [(op, c) for c in big]


CASES = _cases()


@pytest.mark.parametrize("op,case", CASES, ids=[c.id for _, c in CASES])
def test_grouped_model_passes_under_storage_fp16(op, case) -> None:
    inputs = op.make_inputs(case)
    args, attrs = qmoe_call(inputs, op.params(case))
    got = grouped_model(args, attrs)
    result = Prepared.from_inputs(op, case, inputs, FP16).verify(op, got)
    assert result.ok, result.detail


def test_grouped_rounding_needs_the_contract() -> None:
    """The strict bound has no room for fp16 fc inputs: some case's model output fails it, so the
    launcher runs the grouped kernels only under storage=fp16."""
    failed = 0
    for op, case in CASES:
        inputs = op.make_inputs(case)
        args, attrs = qmoe_call(inputs, op.params(case))
        failed += not Prepared.from_inputs(op, case, inputs, STRICT).verify(op, grouped_model(args, attrs)).ok
    assert failed


def test_scatter_model_is_stable_across_passes() -> None:
    """More pairs than one pass of the scatter (2048): the order is still the stable one."""
    rng = np.random.default_rng(7)
    sel = rng.integers(0, 5, (1500, 3))
    live = rng.random((1500, 3)) > 0.1
    order, offs, tiles = scatter_model(sel, live, 5)
    want = np.concatenate([np.flatnonzero((sel.reshape(-1) == e) & live.reshape(-1)) for e in range(5)])
    assert (order[: offs[5]] == want).all()
    assert tiles[5] == sum(-(-int(((sel == e) & live).sum()) // GM) for e in range(5))

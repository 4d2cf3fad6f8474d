"""A lane-level numpy model of the matrix-unit decode kernels of src/qconform/device/kernels/ort/gqa.hip
(``qk_gqa_mma_*``, launcher qconform.device.ort.group_query_attention): each 32-lane group's
loads of K / V row pieces as bytes at the kernel's offsets, its fragments (the int8 codes through
the byte permutes and the fp16 magic number, fp16 V pairs packed across two key rows), the
mma.m16n8k16 of the PTX fragment layout (qk_portable.h's comment: products exact, the sum in
float64 then rounded to fp32: the unit's order is its own), the online softmax of a quad, P split
into hi + lo fp16 halves, the merge of the four groups and the combine of the splits in split
order. Its outputs pass the catalogue's strict check (the device suite's verdict) on coverage 1
of gqa_decode and gqa_prefill for the leaves the mma kernels take (fp16 queries, fp16 or int8
per-tensor caches, head sizes 16 / 32 / 64 / 128), with the launcher's splits and with splits of
5 keys; the check catches the device mutants' arithmetic (P's lo half dropped, the V fragment's
two key pairs swapped; the groups' merge needs more than 16 keys a split, coverage 2's; not the
lo rows of P V left unrescaled: 2^-11 of the output, inside the fp16 output's rounding here)."""

from __future__ import annotations

import numpy as np
import pytest
from gqa_model_common import combine_splits, layout_and_query

from qconform.ops import get_op
from qconform.ops.ort.group_query_attention import gqa_call
from qconform.oracles.ort import group_query_attention
from qconform.properties.checks import Prepared

F32 = np.float32
NEG_INF = F32(-np.inf)
SMS, MG, MH, MK, PS = 132, 4, 8, 16, F32(32768.0)
# (cache kind, head size) -> (KW, VW, CTAs per SM): the QK_GQA_MMA instantiations
GEOMETRY = {
    (1, 16): (8, 4, 3),
    (1, 32): (16, 8, 3),
    (1, 64): (16, 16, 3),
    (1, 128): (16, 16, 2),
    (2, 16): (4, 2, 3),
    (2, 32): (8, 4, 3),
    (2, 64): (16, 8, 3),
    (2, 128): (16, 16, 3),
}


def h2f(bits: np.ndarray) -> np.ndarray:
    """fp16 bits (uint16 / uint32 low halves) as float32 values."""
    return np.asarray(bits, np.uint32).astype(np.uint16).view(np.float16).astype(F32)


def f2h(v: np.ndarray) -> np.ndarray:
    """float32 -> fp16 bits (round to nearest even), uint32."""
    return np.asarray(v, F32).astype(np.float16).view(np.uint16).astype(np.uint32)


def pair_vals(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return h2f(w & 0xFFFF), h2f(w >> 16)


def prmt(x: np.ndarray, y: np.ndarray, sel: int) -> np.ndarray:
    """CUDA __byte_perm: the bytes of {y:x} picked by the low 3 bits of sel's nibbles."""
    src = (np.asarray(y, np.uint64) << 32) | np.asarray(x, np.uint64)
    out = np.zeros_like(src)
    for k in range(4):
        nib = (sel >> (4 * k)) & 7
        out |= ((src >> (8 * nib)) & 0xFF) << (8 * k)
    return out.astype(np.uint32)


def i8pair(x: np.ndarray, y: np.ndarray, sel: int) -> np.ndarray:
    """qk_gqa_i8pair: the biased bytes under 1024's exponent, minus 1152 (exact)."""
    t = (prmt(x, y, sel) & 0x00FF00FF) | 0x64006400
    lo, hi = pair_vals(t)
    return f2h(lo - F32(1152)) | (f2h(hi - F32(1152)) << 16)


def load(buf: np.ndarray, addr: np.ndarray, w: int) -> list[np.ndarray]:
    """Per lane, the words of w bytes at byte address addr (w = 2: the low half of one word)."""
    words = []
    for k in range(max(1, w // 4)):
        nb = min(4, w)
        v = np.zeros(addr.shape, np.uint32)
        for j in range(nb):
            v |= buf[addr + 4 * k + j].astype(np.uint32) << (8 * j)
        words.append(v)
    return words


def mma(d: np.ndarray, a: list[np.ndarray], b: list[np.ndarray]) -> np.ndarray:
    """D (per lane 4 fp32) += A B in the PTX m16n8k16 fragment layout (lane = 4 g + t)."""
    lane = np.arange(32)
    g, t = lane // 4, lane % 4
    A, B, D = np.zeros((16, 16)), np.zeros((16, 8)), np.zeros((16, 8))
    for reg, (r0, c0) in enumerate(((0, 0), (8, 0), (0, 8), (8, 8))):
        lo, hi = pair_vals(a[reg])
        A[g + r0, 2 * t + c0], A[g + r0, 2 * t + c0 + 1] = lo, hi
    for reg, k0 in enumerate((0, 8)):
        lo, hi = pair_vals(b[reg])
        B[2 * t + k0, g], B[2 * t + k0 + 1, g] = lo, hi
    D[g, 2 * t], D[g, 2 * t + 1], D[g + 8, 2 * t], D[g + 8, 2 * t + 1] = d[:, 0], d[:, 1], d[:, 2], d[:, 3]
    D = (D + A @ B).astype(F32)
    return np.stack([D[g, 2 * t], D[g, 2 * t + 1], D[g + 8, 2 * t], D[g + 8, 2 * t + 1]], axis=1)


def mma_kernel_takes(args: tuple, attrs: dict) -> bool:
    """Whether the launcher runs qk_gqa_mma_* on the call (the model's leaves and head sizes)."""
    lay, _ = layout_and_query(args, attrs)
    bits = attrs.get("kv_cache_bit_width", 0)
    kind = 1 if bits == 0 else (2 if bits == 8 and attrs["k_quant_type"] == "PER_TENSOR" else 0)
    return lay.dtype == np.float16 and kind > 0 and lay.head_size in (16, 32, 64, 128)


def cta(q, kb, vb, ctx, lo_half=True, swap_v=False, rescale_lo=True, shift=True):
    """One CTA's split (m, l, acc) for its heads (the merge of its four groups)."""
    KIND, HD, n, nh, ks0, score = ctx["KIND"], ctx["H"], ctx["n"], ctx["nh"], ctx["ks0"], ctx["score"]
    KW, VW, _ = GEOMETRY[(KIND, HD)]
    EB = 2 if KIND == 1 else 1
    KS, SPL, E = HD // 16, KW // (4 * EB), VW // EB
    KL, VL, NT = KS // SPL, HD // (8 * E), HD // 8
    row_bytes = HD * EB
    lane = np.arange(32)
    gq, tq = lane // 4, lane % 4
    use = gq < nh
    qa = []
    for s_ in range(KS):
        c = (s_ // SPL) * 16 * SPL + tq * 4 * SPL + (s_ % SPL) * 4
        qv = np.where(use[:, None], q[np.minimum(gq, nh - 1)[:, None], c[:, None] + np.arange(4)], 0).astype(F32)
        qa.append((f2h(qv[:, 0]) | (f2h(qv[:, 1]) << 16), f2h(qv[:, 2]) | (f2h(qv[:, 3]) << 16)))
    groups = []
    for grp in range(MG):
        acc = np.zeros((NT, 32, 4), F32)
        m, lsum = np.full(32, NEG_INF), np.zeros(32, F32)
        for t0 in range(grp * MK, n, MG * MK):
            kw = []
            for nt in range(2):
                i = np.minimum(t0 + nt * 8 + gq, n - 1)
                base = i * row_bytes + tq * KW
                kw.append([load(kb, base + li * 4 * KW, KW) for li in range(KL)])
            vw = []
            for r in range(4):
                kr = 2 * tq + (r & 1) + (r >> 1) * 8
                i = np.minimum(t0 + kr, n - 1)
                base = i * row_bytes + gq * VW
                vw.append([load(vb, base + lv * 8 * VW, VW) for lv in range(VL)])
            d = [np.zeros((32, 4), F32) for _ in range(2)]
            zero = np.zeros(32, np.uint32)
            for nt in range(2):
                for s_ in range(KS):
                    if KIND == 1:
                        bf = [kw[nt][s_ // SPL][2 * (s_ % SPL)], kw[nt][s_ // SPL][2 * (s_ % SPL) + 1]]
                    else:
                        w = kw[nt][s_ // SPL][s_ % SPL] ^ np.uint32(0x80808080)
                        bf = [i8pair(w, zero, 0x3130), i8pair(w, zero, 0x3332)]
                    d[nt] = mma(d[nt], [qa[s_][0], zero, qa[s_][1], zero], bf)
            x = np.full((32, 4), NEG_INF)
            for k in range(4):
                kk = (k >> 1) * 8 + 2 * tq + (k & 1)
                dk = d[k >> 1][:, k & 1]
                if KIND == 2:
                    dk = (dk * ks0).astype(F32)
                for ln in range(32):
                    if t0 + kk[ln] < n and use[ln]:
                        x[ln, k] = score(F32(dk[ln]), int(gq[ln]), int(t0 + kk[ln]))
            mt = x.max(axis=1)
            mt = np.maximum(mt, mt[lane ^ 1])
            mt = np.maximum(mt, mt[lane ^ 2])
            mn = np.maximum(m, mt)
            with np.errstate(invalid="ignore"):
                c = np.where(mn == NEG_INF, F32(1), np.exp((m - mn).astype(F32)).astype(F32)).astype(F32)
            resc = c != 1
            lsum = np.where(resc, (lsum * c).astype(F32), lsum)
            scaled = (acc * c[None, :, None]).astype(F32)
            if not rescale_lo:
                scaled[:, :, 2:] = acc[:, :, 2:]
            acc = np.where(resc[None, :, None], scaled, acc)
            m = mn
            pa = []
            for half in range(2):
                hs, ls = [], []
                for j in range(2):
                    xv = x[:, 2 * half + j]
                    with np.errstate(invalid="ignore"):
                        p = np.where(xv == NEG_INF, F32(0), np.exp((xv - mn).astype(F32)).astype(F32)).astype(F32)
                    lsum = (lsum + p).astype(F32)
                    ps = (p * PS).astype(F32)
                    hb = f2h(ps)
                    lb = f2h(((ps - h2f(hb)).astype(F32) * F32(2048)).astype(F32))
                    hs.append(hb)
                    ls.append(lb if lo_half else np.zeros_like(lb))
                pa += [hs[0] | (hs[1] << 16), ls[0] | (ls[1] << 16)]
            for jn in range(NT):
                lv, e = jn // E, jn % E
                bf = []
                for hk in range(2):
                    r0, r1 = vw[2 * hk][lv], vw[2 * hk + 1][lv]
                    if KIND == 1:
                        bf.append(prmt(r0[e // 2], r1[e // 2], 0x7632 if e & 1 else 0x5410))
                    else:
                        sel = (e % 4) | ((4 + e % 4) << 8)
                        x80 = np.uint32(0x80808080)
                        bf.append(i8pair(r0[e // 4] ^ x80, r1[e // 4] ^ x80, sel))
                if swap_v:
                    bf = bf[::-1]
                acc[jn] = mma(acc[jn], pa, bf)
        lsum = (lsum + lsum[lane ^ 1]).astype(F32)
        lsum = (lsum + lsum[lane ^ 2]).astype(F32)
        out = np.zeros((MH, HD), F32)
        for jn in range(NT):
            for j in range(2):
                col = 2 * tq + j
                ch = (jn // E) * 8 * E + col * E + jn % E
                v = (acc[jn][:, j] + (acc[jn][:, 2 + j] * F32(1 / 2048)).astype(F32)).astype(F32)
                out[gq, ch] = (v * F32(1 / 32768)).astype(F32)
        groups.append((m[::4], lsum[::4], out))
    res = []
    for h in range(nh):
        M = max(gm[h] for gm, _, _ in groups)
        tot, a = F32(0), np.zeros(HD, F32)
        for gm, gl, gacc in groups:
            if gm[h] == NEG_INF and gl[h] == 0:
                continue
            f = F32(np.exp(F32(gm[h] - M))) if shift else F32(1)
            tot = F32(tot + F32(gl[h] * f))
            a = (a + (gacc[h] * f).astype(F32)).astype(F32)
        res.append((M, tot, a))
    return res


def mma_decode_model(args: tuple, attrs: dict, pk: np.ndarray, pv: np.ndarray, chunk_keys: int = 0, **mut):
    """The kernels' output (B, S, N H) in fp16."""
    bias, sink_in, k_scale, v_scale = args[10:]
    lay, q = layout_and_query(args, attrs)
    B, S, N, Nk, H = lay.batch, lay.sequence_length, lay.num_heads, lay.kv_num_heads, lay.head_size
    T, Tp = lay.total_sequence_length, pk.shape[2]
    totals, pasts = lay.total_lengths, lay.past_lengths
    bits = attrs.get("kv_cache_bit_width", 0)
    KIND = 2 if bits else 1
    q = q.astype(F32)
    scale = attrs.get("scale", 0.0)
    alpha = F32(scale) if scale else F32(1) / np.sqrt(F32(H), dtype=F32)
    cap = F32(attrs.get("softcap", 0.0))
    window = attrs.get("local_window_size", -1)
    sink = None if sink_in is None else sink_in.astype(F32)
    if sink is None and attrs.get("smooth_softmax", -1) == 1:
        sink = np.zeros(N, F32)
    G = N // Nk
    nhb = -(-G // MH)
    resident = GEOMETRY[(KIND, H)][2]
    tiles = -(-T // (MG * MK))
    want = min(max(1, SMS * resident // (B * S * Nk * nhb)), tiles, 512)
    chunk = -(-tiles // want) * MG * MK
    if chunk_keys:
        chunk = chunk_keys
    splits = -(-T // chunk)
    kbytes = pk.view(np.uint8).reshape(B, Nk, Tp, -1)
    vbytes = pv.view(np.uint8).reshape(B, Nk, Tp, -1)
    ks0 = F32(k_scale.reshape(-1)[0]) if bits else F32(1)
    vs0 = F32(v_scale.reshape(-1)[0]) if bits else F32(1)
    out = np.zeros((B, S, N, H), F32)
    for b in range(B):
        total, past = int(totals[b]), int(pasts[b])
        for s in range(S):
            L = min(past + s + 1, total)
            lo = L - window if window >= 1 and L > window else 0
            for g in range(Nk):
                for hb in range(nhb):
                    h0 = g * G + hb * MH
                    nh = min(MH, G - hb * MH)
                    parts = []
                    for sp in range(splits):
                        k0, k1 = max(lo, sp * chunk), min(L, (sp + 1) * chunk)
                        n = max(0, k1 - k0)
                        if n == 0:
                            parts.append([(NEG_INF, F32(0), None)] * nh)
                            continue

                        def score(dk, h, i, b=b, s=s, k0=k0, h0=h0):
                            x = F32(dk * alpha)
                            if cap > 0:
                                x = F32(F32(np.tanh(F32(x / cap))) * cap)
                            if bias is not None:
                                bb = bias[min(b, bias.shape[0] - 1), min(h0 + h, bias.shape[1] - 1)]
                                x = F32(x + F32(bb[s, k0 + i]))
                            return x

                        ctx = {"KIND": KIND, "H": H, "n": n, "nh": nh, "ks0": ks0, "score": score}
                        kb = kbytes[b, g, k0:].reshape(-1)
                        vb = vbytes[b, g, k0:].reshape(-1)
                        res = cta(q[b, h0 : h0 + nh, s], kb, vb, ctx, **mut)
                        parts.append([(M, tot, (a * vs0).astype(F32) if bits else a) for M, tot, a in res])
                    for h in range(nh):
                        n_ = h0 + h
                        hp = [p[h] for p in parts]
                        out[b, s, n_] = combine_splits(hp, None if sink is None else sink[n_], H)
    return out.reshape(B, S, N * H).astype(np.float16)


def _cases() -> list:
    picked = []
    for name in ("gqa_decode", "gqa_prefill"):
        op = get_op(name)
        for leaf in ("Xfp16_Wfp16_Yfp16", "Xfp16_Wi8_Yfp16"):
            for c in op.cases(leaf, 1):
                args, attrs = gqa_call(op.make_inputs(c), op.params(c))
                if mma_kernel_takes(args, attrs):
                    picked.append((op, c))
    return picked


CASES = _cases()


def _run(op, case, chunk_keys: int = 0, **mut):
    inputs = op.make_inputs(case)
    args, attrs = gqa_call(inputs, op.params(case))
    _, pk, pv = group_query_attention(*args, **attrs)
    got = mma_decode_model(args, attrs, pk, pv, chunk_keys, **mut)
    return Prepared.from_case(op, case).verify(op, (got, pk, pv))


@pytest.mark.parametrize("chunk_keys", [0, 5], ids=["launcher_splits", "splits_of_5_keys"])
@pytest.mark.parametrize("op,case", CASES, ids=[f"{op.name}-{c.id}" for op, c in CASES])
def test_mma_decode_model_passes_the_strict_check(op, case, chunk_keys) -> None:
    result = _run(op, case, chunk_keys)
    assert result.ok, result.detail


def test_every_mma_leaf_has_cases() -> None:
    """Coverage 1 reaches the mma kernels on both leaves (the device mutant rows rely on it)."""
    assert {c.leaf for _, c in CASES} == {"Xfp16_Wfp16_Yfp16", "Xfp16_Wi8_Yfp16"}


MUTANTS = [{"swap_v": True}, {"lo_half": False}]


@pytest.mark.parametrize("mut", MUTANTS, ids=["v_pairs_swapped", "p_lo_dropped"])
def test_the_check_catches_the_mutants(mut) -> None:
    """The model with a device mutant's arithmetic fails the check on some case."""
    assert any(not _run(op, case, **mut).ok for op, case in CASES)


def _decode_cases_2() -> list:
    op = get_op("gqa_decode")
    picked = []
    for leaf in ("Xfp16_Wfp16_Yfp16", "Xfp16_Wi8_Yfp16"):
        for c in op.cases(leaf, 2):
            args, attrs = gqa_call(op.make_inputs(c), op.params(c))
            if c.shape[-1] == 128 and mma_kernel_takes(args, attrs):
                picked.append((op, c))
    return picked


CASES_2 = _decode_cases_2()


@pytest.mark.parametrize("op,case", CASES_2, ids=[f"{op.name}-{c.id}" for op, c in CASES_2])
def test_mma_decode_model_on_the_real_heads(op, case) -> None:
    """Coverage 2's head size 128 decodes (32/8, 40/10, 64/8 heads; 128..1024 keys: the four groups
    and several splits take keys) pass; the groups merged without their shift fail (device row
    "gqa mma: groups merged unshifted", coverage 2)."""
    result = _run(op, case)
    assert result.ok, result.detail
    assert not _run(op, case, shift=False).ok

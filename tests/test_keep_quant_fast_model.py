"""Offline model of the fast keep-quant GEMV's integer layout (``kernels/ggml/keep_quant_fast.hip``,
run under the contract order=any): each thread slice's words as the kernel loads them (16-byte slices,
Q6_K / Q8_0 realigned from aligned words by halves), its nibble / high-bit unpacking, the branch-free
scale and min unpacking, the dp4a sums, the activation words and bsums it reads (Q8_K quants as
words in element order, as the kernel assembles them from the quantized blocks; Q8_0 in the
``qk_q8_0_quant_words`` layout), and its per-slice terms, evaluated in float64 (the kernel's own code runs on
the host in tests/test_keep_quant_fast_host.py). The
sum of the terms must equal the float64 reference of the quantized operands
(``qconform.ops.ggml.keep_quant.matmul_terms``) to float64 rounding: a wrong index, shift or scale
in the layout moves it by many orders of magnitude more. A broken copy of the model must fail."""

from __future__ import annotations

import numpy as np
import pytest

from qconform.formats.ggml import FORMATS
from qconform.ops.ggml.keep_quant import matmul_terms
from qconform.ops.ggml.q8_quant import finite_scales
from qconform.oracles.ggml import quantize

U32 = np.uint32
TS = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210, "Q8_0": 34}


def _u32(buf: np.ndarray, off: np.ndarray) -> np.ndarray:
    """Little-endian words at byte offsets ``off`` (4-byte aligned) of ``buf``."""
    assert np.all(off % 4 == 0)
    b = buf[off[..., None] + np.arange(4)].astype(U32)
    return b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)


def _u16(buf: np.ndarray, off: np.ndarray) -> np.ndarray:
    assert np.all(off % 2 == 0)
    return buf[off].astype(U32) | (buf[off + 1].astype(U32) << 8)


def _load16(buf: np.ndarray, p: np.ndarray) -> list[np.ndarray]:
    """kf_raw16 + kf_align16: the aligned words from p & ~3 and the half word at base + 14 + mis,
    realigned with byte_perm 0x5432 where p is 2 past a word."""
    mis = p & 2
    base = p - mis
    r = [_u32(buf, base + 4 * k) for k in range(4)] + [_u16(buf, base + 14 + mis)]
    return [np.where(mis != 0, (r[k] >> 16) | ((r[k + 1] << 16) & 0xFFFFFFFF), r[k]).astype(U32) for k in range(4)]


def _dot4(q: list[np.ndarray], a: list[np.ndarray]) -> np.ndarray:
    """dp4a chains: the signed bytes of q times those of a, summed."""
    s = np.zeros(q[0].shape, np.int64)
    for qw, aw in zip(q, a, strict=True):
        for k in range(4):
            s += ((qw >> (8 * k)) & 0xFF).astype(np.int8).astype(np.int64) * (
                ((aw >> (8 * k)) & 0xFF).astype(np.int8).astype(np.int64)
            )
    return s


def _half(w: np.ndarray, hi: int) -> np.ndarray:
    return ((w >> 16) if hi else (w & 0xFFFF)).astype(np.uint16).astype(np.int16).astype(np.int64)


def _fp16(bits: np.ndarray) -> np.ndarray:
    return bits.astype(np.uint16).view(np.float16).astype(np.float64)


def _q8_k_words(a8: np.ndarray, nb: int) -> np.ndarray:
    """Q8_K blocks as words (the qk_q8_k_words layout): per block 76 words, 0..71 the bytes 4..291
    (quants in element order, then the bsums), 72 the fp32 d bits."""
    blocks = a8.reshape(-1, 292)
    out = np.zeros((len(blocks), 76), U32)
    out[:, :72] = blocks[:, 4:292].copy().view("<u4")
    out[:, 72] = blocks[:, 0:4].copy().view("<u4")[:, 0]
    return out.reshape(-1, nb, 76)


def _q8_0_words(a8: np.ndarray, nb: int) -> np.ndarray:
    """qk_q8_0_quant_words: per block 12 words, 0..7 the quants, 8 the fp16 d as fp32 bits."""
    blocks = a8.reshape(-1, 34)
    out = np.zeros((len(blocks), 12), U32)
    out[:, :8] = blocks[:, 2:34].copy().view("<u4")
    out[:, 8] = _fp16(blocks[:, 0].astype(U32) | (blocks[:, 1].astype(U32) << 8)).astype(np.float32).view(U32)
    return out.reshape(-1, nb, 12)


def _scale_min_pair(sc: list[np.ndarray], g: int) -> tuple[np.ndarray, np.ndarray]:
    """kf_scale_min_pair"""
    sh = 16 * (g & 1)
    a, b, c = (w >> sh for w in sc)
    if g < 2:
        return a & 0x3F3F, b & 0x3F3F
    return (c & 0x0F0F) | ((a >> 2) & 0x3030), ((c >> 4) & 0x0F0F) | ((b >> 2) & 0x3030)


def fast_model(W: np.ndarray, qtype: str, aq: np.ndarray, mutate: str = "") -> np.ndarray:
    """The kernel's per-slice terms in float64, summed: y (M, N). ``aq``: the regrouped activation
    words (M, nb, AW). ``mutate``: a deliberate break (the self-check)."""
    N = W.shape[0]
    buf = W.reshape(-1)
    M, nb, _ = aq.shape
    ts = TS[qtype]
    y = np.zeros((M, N))
    rows = np.arange(N)[:, None] * (nb * ts)
    ib = np.arange(nb)[None, :]
    blk = rows + ib * ts  # (N, nb) byte offsets of every block
    yd = aq[..., 72 if qtype != "Q8_0" else 8].view(np.float32).astype(np.float64)  # (M, nb)
    for c in range(8):
        if qtype in ("Q4_K", "Q5_K"):
            g, half = c >> 1, c & 1
            hd = [_u32(buf, blk + 4 * k) for k in range(4)]
            qw = [_u32(buf, blk + (48 if qtype == "Q5_K" else 16) + 16 * c + 4 * k) for k in range(4)]
            lo = [w & 0x0F0F0F0F for w in qw]
            hi = [(w >> 4) & 0x0F0F0F0F for w in qw]
            if qtype == "Q5_K":
                hw = [_u32(buf, blk + 16 + 16 * half + 4 * k) for k in range(4)]
                gh = 2 * g + (1 if mutate == "q5_high_bit" else 0)
                lo = [lw | (((h >> gh) & 0x01010101) << 4) for lw, h in zip(lo, hw, strict=True)]
                hi = [hw_ | (((h >> (2 * g + 1)) & 0x01010101) << 4) for hw_, h in zip(hi, hw, strict=True)]
            sc01, mn01 = _scale_min_pair(hd[1:], g)
            s0, s1 = (sc01 & 0xFF).astype(np.int64), (sc01 >> 8).astype(np.int64)
            m0, m1 = (mn01 & 0xFF).astype(np.int64), (mn01 >> 8).astype(np.int64)
            if mutate == "q4_min_half":
                m0, m1 = m1, m0
            dx, dmx = _fp16(hd[0] & 0xFFFF), _fp16(hd[0] >> 16)
            for m in range(M):
                a = aq[m]
                alo = [a[:, 16 * g + 4 * half + k][None, :] for k in range(4)]
                ahi = [a[:, 16 * g + 8 + 4 * half + k][None, :] for k in range(4)]
                b0, b1 = _half(a[:, 64 + 2 * g], half)[None, :], _half(a[:, 65 + 2 * g], half)[None, :]
                isum = s0 * _dot4(lo, alo) + s1 * _dot4(hi, ahi)
                imin = m0 * b0 + m1 * b1
                y[m] += (dx * yd[m][None, :] * isum - dmx * yd[m][None, :] * imin).sum(axis=1)
        elif qtype == "Q6_K":
            h, p = c >> 2, c & 3
            k = p >> 1
            ql = _load16(buf, blk + 64 * h + 16 * p)
            qh = _load16(buf, blk + 128 + 32 * h + 16 * (p & 1))
            sh = 2 * k - (2 if mutate == "q6_high_shift" and k else 0)
            lo = [(lw & 0x0F0F0F0F) | (((hw >> sh) & 0x03030303) << 4) for lw, hw in zip(ql, qh, strict=True)]
            pairs = list(zip(ql, qh, strict=True))
            hi = [((lw >> 4) & 0x0F0F0F0F) | (((hw >> (2 * k + 4)) & 0x03030303) << 4) for lw, hw in pairs]
            i0 = 8 * h + 2 * k + (p & 1)
            s0 = buf[blk + 192 + i0].astype(np.int8).astype(np.int64)
            s1 = buf[blk + 196 + i0].astype(np.int8).astype(np.int64)
            dx = _fp16(_u16(buf, blk + 208))
            j = 2 * k + (p & 1)
            for m in range(M):
                a = aq[m]
                base = 32 * h + 8 * k + 4 * (p & 1)
                alo = [a[:, base + v][None, :] for v in range(4)]
                ahi = [a[:, base + 16 + v][None, :] for v in range(4)]
                bw = [a[:, 64 + 4 * h + v] for v in range(4)]
                b0 = _half(bw[j >> 1], j & 1)[None, :]
                b1 = _half(bw[2 + (j >> 1)], j & 1)[None, :]
                isum = s0 * (_dot4(lo, alo) - 32 * b0) + s1 * (_dot4(hi, ahi) - 32 * b1)
                y[m] += (dx * yd[m][None, :] * isum).sum(axis=1)
        else:
            if c >= 2:  # Q8_0: slices 0, 1 of every block (the kernel's 8 threads take 4 blocks)
                continue
            q = _load16(buf, blk + 2 + 16 * c)
            dx = _fp16(_u16(buf, blk))
            for m in range(M):
                a = aq[m]
                sumi = _dot4(q, [a[:, 4 * c + k][None, :] for k in range(4)])
                y[m] += (dx * yd[m][None, :] * sumi).sum(axis=1)
    return y


def _case(qtype: str, M: int, N: int, K: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    fmt = FORMATS[qtype]
    W = finite_scales(fmt, rng.integers(0, 256, (N, fmt.n_bytes(K)), dtype=np.uint8), rng)
    A = rng.standard_normal((M, K)).astype(np.float32)
    afmt = "Q8_0" if qtype == "Q8_0" else "Q8_K"
    a8 = quantize(A, afmt)
    nb = K // FORMATS[afmt].block_size
    aq = _q8_0_words(a8, nb) if qtype == "Q8_0" else _q8_k_words(a8, nb)
    return W, a8, aq


# K = 768: an odd number of Q6_K super-blocks (rows start 2 past a word), Q8_0 24 blocks
@pytest.mark.parametrize("qtype", list(TS))
def test_fast_layout_sums_to_the_float64_reference(qtype: str) -> None:
    W, a8, aq = _case(qtype, 3, 5, 768, 11)
    ref = matmul_terms(W, qtype, a8)
    got = fast_model(W, qtype, aq)
    scale = ref["mag"].max()
    assert np.max(np.abs(got - ref["ref"])) <= 1e-12 * scale


@pytest.mark.parametrize(
    "qtype,mutate", [("Q4_K", "q4_min_half"), ("Q5_K", "q5_high_bit"), ("Q6_K", "q6_high_shift")]
)
def test_fast_layout_model_catches_a_broken_layout(qtype: str, mutate: str) -> None:
    W, a8, aq = _case(qtype, 2, 4, 512, 12)
    ref = matmul_terms(W, qtype, a8)
    got = fast_model(W, qtype, aq, mutate)
    assert np.max(np.abs(got - ref["ref"])) > 1e-6 * ref["mag"].max()

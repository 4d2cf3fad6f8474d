"""A numpy model of ``bnb/gemm_mma.hip`` (gemm_4bit's cpu reading on mma.sync m16n8k16): the
kernel's own index arithmetic per lane (which bytes of W and which activations each lane loads,
how it fills the A and B fragments), the fragments' meaning as PTX defines it (PTX ISA "Matrix
Fragments for mma.m16n8k16 with floating point type", as in qk_portable.h's qk_mma_16816), the
warps' K split and the reduction through shared memory in warp order. The tensor core's sums are
modelled as the exact sum of each mma's 16 products rounded once to fp32 and added to the fp32
accumulator (any fp32 order is the reading's). A byte decodes through the pair table as laid out
in shared memory and addressed by the build's offset: ``build="prmt"`` (CUDA: 32 copies, PTX
``prmt.b32`` as __byte_perm emits it) or ``"tab16"`` (HIP and -DQK_BNBM_TAB16: 16 copies, a shift
and a mask). ``mutant`` names a deliberately broken variant (the device catalogue's rows of the
same names): the model must fail the op's bound with it."""

from __future__ import annotations

import numpy as np

from qconform.formats.bf16 import fp32_to_bf16_bits
from qconform.oracles.bnb.codes import native_4bit_table

WARPS, STEP, ROWS = 8, 128, 16
MUTANTS = ("nibbles swapped", "absmax of the previous block", "second n-half dropped", "PRMT offset of the byte beside")
COPIES = {"prmt": 32, "tab16": 16}  # the kernel's QK_BNBM_COPIES per build


def _to_t(v: np.ndarray, dtype: str) -> np.ndarray:
    """float32 -> T (nearest even) -> float32."""
    v = np.asarray(v, np.float32)
    if dtype == "float16":
        return v.astype(np.float16).astype(np.float32)
    return (fp32_to_bf16_bits(v, "rne").astype(np.uint32) << 16).view(np.float32)


def _prmt(a: int, b: int, sel: int) -> int:
    """PTX prmt.b32, default mode: byte i of the result is byte (sel >> 4 i) & 7 of {b, a} (a's bytes
    0-3, b's 4-7; the selectors here never set bit 3, the sign replication)."""
    src = a | (b << 32)
    return sum(((src >> (8 * ((sel >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))


def _offset(word: int, j: int, lane: int, build: str, mutant: str | None) -> int:
    """Byte offset in the table of byte j of ``word`` for ``lane`` (qk_bnbm_decode's addressing)."""
    low = 8 * (lane % COPIES[build])
    if build == "prmt":
        jj = j ^ 1 if mutant == "PRMT offset of the byte beside" else j
        return _prmt(word, low, 0x5504 | (jj << 4))
    return (((word << 7) if j == 0 else (word >> (8 * j - 7))) & 0x7F80) | low  # qk_bnb_pair_at


def _table(table: np.ndarray, build: str, mutant: str | None) -> np.ndarray:
    """The shared table as the kernel fills it: entry i (8 bytes) is byte i // COPIES's centroid pair
    (high nibble, low nibble)."""
    e = np.arange(256 * COPIES[build]) // COPIES[build]
    hi, lo = (e & 15, e >> 4) if mutant == "nibbles swapped" else (e >> 4, e & 15)
    return np.stack([table[hi], table[lo]], axis=1).astype(np.float32)


def _pair(word: int, j: int, lane: int, s: float, tab: np.ndarray, dtype: str, build: str, mutant: str | None):
    """qk_bnbm_decode: the entry at byte j's offset, times s, each rounded to T."""
    return _to_t(tab[_offset(word, j, lane, build, mutant) // 8] * np.float32(s), dtype)


def gemm_mma(
    a: np.ndarray, packed: np.ndarray, absmax: np.ndarray, bias: np.ndarray | None, N: int, K: int, blocksize: int,
    quant_type: str, dtype: str, mutant: str | None = None, build: str = "prmt",
) -> np.ndarray:  # fmt: skip
    """``a``: (M, K) T values as float32, M <= 16; ``bias``: (N,) T values as float32 or None. Returns
    (M, N) float32 holding T values, as the kernel stores them."""
    M = a.shape[0]
    NT = 1 if M <= 8 else 2
    tab = _table(native_4bit_table(quant_type).astype(np.float32), build, mutant)
    shift = blocksize.bit_length() - 1
    steps = -(-K // STEP)
    out = np.zeros((M, N), np.float32)
    for n0 in range(0, N, ROWS):
        red = np.zeros((WARPS, 4 * NT, 32), np.float32)
        for warp in range(WARPS):
            D = np.zeros((NT, 16, 8), np.float32)
            for s in range(warp, steps, WARPS):
                afrag = np.zeros((8, 32, 4, 2), np.float32)  # mma i, lane, register, half
                bfrag = np.zeros((NT, 8, 32, 2, 2), np.float32)
                for lane in range(32):
                    g, t = lane >> 2, lane & 3
                    k = STEP * s + 32 * t
                    if k >= K:
                        continue  # zero weights, scale and activations
                    rows = [min(n0 + g, N - 1), min(n0 + g + 8, N - 1)]
                    w = [packed[(r * K + k) // 2 : (r * K + k) // 2 + 16].view("<u4") for r in rows]  # 4 words
                    blk = [(r * K + k) >> shift for r in rows]
                    if mutant == "absmax of the previous block":
                        blk = [b - (b > 0) for b in blk]
                    sc = [absmax[b] for b in blk]
                    for i in range(8):
                        wd, j0 = i >> 1, 2 * (i & 1)  # byte 2i: word i >> 1, byte 2 (i & 1)
                        w0, w1 = int(w[0][wd]), int(w[1][wd])
                        afrag[i, lane, 0] = _pair(w0, j0, lane, sc[0], tab, dtype, build, mutant)
                        afrag[i, lane, 1] = _pair(w1, j0, lane, sc[1], tab, dtype, build, mutant)
                        afrag[i, lane, 2] = _pair(w0, j0 + 1, lane, sc[0], tab, dtype, build, mutant)
                        afrag[i, lane, 3] = _pair(w1, j0 + 1, lane, sc[1], tab, dtype, build, mutant)
                        for nt in range(NT):
                            tok = 8 * nt + g
                            if tok >= M:
                                continue
                            v = a[tok, k + 8 * (i >> 1) : k + 8 * (i >> 1) + 8]  # act[nt][i >> 1]
                            off = 4 * (i & 1)  # (x, y) or (z, w)
                            bfrag[nt, i, lane, 0] = v[off : off + 2]
                            bfrag[nt, i, lane, 1] = v[off + 2 : off + 4]
                for i in range(8):
                    A16 = np.zeros((16, 16), np.float64)
                    for lane in range(32):
                        g, t = lane >> 2, lane & 3
                        A16[g, 2 * t : 2 * t + 2] = afrag[i, lane, 0]
                        A16[g + 8, 2 * t : 2 * t + 2] = afrag[i, lane, 1]
                        A16[g, 2 * t + 8 : 2 * t + 10] = afrag[i, lane, 2]
                        A16[g + 8, 2 * t + 8 : 2 * t + 10] = afrag[i, lane, 3]
                    for nt in range(NT):
                        if mutant == "second n-half dropped" and nt == 1:
                            continue
                        B16 = np.zeros((16, 8), np.float64)
                        for lane in range(32):
                            g, t = lane >> 2, lane & 3
                            B16[2 * t : 2 * t + 2, g] = bfrag[nt, i, lane, 0]
                            B16[2 * t + 8 : 2 * t + 10, g] = bfrag[nt, i, lane, 1]
                        D[nt] = (D[nt] + (A16 @ B16).astype(np.float32)).astype(np.float32)
            for nt in range(NT):
                for lane in range(32):
                    g, t = lane >> 2, lane & 3
                    for r in range(4):
                        red[warp, 4 * nt + r, lane] = D[nt, g + 8 * (r >> 1), 2 * t + (r & 1)]
        for e in range(4 * NT * 32):
            lane, r = e & 31, e >> 5
            nt, rr = r >> 2, r & 3
            n, tok = n0 + (lane >> 2) + 8 * (rr >> 1), 8 * nt + 2 * (lane & 3) + (rr & 1)
            v = red[0, r, lane]
            for w_ in range(1, WARPS):
                v = np.float32(v + red[w_, r, lane])
            if n < N and tok < M:
                if bias is not None:
                    v = np.float32(v + bias[n])
                out[tok, n] = _to_t(v, dtype)
    return out

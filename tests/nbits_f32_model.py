"""A numpy model of the fp32-activation ring decode (``qk_nbits_mmaa`` with split activations,
kernels/ort/nbits_mma.hip): its pre-pass (per-token power-of-two prescale, fp16 hi + fp16 lo scaled
by 2^LO_SHIFT), the matrix unit's sums (a conservative model of the tensor core's fp32
accumulation: every addend of a step aligned to the largest and truncated ``extra`` bits below its
ulp, the sum rounded toward zero), the per-chunk ``fmaf`` with the block scale, the K split across
warps in warp order, and the epilogue; the split's flags (rows it does not carry) and the
kernel that computes the flagged groups. Used by tests/test_nbits_f32_model.py against the
suite's own bound (``qconform.properties.bounds``)."""

from __future__ import annotations

import numpy as np

from qconform.oracles.ort.matmul_nbits import NBitsLayout, unpack_weights

LO_SHIFT = 12  # lo = fp16((x - hi) * 2^12): |x - hi| <= 8 for |x| < 2^15, so |lo| <= 2^15
HI_TOP = 14  # the prescaled row maximum lies in [2^14, 2^15)
F32_TINY = 2.0**-126
SPLIT_FLOOR = 2.0**-14  # prescaled |x| from here up: hi + lo carry x to 2^-23 of itself (else the row is flagged)


def ftz32(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float32)
    return np.where(np.abs(x) < np.float32(F32_TINY), np.float32(0), x).astype(np.float32)


def prescale_exponent(a: np.ndarray) -> np.ndarray:
    """e per row: max|a| 2^e in [2^14, 2^15), clamped to [-113, 126 - LO_SHIFT] (2^-e and
    2^-(e + LO_SHIFT) stay normal fp32); 0 for a row of zeros / non-finite maxima."""
    mag = np.abs(ftz32(a)).astype(np.float32)
    mag = np.where(np.isfinite(mag), mag, 0).max(axis=-1)
    _, ex = np.frexp(mag)  # mag = f 2^ex, f in [0.5, 1): floor(log2 mag) = ex - 1
    e = np.where(mag > 0, HI_TOP - (ex - 1), 0)
    return np.clip(e, -113, 126 - LO_SHIFT).astype(np.int64)


def split(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hi, lo, e): x = fl32(a 2^e) (flushed), hi = fp16(x), lo = fp16((x - hi) 2^LO_SHIFT), lo = 0
    where hi is not finite; the kernel's pre-pass (``qk_nbits_split_a``)."""
    e = prescale_exponent(a)
    x = ftz32(ftz32(a) * np.ldexp(np.float32(1), e)[:, None].astype(np.float32))
    hi = x.astype(np.float16)
    d = ftz32(x - hi.astype(np.float32))  # exact (Sterbenz), flushed like the device
    lo = ftz32(d * np.float32(2.0**LO_SHIFT)).astype(np.float16)
    lo = np.where(np.isfinite(hi), lo, np.float16(0))
    return hi, lo, e


def flagged(a: np.ndarray) -> np.ndarray:
    """Per row: a finite nonzero activation (flushed) whose prescaled x = fl32(a 2^e) (flushed)
    is below SPLIT_FLOOR, where hi + lo may not carry it to 2^-23 of itself; the kernel's
    ``flags`` (``qk_nbits_split_a``). Such a row's group of 4 goes to ``tile_f32``."""
    a32 = ftz32(a)
    e = prescale_exponent(a)
    x = ftz32(a32 * np.ldexp(np.float32(1), e)[:, None].astype(np.float32))
    return ((a32 != 0) & np.isfinite(a32) & (np.abs(x) < SPLIT_FLOOR)).any(axis=-1)


def group_flags(a: np.ndarray) -> np.ndarray:
    """Per row: whether its group of 4 rows (the ring kernel's blockIdx.y) has a flagged row."""
    f = flagged(a)
    g = np.pad(f, (0, -len(f) % 4)).reshape(-1, 4).any(axis=1)
    return np.repeat(g, 4)[: len(f)]


def tile_f32(
    A: np.ndarray, B: np.ndarray, scales: np.ndarray, bias: np.ndarray | None, *, K: int, bits: int, block_size: int
) -> np.ndarray:
    """Y (M, N) as the ring kernel's flagged-group path (``qk_nbits_f32_tile``) computes it:
    w = fp32((q - z) s), lane l of 32 chaining fmaf(a[k], w[k]) over k = l (mod 32), a width-32
    butterfly (lane i + lane i ^ off, off 16..1), + bias."""
    M, N = A.shape[0], B.shape[0]
    q = unpack_weights(B, NBitsLayout(K, N, bits, block_size)).astype(np.float32)
    s = scales.astype(np.float32).reshape(N, -1)[:, np.arange(K) // block_size]
    w = ftz32((q - np.float32(2 ** (bits - 1))) * s)
    a = ftz32(A)
    out = np.zeros((M, N), np.float32)
    for m in range(M):
        lanes = np.zeros((32, N), np.float32)
        for k in range(K):
            lanes[k % 32] = fmaf(np.full(N, a[m, k], np.float32), w[:, k], lanes[k % 32])
        off = 16
        while off:
            lanes = ftz32(lanes + lanes[np.arange(32) ^ off])
            off >>= 1
        y = lanes[0]
        out[m] = y if bias is None else ftz32(y + bias.astype(np.float32))
    return out


def per_output(A: np.ndarray, W: np.ndarray, bias: np.ndarray | None, *, bits: int) -> np.ndarray:
    """Y (M, N) fp32 as the per-output kernel (``qk_nbits_gemv``, kernels/ort/nbits_gemv.hip)
    computes it from W = the dequantized weights (``dequantize_nbits``, bit-identical to its
    qk_weight): bits 2 / 4, lane l takes the 32-bit words l, l + 32, ... (K rounded up to whole
    words, zeros past K), a word's elements in the order (field j of each byte, bytes 0..3), each
    fmaf(a, w) onto the lane's sum; other widths lane l takes k = l (mod 32); a width-32 butterfly,
    + bias."""
    M, K = A.shape
    if bits in (2, 4):
        per, fields = 32 // bits, 8 // bits
        words = -(-K // per)
        order = np.arange(words)[:, None] * per + (fields * np.arange(4)[None, :] + np.arange(fields)[:, None]).ravel()
        lane_of = np.repeat(np.arange(words) % 32, per)
        ks = order.ravel()
        keep = ks < K
        ks, lane_of = ks[keep], lane_of[keep]
    else:
        ks, lane_of = np.arange(K), np.arange(K) % 32
    a, w = ftz32(A), W.astype(np.float32)
    out = np.zeros((M, W.shape[0]), np.float32)
    for m in range(M):
        lanes = np.zeros((32, W.shape[0]), np.float32)
        for k, lane in zip(ks, lane_of, strict=True):
            lanes[lane] = fmaf(np.full(W.shape[0], a[m, k], np.float32), w[:, k], lanes[lane])
        off = 16
        while off:
            lanes = ftz32(lanes + lanes[np.arange(32) ^ off])
            off >>= 1
        out[m] = lanes[0] if bias is None else ftz32(lanes[0] + bias.astype(np.float32))
    return out


def _rz32(x: np.ndarray) -> np.ndarray:
    """float64 -> fp32 rounded toward zero."""
    r = x.astype(np.float32)
    over = np.abs(r.astype(np.float64)) > np.abs(x)
    r = np.where(over, np.nextafter(r, np.float32(0)), r)
    return r.astype(np.float32)


def tc_step(c: np.ndarray, prods: np.ndarray, extra: int) -> np.ndarray:
    """c (fp32, shape S) + the sum of prods (exact fp16 products, shape S x G): every addend
    truncated to ``extra`` bits below the ulp of the largest one, summed exactly, rounded toward
    zero to fp32; ``extra=None``: one round-to-nearest fp32 rounding of the exact sum."""
    terms = np.concatenate([c.astype(np.float64)[..., None], prods], axis=-1)
    if extra is None:
        return terms.sum(axis=-1).astype(np.float32)
    big = np.abs(terms).max(axis=-1)
    _, ex = np.frexp(np.where(big > 0, big, 1.0))
    quantum = np.ldexp(1.0, ex - 24 - extra)[..., None]
    trunc = np.trunc(terms / quantum) * quantum
    return ftz32(_rz32(trunc.sum(axis=-1)))


def fmaf(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    return ftz32((a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32))


def warp_chunks(wk: int, wk_n: int, n_super: int, sc: int, n_chunks: int, strided: bool) -> list[int]:
    """The chunks warp wk of a CTA sums, in its order: its superchunks (strided, or one contiguous
    range of n_super / wk_n), sc chunks each, those past K skipped."""
    supers = range(wk, n_super, wk_n) if strided else range(wk * n_super // wk_n, (wk + 1) * n_super // wk_n)
    return [c for sj in supers for c in range(sj * sc, min(sj * sc + sc, n_chunks))]


def ring_f32(
    A: np.ndarray,
    B: np.ndarray,
    scales: np.ndarray,
    bias: np.ndarray | None,
    *,
    K: int,
    bits: int,
    block_size: int,
    wk_n: int = 1,
    extra: int | None = 0,
    strided: bool | None = None,
) -> np.ndarray:
    """Y (M, N) fp32 as the split ring kernel computes it (default zero point, block % 64 == 0).
    The warps' superchunks: ``strided`` (warp wk takes wk, wk + wk_n, ...) or each warp a contiguous
    range; None: the shipped order, strided for bits 4 only."""
    M, N = A.shape[0], B.shape[0]
    n_chunks = -(-K // 64)
    sc = 8 // bits
    n_super = -(-n_chunks // sc)
    hi, lo, e = split(A)
    Kp = n_super * sc * 64
    pad = lambda h: np.pad(h.astype(np.float64), ((0, 0), (0, Kp - K)))  # noqa: E731
    cols = [pad(hi), pad(lo)]  # the hi columns and the lo columns of the mma
    q = unpack_weights(B, NBitsLayout(K, N, bits, block_size))
    qz = np.pad(q.astype(np.float64) - 2 ** (bits - 1), ((0, 0), (0, Kp - K)))
    s32 = scales.astype(np.float32)
    out = np.zeros((M, N), np.float32)
    for m in range(M):
        parts = []
        for wk in range(wk_n):
            acc = [np.zeros(N, np.float32), np.zeros(N, np.float32)]
            for c in warp_chunks(wk, wk_n, n_super, sc, n_chunks, bits == 4 if strided is None else strided):
                s = s32[:, (c * 64) // block_size]
                for j in range(2):
                    d = np.zeros(N, np.float32)
                    for mm in range(4):  # mma mm: the chunk's positions k = mm (mod 4)
                        ks = c * 64 + np.arange(mm, 64, 4)
                        d = tc_step(d, qz[:, ks] * cols[j][m, ks][None, :], extra)
                    acc[j] = fmaf(s, d, acc[j])
            parts.append(acc)
        hsum, lsum = parts[0]
        for k in range(1, wk_n):
            hsum = ftz32(hsum + parts[k][0])
            lsum = ftz32(lsum + parts[k][1])
        inv_hi = np.float32(np.ldexp(1.0, -int(e[m])))
        inv_lo = np.float32(np.ldexp(1.0, -int(e[m]) - LO_SHIFT))
        y = fmaf(lsum, np.full(N, inv_lo, np.float32), ftz32(hsum * inv_hi))
        if bias is not None:
            y = ftz32(y + bias.astype(np.float32))
        out[m] = y
    return out

"""A numpy model of the fp16-activation matrix-unit MatMulNBits kernel (``qk_nbits_mma``,
kernels/ort/nbits_mma.hip: the decode kernel for zero points and the prefill kernel): per 64-wide
K chunk and output, four mma steps (the chunk's positions k = m (mod 4), 16 exact fp16 products
each) summed by the tensor core's fp32 accumulation (``nbits_f32_model.tc_step``), then
``fmaf(s, d, acc)`` and, where the zero point has a fraction, ``fmaf(c, sum(a), acc)``; the K split
across warps added in warp order; + bias in fp32; one fp16 rounding.

``sum_form=True`` is the session-3 arithmetic (build option ``-DQK_NBITS_ZP_SUM_V1``): q itself in
the weights, c = fp32(-s z) through sum(a) for every zero-point kind, which cancels beside a large
activation on weights q = z. The session-10 form folds the integer zi nearest z (within the codes)
into the weights, so q - zi is an exact fp16 integer, and applies only c = fp32(-s (z - zi)) through
sum(a). Used by tests/test_nbits_mma_model.py against the suite's own bound."""

from __future__ import annotations

import numpy as np
from nbits_f32_model import fmaf, ftz32, tc_step

from qconform.oracles.ort.matmul_nbits import NBitsLayout, unpack_weights
from qconform.oracles.ort.packing import unpack_bits


def zero_points(zp: np.ndarray | None, N: int, k_blocks: int, bits: int) -> tuple[np.ndarray, str]:
    """(z per (n, block) as float64, kind) as the kernel reads them: default 2^(bits - 1), packed
    uint8 fields, float per block (fp16 values), one scalar (the kernel form)."""
    if zp is None:
        return np.full((N, k_blocks), 2.0 ** (bits - 1)), "none"
    z = np.asarray(zp)
    if z.dtype == np.uint8:
        fields = unpack_bits(z.reshape(N, -1), bits, k_blocks).astype(np.float64)
        return fields, "packed"
    if z.size == 1:
        return np.full((N, k_blocks), float(z.astype(np.float32).reshape(()))), "scalar"
    return z.astype(np.float32).astype(np.float64).reshape(N, k_blocks), "float"


def split_zero_point(z: np.ndarray, s: np.ndarray, kind: str, bits: int, sum_form: bool) -> tuple:
    """(zi, c, frac): the integer folded into the weights, the fp32 c applied through sum(a) and
    whether the kernel runs the sum(a) mma (qk_unpack_szi / qk_unpack_sz)."""
    s32 = s.astype(np.float32)
    if sum_form:
        c = ftz32(-s32 * z.astype(np.float32))
        return np.zeros_like(z), c, True
    zi = np.clip(np.rint(z), 0, 2**bits - 1)
    zf = (z.astype(np.float32) - zi.astype(np.float32)).astype(np.float32)
    if kind == "packed":
        zf = np.zeros_like(zf)
    c = ftz32(-s32 * zf)
    frac = kind == "float" or (kind != "packed" and bool(np.any(zf != 0)))
    return zi, c, frac


def mma_fp16(
    A: np.ndarray,
    B: np.ndarray,
    scales: np.ndarray,
    zp: np.ndarray | None,
    bias: np.ndarray | None,
    *,
    K: int,
    bits: int,
    block_size: int,
    sum_form: bool = False,
    wk_n: int = 1,
    extra: int | None = 0,
    rounded: bool = True,
) -> np.ndarray:
    """Y (M, N) fp16 as qk_nbits_mma computes it (bits 2 / 4, block % 64 == 0, fp16 A / scales);
    ``rounded=False``: the fp32 value before the output rounding."""
    M, N = A.shape[0], B.shape[0]
    lay = NBitsLayout(K, N, bits, block_size)
    kb_n = -(-K // block_size)
    n_chunks = -(-K // 64)
    Kp = n_chunks * 64
    q = np.pad(unpack_weights(B, lay).astype(np.float64), ((0, 0), (0, Kp - K)))
    a = np.pad(A.astype(np.float64), ((0, 0), (0, Kp - K)))
    s = scales.astype(np.float32).reshape(N, kb_n)
    z, kind = zero_points(zp, N, kb_n, bits)
    zi, c, frac = split_zero_point(z, s, kind, bits, sum_form)
    parts = []
    for wk in range(wk_n):
        c_lo, c_hi = wk * n_chunks // wk_n, (wk + 1) * n_chunks // wk_n
        acc = np.zeros((M, N), np.float32)
        for ch in range(c_lo, c_hi):
            b = ch * 64 // block_size
            qz = q[:, ch * 64 : ch * 64 + 64] - zi[:, b : b + 1]  # exact fp16 integers
            d = np.zeros((M, N), np.float32)
            asum = np.zeros((M, 1), np.float32)
            for mm in range(4):  # mma mm: the chunk's positions k = mm (mod 4)
                ks = np.arange(mm, 64, 4)
                ak = a[:, ch * 64 + ks]
                d = tc_step(d, ak[:, None, :] * qz[None, :, ks], extra)
                asum = tc_step(asum, ak[:, None, :], extra)
            acc = fmaf(np.broadcast_to(s[:, b], (M, N)), d, acc)
            if frac:
                acc = fmaf(np.broadcast_to(c[:, b], (M, N)), np.broadcast_to(asum, (M, N)), acc)
        parts.append(acc)
    y = parts[0]
    for p in parts[1:]:
        y = ftz32(y + p)
    if bias is not None:
        y = ftz32(y + bias.astype(np.float32))
    return y.astype(np.float16) if rounded else y


def drop_in(sum_form: bool, leaf: str):
    """A ``matmul_nbits`` implementation (the oracle's signature) answering as the modelled kernel
    where it applies (fp16 A and scales, bits 2 / 4, blocks of 64 x 2^j, not ORT CPU's int8 path),
    the oracle elsewhere; after the oracle's own argument checks."""
    from qconform.oracles.ort import matmul_nbits
    from qconform.oracles.ort.matmul_nbits import check_a, check_nbits_args, uses_int8_activations

    def fn(A, B, scales, zero_points=None, g_idx=None, bias=None, *, K, N, bits, block_size, out=None, **kw):
        lay = check_nbits_args(
            B, scales, zero_points, g_idx, K=K, N=N, bits=bits, block_size=block_size, form=kw.get("form", "ort")
        )
        a = check_a(A, bias, lay)
        pow2 = block_size % 64 == 0 and block_size & (block_size - 1) == 0
        int8 = uses_int8_activations(kw.get("accuracy_level", 0), zero_points, g_idx, bits, block_size)
        if (
            a.dtype != np.float16
            or scales.dtype != np.float16
            or bits not in (2, 4)
            or not pow2
            or int8
            or g_idx is not None
        ):
            return matmul_nbits(
                A, B, scales, zero_points, g_idx, bias, K=K, N=N, bits=bits, block_size=block_size, out=out, **kw
            )
        y = mma_fp16(
            a.reshape(-1, K), B, scales, zero_points, bias, K=K, bits=bits, block_size=block_size, sum_form=sum_form
        ).reshape(*a.shape[:-1], N)
        if out is not None:
            matmul_nbits(
                A, B, scales, zero_points, g_idx, bias, K=K, N=N, bits=bits, block_size=block_size, out=out, **kw
            )  # the oracle's checks of out
            out[...] = y
            return out
        return y

    fn.__qconform_ops__ = ("matmul_nbits",)
    fn.__qconform_leaf__ = leaf
    return fn


matmul_fp16_mma_folded = drop_in(False, "Xfp16_Wu4_Yfp16")
matmul_fp16_mma_folded.__doc__ = "The session-10 kernel arithmetic (control: must pass)."

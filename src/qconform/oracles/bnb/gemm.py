"""4-bit GEMV/GEMM ``C[m, n] = sum_k A[m, k] * W[n, k] (+ bias[n])`` in the accumulation orders of
bitsandbytes' CUDA kernels (docs/bnb-4bit.md 5.1, 5.2), and a float64 reference.

``W`` is the packed [N, K] weight of ``quantize_4bit`` (nn.Linear layout). T is A's dtype; every
rounding to T is RNE; ``tofp`` widens T to float32 exactly. Orders:

- ``"naive_gemv"``: csrc/kernels.cu ``kgemm_4bit_inference_naive``. ``qmap = T(code)`` (the state's
  Python table, FP4 code 8 is +0), ``sc = T(absmax[block])`` with the absmax already de-nested in
  Python (two roundings), ``b = T(qmap * sc)`` (a multiply in T; fp32 for T = float). Lane l of 32 takes
  the 32-value chunks ``k0 = 32 l + 1024 g`` in natural order: ``acc_l += tofp(T(a * b))``, or
  ``acc_l = fmaf(a, b, acc_l)`` for T = float (fast-math contraction). The lanes are summed by cub
  WarpReduce (``shfl_down`` 1, 2, 4, 8, 16: lane 0 holds ``((v0+v1)+(v2+v3))+...``), ``out = T(acc)``.
  Needs K % 32 == 0. A bias (bitsandbytes <= 0.49 ``matmul_4bit``) is added afterwards in T:
  ``T(T(acc) + bias)``.
- ``"simt"``: csrc/gemm_4bit_simt.cu ``gemm_4bit_simt`` on CUDA. One warp per output column, lane l,
  chunks ``32 l + 1024 g``, one scale per chunk: ``absmax[block]``, or for a nested state
  ``fmaf(code8[q8], absmax2[block >> 8], offset)`` (one rounding). fp16/bf16: ``cen = T(LUT[q])`` from
  the native table (FP4 code 8 is -0), ``b = T(cen * T(scale))``, then per pair of values
  ``acc += fl32(tofp(T(a0*b0)) + tofp(T(a1*b1)))``; fp32: ``b = fl32(LUT[q] * scale)`` and FMA in the
  element order 0,4,1,5,2,6,3,7 of each 8. Lanes summed with ``shfl_down`` 16, 8, 4, 2, 1 (lane 0 holds
  ``((v0+v16)+(v8+v24))+...``); ``C = T(fl32(acc + bias))``. Needs K % blocksize == 0.
- ``"float64"``: ``sum_k A * fl32(code[q] * absmax)`` and the bias in float64, unrounded: the reference
  for the CPU/default path (dequantize + ``F.linear``), the MMA kernels and the fallbacks, whose order
  is a BLAS's or the hardware's, checked by relative L2 error.
Both CUDA orders flush fp32 subnormals (``--use_fast_math``). Verified on CUDA by the research behind
docs/bnb-4bit.md (5.1, 5.2 [V-cuda]); not run here, where there is no GPU.
"""

from __future__ import annotations

import numpy as np

from qconform.formats.bf16 import bf16_bits_to_fp32, fp32_to_bf16_bits
from qconform.formats.ftz import flush
from qconform.oracles.bnb.codes import get_4bit_type, native_4bit_table
from qconform.oracles.bnb.fourbit import unpack_nibbles

ORDERS = ("naive_gemv", "simt", "float64")
LANES, CHUNK, STRIDE = 32, 32, 1024
FP32_FMA_ORDER = np.array([0, 4, 1, 5, 2, 6, 3, 7])


def round_to(v: np.ndarray, dtype: str) -> np.ndarray:
    """float32 -> T -> float32 (RNE), so T values can be carried as float32."""
    v = np.asarray(v, np.float32)
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return v.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        return bf16_bits_to_fp32(fp32_to_bf16_bits(v, "rne"))
    return v


def mul_in(a: np.ndarray, b: np.ndarray, dtype: str, ftz: bool) -> np.ndarray:
    """``T(a * b)`` for T values held in float32: one rounding of the exact product (it fits in float64)."""
    with np.errstate(over="ignore", invalid="ignore"):
        p = (a.astype(np.float64) * b.astype(np.float64)).astype(np.float32)  # exact for fp16/bf16 factors
    return flush(p, ftz) if dtype == "float32" else round_to(p, dtype)


def fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``fmaf(a, b, c)`` on float32 arrays: one rounding (RNE) of the exact ``a*b + c`` (finite inputs)."""
    p = np.asarray(a, np.float64) * np.asarray(b, np.float64)  # exact: 24 + 24 bits
    c64 = np.asarray(c, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        s = p + c64
        bb = s - p
        err = (p - (s - bb)) + (c64 - bb)  # TwoSum: p + c = s + err exactly
        r = s.astype(np.float32)
        d = s - r.astype(np.float64)
        other = np.nextafter(r, np.where(d > 0, np.float32(np.inf), np.float32(-np.inf))).astype(np.float32)
        tie = (d != 0) & (np.abs(d) * 2 == np.abs(other.astype(np.float64) - r.astype(np.float64)))
    # s can land on a float32 midpoint but never cross one; past a tie the exact sum's side decides
    return np.where(tie & (err != 0) & ((err > 0) == (d > 0)), other, r).astype(np.float32)


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``fmaf`` flushed to zero, as the fast-math kernels compute it."""
    return flush(fma_f32(a, b, c), True)


def warp_sum(v: np.ndarray, offsets: tuple[int, ...]) -> np.ndarray:
    """Lane 0 of a ``shfl_down`` reduction over the last axis (32 lanes), float32, in ``offsets`` order."""
    v = v.astype(np.float32)
    for off in offsets:
        shifted = np.zeros_like(v)
        shifted[..., : LANES - off] = v[..., off:]
        with np.errstate(over="ignore", invalid="ignore"):
            v = flush((v + shifted).astype(np.float32), True)
    return v[..., 0]


def lane_layout(K: int) -> np.ndarray:
    """(groups, 32 lanes, 32 values) -> the k index each lane reads, -1 past K."""
    g = -(-K // STRIDE)
    k = (np.arange(g)[:, None, None] * STRIDE + np.arange(LANES)[None, :, None] * CHUNK
         + np.arange(CHUNK)[None, None, :])  # fmt: skip
    return np.where(k < K, k, -1)


def gemm(
    a: np.ndarray,
    packed: np.ndarray,
    absmax: np.ndarray,
    fused_scale: np.ndarray | None,
    shape: tuple[int, int],
    blocksize: int,
    quant_type: str,
    dtype: str,
    bias: np.ndarray | None,
    order: str,
) -> np.ndarray:
    """``a``: (M, K) T values as float32; ``absmax``: the float32 per-block scales (two-round de-nesting);
    ``fused_scale``: the one-rounding nested scales for ``simt`` (None when not nested). Returns (M, N)
    float32 holding T values, or float64 for ``order="float64"``."""
    N, K = shape
    q = unpack_nibbles(packed, N * K).reshape(N, K).astype(np.int64)
    blk = (np.arange(N)[:, None] * K + np.arange(K)[None, :]) // blocksize
    if order == "float64":
        with np.errstate(over="ignore", invalid="ignore"):
            w = (get_4bit_type(quant_type)[q] * absmax[blk]).astype(np.float32).astype(np.float64)
            out = a.astype(np.float64) @ w.T
        return out + bias.astype(np.float64) if bias is not None else out
    kk = lane_layout(K)  # (G, 32, 32)
    valid = kk >= 0
    kc = np.where(valid, kk, 0)
    if order == "naive_gemv":
        qmap = round_to(get_4bit_type(quant_type), dtype)
        sc = round_to(absmax[blk], dtype)  # (N, K): the chunk's block, the same for all 32 values
        b = mul_in(qmap[q], sc, dtype, True)
    else:
        scale = absmax[blk] if fused_scale is None else fused_scale[blk]
        lut = native_4bit_table(quant_type)
        if dtype == "float32":
            with np.errstate(over="ignore", invalid="ignore"):
                b = flush((lut[q] * scale).astype(np.float32), True)
        else:
            b = mul_in(round_to(lut[q], dtype), round_to(scale, dtype), dtype, True)
    bl = np.where(valid, b[:, kc], 0).astype(np.float32)  # (N, G, 32, 32)
    al = np.where(valid, a[:, kc], 0).astype(np.float32)  # (M, G, 32, 32)
    M = a.shape[0]
    acc = np.zeros((M, N, LANES), np.float32)
    G = kk.shape[0]
    with np.errstate(over="ignore", invalid="ignore"):
        for g in range(G):
            if order == "simt" and dtype != "float32":
                for j in range(0, CHUNK, 2):
                    p0 = mul_in(al[:, None, g, :, j], bl[None, :, g, :, j], dtype, True)
                    p1 = mul_in(al[:, None, g, :, j + 1], bl[None, :, g, :, j + 1], dtype, True)
                    acc = flush((acc + flush((p0 + p1).astype(np.float32), True)).astype(np.float32), True)
                continue
            steps = np.arange(CHUNK)
            if order == "simt":
                steps = (np.arange(0, CHUNK, 8)[:, None] + FP32_FMA_ORDER[None, :]).reshape(-1)
            for j in steps:
                av, bv = al[:, None, g, :, j], bl[None, :, g, :, j]
                if dtype == "float32":
                    acc = fma32(av, bv, acc)
                else:
                    acc = flush((acc + mul_in(av, bv, dtype, True)).astype(np.float32), True)
    offsets = (1, 2, 4, 8, 16) if order == "naive_gemv" else (16, 8, 4, 2, 1)
    total = warp_sum(acc, offsets)
    if order == "naive_gemv":
        out = round_to(total, dtype)
        if bias is not None:
            out = round_to((out + bias[None, :]).astype(np.float32), dtype)
        return out
    if bias is not None:
        with np.errstate(over="ignore", invalid="ignore"):
            total = (total + bias[None, :]).astype(np.float32)
    return round_to(total, dtype)

"""A MatMulNBits drop-in with llama.cpp's fp16 GEMV numerics: weights dequantized to fp16,
products and partial sums in fp16, the partials combined in fp32.

It follows llama.cpp's CUDA dequantize-mul-mat-vec kernel built with ``GGML_CUDA_F16``
(ggml/src/ggml-cuda/common.cuh: ``typedef half dfloat; typedef half2 dfloat2;``; dmmv.cu: each
of a warp's 32 threads dequantizes two values per step into a ``half2``, multiplies them by the
activations converted to ``half2`` and accumulates into a ``half2`` partial, stepping 64 values
along the row; the 32 partials are then summed in float by the warp reduction). Here the 64
fp16 lanes (32 threads x 2 halves) each sum every 64th product, chains of ceil(K/64).

Strictly (the upstream reference: fp32 accumulation of exact fp32 weights) this fails; its
declared contract is ``storage=fp16,accumulate=fp16,chain=K/64``:

    qconform run --impl py:examples/contracts/matmul_nbits_half.py:matmul_nbits --ops matmul_nbits \\
        --contract storage=fp16,accumulate=fp16,chain=K/64
"""

from __future__ import annotations

import numpy as np

from qconform.oracles.ort import unpack_bits
from qconform.oracles.ort._out import deliver
from qconform.validators import check_a, check_nbits_args, check_out

LANES = 64  # 32 threads x 2 halves of a half2
ROWS_AT_ONCE = 16  # bounded memory: (rows, N, 64) fp16 partials


def dequantize_fp16(B, scales, zero_points, lay) -> np.ndarray:
    """W (N, K) in fp16: fp16(fp16(q - z) * s) (integer or float zero points alike)."""
    q = unpack_bits(B.reshape(lay.N, lay.k_blocks, lay.blob_size), lay.bits, lay.block_size)
    q = q.reshape(lay.N, -1)[:, : lay.K].astype(np.float16)
    kb = np.arange(lay.K) // lay.block_size
    s = scales.reshape(lay.N, lay.k_blocks).astype(np.float16)[:, kb]
    if zero_points is None:
        z = np.float16(1 << (lay.bits - 1))
    elif zero_points.dtype == np.uint8:
        z = unpack_bits(zero_points.reshape(lay.N, -1), lay.bits, lay.k_blocks).astype(np.float16)[:, kb]
    else:
        z = zero_points.reshape(lay.N, -1).astype(np.float16)[:, kb] if zero_points.size > 1 else zero_points
        z = np.asarray(z, np.float16)
    return ((q - z).astype(np.float16) * s).astype(np.float16)


def matmul_nbits(
    A, B, scales, zero_points=None, g_idx=None, bias=None, *, K, N, bits, block_size, form="ort", out=None, **_
):
    if g_idx is not None:
        raise NotImplementedError("g_idx: llama.cpp's kernels have none")
    lay = check_nbits_args(B, scales, zero_points, None, K=K, N=N, bits=bits, block_size=block_size, form=form)
    a = check_a(A, bias, lay)
    check_out(out, (*a.shape[:-1], lay.N), a.dtype, A, B, scales, zero_points, bias)
    w = dequantize_fp16(B, scales, zero_points, lay)
    steps = -(-lay.K // LANES)
    w3 = np.zeros((lay.N, steps * LANES), np.float16)
    w3[:, : lay.K] = w
    w3 = w3.reshape(lay.N, steps, LANES)
    a2 = a.reshape(-1, lay.K)
    y = np.empty((len(a2), lay.N), np.float32)
    for r0 in range(0, len(a2), ROWS_AT_ONCE):
        rows = np.zeros((min(ROWS_AT_ONCE, len(a2) - r0), steps * LANES), np.float16)
        rows[:, : lay.K] = a2[r0 : r0 + ROWS_AT_ONCE].astype(np.float16)
        rows = rows.reshape(len(rows), steps, LANES)
        acc = np.zeros((len(rows), lay.N, LANES), np.float16)
        for i in range(steps):  # each lane: acc = fp16(acc + fp16(a * w)), in K order
            acc = (acc + (rows[:, None, i, :] * w3[None, :, i, :]).astype(np.float16)).astype(np.float16)
        y[r0 : r0 + len(rows)] = acc.astype(np.float32).sum(axis=2, dtype=np.float32)
    if bias is not None:
        y = (y + bias.astype(np.float32)).astype(np.float32)
    return deliver(y.reshape(*a.shape[:-1], lay.N).astype(a.dtype), out)

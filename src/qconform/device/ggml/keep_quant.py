"""Launcher of ``matmul_bt_quant`` (kernels ``ggml/keep_quant.hip``): ggml's keep-quant linear layer
for Q4_K, Q5_K, Q6_K and Q8_0 weights, bit-identical to the oracle's generic vec_dot order.

The call's rules are the oracle's, checked before any launch (``bind_call`` on host stand-ins); the
activation rows are quantized on the device by the Q8_K / Q8_0 quantize kernels (byte-identical to
ggml's reference quantizers), Q8_K's quants regrouped per fp32 lane (``qk_q8_k_lanes``), then one
GEMV launch: CTAs of 32 weight rows x up to 8 activation rows. Other weight types are declined.
"""

from __future__ import annotations

from typing import Any

import cupy
import numpy as np

from qconform.device.abi import bind_call
from qconform.device.ggml.q8_quant import quantize
from qconform.device.launchers import launch_grid
from qconform.errors import Declined
from qconform.ops.ggml.keep_quant import MATMUL_BT_QUANT
from qconform.oracles.ggml.vec_dot_generic import vec_dot_formats

SOURCE = "ggml/keep_quant.hip"
SYMBOLS = {"Q4_K": "qk_kq_gemv_q4_k", "Q5_K": "qk_kq_gemv_q5_k", "Q6_K": "qk_kq_gemv_q6_k", "Q8_0": "qk_kq_gemv_q8_0"}
ROWS_PER_CTA, ACT_ROWS_PER_CTA, THREADS = 32, 8, 256
LANE_WORDS = 64  # qk_q8_k_lanes: int32 words per Q8_K block


def matmul_bt_quant(W_blocks: Any, qtype: str, A_fp32: Any, *, fma: bool = False, out: Any = None) -> Any:
    """``Y[m, n] = vec_dot(W_blocks[n], quantize(A_fp32[m]))`` (CuPy arrays, float32 (M, N)) in
    ggml's generic order, every fp32 operation rounded on its own (the oracle with ``fma=False``);
    ``fma=True`` is declined (the ABI has no such argument)."""
    call = bind_call(MATMUL_BT_QUANT, (W_blocks, qtype, A_fp32), {"fma": fma}, out)
    wfmt, afmt = vec_dot_formats(qtype)
    if wfmt.name not in SYMBOLS:
        raise Declined(f"qtype: qconform's device GEMV covers {', '.join(SYMBOLS)}; not {wfmt.name}")
    M, N = call.out.shape
    if M == 0 or N == 0:
        return call.out
    nb = A_fp32.shape[1] // afmt.block_size
    a8 = quantize(A_fp32, afmt.name)
    grid = (-(-N // ROWS_PER_CTA), -(-M // ACT_ROWS_PER_CTA))
    sizes = (np.int64(M), np.int64(N), np.int64(nb))
    op = MATMUL_BT_QUANT.name
    if wfmt.name == "Q8_0":
        launch_grid(op, SOURCE, SYMBOLS["Q8_0"], grid, THREADS, (W_blocks, a8, call.out, *sizes))
        return call.out
    lanes = cupy.empty(M * nb * LANE_WORDS, cupy.int32)
    words = M * nb * LANE_WORDS
    launch_grid(op, SOURCE, "qk_q8_k_lanes", -(-words // THREADS), THREADS, (a8, lanes, np.int64(M * nb)))
    launch_grid(op, SOURCE, SYMBOLS[wfmt.name], grid, THREADS, (W_blocks, a8, lanes, call.out, *sizes))
    return call.out

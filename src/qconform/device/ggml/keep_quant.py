"""Launcher of ``matmul_bt_quant`` (kernels ``ggml/keep_quant.hip``): ggml's keep-quant linear layer
for every weight type with a generic vec_dot (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K .. Q6_K,
IQ4_XS), bit-identical to the oracle's generic vec_dot order.

The call's rules are the oracle's, checked before any launch (``bind_call`` on host stand-ins); the
activation rows are quantized on the device by the Q8_K / Q8_0 quantize kernels (byte-identical to
ggml's reference quantizers; Q8_1's quants are Q8_0's; Q8_K by ``qk_q8_k_quant_w32``, a warp a
super-block) and regrouped for the GEMV (``qk_q8_k_lanes`` for the 8-lane types Q3_K..Q6_K,
``qk_q8_k_words`` for Q2_K / IQ4_XS, ``qk_q8_1_words``, which adds Q8_1's ``s`` from the fp32 rows;
Q8_0 quantized straight into its words by ``qk_q8_0_quant_words``), then one GEMV launch: CTAs of 4 weight
rows x 1 or 2 activation rows (the kernel's phases are in its header). ``W_blocks`` must be 16-byte
aligned for Q4_K / Q5_K and 4-byte aligned otherwise. Other weight types are declined.

``order="any"`` (the contract ``order=any``, passed by ``qconform.impls.device``) runs Q4_K, Q5_K, Q6_K
and Q8_0 through ``ggml/keep_quant_fast.hip`` instead: llama.cpp's mmvq layout in its own fp32 order
(each output within the contract's bound, not bit-identical to the generic order); Q8_K activations
read as quantized (no regrouping launch), Q8_0 ones as ``qk_q8_0_quant_words`` writes them; CTAs of 4 weight rows x 1, 2
or 4 activation rows. The other types run the generic-order kernel, which meets that bound too.
Q4_K and Q5_K at M = 1 in one launch (``qk_kq_one_<t>``, session 40): its first CTAs quantize the row,
the others wait for them after their first weight loads; the same bits as the two launches, which
the bench-only builds ``TWO_LAUNCH_OPTIONS`` keep. Q6_K and Q8_0 at M = 1 (session 41), where nb is a
multiple of 8 and ``W_blocks`` 16-byte aligned: the weights brought into a shared-memory ring by the bulk
copy engine (``qk_kq_bulk_<t>``), Q6_K in one launch as Q4_K (``qk_kq_one_bulk_q6_k``).
"""

from __future__ import annotations

from typing import Any

import cupy
import numpy as np

from qconform.device import launchers
from qconform.device.abi import bind_call
from qconform.device.ggml.q8_quant import quantize
from qconform.device.launch import check_aligned
from qconform.device.launchers import kernel_of, launch_grid, sm_count, smem_limits
from qconform.device.registry import kernel_for, resident_ctas
from qconform.errors import ArgumentError, Declined
from qconform.ops.ggml.keep_quant import MATMUL_BT_QUANT
from qconform.oracles.ggml.vec_dot_generic import vec_dot_formats

SOURCE = "ggml/keep_quant.hip"
FAST_SOURCE = "ggml/keep_quant_fast.hip"
Q8_SOURCE = "ggml/q8_quant.hip"
FAST_TYPES = {"Q4_K": "q4_k", "Q5_K": "q5_k", "Q6_K": "q6_k", "Q8_0": "q8_0"}  # qk_kq_fast_<t>_m<MT>
FAST_TILES = (1, 2, 4)  # activation rows per CTA of the fast kernel (MT)
ORDERS = ("reference", "any")  # qconform.contracts.ORDER
KERNEL_TYPES = {
    "Q4_K": "q4_k",
    "Q5_K": "q5_k",
    "Q6_K": "q6_k",
    "Q8_0": "q8_0",
    "Q3_K": "q3_k",
    "Q2_K": "q2_k",
    "IQ4_XS": "iq4_xs",
    "Q4_0": "q4_0",
    "Q4_1": "q4_1",
    "Q5_0": "q5_0",
    "Q5_1": "q5_1",
    "IQ4_NL": "iq4_nl",
}
ELEMENT_ORDER = ("Q2_K", "IQ4_XS")  # Q8_K activations in element order (qk_q8_k_words), not by lane
ROWS_PER_CTA, THREADS = 4, 128  # KQ_R weight rows, a warp each; the regrouping kernels' CTA too
ACT_WORDS = {"Q8_K": 76, "Q8_0": 12, "Q8_1": 12}  # KQ_AK, KQ_A0: words per regrouped activation block
ACT_TILES = (1, 2)  # activation rows per CTA, the kernel's instantiations (MT)
MAX_GRID_Y = 65535  # CUDA's and HIP's limit on gridDim.y: the weight-row blocks
ONE_LAUNCH_TYPES = ("Q4_K", "Q5_K")  # at M = 1 in one launch (qk_kq_one_<t>) ...
TWO_LAUNCH_OPTIONS = ("-DQK_KF_TWO_LAUNCH", "-DQK_KQ_FAST_V1")  # ... but in these builds (bench-only)
QUANT_PASS = 4  # super-blocks a quantizing CTA of qk_kq_one_<t> (a warp each)
BULK_TYPES = ("Q6_K", "Q8_0")  # at M = 1 through shared memory (qk_kq_bulk_<t>) ...
BULK_BLOCKS = 8  # ... where nb is a multiple of this (every row 16-byte aligned) and W is 16-byte aligned ...
STAGED_OPTION = "-DQK_KF_STAGED"  # ... but in this build (bench-only: qk_kq_fast_<t>_m1 as before)
QUANT_PASS_Q8_0 = 64  # Q8_0 blocks a quantizing CTA of qk_kq_one_bulk_q8_0 (2 lanes each)


def act_tile(M: int, tiles: tuple[int, ...] = ACT_TILES) -> int:
    """The activation rows a CTA takes: the smallest tile holding M, else the largest."""
    return next((t for t in tiles if t >= M), tiles[-1])


def _one_launch(W_blocks: Any, wtype: str, A_fp32: Any, out: Any, N: int, nb: int) -> bool:
    """The M = 1 call of a ``ONE_LAUNCH_TYPES`` type in one launch (qk_kq_one_<t>: its first CTAs quantize
    the row into ``act`` and count themselves in a ticket buffer, the others wait for them after their
    first weight loads; Q6_K and Q8_0 likewise on the bulk kernel's ring, qk_kq_one_bulk_<t>, where that
    kernel fits);
    False where the build has no such kernel (``TWO_LAUNCH_OPTIONS``) or another type."""
    if any(o in launchers.OPTIONS for o in TWO_LAUNCH_OPTIONS):
        return False
    bulk_one = wtype in BULK_TYPES and _bulk_fits(W_blocks, wtype, 1, nb)
    if bulk_one:
        symbol = f"qk_kq_one_bulk_{FAST_TYPES[wtype]}"
    elif wtype in ONE_LAUNCH_TYPES:
        symbol = f"qk_kq_one_{FAST_TYPES[wtype]}"
    else:
        return False
    kernel = kernel_of(FAST_SOURCE, symbol)
    q8_0 = wtype == "Q8_0"
    producers = -(-nb // (QUANT_PASS_Q8_0 if q8_0 else QUANT_PASS))
    # no more CTAs than are resident at once, so every waiting CTA's producers run
    smem = kernel.shared_size_bytes if bulk_one else 64  # the bulk kernel's ring
    grid = producers + max(1, min(-(-N // ROWS_PER_CTA), _resident(kernel, smem) - producers))
    # block_q8_K slots, the spare ones zeros; Q8_0: qk_q8_0_quant_words' 48 bytes a block
    act = cupy.empty(producers * QUANT_PASS_Q8_0 * 48 if q8_0 else producers * QUANT_PASS * 292, cupy.uint8)
    args = (A_fp32, W_blocks, out, np.int64(N), np.int64(nb), act, launchers.tickets(2, kernel))
    launch_grid(MATMUL_BT_QUANT.name, FAST_SOURCE, symbol, grid, THREADS, args, dependent=True)
    return True


def _resident(kernel: Any, smem: int) -> int:
    """The CTAs of ``kernel`` (THREADS threads, ``smem`` bytes of shared memory each) resident at once on
    the device, at least one an SM."""
    return max(1, resident_ctas(THREADS // 32, kernel.num_regs, smem, smem_limits()[1])) * sm_count()


def _bulk_fits(W_blocks: Any, wtype: str, M: int, nb: int) -> bool:
    """Whether the build has ``qk_kq_bulk_<t>`` and the call fits it (its type, M = 1, every row and W
    16-byte aligned)."""
    if STAGED_OPTION in launchers.OPTIONS or wtype not in BULK_TYPES or M != 1 or nb % BULK_BLOCKS:
        return False
    return W_blocks.data.ptr % 16 == 0


def matmul_bt_quant(
    W_blocks: Any, qtype: str, A_fp32: Any, *, fma: bool = False, out: Any = None, order: str = "reference"
) -> Any:
    """``Y[m, n] = vec_dot(W_blocks[n], quantize(A_fp32[m]))`` (CuPy arrays, float32 (M, N)) in
    ggml's generic order, every fp32 operation rounded on its own (the oracle with ``fma=False``);
    ``fma=True`` is declined (the ABI has no such argument). ``order``: the contract's; "any" runs
    the fast kernel for Q4_K, Q5_K, Q6_K and Q8_0 (its own fp32 order, within the contract's bound)."""
    if order not in ORDERS:
        raise ArgumentError(f"order: one of {', '.join(ORDERS)} (the contract's order), got {order!r}")
    call = bind_call(MATMUL_BT_QUANT, (W_blocks, qtype, A_fp32), {"fma": fma}, out)
    wfmt, afmt = vec_dot_formats(qtype)
    if wfmt.name not in KERNEL_TYPES:
        raise Declined(f"qtype: qconform's device GEMV covers {', '.join(KERNEL_TYPES)}; not {wfmt.name}")
    check_aligned("W_blocks", W_blocks, 16 if wfmt.type_size % 16 == 0 else 4)
    check_aligned("A_fp32", A_fp32, 16)  # the activation quantize kernels read float4
    M, N = call.out.shape
    if -(-N // ROWS_PER_CTA) > MAX_GRID_Y:
        raise ArgumentError(
            f"W_blocks: the device GEMV takes at most {MAX_GRID_Y * ROWS_PER_CTA} rows in one call "
            f"(grid y limit), got {N}; split the rows"
        )
    if M == 0 or N == 0:
        return call.out
    nb = A_fp32.shape[1] // afmt.block_size
    op, blocks, words = MATMUL_BT_QUANT.name, M * nb, ACT_WORDS[afmt.name]
    fast = order == "any" and wfmt.name in FAST_TYPES
    if fast and M == 1 and _one_launch(W_blocks, wfmt.name, A_fp32, call.out, N, nb):
        return call.out
    aq = cupy.empty(0 if fast and afmt.name == "Q8_K" else blocks * words, cupy.uint32)
    if afmt.name == "Q8_0":  # quantized straight into the regrouped words: one launch, 2 lanes a block
        launch_grid(
            op, Q8_SOURCE, "qk_q8_0_quant_words", -(-2 * blocks // THREADS), THREADS, (A_fp32, aq, np.int64(blocks))
        )
    elif afmt.name == "Q8_1":  # Q8_1's quants and d are Q8_0's
        a8 = quantize(A_fp32, "Q8_0")
        launch_grid(op, SOURCE, "qk_q8_1_words", -(-blocks // THREADS), THREADS, (A_fp32, a8, aq, np.int64(blocks)))
    else:  # Q8_K by a warp a super-block (w32: coop's bytes, a chain a quarter as long, for short rows);
        # launched here as the Q8_0 one is, so the family's build options and source overrides reach it
        w32 = kernel_for("q8_k_quant", "w32")
        a8 = cupy.empty((M, nb * afmt.type_size), cupy.uint8)
        geometry = w32.geometry
        launch_grid(op, w32.source, w32.symbol, geometry.grid(blocks), geometry.threads, (A_fp32, a8, np.int64(blocks)))
        if not fast:  # the fast kernel reads the Q8_K blocks as quantized
            regroup = "qk_q8_k_words" if wfmt.name in ELEMENT_ORDER else "qk_q8_k_lanes"
            launch_grid(op, SOURCE, regroup, -(-blocks * words // THREADS), THREADS, (a8, aq, np.int64(blocks)))
    if fast:
        mt = act_tile(M, FAST_TILES)
        grid = (-(-M // mt), -(-N // ROWS_PER_CTA))
        symbol = f"qk_kq_fast_{FAST_TYPES[wfmt.name]}_m{mt}"
        if _bulk_fits(W_blocks, wfmt.name, M, nb):  # the resident CTAs, no more than the row groups
            symbol = f"qk_kq_bulk_{FAST_TYPES[wfmt.name]}"
            kernel = kernel_of(FAST_SOURCE, symbol)
            grid = (min(-(-N // ROWS_PER_CTA), _resident(kernel, kernel.shared_size_bytes)),)
        act = a8 if afmt.name == "Q8_K" else aq
        args = (W_blocks, act, call.out, np.int64(M), np.int64(N), np.int64(nb))
        # a programmatic dependent: the GEMV waits for the quantize before it reads an activation
        launch_grid(op, FAST_SOURCE, symbol, grid, THREADS, args, dependent=True)
        return call.out
    mt = act_tile(M)
    grid = (-(-M // mt), -(-N // ROWS_PER_CTA))
    symbol = f"qk_kq_gemv_{KERNEL_TYPES[wfmt.name]}_m{mt}"
    launch_grid(op, SOURCE, symbol, grid, THREADS, (W_blocks, aq, call.out, np.int64(M), np.int64(N), np.int64(nb)))
    return call.out

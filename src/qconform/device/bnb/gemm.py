"""Launcher of gemm_4bit (kernels ``bnb/gemm_simt.hip``, which take the op's declared ABI: ``qconform
abi gemm_4bit``): the oracle's call shape on CuPy arrays. One group of 32 lanes per output column and
tile of MT rows of A (the smallest of 1, 2, 4, 8, 16 holding M, else 16 per tile).

``variant`` picks the reading (a ``cupy`` implementation passes its contract's): "cpu" (the default
contract: weights rounded once to A's dtype, fp32 sums; within the op's bound) or "cuda" (``--contract
variant=cuda``: bitsandbytes' ``gemm_4bit_simt`` bit for bit, ``qconform.oracles.bnb.gemm_4bit(...,
order="simt")``); others are declined, as is K % blocksize != 0 (bitsandbytes' SIMT kernel needs it;
its 16-byte chunk loads need K % 32 == 0). A and B must be 16-byte aligned."""

from __future__ import annotations

from typing import Any

from qconform.device.abi import bind_call
from qconform.device.launch import check_aligned
from qconform.device.launchers import launch_grid
from qconform.errors import Declined
from qconform.ops.bnb.gemm import GEMM_4BIT

SOURCE = "bnb/gemm_simt.hip"
TILES = (1, 2, 4, 8, 16)  # rows of A per group: the kernel's instantiations (MT)
THREADS = 128  # 4 groups (output columns) per CTA
GROUP = 32
READINGS = {"cpu": "qk_gemm_4bit", "cuda": "qk_gemm_4bit_simt"}


def row_tile(M: int) -> int:
    """The rows of A a group takes: the smallest tile holding M, else the largest."""
    return next((t for t in TILES if t >= M), TILES[-1])


def handles(K: int, blocksize: int) -> bool:
    """The shapes the kernels read: whole blocks per weight row (so 32-value chunks, 16-byte rows)."""
    return K % blocksize == 0


def symbol(variant: str, M: int) -> str:
    if variant not in READINGS:
        raise Declined(f"variant: the device gemm_4bit reads {', '.join(READINGS)}; not {variant!r}")
    return f"{READINGS[variant]}_m{row_tile(M)}"


def gemm_4bit(
    A: Any,
    B: Any,
    absmax: Any,
    bias: Any = None,
    *,
    K: int,
    blocksize: int,
    quant_type: str,
    variant: str = "cpu",
    out: Any = None,
) -> Any:
    """``A [..., K] @ W^T (+ bias)`` on the device in A's dtype (module docstring)."""
    kwargs = {"K": K, "blocksize": blocksize, "quant_type": quant_type}
    call = bind_call(GEMM_4BIT, (A, B, absmax, bias), kwargs, out)
    name = symbol(variant, call.bound.scalars["M"])
    if not handles(int(K), int(blocksize)):
        raise Declined(
            f"K: the device gemm_4bit needs K % blocksize == 0 (whole blocks per row), not {K} % {blocksize}"
        )
    check_aligned("A", A, 16)
    check_aligned("B", B, 16)
    M, N = call.bound.scalars["M"], call.bound.scalars["N"]
    groups = N * -(-M // row_tile(M))
    launch_grid(GEMM_4BIT.name, SOURCE, name, -(-groups * GROUP // THREADS), THREADS, call.kernel_args())
    return call.out

"""The bitsandbytes matrix-unit GEMM's row tiles (``kernels/bnb/gemm_mma.hip``, launcher
``qconform.device.bnb.gemm``): a function of the shape and the GPU's CTA slots. No CuPy here (the
offline tests check the rule)."""

from __future__ import annotations

TOKENS = 8  # tokens an n-tile of the kernel holds (n1: M <= 8, n2: M <= 16)


def row_tiles(M: int, N: int, slots: int) -> int:
    """RT, the 16-row tiles a warp step takes (a CTA tile of 16 RT rows), for M tokens and N weight
    rows on a GPU with ``slots`` resident CTAs. Two tiles share each step's activation fragments (half
    the activation loads a weight), so M = 9..16 takes 2; at M <= 8 two only where the 32-row tiles
    still fill every slot, else 1 (fewer CTAs, fewer bytes in flight: on the H200, NF4 14336 x 4096
    M = 1 took 23.9 us at RT 2 on 128 CTAs against 21.7 at RT 1 on 256, and 4096 x 14336 21.9 against
    23.1; docs/perf-notes.md, session 19)."""
    return 2 if M > TOKENS or -(-N // 32) >= slots else 1

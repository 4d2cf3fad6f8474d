"""Launcher of gemm_4bit (kernels ``bnb/gemm_mma.hip`` and ``bnb/gemm_simt.hip``, which take the op's
declared ABI: ``qconform abi gemm_4bit``): the oracle's call shape on CuPy arrays.

The default (cpu) reading with fp16 / bf16 activations and M <= 16 runs on the matrix units
(``qk_gemm_4bit_mma_n{1,2}``, ``_n1_r1``: one or two n-tiles of 8 tokens; a CTA of 256 threads per 16
RT weight rows, K split over its 8 warps, each warp step taking RT 16-row tiles against the same
activations (``mma_row_tiles``); at most MMA_CTAS_PER_SM CTAs per SM, the tiles striding over them).
On CUDA its pair table takes 32 copies in 64 KiB of dynamic shared memory (``mma_smem``: a byte's
offset one PRMT); on HIP, with ``TAB16_OPTION`` and where a device's per-CTA limit is smaller, 16
static copies (32 KiB).
Built with ``CPU_SIMT_OPTION`` (``compile_options``) that reading stays on the SIMT kernel (the
session-8 path: the bench's old variant, ``qconform.bench.bnb_gemv --variants``, and the device
suite's control row). Everything else runs the SIMT kernel: one group of 32 lanes per COLS adjacent
output columns and tile of MT rows of A (the smallest of 1, 2, 4, 8, 16 holding M, else 16 per
tile), 256 threads per CTA, one CTA per 8 groups. Built with ``V1_OPTION`` the module is session
7's SIMT kernel instead (one column per group, 128 threads; the SIMT kernel for every reading).

``variant`` picks the reading (a ``cupy`` implementation passes its contract's): "cpu" (the default
contract: weights rounded once to A's dtype, fp32 sums; within the op's bound) or "cuda" (``--contract
variant=cuda``: bitsandbytes' ``gemm_4bit_simt`` bit for bit, ``qconform.oracles.bnb.gemm_4bit(...,
order="simt")``); others are declined, as is K % blocksize != 0 (bitsandbytes' SIMT kernel needs it;
its 16-byte chunk loads need K % 32 == 0). A and B must be 16-byte aligned."""

from __future__ import annotations

from typing import Any

from qconform.device import launchers
from qconform.device.abi import bind_call
from qconform.device.bnb_tiling import TOKENS, row_tiles
from qconform.device.launch import check_aligned
from qconform.device.launchers import launch_grid
from qconform.device.loader import device_info
from qconform.errors import Declined
from qconform.ops.abi import DTYPE
from qconform.ops.bnb.gemm import GEMM_4BIT

SOURCE = "bnb/gemm_simt.hip"
MMA_SOURCE = "bnb/gemm_mma.hip"
MMA_TOKENS = TOKENS  # tokens per n-tile; two n-tiles at most
MMA_CTAS_PER_SM = 2  # 256 threads x 128 registers (ptxas, sm_90; __launch_bounds__(256, 2))
TAB16_OPTION = "-DQK_BNBM_TAB16"  # CUDA builds: the pair table in 16 static copies, as on HIP
# bench-only (``qconform.bench.bnb_gemv --variants mma --build-options=-DQK_BNBM_RT1``): every launch at one
# n-tile of tokens on 16-row tiles (``qk_gemm_4bit_mma_n1_r1``), whatever N; read here, not by the kernel
RT1_OPTION = "-DQK_BNBM_RT1"
TABLE32_BYTES = 256 * 32 * 8  # the CUDA build's pair table: 256 float2 entries in 32 copies
CPU_SIMT_OPTION = "-DQK_BNB_CPU_SIMT"  # the cpu reading on the SIMT kernel (session 8)
TILES = (1, 2, 4, 8, 16)  # rows of A per group: the kernel's instantiations (MT)
COLS = 2  # output columns per group: the kernel's QK_BNB_COLS
THREADS = 256  # 8 groups per CTA
GROUP = 32
V1_OPTION = "-DQK_BNB_GEMM_V1"  # session 7's kernel: one column per group, 128 threads
READINGS = {"cpu": "qk_gemm_4bit", "cuda": "qk_gemm_4bit_simt"}


def row_tile(M: int) -> int:
    """The rows of A a group takes: the smallest tile holding M, else the largest."""
    return next((t for t in TILES if t >= M), TILES[-1])


def handles(K: int, blocksize: int) -> bool:
    """The shapes the kernels read: whole blocks per weight row (so 32-value chunks, 16-byte rows)."""
    return K % blocksize == 0


def geometry(M: int, N: int) -> tuple[int, int]:
    """(CTAs, threads) of a launch for the build the current compile options select."""
    tiles = -(-M // row_tile(M))
    cols, threads = (N, 128) if V1_OPTION in launchers.OPTIONS else (-(-N // COLS), THREADS)
    return -(-cols * tiles * GROUP // threads), threads


def uses_mma(variant: str, dtype: str, M: int) -> bool:
    """Whether a call runs the matrix-unit kernel: the cpu reading, fp16 / bf16 A (``dtype``: the
    numpy name, bfloat16 for its uint16 carrier), M <= 16, and neither CPU_SIMT_OPTION nor
    V1_OPTION among the compile options."""
    simt_build = CPU_SIMT_OPTION in launchers.OPTIONS or V1_OPTION in launchers.OPTIONS
    return variant == "cpu" and dtype in ("float16", "bfloat16") and M <= 2 * MMA_TOKENS and not simt_build


def mma_row_tiles(M: int, N: int) -> int:
    """RT of a matrix-unit launch: ``qconform.device.bnb_tiling.row_tiles`` on this GPU's CTA slots (1 at
    one n-tile under RT1_OPTION)."""
    if M <= MMA_TOKENS and RT1_OPTION in launchers.OPTIONS:
        return 1
    return row_tiles(M, N, MMA_CTAS_PER_SM * launchers.sm_count())


def mma_geometry(M: int, N: int) -> tuple[str, int, int]:
    """(symbol, CTAs, RT) of a matrix-unit launch: n-tiles of tokens, row tiles over the SMs."""
    rt = mma_row_tiles(M, N)
    tiles = -(-N // (16 * rt))
    symbol = f"qk_gemm_4bit_mma_n{1 if M <= MMA_TOKENS else 2}" + ("_r1" if rt == 1 else "")
    return symbol, min(tiles, MMA_CTAS_PER_SM * launchers.sm_count()), rt


def mma_smem(M: int, rt: int) -> int:
    """Dynamic shared memory of a matrix-unit launch: the 32-copy pair table and the warps' partials
    (CUDA builds); 0 where the kernel keeps 16 static copies (HIP, TAB16_OPTION)."""
    if device_info().is_hip or TAB16_OPTION in launchers.OPTIONS:
        return 0
    n_tiles = 1 if M <= MMA_TOKENS else 2
    red = THREADS * 4 * n_tiles * rt * 4  # each lane's 4 fp32 partials per n-tile and row tile
    return TABLE32_BYTES + red


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
    dtype = next(label for label, code, _ in DTYPE.codes if code == call.bound.scalars["a_dtype"])
    if uses_mma(variant, dtype, M):
        if M > 0 and N > 0:
            mma_name, grid, rt = mma_geometry(M, N)
            smem, options = mma_smem(M, rt), ()
            if smem and not launchers.allow_smem(launchers.kernel_of(MMA_SOURCE, mma_name), smem):
                smem, options = 0, (TAB16_OPTION,)  # a device without that much per CTA: the static table
            with launchers.compile_options(*options):
                launch_grid(GEMM_4BIT.name, MMA_SOURCE, mma_name, grid, THREADS, call.kernel_args(), smem)
        return call.out
    grid, threads = geometry(M, N)
    launch_grid(GEMM_4BIT.name, SOURCE, name, grid, threads, call.kernel_args())
    return call.out

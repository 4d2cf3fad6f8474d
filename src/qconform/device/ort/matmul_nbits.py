"""Launchers of dequantize_nbits and matmul_nbits (kernels ``ort/nbits_gemv.hip``,
``ort/nbits_mma.hip`` and ``ort/nbits_wgmma.hip``), with the oracles' call shapes on CuPy arrays, bit-identical to
``qconform.oracles.ort.dequantize_nbits`` and within the accumulation bound of ``matmul_nbits``."""

from __future__ import annotations

from typing import Any, NamedTuple

import cupy
import numpy as np

from qconform.device import launchers, tensormap
from qconform.device.abi import out_buffer, shadow
from qconform.device.launchers import (
    allow_smem,
    contiguous,
    kernel_of,
    launch,
    launch_abi,
    launch_grid,
    sm_count,
    smem_limits,
)
from qconform.device.loader import arch_specific_options, load_module
from qconform.device.registry import (
    GEMM_MIN_M,
    KERNEL_DIR,
    MMA_SHAPES,
    STORAGE_TYPES,
    WGMMA_FOLD_MIN_M,
    WGMMA_MIN_M,
    WGMMA_TILE,
    MmaShape,
    decode_shape,
    fewer_warps,
    fold_launch_split,
    gemm_shape,
    resident_ctas,
    tail_wave,
    wgmma_smem,
    wgmma_symbol,
    wgmma_tokens,
)
from qconform.errors import ArgumentError, Declined
from qconform.ops.ort.matmul_nbits import DEQUANTIZE_NBITS, ZP_KIND, zero_point_kind
from qconform.oracles.ort.matmul_nbits import check_a, check_nbits_args

ZP_DEFAULT, ZP_PACKED, ZP_FLOAT, ZP_SCALAR = (ZP_KIND[k] for k in ("none", "packed", "float", "scalar"))
GEMV = "ort/nbits_gemv.hip"
MMA = "ort/nbits_mma.hip"
WGMMA = "ort/nbits_wgmma.hip"


def _mma_ok(B: Any, bits: int, block_size: int, a16: bool, zp_kind: int, z16: int) -> bool:
    """The matrix-unit kernel's domain: bits 2 / 4, fp16 A, blocks of 64 x 2^j, fp16 float zero points."""
    fp16_zp = zp_kind != ZP_FLOAT or z16
    pow2 = block_size % 64 == 0 and (block_size & (block_size - 1)) == 0
    return bits in (2, 4) and a16 and pow2 and B.data.ptr % 8 == 0 and bool(fp16_zp)


ACT_SMEM_LIMIT = 48 * 1024  # activations staged in shared memory up to this (CuPy's default dynamic limit)


def _launch_mma(
    bits: int, M: int, lay: Any, ptrs: tuple, zps: Any, kind: Any, has_bias: bool, a_vec: bool, fold: bool = False
) -> None:
    """The matrix-unit kernel; ``ptrs`` = (A, B, scales, zero points, bias, Y); ``fold``: the contract
    allows fp16 weights (storage=fp16), so the wgmma GEMM may fold the scales into them."""
    A, B, scales, zp, bias, y = ptrs
    aligned = B.data.ptr % 16 == 0 and scales.data.ptr % 4 == 0  # the ring's and the GEMM's 16- / 4-byte copies
    if M <= 8 and MMA_SHAPES["decode"].ring and kind == ZP_DEFAULT and aligned:
        if _launch_ring(bits, M, lay, ptrs, has_bias, a_vec):
            return
    packed = kind == ZP_PACKED and zp.data.ptr % 4 == 0
    if M >= GEMM_MIN_M and (kind == ZP_DEFAULT or packed) and aligned and a_vec:
        if M >= WGMMA_MIN_M and _launch_wgmma(bits, M, lay, ptrs, packed, has_bias, fold and M >= WGMMA_FOLD_MIN_M):
            return
        if _launch_gemm(bits, M, lay, ptrs, packed, has_bias):
            return
    shape = MMA_SHAPES["decode_zp" if M <= 8 else "prefill"]
    items = -(-lay.N // (16 * shape.r)) * -(-M // (8 * shape.t))
    n_chunks = -(-lay.K // 64)
    wk = shape.k_split(items, n_chunks, kernel_of(MMA, shape.symbol(bits)).num_regs, sm_count())
    grid = -(-items // shape.wi)
    if grid >= 2**31:
        raise ArgumentError(f"A: {M} x {lay.N} outputs need more than 2^31 - 1 CTAs")
    red = wk * shape.wi * shape.r * shape.t * 4 * 32 * 4 if wk > 1 else 0
    staged = min(M, 8 * shape.t) * n_chunks * 64 * 2
    act_smem = shape.wi == 1 and staged <= ACT_SMEM_LIMIT
    sizes = (M, lay.K, lay.N, (lay.block_size // 64).bit_length() - 1, lay.k_blocks, lay.zp_bytes, kind, has_bias)
    flags = (a_vec, act_smem, wk, shape.wi)
    args = (A, B, scales, zp, zps, bias, y, *(np.int32(v) for v in (*sizes, *flags)))
    launch_grid("matmul_nbits", MMA, shape.symbol(bits), grid, 32 * wk * shape.wi, args, max(red, staged * act_smem))


def _launch_gemm(bits: int, M: int, lay: Any, ptrs: tuple, packed: bool, has_bias: bool) -> bool:
    """The prefill GEMM (``qk_nbits_gemm`` with ``gemm_shape``'s tiles; the caller checked its domain:
    the default zero point or ``packed`` ones, K % 8 == 0, A and B 16-byte aligned, scales and packed
    zero points 4-byte aligned); False where its shared memory does not fit or M needs more than
    2^16 - 1 token tiles. (Float and scalar zero points stay on ``qk_nbits_mma``.)"""
    A, B, scales, zp, bias, y = ptrs
    shape = gemm_shape(M)
    if -(-M // shape.tokens) >= 2**16:
        return False
    symbol, smem = shape.symbol(bits, packed), shape.smem(bits, packed)
    if smem > smem_limits()[0] or (smem > 48 * 1024 and not allow_smem(kernel_of(MMA, symbol), smem_limits()[0])):
        return False
    grid = (-(-lay.N // shape.rows), -(-M // shape.tokens))
    y_vec = lay.N % 8 == 0 and y.data.ptr % 16 == 0
    sizes = (M, lay.K, lay.N, (lay.block_size // 64).bit_length() - 1, lay.k_blocks, lay.zp_bytes, has_bias, y_vec)
    args = (A, B, scales, zp if packed else np.uint64(0), bias, y, *(np.int32(v) for v in sizes))
    launch_grid("matmul_nbits", MMA, symbol, grid, shape.threads, args, smem)
    return True


_WGMMA_BUILT: dict[tuple[str, tuple[str, ...], int], bool] = {}


def _wgmma_built(options: tuple[str, ...]) -> bool:
    """Whether the wgmma source built with ``options`` has its kernels (the module's
    ``qk_nbits_wgmma_built``, 1 where NVRTC compiled it for sm_90a): read once per build and device. A
    build NVRTC refuses (an older toolkit without sm_90a) is one without them: the GEMM runs."""
    path = launchers.OVERRIDES.get(WGMMA, KERNEL_DIR / WGMMA)
    opts = launchers.OPTIONS + options
    key = (str(path), opts, cupy.cuda.Device().id)
    if key not in _WGMMA_BUILT:
        try:
            flag = load_module(path, opts).get_global("qk_nbits_wgmma_built")
        except cupy.cuda.compiler.CompileException:
            _WGMMA_BUILT[key] = False
        else:
            _WGMMA_BUILT[key] = bool(cupy.ndarray((1,), cupy.int32, flag).get()[0])
    return _WGMMA_BUILT[key]


_FOLD_COUNTS: dict[tuple[int, int], Any] = {}


def _fold_counts(n: int) -> Any:
    """The split tiles' arrival counts of this device and stream: zeros, each left zero by the CTA that
    sums its tile (so one buffer serves every call on the stream, in order)."""
    key = (cupy.cuda.Device().id, cupy.cuda.get_current_stream().ptr)
    if key not in _FOLD_COUNTS or _FOLD_COUNTS[key].size < n:
        _FOLD_COUNTS[key] = cupy.zeros(max(n, 256), cupy.int32)
    return _FOLD_COUNTS[key]


def has_wgmma() -> bool:
    """Whether this device and its build of the wgmma source run ``qk_nbits_wgmma``."""
    options = arch_specific_options()
    return bool(options) and _wgmma_built(options)


def _launch_wgmma(bits: int, M: int, lay: Any, ptrs: tuple, packed: bool, has_bias: bool, fold: bool) -> bool:
    """The prefill GEMM on Hopper's warpgroup matrix units (``qk_nbits_wgmma``, its _z twin for
    ``packed`` zero points; ``fold``: ``qk_nbits_wgmma_fold``, the weights as fp16 (q - z) s; the caller
    checked the GEMM's domain); False where the device or its build lacks wgmma, the shared memory
    does not fit, or N needs more than 2^16 - 1 row tiles."""
    if not has_wgmma():
        return False
    options = arch_specific_options()
    A, B, scales, zp, bias, y = ptrs
    grid = (-(-M // wgmma_tokens(fold)), -(-lay.N // WGMMA_TILE))
    tiles, full, parts = fold_launch_split(M, lay.N, lay.K, sm_count()) if fold else (0, 0, 1)
    symbol, smem = wgmma_symbol(bits, packed, fold, parts > 1), wgmma_smem(bits, packed, fold)
    if grid[1] >= 2**16 or smem > smem_limits()[0] or not allow_smem(kernel_of(WGMMA, symbol, options), smem):
        return False
    y_vec = lay.N % 8 == 0 and y.data.ptr % 16 == 0
    sizes = (M, lay.K, lay.N, (lay.block_size // 64).bit_length() - 1, lay.k_blocks, lay.zp_bytes, has_bias, y_vec)
    a_or_map, b_or_map = A, B
    if fold:  # the activations' and the weights' tensor copies (ort/nbits_wgmma.hip, qk_nbits_wgmma_rs)
        row_bytes = lay.k_blocks * lay.block_size * bits // 8
        a_or_map = tensormap.tiled_2d(A.data.ptr, tensormap.FLOAT16, (lay.K, M), 2 * lay.K,
                                      (64, wgmma_tokens(fold)), tensormap.SWIZZLE_128B)
        b_or_map = tensormap.tiled_2d(B.data.ptr, tensormap.UINT8, (row_bytes, lay.N), row_bytes,
                                      (8 * bits, WGMMA_TILE), tensormap.SWIZZLE_NONE)
        if a_or_map is None or b_or_map is None:
            return False
    args = (a_or_map, b_or_map, scales, zp if packed else np.uint64(0), bias, y, *(np.int32(v) for v in sizes))
    if fold:  # the tail split's workspace, counts, whole-wave tiles and parts (unread by the unsplit kernel)
        split = (np.uint64(0), np.uint64(0), np.int32(0), np.int32(1))
        if parts > 1:  # a 1-D grid: the whole waves' tiles, then each split tile's parts; a part's slot of
            grid = (full + (tiles - full) * parts, 1)  # 128 x 256 fp32 sums
            slots = cupy.empty((tiles - full) * parts * 128 * 256, cupy.float32)
            split = (slots, _fold_counts(tiles - full), np.int32(full), np.int32(parts))
        args += split
    launch_grid("matmul_nbits", WGMMA, symbol, grid, 256, args, smem, options)
    return True


RING_ACT_LIMIT = 16 * 1024  # activations staged beside the rings up to this; read from global memory beyond


class _RingPlan(NamedTuple):
    symbol: str  # the ring kernel
    kp: int  # K rounded up to whole superchunks
    act: int  # bytes of staged activations (0: read from global memory)
    items: int  # CTAs along N (16 r rows each)
    wk: int  # warps per CTA, splitting the superchunks
    smem: int  # dynamic shared memory per CTA


def _ring_plan(bits: int, lay: Any, act_rows: int, groups: int, f32: bool) -> _RingPlan | None:
    """The ring kernel's launch for ``act_rows`` activation rows staged per CTA and ``groups`` token
    groups (blockIdx.y): ``decode_shape``'s; where decode's CTAs would leave a nearly empty last wave
    (``tail_wave``), decode with ``fewer_warps`` a CTA if its CTAs then fit one wave, else
    decode_wave's if they fit one; None as ``_shape_plan``."""
    shape = decode_shape(lay.N, sm_count())
    plan = _shape_plan(shape, bits, lay, act_rows, groups, f32)
    if plan is None or shape is not MMA_SHAPES["decode"]:
        return plan
    ctas = plan.items * groups
    if not tail_wave(ctas, _slots(plan)):
        return plan
    wk = fewer_warps(plan.wk)
    if wk < plan.wk:
        fewer = _shape_plan(shape, bits, lay, act_rows, groups, f32, wk=wk)
        if fewer is not None and _slots(fewer) >= ctas:
            return fewer
    wave = _shape_plan(MMA_SHAPES["decode_wave"], bits, lay, act_rows, groups, f32)
    return wave if wave is not None and _slots(wave) >= ctas else plan


def _slots(plan: _RingPlan) -> int:
    """The plan's CTAs resident at once on the device (by its kernel's registers)."""
    regs = kernel_of(MMA, plan.symbol).num_regs
    return resident_ctas(plan.wk, regs, plan.smem, smem_limits()[1]) * sm_count()


def _shape_plan(
    shape: MmaShape, bits: int, lay: Any, act_rows: int, groups: int, f32: bool, wk: int = 0
) -> _RingPlan | None:
    """``shape``'s ring launch with ``wk`` warps a CTA (0: ``MmaShape.ring_split``'s); None when N is
    below one CTA's 16 r rows (its CTAs read 16 r whole rows of B) or one warp's ring does not fit."""
    if lay.N < 16 * shape.r:
        return None
    n_chunks = -(-lay.K // 64)
    sc = 8 // bits  # chunks of 64 per superchunk
    units = -(-n_chunks // sc)
    kp = units * sc * 64
    act = act_rows * kp * 2
    act = act if act <= RING_ACT_LIMIT else 0
    per_cta = smem_limits()[0]
    items = -(-lay.N // (16 * shape.r))
    wk = wk or shape.ring_split(items * groups, units, act, per_cta, sm_count())
    symbol = shape.symbol_f32(bits) if f32 else shape.symbol(bits)
    smem = max(act + wk * shape.ring_bytes(), wk * shape.r * 4 * 32 * 4)
    if wk == 0 or (smem > 48 * 1024 and not allow_smem(kernel_of(MMA, symbol), per_cta)):
        return None
    return _RingPlan(symbol, kp, act, items, wk, smem)


def _launch_ring(bits: int, M: int, lay: Any, ptrs: tuple, has_bias: bool, a_vec: bool) -> bool:
    """The decode kernel with the weights streamed through shared-memory rings (default zero
    point); False where ``_ring_plan`` finds none (the caller then takes the general kernel)."""
    A, B, scales, _, bias, y = ptrs
    plan = _ring_plan(bits, lay, min(M, 8), 1, f32=False)
    if plan is None:
        return False
    sizes = (M, lay.K, lay.N, (lay.block_size // 64).bit_length() - 1, lay.k_blocks, has_bias, a_vec, plan.act, plan.wk)
    args = (A, B, scales, bias, y, *(np.int32(v) for v in sizes))
    launch_grid("matmul_nbits", MMA, plan.symbol, plan.items, 32 * plan.wk, args, plan.smem)
    return True


F32_PER_OUTPUT = "-DQK_NBITS_F32_PER_OUTPUT"  # build option: fp32 A on the per-output kernel (the old variant)
SPLIT_SLICE, SPLIT_THREADS = 2048, 512  # qk_nbits_split_a's K per CTA (about: the grid sets it) and threads
F32_MIN_K = 64  # below, the split's 2^-23 per activation is not within the bound of K terms (tests/nbits_f32_model.py)


def _f32_ring_ok(bits: int, block_size: int, M: int, lay: Any, zp_kind: int, B: Any, scales: Any) -> bool:
    """fp32 A on the ring kernel: bits 2 / 4, blocks of 64 x 2^j, default zero point, 1 <= M <= 8,
    K >= F32_MIN_K, aligned weights and scales; not with the F32_PER_OUTPUT build option."""
    pow2 = block_size % 64 == 0 and (block_size & (block_size - 1)) == 0
    aligned = B.data.ptr % 16 == 0 and scales.data.ptr % 4 == 0
    fits = bits in (2, 4) and pow2 and zp_kind == ZP_DEFAULT and 1 <= M <= 8 and lay.K >= F32_MIN_K and lay.N > 0
    return fits and aligned and F32_PER_OUTPUT not in launchers.OPTIONS


def _launch_ring_f32(bits: int, M: int, lay: Any, A: Any, B: Any, scales: Any, bias: Any, y: Any) -> bool:
    """fp32 A through the ring kernel (``qk_nbits_mmaf_*``): ``qk_nbits_split_a`` (a CTA per
    ``SPLIT_SLICE`` of K and token) writes each token as fp16 hi + lo rows (a per-token power of two
    first), groups of 4 tokens (8 rows) per blockIdx.y, and flags each token with a nonzero
    activation the split does not carry (one more than 2^28 below its row's maximum:
    tests/nbits_f32_model.py); the ring kernel's CTAs of a flagged token's group compute their
    outputs from A in fp32 instead (``qk_nbits_f32_tile``, decided on the device: no host sync, no
    launch more). The ring kernel is launched as a programmatic dependent of the split
    (``qconform.device.pdl``): its first weight copies overlap the split. False where ``_ring_plan``
    finds none (the caller takes the per-output kernel)."""
    groups = -(-M // 4)
    plan = _ring_plan(bits, lay, 2 * min(M, 4), groups, f32=True)  # hi and lo rows of a group's tokens
    if plan is None:
        return False
    kp = plan.kp
    split = cupy.empty((groups * 8, kp), cupy.float16)
    scratch = cupy.empty(groups * 4 * 3, cupy.int32)  # per token: 2^-e, 2^-(e + 12) (fp32); then the flags
    inv, flags = scratch[: groups * 8].view(cupy.float32), scratch[groups * 8 :]  # flags 16-byte aligned
    a_vec = lay.K % 4 == 0 and A.data.ptr % 16 == 0
    split_args = (A, split, inv, flags, *np.int32([M, lay.K, kp, a_vec]))
    launch_grid("matmul_nbits", MMA, "qk_nbits_split_a", (-(-kp // SPLIT_SLICE), M), SPLIT_THREADS, split_args)
    bias_ptr = A if bias is None else bias
    block_shift = (lay.block_size // 64).bit_length() - 1
    sizes = (M, lay.K, lay.N, block_shift, lay.k_blocks, bias is not None, 1, plan.act, plan.wk)
    args = (split, B, scales, bias_ptr, y, inv, flags, A, *(np.int32(v) for v in sizes))
    launch_grid("matmul_nbits", MMA, plan.symbol, (plan.items, groups), 32 * plan.wk, args, plan.smem, dependent=True)
    return True


def _zp_args(zero_points: Any, lay, form: str, B: Any) -> tuple[Any, float, int, int]:
    """(zp pointer, scalar zp, kind, zp is fp16), by the ABI's zero_point_kind."""
    kind = zero_point_kind(zero_points, form)
    if kind == "none":
        return B, 0.0, ZP_DEFAULT, 0
    if kind == "packed":
        return zero_points, 0.0, ZP_PACKED, 0
    if kind == "scalar":
        return B, float(cupy.asnumpy(zero_points).reshape(())), ZP_SCALAR, 0
    return zero_points, 0.0, ZP_FLOAT, int(zero_points.dtype == np.float16)


def _nbits_args(B, scales, zero_points, g_idx, K, N, bits, block_size, form):
    if g_idx is not None:  # a valid call the kernels do not take: declined (counted), not rejected
        raise Declined("g_idx: the device kernels do not implement g_idx (deprecated in ORT)")
    contiguous(B=B, scales=scales, zero_points=zero_points)
    lay = check_nbits_args(
        shadow("B", B),
        shadow("scales", scales),
        shadow("zero_points", zero_points),
        None,
        K=K,
        N=N,
        bits=bits,
        block_size=block_size,
        form=form,
    )
    zp, zps, kind, z16 = _zp_args(zero_points, lay, form, B)
    common = (
        np.int32(lay.K),
        np.int32(lay.N),
        np.int32(bits),
        np.int32(block_size),
        np.int32(lay.k_blocks),
        np.int32(lay.blob_size),
        np.int32(lay.zp_bytes),
        np.int32(kind),
    )
    return lay, zp, np.float32(zps), common, np.int32(scales.dtype == np.float16), np.int32(z16)


def dequantize_nbits(
    B: Any, scales: Any, zero_points: Any = None, g_idx: Any = None, *, out: Any = None, **attributes: Any
) -> Any:
    """W (N, K) fp32, bit-identical to ``oracles.ort.dequantize_nbits``: the kernel takes the op's
    declared ABI (``qconform abi dequantize_nbits``); ``attributes`` are the oracle's."""
    return launch_abi(DEQUANTIZE_NBITS, GEMV, "qk_nbits_dequant", (B, scales, zero_points, g_idx), attributes, out)


def matmul_nbits(
    A,
    B,
    scales,
    zero_points=None,
    g_idx=None,
    bias=None,
    *,
    K,
    N,
    bits,
    block_size,
    accuracy_level=0,
    form="ort",
    out=None,
    storage="exact",
):
    """Y = A @ W^T (+ bias) in A's dtype (fp32 or fp16 read and written natively), fp32 sums;
    accuracy_level 4 with integer zero points: ORT's int8 activation path (as the oracle).
    ``storage``: the contract's (``qconform.impls.device`` passes it): "fp16" lets the prefill GEMM on
    wgmma hold the weights as fp16 (q - z) s (``qk_nbits_wgmma_fold``); every other call is as strict."""
    if accuracy_level not in (0, 1, 2, 3, 4):
        raise ArgumentError(f"accuracy_level: must be 0..4, got {accuracy_level!r}")
    if storage not in STORAGE_TYPES:
        raise ArgumentError(f"storage: must be one of {', '.join(STORAGE_TYPES)}, got {storage!r}")
    lay, zp, zps, common, s16, z16 = _nbits_args(B, scales, zero_points, g_idx, K, N, bits, block_size, form)
    contiguous(A=A, bias=bias)
    a = check_a(shadow("A", A), shadow("bias", bias), lay)
    if a.dtype != scales.dtype:
        raise ArgumentError(f"scales: dtype must be A's {a.dtype}, got {scales.dtype}")
    M = int(np.prod(a.shape[:-1], dtype=np.int64))
    y = out_buffer(out, (*a.shape[:-1], lay.N), a.dtype, A, B, scales, zero_points, bias)
    K_, N_, bits_, bs_, kb_, blob_, zpb_, kind_ = common
    a16 = np.int32(a.dtype == np.float16)
    if accuracy_level == 4 and int(kind_) in (ZP_DEFAULT, ZP_PACKED):
        qa = cupy.empty((M, lay.K), cupy.int32)
        sa = cupy.empty((M, lay.k_blocks), cupy.float32)
        qargs = (A, qa, sa, np.int32(M), K_, bs_, kb_, a16)
        launch("matmul_nbits", GEMV, "qk_quantize_a_int8", M * lay.k_blocks, qargs)
        bias_ptr = A if bias is None else bias
        args = (qa, sa, B, scales, zp, bias_ptr, y, np.int32(M), K_, N_, bits_, bs_, kb_, blob_, zpb_, kind_, a16, s16)
        launch("matmul_nbits", GEMV, "qk_nbits_gemv_int8", M * lay.N * 32, (*args, np.int32(bias is not None)))
        return y
    if not a16 and _f32_ring_ok(bits, block_size, M, lay, int(kind_), B, scales):
        if _launch_ring_f32(bits, M, lay, A, B, scales, bias, y):
            return y
    if _mma_ok(B, bits, block_size, bool(a16), int(kind_), int(z16)) and M > 0 and lay.N > 0:
        ptrs = (A, B, scales, zp, A if bias is None else bias, y)
        a_vec = lay.K % 8 == 0 and A.data.ptr % 16 == 0
        _launch_mma(bits, M, lay, ptrs, zps, int(kind_), bias is not None, a_vec, storage == "fp16")
        return y
    launch(
        "matmul_nbits",
        GEMV,
        "qk_nbits_gemv",
        M * lay.N * 32,
        (
            A,
            B,
            scales,
            zp,
            zps,
            A if bias is None else bias,
            y,
            np.int32(M),
            K_,
            N_,
            bits_,
            bs_,
            kb_,
            blob_,
            zpb_,
            kind_,
            np.int32(a.dtype == np.float16),
            s16,
            z16,
            np.int32(bias is not None),
        ),
    )
    return y

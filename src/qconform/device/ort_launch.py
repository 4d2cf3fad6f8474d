"""Launchers for the ONNX Runtime family's kernels (``kernels/ort_quant.hip``), with the oracles'
call shapes (``qconform.oracles.ort``) on CuPy arrays.

Every rule is checked before any launch by the oracles' own validators, run on zero-stride numpy
stand-ins of the device arrays (dtype and shape are what they check; value-range rules that
cannot reach device memory out of bounds are left to the kernels' definitions), plus
C-contiguity of every device array and the ``out`` buffer's shape and dtype.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

import cupy
import numpy as np

from qconform.device.launch import CUPY, launch_kernel
from qconform.device.loader import get_kernel
from qconform.device.registry import KERNEL_DIR, MMA_SHAPES, Geometry, check_grid
from qconform.errors import ArgumentError
from qconform.oracles.ort.gather_block_quantized import _check as check_gather_args
from qconform.oracles.ort.matmul_nbits import _check_a, check_nbits_args
from qconform.oracles.ort.qdq import QTYPES, check_fake_quantize_args
from qconform.oracles.ort.qswiglu import STEPS as SWIGLU_STEPS
from qconform.oracles.ort.qswiglu import check_activations, check_qparams

SOURCE = KERNEL_DIR / "ort_quant.hip"
THREADS = 256
ZP_DEFAULT, ZP_PACKED, ZP_FLOAT, ZP_SCALAR = 0, 1, 2, 3
DT_CODES = {"uint8": 0, "int4": 1, "uint4": 2, "float8e4m3fn": 3, "float8e5m2": 4}


def _shadow(a: Any) -> Any:
    """A numpy stand-in with a device array's dtype and shape (no copy of the data)."""
    if a is None or isinstance(a, (np.ndarray, np.generic)):
        return a
    if not isinstance(a, cupy.ndarray):
        raise ArgumentError(f"arguments must be cupy.ndarray, got {type(a).__name__}")
    return np.broadcast_to(np.zeros((), a.dtype), a.shape)


def _contiguous(**arrays: Any) -> None:
    """Every given array (None for an absent optional input) is a C-contiguous CuPy array: a
    kernel takes its pointer, so a host array here would be read as a device address."""
    for name, a in arrays.items():
        if a is None:
            continue
        if not isinstance(a, cupy.ndarray):
            raise ArgumentError(f"{name}: must be a cupy.ndarray, got {type(a).__name__}")
        if not a.flags.c_contiguous:
            raise ArgumentError(f"{name}: must be C-contiguous")


def _out(out: Any, shape: tuple[int, ...], dtype: np.dtype, *inputs: Any) -> Any:
    if out is None:
        return cupy.empty(shape, dtype)
    if not isinstance(out, cupy.ndarray):
        raise ArgumentError(f"out: must be a cupy.ndarray, got {type(out).__name__}")
    if out.dtype != dtype or out.shape != tuple(shape):
        raise ArgumentError(f"out: must be {np.dtype(dtype)}{tuple(shape)}, got {out.dtype}{out.shape}")
    _contiguous(out=out)
    if any(isinstance(a, cupy.ndarray) and CUPY.may_share_memory(out, a) for a in inputs):
        raise ArgumentError("out: must not overlap an input")
    return out


_BIND: list[list[tuple[Any, int, int, int, tuple]]] = []  # launches recorded by bound(), not run
OPTIONS: tuple[str, ...] = ()  # extra compile options, set through compile_options()


@contextlib.contextmanager
def compile_options(*options: str) -> Iterator[None]:
    """Build and launch this module's kernels with extra compile options inside the block (the
    device mutants' and controls' -D hooks, the bench's diagnostic builds)."""
    global OPTIONS
    saved, OPTIONS = OPTIONS, tuple(options)
    try:
        yield
    finally:
        OPTIONS = saved


def _launch(op: str, symbol: str, n_threads: int, args: tuple) -> None:
    """One thread per element: ceil(n_threads / THREADS) CTAs of THREADS."""
    if n_threads == 0:
        return
    _launch_grid(op, symbol, check_grid(op, n_threads, Geometry(1, THREADS)), THREADS, args)


def _launch_grid(op: str, symbol: str, grid: int, threads: int, args: tuple, shared_mem: int = 0) -> None:
    kernel = get_kernel(SOURCE, symbol, OPTIONS)
    if _BIND:
        _BIND[-1].append((kernel, grid, threads, shared_mem, args))
        return
    launch_kernel(op, kernel, grid, threads, args, shared_mem=shared_mem)


def bound(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[[], None]:
    """Check and bind one call of a launcher once; the returned function replays its kernel
    launches with nothing else on the host path (for timing: the checks cost more host time than
    a decode GEMV takes on the device)."""
    _BIND.append([])
    try:
        fn(*args, **kwargs)
    finally:
        launches = _BIND.pop()

    def replay() -> None:
        for kernel, grid, threads, shared_mem, kargs in launches:
            kernel((grid,), (threads,), kargs, shared_mem=shared_mem)

    return replay


@functools.cache
def _sm_count() -> int:
    return int(cupy.cuda.Device().attributes["MultiProcessorCount"])


def _mma_ok(B: Any, bits: int, block_size: int, a16: bool, zp_kind: int, z16: int) -> bool:
    """The matrix-unit kernel's domain: bits 2 / 4, fp16 A, blocks of 64 x 2^j, fp16 float zero points."""
    fp16_zp = zp_kind != ZP_FLOAT or z16
    pow2 = block_size % 64 == 0 and (block_size & (block_size - 1)) == 0
    return bits in (2, 4) and a16 and pow2 and B.data.ptr % 8 == 0 and bool(fp16_zp)


ACT_SMEM_LIMIT = 48 * 1024  # activations staged in shared memory up to this (CuPy's default dynamic limit)


def _launch_mma(bits: int, M: int, lay: Any, ptrs: tuple, zps: Any, kind: Any, has_bias: bool, a_vec: bool) -> None:
    """The matrix-unit kernel; ``ptrs`` = (A, B, scales, zero points, bias, Y)."""
    shape = MMA_SHAPES["decode" if M <= 8 else "prefill"]
    items = -(-lay.N // (16 * shape.r)) * -(-M // (8 * shape.t))
    n_chunks = -(-lay.K // 64)
    wk = shape.k_split(items, n_chunks, get_kernel(SOURCE, shape.symbol(bits), OPTIONS).num_regs, _sm_count())
    grid = -(-items // shape.wi)
    if grid >= 2**31:
        raise ArgumentError(f"A: {M} x {lay.N} outputs need more than 2^31 - 1 CTAs")
    red = wk * shape.wi * shape.r * shape.t * 4 * 32 * 4 if wk > 1 else 0
    staged = min(M, 8 * shape.t) * n_chunks * 64 * 2
    act_smem = shape.wi == 1 and staged <= ACT_SMEM_LIMIT
    A, B, scales, zp, bias, y = ptrs
    sizes = (M, lay.K, lay.N, (lay.block_size // 64).bit_length() - 1, lay.k_blocks, lay.zp_bytes, kind, has_bias)
    flags = (a_vec, act_smem, wk, shape.wi)
    args = (A, B, scales, zp, zps, bias, y, *(np.int32(v) for v in (*sizes, *flags)))
    _launch_grid("matmul_nbits", shape.symbol(bits), grid, 32 * wk * shape.wi, args, max(red, staged * act_smem))


def _zp_args(zero_points: Any, lay, form: str, B: Any) -> tuple[Any, float, int, int]:
    """(zp pointer, scalar zp, kind, zp is fp16)."""
    if zero_points is None:
        return B, 0.0, ZP_DEFAULT, 0
    if zero_points.dtype == np.uint8:
        return zero_points, 0.0, ZP_PACKED, 0
    if form == "kernel" and zero_points.size == 1:
        return B, float(cupy.asnumpy(zero_points).reshape(())), ZP_SCALAR, 0
    return zero_points, 0.0, ZP_FLOAT, int(zero_points.dtype == np.float16)


def _nbits_args(B, scales, zero_points, g_idx, K, N, bits, block_size, form):
    if g_idx is not None:
        raise ArgumentError("g_idx: the device kernels do not implement g_idx (deprecated in ORT)")
    _contiguous(B=B, scales=scales, zero_points=zero_points)
    lay = check_nbits_args(
        _shadow(B), _shadow(scales), _shadow(zero_points), None, K=K, N=N, bits=bits, block_size=block_size, form=form
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
    B, scales, zero_points=None, g_idx=None, *, K, N, bits, block_size, form="ort", ort_quirks=False, out=None
):
    """W (N, K) fp32, bit-identical to ``oracles.ort.dequantize_nbits``."""
    lay, zp, zps, common, s16, z16 = _nbits_args(B, scales, zero_points, g_idx, K, N, bits, block_size, form)
    y = _out(out, (lay.N, lay.K), np.dtype(np.float32), B, scales, zero_points)
    K_, N_, bits_, bs_, kb_, blob_, zpb_, kind_ = common
    _launch(
        "dequantize_nbits",
        "qk_nbits_dequant",
        lay.N * lay.K,
        (B, scales, zp, zps, y, K_, N_, bits_, bs_, kb_, blob_, zpb_, kind_, s16, z16),
    )
    return y


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
    ort_quirks=False,
    out=None,
):
    """Y = A @ W^T (+ bias) in A's dtype (fp32 or fp16 read and written natively), fp32 sums;
    accuracy_level 4 with integer zero points: ORT's int8 activation path (as the oracle)."""
    if accuracy_level not in (0, 1, 2, 3, 4):
        raise ArgumentError(f"accuracy_level: must be 0..4, got {accuracy_level!r}")
    lay, zp, zps, common, s16, z16 = _nbits_args(B, scales, zero_points, g_idx, K, N, bits, block_size, form)
    _contiguous(A=A, bias=bias)
    a = _check_a(_shadow(A), _shadow(bias), lay)
    if a.dtype != scales.dtype:
        raise ArgumentError(f"scales: dtype must be A's {a.dtype}, got {scales.dtype}")
    M = int(np.prod(a.shape[:-1], dtype=np.int64))
    y = _out(out, (*a.shape[:-1], lay.N), a.dtype, A, B, scales, zero_points, bias)
    K_, N_, bits_, bs_, kb_, blob_, zpb_, kind_ = common
    a16 = np.int32(a.dtype == np.float16)
    if accuracy_level == 4 and int(kind_) in (ZP_DEFAULT, ZP_PACKED):
        qa = cupy.empty((M, lay.K), cupy.int32)
        sa = cupy.empty((M, lay.k_blocks), cupy.float32)
        _launch("matmul_nbits", "qk_quantize_a_int8", M * lay.k_blocks, (A, qa, sa, np.int32(M), K_, bs_, kb_, a16))
        bias_ptr = A if bias is None else bias
        args = (qa, sa, B, scales, zp, bias_ptr, y, np.int32(M), K_, N_, bits_, bs_, kb_, blob_, zpb_, kind_, a16, s16)
        _launch("matmul_nbits", "qk_nbits_gemv_int8", M * lay.N * 32, (*args, np.int32(bias is not None)))
        return y
    if _mma_ok(B, bits, block_size, bool(a16), int(kind_), int(z16)) and M > 0 and lay.N > 0:
        ptrs = (A, B, scales, zp, A if bias is None else bias, y)
        a_vec = lay.K % 8 == 0 and A.data.ptr % 16 == 0
        _launch_mma(bits, M, lay, ptrs, zps, int(kind_), bias is not None, a_vec)
        return y
    _launch(
        "matmul_nbits",
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


def gather_block_quantized(
    data,
    indices,
    scales,
    zero_points=None,
    *,
    bits=4,
    block_size=128,
    gather_axis=0,
    quantize_axis=1,
    data_type="uint8",
    data_shape=None,
    out_of_range="zero",
    out=None,
):
    """Gather then dequantize, bit-identical to the oracle, for 2-D tables gathered along axis 0."""
    _contiguous(data=data, indices=indices, scales=scales, zero_points=zero_points)
    shape, gax, qax, blocks = check_gather_args(
        _shadow(data),
        _shadow(indices),
        _shadow(scales),
        _shadow(zero_points),
        bits,
        block_size,
        gather_axis,
        quantize_axis,
        data_type,
        data_shape,
    )
    if len(shape) != 2 or gax != 0 or qax != 1:
        raise ArgumentError("data: the device kernel gathers rows of a 2-D table (gather_axis 0, quantize_axis 1)")
    if scales.shape != (shape[0], blocks):
        raise ArgumentError(f"scales: the device kernel needs one scale per block, shape {(shape[0], blocks)}")
    if out_of_range != "zero":
        raise ArgumentError("out_of_range: the device kernel gives zeros (ORT >= 1.31)")
    rows, cols = shape
    idx = indices.astype(cupy.int64)
    y = _out(out, (*indices.shape, cols), scales.dtype, data, indices, scales, zero_points)
    bsz = cols if blocks == 1 and block_size == 0 else block_size
    _launch(
        "gather_block_quantized",
        "qk_gather_block_quantized",
        idx.size * cols,
        (
            data,
            idx,
            scales,
            data if zero_points is None else zero_points,
            y,
            np.int32(rows),
            np.int32(cols),
            np.int32(idx.size),
            np.int32(bits),
            np.int32(bsz),
            np.int32(blocks),
            np.int32(DT_CODES[data_type]),
            np.int32(zero_points is not None),
            np.int32(scales.dtype == np.float16),
            np.int32(data.shape[-1] if data.ndim == 2 else 0),
            np.int32(zero_points.shape[-1] if zero_points is not None and zero_points.ndim == 2 else 0),
        ),
    )
    return y


def fake_quantize(x, scale, zero_point=None, *, axis=1, block_size=0, dtype=None, out=None):
    """DQ(Q(x)) bit-identical to the oracle, for 2-D x quantized along axis 1."""
    _contiguous(x=x, scale=scale, zero_point=zero_point)
    xs, ss, dtype = check_fake_quantize_args(_shadow(x), _shadow(scale), _shadow(zero_point), axis, block_size, dtype)
    _, lo, hi = QTYPES[dtype]
    if xs.ndim != 2 or axis % 2 != 1:
        raise ArgumentError("x: the device kernel takes 2-D x quantized along axis 1")
    if ss.dtype != xs.dtype:
        raise ArgumentError(f"scale: dtype must be x's {xs.dtype} on the device, got {ss.dtype}")
    gran = 0 if ss.ndim == 0 or (ss.shape == (1,) and block_size == 0) else (1 if block_size == 0 else 2)
    y = _out(out, xs.shape, ss.dtype, x, scale, zero_point)
    zp = cupy.zeros(1, cupy.int32) if zero_point is None else zero_point.astype(cupy.int32).ravel()
    rows, cols = xs.shape
    _launch(
        "fake_quantize",
        "qk_fake_quantize",
        rows * cols,
        (
            x,
            scale,
            zp,
            y,
            np.int32(rows),
            np.int32(cols),
            np.int32(gran),
            np.int32(max(block_size, 1)),
            np.int32(lo),
            np.int32(hi),
            np.int32(xs.dtype == np.float16),
            np.int32(zero_point is not None),
        ),
    )
    return y


def qswiglu(gate_q, up_q, *, dtype="uint16", out=None, fused=True, **qparams):
    """The quantized SwiGLU chain: one fused kernel, or (``fused=False``) its unfused steps as
    separate kernels; the two are byte-identical (same device functions)."""
    np_dtype = check_activations(gate_q, up_q, dtype, cupy.ndarray)
    _contiguous(gate_q=gate_q, up_q=up_q)
    checked = check_qparams({k: _host(v) for k, v in qparams.items()}, np_dtype)
    p = {k: (np.float32(sc), np.int32(zp)) for k, (sc, zp) in checked.items()}
    y = _out(out, gate_q.shape, np_dtype, gate_q, up_q)
    n, hi, is16 = np.int64(gate_q.size), np.int32(QTYPES[dtype][2]), np.int32(dtype == "uint16")
    if fused:
        flat = tuple(v for k in SWIGLU_STEPS for v in p[k])  # the kernel's argument order
        _launch("qswiglu", "qk_qswiglu_fused", int(n), (gate_q, up_q, y, n, *flat, hi, is16))
        return y
    g, u, t = (cupy.empty(gate_q.shape, cupy.float32) for _ in range(3))
    q = cupy.empty(gate_q.shape, np_dtype)
    _launch("qswiglu", "qk_step_dequantize", int(n), (gate_q, g, n, *p["gate"], is16))
    _launch("qswiglu", "qk_step_dequantize", int(n), (up_q, u, n, *p["up"], is16))
    _launch("qswiglu", "qk_step_sigmoid_quantize", int(n), (g, q, n, *p["sig"], hi, is16))
    _launch("qswiglu", "qk_step_dequantize", int(n), (q, t, n, *p["sig"], is16))
    _launch("qswiglu", "qk_step_mul_quantize", int(n), (g, t, q, n, *p["silu"], hi, is16))
    _launch("qswiglu", "qk_step_dequantize", int(n), (q, t, n, *p["silu"], is16))
    _launch("qswiglu", "qk_step_mul_quantize", int(n), (t, u, y, n, *p["out"], hi, is16))
    return y


def _host(v: Any) -> Any:
    return cupy.asnumpy(v) if isinstance(v, cupy.ndarray) else v


DEVICE_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "dequantize_nbits": dequantize_nbits,
    "matmul_nbits": matmul_nbits,
    "gather_block_quantized": gather_block_quantized,
    "fake_quantize": fake_quantize,
    "qswiglu": qswiglu,
}

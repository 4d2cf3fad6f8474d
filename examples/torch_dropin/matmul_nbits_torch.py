"""A worked device ``py:`` drop-in for matmul_nbits (com.microsoft.MatMulNBits), in PyTorch.

A device drop-in has the oracle's call shape (``qconform.oracles.ort.matmul_nbits``: the same
positional and keyword arguments) but receives device arrays: the suite passes CuPy arrays, and
``torch.as_tensor(x, device="cuda")`` reads them without a copy. It returns a device array (a torch
tensor is fine) or, when the suite passes ``out=`` (a poisoned CuPy array), writes into ``out``
and returns it. Run it with::

    qconform run --ops matmul_nbits --impl py:examples/torch_dropin/matmul_nbits_torch.py:matmul_nbits

What it does, step by step:

1. checks the arguments with qconform's own validators (``check_nbits_args``, ``check_a``) on
   host stand-ins of the device arrays (their shapes and dtypes), so a bad call is rejected with
   the op's own ``ArgumentError`` before anything runs on the device;
2. declines (``qconform.Declined``: counted, not failed) what it does not implement: ORT's int8
   activation path (accuracy_level 4 with integer zero points) and ``g_idx``;
3. dequantizes the weights to W (N, K) fp32 exactly as the oracle does (``dequantize`` below:
   one function for torch and numpy, so tests/test_user_kernels.py checks it bit for bit against
   the oracle on a machine without a GPU);
4. Y = A @ W^T (+ bias) in fp32 with TF32 off (fp32 products and sums; the suite checks the sum
   within its K-derived bound), rounded once to A's dtype.

The weights: B (N, k_blocks, block_size * bits / 8) uint8; the value q of column n at K index k is
field k % block_size of blob B[n, k // block_size], ``bits`` wide, the fields packed LOW bits first
in a little-endian bit stream (a 3-bit field may straddle two bytes). The last block is padded.
Zero points (``qconform abi matmul_nbits``):
  absent               z = 2^(bits-1)           w = fp32((q - z) * s)           one rounding
  uint8 packed         z = field kb of row n    w = fp32((q - z) * s)
  float, form "ort"    z = zero_points[n, kb]   w = fp32(q * s) + fp32(-s * z)  ORT's two roundings
  form "kernel"        z any of the above, or one scalar: w = fp32(fp32(q - z) * s)
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np

import qconform
from qconform.oracles.ort import check_a, check_nbits_args

try:
    import torch
except ImportError:  # dequantize() also runs on numpy (the offline check); matmul_nbits needs torch
    torch = None


def default_zero_point(bits: int) -> int:
    """The zero point when none is given: the middle of the unsigned range, 2^(bits-1)."""
    return 1 << (bits - 1)


# ------------------------------------------------------------------ the array operations used


class NumpyOps:
    """The few operations ``dequantize`` needs beyond arithmetic, on numpy arrays (CPU)."""

    @staticmethod
    def int32(a: Any) -> Any:
        return a.astype(np.int32)

    @staticmethod
    def float32(a: Any) -> Any:
        return a.astype(np.float32)

    @staticmethod
    def is_uint8(a: Any) -> bool:
        return a.dtype == np.uint8

    @staticmethod
    def arange(n: int, like: Any) -> Any:
        return np.arange(n)

    @staticmethod
    def append_zero_byte(a: Any) -> Any:
        return np.concatenate([a, np.zeros((*a.shape[:-1], 1), a.dtype)], axis=-1)


class TorchOps:
    """The same on torch tensors (on the tensors' device)."""

    @staticmethod
    def int32(a: Any) -> Any:
        return a.to(torch.int32)

    @staticmethod
    def float32(a: Any) -> Any:
        return a.to(torch.float32)

    @staticmethod
    def is_uint8(a: Any) -> bool:
        return a.dtype == torch.uint8

    @staticmethod
    def arange(n: int, like: Any) -> Any:
        return torch.arange(n, device=like.device)

    @staticmethod
    def append_zero_byte(a: Any) -> Any:
        return torch.cat([a, torch.zeros((*a.shape[:-1], 1), dtype=a.dtype, device=a.device)], dim=-1)


# ------------------------------------------------------------------ dequantization (any backend)


def unpack_fields(ops: Any, packed: Any, bits: int, count: int) -> Any:
    """uint8 (..., bytes) holding ``count`` fields of ``bits`` bits, low bits first -> int32 (..., count).

    Field j occupies bits [j*bits, j*bits + bits) of the little-endian bit stream: it starts in
    byte j*bits // 8 at bit j*bits % 8 and, for 3 bits, may run into the next byte, so each field
    is read from a 16-bit window of two bytes (one zero byte appended for the last field)."""
    stream = ops.int32(ops.append_zero_byte(packed))
    start = ops.arange(count, packed) * bits
    first, shift = start // 8, ops.int32(start % 8)
    window = stream[..., first] | (stream[..., first + 1] << 8)
    return (window >> shift) & ((1 << bits) - 1)


def dequantize(
    ops: Any,
    B: Any,
    scales: Any,
    zero_points: Any = None,
    *,
    K: int,
    N: int,
    bits: int,
    block_size: int,
    form: str = "ort",
) -> Any:
    """W (N, K) fp32, bit for bit what ``qconform.oracles.ort.dequantize_nbits`` returns (the module
    docstring has the formulas); ``ops`` is ``NumpyOps`` or ``TorchOps``. Works block by block:
    q (N, k_blocks, block_size) against a scale and zero point (N, k_blocks, 1) per block."""
    k_blocks = -(-K // block_size)
    q = unpack_fields(ops, B.reshape(N, k_blocks, -1), bits, block_size)
    s = ops.float32(scales).reshape(N, k_blocks, 1)
    z_is_float = zero_points is not None and not ops.is_uint8(zero_points)
    if zero_points is None:
        z = default_zero_point(bits)
    elif not z_is_float:
        z = unpack_fields(ops, zero_points.reshape(N, -1), bits, k_blocks).reshape(N, k_blocks, 1)
    elif zero_points.reshape(-1).shape[0] == 1:  # one scalar (form "kernel" only)
        z = ops.float32(zero_points).reshape(())
    else:
        z = ops.float32(zero_points).reshape(N, k_blocks, 1)
    if form == "kernel":
        w = ops.float32(ops.float32(q) - z) * s  # fp32(fp32(q - z) * s)
    elif z_is_float:
        w = ops.float32(q) * s + (-s * z)  # fp32(q * s) + fp32(-s * z): three fp32 roundings
    else:
        w = ops.float32(q - z) * s  # q - z is an exact integer: one rounding
    return w.reshape(N, k_blocks * block_size)[:, :K]  # the last block's padding dropped


# ------------------------------------------------------------------ the drop-in


def _host_standin(a: Any) -> Any:
    """A numpy array with ``a``'s shape and dtype (never its values: np.empty commits no memory),
    for qconform's validators, which read shapes and dtypes."""
    if a is None:
        return None
    dtype = np.dtype(str(a.dtype).removeprefix("torch."))
    return np.empty(tuple(a.shape), dtype)


@functools.cache
def _torch_runtime() -> tuple[Any, str] | None:
    """(ctypes handle, GetLastError's name) of the shared CUDA/HIP runtime that PyTorch's kernels
    report through (the libcudart / libamdhip64 of PyTorch's own installation, mapped into this
    process), or None where PyTorch links it statically."""
    root = str(Path(torch.__file__).resolve().parent.parent)  # site-packages: torch/, nvidia/
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        path = fields[5] if len(fields) == 6 else ""
        name = os.path.basename(path)
        if path.startswith(root) and name.startswith(("libcudart.so", "libamdhip64.so")):
            lib = ctypes.CDLL(path)
            get = "hipGetLastError" if name.startswith("libamdhip64") else "cudaGetLastError"
            getattr(lib, get).restype = ctypes.c_int
            return lib, get
    return None


def clear_pending_runtime_error() -> None:
    """PyTorch checks the runtime's last-error slot (cudaGetLastError) after each kernel it
    launches and raises for whatever is pending there, including an error its caller left
    behind: that would make this call fail for someone else's error. So the drop-in takes the
    slot over on entry and clears it: by design, and reported by qconform's pending-error
    property as a WARNING (the caller's error is gone), not as a failure."""
    runtime = _torch_runtime()
    if runtime is not None:
        lib, get = runtime
        getattr(lib, get)()


@contextlib.contextmanager
def ieee_fp32_matmul() -> Iterator[None]:
    """fp32 matrix products in IEEE fp32 (TF32 off) inside the block; the caller's setting restored."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):  # PyTorch 2.9+
        saved = matmul.fp32_precision
        matmul.fp32_precision = "ieee"
        try:
            yield
        finally:
            matmul.fp32_precision = saved
    else:
        saved = matmul.allow_tf32
        matmul.allow_tf32 = False
        try:
            yield
        finally:
            matmul.allow_tf32 = saved


def matmul_nbits(
    A: Any,
    B: Any,
    scales: Any,
    zero_points: Any = None,
    g_idx: Any = None,
    bias: Any = None,
    *,
    K: int,
    N: int,
    bits: int,
    block_size: int,
    accuracy_level: int = 0,
    form: str = "ort",
    out: Any = None,
) -> Any:
    """Y (..., N) = A (..., K) @ W^T (+ bias), in A's dtype, on the GPU (see the module docstring)."""
    # 1. the op's argument rules, before anything runs
    host = {name: _host_standin(a) for name, a in (("B", B), ("scales", scales), ("zero_points", zero_points))}
    lay = check_nbits_args(**host, K=K, N=N, bits=bits, block_size=block_size, form=form)
    a_host = check_a(_host_standin(A), _host_standin(bias), lay)
    if accuracy_level not in (0, 1, 2, 3, 4):
        raise qconform.ArgumentError(f"accuracy_level: must be 0..4, got {accuracy_level!r}")
    y_shape, y_dtype = (*a_host.shape[:-1], lay.N), a_host.dtype
    if out is not None and (tuple(out.shape) != y_shape or _host_standin(out).dtype != y_dtype):
        raise qconform.ArgumentError(f"out: must be {y_dtype}{y_shape}, got {out.dtype}{tuple(out.shape)}")
    # 2. what this drop-in does not implement
    integer_zp = zero_points is None or _host_standin(zero_points).dtype == np.uint8
    if accuracy_level == 4 and integer_zp:
        raise qconform.Declined("int8 activations not implemented")
    if g_idx is not None:
        raise qconform.Declined("g_idx not implemented")
    clear_pending_runtime_error()

    def dev(a: Any) -> Any:
        return None if a is None else torch.as_tensor(a, device="cuda")  # CuPy -> torch, no copy

    a = dev(A)
    # 3. and 4.
    with ieee_fp32_matmul():
        W = dequantize(
            TorchOps, dev(B), dev(scales), dev(zero_points), K=K, N=N, bits=bits, block_size=block_size, form=form
        )
        Y = a.reshape(-1, K).to(torch.float32) @ W.T
        if bias is not None:
            Y = Y + dev(bias).to(torch.float32)
        Y = Y.to(a.dtype).reshape(y_shape)  # one rounding to A's dtype
    if out is None:
        return Y
    torch.as_tensor(out, device="cuda").copy_(Y)
    return out


matmul_nbits.__qconform_device__ = True  # device arrays in and out
matmul_nbits.__qconform_ops__ = ("matmul_nbits",)

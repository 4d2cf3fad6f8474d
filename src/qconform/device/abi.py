"""Call a user's kernel (``hip:``) or C launcher (``so:``) with an op's declared ABI
(``qconform.ops.abi``): check every rule on host stand-ins of the device arrays (the catalogue's
``bind``, which runs the oracle's own validators), check the ``out`` buffer, convert the inputs the
ABI passes in another dtype, then launch with the op's default geometry or the user's override.
Nothing is launched and nothing written when a rule is broken.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

import cupy
import numpy as np

from qconform.device.launch import CUPY, launch_kernel
from qconform.device.registry import Launch
from qconform.errors import ArgumentError
from qconform.ops import OpSpec
from qconform.ops.abi import Abi, Bound, call_arguments, check_predicate
from qconform.ops.spec import output_parts

SMALL_BYTES = 1 << 20  # device arrays up to this size are copied to the host for validation


def shadow(name: str, a: Any) -> Any:
    """A host stand-in with a device array's dtype and shape for the oracle's validators: a copy
    of small arrays (scales, zero points and indices are checked by value), zeros for large ones
    (weights and activations: only their dtype and shape are checked; zero pages cost nothing).
    Host values pass through."""
    if not isinstance(a, cupy.ndarray):
        return a  # None, host values (attributes, shapes); a host array is refused by the binding below
    if not a.flags.c_contiguous:
        raise ArgumentError(f"{name}: must be C-contiguous")
    if a.nbytes <= SMALL_BYTES:
        return cupy.asnumpy(a)
    return np.zeros(a.shape, a.dtype)


@dataclass
class AbiCall:
    """An op call bound to its ABI: the argument values in order and the output array."""

    op: str
    bound: Bound
    out: Any
    pointers: list[Any] = field(default_factory=list)  # device arrays (None: null), output included
    scalars: list[Any] = field(default_factory=list)  # np.int64 / np.float32 in ABI order

    def kernel_args(self) -> tuple:
        null = np.uint64(0)
        return (*(null if p is None else p for p in self.pointers), *self.scalars)

    def c_args(self, stream: int) -> tuple:
        ptrs = (0 if p is None else p.data.ptr for p in self.pointers)
        return (*ptrs, *(s.item() for s in self.scalars), stream)


def host_standins(op: OpSpec, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """A call of ``op``'s oracle on device arrays, with host stand-ins (dtype and shape, no data)."""
    named = call_arguments(op.oracle, args, kwargs)
    return tuple(shadow(name, v) for name, v in zip(named, args, strict=False)), {
        k: shadow(k, v) for k, v in kwargs.items()
    }


def bind_call(op: OpSpec, args: tuple, kwargs: dict[str, Any], out: Any = None) -> AbiCall:
    """Bind a call of ``op``'s oracle on device arrays to ``op.abi``: check every rule on host
    stand-ins (ArgumentError), Declined where the ABI cannot express the call, check or allocate
    ``out`` (a tuple of one buffer per output for an op with several); inputs the ABI passes in
    another dtype are converted."""
    named = call_arguments(op.oracle, args, kwargs)
    bound = op.abi.bind(*host_standins(op, args, kwargs))
    if len(bound.outs) > 1 and out is not None and (not isinstance(out, tuple) or len(out) != len(bound.outs)):
        pair = " (a pair)" if len(bound.outs) == 2 else ""
        raise ArgumentError(
            f"out: must be a tuple of {len(bound.outs)} buffers{pair}, one per output ({', '.join(op.output_names)})"
        )
    given = output_parts(out) if out is not None else (None,) * len(bound.outs)
    inputs = tuple(named.values())
    results = [out_buffer(o, shape, dtype, *inputs) for o, (shape, dtype) in zip(given, bound.outs, strict=True)]
    call = AbiCall(op.name, bound, results[0] if len(results) == 1 else tuple(results))
    outs = iter(results)
    for arg in op.abi.pointers:
        if arg.kind == "out":
            call.pointers.append(next(outs))
            continue
        src = bound.tensors.get(arg.name)
        if src is None:
            call.pointers.append(None)
            continue
        key, dtype = src
        a = named[key]
        if not isinstance(a, cupy.ndarray):
            raise ArgumentError(f"{key}: must be a cupy.ndarray (a device pointer), got {type(a).__name__}")
        call.pointers.append(a if a.dtype == dtype else cupy.ascontiguousarray(a.astype(dtype)))
    for arg, value in op.abi.values(bound):
        call.scalars.append(np.int64(value) if arg.kind == "i64" else np.float32(value))
    return call


def run_abi(op: OpSpec, kernel: Any, launch: Launch, args: tuple, kwargs: dict[str, Any], out: Any = None) -> Any:
    """One call of ``op`` with the oracle's call shape on CuPy arrays through a kernel of its ABI."""
    return launch_hip(op, kernel, launch, bind_call(op, args, kwargs, out))


def out_buffer(out: Any, shape: tuple[int, ...], dtype: Any, *inputs: Any) -> Any:
    """``out`` checked (a C-contiguous CuPy array of this shape and dtype, overlapping no input),
    or a new one when it is None."""
    if out is None:
        return cupy.empty(shape, dtype)
    if not isinstance(out, cupy.ndarray):
        raise ArgumentError(f"out: must be a cupy.ndarray, got {type(out).__name__}")
    if out.dtype != dtype:
        raise ArgumentError(f"out: dtype must be {np.dtype(dtype)}, got {out.dtype}")
    if out.shape != tuple(shape):
        raise ArgumentError(f"out: shape must be {tuple(shape)}, got {out.shape}")
    if not out.flags.c_contiguous:
        raise ArgumentError("out: must be C-contiguous")
    if any(isinstance(a, cupy.ndarray) and CUPY.may_share_memory(out, a) for a in inputs):
        raise ArgumentError("out: must not overlap an input")
    return out


def check_requires(launch: Launch, call: AbiCall) -> None:
    """Decline the case when the user's ``requires=`` predicate is false on its ABI scalars."""
    if launch.requires is not None:
        check_predicate(launch.requires, call.bound.scalars)


def launch_hip(op: OpSpec, kernel: Any, launch: Launch, call: AbiCall, stream: Any = None) -> Any:
    """Launch ``kernel`` with the bound arguments; zero work launches nothing."""
    check_requires(launch, call)
    if call.bound.work == 0 and launch.grid is None:
        return call.out
    grid, threads = launch.shape(op.abi, call.bound.work)
    launch_kernel(op.name, kernel, grid, threads, call.kernel_args(), stream, shared_mem=launch.smem)
    return call.out


def c_argtypes(abi: Abi) -> list[Any]:
    """ctypes argument types of a ``so:`` launcher for ``abi``: pointers, scalars, the stream."""
    kinds = {"in": ctypes.c_void_p, "out": ctypes.c_void_p, "i64": ctypes.c_longlong, "f32": ctypes.c_float}
    return [kinds[a.kind] for a in abi.args] + [ctypes.c_void_p]

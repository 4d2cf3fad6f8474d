"""Device implementations: ``cupy[:variant]`` (our kernels), ``hip:file.hip:symbol`` (a user's
kernel source compiled by the same loader, launched with the op's declared ABI), ``so:lib.so:symbol``
(a user's C launcher called through ctypes with the same ABI plus the stream) and device ``py:``
callables (the oracle's call shape on device arrays: CuPy, or anything with
``__cuda_array_interface__`` / DLPack such as a PyTorch tensor). All take the suite's numpy
inputs, run on the device and return numpy, so every property applies unchanged; ``out=`` is
uploaded as it is (poison included) and the device result copied back only after a successful call.
"""

from __future__ import annotations

import ctypes
import inspect
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import cupy
import numpy as np

from qconform import guard
from qconform.contracts import STRICT
from qconform.device import errstate
from qconform.device.abi import bind_call, c_argtypes, check_requires, host_standins, run_abi
from qconform.device.functions import DEVICE_FUNCTIONS
from qconform.device.ggml.q8_quant import run_op
from qconform.device.loader import device_info, get_kernel
from qconform.device.registry import KERNELS, VARIANTS, parse_impl_spec
from qconform.errors import ArgumentError, Declined, DeviceError
from qconform.impls.cpu import accepts_kwarg
from qconform.ops import CATALOGUE, OpSpec
from qconform.ops.abi import STATUS_DECLINED, check_declared_predicate
from qconform.ops.spec import output_parts

CUPY_OPS = (*dict.fromkeys(k.op for k in KERNELS), *DEVICE_FUNCTIONS)  # ops qconform's own kernels cover


def to_device(a: Any) -> Any:
    """Upload a numpy array as it is: dtype, shape and (for a non-contiguous view) non-contiguity,
    so the launcher's own checks see what the caller passed. Anything else is passed through."""
    if isinstance(a, np.generic):  # a numpy scalar (a per-tensor scale): a 0-d device array
        a = np.asarray(a)
    if not isinstance(a, np.ndarray):
        return a
    if a.ndim == 0 or a.flags.c_contiguous:
        return cupy.asarray(a)
    full = cupy.empty((*a.shape[:-1], 2 * a.shape[-1]), a.dtype)
    view = full[..., ::2]
    view[...] = cupy.asarray(np.ascontiguousarray(a))
    return view


def synchronize(what: str) -> None:
    """Wait for the current stream; an asynchronous fault of the call is a DeviceError."""
    try:
        cupy.cuda.get_current_stream().synchronize()
    except (cupy.cuda.runtime.CUDARuntimeError, cupy.cuda.driver.CUDADriverError) as exc:
        raise DeviceError(f"{what}: the device reported {exc} after the call") from exc


class DeviceImpl:
    """Shared host<->device plumbing; subclasses implement ``launch`` on CuPy arrays."""

    on_device = True
    accepts_out = True
    guessed = False
    ftz: bool | None = True  # CuPy compiles device code with flush-to-zero on both vendors
    contract = STRICT

    def __init__(self, name: str, ops: tuple[str, ...] | None, guessed: bool = False) -> None:
        info = device_info()
        self.name = name
        self.ops = ops
        self.guessed = guessed
        self.arch = info.label
        self.l2_bytes = info.l2_bytes
        self.is_hip = info.is_hip

    def applies_to(self, op: OpSpec) -> bool:
        return op.name in (self.ops if self.ops is not None else CUPY_OPS)

    def launch(self, op: OpSpec, dev_inputs: dict[str, Any], params: dict[str, Any], dev_out: Any) -> Any:
        raise NotImplementedError

    def run(
        self,
        op: OpSpec,
        leaf: str,
        inputs: dict[str, Any],
        params: dict[str, Any],
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        outs = {} if out is None else _out_names(out)
        guards = guard.guarded_inputs({**inputs, **outs}, cupy)  # inputs and out in guarded device memory
        dev = {k: guards[k][1] if k in guards else to_device(v) for k, v in inputs.items()}
        dev_outs = tuple(guards[k][1] if k in guards else to_device(v) for k, v in outs.items())
        dev_out = None if out is None else (dev_outs if isinstance(out, tuple) else dev_outs[0])
        result = self.launch(op, dev, params, dev_out)
        synchronize(op.name)
        guard.check(guards)
        _mirror_inputs(inputs, dev)
        host = tuple(cupy.asnumpy(r) for r in result) if isinstance(result, tuple) else cupy.asnumpy(result)
        if out is None:
            return host
        for mine, back in zip(output_parts(out), output_parts(host), strict=True):
            mine[...] = back
        return out

    def stage(self, op: OpSpec, leaf: str, inputs: dict[str, Any], params: dict[str, Any]) -> Callable[[], Any]:
        """Upload once; each call of the returned function launches on the resident inputs and
        returns the output, kept on the device and compared there bit for bit."""
        dev = {k: to_device(v) for k, v in inputs.items()}

        def call() -> DeviceBits:
            result = self.launch(op, dev, params, None)
            synchronize(op.name)
            return DeviceBits(result)

        return call

    def error_slot(self) -> tuple[errstate.ErrorSlot | None, str]:
        return errstate.process_slot(self.is_hip)

    def bad_call_status(self, op: OpSpec, leaf: str) -> tuple[int, str] | None:
        """(status, detail) of a deliberately bad call at the ABI level; None where the ABI can't
        express one (our launchers reject bad calls before any launch)."""
        return None


def _out_names(out: Any) -> dict[str, Any]:
    """``out`` (a buffer, or a tuple of one per output) by the names its guards report."""
    parts = output_parts(out)
    return {"out": parts[0]} if len(parts) == 1 else {f"out {i}": a for i, a in enumerate(parts)}


class DeviceBits:
    """A device output (or tuple of outputs) compared by its bits (``==``), without a copy to the host."""

    def __init__(self, a: Any) -> None:
        self.parts = output_parts(a)

    def checked(self, defined: tuple[np.ndarray | None, ...]) -> "DeviceBits":
        """Only the ``defined`` elements (True; one mask per output, None: all), flattened."""
        return DeviceBits(
            tuple(a if m is None else a[cupy.asarray(m)] for a, m in zip(self.parts, defined, strict=True))
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DeviceBits) or len(other.parts) != len(self.parts):
            return False
        for a, b in zip(self.parts, other.parts, strict=True):
            if a.shape != b.shape or a.dtype != b.dtype:
                return False
            if not bool(cupy.array_equal(a.view(cupy.uint8), b.view(cupy.uint8))):
                return False
        return True

    __hash__ = None  # type: ignore[assignment]


def _mirror_inputs(inputs: dict[str, Any], dev: dict[str, Any]) -> None:
    """Copy a device input the call modified back into the caller's array, so the suite's
    inputs-untouched check sees what the kernel did."""
    for k, a in inputs.items():
        d = dev[k]
        if isinstance(a, np.ndarray) and a.ndim and a.flags.c_contiguous and a.flags.writeable:
            back = cupy.asnumpy(d)
            if back.tobytes() != a.tobytes():
                a[...] = back


class CupyImpl(DeviceImpl):
    """qconform's own kernels (``variant``: ``coop`` / ``ref`` where an op has both)."""

    def __init__(self, variant: str | None = None) -> None:
        super().__init__("cupy" if variant is None else f"cupy:{variant}", None)
        self.variant = variant

    def launch(self, op: OpSpec, dev_inputs: dict[str, Any], params: dict[str, Any], dev_out: Any) -> Any:
        if op.name in DEVICE_FUNCTIONS:  # the oracle's call shape on device arrays
            args, kwargs = op.call_args(dev_inputs, params)
            fn = DEVICE_FUNCTIONS[op.name]
            if takes_variant(fn):  # a launcher with several readings runs the contract's (bnb)
                kwargs = {**kwargs, "variant": self.contract.variant}
            if takes_storage(fn):  # a launcher whose fast kernel needs the contract's storage (gqa_prefill)
                kwargs = {**kwargs, "storage": self.contract.storage}
            if takes_order(fn):  # a launcher whose fast kernel needs the contract's order (matmul_bt_quant)
                kwargs = {**kwargs, "order": self.contract.order}
            return fn(*args, **kwargs, out=dev_out)
        return run_op(op.name, dev_inputs, params, dev_out, variant=self.variant)


def takes_variant(fn: Callable[..., Any]) -> bool:
    """``fn`` has a ``variant`` parameter: the bitsandbytes reading it computes (qconform.ops.bnb)."""
    try:
        return "variant" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def takes_storage(fn: Callable[..., Any]) -> bool:
    """``fn`` has a ``storage`` parameter: the contract's storage type picks its kernel (gqa_prefill)."""
    try:
        return "storage" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def takes_order(fn: Callable[..., Any]) -> bool:
    """``fn`` has an ``order`` parameter: the contract's reduction order picks its kernel (matmul_bt_quant)."""
    try:
        return "order" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class HipSourceImpl(DeviceImpl):
    """A user's kernel source: ``hip:path/file.hip:symbol[:key=value]...``, compiled with the same
    RawModule loader (``kernels/common`` on the include path: ``qk_portable.h``, ``qconform_abi.h``),
    launched with the op's declared ABI (``qconform abi OP``) and its default geometry, or the
    ``lanes`` / ``threads`` / ``grid`` / ``smem`` given; ``opt=`` passes compiler options;
    ``requires=`` declines the cases where a predicate over the ABI's scalars is false."""

    def __init__(self, spec: str, ops: tuple[str, ...], guessed: bool) -> None:
        super().__init__(spec, ops, guessed)
        path, symbol, self.geometry = parse_impl_spec(spec)
        self.kernel = get_kernel(path, symbol, self.geometry.options)

    def launch(self, op: OpSpec, dev_inputs: dict[str, Any], params: dict[str, Any], dev_out: Any) -> Any:
        args, kwargs = op.call_args(dev_inputs, params)
        return run_abi(op, self.kernel, self.geometry, args, kwargs, dev_out)


class SharedLibImpl(DeviceImpl):
    """A user's C launcher: ``so:path/lib.so:symbol[:requires=EXPR]``, called through ctypes with
    the op's declared ABI and the current stream (``int symbol(QCONFORM_<OP>_PARAMS, void* stream)``),
    returning the status of its own launch: 0 success, ``QCONFORM_STATUS_DECLINED`` (801, the
    vendors' NotSupported) for a case it does not handle, anything else a DeviceError naming the op
    and the code. Arguments are checked here, by the op's rules, before the call. Its build flags
    are unknown, so flush-to-zero is too (``ftz=as-built`` accepts either)."""

    ftz = None

    def __init__(self, spec: str, ops: tuple[str, ...], guessed: bool) -> None:
        super().__init__(spec, ops, guessed)
        path, symbol, self.geometry = parse_impl_spec(spec)
        self.path = str(Path(path).resolve())
        self.symbol = symbol
        cupy.cuda.Device().use()  # the primary context exists before the library's first call
        try:
            self.lib = ctypes.CDLL(self.path)
        except OSError as exc:
            raise ArgumentError(f"impl: cannot load {path!r}: {exc}") from exc
        if getattr(self.lib, symbol, None) is None:
            raise ArgumentError(f"impl: {path!r} exports no {symbol!r}")
        self._slot, self._no_slot = errstate.slot_for_library(self.lib, self.path)

    def _function(self, op: OpSpec) -> Any:
        fn = getattr(self.lib, self.symbol)  # a fresh ctypes object per op: its own argtypes
        fn.argtypes = c_argtypes(op.abi)
        fn.restype = ctypes.c_int
        return fn

    def launch(self, op: OpSpec, dev_inputs: dict[str, Any], params: dict[str, Any], dev_out: Any) -> Any:
        call = bind_call(op, *op.call_args(dev_inputs, params), dev_out)
        check_requires(self.geometry, call)
        if call.bound.work == 0:
            return call.out
        status = self._function(op)(*call.c_args(cupy.cuda.get_current_stream().ptr))
        if status == STATUS_DECLINED:
            raise Declined(f"{self.symbol} returned QCONFORM_STATUS_DECLINED ({STATUS_DECLINED})")
        if status != 0:
            raise DeviceError(f"{op.name}: {self.symbol} returned status {status} ({self._spell(status)})")
        return call.out

    def _spell(self, code: int) -> str:
        return self._slot.name(code) if self._slot is not None else f"error {code}"

    def error_slot(self) -> tuple[errstate.ErrorSlot | None, str]:
        return self._slot, self._no_slot

    def bad_call_status(self, op: OpSpec, leaf: str) -> tuple[int, str] | None:
        """Call the launcher with the op's first size argument = -1 in a subprocess (a library that
        launches anyway may fault, and a sticky fault would end this process's context)."""
        size = next(a.name for a in op.abi.scalars if a.kind == "i64")
        cmd = [sys.executable, "-m", "qconform.device.badcall", self.path, self.symbol, op.name]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            return -1, "the bad call did not return within 120 s"
        if done.returncode != 0:
            return -1, f"the bad call's process failed (exit {done.returncode}): {done.stderr.strip()[-300:]}"
        status = int(done.stdout.split()[0])
        return status, f"a call with {size} = -1 returned {status} ({self._spell(status)})"


class DevicePyImpl(DeviceImpl):
    """A Python callable with the oracle's call shape on device arrays: it gets CuPy arrays (and
    ``out=``, a poisoned CuPy array, when it accepts one) and returns a device array (CuPy, or
    anything with ``__cuda_array_interface__`` or ``__dlpack__``: ``torch.as_tensor(x,
    device="cuda")`` reads a CuPy array, and a torch tensor comes back through either protocol).
    With ``out=`` given, ``out`` is the result (write into it). The device is synchronized after
    each call (the callable may use its own streams). Its flush-to-zero mode is unknown."""

    ftz = None

    def __init__(self, name: str, fn: Any, ops: tuple[str, ...], guessed: bool) -> None:
        super().__init__(name, ops, guessed)
        self.fn = fn
        self.accepts_out = accepts_kwarg(fn, "out")

    def launch(self, op: OpSpec, dev_inputs: dict[str, Any], params: dict[str, Any], dev_out: Any) -> Any:
        args, kwargs = op.call_args(dev_inputs, params)
        if getattr(self.fn, "__qconform_requires__", None):  # its declared predicate, on host stand-ins
            try:
                host = host_standins(op, args, kwargs)
            except (ArgumentError, TypeError, ValueError):  # a bad call: the callable's to reject
                host = None
            if host is not None:
                check_declared_predicate(self.fn, op.abi, *host)
        if dev_out is not None:
            if not self.accepts_out:
                raise ArgumentError(f"out: implementation {self.name} does not accept out=")
            kwargs = {**kwargs, "out": dev_out}
        result = self.fn(*args, **kwargs)
        synchronize_device(op.name)
        if dev_out is not None:
            return dev_out
        return tuple(as_cupy(r, self.name) for r in result) if isinstance(result, tuple) else as_cupy(result, self.name)


def as_cupy(a: Any, who: str) -> Any:
    """A device result as a CuPy array (zero copy)."""
    if isinstance(a, cupy.ndarray):
        return a
    if hasattr(a, "__cuda_array_interface__"):
        return cupy.asarray(a)
    if hasattr(a, "__dlpack__"):
        return cupy.from_dlpack(a)
    raise TypeError(
        f"{who} returned {type(a).__name__}: a device py: implementation returns a device array "
        "(CuPy, __cuda_array_interface__ or DLPack)"
    )


def synchronize_device(what: str) -> None:
    try:
        cupy.cuda.runtime.deviceSynchronize()
    except (cupy.cuda.runtime.CUDARuntimeError, cupy.cuda.driver.CUDADriverError) as exc:
        raise DeviceError(f"{what}: the device reported {exc} after the call") from exc


def load_device_impl(spec: str, ops: tuple[str, ...] | None, guessed: bool, fn: Any = None) -> DeviceImpl:
    """``cupy[:variant]``, ``hip:...``, ``so:...`` or a device ``py:`` callable ``fn`` (ops: the
    ones a user's implementation covers)."""
    if spec == "cupy" or spec.startswith("cupy:"):
        variant = spec.partition(":")[2] or None
        if variant is not None and variant not in VARIANTS:
            raise ArgumentError(f"impl: cupy variants are {', '.join(VARIANTS)}, got {variant!r}")
        return CupyImpl(variant)
    known = tuple(ops or ())
    unknown = [name for name in known if name not in CATALOGUE]
    if not known or unknown:
        raise ArgumentError(f"impl: {spec}: unknown ops {unknown}; ops: {', '.join(CATALOGUE)}")
    if fn is not None:
        return DevicePyImpl(spec, fn, known, guessed)
    if spec.startswith("hip:"):
        return HipSourceImpl(spec, known, guessed)
    return SharedLibImpl(spec, known, guessed)

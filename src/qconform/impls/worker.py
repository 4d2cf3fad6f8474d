"""Run a CPU implementation in a worker process that can be killed: a call that does not return
within the timeout, or that kills its process (a segfault in a C extension, ``os._exit``), becomes
an error of that call, the worker is replaced, and the run goes on with the next case.

The worker loads the same ``--impl`` string; each call sends the inputs, params and ``out``
(poison included) and gets back the result, plus whatever the call did to the inputs and to
``out`` (copied into the caller's arrays even when the call raised, so the properties see every
write). Exceptions come back by kind: ArgumentError, ValueError, TypeError and NotImplementedError
(a decline) and OutOfBoundsWrite as themselves, anything else as a RuntimeError naming the
original type. The worker puts the inputs and ``out`` in guard regions of its own (qconform.guard).
"""

from __future__ import annotations

import multiprocessing as mp
import signal
from typing import Any, Callable

import numpy as np

from qconform import guard
from qconform.errors import ArgumentError, Declined, OutOfBoundsWrite
from qconform.impls.protocol import Implementation
from qconform.ops import CATALOGUE, OpSpec
from qconform.ops.spec import output_parts

DEFAULT_TIMEOUT_S = 300.0  # per call: generous (a coverage-3 case on a slow CPU), never forever
START_TIMEOUT_S = 120.0  # a fresh worker's start (spawn, imports, loading --impl): not a call's time


class CallTimeout(RuntimeError):
    """A call did not return within the timeout; its worker was killed."""


class WorkerCrashed(RuntimeError):
    """The implementation ended its process during a call."""


def _serve(conn: Any, spec: str, ops: list[str] | None) -> None:
    from qconform.impls import load_impl

    try:
        impl = load_impl(spec, ops)
    except BaseException as exc:  # noqa: BLE001 - the parent reports it
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready",))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg[0] == "poison":  # free a poisoned block of this size: the allocator hands it back next
            bait = np.empty(msg[1], np.uint8)
            bait.fill(msg[2])
            del bait
            conn.send(None)
            continue
        op_name, leaf, packed, params, out_sent = msg
        inputs = {k: _unpack(v) for k, v in packed.items()}
        guards = guard.guarded_inputs(inputs)
        inputs.update({k: view for k, (_, view) in guards.items()})
        out = None
        if out_sent is not None:  # one buffer, or a tuple of one per output
            sent = output_parts(out_sent)
            names = ["out"] if len(sent) == 1 else [f"out {i}" for i in range(len(sent))]
            guards.update({name: guard.guarded_copy(a) for name, a in zip(names, sent, strict=True)})
            views = tuple(guards[name][1] for name in names)
            out = views if isinstance(out_sent, tuple) else views[0]
        before = {k: v.tobytes() for k, v in inputs.items() if isinstance(v, np.ndarray)}
        try:
            result = impl.run(CATALOGUE[op_name], leaf, inputs, params, out=out)
            guard.check(guards)
            kept = tuple(np.asarray(a) for a in result) if isinstance(result, (tuple, list)) else np.asarray(result)
            reply: tuple = ("ok", kept if out is None else None)
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent
            kind = next((k for cls, k in _KINDS if isinstance(exc, cls)), "other")
            reply = ("raised", kind, type(exc).__name__, str(exc))
        changed = {k: v for k, v in inputs.items() if isinstance(v, np.ndarray) and v.tobytes() != before[k]}
        conn.send((reply, changed, out))


# how an exception travels back (the first class that matches), and what the parent raises for it
_KINDS = (
    (OutOfBoundsWrite, "guard"),
    (ArgumentError, "argument"),
    (ValueError, "value"),
    (TypeError, "type"),
    (NotImplementedError, "declined"),
)


def _pack(a: Any) -> Any:
    """Pickling makes an array C-contiguous: a strided input (a bad argument) travels marked."""
    if isinstance(a, np.ndarray) and a.ndim and not a.flags.c_contiguous:
        return ("strided", np.ascontiguousarray(a))
    return a


def _unpack(a: Any) -> Any:
    if isinstance(a, tuple) and len(a) == 2 and a[0] == "strided":
        values = a[1]
        full = np.empty((*values.shape[:-1], 2 * values.shape[-1]), values.dtype)
        view = full[..., ::2]
        view[...] = values
        return view
    return a


_EXCEPTIONS: dict[str, Callable[[str, str], BaseException]] = {
    "argument": lambda name, msg: ArgumentError(msg),
    "value": lambda name, msg: ValueError(msg),
    "type": lambda name, msg: TypeError(msg),
    "declined": lambda name, msg: Declined(msg),
    "guard": lambda name, msg: OutOfBoundsWrite(msg),
    "other": lambda name, msg: RuntimeError(f"{name}: {msg}"),
}


class WorkerImpl:
    """``inner`` (a CPU implementation loaded from ``spec``) with each call made in a worker
    process under ``timeout`` seconds. Same protocol as ``inner``."""

    def __init__(self, inner: Implementation, spec: str, ops: list[str] | None, timeout: float) -> None:
        self.inner = inner
        self.spec, self.ops, self.timeout = spec, ops, timeout
        for attr in ("name", "arch", "accepts_out", "on_device", "guessed", "ftz", "l2_bytes", "contract"):
            setattr(self, attr, getattr(inner, attr))
        self._proc: Any = None
        self._conn: Any = None

    def applies_to(self, op: OpSpec) -> bool:
        return self.inner.applies_to(op)

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, self.spec, self.ops), daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent
        # the call's timeout starts once the worker is ready: a replacement worker's start-up must not
        # count against the call after a killed one (each later call would time out in turn)
        wait = max(self.timeout, START_TIMEOUT_S)
        try:
            ready = self._conn.recv() if self._conn.poll(wait) else ("failed", f"not ready within {wait:g} s")
        except (EOFError, ConnectionResetError):
            self._proc.join(5)
            ready = ("failed", f"its process ended (exit code {self._proc.exitcode})")
        if ready[0] != "ready":
            self._stop()
            raise WorkerCrashed(f"the worker process did not start: {ready[1]}")

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(5)
        self._proc = self._conn = None

    def close(self) -> None:
        self._stop()

    def run(
        self,
        op: OpSpec,
        leaf: str,
        inputs: dict[str, np.ndarray],
        params: dict[str, Any],
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        if self._proc is None or not self._proc.is_alive():
            self._start()
        try:
            self._conn.send((op.name, leaf, {k: _pack(v) for k, v in inputs.items()}, params, out))
            if not self._conn.poll(self.timeout):
                self._stop()
                raise CallTimeout(f"no result within {self.timeout:g} s (--timeout): the worker was killed")
            reply, changed, out_back = self._conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError) as exc:
            if self._proc is not None:
                self._proc.join(5)  # the exit code is known once the process is reaped
            code = self._proc.exitcode if self._proc is not None else None
            self._stop()
            how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
            raise WorkerCrashed(f"the implementation ended its process during the call ({how})") from exc
        for k, v in changed.items():
            inputs[k][...] = v
        if out is not None and out_back is not None:
            for mine, back in zip(output_parts(out), output_parts(out_back), strict=True):
                mine[...] = back
        if reply[0] == "raised":
            _, kind, name, msg = reply
            raise _EXCEPTIONS[kind](name, msg)
        return out if out is not None else reply[1]

    def poison_allocator(self, n_bytes: int, byte: int) -> None:
        """The allocator poisoning of writes_every_output, done where the call allocates."""
        if self._proc is None or not self._proc.is_alive():
            self._start()
        self._conn.send(("poison", n_bytes, byte))
        self._conn.recv()

    def stage(self, op: OpSpec, leaf: str, inputs: dict[str, Any], params: dict[str, Any]) -> Callable[[], Any]:
        return lambda: self.run(op, leaf, inputs, params)

    def error_slot(self) -> tuple[Any, str]:
        return None, "CPU implementation"

    def bad_call_status(self, op: OpSpec, leaf: str) -> tuple[int, str] | None:
        return None

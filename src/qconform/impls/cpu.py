"""CPU implementations: built in, ``oracle`` (numba twin) and ``oracle-numpy`` (the readable spec).
Loadable: ``py:module:callable`` or ``py:path/to/file.py:callable`` -- a drop-in replacement for an
op's oracle function (same arguments, same return; ``out=`` is passed when the callable accepts it).
The ops a ``py:`` callable applies to: ``--ops``, else its ``__qconform_ops__`` attribute, else
the ops its name mentions (``guess_ops``). A case it does not handle raises ``qconform.Declined``
(any NotImplementedError): counted as declined. Any other exception is a failure of that case.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

from qconform.contracts import STRICT
from qconform.errors import ArgumentError
from qconform.impls.protocol import cpu_arch
from qconform.ops import CATALOGUE, OpSpec
from qconform.ops.abi import check_declared_predicate


class CallableImpl:
    """Runs an oracle-shaped function: ``fn(*op.call_args(inputs, params), out=out?)``."""

    on_device = False
    ftz: bool | None = False
    l2_bytes = 0
    contract = STRICT

    def __init__(
        self, name: str, fn: Callable[..., np.ndarray], ops: tuple[str, ...] | None, guessed: bool = False
    ) -> None:
        self.name = name
        self.fn = fn
        self.ops = ops
        self.guessed = guessed  # the ops were guessed from the name (reported; no exception is excused)
        self.arch = cpu_arch()
        self.accepts_out = accepts_kwarg(fn, "out")

    def applies_to(self, op: OpSpec) -> bool:
        return self.ops is None or op.name in self.ops

    def function(self, op: OpSpec) -> Callable[..., np.ndarray]:
        return self.fn

    def run(
        self,
        op: OpSpec,
        leaf: str,
        inputs: dict[str, np.ndarray],
        params: dict[str, Any],
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        args, kwargs = op.call_args(inputs, params)
        check_declared_predicate(self.function(op), op.abi, args, kwargs)
        if out is not None:
            if not self.accepts_out:
                raise ArgumentError(f"out: implementation {self.name} does not accept out=")
            kwargs = {**kwargs, "out": out}
        return self.function(op)(*args, **kwargs)

    def stage(self, op: OpSpec, leaf: str, inputs: dict[str, np.ndarray], params: dict[str, Any]) -> Callable[[], Any]:
        return lambda: self.run(op, leaf, inputs, params)

    def error_slot(self) -> tuple[Any, str]:
        return None, "CPU implementation"

    def bad_call_status(self, op: OpSpec, leaf: str) -> tuple[int, str] | None:
        return None


def accepts_kwarg(fn: Callable[..., Any], name: str) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in sig.parameters.values())


class OracleImpl(CallableImpl):
    """The oracle itself (numba twin, or the numpy spec), through the same path as a drop-in."""

    def __init__(self, backend: str = "numba") -> None:
        self.name = "oracle" if backend == "numba" else f"oracle-{backend}"
        self.backend = backend
        self.ops = None
        self.guessed = False
        self.arch = cpu_arch()
        self.accepts_out = True

    def function(self, op: OpSpec) -> Callable[..., np.ndarray]:
        """The oracle in this backend; an oracle with one implementation (no ``backend``) as it is."""
        if accepts_kwarg(op.oracle, "backend"):
            return functools.partial(op.oracle, backend=self.backend)
        return op.oracle


def load_python_callable(spec: str) -> Callable[..., Any]:
    """``module:callable`` or ``path/to/file.py:callable`` -> the callable."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise ArgumentError(
            f"impl: py: implementations are 'py:module:callable' or 'py:file.py:callable', got 'py:{spec}'"
        )
    try:
        if target.endswith(".py") or "/" in target:
            path = Path(target).resolve()
            if not path.is_file():
                raise ArgumentError(f"impl: no such file {target!r}")
            if str(path.parent) not in sys.path:  # so the file can import its neighbours
                sys.path.insert(0, str(path.parent))
            mod_name = f"qconform_user_{path.stem}"
            mod_spec = importlib.util.spec_from_file_location(mod_name, path)
            assert mod_spec is not None and mod_spec.loader is not None
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules[mod_name] = module
            mod_spec.loader.exec_module(module)
        else:
            if "" not in sys.path and str(Path.cwd()) not in sys.path:
                sys.path.insert(0, str(Path.cwd()))
            module = importlib.import_module(target)
    except ArgumentError:
        raise
    except Exception as exc:  # ImportError, or whatever the user's module raises while loading
        raise ArgumentError(f"impl: cannot load {target!r}: {type(exc).__name__}: {exc}") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ArgumentError(f"impl: {target!r} has no callable {attr!r}")
    return fn


def ops_for_callable(fn: Callable[..., Any], ops: list[str] | None) -> tuple[tuple[str, ...], bool]:
    """(the ops a callable replaces, whether that was guessed from its name)."""
    if ops:
        return tuple(ops), False
    declared = getattr(fn, "__qconform_ops__", None)
    if declared:
        return tuple(declared), False
    return guess_ops(getattr(fn, "__name__", "")), True


def guess_ops(name: str) -> tuple[str, ...]:
    """Ops a callable's or kernel's name mentions: the ops whose whole name it contains
    (``my_matmul_nbits_u2`` -> matmul_nbits), else by kind and format (``quantize`` -> every
    ``*_quant``, ``my_q8k_dequant`` -> ``q8_k_dequant``); a name that mentions none -> every op."""
    n = name.lower().replace("_", "")
    whole = [op for op in CATALOGUE if op.replace("_", "") in n]
    if whole:
        return tuple(whole)
    chosen = list(CATALOGUE)
    kind = "dequant" if "dequant" in n else "quant" if "quant" in n else None
    if kind:
        chosen = [op for op in chosen if op.endswith("_" + kind)]
    formats = {op.rsplit("_", 1)[0].replace("_", "") for op in chosen}
    named = {f for f in formats if f in n}
    if named:
        chosen = [op for op in chosen if op.rsplit("_", 1)[0].replace("_", "") in named]
    return tuple(chosen)

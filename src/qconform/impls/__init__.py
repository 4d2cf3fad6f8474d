"""Implementations: the protocol the property engine calls (``protocol``) and the ways to load
one from an ``--impl`` string: ``oracle``, ``oracle-numpy``, ``py:`` (``cpu``), and ``cupy``,
``hip:``, ``so:`` and device ``py:`` callables (``device``, imported only when a GPU is used)."""

from __future__ import annotations

from qconform.errors import ArgumentError
from qconform.impls.cpu import CallableImpl, OracleImpl, guess_ops, load_python_callable, ops_for_callable
from qconform.impls.protocol import Implementation, cpu_arch

__all__ = [
    "BUILTIN_IMPLS",
    "DEVICE_IMPLS",
    "CallableImpl",
    "Implementation",
    "OracleImpl",
    "cpu_arch",
    "device_available",
    "guess_ops",
    "load_impl",
]


def device_available() -> tuple[bool, str]:
    """(True, description) when CuPy sees a GPU; (False, reason) otherwise."""
    try:
        import cupy  # noqa: F401
    except Exception as exc:  # ImportError, or a broken CUDA/ROCm install
        return False, f"CuPy is not importable ({type(exc).__name__})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return False, f"CuPy found no device ({type(exc).__name__})"
    if n < 1:
        return False, "CuPy found no device"
    return True, f"{n} device(s)"


def load_impl(spec: str, ops: list[str] | None = None) -> Implementation:
    """Resolve an ``--impl`` string."""
    if spec == "oracle":
        return OracleImpl("numba")
    if spec == "oracle-numpy":
        return OracleImpl("numpy")
    if spec.startswith("py:"):
        fn = load_python_callable(spec[3:])
        return CallableImpl(spec, fn, *ops_for_callable(fn, ops))
    if spec == "cupy" or spec.startswith(("cupy:", "hip:", "so:")):
        found, why = device_available()
        if not found:
            raise ArgumentError(f"impl: {spec} needs a GPU and CuPy: {why}")
        from qconform.impls.device import load_device_impl

        if spec.startswith("cupy"):
            return load_device_impl(spec, None, False)
        parts = spec.split(":")  # hip:PATH:SYMBOL[:options] / so:PATH:SYMBOL
        symbol = parts[2] if len(parts) > 2 else ""
        chosen, guessed = (tuple(ops), False) if ops else (guess_ops(symbol), True)
        return load_device_impl(spec, chosen, guessed)
    raise ArgumentError(
        f"impl: unknown implementation {spec!r}; use oracle, oracle-numpy, py:module:callable, cupy[:variant], "
        "hip:file.hip:symbol or so:lib.so:symbol"
    )


BUILTIN_IMPLS = ("oracle", "oracle-numpy")
DEVICE_IMPLS = ("cupy", "cupy:coop", "cupy:ref", "hip:file.hip:symbol[:lanes=N][:threads=N]", "so:lib.so:symbol")

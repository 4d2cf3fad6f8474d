"""Implementations: the protocol the property engine calls (``protocol``) and the ways to load
one from an ``--impl`` string: ``oracle``, ``oracle-numpy``, ``py:`` (``cpu``), and ``cupy``,
``hip:``, ``so:`` and device ``py:`` callables (``device``, imported only when a GPU is used)."""

from __future__ import annotations

from qconform.contracts import Contract, parse_contract
from qconform.errors import ArgumentError
from qconform.impls.cpu import CallableImpl, OracleImpl, guess_ops, load_python_callable, ops_for_callable
from qconform.impls.protocol import Implementation, cpu_arch
from qconform.ops import CATALOGUE

__all__ = [
    "BUILTIN_IMPLS",
    "DEVICE_IMPLS",
    "CallableImpl",
    "Implementation",
    "OracleImpl",
    "cpu_arch",
    "device_available",
    "gpu_count",
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


def gpu_count() -> int:
    """The GPUs CuPy sees (0 without CuPy or a device)."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # ImportError, or a broken CUDA/ROCm install
        return 0


def _need_device(spec: str) -> None:
    found, why = device_available()
    if not found:
        raise ArgumentError(f"impl: {spec} needs a GPU and CuPy: {why}")


CONTRACT_OPTION = ":contract="


def load_impl(spec: str, ops: list[str] | None = None, contract: str | Contract | None = None) -> Implementation:
    """Resolve an ``--impl`` string. A ``py:`` callable with ``__qconform_device__ = True`` is a
    device drop-in (device arrays in and out); ``hip:``/``so:`` cover ``--ops``, else the ops their
    symbol names (an error when it names none). The implementation's numeric contract: what a
    ``py:`` callable declares (``__qconform_contract__``), then a ``:contract=KEY=VALUE,...``
    option anywhere among the string's options, then ``contract`` (``--contract``), each on top
    of the last."""
    body, _, rest = spec.partition(CONTRACT_OPTION)
    declared, colon, tail = rest.partition(":")  # a contract's values hold no ':'
    body += colon + tail
    impl = _load(body, ops)
    own = getattr(getattr(impl, "fn", None), "__qconform_contract__", None)
    impl.contract = (
        parse_contract(own, f"{body}: __qconform_contract__")
        .merged(parse_contract(declared, "impl: contract"))
        .merged(parse_contract(contract, "--contract"))
    )
    if declared:
        impl.name = spec
    return impl


def _load(spec: str, ops: list[str] | None) -> Implementation:
    if spec == "oracle":
        return OracleImpl("numba")
    if spec == "oracle-numpy":
        return OracleImpl("numpy")
    if spec.startswith("py:"):
        fn = load_python_callable(spec[3:])
        chosen, guessed = ops_for_callable(fn, ops)
        if not getattr(fn, "__qconform_device__", False):
            return CallableImpl(spec, fn, chosen, guessed)
        _need_device(spec)
        from qconform.impls.device import load_device_impl

        return load_device_impl(spec, chosen, guessed, fn)
    if spec == "cupy" or spec.startswith(("cupy:", "hip:", "so:")):
        _need_device(spec)
        from qconform.impls.device import load_device_impl

        if spec.startswith("cupy"):
            return load_device_impl(spec, None, False)
        return load_device_impl(spec, *kernel_ops(spec, ops))
    raise ArgumentError(
        f"impl: unknown implementation {spec!r}; use oracle, oracle-numpy, py:module:callable, cupy[:variant], "
        "hip:file.hip:symbol or so:lib.so:symbol"
    )


def kernel_ops(spec: str, ops: list[str] | None) -> tuple[tuple[str, ...], bool]:
    """The ops a ``hip:``/``so:`` symbol is run for: ``--ops``, else the ones its name names.
    A kernel launched with another op's arguments may fault, so a name naming none is an error."""
    if ops:
        return tuple(ops), False
    parts = spec.split(":")
    guessed = guess_ops(parts[2] if len(parts) > 2 else "")
    if len(guessed) == len(CATALOGUE):
        raise ArgumentError(f"impl: {spec}: the symbol names no op; pass --ops (one of {', '.join(CATALOGUE)})")
    return guessed, True


BUILTIN_IMPLS = ("oracle", "oracle-numpy")
DEVICE_IMPLS = (
    "cupy",
    "cupy:coop",
    "cupy:ref",
    "hip:file.hip:symbol[:lanes=N][:threads=N][:grid=N][:smem=N][:opt=FLAG][:requires=EXPR]",
    "so:lib.so:symbol[:requires=EXPR]",
    "py:module:callable (with __qconform_device__ = True)",
    "any of them + :contract=KEY=VALUE,... (the numeric contract: docs/contracts.md)",
)

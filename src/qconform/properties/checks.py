"""The five properties of DESIGN.md, as functions any Implementation can be run through.

Each returns an ``Outcome``: ``ok`` True / False, or None when the property does not apply (the
pending-error property on a CPU implementation, writes-every-output for a callable that takes no
``out=``).
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from qconform.errors import ArgumentError
from qconform.impls import Implementation
from qconform.ops import Case, OpSpec
from qconform.properties.compare import compare

POISONS = (0xA5, 0x5A)
DEFAULT_REPEAT_CALLS = 129


@dataclass(frozen=True)
class Outcome:
    prop: str
    op: str
    leaf: str
    case: str | None
    ok: bool | None
    detail: str
    rel_l2: float = 0.0
    ms: float = 0.0


@dataclass(frozen=True)
class Prepared:
    """A case with its inputs, params and the oracle's output."""

    case: Case
    inputs: dict[str, np.ndarray]
    params: dict[str, Any]
    want: np.ndarray

    @classmethod
    def from_case(cls, op: OpSpec, case: Case) -> "Prepared":
        inputs = op.make_inputs(case)
        params = op.params(case)
        args, kwargs = op.call_args(inputs, params)
        return cls(case, inputs, params, op.oracle(*args, **kwargs))


def _raised(exc: BaseException) -> str:
    return f"raised {type(exc).__name__}: {exc}"


def _snapshot(arrays: dict[str, Any]) -> dict[str, bytes]:
    return {k: np.asarray(v).tobytes() for k, v in arrays.items()}


def matches_oracle(impl: Implementation, op: OpSpec, p: Prepared) -> Outcome:
    """Property 1: the output equals the oracle's (exact or relL2), and the inputs are left untouched."""
    result = functools.partial(Outcome, "matches_oracle", op.name, p.case.leaf, p.case.id)
    before = _snapshot(p.inputs)
    t0 = time.perf_counter()
    try:
        got = impl.run(op, p.case.leaf, p.inputs, p.params)
    except Exception as exc:
        return result(False, _raised(exc), math.nan)
    ms = (time.perf_counter() - t0) * 1e3
    c = compare(op, p.params, got, p.want)
    if c.ok and _snapshot(p.inputs) != before:
        return result(False, "modified its inputs", c.rel_l2, ms)
    return result(c.ok, c.detail, c.rel_l2, ms)


def repeatable(
    impl: Implementation, op: OpSpec, sets: Sequence[Prepared], calls: int = DEFAULT_REPEAT_CALLS
) -> Outcome:
    """Property 2: ``calls`` calls rotating among input sets; every output bit-identical to the
    first output for its set (so a first call of a new shape that differs is caught)."""
    leaf = sets[0].case.leaf
    result = functools.partial(Outcome, "repeatable", op.name, leaf)
    first: list[bytes | None] = [None] * len(sets)
    for k in range(calls):
        i = k % len(sets)
        p = sets[i]
        try:
            got = np.asarray(impl.run(op, leaf, p.inputs, p.params)).tobytes()
        except Exception as exc:
            return result(p.case.id, False, f"call {k + 1}: {_raised(exc)}")
        if first[i] is None:
            first[i] = got
        elif got != first[i]:
            return result(
                p.case.id, False, f"call {k + 1} (input set {i}) differs from the first call on the same inputs"
            )
    return result(None, True, f"{calls} calls over {len(sets)} input sets identical")


def _call_after_poisoning_the_allocator(impl: Implementation, op: OpSpec, p: Prepared, poison: int) -> Any:
    """Free a poisoned block of the output's size, then call: allocators hand the most recently
    freed block of a size back first (numpy's small-block cache, glibc's bins, and its mmap
    threshold rises to a freed block's size), so an element the call never writes is likely to
    read as the poison. Best effort, for implementations that allocate their own output."""
    bait = np.empty(p.want.shape, p.want.dtype)
    bait.view(np.uint8).fill(poison)
    del bait
    return impl.run(op, p.case.leaf, p.inputs, p.params)


def writes_every_output(impl: Implementation, op: OpSpec, p: Prepared) -> Outcome:
    """Property 3: with ``out`` poisoned by two different byte patterns, both results equal the
    oracle's. An implementation without ``out=`` is called with the allocator poisoned instead."""
    result = functools.partial(Outcome, "writes_every_output", op.name, p.case.leaf, p.case.id)
    how = "out" if impl.accepts_out else "allocator"
    for poison in POISONS:
        try:
            if impl.accepts_out:
                got = np.empty(p.want.shape, p.want.dtype)
                got.view(np.uint8).fill(poison)
                impl.run(op, p.case.leaf, p.inputs, p.params, out=got)
            else:
                got = _call_after_poisoning_the_allocator(impl, op, p, poison)
        except Exception as exc:
            return result(False, _raised(exc))
        c = compare(op, p.params, got, p.want)
        if not c.ok:
            return result(False, f"{how} poisoned with 0x{poison:02X}: {c.detail}", c.rel_l2)
    return result(True, f"every element written ({how} poisoned with 0xA5, 0x5A)")


def rejects_bad_arguments(impl: Implementation, op: OpSpec, leaf: str) -> Outcome:
    """Property 4: each rule-breaking call raises ValueError/TypeError (qconform.ArgumentError is a
    ValueError) and leaves every caller buffer -- inputs and ``out`` -- byte for byte as it was."""
    result = functools.partial(Outcome, "rejects_bad_arguments", op.name, leaf, None)
    checked = 0
    for bad in op.bad_arguments(leaf):
        try:
            op.validate(bad.inputs, bad.params, bad.bad_out)
        except ArgumentError:
            pass
        else:
            raise AssertionError(f"catalogue bug: {op.name} validate accepts '{bad.rule}'")
        out = None
        if bad.bad_out is not None:
            if not impl.accepts_out:
                continue
            out = bad.bad_out.copy()
            out.view(np.uint8).fill(POISONS[0])
        before = _snapshot(bad.inputs)
        out_before = None if out is None else out.tobytes()
        try:
            impl.run(op, leaf, bad.inputs, bad.params, out=out)
        except (ValueError, TypeError):
            pass
        except Exception as exc:
            return result(False, f"'{bad.rule}': {_raised(exc)} (expected ValueError/ArgumentError)")
        else:
            return result(False, f"accepted a call where {bad.rule}")
        if _snapshot(bad.inputs) != before or (out is not None and out.tobytes() != out_before):
            return result(False, f"'{bad.rule}': raised, but a caller buffer was modified")
        checked += 1
    return result(True, f"{checked} bad calls rejected, buffers untouched")


def survives_pending_error(impl: Implementation, op: OpSpec, p: Prepared) -> Outcome:
    """Property 5: a pending, unrelated device error changes neither status nor result.
    Meaningless for CPU implementations; the device backend supplies the real check."""
    if not impl.on_device:
        return Outcome("survives_pending_error", op.name, p.case.leaf, p.case.id, None, "n/a: CPU implementation")
    raise NotImplementedError("device implementations are not available in this version")

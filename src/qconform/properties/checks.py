"""The five properties (docs/architecture.md, Properties), as functions any Implementation can be run through.

Each returns an ``Outcome``: ``ok`` True / False, or None when the property does not apply (the
pending-error property on a CPU implementation, writes-every-output for a callable that takes no
``out=``).
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from qconform import guard
from qconform.contracts import STRICT, Contract
from qconform.errors import ArgumentError
from qconform.impls.protocol import Implementation
from qconform.ops import Case, OpSpec
from qconform.ops.spec import output_parts, result_bytes
from qconform.properties.compare import Comparison, compare
from qconform.properties.expect import expectations, has_nan
from qconform.readings import Expected

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
    """A case with its inputs, params and what an implementation's output may be: ``want`` is the
    oracle's output (the strict reference, as the implementation flushes subnormals), ``expected``
    every reading its numeric contract accepts (``qconform.properties.expect``)."""

    case: Case
    inputs: dict[str, np.ndarray]
    params: dict[str, Any]
    want: Any  # an array, or a tuple of one per output (OpSpec.outputs)
    expected: tuple[Expected, ...] = ()
    contract: Contract = STRICT

    @classmethod
    def from_inputs(
        cls, op: OpSpec, case: Case, inputs: dict[str, np.ndarray], impl: Implementation | None = None
    ) -> "Prepared":
        """The readings ``impl``'s contract accepts (the strict reference, flush-to-zero as it is
        built, without an ``impl``)."""
        params = op.params(case)
        contract = impl.contract if impl is not None else STRICT
        built = impl.ftz if impl is not None else False
        expected = expectations(op, inputs, params, contract, built)
        return cls(case, inputs, params, expected[0].want, expected, contract)

    @classmethod
    def from_case(cls, op: OpSpec, case: Case, impl: Implementation | None = None) -> "Prepared":
        return cls.from_inputs(op, case, op.make_inputs(case), impl)

    def for_impl(self, op: OpSpec, impl: Implementation) -> "Prepared":
        """This stored case as ``impl`` must reproduce it: the readings of its contract, with the
        stored output as the plain strict reference (so the oracle is checked against it)."""
        p = Prepared.from_inputs(op, self.case, self.inputs, impl)
        expected = tuple(replace(e, want=self.want) if e.plain else e for e in p.expected)
        return replace(p, want=expected[0].want, expected=expected)

    def verify(self, op: OpSpec, got: Any) -> Comparison:
        """``got`` against every accepted reading: the first that it matches, else the failure
        against the first reading (naming the others it does not match either) and the rule."""
        readings = self.expected or (Expected("reference", self.want, plain=True),)
        results = []
        for e in readings:  # the first reading it matches; most outputs match the first
            c = compare(op, self.params, got, e.want, e, self.contract)
            if c.ok:
                return c if len(readings) == 1 else replace(c, detail=f"{c.detail} ({e.label})")
            results.append(c)
        first = results[0]
        detail = first.detail if len(readings) == 1 else f"{readings[0].label}: {first.detail}"
        if len(readings) > 1:
            detail += " (" + "; ".join(f"not {e.label} either" for e in readings[1:]) + ")"
        if op.check.kind != "bound" and readings[0].model is None:  # a bound failure states its rule itself
            detail += f"; rule failed: {op.check.reason} (contract {self.contract})"
        return replace(first, detail=detail)

    @property
    def excluded(self) -> str | None:
        """Why the contract leaves this case out (nan=unsupported and a NaN input), else None."""
        if self.contract.nan == "unsupported" and has_nan(self.inputs):
            return "by contract (nan=unsupported): an input holds NaN"
        return None


def _raised(exc: BaseException) -> str:
    return f"raised {type(exc).__name__}: {exc}"


DECLINED = "declined: "  # an Outcome detail for a case the implementation does not handle


def declined(outcome: Outcome) -> bool:
    return outcome.ok is None and outcome.detail.startswith(DECLINED)


def _snapshot(arrays: dict[str, Any]) -> dict[str, bytes]:
    return {k: np.asarray(v).tobytes() for k, v in arrays.items()}


def matches_oracle(impl: Implementation, op: OpSpec, p: Prepared) -> Outcome:
    """Property 1: the output equals the oracle's (exact or relL2), and the inputs are left untouched."""
    result = functools.partial(Outcome, "matches_oracle", op.name, p.case.leaf, p.case.id)
    if p.excluded:
        return result(None, f"{DECLINED}{p.excluded}")
    before = _snapshot(p.inputs)
    guards = guard.guarded_inputs(p.inputs)  # a write outside an input: caught by its margins
    inputs = {k: guards[k][1] if k in guards else v for k, v in p.inputs.items()}
    t0 = time.perf_counter()
    try:
        got = impl.run(op, p.case.leaf, inputs, p.params)
        guard.check(guards)
    except NotImplementedError as exc:  # qconform.Declined, a so: launcher's DECLINED status
        return result(None, f"{DECLINED}{type(exc).__name__}: {exc}")
    except Exception as exc:
        return result(False, _raised(exc), math.nan)
    ms = (time.perf_counter() - t0) * 1e3
    c = p.verify(op, got)
    if c.ok and _snapshot(inputs) != before:
        return result(False, "modified its inputs", c.rel_l2, ms)
    return result(c.ok, c.detail, c.rel_l2, ms)


def defined_elements(p: Prepared) -> tuple[np.ndarray | None, ...] | None:
    """Per output, the elements some reading of ``p`` checks (True; None for an output every
    reading checks whole), or None when every reading checks every element."""
    masks = [getattr(e, "mask", None) for e in p.expected]
    if not masks or any(m is None for m in masks):
        return None
    per_output = [m if isinstance(m, tuple) else (m,) for m in masks]
    return tuple(
        None if any(m is None for m in parts) else ~np.logical_and.reduce([np.asarray(m, bool) for m in parts])
        for parts in zip(*per_output, strict=True)
    )


def defined_bits(got: Any, defined: tuple[np.ndarray | None, ...] | None) -> Any:
    """A staged call's output reduced to what repeat calls must reproduce bit for bit: every
    output's bytes, or only its ``defined`` elements (a device output stays on the device:
    ``DeviceBits.checked``)."""
    if hasattr(got, "checked"):
        return got if defined is None else got.checked(defined)
    if defined is None:
        return result_bytes(got)
    return b"".join(
        (np.asarray(a) if m is None else np.asarray(a)[m]).tobytes()
        for a, m in zip(output_parts(got), defined, strict=True)
    )


def repeatable(
    impl: Implementation, op: OpSpec, sets: Sequence[Prepared], calls: int = DEFAULT_REPEAT_CALLS
) -> Outcome:
    """Property 2: ``calls`` calls rotating among input sets (resident where the implementation
    keeps them: a device rotates sets larger than its L2, so weights are read cold); every output
    bit-identical to the first output for its set (so a first call of a new shape that differs is
    caught), on the elements the op defines: those no reading leaves unchecked (GroupQueryAttention's
    present rows past the valid length are the caller's buffer, never written)."""
    leaf = sets[0].case.leaf
    result = functools.partial(Outcome, "repeatable", op.name, leaf)
    try:
        staged = [impl.stage(op, leaf, p.inputs, p.params) for p in sets]
    except Exception as exc:
        return result(None, False, f"staging the inputs {_raised(exc)}")
    defined = [defined_elements(p) for p in sets]  # once: the same masks for every call
    first: list[Any] = [None] * len(sets)
    for k in range(calls):
        i = k % len(sets)
        try:
            got = defined_bits(staged[i](), defined[i])
        except Exception as exc:
            return result(sets[i].case.id, False, f"call {k + 1}: {_raised(exc)}")
        if first[i] is None:
            first[i] = got
        elif not got == first[i]:
            return result(
                sets[i].case.id, False, f"call {k + 1} (input set {i}) differs from the first call on the same inputs"
            )
    return result(None, True, f"{calls} calls over {len(sets)} input sets identical")


def _call_after_poisoning_the_allocator(impl: Implementation, op: OpSpec, p: Prepared, poison: int) -> Any:
    """Free a poisoned block of the output's size, then call: allocators hand the most recently
    freed block of a size back first (numpy's small-block cache, glibc's bins, and its mmap
    threshold rises to a freed block's size), so an element the call never writes is likely to
    read as the poison. Best effort, for implementations that allocate their own output."""
    for want in output_parts(p.want):
        if hasattr(impl, "poison_allocator"):  # an implementation in another process poisons its own
            impl.poison_allocator(want.nbytes, poison)
        else:
            bait = np.empty(want.shape, want.dtype)
            bait.view(np.uint8).fill(poison)
            del bait
    return impl.run(op, p.case.leaf, p.inputs, p.params)


def _poisoned_out(op: OpSpec, want: Any, poison: int) -> tuple[Any, dict[str, tuple[Any, Any]]]:
    """``out`` for ``want`` (a buffer, or a tuple of one per output) in guarded allocations, every
    byte ``poison``; and the guards, named ``out`` or by output."""
    wants = output_parts(want)
    names = ("out",) if len(wants) == 1 else tuple(f"out ({name})" for name in op.output_names)
    guards = {name: guard.guarded_empty(w.shape, w.dtype) for name, w in zip(names, wants, strict=True)}
    views = [view for _, view in guards.values()]
    for view in views:
        view.view(np.uint8).fill(poison)
    return (views[0] if len(views) == 1 else tuple(views)), guards


def writes_every_output(impl: Implementation, op: OpSpec, p: Prepared) -> Outcome:
    """Property 3: with ``out`` poisoned by two different byte patterns, both results equal the
    oracle's. An implementation without ``out=`` is called with the allocator poisoned instead."""
    result = functools.partial(Outcome, "writes_every_output", op.name, p.case.leaf, p.case.id)
    how = "out" if impl.accepts_out else "allocator"
    if p.excluded:
        return result(None, f"{DECLINED}{p.excluded}")
    for poison in POISONS:
        try:
            if impl.accepts_out:
                got, guards = _poisoned_out(op, p.want, poison)
                impl.run(op, p.case.leaf, p.inputs, p.params, out=got)
                guard.check(guards)
            else:
                got = _call_after_poisoning_the_allocator(impl, op, p, poison)
        except NotImplementedError as exc:
            return result(None, f"{DECLINED}{type(exc).__name__}: {exc}")
        except Exception as exc:
            return result(False, _raised(exc))
        c = p.verify(op, got)
        if not c.ok:
            return result(False, f"{how} poisoned with 0x{poison:02X}: {c.detail}", c.rel_l2)
    return result(True, f"every element written ({how} poisoned with 0xA5, 0x5A)")


def rejects_bad_arguments(impl: Implementation, op: OpSpec, leaf: str) -> Outcome:
    """Property 4: each rule-breaking call raises ValueError/TypeError (qconform.ArgumentError is a
    ValueError) for the rule it breaks -- the message names the argument and matches the rule's
    pattern (``BadArgument.arg`` / ``match``) -- and leaves every caller buffer -- inputs and
    ``out`` -- byte for byte as it was. A bad call the implementation declines (NotImplementedError,
    qconform.Declined) is counted, not passed; one that declines every bad call is n/a."""
    result = functools.partial(Outcome, "rejects_bad_arguments", op.name, leaf, None)
    checked = declined_calls = 0
    for bad in op.bad_arguments(leaf):
        try:
            op.validate(bad.inputs, bad.params, bad.bad_out)
        except ArgumentError as exc:
            why = bad.mismatch(str(exc))
            if why is not None:
                raise AssertionError(
                    f"catalogue bug: {op.name} validate rejects '{bad.rule}' for another reason: {why}; "
                    f"raised {type(exc).__name__}({str(exc)!r})"
                ) from exc
        else:
            raise AssertionError(f"catalogue bug: {op.name} validate accepts '{bad.rule}'")
        out = None
        if bad.bad_out is not None:
            if not impl.accepts_out:
                continue
            out = tuple(o.copy() for o in output_parts(bad.bad_out))
            for o in out:
                o.view(np.uint8).fill(POISONS[0])
            out = out if isinstance(bad.bad_out, tuple) else out[0]
        before = _snapshot(bad.inputs)
        out_before = None if out is None else result_bytes(out)
        declines = False
        try:
            impl.run(op, leaf, bad.inputs, bad.params, out=out)
        except (ValueError, TypeError) as exc:
            why = bad.mismatch(str(exc))
            if why is not None:
                got = f"{type(exc).__name__}({str(exc)!r})"
                return result(False, f"'{bad.rule}': rejected for another reason: {why}; raised {got}")
        except NotImplementedError:  # qconform.Declined: a call it does not handle (a decode-only
            declines = True  # kernel given two rows): counted, neither passed nor failed
        except Exception as exc:
            return result(False, f"'{bad.rule}': {_raised(exc)} (expected ValueError/ArgumentError)")
        else:
            return result(False, f"accepted a call where {bad.rule}")
        if _snapshot(bad.inputs) != before or (out is not None and result_bytes(out) != out_before):
            return result(False, f"'{bad.rule}': raised, but a caller buffer was modified")
        checked += not declines
        declined_calls += declines
    if declined_calls and not checked:
        return result(None, f"n/a: the implementation declines every bad call ({declined_calls})")
    extra = f"; {declined_calls} declined" if declined_calls else ""
    return result(True, f"{checked} bad calls rejected for their rule, buffers untouched{extra}")


def survives_pending_error(impl: Implementation, op: OpSpec, fresh: Prepared | None) -> Outcome:
    """Property 5 (docs/device-tooling.md C4): with a foreign, non-sticky error pending in the runtime
    slot the implementation reports through, the first call of a never-seen shape succeeds with the
    right output and leaves the error pending (a call that clears it is reported as a warning,
    not failed); a deliberately bad call, where the ABI can express one, reports its own error."""
    leaf = fresh.case.leaf if fresh else ""
    result = functools.partial(Outcome, "survives_pending_error", op.name, leaf, fresh.case.id if fresh else None)
    if not impl.on_device or fresh is None:
        return result(None, "n/a: CPU implementation")
    slot, why = impl.error_slot()
    if slot is None:
        return result(None, f"n/a: {why}")
    slot.clear()
    planted = slot.plant()
    if planted == 0 or slot.peek() != planted:
        slot.clear()
        return result(None, f"n/a: could not plant a pending error through {slot.where}")
    name = slot.name(planted)
    notes = []
    try:
        try:
            got = impl.run(op, leaf, fresh.inputs, fresh.params)
        except NotImplementedError as exc:
            return result(None, f"n/a: the implementation declines the fresh-shape case ({exc})")
        except Exception as exc:
            return result(False, f"with a foreign {name} pending ({slot.where}) the call failed: {_raised(exc)}")
        c = fresh.verify(op, got)
        if not c.ok:
            return result(False, f"with a foreign {name} pending the output is wrong: {c.detail}", c.rel_l2)
        after = slot.peek()
        if after != planted:
            notes.append(f"WARNING: the call cleared the caller's pending {name} (now {slot.name(after)})")
        bad = impl.bad_call_status(op, leaf)
        if bad is not None:
            status, detail = bad
            if status == 0:
                return result(False, f"a deliberately bad call reported success: {detail}")
            notes.append(f"bad call reported its own error: {detail}")
    finally:
        slot.clear()
    return result(True, "; ".join([f"status and output unaffected by a foreign {name} pending ({slot.where})", *notes]))

"""``qconform fuzz``: hypothesis searches the op's case space for an input where an implementation
breaks a property (matches the oracle, writes every output, repeat calls identical), shrinks it,
prints it with a one-line replay command, and saves it as a golden set holding the oracle's
output. The catalogue's bad-argument calls are tried first: they are a fixed list, not a search."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import seed as hseed

from qconform.contracts import contract_flag
from qconform.impls.protocol import Implementation
from qconform.ops import Case, OpSpec
from qconform.ops.spec import result_bytes
from qconform.properties.checks import Outcome, Prepared, matches_oracle, rejects_bad_arguments, writes_every_output
from qconform.properties.profiles import load_profile

REPEATS = 3  # calls per drawn case for the repeat check


class CaseFailed(AssertionError):
    def __init__(self, case: Case, prop: str, detail: str) -> None:
        super().__init__(f"{prop}: {detail}")
        self.case, self.prop, self.detail = case, prop, detail


def _first_failure(exc: BaseException) -> CaseFailed | None:
    if isinstance(exc, CaseFailed):
        return exc
    for sub in getattr(exc, "exceptions", ()):
        found = _first_failure(sub)
        if found:
            return found
    return None


def find_failure(impl: Implementation, op: OpSpec, leaf: str, *, examples: int, seed: int) -> CaseFailed | None:
    """The shrunk failing case, or None when ``examples`` inputs all pass."""
    load_profile("fuzz")

    @hseed(seed)
    @settings(max_examples=examples, database=None, derandomize=False, print_blob=False)
    @given(op.strategy(leaf))
    def probe(case: Case) -> None:
        p = Prepared.from_case(op, case, impl)
        for check in (matches_oracle, writes_every_output, _repeats):
            o = check(impl, op, p)
            if o.ok is False:
                raise CaseFailed(case, o.prop, o.detail)

    try:
        probe()
    except BaseException as exc:  # hypothesis raises the minimal example's error (or a group)
        failure = _first_failure(exc)
        if failure is None:
            raise
        return failure
    return None


def _repeats(impl: Implementation, op: OpSpec, p: Prepared) -> Outcome:
    """Property 2 on one drawn case: further calls give the first call's bytes."""
    try:
        outs = [result_bytes(impl.run(op, p.case.leaf, p.inputs, p.params)) for _ in range(REPEATS)]
    except Exception as exc:
        return Outcome("repeatable", op.name, p.case.leaf, p.case.id, False, f"{type(exc).__name__}: {exc}")
    ok = all(o == outs[0] for o in outs)
    detail = "" if ok else f"{REPEATS} calls on the same inputs gave {len(set(outs))} different outputs"
    return Outcome("repeatable", op.name, p.case.leaf, p.case.id, ok, detail)


def replay_command(impl: Implementation, case: Case) -> str:
    return (
        f"qconform run --impl {shlex.quote(impl.name)}{contract_flag(impl.contract)} --ops {case.op} "
        f"--leaf {case.leaf} --case {shlex.quote(case.to_json())}"
    )


def fuzz(impl: Implementation, op: OpSpec, leaf: str, *, examples: int, seed: int, save_dir: Path) -> int:
    from qconform.golden import write_set

    print(
        f"qconform fuzz: {op.name} {leaf}, impl {impl.name}, contract {impl.contract}, "
        f"up to {examples} examples, seed {seed}"
    )
    bad = rejects_bad_arguments(impl, op, leaf)
    if bad.ok is False:
        smallest = min(op.cases(leaf, 1), key=lambda c: c.shape[0] * c.shape[-1])
        print(f"FAIL rejects_bad_arguments: {bad.detail}")
        print("replay (every run checks the bad-argument calls):")
        print(replay_command(impl, smallest))
        return 1
    failure = find_failure(impl, op, leaf, examples=examples, seed=seed)
    if failure is None:
        print(f"no failure in {examples} examples")
        return 0
    case = failure.case
    out = save_dir / f"{op.name}-{leaf}-{case.id}"
    write_set(
        out,
        [(op, leaf, [Prepared.from_case(op, case)])],
        name=out.name,
        command="qconform " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
    )
    print(f"FAIL (shrunk): case {case.to_json()}")
    print(f"  {failure.prop}: {failure.detail}")
    verify = f"qconform golden verify {out} --impl {shlex.quote(impl.name)}{contract_flag(impl.contract)}"
    print(f"saved the case with the oracle's output: {out}/  (replay: {verify})")
    print("replay:")
    print(replay_command(impl, case))
    return 1

"""Run every property for one (implementation, op, leaf) and summarise it as one report row."""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from qconform.impls.protocol import Implementation
from qconform.ops import OpSpec
from qconform.ops.spec import result_size
from qconform.properties.checks import (
    DECLINED,
    DEFAULT_REPEAT_CALLS,
    Outcome,
    Prepared,
    declined,
    matches_oracle,
    rejects_bad_arguments,
    repeatable,
    survives_pending_error,
    writes_every_output,
)

REPEAT_SETS = 3
COLD_SETS = 3
COLD_SEED = 7000  # seeds of the cold input sets: 7000, 7001, ...
FRESH_SEED = 9000  # seed of the never-seen shape of the pending-error property
_FRESH_SIZES = itertools.count()


@dataclass
class LeafResult:
    op: str
    leaf: str
    arch: str
    impl: str
    outcomes: list[Outcome] = field(default_factory=list)
    ms: float = 0.0
    skipped: str | None = None
    cases: dict[str, str] = field(default_factory=dict)  # case id -> its JSON (the replay of a failure)
    contract: str = "strict"  # the numeric contract checked against (qconform.contracts)

    @property
    def checked(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.ok is not None]

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.ok is False]

    @property
    def declined(self) -> list[Outcome]:
        """Cases the implementation declined (matches_oracle): counted, never passed."""
        return [o for o in self.outcomes if o.prop == "matches_oracle" and declined(o)]

    @property
    def ran(self) -> int:
        return sum(o.prop == "matches_oracle" and o.ok is not None for o in self.outcomes)

    @property
    def max_rel_l2(self) -> float:
        vals = [o.rel_l2 for o in self.outcomes if o.prop == "matches_oracle"]
        if any(math.isnan(v) for v in vals):
            return math.nan
        return max(vals, default=0.0)

    @property
    def verdict(self) -> str:
        if self.failed:
            return "FAIL"
        if self.skipped is not None or not self.ran:
            return "SKIP"
        return "PASS"


def _repeat_sets(prepared: Sequence[Prepared]) -> list[Prepared]:
    """The smallest cases of distinct shapes: cheap to call many times, each a new shape."""
    seen: dict[tuple[int, ...], Prepared] = {}
    for p in sorted(prepared, key=lambda p: result_size(p.want)):
        seen.setdefault(p.case.shape, p)
    return list(seen.values())[:REPEAT_SETS]


def _size_for_bytes(op: OpSpec, leaf: str, n_bytes: int) -> int:
    """The size (the op's own growth unit) of ``op.sized_case`` whose inputs hold ``n_bytes``,
    from the bytes its inputs measure at sizes 1 and 2 (a fixed part, such as one activation row
    beside the weights, apart)."""

    def size(units: int) -> int:
        return sum(a.nbytes for a in op.make_inputs(op.sized_case(leaf, units, 0)).values())

    one, two = size(1), size(2)
    per_unit = max(1, two - one)
    return max(1, -(-(n_bytes - (one - per_unit)) // per_unit))


def cold_sets(impl: Implementation, op: OpSpec, leaf: str) -> list[Prepared]:
    """COLD_SETS input sets, each larger than the implementation's last-level cache."""
    size = _size_for_bytes(op, leaf, impl.l2_bytes + impl.l2_bytes // 8)
    return [Prepared.from_case(op, op.sized_case(leaf, size, COLD_SEED + i), impl) for i in range(COLD_SETS)]


def fresh_shape(impl: Implementation, op: OpSpec, leaf: str) -> Prepared:
    """A case whose shape no other check in this process has used (odd sizes from 3 upward of the
    op's sized case; the generated cases use other shapes)."""
    return Prepared.from_case(op, op.sized_case(leaf, 2 * next(_FRESH_SIZES) + 3, FRESH_SEED), impl)


def run_leaf(
    impl: Implementation,
    op: OpSpec,
    leaf: str,
    prepared: Sequence[Prepared],
    *,
    repeat_calls: int = DEFAULT_REPEAT_CALLS,
    progress: Callable[[], None] | None = None,
    cold: bool = True,
) -> LeafResult:
    """Match every case, then repeatability, writes-every-output, bad arguments, pending error.
    ``ms`` is the wall time after the first call, which carries any JIT compile (still checked)."""
    result = LeafResult(op.name, leaf, impl.arch, impl.name, contract=str(getattr(impl, "contract", "strict")))
    result.cases.update((p.case.id, p.case.to_json()) for p in prepared)
    t0 = time.perf_counter()
    for i, p in enumerate(prepared):
        outcome = matches_oracle(impl, op, p)
        if i == 0:
            t0 = time.perf_counter()
        result.outcomes.append(outcome)
        if progress:
            progress()
    ran = [p for p, o in zip(prepared, result.outcomes, strict=True) if not declined(o)]
    if not ran and prepared:
        result.skipped = f"declined every case ({result.outcomes[0].detail[len(DECLINED):]})"
    if ran:
        sets = _repeat_sets(ran)
        if cold and impl.on_device and impl.l2_bytes and op.cold_repeat:
            big = cold_sets(impl, op, leaf)
            result.cases.update((p.case.id, p.case.to_json()) for p in big)
            matched = [matches_oracle(impl, op, p) for p in big]
            result.outcomes.extend(matched)
            sets = [*sets, *(p for p, o in zip(big, matched, strict=True) if not declined(o))]
        result.outcomes.append(repeatable(impl, op, sets, calls=repeat_calls))
        for p in ran:
            result.outcomes.append(writes_every_output(impl, op, p))
        fresh = fresh_shape(impl, op, leaf) if impl.on_device else None
        if fresh is not None:
            result.cases[fresh.case.id] = fresh.case.to_json()
        result.outcomes.append(survives_pending_error(impl, op, fresh))
    if ran or not prepared:
        result.outcomes.append(rejects_bad_arguments(impl, op, leaf))
    result.ms = (time.perf_counter() - t0) * 1e3
    return result

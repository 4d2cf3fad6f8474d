"""qconform inside a kernel repository's own test suite: a pytest plugin.

Registered through the ``pytest11`` entry point, so it is present in every pytest run where
qconform is installed; it adds nothing (and imports nothing of qconform's engine) unless
``--qconform-impl`` is given::

    pytest --qconform-impl=py:my_kernels/q8_k.py:quantize --qconform-ops=q8_k_quant

Then it adds one test item per (implementation, op, leaf, property), with ids such as
``qconform[py:my_mod:fn-matmul_nbits-Xfp16_Wu2_Yfp16-matches_oracle]``. The first item of a leaf
runs the whole leaf once through ``qconform.properties.suite.run_leaf`` (the properties of one
leaf share that run); an item passes when every outcome of its property passed, fails with the
lines ``qconform run`` prints (the case id included) and a replay command, and is skipped when the
property does not apply (``n/a``), when every case it would check was declined (the count is in the
reason), when the implementation does not cover the op, or, for a device implementation on a
machine without a GPU, with the reason ``qconform.impls.device_available()`` gives.

Options (the same strings as ``qconform run``): ``--qconform-impl`` (repeatable), ``--qconform-ops``
(comma-separated or repeated), ``--qconform-leaf``, ``--qconform-coverage`` (default 1) and
``--qconform-repeat-calls``. Set them in the repository's ``addopts``. With pytest-xdist, each
leaf's items carry an ``xdist_group`` mark: ``-n N --dist loadgroup`` keeps a leaf on one worker
(under other ``--dist`` modes a leaf whose items land on two workers is run on both).
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # imported lazily: a pytest run without --qconform-impl never loads the engine
    from qconform.impls.protocol import Implementation
    from qconform.ops import OpSpec
    from qconform.properties.checks import Outcome
    from qconform.properties.suite import LeafResult

COLLECTOR_NAME = "qconform"
MAX_FAILURES_SHOWN = 5
DECLINED = "declined: "


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("qconform", "qconform conformance suite (items added only with --qconform-impl)")
    group.addoption(
        "--qconform-impl",
        action="append",
        default=[],
        metavar="SPEC",
        help="run this implementation through qconform's properties (repeatable; the strings of "
        "'qconform run --impl': py:module:callable, py:file.py:callable, hip:file.hip:symbol, "
        "so:lib.so:symbol, cupy, oracle)",
    )
    group.addoption(
        "--qconform-ops",
        action="append",
        default=[],
        metavar="OPS",
        help="ops to check (comma-separated or repeated; default: the ops the implementation covers)",
    )
    group.addoption("--qconform-leaf", default=None, metavar="NAME", help="only this leaf")
    group.addoption(
        "--qconform-coverage", type=int, choices=(1, 2, 3), default=1, help="case coverage: 1 quick, 2 CI, 3 full"
    )
    group.addoption(
        "--qconform-repeat-calls",
        type=_positive,
        default=None,
        metavar="N",
        help="calls of the repeatability property (default: qconform run's)",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("qconform_impl", None):
        config.pluginmanager.register(QconformSession(config), "qconform-session")


class QconformFailure(Exception):
    """A property failed; the message is the whole report of the item."""


@dataclass
class Target:
    """One ``--qconform-impl``: the implementation, or why every item of it is skipped."""

    spec: str  # as given: the item ids
    load_spec: str  # a py:/hip:/so: file path resolved against the rootdir where it is not found from the cwd
    impl: Implementation | None
    skip: str | None
    pairs: list[tuple[OpSpec, str]] = field(default_factory=list)


class QconformSession:
    """Registered only when ``--qconform-impl`` is given: adds the items, caches each leaf's run."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.specs = list(dict.fromkeys(config.getoption("qconform_impl")))
        self.ops = [n.strip() for v in config.getoption("qconform_ops") for n in v.split(",") if n.strip()] or None
        self.leaf = config.getoption("qconform_leaf")
        self.coverage = config.getoption("qconform_coverage")
        self.repeat_calls = config.getoption("qconform_repeat_calls")
        self._results: dict[tuple[str, str, str], LeafResult | Exception] = {}

    @pytest.hookimpl(tryfirst=True)  # before -k / --deselect / --lf see the items
    def pytest_collection_modifyitems(self, session: pytest.Session, items: list[pytest.Item]) -> None:
        collector = QconformCollector.from_parent(session, name=COLLECTOR_NAME, nodeid=COLLECTOR_NAME, plugin=self)
        items.extend(session.genitems(collector))

    # -- the plan -------------------------------------------------------------------------------

    def targets(self) -> list[Target]:
        from qconform.errors import ArgumentError
        from qconform.ops import get_op

        try:
            if self.ops:
                for name in self.ops:
                    get_op(name)
            targets = [self._target(spec) for spec in self.specs]
        except ArgumentError as exc:
            raise QconformCollector.CollectError(f"qconform: {exc}") from exc
        for t in targets:
            if not t.pairs:
                chosen = self._chosen(t)
                names = ", ".join(op.name for op in chosen) or "none"
                leaves = ", ".join(lf.name for op in chosen for lf in op.leaves) or "none"
                raise QconformCollector.CollectError(
                    f"qconform: --qconform-impl {t.spec}: no (op, leaf) selected: --qconform-leaf {self.leaf} "
                    f"is not a leaf of {names} (leaves: {leaves})"
                )
        return targets

    def _chosen(self, t: Target) -> list[OpSpec]:
        from qconform.ops import CATALOGUE, get_op

        if self.ops:
            return [get_op(n) for n in self.ops]
        if t.impl is not None:
            return [op for op in CATALOGUE.values() if t.impl.applies_to(op)]
        return [get_op(n) for n in self._device_ops(t.load_spec)]

    def _target(self, spec: str) -> Target:
        from qconform.errors import ArgumentError
        from qconform.impls import device_available, load_impl

        load_spec = _resolve_paths(spec, self.config.rootpath)
        try:
            t = Target(spec, load_spec, load_impl(load_spec, self.ops), None)
        except ArgumentError:
            found, why = device_available()
            if found or not self._is_device_spec(load_spec):
                raise
            t = Target(spec, load_spec, None, f"{spec} needs a GPU: {why}")
        t.pairs = [(op, lf.name) for op in self._chosen(t) for lf in op.leaves if self.leaf in (None, lf.name)]
        return t

    @staticmethod
    def _is_device_spec(spec: str) -> bool:
        if spec == "cupy" or spec.startswith(("cupy:", "hip:", "so:")):
            return True
        if spec.startswith("py:"):
            from qconform.impls.cpu import load_python_callable

            return bool(getattr(load_python_callable(spec[3:]), "__qconform_device__", False))
        return False

    def _device_ops(self, spec: str) -> list[str]:
        """The ops a device implementation covers, found without a GPU."""
        from qconform.impls import kernel_ops
        from qconform.ops import CATALOGUE

        if spec.startswith(("hip:", "so:")):
            return list(kernel_ops(spec, self.ops)[0])
        if spec.startswith("py:"):
            from qconform.impls.cpu import load_python_callable, ops_for_callable

            return list(ops_for_callable(load_python_callable(spec[3:]), self.ops)[0])
        from qconform.device.registry import KERNELS

        covered = {k.op for k in KERNELS}
        return [name for name in CATALOGUE if name in covered]

    # -- running ------------------------------------------------------------------------------

    def leaf_result(self, t: Target, op: OpSpec, leaf: str) -> LeafResult:
        """The leaf's run, once per session; an exception of the run is re-raised for each item."""
        key = (t.spec, op.name, leaf)
        cached = self._results.get(key)
        if isinstance(cached, Exception):
            raise QconformFailure(
                f"running {t.spec} on {op.name} {leaf} raised {type(cached).__name__}: {cached} "
                "(the traceback is on the first item of this leaf)"
            )
        if cached is not None:
            return cached
        from qconform.properties.checks import DEFAULT_REPEAT_CALLS, Prepared
        from qconform.properties.suite import run_leaf

        assert t.impl is not None
        try:
            prepared = [Prepared.from_case(op, c, t.impl) for c in op.cases(leaf, self.coverage)]
            result = run_leaf(t.impl, op, leaf, prepared, repeat_calls=self.repeat_calls or DEFAULT_REPEAT_CALLS)
        except Exception as exc:
            self._results[key] = exc
            raise
        self._results[key] = result
        return result

    def replay(self, t: Target, op: OpSpec, leaf: str, result: LeafResult, case_id: str | None) -> str:
        """``qconform run`` for exactly this case (its JSON), or for the leaf when there is none."""
        cmd = f"qconform run --impl {shlex.quote(t.load_spec)} --ops {op.name} --leaf {shlex.quote(leaf)}"
        if self.repeat_calls:
            cmd += f" --repeat-calls {self.repeat_calls}"
        case_json = _case_json(op, leaf, self.coverage, result, case_id)
        if case_json is None:
            return f"{cmd} --coverage {self.coverage}"
        return f"{cmd} --case {shlex.quote(case_json)}"


def _resolve_paths(spec: str, rootpath: Path) -> str:
    """A relative file in a py:/hip:/so: spec that is not there from the cwd but is from the rootdir
    (options in the repository's ini file, pytest run from a subfolder) -> its absolute path."""
    kind, sep, body = spec.partition(":")
    if not sep or kind not in ("py", "hip", "so"):
        return spec
    if kind == "py":
        target, colon, attr = body.rpartition(":")
        if not colon or not (target.endswith(".py") or "/" in target):
            return spec
        rest = [attr]
    else:
        target, *rest = body.split(":")
    path = Path(target)
    if not target or path.is_absolute() or path.exists() or not (rootpath / path).exists():
        return spec
    return ":".join([kind, str(rootpath / path), *rest])


def _case_json(op: OpSpec, leaf: str, coverage: int, result: LeafResult, case_id: str | None) -> str | None:
    if case_id is None:
        return None
    known = getattr(result, "cases", None)  # case id -> JSON, where the suite records it
    if isinstance(known, dict) and case_id in known:
        return known[case_id]
    for case in op.cases(leaf, coverage):
        if case.id == case_id:
            return case.to_json()
    return None


def _failure_line(o: Outcome) -> str:
    where = f" case {o.case}" if o.case else ""
    return f"FAIL {o.op} {o.leaf} {o.prop}{where}: {o.detail}"


class QconformCollector(pytest.Collector):
    """The virtual module ``qconform``: one item per (implementation, op, leaf, property)."""

    def __init__(self, *, plugin: QconformSession, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plugin = plugin

    def collect(self) -> list[pytest.Item]:
        from qconform.properties.checks import (
            matches_oracle,
            rejects_bad_arguments,
            repeatable,
            survives_pending_error,
            writes_every_output,
        )

        props = [
            f.__name__
            for f in (matches_oracle, repeatable, writes_every_output, rejects_bad_arguments, survives_pending_error)
        ]
        xdist = self.config.pluginmanager.hasplugin("xdist")
        items: list[pytest.Item] = []
        for t in self.plugin.targets():
            for op, leaf in t.pairs:
                for prop in props:
                    item = QconformItem.from_parent(
                        self, name=f"qconform[{t.spec}-{op.name}-{leaf}-{prop}]", target=t, op=op, leaf=leaf, prop=prop
                    )
                    if xdist:
                        item.add_marker(pytest.mark.xdist_group(f"qconform:{t.spec}:{op.name}:{leaf}"))
                    items.append(item)
        return items

    def reportinfo(self) -> tuple[Path, None, str]:
        return self.path, None, COLLECTOR_NAME


class QconformItem(pytest.Item):
    """One property of one leaf of one implementation."""

    def __init__(self, *, target: Target, op: OpSpec, leaf: str, prop: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.target, self.op, self.leaf, self.prop = target, op, leaf, prop
        self.plugin: QconformSession = self.parent.plugin  # type: ignore[union-attr]

    def runtest(self) -> None:
        t = self.target
        if t.skip is not None:
            pytest.skip(t.skip)
        assert t.impl is not None
        if not t.impl.applies_to(self.op):
            pytest.skip(f"{t.spec} does not implement {self.op.name}")
        result = self.plugin.leaf_result(t, self.op, self.leaf)
        outcomes = [o for o in result.outcomes if o.prop == self.prop]
        failed = [o for o in outcomes if o.ok is False]
        declined = [o for o in outcomes if o.ok is None and o.detail.startswith(DECLINED)]
        if failed:
            raise QconformFailure(self._failure_text(result, outcomes, failed, declined))
        if any(o.ok for o in outcomes):
            if declined:
                self.add_report_section("call", "qconform", f"{len(declined)} of {len(outcomes)} cases declined")
            return
        pytest.skip(self._skip_reason(result, outcomes, declined))

    def _skip_reason(self, result: LeafResult, outcomes: list[Outcome], declined: list[Outcome]) -> str:
        head = f"{self.op.name} {self.leaf} {self.prop}"
        if declined:
            first = declined[0]
            return (
                f"{head}: declined {len(declined)} of {len(outcomes)} cases "
                f"(first: case {first.case}, {first.detail[len(DECLINED) :]})"
            )
        n_declined = len(result.declined)
        counted = f" [{n_declined} cases declined]" if n_declined else ""
        if result.skipped:
            return f"{head}: {result.skipped}{counted}"
        if outcomes:
            return f"{head}: " + "; ".join(dict.fromkeys(o.detail for o in outcomes)) + counted
        return f"{head}: did not run for this leaf{counted}"

    def _failure_text(
        self, result: LeafResult, outcomes: list[Outcome], failed: list[Outcome], declined: list[Outcome]
    ) -> str:
        t = self.target
        checked = len(outcomes) - len(declined)
        lines = [f"{t.spec} {self.op.name} {self.leaf}: {self.prop} failed {len(failed)} of {checked} checks"]
        if declined:
            lines[0] += f" ({len(declined)} declined)"
        for o in failed[:MAX_FAILURES_SHOWN]:
            lines.append(_failure_line(o))
            lines.append(f"  replay: {self.plugin.replay(t, self.op, self.leaf, result, o.case)}")
        if len(failed) > MAX_FAILURES_SHOWN:
            lines.append(f"     ... and {len(failed) - MAX_FAILURES_SHOWN} more failures of {self.prop}")
        return "\n".join(lines)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, QconformFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, None, str]:
        return self.path, None, self.name

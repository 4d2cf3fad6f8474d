"""Render leaf results as text, markdown, json or junit (docs/architecture.md, Reports)."""

from __future__ import annotations

import json
import math
import shlex
from typing import Any, Sequence
from xml.sax.saxutils import escape, quoteattr

from qconform.contracts import contract_flag
from qconform.properties.checks import DECLINED
from qconform.properties.suite import LeafResult

COLUMNS = ("Op", "Leaf", "Arch", "Cases", "Failed", "Suite (ms)", "max relL2", "Verdict")
MAX_FAILURES_SHOWN = 5


def _rel(v: float) -> str:
    if math.isnan(v):
        return "nan"
    return "0" if v == 0 else f"{v:.2e}"


def _row(r: LeafResult) -> tuple[str, ...]:
    return (r.op, r.leaf, r.arch, str(len(r.checked)), str(len(r.failed)), f"{r.ms:.0f}", _rel(r.max_rel_l2), r.verdict)


def summary(results: Sequence[LeafResult]) -> str:
    leaves_failed = sum(r.verdict == "FAIL" for r in results)
    cases = sum(len(r.checked) for r in results)
    failed = sum(len(r.failed) for r in results)
    declined = sum(len(r.declined) for r in results)
    extra = f", {declined} declined" if declined else ""
    return f"Leaves: {len(results)} ({leaves_failed} failed) | Cases: {cases} ({failed} failed{extra})"


def replay_command(r: LeafResult, case_id: str | None) -> str | None:
    """The one-line command that replays exactly one case of ``r`` (None without a known case)."""
    case = r.cases.get(case_id or "")
    if case is None:
        return None
    return f"qconform run --impl {shlex.quote(r.impl)}{contract_flag(r.contract)} --case {shlex.quote(case)}"


def _failure_lines(results: Sequence[LeafResult], max_failures: int | None = MAX_FAILURES_SHOWN) -> list[str]:
    """SKIP / DECLINED / FAIL / WARN lines; each failure with a known case is followed by its replay
    command. ``max_failures``: per leaf (None: all)."""
    lines = []
    for r in results:
        if r.skipped:
            lines.append(f"SKIP {r.op} {r.leaf}: {r.skipped}")
        elif r.declined:
            n = r.ran + len(r.declined)
            first = r.declined[0]
            lines.append(
                f"DECLINED {r.op} {r.leaf}: ran {r.ran}/{n}, declined {len(r.declined)} "
                f"(first: case {first.case}, {first.detail[len(DECLINED):]})"
            )
        shown = r.failed if max_failures is None else r.failed[:max_failures]
        for o in shown:
            where = f" case {o.case}" if o.case else ""
            lines.append(f"FAIL {r.op} {r.leaf} {o.prop}{where}: {o.detail}")
            replay = replay_command(r, o.case)
            if replay:
                lines.append(f"  replay: {replay}")
        if len(r.failed) > len(shown):
            more = len(r.failed) - len(shown)
            lines.append(f"     ... and {more} more failures in {r.op} {r.leaf} (--all-failures shows them)")
        for o in r.outcomes:
            if o.ok is not False and "WARNING" in o.detail:
                lines.append(f"WARN {r.op} {r.leaf} {o.prop}: {o.detail}")
    return lines


def text(results: Sequence[LeafResult], context: dict[str, Any], max_failures: int | None = MAX_FAILURES_SHOWN) -> str:
    rows = [COLUMNS] + [_row(r) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    out = [" | ".join(f"{k}: {v}" for k, v in context.items())]
    for n, row in enumerate(rows):
        out.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    out.append(summary(results))
    return "\n".join(out + _failure_lines(results, max_failures)) + "\n"


def markdown(
    results: Sequence[LeafResult], context: dict[str, Any], max_failures: int | None = MAX_FAILURES_SHOWN
) -> str:
    out = [
        " · ".join(f"**{k}**: {v}" for k, v in context.items()),
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    out += ["| " + " | ".join(_row(r)) + " |" for r in results]
    out += ["", summary(results)]
    failures = _failure_lines(results, max_failures)
    if failures:
        out += ["", "```"] + failures + ["```"]
    return "\n".join(out) + "\n"


def as_json(results: Sequence[LeafResult], context: dict[str, Any], max_failures: int | None = None) -> str:
    """Every outcome; a failing one carries its case's JSON and replay command."""
    def num(v: float) -> float | None:
        return None if math.isnan(v) else v

    rows = [
        {
            "op": r.op,
            "leaf": r.leaf,
            "arch": r.arch,
            "impl": r.impl,
            "contract": r.contract,
            "cases": len(r.checked),
            "failed": len(r.failed),
            "suite_ms": round(r.ms, 3),
            "max_rel_l2": num(r.max_rel_l2),
            "verdict": r.verdict,
            "skipped": r.skipped,
            "ran": r.ran,
            "declined": len(r.declined),
            "outcomes": [
                {
                    "property": o.prop,
                    "case": o.case,
                    "ok": o.ok,
                    "detail": o.detail,
                    "rel_l2": num(o.rel_l2),
                    "ms": round(o.ms, 3),
                    **(
                        {"case_json": r.cases.get(o.case or ""), "replay": replay_command(r, o.case)}
                        if o.ok is False
                        else {}
                    ),
                }
                for o in r.outcomes
            ],
        }
        for r in results
    ]
    return json.dumps({"context": context, "rows": rows, "summary": summary(results)}, indent=1) + "\n"


def junit(results: Sequence[LeafResult], context: dict[str, Any], max_failures: int | None = None) -> str:
    tests = sum(len(r.outcomes) for r in results)
    failures = sum(len(r.failed) for r in results)
    skipped = sum(1 for r in results for o in r.outcomes if o.ok is None) + sum(1 for r in results if r.skipped)
    out = [
        '<?xml version="1.0" encoding="utf-8"?>',
        f'<testsuites><testsuite name="qconform" tests="{tests}" failures="{failures}" errors="0" skipped="{skipped}">',
        "<properties>",
    ]
    out += [f"<property name={quoteattr(str(k))} value={quoteattr(str(v))}/>" for k, v in context.items()]
    out.append("</properties>")
    for r in results:
        cls = quoteattr(f"{r.op}.{r.leaf}")
        if r.skipped:
            out.append(f'<testcase classname={cls} name="leaf"><skipped message={quoteattr(r.skipped)}/></testcase>')
        for o in r.outcomes:
            name = quoteattr(f"{o.prop}[{o.case}]" if o.case else o.prop)
            body = ""
            if o.ok is False:
                replay = replay_command(r, o.case)
                text_ = o.detail + (f"\ncase: {r.cases[o.case]}\nreplay: {replay}" if replay and o.case else "")
                body = f"<failure message={quoteattr(o.detail)}>{escape(text_)}</failure>"
            elif o.ok is None:
                body = f"<skipped message={quoteattr(o.detail)}/>"
            out.append(f'<testcase classname={cls} name={name} time="{o.ms / 1e3:.6f}">{body}</testcase>')
    out.append("</testsuite></testsuites>")
    return "\n".join(out) + "\n"


RENDERERS = {"text": text, "markdown": markdown, "json": as_json, "junit": junit}


def render(
    results: Sequence[LeafResult], fmt: str, context: dict[str, Any], max_failures: int | None = MAX_FAILURES_SHOWN
) -> str:
    """``max_failures``: failure lines shown per leaf in text and markdown (None: every one)."""
    return RENDERERS[fmt](results, context, max_failures)


class TextStream:
    """The text table written as each leaf finishes (``qconform run`` on a terminal or a CI log):
    the context line and the header first, a row per leaf, then the summary and the failure lines."""

    NUMERIC = (5, 6, 10, 9, 7)  # Cases, Failed, Suite (ms), max relL2, Verdict

    def __init__(self, write: Any, context: dict[str, Any], names: Sequence[tuple[str, str]], arch: str) -> None:
        self.write = write
        self.widths = [
            max([len(COLUMNS[0]), *(len(op) for op, _ in names)]),
            max([len(COLUMNS[1]), *(len(leaf) for _, leaf in names)]),
            max(len(COLUMNS[2]), len(arch)),
            *(max(len(c), w) for c, w in zip(COLUMNS[3:], self.NUMERIC, strict=True)),
        ]
        self.write(" | ".join(f"{k}: {v}" for k, v in context.items()) + "\n")
        self._line(COLUMNS)
        self._line(tuple("-" * w for w in self.widths))

    def _line(self, cells: Sequence[str]) -> None:
        self.write("  ".join(c.ljust(w) for c, w in zip(cells, self.widths, strict=True)).rstrip() + "\n")

    def row(self, r: LeafResult) -> None:
        self._line(_row(r))

    def end(self, results: Sequence[LeafResult], max_failures: int | None, note: str = "") -> None:
        self.write(summary(results) + (f" | {note}" if note else "") + "\n")
        for line in _failure_lines(results, max_failures):
            self.write(line + "\n")


def from_json(data: dict[str, Any]) -> list[LeafResult]:
    """The leaf results of a ``--format json`` report (``qconform report merge``)."""
    from qconform.properties.checks import Outcome

    out = []
    for row in data["rows"]:
        r = LeafResult(
            row["op"],
            row["leaf"],
            row["arch"],
            row["impl"],
            ms=row["suite_ms"],
            skipped=row["skipped"],
            contract=row.get("contract", "strict"),
        )
        for o in row["outcomes"]:
            rel = o["rel_l2"] if o["rel_l2"] is not None else math.nan
            r.outcomes.append(Outcome(o["property"], r.op, r.leaf, o["case"], o["ok"], o["detail"], rel, o["ms"]))
            if o.get("case_json"):
                r.cases[o["case"]] = o["case_json"]
        out.append(r)
    return out

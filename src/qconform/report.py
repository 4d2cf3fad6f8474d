"""Render leaf results as text, markdown, json or junit (DESIGN.md, Reports)."""

from __future__ import annotations

import json
import math
from typing import Any, Sequence
from xml.sax.saxutils import escape, quoteattr

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


def _failure_lines(results: Sequence[LeafResult]) -> list[str]:
    lines = []
    for r in results:
        if r.skipped:
            lines.append(f"SKIP {r.op} {r.leaf}: {r.skipped}")
        elif r.declined:
            n = r.ran + len(r.declined)
            first = r.declined[0]
            lines.append(
                f"DECLINED {r.op} {r.leaf}: ran {r.ran}/{n}, declined {len(r.declined)} "
                f"(first: case {first.case}, {first.detail[len('declined: '):]})"
            )
        for o in r.failed[:MAX_FAILURES_SHOWN]:
            where = f" case {o.case}" if o.case else ""
            lines.append(f"FAIL {r.op} {r.leaf} {o.prop}{where}: {o.detail}")
        if len(r.failed) > MAX_FAILURES_SHOWN:
            lines.append(f"     ... and {len(r.failed) - MAX_FAILURES_SHOWN} more failures in {r.op} {r.leaf}")
        for o in r.outcomes:
            if o.ok is not False and "WARNING" in o.detail:
                lines.append(f"WARN {r.op} {r.leaf} {o.prop}: {o.detail}")
    return lines


def text(results: Sequence[LeafResult], context: dict[str, Any]) -> str:
    rows = [COLUMNS] + [_row(r) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    out = [" | ".join(f"{k}: {v}" for k, v in context.items())]
    for n, row in enumerate(rows):
        out.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    out.append(summary(results))
    return "\n".join(out + _failure_lines(results)) + "\n"


def markdown(results: Sequence[LeafResult], context: dict[str, Any]) -> str:
    out = [
        " · ".join(f"**{k}**: {v}" for k, v in context.items()),
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    out += ["| " + " | ".join(_row(r)) + " |" for r in results]
    out += ["", summary(results)]
    failures = _failure_lines(results)
    if failures:
        out += ["", "```"] + failures + ["```"]
    return "\n".join(out) + "\n"


def as_json(results: Sequence[LeafResult], context: dict[str, Any]) -> str:
    def num(v: float) -> float | None:
        return None if math.isnan(v) else v

    rows = [
        {
            "op": r.op,
            "leaf": r.leaf,
            "arch": r.arch,
            "impl": r.impl,
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
                }
                for o in r.outcomes
            ],
        }
        for r in results
    ]
    return json.dumps({"context": context, "rows": rows, "summary": summary(results)}, indent=1) + "\n"


def junit(results: Sequence[LeafResult], context: dict[str, Any]) -> str:
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
                body = f"<failure message={quoteattr(o.detail)}>{escape(o.detail)}</failure>"
            elif o.ok is None:
                body = f"<skipped message={quoteattr(o.detail)}/>"
            out.append(f'<testcase classname={cls} name={name} time="{o.ms / 1e3:.6f}">{body}</testcase>')
    out.append("</testsuite></testsuites>")
    return "\n".join(out) + "\n"


RENDERERS = {"text": text, "markdown": markdown, "json": as_json, "junit": junit}


def render(results: Sequence[LeafResult], fmt: str, context: dict[str, Any]) -> str:
    return RENDERERS[fmt](results, context)

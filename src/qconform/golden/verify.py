"""``golden verify``: hashes first (a changed byte is named by file and tensor), then a replay of
the implementation on the stored inputs, reporting drift with a byte-level summary."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from qconform.golden.store import MANIFEST, decode_leaf, oracle_source_hash, read_manifest, sha256
from qconform.impls import Implementation, OracleImpl
from qconform.properties.checks import Prepared
from qconform.properties.compare import same_elements


@dataclass(frozen=True)
class Finding:
    kind: str  # corrupt | missing | unlisted | unreadable | drift
    path: str
    detail: str


@dataclass
class VerifyReport:
    set_dir: Path
    impl: str
    contract: str = "strict"
    files: int = 0
    cases: int = 0
    findings: list[Finding] = field(default_factory=list)
    oracle_sources_changed: bool = False

    @property
    def ok(self) -> bool:
        return not self.findings


def locate_changes(data: bytes, entry: dict[str, Any]) -> list[str]:
    """Which recorded regions (header, tensors) of a file no longer hash as the manifest says."""
    if len(data) != entry["bytes"]:
        return [f"size {len(data)} bytes, manifest says {entry['bytes']}"]
    changed = []
    a, b = entry["header"]["offsets"]
    if sha256(data[a:b]) != entry["header"]["sha256"]:
        changed.append("the safetensors header (names, dtypes, offsets or metadata)")
    for name, t in entry["tensors"].items():
        a, b = t["offsets"]
        if sha256(data[a:b]) != t["sha256"]:
            changed.append(f"tensor '{name}' (bytes {a}..{b})")
    return changed or ["bytes outside every recorded region"]


def diff_summary(op, params: dict[str, Any], got: np.ndarray, want: np.ndarray) -> str:
    """Counts of differing elements by block field (``d``, ``qs``, ``bsums``...) where the op names them."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return ""
    idx = np.argwhere(~same_elements(got, want))
    if not len(idx) or op.locate is None:
        return ""
    fields = Counter(
        re.sub(r"\[\d+\]$", "", op.locate(params, tuple(int(i) for i in ix)).split(", ")[-1]) for ix in idx[:100_000]
    )
    return "; by field: " + ", ".join(f"{k}={v}" for k, v in sorted(fields.items()))


def integrity(set_dir: Path) -> tuple[list[Finding], dict[str, bytes]]:
    """Check every file against the manifest: (findings, the bytes of each intact listed file)."""
    findings: list[Finding] = []
    intact: dict[str, bytes] = {}
    manifest = read_manifest(set_dir)
    listed = {e["path"] for e in manifest["files"]}
    for path in sorted(set_dir.rglob("*.safetensors")):
        rel = path.relative_to(set_dir).as_posix()
        if rel not in listed:
            findings.append(Finding("unlisted", rel, f"not in {MANIFEST}"))
    for entry in manifest["files"]:
        path = set_dir / entry["path"]
        if not path.is_file():
            findings.append(Finding("missing", entry["path"], "listed in the manifest, not on disk"))
            continue
        data = path.read_bytes()
        if sha256(data) != entry["sha256"]:
            findings += [Finding("corrupt", entry["path"], f"changed: {w}") for w in locate_changes(data, entry)]
        else:
            intact[entry["path"]] = data
    return findings, intact


def verify_set(set_dir: Path, impl: Implementation | None = None) -> VerifyReport:
    """Hashes, then a replay of ``impl`` (the oracle by default) on every intact file's cases."""
    impl = impl or OracleImpl()
    report = VerifyReport(set_dir, impl.name, str(impl.contract))
    report.oracle_sources_changed = read_manifest(set_dir).get("oracle_source_sha256") != oracle_source_hash()
    report.findings, intact = integrity(set_dir)
    report.files = len(intact) + len({f.path for f in report.findings if f.kind == "corrupt"})
    for path, data in intact.items():
        try:
            leaf = decode_leaf(data)
        except Exception as exc:
            report.findings.append(Finding("unreadable", path, f"{type(exc).__name__}: {exc}"))
            continue
        if not impl.applies_to(leaf.op):
            continue
        for p in leaf.prepared:
            report.cases += 1
            _replay(report, impl, leaf.op, p.for_impl(leaf.op, impl), path)
    return report


def _replay(report: VerifyReport, impl: Implementation, op, p: Prepared, path: str) -> None:
    try:
        got = impl.run(op, p.case.leaf, p.inputs, p.params)
    except Exception as exc:
        report.findings.append(
            Finding("drift", path, f"case {p.case.id}: {impl.name} raised {type(exc).__name__}: {exc}")
        )
        return
    c = p.verify(op, got)
    if not c.ok:
        single = isinstance(p.want, np.ndarray)  # a multi-output op's detail names the output
        summary = diff_summary(op, p.params, np.asarray(got), p.want) if single else ""
        tensors = op.output_name if single else "{" + ",".join(op.output_names) + "}"
        report.findings.append(
            Finding(
                "drift",
                path,
                f"case {p.case.id}, tensor '{p.case.id}/{tensors}': "
                f"{impl.name} output differs from the stored one: {c.detail}{summary}",
            )
        )

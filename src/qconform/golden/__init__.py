"""Golden vectors: writer, reader and verifier (safetensors + MANIFEST.json)."""

from __future__ import annotations

from pathlib import Path

import qconform
from qconform.golden.store import GoldenLeaf, decode_leaf, read_manifest, write_set
from qconform.golden.verify import Finding, VerifyReport, verify_set

__all__ = [
    "GoldenLeaf",
    "Finding",
    "VerifyReport",
    "decode_leaf",
    "default_set_dir",
    "read_manifest",
    "verify_set",
    "write_set",
]


def default_set_dir(name: str | None = None) -> Path | None:
    """A committed golden set (the newest ``v<N>`` when ``name`` is None): shipped in the wheel, or
    ``golden/<name>`` of a source checkout. Released sets are never rewritten; older ones stay as
    regression sets."""
    pkg = Path(qconform.__file__).parent
    for root in (pkg / "_golden_sets", pkg.parents[1] / "golden"):
        sets = sorted(
            (d for d in root.glob("v*") if d.name[1:].isdigit() and (d / "MANIFEST.json").is_file()),
            key=lambda d: int(d.name[1:]),
        )
        chosen = [d for d in sets if d.name == name] if name else sets[-1:]
        if chosen:
            return chosen[0]
    return None

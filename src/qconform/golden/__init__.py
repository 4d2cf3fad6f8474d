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
    "default_sets",
    "read_manifest",
    "verify_set",
    "write_set",
]


def default_sets() -> list[Path]:
    """The committed golden sets ``v<N>``, newest first: shipped in the wheel, or ``golden/`` of a
    source checkout. Released sets are never rewritten; a newer set adds leaves (or new cases of
    old ones), so without a GPU ``qconform run`` checks each leaf from the newest set holding it."""
    pkg = Path(qconform.__file__).parent
    for root in (pkg / "_golden_sets", pkg.parents[1] / "golden"):
        sets = sorted(
            (d for d in root.glob("v*") if d.name[1:].isdigit() and (d / "MANIFEST.json").is_file()),
            key=lambda d: -int(d.name[1:]),
        )
        if sets:
            return sets
    return []


def default_set_dir(name: str | None = None) -> Path | None:
    """A committed golden set: ``name``, or the newest when None."""
    sets = default_sets()
    chosen = [d for d in sets if d.name == name] if name else sets[:1]
    return chosen[0] if chosen else None

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


def default_set_dir(name: str = "v1") -> Path | None:
    """The committed golden set: shipped in the wheel, or ``golden/<name>`` of a source checkout."""
    pkg = Path(qconform.__file__).parent
    for candidate in (pkg / "_golden_sets" / name, pkg.parents[1] / "golden" / name):
        if (candidate / "MANIFEST.json").is_file():
            return candidate
    return None

"""The import rules of docs/architecture.md (Layers): formats import nothing of ours; oracles
import only formats (and the error types), one family never another; neither imports CuPy,
hypothesis or pytest; the property engine reaches implementations only through their protocol
(never the device layer); the device layer imports ops, the oracles' validators and itself,
never the property engine or the CLI."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import qconform

PKG = Path(qconform.__file__).parent
FORBIDDEN = {"cupy", "hypothesis", "pytest"}
ALLOWED = {  # layer -> the qconform modules it may import (a module and everything under it)
    "formats": set(),
    "oracles": {"formats", "errors", "oracles"},
    "ops": {"formats", "errors", "oracles", "ops", "contracts", "readings"},
    "properties": {"formats", "errors", "guard", "ops", "properties", "impls.protocol", "contracts", "readings"},
    "device": {"formats", "errors", "guard", "oracles", "ops", "device"},
}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("layer", sorted(ALLOWED), ids=[f"layer-{name}" for name in sorted(ALLOWED)])
def test_layer_imports(layer: str) -> None:
    for path in (PKG / layer).rglob("*.py"):
        for name in _imports(path):
            top, _, rest = name.partition(".")
            if layer in ("formats", "oracles"):
                assert top not in FORBIDDEN, f"{path.relative_to(PKG)} imports {name}"
            if top == "qconform" and rest:
                ok = any(rest == a or rest.startswith(a + ".") for a in ALLOWED[layer])
                assert ok, f"{path.relative_to(PKG)} imports {name}"


def test_one_oracle_family_never_imports_another() -> None:
    for family in (p for p in (PKG / "oracles").iterdir() if p.is_dir() and p.name != "__pycache__"):
        for path in family.rglob("*.py"):
            for name in _imports(path):
                if name.startswith("qconform.oracles."):
                    assert name.split(".")[2] == family.name, f"{path.relative_to(PKG)} imports {name}"

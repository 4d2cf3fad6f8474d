"""DESIGN.md's import rules: formats import nothing of ours; oracles import only formats (and the
error types); neither imports CuPy, hypothesis or pytest; imports point downwards."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import qconform

PKG = Path(qconform.__file__).parent
FORBIDDEN = {"cupy", "hypothesis", "pytest"}
ALLOWED = {  # layer -> the qconform subpackages it may import
    "formats": set(),
    "oracles": {"formats", "errors", "oracles"},
    "ops": {"formats", "errors", "oracles", "ops"},
}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layer_imports(layer: str) -> None:
    for path in (PKG / layer).rglob("*.py"):
        for name in _imports(path):
            top, _, rest = name.partition(".")
            if layer != "ops":
                assert top not in FORBIDDEN, f"{path.relative_to(PKG)} imports {name}"
            if top == "qconform":
                sub = rest.partition(".")[0]
                assert sub in ALLOWED[layer], f"{path.relative_to(PKG)} imports {name}"

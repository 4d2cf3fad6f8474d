"""The op catalogue: one OpSpec per op (see ``spec.OpSpec``)."""

from __future__ import annotations

from qconform.errors import ArgumentError
from qconform.ops import bnb, ggml, ort
from qconform.ops.spec import BadArgument, Case, Check, Leaf, OpSpec

CATALOGUE: dict[str, OpSpec] = {op.name: op for op in (*ggml.OPS, *ort.OPS, *bnb.OPS)}

__all__ = ["CATALOGUE", "BadArgument", "Case", "Check", "Leaf", "OpSpec", "get_op"]


def get_op(name: str) -> OpSpec:
    if name not in CATALOGUE:
        raise ArgumentError(f"op: unknown op {name!r}; known: {', '.join(CATALOGUE)}")
    return CATALOGUE[name]

"""What an implementation's output may be, under its numeric contract: one or more readings of
the op (the oracle with flush-to-zero on or off when the build is unknown, both MatMulNBits
paths at accuracy_level 4, IEEE NaN rules), each an exact output or an error model to bound."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from qconform.contracts import Contract
from qconform.ops import OpSpec
from qconform.readings import Expected


def oracle_output(op: OpSpec, inputs: dict[str, np.ndarray], params: dict[str, Any], ftz: bool) -> Any:
    args, kwargs = op.call_args(inputs, params)
    return op.oracle(*args, **{**kwargs, **({"ftz": True} if ftz else {})})


def expectations(
    op: OpSpec, inputs: dict[str, np.ndarray], params: dict[str, Any], contract: Contract, built_ftz: bool | None
) -> tuple[Expected, ...]:
    """Every reading the contract accepts, the strict reference (as the build flushes) first."""
    modes = contract.ftz_modes(built_ftz)
    out: list[Expected] = []
    for ftz in modes:
        if op.numerics is not None:
            readings = op.numerics(inputs, params, contract, ftz)
        else:
            readings = [Expected("reference", oracle_output(op, inputs, params, ftz), plain=not ftz)]
        for e in readings:
            label = f"{e.label}, ftz {'on' if ftz else 'off'}" if len(modes) > 1 else e.label
            out.append(replace(e, label=label, ftz=ftz, plain=e.plain and not ftz))
    return tuple(out)


def has_nan(inputs: dict[str, np.ndarray]) -> bool:
    return any(np.asarray(v).dtype.kind == "f" and bool(np.isnan(v).any()) for v in inputs.values())

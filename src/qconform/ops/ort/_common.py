"""What the ONNX Runtime family's catalogue entries share: activation dtypes, leaf params, and a
``validate`` built from an oracle's own argument checks."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from qconform.ops.spec import Leaf

ACTS = {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16)}
U32 = np.float32(2.0**-24)


def validating(oracle: Callable[..., np.ndarray], call: Callable[..., tuple[tuple, dict]]) -> Callable[..., Any]:
    """An OpSpec.validate that runs the oracle's own argument checks (they all precede any work)."""

    def validate(inputs: dict[str, Any], params: dict[str, Any], out: Any = None) -> None:
        args, kw = call(inputs, params)
        oracle(*args, **kw, out=out)

    return validate


def leaf_params(leaves: tuple[Leaf, ...], name: str) -> dict[str, Any]:
    for lf in leaves:
        if lf.name == name:
            return dict(lf.params)
    raise KeyError(name)

"""The Implementation protocol: what the property engine calls. Loaders live beside it
(``cpu`` for the oracle and ``py:`` drop-ins, ``device`` for cupy / hip: / so: / device py:)."""

from __future__ import annotations

import platform
from typing import Any, Callable, Protocol

import numpy as np

from qconform.contracts import Contract
from qconform.ops import OpSpec


class Implementation(Protocol):
    name: str
    arch: str
    accepts_out: bool
    on_device: bool
    guessed: bool  # the ops it applies to were guessed from its name (no exception is excused by it)
    ftz: bool | None  # fp32 subnormals flushed (compared with the oracles' ftz=True); None: unknown
    contract: Contract  # the declared numerics it is checked against (qconform.contracts)
    l2_bytes: int  # last-level cache the repeat sets must exceed (0 on the CPU)

    def applies_to(self, op: OpSpec) -> bool: ...

    def stage(self, op: OpSpec, leaf: str, inputs: dict[str, np.ndarray], params: dict[str, Any]) -> Callable[[], Any]:
        """Inputs made resident once; the returned function calls the op and returns a result
        whose ``==`` means bit-identical."""
        ...

    def error_slot(self) -> tuple[Any, str]:
        """(the runtime last-error slot this implementation reports through, or None and why)."""
        ...

    def bad_call_status(self, op: OpSpec, leaf: str) -> tuple[int, str] | None:
        """(status, detail) of a deliberately bad call at the launcher's ABI, or None."""
        ...

    def run(
        self,
        op: OpSpec,
        leaf: str,
        inputs: dict[str, np.ndarray],
        params: dict[str, Any],
        out: np.ndarray | None = None,
    ) -> np.ndarray: ...


def cpu_arch() -> str:
    return f"cpu-{platform.machine() or 'unknown'}"

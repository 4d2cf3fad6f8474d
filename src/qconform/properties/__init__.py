"""Generic properties any implementation is run through, hypothesis profiles, and the leaf runner."""

from qconform.properties.checks import (
    Outcome,
    Prepared,
    matches_oracle,
    rejects_bad_arguments,
    repeatable,
    survives_pending_error,
    writes_every_output,
)
from qconform.properties.compare import Comparison, compare, rel_l2
from qconform.properties.suite import LeafResult, run_leaf

__all__ = [
    "Comparison",
    "LeafResult",
    "Outcome",
    "Prepared",
    "compare",
    "matches_oracle",
    "rel_l2",
    "rejects_bad_arguments",
    "repeatable",
    "run_leaf",
    "survives_pending_error",
    "writes_every_output",
]

"""Hypothesis profiles: ``ci`` (derandomized, bounded), ``dev`` and ``fuzz`` (thousands of examples).

Chosen by ``HYPOTHESIS_PROFILE``; without it, ``ci`` when ``CI`` is set, else ``dev``.
``deadline=None`` everywhere: oracle compiles and device JIT take seconds on a first call.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

settings.register_profile("ci", derandomize=True, database=None, max_examples=40, print_blob=True, **_COMMON)
settings.register_profile("dev", max_examples=100, **_COMMON)
settings.register_profile("fuzz", max_examples=5000, **_COMMON)


def load_profile(name: str | None = None) -> str:
    """Load and return the profile named, or the one the environment selects."""
    chosen = name or os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
    settings.load_profile(chosen)
    return chosen

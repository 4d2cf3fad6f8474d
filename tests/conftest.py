"""pytest wiring: hypothesis profile from the environment, the tests dir importable (mutants)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from qconform.properties.profiles import load_profile

TESTS = Path(__file__).parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(REPO / "examples"))  # my_kernels: the README's drop-ins
load_profile()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from qconform.impls import device_available

    found, why = device_available()
    if found:
        return
    skip = pytest.mark.skip(reason=f"no GPU: {why}")
    for item in items:
        if item.get_closest_marker("device") is not None:
            item.add_marker(skip)


@pytest.fixture
def in_tests_dir(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run with the tests dir as cwd, so ``py:mutants:...`` resolves as a user's module would."""
    monkeypatch.chdir(TESTS)
    return TESTS

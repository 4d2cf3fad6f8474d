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


def own_kernel_family(test_name: str) -> str | None:
    """The family a ``test_own_kernel_<op>_...`` test checks: that of the catalogue op (or the family)
    its name starts with after the prefix, the longest match; None for any other name. ``ci/device.sh
    check FAMILY`` selects a family's own-kernel tests by it (``-k FAMILY``)."""
    from qconform.ops import CATALOGUE

    prefix = "test_own_kernel_"
    if not test_name.startswith(prefix):
        return None
    rest = test_name[len(prefix) :] + "_"
    names = {op.name: op.family for op in CATALOGUE.values()} | {op.family: op.family for op in CATALOGUE.values()}
    found = [name for name in names if rest.startswith(name + "_")]
    return names[max(found, key=len)] if found else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from qconform.impls import device_available

    for item in items:  # the family as a keyword: -k ort selects test_own_kernel_matmul_nbits_*
        family = own_kernel_family(getattr(item, "originalname", item.name))
        if family is not None:
            item.extra_keyword_matches.add(family)
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

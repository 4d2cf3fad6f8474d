"""The pytest plugin (``qconform.pytest_plugin``): a kernel repository's own ``pytest`` run gets one
item per (implementation, op, leaf, property) with ``--qconform-impl``, and nothing without it."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

# Imported here, before any inline run: pytester drops the modules an inner run imports, and the
# next import of an oracle would load its numba twin again.
import qconform.oracles.ggml  # noqa: F401
import qconform.oracles.ort  # noqa: F401
import qconform.properties.suite  # noqa: F401
from qconform.cli import main
from qconform.impls import device_available
from qconform.ops import get_op

pytest_plugins = ["pytester"]

TESTS = Path(__file__).parent
EXAMPLE = TESTS.parent / "examples" / "kernel_repo"
OP = get_op("q8_k_quant")
LEAF = OP.leaves[0].name
PROPERTIES = ("matches_oracle", "repeatable", "writes_every_output", "rejects_bad_arguments", "survives_pending_error")
ORACLE = "py:qconform.oracles.ggml:quantize"


def _plugin_args() -> list[str]:
    """Nothing where the entry point loads the plugin (an installed qconform), else ``-p``."""
    registered = any(ep.value == "qconform.pytest_plugin" for ep in entry_points(group="pytest11"))
    if registered and not os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return []
    return ["-p", "qconform.pytest_plugin"]


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest("-p", "no:cacheprovider", "-rA", *_plugin_args(), *args)


def _item(spec: str, prop: str, leaf: str = LEAF) -> str:
    return f"qconform::qconform[{spec}-{OP.name}-{leaf}-{prop}]"


def test_a_correct_drop_in_passes_one_item_per_leaf_and_property(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_own="def test_own():\n    pass\n")
    result = _run(pytester, f"--qconform-impl={ORACLE}", f"--qconform-ops={OP.name}", "--qconform-coverage=1")
    n_items = len(OP.leaves) * len(PROPERTIES)
    # the CPU implementation: every property passes, but the device-only pending-error one is n/a
    result.assert_outcomes(passed=1 + n_items - len(OP.leaves), skipped=len(OP.leaves))
    out = result.stdout.str()
    for lf in OP.leaves:
        for prop in PROPERTIES[:-1]:
            assert f"PASSED {_item(ORACLE, prop, lf.name)}" in out
    assert "survives_pending_error: n/a: CPU implementation" in out
    assert f"collected {1 + n_items} items" in out


def test_a_broken_drop_in_fails_matches_oracle_with_the_case_and_its_replay(
    pytester: pytest.Pytester, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = f"py:{TESTS / 'mutants.py'}:q8_k_ties_away"  # Q8_K rounding ties away from zero
    result = _run(pytester, f"--qconform-impl={spec}", f"--qconform-ops={OP.name}")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = result.stdout.str()
    assert f"FAILED {_item(spec, 'matches_oracle')}" in out
    assert f"PASSED {_item(spec, 'rejects_bad_arguments')}" in out
    fail = [line for line in result.stdout.lines if line.startswith(f"FAIL {OP.name} {LEAF} matches_oracle case ")]
    assert fail and "bytes differ" in fail[0]
    case_id = fail[0].split(" case ", 1)[1].split(":", 1)[0]
    replays = [line.strip() for line in result.stdout.lines if line.strip().startswith("replay: qconform run ")]
    prefix = f"replay: qconform run --impl {spec} --ops {OP.name} --leaf {LEAF} --case "
    assert replays and replays[0].startswith(prefix)
    case_json = shlex.split(replays[0])[-1]
    assert case_json in {c.to_json() for c in OP.cases(LEAF, 1) if c.id == case_id}
    # the replay line is a working command: it reproduces that one case
    capsys.readouterr()
    argv = shlex.split(replays[0])
    assert argv[1:3] == ["qconform", "run"]
    assert main(argv[2:]) == 1
    assert f"case {case_id}" in capsys.readouterr().out


def test_without_the_option_nothing_is_added(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_own="def test_own():\n    pass\n")
    result = _run(pytester)
    result.assert_outcomes(passed=1)
    assert "qconform[" not in result.stdout.str()
    config = pytester.parseconfigure(*_plugin_args())
    assert config.pluginmanager.get_plugin("qconform-session") is None
    assert config.getoption("qconform_impl") == []
    assert "--qconform-impl=SPEC" in _run(pytester, "--help").stdout.str()


def test_an_implementation_that_declines_everything_gives_skips_never_passes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(dec="def q8_k_quant(x, qtype, out=None):\n    raise NotImplementedError('not yet')\n")
    result = _run(pytester, "--qconform-impl=py:dec.py:q8_k_quant", f"--qconform-ops={OP.name}")
    n_cases = len(OP.cases(LEAF, 1))
    result.assert_outcomes(skipped=len(OP.leaves) * len(PROPERTIES))
    out = result.stdout.str()
    assert f"matches_oracle: declined {n_cases} of {n_cases} cases" in out
    assert "NotImplementedError: not yet" in out
    assert f"[{n_cases} cases declined]" in out  # the other properties' reasons carry the count


@pytest.mark.skipif(device_available()[0], reason="checks the skip reason on a machine without a GPU")
def test_a_device_implementation_without_a_gpu_is_skipped_with_the_reason(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "--qconform-impl=hip:kernel.hip:my_q8_k_quant", f"--qconform-ops={OP.name}")
    result.assert_outcomes(skipped=len(OP.leaves) * len(PROPERTIES))
    assert f"needs a GPU: {device_available()[1]}" in result.stdout.str()


def test_an_implementation_that_cannot_load_is_a_collection_error(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "--qconform-impl=py:missing.py:fn")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*ERROR collecting qconform*", "qconform: impl: no such file 'missing.py'"])


def test_the_example_kernel_repo_runs_with_its_own_config(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(EXAMPLE, pytester.path, dirs_exist_ok=True)
    # its tests import its package my_kernels: not the README's examples/my_kernels.py (mutants.py)
    for name in [m for m in sys.modules if m == "my_kernels" or m.startswith("my_kernels.")]:
        monkeypatch.delitem(sys.modules, name)
    result = _run(pytester)  # the options come from its pytest.ini addopts
    n_items = len(OP.leaves) * len(PROPERTIES)
    result.assert_outcomes(passed=1 + n_items - len(OP.leaves), skipped=len(OP.leaves))
    assert f"PASSED {_item('py:my_kernels/q8_k.py:quantize', 'matches_oracle')}" in result.stdout.str()

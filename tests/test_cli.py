"""The command line: the default run, report formats, exit codes, ``python -m qconform``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from qconform.cli import main


def test_default_run_checks_what_the_host_has(capsys) -> None:
    """Without a GPU: the oracle against the committed golden sets, every leaf of the catalogue from
    the newest set holding it. With one: the device kernels (``--impl cupy``) on the cases of
    every op they implement."""
    from qconform.golden import default_sets
    from qconform.impls import device_available
    from qconform.ops import CATALOGUE

    found, why = device_available()
    assert main(["run", "--coverage", "1", "--repeat-calls", "8"]) == 0
    out = capsys.readouterr().out
    assert "Op  " in out and "Verdict" in out and "Suite (ms)" in out and "max relL2" in out
    head = out.splitlines()[1]
    if found:
        from qconform.impls import load_impl

        assert out.startswith(f"GPU found ({why}): checking qconform's device kernels (--impl cupy)")
        assert "No GPU device found" not in out
        assert "| impl: cupy |" in head and head.endswith("cases: coverage 1")
        cupy_impl = load_impl("cupy")
        ops = [op for op in CATALOGUE.values() if cupy_impl.applies_to(op)]
    else:
        assert out.startswith(f"No GPU device found ({why}): checking the oracle against the committed golden sets.")
        assert "| impl: oracle |" in head and head.endswith(f"cases: golden {', '.join(map(str, default_sets()))}")
        ops = list(CATALOGUE.values())
    leaves = sum(len(op.leaves) for op in ops)
    assert f"Leaves: {leaves} (0 failed) | Cases:" in out and "(0 failed)\n" in out


def test_default_run_with_a_gpu_checks_the_device_kernels(monkeypatch, capsys) -> None:
    import qconform.cli
    from qconform.impls import OracleImpl

    asked = []
    monkeypatch.setattr(qconform.cli, "device_available", lambda: (True, "1 device(s)"))
    monkeypatch.setattr(
        qconform.cli, "load_impl", lambda spec, ops=None, contract=None: asked.append(spec) or OracleImpl()
    )
    monkeypatch.setattr(qconform.cli, "_device_line", lambda: "a stand-in GPU")
    assert main(["run", "--repeat-calls", "4", "--coverage", "1", "--ops", "q8_0_dequant"]) == 0
    assert asked == ["cupy"]
    out = capsys.readouterr().out
    assert out.startswith("GPU found (1 device(s)): checking qconform's device kernels (--impl cupy)")
    assert "device: a stand-in GPU" in out


def test_device_impls_need_a_device(capsys) -> None:
    """Without a GPU every device implementation is a usage error saying why; with one they load,
    and what is wrong with a user's kernel or library (here: it does not exist) is the error."""
    from qconform.impls import device_available

    found, why = device_available()
    if not found:
        for spec in ("cupy", "cupy:ref", "hip:k.hip:sym", "so:lib.so:sym"):
            assert main(["run", "--impl", spec]) == 2
            err = capsys.readouterr().err
            assert "needs a GPU and CuPy" in err and why in err
        return
    for spec, words in (
        ("cupy:nope", "cupy variants are"),
        ("hip:k.hip:sym", "no such kernel source 'k.hip'"),
        ("so:lib.so:sym", "no such shared library 'lib.so'"),
    ):
        assert main(["run", "--impl", spec, "--ops", "q8_0_quant"]) == 2
        err = capsys.readouterr().err
        assert words in err and "needs a GPU" not in err, err


def test_hypothesis_profiles(monkeypatch) -> None:
    from hypothesis import settings

    from qconform.properties.profiles import load_profile

    try:
        monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
        monkeypatch.setenv("CI", "true")
        assert load_profile() == "ci"
        assert settings().derandomize and settings().database is None and settings().deadline is None
        monkeypatch.delenv("CI")
        assert load_profile() == "dev"
        monkeypatch.setenv("HYPOTHESIS_PROFILE", "fuzz")
        assert load_profile() == "fuzz" and settings().max_examples >= 1000
    finally:
        load_profile()


@pytest.mark.parametrize("fmt", ["json", "junit", "markdown"])
def test_report_formats(fmt: str, tmp_path, capsys) -> None:
    out_file = tmp_path / f"report.{fmt}"
    assert (
        main(
            [
                "run",
                "--impl",
                "oracle",
                "--ops",
                "q8_0_quant",
                "--coverage",
                "1",
                "--format",
                fmt,
                "--out",
                str(out_file),
                "--repeat-calls",
                "4",
            ]
        )
        == 0
    )
    text = out_file.read_text()
    if fmt == "json":
        doc = json.loads(text)
        (row,) = doc["rows"]
        assert (row["op"], row["leaf"], row["verdict"], row["failed"]) == ("q8_0_quant", "Xfp32_Yq8_0", "PASS", 0)
    elif fmt == "junit":
        suite = ET.fromstring(text).find("testsuite")
        assert suite is not None and suite.get("failures") == "0" and int(suite.get("tests")) > 10
    else:
        assert "| Op | Leaf | Arch | Cases | Failed | Suite (ms) | max relL2 | Verdict |" in text


def test_junit_records_failures(in_tests_dir, tmp_path) -> None:
    out_file = tmp_path / "r.xml"
    assert (
        main(
            [
                "run",
                "--impl",
                "py:mutants:q8_k_no_clamp",
                "--coverage",
                "1",
                "--format",
                "junit",
                "--out",
                str(out_file),
            ]
        )
        == 1
    )
    suite = ET.fromstring(out_file.read_text()).find("testsuite")
    assert int(suite.get("failures")) >= 1
    assert any(tc.find("failure") is not None and "nan_payload" in tc.get("name") for tc in suite.iter("testcase"))


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--ops", "no_such_op", "--impl", "oracle"],
        ["run", "--impl", "py:no_such_module_xyz:fn"],
        ["run", "--impl", "nonsense"],
        ["run", "--impl", "oracle", "--case", "{}"],
        ["fuzz"],
        ["golden", "verify", "/nonexistent/dir"],
        ["run", "--impl", "oracle", "--repeat-calls", "0"],
        ["fuzz", "--op", "q8_0_quant", "--examples", "-3"],
        ["bogus"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys) -> None:
    assert main(argv) == 2


def test_list(capsys) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("q8_k_quant", "q8_0_quant", "q8_k_dequant", "q8_0_dequant", "oracle", "py:module:callable"):
        assert name in out


def test_python_dash_m() -> None:
    r = subprocess.run([sys.executable, "-m", "qconform", "list"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "q8_k_quant" in r.stdout


@pytest.mark.skipif(shutil.which("qconform") is None, reason="console script not installed")
def test_console_script() -> None:
    r = subprocess.run(["qconform", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("qconform ")


def test_bench_where_gpu_without_a_gpu_is_a_usage_error(capsys) -> None:
    """``qconform bench --where gpu`` on a host without a GPU says so in one line and exits 2
    (with a GPU it runs the device table: ci/device.sh's time part)."""
    from qconform.cli import main
    from qconform.impls import device_available

    if device_available()[0]:
        pytest.skip("a GPU is present: --where gpu runs the device benchmark")
    assert main(["bench", "--where", "gpu"]) == 2
    assert "--where gpu: no GPU device found" in capsys.readouterr().err

"""The merge gate cannot lie: every way an implementation can misbehave -- raise, hang, crash its
process, return garbage, write outside ``out`` -- gives a FAIL naming the case and exit status 1;
a run where nothing ran exits 2; every user error exits 2 with one line and no traceback; Ctrl-C
prints the partial table and exits 130; failures come with a replay command that replays them."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from qconform.cli import main
from qconform.golden import default_set_dir
from qconform.impls import CallableImpl
from qconform.ops import get_op
from qconform.oracles.ggml import quantize
from qconform.properties import Prepared, run_leaf

DROPINS = '''
import ctypes, os, signal, time
import numpy as np
import qconform
from qconform.oracles.ggml import quantize as oracle


def raises_on_q8_k(x, qtype, out=None):
    """Right for Q8_0, raises for Q8_K: a merge gate must not call that a skip."""
    if qtype == "Q8_K":
        raise qconform.ArgumentError("x: row too wide")
    return oracle(x, qtype, out=out)


def hangs_on_64_rows(x, qtype, out=None):
    if x.ndim == 2 and x.shape[0] == 64:
        time.sleep(3600)
    return oracle(x, qtype, out=out)


def crashes_on_64_rows(x, qtype, out=None):
    if x.ndim == 2 and x.shape[0] == 64:
        os.kill(os.getpid(), signal.SIGSEGV)
    return oracle(x, qtype, out=out)


def returns_garbage(x, qtype, out=None):
    return np.zeros(3, np.float64)


def writes_past_out(x, qtype, out=None):
    y = oracle(x, qtype, out=out)
    if out is not None:  # a kernel whose last store is rounded up to 16 bytes
        ctypes.memset(out.ctypes.data + out.nbytes, 0, 16)
    return y


def declines_everything(x, qtype, out=None):
    raise qconform.Declined("later")


def interrupted(x, qtype, out=None):
    raise KeyboardInterrupt


for f in (raises_on_q8_k, hangs_on_64_rows, crashes_on_64_rows, returns_garbage, writes_past_out,
          declines_everything, interrupted):
    f.__qconform_ops__ = ("q8_k_quant", "q8_0_quant") if f is raises_on_q8_k else ("q8_0_quant",)
'''


@pytest.fixture
def dropins(tmp_path: Path) -> Path:
    path = tmp_path / "misbehaving.py"
    path.write_text(textwrap.dedent(DROPINS))
    return path


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["run", "--coverage", "1", "--repeat-calls", "5", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "fn,extra,expect",
    [
        ("raises_on_q8_k", [], r"FAIL q8_k_quant Xfp32_Yq8_K matches_oracle case \S+: raised ArgumentError: x: row"),
        ("hangs_on_64_rows", ["--timeout", "5"], r"matches_oracle case uniform-64x256-s2: raised CallTimeout: no res"),
        ("crashes_on_64_rows", [], r"raised WorkerCrashed: the implementation ended its process .*SIGSEGV"),
        ("returns_garbage", [], r"matches_oracle case \S+: returned float64\[3\], expected uint8"),
        ("writes_past_out", [], r"writes_every_output case \S+: raised OutOfBoundsWrite: wrote 16 bytes past the end"),
    ],
)
def test_every_misbehaviour_is_a_failure_with_exit_1(dropins: Path, capsys, fn: str, extra: list, expect: str) -> None:
    # numba compiles the Q8_0 oracle into its on-disk cache here, so that a fresh worker's first call
    # loads it (0.7 s here) instead of compiling it (4 s here; more on a loaded CI machine, past the
    # --timeout below)
    quantize(np.zeros((2, 256), np.float32), "Q8_0")
    code, out, err = _run(capsys, "--impl", f"py:{dropins}:{fn}", *extra)
    assert code == 1, out + err
    assert re.search(expect, out), out
    assert "Traceback" not in out + err
    assert re.search(r"^  replay: qconform run --impl \S+ --case '\{", out, re.M), out
    if fn == "raises_on_q8_k":
        assert re.search(r"^q8_0_quant .* PASS$", out, re.M), "the other op still runs and passes"
    if fn == "hangs_on_64_rows":  # the replacement worker's start-up is not the next call's time
        fails = re.findall(r"^FAIL .*$", out, re.M)
        assert fails and all("64x" in line for line in fails), out
        assert "more failures" not in out, out


def test_out_of_bounds_writes_are_caught_in_process_too() -> None:
    import ctypes

    from qconform.oracles.ggml import quantize

    def writes_before_out(x, qtype, out=None):
        y = quantize(x, qtype, out=out)
        if out is not None:
            ctypes.memset(out.ctypes.data - 4, 0, 4)
        return y

    op = get_op("q8_0_quant")
    prepared = [Prepared.from_case(op, c) for c in op.cases("Xfp32_Yq8_0", 1)[:2]]
    r = run_leaf(CallableImpl("py:writes_before_out", writes_before_out, (op.name,)), op, "Xfp32_Yq8_0", prepared)
    details = [o.detail for o in r.failed if o.prop == "writes_every_output"]
    assert details and "4 bytes before the start of out (first at offset -4)" in details[0]


def test_a_run_where_nothing_ran_exits_2(dropins: Path, capsys) -> None:
    code, out, err = _run(capsys, "--impl", f"py:{dropins}:declines_everything")
    assert code == 2 and "declined every case" in err and "SKIP q8_0_quant" in out


def test_ctrl_c_prints_the_partial_table_and_exits_130(dropins: Path, capsys) -> None:
    code, out, err = _run(capsys, "--impl", f"py:{dropins}:interrupted", "--in-process")
    assert code == 130
    assert "interrupted after 0 of 1 leaves" in out and "Traceback" not in out + err


def test_replay_line_replays_exactly_the_failing_case(dropins: Path, capsys) -> None:
    code, out, _ = _run(capsys, "--impl", f"py:{dropins}:raises_on_q8_k", "--ops", "q8_k_quant", "--max-failures", "1")
    replay = re.search(r"^  replay: qconform run --impl (\S+) --case '(\{.*\})'$", out, re.M)
    assert code == 1 and replay
    case = json.loads(replay.group(2))
    code, out, _ = _run(capsys, "--impl", replay.group(1), "--case", replay.group(2))
    assert code == 1 and f"case {case['pattern']}-" in out and "x: row too wide" in out
    assert "replay" in _run(capsys, "--impl", replay.group(1), "--case", replay.group(2), "--format", "json")[1]


def test_json_and_junit_reports_carry_the_failing_case(dropins: Path, tmp_path: Path, capsys) -> None:
    report = tmp_path / "r.json"
    code, _, _ = _run(capsys, "--impl", f"py:{dropins}:returns_garbage", "--format", "json", "--out", str(report))
    assert code == 1
    failing = [o for row in json.loads(report.read_text())["rows"] for o in row["outcomes"] if o["ok"] is False]
    assert failing and all(o["case_json"] and o["replay"] for o in failing if o["case"])
    xml = tmp_path / "r.xml"
    _run(capsys, "--impl", f"py:{dropins}:returns_garbage", "--format", "junit", "--out", str(xml))
    assert "replay: qconform run" in xml.read_text() and '"op":"q8_0_quant"' in xml.read_text()


def test_max_failures_and_all_failures(dropins: Path, capsys) -> None:
    _, few, _ = _run(capsys, "--impl", f"py:{dropins}:returns_garbage", "--max-failures", "1")
    _, every, _ = _run(capsys, "--impl", f"py:{dropins}:returns_garbage", "--all-failures")
    assert few.count("\nFAIL ") == 1 and "--all-failures shows them" in few
    assert every.count("\nFAIL ") > 1 and "more failures" not in every


def test_shards_split_every_leaf_exactly_once(tmp_path: Path, capsys) -> None:
    from qconform.cli import build_parser, shard

    groups = [(get_op(n), lf.name, []) for n in ("matmul_nbits", "fake_quantize") for lf in get_op(n).leaves]
    parts = [shard(groups, f"{i}/3") for i in (1, 2, 3)]
    assert sorted(id(g) for p in parts for g in p) == sorted(id(g) for g in groups)
    assert all(parts), "three shards of 15 leaves are all non-empty"
    assert build_parser().parse_args(["run", "--shard", "1/3"]).shard == "1/3"


def test_report_merge_joins_shards(tmp_path: Path, capsys) -> None:
    files = []
    for i in (1, 2):
        f = tmp_path / f"s{i}.json"
        _run(capsys, "--impl", "oracle", "--ops", "q8_0_quant,q8_k_quant", "--shard", f"{i}/2", "--format", "json",
             "--out", str(f))
        files.append(str(f))
    assert main(["report", "merge", *files]) == 0
    merged = capsys.readouterr().out
    assert "q8_0_quant" in merged and "q8_k_quant" in merged and "Leaves: 2 (0 failed)" in merged


@pytest.mark.parametrize(
    "argv,message",
    [
        (["run", "--ops", "nope"], "op: unknown op 'nope'"),
        (["run", "--impl", "oracle", "--leaf", "nope"], "--leaf: no leaf 'nope'"),
        (["run", "--impl", "py:no_such_module_x:f"], "impl: cannot load"),
        (["run", "--out", "/no/such/folder/r.txt"], "--out: the folder"),
        (["run", "--shard", "0/2"], "--shard: must be i/n"),
        (["run", "--case", "not-a-case-id", "--ops", "q8_0_quant"], "--case: no case with id"),
        (["fuzz", "--op", "q8_k_quant", "--leaf", "nope"], "--leaf: q8_k_quant has no leaf 'nope'"),
        (["golden", "verify", "/no/such/set"], "has no MANIFEST.json"),
        (["abi", "nope"], "op: unknown op"),
        (["report", "merge", "/no/such/report.json"], "not a qconform JSON report"),
    ],
)
def test_usage_errors_exit_2_with_one_line(argv: list, message: str, capsys) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in out + err


@pytest.mark.parametrize("command", [["golden", "verify"], ["run", "--golden"]])
def test_a_corrupt_manifest_exits_2(command: list, tmp_path: Path, capsys) -> None:
    committed = default_set_dir()
    bad = tmp_path / "set"
    shutil.copytree(committed, bad)
    (bad / "MANIFEST.json").write_text("{ not json")
    assert main([*command, str(bad)]) == 2
    out, err = capsys.readouterr()
    assert "MANIFEST.json is unreadable" in err and "Traceback" not in out + err


def test_golden_generate_refuses_to_overwrite(tmp_path: Path, capsys) -> None:
    out = tmp_path / "g"
    assert main(["golden", "generate", "--out", str(out), "--ops", "q8_0_dequant"]) == 0
    before = (out / "MANIFEST.json").read_bytes()
    assert main(["golden", "generate", "--out", str(out), "--ops", "q8_0_dequant"]) == 2
    assert "--force" in capsys.readouterr().err and (out / "MANIFEST.json").read_bytes() == before
    assert main(["golden", "generate", "--out", str(out), "--ops", "q8_0_dequant", "--force"]) == 0


def test_every_command_and_option_has_help() -> None:
    import argparse

    from qconform.cli import build_parser

    def walk(parser: argparse.ArgumentParser):
        yield parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    yield from walk(sub)

    for parser in walk(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction) or action.dest in ("help", "version"):
                continue
            assert action.help, f"{parser.prog} {action.option_strings or action.dest} has no help"


def test_arrays_in_the_guard_regions_are_aligned() -> None:
    from qconform import guard

    buf, view = guard.guarded_empty((3, 5), np.float32)
    assert view.ctypes.data - buf.ctypes.data == guard.MARGIN and view.flags.c_contiguous
    assert guard.violation(buf, view, "out") is None
    buf[guard.MARGIN + view.nbytes + 2] = 0
    want = "wrote 1 bytes past the end of out (first at offset +2 after its last byte)"
    assert guard.violation(buf, view, "out") == want


def test_workers_split_the_run_and_print_one_table(dropins: Path, capsys) -> None:
    """--workers N: N processes, one shard each, one merged table in catalogue order, the same
    verdicts and exit status as one process."""
    ops = ["--ops", "q8_0_quant,q8_k_quant,fake_quantize"]
    code1, one, _ = _run(capsys, "--impl", "oracle", *ops, "--workers", "1")
    code3, three, _ = _run(capsys, "--impl", "oracle", *ops, "--workers", "3")
    row = r"^(\w+)\s+(\w+)\s+cpu\S+\s+(\d+)\s+(\d+)\s+\d+\s+\S+\s+(\w+)$"
    rows = [re.findall(row, out, re.M) for out in (one, three)]
    leaves = 2 + len(get_op("fake_quantize").leaves)
    assert code1 == code3 == 0 and sorted(rows[0]) == sorted(rows[1]) and len(rows[0]) == leaves
    assert "workers: 3" in three
    code, out, _ = _run(capsys, "--impl", f"py:{dropins}:returns_garbage", "--workers", "2")
    assert code == 1 and "FAIL q8_0_quant" in out and "replay: qconform run" in out
    assert main(["run", "--workers", "0"]) == 2 and "--workers" in capsys.readouterr().err


FAKE_SANITIZER = """#!/usr/bin/env bash
# a stand-in for NVIDIA compute-sanitizer: runs the command, writes a log like the tool's
log=""
while [ "$1" != "${1#-}" ]; do
  case "$1" in --log-file) log=$2; shift 2 ;; --tool | --print-limit) shift 2 ;; *) shift ;; esac
done
"$@"
status=$?
{
  echo "========= COMPUTE-SANITIZER"
  if [ -n "$FAKE_SANITIZER_ERRORS" ]; then
    echo "========= Invalid __global__ write of size 4 bytes"
    echo "=========     at qk_q8_0_quant+0x70"
    echo "========= ERROR SUMMARY: 2 errors"
  else
    echo "========= ERROR SUMMARY: 0 errors"
  fi
} >"$log"
exit $status
"""


@pytest.mark.parametrize("errors", [False, True])
def test_sanitize_reports_the_tools_findings_per_leaf(tmp_path: Path, monkeypatch, capsys, errors: bool) -> None:
    """--sanitize runs each leaf under compute-sanitizer (here a stand-in with the tool's log
    format) and turns its ERROR SUMMARY into the leaf's sanitizer outcome."""
    tool = tmp_path / "bin" / "compute-sanitizer"
    tool.parent.mkdir()
    tool.write_text(FAKE_SANITIZER)
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(sys.path))
    if errors:
        monkeypatch.setenv("FAKE_SANITIZER_ERRORS", "1")
    code, out, _ = _run(capsys, "--impl", "oracle", "--ops", "q8_0_quant", "--sanitize", "memcheck")
    if errors:
        assert code == 1
        assert "FAIL q8_0_quant Xfp32_Yq8_0 sanitizer: compute-sanitizer --tool memcheck: 2 errors: " in out
        assert "Invalid __global__ write of size 4 bytes" in out
    else:
        assert code == 0 and re.search(r"^q8_0_quant .* PASS$", out, re.M), out


def test_sanitize_without_the_tool_is_a_usage_error(monkeypatch, capsys) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert main(["run", "--impl", "oracle", "--sanitize", "memcheck"]) == 2
    assert "compute-sanitizer is not installed" in capsys.readouterr().err


def test_coverage_3_states_its_size_and_refuses_what_does_not_fit(monkeypatch, capsys) -> None:
    """Before a coverage-3 run: the case count and the largest case's inputs; on a machine whose
    memory cannot hold that case, a usage error before anything runs."""
    real = os.sysconf
    monkeypatch.setattr(os, "sysconf", lambda name: 1 if name == "SC_PHYS_PAGES" else real(name))
    assert main(["run", "--impl", "oracle", "--coverage", "3", "--ops", "q8_0_dequant"]) == 2
    err = capsys.readouterr().err
    assert re.search(r"coverage 3: \d+ cases over 1 leaves; the largest, q8_0_dequant Xq8_0_Yfp32 case \S+", err)
    assert "coverage 3 needs about" in err and "run it on a larger machine" in err


@pytest.mark.parametrize(
    "argv", [["runn"], ["run", "--tpyo"], ["run", "--coverage", "7"], ["golden"], ["run", "--repeat-calls", "0"]]
)
def test_mistyped_commands_and_flags_exit_2_with_one_line(argv: list, capsys) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert err.startswith("qconform: error: ") and len(err.strip().splitlines()) == 1 and "--help)" in err

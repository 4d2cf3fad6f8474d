"""The README's example sessions are what qconform prints: each ``$ qconform ...`` block of the
README is run (in a copy of examples/, where ``py:my_kernels:...`` resolves) and its output
compared with the README's, after masking what changes from run to run (wall times, the
machine's paths). ``python tests/test_readme.py --update`` rewrites the blocks from a fresh run.
Skipped: ``qconform bench`` (a timing); a block that shows ``...`` is compared up to it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import qconform

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
BLOCK = re.compile(r"```\n(\$ qconform .*?)```", re.S)
TIMED = ("qconform bench",)


def sessions(text: str) -> list[tuple[str, list[tuple[str, list[str]]]]]:
    """(block text, [(command, expected output lines)]) for every README session block."""
    out = []
    for m in BLOCK.finditer(text):
        steps: list[tuple[str, list[str]]] = []
        for line in m.group(1).splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            elif steps:
                steps[-1][1].append(line)
        out.append((m.group(1), steps))
    return out


def normalize(lines: list[str], cwd: Path) -> list[str]:
    """Mask the leaf wall time (Suite (ms)), the machine's paths and the column alignment."""
    norm = []
    for line in lines:
        line = line.replace(str(cwd), ".")
        line = re.sub(r"\S*/(?:golden|_golden_sets)/v\d+", ".../golden/vN", line)  # repo or installed copy
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) == 8 and cells[-1] in ("PASS", "FAIL", "SKIP"):
            cells[5] = "N"
        norm.append(" ".join(cells))
    return norm


def run_session(steps: list[tuple[str, list[str]]], cwd: Path) -> list[tuple[str, list[str]]]:
    """Each command's actual output lines (``echo $?``: the previous command's exit status)."""
    # the qconform this process imported (the repo's src/ in an editable install, the installed copy
    # in CI), so the session runs the same code and shares its numba cache (ci/test.sh fills it)
    here = Path(qconform.__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": f"{here}{os.pathsep}{cwd}", "COLUMNS": "100"}
    got, status = [], 0
    for command, _ in steps:
        if command == "echo $?":
            got.append((command, [str(status)]))
            continue
        argv = [sys.executable, "-m", "qconform", *command.split()[1:]]
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        status = done.returncode
        got.append((command, done.stdout.rstrip("\n").splitlines()))
    return got


def _masked(line: str, cwd: Path) -> str:
    """A line as the README shows it: no machine paths."""
    return re.sub(r"\S*/golden/(v\d+)", r".../golden/\1", line.replace(str(cwd), "."))


def _workdir(tmp: Path) -> Path:
    work = tmp / "examples"
    shutil.copytree(REPO / "examples", work, ignore=shutil.ignore_patterns("__pycache__"))
    return work


SESSIONS = [s for s in sessions(README.read_text()) if not s[1][0][0].startswith(TIMED)]


@pytest.mark.parametrize("block,steps", SESSIONS, ids=[s[1][0][0][:60] for s in SESSIONS])
def test_readme_session_is_what_qconform_prints(block: str, steps: list, tmp_path: Path) -> None:
    work = _workdir(tmp_path)
    for (command, want), (_, got) in zip(steps, run_session(steps, work), strict=True):
        if "..." in want:
            cut = want.index("...")
            want, got = want[:cut], got[:cut]
        assert normalize(got, work) == normalize(want, work), (
            f"README.md's session `{command}` no longer matches what qconform prints; "
            "refresh it with: python tests/test_readme.py --update"
        )


def update() -> None:
    """Rewrite every session block of the README from a fresh run (kept: blocks with ``...``)."""
    import tempfile

    text = README.read_text()
    for block, steps in SESSIONS:
        if any("..." in want for _, want in steps):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            work = _workdir(Path(tmp))
            got = run_session(steps, work)
            body = "".join(f"$ {c}\n" + "".join(_masked(line, work) + "\n" for line in out) for c, out in got)
        text = text.replace(block, body)
    README.write_text(text)


if __name__ == "__main__" and sys.argv[1:] == ["--update"]:
    update()

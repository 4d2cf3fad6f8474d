"""Golden vectors: the committed set verifies, a changed byte is named by file and tensor, drift is
summarised byte by byte, and generation is reproducible."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO
from safetensors import safe_open

from qconform.cli import main
from qconform.formats.ggml import FORMATS
from qconform.golden import default_set_dir, read_manifest, verify_set
from qconform.golden.store import decode_leaf, layout
from qconform.golden.verify import locate_changes
from qconform.impls import load_impl
from qconform.ops.ggml.q8_quant import leaf_qtype


def committed_sets() -> list[Path]:
    """Every committed golden set, ``golden/v<N>`` with a MANIFEST.json, oldest first."""
    sets = [d for d in (REPO / "golden").glob("v*") if d.name[1:].isdigit() and (d / "MANIFEST.json").is_file()]
    return sorted(sets, key=lambda d: int(d.name[1:]))


SETS = committed_sets()
COMMITTED = default_set_dir()  # the newest set: what ``qconform run`` checks without a GPU


def test_the_default_set_is_the_newest_committed_one() -> None:
    assert SETS, "no committed golden set under golden/"
    assert COMMITTED is not None and COMMITTED.name == SETS[-1].name
    for s in SETS:
        assert default_set_dir(s.name).name == s.name


@pytest.mark.parametrize("set_dir", SETS, ids=lambda d: d.name)
def test_committed_set_verifies_and_is_small(set_dir: Path) -> None:
    """Every committed set (released sets are never rewritten) still verifies: hashes, and the
    oracle reproduces every stored output."""
    report = verify_set(set_dir)
    assert report.ok, report.findings
    manifest = read_manifest(set_dir)
    assert report.files == len(manifest["files"]) >= 4
    assert report.cases == sum(len(f["cases"]) for f in manifest["files"]) > 60
    sizes = [p.stat().st_size for p in set_dir.rglob("*.safetensors")]
    # small enough to commit and to read in a unit test (v3: 34 leaves at coverage 1, 4.6 MB; v4: 71
    # leaves, 5.1 MB); the manifest holds a hash per tensor: 0.5 MB for v4's 71 files
    assert max(sizes) < 2**19 and (set_dir / "MANIFEST.json").stat().st_size < 2**20
    assert sum(sizes) + (set_dir / "MANIFEST.json").stat().st_size < 6 * 2**20
    for key in ("qconform_version", "oracle_source_sha256", "generator", "schema_version"):
        assert key in manifest
    assert {"python", "numpy", "numba", "command"} <= set(manifest["generator"])


@pytest.mark.parametrize("set_dir", SETS, ids=lambda d: d.name)
def test_files_carry_cases_and_params_in_metadata(set_dir: Path) -> None:
    for entry in read_manifest(set_dir)["files"]:
        leaf = decode_leaf((set_dir / entry["path"]).read_bytes())
        assert (leaf.op.name, leaf.leaf) == (entry["op"], entry["leaf"])
        assert [p.case.id for p in leaf.prepared] == entry["cases"]
        assert [p.case.seed for p in leaf.prepared] == entry["seeds"]
        meta = safe_open(set_dir / entry["path"], framework="np").metadata()
        logical = json.loads(meta["logical_dtypes"])
        for p in leaf.prepared:
            assert f"{p.case.id}/{leaf.op.output_name}" in logical
            if leaf.op.family == "ggml":
                assert p.params["qtype"] == leaf_qtype(leaf.leaf) and p.params["qtype"] in FORMATS
                assert f"ggml {p.params['qtype']} blocks (raw bytes)" in logical.values()


def _positions(data: bytes, rng: np.random.Generator) -> list[int]:
    header_end, spans = layout(data)
    pos = list(range(0, header_end, 7))
    for a, b in spans.values():
        pos += [a, (a + b) // 2, b - 1]
    pos += rng.integers(header_end, len(data), size=300).tolist()
    return pos


def test_flipping_any_byte_is_named_by_file_and_tensor() -> None:
    rng = np.random.default_rng(0)
    for entry in read_manifest(COMMITTED)["files"]:
        data = bytearray((COMMITTED / entry["path"]).read_bytes())
        _, spans = layout(bytes(data))
        for pos in _positions(bytes(data), rng):
            data[pos] ^= 0xFF
            changes = locate_changes(bytes(data), entry)
            data[pos] ^= 0xFF
            owner = [name for name, (a, b) in spans.items() if a <= pos < b]
            if owner:
                assert changes == [f"tensor '{owner[0]}' (bytes {spans[owner[0]][0]}..{spans[owner[0]][1]})"], (
                    entry["path"],
                    pos,
                )
            else:
                assert changes == ["the safetensors header (names, dtypes, offsets or metadata)"], (entry["path"], pos)


def test_verify_reports_a_flipped_byte_end_to_end(tmp_path, capsys) -> None:
    copy = tmp_path / COMMITTED.name
    shutil.copytree(COMMITTED, copy)
    entry = read_manifest(copy)["files"][0]
    path = copy / entry["path"]
    data = bytearray(path.read_bytes())
    name, t = next(iter(entry["tensors"].items()))
    data[t["offsets"][0] + 1] ^= 0x01
    path.write_bytes(bytes(data))
    assert main(["golden", "verify", str(copy)]) == 1
    out = capsys.readouterr().out
    assert f"CORRUPT {entry['path']}: changed: tensor '{name}'" in out
    assert main(["run", "--golden", str(copy)]) == 1
    assert f"GOLDEN CORRUPT {entry['path']}: changed: tensor '{name}'" in capsys.readouterr().err


def _newest_holding(path: str) -> Path:
    return next(d for d in reversed(SETS) if (d / path).is_file())


def test_drift_has_a_byte_level_summary(in_tests_dir) -> None:
    holding = _newest_holding("q8_k_quant/Xfp32_Yq8_K.safetensors")
    report = verify_set(holding, load_impl("py:mutants:q8_k_ties_away"))
    assert not report.ok and report.cases > 0
    (finding,) = [f for f in report.findings if "ties-" in f.detail]
    assert finding.kind == "drift" and finding.path == "q8_k_quant/Xfp32_Yq8_K.safetensors"
    assert "/y'" in finding.detail and "bytes differ" in finding.detail and "by field: bsums=" in finding.detail


def test_missing_and_unlisted_files(tmp_path) -> None:
    copy = tmp_path / COMMITTED.name
    shutil.copytree(COMMITTED, copy)
    first = read_manifest(copy)["files"][0]["path"]
    (copy / first).rename(copy / "stray.safetensors")
    kinds = {(f.kind, f.path) for f in verify_set(copy).findings}
    assert kinds == {("missing", first), ("unlisted", "stray.safetensors")}


def test_generate_is_reproducible_and_verifies(tmp_path, capsys) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        assert main(["golden", "generate", "--out", str(d), "--ops", "q8_0_quant,q8_k_dequant"]) == 0
    for entry in read_manifest(a)["files"]:
        assert (a / entry["path"]).read_bytes() == (b / entry["path"]).read_bytes()
    assert main(["golden", "verify", str(a)]) == 0
    assert "0 problems: OK" in capsys.readouterr().out
    assert json.loads((a / "MANIFEST.json").read_text())["coverage"] == 1


def test_generate_takes_only_the_named_leaves(tmp_path, capsys) -> None:
    """``--leaf`` (repeated) keeps those leaves of the selected ops and records them in the command;
    a leaf the ops do not have is a usage error naming it, and nothing is written."""
    out = tmp_path / "s"
    leaves = ["Xfp32_Qfp8e4m3_Yfp32", "Xfp16_Qfp8e5m2_Yfp16"]
    args = ["golden", "generate", "--out", str(out), "--ops", "fake_quantize"]
    assert main([*args, *(a for lf in leaves for a in ("--leaf", lf))]) == 0
    manifest = read_manifest(out)
    assert [f["leaf"] for f in manifest["files"]] == ["Xfp32_Qfp8e4m3_Yfp32", "Xfp16_Qfp8e5m2_Yfp16"]
    assert manifest["generator"]["command"].endswith(" --leaf Xfp32_Qfp8e4m3_Yfp32 --leaf Xfp16_Qfp8e5m2_Yfp16")
    capsys.readouterr()
    assert main(["golden", "generate", "--out", str(tmp_path / "t"), "--ops", "fake_quantize", "--leaf", "Xq"]) == 2
    assert "--leaf: no leaf Xq" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("impl", ["oracle", "oracle-numpy"])
def test_run_against_the_golden_set(impl: str, capsys) -> None:
    assert main(["run", "--impl", impl, "--golden", str(COMMITTED), "--repeat-calls", "8"]) == 0
    leaves = len(read_manifest(COMMITTED)["files"])
    assert f"Leaves: {leaves} (0 failed)" in capsys.readouterr().out

"""Per-case declines: an implementation may decline a case (``qconform.Declined``, any
``NotImplementedError``); the case is counted and shown, never passed; a leaf where nothing ran is
not a PASS; a decline never hides a wrong answer on the cases that ran."""

from __future__ import annotations

import numpy as np

import qconform
from qconform.cli import main
from qconform.impls import CallableImpl
from qconform.ops import get_op
from qconform.oracles.ort import matmul_nbits
from qconform.properties import Prepared, run_leaf
from qconform.report import render

OP = get_op("matmul_nbits")
LEAF = "Xfp32_Wu4_Yfp32"


def only_single_rows(A, *args, **kwargs):
    """The oracle for one activation row; declines the others (a decode-only kernel)."""
    if A.shape[0] != 1:
        raise qconform.Declined("this kernel is decode-only (M == 1)")
    return matmul_nbits(A, *args, **kwargs)


def declines_everything(A, *args, **kwargs):
    raise NotImplementedError("nothing implemented yet")


def declines_some_wrong_others(A, *args, out=None, **kwargs):
    """A mutant: declines M > 1 and adds one ulp to every output it computes."""
    if A.shape[0] != 1:
        raise qconform.Declined("decode-only")
    y = matmul_nbits(A, *args, **kwargs)
    y = np.nextafter(y, np.inf).astype(y.dtype) * 1.001
    if out is not None:
        out[...] = y
        return out
    return y


def _run(fn):
    impl = CallableImpl(f"py:{fn.__name__}", fn, ("matmul_nbits",))
    prepared = [Prepared.from_case(OP, c) for c in OP.cases(LEAF, 2)]
    return prepared, run_leaf(impl, OP, LEAF, prepared)


def test_declined_cases_are_counted_not_passed() -> None:
    prepared, r = _run(only_single_rows)
    singles = sum(p.inputs["A"].shape[0] == 1 for p in prepared)
    assert 0 < singles < len(prepared)
    assert r.verdict == "PASS" and r.ran == singles and len(r.declined) == len(prepared) - singles
    assert all(o.ok is None and "decode-only" in o.detail for o in r.declined)
    text = render([r], "text", {})
    assert f"{len(prepared) - singles} declined" in text
    assert f"DECLINED matmul_nbits {LEAF}: ran {singles}/{len(prepared)}" in text


def test_a_leaf_where_nothing_ran_is_not_a_pass() -> None:
    prepared, r = _run(declines_everything)
    assert r.verdict == "SKIP" and r.ran == 0 and len(r.declined) == len(prepared)
    assert "declined every case" in r.skipped


def test_a_decline_does_not_hide_a_wrong_answer() -> None:
    _, r = _run(declines_some_wrong_others)
    assert r.verdict == "FAIL"
    assert {o.prop for o in r.failed} >= {"matches_oracle"}


def test_run_exit_status_when_every_case_is_declined(tmp_path, capsys) -> None:
    mod = tmp_path / "dec.py"
    mod.write_text("def matmul_nbits(*a, **k):\n    raise NotImplementedError('later')\n")
    code = main(["run", "--impl", f"py:{mod}:matmul_nbits", "--ops", "matmul_nbits", "--leaf", LEAF, "--coverage", "1"])
    assert code != 0
    assert "declined every case" in capsys.readouterr().out


def test_a_py_callables_declared_predicate_declines_per_case() -> None:
    """``__qconform_requires__`` over the op's ABI scalars, like hip:/so: ``requires=``: the cases
    where it is false are declined and counted; the bad calls still reach the callable."""
    from qconform.properties.checks import matches_oracle, rejects_bad_arguments

    op = get_op("matmul_nbits")

    def gated(*args, **kwargs):
        return matmul_nbits(*args, **kwargs)

    gated.__qconform_requires__ = "bits == 4 and K % 128 == 0 and M <= 8"
    impl = CallableImpl("gated", gated, ("matmul_nbits",))
    outcomes = [matches_oracle(impl, op, Prepared.from_case(op, c, impl)) for c in op.cases("Xfp16_Wu4_Yfp16", 2)]
    ran = [o for o in outcomes if o.ok is not None]
    declined = [o for o in outcomes if o.ok is None]
    assert ran and declined and all(o.ok for o in ran)
    assert all("requires bits == 4 and K % 128 == 0" in o.detail for o in declined)
    assert rejects_bad_arguments(impl, op, "Xfp16_Wu4_Yfp16").ok

"""Compare an implementation's output with the oracle's, as the op's Check says."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from qconform.contracts import STRICT, Contract
from qconform.ops import OpSpec
from qconform.properties.bounds import check_bound


@dataclass(frozen=True)
class Comparison:
    ok: bool
    detail: str
    rel_l2: float  # of the decoded values against the oracle's; 0.0 when equal, nan when not computable


def same_elements(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Elementwise 'same result': identical bits, or NaN in both places (payloads may differ)."""
    if want.dtype.kind == "f":
        bits = f"u{want.dtype.itemsize}"
        same = got.view(bits) == want.view(bits)
        return same | (np.isnan(got) & np.isnan(want))
    return got == want


def rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    """||got - want|| / ||want|| in float64 over positions finite in both; nan if NaN positions differ."""
    g = np.asarray(got, np.float64).ravel()
    w = np.asarray(want, np.float64).ravel()
    if not np.array_equal(np.isnan(g), np.isnan(w)):
        return math.nan
    fin = np.isfinite(g) & np.isfinite(w)
    if not np.array_equal(g[~fin], w[~fin]):
        return math.inf
    num = float(np.linalg.norm(g[fin] - w[fin]))
    den = float(np.linalg.norm(w[fin]))
    return 0.0 if num == 0.0 else (num / den if den > 0 else math.inf)


def _fmt(v: Any, dtype: np.dtype) -> str:
    if dtype.kind == "f":
        bits = np.array([v], dtype).view(f"u{dtype.itemsize}")[0]
        return f"{float(v)!r} (0x{int(bits):0{dtype.itemsize * 2}x})"
    if dtype == np.uint8:
        return f"0x{int(v):02x}"
    return repr(v)


def compare(
    op: OpSpec,
    params: dict[str, Any],
    got: Any,
    want: np.ndarray,
    expected: Any = None,
    contract: Contract = STRICT,
) -> Comparison:
    """Check ``got`` against the oracle output ``want``; the detail names the first difference.
    ``expected`` (a ``qconform.properties.expect.Expected``): its error model bounds a ``bound``
    op's elements under ``contract`` (any op's reading that carries one: matmul_bt_quant under
    ``order=any``); its mask leaves elements unchecked. An op with several
    outputs: ``want`` is a tuple, each output checked (``_compare_outputs``)."""
    if isinstance(want, tuple):
        return _compare_outputs(op, params, got, want, expected, contract)
    if not isinstance(got, np.ndarray):
        return Comparison(False, f"returned {type(got).__name__}, not a numpy array", math.nan)
    if got.dtype != want.dtype or got.shape != want.shape:
        return Comparison(
            False, f"returned {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}", math.nan
        )
    try:
        err = rel_l2(op.decode(got, params), op.decode(want, params))
    except Exception:  # undecodable output: relL2 is not defined
        err = math.nan
    model = getattr(expected, "model", None)
    if op.check.kind == "bound" or model is not None:  # an exact op's reading under a relaxed order bounds too
        if model is None:
            raise AssertionError(f"catalogue bug: {op.name} checks bounds but gave no error model")
        mask = getattr(expected, "mask", None)
        fmt = lambda v: _fmt(v, want.dtype)  # noqa: E731
        b = check_bound(got, want, model, contract, getattr(expected, "ftz", False), fmt, mask)
        return Comparison(b.ok, b.detail, err)
    same = same_elements(got, want)
    mask, accept = getattr(expected, "mask", None), getattr(expected, "accept", None)
    if mask is not None:
        same = same | mask
    if accept is not None and not same.all():
        same = same | accept(got)
    if op.check.kind == "exact":
        if same.all():
            return Comparison(True, "exact", 0.0)
        bad = np.argwhere(~same)
        first = tuple(int(i) for i in bad[0])
        where = op.locate(params, first) if op.locate else str(first)
        unit = "bytes" if want.dtype == np.uint8 else "values"
        return Comparison(
            False,
            f"{len(bad)} of {want.size} {unit} differ; first at {list(first)} ({where}): "
            f"got {_fmt(got[first], want.dtype)}, want {_fmt(want[first], want.dtype)}",
            err,
        )
    tol = op.check.tol_for(params) if op.check.tol_for else op.check.tol
    if op.check.kind == "steps":
        diff = np.abs(got.astype(np.int64) - want.astype(np.int64))
        n, worst = int((diff > 0).sum()), int(diff.max(initial=0))
        detail = f"{n} of {want.size} elements differ, by at most {worst} step(s) (allowed {tol:g})"
        return Comparison(worst <= tol, detail if n else "exact", err)
    if not math.isnan(err) and err <= tol:
        return Comparison(True, f"relL2 {err:.3g} <= {tol:.3g}", err)
    return Comparison(False, f"relL2 {err:.3g} > {tol:.3g} ({op.check.reason}){_largest(op, params, got, want)}", err)


def _compare_outputs(
    op: OpSpec, params: dict[str, Any], got: Any, want: tuple, expected: Any, contract: Contract
) -> Comparison:
    """Each output of a multi-output op: the first as ``op.check`` says, every other exactly, each
    on the elements its mask (``expected.mask``, a tuple) leaves checked. relL2: the first's."""
    names = op.output_names
    if not isinstance(got, (tuple, list)) or len(got) != len(want):
        what = f"{len(got)} outputs" if isinstance(got, (tuple, list)) else type(got).__name__
        return Comparison(False, f"returned {what}, expected a tuple of {len(want)}: {', '.join(names)}", math.nan)
    masks = getattr(expected, "mask", None) or (None,) * len(want)
    first = compare(op, params, got[0], want[0], replace(expected, mask=masks[0]) if expected else None, contract)
    failed = [] if first.ok else [f"{names[0]}: {first.detail}"]
    for name, g, w, mask in zip(names[1:], got[1:], want[1:], masks[1:], strict=True):
        detail = _exact_output(g, w, mask)
        if detail:
            failed.append(f"{name}: {detail}")
    if failed:
        return Comparison(False, "; ".join(failed), first.rel_l2)
    return Comparison(True, f"{first.detail}; {', '.join(names[1:])} exact", first.rel_l2)


def _exact_output(got: Any, want: np.ndarray, mask: np.ndarray | None) -> str:
    """'' when ``got`` equals ``want`` wherever ``mask`` (True: unchecked) allows, else what differs."""
    if not isinstance(got, np.ndarray) or got.dtype != want.dtype or got.shape != want.shape:
        what = f"{got.dtype}{list(got.shape)}" if isinstance(got, np.ndarray) else type(got).__name__
        return f"returned {what}, expected {want.dtype}{list(want.shape)}"
    same = same_elements(got, want) | (False if mask is None else mask)
    if same.all():
        return ""
    bad = np.argwhere(~same)
    first = tuple(int(i) for i in bad[0])
    checked = want.size if mask is None else int((~mask).sum())
    return (
        f"{len(bad)} of {checked} checked values differ; first at {list(first)}: "
        f"got {_fmt(got[first], want.dtype)}, want {_fmt(want[first], want.dtype)}"
    )


def _largest(op: OpSpec, params: dict[str, Any], got: np.ndarray, want: np.ndarray) -> str:
    """'; largest difference at [i, j] (where): got X, want Y' over the decoded values (a NaN or
    infinity in one place only counts as the largest), '' where no element differs or the
    decoded outputs do not line up."""
    try:
        g = np.asarray(op.decode(got, params), np.float64)
        w = np.asarray(op.decode(want, params), np.float64)
    except Exception:
        return ""
    if g.shape != w.shape or g.size == 0:
        return ""
    with np.errstate(invalid="ignore"):
        diff = np.abs(g - w)
    diff = np.where((np.isnan(g) & np.isnan(w)) | (g == w), 0.0, np.where(np.isnan(diff), np.inf, diff))
    at = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), diff.shape))
    if diff[at] == 0.0:
        return ""
    raw = g.shape == got.shape  # decoded positions are the output's own
    where = f" ({op.locate(params, at)})" if raw and op.locate else ""
    gv, wv = (_fmt(got[at], got.dtype), _fmt(want[at], want.dtype)) if raw else (repr(g[at]), repr(w[at]))
    return f"; largest difference at {list(at)}{where}: got {gv}, want {wv}"

"""Per-element error bounds for sum-of-products ops, derived from the data and the contract.

For an output y = sum_i t_i (t_i = a_i * w_i, plus a bias term) the float64 reference ``ref``
is the reference's own arithmetic done exactly, and the magnitudes ``mag`` = sum_i |t_i| and
``store_mag`` = sum_i |a_i| (|z_i s_i| + 2 |w_i|) (what rounding the stored weights and the
converted activations can move; the op's error model says) come from the same inputs. Element j passes when

    |got_j - ref_j| <= u_out |ref_j| + (1 + u_out) (e_acc mag_j + e_store store_mag_j) + tiny_j

u_out: one rounding of the output type. e_acc: fp32 accumulation of n terms in any order --
probabilistic lambda*sqrt(n)*u (Higham & Mary, SIAM J. Sci. Comput. 41(5) 2019, Theorem 3.1:
holds with probability at least 1 - 2n exp(-lambda^2 (1-u)^2 / 2) under their model of independent
rounding errors; lambda = 8), or the worst case gamma_n = n u / (1 - n u) (Higham, Accuracy and
Stability of Numerical Algorithms, 2002, eq. 3.5). fp16/bf16 accumulation: chains of L products
in that type (gamma_L, worst case) combined in fp32. e_store: the unit roundoff of the declared
storage type. tiny: half the output's subnormal spacing, n fp32 underflows, and with flush-to-zero
n * 2^-126.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from qconform.contracts import LAMBDA, UNIT_ROUNDOFF, Contract, accumulation_error, gamma  # noqa: F401
from qconform.formats.bf16 import bf16_bits_to_fp32
from qconform.readings import ErrorModel

F32_TINY = 2.0**-126
F32_SUBNORMAL = 2.0**-149
BF16_BITS = np.dtype(np.uint16)  # a bfloat16 output travels as its uint16 bit patterns (qconform.formats.bf16)
OUT_HALF_SPACING = {np.dtype(np.float16): 2.0**-25, np.dtype(np.float32): 2.0**-150, BF16_BITS: 2.0**-134}


@dataclass(frozen=True)
class Budget:
    u_out: float
    e_acc: float
    e_store: float
    tiny: float

    def bound(self, m: ErrorModel) -> np.ndarray:
        """NaN where a magnitude is infinite (0 * inf): only where the reference is non-finite too,
        and those elements are checked for the oracle's non-finite value, not against a bound."""
        with np.errstate(invalid="ignore"):
            rounded = self.e_acc * m.mag + self.e_store * m.store_mag + (0.0 if m.slack is None else m.slack)
        return self.u_out * np.abs(m.ref) + (1 + self.u_out) * rounded + self.tiny

    def describe(self, m: ErrorModel, contract: Contract) -> str:
        acc = f"{contract.accumulate} accumulation of {m.n_terms} terms"
        if contract.accumulate != "fp32":
            acc += f" (chains of {contract.chain_length(m.n_terms, m.chain)})"
        elif contract.bound == "worst-case":
            acc += " (worst case)"
        parts = [f"{m.out_dtype} output rounding {self.u_out:.3g}*|ref|"]
        if np.any(m.mag):  # an op whose slack propagates the contract itself has no magnitudes here
            parts.append(f"{acc} {self.e_acc:.3g}*sum|a||w|")
        if self.e_store and np.any(m.store_mag):
            parts.append(f"{contract.storage} storage {self.e_store:.3g}*sum|a|(|zs|+2|w|)")
        if m.slack is not None:
            label = m.slack_label or f"division within {contract.division} ulp (activation codes beside a tie may step)"
            parts.append(label)
        return " + ".join(parts)


def budget(m: ErrorModel, contract: Contract, ftz: bool) -> Budget:
    e_store = 0.0 if contract.storage == "exact" else UNIT_ROUNDOFF[contract.storage]
    tiny = OUT_HALF_SPACING.get(m.out_dtype, 0.0) + m.n_terms * (F32_TINY if ftz else F32_SUBNORMAL)
    e_acc = accumulation_error(m.n_terms, m.chain, contract)
    return Budget(UNIT_ROUNDOFF[_out_type(m.out_dtype)], e_acc, e_store, tiny)


def _out_type(dtype: np.dtype) -> str:
    return {np.dtype(np.float16): "fp16", np.dtype(np.float32): "fp32", BF16_BITS: "bf16"}[np.dtype(dtype)]


def _values(a: np.ndarray) -> np.ndarray:
    """An output as float64 values (bfloat16 bit patterns widened)."""
    return (bf16_bits_to_fp32(a) if a.dtype == BF16_BITS else a).astype(np.float64)


@dataclass(frozen=True)
class BoundCheck:
    ok: bool
    detail: str
    worst: float  # largest |got - ref| / bound (0 when every element is equal)


# relaxations tried, in order, to name the one that would explain a failure
HINTS = (
    ("storage=fp16", {"storage": "fp16"}),
    ("accumulate=fp16", {"accumulate": "fp16"}),
    ("storage=fp16,accumulate=fp16", {"storage": "fp16", "accumulate": "fp16"}),
    ("storage=bf16", {"storage": "bf16"}),
    ("accumulate=bf16", {"accumulate": "bf16"}),
    ("storage=bf16,accumulate=bf16", {"storage": "bf16", "accumulate": "bf16"}),
)


def check_bound(
    got: np.ndarray,
    want: np.ndarray,
    m: ErrorModel,
    contract: Contract,
    ftz: bool,
    fmt: Callable[..., str],
    mask: np.ndarray | None = None,
) -> BoundCheck:
    """Every finite element within its bound; non-finite ones where the oracle has them (``want``:
    the oracle's output under this reading); ``mask``: elements left unchecked. The failure names
    the worst element, its bound and the rule, and the declarable relaxation that would explain
    it, if one does."""
    b = budget(m, contract, ftz)
    if not math.isfinite(b.e_acc):  # n u >= 1: every output would pass; that is no check
        length = contract.chain_length(m.n_terms, m.chain)
        return BoundCheck(
            False,
            f"contract {contract}: no error bound holds for {contract.accumulate} chains of {length} products "
            "(length * unit roundoff >= 1): declare a shorter chain",
            math.inf,
        )
    g = _values(got)
    w = _values(want)
    finite = np.isfinite(w)
    with np.errstate(invalid="ignore"):  # non-finite outputs where the oracle has them, the same ones
        same = (g == w) | (np.isnan(g) & np.isnan(w))
    checked = np.ones(g.shape, bool) if mask is None else ~mask
    bad = np.argwhere(checked & ((np.isfinite(g) != finite) | (~finite & ~same)))
    if len(bad):
        at = tuple(int(i) for i in bad[0])
        detail = f"{len(bad)} non-finite outputs differ; first at {list(at)}: got {fmt(got[at])}, want {fmt(want[at])}"
        return BoundCheck(False, detail, math.inf)
    bound = b.bound(m)
    with np.errstate(invalid="ignore"):
        diff = np.where(finite & checked, np.abs(g - m.ref), 0.0)
    ratio = np.where(diff > 0, diff / np.where(bound > 0, bound, F32_SUBNORMAL), 0.0)
    worst = float(ratio.max(initial=0.0))
    if worst <= 1.0:
        return BoundCheck(True, f"every element within its bound (worst {worst:.2g} of it)", worst)
    at = tuple(int(i) for i in np.unravel_index(int(np.argmax(ratio)), ratio.shape))
    n_bad = int((ratio > 1.0).sum())
    where = f" ({m.diagnose(at, float(g[at] - m.ref[at]))})" if m.diagnose else ""
    detail = (
        f"{n_bad} of {got.size} elements exceed their bound ({m.path}); worst at {list(at)}{where}: "
        f"got {fmt(got[at])}, want {fmt(want[at])}, float64 reference {float(m.ref[at])!r}; "
        f"|got - ref| {diff[at]:.3g} > bound {bound[at]:.3g} = {b.describe(m, contract)} ({worst:.3g}x); "
        f"rule failed: contract {contract}"
    )
    if got.size >= ISOLATED_MIN and n_bad <= ISOLATED * got.size:
        return BoundCheck(False, f"{detail}; isolated ({n_bad} element(s)): a rounding habit would show on many", worst)
    return BoundCheck(False, detail + _hint(g, m, contract, ftz, finite & checked), worst)


ISOLATED = 0.01  # at most this share of elements out of bound: no relaxation is hinted
ISOLATED_MIN = 100  # ... in an output of at least this many elements


def _hint(g: np.ndarray, m: ErrorModel, contract: Contract, ftz: bool, finite: np.ndarray) -> str:
    for label, change in HINTS:
        relaxed = replace(contract, **change)
        if relaxed == contract:
            continue
        bound = budget(m, relaxed, ftz).bound(m)
        if bool(np.all(~finite | (np.abs(g - m.ref) <= bound))):
            return f"; within what {label} allows: declare it (--contract {label}) if the kernel rounds so"
    return ""

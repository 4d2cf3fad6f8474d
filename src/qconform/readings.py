"""Readings of an op an implementation's output may follow under its numeric contract: an exact
output (``Expected.want``, optionally masked) or an error model to bound (``ErrorModel``). Used by
the catalogue's ``numerics`` hooks (``qconform.ops``) and the checks (``qconform.properties``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class ErrorModel:
    """What the bound of one output needs: the float64 reference and its magnitudes."""

    ref: np.ndarray  # float64: the reference's arithmetic done exactly, before the output rounding
    mag: np.ndarray  # float64: sum of |terms| per output
    store_mag: np.ndarray  # float64: what rounding the stored weights / activations can move per output
    n_terms: int  # terms summed per output
    chain: int  # the natural fp16/bf16 partial-sum chain (the quantization block)
    out_dtype: np.dtype
    path: str  # which reading of the op this is ("fp32 activations", "int8 activations (ORT CPU)")
    # (index, got - ref) -> where the element is, and which K block's partial sum the difference
    # matches if one does ("row 0, column 3; the difference is -1.00x K block 7's partial sum")
    diagnose: Callable[[tuple[int, ...], float], str] | None = None
    # float64, absolute: what a declared relaxation moves beyond the roundings (an approximate
    # division's code steps at MatMulNBits level 4), or None
    slack: np.ndarray | None = None
    # what ``slack`` is when it is the op's own propagated bound (attention, mixture of experts)
    # rather than a declared relaxation; named in a failure's bound
    slack_label: str = ""


@dataclass(frozen=True)
class Expected:
    """One accepted reading: ``want`` is the oracle's output under it; ``model`` (bound ops) the
    float64 reference and magnitudes; ``mask`` the output elements left unchecked; ``accept``
    the elements a relaxation accepts given the output (an op with several outputs: ``want`` and
    ``mask`` are tuples, one entry per output, ``model`` bounds the first); ``plain``: the
    strict reference with flush-to-zero off (what golden sets store)."""

    label: str
    want: np.ndarray | tuple[np.ndarray, ...]
    model: ErrorModel | None = None
    mask: np.ndarray | tuple[np.ndarray | None, ...] | None = None
    ftz: bool = False
    plain: bool = False
    # got -> the output elements a relaxation accepts as they are (e.g. whole blocks equal to a
    # candidate of approximate division), each compared exactly otherwise
    accept: Callable[[np.ndarray], np.ndarray] | None = None


def matching_any(candidates: list[np.ndarray], group: int, got: np.ndarray) -> np.ndarray:
    """The elements of ``got`` in groups of ``group`` (a block's bytes; 1: each element) equal,
    bit for bit and whole, to the same group of some candidate: the ``accept`` of a relaxation
    whose readings are a finite set (one approximate scale per block, per element)."""
    bits = np.dtype(f"u{got.dtype.itemsize}")
    mine = got.view(bits).reshape(-1, group)
    ok = np.zeros(len(mine), bool)
    for c in candidates:
        ok |= (mine == c.view(bits).reshape(-1, group)).all(axis=1)
    return np.repeat(ok, group).reshape(got.shape)

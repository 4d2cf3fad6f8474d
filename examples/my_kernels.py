"""A kernel author's own Q8_K quantizer, in numpy, with the rules of ggml's reference as knobs:
the drop-ins the README's examples run (``qconform run --impl py:my_kernels:q8_k_ties_away``),
each one knob away from the reference (``q8_k_reference_knobs`` passes every property).

Source of the rules: ggml-org/llama.cpp ggml/src/ggml-quants.c ``quantize_row_q8_K_ref``
(docs/ggml-formats.md): the first strict max of |x| wins, iscale = -127/max, ``nearest_int``
rounds half to even, the quant is clamped to 127, bsums are int16 sums of 16.
"""

from __future__ import annotations

import numpy as np

from qconform.formats.ggml import Q8_K
from qconform.oracles.ggml import check_quantize_args, resolve_qtype
from qconform.oracles.ggml.rounding import int_to_int8, nearest_int


def q8_k_spec(
    x: np.ndarray,
    qtype: str,
    *,
    ties: str = "even",
    tie_break: str = "first",
    clamp: bool = True,
    check_width: bool = True,
    skip_last_block: bool = False,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """A Q8_K quantizer with the reference's rules as knobs (finite or not, ftz off)."""
    if resolve_qtype(qtype).name != "Q8_K":
        raise NotImplementedError(f"this mutant only quantizes Q8_K, not {qtype}")
    if check_width:
        _, shape = check_quantize_args(x, qtype, out)
    else:
        shape = (*x.shape[:-1], x.shape[-1] // 256 * Q8_K.type_size)
    y = np.empty(shape, np.uint8) if out is None else out
    blocks = y.reshape(-1).view(Q8_K.dtype)
    xb = x[..., : shape[-1] // Q8_K.type_size * 256].reshape(-1, 256)
    if skip_last_block:
        xb, blocks = xb[:-1], blocks[:-1]
    a = np.abs(xb)
    amax = np.zeros(len(xb), np.float32)
    mx = np.zeros(len(xb), np.float32)
    for j in range(256):
        upd = a[:, j] > amax if tie_break == "first" else a[:, j] >= amax
        amax = np.where(upd, a[:, j], amax)
        mx = np.where(upd, xb[:, j], mx)
    zero = amax == 0
    with np.errstate(all="ignore"):
        iscale = (np.float32(-127.0) / np.where(zero, np.float32(1), mx)).astype(np.float32)
        p = (iscale[:, None] * xb).astype(np.float32)
        d = (np.float32(1) / iscale).astype(np.float32)
        v = nearest_int(p, xb)
        if ties == "away":
            tie = np.isfinite(p) & (np.abs(p) - np.floor(np.abs(p)) == 0.5)
            v = np.where(tie, (np.sign(p) * (np.floor(np.abs(p)) + 1)).astype(np.int32), v)
    qs = int_to_int8(np.minimum(127, v) if clamp else v)
    qs[zero] = 0
    blocks["d"] = np.where(zero, np.float32(0), d)
    blocks["qs"] = qs
    blocks["bsums"] = qs.reshape(-1, 16, 16).astype(np.int32).sum(axis=2).astype(np.int16)
    return y


def _mutant(**knobs):
    def fn(x: np.ndarray, qtype: str, out: np.ndarray | None = None) -> np.ndarray:
        return q8_k_spec(x, qtype, out=out, **knobs)

    fn.__qconform_ops__ = ("q8_k_quant",)
    return fn


q8_k_reference_knobs = _mutant()
q8_k_ties_away = _mutant(ties="away")
q8_k_last_on_equal_abs = _mutant(tie_break="last")
q8_k_no_clamp = _mutant(clamp=False)

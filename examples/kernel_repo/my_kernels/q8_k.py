"""A kernel repository's Q8_K quantizer, as qconform calls it: a drop-in for the oracle
``qconform.oracles.ggml.quantize`` (same arguments, same return).

This example delegates to the oracle so that it passes; a real repository would call its kernel
here (a compiled extension, a ctypes launcher, a Triton or PyTorch wrapper) and copy the result
into ``out`` when one is given. A case the kernel does not handle raises ``qconform.Declined``:
it is counted as declined, never passed.
"""

from __future__ import annotations

import numpy as np

from qconform.oracles.ggml import quantize as _reference


def quantize(x: np.ndarray, qtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """float32 (..., K) -> uint8 (..., K/256*292) Q8_K blocks (ggml's ``quantize_row_q8_K_ref``)."""
    return _reference(x, qtype, out=out)


quantize.__qconform_ops__ = ("q8_k_quant",)  # the op it replaces (else --qconform-ops, or guessed)

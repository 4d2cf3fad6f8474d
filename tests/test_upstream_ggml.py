"""Cross-check against ggml's own C reference, when a built ``libggml-base.so`` is named in
``QCONFORM_GGML_LIB`` (any llama.cpp or ggml build has one); skipped otherwise.

Compares ``quantize_row_q8_0_ref``, ``quantize_row_q8_K_ref``, ``dequantize_row_q8_0`` and
``dequantize_row_q8_K`` with both oracle twins on every input pattern (NaN payloads, inf,
subnormals included) and on random fp32 bit patterns. The C output buffer is zeroed first: ggml
leaves a Q8_K all-zero block's bsums unwritten, where qconform requires 0.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

from qconform.formats.ggml import FORMATS
from qconform.ops.patterns import PATTERNS, make_values
from qconform.oracles.ggml import dequantize, quantize

LIB = os.environ.get("QCONFORM_GGML_LIB")
pytestmark = pytest.mark.skipif(not LIB, reason="set QCONFORM_GGML_LIB to a built libggml-base.so")


@pytest.fixture(scope="module")
def ggml() -> ctypes.CDLL:
    lib = ctypes.CDLL(LIB)
    for qt in ("q8_0", "q8_K"):
        for name in (f"quantize_row_{qt}_ref", f"dequantize_row_{qt}"):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
    return lib


def _inputs(block: int) -> list[tuple[str, np.ndarray]]:
    rows = [(p, make_values(p, 5000 + s, 8, 1024, block)) for p in PATTERNS for s in range(10)]
    bits = np.random.default_rng(123).integers(0, 2**32, size=(64, 4096), dtype=np.uint64).astype(np.uint32)
    return rows + [("random_bits", bits.view(np.float32))]


@pytest.mark.parametrize("qtype", ["Q8_0", "Q8_K"])
@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_oracle_is_the_ggml_reference(ggml: ctypes.CDLL, qtype: str, backend: str) -> None:
    fmt = FORMATS[qtype]
    c_name = qtype[0].lower() + qtype[1:]
    rng = np.random.default_rng(9)
    for name, x in _inputs(fmt.block_size):
        theirs = np.zeros(fmt.n_bytes(x.size), np.uint8)
        getattr(ggml, f"quantize_row_{c_name}_ref")(x.ctypes.data, theirs.ctypes.data, x.size)
        ours = quantize(x, qtype, backend=backend).reshape(-1)
        assert np.array_equal(ours, theirs), (name, np.flatnonzero(ours != theirs)[:5])
        for data in (theirs, rng.integers(0, 256, size=theirs.size, dtype=np.uint8)):
            y = np.empty(x.size, np.float32)
            getattr(ggml, f"dequantize_row_{c_name}")(data.ctypes.data, y.ctypes.data, y.size)
            got = dequantize(data.reshape(1, -1), qtype, backend=backend).reshape(-1)
            assert ((got.view(np.uint32) == y.view(np.uint32)) | (np.isnan(got) & np.isnan(y))).all(), name

"""Every ggml oracle against ggml's own C, when ``QCONFORM_GGML_LIB`` names a build of it (skipped otherwise).

CI builds the libraries (``ci/ggml-lib.sh``, docs/ggml-formats.md 0) from the ggml that a pinned
llama-cpp-python sdist vendors: ``ggml/src/ggml-quants.c`` and ``ggml/src/ggml-cpu/quants.c``, without
``-march`` flags (``QCONFORM_GGML_LIB``: no FMA, as ggml-base is built on x86-64) and with the CPU
backend's x86 flags, ``-mfma`` among them (``QCONFORM_GGML_LIB_FMA``). Any llama.cpp or ggml
``libggml-base.so`` serves the quantizer and dequantizer tests; the vec_dot tests need the
``ggml_vec_dot_*_generic`` symbols, which only a ggml-cpu library or ci's builds have.

For every type the oracles support (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q8_K, Q2_K..Q6_K, IQ4_NL,
IQ4_XS), both twins (numba and numpy), bit for bit:

- ``quantize_row_*_ref``, called per row as the CPU backend's ``from_float`` calls it, and the chunk
  quantizers ``quantize_iq4_nl`` (``variant="chunk"``) and ``quantize_iq4_xs``, on >= 10,000 blocks:
  every input pattern (ties, zero blocks, NaN, inf, subnormals, extremes, ...) plus random fp32 bit
  patterns. NaNs with payload bits are left out for Q2_K..Q6_K only, whose oracles treat every NaN as
  ggml's default NaN (``oracles/ggml/kquant_search.py``): no ``nan_payload``/``mixed`` pattern, and
  default NaNs in their random bit patterns. The C output buffers are zeroed first: ggml leaves a
  Q8_K all-zero block's bsums unwritten, where qconform requires 0 (docs/ggml-formats.md 8.4);
- ``dequantize_row_*`` on those C-quantized bytes and on >= 10,000 blocks of random bytes (fp16
  NaN and inf scales included; NaNs compare by their bits too). ggml has no ``dequantize_row_q8_1``;
- every generic vec_dot pair, the no-FMA library against ``vec_dot(..., fma=False)`` and the FMA
  library against ``fma=True``, once ``qconform.oracles.ggml`` has ``vec_dot`` (skipped until then).

Hand-derived vectors and the twins on ftz are in tests/test_ggml_formats_legacy.py and
tests/test_ggml_formats_kquants.py; the latter also recomputes its stored K-quant digests from the C.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable

import numpy as np
import pytest

import qconform.oracles.ggml as ggml_oracles
from qconform.formats.ggml import FORMATS, BlockFormat
from qconform.ops.ggml.q8_quant import OWN_PATTERNS
from qconform.ops.patterns import PATTERNS, make_values
from qconform.oracles.ggml import dequantize, quantize

LIB = os.environ.get("QCONFORM_GGML_LIB")
LIB_FMA = os.environ.get("QCONFORM_GGML_LIB_FMA")
pytestmark = pytest.mark.skipif(not LIB, reason="set QCONFORM_GGML_LIB (ci/ggml-lib.sh builds one)")

BACKENDS = ("numba", "numpy")
KQUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q8_K", *KQUANTS, "IQ4_NL", "IQ4_XS")
QUANTIZERS = [(t, "ref") for t in TYPES] + [("IQ4_NL", "chunk")]
# weight type -> activation type of its ggml_vec_dot_<w>_<a>_generic (type_traits_cpu vec_dot_type)
VEC_DOT = {"Q4_0": "Q8_0", "Q4_1": "Q8_1", "Q5_0": "Q8_0", "Q5_1": "Q8_1", "Q8_0": "Q8_0", "IQ4_NL": "Q8_0"}
VEC_DOT |= {t: "Q8_K" for t in (*KQUANTS, "IQ4_XS")}
MIN_BLOCKS = 10_000
WIDTH = 1024
VP = ctypes.c_void_p


def c_name(qtype: str) -> str:
    """ggml's spelling in function names: q4_0, q8_K, iq4_nl."""
    return qtype.lower().replace("_k", "_K")


def _bind(lib: ctypes.CDLL, name: str, argtypes: list, restype: type | None) -> Callable:
    fn = getattr(lib, name)
    fn.argtypes, fn.restype = argtypes, restype
    return fn


@pytest.fixture(scope="module")
def ggml() -> ctypes.CDLL:
    return ctypes.CDLL(LIB)


@functools.cache
def inputs(qtype: str) -> tuple[tuple[str, np.ndarray], ...]:
    """>= 10,000 blocks of ``qtype``: every pattern the oracle documents, then random fp32 bits, each
    about the same number of blocks."""
    block = FORMATS[qtype].block_size
    kquant = qtype in KQUANTS
    patterns = [p for p in PATTERNS if not (kquant and p in ("nan_payload", "mixed"))]
    patterns += OWN_PATTERNS.get(qtype, ())  # the format's own: Q4_0's power-of-two ties, the legacy fma edges
    per_input = -(-MIN_BLOCKS // (len(patterns) + 1))
    rows = -(-per_input * block // WIDTH)
    out = [(p, make_values(p, 6000 + k, rows, WIDTH, block)) for k, p in enumerate(patterns)]
    bits = np.random.default_rng(6100).integers(0, 2**32, size=(rows, WIDTH), dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    if kquant:
        x = np.where(np.isnan(x), np.float32(np.nan), x)
    out.append(("random_bits", x))
    assert sum(v.size for _, v in out) // block >= MIN_BLOCKS
    return tuple(out)


def c_quantize(lib: ctypes.CDLL, qtype: str, variant: str, x: np.ndarray) -> np.ndarray:
    """ggml's bytes for float32 rows ``x`` (rows, K), into a zeroed buffer. ``ref``: the row quantizer
    per row; IQ4_XS also through its chunk quantizer, which must agree; ``chunk``: ``quantize_iq4_nl``."""
    fmt = FORMATS[qtype]
    out = np.zeros((len(x), fmt.n_bytes(x.shape[1])), np.uint8)
    if variant == "ref":
        fn = _bind(lib, f"quantize_row_{c_name(qtype)}_ref", [VP, VP, ctypes.c_int64], None)
        for r in range(len(x)):
            fn(x[r].ctypes.data, out[r].ctypes.data, x.shape[1])
    if variant == "chunk" or qtype == "IQ4_XS":
        chunk = np.zeros_like(out)
        fn = _bind(lib, f"quantize_{c_name(qtype)}", [VP, VP, ctypes.c_int64, ctypes.c_int64, VP], ctypes.c_size_t)
        assert fn(x.ctypes.data, chunk.ctypes.data, x.shape[0], x.shape[1], None) == chunk.size
        if variant == "ref":
            assert np.array_equal(out, chunk), "quantize_row_iq4_xs_ref != quantize_iq4_xs"
        out = chunk
    return out


def stale_iq4_nl_qs(x: np.ndarray, theirs: np.ndarray, ours: np.ndarray) -> None:
    """quantize_row_iq4_nl_ref leaves the qs of a block with amax < GROUP_MAX_EPS unwritten (stale),
    where qconform writes the chunk quantizer's bytes: take ours there (docs/ggml-formats.md 8.4)."""
    fmt = FORMATS["IQ4_NL"]
    xb = x.reshape(-1, fmt.block_size)
    tiny = np.where(np.isnan(xb), 0, np.abs(xb)).max(axis=1) < np.float32(1e-15)
    fmt.blocks(theirs)["qs"][tiny] = fmt.blocks(ours)["qs"][tiny]


def _first_diff(ours: np.ndarray, theirs: np.ndarray) -> str:
    bad = np.flatnonzero(ours.reshape(-1) != theirs.reshape(-1))
    return f"{bad.size} bytes differ, first at {bad[:4].tolist()}"


@pytest.mark.parametrize("qtype,variant", QUANTIZERS, ids=[f"{q}-{v}" for q, v in QUANTIZERS])
def test_quantize_is_ggml_c(ggml: ctypes.CDLL, qtype: str, variant: str) -> None:
    for name, x in inputs(qtype):
        theirs = c_quantize(ggml, qtype, variant, x)
        for backend in BACKENDS:
            ours = quantize(x, qtype, backend=backend, variant=variant)
            if qtype == "IQ4_NL" and variant == "ref":
                stale_iq4_nl_qs(x, theirs, ours)
            assert np.array_equal(ours, theirs), (name, backend, _first_diff(ours, theirs))


@pytest.mark.parametrize("qtype", [t for t in TYPES if t != "Q8_1"])
def test_dequantize_is_ggml_c(ggml: ctypes.CDLL, qtype: str) -> None:
    fmt = FORMATS[qtype]
    fn = _bind(ggml, f"dequantize_row_{c_name(qtype)}", [VP, VP, ctypes.c_int64], None)
    quantized = np.concatenate([c_quantize(ggml, qtype, "ref", x).reshape(-1) for _, x in inputs(qtype)])
    rng = np.random.default_rng(6200)
    random = rng.integers(0, 256, size=MIN_BLOCKS * fmt.type_size, dtype=np.uint8)
    for name, data in (("quantized", quantized), ("random_bytes", random)):
        assert data.size // fmt.type_size >= MIN_BLOCKS
        theirs = np.empty(data.size // fmt.type_size * fmt.block_size, np.float32)
        fn(data.ctypes.data, theirs.ctypes.data, theirs.size)
        for backend in BACKENDS:
            ours = dequantize(data.reshape(-1, fmt.type_size), qtype, backend=backend).reshape(-1)
            diff = _first_diff(ours.view(np.uint32), theirs.view(np.uint32))
            assert ours.tobytes() == theirs.tobytes(), (name, backend, diff)


# --- vec_dot --------------------------------------------------------------------------------------

VEC_N = 4096  # elements per row: 128 blocks of 32, 16 superblocks of 256
VEC_ROWS = 32  # rows per input pattern


def finite_scales(fmt: BlockFormat, data: np.ndarray) -> np.ndarray:
    """Random block bytes with every fp16 scale field (d, m, s, dmin) and Q8_K's fp32 d made finite:
    an exponent of all ones loses its top bit. Random bytes otherwise make almost every row NaN."""
    out = data.copy()
    blocks = fmt.blocks(out)
    for name in ("d", "m", "s", "dmin"):
        if name in blocks.dtype.names:
            field = blocks[name]
            if field.itemsize == 2:
                v, exponent, top = field.view(np.uint16), np.uint16(0x7C00), np.uint16(0x4000)
            else:
                v, exponent, top = field.view(np.uint32), np.uint32(0x7F800000), np.uint32(0x40000000)
            v[(v & exponent) == exponent] &= ~top
    return out


@functools.cache
def vec_dot_rows(lib_path: str, qtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(weights, activations) as uint8 rows of one vec_dot each. Weights: ggml's ref quantization of
    every pattern, then random bytes; activations: ggml's ref Q8 quantization of normal values and
    of the same patterns, then random bytes (Q8_K bsums unrelated to the qs), half of the random rows
    with finite scales. One-sign weights meet one-sign activations: block sums of 14 bits and more,
    where the order of the scale products rounds differently."""
    lib = ctypes.CDLL(lib_path)
    wfmt, act = FORMATS[qtype], VEC_DOT[qtype]
    afmt = FORMATS[act]
    w, a = [], []
    for k, p in enumerate((*PATTERNS, "one_sign")):
        w.append(c_quantize(lib, qtype, "ref", make_values(p, 6300 + k, VEC_ROWS, VEC_N, wfmt.block_size)))
        a_pattern = "normal" if k % 2 and p != "one_sign" else p
        a.append(c_quantize(lib, act, "ref", make_values(a_pattern, 6400 + k, VEC_ROWS, VEC_N, afmt.block_size)))
    rng = np.random.default_rng(6500)
    for _ in range(2):
        w.append(rng.integers(0, 256, size=(2 * VEC_ROWS, wfmt.n_bytes(VEC_N)), dtype=np.uint8))
        a.append(rng.integers(0, 256, size=(2 * VEC_ROWS, afmt.n_bytes(VEC_N)), dtype=np.uint8))
    w[-1], a[-1] = finite_scales(wfmt, w[-1]), finite_scales(afmt, a[-1])
    return np.concatenate(w), np.concatenate(a)


def c_vec_dot(lib: ctypes.CDLL, qtype: str, w: np.ndarray, a: np.ndarray) -> np.ndarray:
    """One ``ggml_vec_dot_<w>_<a>_generic(n, &s, bs, vx, bx, vy, by, nrc=1)`` per row: float32 (rows,)."""
    name = f"ggml_vec_dot_{c_name(qtype)}_{c_name(VEC_DOT[qtype])}_generic"
    if not hasattr(lib, name):
        pytest.skip(f"{name} is not exported (a libggml-base.so has no CPU backend; ci/ggml-lib.sh builds it)")
    argtypes = [ctypes.c_int, VP, ctypes.c_size_t, VP, ctypes.c_size_t, VP, ctypes.c_size_t, ctypes.c_int]
    fn = _bind(lib, name, argtypes, None)
    s = np.empty(len(w), np.float32)
    for r in range(len(w)):
        fn(VEC_N, s[r:].ctypes.data, 0, w[r].ctypes.data, 0, a[r].ctypes.data, 0, 1)
    return s


def _same(ours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """Equal bits, or both NaN (the vec_dot oracle does not model NaN payloads)."""
    return (ours.view(np.uint32) == theirs.view(np.uint32)) | (np.isnan(ours) & np.isnan(theirs))


@pytest.mark.parametrize("fma", [False, True], ids=["nofma", "fma"])
@pytest.mark.parametrize("qtype", list(VEC_DOT))
def test_vec_dot_is_ggml_c_generic(qtype: str, fma: bool) -> None:
    """``ggml_vec_dot_*_generic`` of the library without FMA against ``vec_dot(..., fma=False)``, and
    of the ``-mfma`` library against ``fma=True``, both twins. ``vec_dot(qtype, w_blocks, a_blocks, fma=,
    backend=)`` takes rows of weight blocks and of activation blocks (uint8 bytes; the activation type
    is ggml's vec_dot_type for ``qtype``) and returns one float32, ggml's ``*s``, per row pair."""
    vec_dot = getattr(ggml_oracles, "vec_dot", None)
    if vec_dot is None:
        pytest.skip("qconform.oracles.ggml has no vec_dot yet")
    path = LIB_FMA if fma else LIB
    if not path:
        pytest.skip("set QCONFORM_GGML_LIB_FMA to ci/ggml-lib.sh's libggml-ref-fma.so")
    w, a = vec_dot_rows(LIB, qtype)
    theirs = c_vec_dot(ctypes.CDLL(path), qtype, w, a)
    for backend in BACKENDS:
        ours = np.asarray(vec_dot(qtype, w, a, fma=fma, backend=backend), np.float32)
        assert ours.shape == theirs.shape
        same = _same(ours, theirs)
        bad = np.flatnonzero(~same)
        assert same.all(), f"{backend}: {bad.size} of {len(w)} rows differ, first {bad[:5].tolist()}"


@pytest.mark.skipif(not LIB_FMA, reason="set QCONFORM_GGML_LIB_FMA to ci/ggml-lib.sh's libggml-ref-fma.so")
@pytest.mark.parametrize("qtype", list(VEC_DOT))
def test_the_fma_library_rounds_differently(qtype: str) -> None:
    """The FMA comparison above is worth something only if contraction changes results: it changes
    some rows of every pair."""
    w, a = vec_dot_rows(LIB, qtype)
    plain = c_vec_dot(ctypes.CDLL(LIB), qtype, w, a)
    fused = c_vec_dot(ctypes.CDLL(LIB_FMA), qtype, w, a)
    assert not _same(plain, fused).all()


"""Catalogue entries for ggml's keep-quant linear layer and the fused producers of its Q8_K activations.

  matmul_bt_quant  W<type>_A<vec_dot_type>_Yfp32, one leaf per weight type of ggml's generic vec_dot
                   (``Wq4_K_Aq8_K_Yfp32``, ``Wq4_0_Aq8_0_Yfp32``, ...)                  shape (M, N, K)
  rms_norm_q8_k    Xfp32_Yfp32_Aq8_K, Xfp32_Ybf16_Aq8_K                                shape (rows, K)
  silu_mul_q8_k    Xfp32_Yfp32_Aq8_K, Xfp32_Ybf16_Aq8_K                                shape (rows, K)

Oracles: ``qconform.oracles.ggml`` ``matmul_bt_quant``, ``rms_norm_q8_k``, ``silu_mul_q8_k`` (fused.py,
vec_dot_generic.py; ggml-org/llama.cpp ggml-cpu.c ``ggml_compute_forward_mul_mat``, quants.c
``ggml_vec_dot_*_generic``, ops.cpp ``ggml_compute_forward_rms_norm_f32``, vec.cpp ``ggml_vec_swiglu_f32``;
docs/ggml-formats.md sections 4, 5 and 8). The functions below are their call shapes in the catalogue:
the oracle's arguments plus ``out=`` (a ``py:`` drop-in replaces them), with the device ABI's rules
(C-contiguous arrays) checked first.

matmul_bt_quant (the keep-quant GEMV / linear layer): ``y[m, n] = vec_dot(W row n, quantize(A row m,
vec_dot_type))``, the activations quantized with the reference quantizer, one vec_dot per output in
ggml's generic order. Strict: bit-exact (a kernel in the documented order, with every product rounded,
matches it). The contract selects other readings (``matmul_numerics``): ``fma=on`` GCC's ``-mfma``
contraction of the same C, ``fma=either`` both; ``order=any`` (and ``accumulate``, ``chain`` or
``storage``, which imply another order) a per-element bound from the quantized operands in float64.

rms_norm_q8_k, silu_mul_q8_k (the fused producers): two outputs, the row in ``out_dtype`` (float32, or
bfloat16 as its uint16 bits) and the Q8_K bytes of that stored row, both checked bit for bit. Stale
bytes: ggml's ``quantize_row_q8_K_ref`` leaves the 32 ``bsums`` bytes of a block whose values are all
+-0 or NaN unwritten (docs/ggml-formats.md 8.4); the oracle writes zeros there and every reading leaves
those bytes unchecked (``q8_k_stale_mask``), so a kernel may write anything to them. A C test reading a
golden set applies the same mask (``qconform.oracles.ggml.q8_k_stale_mask`` of the stored row read back).
Which NaN a row holds is not modelled (ggml's follows the compiler's operand order): the row's NaNs are
returned as 0x7FC00000 / 0x7FC0 and any NaN is accepted where the reference holds one.

Cases are small at coverage 1 (a leaf's inputs and outputs under 40 KB: they go into the committed golden
sets), realistic from coverage 2; tests/test_keep_quant.py checks the readings, docs/contracts.md states them.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from hypothesis import strategies as st

from qconform.contracts import Contract
from qconform.errors import ArgumentError, Declined
from qconform.formats.bf16 import bf16_bits_to_fp32
from qconform.formats.fp16 import fp16_bits_to_fp32
from qconform.formats.ggml import FORMATS, Q8_K, BlockFormat
from qconform.ops.abi import DTYPE, F32, I64, Abi, Bound, Enum, In, Out, call_arguments
from qconform.ops.ggml.q8_quant import _nan_bytes, finite_scales, ggml_name
from qconform.ops.patterns import make_values
from qconform.ops.spec import BadArgument, Case, Check, Leaf, OpSpec
from qconform.oracles.ggml import VEC_DOT_PAIRS, dequantize, q8_k_stale_mask, quantize, vec_dot
from qconform.oracles.ggml.fused import OUT_DTYPES, SIMDS
from qconform.oracles.ggml.fused import matmul_bt_quant as _matmul_oracle
from qconform.oracles.ggml.fused import rms_norm_q8_k as _rms_oracle
from qconform.oracles.ggml.fused import silu_mul_q8_k as _silu_oracle
from qconform.oracles.ggml.vec_dot_generic import vec_dot_formats
from qconform.readings import ErrorModel, Expected

MATMUL = "matmul_bt_quant"
RMS = "rms_norm_q8_k"
SILU = "silu_mul_q8_k"
OUT_DTYPE_LEAF = {"float32": "fp32", "bfloat16": "bf16"}
ROW_LOGICAL = {"float32": "float32", "bfloat16": "bfloat16 (its uint16 bits)"}  # the golden sets' logical dtype
EDGE_PATTERNS = (  # activation / input patterns, each once at coverage 1 (qconform.ops.patterns)
    "ties",
    "ties_npot",
    "zero_block",
    "equal_abs",
    "outlier",
    "extreme",
    "subnormal",
    "nan",
    "inf",
    "nan_payload",
)
FUZZ_PATTERNS = ("normal", "uniform", "mixed", "one_sign", *EDGE_PATTERNS)
WEIGHTS = ("valid", "quantized")  # random blocks with finite scales; quantize() of normal values
SATURATED = "one_sign"  # quantize() of one-sign blocks against one-sign activations: block sums past 2^13


def _check_array(name: str, a: object, dtype: Any, ndim: int | None, what: str) -> np.ndarray:
    """A C-contiguous numpy array of ``dtype`` (and ``ndim`` dimensions), as the device ABI passes it."""
    dims = f"{ndim}-D " if ndim else ""
    if not isinstance(a, np.ndarray) or (ndim is not None and a.ndim != ndim):
        raise ArgumentError(f"{name}: must be a {dims}numpy.ndarray ({what})")
    if a.dtype != np.dtype(dtype):
        raise ArgumentError(f"{name}: dtype must be {np.dtype(dtype)} ({what}), got {a.dtype}")
    if not a.flags.c_contiguous:
        raise ArgumentError(f"{name}: must be C-contiguous (got strides {a.strides})")
    return a


def _check_out(out: object, shape: tuple[int, ...], dtype: Any, *inputs: np.ndarray, name: str = "out") -> None:
    if out is None:
        return
    if not isinstance(out, np.ndarray):
        raise ArgumentError(f"{name}: must be a numpy.ndarray, got {type(out).__name__}")
    if out.dtype != np.dtype(dtype):
        raise ArgumentError(f"{name}: dtype must be {np.dtype(dtype)}, got {out.dtype}")
    if out.shape != shape:
        raise ArgumentError(f"{name}: shape must be {shape}, got {out.shape}")
    if not out.flags.writeable or not out.flags.c_contiguous:
        raise ArgumentError(f"{name}: must be writeable and C-contiguous")
    if any(np.may_share_memory(out, a) for a in inputs):
        raise ArgumentError(f"{name}: must not overlap an input")


# ---------------------------------------------------------------------------- matmul_bt_quant


def check_matmul_args(
    W_blocks: object, qtype: object, A_fp32: object, out: object = None
) -> tuple[BlockFormat, BlockFormat, tuple[int, int]]:
    """``matmul_bt_quant``'s rules (the oracle's, in its words, and C-contiguity); returns the weight
    format, the activation format and the output shape (M, N)."""
    wfmt, afmt = vec_dot_formats(qtype)
    W = _check_array("W_blocks", W_blocks, np.uint8, 2, f"N rows of {wfmt.name} block bytes")
    A = _check_array("A_fp32", A_fp32, np.float32, 2, "M rows of float32 activations")
    k = A.shape[1]
    if k == 0 or k % afmt.block_size:
        raise ArgumentError(
            f"A_fp32: the last dimension (row width; a {afmt.name} block holds {afmt.block_size} values) "
            f"must be a positive multiple of {afmt.block_size}, got shape {A.shape}"
        )
    nb = k // afmt.block_size
    if W.shape[1] != nb * wfmt.type_size:
        raise ArgumentError(
            f"W_blocks: rows must hold {nb} {wfmt.name} blocks ({nb * wfmt.type_size} bytes) to match "
            f"A_fp32's {k} columns, got {W.shape[1]} bytes"
        )
    shape = (A.shape[0], W.shape[0])
    _check_out(out, shape, np.float32, W, A)
    return wfmt, afmt, shape


def matmul_bt_quant(
    W_blocks: np.ndarray,
    qtype: str,
    A_fp32: np.ndarray,
    *,
    fma: bool = False,
    out: np.ndarray | None = None,
    backend: str = "numba",
) -> np.ndarray:
    """ggml's keep-quant linear layer: ``y[m, n] = vec_dot(W_blocks[n], quantize(A_fp32[m], vec_dot_type))``,
    float32 (M, N) (``qconform.oracles.ggml.matmul_bt_quant``: the reference activation quantizer,
    then ggml's generic vec_dot, every fp32 operation rounded in the C's order; ``fma=True`` GCC's
    ``-mfma`` contraction of it), written to ``out`` when given."""
    _, _, shape = check_matmul_args(W_blocks, qtype, A_fp32, out)
    y = _matmul_oracle(W_blocks, qtype, A_fp32, fma=fma, backend=backend)
    if out is None:
        return y
    out[...] = y
    return out


def _mm_inputs(case: Case) -> dict[str, np.ndarray]:
    """A: the case's pattern per activation block. W: ``valid`` random block bytes with finite fp16
    scales (every quant, packed sub-block scale and sign arbitrary), ``quantized`` (the reference
    quantizer of normal values: real weights) or ``one_sign`` (of blocks of one sign: with one-sign
    activations each block's integer sum has 14 or more significant bits, so that ``sumi * dx`` is
    rounded and the generic order of the scale products shows)."""
    qtype = case.params["qtype"]
    wfmt, afmt = vec_dot_formats(qtype)
    M, N, K = case.shape
    A = make_values(case.pattern, case.seed, M, K, afmt.block_size)
    rng = np.random.default_rng([case.seed, 1])
    w = case.params.get("w", "valid")
    if w in ("quantized", SATURATED):
        W = quantize(make_values("normal" if w == "quantized" else w, case.seed + 1, N, K, wfmt.block_size), qtype)
    else:
        W = finite_scales(wfmt, rng.integers(0, 256, (N, wfmt.n_bytes(K)), dtype=np.uint8), rng)
    return {"W_blocks": W, "A_fp32": A}


REALISTIC = (  # (M, N, K, weights): coverage 2, every LLM width; decode rows, a prefill tile, 128 tokens
    (1, 8192, 2048, "valid"),
    (2, 512, 2560, "quantized"),
    (1, 1024, 4096, "quantized"),
    (7, 256, 5120, "valid"),
    (16, 128, 8192, "valid"),
    (1, 512, 14336, "valid"),
    (128, 64, 2048, "valid"),
)
FULL = (  # coverage 3: a 14336-wide FFN projection, a prefill tile, 128 tokens
    (1, 8192, 14336, "valid"),
    (16, 4096, 4096, "quantized"),
    (128, 512, 4096, "valid"),
)
MM_CORE = (  # (M, N, K): M tokens, N a multiple of 8, K a multiple of 256; the first at coverage 1
    (2, 8, 512),
    (1, 256, 1024),
    (4, 128, 512),
    (8, 64, 2048),
    (16, 64, 1024),
    (32, 32, 512),
    (64, 16, 256),
    (5, 48, 768),
    (3, 96, 1536),
    (7, 32, 4096),
    (6, 16, 2560),
)


def _mm_cases(leaf: str, coverage: int, qtype: str) -> list[Case]:
    """coverage 1 (small: a golden leaf stays under 40 KB): one activation row of 256 values against
    two weight rows for each special pattern, two quantized weight rows of 512, two one-sign
    activation rows against four one-sign weight rows (block sums past 2^13), and the first core
    shape; 2: more seeds of the patterns, an odd N with K = 768, a mixed 4 x 64 x 4096, and the
    realistic shapes (every LLM width from 2048 to 14336, N up to 8192, M 1, 2, 7, 16 and 128); 3:
    a 8192 x 14336 projection, a 16-token 4096 x 4096 tile, 128 tokens.

    core: kernel-shaped cases beside those (pattern ``normal``, seeds 400..410; 1 at coverage 1, 11
    from coverage 2): M in 1..8, 16, 32, 64, N a multiple of 8, K a multiple of 256 (every weight
    block), weights alternately random-valid and quantized."""
    out: list[Case] = []

    def add(M: int, N: int, K: int, seed: int, pattern: str = "normal", w: str = "valid") -> None:
        out.append(Case(MATMUL, leaf, seed, (M, N, K), pattern, {"qtype": qtype, "w": w}))

    seeds = {1: 1, 2: 2, 3: 4}[coverage]
    for i, pattern in enumerate(EDGE_PATTERNS):
        for s in range(seeds):
            add(1, 2, 256, 1000 + 10 * i + s, pattern)
    add(1, 4, 512, 1, w="quantized")
    add(2, 4, 512, 2, SATURATED, w=SATURATED)
    if coverage >= 2:
        add(3, 5, 768, 2, "uniform")
        add(4, 64, 4096, 3, "mixed")
        for i, (M, N, K, w) in enumerate(REALISTIC):
            add(M, N, K, 100 + i, w=w)
    for i, (M, N, K) in enumerate(MM_CORE[: 1 if coverage == 1 else None]):
        add(M, N, K, 400 + i, w=WEIGHTS[i % 2])
    if coverage >= 3:
        for i, (M, N, K, w) in enumerate(FULL):
            add(M, N, K, 300 + i, w=w)
    return out


def _mm_strategy(leaf: str, qtype: str) -> Any:
    """Shape, pattern, weight kind and a seed from hypothesis; the arrays from numpy."""
    step = max(FORMATS[qtype].block_size, 32)
    return st.builds(
        lambda seed, M, N, blocks, pattern, w: Case(
            MATMUL, leaf, seed, (M, N, blocks * step), pattern, {"qtype": qtype, "w": w}
        ),
        seed=st.integers(0, 2**32 - 1),
        M=st.integers(1, 4),
        N=st.integers(1, 8),
        blocks=st.integers(1, 4),
        pattern=st.sampled_from(FUZZ_PATTERNS),
        w=st.sampled_from((*WEIGHTS, SATURATED)),
    )


def _mm_call(inputs: dict[str, Any], params: dict[str, Any]) -> tuple[tuple, dict]:
    return (inputs["W_blocks"], params["qtype"], inputs["A_fp32"]), {}


def _mm_bad(qtype: str) -> list[BadArgument]:
    wfmt, afmt = vec_dot_formats(qtype)
    good = _mm_inputs(Case(MATMUL, "bad", 5, (2, 3, 2 * max(afmt.block_size, 32)), "normal", {"qtype": qtype}))
    W, A = good["W_blocks"], good["A_fp32"]
    p = {"qtype": qtype}
    bs = afmt.block_size
    return [
        BadArgument(
            "qtype must be a weight type with a generic vec_dot",
            good,
            {"qtype": "Q8_K"},
            arg="qtype",
            match="Q8_K|support",
        ),
        BadArgument("qtype must be a ggml type", good, {"qtype": "Q9_9"}, arg="qtype", match="Q9_9|support"),
        BadArgument("W_blocks must be uint8", {**good, "W_blocks": W.view(np.int8)}, p, arg="W_blocks", match="uint8"),
        BadArgument("W_blocks must be 2-D", {**good, "W_blocks": W.reshape(-1)}, p, arg="W_blocks", match="2-D"),
        BadArgument(
            "W_blocks must be C-contiguous",
            {**good, "W_blocks": np.repeat(W, 2, axis=1)[:, ::2]},
            p,
            arg="W_blocks",
            match="contiguous",
        ),
        BadArgument(
            "W_blocks rows must hold A_fp32's blocks",
            {**good, "W_blocks": W[:, : wfmt.type_size].copy()},
            p,
            arg="W_blocks",
            match=f"{A.shape[1] // bs} {wfmt.name} blocks|match",
        ),
        BadArgument(
            "A_fp32 must be float32", {**good, "A_fp32": A.astype(np.float64)}, p, arg="A_fp32", match="float32"
        ),
        BadArgument("A_fp32 must be 2-D", {**good, "A_fp32": A[0].copy()}, p, arg="A_fp32", match="2-D"),
        BadArgument(
            f"A_fp32's width must be a multiple of {bs}",
            {**good, "A_fp32": A[:, : bs + 16].copy()},
            p,
            arg="A_fp32",
            match=f"multiple of {bs}",
        ),
        BadArgument(
            "A_fp32 must be C-contiguous",
            {**good, "A_fp32": np.repeat(A, 2, axis=1)[:, ::2]},
            p,
            arg="A_fp32",
            match="contiguous",
        ),
        BadArgument(
            "out must be (M, N)", good, p, bad_out=np.zeros((2, 4), np.float32), arg="out", match=r"shape|\(2, 3\)"
        ),
        BadArgument("out must be float32", good, p, bad_out=np.zeros((2, 3), np.float64), arg="out", match="float32"),
    ]


GGML_TYPE = Enum(
    "ggml_type",
    tuple(
        (name, FORMATS[name].type_id, f"{FORMATS[name].block_size} values in {FORMATS[name].type_size} bytes")
        for name in VEC_DOT_PAIRS
    ),
)


def _mm_bind(args: tuple, kwargs: Any) -> Bound:
    c = call_arguments(matmul_bt_quant, args, kwargs)
    wfmt, _, (M, N) = check_matmul_args(c["W_blocks"], c["qtype"], c["A_fp32"])
    if c["fma"]:
        raise Declined("fma: the ABI has no fma argument (a kernel's contraction is its contract's fma)")
    K = c["A_fp32"].shape[1]
    tensors = {"W_blocks": ("W_blocks", np.dtype(np.uint8)), "A_fp32": ("A_fp32", np.dtype(np.float32))}
    scalars = {"M": M, "N": N, "K": K, "qtype": GGML_TYPE[wfmt.name]}
    return Bound(tensors, (M, N), np.dtype(np.float32), scalars, M * N)


MATMUL_ABI = Abi(
    (
        In(
            "W_blocks", "unsigned char", "uint8", "(N, K / QK * type_size)", "weight row n: K / QK ggml blocks of qtype"
        ),
        In("A_fp32", "float", "float32", "(M, K)", "activations, quantized by the kernel to qtype's vec_dot_type"),
        Out("Y", "float", "float32", "(M, N)", "Y[m, n] = vec_dot(W_blocks[n], quantize(A_fp32[m]))"),
        I64("M", "rows of A_fp32 (tokens)"),
        I64("N", "rows of W_blocks (output columns)"),
        I64("K", "reduction length: a multiple of qtype's block (32 or 256)"),
        I64("qtype", "the weight type, ggml's type id", GGML_TYPE),
    ),
    _mm_bind,
    "ggml keep-quant linear layer: Y = W @ quantize(A)^T with ggml's generic vec_dot",
    "M * N outputs",
    lanes=32,
    notes=(
        "vec_dot_type (ggml-cpu.c type_traits_cpu): Q8_0 for Q4_0, Q5_0, Q8_0, IQ4_NL; Q8_1 for Q4_1, Q5_1; "
        "Q8_K for Q2_K..Q6_K, IQ4_XS; each activation row quantized with the reference quantizer "
        "(quantize_row_q8_K_ref, quantize_row_q8_0_ref / _q8_1_ref)",
        "strict: bit-exact with the generic order (docs/ggml-formats.md 4); contract fma=on|either: GCC's -mfma "
        "contraction; order=any: fp32 sums in any order, each output within its bound (docs/contracts.md)",
    ),
)


def _fp16(bits: np.ndarray) -> np.ndarray:
    return fp16_bits_to_fp32(bits).astype(np.float64)


def _activations(a_blocks: np.ndarray, afmt: BlockFormat) -> tuple[np.ndarray, np.ndarray | None]:
    """(the activation values d * q (M, K), float64 and exact; Q8_1's fp16 ``s`` (M, nb) or None)."""
    b = afmt.blocks(a_blocks).reshape(len(a_blocks), -1)
    d = b["d"].astype(np.float64) if afmt.name == "Q8_K" else _fp16(b["d"])
    a = (d[..., None] * b["qs"].astype(np.float64)).reshape(len(a_blocks), -1)
    return a, (_fp16(b["s"]) if "s" in afmt.dtype.names else None)


def _weight_parts(W: np.ndarray, wfmt: BlockFormat) -> tuple[np.ndarray, np.ndarray | None]:
    """(scale part, min part) of the weights, float64 (rows, K), exact, with w = scale + min: the
    oracle's dequantization with the min field (``dmin`` / ``m``) zeroed, and with ``d`` zeroed.
    Each is a product of an fp16 scale and small integers, at most 23 significant bits (d * sc * q:
    Q6_K 11 + 7 + 5, IQ4_XS 11 + 5 + 7), so the fp32 dequantization computes it exactly; only the
    final ``scale - min`` of the affine types rounds, and it is left out."""
    mins = [f for f in ("dmin", "m") if f in wfmt.dtype.names]
    if not mins:
        return dequantize(W, wfmt.name).astype(np.float64), None
    parts = []
    for zeroed in (mins[0], "d"):
        blocks = wfmt.blocks(W.copy())
        blocks[zeroed] = 0
        parts.append(dequantize(blocks.view(np.uint8).reshape(W.shape), wfmt.name).astype(np.float64))
    return parts[0], parts[1]


def matmul_terms(W: np.ndarray, qtype: str, a_blocks: np.ndarray, chunk_values: int = 1 << 22) -> dict[str, Any]:
    """The float64 model of ``y[m, n] = sum_k w[n, k] a[m, k]`` over the quantized operands:
    ``ref`` (exact sum, float64), ``mag`` = sum_k (|scale part| + |min part|) |a| (what the fp32
    sums round against: the two parts are summed separately by every ggml kernel), ``store`` = ``mag``
    + 2 sum_k |w| |a| (what fp16/bf16 storage of the weights, their scales and the activations moves).
    Q8_1 pairs (Q4_1, Q5_1) take the min part as ggml does, ``sum_b m_b * s_b`` with the activation
    block's fp16 ``s``. Chunked over N. Where an operand is inf or NaN (an fp16 scale that
    overflowed), ``mag`` and ``store`` are 0: the output is non-finite there, checked for its kind."""
    wfmt, afmt = vec_dot_formats(qtype)
    with np.errstate(invalid="ignore", over="ignore"):
        a, s = _activations(a_blocks, afmt)
        M, N = len(a), len(W)
        ref, mag, store = (np.zeros((M, N)) for _ in range(3))
        step = max(1, chunk_values // max(1, a.shape[1]))
        for lo in range(0, N, step):
            hi = min(N, lo + step)
            ws, wm = _weight_parts(W[lo:hi], wfmt)
            ref[:, lo:hi] = a @ ws.T
            mag[:, lo:hi] = np.abs(a) @ np.abs(ws).T
            w = ws if wm is None else ws + wm
            if wm is not None and s is not None:  # Q8_1: m_b * s_b per block
                mb = wm[:, :: wfmt.block_size]
                ref[:, lo:hi] += s @ mb.T
                mag[:, lo:hi] += np.abs(s) @ np.abs(mb).T
            elif wm is not None:
                ref[:, lo:hi] += a @ wm.T
                mag[:, lo:hi] += np.abs(a) @ np.abs(wm).T
            store[:, lo:hi] = mag[:, lo:hi] + 2 * (np.abs(a) @ np.abs(w).T)
    odd = ~np.isfinite(store)
    mag[odd] = store[odd] = 0.0
    return {"ref": ref, "mag": mag, "store": store, "a": a, "s": s}


def _reordered(contract: Contract) -> bool:
    """The contract allows another summation than the generic C's: fp32 in any order, fp16/bf16
    partial sums, or operands stored in fp16/bf16."""
    return contract.order == "any" or contract.accumulate != "fp32" or contract.storage != "exact"


FMA_MODES = {"off": (False,), "on": (True,), "either": (False, True)}
FTZ_Q8_K_D = 2.0**-50  # Q8_K scales below this may make vec_dot's fp32 products subnormal (matmul_numerics)
HUGE = 2.0**127  # a sum of magnitudes at least this may overflow fp32 in some order but not another


def matmul_numerics(
    inputs: dict[str, np.ndarray], params: dict[str, Any], contract: Contract, ftz: bool
) -> list[Expected]:
    """The readings of matmul_bt_quant the contract accepts.

    Exact (strict, ``order=reference``): the oracle with ``fma`` False, True or both (contract ``fma``:
    off, on, either). With flush-to-zero the activations are quantized as a flushing device quantizes
    them (the Q8 oracles' ``ftz``); vec_dot's own fp32 products are not flushed by the oracle, which
    matters only when one is subnormal: with every fp16 weight scale at least 2^-24 (its smallest
    subnormal) and a Q8_K activation scale of at least 2^-50, every product of scales is at least
    2^-74 and every term and partial sum a multiple of 2^-126 (so never subnormal), and Q8_0 / Q8_1
    scales are fp16; the outputs of activation rows with a Q8_K block scale below 2^-50 (tiny
    activations: the ``subnormal`` pattern's mixed blocks) are left unchecked under flush-to-zero.
    ``nan=ieee``: a row holding a NaN activation is left unchecked (its codes are the kernel's own
    conversion of NaN).

    Bound (``order=any``, or ``accumulate`` / ``chain`` / ``storage`` relaxed): each output within
    ``u |ref| + (1 + u)(e_acc mag + e_store store) + tiny`` (qconform.properties.bounds), ``ref`` and
    the magnitudes from the quantized operands in float64 (``matmul_terms``). Derivation: every
    kernel forms a term from exact integer sums and at most four rounded fp32 products (an activation
    scale times a weight scale, times a sub-block scale, times an integer sum or a dequantized value,
    the min part likewise), each within relative u, then sums at most K terms in fp32: the result is
    within gamma_{K+4} sum |terms| <= gamma_{K+4} mag of ``ref`` (Higham 2002, 3.1; the probabilistic
    8 sqrt(K+4) u where the contract says so), so n_terms = K + 4. Outputs whose ``mag`` is at least
    2^127 are left unchecked (an fp32 partial sum may overflow in one order and not another)."""
    W, A, qtype = inputs["W_blocks"], inputs["A_fp32"], params["qtype"]
    wfmt, afmt = vec_dot_formats(qtype)
    a_blocks = quantize(A, afmt.name, ftz=ftz)
    unchecked = np.zeros(len(A), bool)
    if contract.nan == "ieee":
        unchecked |= np.isnan(A).any(axis=1)
    if ftz and afmt.name == "Q8_K":
        d = np.abs(afmt.blocks(a_blocks)["d"].astype(np.float64)).reshape(len(A), -1)
        unchecked |= ((d > 0) & (d < FTZ_Q8_K_D)).any(axis=1)
    rows = np.broadcast_to(unchecked[:, None], (len(A), len(W)))
    if _reordered(contract):
        want = vec_dot(qtype, W[None, :, :], a_blocks[:, None, :])
        t = matmul_terms(W, qtype, a_blocks)
        model = ErrorModel(
            t["ref"],
            t["mag"],
            t["store"],
            A.shape[1] + 4,
            wfmt.block_size,
            np.dtype(np.float32),
            "fp32 sums of the quantized operands in any order",
            _mm_diagnose(W, wfmt, t),
        )
        mask = rows | (t["mag"] >= HUGE)
        return [Expected("sums in any order, bounded", want, model, mask=mask if mask.any() else None, plain=True)]
    out = []
    for fused in FMA_MODES[contract.fma]:
        want = vec_dot(qtype, W[None, :, :], a_blocks[:, None, :], fma=fused)
        label = "generic vec_dot, -mfma contraction" if fused else "generic vec_dot"
        out.append(Expected(label, want, mask=rows.copy() if unchecked.any() else None, plain=not fused))
    return out


def _mm_diagnose(W: np.ndarray, wfmt: BlockFormat, t: dict[str, Any]) -> Callable[[tuple[int, ...], float], str]:
    """(index, got - ref) -> "activation row m, weight row n", and the K block whose partial sum the
    difference equals (within 2%, either sign) when one does: a dropped, doubled or misplaced block."""

    def where(at: tuple[int, ...], diff: float) -> str:
        m, n = at
        text = f"activation row {m}, weight row {n}"
        ws, wm = _weight_parts(W[n : n + 1], wfmt)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            prod = t["a"][m] * (ws[0] if wm is None or t["s"] is not None else ws[0] + wm[0])
            part = prod.reshape(-1, wfmt.block_size).sum(axis=1)
            if wm is not None and t["s"] is not None:
                part = part + t["s"][m] * wm[0, :: wfmt.block_size]
            ratio = np.where(part != 0, diff / part, np.inf)
        b = int(np.argmin(np.abs(np.abs(ratio) - 1)))
        if abs(abs(ratio[b]) - 1) <= 0.02:
            k0 = b * wfmt.block_size
            text += (
                f"; the difference is {ratio[b]:+.3f}x K block {b}'s partial sum (k {k0}..{k0 + wfmt.block_size - 1})"
            )
        return text

    return where


def _mm_leaf(qtype: str) -> Leaf:
    return Leaf(f"W{ggml_name(qtype)}_A{ggml_name(VEC_DOT_PAIRS[qtype])}_Yfp32", {"qtype": qtype})


MM_LEAVES = tuple(_mm_leaf(t) for t in VEC_DOT_PAIRS)


def _leaf_qtype(leaf: str) -> str:
    for lf in MM_LEAVES:
        if lf.name == leaf:
            return lf.params["qtype"]
    raise KeyError(f"{MATMUL} has no leaf {leaf!r}")


MATMUL_BT_QUANT = OpSpec(
    name=MATMUL,
    family="ggml",
    leaves=MM_LEAVES,
    oracle=matmul_bt_quant,
    call_args=_mm_call,
    make_inputs=_mm_inputs,
    cases=lambda lf, coverage: _mm_cases(lf, coverage, _leaf_qtype(lf)),
    strategy=lambda lf: _mm_strategy(lf, _leaf_qtype(lf)),
    validate=lambda inputs, params, out=None: check_matmul_args(
        inputs["W_blocks"], params["qtype"], inputs["A_fp32"], out
    ),
    bad_arguments=lambda lf: _mm_bad(_leaf_qtype(lf)),
    decode=lambda y, params: y,
    abi=MATMUL_ABI,
    check=Check(
        "exact",
        0.0,
        "ggml's generic vec_dot fixes the order and every rounding: bit-exact (another order: contract order=any)",
    ),
    input_names=("W_blocks", "A_fp32"),
    locate=lambda params, at: f"activation row {at[0]}, weight row {at[1]}",
    logical_dtypes={"W_blocks": "ggml {qtype} blocks (raw bytes)", "A_fp32": "float32", "y": "float32"},
    sized_case=lambda lf, cols, seed: Case(
        MATMUL, lf, seed, (1, cols, 4096), "normal", {"qtype": _leaf_qtype(lf), "w": "valid"}
    ),
    numerics=matmul_numerics,
)


# ---------------------------------------------------------------------------- fused producers


def _check_rows(name: str, a: object, what: str) -> np.ndarray:
    a = _check_array(name, a, np.float32, None, what)
    if a.ndim < 1 or a.shape[-1] == 0 or a.shape[-1] % Q8_K.block_size:
        raise ArgumentError(
            f"{name}: the last dimension (row width; Q8_K blocks hold 256 values) must be a positive "
            f"multiple of 256, got shape {a.shape}"
        )
    return a


def _check_fused_out(out: object, x: np.ndarray, out_dtype: str, *inputs: np.ndarray) -> tuple[Any, Any]:
    """(shape, dtype) of both outputs; ``out``, when given, a (row, Q8_K bytes) pair of buffers."""
    row = (x.shape, np.dtype(np.float32 if out_dtype == "float32" else np.uint16))
    q8 = ((*x.shape[:-1], Q8_K.n_bytes(x.shape[-1])), np.dtype(np.uint8))
    if out is not None:
        if not isinstance(out, tuple) or len(out) != 2:
            raise ArgumentError("out: must be a pair of numpy.ndarray (the row, its Q8_K bytes)")
        _check_out(out[0], row[0], row[1], *inputs, name="out")
        _check_out(out[1], q8[0], q8[1], *inputs, out[0], name="out")
    return row, q8


def _check_out_dtype(out_dtype: object) -> str:
    if out_dtype not in OUT_DTYPES:
        raise ArgumentError(f"out_dtype: must be one of {', '.join(OUT_DTYPES)}, got {out_dtype!r}")
    return str(out_dtype)


def check_rms_args(x: object, gamma: object, eps: object, out_dtype: object, out: object = None) -> tuple[Any, Any]:
    """``rms_norm_q8_k``'s rules (the oracle's, and C-contiguity); returns the outputs' (shape, dtype)."""
    xs = _check_rows("x", x, "rows of float32 activations")
    k = xs.shape[-1]
    g = _check_array("gamma", gamma, np.float32, 1, "one weight per column of x")
    if g.shape != (k,):
        raise ArgumentError(f"gamma: must be a float32 numpy.ndarray of shape ({k},), one weight per column of x")
    if not isinstance(eps, (int, float, np.floating)) or not np.float32(eps) >= 0:
        raise ArgumentError(f"eps: must be a number >= 0 (ggml asserts eps >= 0.0f), got {eps!r}")
    return _check_fused_out(out, xs, _check_out_dtype(out_dtype), xs, g)


def check_silu_args(gate: object, up: object, out_dtype: object, out: object = None) -> tuple[Any, Any]:
    """``silu_mul_q8_k``'s rules (the oracle's, and C-contiguity); returns the outputs' (shape, dtype)."""
    g = _check_rows("gate", gate, "rows of float32 gate activations")
    if not isinstance(up, np.ndarray) or up.dtype != np.float32 or up.shape != g.shape:
        raise ArgumentError(f"up: must be a float32 numpy.ndarray of gate's shape {g.shape}")
    _check_array("up", up, np.float32, g.ndim, "gate's shape")
    return _check_fused_out(out, g, _check_out_dtype(out_dtype), g, up)


BF16_QNAN = np.uint16(0x7FC0)


def _bf16_nan(y: np.ndarray) -> np.ndarray:
    return (y & np.uint16(0x7FFF)) > np.uint16(0x7F80)


def _deliver(result: tuple[np.ndarray, np.ndarray], out: Any) -> tuple[np.ndarray, np.ndarray]:
    """The row with every NaN as 0x7FC00000 (fp32) or 0x7FC0 (bf16): which NaN ggml's C returns
    follows the compiler's operand order (the twins differ there), only where it returns one is
    modelled. Written to ``out`` when given."""
    y, q = result
    if y.dtype == np.float32:
        y[np.isnan(y)] = np.float32(np.nan)
    else:
        y[_bf16_nan(y)] = BF16_QNAN
    if out is None:
        return y, q
    out[0][...] = y
    out[1][...] = q
    return out


def rms_norm_q8_k(
    x: np.ndarray,
    gamma: np.ndarray,
    eps: float,
    out_dtype: str = "float32",
    *,
    out: tuple[np.ndarray, np.ndarray] | None = None,
    backend: str = "numba",
) -> tuple[np.ndarray, np.ndarray]:
    """RMSNorm times ``gamma`` stored in ``out_dtype`` (float32, or bfloat16 as uint16 bits, rounded to
    nearest even), and that stored row's Q8_K bytes (``qconform.oracles.ggml.rms_norm_q8_k``: ggml's
    rms_norm then mul, the sum of squares in double, ``quantize_row_q8_K_ref``); into ``out`` (a pair)
    when given."""
    check_rms_args(x, gamma, eps, out_dtype, out)
    return _deliver(_rms_oracle(x, gamma, eps, out_dtype, backend=backend), out)


def silu_mul_q8_k(
    gate: np.ndarray,
    up: np.ndarray,
    out_dtype: str = "float32",
    *,
    simd: str = "sse2",
    out: tuple[np.ndarray, np.ndarray] | None = None,
    backend: str = "numba",
) -> tuple[np.ndarray, np.ndarray]:
    """SiLU(gate) * up stored in ``out_dtype`` and that stored row's Q8_K bytes
    (``qconform.oracles.ggml.silu_mul_q8_k``: ``ggml_vec_swiglu_f32`` with ``ggml_v_expf``'s ``simd``
    branch, ``quantize_row_q8_K_ref``); into ``out`` (a pair) when given."""
    check_silu_args(gate, up, out_dtype, out)
    if simd not in SIMDS:
        raise ArgumentError(f"simd: must be one of {', '.join(SIMDS)}, got {simd!r}")
    return _deliver(_silu_oracle(gate, up, out_dtype, simd=simd, backend=backend), out)


def _gamma(seed: int, k: int) -> np.ndarray:
    return (1.0 + 0.2 * np.random.default_rng([seed, 2]).standard_normal(k)).astype(np.float32)


def _rms_inputs(case: Case) -> dict[str, np.ndarray]:
    rows, k = case.shape
    return {"x": make_values(case.pattern, case.seed, rows, k, Q8_K.block_size), "gamma": _gamma(case.seed, k)}


def _silu_inputs(case: Case) -> dict[str, np.ndarray]:
    """gate: the pattern (per-row scales 10^-3..10^3 reach every v_expf branch); up: standard normal."""
    rows, k = case.shape
    up = np.random.default_rng([case.seed, 3]).standard_normal((rows, k)).astype(np.float32)
    return {"gate": make_values(case.pattern, case.seed, rows, k, Q8_K.block_size), "up": up}


FUSED_CORE = (
    (1, 256),
    (1, 4096),
    (8, 2048),
    (16, 1024),
    (32, 512),
    (64, 256),
    (3, 768),
    (5, 1280),
    (7, 2560),
    (2, 256),
)
FUSED_WIDE = ((2, 2048), (1, 2560), (4, 4096), (1, 5120), (2, 8192), (1, 14336))


def _fused_cases(op: str, leaf: str, coverage: int) -> list[Case]:
    """coverage 1 (small: a golden leaf stays under 40 KB): one row of 256 values per special pattern
    (zero_block: 512, two Q8_K blocks, at least one all-zero: stale bsums inside a row) and the first
    core shape; 2: every LLM width, a mixed 16 x 4096, an all-zero row with eps = 0 (RMSNorm: NaN)
    and more seeds; 3: 128 x 14336 and 512 x 4096.

    core: kernel-shaped cases beside those (pattern ``normal``, seeds 400..409; 1 at coverage 1, 10
    from coverage 2): 1..8, 16, 32 or 64 rows of widths a multiple of 256."""
    out: list[Case] = []
    rms = op == RMS

    def add(rows: int, k: int, seed: int, pattern: str = "normal", eps: float = 1e-6) -> None:
        out.append(Case(op, leaf, seed, (rows, k), pattern, {"eps": eps} if rms else {}))

    for i, pattern in enumerate(p for p in EDGE_PATTERNS if p != "ties_npot"):
        for s in range({1: 1, 2: 2, 3: 3}[coverage]):
            add(1, 512 if pattern == "zero_block" else 256, 1000 + 10 * i + s, pattern)
    if coverage >= 2:
        for i, (rows, k) in enumerate(FUSED_WIDE):
            add(rows, k, 100 + i, eps=1e-5 if i % 2 else 1e-6)
        add(16, 4096, 110, "mixed")
        add(3, 1024, 111, "zero_block", eps=0.0)
        add(2, 768, 112, "uniform")
    for i, (rows, k) in enumerate(FUSED_CORE[: 1 if coverage == 1 else None]):
        add(rows, k, 400 + i)
    if coverage >= 3:
        add(128, 14336, 300)
        add(512, 4096, 301, "mixed")
    return out


def _fused_strategy(op: str, leaf: str) -> Any:
    return st.builds(
        lambda seed, rows, blocks, pattern, eps: Case(
            op, leaf, seed, (rows, 256 * blocks), pattern, {"eps": eps} if op == RMS else {}
        ),
        seed=st.integers(0, 2**32 - 1),
        rows=st.integers(1, 4),
        blocks=st.integers(1, 4),
        pattern=st.sampled_from(FUZZ_PATTERNS),
        eps=st.sampled_from((1e-6, 1e-5, 0.0)),
    )


def _rms_call(inputs: dict[str, Any], params: dict[str, Any]) -> tuple[tuple, dict]:
    return (inputs["x"], inputs["gamma"], params["eps"], params["out_dtype"]), {}


def _silu_call(inputs: dict[str, Any], params: dict[str, Any]) -> tuple[tuple, dict]:
    return (inputs["gate"], inputs["up"], params["out_dtype"]), {}


def _fused_bad(op: str, out_dtype: str) -> list[BadArgument]:
    rows, k = 2, 512
    good = (_rms_inputs if op == RMS else _silu_inputs)(Case(op, "bad", 6, (rows, k), "normal"))
    p = {"out_dtype": out_dtype, "qtype": "Q8_K", **({"eps": 1e-6} if op == RMS else {})}
    first = "x" if op == RMS else "gate"
    x = good[first]
    row_dtype = np.float32 if out_dtype == "float32" else np.uint16
    q8 = np.zeros((rows, Q8_K.n_bytes(k)), np.uint8)
    bad = [
        BadArgument(f"{first} must be float32", {**good, first: x.astype(np.float64)}, p, arg=first, match="float32"),
        BadArgument(
            f"{first}'s width must be a multiple of 256",
            {**good, first: x[:, :300].copy()},
            p,
            arg=first,
            match="multiple of 256",
        ),
        BadArgument(
            f"{first} must be C-contiguous",
            {**good, first: np.repeat(x, 2, axis=1)[:, ::2]},
            p,
            arg=first,
            match="contiguous",
        ),
        BadArgument(
            "out_dtype must be float32 or bfloat16",
            good,
            {**p, "out_dtype": "float16"},
            arg="out_dtype",
            match="bfloat16|float16",
        ),
        BadArgument(
            "out must be a pair (row, Q8_K bytes)",
            good,
            p,
            bad_out=(np.zeros((rows, k), row_dtype),),
            arg="out",
            match="pair",
        ),
        BadArgument(
            "out's row must have x's shape",
            good,
            p,
            bad_out=(np.zeros((rows, k + 1), row_dtype), q8),
            arg="out",
            match=rf"shape|\({rows}, {k}\)",
        ),
        BadArgument(
            "out's row must be the out_dtype",
            good,
            p,
            bad_out=(np.zeros((rows, k), np.float64), q8),
            arg="out",
            match=np.dtype(row_dtype).name,
        ),
        BadArgument(
            "out's Q8_K bytes must be (rows, K / 256 * 292) uint8",
            good,
            p,
            bad_out=(np.zeros((rows, k), row_dtype), q8[:, :-1].copy()),
            arg="out",
            match=rf"shape|\({rows}, {Q8_K.n_bytes(k)}\)",
        ),
    ]
    if op == RMS:
        g = good["gamma"]
        bad += [
            BadArgument(
                "gamma must be (K,)", {**good, "gamma": g[:-1].copy()}, p, arg="gamma", match=rf"shape|\({k},\)"
            ),
            BadArgument(
                "gamma must be float32", {**good, "gamma": g.astype(np.float16)}, p, arg="gamma", match="float32"
            ),
            BadArgument("eps must be >= 0", good, {**p, "eps": -1e-6}, arg="eps", match=">= 0"),
        ]
    else:
        u = good["up"]
        bad += [
            BadArgument("up must have gate's shape", {**good, "up": u[:, :256].copy()}, p, arg="up", match="shape"),
            BadArgument("up must be float32", {**good, "up": u.astype(np.float64)}, p, arg="up", match="float32"),
        ]
    return bad


def _tiny(a: np.ndarray, below: float) -> np.ndarray:
    """Per row (the last axis is the row): some finite nonzero |value| below ``below``."""
    with np.errstate(invalid="ignore"):
        v = np.abs(a.astype(np.float64)).reshape(-1, a.shape[-1])
        return ((v != 0) & (v < below)).any(axis=1)


def _ftz_unmodelled(op: str, inputs: dict[str, np.ndarray], back: np.ndarray) -> np.ndarray:
    """Rows whose flush-to-zero result the oracle (which does not flush) may not give: some fp32
    intermediate of the row may be subnormal. Found from the inputs and the stored row read back
    (0, inf and NaN never change under flushing):
    rms_norm_q8_k: |x| < 2^-50 (x^2 or the mean of squares may be subnormal), |y| < 2^-100 (x * scale
    may have been subnormal before gamma), every row when a gamma lies outside [2^-50, 2^26];
    silu_mul_q8_k: |gate| < 2^-124 (silu(g) ~ g / 2), |up| < 2^-126, |y| < 2^-125 (silu(g) * up: silu
    is 0 or at least 2^-122, as exp(88.72) is the largest finite; ggml_v_expf's own subnormal results
    only ever meet 1 + e == 1);
    both: a row whose largest |y| is below 2^-118 (its Q8_K d = max / 127 may be subnormal; at or above
    it iscale * y, when subnormal, rounds to the code 0 with or without flushing)."""
    rows = back.reshape(-1, back.shape[-1])
    with np.errstate(invalid="ignore"):
        top = np.where(np.isfinite(rows), np.abs(rows), 0).max(axis=1)
    bad = (top != 0) & (top < 2.0**-118)
    if op == RMS:
        bad |= _tiny(inputs["x"], 2.0**-50) | _tiny(back, 2.0**-100)
        g = np.abs(inputs["gamma"].astype(np.float64))
        if ((g != 0) & ((g < 2.0**-50) | (g > 2.0**26))).any():
            bad[:] = True
    else:
        bad |= _tiny(inputs["gate"], 2.0**-124) | _tiny(inputs["up"], 2.0**-126) | _tiny(back, 2.0**-125)
    return bad


SIMD_MODES = {"off": ("sse2",), "on": ("avx2", "avx512"), "either": SIMDS}


def _fused_numerics(op: str) -> Callable[..., list[Expected]]:
    """The readings of a fused producer: its Q8_K bytes with the stale ``bsums`` of all-zero blocks
    unchecked (always: ggml leaves them unwritten), ``nan=ieee`` the NaN values' own codes and their
    block sums unchecked (as q8_k_quant), and with flush-to-zero the rows ``_ftz_unmodelled`` names
    unchecked. silu_mul_q8_k: ggml_v_expf's ``sse2`` branch (no FMA: strict, ``fma=off``), its
    ``avx2`` (every MADD one fmaf: also NEON) and ``avx512`` (scalef) branches under ``fma=on``, all
    three under ``fma=either``. RMSNorm has no product feeding an add (the squares are widened to
    double before the sum): ``fma`` changes nothing there. A bfloat16 row may hold any NaN where the
    reference holds one (``_deliver``)."""

    def numerics(
        inputs: dict[str, np.ndarray], params: dict[str, Any], contract: Contract, ftz: bool
    ) -> list[Expected]:
        out_dtype = params["out_dtype"]
        readings = []
        for simd in SIMD_MODES[contract.fma] if op == SILU else ("sse2",):
            if op == RMS:
                y, q = rms_norm_q8_k(inputs["x"], inputs["gamma"], params["eps"], out_dtype)
            else:
                y, q = silu_mul_q8_k(inputs["gate"], inputs["up"], out_dtype, simd=simd)
            back = y if out_dtype == "float32" else bf16_bits_to_fp32(y)
            q_mask = q8_k_stale_mask(back)
            if contract.nan == "ieee":
                q_mask |= _nan_bytes(np.isnan(back), Q8_K)
            y_mask = None
            if ftz:
                rows = _ftz_unmodelled(op, inputs, back).reshape(*back.shape[:-1], 1)
                if rows.any():
                    y_mask = np.broadcast_to(rows, y.shape).copy()
                    q_mask |= rows
            label = "reference" if op == RMS else f"ggml_v_expf {simd} branch"
            accept = None if y.dtype == np.float32 else _any_bf16_nan_where(_bf16_nan(y))
            readings.append(Expected(label, (y, q), mask=(y_mask, q_mask), plain=simd == "sse2", accept=accept))
        return readings

    return numerics


def _any_bf16_nan_where(nan: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """The ``accept`` of a bfloat16 row: any NaN bit pattern where the reference holds a NaN (the
    fp32 path compares NaN with NaN already)."""
    return lambda got: nan & _bf16_nan(got)


def _fused_bind(op: str) -> Callable[[tuple, Any], Bound]:
    def bind(args: tuple, kwargs: Any) -> Bound:
        if op == RMS:
            c = call_arguments(rms_norm_q8_k, args, kwargs)
            (shape, dtype), q8 = check_rms_args(c["x"], c["gamma"], c["eps"], c["out_dtype"])
            tensors = {"x": ("x", np.dtype(np.float32)), "gamma": ("gamma", np.dtype(np.float32))}
            extra: dict[str, int | float] = {"eps": float(np.float32(c["eps"]))}
        else:
            c = call_arguments(silu_mul_q8_k, args, kwargs)
            (shape, dtype), q8 = check_silu_args(c["gate"], c["up"], c["out_dtype"])
            if c["simd"] != "sse2":
                raise Declined("simd: the ABI has no simd argument (a kernel's v_expf branch is its contract's fma)")
            tensors = {"gate": ("gate", np.dtype(np.float32)), "up": ("up", np.dtype(np.float32))}
            extra = {}
        k = shape[-1]
        rows = int(np.prod(shape[:-1], dtype=np.int64))
        scalars = {"rows": rows, "K": k, "out_dtype": DTYPE[c["out_dtype"]], **extra}
        return Bound(tensors, shape, dtype, scalars, rows * k, more_outs=(q8,))

    return bind


def _fused_abi(op: str) -> Abi:
    if op == RMS:
        ins = (
            In("x", "float", "float32", "(rows, K)"),
            In("gamma", "float", "float32", "(K,)", "RMSNorm weight"),
        )
        what = "y = f32(f32(x * scale) * gamma), scale = 1 / sqrtf(mean(x^2) + eps), the squares summed in double"
    else:
        ins = (In("gate", "float", "float32", "(rows, K)"), In("up", "float", "float32", "(rows, K)"))
        what = "y = silu(gate) * up, silu(g) = g / (1 + ggml_v_expf(-g))"
    return Abi(
        (
            *ins,
            Out("y", "void", "float32 | bfloat16 bits (out_dtype)", "(rows, K)", "the row in out_dtype"),
            Out("y_q8_k", "unsigned char", "uint8", "(rows, K / 256 * 292)", "Q8_K blocks of y as stored"),
            I64("rows", "rows (the product of the leading dimensions)"),
            I64("K", "row width, a multiple of 256"),
            I64("out_dtype", "y's type: float32 or bfloat16 (round to nearest even)", DTYPE),
            *((F32("eps", "added to the mean of squares"),) if op == RMS else ()),
        ),
        _fused_bind(op),
        f"ggml {'RMSNorm * gamma' if op == RMS else 'SiLU(gate) * up'} stored in out_dtype, then its Q8_K bytes",
        "rows * K outputs (by default a 256-thread block per Q8_K block)",
        notes=(
            what,
            "y_q8_k: quantize_row_q8_K_ref of y as stored (bfloat16 read back), d negative when the max-|y| "
            "value is positive; the bsums of a block whose values are all +-0 or NaN are unchecked (ggml leaves "
            "them unwritten)",
        ),
    )


def _fused_leaves() -> tuple[Leaf, ...]:
    return tuple(
        Leaf(f"Xfp32_Y{OUT_DTYPE_LEAF[d]}_Aq8_K", {"out_dtype": d, "qtype": "Q8_K", "row": ROW_LOGICAL[d]})
        for d in ("float32", "bfloat16")
    )


def _decode_row(y: np.ndarray, params: dict[str, Any]) -> np.ndarray:
    return y if y.dtype == np.float32 else bf16_bits_to_fp32(y)


def _fused_op(op: str) -> OpSpec:
    leaves = _fused_leaves()
    rms = op == RMS
    first = "x" if rms else "gate"
    return OpSpec(
        name=op,
        family="ggml",
        leaves=leaves,
        oracle=rms_norm_q8_k if rms else silu_mul_q8_k,
        call_args=_rms_call if rms else _silu_call,
        make_inputs=_rms_inputs if rms else _silu_inputs,
        cases=lambda lf, coverage: _fused_cases(op, lf, coverage),
        strategy=lambda lf: _fused_strategy(op, lf),
        validate=(
            (
                lambda inputs, params, out=None: check_rms_args(
                    inputs["x"], inputs["gamma"], params["eps"], params["out_dtype"], out
                )
            )
            if rms
            else (
                lambda inputs, params, out=None: check_silu_args(inputs["gate"], inputs["up"], params["out_dtype"], out)
            )
        ),
        bad_arguments=lambda lf: _fused_bad(op, next(x.params["out_dtype"] for x in leaves if x.name == lf)),
        decode=_decode_row,
        abi=_fused_abi(op),
        check=Check(
            "exact", 0.0, "ggml's CPU ops are elementwise and blockwise in fp32: the row and its Q8_K bytes bit-exact"
        ),
        input_names=("x", "gamma") if rms else ("gate", "up"),
        outputs=("y", "y_q8_k"),
        locate=lambda params, at: f"row {tuple(at[:-1])}, value {at[-1]} (Q8_K block {at[-1] // 256})",
        logical_dtypes={
            first: "float32",
            **({"gamma": "float32"} if rms else {"up": "float32"}),
            "y": "{row}",
            "y_q8_k": "ggml Q8_K blocks (raw bytes)",
        },
        sized_case=lambda lf, rows, seed: Case(op, lf, seed, (rows, 4096), "normal", {"eps": 1e-6} if rms else {}),
        cold_repeat=False,
        numerics=_fused_numerics(op),
    )


RMS_NORM_Q8_K = _fused_op(RMS)
SILU_MUL_Q8_K = _fused_op(SILU)
OPS: tuple[OpSpec, ...] = (MATMUL_BT_QUANT, RMS_NORM_Q8_K, SILU_MUL_Q8_K)

__all__ = [
    "MATMUL_BT_QUANT",
    "OPS",
    "RMS_NORM_Q8_K",
    "SILU_MUL_Q8_K",
    "check_matmul_args",
    "check_rms_args",
    "check_silu_args",
    "matmul_bt_quant",
    "matmul_numerics",
    "matmul_terms",
    "rms_norm_q8_k",
    "silu_mul_q8_k",
]

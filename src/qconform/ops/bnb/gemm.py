"""Catalogue entry gemm_4bit: ``C = A @ W^T + bias`` with ``W`` bitsandbytes' packed 4-bit weight [N, K]
(nn.Linear layout) and a float32 absmax (oracle: ``qconform.oracles.bnb.gemm_4bit``; upstream
bitsandbytes ``gemm_4bit`` op, which ``bnb.matmul_4bit`` calls from 0.50: bitsandbytes/backends/
default/ops.py ``_gemm_4bit_default_impl`` on the CPU, csrc/gemm_4bit_simt.cu on CUDA). Shape
(M, K, N); leaves by activation dtype ``Xfp32_W4_Yfp32``, ``Xfp16_W4_Yfp16``, ``Xbf16_W4_Ybf16``
(bfloat16 as uint16 bits), NF4 or FP4 per case (``quant_type``).

Checked per element against a float64 bound (``Check("bound")``, as matmul_nbits: docs/contracts.md),
because the upstream CPU path ends in a BLAS whose order is its own. The readings:

- variant cpu (default): bitsandbytes' CPU/default path, ``dequantize_4bit(B, ..., A.dtype)`` then
  ``F.linear``: the weights ``T(fl32(code[q] * absmax))`` (one rounding to T), products exact,
  summed in fp32 in any order, bias included, one rounding to T. The same reading describes the CUDA
  MMA kernels (sm75/sm80: one rounding of the weights, fp32 tensor-core sums) and the CUDA fallback.
  The oracle's output is ``T(fl32(sum))`` of the exact float64 sum.
- variant cuda (``--contract variant=cuda``): the SIMT kernel ``gemm_4bit_simt`` when K % blocksize
  == 0 (else bitsandbytes falls back to dequantize + cuBLAS: the cpu reading, flushed): fp16/bf16
  weights ``T(T(code) * T(absmax))`` (two roundings) and products ``T(a * b)`` rounded to T before
  their fp32 sums; fp32 weights ``fl32(code * absmax)`` and FMA. The oracle's output is the SIMT
  order bit for bit (docs/bnb-4bit.md 5.2, verified on an H200); the bound accepts any fp32 order
  of the same rounded products.
- variant rocm: the cpu reading with the ROCm dequantization (the ROCm SIMT paths are unverified).

The bound per element: ``u_T |ref| + (1 + u_T) (8 sqrt(n) u32 sum|terms|) + tiny`` with n = K terms
(+1 for the bias), ``ref`` the reading's float64 sum (qconform.properties.bounds).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from qconform.contracts import Contract
from qconform.errors import ArgumentError
from qconform.ops.abi import DTYPE, I64, Abi, Bound, Enum, In, Out, call_arguments
from qconform.ops.bnb import patterns
from qconform.ops.bnb._common import (
    CARRIER,
    QUANT_TYPES,
    check_absmax,
    check_blocksize,
    check_out,
    choice,
    contract_variant,
    deliver,
    from_f32,
    input_dtype,
    positive_int,
    subnormal,
    to_values,
)
from qconform.ops.spec import BadArgument, Case, Check, Leaf, OpSpec
from qconform.oracles.bnb import BLOCKSIZES, VARIANTS, QuantState, dequantize_4bit, get_4bit_type, quantize_4bit
from qconform.oracles.bnb import gemm_4bit as bnb_gemm_4bit
from qconform.oracles.bnb.codes import native_4bit_table
from qconform.oracles.bnb.fourbit import unpack_nibbles
from qconform.oracles.bnb.gemm import mul_in, round_to
from qconform.readings import ErrorModel, Expected

LEAVES = tuple(
    Leaf(f"X{t}_W4_Y{t}", {"dtype": d}) for t, d in (("fp32", "float32"), ("fp16", "float16"), ("bf16", "bfloat16"))
)
QUANT_TYPE = Enum("quant_type", (("nf4", 0, "NormalFloat4"), ("fp4", 1, "bitsandbytes' FP4 (not OCP E2M1)")))
CHUNK = 1 << 22  # float64 elements per block of products held at once


def check_gemm_args(
    A: Any, B: Any, absmax: Any, bias: Any, K: Any, blocksize: Any, quant_type: Any, out: Any = None
) -> tuple[str, int, int]:
    """The argument rules: (A's dtype name, M, N); N comes from B's size: (N * K + 1) // 2 bytes."""
    k = positive_int("K", K)
    bs = check_blocksize(blocksize)
    choice("quant_type", quant_type, QUANT_TYPES)
    dtype = input_dtype("A", A)
    if A.shape[-1] != k:
        raise ArgumentError(f"A: the last dimension must be K = {k}, got {A.shape[-1]}")
    if not isinstance(B, np.ndarray) or B.dtype != np.uint8:
        raise ArgumentError(f"B: must be a uint8 numpy.ndarray, got {getattr(B, 'dtype', type(B).__name__)}")
    n = 2 * B.size // k
    if n == 0 or (n * k + 1) // 2 != B.size:
        raise ArgumentError(f"B: must hold (N * K + 1) // 2 bytes for N weight rows of K = {k}, got {B.size}")
    check_absmax(absmax, n * k, bs)
    if bias is not None:
        if not isinstance(bias, np.ndarray) or bias.dtype != CARRIER[dtype] or bias.shape != (n,):
            got = f"{getattr(bias, 'dtype', type(bias).__name__)} {getattr(bias, 'shape', '')}"
            raise ArgumentError(f"bias: must be None or an array of A's dtype ({dtype}) and shape ({n},), got {got}")
    check_out(out, CARRIER[dtype], (*A.shape[:-1], n), dtype)
    return dtype, int(np.prod(A.shape[:-1], dtype=np.int64)), n


def _state(absmax: np.ndarray, N: int, K: int, dtype: str, blocksize: int, quant_type: str) -> QuantState:
    return QuantState(absmax, (N, K), dtype, blocksize, get_4bit_type(quant_type), quant_type)


def _simt_weights(B: np.ndarray, absmax: np.ndarray, N: int, K: int, bs: int, qt: str, dtype: str) -> np.ndarray:
    """gemm_4bit_simt's weights as float32 values: fp32 ``fl32(LUT[q] * s)``; fp16/bf16 ``T(T(LUT[q]) * T(s))``."""
    q = unpack_nibbles(B, N * K).astype(np.int64)
    scale = np.repeat(absmax, bs)[: N * K]
    lut = native_4bit_table(qt)
    if dtype == "float32":
        with np.errstate(over="ignore", invalid="ignore"):
            v = (lut[q] * scale).astype(np.float32)
        return np.where(subnormal(v), np.copysign(np.float32(0), v), v).astype(np.float32).reshape(N, K)
    return mul_in(round_to(lut[q], dtype), round_to(scale, dtype), dtype, True).reshape(N, K)


def _terms(
    A: np.ndarray, B: np.ndarray, absmax: np.ndarray, bias: Any, K: int, blocksize: int, quant_type: str,
    variant: str, magnitudes: bool,
) -> tuple[str, np.ndarray, np.ndarray | None, np.ndarray]:  # fmt: skip
    """(label, ref, sum |terms| or None, per-term weights) of a reading: float64 (M, N) sums of the
    reading's terms, the bias included; the weights are the reading's, float64 (N, K)."""
    dtype, M, N = check_gemm_args(A, B, absmax, bias, K, blocksize, quant_type)
    a = to_values(A, dtype).reshape(M, K).astype(np.float64)
    simt = variant == "cuda" and K % blocksize == 0
    if simt:
        w = _simt_weights(B, absmax, N, K, blocksize, quant_type, dtype).astype(np.float64)
        label = "bitsandbytes cuda gemm_4bit_simt (T-rounded weights and products, fp32 sums)"
    else:
        st = _state(absmax, N, K, dtype, blocksize, quant_type)
        w = to_values(dequantize_4bit(B, st, dtype, variant), dtype).reshape(N, K).astype(np.float64)
        label = f"bitsandbytes {variant}: dequantize_4bit to {dtype}, then a GEMM with fp32 sums"
    ref = np.empty((M, N), np.float64)
    mag = np.empty((M, N), np.float64) if magnitudes else None
    with np.errstate(over="ignore", invalid="ignore"):
        if simt and dtype != "float32":  # each product rounded to T: summed exactly here
            step = max(1, CHUNK // max(1, M * K))
            for n0 in range(0, N, step):
                p = mul_in(a[:, None, :].astype(np.float32), w[None, n0 : n0 + step].astype(np.float32), dtype, True)
                p = p.astype(np.float64)
                ref[:, n0 : n0 + step] = p.sum(axis=2)
                if mag is not None:
                    mag[:, n0 : n0 + step] = np.abs(p).sum(axis=2)
        else:
            ref[...] = a @ w.T
            if mag is not None:
                mag[...] = np.abs(a) @ np.abs(w).T
    if bias is not None:
        b64 = to_values(bias, dtype).astype(np.float64)
        ref += b64
        if mag is not None:
            mag += np.abs(b64)
    return label, ref, mag, w


def _output(ref: np.ndarray, dtype: str, ftz: bool) -> np.ndarray:
    """The reading's exact output: ``T(fl32(ref))`` (fp32 flushed with ``ftz``)."""
    with np.errstate(over="ignore", invalid="ignore"):
        v = ref.astype(np.float32)
    if ftz:
        v = np.where(subnormal(v), np.copysign(np.float32(0), v), v).astype(np.float32)
    return from_f32(v, dtype)


def gemm_4bit(
    A: np.ndarray,
    B: np.ndarray,
    absmax: np.ndarray,
    bias: np.ndarray | None = None,
    *,
    K: int,
    blocksize: int,
    quant_type: str,
    out: np.ndarray | None = None,
    variant: str = "cpu",
    ftz: bool = False,
) -> np.ndarray:
    """``A [..., K] @ W^T (+ bias)`` in A's dtype, W the packed [N, K] weight with one float32 absmax per
    block of its flattening: the reading of ``variant`` (module docstring). ``ftz``: the fp32 sum
    flushed before the output rounding (the cuda variant's SIMT kernel always flushes)."""
    dtype, M, N = check_gemm_args(A, B, absmax, bias, K, blocksize, quant_type, out)
    choice("variant", variant, VARIANTS)
    if variant == "cuda" and K % blocksize == 0:
        st = _state(absmax, N, K, dtype, blocksize, quant_type)
        y = bnb_gemm_4bit(A, B, st, bias, order="simt")
    else:
        _, ref, _, _ = _terms(A, B, absmax, bias, K, blocksize, quant_type, variant, False)
        y = _output(ref, dtype, ftz or variant == "cuda").reshape(*A.shape[:-1], N)
    return deliver(y, out)


def _call(inputs: dict[str, Any], params: dict[str, Any]) -> tuple[tuple, dict]:
    args = (inputs["A"], inputs["B"], inputs["absmax"], inputs.get("bias"))
    return args, {k: params[k] for k in ("K", "blocksize", "quant_type")}


def _numerics(inputs: dict[str, Any], params: dict[str, Any], contract: Contract, ftz: bool) -> list[Expected]:
    """The reading the contract's variant selects, bounded per element (qconform.properties.bounds)."""
    variant = contract_variant(contract)
    args, kw = _call(inputs, params)
    label, ref, mag, w = _terms(*args, **kw, variant=variant, magnitudes=True)
    dtype, K, bs, bias = params["dtype"], params["K"], params["blocksize"], inputs.get("bias")
    if variant == "cuda" and K % bs == 0:
        want = gemm_4bit(*args, **kw, variant=variant, ftz=ftz)
    else:
        want = _output(ref, dtype, ftz or variant == "cuda").reshape(*inputs["A"].shape[:-1], -1)
    a = to_values(inputs["A"], dtype).reshape(-1, K).astype(np.float64)
    bias_mag = 0.0 if bias is None else np.abs(to_values(bias, dtype).astype(np.float64))
    model = ErrorModel(
        ref.reshape(want.shape),
        mag.reshape(want.shape),
        (2 * (mag - bias_mag)).reshape(want.shape),  # sum |a| 2|w|: a stored weight moved by its rounding
        params["K"] + (bias is not None),
        params["blocksize"],
        want.dtype,
        label,
        _diagnose(a.astype(np.float32), w.astype(np.float32), params, want.shape),  # exact: T or fp32 values
    )
    return [Expected(label, want, model, plain=variant == "cpu")]


def _diagnose(a: np.ndarray, w: np.ndarray, params: dict[str, Any], shape: tuple[int, ...]) -> Any:
    """(index, got - ref) -> "row m, column n", and the K block whose partial sum the difference
    equals (within 2%, either sign) when one does: a dropped, doubled or misplaced block."""
    K, bs = params["K"], params["blocksize"]

    def where(at: tuple[int, ...], diff: float) -> str:
        row = int(np.ravel_multi_index(at[:-1], shape[:-1])) if len(shape) > 1 else 0
        text = f"row {row}, column {at[-1]}"
        kb = (at[-1] * K + np.arange(K)) // bs - (at[-1] * K) // bs  # blocks run over the flattened weight
        part = np.bincount(kb, weights=a[row] * w[at[-1]])
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(part != 0, diff / part, np.inf)
        b = int(np.argmin(np.abs(np.abs(ratio) - 1)))
        if abs(abs(ratio[b]) - 1) <= 0.02:
            text += f"; the difference is {ratio[b]:+.3f}x the partial sum over weight block {b} of the row"
        return text

    return where


def _make_inputs(case: Case) -> dict[str, np.ndarray]:
    """A normal in T; W normal / sqrt(K) quantized by the oracle (``normal``) or random codes under
    scales ~ 1/sqrt(K) (``random``); a bias ~ N(0, 1), the size of a typical output, so that some
    outputs cancel."""
    p = case.params
    dtype = next(lf.params["dtype"] for lf in LEAVES if lf.name == case.leaf)
    M, K, N = case.shape
    rng = np.random.default_rng(case.seed)
    A = from_f32(rng.standard_normal((M, K)).astype(np.float32), dtype)
    if case.pattern == "random":
        B, absmax = patterns.weights("random", case.seed, N * K, p["blocksize"], p["quant_type"])
        absmax = (rng.uniform(0.5, 2.0, absmax.size) * 1.6 / np.sqrt(K)).astype(np.float32)
    else:
        W = (rng.standard_normal(N * K) / np.sqrt(K)).astype(np.float32)
        packed, state = quantize_4bit(W, p["blocksize"], False, p["quant_type"])
        B, absmax = packed.reshape(-1), state.absmax
    inputs = {"A": A, "B": B, "absmax": absmax}
    if p.get("bias"):
        inputs["bias"] = from_f32(rng.standard_normal(N).astype(np.float32), dtype)
    return inputs


def _with_k(case: Case) -> Case:
    """K in the params (left out of the id): B's size alone does not say where its rows start."""
    return Case(case.op, case.leaf, case.seed, case.shape, case.pattern, {**case.params, "K": case.shape[1]})


def _cases(leaf: str, coverage: int) -> list[Case]:
    """coverage 1 (small: the golden set): M = 1..4, NF4 and FP4, K a multiple of the block and not
    (320 at blocksize 128; 99: an odd N*K, the pad nibble), random codes, a bias; 2: blocksizes
    32..4096 at K = 4096, K not a multiple of the block at larger sizes, M = 12 (12 x 352 x 40), the
    layer weights 4096 x 512 (GQA k/v) and 2048 x 768 (MoE expert) at M = 1 and 16; 3: 4096 x 14336
    (FFN up, M = 1, 8) and 14336 x 4096 (down, M = 1).

    core: shapes production kernels take (pattern ``normal``, seeds 400..413; 1 at coverage 1, 14
    from coverage 2): M = 1, 2, 4, 8, 16, 64 (and 3, 5, 6, 7, 32), K a multiple of the blocksize
    (bitsandbytes' SIMT kernel needs it) and of 256, N a multiple of 8, blocksizes 32..256."""
    out: list[Case] = []

    def add(shape: tuple[int, int, int], seed: int, bs: int, qt: str, bias: bool, pattern: str = "normal") -> None:
        params = {"blocksize": bs, "quant_type": qt} | ({"bias": True} if bias else {})
        out.append(_with_k(Case("gemm_4bit", leaf, seed, shape, pattern, params)))

    add((1, 256, 16), 1, 64, "nf4", True)
    add((2, 320, 8), 2, 128, "fp4", False, "random")
    add((3, 99, 7), 3, 32, "fp4", True)
    if coverage >= 2:
        for i, bs in enumerate(BLOCKSIZES):
            add((2, 4096, 8), 10 + i, bs, QUANT_TYPES[i % 2], i % 3 == 0)
        add((5, 4100, 12), 20, 64, "nf4", True)
        add((7, 1000, 9), 21, 256, "fp4", False, "random")
        add((1, 2056, 24), 22, 1024, "nf4", True)
        add((12, 352, 40), 23, 32, "fp4", True)  # two n-tiles of the mma kernel, a partial K step and row tile
        for i, (K, N) in enumerate(((4096, 512), (2048, 768))):
            add((1, K, N), 300 + 2 * i, 64, "nf4", True)
            add((16, K, N), 301 + 2 * i, 64, "fp4", False)
    if coverage >= 3:
        add((1, 4096, 14336), 310, 64, "nf4", False)
        add((8, 4096, 14336), 311, 64, "fp4", True)
        add((1, 14336, 4096), 312, 64, "nf4", True)
    core = [(4, 256, 16, 64, "nf4", True)] + [
        (1, 4096, 64, 64, "nf4", False), (2, 2048, 32, 128, "fp4", True), (4, 1024, 64, 64, "fp4", False),
        (8, 512, 128, 256, "nf4", True), (16, 4096, 32, 64, "nf4", False), (64, 1024, 64, 32, "fp4", True),
        (1, 1024, 256, 32, "fp4", True), (3, 512, 64, 128, "nf4", False), (5, 256, 128, 64, "fp4", False),
        (6, 1024, 40, 256, "nf4", True), (7, 768, 64, 256, "fp4", False), (32, 512, 64, 64, "nf4", True),
        (64, 256, 128, 128, "nf4", False),
    ]  # fmt: skip
    for i, (M, K, N, bs, qt, bias) in enumerate(core[: 1 if coverage == 1 else None]):
        add((M, K, N), 400 + i, bs, qt, bias)
    return out


def _strategy(leaf: str) -> Any:
    def build(seed: int, m: int, k_blocks: int, extra: int, n: int, bs: int, qt: str, bias: bool, pattern: str) -> Case:
        K = max(1, k_blocks * bs - extra)
        params = {"blocksize": bs, "quant_type": qt} | ({"bias": True} if bias else {})
        return _with_k(Case("gemm_4bit", leaf, seed, (m, K, n), pattern, params))

    return st.builds(
        build,
        seed=st.integers(0, 2**32 - 1),
        m=st.integers(1, 8),
        k_blocks=st.integers(1, 6),
        extra=st.sampled_from((0, 0, 1, 7, 16)),
        n=st.integers(1, 16),
        bs=st.sampled_from(BLOCKSIZES[:4]),
        qt=st.sampled_from(QUANT_TYPES),
        bias=st.booleans(),
        pattern=st.sampled_from(("normal", "random")),
    )


def _bad(leaf: str) -> list[BadArgument]:
    dtype = next(lf.params["dtype"] for lf in LEAVES if lf.name == leaf)
    case = _with_k(
        Case("gemm_4bit", leaf, 3, (2, 64, 4), "normal", {"blocksize": 32, "quant_type": "nf4", "bias": True})
    )
    good = _make_inputs(case)
    p = {"K": 64, "blocksize": 32, "quant_type": "nf4", "dtype": dtype}
    carrier = CARRIER[dtype]
    return [
        BadArgument("K must be a positive int", good, {**p, "K": 0}, arg="K", match="positive"),
        BadArgument(
            "blocksize must be a power of two 32..4096", good, {**p, "blocksize": 16}, arg="blocksize", match="32"
        ),
        BadArgument("quant_type must be nf4 or fp4", good, {**p, "quant_type": "int4"}, arg="quant_type", match="nf4"),
        BadArgument(
            "A must be float32, float16 or bfloat16",
            {**good, "A": good["A"].astype(np.float64)},
            p,
            arg="A",
            match="dtype",
        ),
        BadArgument(
            "A's last dimension must be K",
            {**good, "A": good["A"][:, :63].copy()},
            p,
            arg="A",
            match="last dimension|K = 64",
        ),
        BadArgument("B must be uint8", {**good, "B": good["B"].view(np.int8)}, p, arg="B", match="uint8"),
        BadArgument(
            "B must hold (N * K + 1) // 2 bytes", {**good, "B": good["B"][:100].copy()}, p, arg="B", match="bytes"
        ),
        BadArgument(
            "absmax must hold one float32 per block of W",
            {**good, "absmax": good["absmax"][:7].copy()},
            p,
            arg="absmax",
            match=r"shape|\(8,\)",
        ),
        BadArgument(
            "bias must be (N,) in A's dtype",
            {**good, "bias": np.zeros(5, carrier)},
            p,
            arg="bias",
            match=r"shape|\(4,\)",
        ),
        BadArgument(
            "bias must have A's dtype",
            {**good, "bias": np.zeros(4, np.float64)},
            p,
            arg="bias",
            match="dtype",
        ),
        BadArgument(
            "out must have the output shape",
            good,
            p,
            bad_out=np.zeros((3, 4), carrier),
            arg="out",
            match=r"shape|\(2, 4\)",
        ),
        BadArgument(
            "out must have A's dtype",
            good,
            p,
            bad_out=np.zeros((2, 4), np.float64),
            arg="out",
            match="dtype|" + carrier.name,
        ),
    ]


def _bind(args: tuple, kwargs: Any) -> Bound:
    c = call_arguments(gemm_4bit, args, kwargs)
    dtype, M, N = check_gemm_args(c["A"], c["B"], c["absmax"], c["bias"], c["K"], c["blocksize"], c["quant_type"])
    carrier = CARRIER[dtype]
    tensors = {
        "A": ("A", carrier),
        "B": ("B", np.dtype(np.uint8)),
        "absmax": ("absmax", np.dtype(np.float32)),
        "bias": ("bias", carrier) if c["bias"] is not None else None,
    }
    scalars = {
        "M": M,
        "N": N,
        "K": int(c["K"]),
        "blocksize": int(c["blocksize"]),
        "quant_type": QUANT_TYPE[c["quant_type"]],
        "a_dtype": DTYPE[dtype],
    }
    return Bound(tensors, (*c["A"].shape[:-1], N), carrier, scalars, M * N)


GEMM_ABI = Abi(
    (
        In("A", "void", "float32 | float16 | bfloat16 (a_dtype)", "(M, K)"),
        In(
            "B", "unsigned char", "uint8", "((N * K + 1) / 2)", "W [N, K] flattened, element 2j in byte j's high nibble"
        ),
        In("absmax", "float", "float32", "(ceil(N * K / blocksize))", "one scale per block of W's flattening"),
        In("bias", "void", "A's dtype", "(N,)", optional=True),
        Out("C", "void", "A's dtype", "(M, N)"),
        I64("M", "rows of A (the product of its leading dimensions)"),
        I64("N", "output columns (rows of W)"),
        I64("K", "reduction length"),
        I64("blocksize", "32, 64, ..., 4096: values of W per absmax"),
        I64("quant_type", "the 4-bit code", QUANT_TYPE),
        I64("a_dtype", "A, bias and C element type (bfloat16: its 16 bits)", DTYPE),
    ),
    _bind,
    "bitsandbytes gemm_4bit (matmul_4bit): C = A @ dequantize_4bit(W)^T + bias",
    "M * N outputs",
    lanes=32,
    notes=(
        "w[n, k] = code[q] * absmax[(n*K + k) / blocksize]; C[m, n] = sum_k A[m, k] w[n, k] + bias[n], "
        "each element within its bound from the data and the contract (docs/contracts.md)",
        "the default reading is bitsandbytes' CPU path (weights rounded once to A's dtype, fp32 sums); "
        "--contract variant=cuda: the CUDA SIMT kernel (weights and products rounded to A's dtype)",
    ),
)


def _validate(inputs: dict[str, Any], params: dict[str, Any], out: Any = None) -> None:
    args, kw = _call(inputs, params)
    check_gemm_args(*args, **kw, out=out)


GEMM_4BIT = OpSpec(
    name="gemm_4bit",
    family="bnb",
    leaves=LEAVES,
    oracle=gemm_4bit,
    call_args=_call,
    make_inputs=_make_inputs,
    cases=_cases,
    strategy=_strategy,
    validate=lambda inputs, params, out=None: _validate(inputs, params, out),
    bad_arguments=_bad,
    decode=lambda y, params: to_values(y, params["dtype"]),
    abi=GEMM_ABI,
    check=Check("bound", 0.0, "each element within its bound from the data and the numeric contract"),
    input_names=("A", "B", "absmax", "bias"),
    output_name="C",
    logical_dtypes={
        "A": "{dtype} (bfloat16 as uint16 bits)",
        "B": "{quant_type} codes of W [N, K], 2 per byte, high nibble first",
        "absmax": "float32 per block of {blocksize}",
        "C": "{dtype} (bfloat16 as uint16 bits)",
    },
    sized_case=lambda lf, rows, seed: _with_k(
        Case("gemm_4bit", lf, seed, (1, 4096, rows), "normal", {"blocksize": 64, "quant_type": "nf4"})
    ),
    numerics=_numerics,
)

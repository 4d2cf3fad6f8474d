"""Catalogue entries matmul_nbits and dequantize_nbits (com.microsoft.MatMulNBits; oracles:
``qconform.oracles.ort.matmul_nbits``). Shapes (M, K, N) and (K, N)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
from hypothesis import strategies as st

from qconform.contracts import Contract
from qconform.errors import ArgumentError, Declined
from qconform.ops.abi import DTYPE, I64, Abi, Bound, Enum, In, Out, call_arguments, dtype_code
from qconform.ops.ort._common import ACTS, leaf_params, validating
from qconform.ops.spec import BadArgument, Case, Check, Leaf, OpSpec
from qconform.oracles.ort import check_a, check_nbits_args, dequantize_nbits, matmul_nbits
from qconform.oracles.ort.matmul_nbits import product_terms, uses_int8_activations
from qconform.readings import ErrorModel, Expected

BITS = (2, 3, 4, 8)
ZP_KINDS = ("none", "packed", "float", "uniform")  # matmul_nbits adds "scalar": one zero point, kernel form

# ---------------------------------------------------------------------------------- MatMulNBits


def _nbits_inputs(case: Case, with_a: bool) -> dict[str, np.ndarray]:
    """B (random bytes: every packed value and the padding arbitrary), scales of both signs,
    zero points of the case's kind; A normal."""
    rng = np.random.default_rng(case.seed)
    p = case.params
    bits, bs = p["bits"], p["block_size"]
    M, K, N = case.shape if with_a else (0, *case.shape)
    kb = -(-K // bs)
    act = ACTS[p.get("act", "fp32")]
    inputs = {
        "B": rng.integers(0, 256, (N, kb, bs * bits // 8), dtype=np.uint8),
        "scales": (rng.uniform(0.5, 2.0, (N, kb)) * rng.choice([-1, 1], (N, kb)) * 2.0 ** -(bits + 2)).astype(act),
    }
    zp = p.get("zp", "none")
    if zp == "packed":
        inputs["zero_points"] = rng.integers(0, 256, (N, -(-kb * bits // 8)), dtype=np.uint8)
    elif zp == "float":
        inputs["zero_points"] = rng.uniform(0, 2**bits - 1, (N, kb)).astype(act)
    elif zp in ("uniform", "scalar"):
        mid = np.array(2 ** (bits - 1) - 0.5, act)
        inputs["zero_points"] = np.full((N, kb), mid, act) if zp == "uniform" and with_a else mid.reshape(1)
    if with_a:
        inputs["A"] = rng.standard_normal((M, K)).astype(act)
        if case.pattern == "spike":  # row 1: one large activation (k = 1) on weights q = z = 2^(bits - 1)
            if act == np.float16:  # fp16's largest beside activations ~1e-3
                inputs["A"][1] *= np.float16(1e-3)
                inputs["A"][1, 1] = 65504
            else:
                inputs["A"][1, 1] = 1e30
            low, byte, shift = (1 << bits) - 1, bits // 8, bits % 8  # field 1 of each row's block 0
            field = inputs["B"][:, 0, byte]
            inputs["B"][:, 0, byte] = (field & (0xFF ^ (low << shift))) | (1 << (bits - 1)) << shift
            if zp == "packed":  # block 0's zero point of every row
                inputs["zero_points"][:, 0] = (inputs["zero_points"][:, 0] & (0xFF ^ low)) | (1 << (bits - 1))
            elif zp == "float":  # block 0's (the other blocks keep their fractions)
                inputs["zero_points"][:, 0] = 2 ** (bits - 1)
            elif zp in ("uniform", "scalar"):  # an integer: q = z exactly
                inputs["zero_points"][...] = 2 ** (bits - 1)
        if case.pattern == "ties8":  # amax 127 * 2^-3 per block: a * inv = k + 0.5 exactly (int8 ties)
            k = rng.integers(-126, 126, (M, K)) + np.where(rng.random((M, K)) < 0.5, 0.5, 0.0)
            k[:, ::bs] = 127
            inputs["A"] = (k / 8).astype(act)
        if case.pattern == "outlier":  # an outlier channel near the end of K, 2^10 above the rest
            inputs["A"][:, K - 3] *= 1024
        if p.get("bias"):
            inputs["bias"] = rng.standard_normal(N).astype(act)
    if p.get("g_idx"):  # a permuted act-order assignment: k's block is g_idx[k], not k // block_size
        inputs["g_idx"] = rng.permutation(np.arange(K) // bs).astype(np.int32)
    return inputs


def _nbits_kwargs(inputs: dict[str, Any], params: dict[str, Any], K: int, N: int) -> dict[str, Any]:
    kw = {"K": K, "N": N, "bits": params["bits"], "block_size": params["block_size"]}
    if params.get("zp") == "scalar" or (params.get("zp") == "uniform" and "A" not in inputs):
        kw["form"] = "kernel"
    return kw


def _kn_from_inputs(inputs: dict[str, Any], params: dict[str, Any]) -> tuple[int, int]:
    """(K, N): K from the case (the packed B does not say where the padding starts), N = B's rows."""
    return int(params["K"]), int(inputs["B"].shape[0])


def _matmul_call(inputs: dict[str, Any], params: dict[str, Any]) -> tuple[tuple, dict]:
    K, N = _kn_from_inputs(inputs, params)
    kw = _nbits_kwargs(inputs, params, K, N)
    kw["accuracy_level"] = params.get("accuracy_level", 0)
    zp, g_idx = inputs.get("zero_points"), inputs.get("g_idx")
    return (inputs["A"], inputs["B"], inputs["scales"], zp, g_idx, inputs.get("bias")), kw


def _dequant_call(inputs: dict[str, Any], params: dict[str, Any]) -> tuple[tuple, dict]:
    K, N = _kn_from_inputs(inputs, params)
    args = (inputs["B"], inputs["scales"], inputs.get("zero_points"), inputs.get("g_idx"))
    return args, _nbits_kwargs(inputs, params, K, N)


_MMA_TILING = (  # (M, K, N), block, zero point, bias: decode M <= 8, prefill beyond; K % 8 != 0 too
    ((1, 2112, 77), 64, "uniform", False),
    ((5, 4100, 45), 128, "packed", True),
    ((8, 1536, 130), 256, "float", False),
    ((37, 1000, 50), 64, "scalar", False),
    ((70, 2056, 33), 64, "none", True),
    ((6, 2112, 40), 64, "none", True),  # the ring kernels with activations read from global memory
    ((130, 1088, 264), 128, "none", False),  # the prefill GEMM: 3 token tiles, 2 row tiles, a half block last
    ((264, 1088, 136), 64, "none", True),  # the wgmma GEMM: 3 token tiles, 2 row tiles, 17 K chunks (4 x 4 + 1)
    ((136, 1024, 72), 64, "packed", False),  # packed zero points: the prefill GEMM with 2 token tiles
    ((272, 640, 40), 128, "packed", False),  # storage=fp16's wgmma GEMM with packed zero points, 10 K chunks
)


def _nbits_cases(op: str, leaf: str, coverage: int, with_a: bool) -> list[Case]:
    """coverage 1: every zero-point kind, K a multiple of the block and not, blocks 16..256, M = 1
    and a few rows; 2: more seeds, M up to 70, bias, accuracy_level 4, the tiling of the
    matrix-unit kernel (K over several warps, partial tiles); 3: the LLM shapes
    (5120x17920, 17920x5120, 5120x5120; M = 1 and 2048) and the 100352x5120 lm_head at M = 1.

    core: shapes production kernels accept, beside the edge shapes above (pattern ``core``,
    seeds 400..421; 3 small ones at coverage 1 (2 without A: the output is N x K floats), 22
    from coverage 2): N in 16..256 (multiples of 8 and 16), K in 256..1024 (multiples of 128
    and of the block), blocks 16..256, M = 1..8, 16, 32, 64, every zero-point kind, bias,
    accuracy_level 4. ONNX Runtime's CUDA GEMVs take only such shapes (microsoft/onnxruntime
    contrib_ops/cuda/quantization: ``TryMatMul4Bits`` in matmul_4bits.cu refuses
    ``n % 8 != 0 || k % 8 != 0 || m > 1`` and dispatches blocks 16, 32, 64, 128;
    ``TryMatMul8Bits`` in matmul_8bits.cu also wants ``256 % block_size == 0`` and
    ``k % block_size == 0``); the edge cases are where such a kernel declines.

    spike (fp32 A, coverage 2; fp16 storage cannot hold it): row 1 holds one activation 1e30 on
    weights that are exactly zero (q = z), the rest normal: the other products of that row sit 2^99
    below it (k = 1: not the first term of a chain that starts at k = 0). M = 6, default zero point
    (a kernel holding a row in fp16 pieces with one shared exponent loses them; rows 4 and 5 in a
    group of 4 tokens of their own); M = 12, packed zero points, K 200 (a kernel applying the zero
    point through sum(a), s (sum a q - z sum a), loses them to cancellation).

    outlier (fp32 A, coverage 2): channel K - 3 of every row 2^10 above the rest, default zero
    point: K 4160, M 3, the row's maximum in the last slice of a kernel that splits K (an fp16 hi +
    lo split whose shared exponent comes from part of the row loses the rest); K 1024, M 4, the
    rows' maxima 3 or 4 different powers of two apart (a split that takes one row's exponent for
    another's).

    spike (fp16 A, coverage 2): row 1 activations ~1e-3 and one 65504 (k = 1) on weights q = z,
    every zero-point kind (float: block 0's zero point 2^(bits - 1), the others' fractional;
    uniform and scalar: 2^(bits - 1) everywhere): M = 6 (the decode kernels), and M = 40 default
    and float (the prefill kernel). A kernel applying the zero point through sum(a) loses the
    row's small products to cancellation (tests/nbits_mma_model.py)."""
    out: list[Case] = []

    def add(shape: tuple[int, ...], seed: int, pattern: str = "normal", **params: Any) -> None:
        out.append(Case(op, leaf, seed, shape, pattern, params))

    sizes = [(64, 64, 8), (40, 16, 5), (600, 128, 3), (1000, 256, 2), (320, 32, 7)]  # (K, block, N)
    for i, (K, bs, N) in enumerate(sizes[: 3 if coverage == 1 else 5]):
        for j, zp in enumerate(ZP_KINDS + (("scalar",) if with_a else ())):
            shape = (1 + (i + j) % 3, K, N) if with_a else (K, N)
            add(shape, 10 * i + j, block_size=bs, zp=zp)
    if coverage >= 2:
        for seed, bs in enumerate((16, 32, 64, 128, 256)):
            add((64, 5 * bs + 3, 9) if with_a else (5 * bs + 3, 9), 100 + seed, block_size=bs, zp="packed")
        if with_a:  # the matrix-unit kernel's tiling: K split over 8 warps, partial row/token tiles
            for seed, (shape, bs, zp, bias) in enumerate(_MMA_TILING):
                add(shape, 150 + seed, block_size=bs, zp=zp, bias=bias)
            add((7, 512, 16), 200, block_size=64, zp="none", bias=True)
            add((7, 500, 16), 201, block_size=32, zp="packed", accuracy_level=4)
            add((1, 512, 16), 202, block_size=64, zp="none", accuracy_level=4)
    core = (  # (M, K, N, block, zero point, matmul-only params); the first 3 at coverage 1
        (1, 256, 16, 32, "packed", {}),
        (8, 256, 16, 128, "float", {}),
        (4, 256, 32, 64, "none", {"bias": True}),
        (1, 512, 128, 64, "packed", {}),
        (2, 1024, 64, 128, "float", {}),
        (4, 256, 128, 16, "uniform", {}),
        (8, 512, 64, 64, "scalar", {}),
        (1, 1024, 256, 128, "packed", {"bias": True}),
        (3, 512, 128, 32, "packed", {}),
        (5, 256, 256, 64, "none", {"bias": True}),
        (6, 1024, 128, 128, "uniform", {}),
        (7, 768, 64, 256, "float", {}),
        (16, 512, 128, 64, "packed", {}),
        (32, 256, 64, 32, "none", {}),
        (64, 1024, 128, 128, "packed", {"bias": True}),
        (16, 256, 256, 16, "float", {}),
        (32, 1024, 64, 256, "scalar", {}),
        (64, 512, 64, 64, "uniform", {}),
        (1, 1024, 128, 32, "packed", {"accuracy_level": 4}),
        (4, 512, 256, 128, "none", {"accuracy_level": 4}),
        (16, 256, 64, 64, "packed", {"accuracy_level": 4}),
        (8, 768, 128, 256, "packed", {}),
    )
    if with_a:  # int8 activation ties (accuracy_level 4): rint half to even
        add((3, 256, 16), 540, "ties8", block_size=64, zp="none", accuracy_level=4)
    for i, zp in enumerate(("none", "packed", "float")):  # g_idx (act order), K ragged
        add((3, 200, 6) if with_a else (200, 6), 530 + i, block_size=32, zp=zp, g_idx=True)
    if coverage >= 2 and with_a and "Xfp32" in leaf:  # fp32's dynamic range: a row an fp16 split or a sum(a) form loses
        add((6, 256, 40), 500, "spike", block_size=64, zp="none", bias=True)
        add((12, 200, 24), 501, "spike", block_size=64, zp="packed")
        add((3, 4160, 24), 503, "outlier", block_size=64, zp="none")  # seeds: no row flagged by the split,
        add((4, 1024, 24), 504, "outlier", block_size=64, zp="none")  # rows of 3 or 4 different exponents
    if coverage >= 2 and with_a and "Xfp16" in leaf:  # a 65504 activation on q = z: the sum(a) form cancels
        for i, zp in enumerate(ZP_KINDS + ("scalar",)):
            add((6, 256, 40), 510 + i, "spike", block_size=64, zp=zp)  # no bias: it would drown row 1 in fp16
        add((40, 256, 40), 515, "spike", block_size=64, zp="none")
        add((40, 320, 24), 516, "spike", block_size=64, zp="float")
    seen = set()
    for i, (M, K, N, bs, zp, extra) in enumerate(core[: (3 if with_a else 2) if coverage == 1 else None]):
        if with_a:
            add((M, K, N), 400 + i, "core", block_size=bs, zp=zp, **extra)
        elif zp != "scalar" and (K, N, bs, zp) not in seen:  # the weights alone: no scalar kind, no A
            seen.add((K, N, bs, zp))
            add((K, N), 400 + i, "core", block_size=bs, zp=zp)
    if coverage >= 3:
        for K, N in ((5120, 17920), (17920, 5120), (5120, 5120)):
            add((1, K, N) if with_a else (K, N), 300, block_size=64, zp="uniform")
        if with_a:
            add((2048, 5120, 5120), 301, block_size=64, zp="packed")
            add((1, 5120, 100352), 302, block_size=64, zp="none")
    return out


def _nbits_strategy(op: str, leaf: str, with_a: bool) -> Any:
    def build(seed: int, m: int, k_blocks: int, extra: int, n: int, bs: int, zp: str) -> Case:
        K = max(1, k_blocks * bs - extra)
        return Case(op, leaf, seed, (m, K, n) if with_a else (K, n), "normal", {"block_size": bs, "zp": zp})

    return st.builds(
        build,
        seed=st.integers(0, 2**32 - 1),
        m=st.integers(1, 8),
        k_blocks=st.integers(1, 6),
        extra=st.integers(0, 15),
        n=st.integers(1, 16),
        bs=st.sampled_from((16, 32, 64, 128, 256)),
        zp=st.sampled_from(ZP_KINDS),
    )


def _int8_path(inputs: dict[str, Any], params: dict[str, Any]) -> bool:
    """ORT CPU's int8 activations apply to this case (the oracle's own rule)."""
    level, zp = params.get("accuracy_level", 0), inputs.get("zero_points")
    return uses_int8_activations(level, zp, None, params["bits"], params["block_size"])


PATHS = {"int8": "int8 activations (ORT CPU's CompInt8)", "float": "fp32 activations"}


def _matmul_numerics(
    inputs: dict[str, Any], params: dict[str, Any], contract: Contract, ftz: bool
) -> list[Expected]:
    """The readings a contract accepts: at accuracy_level 4 (a permission in the op schema: "A
    can be quantized"; ORT's CUDA provider ignores it) ORT CPU's int8 activations, fp32 ones, or
    either (the default); each bounded per element (qconform.properties.bounds)."""
    args, kwargs = _matmul_call(inputs, params)
    if _int8_path(inputs, params):
        paths = {"either": ("int8", "float"), "int8": ("int8",), "float": ("float",)}[contract.level4]
    else:
        paths = ("float",)
    out = []
    for path in paths:
        terms = product_terms(*args, **kwargs, path=path, division_ulp=contract.division, ftz=ftz)
        want = terms.output  # the oracle's Y for this reading
        model = ErrorModel(
            terms.ref,
            terms.mag,
            terms.store_mag,
            terms.n_terms,
            params["block_size"],
            want.dtype,
            PATHS[path],
            _diagnose(terms, want.shape, params),
            terms.slack,
        )
        plain = path == "int8" or not _int8_path(inputs, params)
        out.append(Expected(PATHS[path], want, model, plain=plain))
    return out


def _diagnose(terms: Any, shape: tuple[int, ...], params: dict[str, Any]) -> Any:
    """(index, got - ref) -> "row i, column n", and the K block whose partial sum the difference
    equals (within 2%, either sign) when one does: a dropped, doubled or misplaced block."""

    def where(at: tuple[int, ...], diff: float) -> str:
        row = int(np.ravel_multi_index(at[:-1], shape[:-1])) if len(shape) > 1 else 0
        text = f"row {row}, column {at[-1]}"
        part = np.asarray(terms.partials(row, at[-1]), np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(part != 0, diff / part, np.inf)
        b = int(np.argmin(np.abs(np.abs(ratio) - 1)))
        if abs(abs(ratio[b]) - 1) <= 0.02:
            k0, k1 = b * params["block_size"], min(params["K"], (b + 1) * params["block_size"]) - 1
            text += f"; the difference is {ratio[b]:+.3f}x K block {b}'s partial sum (k {k0}..{k1})"
        return text

    return where


def _nbits_bad(leaf_params: dict[str, Any], with_a: bool) -> list[BadArgument]:
    case = Case("x", "x", 3, (2, 64, 4) if with_a else (64, 4), "normal", {**leaf_params, "block_size": 32})
    good = _nbits_inputs(case, with_a)
    p = {**leaf_params, "block_size": 32, "K": 64}
    out_shape = (2, 4) if with_a else (4, 64)
    out_dtype = ACTS[leaf_params.get("act", "fp32")] if with_a else np.dtype(np.float32)
    # ``match``: the rule's key word or the expected value (the device launchers word a wrong
    # ``out`` as "out: must be float16(2, 4), got ...": the expected shape / dtype appear in both)
    out_rule = f"shape|{re.escape(str(out_shape))}"
    bad = [
        BadArgument("bits must be 2, 3, 4 or 8", good, {**p, "bits": 5}, arg="bits", match="2, 3, 4"),
        BadArgument(
            "block_size must be a power of two >= 16",
            good,
            {**p, "block_size": 24},
            arg="block_size",
            match="power of two",
        ),
        BadArgument(
            "block_size must be a power of two >= 16",
            good,
            {**p, "block_size": 8},
            arg="block_size",
            match=">= ?16|at least 16",
        ),
        # slices copied: a strided view would also break a device launcher's C-contiguity rule
        BadArgument(
            "B must be (N, k_blocks, blob_size)", {**good, "B": good["B"][:, :1].copy()}, p, arg="B", match="shape"
        ),
        BadArgument("B must be uint8", {**good, "B": good["B"].view(np.int8)}, p, arg="B", match="uint8"),
        BadArgument(
            "scales must be (N, k_blocks)",
            {**good, "scales": good["scales"][:, :1].copy()},
            p,
            arg="scales",
            match="shape",
        ),
        BadArgument(
            "scales must be float",
            {**good, "scales": good["scales"].astype(np.float64)},
            p,
            arg="scales",
            match="float32 or float16|float64",
        ),
        BadArgument(
            "packed zero points must be (N, ceil(k_blocks*bits/8))",
            {**good, "zero_points": np.zeros((4, 7), np.uint8)},
            p,
            arg="zero_points",
            match="shape",
        ),
        BadArgument(
            "zero points must be uint8 or the scales' type",
            {**good, "zero_points": np.zeros((4, 2), np.int32)},
            p,
            arg="zero_points",
            match="dtype|int32",
        ),
        BadArgument(
            "out must have the output shape",
            good,
            p,
            bad_out=np.zeros((out_shape[0] + 1, out_shape[1]), out_dtype),
            arg="out",
            match=out_rule,
        ),
        BadArgument(
            "out must have the output dtype",
            good,
            p,
            bad_out=np.zeros(out_shape, np.float64),
            arg="out",
            match=out_dtype.name,
        ),
    ]
    if with_a:
        bad += [
            BadArgument(
                "A's last dimension must be K",
                {**good, "A": good["A"][:, :63].copy()},
                p,
                arg="A",
                match="last dimension|K = 64",
            ),
            BadArgument(
                "A must be float32 or float16",
                {**good, "A": good["A"].astype(np.float64)},
                p,
                arg="A",
                match="float32 or float16|float64",
            ),
            BadArgument(
                "bias must be (N,)",
                {**good, "bias": np.zeros(5, good["A"].dtype)},
                p,
                arg="bias",
                match=r"shape|\(4,\)",
            ),
        ]
    return bad


# ------------------------------------------------------------------------------------ device ABI

ZP_KIND = Enum(
    "zp_kind",
    (
        ("none", 0, "zero_points null: 2^(bits-1)"),
        ("packed", 1, "uint8 (N, ceil(k_blocks*bits/8)), low bits first: fp32((q - z) * s)"),
        ("float", 2, "scales' dtype (N, k_blocks), ORT's form fp32(q*s) + fp32(-s*z)"),
        ("scalar", 3, "one float32 value, the kernel form fp32(fp32(q - z) * s)"),
    ),
)


def zero_point_kind(zero_points: Any, form: str) -> str:
    """How ``zero_points`` is given, as the ABI and qconform's kernels take it (``ZP_KIND``):
    none, packed uint8, float per block (ORT's form), or one scalar (the kernel form). Per-block
    zero points in the kernel form have no kernel: Declined."""
    if zero_points is None:
        return "none"
    if zero_points.dtype == np.uint8:
        return "packed"
    if form == "kernel" and zero_points.size == 1:
        return "scalar"
    if form == "kernel":
        raise Declined("zero_points: no kernel takes per-block zero points in the kernel form")
    return "float"


def _bind_weights(a: dict[str, Any]) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """(layout, pointer bindings, scalars) of B / scales / zero_points, by the oracle's own checks."""
    B, scales, zp, form = a["B"], a["scales"], a["zero_points"], a["form"]
    if a["g_idx"] is not None:
        raise Declined("g_idx: the ABI has no g_idx (deprecated in ORT)")
    lay = check_nbits_args(
        B, scales, zp, None, K=a["K"], N=a["N"], bits=a["bits"], block_size=a["block_size"], form=form
    )
    if scales.shape != (lay.N, lay.k_blocks):
        raise Declined(f"scales: the ABI passes them as (N, k_blocks), got {scales.shape}")
    kind = zero_point_kind(zp, form)
    zdtype = {"packed": np.dtype(np.uint8), "scalar": np.dtype(np.float32), "float": scales.dtype}.get(kind)
    zbind = None if zdtype is None else ("zero_points", zdtype)
    tensors = {"B": ("B", np.dtype(np.uint8)), "scales": ("scales", scales.dtype), "zero_points": zbind}
    sizes = {"K": lay.K, "N": lay.N, "bits": lay.bits, "block_size": lay.block_size, "zp_kind": ZP_KIND[kind]}
    return lay, tensors, sizes


def _matmul_bind(args: tuple, kwargs: Any) -> Bound:
    c = call_arguments(matmul_nbits, args, kwargs)
    lay, tensors, sizes = _bind_weights(c)
    a = check_a(c["A"], c["bias"], lay)
    if c["accuracy_level"] not in (0, 1, 2, 3, 4):
        raise ArgumentError(f"accuracy_level: must be 0..4, got {c['accuracy_level']!r}")
    if c["scales"].dtype != a.dtype:
        raise Declined(f"scales: the ABI passes them in A's dtype {a.dtype}, got {c['scales'].dtype}")
    M = int(np.prod(a.shape[:-1], dtype=np.int64))
    bias = ("bias", a.dtype) if c["bias"] is not None else None
    scalars = {"M": M, **sizes, "a_dtype": dtype_code(a.dtype), "accuracy_level": c["accuracy_level"]}
    return Bound({"A": ("A", a.dtype), **tensors, "bias": bias}, (*a.shape[:-1], lay.N), a.dtype, scalars, M * lay.N)


def _dequant_bind(args: tuple, kwargs: Any) -> Bound:
    c = call_arguments(dequantize_nbits, args, kwargs)
    lay, tensors, sizes = _bind_weights(c)
    scalars = {**sizes, "s_dtype": dtype_code(c["scales"].dtype)}
    return Bound(tensors, (lay.N, lay.K), np.dtype(np.float32), scalars, lay.N * lay.K)


_NOTES = (
    "B: the value q at K index k of column n is field j = k % block_size of blob B[n, k / block_size]: "
    "bits [j*bits, j*bits + bits) counted from bit 0 of the blob's byte 0 (low bits first; 3-bit fields may "
    "straddle bytes); the last block is padded and its padding never read",
    "zero_points packed (zp_kind packed): field kb of row n, packed the same way; default (none): 2^(bits-1)",
    "w = fp32((q - z) * s) for integer zero points, fp32(q*s) + fp32(-s*z) for float ones (ORT's two roundings), "
    "fp32(fp32(q - z) * s) for the scalar kind",
)
_WEIGHT_ARGS = (
    In(
        "B",
        "unsigned char",
        "uint8",
        "(N, k_blocks, block_size * bits / 8)",
        "column n's K values, low bits first; the last block padded",
    ),
    In("scales", "void", "a_dtype | s_dtype", "(N, k_blocks)"),
    In("zero_points", "void", "by zp_kind", "(see zp_kind)", optional=True),
)
_WEIGHT_SIZES = (
    I64("K", "reduction length (k_blocks = ceil(K / block_size))"),
    I64("N", "output columns (rows of B)"),
    I64("bits", "2, 3, 4 or 8"),
    I64("block_size", "a power of two >= 16"),
    I64("zp_kind", "how zero_points is given", ZP_KIND),
)
MATMUL_ABI = Abi(
    (
        In("A", "void", "float16 | float32 (a_dtype)", "(M, K)"),
        *_WEIGHT_ARGS,
        In("bias", "void", "A's dtype", "(N,)", optional=True),
        Out("Y", "void", "A's dtype", "(M, N)"),
        I64("M", "rows of A (the product of its leading dimensions)"),
        *_WEIGHT_SIZES,
        I64("a_dtype", "A, scales, bias and Y element type", DTYPE),
        I64("accuracy_level", "0-4; 4: ORT's int8 activation path (integer zero points)"),
    ),
    _matmul_bind,
    "com.microsoft.MatMulNBits: Y = A @ dequant(B)^T (+ bias)",
    "M * N outputs",
    lanes=32,
    notes=(
        *_NOTES,
        "Y[m, n] = sum_k A[m, k] w[n, k] (+ bias[n]): fp32 sums in any order (each element within its "
        "bound from the data and the contract: docs/contracts.md), fp16 Y rounded once; accuracy_level 4 "
        "with integer zero points: ORT's int8 activations or fp32 ones (qconform.oracles.ort.matmul_nbits)",
    ),
)
DEQUANT_ABI = Abi(
    (
        *_WEIGHT_ARGS,
        Out("Y", "float", "float32", "(N, K)"),
        *_WEIGHT_SIZES,
        I64("s_dtype", "scales' element type (float zero points share it)", DTYPE),
    ),
    _dequant_bind,
    "MatMulNBits weight dequantization: W (N, K) float32",
    "N * K outputs",
    notes=(*_NOTES, "Y[n, k] = w[n, k], bit-exact"),
)


def _nbits_op(with_a: bool) -> OpSpec:
    name = "matmul_nbits" if with_a else "dequantize_nbits"
    leaves = tuple(
        Leaf(f"X{a}_Wu{b}_Y{a}", {"bits": b, "act": a}) if with_a else Leaf(f"Wu{b}_Yfp32", {"bits": b})
        for a in (("fp16", "fp32") if with_a else ("fp32",))
        for b in BITS
    )

    def make_inputs(case: Case) -> dict[str, np.ndarray]:
        return _nbits_inputs(
            Case(
                case.op,
                case.leaf,
                case.seed,
                case.shape,
                case.pattern,
                {**leaf_params(leaves, case.leaf), **case.params},
            ),
            with_a,
        )

    return OpSpec(
        name=name,
        family="ort",
        leaves=leaves,
        oracle=matmul_nbits if with_a else dequantize_nbits,
        call_args=_matmul_call if with_a else _dequant_call,
        make_inputs=make_inputs,
        cases=lambda lf, coverage: [_with_k(c) for c in _nbits_cases(name, lf, coverage, with_a)],
        strategy=lambda lf: _nbits_strategy(name, lf, with_a).map(_with_k),
        validate=validating(matmul_nbits if with_a else dequantize_nbits, _matmul_call if with_a else _dequant_call),
        bad_arguments=lambda lf: _nbits_bad(leaf_params(leaves, lf), with_a),
        decode=lambda y, params: y,
        abi=MATMUL_ABI if with_a else DEQUANT_ABI,
        check=Check("bound", 0.0, "each element within its bound from the data and the numeric contract")
        if with_a
        else Check("exact", 0.0, "dequantization is elementwise: bits must match"),
        input_names=("A", "B", "scales", "zero_points", "bias") if with_a else ("B", "scales", "zero_points"),
        logical_dtypes={"B": "uint{bits} packed along K, low bits first", "zero_points": "uint{bits} packed or float"},
        cold_repeat=with_a,
        numerics=_matmul_numerics if with_a else None,
        sized_case=lambda lf, rows, seed: _with_k(
            Case(
                name,
                lf,
                seed,
                (1, 5120, rows) if with_a else (5120, rows),
                "normal",
                {"block_size": 64, "zp": "packed"},
            )
        ),
    )


def _with_k(case: Case) -> Case:
    """Put K in the case params: the packed B does not say where the last block's padding starts."""
    K = case.shape[1] if len(case.shape) == 3 else case.shape[0]
    return Case(case.op, case.leaf, case.seed, case.shape, case.pattern, {**case.params, "K": K})


MATMUL_NBITS = _nbits_op(True)
DEQUANTIZE_NBITS = _nbits_op(False)

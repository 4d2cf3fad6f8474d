"""Catalogue entries for the ONNX Runtime quantized-weight family (oracles: ``qconform.oracles.ort``).

Ops and leaves (named as the kernels' unit tests name them):
  matmul_nbits            X{fp16,fp32}_Wu{2,3,4,8}_Y{fp16,fp32}   shape (M, K, N)
  dequantize_nbits        Wu{2,3,4,8}_Yfp32                        shape (K, N)
  gather_block_quantized  Xi64_Wu4_Yfp16, Xi64_Wu8_Yfp16, Xi64_Wi4_Yfp16, Xi64_Wfp8_Yfp16
                                                                   shape (rows, cols, n_indices)
  fake_quantize           Xfp32_Q{u8,i8,u16,i16,u4,i4}_Yfp32, Xfp16_Qu8_Yfp16   shape (rows, cols)
  qswiglu                 Xu16_Yu16, Xu8_Yu8                       shape (rows, cols)
A ``py:`` drop-in is called as the oracle is: ``fn(*call_args)`` with the ONNX op's argument and
attribute names. Zero-point kinds in the MatMulNBits cases: none (default 2**(bits-1)), packed
uint8, float (per block), uniform (every float zero point equal: dequantize_nbits compares those in
the kernel form ``(q - z) * s`` with one scalar zero point, matmul_nbits in ORT's form), and for
matmul_nbits scalar (the decode kernels' uniform path: one zero point, the kernel form).
No case holds an fp32 subnormal, so the oracles' ftz changes nothing here.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
from hypothesis import strategies as st

from qconform.ops.spec import BadArgument, Case, Check, Leaf, OpSpec
from qconform.oracles.ort import (
    dequantize_nbits,
    fake_quantize,
    gather_block_quantized,
    matmul_nbits,
    qswiglu,
)
from qconform.oracles.ort.qdq import QTYPES
from qconform.oracles.ort.qswiglu import STEPS as SWIGLU_STEPS

BITS = (2, 3, 4, 8)
ACTS = {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16)}
ZP_KINDS = ("none", "packed", "float", "uniform")  # matmul_nbits adds "scalar": one zero point, kernel form
U32 = np.float32(2.0**-24)

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
        if p.get("bias"):
            inputs["bias"] = rng.standard_normal(N).astype(act)
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
    args = (inputs["A"], inputs["B"], inputs["scales"], inputs.get("zero_points"), None, inputs.get("bias"))
    return args, kw


def _dequant_call(inputs: dict[str, Any], params: dict[str, Any]) -> tuple[tuple, dict]:
    K, N = _kn_from_inputs(inputs, params)
    return (inputs["B"], inputs["scales"], inputs.get("zero_points")), _nbits_kwargs(inputs, params, K, N)


_MMA_TILING = (  # (M, K, N), block, zero point, bias: decode M <= 8, prefill beyond; K % 8 != 0 too
    ((1, 2112, 77), 64, "uniform", False),
    ((5, 4100, 45), 128, "packed", True),
    ((8, 1536, 130), 256, "float", False),
    ((37, 1000, 50), 64, "scalar", False),
    ((70, 2056, 33), 64, "none", True),
)


def _nbits_cases(op: str, leaf: str, coverage: int, with_a: bool) -> list[Case]:
    """coverage 1: every zero-point kind, K a multiple of the block and not, blocks 16..256, M = 1
    and a few rows; 2: more seeds, M up to 70, bias, accuracy_level 4, the tiling of the
    matrix-unit kernel (K over several warps, partial tiles); 3: the LLM shapes
    (5120x17920, 17920x5120, 5120x5120; M = 1 and 2048) and the 100352x5120 lm_head at M = 1."""
    out: list[Case] = []

    def add(shape: tuple[int, ...], seed: int, **params: Any) -> None:
        out.append(Case(op, leaf, seed, shape, "normal", params))

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


def _matmul_tol(params: dict[str, Any]) -> float:
    """fp32 accumulation in any order errs by at most gamma_K = K*u/(1-K*u) relative to
    sum|a||w| (Higham 3.5); on random data the relL2 sits near sqrt(K)*u. Allow 4*sqrt(K)*u, and
    for fp16 outputs one fp16 rounding (2^-11 relative) on top."""
    k = params.get("K", 4096)
    tol = 4 * math.sqrt(k) * float(U32)
    if params.get("act") == "fp16":
        tol += 2.0**-11
    if params.get("accuracy_level") == 4:
        tol += 1.5e-7 * 8
    return tol


def _nbits_bad(leaf_params: dict[str, Any], with_a: bool) -> list[BadArgument]:
    case = Case("x", "x", 3, (2, 64, 4) if with_a else (64, 4), "normal", {**leaf_params, "block_size": 32})
    good = _nbits_inputs(case, with_a)
    p = {**leaf_params, "block_size": 32, "K": 64}
    out_shape = (2, 4) if with_a else (4, 64)
    out_dtype = ACTS[leaf_params.get("act", "fp32")] if with_a else np.dtype(np.float32)
    bad = [
        BadArgument("bits must be 2, 3, 4 or 8", good, {**p, "bits": 5}),
        BadArgument("block_size must be a power of two >= 16", good, {**p, "block_size": 24}),
        BadArgument("block_size must be a power of two >= 16", good, {**p, "block_size": 8}),
        BadArgument("B must be (N, k_blocks, blob_size)", {**good, "B": good["B"][:, :1]}, p),
        BadArgument("B must be uint8", {**good, "B": good["B"].view(np.int8)}, p),
        BadArgument("scales must be (N, k_blocks)", {**good, "scales": good["scales"][:, :1]}, p),
        BadArgument("scales must be float", {**good, "scales": good["scales"].astype(np.float64)}, p),
        BadArgument(
            "packed zero points must be (N, ceil(k_blocks*bits/8))",
            {**good, "zero_points": np.zeros((4, 7), np.uint8)},
            p,
        ),
        BadArgument(
            "zero points must be uint8 or the scales' type", {**good, "zero_points": np.zeros((4, 2), np.int32)}, p
        ),
        BadArgument(
            "out must have the output shape", good, p, bad_out=np.zeros((out_shape[0] + 1, out_shape[1]), out_dtype)
        ),
        BadArgument("out must have the output dtype", good, p, bad_out=np.zeros(out_shape, np.float64)),
    ]
    if with_a:
        bad += [
            BadArgument("A's last dimension must be K", {**good, "A": good["A"][:, :63].copy()}, p),
            BadArgument("A must be float32 or float16", {**good, "A": good["A"].astype(np.float64)}, p),
            BadArgument("bias must be (N,)", {**good, "bias": np.zeros(5, good["A"].dtype)}, p),
        ]
    return bad


def validating(oracle: Callable[..., np.ndarray], call: Callable[..., tuple[tuple, dict]]) -> Callable[..., Any]:
    """An OpSpec.validate that runs the oracle's own argument checks (they all precede any work)."""

    def validate(inputs: dict[str, Any], params: dict[str, Any], out: Any = None) -> None:
        args, kw = call(inputs, params)
        oracle(*args, **kw, out=out)

    return validate


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
                {**_leaf_params(leaves, case.leaf), **case.params},
            ),
            with_a,
        )

    def output_spec(inputs: dict[str, Any], params: dict[str, Any]) -> tuple[tuple[int, ...], np.dtype]:
        K, N = _kn_from_inputs(inputs, params)
        if with_a:
            return (*inputs["A"].shape[:-1], N), inputs["A"].dtype
        return (N, K), np.dtype(np.float32)

    return OpSpec(
        name=name,
        family="ort",
        leaves=leaves,
        oracle=matmul_nbits if with_a else dequantize_nbits,
        call_args=_matmul_call if with_a else _dequant_call,
        output_spec=output_spec,
        make_inputs=make_inputs,
        cases=lambda lf, coverage: [_with_k(c) for c in _nbits_cases(name, lf, coverage, with_a)],
        strategy=lambda lf: _nbits_strategy(name, lf, with_a).map(_with_k),
        validate=validating(matmul_nbits if with_a else dequantize_nbits, _matmul_call if with_a else _dequant_call),
        bad_arguments=lambda lf: _nbits_bad(_leaf_params(leaves, lf), with_a),
        decode=lambda y, params: y,
        check=Check("rel_l2", 1e-5, "fp32 accumulation order is the implementation's", tol_for=_matmul_tol)
        if with_a
        else Check("exact", 0.0, "dequantization is elementwise: bits must match"),
        input_names=("A", "B", "scales", "zero_points", "bias") if with_a else ("B", "scales", "zero_points"),
        logical_dtypes={"B": "uint{bits} packed along K, low bits first", "zero_points": "uint{bits} packed or float"},
        doc="com.microsoft.MatMulNBits (ORT x86 CPU)" if with_a else "MatMulNBits weight dequantization",
        cold_repeat=with_a,
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


def _leaf_params(leaves: tuple[Leaf, ...], name: str) -> dict[str, Any]:
    for lf in leaves:
        if lf.name == name:
            return dict(lf.params)
    raise KeyError(name)


# ------------------------------------------------------------------------- GatherBlockQuantized

GATHER_LEAVES = (
    Leaf("Xi64_Wu4_Yfp16", {"data_type": "uint8", "bits": 4}),
    Leaf("Xi64_Wu8_Yfp16", {"data_type": "uint8", "bits": 8}),
    Leaf("Xi64_Wi4_Yfp16", {"data_type": "int4", "bits": 4}),
    Leaf("Xi64_Wfp8_Yfp16", {"data_type": "float8e4m3fn", "bits": 8}),
)


def _gather_inputs(case: Case) -> dict[str, np.ndarray]:
    """An embedding table (rows, cols) of random codes, fp16 scales per block of the last axis,
    zero points when the case asks; indices in range, negative ones included."""
    p = {**_leaf_params(GATHER_LEAVES, case.leaf), **case.params}
    rng = np.random.default_rng(case.seed)
    rows, cols, n_idx = case.shape
    bs, dt, bits = p["block_size"], p["data_type"], p["bits"]
    nb = -(-cols // bs)
    inputs: dict[str, np.ndarray] = {
        "indices": rng.integers(-rows, rows, n_idx).astype(np.int64),
        "scales": rng.uniform(0.001, 0.05, (rows, nb)).astype(np.float16),
    }
    if dt == "uint8":
        inputs["data"] = rng.integers(0, 256, (rows, cols * bits // 8), dtype=np.uint8)
        if p.get("zp"):
            inputs["zero_points"] = rng.integers(0, 256, (rows, -(-nb * bits // 8)), dtype=np.uint8)
    elif dt == "int4":
        inputs["data"] = rng.integers(0, 256, -(-rows * cols // 2), dtype=np.uint8)
        if p.get("zp"):
            inputs["zero_points"] = rng.integers(0, 256, -(-rows * nb // 2), dtype=np.uint8)
    else:
        codes = rng.integers(0, 256, (rows, cols), dtype=np.uint8)
        codes[(codes & 0x7F) == 0x7F] = 0x38  # no NaN codes: 1.0 instead
        inputs["data"] = codes
    return inputs


def _gather_call(inputs: dict[str, Any], params: dict[str, Any]) -> tuple[tuple, dict]:
    kw = {
        "bits": params["bits"],
        "block_size": params["block_size"],
        "gather_axis": 0,
        "quantize_axis": 1,
        "data_type": params["data_type"],
    }
    if params["data_type"] == "int4":
        kw["data_shape"] = (params["rows"], params["cols"])
    return (inputs["data"], inputs["indices"], inputs["scales"], inputs.get("zero_points")), kw


def _gather_cases(leaf: str, coverage: int) -> list[Case]:
    """Embedding tables: coverage 1 small, 2 more seeds and block sizes, 3 a 100352 x 5120 vocab."""
    out = []
    fp8 = "fp8" in leaf
    shapes = [(64, 256, 7, 32), (33, 128, 16, 64), (100, 512, 3, 128)]
    if coverage >= 2:
        shapes += [(1000, 1024, 64, 128), (17, 64, 40, 16)]
    if coverage >= 3:
        shapes += [(100352, 5120, 32, 128)]
    for i, (rows, cols, n, bs) in enumerate(shapes):
        for zp in (False,) if fp8 else (False, True):
            params = {"block_size": bs, "zp": zp, "rows": rows, "cols": cols}
            out.append(Case("gather_block_quantized", leaf, 50 + i, (rows, cols, n), "normal", params))
    return out


def _gather_bad(leaf: str) -> list[BadArgument]:
    p = {**_leaf_params(GATHER_LEAVES, leaf), "block_size": 32, "zp": False, "rows": 8, "cols": 64}
    good = _gather_inputs(Case("gather_block_quantized", leaf, 1, (8, 64, 3), "normal", p))
    return [
        BadArgument("indices must be int32/int64", {**good, "indices": good["indices"].astype(np.float32)}, p),
        BadArgument("scales must be float32/float16", {**good, "scales": good["scales"].astype(np.float64)}, p),
        BadArgument(
            "scales must have ceil(cols/block_size) blocks",
            {**good, "scales": np.concatenate([good["scales"], good["scales"][:, :1]], axis=1)},
            p,
        ),
        BadArgument("block_size must be a power of two >= 16", good, {**p, "block_size": 12}),
        BadArgument("data must be uint8 bytes", {**good, "data": good["data"].view(np.int8)}, p),
        BadArgument("out must have the output shape", good, p, bad_out=np.zeros((3, 65), np.float16)),
    ]


GATHER = OpSpec(
    name="gather_block_quantized",
    family="ort",
    leaves=GATHER_LEAVES,
    oracle=gather_block_quantized,
    call_args=_gather_call,
    output_spec=lambda inputs, params: ((len(inputs["indices"]), params["cols"]), inputs["scales"].dtype),
    make_inputs=_gather_inputs,
    cases=_gather_cases,
    strategy=lambda lf: st.builds(
        lambda seed, rows, blocks, n, bs, zp: Case(
            "gather_block_quantized",
            lf,
            seed,
            (rows, blocks * bs, n),
            "normal",
            {"block_size": bs, "zp": zp and "fp8" not in lf, "rows": rows, "cols": blocks * bs},
        ),
        seed=st.integers(0, 2**32 - 1),
        rows=st.integers(1, 64),
        blocks=st.integers(1, 4),
        n=st.integers(1, 16),
        bs=st.sampled_from((16, 32, 64, 128)),
        zp=st.booleans(),
    ),
    validate=validating(gather_block_quantized, _gather_call),
    bad_arguments=_gather_bad,
    decode=lambda y, params: y,
    check=Check("exact", 0.0, "one integer subtraction and one fp32 multiply per element, one fp16 rounding"),
    input_names=("data", "indices", "scales", "zero_points"),
    logical_dtypes={"data": "{data_type} codes (raw bytes)", "y": "float16"},
    doc="com.microsoft.GatherBlockQuantized (ORT 1.31+ CPU)",
    cold_repeat=False,
    sized_case=lambda lf, rows, seed: Case(
        "gather_block_quantized",
        lf,
        seed,
        (rows, 5120, 64),
        "normal",
        {"block_size": 128, "zp": False, "rows": rows, "cols": 5120},
    ),
)

# --------------------------------------------------------------------------------- fake_quantize

FQ_LEAVES = tuple(
    Leaf(f"Xfp32_Q{q}_Yfp32", {"dtype": n, "act": "fp32"})
    for q, n in (("u8", "uint8"), ("i8", "int8"), ("u16", "uint16"), ("i16", "int16"), ("u4", "uint4"), ("i4", "int4"))
) + (Leaf("Xfp16_Qu8_Yfp16", {"dtype": "uint8", "act": "fp16"}),)
GRANULARITIES = ("tensor", "axis", "block")


def _fq_params(shape: tuple[int, ...], gran: str, dtype: str, act: np.dtype, rng: np.random.Generator):
    """(scale, zero point) of the granularity; scales powers of two times (1 + a little) so that
    exact .5 ties after the division occur in the data below."""
    np_dtype, lo, hi = QTYPES[dtype]
    rows, cols = shape
    pshape = {"tensor": (), "axis": (cols,), "block": (rows, -(-cols // 32))}[gran]
    scale = (2.0 ** rng.integers(-8, -2, pshape)).astype(act)
    zp = rng.integers(lo, hi + 1, pshape).astype(np_dtype) if hi - lo > 1 else None
    zp = np.clip(zp, lo + (hi - lo) // 4, hi - (hi - lo) // 4).astype(np_dtype) if zp is not None else None
    return scale, zp


def _fq_inputs(case: Case) -> dict[str, np.ndarray]:
    p = {**_leaf_params(FQ_LEAVES, case.leaf), **case.params}
    rng = np.random.default_rng(case.seed)
    act = ACTS[p["act"]]
    _, lo, hi = QTYPES[p["dtype"]]
    scale, zp = _fq_params(case.shape, p["granularity"], p["dtype"], act, rng)
    s = (
        np.broadcast_to(scale.astype(np.float64), case.shape)
        if p["granularity"] != "block"
        else np.repeat(scale.astype(np.float64), 32, axis=1)[:, : case.shape[1]]
    )
    k = rng.integers(lo - 3, hi + 3, case.shape).astype(np.float64)
    tie = rng.random(case.shape) < 0.3  # x = (k + 0.5) * s: exact ties of the division
    x = ((k + np.where(tie, 0.5, rng.uniform(-0.5, 0.5, case.shape))) * s).astype(act)
    out = {"x": x, "scale": scale}
    if zp is not None:
        out["zero_point"] = zp
    return out


def _fq_call(inputs: dict[str, Any], params: dict[str, Any]) -> tuple[tuple, dict]:
    gran = params["granularity"]
    kw = {"axis": 1, "block_size": 32 if gran == "block" else 0, "dtype": params["dtype"]}
    return (inputs["x"], inputs["scale"], inputs.get("zero_point")), kw


def _fq_cases(leaf: str, coverage: int) -> list[Case]:
    shapes = (
        [(4, 96), (16, 200)]
        + ([(64, 4096), (3, 1000)] if coverage >= 2 else [])
        + ([(512, 14336)] if coverage >= 3 else [])
    )
    return [
        Case("fake_quantize", leaf, 70 + i, shape, "ties", {"granularity": g})
        for i, shape in enumerate(shapes)
        for g in GRANULARITIES
    ]


def _fq_bad(leaf: str) -> list[BadArgument]:
    p = {**_leaf_params(FQ_LEAVES, leaf), "granularity": "axis"}
    good = _fq_inputs(Case("fake_quantize", leaf, 2, (4, 64), "ties", p))
    act = good["x"].dtype
    bad = [
        BadArgument("x must be float32/float16", {**good, "x": good["x"].astype(np.float64)}, p),
        BadArgument("per-axis scale must have x.shape[axis] entries", {**good, "scale": good["scale"][:5]}, p),
        BadArgument("blocked scale must have ceil(D/block) entries", good, {**p, "granularity": "block"}),
        BadArgument("dtype must be a supported integer type", good, {**p, "dtype": "uint3"}),
        BadArgument("out must have x's shape", good, p, bad_out=np.zeros((4, 65), act)),
    ]
    if "zero_point" in good:
        wrong = np.int32 if good["zero_point"].dtype != np.int32 else np.int64
        bad.append(
            BadArgument(
                "zero point must have the quantized type", {**good, "zero_point": good["zero_point"].astype(wrong)}, p
            )
        )
    return bad


FAKE_QUANTIZE = OpSpec(
    name="fake_quantize",
    family="ort",
    leaves=FQ_LEAVES,
    oracle=fake_quantize,
    call_args=_fq_call,
    output_spec=lambda inputs, params: (inputs["x"].shape, inputs["scale"].dtype),
    make_inputs=_fq_inputs,
    cases=_fq_cases,
    strategy=lambda lf: st.builds(
        lambda seed, rows, cols, g: Case("fake_quantize", lf, seed, (rows, cols), "ties", {"granularity": g}),
        seed=st.integers(0, 2**32 - 1),
        rows=st.integers(1, 8),
        cols=st.integers(1, 300),
        g=st.sampled_from(GRANULARITIES),
    ),
    validate=validating(fake_quantize, _fq_call),
    bad_arguments=_fq_bad,
    decode=lambda y, params: y,
    check=Check("exact", 0.0, "true fp32 division, half-to-even, one multiply: bits must match"),
    input_names=("x", "scale", "zero_point"),
    logical_dtypes={"zero_point": "{dtype} (logical values)"},
    doc="ONNX QuantizeLinear -> DequantizeLinear fused (opset 21, ORT CPU arithmetic)",
    cold_repeat=False,
    sized_case=lambda lf, rows, seed: Case("fake_quantize", lf, seed, (rows, 14336), "ties", {"granularity": "axis"}),
)

# ------------------------------------------------------------------------------------- qswiglu

SWIGLU_LEAVES = (Leaf("Xu16_Yu16", {"dtype": "uint16"}), Leaf("Xu8_Yu8", {"dtype": "uint8"}))


def _swiglu_inputs(case: Case) -> dict[str, np.ndarray]:
    """gate/up codes over the whole range; scales chosen so g spans about [-8, 8] (where the
    sigmoid bends) and the product fits the output range."""
    dtype = _leaf_params(SWIGLU_LEAVES, case.leaf)["dtype"]
    np_dtype = np.dtype(dtype)
    top = float(np.iinfo(np_dtype).max)
    rng = np.random.default_rng(case.seed)
    mid = np_dtype.type(int(top + 1) // 2)
    ranges = {"gate": 16.0, "up": 8.0, "sig": 1.0, "silu": 16.0, "out": 64.0}
    inputs = {
        "gate_q": rng.integers(0, int(top) + 1, case.shape).astype(np_dtype),
        "up_q": rng.integers(0, int(top) + 1, case.shape).astype(np_dtype),
    }
    for k, r in ranges.items():
        inputs[f"{k}_scale"] = np.array(r / top, np.float32)
        inputs[f"{k}_zp"] = np.array(0 if k == "sig" else mid, np_dtype)
    return inputs


def _swiglu_call(inputs: dict[str, Any], params: dict[str, Any]) -> tuple[tuple, dict]:
    kw = {f"{k}_{w}": inputs[f"{k}_{w}"] for k in SWIGLU_STEPS for w in ("scale", "zp")}
    return (inputs["gate_q"], inputs["up_q"]), {**kw, "dtype": params["dtype"]}


def _swiglu_bad(leaf: str) -> list[BadArgument]:
    p = dict(_leaf_params(SWIGLU_LEAVES, leaf))
    good = _swiglu_inputs(Case("qswiglu", leaf, 4, (2, 64), "normal"))
    other = np.uint8 if p["dtype"] == "uint16" else np.uint16
    return [
        BadArgument("gate_q must have the activation type", {**good, "gate_q": good["gate_q"].astype(other)}, p),
        BadArgument("up_q must have gate_q's shape", {**good, "up_q": good["up_q"][:, :63].copy()}, p),
        BadArgument("scales must be per-tensor scalars", {**good, "sig_scale": np.ones(2, np.float32)}, p),
        BadArgument("zero points must have the activation type", {**good, "out_zp": np.array(1, np.int32)}, p),
        BadArgument("out must have the input shape", good, p, bad_out=np.zeros((2, 65), np.dtype(p["dtype"]))),
    ]


QSWIGLU = OpSpec(
    name="qswiglu",
    family="ort",
    leaves=SWIGLU_LEAVES,
    oracle=qswiglu,
    call_args=_swiglu_call,
    output_spec=lambda inputs, params: (inputs["gate_q"].shape, inputs["gate_q"].dtype),
    make_inputs=_swiglu_inputs,
    cases=lambda lf, coverage: [
        Case("qswiglu", lf, 80 + i, shape, "normal")
        for i, shape in enumerate(
            [(1, 4096), (4, 1000)]
            + ([(64, 14336)] if coverage >= 2 else [])
            + ([(512, 14336)] if coverage >= 3 else [])
        )
    ],
    strategy=lambda lf: st.builds(
        lambda seed, rows, cols: Case("qswiglu", lf, seed, (rows, cols), "normal"),
        seed=st.integers(0, 2**32 - 1),
        rows=st.integers(1, 8),
        cols=st.integers(1, 2048),
    ),
    validate=validating(qswiglu, _swiglu_call),
    bad_arguments=_swiglu_bad,
    decode=lambda y, params: y,
    check=Check("steps", 1.0, "sigmoid's last-ulp accuracy is the runtime's: one output step allowed, counted"),
    input_names=("gate_q", "up_q", *(f"{k}_{w}" for k in SWIGLU_STEPS for w in ("scale", "zp"))),
    logical_dtypes={"gate_q": "{dtype}", "up_q": "{dtype}", "y": "{dtype}"},
    doc="quantized SwiGLU: DQ, Sigmoid, Q/DQ, Mul, Q/DQ, Mul, Q (per-tensor)",
    cold_repeat=False,
    sized_case=lambda lf, rows, seed: Case("qswiglu", lf, seed, (rows, 14336), "normal"),
)

OPS: tuple[OpSpec, ...] = (_nbits_op(True), _nbits_op(False), GATHER, FAKE_QUANTIZE, QSWIGLU)

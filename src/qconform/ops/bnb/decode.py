"""Catalogue entries nf4_decode and fp4_decode: bitsandbytes ``dequantize_4bit`` from the packed codes
and a float32 absmax (oracle: ``qconform.oracles.bnb.dequantize_4bit``; upstream
bitsandbytes/functional.py ``dequantize_4bit``, csrc/cpu_ops.cpp ``dequantizeBlockwise4bitCpu`` and
bitsandbytes/backends/default/ops.py on the CPU, csrc/kernels.cu ``kDequantizeBlockwise`` on CUDA).
Shape (rows, cols) of the output; blocks run over its flattening.

``y[i] = T(fl32(code[q_i] * absmax[i // blocksize]))``, one rounding to the output type T (round to
nearest even). The variants differ in FP4 code 8 (-0 in the C++ and CUDA tables, +0 in Python's,
which the CPU backend takes for an odd last dimension), in bf16's NaN (the CPU's bit trick), and in
flush-to-zero (cuda). Checked exact. Leaves by output dtype: ``Xnf4_Yfp32``, ``Xnf4_Yfp16``,
``Xnf4_Ybf16`` (bfloat16 as uint16 bits), likewise FP4.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from qconform.contracts import Contract
from qconform.ops.abi import DTYPE, I64, Abi, Bound, In, Out, call_arguments
from qconform.ops.bnb import patterns
from qconform.ops.bnb._common import (
    CARRIER,
    CORE_SHAPES,
    DTYPES,
    check_absmax,
    check_blocksize,
    check_out,
    check_packed,
    choice,
    contract_variant,
    deliver,
    from_f32,
    positive_int,
    shape_strategy,
    subnormal,
    to_values,
    with_shape,
)
from qconform.ops.spec import BadArgument, Case, Check, Leaf, OpSpec
from qconform.oracles.bnb import BLOCKSIZES, VARIANTS, QuantState, dequantize_4bit, get_4bit_type
from qconform.readings import Expected

EXACT = Check("exact", 0.0, "4-bit dequantization is elementwise: bits must match")
LLM = ((4096, 512), (2048, 768))  # GQA k/v projection, MoE expert weights (4096 x 14336: coverage 3)


def check_decode_args(
    packed: Any, absmax: Any, rows: Any, cols: Any, blocksize: Any, dtype: Any, out: Any = None
) -> tuple[int, int]:
    """The argument rules: (n, n_blocks)."""
    r, c = positive_int("rows", rows), positive_int("cols", cols)
    bs = check_blocksize(blocksize)
    choice("dtype", dtype, DTYPES)
    n = r * c
    check_packed("packed", packed, n)
    check_absmax(absmax, n, bs)
    check_out(out, CARRIER[dtype], (r, c), dtype)
    return n, -(-n // bs)


def _decode(
    quant_type: str, packed: Any, absmax: Any, rows: Any, cols: Any, blocksize: Any, dtype: Any,
    out: Any, variant: str, ftz: bool, backend: str,
) -> np.ndarray:  # fmt: skip
    check_decode_args(packed, absmax, rows, cols, blocksize, dtype, out)
    choice("variant", variant, VARIANTS)
    flush = ftz and variant != "cuda"  # "cuda" always flushes (--use_fast_math)
    if flush:
        absmax = np.where(subnormal(absmax), np.copysign(np.float32(0), absmax), absmax).astype(np.float32)
    state = QuantState(absmax, (rows, cols), dtype, blocksize, get_4bit_type(quant_type), quant_type)
    y = dequantize_4bit(packed, state, dtype, variant, backend=backend)
    if flush:  # the float32 product flushed before the output rounding
        v = dequantize_4bit(packed, state, "float32", variant, backend=backend)
        y = np.where(subnormal(v), from_f32(np.copysign(np.float32(0), v), dtype), y).astype(CARRIER[dtype])
    return deliver(y, out)


def nf4_decode(
    packed: np.ndarray,
    absmax: np.ndarray,
    *,
    rows: int,
    cols: int,
    blocksize: int,
    dtype: str = "float32",
    out: np.ndarray | None = None,
    variant: str = "cpu",
    ftz: bool = False,
    backend: str = "numba",
) -> np.ndarray:
    """NF4 ``dequantize_4bit`` of a (rows, cols) weight to ``dtype`` (module docstring)."""
    return _decode("nf4", packed, absmax, rows, cols, blocksize, dtype, out, variant, ftz, backend)


def fp4_decode(
    packed: np.ndarray,
    absmax: np.ndarray,
    *,
    rows: int,
    cols: int,
    blocksize: int,
    dtype: str = "float32",
    out: np.ndarray | None = None,
    variant: str = "cpu",
    ftz: bool = False,
    backend: str = "numba",
) -> np.ndarray:
    """FP4 ``dequantize_4bit`` of a (rows, cols) weight to ``dtype`` (module docstring)."""
    return _decode("fp4", packed, absmax, rows, cols, blocksize, dtype, out, variant, ftz, backend)


def _call(inputs: dict[str, Any], params: dict[str, Any]) -> tuple[tuple, dict]:
    kw = {k: params[k] for k in ("rows", "cols", "blocksize", "dtype")}
    return (inputs["packed"], inputs["absmax"]), kw


def _cases(op: str, leaf: str, coverage: int) -> list[Case]:
    """coverage 1 (small: the golden set): random codes (FP4's -0 code 8 included) on an even and an
    odd last dimension (3 x 333: bitsandbytes' CPU backend switches to its Python path, code 8 +0),
    scales that separate the backends (0, NaN, inf, subnormal products, fp16 overflow, bf16 ties),
    scales whose fp32 products sit on fp16 / bf16 midpoints (the two roundings show),
    one partial block of 4096 and a quantized weight; 2: every blocksize 32..4096, more seeds,
    the layer weights 4096 x 512 (GQA k/v) and 2048 x 768 (MoE expert); 3: 4096 x 14336.

    core: shapes production kernels take (pattern ``quantized``, seeds 400..409; 1 at coverage 1,
    10 from coverage 2): rows 1..64, widths a whole number of blocks, blocksizes 64, 128, 256."""
    out: list[Case] = []

    def add(pattern: str, shape: tuple[int, int], seed: int, bs: int) -> None:
        out.append(with_shape(Case(op, leaf, seed, shape, pattern, {"blocksize": bs})))

    add("random", (2, 256), 1, 64)
    add("random", (3, 333), 2, 128)
    add("special_absmax", (2, 256), 1000, 32)
    add("double_rounding", (2, 256), 1001, 64)  # fl32(code * absmax) on fp16 / bf16 midpoints
    add("quantized", (1, 1000), 3, 4096)
    if coverage >= 2:
        for i, bs in enumerate(BLOCKSIZES):
            add("random", (2, 2 * bs), 10 + i, bs)
            add("quantized", (3, bs + bs // 2 + 1), 20 + i, bs)
            add("special_absmax", (4, 4 * bs), 1010 + i, bs)
        for i, shape in enumerate(LLM):
            add("quantized", shape, 300 + i, 64)
    if coverage >= 3:
        add("quantized", (4096, 14336), 310, 64)
        for s in range(8):
            add("special_absmax", (16, 1024), 1100 + s, (32, 64, 128, 256)[s % 4])
    for i, (rows, cols, bs) in enumerate(CORE_SHAPES[: 1 if coverage == 1 else None]):
        add("quantized", (rows, cols), 400 + i, bs)
    return out


def _bad(dtype: str, quant_type: str) -> list[BadArgument]:
    packed, absmax = patterns.weights("random", 6, 128, 64, quant_type)
    good = {"packed": packed, "absmax": absmax}
    p = {"rows": 2, "cols": 64, "blocksize": 64, "dtype": dtype}
    return [
        BadArgument("packed must be uint8", {**good, "packed": packed.view(np.int8)}, p, arg="packed", match="uint8"),
        BadArgument(
            "packed must hold (n + 1) // 2 bytes",
            {**good, "packed": packed[:63].copy()},
            p,
            arg="packed",
            match="64 bytes",
        ),
        BadArgument(
            "absmax must be float32 (one per block)",
            {**good, "absmax": absmax.astype(np.float16)},
            p,
            arg="absmax",
            match="float32",
        ),
        BadArgument(
            "absmax must hold ceil(n / blocksize) scales",
            {**good, "absmax": np.ones(3, np.float32)},
            p,
            arg="absmax",
            match=r"shape|\(2,\)",
        ),
        BadArgument("rows must be positive", good, {**p, "rows": 0}, arg="rows", match="positive"),
        BadArgument("cols must be an int", good, {**p, "cols": 64.0}, arg="cols", match="int"),
        BadArgument(
            "blocksize must be a power of two 32..4096", good, {**p, "blocksize": 16}, arg="blocksize", match="32, 64"
        ),
        BadArgument(
            "dtype must be float32, float16 or bfloat16", good, {**p, "dtype": "float64"}, arg="dtype", match="bfloat16"
        ),
        BadArgument(
            "out must have the output shape (rows, cols)",
            good,
            p,
            bad_out=np.zeros((2, 65), CARRIER[dtype]),
            arg="out",
            match=r"shape|\(2, 64\)",
        ),
        BadArgument(
            "out must have the output dtype",
            good,
            p,
            bad_out=np.zeros((2, 64), np.float64),
            arg="out",
            match="dtype|" + ("uint16" if dtype == "bfloat16" else dtype),
        ),
    ]


def _bind(oracle: Any) -> Any:
    def bind(args: tuple, kwargs: Any) -> Bound:
        a = call_arguments(oracle, args, kwargs)
        n, nb = check_decode_args(a["packed"], a["absmax"], a["rows"], a["cols"], a["blocksize"], a["dtype"])
        scalars = {
            "rows": int(a["rows"]),
            "cols": int(a["cols"]),
            "blocksize": int(a["blocksize"]),
            "y_dtype": DTYPE[a["dtype"]],
        }
        tensors = {"packed": ("packed", np.dtype(np.uint8)), "absmax": ("absmax", np.dtype(np.float32))}
        return Bound(tensors, (int(a["rows"]), int(a["cols"])), CARRIER[a["dtype"]], scalars, n)

    return bind


def _abi(name: str, oracle: Any, quant_type: str) -> Abi:
    return Abi(
        (
            In(
                "packed", "unsigned char", "uint8", "((n + 1) / 2)", "two codes per byte, element 2j in the high nibble"
            ),
            In("absmax", "float", "float32", "(ceil(n / blocksize))", "one scale per block of the flattened output"),
            Out("y", "void", "float32 | float16 | bfloat16 (y_dtype)", "(rows, cols)"),
            I64("rows", "output rows"),
            I64("cols", "output columns (n = rows * cols)"),
            I64("blocksize", "32, 64, ..., 4096: values per absmax"),
            I64("y_dtype", "y's element type (bfloat16: its 16 bits)", DTYPE),
        ),
        _bind(oracle),
        f"bitsandbytes dequantize_4bit (quant_type={quant_type}): packed codes, absmax -> (rows, cols)",
        "rows * cols outputs",
        notes=(
            "y[i] = T(fl32(code[q_i] * absmax[i / blocksize])), one rounding to y_dtype (nearest even)",
            "the default reading is bitsandbytes' CPU backend (--contract variant=cuda: its CUDA kernel)",
        ),
    )


def _op(name: str, oracle: Any) -> OpSpec:
    qt = name[:3]
    leaves = tuple(
        Leaf(f"X{qt}_Y{t}", {"dtype": d}) for t, d in (("fp32", "float32"), ("fp16", "float16"), ("bf16", "bfloat16"))
    )

    def make_inputs(case: Case) -> dict[str, np.ndarray]:
        rows, cols = case.shape
        packed, absmax = patterns.weights(case.pattern, case.seed, rows * cols, case.params["blocksize"], qt)
        return {"packed": packed, "absmax": absmax}

    def numerics(inputs: dict[str, Any], params: dict[str, Any], contract: Contract, ftz: bool) -> list:
        variant = contract_variant(contract)
        args, kw = _call(inputs, params)
        return [
            Expected(f"bitsandbytes {variant}", oracle(*args, **kw, variant=variant, ftz=ftz), plain=variant == "cpu")
        ]

    def decode(y: np.ndarray, params: dict[str, Any]) -> np.ndarray:
        return to_values(y, params["dtype"])

    def locate(params: dict[str, Any], index: tuple[int, ...]) -> str:
        i = index[0] * params["cols"] + index[1]
        return (
            f"element {i} (block {i // params['blocksize']}, {'high' if i % 2 == 0 else 'low'} nibble of byte {i // 2})"
        )

    return OpSpec(
        name=name,
        family="bnb",
        leaves=leaves,
        oracle=oracle,
        call_args=_call,
        make_inputs=make_inputs,
        cases=lambda lf, coverage: _cases(name, lf, coverage),
        strategy=lambda lf: shape_strategy(name, lf, patterns.WEIGHT_PATTERNS),
        validate=lambda inputs, params, out=None: check_decode_args(
            inputs["packed"], inputs["absmax"], *(params[k] for k in ("rows", "cols", "blocksize", "dtype")), out
        ),
        bad_arguments=lambda lf: _bad(next(x.params["dtype"] for x in leaves if x.name == lf), qt),
        decode=decode,
        abi=_abi(name, oracle, qt),
        check=EXACT,
        input_names=("packed", "absmax"),
        output_name="y",
        locate=locate,
        logical_dtypes={
            "packed": f"{qt.upper()} codes, 2 per byte, high nibble first",
            "absmax": "float32 per block of {blocksize}",
            "y": "{dtype} (bfloat16 as uint16 bits)",
        },
        sized_case=lambda lf, rows, seed: with_shape(Case(name, lf, seed, (rows, 4096), "random", {"blocksize": 64})),
        numerics=numerics,
    )


NF4_DECODE = _op("nf4_decode", nf4_decode)
FP4_DECODE = _op("fp4_decode", fp4_decode)

"""Catalogue entries for ggml block formats: ``<type>_quant`` (float32 rows -> blocks) and
``<type>_dequant`` (blocks -> float32 rows) for the activation formats Q8_K / Q8_0 (device kernels,
contracts) and the weight formats of ``WEIGHT_TYPES`` (device dequantize kernels for Q4_0, Q4_K, Q5_K, Q6_K).

Oracle: ``qconform.oracles.ggml.quantize / dequantize`` (gguf-py call shape). A ``py:`` drop-in is
called as ``fn(x, "Q8_K")`` / ``fn(data, "Q8_K")``, with ``out=`` when it accepts one. Leaves carry
ggml's type names (``Xfp32_Yq4_K``, ``Xiq4_nl_Yfp32``).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from hypothesis import strategies as st

from qconform.contracts import Contract
from qconform.errors import ArgumentError
from qconform.formats.ggml import FORMATS
from qconform.ops.abi import I64, Abi, Bound, In, Out, call_arguments
from qconform.ops.patterns import PATTERNS, make_values
from qconform.ops.spec import BadArgument, Case, Check, Leaf, OpSpec
from qconform.oracles.ggml import check_dequantize_args, check_quantize_args, dequantize, quantize
from qconform.readings import Expected, matching_any

LLM_WIDTHS = (2048, 2560, 4096, 5120, 8192, 14336)
WIDE_ROW = 14336  # an FFN width: a multiple of every block size here
DEQUANT_EXTRA_PATTERNS = ("random_bytes", "valid_blocks")  # any bytes; any bytes with finite fp16 scales
OWN_PATTERNS = {  # quantizer inputs about one format's own scale (patterns.FORMAT_PATTERNS)
    "Q4_0": ("ties_4bit", "fma_edges_q4_0"),
    "Q5_0": ("fma_edges_q5_0",),
    "Q4_1": ("fma_edges_q4_1", "one_sign"),
    "Q5_1": ("fma_edges_q5_1", "one_sign"),
    "Q2_K": ("one_sign", "requant_ties_q2_k"),
    "Q3_K": ("requant_ties_q3_k",),
    "Q4_K": ("one_sign", "requant_ties_q4_k"),
    "Q5_K": ("one_sign", "requant_ties_q5_k"),
    "Q6_K": ("requant_ties_q6_k",),
}
WEIGHT_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS")
FP16_FIELDS = ("d", "dmin", "m", "s")  # the block fields that hold fp16 scales (ggml-common.h)
EXACT = Check("exact", 0.0, "ggml's scalar reference is deterministic and blockwise: bytes must match")


def _cases(
    op: str, leaf: str, block: int, patterns: tuple[str, ...], coverage: int, light: bool = False
) -> list[Case]:
    """coverage 1: one row of three LLM widths, one block, many rows, each special pattern once;
    2: every LLM width, more rows and seeds; 3: full-size rows and several seeds per pattern.
    ``light`` (the weight formats: their goldens stay small): at coverage 1 two widths, 16
    rows and one core shape, so that their golden leaves stay small.

    core: shapes production kernels accept, beside those (pattern ``normal``, seeds 400..407; 2
    at coverage 1, 8 from coverage 2): 1..8, 16, 32 or 64 rows (tokens) of widths that are
    multiples of 256 (every block size here). The patterns include ``ties_npot`` (ties under
    scales that are not powers of two: an approximate division or reciprocal fails it)."""
    out: list[Case] = []

    def add(pattern: str, rows: int, width: int, seed: int) -> None:
        out.append(Case(op, leaf, seed, (rows, width), pattern))

    light = light and coverage == 1
    widths = (2048, 4096) if light else (2048, 4096, 14336) if coverage == 1 else LLM_WIDTHS
    for i, w in enumerate(widths):
        add("normal", 1 if coverage == 1 else 4, w, 100 + i)
    add("normal", 1, block, 1)  # one block
    add("uniform", 16 if light else 64, 256, 2)  # many rows
    edge_width = max(block, 256) * 2
    seeds = {1: 1, 2: 3, 3: 8}[coverage]
    for pattern in patterns:
        if pattern == "normal":
            continue
        for s in range(seeds):
            add(pattern, 2, edge_width, 1000 + s)
    if coverage >= 2:
        add("mixed", 8, 4096, 7)
        add("normal", 3, block * 3, 11)  # a few blocks, odd row count
    core = [(8, 256)] if light else [(8, 256), (16, 256)]  # (rows, width)
    if coverage >= 2:
        core += [(2, 4096), (5, 2560), (6, 768), (7, 1024), (32, 1024), (64, 256)]
    for i, (rows, width) in enumerate(core):
        add("normal", rows, width, 400 + i)
    if coverage >= 3:
        add("normal", 32, 14336, 21)
        add("mixed", 16, 8192, 22)
    return out


def _strategy(op: str, leaf: str, patterns: tuple[str, ...]) -> Any:
    """Structure and a seed from hypothesis, bulk values from numpy (docs/device-tooling.md D3)."""
    block = FORMATS[leaf_qtype(leaf)].block_size
    return st.builds(
        lambda pattern, rows, blocks, seed: Case(op, leaf, seed, (rows, blocks * block), pattern),
        pattern=st.sampled_from(patterns),
        rows=st.integers(1, 4),
        blocks=st.integers(1, 8),
        seed=st.integers(0, 2**32 - 1),
    )


def ggml_name(qtype: str) -> str:
    """ggml's own name of a type (``ggml_type_name``): ``Q4_K`` -> ``q4_K``, ``IQ4_NL`` -> ``iq4_nl``."""
    return qtype.lower().replace("_k", "_K")


def leaf_qtype(leaf: str) -> str:
    """The ggml type a leaf name carries: ``Xfp32_Yq8_K`` / ``Xq8_K_Yfp32`` -> ``Q8_K``; a GEMV's
    weight type (``Wq4_K_Aq8_K_Yfp32`` -> ``Q4_K``); a fused producer's activation type
    (``Xfp32_Ybf16_Aq8_K`` -> ``Q8_K``)."""
    x, _, y = leaf.partition("_Y")
    if x.startswith("W"):
        token = x[1:].partition("_A")[0]
    elif "_A" in y:
        token = y.partition("_A")[2]
    else:
        token = y if x == "Xfp32" else x[1:]
    for name in FORMATS:
        if ggml_name(name) == token:
            return name
    raise KeyError(f"leaf {leaf!r} names no ggml type")


def _quant_inputs(case: Case) -> dict[str, np.ndarray]:
    fmt = FORMATS[leaf_qtype(case.leaf)]
    rows, width = case.shape
    return {"x": make_values(case.pattern, case.seed, rows, width, fmt.block_size)}


def _dequant_inputs(case: Case) -> dict[str, np.ndarray]:
    fmt = FORMATS[leaf_qtype(case.leaf)]
    rows, width = case.shape
    if case.pattern in ("random_bytes", "valid_blocks"):
        rng = np.random.default_rng(case.seed)
        data = rng.integers(0, 256, size=(rows, fmt.n_bytes(width)), dtype=np.uint8)
        if case.pattern == "valid_blocks":  # finite scales: the format's decoding apart from its quantizer
            data = finite_scales(fmt, data, rng)
        return {"data": data}
    x = make_values(case.pattern, case.seed, rows, width, fmt.block_size)
    return {"data": quantize(x, fmt.name)}


def finite_scales(fmt: Any, data: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Random block bytes ``data`` (rows, bytes) with every scale field finite: each fp16 ``d`` /
    ``dmin`` / ``m`` / ``s`` drawn as fp16(0.01 * N(0, 1)), an fp32 ``d`` as fp32(N(0, 1)) * 0.01;
    every other byte (quants, packed sub-block scales) left as drawn."""
    blocks = fmt.blocks(data)
    for field in fmt.dtype.names:
        kind = fmt.dtype.fields[field][0]
        if field in FP16_FIELDS and kind == np.dtype("<u2"):
            blocks[field] = (rng.standard_normal(len(blocks)) * 0.01).astype(np.float16).view(np.uint16)
        elif field == "d" and kind == np.dtype("<f4"):
            blocks[field] = rng.standard_normal(len(blocks)).astype(np.float32) * 0.01
    return blocks.view(np.uint8).reshape(data.shape)


def _quant_bad(leaf: str) -> list[BadArgument]:
    qtype = leaf_qtype(leaf)
    bs = FORMATS[qtype].block_size
    rng = np.random.default_rng(5)
    good = rng.standard_normal((2, 2 * bs)).astype(np.float32)
    p = {"qtype": qtype}
    bad = [
        BadArgument(
            f"width {w} is not a multiple of {bs}",
            {"x": rng.standard_normal((2, w)).astype(np.float32)},
            p,
            arg="x",
            match=f"multiple of {bs}",
        )
        for w in (bs - 1, bs + 1, bs + bs // 2, 3 * bs - 16)
    ]
    bad += [
        BadArgument("x must be float32 (float64 given)", {"x": good.astype(np.float64)}, p, arg="x", match="float32"),
        BadArgument("x must be float32 (float16 given)", {"x": good.astype(np.float16)}, p, arg="x", match="float32"),
        BadArgument(
            "x must be C-contiguous", {"x": np.repeat(good, 2, axis=1)[:, ::2]}, p, arg="x", match="contiguous"
        ),
        # a 0-d float32 array: an array of the right dtype that lacks the row dimension only
        BadArgument(
            "x must have a row dimension",
            {"x": np.array(1.0, np.float32)},
            p,
            arg="x",
            match="scalar|one dimension|0-d|ndim",
        ),
        BadArgument(
            "qtype must be a supported ggml type", {"x": good}, {"qtype": "Q9_9"}, arg="qtype", match="support|Q9_9"
        ),
        BadArgument(
            "out must have the output shape",
            {"x": good},
            p,
            bad_out=np.zeros((2, FORMATS[qtype].n_bytes(2 * bs) - 1), np.uint8),
            arg="out",
            match="shape",
        ),
        BadArgument(
            "out must be uint8",
            {"x": good},
            p,
            bad_out=np.zeros((2, FORMATS[qtype].n_bytes(2 * bs)), np.int8),
            arg="out",
            match="uint8",
        ),
    ]
    return bad


def _dequant_bad(leaf: str) -> list[BadArgument]:
    qtype = leaf_qtype(leaf)
    fmt = FORMATS[qtype]
    rng = np.random.default_rng(6)
    good = quantize(rng.standard_normal((2, 2 * fmt.block_size)).astype(np.float32), qtype)
    p = {"qtype": qtype}
    return [
        BadArgument(
            f"bytes per row {n} are not a multiple of {fmt.type_size}",
            {"data": rng.integers(0, 256, (2, n), dtype=np.uint8)},
            p,
            arg="data",
            match=f"multiple of {fmt.type_size}",
        )
        for n in (fmt.type_size - 1, fmt.type_size + 1, 2 * fmt.type_size + 2)
    ] + [
        BadArgument("data must be uint8", {"data": good.view(np.int8)}, p, arg="data", match="uint8"),
        BadArgument(
            "data must be C-contiguous",
            {"data": np.repeat(good, 2, axis=1)[:, ::2]},
            p,
            arg="data",
            match="contiguous",
        ),
        BadArgument(
            "qtype must be a supported ggml type", {"data": good}, {"qtype": "Q9_9"}, arg="qtype", match="support|Q9_9"
        ),
        BadArgument(
            "out must have the output shape",
            {"data": good},
            p,
            bad_out=np.zeros((2, 2 * fmt.block_size + 1), np.float32),
            arg="out",
            match="shape",
        ),
        BadArgument(
            "out must be float32",
            {"data": good},
            p,
            bad_out=np.zeros((2, 2 * fmt.block_size), np.float64),
            arg="out",
            match="float32",
        ),
    ]


def _locate_byte(params: dict[str, Any], index: tuple[int, ...]) -> str:
    """Name the block field an output byte belongs to: ``row 0, block 3, qs[17]``."""
    fmt = FORMATS[params["qtype"]]
    *rows, col = index
    block, off = divmod(col, fmt.type_size)
    for field, (dt, start) in fmt.dtype.fields.items():
        if start <= off < start + dt.itemsize:
            elem = dt.base.itemsize
            sub = f"[{(off - start) // elem}]" if dt.shape else ""
            return f"row {tuple(rows)}, block {block}, {field}{sub}"
    return f"row {tuple(rows)}, block {block}, byte {off}"


def _locate_value(params: dict[str, Any], index: tuple[int, ...]) -> str:
    fmt = FORMATS[params["qtype"]]
    *rows, col = index
    return f"row {tuple(rows)}, block {col // fmt.block_size}, value {col % fmt.block_size}"


def _same_qtype(op: str, qtype: str, given: str) -> None:
    if given != qtype:
        raise ArgumentError(f"qtype: {op} takes {qtype}, got {given}")


def _block_abi(name: str, qtype: str, quant: bool) -> Abi:
    """``(x, y, n_blocks)`` (quantize) or ``(data, y, n_blocks)`` (dequantize): one work item per
    format block, the op's oracle checking every rule."""
    fmt = FORMATS[qtype]
    src, oracle, check = ("x", quantize, check_quantize_args) if quant else ("data", dequantize, check_dequantize_args)
    src_dtype, out_dtype = (np.float32, np.uint8) if quant else (np.uint8, np.float32)
    per_item = fmt.block_size if quant else fmt.type_size  # elements of the input per block

    def bind(args: tuple, kwargs: Any) -> Bound:
        a = call_arguments(oracle, args, kwargs)
        got, shape = check(a[src], a["qtype"])
        _same_qtype(name, qtype, got.name)
        n = a[src].size // per_item
        return Bound({src: (src, np.dtype(src_dtype))}, shape, np.dtype(out_dtype), {"n_blocks": n}, n)

    blocks = f"{qtype} blocks"
    rows = f"(rows, width), width % {fmt.block_size} == 0"
    packed = f"(rows, width / {fmt.block_size} * {fmt.type_size}): {blocks}"
    ref = ggml_name(qtype)
    return Abi(
        (
            In(src, "float" if quant else "unsigned char", np.dtype(src_dtype).name, rows if quant else packed),
            Out("y", "unsigned char" if quant else "float", np.dtype(out_dtype).name, packed if quant else rows),
            I64("n_blocks", f"{blocks} to {'write' if quant else 'read'}: {src}.size / {per_item}"),
        ),
        bind,
        f"ggml quantize_row_{ref}_ref: float32 rows -> {blocks}"
        if quant
        else f"ggml dequantize_row_{ref}: {blocks} -> float32 rows",
        "n_blocks",
    )


def _quant_numerics(
    inputs: dict[str, np.ndarray], params: dict[str, Any], contract: Contract, ftz: bool
) -> list[Expected]:
    """The reference, relaxed as the contract says. nan=ieee: each block's max taken as IEEE
    fmaxf does (a NaN never wins: ggml's MAX macro lets a NaN reset Q8_0's running max; Q8_K's
    strict compare already skips NaN), the NaN elements' own bytes -- and Q8_K's block sums over
    them -- unchecked (a device's float-to-int of NaN is its own). division=N: a block is also
    right when it equals the reference computed with its scale's division and reciprocal each up
    to N ulp off (the oracle's ``nudge``), as one approximate scale per block gives."""
    x, qtype = inputs["x"], params["qtype"]
    fmt = FORMATS[qtype]
    nan = np.isnan(x)
    ieee = contract.nan == "ieee" and bool(nan.any())
    x = np.where(nan, np.float32(0), x) if ieee else x
    label, mask = ("IEEE max, NaN elements unchecked", _nan_bytes(nan, fmt)) if ieee else ("reference", None)
    accept = None
    if contract.division:
        n = contract.division
        steps = [(i, j) for i in range(-n, n + 1) for j in range(-n, n + 1) if (i, j) != (0, 0)]
        candidates = [quantize(x, qtype, ftz=ftz, nudge=step) for step in steps]
        accept = functools.partial(matching_any, candidates, fmt.type_size)
        label += f", scale division within {n} ulp"
    want = quantize(x, qtype, ftz=ftz)
    return [Expected(label, want, mask=mask, plain=not ieee and not accept, accept=accept)]


def _nan_bytes(nan: np.ndarray, fmt: Any) -> np.ndarray:
    """The output bytes that hold a NaN input's quant, or a Q8_K block sum over one."""
    marks = np.zeros(nan.size // fmt.block_size, fmt.dtype)
    per_block = nan.reshape(-1, fmt.block_size)
    marks["qs"][per_block] = -1
    if "bsums" in fmt.dtype.names:
        marks["bsums"][per_block.reshape(len(per_block), marks["bsums"].shape[1], -1).any(axis=2)] = -1
    return marks.view(np.uint8).reshape(*nan.shape[:-1], fmt.n_bytes(nan.shape[-1])) != 0


def _quant_op(qtype: str) -> OpSpec:
    name = f"{qtype.lower()}_quant"
    patterns = tuple(PATTERNS) + OWN_PATTERNS.get(qtype, ())
    leaf = f"Xfp32_Y{ggml_name(qtype)}"
    block = FORMATS[qtype].block_size
    return OpSpec(
        name=name,
        family="ggml",
        leaves=(Leaf(leaf, {"qtype": qtype}),),
        oracle=quantize,
        call_args=lambda inputs, params: ((inputs["x"], params["qtype"]), {}),
        make_inputs=_quant_inputs,
        cases=lambda lf, coverage: _cases(name, lf, block, patterns, coverage, qtype in WEIGHT_TYPES),
        strategy=lambda lf: _strategy(name, lf, patterns),
        validate=lambda inputs, params, out=None: check_quantize_args(inputs["x"], params["qtype"], out),
        bad_arguments=_quant_bad,
        decode=lambda y, params: dequantize(y, params["qtype"]),
        abi=_block_abi(name, qtype, quant=True),
        check=EXACT,
        numerics=_quant_numerics if qtype in ("Q8_K", "Q8_0") else None,  # nan / division: the Q8 rules
        input_names=("x",),
        locate=_locate_byte,
        logical_dtypes={"x": "float32", "y": "ggml {qtype} blocks (raw bytes)"},
        sized_case=lambda lf, rows, seed: Case(name, lf, seed, (rows, WIDE_ROW), "normal"),
    )


def _dequant_op(qtype: str) -> OpSpec:
    name = f"{qtype.lower()}_dequant"
    leaf = f"X{ggml_name(qtype)}_Yfp32"
    block = FORMATS[qtype].block_size
    patterns = tuple(PATTERNS) + DEQUANT_EXTRA_PATTERNS
    return OpSpec(
        name=name,
        family="ggml",
        leaves=(Leaf(leaf, {"qtype": qtype}),),
        oracle=dequantize,
        call_args=lambda inputs, params: ((inputs["data"], params["qtype"]), {}),
        make_inputs=_dequant_inputs,
        cases=lambda lf, coverage: _cases(name, lf, block, patterns, coverage, qtype in WEIGHT_TYPES),
        strategy=lambda lf: _strategy(name, lf, patterns),
        validate=lambda inputs, params, out=None: check_dequantize_args(inputs["data"], params["qtype"], out),
        bad_arguments=_dequant_bad,
        decode=lambda y, params: y,
        abi=_block_abi(name, qtype, quant=False),
        check=EXACT,
        input_names=("data",),
        locate=_locate_value,
        logical_dtypes={"data": "ggml {qtype} blocks (raw bytes)", "y": "float32"},
        sized_case=lambda lf, rows, seed: Case(name, lf, seed, (rows, WIDE_ROW), "normal"),
    )


OPS: tuple[OpSpec, ...] = (
    _quant_op("Q8_K"),
    _quant_op("Q8_0"),
    _dequant_op("Q8_K"),
    _dequant_op("Q8_0"),
    *(_quant_op(t) for t in WEIGHT_TYPES),
    *(_dequant_op(t) for t in WEIGHT_TYPES),
)

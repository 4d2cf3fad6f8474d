"""Catalogue entry gather_block_quantized (com.microsoft.GatherBlockQuantized; oracle:
``qconform.oracles.ort.gather_block_quantized``). Shape (rows, cols, n_indices)."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from qconform.errors import Declined
from qconform.ops.abi import DTYPE, I64, Abi, Bound, Enum, In, Out, call_arguments, dtype_code
from qconform.ops.ort._common import leaf_params, validating
from qconform.ops.spec import BadArgument, Case, Check, Leaf, OpSpec
from qconform.oracles.ort import check_gather_args, gather_block_quantized

GATHER_LEAVES = (
    Leaf("Xi64_Wu4_Yfp16", {"data_type": "uint8", "bits": 4}),
    Leaf("Xi64_Wu8_Yfp16", {"data_type": "uint8", "bits": 8}),
    Leaf("Xi64_Wi4_Yfp16", {"data_type": "int4", "bits": 4}),
    Leaf("Xi64_Wfp8_Yfp16", {"data_type": "float8e4m3fn", "bits": 8}),
    Leaf("Xi64_Wu2_Yfp16", {"data_type": "uint8", "bits": 2}),
    Leaf("Xi64_Wuint4_Yfp16", {"data_type": "uint4", "bits": 4}),
    Leaf("Xi64_Wfp8e5m2_Yfp16", {"data_type": "float8e5m2", "bits": 8}),
)


def _gather_inputs(case: Case) -> dict[str, np.ndarray]:
    """A table (rows, cols) of random codes, fp16 scales per block along ``quantize_axis`` (default
    1; block_size 0 for float8: one block), zero points when the case asks; indices along
    ``gather_axis`` (default 0) in range, negative ones included, int64 or (``int32``) int32, 1-D or
    (``index_rows``) 2-D. ``scale_rows_1``: float8 scales of one row, broadcast over the rows."""
    p = {**leaf_params(GATHER_LEAVES, case.leaf), **case.params}
    rng = np.random.default_rng(case.seed)
    rows, cols, n_idx = case.shape
    bs, dt, bits = p["block_size"], p["data_type"], p["bits"]
    gax, qax = p.get("gather_axis", 0), p.get("quantize_axis", 1)
    dim = (rows, cols)[gax]
    nb = -(-(rows, cols)[qax] // bs) if bs else 1
    s_shape = (nb, cols) if qax == 0 else (1 if p.get("scale_rows_1") else rows, nb)
    indices = rng.integers(-dim, dim, n_idx).astype(np.int32 if p.get("int32") else np.int64)
    if case.pattern == "oob":  # indices outside [-dim, dim): a zero slice (ORT >= 1.31)
        indices[:4] = [dim, -dim - 1, dim + 5, 2**40]
    inputs: dict[str, np.ndarray] = {
        "indices": indices.reshape(p["index_rows"], -1) if p.get("index_rows") else indices,
        "scales": rng.uniform(0.001, 0.05, s_shape).astype(np.float16),
    }
    if dt == "uint8":
        inputs["data"] = rng.integers(0, 256, (rows, cols * bits // 8), dtype=np.uint8)
        if p.get("zp"):
            inputs["zero_points"] = rng.integers(0, 256, (rows, -(-nb * bits // 8)), dtype=np.uint8)
    elif dt in ("int4", "uint4"):
        inputs["data"] = rng.integers(0, 256, -(-rows * cols // 2), dtype=np.uint8)
        if p.get("zp"):
            inputs["zero_points"] = rng.integers(0, 256, -(-int(np.prod(s_shape)) // 2), dtype=np.uint8)
    else:
        codes = rng.integers(0, 256, (rows, cols), dtype=np.uint8)
        if dt == "float8e5m2":  # no inf / NaN codes (exponent 31): 1.0 instead
            codes[(codes & 0x7C) == 0x7C] = 0x3C
        else:
            codes[(codes & 0x7F) == 0x7F] = 0x38  # no NaN codes: 1.0 instead
        inputs["data"] = codes
    return inputs


def _gather_call(inputs: dict[str, Any], params: dict[str, Any]) -> tuple[tuple, dict]:
    kw = {
        "bits": params["bits"],
        "block_size": params["block_size"],
        "gather_axis": params.get("gather_axis", 0),
        "quantize_axis": params.get("quantize_axis", 1),
        "data_type": params["data_type"],
    }
    if params["data_type"] in ("int4", "uint4"):
        kw["data_shape"] = (params["rows"], params["cols"])
    return (inputs["data"], inputs["indices"], inputs["scales"], inputs.get("zero_points")), kw


AXES = (  # (seed, (rows, cols, indices, block), gather_axis, quantize_axis): int4 / uint4 / float8 tables
    (63, (40, 24, 9, 16), 1, 0),  # gather columns of a table blocked along its rows (ragged last block)
    (64, (40, 24, 7, 16), 0, 0),  # gather rows, blocked along the rows too
    (65, (24, 40, 5, 16), 1, 1),  # gather columns, blocked along the columns
)


def _gather_cases(leaf: str, coverage: int) -> list[Case]:
    """Embedding tables: coverage 1 small, 2 more seeds and block sizes, 3 a 100352 x 5120 vocab;
    at every coverage int32 indices of rank 2, and for int4 / uint4 / float8 tables the other
    gather and quantize axes (``AXES``); float8 also one block per row (block_size 0) and a
    single row of scales broadcast over the rows.

    core: shapes production kernels accept, beside those (pattern ``core``, seeds 400..404; a
    small table at coverage 1, 5 from coverage 2): rows a multiple of 16, cols a multiple of 128
    and of the block, blocks 16..128, 1..8, 16, 32 or 64 indices (tokens)."""
    out = []
    fp8 = "fp8" in leaf
    shapes = [(64, 256, 7, 32), (33, 128, 16, 64), (100, 512, 3, 128)]
    if coverage >= 2:
        shapes += [(1000, 1024, 64, 128), (17, 64, 40, 16)]
    if coverage >= 3:
        shapes += [(100352, 5120, 32, 128)]
    core = [(32, 256, 8, 64)]  # (rows, cols, indices, block)
    if coverage >= 2:
        core += [(128, 512, 1, 32), (256, 2048, 64, 64), (64, 256, 16, 16), (512, 1024, 32, 128)]
    tables = [(50 + i, "normal", shape, {}) for i, shape in enumerate(shapes)]
    tables += [(400 + i, "core", shape, {}) for i, shape in enumerate(core)]
    # indices out of range; 3 blocks, the last partial; int32 indices of rank 2
    tables += [(60, "oob", (40, 64, 9, 16), {}), (61, "normal", (17, 40, 9, 16), {})]
    tables += [(66, "normal", (40, 64, 9, 16), {"int32": True, "index_rows": 3})]
    if "Wi4" in leaf or "Wuint4" in leaf or fp8:
        tables += [(62, "normal", (9, 45, 7, 16), {})]  # odd cols: the flat nibble stream crosses rows
        tables += [(seed, "normal", shape, {"gather_axis": g, "quantize_axis": q}) for seed, shape, g, q in AXES]
    if fp8:
        tables += [(67, "normal", (20, 48, 6, 0), {}), (68, "normal", (20, 48, 6, 16), {"scale_rows_1": True})]
    for seed, pattern, (rows, cols, n, bs), more in tables:
        for zp in (False,) if fp8 else (False, True):
            params = {"block_size": bs, "zp": zp, "rows": rows, "cols": cols, **more}
            out.append(Case("gather_block_quantized", leaf, seed, (rows, cols, n), pattern, params))
    return out


def _gather_bad(leaf: str) -> list[BadArgument]:
    p = {**leaf_params(GATHER_LEAVES, leaf), "block_size": 32, "zp": False, "rows": 8, "cols": 64}
    good = _gather_inputs(Case("gather_block_quantized", leaf, 1, (8, 64, 3), "normal", p))
    bad = [
        BadArgument(
            "indices must be int32/int64",
            {**good, "indices": good["indices"].astype(np.float32)},
            p,
            arg="indices",
            match="int32|int64",
        ),
        BadArgument(
            "scales must be float32/float16",
            {**good, "scales": good["scales"].astype(np.float64)},
            p,
            arg="scales",
            match="float32|float16",
        ),
        BadArgument(
            "scales must have ceil(cols/block_size) blocks",
            {**good, "scales": np.concatenate([good["scales"], good["scales"][:, :1]], axis=1)},
            p,
            arg="scales",
            match="shape",
        ),
        BadArgument(
            "data must be uint8 bytes", {**good, "data": good["data"].view(np.int8)}, p, arg="data", match="uint8"
        ),
        # the device launcher words it "out: must be float16(3, 64), got ...": the expected shape is in both
        BadArgument(
            "out must have the output shape",
            good,
            p,
            bad_out=np.zeros((3, 65), np.float16),
            arg="out",
            match=r"shape|\(3, 64\)",
        ),
    ]
    if "fp8" in leaf:  # float8 blocks may have any size (no block_size rule); no zero points instead
        bad.append(
            BadArgument(
                "float8 data takes no zero points",
                {**good, "zero_points": np.zeros((8, 2), np.uint8)},
                p,
                arg="zero_points",
                match="not allowed|float8",
            )
        )
    else:
        bad.append(
            BadArgument(
                "block_size must be a power of two >= 16",
                good,
                {**p, "block_size": 12},
                arg="block_size",
                match="power of two|>= ?16",
            )
        )
    return bad


DATA_TYPE = Enum(
    "data_type",
    (
        ("uint8", 0, "bits 2/4/8 packed along cols, low bits first; zero points packed likewise, default 2^(bits-1)"),
        ("int4", 1, "ONNX flat nibbles over rows * cols (low nibble first), signed; default zero point 0"),
        ("uint4", 2, "ONNX flat nibbles, unsigned; default zero point 0"),
        ("float8e4m3fn", 3, "one byte per value, no zero point"),
        ("float8e5m2", 4, "one byte per value, no zero point"),
    ),
)


def _gather_bind(args: tuple, kwargs: Any) -> Bound:
    kw = call_arguments(gather_block_quantized, args, kwargs)
    data, indices, scales, zp = kw["data"], kw["indices"], kw["scales"], kw["zero_points"]
    shape, gax, qax, blocks = check_gather_args(
        data,
        indices,
        scales,
        zp,
        kw["bits"],
        kw["block_size"],
        kw["gather_axis"],
        kw["quantize_axis"],
        kw["data_type"],
        kw["data_shape"],
    )
    if len(shape) != 2 or gax != 0 or qax != 1 or scales.shape != (shape[0], blocks):
        raise Declined("data: the ABI gathers rows of a 2-D table (gather_axis 0, quantize_axis 1, a scale per block)")
    if kw.get("out_of_range", "zero") != "zero":
        raise Declined("out_of_range: the ABI gives a row of zeros (ORT >= 1.31)")
    rows, cols = shape
    n = int(indices.size)
    block = cols if blocks == 1 and kw["block_size"] == 0 else kw["block_size"]
    tensors = {
        "data": ("data", np.dtype(np.uint8)),
        "indices": ("indices", np.dtype(np.int64)),
        "scales": ("scales", scales.dtype),
        "zero_points": None if zp is None else ("zero_points", np.dtype(np.uint8)),
    }
    scalars = {
        "rows": rows,
        "cols": cols,
        "n_indices": n,
        "bits": kw["bits"],
        "block_size": block,
        "data_type": DATA_TYPE[kw["data_type"]],
        "y_dtype": dtype_code(scales.dtype),
    }
    return Bound(tensors, (*indices.shape, cols), scales.dtype, scalars, n * cols)


GATHER_ABI = Abi(
    (
        In("data", "unsigned char", "uint8", "(rows, cols * bits / 8) | flat nibbles", "the table's codes (data_type)"),
        In("indices", "long long", "int64", "(n_indices,)", "negative: + rows; outside [-rows, rows): a row of zeros"),
        In("scales", "void", "y_dtype", "(rows, ceil(cols / block_size))"),
        In("zero_points", "unsigned char", "uint8", "packed like data (see data_type)", optional=True),
        Out("Y", "void", "y_dtype", "(n_indices, cols)"),
        I64("rows", "table rows"),
        I64("cols", "table columns (values per row)"),
        I64("n_indices", "rows to gather"),
        I64("bits", "2, 4 or 8 (uint8 data), 4 (int4/uint4), 8 (fp8)"),
        I64("block_size", "values per scale along cols"),
        I64("data_type", "how data holds the codes", DATA_TYPE),
        I64("y_dtype", "scales' and Y's element type", DTYPE),
    ),
    _gather_bind,
    "com.microsoft.GatherBlockQuantized: Y[i] = fp(float(d - zp) * scale) of table row indices[i]",
    "n_indices * cols outputs",
    notes=("int32 indices are widened to int64 before the call",),
)


GATHER = OpSpec(
    name="gather_block_quantized",
    family="ort",
    leaves=GATHER_LEAVES,
    oracle=gather_block_quantized,
    call_args=_gather_call,
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
    abi=GATHER_ABI,
    check=Check("exact", 0.0, "one integer subtraction and one fp32 multiply per element, one fp16 rounding"),
    input_names=("data", "indices", "scales", "zero_points"),
    logical_dtypes={"data": "{data_type} codes (raw bytes)", "y": "float16"},
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

"""Catalogue entry fake_quantize (ONNX QuantizeLinear then DequantizeLinear; oracle:
``qconform.oracles.ort.qdq``). Shape (rows, cols)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from hypothesis import strategies as st

from qconform.contracts import Contract
from qconform.errors import Declined
from qconform.formats.fp8 import FP8_TABLES
from qconform.ops.abi import DTYPE, I64, Abi, Bound, Enum, In, Out, call_arguments, dtype_code
from qconform.ops.ort._common import ACTS, leaf_params, validating
from qconform.ops.spec import BadArgument, Case, Check, Leaf, OpSpec
from qconform.oracles.ort import check_fake_quantize_args, fake_quantize
from qconform.oracles.ort.qdq import FP8_TYPES, QTYPES
from qconform.readings import Expected, matching_any

FQ_LEAVES = tuple(
    Leaf(f"Xfp32_Q{q}_Yfp32", {"dtype": n, "act": "fp32"})
    for q, n in (
        ("u8", "uint8"),
        ("i8", "int8"),
        ("u16", "uint16"),
        ("i16", "int16"),
        ("u4", "uint4"),
        ("i4", "int4"),
        ("u2", "uint2"),
        ("i2", "int2"),
        ("fp8e4m3", "float8e4m3fn"),
        ("fp8e5m2", "float8e5m2"),
    )
) + (
    Leaf("Xfp16_Qu8_Yfp16", {"dtype": "uint8", "act": "fp16"}),
    Leaf("Xfp16_Qfp8e4m3_Yfp16", {"dtype": "float8e4m3fn", "act": "fp16"}),
    Leaf("Xfp16_Qfp8e5m2_Yfp16", {"dtype": "float8e5m2", "act": "fp16"}),
)
GRANULARITIES = ("tensor", "axis", "block")
ALONG_ROWS = ("axis0", "block0")  # axis 0: a scale per row, or blocks of 32 rows per column
AXIS = {"tensor": 1, "axis": 1, "block": 1, "axis0": 0, "block0": 0}
BLOCKED = ("block", "block0")


# Mantissas of the scales that are not powers of two (pattern ``ties_npot``): short (x = (k + 0.5)
# * s stays exact in fp32, and in fp16 for small k), and fp32(1/m) errs by +0.875, +0.96875,
# -0.9375 and -0.765625 units of 2^-24 relative, so x * fp32(1/s) leaves the tie x / s = k + 0.5
# when |error| * m_t > 2^-24 (k + 0.5 = m_t * 2^E), and rint then goes the other way where the
# even neighbour is on the other side: up for 2.5 (m_t 1.25) with the first two, down for 1.5
# with the last two -- so even a 2-bit range has ties that catch it
NPOT_MANTISSAS = np.array([1.875, 1.96875, 1.90625, 1.796875])


def _fq_params(
    shape: tuple[int, ...], gran: str, dtype: str, act: np.dtype, rng: np.random.Generator, npot: bool = False
):
    """(scale, zero point) of the granularity; scales powers of two so that exact .5 ties after
    the division occur in the data below, where dividing by s and multiplying by 1/s agree. With
    ``npot`` the scales are a power of two times a mantissa of ``NPOT_MANTISSAS``: the ties stay
    exact for a true division, and a kernel that multiplies by 1/s misses some of them."""
    rows, cols = shape
    pshape = {
        "tensor": (),
        "axis": (cols,),
        "block": (rows, -(-cols // 32)),
        "axis0": (rows,),
        "block0": (-(-rows // 32), cols),
    }[gran]
    scale = 2.0 ** rng.integers(-8, -2, pshape)
    if npot:
        scale = scale * NPOT_MANTISSAS[rng.integers(len(NPOT_MANTISSAS), size=pshape)]
    scale = scale.astype(act)
    if dtype in FP8_TYPES:  # ONNX Runtime ignores an fp8 zero point (ONNX requires 0)
        return scale, None
    np_dtype, lo, hi = QTYPES[dtype]
    zp = rng.integers(lo, hi + 1, pshape).astype(np_dtype) if hi - lo > 1 else None
    zp = np.clip(zp, lo + (hi - lo) // 4, hi - (hi - lo) // 4).astype(np_dtype) if zp is not None else None
    return scale, zp


def fp8_quotients(rng: np.random.Generator, n: int, fmt: str) -> np.ndarray:
    """n float32 values of x / s over the whole range of an fp8 format, random signs: every finite
    value, the midpoints between neighbours (exact ties: round half to even) and the float32 values
    either side of them, and values past the largest (saturation; e5m2's round-up to NaN)."""
    table = FP8_TABLES[fmt]
    finite = np.unique(np.abs(table[np.isfinite(table)]))
    mids = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)
    top = finite[-1]
    # 15/14: 480 (e4m3fn: ONNX Runtime truncates it to 448) and 61440 (e5m2: its round-up to NaN)
    over = (np.array([1.0625, 15 / 14, 1.07, 1.125, 1.25, 1.5, 4.0, 1e20]) * top).astype(np.float32)
    beside = (np.nextafter(mids, np.float32(0)), np.nextafter(mids, np.float32(np.inf)))
    pool = np.concatenate([finite, mids, *beside, np.tile(over, 8)])  # an overflow in about one value in 9
    return (pool[rng.integers(len(pool), size=n)] * rng.choice(np.array([-1, 1], np.float32), n)).astype(np.float32)


def _fq_inputs(case: Case) -> dict[str, np.ndarray]:
    p = {**leaf_params(FQ_LEAVES, case.leaf), **case.params}
    rng = np.random.default_rng(case.seed)
    act = ACTS[p["act"]]
    npot = case.pattern == "ties_npot"
    scale, zp = _fq_params(case.shape, p["granularity"], p["dtype"], act, rng, npot)
    if case.pattern == "any_scale":  # full fp32 mantissas: (q - zp) * s rounds, q*s - zp*s rounds twice
        scale = (scale.astype(np.float64) * rng.uniform(1.0, 2.0, np.shape(scale))).astype(act)
    if p.get("zp") is False:
        zp = None

    def per_element(a: np.ndarray) -> np.ndarray:  # a scale-shaped parameter, at each element of x
        a = a.astype(np.float64)
        if p["granularity"] in BLOCKED:
            axis = AXIS[p["granularity"]]
            return np.repeat(a, 32, axis=axis)[: case.shape[0], : case.shape[1]]
        if p["granularity"] == "axis0":
            return np.broadcast_to(a[:, None], case.shape)
        return np.broadcast_to(a, case.shape)

    s = per_element(scale)
    if p["dtype"] in FP8_TYPES:
        with np.errstate(over="ignore"):  # past fp16's range: inf, as a caller's overflow would give
            x = (fp8_quotients(rng, int(np.prod(case.shape)), p["dtype"]).reshape(case.shape) * s).astype(act)
        return _with_specials(case, rng, x, act, {"x": x, "scale": scale})
    _, lo, hi = QTYPES[p["dtype"]]
    k = rng.integers(lo - 3, hi + 3, case.shape).astype(np.float64)
    tie = rng.random(case.shape) < (0.6 if npot else 0.3)  # x = (k + 0.5) * s: exact ties of the division
    if npot:  # ties whose two neighbours q = k + zp, k + 1 + zp are both in range (clipping hides none)
        z = 0.0 if zp is None else per_element(zp)
        k = np.where(tie, np.floor(lo - z + rng.random(case.shape) * (hi - lo)), k)
    x = ((k + np.where(tie, 0.5, rng.uniform(-0.5, 0.5, case.shape))) * s).astype(act)
    if npot and act == np.float32:  # a quarter of the ties one ulp up, a quarter one ulp down:
        # x / s then lies an ulp or two beside the tie (an fp16 ulp would move it far from it)
        step = rng.choice(np.array([-1, 0, 0, 1]), case.shape) * tie
        x = np.where(step != 0, np.nextafter(x, np.where(step > 0, np.inf, -np.inf).astype(act)), x)
    out = {"x": x, "scale": scale}
    if zp is not None:
        out["zero_point"] = zp
    return _with_specials(case, rng, x, act, out)


def _with_specials(case: Case, rng: np.random.Generator, x: np.ndarray, act: Any, out: dict) -> dict:
    """Pattern ``specials``: NaN (-> the zero point; fp8 NaN), +-inf, |x/s| beyond 2^31 (saturate)."""
    if case.pattern == "specials":
        flat = x.reshape(-1).copy()
        big = 3e9 if act == np.float32 else 6e4
        specials = np.array([np.nan, np.inf, -np.inf, big, -big], act)
        where = rng.choice(flat.size, min(flat.size, 40), replace=False)
        flat[where] = np.resize(specials, where.size)
        out["x"] = flat.reshape(x.shape)
    return out


def _fq_call(inputs: dict[str, Any], params: dict[str, Any]) -> tuple[tuple, dict]:
    gran = params["granularity"]
    kw = {"axis": AXIS[gran], "block_size": 32 if gran in BLOCKED else 0, "dtype": params["dtype"]}
    if "saturate" in params:
        kw["saturate"] = params["saturate"]
    return (inputs["x"], inputs["scale"], inputs.get("zero_point")), kw


def _fq_cases(leaf: str, coverage: int) -> list[Case]:
    """Every granularity on (rows, cols): coverage 1 small and a ragged last block, 2 a 64 x 4096
    layer and 3 x 1000, 3 512 x 14336; pattern ``ties`` (power-of-two scales: exact ties; for fp8
    the midpoints between codes and their neighbours, ``fp8_quotients``).

    core: shapes production kernels accept, beside those (pattern ``ties``, seeds 400..404; 1 at
    coverage 1, 5 from coverage 2): 1..8, 16, 32 or 64 rows, cols a multiple of 128 (and of the
    32-value block). ``ties_npot`` (seeds 500..502; 1 at coverage 1, 3 from coverage 2): the
    same ties under scales that are not powers of two, where x / s and x * (1/s) differ. Beside
    them, at every coverage: no zero point, full-mantissa scales, NaN / inf / saturating values,
    quantization along axis 0 (a scale per row, blocks of 32 rows with a ragged last one) and for
    fp8 ``saturate=0``. The fp8 leaves at coverage 1 keep the small shapes (their golden leaves)."""
    fp8 = leaf_params(FQ_LEAVES, leaf)["dtype"] in FP8_TYPES
    small = fp8 and coverage == 1
    shapes = (
        [(4, 96)]
        + ([] if small else [(16, 200)])
        + ([(64, 4096), (3, 1000)] if coverage >= 2 else [])
        + ([(512, 14336)] if coverage >= 3 else [])
    )
    core = [(4, 128)] + ([(1, 128), (16, 512), (32, 1024), (64, 256)] if coverage >= 2 else [])
    npot = [(4, 128)] + ([(16, 200), (64, 1024)] if coverage >= 2 else [])
    wide = (4, 96) if small else (16, 200)
    sets = [(70 + i, "ties", shape, {}) for i, shape in enumerate(shapes)]
    sets += [(400 + i, "ties", shape, {}) for i, shape in enumerate(core)]
    sets += [(500 + i, "ties_npot", shape, {}) for i, shape in enumerate(npot)]
    sets += [(601, "any_scale", wide, {}), (602, "specials", (4, 96) if small else (8, 128), {})]
    if fp8:  # without saturation: overflow -> NaN / inf (a zero point does not apply)
        sets += [(605, "ties", wide, {"saturate": False}), (606, "specials", wide, {"saturate": False})]
    else:
        sets += [(600, "ties", (4, 96), {"zp": False})]
    cases = [
        Case("fake_quantize", leaf, seed, shape, pattern, {"granularity": g, **more})
        for seed, pattern, shape, more in sets
        for g in GRANULARITIES
    ]
    rows = [(603, "ties", (40, 16) if small else (40, 96)), (604, "ties_npot", (72, 8) if small else (72, 64))]
    cases += [
        Case("fake_quantize", leaf, seed, shape, pattern, {"granularity": g})
        for seed, pattern, shape in rows
        for g in ALONG_ROWS
    ]
    return cases


def _fq_bad(leaf: str) -> list[BadArgument]:
    p = {**leaf_params(FQ_LEAVES, leaf), "granularity": "axis"}
    good = _fq_inputs(Case("fake_quantize", leaf, 2, (4, 64), "ties", p))
    act = good["x"].dtype
    bad = [
        BadArgument(
            "x must be float32/float16",
            {**good, "x": good["x"].astype(np.float64)},
            p,
            arg="x",
            match="float32|float16",
        ),
        BadArgument(
            "per-axis scale must have x.shape[axis] entries",
            {**good, "scale": good["scale"][:5]},
            p,
            arg="scale",
            match=r"per-axis|x\.shape",
        ),
        BadArgument(
            "blocked scale must have ceil(D/block) entries",
            good,
            {**p, "granularity": "block"},
            arg="scale",
            match="block",
        ),
        BadArgument(
            "dtype must be a supported integer type",
            good,
            {**p, "dtype": "uint3"},
            arg="dtype",
            match="one of|support|uint3",
        ),
        # the device launcher words it "out: must be float32(4, 64), got ...": the expected shape is in both
        BadArgument(
            "out must have x's shape",
            good,
            p,
            bad_out=np.zeros((4, 65), act),
            arg="out",
            match=r"shape|\(4, 64\)",
        ),
    ]
    if "zero_point" in good:
        wrong = np.int32 if good["zero_point"].dtype != np.int32 else np.int64
        bad.append(
            BadArgument(
                "zero point must have the quantized type",
                {**good, "zero_point": good["zero_point"].astype(wrong)},
                p,
                arg="zero_point",
                match=good["zero_point"].dtype.name,
            )
        )
    return bad


GRANULARITY = Enum(
    "granularity",
    (
        ("tensor", 0, "one scale (and zero point)"),
        ("axis", 1, "one per column: cols values"),
        ("block", 2, "one per block of block_size columns of a row: (rows, ceil(cols / block_size))"),
    ),
)


def _fq_bind(args: tuple, kwargs: Any) -> Bound:
    kw = call_arguments(fake_quantize, args, kwargs)
    x, scale, zp = kw["x"], kw["scale"], kw["zero_point"]
    xs, ss, dtype = check_fake_quantize_args(x, scale, zp, kw["axis"], kw["block_size"], kw["dtype"])
    if dtype in FP8_TYPES:
        raise Declined("dtype: the ABI takes the integer types")
    if xs.ndim != 2 or kw["axis"] % 2 != 1 or ss.dtype != xs.dtype:
        raise Declined("x: the ABI takes 2-D x quantized along axis 1 with scales of x's dtype")
    gran = (
        "tensor"
        if ss.ndim == 0 or (ss.shape == (1,) and kw["block_size"] == 0)
        else ("axis" if kw["block_size"] == 0 else "block")
    )
    _, lo, hi = QTYPES[dtype]
    rows, cols = xs.shape
    tensors = {
        "x": ("x", xs.dtype),
        "scale": ("scale", xs.dtype),
        "zero_point": None if zp is None else ("zero_point", np.dtype(np.int32)),
    }
    scalars = {
        "rows": rows,
        "cols": cols,
        "granularity": GRANULARITY[gran],
        "block_size": max(kw["block_size"], 1),
        "qmin": lo,
        "qmax": hi,
        "x_dtype": dtype_code(xs.dtype),
    }
    return Bound(tensors, xs.shape, xs.dtype, scalars, rows * cols)


FQ_ABI = Abi(
    (
        In("x", "void", "x_dtype", "(rows, cols)"),
        In("scale", "void", "x_dtype", "by granularity"),
        In("zero_point", "int", "int32", "like scale (the quantized type's values, widened)", optional=True),
        Out("Y", "void", "x_dtype", "(rows, cols)"),
        I64("rows", "rows of x"),
        I64("cols", "columns of x (axis 1, the quantized axis)"),
        I64("granularity", "which scale an element uses", GRANULARITY),
        I64("block_size", "columns per scale for granularity block (1 otherwise)"),
        I64("qmin", "the quantized type's lowest value (e.g. -128 for int8, 0 for uint4)"),
        I64("qmax", "its highest value"),
        I64("x_dtype", "x's, scale's and Y's element type", DTYPE),
    ),
    _fq_bind,
    "DequantizeLinear(QuantizeLinear(x)): clip(rint(x / s) + zp, qmin, qmax), then (q - zp) * s",
    "rows * cols outputs",
    notes=("zero points are widened to int32 before the call",),
)


def _fq_numerics(inputs: dict[str, Any], params: dict[str, Any], contract: Contract, ftz: bool) -> list[Expected]:
    """The reference; with division=N an element also matches the reference whose quotient x/scale
    was up to N ulp off before the rounding (a kernel that multiplies by the reciprocal, or
    divides approximately, lands there)."""
    args, kwargs = _fq_call(inputs, params)
    want = fake_quantize(*args, **kwargs, ftz=ftz)
    if not contract.division:
        return [Expected("reference", want, plain=True)]
    n = contract.division
    candidates = [fake_quantize(*args, **kwargs, ftz=ftz, nudge=k) for k in range(-n, n + 1) if k]
    accept = functools.partial(matching_any, candidates, 1)
    return [Expected(f"reference, x/scale within {n} ulp", want, accept=accept)]


FAKE_QUANTIZE = OpSpec(
    name="fake_quantize",
    family="ort",
    leaves=FQ_LEAVES,
    oracle=fake_quantize,
    call_args=_fq_call,
    make_inputs=_fq_inputs,
    cases=_fq_cases,
    strategy=lambda lf: st.builds(
        lambda seed, rows, cols, g: Case("fake_quantize", lf, seed, (rows, cols), "ties", {"granularity": g}),
        seed=st.integers(0, 2**32 - 1),
        rows=st.integers(1, 40),
        cols=st.integers(1, 300),
        g=st.sampled_from((*GRANULARITIES, *ALONG_ROWS)),
    ),
    validate=validating(fake_quantize, _fq_call),
    bad_arguments=_fq_bad,
    numerics=_fq_numerics,
    decode=lambda y, params: y,
    abi=FQ_ABI,
    check=Check("exact", 0.0, "true fp32 division, half-to-even, one multiply: bits must match"),
    input_names=("x", "scale", "zero_point"),
    logical_dtypes={"zero_point": "{dtype} (logical values)"},
    cold_repeat=False,
    sized_case=lambda lf, rows, seed: Case("fake_quantize", lf, seed, (rows, 14336), "ties", {"granularity": "axis"}),
)

"""Catalogue entry qswiglu (the quantized SwiGLU chain; oracle: ``qconform.oracles.ort.qswiglu``).
Shape (rows, cols)."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from qconform.ops.abi import DTYPE, F32, I64, Abi, Bound, In, Out, call_arguments, dtype_code
from qconform.ops.ort._common import leaf_params, validating
from qconform.ops.spec import BadArgument, Case, Check, Leaf, OpSpec
from qconform.oracles.ort import qswiglu
from qconform.oracles.ort.qswiglu import STEPS as SWIGLU_STEPS
from qconform.oracles.ort.qswiglu import check_activations, check_qparams

SWIGLU_LEAVES = (Leaf("Xu16_Yu16", {"dtype": "uint16"}), Leaf("Xu8_Yu8", {"dtype": "uint8"}))


def _swiglu_inputs(case: Case) -> dict[str, np.ndarray]:
    """gate/up codes over the whole range; scales chosen so g spans about [-8, 8] (where the
    sigmoid bends) and the product fits the output range; zero points mid-range (the sigmoid's 0),
    or with pattern ``zp`` each moved (the sigmoid's to 1..top/4: its values above 1 - zp/top clip)."""
    dtype = leaf_params(SWIGLU_LEAVES, case.leaf)["dtype"]
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
    if case.pattern == "zp":  # every zero point off its usual place, the sigmoid's too: Q -> DQ only
        # depends on a zero point through the range it clips to, so the sigmoid's top quarter clips
        for k in ranges:
            z = int(rng.integers(1, int(top) // 4)) if k == "sig" else int(mid) + int(rng.integers(-top // 8, top // 8))
            inputs[f"{k}_zp"] = np.array(z, np_dtype)
    return inputs


def _swiglu_call(inputs: dict[str, Any], params: dict[str, Any]) -> tuple[tuple, dict]:
    kw = {f"{k}_{w}": inputs[f"{k}_{w}"] for k in SWIGLU_STEPS for w in ("scale", "zp")}
    return (inputs["gate_q"], inputs["up_q"]), {**kw, "dtype": params["dtype"]}


def _swiglu_cases(leaf: str, coverage: int) -> list[Case]:
    """Activations (tokens, FFN width): coverage 1 one token and a ragged width, 2 a 64 x 14336
    prefill, 3 512 tokens; at every coverage ``zp``: every zero point moved, the sigmoid's from 0.

    core: shapes production kernels accept, beside those (pattern ``core``, seeds 400..404; 1 at
    coverage 1, 5 from coverage 2): 1..8, 16, 32 or 64 tokens, widths a multiple of 128."""
    shapes = (
        [(1, 4096), (4, 1000)]
        + ([(64, 14336)] if coverage >= 2 else [])
        + ([(512, 14336)] if coverage >= 3 else [])
    )
    core = [(8, 512)] + ([(16, 1024), (32, 512), (3, 4096), (64, 256)] if coverage >= 2 else [])
    return (
        [Case("qswiglu", leaf, 80 + i, shape, "normal") for i, shape in enumerate(shapes)]
        + [Case("qswiglu", leaf, 90, (2, 1000), "zp")]
        + [Case("qswiglu", leaf, 400 + i, shape, "core") for i, shape in enumerate(core)]
    )


def _swiglu_bad(leaf: str) -> list[BadArgument]:
    p = dict(leaf_params(SWIGLU_LEAVES, leaf))
    good = _swiglu_inputs(Case("qswiglu", leaf, 4, (2, 64), "normal"))
    other = np.uint8 if p["dtype"] == "uint16" else np.uint16
    return [
        BadArgument(
            "gate_q must have the activation type",
            {**good, "gate_q": good["gate_q"].astype(other)},
            p,
            arg="gate_q",
            match=p["dtype"],
        ),
        BadArgument(
            "up_q must have gate_q's shape", {**good, "up_q": good["up_q"][:, :63].copy()}, p, arg="up_q", match="shape"
        ),
        BadArgument(
            "scales must be per-tensor scalars",
            {**good, "sig_scale": np.ones(2, np.float32)},
            p,
            arg="sig_scale",
            match="scalar|per-tensor",
        ),
        BadArgument(
            "zero points must have the activation type",
            {**good, "out_zp": np.array(1, np.int32)},
            p,
            arg="out_zp",
            match=p["dtype"],
        ),
        # the device launcher words it "out: must be uint16(2, 64), got ...": the expected shape is in both
        BadArgument(
            "out must have the input shape",
            good,
            p,
            bad_out=np.zeros((2, 65), np.dtype(p["dtype"])),
            arg="out",
            match=r"shape|\(2, 64\)",
        ),
    ]


def _swiglu_bind(args: tuple, kwargs: Any) -> Bound:
    c = call_arguments(qswiglu, args, kwargs)
    gate, up = c["gate_q"], c["up_q"]
    dtype = check_activations(gate, up, c["dtype"])
    q = check_qparams({f"{k}_{w}": c[f"{k}_{w}"] for k in SWIGLU_STEPS for w in ("scale", "zp")}, dtype)
    scalars: dict[str, int | float] = {"n": int(gate.size)}
    for step in SWIGLU_STEPS:
        scale, zp = q[step]
        scalars[f"{step}_scale"] = float(scale)
        scalars[f"{step}_zp"] = int(zp)
    scalars["dtype"] = dtype_code(dtype)
    tensors = {"gate_q": ("gate_q", dtype), "up_q": ("up_q", dtype)}
    return Bound(tensors, gate.shape, dtype, scalars, int(gate.size))


SWIGLU_ABI = Abi(
    (
        In("gate_q", "void", "dtype", "(n,) any shape, C order"),
        In("up_q", "void", "dtype", "like gate_q"),
        Out("Y", "void", "dtype", "like gate_q"),
        I64("n", "elements"),
        *(
            arg
            for step in SWIGLU_STEPS
            for arg in (F32(f"{step}_scale", f"per-tensor scale of {step}"), I64(f"{step}_zp", "its zero point"))
        ),
        I64("dtype", "uint8 or uint16 codes", DTYPE),
    ),
    _swiglu_bind,
    "quantized SwiGLU: Q(Q/DQ(Q/DQ(Sigmoid(g)) * g) * u), every tensor per-tensor quantized",
    "n outputs",
)


QSWIGLU = OpSpec(
    name="qswiglu",
    family="ort",
    leaves=SWIGLU_LEAVES,
    oracle=qswiglu,
    call_args=_swiglu_call,
    make_inputs=_swiglu_inputs,
    cases=_swiglu_cases,
    strategy=lambda lf: st.builds(
        lambda seed, rows, cols: Case("qswiglu", lf, seed, (rows, cols), "normal"),
        seed=st.integers(0, 2**32 - 1),
        rows=st.integers(1, 8),
        cols=st.integers(1, 2048),
    ),
    validate=validating(qswiglu, _swiglu_call),
    bad_arguments=_swiglu_bad,
    decode=lambda y, params: y,
    abi=SWIGLU_ABI,
    check=Check("steps", 1.0, "sigmoid's last-ulp accuracy is the runtime's: one output step allowed, counted"),
    input_names=("gate_q", "up_q", *(f"{k}_{w}" for k in SWIGLU_STEPS for w in ("scale", "zp"))),
    logical_dtypes={"gate_q": "{dtype}", "up_q": "{dtype}", "y": "{dtype}"},
    cold_repeat=False,
    sized_case=lambda lf, rows, seed: Case("qswiglu", lf, seed, (rows, 14336), "normal"),
)

"""Catalogue entry nested_absmax: the float32 absmax of a 4-bit weight quantized with
``compress_statistics=True`` (oracle: ``qconform.oracles.bnb.nested_absmax``; upstream
bitsandbytes/functional.py ``quantize_4bit`` / ``dequantize_4bit``, csrc/gemm_4bit_simt.cu).

bitsandbytes stores such an absmax as 8-bit codes ``qabsmax`` of ``absmax - offset`` in blocks of
256 (the dynamic map ``create_dynamic_map()``, scales ``absmax2``) and a float32 ``offset``. Leaves:
``Xu8_Yfp32``: ``fl32(fl32(code8[q] * absmax2[j // 256]) + offset)``, two roundings, as
``dequantize_4bit`` and every Python path (CPU, default, the CUDA fallback) compute it;
``Xu8_Yfp32_fma``: ``fmaf(code8[q], absmax2[j // 256], offset)``, one rounding, as the fused CUDA
SIMT GEMM computes its scale (docs/bnb-4bit.md 4.5). Variant cuda: the product flushed to zero.
Shape (rows, cols) of the weight: ``n_blocks = ceil(rows * cols / blocksize)``. Checked exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from qconform.contracts import Contract
from qconform.errors import ArgumentError
from qconform.ops.abi import F32, I64, Abi, Bound, Enum, In, Out, call_arguments
from qconform.ops.bnb import patterns
from qconform.ops.bnb._common import NESTED_BLOCKSIZE, check_out, choice, contract_variant, deliver
from qconform.ops.spec import BadArgument, Case, Check, Leaf, OpSpec
from qconform.oracles.bnb import BLOCKSIZES, VARIANTS, QuantState, create_dynamic_map, get_4bit_type
from qconform.oracles.bnb import nested_absmax as bnb_nested_absmax
from qconform.readings import Expected

MODES = ("two_round", "fma")
NESTED_MODE = Enum(
    "nested_mode",
    (
        ("two_round", 0, "fl32(fl32(code8[q] * absmax2) + offset): dequantize_4bit, the Python paths"),
        ("fma", 1, "fmaf(code8[q], absmax2, offset): the fused CUDA SIMT GEMM"),
    ),
)
LEAVES = (Leaf("Xu8_Yfp32", {"mode": "two_round"}), Leaf("Xu8_Yfp32_fma", {"mode": "fma"}))
LLM = ((4096, 14336), (4096, 512), (2048, 768))  # FFN, GQA k/v, MoE expert weights (coverage 2)


def check_nested_args(qabsmax: Any, absmax2: Any, offset: Any, mode: Any, out: Any = None) -> int:
    """The argument rules: n_blocks."""
    if not isinstance(qabsmax, np.ndarray) or qabsmax.dtype != np.uint8 or qabsmax.ndim != 1 or qabsmax.size == 0:
        got = f"{getattr(qabsmax, 'dtype', type(qabsmax).__name__)} {getattr(qabsmax, 'shape', '')}"
        raise ArgumentError(f"qabsmax: must be a non-empty 1-D uint8 numpy.ndarray (a code per block), got {got}")
    nb = qabsmax.size
    nb2 = -(-nb // NESTED_BLOCKSIZE)
    if not isinstance(absmax2, np.ndarray) or absmax2.dtype != np.float32 or absmax2.shape != (nb2,):
        got = f"{getattr(absmax2, 'dtype', type(absmax2).__name__)} {getattr(absmax2, 'shape', '')}"
        raise ArgumentError(f"absmax2: must be float32 of shape ({nb2},) (one per 256 blocks of {nb}), got {got}")
    if not isinstance(offset, np.ndarray) or offset.dtype != np.float32 or offset.size != 1:
        got = f"{getattr(offset, 'dtype', type(offset).__name__)} {getattr(offset, 'shape', '')}"
        raise ArgumentError(f"offset: must be a float32 scalar array (0-d or one element), got {got}")
    choice("mode", mode, MODES)
    check_out(out, np.dtype(np.float32), (nb,))
    return nb


def nested_absmax(
    qabsmax: np.ndarray,
    absmax2: np.ndarray,
    offset: np.ndarray,
    *,
    mode: str = "two_round",
    out: np.ndarray | None = None,
    variant: str = "cpu",
    ftz: bool = False,
) -> np.ndarray:
    """float32 absmax ``(n_blocks,)`` from bitsandbytes' nested statistics (module docstring).
    ``ftz``: the product flushed as a flush-to-zero build does (the cuda variant always does)."""
    nb = check_nested_args(qabsmax, absmax2, offset, mode, out)
    choice("variant", variant, VARIANTS)
    state = QuantState(
        absmax=qabsmax, shape=(nb * 64,), dtype="float32", blocksize=64, code=get_4bit_type("nf4"),
        quant_type="nf4", offset=np.float32(offset.reshape(-1)[0]), state2_absmax=absmax2,
        state2_code=create_dynamic_map(), state2_blocksize=NESTED_BLOCKSIZE,
    )  # fmt: skip
    with np.errstate(invalid="ignore", over="ignore"):  # NaN / inf scales are inputs like any other
        y = bnb_nested_absmax(state, "cuda" if ftz else variant, mode)  # the variants differ only in flush-to-zero
    return deliver(np.asarray(y, np.float32), out)


def _call(inputs: dict[str, Any], params: dict[str, Any]) -> tuple[tuple, dict]:
    return (inputs["qabsmax"], inputs["absmax2"], inputs["offset"]), {"mode": params["mode"]}


def _cases(leaf: str, coverage: int) -> list[Case]:
    """coverage 1 (small: the golden set): a quantized absmax with one partial 256-block, random
    codes over a whole 256-group and a partial one, and second-level scales 0, NaN, inf, subnormal
    products (flush-to-zero) and 3e38 (the sum overflows); 2: blocksizes 32..4096 of a 64 x 4096
    weight, more seeds, the nested statistics of the 4096 x 14336, 4096 x 512 and 2048 x 768 layer
    weights; 3: 8192 x 28672.

    core: shapes production kernels take (pattern ``quantized``, seeds 400..409; 1 at coverage 1,
    10 from coverage 2): weights of 1..64 rows and widths 512..8192 at blocksizes 32..256."""
    out: list[Case] = []

    def add(pattern: str, shape: tuple[int, int], seed: int, bs: int) -> None:
        out.append(Case("nested_absmax", leaf, seed, shape, pattern, {"blocksize": bs}))

    add("quantized", (1, 14336), 1, 64)
    add("random", (3, 3000), 2, 32)  # 282 blocks: a whole 256-group, then a partial one
    add("special", (16, 8192), 1000, 64)
    if coverage >= 2:
        for i, bs in enumerate(BLOCKSIZES):
            add("quantized", (64, 4096), 10 + i, bs)
            add("random", (64, 4096), 20 + i, bs)
        for s in range(4):
            add("special", (32, 8192), 1010 + s, 32)
        for i, shape in enumerate(LLM):
            add("quantized", shape, 300 + i, 64)
    if coverage >= 3:
        add("quantized", (8192, 28672), 310, 64)
        add("random", (8192, 28672), 311, 32)
    core = [(8, 4096, 64)] + [
        (1, 4096, 64), (2, 2048, 128), (3, 8192, 32), (4, 4096, 256), (5, 512, 64),
        (6, 1024, 128), (7, 2048, 32), (16, 4096, 64), (32, 1024, 128), (64, 4096, 64),
    ]  # fmt: skip
    for i, (rows, cols, bs) in enumerate(core[: 1 if coverage == 1 else None]):
        add("quantized", (rows, cols), 400 + i, bs)
    return out


def _make_inputs(case: Case) -> dict[str, np.ndarray]:
    rows, cols = case.shape
    nb = -(-rows * cols // case.params["blocksize"])
    q8, absmax2, offset = patterns.nested(case.pattern, case.seed, nb)
    return {"qabsmax": q8, "absmax2": absmax2, "offset": offset}


def _bad(leaf: str) -> list[BadArgument]:
    good = _make_inputs(Case("nested_absmax", leaf, 7, (4, 8192), "random", {"blocksize": 64}))  # 512 blocks
    p = {"mode": next(lf.params["mode"] for lf in LEAVES if lf.name == leaf)}
    return [
        BadArgument(
            "qabsmax must be uint8", {**good, "qabsmax": good["qabsmax"].view(np.int8)}, p, arg="qabsmax", match="uint8"
        ),
        BadArgument(
            "qabsmax must be 1-D", {**good, "qabsmax": good["qabsmax"].reshape(2, 256)}, p, arg="qabsmax", match="1-D"
        ),
        BadArgument(
            "absmax2 must hold one scale per 256 blocks",
            {**good, "absmax2": np.ones(3, np.float32)},
            p,
            arg="absmax2",
            match=r"shape|\(2,\)",
        ),
        BadArgument(
            "absmax2 must be float32",
            {**good, "absmax2": good["absmax2"].astype(np.float64)},
            p,
            arg="absmax2",
            match="float32",
        ),
        BadArgument(
            "offset must be one float32",
            {**good, "offset": np.ones(2, np.float32)},
            p,
            arg="offset",
            match="scalar|one element",
        ),
        BadArgument("offset must be float32", {**good, "offset": np.array(1.0)}, p, arg="offset", match="float32"),
        BadArgument("mode must be two_round or fma", good, {"mode": "fast"}, arg="mode", match="two_round"),
        BadArgument(
            "out must be float32 (n_blocks,)",
            good,
            p,
            bad_out=np.zeros(511, np.float32),
            arg="out",
            match=r"shape|\(512,\)",
        ),
    ]


def _bind(args: tuple, kwargs: Any) -> Bound:
    a = call_arguments(nested_absmax, args, kwargs)
    nb = check_nested_args(a["qabsmax"], a["absmax2"], a["offset"], a["mode"])
    scalars = {"n_blocks": nb, "mode": NESTED_MODE[a["mode"]], "offset": float(a["offset"].reshape(-1)[0])}
    tensors = {"qabsmax": ("qabsmax", np.dtype(np.uint8)), "absmax2": ("absmax2", np.dtype(np.float32))}
    return Bound(tensors, (nb,), np.dtype(np.float32), scalars, nb)


NESTED_ABI = Abi(
    (
        In("qabsmax", "unsigned char", "uint8", "(n_blocks)", "8-bit codes of absmax - offset (the dynamic map)"),
        In("absmax2", "float", "float32", "(ceil(n_blocks / 256))", "the scale of each 256 codes"),
        Out("y", "float", "float32", "(n_blocks)", "the absmax of each 4-bit block"),
        I64("n_blocks", "4-bit blocks"),
        I64("mode", "how the offset is added", NESTED_MODE),
        F32("offset", "the mean bitsandbytes subtracted before nesting"),
    ),
    _bind,
    "bitsandbytes nested statistics (compress_statistics=True): 8-bit codes, absmax2, offset -> float32 absmax",
    "n_blocks outputs",
    notes=(
        "code8 is bitsandbytes' dynamic map, create_dynamic_map() (qconform.oracles.bnb; sha256 of its 1024 "
        "little-endian bytes e732639a65f497b4ad684bb166a4467708255edd5207757de8b8f0c7e1fda89c)",
        "the default reading is bitsandbytes' CPU backend (--contract variant=cuda: the product flushed to zero)",
    ),
)


def _numerics(inputs: dict[str, Any], params: dict[str, Any], contract: Contract, ftz: bool) -> list:
    variant = contract_variant(contract)
    args, kw = _call(inputs, params)
    return [
        Expected(
            f"bitsandbytes {variant}", nested_absmax(*args, **kw, variant=variant, ftz=ftz), plain=variant == "cpu"
        )
    ]


NESTED_ABSMAX = OpSpec(
    name="nested_absmax",
    family="bnb",
    leaves=LEAVES,
    oracle=nested_absmax,
    call_args=_call,
    make_inputs=_make_inputs,
    cases=_cases,
    strategy=lambda lf: st.builds(
        lambda pattern, rows, cols, bs, seed: Case("nested_absmax", lf, seed, (rows, cols), pattern, {"blocksize": bs}),
        pattern=st.sampled_from(patterns.NESTED_PATTERNS),
        rows=st.integers(1, 16),
        cols=st.integers(1, 8192),
        bs=st.sampled_from(BLOCKSIZES[:4]),
        seed=st.integers(0, 2**32 - 1),
    ),
    validate=lambda inputs, params, out=None: check_nested_args(*_call(inputs, params)[0], params["mode"], out),
    bad_arguments=_bad,
    decode=lambda y, params: y,
    abi=NESTED_ABI,
    check=Check("exact", 0.0, "the nested absmax is elementwise: bits must match"),
    input_names=("qabsmax", "absmax2", "offset"),
    output_name="y",
    locate=lambda params, index: f"block {index[0]} (absmax2 block {index[0] // NESTED_BLOCKSIZE})",
    logical_dtypes={"qabsmax": "uint8 codes of the dynamic map", "y": "float32 absmax ({mode})"},
    sized_case=lambda lf, rows, seed: Case("nested_absmax", lf, seed, (rows, 16384), "random", {"blocksize": 64}),
    cold_repeat=False,
    numerics=_numerics,
)

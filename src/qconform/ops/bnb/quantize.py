"""Catalogue entries nf4_quantize and fp4_quantize: bitsandbytes ``quantize_4bit`` without nested
statistics (oracle: ``qconform.oracles.bnb.quantize_4bit``; upstream bitsandbytes/functional.py
``quantize_4bit``, bitsandbytes/backends/default/ops.py on the CPU, csrc/kernels.cu
``kQuantizeBlockwise`` on CUDA). Shape (rows, cols) of the input ``A``; blocks of ``blocksize`` run
over ``A.reshape(-1)``.

Output ``y``: one uint8 array, ``4 * n_blocks + (n + 1) // 2`` bytes: the float32 absmax of each
block (little-endian), then the packed codes (element 2j in the high nibble of byte j, 2j+1 in the
low one; an odd n pads the last byte with the code of 0.0 at the last block's scale). Rounding: the
scaled value ``x * fl32(1/absmax)`` (the tail block ``x / absmax``) goes to the code whose float32
midpoints bracket it, a tie to the lower code (variant cpu); the float32 literal thresholds with
strict ``>`` (variant cuda). Checked exact.
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
    check_blocksize,
    check_out,
    choice,
    contract_variant,
    deliver,
    flush_carrier,
    input_dtype,
    shape_strategy,
    subnormal,
    with_shape,
)
from qconform.ops.spec import BadArgument, Case, Check, Leaf, OpSpec
from qconform.oracles.bnb import BLOCKSIZES, VARIANTS, quantize_4bit
from qconform.oracles.bnb.codes import native_4bit_table
from qconform.oracles.bnb.fourbit import unpack_nibbles
from qconform.readings import Expected

EXACT = Check("exact", 0.0, "bitsandbytes' 4-bit quantization is blockwise and deterministic: bytes must match")
LLM = ((4096, 512), (2048, 768))  # GQA k/v projection, MoE expert: coverage 2 (4096 x 14336: coverage 3)
EDGE = ("zero_block", "nan", "midpoints")  # where the backends disagree (docs/bnb-4bit.md 2.3)
MORE = ("uniform", "outlier", "equal_abs", "extreme", "subnormal", "inf", "nan_payload", "mixed", "midpoints_npot")


def layout(n: int, blocksize: int) -> tuple[int, int]:
    """(n_blocks, packed bytes) of ``n`` values."""
    return -(-n // blocksize), (n + 1) // 2


def check_quantize_args(A: Any, blocksize: Any, out: Any = None) -> tuple[str, int, int]:
    """The argument rules: (A's dtype name, n_blocks, packed bytes)."""
    dtype = input_dtype("A", A)
    bs = check_blocksize(blocksize)
    nb, nbytes = layout(A.size, bs)
    check_out(out, np.dtype(np.uint8), (4 * nb + nbytes,))
    return dtype, nb, nbytes


def _quantize(quant_type: str, A: np.ndarray, blocksize: int, out: Any, variant: str, ftz: bool, backend: str) -> Any:
    dtype, _, _ = check_quantize_args(A, blocksize, out)
    choice("variant", variant, VARIANTS)
    if ftz and variant != "cuda":  # "cuda" always flushes (--use_fast_math); the others read inputs flushed
        A = flush_carrier(A, dtype)
    packed, state = quantize_4bit(A, blocksize, False, quant_type, variant, backend=backend)
    absmax = state.absmax
    if ftz and variant != "cuda":
        absmax = np.where(subnormal(absmax), np.float32(0), absmax).astype(np.float32)  # the 1e-38 clamp flushed
    y = np.concatenate([absmax.astype("<f4").view(np.uint8), packed.reshape(-1)])
    return deliver(y, out)


def nf4_quantize(
    A: np.ndarray,
    blocksize: int = 64,
    *,
    out: np.ndarray | None = None,
    variant: str = "cpu",
    ftz: bool = False,
    backend: str = "numba",
) -> np.ndarray:
    """NF4 ``quantize_4bit(A, blocksize, quant_type="nf4")`` as one uint8 array (module docstring).
    ``ftz``: as a flush-to-zero build reads fp32/bf16 subnormal inputs (the cuda variant always does)."""
    return _quantize("nf4", A, blocksize, out, variant, ftz, backend)


def fp4_quantize(
    A: np.ndarray,
    blocksize: int = 64,
    *,
    out: np.ndarray | None = None,
    variant: str = "cpu",
    ftz: bool = False,
    backend: str = "numba",
) -> np.ndarray:
    """FP4 ``quantize_4bit(A, blocksize, quant_type="fp4")`` as one uint8 array (module docstring)."""
    return _quantize("fp4", A, blocksize, out, variant, ftz, backend)


def split(y: np.ndarray, n: int, blocksize: int) -> tuple[np.ndarray, np.ndarray]:
    """(float32 absmax, packed bytes) of an output ``y``."""
    nb, _ = layout(n, blocksize)
    return y[: 4 * nb].view("<f4").astype(np.float32), y[4 * nb :]


def _decode(quant_type: str, y: np.ndarray, params: dict[str, Any]) -> np.ndarray:
    """The values the output stands for, ``code[q] * absmax`` in float64 (pad nibble included)."""
    n, bs = params["rows"] * params["cols"], params["blocksize"]
    absmax, packed = split(y, n, bs)
    m = n + n % 2
    q = unpack_nibbles(packed, m).astype(np.int64)
    scale = np.repeat(absmax.astype(np.float64), bs)[:m]
    with np.errstate(invalid="ignore", over="ignore"):
        return native_4bit_table(quant_type)[q].astype(np.float64) * scale


def _locate(params: dict[str, Any], index: tuple[int, ...]) -> str:
    n, bs = params["rows"] * params["cols"], params["blocksize"]
    nb, _ = layout(n, bs)
    (i,) = index
    if i < 4 * nb:
        return f"absmax of block {i // 4} (byte {i % 4})"
    j = i - 4 * nb
    return f"packed byte {j}: elements {2 * j} (high nibble), {2 * j + 1} (low nibble) of block {2 * j // bs}"


def _cases(op: str, leaf: str, coverage: int) -> list[Case]:
    """coverage 1 (small: the golden set): a ragged width (1000 at blocksize 64: a partial block),
    an odd n (3 x 333: the pad nibble), one partial block of 4096, and the disagreement patterns
    ``midpoints`` (ties on the float32 midpoints and the CUDA literal thresholds), ``zero_block``
    and ``nan`` at blocksizes 32..128, ``midpoints_npot`` over 7 full blocks and a tail, an all-zero
    tail (``zero_tail``) and fp16 subnormal blocks (``subnormal_f16``); 2: every
    blocksize 32..4096 on full and partial blocks, every other pattern, more seeds, the layer
    weights 4096 x 512 (GQA k/v) and 2048 x 768 (MoE expert); 3: the 4096 x 14336 FFN weight and
    more seeds.

    core: shapes production kernels take (pattern ``normal``, seeds 400..409; 1 at coverage 1, 10
    from coverage 2): rows 1..64, widths a multiple of every blocksize used (a whole number of
    blocks per row), blocksizes 64 (bitsandbytes' default), 128, 256."""
    out: list[Case] = []

    def add(pattern: str, shape: tuple[int, int], seed: int, bs: int) -> None:
        out.append(with_shape(Case(op, leaf, seed, shape, pattern, {"blocksize": bs})))

    add("normal", (1, 1000), 1, 64)
    add("normal", (3, 333), 2, 128)
    add("normal", (1, 1000), 3, 4096)
    for i, (pattern, bs) in enumerate(zip(EDGE, (32, 64, 128), strict=True)):
        add(pattern, (2, 128 if pattern != "midpoints" else 256), 1000 + i, bs)
    add("midpoints_npot", (3, 333), 1003, 128)  # full blocks and a tail: their two scalings
    add("zero_tail", (3, 333), 1004, 128)  # an all-zero partial block: absmax 0 (the 1e-38 clamp; 0 * inf)
    add("subnormal_f16", (2, 256), 1005, 64)
    if coverage >= 2:
        for i, bs in enumerate(BLOCKSIZES):
            add("normal", (2, 2 * bs), 10 + i, bs)
            add("uniform", (3, bs + bs // 2 + 1), 20 + i, bs)
            add("midpoints", (2, 2 * bs), 1010 + i, bs)
        for i, pattern in enumerate(EDGE + MORE):
            add(pattern, (4, 256), 1100 + i, 64)
            add(pattern, (3, 300), 1200 + i, 128)
        for i, shape in enumerate(LLM):
            add("normal", shape, 300 + i, 64)
    if coverage >= 3:
        add("normal", (4096, 14336), 310, 64)
        for s in range(8):
            add("midpoints", (8, 4096), 1300 + s, (64, 128, 256, 4096)[s % 4])
            add("nan", (4, 1024), 1400 + s, 64)
    for i, (rows, cols, bs) in enumerate(CORE_SHAPES[: 1 if coverage == 1 else None]):
        add("normal", (rows, cols), 400 + i, bs)
    return out


def _bad(leaf: str, dtype: str) -> list[BadArgument]:
    rng = np.random.default_rng(5)
    carrier = CARRIER[dtype]
    good = patterns.values("normal", 5, 128, 64, "nf4", dtype).reshape(2, 64)
    p = {"blocksize": 64}
    return [
        BadArgument(
            "A must be float32, float16 or bfloat16", {"A": good.astype(np.float64)}, p, arg="A", match="dtype"
        ),
        BadArgument("A must be float32, float16 or bfloat16", {"A": good.view(np.int16)}, p, arg="A", match="dtype"),
        BadArgument("A must hold an element", {"A": np.zeros((2, 0), carrier)}, p, arg="A", match="one element"),
        BadArgument(
            "blocksize must be a power of two 32..4096", {"A": good}, {"blocksize": 48}, arg="blocksize", match="32, 64"
        ),
        BadArgument(
            "blocksize must be a power of two 32..4096", {"A": good}, {"blocksize": 8192}, arg="blocksize", match="4096"
        ),
        BadArgument(
            "out must be uint8 (4 * n_blocks + (n + 1) // 2,)",
            {"A": good},
            p,
            bad_out=np.zeros(4 * 2 + 63, np.uint8),
            arg="out",
            match=r"shape|\(72,\)",
        ),
        BadArgument(
            "out must be uint8",
            {"A": good},
            p,
            bad_out=rng.integers(0, 9, 72).astype(np.int8),
            arg="out",
            match="uint8",
        ),
    ]


def _numerics(oracle: Any, inputs: dict[str, Any], params: dict[str, Any], contract: Contract, ftz: bool) -> list:
    """The reading of the variant the contract selects (default cpu; ``--contract variant=cuda``)."""
    variant = contract_variant(contract)
    want = oracle(inputs["A"], params["blocksize"], variant=variant, ftz=ftz)
    return [Expected(f"bitsandbytes {variant}", want, plain=variant == "cpu" and not ftz)]


QUANT_TYPE = {"nf4_quantize": "nf4", "fp4_quantize": "fp4"}


def _bind(oracle: Any) -> Any:
    def bind(args: tuple, kwargs: Any) -> Bound:
        a = call_arguments(oracle, args, kwargs)
        dtype, nb, nbytes = check_quantize_args(a["A"], a["blocksize"])
        scalars = {"n": int(a["A"].size), "blocksize": int(a["blocksize"]), "n_blocks": nb, "a_dtype": DTYPE[dtype]}
        return Bound({"A": ("A", CARRIER[dtype])}, (4 * nb + nbytes,), np.dtype(np.uint8), scalars, nb)

    return bind


def _abi(name: str, oracle: Any) -> Abi:
    qt = QUANT_TYPE[name].upper()
    return Abi(
        (
            In("A", "void", "float32 | float16 | bfloat16 (a_dtype)", "(n,) any shape, C order", "values to quantize"),
            Out(
                "y",
                "unsigned char",
                "uint8",
                "(4 * n_blocks + (n + 1) / 2)",
                "n_blocks float32 absmax (little-endian), then the packed codes",
            ),
            I64("n", "values in A"),
            I64("blocksize", "32, 64, ..., 4096: values per absmax"),
            I64("n_blocks", "ceil(n / blocksize)"),
            I64("a_dtype", "A's element type (bfloat16: its 16 bits)", DTYPE),
        ),
        _bind(oracle),
        f"bitsandbytes quantize_4bit (quant_type={QUANT_TYPE[name]}, no nested statistics): A -> absmax, {qt} codes",
        "n_blocks",
        notes=(
            "block b covers A.reshape(-1)[b*blocksize : (b+1)*blocksize]; absmax[b] = max |x| over it",
            "byte j of the codes holds element 2j in its high nibble and 2j+1 in its low nibble; an odd n pads "
            "the last low nibble with the code of 0.0",
            "the default reading is bitsandbytes' CPU backend (--contract variant=cuda: its CUDA kernels)",
        ),
    )


def _op(name: str, oracle: Any) -> OpSpec:
    qt = QUANT_TYPE[name]
    leaves = tuple(
        Leaf(f"X{t}_Y{qt}", {"dtype": d}) for t, d in (("fp32", "float32"), ("fp16", "float16"), ("bf16", "bfloat16"))
    )

    def make_inputs(case: Case) -> dict[str, np.ndarray]:
        dtype = next(lf.params["dtype"] for lf in leaves if lf.name == case.leaf)
        rows, cols = case.shape
        x = patterns.values(case.pattern, case.seed, rows * cols, case.params["blocksize"], qt, dtype)
        return {"A": x.reshape(rows, cols)}

    def numerics(inputs: dict[str, Any], params: dict[str, Any], contract: Contract, ftz: bool) -> list:
        return _numerics(oracle, inputs, params, contract, ftz)

    return OpSpec(
        name=name,
        family="bnb",
        leaves=leaves,
        oracle=oracle,
        call_args=lambda inputs, params: ((inputs["A"], params["blocksize"]), {}),
        make_inputs=make_inputs,
        cases=lambda lf, coverage: _cases(name, lf, coverage),
        strategy=lambda lf: shape_strategy(name, lf, patterns.VALUE_PATTERNS),
        validate=lambda inputs, params, out=None: check_quantize_args(inputs["A"], params["blocksize"], out),
        bad_arguments=lambda lf: _bad(lf, next(x.params["dtype"] for x in leaves if x.name == lf)),
        decode=lambda y, params: _decode(qt, y, params),
        abi=_abi(name, oracle),
        check=EXACT,
        input_names=("A",),
        output_name="y",
        locate=_locate,
        logical_dtypes={
            "A": "{dtype} (bfloat16 as uint16 bits)",
            "y": f"float32 absmax per block of {{blocksize}}, then {qt.upper()} codes (2 per byte, high nibble first)",
        },
        sized_case=lambda lf, rows, seed: with_shape(Case(name, lf, seed, (rows, 4096), "normal", {"blocksize": 64})),
        numerics=numerics,
    )


NF4_QUANTIZE = _op("nf4_quantize", nf4_quantize)
FP4_QUANTIZE = _op("fp4_quantize", fp4_quantize)

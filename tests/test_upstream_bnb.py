"""Cross-check ``qconform.oracles.bnb`` against bitsandbytes' own CPU backend, bit for bit.

bitsandbytes (0.50.x, with a CPU build of torch) quantizes 4-bit on CPU with its default (torch) path,
the nested statistics with its C++ LUT quantizer, and dequantizes with a C++ kernel: the scalar one,
the AVX-512 one (last dimension a multiple of 16, on an AVX-512 machine), or the torch path (odd last
dimension, or blocksize >= 2048 on an AVX-512 machine). The variant under test follows the machine:
"cpu-avx512" where torch reports AVX512, else "cpu". x86-64 only (the NEON kernels are not modelled).

Compared: packed bytes and 8-bit codes exactly; float32 absmax exactly, NaN positions only (torch's
NaN payloads depend on its reduction kernels); dequantized values exactly, where both are NaN counted
equal. Dequantize is fed bitsandbytes' own state, so NaN payloads reach the bf16 bit trick the same.
``torch.compile`` of the default path is off except in one test (it compiles per shape, slowly).
"""

from __future__ import annotations

import platform

import numpy as np
import pytest

from qconform.ops.bnb.patterns import values, weights
from qconform.oracles import bnb as O
from qconform.oracles.bnb.codes import (
    CPU_BOUNDS,
    CPU_ORDER,
    DYNAMIC_MAP,
    FP4_CUDA_THRESHOLDS,
    NF4_CUDA_THRESHOLDS,
)

bitsandbytes = pytest.importorskip("bitsandbytes")
torch = pytest.importorskip("torch")
F = bitsandbytes.functional

pytestmark = [
    pytest.mark.upstream,
    pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 kernels only"),
]

try:
    from bitsandbytes.backends.cpu.ops import _has_avx512 as AVX512
except ImportError:  # older layouts: ask torch the same question
    AVX512 = torch.backends.cpu.get_cpu_capability() == "AVX512"
VARIANT = "cpu-avx512" if AVX512 else "cpu"
AVX512BF16 = bool(F.has_avx512bf16())
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
DTYPES = tuple(TORCH_DTYPES)
BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
# (4, 96): rows == flat for bs 32; (3, 4144): 4144 % 16 == 0 but % bs != 0 -> the AVX-512 kernel's
# per-row absmax differs from the flat one; (5, 40): the scalar C++ kernel; (7, 33) and (1001,): odd
# last dimension -> the torch path; (2, 8192): every blocksize divides; (1, 2): bitsandbytes transposes.
SHAPES = ((4, 96), (3, 4144), (5, 40), (7, 33), (1001,), (2, 8192), (1, 2))


@pytest.fixture(autouse=True)
def _eager_torch():
    torch.set_num_threads(1)
    old = torch._dynamo.config.disable
    torch._dynamo.config.disable = True
    yield
    torch._dynamo.config.disable = old


def to_np(t) -> np.ndarray:
    t = t.detach().contiguous()
    return t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()


def from_np(a: np.ndarray, dtype: str):
    if dtype == "bfloat16":
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a))


def widen(a: np.ndarray) -> np.ndarray:
    if a.dtype == np.uint16:
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def assert_same(ours: np.ndarray, theirs: np.ndarray, what: str) -> None:
    """Bit-equal, except that two NaNs are equal."""
    ours, theirs = np.asarray(ours).reshape(-1), np.asarray(theirs).reshape(-1)
    assert ours.shape == theirs.shape, (what, ours.shape, theirs.shape)
    view = {4: np.uint32, 2: np.uint16, 1: np.uint8}[ours.itemsize]
    same = ours.view(view) == theirs.view(view)
    if ours.dtype != np.uint8:
        same |= np.isnan(widen(ours)) & np.isnan(widen(theirs))
    bad = np.flatnonzero(~same)
    first = bad[:3]
    assert bad.size == 0, f"{what}: {bad.size} differ, first at {first}: ours {ours[first]} theirs {theirs[first]}"


def state_from_bnb(st) -> O.QuantState:
    nested = {}
    if st.nested:
        nested = dict(
            offset=np.float32(st.offset.item()),
            state2_absmax=to_np(st.state2.absmax),
            state2_code=to_np(st.state2.code),
            state2_blocksize=st.state2.blocksize,
        )
    return O.QuantState(
        absmax=to_np(st.absmax), shape=tuple(st.shape), dtype=str(st.dtype).removeprefix("torch."),
        blocksize=st.blocksize, code=to_np(st.code), quant_type=st.quant_type, **nested,
    )  # fmt: skip


def check_4bit(a: np.ndarray, dtype: str, blocksize: int, quant_type: str, nested: bool, what: str) -> int:
    """Quantize ``a`` with bitsandbytes and the oracle, compare everything, then dequantize bitsandbytes'
    result into every dtype both ways. Returns the number of 4-bit blocks compared."""
    t = from_np(a, dtype)
    q, st = F.quantize_4bit(t, blocksize=blocksize, compress_statistics=nested, quant_type=quant_type)
    offset = np.float32(st.offset.item()) if nested else None
    oq, ost = O.quantize_4bit(a, blocksize, nested, quant_type, VARIANT, offset=offset)
    assert oq.shape == tuple(q.shape), what
    assert_same(oq, to_np(q), f"{what} packed")
    assert_same(ost.absmax, to_np(st.absmax), f"{what} absmax")
    if nested:
        assert_same(ost.state2_absmax, to_np(st.state2.absmax), f"{what} state2.absmax")
        assert_same(ost.state2_code, to_np(st.state2.code), f"{what} state2.code")
    ours_state = state_from_bnb(st)
    for out_dtype in DTYPES:
        st.dtype = TORCH_DTYPES[out_dtype]
        theirs = F.dequantize_4bit(q, st)
        ours = O.dequantize_4bit(to_np(q), ours_state, out_dtype, VARIANT, avx512bf16=AVX512BF16)
        assert_same(ours, to_np(theirs), f"{what} dequantize -> {out_dtype}")
    return -(-a.size // blocksize)


def _random(shape: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * np.exp(rng.uniform(-4, 4))).astype(np.float32)
    flat = x.reshape(-1)
    flat[rng.integers(0, flat.size, 3)] *= 50  # outliers
    if dtype == "float16":
        return x.astype(np.float16)
    if dtype == "bfloat16":
        return (x.view(np.uint32) >> 16).astype(np.uint16)  # truncated: any bf16 pattern will do
    return x


@pytest.mark.parametrize("nested", [False, True], ids=["plain", "nested"])
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_4bit_random(dtype: str, quant_type: str, nested: bool) -> None:
    blocks = 0
    for i, shape in enumerate(SHAPES):
        a = _random(shape, dtype, 100 * i + len(dtype))
        for bs in BLOCKSIZES:
            blocks += check_4bit(a, dtype, bs, quant_type, nested, f"{shape} bs={bs}")
    assert blocks > 0


def _f32(*words: int) -> np.ndarray:
    return np.array(words, np.uint32).view(np.float32)


def _steps(v: np.ndarray, k: int) -> np.ndarray:
    for _ in range(abs(k)):
        v = np.nextafter(v, np.float32(np.inf if k > 0 else -np.inf))
    return v.astype(np.float32)


def _special_cases() -> dict[str, np.ndarray]:
    """The spec's disagreement inputs, as float32 rows of 128 (or a tail) with absmax 1 where s = x."""
    probes = np.concatenate([CPU_BOUNDS["nf4"], CPU_BOUNDS["fp4"], NF4_CUDA_THRESHOLDS, FP4_CUDA_THRESHOLDS])
    probes = np.concatenate([probes, -probes])
    probes = np.concatenate([probes, _steps(probes, 1), _steps(probes, -1)])
    ties = np.concatenate([[1.0], probes]).astype(np.float32)
    tiny = _f32(0x3B2AAAAB, 0x3B2AAAAC, 0x3B2AAAB9, 0x3B2AAABA, 0x3B000000, 0xBB000000, 0xBB2AAAAB, 0xBB2AAAAA)
    rng = np.random.default_rng(7)
    nan_inf = rng.standard_normal(200).astype(np.float32)
    nan_inf[[10, 199]] = np.nan
    nan_inf[150] = np.inf
    # absmax 3: fl32(x / 3) (tail block) and fl32(x * fl32(1/3)) (full block) straddle an NF4 midpoint
    straddle = np.concatenate([[3.0], _f32(0xBFEA7BA7, 0xBF826FD8, 0xBED3D519, 0x3DF4787F, 0x3F957EFB, 0x3FF6D487)])
    return {
        "tail division": np.concatenate([straddle, np.zeros(25), straddle]).astype(np.float32),
        "midpoint ties": np.concatenate([ties, np.zeros(-ties.size % 64, np.float32)]),
        "fp4 tiny": np.concatenate([[1.0], tiny, -tiny, np.zeros(47)]).astype(np.float32),
        "zero blocks": np.concatenate([np.zeros(64), rng.standard_normal(64), np.zeros(37)]).astype(np.float32),
        "nan and inf": nan_inf,
        "subnormals": np.concatenate([_f32(*range(1, 65)), _f32(0x00400000, 0x3F800000, 0x80000005)]),
        "huge": np.concatenate([[3.4e38, -3.4e38, 1e-30], np.ones(61), [-3.4e38]]).astype(np.float32),
    }


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(_special_cases()))
def test_4bit_disagreement_cases(case: str, dtype: str) -> None:
    x = _special_cases()[case]
    with np.errstate(over="ignore"):  # "huge" overflows fp16 to inf, on purpose
        a = {"float32": x, "float16": x.astype(np.float16), "bfloat16": (x.view(np.uint32) >> 16).astype(np.uint16)}
    for shape in ((x.size,), (1, x.size)):
        for bs in (32, 64, 2048):
            for qt in ("nf4", "fp4"):
                for nested in (False, True):
                    with np.errstate(all="ignore"):
                        check_4bit(a[dtype].reshape(shape), dtype, bs, qt, nested, f"{case} {shape} bs={bs} {qt}")


@pytest.mark.parametrize("pattern", ["midpoints_npot", "zero_tail", "subnormal_f16"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_4bit_catalogue_patterns(dtype: str, pattern: str) -> None:
    """The catalogue's inputs over full blocks and a tail: midpoints_npot (absmax not a power of two,
    values where the full blocks' reciprocal product and the tail's division pick different codes),
    zero_tail (an all-zero partial block), subnormal_f16 (fp16 subnormal magnitudes)."""
    for qt in ("nf4", "fp4"):
        for bs in (64, 128):
            x = values(pattern, 11 + bs, 999, bs, qt, dtype)
            check_4bit(x.reshape(3, 333), dtype, bs, qt, False, f"{pattern} bs={bs} {qt}")


def test_4bit_with_torch_compile() -> None:
    """bitsandbytes compiles its default dequantize with torch.compile when it can; same bits."""
    torch._dynamo.config.disable = False
    for shape in ((7, 33), (2, 4096)):
        a = _random(shape, "float32", 3)
        check_4bit(a, "float32", 2048, "fp4", True, f"compiled {shape}")


def test_fp4_code_8_sign_per_kernel() -> None:
    """Code 8 is -0 in the C++ scalar table, +0 in Python's and in the AVX-512 table."""
    for shape in ((2, 40), (2, 64), (3, 33)):
        n = int(np.prod(shape))
        packed = np.full(((n + 1) // 2, 1), 0x88, np.uint8)
        nb = -(-n // 64)
        st = F.QuantState(absmax=torch.ones(nb), shape=torch.Size(shape), dtype=torch.float32, blocksize=64,
                          code=F.get_4bit_type("fp4", device="cpu"), quant_type="fp4")  # fmt: skip
        theirs = to_np(F.dequantize_4bit(torch.from_numpy(packed), st))
        ours = O.dequantize_4bit(packed, state_from_bnb(st), "float32", VARIANT)
        assert_same(ours, theirs, str(shape))
        scalar = shape[-1] % 2 == 0 and not (AVX512 and shape[-1] % 16 == 0)
        assert bool(np.signbit(theirs).all()) == scalar, shape


@pytest.mark.parametrize("out_dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_4bit_decode_double_rounding(quant_type: str, out_dtype: str) -> None:
    """The catalogue's double_rounding weights (fl32(code * absmax) on fp16 / bf16 midpoints): the
    fp32 product rounded again to the output type, as bitsandbytes does."""
    shape = (4, 256)
    packed, absmax = weights("double_rounding", 7, 1024, 64, quant_type)
    torch_dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}[out_dtype]
    st = F.QuantState(absmax=torch.from_numpy(absmax), shape=torch.Size(shape), dtype=torch_dtype, blocksize=64,
                      code=F.get_4bit_type(quant_type, device="cpu"), quant_type=quant_type)  # fmt: skip
    theirs = to_np(F.dequantize_4bit(torch.from_numpy(packed.reshape(-1, 1)), st))
    ours = O.dequantize_4bit(packed.reshape(-1, 1), state_from_bnb(st), out_dtype, VARIANT, avx512bf16=AVX512BF16)
    assert_same(ours, theirs, f"{quant_type} {out_dtype}")


def test_code_tables_match_bitsandbytes() -> None:
    for qt in ("nf4", "fp4"):
        assert_same(O.get_4bit_type(qt), to_np(F.get_4bit_type(qt, device="cpu")), qt)
        from bitsandbytes.backends.default.ops import _get_4bit_quantize_bounds

        bounds, order = _get_4bit_quantize_bounds(qt, torch.device("cpu"))
        assert_same(CPU_BOUNDS[qt], to_np(bounds), f"{qt} bounds")
        assert CPU_ORDER[qt].tolist() == to_np(order).tolist()
    assert_same(O.create_dynamic_map(), to_np(F.create_dynamic_map()), "dynamic map")


def _blockwise_inputs() -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(11)
    mid = (DYNAMIC_MAP[:-1] + DYNAMIC_MAP[1:]).astype(np.float32) / np.float32(2)
    ties = np.concatenate([[1.0], mid, _steps(mid, 1), _steps(mid, -1), DYNAMIC_MAP]).astype(np.float32)
    special = np.concatenate([np.zeros(256), [np.nan, np.inf, -np.inf, 1.0], rng.standard_normal(252)])
    return [
        ("random", (rng.standard_normal(3 * 4096 + 5) * 0.05).astype(np.float32)),
        ("ties", np.concatenate([ties, np.zeros(-ties.size % 256)]).astype(np.float32)),
        ("special", special.astype(np.float32)),
        ("subnormal", np.concatenate([_f32(*range(1, 300)), rng.standard_normal(213).astype(np.float32)])),
    ]


@pytest.mark.parametrize("dtype", DTYPES)
def test_blockwise_8bit(dtype: str) -> None:
    """C++ LUT quantizer (variant "cpu") and the torch one ("default", reached by redispatch), then
    dequantize into every dtype."""
    code = F.create_dynamic_map()
    op = torch.ops.bitsandbytes.quantize_blockwise.default
    default_keys = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)
    for name, x in _blockwise_inputs():
        a = {"float32": x, "float16": x.astype(np.float16), "bfloat16": (x.view(np.uint32) >> 16).astype(np.uint16)}
        a = a[dtype]
        for bs in (64, 256, 1000, 4096):
            what = f"{name} bs={bs}"
            with np.errstate(all="ignore"):
                for variant, run in (("cpu", op), ("default", lambda *args: op.redispatch(default_keys, *args))):
                    q, absmax = run(from_np(a, dtype), code, bs)
                    oq, ost = O.quantize_blockwise(a, blocksize=bs, variant=variant)
                    assert_same(oq, to_np(q), f"{what} {variant} codes")
                    assert_same(ost.absmax, to_np(absmax), f"{what} {variant} absmax")
                for out_dtype in DTYPES:
                    y = torch.ops.bitsandbytes.dequantize_blockwise(q, absmax, code, bs, TORCH_DTYPES[out_dtype])
                    oy = O.dequantize_blockwise(to_np(q), absmax=to_np(absmax), blocksize=bs, dtype=out_dtype)
                    assert_same(oy, to_np(y), f"{what} dequantize -> {out_dtype}")


# relL2 of bitsandbytes' CPU matmul (dequantize into T, then torch's F.linear) against the oracle's
# float64 reference: the output rounding to T dominates (2^-11 fp16, 2^-8 bf16), plus the T-rounded
# weights and a BLAS summation order in fp32.
MATMUL_TOL = {"float32": 1e-6, "float16": 2e-3, "bfloat16": 1.6e-2}


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemv_gemm_against_the_float64_reference(dtype: str) -> None:
    rng = np.random.default_rng(17)
    N, K = 64, 1024
    w = rng.standard_normal((N, K)).astype(np.float32)
    for qt, nested in (("nf4", False), ("fp4", True)):
        wt = from_np(w if dtype == "float32" else _random((N, K), dtype, 5), dtype)
        q, st = F.quantize_4bit(wt, blocksize=64, compress_statistics=nested, quant_type=qt)
        ours = state_from_bnb(st)
        a = _random((3, K), dtype, 6)
        bias = _random((N,), dtype, 7)
        theirs = to_np(bitsandbytes.matmul_4bit(from_np(a, dtype), q.t(), quant_state=st, bias=from_np(bias, dtype)))
        ref = O.gemm_4bit(a, to_np(q), ours, bias, order="float64")
        assert np.linalg.norm(widen(theirs) - ref) / np.linalg.norm(ref) < MATMUL_TOL[dtype], (qt, "gemm")
        row = a[:1]
        ref = O.gemv_4bit(row, to_np(q), ours, order="float64")
        if AVX512BF16:  # F.gemv_4bit runs the AVX512-BF16 kernel, which reads only the packed CPU layout
            q, st = F._convert_weight_packed_for_cpu(q.clone(), st)
        theirs = to_np(F.gemv_4bit(from_np(row, dtype), q, state=st))
        tol = max(MATMUL_TOL[dtype], 1e-2) if AVX512BF16 else MATMUL_TOL[dtype]  # bf16 A and absmax
        assert np.linalg.norm(widen(theirs) - ref) / np.linalg.norm(ref) < tol, (qt, "gemv")

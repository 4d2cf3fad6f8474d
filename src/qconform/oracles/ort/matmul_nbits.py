"""com.microsoft.MatMulNBits: blockwise n-bit weights along K, as ONNX Runtime's x86 CPU computes.

Source: docs/ort-ops.md section 1 (ORT 1.30/1.31 schema, experiments, and
contrib_ops/cpu/quantization/matmul_nbits.cc, mlas q4_dq.cpp, sqnbitgemm_kernel_avx2.cpp).

Layout: B (N, k_blocks, block_size*bits/8) uint8, column n's values along K packed low bits first;
the last block padded to a whole block (the padding is never read). scales (N, k_blocks).
zero_points: packed uint8 (N, ceil(k_blocks*bits/8)) with default 2**(bits-1) when absent, or
float (N, k_blocks) in the scales' type.

Dequantization, form="ort" (what ORT's CPU computes):
  integer zero point (packed or default), no g_idx:  w = fp32(float(q - z) * s)        one rounding
  float zero point, or g_idx present:                w = fp32(fp32(q * s) + fp32(-s * z))  two
form="kernel": w = fp32(fp32(q - z) * s) for any zero point, including a scalar (the uniform
fp16 zero-point path of a kernel that folds all-equal zero points into one constant); compare a
kernel with the form that rounds where it rounds.
g_idx (4-bit only in ORT): the block of row k is g_idx[k]. ORT ignores packed uint8 zero points
when g_idx is present (matmul_nbits_impl.cc never assigns them); ``ort_quirks=True`` reproduces
that, the default applies them.

Product: accuracy_level 0-3 compute Y = A @ W^T (+ bias) in float64 and round once to fp32 (ORT
accumulates in fp32 in an implementation-defined order: compare with a tolerance from K); fp16 A:
everything in fp32, Y rounded once to fp16. accuracy_level 4 (int8 activations, ORT's CompInt8):
per row and K-block, amax = max|a|, sa = fp32(amax/127), inv = fp32(127/amax) (0 when amax = 0),
qa = clip(rint(fp32(a*inv)), -128, 127) (half to even); Y = sum_b fp32(sa*s[n,b]) *
sum_i qa_i*(q[n,i] - z[n,b]) + bias. It applies only with integer zero points and no g_idx
(ORT takes the unpacked fp32 path otherwise). bits = 3 follows the same rules; ORT's CPU refuses
it ("Only 2b, 4b and 8b quantization is supported"). A block whose amax is below 127 / FLT_MAX has
inv = inf, and which code its non-finite products (a * inf, and 0 * inf = NaN) get depends on the
x86-64 kernel MLAS dispatches to on the host (``mlas``): "avx512" (QuantizeARow_CompInt8_avx512,
AVX-512 F/BW/DQ/VL hosts) keeps the low byte of cvtps_epi32's INT32_MIN, 0; "avx2"
(QuantizeARow_CompInt8_avx2, AVX2 and AVX2-VNNI hosts) packs INT32_MIN with signed saturation
(packs_epi32, packs_epi16: convert_2_ps_to_epi8), -128. Finite products are within [-127, 127] on both.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qconform.errors import ArgumentError
from qconform.formats.ulp import nudge_ulp
from qconform.oracles.ort._out import check_out, deliver, flushed
from qconform.oracles.ort.packing import SUPPORTED_BITS, packed_size, unpack_bits

FLOAT_TYPES = (np.dtype(np.float32), np.dtype(np.float16))
FORMS = ("ort", "kernel")
MLAS_KERNELS = {"avx512": 0, "avx2": -128}  # MLAS's x86-64 A quantizer -> the code of a non-finite a * inv


@dataclass(frozen=True)
class NBitsLayout:
    K: int
    N: int
    bits: int
    block_size: int

    @property
    def k_blocks(self) -> int:
        return -(-self.K // self.block_size)

    @property
    def blob_size(self) -> int:
        return self.block_size * self.bits // 8

    @property
    def zp_bytes(self) -> int:
        return packed_size(self.k_blocks, self.bits)


def _array(name: str, a: object, dtypes: tuple[np.dtype, ...]) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise ArgumentError(f"{name}: must be a numpy.ndarray, got {type(a).__name__}")
    if a.dtype not in dtypes:
        raise ArgumentError(f"{name}: dtype must be {' or '.join(str(d) for d in dtypes)}, got {a.dtype}")
    return a


def _shape(name: str, a: np.ndarray, shape: tuple[int, ...]) -> None:
    if a.shape != shape:
        raise ArgumentError(f"{name}: shape must be {shape}, got {a.shape}")


def check_nbits_args(
    B: object,
    scales: object,
    zero_points: object = None,
    g_idx: object = None,
    *,
    K: int,
    N: int,
    bits: int,
    block_size: int,
    form: str = "ort",
) -> NBitsLayout:
    """Validate the weight-side arguments of MatMulNBits; return the layout."""
    if bits not in SUPPORTED_BITS:
        raise ArgumentError(f"bits: must be one of {SUPPORTED_BITS}, got {bits!r}")
    if not isinstance(block_size, int) or block_size < 16 or block_size & (block_size - 1):
        raise ArgumentError(f"block_size: must be a power of two >= 16, got {block_size!r}")
    for name, v in (("K", K), ("N", N)):
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise ArgumentError(f"{name}: must be a positive integer, got {v!r}")
    if form not in FORMS:
        raise ArgumentError(f"form: must be one of {FORMS}, got {form!r}")
    lay = NBitsLayout(int(K), int(N), bits, block_size)
    _shape("B", _array("B", B, (np.dtype(np.uint8),)), (lay.N, lay.k_blocks, lay.blob_size))
    s = _array("scales", scales, FLOAT_TYPES)
    if s.shape not in ((lay.N, lay.k_blocks), (lay.N * lay.k_blocks,)):
        raise ArgumentError(f"scales: shape must be {(lay.N, lay.k_blocks)}, got {s.shape}")
    if zero_points is not None:
        z = np.asarray(zero_points)
        if z.dtype == np.uint8:
            if z.shape not in ((lay.N, lay.zp_bytes), (lay.N * lay.zp_bytes,)):
                raise ArgumentError(f"zero_points: packed uint8 shape must be {(lay.N, lay.zp_bytes)}, got {z.shape}")
        elif z.dtype == s.dtype or (form == "kernel" and z.dtype in FLOAT_TYPES):
            scalar = z.ndim == 0 or z.size == 1
            if not (scalar and form == "kernel") and z.shape not in ((lay.N, lay.k_blocks), (lay.N * lay.k_blocks,)):
                raise ArgumentError(
                    f"zero_points: float shape must be {(lay.N, lay.k_blocks)}"
                    + (" (or a scalar with form='kernel')" if form == "kernel" else "")
                    + f", got {z.shape}"
                )
        else:
            raise ArgumentError(f"zero_points: dtype must be uint8 (packed) or the scales' {s.dtype}, got {z.dtype}")
    if g_idx is not None:
        g = _array("g_idx", g_idx, (np.dtype(np.int32),))
        _shape("g_idx", g, (lay.K,))
        if g.size and (g.min() < 0 or g.max() >= lay.k_blocks):
            raise ArgumentError(f"g_idx: every entry must be a block index in [0, {lay.k_blocks})")
    return lay


def unpack_weights(B: np.ndarray, lay: NBitsLayout) -> np.ndarray:
    """(N, K) int32 quantized values; the padding of the last block dropped."""
    q = unpack_bits(B.reshape(lay.N, lay.k_blocks, lay.blob_size), lay.bits, lay.block_size)
    return q.reshape(lay.N, lay.k_blocks * lay.block_size)[:, : lay.K].astype(np.int32)


def _zero_points(zero_points: object, lay: NBitsLayout, ignore_packed: bool) -> tuple[np.ndarray, bool]:
    """(zero points, is_float): (N, k_blocks) int32, float32 (N, k_blocks), or a float32 scalar."""
    default = np.full((lay.N, lay.k_blocks), 1 << (lay.bits - 1), np.int32)
    if zero_points is None:
        return default, False
    z = np.asarray(zero_points)
    if z.dtype == np.uint8:
        if ignore_packed:
            return default, False
        return unpack_bits(z.reshape(lay.N, lay.zp_bytes), lay.bits, lay.k_blocks).astype(np.int32), False
    if z.size == 1:
        return z.astype(np.float32).reshape(()), True
    return z.astype(np.float32).reshape(lay.N, lay.k_blocks), True


def dequantize_nbits(
    B: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None = None,
    g_idx: np.ndarray | None = None,
    *,
    K: int,
    N: int,
    bits: int,
    block_size: int,
    form: str = "ort",
    ort_quirks: bool = False,
    out: np.ndarray | None = None,
    ftz: bool = False,
) -> np.ndarray:
    """The exact fp32 weight W (N, K) that MatMulNBits multiplies by (see the module docstring)."""
    lay = check_nbits_args(B, scales, zero_points, g_idx, K=K, N=N, bits=bits, block_size=block_size, form=form)
    check_out(out, (lay.N, lay.K), np.dtype(np.float32), B, scales, zero_points)
    return deliver(_dequantize(B, scales, zero_points, g_idx, lay, form, ort_quirks), out, ftz)


def _dequantize(B, scales, zero_points, g_idx, lay: NBitsLayout, form: str, ort_quirks: bool) -> np.ndarray:
    q = unpack_weights(B, lay)
    s_blocks = scales.astype(np.float32).reshape(lay.N, lay.k_blocks)
    z_blocks, z_float = _zero_points(zero_points, lay, ignore_packed=g_idx is not None and ort_quirks)
    kb = np.asarray(g_idx, dtype=np.int64) if g_idx is not None else np.arange(lay.K) // lay.block_size
    s = s_blocks[:, kb]
    z = z_blocks if z_blocks.ndim == 0 else z_blocks[:, kb]
    with np.errstate(over="ignore", invalid="ignore"):
        if form == "kernel":
            return (((q.astype(np.float32) - z).astype(np.float32)) * s).astype(np.float32)
        if z_float or g_idx is not None:
            qs = (q.astype(np.float32) * s).astype(np.float32)
            neg_sz = (-s * np.asarray(z, np.float32)).astype(np.float32)
            return (qs + neg_sz).astype(np.float32)
        return ((q - z).astype(np.float32) * s).astype(np.float32)


def check_a(A: object, bias: object, lay: NBitsLayout) -> np.ndarray:
    a = _array("A", A, FLOAT_TYPES)
    if a.ndim < 1 or a.shape[-1] != lay.K:
        raise ArgumentError(f"A: the last dimension must be K = {lay.K}, got shape {a.shape}")
    if bias is not None:
        b = _array("bias", bias, FLOAT_TYPES)
        _shape("bias", b, (lay.N,))
    return a


def _activation_products(a: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """ORT's CompInt8 scaling: (fp32(a * inv) (M, kb, bs), sa (M, kb)), the padding zero."""
    m, k = a.shape
    kb = -(-k // block_size)
    padded = np.zeros((m, kb * block_size), np.float32)
    padded[:, :k] = a
    blocks = padded.reshape(m, kb, block_size)
    amax = np.abs(blocks).max(axis=2)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        sa = (amax / np.float32(127)).astype(np.float32)
        inv = np.where(amax != 0, (np.float32(127) / np.where(amax != 0, amax, 1)).astype(np.float32), np.float32(0))
        return (blocks * inv[:, :, None]).astype(np.float32), sa


def _check_mlas(mlas: str) -> None:
    if mlas not in MLAS_KERNELS:
        raise ArgumentError(f"mlas: must be one of {', '.join(MLAS_KERNELS)}, got {mlas!r}")


def quantize_activations_int8(a: np.ndarray, block_size: int, mlas: str = "avx512") -> tuple[np.ndarray, np.ndarray]:
    """ORT's CompInt8 A quantization: (M, K) fp32 -> (qa (M, kb*bs) int32, sa (M, kb) fp32). A block
    whose amax is below 127 / FLT_MAX has inv = inf: MLAS converts its non-finite products to INT32_MIN,
    then keeps the low byte, 0 (``mlas`` "avx512": QuantizeARow_CompInt8_avx512, vpmovdb truncates) or
    saturates it to -128 (``mlas`` "avx2": QuantizeARow_CompInt8_avx2's signed packs)."""
    _check_mlas(mlas)
    prod, sa = _activation_products(a, block_size)
    qa = np.where(np.isfinite(prod), np.clip(np.rint(prod), -128, 127), float(MLAS_KERNELS[mlas]))
    return qa.astype(np.int32).reshape(len(a), -1), sa


def matmul_nbits(
    A: np.ndarray,
    B: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None = None,
    g_idx: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    *,
    K: int,
    N: int,
    bits: int,
    block_size: int,
    accuracy_level: int = 0,
    form: str = "ort",
    ort_quirks: bool = False,
    out: np.ndarray | None = None,
    ftz: bool = False,
    mlas: str = "avx512",
) -> np.ndarray:
    """Y (..., N) = A (..., K) @ W^T (+ bias), in A's dtype (see the module docstring); ``mlas``: the
    x86-64 kernel whose accuracy_level 4 A quantization is reproduced ("avx512" or "avx2")."""
    lay = check_nbits_args(B, scales, zero_points, g_idx, K=K, N=N, bits=bits, block_size=block_size, form=form)
    a = check_a(A, bias, lay)
    check_out(out, (*a.shape[:-1], lay.N), a.dtype, A, B, scales, zero_points, bias)
    if accuracy_level not in (0, 1, 2, 3, 4):
        raise ArgumentError(f"accuracy_level: must be 0..4, got {accuracy_level!r}")
    _check_mlas(mlas)
    a32 = a.astype(np.float32).reshape(-1, lay.K)
    if uses_int8_activations(accuracy_level, zero_points, g_idx, lay.bits, lay.block_size):
        y = _int8_blocks(a32, B, scales, zero_points, lay, mlas)[0].sum(axis=2)
    else:
        y = _fp32_product(a32, B, scales, zero_points, g_idx, lay, form, ort_quirks)[0]
    if bias is not None:
        y = y + bias.astype(np.float32).astype(np.float64)
    return deliver(_rounded(y, a, lay, ftz), out)


def uses_int8_activations(accuracy_level: int, zero_points: object, g_idx: object, bits: int, block_size: int) -> bool:
    """ORT CPU's CompInt8 path: accuracy_level 4 with integer zero points and no g_idx, where MLAS has an
    int8 kernel for the width and block (``MlasIsQNBitGemmAvailable``; ORT 1.32 on x86-64, measured: 4 and
    8 bits at every block of 16..256, 2 bits at 32, 64 and 128 only, else fp32 activations, level 0's
    result). 3 bits (which ORT refuses) keep the int8 reading."""
    z_is_float = zero_points is not None and np.asarray(zero_points).dtype != np.uint8
    if bits == 2 and block_size not in (32, 64, 128):
        return False
    return accuracy_level == 4 and g_idx is None and not z_is_float


def _rounded(y: np.ndarray, a: np.ndarray, lay: NBitsLayout, ftz: bool) -> np.ndarray:
    """The float64 product (bias included) as Y: fp32 (flushed with ``ftz``), then A's dtype."""
    with np.errstate(over="ignore"):
        return flushed(y.astype(np.float32).reshape(*a.shape[:-1], lay.N), ftz).astype(a.dtype)


N_CHUNK = 2048  # weight columns dequantized at a time: bounded memory for lm_head-sized N


def _fp32_product(
    a32, B, scales, zero_points, g_idx, lay: NBitsLayout, form: str, ort_quirks: bool, magnitudes: bool = False
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """A @ W^T in float64, W dequantized N_CHUNK columns at a time; with ``magnitudes`` also
    |A| @ |W|^T and |A| @ moved^T (``_weights64``), else None for both."""
    a64 = a32.astype(np.float64)
    y = np.empty((len(a64), lay.N), np.float64)
    mag, store = (np.empty_like(y), np.empty_like(y)) if magnitudes else (None, None)
    for n0 in range(0, lay.N, N_CHUNK):
        n1 = min(lay.N, n0 + N_CHUNK)
        w, moved = _weights64(B, scales, zero_points, g_idx, lay, n0, n1, form, ort_quirks, magnitudes)
        y[:, n0:n1] = a64 @ w.T
        if magnitudes:
            mag[:, n0:n1], store[:, n0:n1] = np.abs(a64) @ np.abs(w).T, np.abs(a64) @ moved.T
    return y, mag, store


def _int8_blocks(
    a32: np.ndarray, B: np.ndarray, scales: np.ndarray, zero_points: object, lay: NBitsLayout, mlas: str = "avx512"
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """ORT's CompInt8 terms per block: (fp32(sa * s) * integer dot, |fp32(sa * s)| (M, N, kb), the
    activation codes (M, kb, bs) as ``mlas``'s kernel makes them, the weights' codes q - z (N, kb, bs)),
    float64 (the integer dots are exact in it)."""
    qa, sa = quantize_activations_int8(a32, lay.block_size, mlas)
    q = unpack_bits(B.reshape(lay.N, lay.k_blocks, lay.blob_size), lay.bits, lay.block_size).astype(np.int64)
    z, _ = _zero_points(zero_points, lay, ignore_packed=False)
    wz = (q - z.astype(np.int64)[:, :, None]).astype(np.float64)  # the padding meets zero activations
    qa3 = qa.reshape(len(qa), lay.k_blocks, lay.block_size).astype(np.float64)
    s = scales.astype(np.float32).reshape(lay.N, lay.k_blocks)
    scale = (sa[:, None, :] * s[None, :, :]).astype(np.float32).astype(np.float64)  # fp32(sa * s)
    return scale * np.einsum("mbi,nbi->mnb", qa3, wz), np.abs(scale), qa3, wz


@dataclass(frozen=True)
class ProductTerms:
    """One reading of Y = A @ W^T (+ bias), for error bounds (``qconform.properties.bounds``):
    ``ref`` the reference's arithmetic done exactly in float64 (before Y's rounding), ``mag`` =
    sum |terms|, ``store_mag`` = sum |a| (|z s| + 2 |w|) (``_weights64``), ``n_terms`` the terms per
    output (rounded products and sums a kernel may perform), ``partials(i)`` the per-K-block
    partial sums of output ``i`` (row-major over A's rows, then n)."""

    ref: np.ndarray
    mag: np.ndarray
    store_mag: np.ndarray
    n_terms: int
    partials: object  # Callable[[int, int], np.ndarray]
    output: np.ndarray  # Y as the oracle rounds ``ref`` (this reading's exact output)
    slack: np.ndarray | None = None  # absolute allowance of a declared approximate division


def product_terms(
    A: np.ndarray,
    B: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None = None,
    g_idx: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    *,
    K: int,
    N: int,
    bits: int,
    block_size: int,
    accuracy_level: int = 0,
    form: str = "ort",
    ort_quirks: bool = False,
    path: str = "float",
    division_ulp: int = 0,
    ftz: bool = False,
) -> ProductTerms:
    """``path="float"``: fp32 activations times the fp32 weights (levels 0-3; what ORT's CUDA
    provider computes at every level); ``"int8"``: ORT CPU's int8 activations (level 4, integer
    zero points, no g_idx): sum_b fp32(sa*s) * (integer dot) over k_blocks + 2 rounded terms.
    ``division_ulp`` (int8 path): sa and 127/amax may be that many ulp off (approximate division):
    ``slack`` then holds what moves -- each code a*inv within that of a rounding boundary may
    step by one (|fp32(sa*s)| |q - z| each), and the block scales by (2N + 1) u. ``output`` is
    the oracle's Y for this reading (``ftz`` as the oracle's)."""
    lay = check_nbits_args(B, scales, zero_points, g_idx, K=K, N=N, bits=bits, block_size=block_size, form=form)
    a = check_a(A, bias, lay)
    a32 = a.astype(np.float32).reshape(-1, lay.K)
    slack = None
    if path == "int8":
        block_sums, abs_scale, qa3, wz = _int8_blocks(a32, B, scales, zero_points, lay)
        ref = block_sums.sum(axis=2)
        mag = (abs_scale * np.einsum("mbi,nbi->mnb", np.abs(qa3), np.abs(wz))).sum(axis=2)
        store, n_terms = np.zeros_like(ref), lay.k_blocks + 2
        if division_ulp:
            prod, _ = _activation_products(a32, lay.block_size)
            steps = division_ulp + 1  # the approximate inverse, then the product's own rounding
            near = np.rint(nudge_ulp(prod, -steps)) != np.rint(nudge_ulp(prod, steps))
            flips = np.einsum("mbi,nbi->mnb", near.astype(np.float64), np.abs(wz))
            slack = (abs_scale * flips).sum(axis=2) + (2 * division_ulp + 1) * 2.0**-24 * mag

        def partials(i: int, n: int) -> np.ndarray:
            return block_sums[i, n]
    else:
        ref, mag, store = _fp32_product(a32, B, scales, zero_points, g_idx, lay, form, ort_quirks, magnitudes=True)
        n_terms = lay.K
        kb = np.asarray(g_idx, dtype=np.int64) if g_idx is not None else np.arange(lay.K) // lay.block_size
        a64 = a32.astype(np.float64)

        def partials(i: int, n: int) -> np.ndarray:
            w, _ = _weights64(B, scales, zero_points, g_idx, lay, n, n + 1, form, ort_quirks)
            return np.bincount(kb, weights=a64[i] * w[0], minlength=int(kb.max(initial=0)) + 1)

    if bias is not None:
        bias64 = bias.astype(np.float32).astype(np.float64)
        ref, mag, n_terms = ref + bias64, mag + np.abs(bias64), n_terms + 1
    shape = (*A.shape[:-1], lay.N)
    return ProductTerms(
        ref.reshape(shape),
        mag.reshape(shape),
        store.reshape(shape),
        n_terms,
        partials,
        _rounded(ref, a, lay, ftz),
        None if slack is None else slack.reshape(shape),
    )


def _weights64(
    B, scales, zero_points, g_idx, lay: NBitsLayout, n0: int, n1: int, form: str, ort_quirks: bool, moved: bool = True
) -> tuple[np.ndarray, np.ndarray | None]:
    """Columns n0..n1 of W in float64, and (with ``moved``, else None) what holding them and the
    activations in a narrower type moves, per unit roundoff: |z s| + 2 |w| (z*s rounded, w
    stored, a converted), with |q s| added for ORT's float-zero-point form fp32(q*s) + fp32(-s*z)."""
    sub = NBitsLayout(lay.K, n1 - n0, lay.bits, lay.block_size)
    z = None if zero_points is None else np.asarray(zero_points)
    if z is not None and z.size > 1:
        z = z.reshape(lay.N, -1)[n0:n1]
    s2 = scales.reshape(lay.N, lay.k_blocks)[n0:n1]
    w = _dequantize(B[n0:n1], s2, z, g_idx, sub, form, ort_quirks).astype(np.float64)
    if not moved:
        return w, None
    z_blocks, z_float = _zero_points(z, sub, ignore_packed=g_idx is not None and ort_quirks)
    kb = np.asarray(g_idx, dtype=np.int64) if g_idx is not None else np.arange(lay.K) // lay.block_size
    s = np.abs(s2.astype(np.float64)[:, kb])
    zz = np.abs(np.asarray(z_blocks, np.float64))
    amount = (zz if zz.ndim == 0 else zz[:, kb]) * s + 2 * np.abs(w)
    if form == "ort" and (z_float or g_idx is not None):
        amount += np.abs(unpack_weights(B[n0:n1], sub).astype(np.float64)) * s
    return w, amount

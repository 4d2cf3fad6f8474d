"""com.microsoft.QMoE and com.microsoft.MoE: mixture of experts, as ONNX Runtime's x86 CPU computes.

Sources (microsoft/onnxruntime): onnxruntime/contrib_ops/cpu/moe/moe_quantization_cpu.cc (QMoE:
``DequantizeBlockWithMlas``, ``QMoECPU`` constructor and ``QNBitGemmEligible`` for the int8
activation path, ``ComputeCommon``), onnxruntime/contrib_ops/cpu/moe/moe_cpu.cc (MoE),
onnxruntime/contrib_ops/cpu/moe/moe_utils.cc (``ApplyActivation``, ``ApplySwiGLUActivation``),
the op schemas (docs/ContribOperators.md); docs/ort-ops.md section 5. Cross-checked against
onnxruntime 1.32.0 on the CPU (tests/test_upstream_ort_qmoe.py). Routing: ``moe_routing``.

Layout, per expert e (rows N = output features, K = input features, like nn.Linear.weight):
- fc1_experts_weights uint8 (E, f*I, H*bits/8), fc2_experts_weights (E, H, I*bits/8): row n holds
  W[e, n, 0:K] packed along K, low bits first (``packing``); f = 2 for SwiGLU, where the fc1 rows
  interleave gate and linear: gate = even rows, linear = odd rows (swiglu_fusion=1, the only
  layout ORT's CPU takes; QMoE needs swiglu_fusion=0 with the other activations).
- scales (the input's dtype): per row (E, N), or with block_size (E, N, K/block_size), block
  k // block_size. block_size: a power of two >= 16 dividing H and I (the schema's rule; ORT's
  CPU also runs a partial last block, on fp32 activations -- not modelled here).
- zero points uint8, default 2**(bits-1): per row (E, ceil(N*bits/8)) packed along N; block-wise
  (E, N, ceil((K/block_size)*bits/8)) packed along the blocks, each row padded to a whole byte
  (onnxruntime 1.30 mis-read an odd block count per row; fixed in 1.31).
- An fc whose K equals block_size has one block per row; its zero points keep the block-wise
  layout (E, N, 1) (one byte per row; onnxruntime 1.30 mis-read it).

precision="reference" (ORT's CPU arithmetic; fp16 input, scales and biases are widened to fp32,
everything runs in fp32 and the output is rounded once to fp16):
1. routing: ``moe_routing.route`` (QMoE: softmax over the k selected logits; skip w <= 1e-8).
2. W = fp32((q - z) * s): integer subtraction, one fp32 multiply (exact dequantization).
3. fc: Y = fp32(X @ W^T), the dot products in float64 and rounded once (ORT's MLAS accumulates in
   fp32 in an implementation-defined order: compare with a tolerance growing with K); then
   fp32(Y + bias).
   ORT's int8 activation path (the MatMulNBits CompInt8 kernels) replaces the product where it
   applies: block-wise weights (block_size given, one block per row included), 8-bit at every
   accuracy_level or 4-bit with accuracy_level 4, weights, scales and zero points constant
   initializers (``constant_weights``; graph inputs keep fp32 activations). Per row and per
   K-block of block_size: amax = max|x|, sa = fp32(amax/127),
   qx = clip(rint(fp32(x * fp32(127/amax))), -128, 127) (half to even);
   Y = sum_b fp32(sa_b * s[n, b]) * sum_{i in b} qx_i (q_i - z_b), in float64, rounded once
   (bit for bit with ORT 1.32 on AVX-512 VNNI here; docs/ort-ops.md 5.4 reports 1.31 on AVX2).
   Not modelled: 2-bit block-wise weights with block_size and K multiples of 32 and N of 128 run
   MLAS's LUT GEMM on x86 (activation partial sums in int8 lookup tables; ``moe_bounds.lut_path``
   has the rule from the source); the reference keeps
   fp32 activations there (ORT differed by up to about 1e-2 of the largest output in the
   cross-check).
4. activation, each operation rounded to fp32 in C order: relu max(0, h); gelu (tanh form)
   fp32(fp32(0.5 h) * fp32(1 + tanh(fp32(0.7978845608 * fp32(h + fp32(fp32(fp32(0.044715 h) h)
   h)))))); silu fp32(h * fp32(1 / fp32(1 + exp(-h)))); identity; swiglu, per pair
   (g, l) = (h[2i], h[2i+1]): g = min(g, limit), l = clamp(l, -limit, limit),
   a = fp32(fp32(g * fp32(1 / fp32(1 + exp(-fp32(alpha g))))) * fp32(l + beta)) (limit absent:
   no clamp). exp and tanh correctly rounded to fp32 (glibc's are within 1 ulp).
5. out[t] = sum over the token's experts of fp32(w * y): each product rounded to fp32, the sum
   in float64 rounded once (ORT adds them in fp32 in expert-workload order).
MoE (``moe``, fp32 only on the CPU): the same FFN with unquantized fp32 weights (no int8 path),
its own routing (full softmax, ``moe_routing``) and skip rule (w <= 0).

precision="float64": the accuracy reference -- the same routing selection, weights dequantized
exactly, every step in float64 (no fp32 rounding, no activation quantization), float64 output.

precision="kernel": the reference that rounds where a fused GPU kernel rounds; ``rounding``
(a dict, keys below, defaults in ``KERNEL_ROUNDING``) places the rounding points:
- "fc1_out": "fp16" or "fp32": the dtype the fc1 output h (bias added) is stored in;
- "act_out": "fp16" or "fp32": the dtype the activation output (fc2's input) is stored in;
- "int8_activations": True: the fc1 and fc2 inputs are quantized to int8 per block of
  "act_block" values with the step-3 scheme, and Y = sum_b fp32(sa_b * s) * (integer dot of the
  codes with q - z) (a dp4a kernel: integer dot, one fp32 scale multiply per block);
  False: fp32 inputs times the dequantized weights;
- "act_block": the activation block (None: block_size, or 32 for per-row weights); with
  block-wise weights it must divide block_size (each activation block inside one weight block);
  a partial last block (per-row weights) is padded with zeros;
- "weights": "fp32" or "fp16": the dequantized weight W = fp32((q - z) * s), or fp16 of it
  (used when "int8_activations" is False).
Routing, the fp32 bias additions and the output accumulation are as in "reference"; the
tie_break argument selects the kernel's tie rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qconform.errors import ArgumentError
from qconform.oracles.ort._out import check_out
from qconform.oracles.ort.matmul_nbits import quantize_activations_int8
from qconform.oracles.ort.moe_routing import SKIP_QMOE, exp_fp32, route
from qconform.oracles.ort.packing import packed_size, unpack_bits

ACTIVATIONS = ("relu", "gelu", "silu", "identity", "swiglu")
PRECISIONS = ("reference", "float64", "kernel")
BITS = (2, 4, 8)
FLOAT_TYPES = (np.dtype(np.float32), np.dtype(np.float16))
KERNEL_ROUNDING = {"fc1_out": "fp16", "act_out": "fp16", "int8_activations": True, "act_block": None, "weights": "fp32"}
_F32 = np.float32


@dataclass(frozen=True)
class FcLayout:
    """One projection of every expert: N output rows, K input features."""

    N: int
    K: int
    bits: int
    block_size: int | None

    @property
    def blocks(self) -> int:
        """Scale blocks per row as ORT indexes them (1 = per-row scales)."""
        return 1 if self.block_size is None else self.K // self.block_size

    def scale_shape(self, E: int) -> tuple[int, ...]:
        return (E, self.N) if self.block_size is None else (E, self.N, self.blocks)

    def zp_shape(self, E: int) -> tuple[int, ...]:
        if self.block_size is None:
            return (E, packed_size(self.N, self.bits))
        return (E, self.N, packed_size(self.blocks, self.bits))


@dataclass(frozen=True)
class MoELayout:
    tokens: int
    hidden: int
    inter: int
    experts: int
    fc1: FcLayout
    fc2: FcLayout
    dtype: np.dtype
    shape: tuple[int, ...]


def _array(name: str, a: object, dtypes: tuple[np.dtype, ...]) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise ArgumentError(f"{name}: must be a numpy.ndarray, got {type(a).__name__}")
    if a.dtype not in dtypes:
        raise ArgumentError(f"{name}: dtype must be {' or '.join(str(d) for d in dtypes)}, got {a.dtype}")
    return a


def _shape(name: str, a: np.ndarray, shape: tuple[int, ...], why: str = "") -> None:
    if a.shape != shape:
        raise ArgumentError(f"{name}: shape must be {shape}{why}, got {a.shape}")


def _check_attrs(k, activation_type, normalize_routing_weights, swiglu_fusion, accuracy_level, tie_break, op) -> None:
    if activation_type not in ACTIVATIONS:
        raise ArgumentError(f"activation_type: must be one of {ACTIVATIONS}, got {activation_type!r}")
    if swiglu_fusion not in (0, 1, 2):
        raise ArgumentError(f"swiglu_fusion: must be 0, 1 or 2, got {swiglu_fusion!r}")
    if activation_type == "swiglu" and swiglu_fusion != 1:
        raise ArgumentError(
            f"swiglu_fusion: ORT's CPU takes only 1 (gate and linear interleaved) with swiglu, got {swiglu_fusion!r}"
        )
    if op == "qmoe" and activation_type != "swiglu" and swiglu_fusion != 0:
        raise ArgumentError(
            f"swiglu_fusion: must be 0 with activation_type {activation_type!r} (ORT's CPU QMoE sizes fc1 as "
            f"2*inter_size rows when it is > 0 and reads past the weights), got {swiglu_fusion!r}"
        )
    if normalize_routing_weights not in (0, 1):
        raise ArgumentError(f"normalize_routing_weights: must be 0 or 1, got {normalize_routing_weights!r}")
    if accuracy_level not in (0, 1, 2, 3, 4):
        raise ArgumentError(f"accuracy_level: must be 0..4, got {accuracy_level!r}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ArgumentError(f"k: must be a positive integer, got {k!r}")
    if tie_break not in ("higher", "lower"):
        raise ArgumentError(f"tie_break: must be 'higher' or 'lower', got {tie_break!r}")


def _check_tokens(input, router_probs, router_weights, k, dtypes) -> tuple[np.ndarray, int, int]:
    x = _array("input", input, dtypes)
    if x.ndim not in (2, 3) or x.shape[-1] < 1:
        raise ArgumentError(f"input: must be 2-D (tokens, hidden) or 3-D (batch, seq, hidden), got shape {x.shape}")
    tokens = int(np.prod(x.shape[:-1]))
    r = _array("router_probs", router_probs, (x.dtype,))
    if r.ndim != 2 or r.shape[0] != tokens or r.shape[1] < 1:
        raise ArgumentError(f"router_probs: shape must be ({tokens}, num_experts), got {r.shape}")
    if k > r.shape[1]:
        raise ArgumentError(f"k: must be <= num_experts = {r.shape[1]}, got {k}")
    if router_weights is not None:
        _shape("router_weights", _array("router_weights", router_weights, (x.dtype,)), r.shape)
    return x, tokens, r.shape[1]


def _check_bias(name: str, b: object, dtype: np.dtype, shape: tuple[int, ...]) -> None:
    if b is not None:
        _shape(name, _array(name, b, (dtype,)), shape)


def _check_limits(activation_alpha, activation_beta, swiglu_limit) -> None:
    for name, v in (("activation_alpha", activation_alpha), ("activation_beta", activation_beta)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)):
            raise ArgumentError(f"{name}: must be a float, got {v!r}")
    if swiglu_limit is not None:
        if isinstance(swiglu_limit, bool) or not isinstance(swiglu_limit, (int, float, np.floating, np.integer)):
            raise ArgumentError(f"swiglu_limit: must be a float or None (no clamp), got {swiglu_limit!r}")
        if not swiglu_limit >= 0:
            raise ArgumentError(
                f"swiglu_limit: must be >= 0 or None (ORT clamps the linear half to [-limit, limit]; a negative "
                f"limit aborts onnxruntime 1.32 in std::clamp), got {swiglu_limit!r}"
            )


def check_qmoe_args(
    input: object,
    router_probs: object,
    fc1_experts_weights: object,
    fc1_scales: object,
    fc1_experts_bias: object = None,
    fc2_experts_weights: object = None,
    fc2_scales: object = None,
    fc2_experts_bias: object = None,
    fc1_zero_points: object = None,
    fc2_zero_points: object = None,
    router_weights: object = None,
    *,
    k: int,
    activation_type: str,
    normalize_routing_weights: int = 0,
    expert_weight_bits: int = 4,
    block_size: int | None = None,
    swiglu_fusion: int = 1,
    activation_alpha: float = 1.0,
    activation_beta: float = 0.0,
    swiglu_limit: float | None = None,
    accuracy_level: int = 0,
    tie_break: str = "higher",
) -> MoELayout:
    """Validate QMoE's inputs and attributes (the rules of ORT's CPU kernel); return the layout."""
    _check_attrs(k, activation_type, normalize_routing_weights, swiglu_fusion, accuracy_level, tie_break, "qmoe")
    _check_limits(activation_alpha, activation_beta, swiglu_limit)
    if isinstance(expert_weight_bits, bool) or expert_weight_bits not in BITS:
        raise ArgumentError(f"expert_weight_bits: must be one of {BITS}, got {expert_weight_bits!r}")
    bits = int(expert_weight_bits)
    x, tokens, E = _check_tokens(input, router_probs, router_weights, k, FLOAT_TYPES)
    H = x.shape[-1]
    if H * bits % 8:
        raise ArgumentError(f"input: hidden_size {H} times {bits} bits must be whole bytes (weight rows byte-aligned)")
    if fc2_experts_weights is None:
        raise ArgumentError("fc2_experts_weights: required")
    if fc1_scales is None or fc2_scales is None:
        raise ArgumentError(f"{'fc1_scales' if fc1_scales is None else 'fc2_scales'}: required for integer QMoE")
    f = 2 if activation_type == "swiglu" else 1
    w2 = _array("fc2_experts_weights", fc2_experts_weights, (np.dtype(np.uint8),))
    if w2.ndim != 3 or w2.shape[:2] != (E, H):
        raise ArgumentError(f"fc2_experts_weights: shape must be ({E}, {H}, inter_size*{bits}/8), got {w2.shape}")
    inter = w2.shape[2] * 8 // bits
    if inter < 1:
        raise ArgumentError(f"fc2_experts_weights: the last dimension must hold inter_size >= 1, got {w2.shape}")
    w1 = _array("fc1_experts_weights", fc1_experts_weights, (np.dtype(np.uint8),))
    _shape("fc1_experts_weights", w1, (E, f * inter, H * bits // 8), f" (E, {f}*inter_size, hidden_size*bits/8)")
    if block_size is not None:
        if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)):
            raise ArgumentError(f"block_size: must be an integer or None, got {block_size!r}")
        if block_size < 16 or block_size & (block_size - 1):
            raise ArgumentError(f"block_size: must be a power of two >= 16, got {block_size}")
        if H % block_size or inter % block_size:
            raise ArgumentError(
                f"block_size: must divide hidden_size {H} and inter_size {inter} (no partial blocks), got {block_size}"
            )
        block_size = int(block_size)
    fc1 = FcLayout(f * inter, H, bits, block_size)
    fc2 = FcLayout(H, inter, bits, block_size)
    for name, lay, s, z in (("fc1", fc1, fc1_scales, fc1_zero_points), ("fc2", fc2, fc2_scales, fc2_zero_points)):
        _shape(f"{name}_scales", _array(f"{name}_scales", s, (x.dtype,)), lay.scale_shape(E), " (the input's dtype)")
        if z is not None:
            _shape(f"{name}_zero_points", _array(f"{name}_zero_points", z, (np.dtype(np.uint8),)), lay.zp_shape(E))
    _check_bias("fc1_experts_bias", fc1_experts_bias, x.dtype, (E, f * inter))
    _check_bias("fc2_experts_bias", fc2_experts_bias, x.dtype, (E, H))
    return MoELayout(tokens, H, inter, E, fc1, fc2, x.dtype, x.shape)


def _zero_points(z: np.ndarray | None, lay: FcLayout, e: int) -> np.ndarray:
    """(N, blocks) int32 zero points of expert e."""
    if z is None:
        return np.full((lay.N, lay.blocks), 1 << (lay.bits - 1), np.int32)
    if lay.block_size is not None:
        return unpack_bits(z[e], lay.bits, lay.blocks).astype(np.int32)
    return unpack_bits(z[e], lay.bits, lay.N).astype(np.int32)[:, None]


def expert_codes(w: np.ndarray, z: np.ndarray | None, lay: FcLayout, e: int) -> np.ndarray:
    """q - z of expert e as int32 (N, blocks, K/blocks)."""
    q = unpack_bits(w[e], lay.bits, lay.K).astype(np.int32).reshape(lay.N, lay.blocks, -1)
    return q - _zero_points(z, lay, e)[:, :, None]


def dequantize_expert(
    w: np.ndarray, s: np.ndarray, z: np.ndarray | None, lay: FcLayout, e: int, precision: str = "reference"
) -> np.ndarray:
    """W[e] (N, K): fp32((q - z) * s) (ORT's ``DequantizeBlockWithMlas``), or float64 exactly."""
    codes = expert_codes(w, z, lay, e)
    scale = s[e].reshape(lay.N, lay.blocks, 1)
    if precision == "float64":
        return (codes * scale.astype(np.float64)).reshape(lay.N, lay.K)
    with np.errstate(over="ignore", invalid="ignore"):
        return (codes.astype(np.float32) * scale.astype(np.float32)).astype(np.float32).reshape(lay.N, lay.K)


def uses_int8_activations(lay: FcLayout, accuracy_level: int, constant_weights: bool = True) -> bool:
    """ORT CPU QMoE's MLAS QNBit path with int8 activations for one fc (module docstring, step 3)."""
    if not (constant_weights and lay.block_size is not None):
        return False
    return lay.bits == 8 or (lay.bits == 4 and accuracy_level == 4)


def _int8_product(a32: np.ndarray, codes: np.ndarray, s: np.ndarray, act_block: int) -> np.ndarray:
    """sum_b fp32(sa_b * s[n, block of b]) * (qa_b . codes_b) in float64, rounded to fp32.
    codes (N, wblocks, wbs) int32, s (N, wblocks) fp32; act_block divides wbs, or (one weight
    block) the last activation block is zero padded."""
    n, wblocks, wbs = codes.shape
    K = wblocks * wbs
    qa, sa = quantize_activations_int8(a32, act_block)  # (M, ab*nb) codes, (M, nb) scales
    nb = sa.shape[1]
    cpad = np.zeros((n, nb * act_block), np.float64)
    cpad[:, :K] = codes.reshape(n, K)
    dots = np.einsum("mbi,nbi->mnb", qa.reshape(len(qa), nb, act_block).astype(np.float64), cpad.reshape(n, nb, -1))
    wb = np.minimum(np.arange(nb) * act_block // wbs, wblocks - 1)
    scale = (sa[:, None, :] * s.astype(np.float32)[None, :, wb]).astype(np.float32).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return (scale * dots).sum(axis=2).astype(np.float32)


def _fp32_product(a32: np.ndarray, w32: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return (a32.astype(np.float64) @ w32.astype(np.float64).T).astype(np.float32)


def _add_bias(y: np.ndarray, bias: np.ndarray | None, e: int) -> np.ndarray:
    if bias is None:
        return y
    with np.errstate(over="ignore", invalid="ignore"):
        return (y + bias[e].astype(np.float32)).astype(np.float32)


def _tanh_fp32(x: np.ndarray) -> np.ndarray:
    return np.tanh(x.astype(np.float64)).astype(np.float32)


def expert_activation(
    h: np.ndarray,
    activation_type: str,
    alpha: float = 1.0,
    beta: float = 0.0,
    limit: float | None = None,
    precision: str = "reference",
) -> np.ndarray:
    """The activation of ORT's CPU MoE/QMoE (``moe_utils.cc``) on fc1's output h (M, f*I):
    fp32 step by step (module docstring, step 4), or float64 with precision="float64"."""
    if precision == "float64":
        return _activation64(h.astype(np.float64), activation_type, alpha, beta, limit)
    h = h.astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        if activation_type == "relu":
            return np.where(h > 0, h, _F32(0)).astype(np.float32)
        if activation_type == "identity":
            return h
        if activation_type == "silu":
            return (h * (_F32(1) / (_F32(1) + exp_fp32(-h))).astype(np.float32)).astype(np.float32)
        if activation_type == "gelu":
            cube = ((_F32(0.044715) * h).astype(np.float32) * h).astype(np.float32) * h
            inner = (_F32(0.7978845608) * (h + cube.astype(np.float32)).astype(np.float32)).astype(np.float32)
            half = (_F32(0.5) * h).astype(np.float32)
            return (half * (_F32(1) + _tanh_fp32(inner)).astype(np.float32)).astype(np.float32)
        g, lin = h[:, 0::2], h[:, 1::2]
        if limit is not None:
            lim = _F32(limit)
            g = np.where(lim < g, lim, g)
            lin = np.where(lin < -lim, -lim, np.where(lim < lin, lim, lin))
        arg = (_F32(alpha) * g).astype(np.float32)
        sig = (_F32(1) / (_F32(1) + exp_fp32(-arg)).astype(np.float32)).astype(np.float32)
        swish = (g * sig).astype(np.float32)
        return (swish * (lin + _F32(beta)).astype(np.float32)).astype(np.float32)


def _activation64(h: np.ndarray, activation_type: str, alpha: float, beta: float, limit: float | None) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        if activation_type == "relu":
            return np.where(h > 0, h, 0.0)
        if activation_type == "identity":
            return h
        if activation_type == "silu":
            return h / (1.0 + np.exp(-h))
        if activation_type == "gelu":
            c = float(np.float32(0.7978845608))
            return 0.5 * h * (1.0 + np.tanh(c * (h + float(np.float32(0.044715)) * h**3)))
        g, lin = h[:, 0::2], h[:, 1::2]
        if limit is not None:
            lim = float(np.float32(limit))
            g, lin = np.minimum(g, lim), np.clip(lin, -lim, lim)
        return g / (1.0 + np.exp(-float(np.float32(alpha)) * g)) * (lin + float(np.float32(beta)))


def _kernel_rounding(rounding: dict | None, precision: str, block_size: int | None) -> dict:
    if precision != "kernel":
        if rounding is not None:
            raise ArgumentError(f"rounding: only with precision='kernel', got precision={precision!r}")
        return {}
    r = dict(KERNEL_ROUNDING)
    if rounding is not None:
        if not isinstance(rounding, dict):
            raise ArgumentError(f"rounding: must be a dict with keys from {tuple(KERNEL_ROUNDING)}")
        extra = set(rounding) - set(KERNEL_ROUNDING)
        if extra:
            raise ArgumentError(f"rounding: unknown keys {sorted(extra)}; known: {tuple(KERNEL_ROUNDING)}")
        r.update(rounding)
    for key in ("fc1_out", "act_out", "weights"):
        if r[key] not in ("fp16", "fp32"):
            raise ArgumentError(f"rounding: {key!r} must be 'fp16' or 'fp32', got {r[key]!r}")
    if r["int8_activations"] not in (True, False):
        raise ArgumentError(f"rounding: 'int8_activations' must be True or False, got {r['int8_activations']!r}")
    ab = r["act_block"]
    if ab is None:
        ab = block_size if block_size is not None else 32
    if isinstance(ab, bool) or not isinstance(ab, (int, np.integer)) or ab < 1:
        raise ArgumentError(f"rounding: 'act_block' must be a positive integer or None, got {ab!r}")
    if block_size is not None and block_size % ab:
        raise ArgumentError(f"rounding: 'act_block' must divide block_size {block_size}, got {ab}")
    r["act_block"] = int(ab)
    return r


def _round_to(y: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "fp16":
        with np.errstate(over="ignore"):
            return y.astype(np.float16).astype(np.float32)
    return y


class _Fc:
    """One projection's arrays and how ``precision`` computes it for an expert."""

    def __init__(self, w, s, z, bias, lay: FcLayout, int8: bool):
        self.w, self.s, self.z, self.bias, self.lay, self.int8 = w, s, z, bias, lay, int8

    def __call__(self, a: np.ndarray, e: int, precision: str, r: dict) -> np.ndarray:
        lay = self.lay
        if precision == "float64":
            y = a @ self._weights(e, "float64").T
            return y if self.bias is None else y + self.bias[e].astype(np.float64)
        act_block = r["act_block"] if precision == "kernel" and r["int8_activations"] else None
        if precision == "reference" and self.int8:
            act_block = lay.block_size
        if act_block is not None:
            codes, scales = expert_codes(self.w, self.z, lay, e), self.s[e].reshape(lay.N, lay.blocks)
            y = _int8_product(a, codes, scales, act_block)
        else:
            w32 = self._weights(e, "reference")
            if precision == "kernel":
                w32 = _round_to(w32, r["weights"])
            y = _fp32_product(a, w32)
        return _add_bias(y, self.bias, e)

    def _weights(self, e: int, precision: str) -> np.ndarray:
        if self.s is None:  # MoE: unquantized weights
            return self.w[e].astype(np.float64 if precision == "float64" else np.float32)
        return dequantize_expert(self.w, self.s, self.z, self.lay, e, precision)


def _ffn(
    x: np.ndarray,
    idx: np.ndarray,
    w: np.ndarray,
    skip: np.ndarray,
    fc1: _Fc,
    fc2: _Fc,
    act: tuple,
    precision: str,
    r: dict,
) -> np.ndarray:
    """sum over (token, slot) of w * fc2(act(fc1(x_token))), expert by expert."""
    f64 = precision == "float64"
    xa = x.astype(np.float64 if f64 else np.float32)
    terms = np.zeros((len(x), x.shape[1]), np.float64)
    live = w > skip
    for e in np.unique(idx[live]):
        tok, slot = np.nonzero((idx == e) & live)
        h = fc1(xa[tok], int(e), precision, r)
        if precision == "kernel":
            h = _round_to(h, r["fc1_out"])
        a = expert_activation(h, *act, precision="float64" if f64 else "reference")
        if precision == "kernel":
            a = _round_to(a, r["act_out"])
        y = fc2(a, int(e), precision, r)
        wt = w[tok, slot][:, None]
        with np.errstate(over="ignore", invalid="ignore"):
            contrib = wt * y if f64 else (wt.astype(np.float32) * y).astype(np.float32)
        np.add.at(terms, tok, contrib.astype(np.float64))
    return terms


def _finish(terms: np.ndarray, lay_shape: tuple[int, ...], dtype: np.dtype, precision: str) -> np.ndarray:
    if precision == "float64":
        return terms.reshape(lay_shape)
    with np.errstate(over="ignore"):
        return terms.astype(np.float32).astype(dtype).reshape(lay_shape)


def qmoe(
    input: np.ndarray,
    router_probs: np.ndarray,
    fc1_experts_weights: np.ndarray,
    fc1_scales: np.ndarray,
    fc1_experts_bias: np.ndarray | None = None,
    fc2_experts_weights: np.ndarray | None = None,
    fc2_scales: np.ndarray | None = None,
    fc2_experts_bias: np.ndarray | None = None,
    fc1_zero_points: np.ndarray | None = None,
    fc2_zero_points: np.ndarray | None = None,
    router_weights: np.ndarray | None = None,
    *,
    k: int,
    activation_type: str,
    normalize_routing_weights: int = 0,
    expert_weight_bits: int = 4,
    block_size: int | None = None,
    swiglu_fusion: int = 1,
    activation_alpha: float = 1.0,
    activation_beta: float = 0.0,
    swiglu_limit: float | None = None,
    accuracy_level: int = 0,
    tie_break: str = "higher",
    precision: str = "reference",
    rounding: dict | None = None,
    constant_weights: bool = True,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """com.microsoft.QMoE's output (the input's shape and dtype; float64 with precision="float64").
    Arguments and attributes as the ONNX op names them (see the module docstring for the layout and
    each precision's roundings). ``tie_break``: the routing's rule for equal logits ("higher": ORT
    CPU). ``constant_weights``: weights, scales and zero points are initializers, which ORT's int8
    activation path needs (graph inputs keep it on fp32 activations). ``out``: a buffer for the
    output (checked before any work), filled and returned."""
    lay = check_qmoe_args(
        input,
        router_probs,
        fc1_experts_weights,
        fc1_scales,
        fc1_experts_bias,
        fc2_experts_weights,
        fc2_scales,
        fc2_experts_bias,
        fc1_zero_points,
        fc2_zero_points,
        router_weights,
        k=k,
        activation_type=activation_type,
        normalize_routing_weights=normalize_routing_weights,
        expert_weight_bits=expert_weight_bits,
        block_size=block_size,
        swiglu_fusion=swiglu_fusion,
        activation_alpha=activation_alpha,
        activation_beta=activation_beta,
        swiglu_limit=swiglu_limit,
        accuracy_level=accuracy_level,
        tie_break=tie_break,
    )
    if precision not in PRECISIONS:
        raise ArgumentError(f"precision: must be one of {PRECISIONS}, got {precision!r}")
    if constant_weights not in (True, False):
        raise ArgumentError(f"constant_weights: must be True or False, got {constant_weights!r}")
    r = _kernel_rounding(rounding, precision, lay.fc1.block_size)
    arrays = (input, router_probs, fc1_experts_weights, fc1_scales, fc1_experts_bias, fc2_experts_weights)
    arrays += (fc2_scales, fc2_experts_bias, fc1_zero_points, fc2_zero_points, router_weights)
    check_out(out, lay.shape, np.dtype(np.float64) if precision == "float64" else lay.dtype, *arrays)
    idx, w = route(
        router_probs,
        int(k),
        tie_break,
        op="qmoe",
        normalize_routing_weights=normalize_routing_weights,
        router_weights=router_weights,
        precision="float64" if precision == "float64" else "reference",
    )
    fc1 = _Fc(
        fc1_experts_weights,
        fc1_scales,
        fc1_zero_points,
        fc1_experts_bias,
        lay.fc1,
        uses_int8_activations(lay.fc1, accuracy_level, constant_weights),
    )
    fc2 = _Fc(
        fc2_experts_weights,
        fc2_scales,
        fc2_zero_points,
        fc2_experts_bias,
        lay.fc2,
        uses_int8_activations(lay.fc2, accuracy_level, constant_weights),
    )
    act = (activation_type, activation_alpha, activation_beta, swiglu_limit)
    x = input.reshape(lay.tokens, lay.hidden)
    terms = _ffn(x, idx, w, SKIP_QMOE, fc1, fc2, act, precision, r)
    y = _finish(terms, lay.shape, lay.dtype, precision)
    if out is None:
        return y
    out[...] = y
    return out


def check_moe_args(
    input: object,
    router_probs: object,
    fc1_experts_weights: object,
    fc1_experts_bias: object,
    fc2_experts_weights: object,
    fc2_experts_bias: object,
    *,
    k: int,
    activation_type: str,
    normalize_routing_weights: int,
    swiglu_fusion: int,
    activation_alpha: float,
    activation_beta: float,
    swiglu_limit: float | None,
    tie_break: str,
) -> MoELayout:
    """Validate MoE's inputs and attributes (ORT's CPU kernel: fp32 only); return the layout."""
    _check_attrs(k, activation_type, normalize_routing_weights, swiglu_fusion, 0, tie_break, "moe")
    _check_limits(activation_alpha, activation_beta, swiglu_limit)
    x, tokens, E = _check_tokens(input, router_probs, None, k, (np.dtype(np.float32),))
    H = x.shape[-1]
    if fc2_experts_weights is None:
        raise ArgumentError("fc2_experts_weights: required")
    f = 2 if activation_type == "swiglu" else 1
    w2 = _array("fc2_experts_weights", fc2_experts_weights, (x.dtype,))
    if w2.ndim != 3 or w2.shape[:2] != (E, H) or w2.shape[2] < 1:
        raise ArgumentError(f"fc2_experts_weights: shape must be ({E}, {H}, inter_size), got {w2.shape}")
    inter = w2.shape[2]
    _shape("fc1_experts_weights", _array("fc1_experts_weights", fc1_experts_weights, (x.dtype,)), (E, f * inter, H))
    _check_bias("fc1_experts_bias", fc1_experts_bias, x.dtype, (E, f * inter))
    _check_bias("fc2_experts_bias", fc2_experts_bias, x.dtype, (E, H))
    fc1, fc2 = FcLayout(f * inter, H, 32, None), FcLayout(H, inter, 32, None)  # unquantized: 32-bit fp32 weights
    return MoELayout(tokens, H, inter, E, fc1, fc2, x.dtype, x.shape)


def moe(
    input: np.ndarray,
    router_probs: np.ndarray,
    fc1_experts_weights: np.ndarray,
    fc1_experts_bias: np.ndarray | None = None,
    fc2_experts_weights: np.ndarray | None = None,
    fc2_experts_bias: np.ndarray | None = None,
    *,
    k: int,
    activation_type: str,
    normalize_routing_weights: int = 0,
    swiglu_fusion: int = 1,
    activation_alpha: float = 1.0,
    activation_beta: float = 0.0,
    swiglu_limit: float | None = None,
    tie_break: str = "higher",
    precision: str = "reference",
) -> np.ndarray:
    """com.microsoft.MoE's output with unquantized fp32 weights (E, f*I, H) and (E, H, I): the QMoE
    FFN with MoE's routing -- the full softmax, renormalized over the top k only when
    normalize_routing_weights=1 (``moe_routing``). precision "reference" or "float64"."""
    lay = check_moe_args(
        input,
        router_probs,
        fc1_experts_weights,
        fc1_experts_bias,
        fc2_experts_weights,
        fc2_experts_bias,
        k=k,
        activation_type=activation_type,
        normalize_routing_weights=normalize_routing_weights,
        swiglu_fusion=swiglu_fusion,
        activation_alpha=activation_alpha,
        activation_beta=activation_beta,
        swiglu_limit=swiglu_limit,
        tie_break=tie_break,
    )
    if precision not in ("reference", "float64"):
        raise ArgumentError(f"precision: must be 'reference' or 'float64' for MoE, got {precision!r}")
    idx, w = route(
        router_probs,
        int(k),
        tie_break,
        op="moe",
        normalize_routing_weights=normalize_routing_weights,
        precision=precision,
    )
    fc1 = _Fc(fc1_experts_weights, None, None, fc1_experts_bias, lay.fc1, False)
    fc2 = _Fc(fc2_experts_weights, None, None, fc2_experts_bias, lay.fc2, False)
    act = (activation_type, activation_alpha, activation_beta, swiglu_limit)
    terms = _ffn(input.reshape(lay.tokens, lay.hidden), idx, w, np.float32(0), fc1, fc2, act, precision, {})
    return _finish(terms, lay.shape, lay.dtype, precision)

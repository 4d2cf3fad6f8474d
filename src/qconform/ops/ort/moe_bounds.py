"""Per-element error bounds of QMoE / MoE outputs against ``qconform.oracles.ort.qmoe`` (reference precision).

Used by the catalogue (``qconform.ops.ort.qmoe``: an implementation under its numeric contract),
tests/test_upstream_ort_qmoe.py (onnxruntime's CPU against the oracle) and tests/test_qmoe_oracle.py
(the oracle's reference precision against its float64 twin). The bound is computed per output
element by running the FFN once more in float64 and propagating, stage by stage, how far the other
side (``Other``: ORT, the float64 twin, or an implementation under a contract) may be from the
oracle. u = 2**-24 (unit roundoff of fp32), gamma(n) = n u / (1 - n u).

Derivation (``vs="ort"``; ``vs="float64"`` drops ORT's own terms, see each step; ``kernel_side``
widens them as a contract allows, see the end):

1. Routing weights. Selection is on the fp32 logits, identical on both sides (checked exactly
   elsewhere). ORT's weights use glibc's expf (within 1 ulp = 2u relative of exp; the oracle's is
   correctly rounded, 0.5 ulp), then the same fp32 sum / inverse / product. Each e_j differs by
   <= 3u relative, the sum by <= 3u + 2 gamma(n) relative (n terms: k for QMoE, E for MoE's full
   softmax), the inverse and product add 2u: |dw| <= (8 + 2 n) u |w|, plus 1e-45 absolute for
   subnormal weights. Against float64 the oracle's own roundings alone: (4 + 2 n) u |w|.
2. A projection y = x W^T + b (W the dequantized weight, identical bits on both sides, exact in
   float64), with x on the other side off by dx:
   - fp32 activations: ORT sums the K products and the bias in fp32 in any order (FMA or not):
     |y_ort - exact| <= gamma(K + 1) M with M = |x| |W|^T + |b|; the oracle rounds the exact dot
     once and adds the bias in fp32: <= gamma(2) M. So dy <= |W| dx + gamma(K + 3) (M + |W| dx).
     Against float64: gamma(2) (M + |W| dx) + |W| dx.
   - int8 activations (ORT's CompInt8, step 3 of the oracle): per K-block b, amax_b, sa_b =
     fp32(amax_b / 127), codes q_i = rint(fp32(x_i fp32(127 / amax_b))). With dx = 0 (fc1 of the
     graph input) both sides have the same codes, and only the order of the fp32 sum of the block
     terms fp32(sa_b s) * dot_b and the bias differ: gamma(blocks + 3) (sum_b |fp32(sa_b s) dot_b| +
     |b|). With dx > 0 a code may step: amax moves by at most max_b dx, so the scaled value
     c_i = x_i 127 / amax moves by r_i = (dx_i + |x_i| dmax / amax) 127 / amax + 4 ulp(c_i)
     (the fp32 inverse and product on both sides); the code moves by at most the number of
     half-integers in [c_i - r_i, c_i + r_i]. A moved sa adds dmax / 127 + 2u sa per block. So
     dy <= sum_b [|fp32(sa_b s)| sum_i steps_i |q_i - z| + (dmax_b / 127 + 2u sa_b) |s| sum_i
     (|code_i| + steps_i) |q_i - z|] + gamma(blocks + 3) (block magnitudes + |b|).
     Against float64 (which has no activation quantization): |x_i - sa_b code_i| <= sa_b (1/2 +
     |c_i| 4u) per element, so dy <= sum_b sa_b (1/2 + 128 * 4u) sum_i |w_i| + |W| dx +
     gamma(2) (block magnitudes + |b|).
   - 2-bit LUT (MLAS's T-MAC kernel, ORT x86 with 2-bit block-wise weights, block_size >= 32 and
     K / block_size >= 2): each group of 4 activations is looked up in a table of its 16 signed
     sums, quantized to int8 with step lut_s = max_group (sum of 4 |x|) / 127 (rounding error
     <= lut_s / 2 per lookup); a 2-bit code is read as two bit planes weighted 1/2 and 1, so each
     group contributes <= (1/2 + 1) lut_s / 2 |s| of error: dy_lut <= 0.75 lut_s (block_size / 4)
     sum_b |s_b| on top of the fp32 terms (lut_s taken as the row's largest group: an upper bound
     of the kernel's per-group-of-groups step). The kernel's halving adders are not modelled;
     the cross-check used at most 3 % of this bound (onnxruntime 1.32).
3. Activation, from dh (each side evaluates its own fp32 formula; eps = both sides' rounding):
   relu, identity: da = dh. silu: |d/dh h sigma(h)| <= 1.1, so da <= 1.1 dh + 12u |a|.
   gelu (tanh form): slope <= 1.2, the tanh argument carries <= 4u (|h| + 0.045 |h|^3) absolute,
   so da <= 1.2 dh + |h| (4u (|h| + 0.045 |h|^3) + 6u) + 2u |a|.
   swiglu: the clamps are 1-Lipschitz; with S(g) = g sigma(alpha g), |S'| <= 1.1 for every alpha:
   da <= 1.1 dg (|l + beta| + dl) + |S(g)| dl + 2 (|alpha g| + 7) u |a| (the fp32 product alpha g
   moves exp's argument by |alpha g| u; expf, 1 + e, 1 / ., g * sigma, l + beta, the product: 7u).
   Against float64 the eps terms are halved (the oracle's side only).
4. Output: out = sum_j fl(w_j y_j); ORT adds the k products in fp32 in expert order, the oracle
   in float64 then rounds once: dout <= sum_j (|w_j| dy_j + dw_j (|y_j| + dy_j)) +
   gamma(k + 3) sum_j |w_j y_j| (against float64: the products' and the final rounding,
   gamma(2) sum_j |w_j y_j|).
5. fp16 output: both round their fp32 value once; rounding is monotonic, so the fp16 results differ
   by at most dout plus one fp16 spacing at the larger magnitude.

An implementation under a numeric contract (``kernel_side``): its sums of n terms (a projection's
K products and bias, the int8 path's block terms, the k weighted expert outputs) within
``accumulation_error(n + 1)`` of the contract (fp32 in any order by default) plus the oracle's
gamma(2); exp within 4 ulp (a fast-math expf: step 1 with 9u per e_j, 20 + 2 n in all; the
activation's eps terms doubled); its int8 activation codes from any round-to-nearest of the same
fp32 scale (each code within 4 ulp of a rounding boundary may step, also on fc1's input); and
with ``storage`` fp16 / bf16 (unit roundoff u_s) the dequantized weights, each fc's input and
fc1's output held in that type: the input off by u_s (|x| + dx), the products by u_s |x'| |W|,
h by u_s (|h| + dh), all propagated as above.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from qconform.contracts import UNIT_ROUNDOFF, Contract, accumulation_error
from qconform.oracles.ort.matmul_nbits import quantize_activations_int8
from qconform.oracles.ort.moe_routing import SKIP_QMOE, route
from qconform.oracles.ort.qmoe import (
    FcLayout,
    check_moe_args,
    check_qmoe_args,
    dequantize_expert,
    expert_activation,
    expert_codes,
    uses_int8_activations,
)

U = 2.0**-24


def gamma(n: int) -> float:
    return n * U / (1 - n * U)


@dataclass(frozen=True)
class Other:
    """The side compared with the oracle's reference precision (module docstring).

    ``exact``: it rounds nothing (the float64 twin: no activation quantization either);
    ``acc(n)``: how far its fp32 sum of n terms and a bias may be from the oracle's, relative to
    the sum of |terms|; ``routing_u``: step 1's constant (n u is added); ``act_eps``: the factor of
    step 3's eps terms; ``store``: the unit roundoff of the type it holds weights, fc inputs and
    fc1's output in (0: as the reference); ``lut``: ORT's 2-bit LUT GEMM; ``code_ulp``: its int8
    codes may step within this many ulp of a rounding boundary even where its input equals the
    oracle's (0: ORT's exact scheme)."""

    exact: bool
    acc: Callable[[int], float]
    routing_u: float
    act_eps: float
    store: float = 0.0
    lut: bool = False
    code_ulp: float = 0.0


ORT = Other(False, lambda n: gamma(n + 3), 8.0, 1.0, lut=True)
FLOAT64 = Other(True, lambda n: gamma(2), 4.0, 0.5)
SIDES = {"ort": ORT, "float64": FLOAT64}


def kernel_side(contract: Contract, chain: int) -> Other:
    """An implementation under ``contract`` (module docstring): sums per ``accumulation_error``
    (fp16/bf16 chains of ``chain`` terms), exp within 4 ulp, any round-to-nearest int8 codes, and
    the declared storage type."""
    store = 0.0 if contract.storage == "exact" else UNIT_ROUNDOFF[contract.storage]
    return Other(False, lambda n: accumulation_error(n + 1, chain, contract) + gamma(2), 20.0, 2.0, store, False, 4.0)


def lut_path(lay: FcLayout) -> bool:
    """Whether ORT 1.32 runs the projection on MLAS's 2-bit LUT GEMM (on a CPU that has the kernel:
    x86 AVX2, ARM NEON): microsoft/onnxruntime contrib_ops/cpu/moe/moe_quantization_cpu.cc
    ``CanUseMlasLutGemm`` (2-bit block-wise, K a multiple of the block) and mlas ``MlasIsLutGemmAvailable``
    (block_size and K multiples of 32, N of 128). One block per row included: it is the block size and
    N, not the block count, that decide."""
    bs = lay.block_size
    if lay.bits != 2 or bs is None or bs % 32:
        return False
    return lay.K % bs == 0 and lay.K % 32 == 0 and lay.N % 128 == 0


class _Proj:
    def __init__(self, w, s, z, bias, lay: FcLayout, path: str):
        self.w, self.s, self.z, self.bias, self.lay, self.path = w, s, z, bias, lay, path

    def weights(self, e: int) -> np.ndarray:
        if self.s is None:
            return self.w[e].astype(np.float64)
        return dequantize_expert(self.w, self.s, self.z, self.lay, e, "float64")

    def bias64(self, e: int, n: int) -> np.ndarray:
        return np.zeros(n) if self.bias is None else self.bias[e].astype(np.float32).astype(np.float64)

    def __call__(self, x32: np.ndarray, dx: np.ndarray, e: int, other: Other) -> tuple[np.ndarray, np.ndarray]:
        """(y as the oracle computes it, float64; the bound on the other side's distance)."""
        W = self.weights(e)
        aW = np.abs(W)
        b = self.bias64(e, W.shape[0])
        x = x32.astype(np.float64)
        if self.path == "int8":
            y, dy = self._int8(x32, dx, e, b, other)
            return y, dy + (dx @ aW.T if other.exact else 0.0)
        dx = dx + other.store * (np.abs(x) + dx)  # the input held in the storage type
        M = np.abs(x) @ aW.T + np.abs(b)
        prop = dx @ aW.T + other.store * ((np.abs(x) + dx) @ aW.T)  # ... and the weights
        y = (x @ W.T).astype(np.float32)
        y = (y + b.astype(np.float32)).astype(np.float32).astype(np.float64)
        dy = prop + other.acc(W.shape[1]) * (M + prop)
        if self.path == "lut" and other.lut:
            lay = self.lay
            groups = np.abs(x32.astype(np.float64)).reshape(len(x), -1, 4).sum(axis=2)
            lut_s = (groups + dx.reshape(len(x), -1, 4).sum(axis=2)).max(axis=1, keepdims=True) / 127
            s_abs = np.abs(self.s[e].astype(np.float64)).reshape(lay.N, lay.blocks).sum(axis=1)
            dy = dy + 0.75 * lut_s * (lay.block_size / 4) * s_abs[None, :]
        return y, dy

    def _int8(self, x32, dx, e, b, other: Other):
        lay = self.lay
        bs = lay.block_size
        codes_w = expert_codes(self.w, self.z, lay, e).astype(np.float64)  # (N, blocks, bs)
        s = self.s[e].astype(np.float32).reshape(lay.N, lay.blocks)
        qa, sa = quantize_activations_int8(x32.astype(np.float32), bs)
        m = len(x32)
        qa3 = qa.reshape(m, lay.blocks, bs).astype(np.float64)
        scale = (sa[:, None, :] * s[None]).astype(np.float32).astype(np.float64)  # (m, N, blocks)
        dots = np.einsum("mbi,nbi->mnb", qa3, codes_w)
        y = (scale * dots).sum(axis=2).astype(np.float32)
        y = (y + b.astype(np.float32)).astype(np.float32).astype(np.float64)
        mag = (np.abs(scale) * np.einsum("mbi,nbi->mnb", np.abs(qa3), np.abs(codes_w))).sum(axis=2) + np.abs(b)
        dy = other.acc(lay.blocks) * mag
        x3 = x32.astype(np.float64).reshape(m, lay.blocks, bs)
        amax = np.abs(x3).max(axis=2)
        s64 = np.abs(s.astype(np.float64))
        if other.exact:
            wsum = np.einsum("nbi->nb", np.abs(codes_w)) * s64  # sum_i |w_i| per block
            return y, dy + np.einsum("mb,nb->mn", sa.astype(np.float64) * (0.5 + 128 * 4 * U), wsum)
        d3 = dx.reshape(m, lay.blocks, bs)
        dmax = d3.max(axis=2)
        if not dmax.any() and not other.code_ulp:
            return y, dy
        ulps = max(4.0, other.code_ulp)
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = np.where(amax > 0, 127 / amax, 0.0)
            c = x3 * inv[:, :, None]
            r = (d3 + np.abs(x3) * (dmax / np.where(amax > 0, amax, 1))[:, :, None]) * inv[:, :, None]
            r = r + ulps * np.spacing(np.abs(c).astype(np.float32)).astype(np.float64)
            r = np.where(amax[:, :, None] > 0, r, d3 * 127 / np.maximum(dmax, 1e-300)[:, :, None])
        steps = np.maximum(np.floor(c + r - 0.5) - np.ceil(c - r - 0.5) + 1, 0)
        flip = np.einsum("mnb,mbi,nbi->mn", np.abs(scale), steps, np.abs(codes_w))
        sa_move = (dmax / 127 + 2 * U * sa)[:, None, :] * s64[None]
        moved = (sa_move * np.einsum("mbi,nbi->mnb", np.abs(qa3) + steps, np.abs(codes_w))).sum(axis=2)
        return y, dy + flip + moved


def _activation_bound(h: np.ndarray, dh: np.ndarray, act: tuple, other: Other) -> np.ndarray:
    kind, alpha, beta, limit = act
    half = other.act_eps
    a = expert_activation(h.astype(np.float32), *act).astype(np.float64)
    if kind in ("relu", "identity"):
        return dh
    if kind == "silu":
        return 1.1 * dh + half * 12 * U * np.abs(a)
    if kind == "gelu":
        ah = np.abs(h)
        return 1.2 * dh + half * (ah * (4 * U * (ah + 0.045 * ah**3) + 6 * U) + 2 * U * np.abs(a))
    g, lin, dg, dl = h[:, 0::2], h[:, 1::2], dh[:, 0::2], dh[:, 1::2]
    if limit is not None:
        g, lin = np.minimum(g, limit), np.clip(lin, -limit, limit)
    alpha, beta = float(np.float32(alpha)), float(np.float32(beta))
    sg = g / (1 + np.exp(-alpha * g))
    return 1.1 * dg * (np.abs(lin + beta) + dl) + np.abs(sg) * dl + half * 2 * (np.abs(alpha * g) + 7) * U * np.abs(a)


def _ffn_bound(x, idx, w, dw, skip, fc1: _Proj, fc2: _Proj, act, other: Other) -> tuple[np.ndarray, np.ndarray]:
    """(sum_j |w_j y_j|, bound on |other - oracle|) per output element, before the dtype rounding."""
    T, H = x.shape
    mag = np.zeros((T, H))
    bound = np.zeros((T, H))
    live = w > skip
    for e in np.unique(idx[live]):
        tok, slot = np.nonzero((idx == e) & live)
        xe = x[tok].astype(np.float32)
        h, dh = fc1(xe, np.zeros(xe.shape), int(e), other)
        dh = dh + other.store * (np.abs(h) + dh)  # fc1's output held in the storage type
        a = expert_activation(h.astype(np.float32), *act)
        da = _activation_bound(h, dh, act, other)
        y, dy = fc2(a, da, int(e), other)
        wt = np.abs(w[tok, slot].astype(np.float64))[:, None]
        dwt = dw[tok, slot][:, None]
        np.add.at(mag, tok, wt * np.abs(y))
        np.add.at(bound, tok, wt * dy + dwt * (np.abs(y) + dy))
    return mag, bound


def _side(vs: str | Other) -> Other:
    return vs if isinstance(vs, Other) else SIDES[vs]


def qmoe_bound(arrays: dict, attrs: dict, vs: str | Other = "ort", constant_weights: bool = True) -> np.ndarray:
    """Per-element bound (input's shape, float64) on |other - oracle| for ``qmoe(**arrays, **attrs)``
    before the output's fp16 rounding; ``vs`` "ort", "float64" or an ``Other`` (``kernel_side``)."""
    other = _side(vs)
    lay = check_qmoe_args(**arrays, **{k: v for k, v in attrs.items() if k not in ("precision", "rounding")})
    k = attrs["k"]
    idx, w = route(
        arrays["router_probs"],
        k,
        attrs.get("tie_break", "higher"),
        op="qmoe",
        normalize_routing_weights=attrs.get("normalize_routing_weights", 0),
        router_weights=arrays.get("router_weights"),
    )
    w64 = w.astype(np.float64)
    plain = arrays.get("router_weights") is not None and not attrs.get("normalize_routing_weights", 0)
    dw = np.zeros_like(w64) if plain else (other.routing_u + 2 * k) * U * np.abs(w64) + 1e-45
    acc = attrs.get("accuracy_level", 0)

    def proj(name: str, fl: FcLayout) -> _Proj:
        if uses_int8_activations(fl, acc, constant_weights):
            path = "int8"
        elif lut_path(fl) and other.lut:
            path = "lut"
        else:
            path = "fp32"
        return _Proj(
            arrays[f"{name}_experts_weights"],
            arrays[f"{name}_scales"],
            arrays.get(f"{name}_zero_points"),
            arrays.get(f"{name}_experts_bias"),
            fl,
            path,
        )

    act = (
        attrs["activation_type"],
        attrs.get("activation_alpha", 1.0),
        attrs.get("activation_beta", 0.0),
        attrs.get("swiglu_limit"),
    )
    x = arrays["input"].reshape(lay.tokens, lay.hidden).astype(np.float32)
    mag, bound = _ffn_bound(x, idx, w, dw, SKIP_QMOE, proj("fc1", lay.fc1), proj("fc2", lay.fc2), act, other)
    bound = bound + other.acc(k) * (mag + bound)
    return bound.reshape(lay.shape)


def moe_bound(arrays: dict, attrs: dict, vs: str | Other = "ort") -> np.ndarray:
    """``qmoe_bound`` for ``moe(**arrays, **attrs)`` (fp32 weights, MoE routing over E experts)."""
    other = _side(vs)
    defaults = {"normalize_routing_weights": 0, "swiglu_fusion": 1, "activation_alpha": 1.0, "activation_beta": 0.0}
    defaults.update(swiglu_limit=None, tie_break="higher")
    kw = {name: attrs.get(name, d) for name, d in defaults.items()}
    lay = check_moe_args(
        arrays["input"],
        arrays["router_probs"],
        arrays["fc1_experts_weights"],
        arrays.get("fc1_experts_bias"),
        arrays["fc2_experts_weights"],
        arrays.get("fc2_experts_bias"),
        k=attrs["k"],
        activation_type=attrs["activation_type"],
        **kw,
    )
    k = attrs["k"]
    idx, w = route(
        arrays["router_probs"], k, kw["tie_break"], op="moe", normalize_routing_weights=kw["normalize_routing_weights"]
    )
    w64 = w.astype(np.float64)
    dw = (other.routing_u + 2 * (lay.experts + k)) * U * np.abs(w64) + 1e-45
    fc1 = _Proj(arrays["fc1_experts_weights"], None, None, arrays.get("fc1_experts_bias"), lay.fc1, "fp32")
    fc2 = _Proj(arrays["fc2_experts_weights"], None, None, arrays.get("fc2_experts_bias"), lay.fc2, "fp32")
    act = (attrs["activation_type"], kw["activation_alpha"], kw["activation_beta"], kw["swiglu_limit"])
    x = arrays["input"].reshape(lay.tokens, lay.hidden).astype(np.float32)
    mag, bound = _ffn_bound(x, idx, w, dw, np.float32(0), fc1, fc2, act, other)
    bound = bound + other.acc(k) * (mag + bound)
    return bound.reshape(lay.shape)

"""Launchers of qmoe_decode and qmoe_ragged_mm (kernels ``ort/qmoe.hip``): com.microsoft.QMoE with
the oracle's call shape on CuPy arrays (``qconform.oracles.ort.qmoe``, ONNX Runtime's CPU semantics).

The decode path (the default): two kernels on the current stream where the fc inputs stay fp32.
``qk_moe_fc1v``: every CTA stages its token's input as fp32 in shared memory and routes the token
itself (top-k of the fp32 logits, ties to the higher expert index; QMoE's softmax over the k
selected logits, or router_weights renormalized only when normalize_routing_weights is 1: the
routing kernel's results bit for bit), so nothing waits between routing and fc1 and nothing is read
back to the host; CTA x 0 of each token stores the experts and weights for fc2. Its lane groups then
take tasks of 4 weight rows (1..32 lanes, 16-byte loads, a 4-bit chunk's loads one chunk ahead) over
all k slots, the grid sized to whole rounds of the resident CTAs (``qmoe_tiling.fc1_ctas``); fc1 +
the activation go into an fp32 scratch, chunk-transposed for fc2's chunks (coalesced reads). An fp16
input with 4-bit weights takes ``qk_moe_fc1m`` instead (``_fc1_on_mma``; ``-DQK_MOE_FC1_SIMT`` keeps
``qk_moe_fc1v``): the same routing and staging, then fc1 on the matrix units, a task of 16 weight rows
of a slot whose K is split over 1, 2, 4 or 8 warps (``qmoe_tiling.mma_parts``, a function of the shape;
the parts' sums added in part order), (q - z) exact in fp16 and each 32-value segment's fp32 sum times
its scale (no weight rounded), ``qmoe_tiling.mma_ctas`` CTAs; ``qk_moe_fc1m_z`` where fc1 has packed
zero points.
``qk_moe_fc2v``: a tile of output columns for all k slots per CTA, the slots' fp32(w * (dot + bias))
added in selection order in shared memory (no atomics: repeat calls are bit-identical). Where fc1 runs
on ``qk_moe_fc1m`` and fc2's K is a multiple of 32 with no int8 activations, fc2 takes ``qk_moe_fc2m``
instead (``_fc2_on_mma``; ``-DQK_MOE_FC2_SIMT`` keeps ``qk_moe_fc2v``): fc1m stores its fp32 output as
three bf16 planes (a = b1 + b2 + b3, exact), a CTA stages its token's k rows of them in shared memory
(``qmoe_tiling.fc2m_staged_bytes``, at most FC2M_SMEM) and takes 16 output columns over all k slots on
the matrix units ((q - z) exact in bf16, so every product is exact in fp32), each slot's K split over
``qmoe_tiling.fc2m_parts`` warps and added in part order, then the slots' fp32(w * (dot + bias)) in
selection order as in ``qk_moe_fc2v``. With
``-DQK_MOE_DECODE_V1`` in the build options: the session-8 decode kernels (input and scratch read
from global memory in lane order, one task per lane group; the same sums in the same order, so the
same bits). With ``-DQK_MOE_LEGACY`` (``compile_options``; the bench's ``--variants``), or past the
decode path's limits (E > 512, k > 32, T * k > 65535; by default also hidden size > 8192): the legacy kernels,
routing, fc1, fc2. Weights dequantized exactly as the oracle (``qk_moe_fc1m``: never rounded), fp32
dot products, fp32 intermediates: checked under the strict contract. Where ORT's CPU quantizes an fc's
input to int8 (block-wise weights: 8-bit, or 4-bit at accuracy_level 4; ``uses_int8_activations``),
that fc's input is quantized as ORT does (``qk_moe_quantize``, one more launch each) and the fc
takes a dp4a product (the contract's "int8 activations (ORT CPU)" reading). Each token is computed
on its own (the ragged op too: correct, not a grouped GEMM). The tiling is a function of the shape
(``qconform.device.qmoe_tiling``; legacy: ``tiling``, ``tiling_int8``), never sampled on a call.

``qmoe_ragged_mm`` under the contract storage=fp16 (``storage="fp16"``, passed by the ``cupy``
implementation from its contract; not with ``-DQK_MOE_RAGGED_V1`` or ``-DQK_MOE_LEGACY``): grouped
GEMMs (``_grouped``): the routing kernel, the live (token, slot) pairs grouped per expert in pair
order (``qk_moe_gcount``, ``qk_moe_gscatter``), fc1 + bias + the activation and fc2 + bias on the
matrix units over tiles of 64 pairs of one expert x 64 weight rows (``qk_moe_gemm1_u<bits>``,
``qk_moe_gemm2_u<bits>``: fp16 inputs, (q - z) exact in fp16, each quantization block's fp32 sum
times its scale), fc1's output held in fp16, then each token's k slots added in selection order
(``qk_moe_combine``). The fp32-activation reading only (the contract's level4 "either" accepts it).
``-DQK_MOE_GEMM_V1`` builds session 10 round 1's tile loop (``qmoe_gemm_v1.h``: the same output
bits, more instructions), timed beside the default by ``python -m qconform.bench.qmoe --prefill
--variants grouped,grouped_v1``.

Declined: block sizes that are not a multiple of 32, rows whose K * bits is not a multiple of 32
(the kernels read rows as 32-bit words), misaligned arrays, and everything the op's ABI declines
(precision / rounding other than the reference, tie_break "lower")."""

from __future__ import annotations

from typing import Any

import cupy
import numpy as np

from qconform.device import launchers
from qconform.device.abi import bind_call
from qconform.device.launchers import kernel_of, launch, launch_grid
from qconform.device.qmoe_tiling import (
    EMAX,
    GRID_Y,
    KMAX,
    ROWS,
    XMAX,
    chunk_words,
    fc1_ctas,
    fc2_tile,
    fc2m_parts,
    fc2m_staged_bytes,
    lanes_over,
    mma_ctas,
    mma_parts,
    mma_staged_bytes,
    staged_bytes,
)
from qconform.errors import Declined
from qconform.ops import OpSpec
from qconform.ops.ort.qmoe import ACTIVATION, QMOE_DECODE, QMOE_RAGGED_MM
from qconform.oracles.ort.qmoe import FcLayout, uses_int8_activations

SOURCE = "ort/qmoe.hip"
THREADS = 256
SWIGLU = ACTIVATION["swiglu"]
LEGACY = "-DQK_MOE_LEGACY"  # build option: the routing / fc1 / fc2 kernels before the decode path
DECODE_V1 = "-DQK_MOE_DECODE_V1"  # build option: the session-8 decode kernels (input and A read from global)
FC1_SIMT = "-DQK_MOE_FC1_SIMT"  # build option: fc1 of an fp16 input on qk_moe_fc1v, not the matrix units
FC2_SIMT = "-DQK_MOE_FC2_SIMT"  # build option: fc2 of an fp16 input's layer on qk_moe_fc2v, not the matrix units
FC2M_SMEM = 96 * 1024  # the most dynamic shared memory qk_moe_fc2m takes (2 CTAs per SM on an H200)
RAGGED_V1 = "-DQK_MOE_RAGGED_V1"  # build option: qmoe_ragged_mm per token under storage=fp16 too (session 9)
GROUP_M, GROUP_N, GROUP_K, GROUP_THREADS = 64, 64, 64, 128  # QK_MOE_GM, QK_MOE_GN, QK_MOE_GK, QK_MOE_GT


def tiling(K: int, bits: int) -> tuple[int, int]:
    """(lanes per output, 32-bit words per lane and step) for rows of K ``bits``-bit values: the
    largest step of 4, 2, 1 dividing the row's words that leaves each lane >= 8 steps' worth, then
    as many lanes (a power of two, at most 32) as there are such steps. A function of the shape
    alone, so every call of a shape reduces in one order."""
    words = K * bits // 32
    unroll = next((u for u in (4, 2) if words % u == 0 and words // u >= 8), 1)
    steps = max(1, words // unroll)
    return min(32, 1 << (steps.bit_length() - 1)), unroll


def tiling_int8(K: int, block_size: int) -> int:
    """Lanes per output of the int8 product (a lane takes whole blocks): as many as there are
    blocks, a power of two, at most 32."""
    return min(32, 1 << ((K // block_size).bit_length() - 1))


def _grid(groups: int, lanes: int) -> int:
    grid = -(-groups * lanes // THREADS)
    if grid >= 2**31:
        raise Declined(f"qmoe: {groups} output groups need more than 2^31 - 1 CTAs")
    return grid


def _chunking(K: int, bits: int, bs: int, int8: bool, weights: Any) -> tuple[int, int, int]:
    """(lanes, words per chunk, whether the weights' pointer takes the chunk's vector load) of one fc
    of the decode path: the int8 product's lanes take whole blocks."""
    vw = chunk_words(bs, bits, bs) if int8 else chunk_words(K, bits, bs)
    lanes = lanes_over(K // bs) if int8 else lanes_over(K * bits // 32 // vw)
    return lanes, vw, int(weights.data.ptr % (4 * vw) == 0)


def _fc1_on_mma(x16: Any, bits: int, K: int, int8: bool, v1: bool) -> bool:
    """Whether the decode path's fc1 runs on the matrix units (``qk_moe_fc1m``): an fp16 input (exact
    in the mma), 4-bit weights read as 16-byte segments of 32 values, no int8 activations, the
    staged input within XMAX, and neither -DQK_MOE_FC1_SIMT nor -DQK_MOE_DECODE_V1."""
    return (
        bool(x16)
        and bits == 4
        and not int8
        and K % 32 == 0
        and K <= XMAX
        and not v1
        and (FC1_SIMT not in launchers.OPTIONS)
    )


def _fc2_on_mma(fc1m: bool, K: int, k: int, int8: bool, zp: bool) -> bool:
    """Whether the decode path's fc2 runs on the matrix units (``qk_moe_fc2m``): fc1 on ``qk_moe_fc1m``
    (an fp16 input's layer, 4-bit weights; it writes fc2m's bf16 planes), K in segments of 32 values, no
    int8 activations, the k staged rows within FC2M_SMEM and the device's per-CTA limit, no
    -DQK_MOE_FC2_SIMT, and NVIDIA (qmoe.hip builds qk_moe_fc2m there only)."""
    if not fc1m or int8 or K % 32 or FC2_SIMT in launchers.OPTIONS or cupy.cuda.runtime.is_hip:
        return False
    smem, limit = fc2m_staged_bytes(k, K), launchers.smem_limits()[0]
    if smem > min(FC2M_SMEM, limit - 16 * 1024):
        return False
    return smem <= 48 * 1024 or launchers.allow_smem(kernel_of(SOURCE, _fc2m_symbol(zp)), smem)


def _fc2m_symbol(zp: bool) -> str:
    return "qk_moe_fc2m_z" if zp else "qk_moe_fc2m"


def _check_domain(s: dict[str, Any], ptrs: dict[str, Any]) -> None:
    """Decline what the kernels do not cover (module docstring), before any launch."""
    bits, bs, H, inter = int(s["expert_weight_bits"]), int(s["block_size"]), int(s["hidden_size"]), int(s["inter_size"])
    if bs % 32:
        raise Declined(f"block_size: the kernels take blocks of a multiple of 32 values, got {bs}")
    for name, K in (("hidden_size", H), ("inter_size", inter)):
        if K * bits % 32:
            raise Declined(f"{name}: {K} values of {bits} bits are not whole 32-bit words (rows are read as words)")
    for name, align in (("input", 16), ("fc1_experts_weights", 4), ("fc2_experts_weights", 4)):
        if ptrs[name].data.ptr % align:
            raise Declined(f"{name}: the kernels need a {align}-byte aligned pointer")


def _bound(op: OpSpec, args: tuple, kwargs: dict[str, Any], out: Any) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The call bound to the op's ABI, its arrays by name and its scalars, the domain checked."""
    call = bind_call(op, args, kwargs, out)
    ptrs = dict(zip([a.name for a in op.abi.pointers], call.pointers, strict=True))
    s = call.bound.scalars
    _check_domain(s, ptrs)
    return call, ptrs, s


def _qmoe(op: OpSpec, args: tuple, kwargs: dict[str, Any], out: Any) -> Any:
    call, ptrs, s = _bound(op, args, kwargs, out)
    T, H, inter, E, k = (int(s[n]) for n in ("tokens", "hidden_size", "inter_size", "num_experts", "k"))
    if T == 0:
        return call.out
    bits, bs, act = int(s["expert_weight_bits"]), int(s["block_size"]), int(s["activation_type"])
    x16 = np.int32(ptrs["input"].dtype == np.float16)
    i32 = np.int32
    null = np.uint64(0)
    rw = ptrs["router_weights"]
    sel = cupy.empty((T, k), cupy.int32)
    wts = cupy.empty((T, k), cupy.float32)
    route = (ptrs["router_probs"], null if rw is None else rw, sel, wts, i32(T), i32(E), i32(k))
    route += (i32(s["normalize_routing_weights"]), i32(rw is not None), x16)

    def fc(name: str, N: int, K: int) -> tuple:
        zp, bias = ptrs[f"{name}_zero_points"], ptrs[f"{name}_experts_bias"]
        zp_bytes = 0 if zp is None else zp.shape[-1]
        w = (ptrs[f"{name}_experts_weights"], ptrs[f"{name}_scales"], null if zp is None else zp)
        w += (null if bias is None else bias,)
        return w, (i32(zp_bytes), i32(zp is not None), i32(bias is not None))

    def codes(x: Any, rows: int, K: int, is16: Any, gate: Any) -> tuple[Any, Any]:
        """ORT's int8 activation codes and scales of x (rows, K), per block of bs."""
        qx = cupy.empty((rows, K), cupy.int8)
        sx = cupy.empty((rows, K // bs), cupy.float32)
        args = (x, qx, sx, gate, np.int64(rows), i32(K), i32(bs), is16)
        launch_grid(op.name, SOURCE, "qk_moe_quantize", _grid(rows * (K // bs), 1), THREADS, args)
        return qx, sx

    f = 2 if act == SWIGLU else 1
    level = int(s["accuracy_level"])
    int8 = [uses_int8_activations(FcLayout(n, K, bits, bs or None), level) for n, K in ((f * inter, H), (H, inter))]
    v1 = DECODE_V1 in launchers.OPTIONS
    if LEGACY not in launchers.OPTIONS and E <= EMAX and k <= KMAX and T * k <= GRID_Y and (v1 or H <= XMAX):
        attrs = (np.float32(s["activation_alpha"]), np.float32(s["activation_beta"]), np.float32(s["swiglu_limit"]))
        q1 = codes(ptrs["input"], T, H, x16, null) if int8[0] else (null, null)
        w1, flags1 = fc("fc1", f * inter, H)
        lanes2, vw2, vec2 = _chunking(inter, bits, bs, int8[1], ptrs["fc2_experts_weights"])
        m1 = _fc1_on_mma(x16, bits, H, int8[0], v1)
        m2 = _fc2_on_mma(m1, inter, k, int8[1], ptrs["fc2_zero_points"] is not None)
        # fc1's output: fc2m's three bf16 planes a pair (-1, qk_moe_store_planes), in row order (0), or
        # chunk-transposed for fc2v's chunks
        a = cupy.empty(fc2m_staged_bytes(T * k, inter) // 4 if m2 else T * k * inter, cupy.float32)
        at = -1 if m2 else 0 if v1 or int8[1] else vw2 * 32 // bits
        # the arguments qk_moe_fc1m and qk_moe_fc1v share: routing in, fc1's weights and its output
        head = (ptrs["input"], ptrs["router_probs"], null if rw is None else rw, sel, wts, *w1, a, i32(E), i32(H))
        head += (i32(f * inter), i32(inter), i32(k))
        routing = (i32(s["normalize_routing_weights"]), i32(rw is not None))
        if m1:
            tasks = k * -(-f * inter // 16)
            parts = mma_parts(tasks, H)
            fc1m = (*head, i32(bs), *flags1, i32(act), *attrs, *routing, i32(at), i32(parts))
            grid = (mma_ctas(tasks, THREADS // 32 // parts, T, launchers.sm_count()), T)
            name = "qk_moe_fc1m_z" if flags1[1] else "qk_moe_fc1m"
            launch_grid(op.name, SOURCE, name, grid, THREADS, fc1m, shared_mem=mma_staged_bytes(H))
        else:
            lanes, vw, vec = _chunking(H, bits, bs, int8[0], ptrs["fc1_experts_weights"])
            fc1 = (*head, i32(bits), i32(bs), *flags1, x16, i32(act), *attrs, *routing)
            fc1 += (i32(lanes), i32(vw), i32(vec), *q1, i32(at))
            tasks = -(-inter // (ROWS // f))
            if v1:
                launch_grid(op.name, SOURCE, "qk_moe_fc1v", (-(-tasks // (THREADS // lanes)), T * k), THREADS, fc1)
            else:
                grid = (fc1_ctas(k * tasks, THREADS // lanes, T, launchers.sm_count()), T)
                smem = 0 if int8[0] else staged_bytes(H)
                launch_grid(op.name, SOURCE, "qk_moe_fc1v", grid, THREADS, fc1, shared_mem=smem)
        q2 = codes(a, T * k, inter, i32(0), wts) if int8[1] else (null, null)
        w2, flags2 = fc("fc2", H, inter)
        if m2:
            fc2 = (a, sel, wts, *w2, call.out, i32(inter), i32(H), i32(k), i32(bs), *flags2, i32(fc2m_parts(k, inter)))
            smem = fc2m_staged_bytes(k, inter)
            symbol = _fc2m_symbol(bool(flags2[1]))  # a dependent of fc1 (or of the codes): waits for it
            launch_grid(op.name, SOURCE, symbol, (-(-H // 16), T), THREADS, fc2, smem, dependent=True)
            return call.out
        tile = fc2_tile(H, T, k, lanes2)
        fc2 = (a, sel, wts, *w2, call.out, i32(inter), i32(H), i32(k), i32(bits), i32(bs), *flags2, x16)
        fc2 += (i32(lanes2), i32(vw2), i32(vec2), i32(tile), *q2)
        launch_grid(op.name, SOURCE, "qk_moe_fc2v", (-(-H // tile), T), THREADS, fc2)
        return call.out
    launch_grid(op.name, SOURCE, "qk_moe_route", _grid(T, 1), THREADS, route)
    a = cupy.empty(T * k * inter, cupy.float32)  # fc1's output, in row order
    lanes, unroll = (tiling_int8(H, bs), 1) if int8[0] else tiling(H, bits)
    q1 = codes(ptrs["input"], T, H, x16, null) if int8[0] else (null, null)
    w1, flags1 = fc("fc1", f * inter, H)
    attrs = (np.float32(s["activation_alpha"]), np.float32(s["activation_beta"]), np.float32(s["swiglu_limit"]))
    fc1 = (ptrs["input"], sel, wts, *w1, a, i32(T), i32(H), i32(f * inter), i32(inter), i32(k), i32(bits), i32(bs))
    fc1 += (*flags1, x16, i32(act), *attrs, i32(lanes), i32(unroll), *q1)
    launch_grid(op.name, SOURCE, "qk_moe_fc1", _grid(T * k * inter, lanes), THREADS, fc1)
    lanes, unroll = (tiling_int8(inter, bs), 1) if int8[1] else tiling(inter, bits)
    q2 = codes(a, T * k, inter, i32(0), wts) if int8[1] else (null, null)
    w2, flags2 = fc("fc2", H, inter)
    y = call.out
    fc2 = (a, sel, wts, *w2, y, i32(T), i32(inter), i32(H), i32(k), i32(bits), i32(bs), *flags2, x16)
    fc2 += (i32(lanes), i32(unroll), *q2)
    launch_grid(op.name, SOURCE, "qk_moe_fc2", _grid(T * H, lanes), THREADS, fc2)
    return y


def qmoe_decode(*args: Any, out: Any = None, **kwargs: Any) -> Any:
    """com.microsoft.QMoE for decode (one token, or any): ``qconform.oracles.ort.qmoe``'s call on
    CuPy arrays, the output in the input's shape and dtype (``out``: checked before any launch)."""
    return _qmoe(QMOE_DECODE, args, kwargs, out)


def _grouped(op: OpSpec, args: tuple, kwargs: dict[str, Any], out: Any) -> Any:
    """The grouped-GEMM path (module docstring, "storage=fp16"): route, group the live pairs per
    expert, fc1 and fc2 as grouped GEMMs on the matrix units, the weighted sum per token."""
    call, ptrs, s = _bound(op, args, kwargs, out)
    T, H, inter, E, k = (int(s[n]) for n in ("tokens", "hidden_size", "inter_size", "num_experts", "k"))
    if T == 0:
        return call.out
    bits, bs, act = int(s["expert_weight_bits"]), int(s["block_size"]), int(s["activation_type"])
    f = 2 if act == SWIGLU else 1
    if -(-max(f * inter, H) // GROUP_N) > GRID_Y or T * k >= 2**31 - GROUP_M * E:
        raise Declined(f"qmoe grouped: {T} tokens x {k} slots, fc rows {f * inter} / {H} exceed the grid")
    i32, null = np.int32, np.uint64(0)
    x = ptrs["input"]
    x16 = i32(x.dtype == np.float16)
    rw = ptrs["router_weights"]
    P = T * k
    sel = cupy.empty((T, k), cupy.int32)
    wts = cupy.empty((T, k), cupy.float32)
    route = (ptrs["router_probs"], null if rw is None else rw, sel, wts, i32(T), i32(E), i32(k))
    route += (i32(s["normalize_routing_weights"]), i32(rw is not None), x16)
    launch_grid(op.name, SOURCE, "qk_moe_route", _grid(T, 1), THREADS, route)
    counts = cupy.empty(E, cupy.int32)
    order = cupy.empty(P, cupy.int32)
    offs = cupy.empty(E + 1, cupy.int32)
    tiles = cupy.empty(E + 1, cupy.int32)
    launch_grid(op.name, SOURCE, "qk_moe_gcount", E, 256, (sel, wts, counts, i32(P)))
    launch_grid(op.name, SOURCE, "qk_moe_gscatter", E, 256, (sel, wts, counts, order, offs, tiles, i32(P), i32(E)))
    Kp, Ap = padded(H), padded(inter)
    if x16 and Kp == H and x.data.ptr % 16 == 0:
        X = x  # fp16 rows of a multiple of GROUP_K values: read in place
    else:
        X = cupy.empty((T, Kp), cupy.float16)
        launch(op.name, SOURCE, "qk_moe_stage_x", T * Kp, (x, X, np.int64(T), i32(H), i32(Kp), x16))
    A = (cupy.empty if Ap == inter else cupy.zeros)((P, Ap), cupy.float16)  # pad columns read as zeros
    Y = cupy.empty((P, H), cupy.float32)
    m_tiles = -(-P // GROUP_M) + E  # a bound on sum over experts of ceil(pairs / GROUP_M)
    group = (order, offs, tiles, i32(E), i32(k))

    def fc(name: str, N: int, K: int) -> tuple:
        zp, bias = ptrs[f"{name}_zero_points"], ptrs[f"{name}_experts_bias"]
        w = (ptrs[f"{name}_experts_weights"], ptrs[f"{name}_scales"], null if zp is None else zp)
        w += (null if bias is None else bias, i32(N), i32(K), i32(bs), i32(0 if zp is None else zp.shape[-1]))
        return w + (i32(zp is not None), i32(bias is not None), x16)

    attrs = (np.float32(s["activation_alpha"]), np.float32(s["activation_beta"]), np.float32(s["swiglu_limit"]))
    fc1 = (X, i32(Kp), *group, *fc("fc1", f * inter, H), A, i32(Ap), i32(act), *attrs)
    launch_grid(op.name, SOURCE, f"qk_moe_gemm1_u{bits}", (m_tiles, -(-f * inter // GROUP_N)), GROUP_THREADS, fc1)
    fc2 = (A, i32(Ap), *group, *fc("fc2", H, inter), Y)
    launch_grid(op.name, SOURCE, f"qk_moe_gemm2_u{bits}", (m_tiles, -(-H // GROUP_N)), GROUP_THREADS, fc2)
    launch(op.name, SOURCE, "qk_moe_combine", T * H, (Y, wts, call.out, np.int64(T), i32(H), i32(k), x16))
    return call.out


def padded(K: int) -> int:
    """A row of K fp16 values as the grouped GEMMs stage it: a whole number of GROUP_K."""
    return -(-K // GROUP_K) * GROUP_K


def qmoe_ragged_mm(*args: Any, out: Any = None, storage: str = "exact", **kwargs: Any) -> Any:
    """com.microsoft.QMoE for prefill (tokens routed to ragged groups per expert). ``storage``: the
    contract's; "fp16" runs the grouped GEMMs (fp16 fc inputs, module docstring), anything else
    (or ``-DQK_MOE_RAGGED_V1`` in the build options) the decode kernels, each token on its own."""
    if storage == "fp16" and RAGGED_V1 not in launchers.OPTIONS and LEGACY not in launchers.OPTIONS:
        return _grouped(QMOE_RAGGED_MM, args, kwargs, out)
    return _qmoe(QMOE_RAGGED_MM, args, kwargs, out)

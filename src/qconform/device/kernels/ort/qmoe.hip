/* ONNX Runtime com.microsoft.QMoE (qmoe_decode, qmoe_ragged_mm): routing, fc1 + activation, fc2 + the
 * weighted sum of the k experts, three kernels in sequence on one stream (qconform.device.ort.qmoe).
 * Semantics: qconform.oracles.ort.qmoe and moe_routing (onnxruntime contrib_ops/cpu/moe/
 * moe_quantization_cpu.cc QMoECPU::ComputeCommon, moe_utils.cc ApplyActivation /
 * ApplySwiGLUActivation). Weights per expert row-major (N, K) packed along K, low bits first; every
 * row is read as 32-bit words (K * bits a multiple of 32, a block a multiple of 32 values: a word
 * never spans two blocks). Each weight is dequantized exactly as the oracle, fp32((q - z) * s); the
 * dot products accumulate in fp32 (fmaf) in an order fixed by the launch's tiling (lanes per output,
 * words per lane step), which the launcher picks from the shape alone; fc1's output and the
 * activation are held in fp32; the k expert outputs are added in selection order (no atomics).
 * Where ORT's CPU quantizes an fc's input to int8 (block-wise weights, 8-bit or accuracy_level 4),
 * the launcher quantizes it as ORT does (qk_moe_quantize) and that fc takes the dp4a product. */
#include "ort_common.h"

#define QK_MOE_SKIP 1e-8f /* an expert whose weight is <= this is not evaluated (ORT CPU) */

/* (v, e) ranks above (bv, be): the larger logit, equal logits to the higher expert index
 * (std::partial_sort over (value, index) pairs with std::greater, ORT CPU) */
__device__ __forceinline__ bool qk_moe_above(float v, int e, float bv, int be) {
    return v > bv || (v == bv && e > be);
}

/* one thread per token: the k largest logits in rank order, then the mixing weights: a softmax over
 * the k selected logits (whatever normalize says: QMoE), or router_weights of the selected experts,
 * renormalized (fp32 sum in selection order, times its fp32 inverse; 0 when the sum is 0) only
 * when normalize is 1 */
extern "C" __global__ void __launch_bounds__(256)
qk_moe_route(const void* logits, const void* rw, int* sel, float* wts, int T, int E, int k, int normalize,
             int has_rw, int x16) {
    const qk_i64 t = qk_global_thread();
    if (t >= T) return;
    const qk_i64 row = t * E, o = t * k;
    float pv = 0.0f;
    int pe = -1;
    for (int j = 0; j < k; ++j) { /* the best below the previous pick in the total order */
        float bv = 0.0f;
        int be = -1;
        for (int e = 0; e < E; ++e) {
            const float v = qk_load_f(logits, row + e, x16);
            if (pe >= 0 && !qk_moe_above(pv, pe, v, e)) continue;
            if (be < 0 || qk_moe_above(v, e, bv, be)) {
                bv = v;
                be = e;
            }
        }
        sel[o + j] = be;
        wts[o + j] = bv;
        pv = bv;
        pe = be;
    }
    if (has_rw) {
        for (int j = 0; j < k; ++j) wts[o + j] = qk_load_f(rw, row + sel[o + j], x16);
        if (!normalize) return;
    } else {
        const float vmax = wts[o];
        for (int j = 0; j < k; ++j) wts[o + j] = qk_ftz(expf(qk_ftz(QK_FADD(wts[o + j], -vmax))));
    }
    float s = 0.0f;
    for (int j = 0; j < k; ++j) s = qk_ftz(QK_FADD(s, wts[o + j]));
    const float inv = s == 0.0f ? 0.0f : qk_ftz(QK_FDIV(1.0f, s));
    for (int j = 0; j < k; ++j) wts[o + j] = qk_ftz(QK_FMUL(wts[o + j], inv));
}

/* one projection of every expert: N rows of K values, bits per value, scales per row (bs 0) or per
 * block of bs, packed zero points (per row: packed along N; block-wise: per row along the blocks) */
struct qk_moe_fc {
    const qk_u8* w;
    const void* s;
    const qk_u8* z;
    const void* b;
    int N, K, bs, zp_bytes, has_zp, has_bias, s16;
};

/* four consecutive activations from element i (fp16 or fp32; i a multiple of 4) */
__device__ __forceinline__ void qk_moe_x4(const void* x, qk_i64 i, int x16, float* xv) {
    if (x16) {
        const uint2 v = *(const uint2*)((const __half*)x + i);
        xv[0] = qk_fp16_to_float((qk_u16)v.x);
        xv[1] = qk_fp16_to_float((qk_u16)(v.x >> 16));
        xv[2] = qk_fp16_to_float((qk_u16)v.y);
        xv[3] = qk_fp16_to_float((qk_u16)(v.y >> 16));
    } else {
        const float4 v = *(const float4*)((const float*)x + i);
        xv[0] = v.x;
        xv[1] = v.y;
        xv[2] = v.z;
        xv[3] = v.w;
    }
}

/* acc + sum over the word's values of x * fp32((q - z) * s), in value order */
template <int BITS>
__device__ __forceinline__ float qk_moe_word(qk_u32 word, const float* xv, float s, float z, float acc) {
#pragma unroll
    for (int i = 0; i < 32 / BITS; ++i) {
        const float q = (float)((word >> (BITS * i)) & ((1u << BITS) - 1u));
        acc = fmaf(xv[i], qk_ftz(QK_FMUL(QK_FADD(q, -z), s)), acc);
    }
    return acc;
}

/* this lane's partial dot products of x (K values from xoff) with rows n0 and (two) n0 + dn of
 * expert e: words sub * unroll + c * lanes * unroll + i, i < unroll, in that order */
template <int BITS>
__device__ __forceinline__ float2 qk_moe_lane_dot(const qk_moe_fc& f, int e, int n0, int dn, bool two, const void* x,
                                                  qk_i64 xoff, int x16, int sub, int lanes, int unroll, bool live) {
    const int per = 32 / BITS, words = f.K / per, blocks = f.bs ? f.K / f.bs : 1;
    const int wpb = f.bs ? f.bs / per : words;
    const int step = unroll; /* the tiling: words per lane and step, chosen by the launcher from the shape */
    float2 acc = make_float2(0.0f, 0.0f);
    for (int r = 0; r < 1 + (int)two; ++r) {
        const int n = n0 + r * dn;
        const qk_i64 rr = (qk_i64)e * f.N + n;
        const qk_u32* row = (const qk_u32*)(f.w + rr * (qk_i64)words * 4);
        const qk_u8* zrow = f.bs ? f.z + rr * f.zp_bytes : f.z + (qk_i64)e * f.zp_bytes;
        float a = 0.0f;
        for (int base = sub * step; live && base < words; base += lanes * step) {
            for (int i = 0; i < step && base + i < words; ++i) {
                const int w = base + i, kb = w / wpb;
                const float s = qk_ftz(qk_load_f(f.s, rr * blocks + kb, f.s16));
                const float z = f.has_zp ? (float)qk_field(zrow, BITS, f.bs ? kb : n) : (float)(1 << (BITS - 1));
                float xv[32 / BITS];
#pragma unroll
                for (int c = 0; c < 32 / BITS; c += 4) qk_moe_x4(x, xoff + (qk_i64)w * per + c, x16, xv + c);
                a = qk_moe_word<BITS>(row[w], xv, s, z, a);
            }
        }
        if (r == 0) acc.x = a;
        else acc.y = a;
    }
    return acc;
}

/* accuracy_level 4 / 8-bit block-wise weights (ORT's CompInt8 activations, block = bs): this lane's
 * partial sum over blocks sub, sub + lanes, ... of fp32(sa_b * s_b) * (the exact integer dot of the
 * activation codes with q - z): dp4a of the codes with q - 2^(bits-1) (an int8), plus
 * (2^(bits-1) - z) * the codes' sum. qx: (rows, K) int8, sx: (rows, K / bs) fp32 */
template <int BITS>
__device__ __forceinline__ float2 qk_moe_lane_dot_i8(const qk_moe_fc& f, int e, int n0, int dn, bool two,
                                                     const qk_i8* qx, const float* sx, qk_i64 xrow, int sub,
                                                     int lanes, bool live) {
    const int per = 32 / BITS, blocks = f.K / f.bs, wpb = f.bs / per, mid = 1 << (BITS - 1);
    const qk_u32 mask = (1u << BITS) - 1u;
    float2 acc = make_float2(0.0f, 0.0f);
    for (int r = 0; r < 1 + (int)two; ++r) {
        const int n = n0 + r * dn;
        const qk_i64 rr = (qk_i64)e * f.N + n;
        const qk_u32* row = (const qk_u32*)(f.w + rr * (qk_i64)(f.K / per) * 4);
        const qk_u8* zrow = f.z + rr * f.zp_bytes;
        float a = 0.0f;
        for (int b = sub; live && b < blocks; b += lanes) {
            const int z = f.has_zp ? qk_field(zrow, BITS, b) : mid;
            const int* xq = (const int*)(qx + xrow * f.K + (qk_i64)b * f.bs);
            int dot = 0, xsum = 0;
            for (int w = 0; w < wpb; ++w) {
                const qk_u32 word = row[b * wpb + w];
#pragma unroll
                for (int c = 0; c < 32 / BITS; c += 4) {
                    int wq = 0;
#pragma unroll
                    for (int i = 0; i < 4; ++i)
                        wq |= (((int)((word >> (BITS * (c + i))) & mask) - mid) & 0xFF) << (8 * i);
                    const int a4 = xq[(w * per + c) >> 2];
                    dot = qk_dp4a(a4, wq, dot);
                    xsum = qk_dp4a(a4, 0x01010101, xsum);
                }
            }
            dot += (mid - z) * xsum;
            const float s = qk_ftz(qk_load_f(f.s, rr * blocks + b, f.s16));
            a = fmaf(qk_ftz(QK_FMUL(sx[xrow * blocks + b], s)), (float)dot, a);
        }
        if (r == 0) acc.x = a;
        else acc.y = a;
    }
    return acc;
}

__device__ __forceinline__ float2 qk_moe_dot_i8(int bits, const qk_moe_fc& f, int e, int n0, int dn, bool two,
                                                const qk_i8* qx, const float* sx, qk_i64 xrow, int sub, int lanes,
                                                bool live) {
    if (bits == 4) return qk_moe_lane_dot_i8<4>(f, e, n0, dn, two, qx, sx, xrow, sub, lanes, live);
    if (bits == 8) return qk_moe_lane_dot_i8<8>(f, e, n0, dn, two, qx, sx, xrow, sub, lanes, live);
    return qk_moe_lane_dot_i8<2>(f, e, n0, dn, two, qx, sx, xrow, sub, lanes, live);
}

/* ORT's CompInt8 activation quantization, one thread per (row, block of bs): amax, sa = fp32(amax/127),
 * inv = fp32(127/amax) or 0, code = clamp(rint(fp32(x inv)), -128, 127) (qconform.oracles.ort.
 * matmul_nbits.quantize_activations_int8). With wts (fc2's input, a row per slot): rows of skipped
 * slots are left alone (never written by fc1, never read by fc2) */
extern "C" __global__ void __launch_bounds__(256)
qk_moe_quantize(const void* x, qk_i8* qx, float* sx, const float* wts, qk_i64 rows, int K, int bs, int x16) {
    const qk_i64 t = qk_global_thread();
    const int blocks = K / bs;
    if (t >= rows * blocks) return;
    const qk_i64 m = t / blocks;
    if (wts != 0 && !(wts[m] > QK_MOE_SKIP)) return;
    const qk_i64 k0 = m * K + (t - m * blocks) * bs;
    float amax = 0.0f;
    for (int i = 0; i < bs; ++i) amax = fmaxf(amax, fabsf(qk_ftz(qk_load_f(x, k0 + i, x16))));
    sx[t] = qk_ftz(QK_FDIV(amax, 127.0f));
    const float inv = amax != 0.0f ? qk_ftz(QK_FDIV(127.0f, amax)) : 0.0f;
    for (int i = 0; i < bs; ++i) {
        const float r = rintf(qk_ftz(QK_FMUL(qk_ftz(qk_load_f(x, k0 + i, x16)), inv)));
        qx[k0 + i] = (qk_i8)(int)fminf(fmaxf(r, -128.0f), 127.0f);
    }
}

/* the group's sum (a butterfly over `lanes` lanes; every lane ends with the same bits), plus the bias */
__device__ __forceinline__ float qk_moe_reduce(float a, int lanes, const qk_moe_fc& f, qk_i64 bias_at, bool live) {
    for (int off = lanes >> 1; off > 0; off >>= 1) a = QK_FADD(a, QK_SHFL_XOR(a, off, lanes));
    if (live && f.has_bias) a = qk_ftz(QK_FADD(a, qk_ftz(qk_load_f(f.b, bias_at, f.s16))));
    return a;
}

__device__ __forceinline__ float2 qk_moe_dot(int bits, const qk_moe_fc& f, int e, int n0, int dn, bool two,
                                             const void* x, qk_i64 xoff, int x16, int sub, int lanes, int unroll,
                                             bool live) {
    if (bits == 4) return qk_moe_lane_dot<4>(f, e, n0, dn, two, x, xoff, x16, sub, lanes, unroll, live);
    if (bits == 8) return qk_moe_lane_dot<8>(f, e, n0, dn, two, x, xoff, x16, sub, lanes, unroll, live);
    return qk_moe_lane_dot<2>(f, e, n0, dn, two, x, xoff, x16, sub, lanes, unroll, live);
}

/* the activation codes of qconform.ops.ort.qmoe.ACTIVATION */
#define QK_MOE_RELU 0
#define QK_MOE_GELU 1
#define QK_MOE_SILU 2
#define QK_MOE_IDENTITY 3
#define QK_MOE_SWIGLU 4

/* sigmoid(v) = fp32(1 / fp32(1 + expf(-v))) */
__device__ __forceinline__ float qk_moe_sigmoid(float v) {
    return qk_ftz(QK_FDIV(1.0f, qk_ftz(QK_FADD(1.0f, qk_ftz(expf(-v))))));
}

/* the activation of one fc1 output h (or of the pair: gate g = h, linear l), each step rounded to
 * fp32 in ORT's C order (qconform.oracles.ort.qmoe.expert_activation) */
__device__ __forceinline__ float qk_moe_act(int act, float h, float l, float alpha, float beta, float limit) {
    if (act == QK_MOE_RELU) return h > 0.0f ? h : 0.0f;
    if (act == QK_MOE_IDENTITY) return h;
    if (act == QK_MOE_SILU) return qk_ftz(QK_FMUL(h, qk_moe_sigmoid(h)));
    if (act == QK_MOE_GELU) {
        const float cube = qk_ftz(QK_FMUL(qk_ftz(QK_FMUL(qk_ftz(QK_FMUL(0.044715f, h)), h)), h));
        const float inner = qk_ftz(QK_FMUL(0.7978845608f, qk_ftz(QK_FADD(h, cube))));
        const float half = qk_ftz(QK_FMUL(0.5f, h));
        return qk_ftz(QK_FMUL(half, qk_ftz(QK_FADD(1.0f, qk_ftz(tanhf(inner))))));
    }
    float g = h;
    g = limit < g ? limit : g;                           /* the gate capped above */
    l = l < -limit ? -limit : (limit < l ? limit : l);   /* the linear half clamped */
    const float swish = qk_ftz(QK_FMUL(g, qk_moe_sigmoid(qk_ftz(QK_FMUL(alpha, g)))));
    return qk_ftz(QK_FMUL(swish, qk_ftz(QK_FADD(l, beta))));
}

/* fc1 and the activation: a group of `lanes` lanes per (token, slot, unit); with SwiGLU the unit u
 * takes fc1 rows 2u (gate) and 2u + 1 (linear), interleaved (swiglu_fusion 1). A (T * k, units) fp32;
 * a slot whose weight is skipped is neither computed nor read */
extern "C" __global__ void __launch_bounds__(256)
qk_moe_fc1(const void* x, const int* sel, const float* wts, const qk_u8* W, const void* S, const qk_u8* Z,
           const void* Bias, float* A, int T, int K, int N, int units, int k, int bits, int bs, int zp_bytes,
           int has_zp, int has_bias, int x16, int act, float alpha, float beta, float limit, int lanes, int unroll,
           const qk_i8* qx, const float* sx) {
    const qk_i64 g = qk_global_thread() / lanes, pairs = (qk_i64)T * k;
    const int sub = (int)(threadIdx.x & (unsigned)(lanes - 1));
    const qk_i64 p = g / units;
    const int u = (int)(g - p * units);
    const bool inside = p < pairs;
    const bool live = inside && wts[p] > QK_MOE_SKIP;
    const int e = live ? sel[p] : 0;
    const qk_moe_fc f = {W, S, Z, Bias, N, K, bs, zp_bytes, has_zp, has_bias, x16};
    const bool glu = act == QK_MOE_SWIGLU;
    const int r0 = glu ? 2 * u : u, r1 = 2 * u + 1;
    const float2 acc = qx ? qk_moe_dot_i8(bits, f, e, r0, r1 - r0, glu, qx, sx, p / k, sub, lanes, live)
                          : qk_moe_dot(bits, f, e, r0, r1 - r0, glu, x, (p / k) * K, x16, sub, lanes, unroll, live);
    const float h = qk_moe_reduce(acc.x, lanes, f, (qk_i64)e * N + r0, live);
    const float l = glu ? qk_moe_reduce(acc.y, lanes, f, (qk_i64)e * N + r1, live) : 0.0f;
    if (live && sub == 0) A[p * units + u] = qk_moe_act(act, h, l, alpha, beta, limit);
}

/* fc2 and the weighted sum: a group of `lanes` lanes per (token, output column n); the k slots in
 * selection order, each fp32(w * fp32(dot + bias)) added in fp32; skipped slots add nothing */
extern "C" __global__ void __launch_bounds__(256)
qk_moe_fc2(const float* A, const int* sel, const float* wts, const qk_u8* W, const void* S, const qk_u8* Z,
           const void* Bias, void* Y, int T, int K, int N, int k, int bits, int bs, int zp_bytes, int has_zp,
           int has_bias, int x16, int lanes, int unroll, const qk_i8* qx, const float* sx) {
    const qk_i64 g = qk_global_thread() / lanes;
    const int sub = (int)(threadIdx.x & (unsigned)(lanes - 1));
    const bool inside = g < (qk_i64)T * N;
    const qk_i64 t = g / N;
    const int n = (int)(g - t * N);
    const qk_moe_fc f = {W, S, Z, Bias, N, K, bs, zp_bytes, has_zp, has_bias, x16};
    float out = 0.0f;
#pragma unroll 1
    for (int j = 0; j < k; ++j) {
        const qk_i64 p = t * k + j;
        const float w = inside ? wts[p] : 0.0f;
        const bool live = inside && w > QK_MOE_SKIP;
        const int e = live ? sel[p] : 0;
        const float2 acc = qx ? qk_moe_dot_i8(bits, f, e, n, 0, false, qx, sx, p, sub, lanes, live)
                              : qk_moe_dot(bits, f, e, n, 0, false, A, p * K, 0, sub, lanes, unroll, live);
        const float y = qk_moe_reduce(acc.x, lanes, f, (qk_i64)e * N + n, live);
        if (live) out = qk_ftz(QK_FADD(out, qk_ftz(QK_FMUL(w, y))));
    }
    if (inside && sub == 0) qk_store_f(Y, g, out, x16);
}

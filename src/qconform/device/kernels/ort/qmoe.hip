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
#include "qk_phases.h" /* bench-only -DQK_PHASES: fc1m's boundaries 0..3, fc2m's 12..17 */

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

/* -------------------------------------------------------------------------------------------------
 * The decode path (the launcher's default; its build option -DQK_MOE_LEGACY selects the kernels
 * above; -DQK_MOE_DECODE_V1 its session-8 form, the same sums in the same order). Two launches where
 * the fc inputs stay fp32: qk_moe_fc1v (every CTA routes its token itself, so no routing kernel runs
 * before it, and CTA x 0 of each token writes sel / wts for fc2), then qk_moe_fc2v (a CTA takes a tile of output columns for all k slots and adds the slots in
 * selection order in shared memory: no atomics). Work unit: a task of QK_MOE_ROWS weight rows of one
 * expert, taken by `lanes` consecutive lanes of a 32-lane group (32 on wave32 and wave64 alike, so
 * the order is the same on both); lane li reads chunks li, li + lanes, ... of `vw` 32-bit words
 * (16-byte loads for vw 4 where the pointer allows, else the same words one by one: the order does
 * not depend on the alignment); each row's partial sums are then added by a butterfly over the
 * lanes. lanes, vw and the fc2 tile are functions of the shape (qconform.device.ort.qmoe). The
 * weights are dequantized as above, fp32((q - z) * s), with q - z formed exactly as
 * fp32(2^23 + q) - fp32(2^23 + z) (the byte permute builds 2^23 + q's bits); with fp16 scales the
 * product is exact and normal (11 by at most 8 significant bits, |s| >= 2^-24), so no flush is needed. */

#define QK_MOE_EMAX 512   /* experts the fused routing holds in shared memory */
#define QK_MOE_KMAX 32    /* selected experts per token */
#define QK_MOE_ROWS 4     /* weight rows per task */
#define QK_MOE_YMAX 2048  /* fc2: (slot, column) outputs per CTA, k * tile */
#define QK_MOE_GROUP 32   /* lanes of a reduction group */

/* token t's top-k (s_sel, rank order) and mixing weights (s_w): qk_moe_route's results bit for bit.
 * The logits are loaded (a thread's first QK_MOE_EMAX / 256 in registers), then `stage` runs (the
 * caller's input staging: its loads in flight with the logits'), then they are stored.
 * Without a NaN logit (qk_moe_above is then a strict total order) the serial scan's j-th pick is
 * the logit with exactly j logits above it: where E^2 <= 2048 k (fewer comparisons than k scan rounds
 * take), every logit is ranked at once, tpe threads of a 32-lane group counting the logits above it
 * over a stride of tpe. Else group 0 takes each pick as the best of 32 lanes' best eligible logits
 * (lane l scans e = l, l + 32, ...; a butterfly keeps the better of each pair): (value, index) ordered
 * totally, so it is the serial scan's pick. The weights: thread 0, qk_moe_route's arithmetic in its
 * order. Called by every thread. */
template <class Stage>
__device__ __forceinline__ void qk_moe_route_cta(const void* logits, const void* rw, qk_i64 t, int E, int k,
                                                 int normalize, int has_rw, int x16, float* s_logit, int* s_sel,
                                                 float* s_w, Stage stage) {
    const qk_i64 row = t * E;
    const int tid = (int)threadIdx.x, nt = (int)blockDim.x;
    constexpr int PER = QK_MOE_EMAX / 256; /* all of them at the launcher's 256 threads */
    float lv[PER];
#pragma unroll
    for (int i = 0; i < PER; ++i) lv[i] = tid + i * nt < E ? qk_load_f(logits, row + tid + i * nt, x16) : 0.0f;
    stage();
    int nan = 0;
#pragma unroll
    for (int i = 0; i < PER; ++i)
        if (tid + i * nt < E) {
            s_logit[tid + i * nt] = lv[i];
            nan |= lv[i] != lv[i];
        }
    for (int e = tid + PER * nt; e < E; e += nt) { /* fewer threads */
        s_logit[e] = qk_load_f(logits, row + e, x16);
        nan |= s_logit[e] != s_logit[e];
    }
    if (!__syncthreads_or(nan) && E * E <= 2048 * k) {
        int tpe = 1; /* threads per logit: a power of two up to 32 */
        while (tpe < QK_MOE_GROUP && E * tpe * 2 <= nt) tpe *= 2;
        for (int base = 0; base < E * tpe; base += nt) { /* the same trip count in every thread */
            const int i = base + tid, e = i / tpe, part = i - e * tpe;
            const float v = e < E ? s_logit[e] : 0.0f;
            int rank = 0;
            if (e < E)
                for (int o = part; o < E; o += tpe) rank += qk_moe_above(s_logit[o], o, v, e);
            for (int off = 1; off < tpe; off *= 2) rank += QK_SHFL_XOR(rank, off, QK_MOE_GROUP);
            if (e < E && part == 0 && rank < k) {
                s_sel[rank] = e;
                s_w[rank] = v;
            }
        }
        __syncthreads();
    } else if (tid < QK_MOE_GROUP) {
        const int lane = tid;
        float pv = 0.0f;
        int pe = -1;
        for (int j = 0; j < k; ++j) {
            float bv = 0.0f;
            int be = -1;
            for (int e = lane; e < E; e += QK_MOE_GROUP) {
                const float v = s_logit[e];
                if (pe >= 0 && !qk_moe_above(pv, pe, v, e)) continue;
                if (be < 0 || qk_moe_above(v, e, bv, be)) {
                    bv = v;
                    be = e;
                }
            }
            for (int off = QK_MOE_GROUP / 2; off > 0; off >>= 1) {
                const float ov = QK_SHFL_XOR(bv, off, QK_MOE_GROUP);
                const int oe = QK_SHFL_XOR(be, off, QK_MOE_GROUP);
                if (oe >= 0 && (be < 0 || qk_moe_above(ov, oe, bv, be))) {
                    bv = ov;
                    be = oe;
                }
            }
            if (lane == 0) {
                s_sel[j] = be;
                s_w[j] = bv;
            }
            pv = bv;
            pe = be;
        }
    }
    if (tid == 0) {
        if (has_rw) {
            for (int j = 0; j < k; ++j) s_w[j] = qk_load_f(rw, row + s_sel[j], x16);
        } else {
            const float vmax = s_w[0];
            for (int j = 0; j < k; ++j) s_w[j] = qk_ftz(expf(qk_ftz(QK_FADD(s_w[j], -vmax))));
        }
        if (!has_rw || normalize) {
            float sum = 0.0f;
            for (int j = 0; j < k; ++j) sum = qk_ftz(QK_FADD(sum, s_w[j]));
            const float inv = sum == 0.0f ? 0.0f : qk_ftz(QK_FDIV(1.0f, sum));
            for (int j = 0; j < k; ++j) s_w[j] = qk_ftz(QK_FMUL(s_w[j], inv));
        }
    }
    __syncthreads();
}

/* qk_moe_route_cta's stage with nothing to stage */
struct qk_moe_no_stage {
    __device__ void operator()() const {}
};

/* V consecutive words from p: one vector load where `vec` says p is 4V-byte aligned, else one by one */
template <int V>
__device__ __forceinline__ void qk_moe_load(const qk_u32* p, bool vec, qk_u32* out) {
    if (V == 4 && vec) {
        const uint4 q = *(const uint4*)p;
        out[0] = q.x;
        out[1] = q.y;
        out[2] = q.z;
        out[3] = q.w;
    } else if (V == 2 && vec) {
        const uint2 q = *(const uint2*)p;
        out[0] = q.x;
        out[1] = q.y;
    } else {
#pragma unroll
        for (int i = 0; i < V; ++i) out[i] = p[i];
    }
}

/* acc + sum over the word's values of x * fp32((q - z) * s), in value order; zc = -fp32(2^23 + z) */
template <int BITS, bool S16>
__device__ __forceinline__ float qk_moe_word_v(qk_u32 word, const float* xv, float s, float zc, float acc) {
    const qk_u32 lo = word & 0x0F0F0F0Fu, hi = (word >> 4) & 0x0F0F0F0Fu; /* 4 bits: values 0,2,4,6 / 1,3,5,7 */
#pragma unroll
    for (int i = 0; i < 32 / BITS; ++i) {
        qk_u32 m; /* the bits of fp32(2^23 + q) */
        if (BITS == 8) m = QK_BYTE_PERM(word, 0x4B000000u, 0x7540u | (qk_u32)i);
        else if (BITS == 4) m = QK_BYTE_PERM((i & 1) ? hi : lo, 0x4B000000u, 0x7540u | (qk_u32)(i >> 1));
        else m = qk_and_or(word >> (BITS * i), (1u << BITS) - 1u, 0x4B000000u);
        const float d = QK_FADD(qk_float(m), zc); /* q - z, exact */
        const float w = S16 ? QK_FMUL(d, s) : qk_ftz(QK_FMUL(d, s));
        acc = fmaf(xv[i], w, acc);
    }
    return acc;
}

/* where a lane's activations come from (XL, by kernel and build): QK_MOE_XG the input row in
 * global memory as given (fp16 or fp32; -DQK_MOE_DECODE_V1's kernels); QK_MOE_XS the token's row
 * staged as fp32 in shared memory, 16-byte unit u at qk_moe_swz(u) (qk_moe_fc1v); QK_MOE_XT fc1's
 * fp32 output row in chunk-transposed order (qk_moe_apos: unit i of every chunk together, so a
 * warp's lanes on consecutive chunks read consecutive 16 bytes; qk_moe_fc2v). The values are the
 * same fp32 numbers in every layout: only the addresses differ. */
#define QK_MOE_XG 0
#define QK_MOE_XS 1
#define QK_MOE_XT 2
#ifdef QK_MOE_DECODE_V1
#define QK_MOE_FC2_XL QK_MOE_XG
#define QK_MOE_BOUNDS 256
#else
#define QK_MOE_FC2_XL QK_MOE_XT
#define QK_MOE_BOUNDS 256, 2 /* <= 128 registers: 2 CTAs (16 warps) per SM (qmoe_tiling.CTAS_PER_SM) */
#endif

/* the shared slot of 16-byte unit u: the low 3 bits XORed with bits 3-5, so 8 lanes reading unit i
 * of chunks c .. c + 7 (chunk strides of 1 to 8 units) hit 8 different 4-bank groups */
__device__ __forceinline__ int qk_moe_swz(int u) { return u ^ ((u >> 3) & 7); }

/* the float index in a chunk-transposed row (chunks of cv values, K / cv of them) of value v */
__device__ __forceinline__ int qk_moe_apos(int v, int cv, int K) {
    const int c = v / cv, r = v - c * cv;
    return ((r >> 2) * (K / cv) + c) * 4 + (r & 3);
}

/* four consecutive activations, values vi .. vi + 3 of chunk c (vi a multiple of 4), from layout XL */
template <int XL>
__device__ __forceinline__ void qk_moe_xq(const void* x, qk_i64 xoff, int x16, const float4* xs, int vi, int c,
                                          int cv, int K, float* xv) {
    if (XL == QK_MOE_XS) {
        const float4 q = xs[qk_moe_swz(vi >> 2)];
        xv[0] = q.x;
        xv[1] = q.y;
        xv[2] = q.z;
        xv[3] = q.w;
    } else if (XL == QK_MOE_XT) {
        const float4 q = *(const float4*)((const float*)x + xoff + ((((vi - c * cv) >> 2) * (K / cv) + c) * 4));
        xv[0] = q.x;
        xv[1] = q.y;
        xv[2] = q.z;
        xv[3] = q.w;
    } else {
        qk_moe_x4(x, xoff + vi, x16, xv);
    }
}

#ifdef QK_MOE_DECODE_V1
/* this lane's partial dot products of x (K values from xoff) with rows rows[] of expert e: chunks
 * li, li + L, ... of V words, each row's values in order */
template <int BITS, int V, bool S16, int XL>
__device__ __forceinline__ void qk_moe_rows_dot(const qk_moe_fc& f, int e, const int* rows, const void* x,
                                                qk_i64 xoff, int x16, const float4* xs, int li, int L, bool vec,
                                                float* acc) {
    const int per = 32 / BITS, words = f.K / per, chunks = words / V, wpb = f.bs ? f.bs / per : words;
    const int blocks = f.bs ? f.K / f.bs : 1;
    qk_i64 rr[QK_MOE_ROWS];
    const qk_u32* wrow[QK_MOE_ROWS];
#pragma unroll
    for (int r = 0; r < QK_MOE_ROWS; ++r) {
        rr[r] = (qk_i64)e * f.N + rows[r];
        wrow[r] = (const qk_u32*)(f.w + rr[r] * (qk_i64)words * 4);
    }
    for (int c = li; c < chunks; c += L) {
        const int w0 = c * V, kb = w0 / wpb;
        qk_u32 wv[QK_MOE_ROWS][4];
        float s[QK_MOE_ROWS], zc[QK_MOE_ROWS];
#pragma unroll
        for (int r = 0; r < QK_MOE_ROWS; ++r) {
            qk_moe_load<V>(wrow[r] + w0, vec, wv[r]);
            s[r] = qk_ftz(qk_load_f(f.s, rr[r] * blocks + kb, f.s16));
            const qk_u8* zrow = f.bs ? f.z + rr[r] * f.zp_bytes : f.z + (qk_i64)e * f.zp_bytes;
            const float z = f.has_zp ? (float)qk_field(zrow, BITS, f.bs ? kb : rows[r]) : (float)(1 << (BITS - 1));
            zc[r] = -QK_FADD(8388608.0f, z);
        }
#pragma unroll
        for (int v = 0; v < V; ++v) {
            float xv[32 / BITS];
#pragma unroll
            for (int c4 = 0; c4 < 32 / BITS; c4 += 4)
                qk_moe_xq<XL>(x, xoff, x16, xs, (w0 + v) * per + c4, c, V * per, f.K, xv + c4);
#pragma unroll
            for (int r = 0; r < QK_MOE_ROWS; ++r) acc[r] = qk_moe_word_v<BITS, S16>(wv[r][v], xv, s[r], zc[r], acc[r]);
        }
    }
}
#else
/* chunk c's words, scales and -fp32(2^23 + z) of rows rows[] (qk_moe_rows_dot's loads) */
template <int BITS, int V>
__device__ __forceinline__ void qk_moe_chunk(const qk_moe_fc& f, int e, const int* rows, const qk_i64* rr,
                                             const qk_u32* const* wrow, int c, int wpb, int blocks, bool vec,
                                             qk_u32 (*wv)[4], float* s, float* zc) {
    const int w0 = c * V, kb = w0 / wpb;
#pragma unroll
    for (int r = 0; r < QK_MOE_ROWS; ++r) {
        qk_moe_load<V>(wrow[r] + w0, vec, wv[r]);
        s[r] = qk_ftz(qk_load_f(f.s, rr[r] * blocks + kb, f.s16));
        const qk_u8* zrow = f.bs ? f.z + rr[r] * f.zp_bytes : f.z + (qk_i64)e * f.zp_bytes;
        const float z = f.has_zp ? (float)qk_field(zrow, BITS, f.bs ? kb : rows[r]) : (float)(1 << (BITS - 1));
        zc[r] = -QK_FADD(8388608.0f, z);
    }
}

/* this lane's partial dot products of x (K values from xoff, layout XL) with rows rows[] of expert
 * e: chunks li, li + L, ... of V words, each row's values in order. 4-bit: the next chunk's
 * weights, scales and zero points are loaded before this chunk is multiplied (the same sums in the
 * same order as -DQK_MOE_DECODE_V1, with two chunks' loads in flight) */
template <int BITS, int V, bool S16, int XL>
__device__ __forceinline__ void qk_moe_rows_dot(const qk_moe_fc& f, int e, const int* rows, const void* x,
                                                qk_i64 xoff, int x16, const float4* xs, int li, int L, bool vec,
                                                float* acc) {
    const int per = 32 / BITS, words = f.K / per, chunks = words / V, wpb = f.bs ? f.bs / per : words;
    const int blocks = f.bs ? f.K / f.bs : 1;
    qk_i64 rr[QK_MOE_ROWS];
    const qk_u32* wrow[QK_MOE_ROWS];
#pragma unroll
    for (int r = 0; r < QK_MOE_ROWS; ++r) {
        rr[r] = (qk_i64)e * f.N + rows[r];
        wrow[r] = (const qk_u32*)(f.w + rr[r] * (qk_i64)words * 4);
    }
    qk_u32 wv[QK_MOE_ROWS][4];
    float s[QK_MOE_ROWS], zc[QK_MOE_ROWS];
    constexpr bool PF = BITS == 4; /* prefetch (u2 / u8: each chunk loaded where it is used, in 128 registers) */
    if (PF && li < chunks) qk_moe_chunk<BITS, V>(f, e, rows, rr, wrow, li, wpb, blocks, vec, wv, s, zc);
    for (int c = li; c < chunks; c += L) {
        if (!PF) qk_moe_chunk<BITS, V>(f, e, rows, rr, wrow, c, wpb, blocks, vec, wv, s, zc);
        qk_u32 cw[QK_MOE_ROWS][4];
        float cs[QK_MOE_ROWS], czc[QK_MOE_ROWS];
#pragma unroll
        for (int r = 0; r < QK_MOE_ROWS; ++r) {
#pragma unroll
            for (int v = 0; v < V; ++v) cw[r][v] = wv[r][v];
            cs[r] = s[r];
            czc[r] = zc[r];
        }
        if (PF && c + L < chunks) qk_moe_chunk<BITS, V>(f, e, rows, rr, wrow, c + L, wpb, blocks, vec, wv, s, zc);
        const int w0 = c * V;
#pragma unroll
        for (int v = 0; v < V; ++v) {
            float xv[32 / BITS];
#pragma unroll
            for (int c4 = 0; c4 < 32 / BITS; c4 += 4)
                qk_moe_xq<XL>(x, xoff, x16, xs, (w0 + v) * per + c4, c, V * per, f.K, xv + c4);
#pragma unroll
            for (int r = 0; r < QK_MOE_ROWS; ++r) acc[r] = qk_moe_word_v<BITS, S16>(cw[r][v], xv, cs[r], czc[r], acc[r]);
        }
    }
}
#endif

/* the int8 product of rows[] (ORT's CompInt8 activations, qk_moe_lane_dot_i8's arithmetic per block):
 * this lane's blocks li, li + L, ..., each block's words read V at a time */
template <int BITS, int V>
__device__ __forceinline__ void qk_moe_rows_dot_i8(const qk_moe_fc& f, int e, const int* rows, const qk_i8* qx,
                                                   const float* sx, qk_i64 xrow, int li, int L, bool vec, float* acc) {
    const int per = 32 / BITS, words = f.K / per, blocks = f.K / f.bs, wpb = f.bs / per, mid = 1 << (BITS - 1);
    const qk_u32 mask = (1u << BITS) - 1u;
    qk_i64 rr[QK_MOE_ROWS];
    const qk_u32* wrow[QK_MOE_ROWS];
#pragma unroll
    for (int r = 0; r < QK_MOE_ROWS; ++r) {
        rr[r] = (qk_i64)e * f.N + rows[r];
        wrow[r] = (const qk_u32*)(f.w + rr[r] * (qk_i64)words * 4);
    }
    for (int b = li; b < blocks; b += L) {
        const int* xq = (const int*)(qx + xrow * f.K + (qk_i64)b * f.bs);
        int dot[QK_MOE_ROWS], xsum = 0;
#pragma unroll
        for (int r = 0; r < QK_MOE_ROWS; ++r) dot[r] = 0;
        for (int w0 = 0; w0 < wpb; w0 += V) {
            qk_u32 wv[QK_MOE_ROWS][4];
#pragma unroll
            for (int r = 0; r < QK_MOE_ROWS; ++r) qk_moe_load<V>(wrow[r] + b * wpb + w0, vec, wv[r]);
#pragma unroll
            for (int v = 0; v < V; ++v) {
#pragma unroll
                for (int c = 0; c < 32 / BITS; c += 4) {
                    const int a4 = xq[((w0 + v) * per + c) >> 2];
                    xsum = qk_dp4a(a4, 0x01010101, xsum);
#pragma unroll
                    for (int r = 0; r < QK_MOE_ROWS; ++r) {
                        int wq = 0;
#pragma unroll
                        for (int i = 0; i < 4; ++i)
                            wq |= (((int)((wv[r][v] >> (BITS * (c + i))) & mask) - mid) & 0xFF) << (8 * i);
                        dot[r] = qk_dp4a(a4, wq, dot[r]);
                    }
                }
            }
        }
        const float sa = sx[xrow * blocks + b];
#pragma unroll
        for (int r = 0; r < QK_MOE_ROWS; ++r) {
            const int z = f.has_zp ? qk_field(f.z + rr[r] * f.zp_bytes, BITS, b) : mid;
            const int d = dot[r] + (mid - z) * xsum; /* the exact integer dot with q - z */
            const float s = qk_ftz(qk_load_f(f.s, rr[r] * blocks + b, f.s16));
            acc[r] = fmaf(qk_ftz(QK_FMUL(sa, s)), (float)d, acc[r]);
        }
    }
}

/* the task's dot products by the shape's instantiation: bits 2 / 4 / 8, vw 1 / 2 / 4 words a chunk,
 * fp16 or fp32 scales, activations from layout XL; the int8 product where qx is given */
template <int BITS, int V, int XL>
__device__ __forceinline__ void qk_moe_dot_bv(const qk_moe_fc& f, int e, const int* rows, const void* x, qk_i64 xoff,
                                              int x16, const float4* xs, const qk_i8* qx, const float* sx,
                                              qk_i64 xrow, int li, int L, bool vec, float* acc) {
    if (qx) qk_moe_rows_dot_i8<BITS, V>(f, e, rows, qx, sx, xrow, li, L, vec, acc);
    else if (f.s16) qk_moe_rows_dot<BITS, V, true, XL>(f, e, rows, x, xoff, x16, xs, li, L, vec, acc);
    else qk_moe_rows_dot<BITS, V, false, XL>(f, e, rows, x, xoff, x16, xs, li, L, vec, acc);
}

template <int BITS, int XL>
__device__ __forceinline__ void qk_moe_dot_b(int vw, const qk_moe_fc& f, int e, const int* rows, const void* x,
                                             qk_i64 xoff, int x16, const float4* xs, const qk_i8* qx, const float* sx,
                                             qk_i64 xrow, int li, int L, bool vec, float* acc) {
    if (vw == 4) qk_moe_dot_bv<BITS, 4, XL>(f, e, rows, x, xoff, x16, xs, qx, sx, xrow, li, L, vec, acc);
    else if (vw == 2) qk_moe_dot_bv<BITS, 2, XL>(f, e, rows, x, xoff, x16, xs, qx, sx, xrow, li, L, vec, acc);
    else qk_moe_dot_bv<BITS, 1, XL>(f, e, rows, x, xoff, x16, xs, qx, sx, xrow, li, L, vec, acc);
}

template <int XL>
__device__ __forceinline__ void qk_moe_task_dot(int bits, int vw, const qk_moe_fc& f, int e, const int* rows,
                                                const void* x, qk_i64 xoff, int x16, const float4* xs, const qk_i8* qx,
                                                const float* sx, qk_i64 xrow, int li, int L, bool vec, float* acc) {
    if (bits == 4) qk_moe_dot_b<4, XL>(vw, f, e, rows, x, xoff, x16, xs, qx, sx, xrow, li, L, vec, acc);
    else if (bits == 8) qk_moe_dot_b<8, XL>(vw, f, e, rows, x, xoff, x16, xs, qx, sx, xrow, li, L, vec, acc);
    else qk_moe_dot_b<2, XL>(vw, f, e, rows, x, xoff, x16, xs, qx, sx, xrow, li, L, vec, acc);
}

/* the sum of a row's partial sums over its L lanes (a butterfly within the 32-lane group; every
 * lane ends with the same bits); all 32 lanes of the group take part */
__device__ __forceinline__ float qk_moe_group_sum(float a, int L) {
    for (int off = L / 2; off >= 1; off /= 2) a = QK_FADD(a, QK_SHFL_XOR(a, off, QK_MOE_GROUP));
    return a;
}

/* a row's bias, and a dot product plus it (qk_moe_reduce's rounding), apart so that the bias can be read
 * long before the sum is done (the matrix-unit kernels: read at a task's start, added at its end;
 * -DQK_MOE_BIAS_AT_END, bench-only, reads it at the end as before session 52: docs/perf-notes.md) */
__device__ __forceinline__ float qk_moe_bias_of(const qk_moe_fc& f, qk_i64 at) {
    return f.has_bias ? qk_ftz(qk_load_f(f.b, at, f.s16)) : 0.0f;
}
__device__ __forceinline__ float qk_moe_plus_bias(float a, const qk_moe_fc& f, float b) {
    return f.has_bias ? qk_ftz(QK_FADD(a, b)) : a;
}

/* a row's dot product plus its bias, read here */
__device__ __forceinline__ float qk_moe_biased(float a, const qk_moe_fc& f, qk_i64 at) {
    return qk_moe_plus_bias(a, f, qk_moe_bias_of(f, at));
}

/* a = b1 + b2 + b3 in bf16 (b1: a's upper 16 bits; r = a - b1 is exact and has at most 16 significant
 * bits; b2: r's upper 16; r - b2 has at most 8, so it is b3 itself), exactly for finite |a| >= 2^-103 as
 * built (flush-to-zero: r - b2 must stay a normal fp32; 2^-110 without it); below, what is lost is under
 * 2^-126 (tests/test_qmoe_bf16_split.py). Each part's bits in the low half; a not finite: a as bf16 (NaN
 * stays NaN), 0, 0 */
__device__ __forceinline__ void qk_moe_bf16x3(float a, qk_u32 p[3]) {
    const qk_u32 ab = qk_bits(a);
    if ((ab & 0x7F800000u) == 0x7F800000u) {
        p[0] = (ab >> 16) | ((ab & 0x007FFFFFu) ? 0x40u : 0u);
        p[1] = p[2] = 0u;
        return;
    }
    const float r = QK_FSUB(a, qk_float(ab & 0xFFFF0000u));
    const qk_u32 rb = qk_bits(r);
    p[0] = ab >> 16;
    p[1] = rb >> 16;
    p[2] = qk_bits(QK_FSUB(r, qk_float(rb & 0xFFFF0000u))) >> 16;
}

/* fc1's output u (of `units`) of (token, slot) pair p into qk_moe_fc2m's three bf16 planes of the pair:
 * plane q (0..2; 32 16-byte units a step of K: 32 ceil(units / 256) units) holds part q of each value,
 * 8-value unit u / 8 in the pairs (x0 x4) (x1 x5) (x2 x6) (x3 x7) as qk_moe_xpairs */
__device__ __forceinline__ void qk_moe_store_planes(qk_u16* P, qk_i64 p, int units, int u, float v) {
    const qk_i64 words = 32 * (qk_i64)((units + 255) / 256);
    qk_u32 pc[3];
    qk_moe_bf16x3(v, pc);
#pragma unroll
    for (int q = 0; q < 3; ++q) P[((p * 3 + q) * words + u / 8) * 8 + 2 * (u & 3) + ((u >> 2) & 1)] = (qk_u16)pc[q];
}

/* fc1's activation of unit u of pair p into A (at 0: in unit order; at > 0: chunk-transposed for fc2's
 * chunks of `at` values, qk_moe_apos; at < 0: qk_moe_fc2m's bf16 planes) */
__device__ __forceinline__ void qk_moe_store_a(float* A, qk_i64 p, int units, int u, int at, float v) {
    if (at < 0) { /* qk_moe_fc2m's bf16 planes (qk_moe_store_planes) */
        qk_moe_store_planes((qk_u16*)A, p, units, u, v);
        return;
    }
    A[p * units + (at ? qk_moe_apos(u, at, units) : u)] = v;
}

/* one fc1 task (a group of `lanes` lanes): units u0 .. u0 + 4 / f - 1 of expert e for the (token t,
 * slot) pair p (f 2 with SwiGLU: unit u's rows 2u gate, 2u + 1 linear), the activation into A's row
 * p (at 0: in unit order; else chunk-transposed for fc2's chunks of `at` values, qk_moe_apos). All
 * 32 lanes of the group call it; a task that is not live computes and writes nothing */
template <int XL>
__device__ __forceinline__ void qk_moe_fc1_task(const qk_moe_fc& f, int bits, int vw, bool vec, int e, qk_i64 u0,
                                                int units, bool live, const void* x, qk_i64 t, const float4* xs,
                                                const qk_i8* qx, const float* sx, int li, int lanes, float* A,
                                                qk_i64 p, int at, int act, float alpha, float beta, float limit) {
    const bool glu = act == QK_MOE_SWIGLU;
    const int fr = glu ? 2 : 1;
    int rows[QK_MOE_ROWS];
#pragma unroll
    for (int r = 0; r < QK_MOE_ROWS; ++r) {
        const int unit = (int)(u0 + r / fr < units ? u0 + r / fr : units - 1), half = r % fr;
        rows[r] = glu ? 2 * unit + half : unit;
    }
    float acc[QK_MOE_ROWS];
#pragma unroll
    for (int r = 0; r < QK_MOE_ROWS; ++r) acc[r] = 0.0f;
    /* f.s16: the input's dtype (the scales take the input's) */
    if (live) qk_moe_task_dot<XL>(bits, vw, f, e, rows, x, t * f.K, f.s16, xs, qx, sx, t, li, lanes, vec, acc);
#pragma unroll
    for (int r = 0; r < QK_MOE_ROWS; ++r) acc[r] = qk_moe_group_sum(acc[r], lanes);
    if (!live || li != 0) return;
#pragma unroll
    for (int i = 0; i < QK_MOE_ROWS; ++i) { /* row i: unit i (SwiGLU: even i, the gate; i + 1 its linear row) */
        const int i1 = i + 1 < QK_MOE_ROWS ? i + 1 : i, ui = glu ? i / 2 : i;
        if ((glu && (i & 1)) || u0 + ui >= units) continue;
        const float h = qk_moe_biased(acc[i], f, (qk_i64)e * f.N + rows[i]);
        const float l = glu ? qk_moe_biased(acc[i1], f, (qk_i64)e * f.N + rows[i1]) : 0.0f;
        qk_moe_store_a(A, p, units, (int)u0 + ui, at, qk_moe_act(act, h, l, alpha, beta, limit));
    }
}

/* routing + fc1 + the activation; A (T * k, units) fp32; a skipped slot (weight <= 1e-8) is neither
 * computed nor written. Default: grid (CTAs per token, T tokens); a CTA stages its token's input as
 * fp32 in shared memory (qk_moe_swz's order; dynamic shared memory of 16 * round8(K / 4) bytes,
 * none for the int8 product), routes once, and its lane groups take tasks (slot j, units) j-major,
 * the CTA's S task places at x * S, then x * S + gridDim.x * S, ... With -DQK_MOE_DECODE_V1: grid
 * (tiles of tasks, T * k pairs), one task per lane group, the input read from global memory */
extern "C" __global__ void __launch_bounds__(QK_MOE_BOUNDS)
qk_moe_fc1v(const void* x, const void* logits, const void* rw, int* sel, float* wts, const qk_u8* W, const void* S,
            const qk_u8* Z, const void* Bias, float* A, int E, int K, int N, int units, int k, int bits, int bs,
            int zp_bytes, int has_zp, int has_bias, int x16, int act, float alpha, float beta, float limit,
            int normalize, int has_rw, int lanes, int vw, int vec, const qk_i8* qx, const float* sx, int at) {
    __shared__ float s_logit[QK_MOE_EMAX];
    __shared__ int s_sel[QK_MOE_KMAX];
    __shared__ float s_w[QK_MOE_KMAX];
    const qk_moe_fc f = {W, S, Z, Bias, N, K, bs, zp_bytes, has_zp, has_bias, x16};
    const int per_task = QK_MOE_ROWS / (act == QK_MOE_SWIGLU ? 2 : 1);
    const int lane = (int)(threadIdx.x & (QK_MOE_GROUP - 1)), li = lane & (lanes - 1);
    const int me = (int)(threadIdx.x / QK_MOE_GROUP) * (QK_MOE_GROUP / lanes) + lane / lanes;
#ifdef QK_MOE_DECODE_V1
    const qk_i64 p = blockIdx.y, t = p / k;
    const int j = (int)(p - t * k);
    qk_moe_route_cta(logits, rw, t, E, k, normalize, has_rw, x16, s_logit, s_sel, s_w, qk_moe_no_stage());
    const int e = s_sel[j];
    const float w = s_w[j];
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        sel[p] = e;
        wts[p] = w;
    }
    if (!(w > QK_MOE_SKIP)) return; /* the whole CTA: no barrier follows */
    const qk_i64 tau = (qk_i64)blockIdx.x * (blockDim.x / QK_MOE_GROUP) * (QK_MOE_GROUP / lanes) + me;
    qk_moe_fc1_task<QK_MOE_XG>(f, bits, vw, vec != 0, e, tau * per_task, units, true, x, t, 0, qx, sx, li, lanes, A,
                               p, at, act, alpha, beta, limit);
#else
    extern __shared__ float4 qk_moe_xs[];
    const qk_i64 t = blockIdx.y;
    /* the input staged while the logits load; published by the routing's first barrier; the loads of 4
     * rounds in flight together */
    qk_moe_route_cta(logits, rw, t, E, k, normalize, has_rw, x16, s_logit, s_sel, s_w, [&] {
        if (!qx)
#pragma unroll 4
            for (int u = (int)threadIdx.x; u < K / 4; u += (int)blockDim.x) {
                float v[4];
                qk_moe_x4(x, t * K + 4 * u, x16, v);
                qk_moe_xs[qk_moe_swz(u)] = make_float4(v[0], v[1], v[2], v[3]);
            }
    });
    if (blockIdx.x == 0 && (int)threadIdx.x < k) {
        sel[t * k + threadIdx.x] = s_sel[threadIdx.x];
        wts[t * k + threadIdx.x] = s_w[threadIdx.x];
    }
    const int ntask = (units + per_task - 1) / per_task, total = k * ntask;
    const int places = (int)(blockDim.x / QK_MOE_GROUP) * (QK_MOE_GROUP / lanes);
    for (int base = (int)blockIdx.x * places; base < total; base += (int)gridDim.x * places) { /* CTA-uniform */
        const int tau = base + me < total ? base + me : total - 1, j = tau / ntask;
        const bool live = base + me < total && s_w[j] > QK_MOE_SKIP;
        qk_moe_fc1_task<QK_MOE_XS>(f, bits, vw, vec != 0, s_sel[j], (qk_i64)(tau - j * ntask) * per_task, units,
                                   live, x, t, qk_moe_xs, qx, sx, li, lanes, A, t * k + j, at, act, alpha, beta,
                                   limit);
    }
#endif
}

/* ---------------------------------------------------------------- fc1 on the matrix units
 * qk_moe_fc1m: the decode path's fc1 + activation where the input is fp16 and the weights 4-bit with
 * fp16 scales (the launcher's choice from the shape and dtypes; -DQK_MOE_FC1_SIMT in the build options
 * keeps qk_moe_fc1v). A weight row is read as 16-byte segments of 32 values (K a multiple of 32); a
 * step is 8 segments. A task (slot j, 16 rows) is split over `parts` warps, each a run of its steps
 * (qk_moe_fc1m_body); in a step, lane 4 g + t loads
 * segments 8 S + t and 8 S + 4 + t of rows g and g + 8 (two steps' loads in flight), converts each
 * word's value pairs to (q - z) exactly in fp16 (qk_and_or + qk_hfma2, as qk_moe_gemm_tile) and feeds
 * them to qk_mma_16816 as the A fragment; the B fragment holds the input (fp16, exact) only in column
 * t of lane t's segment (t + 4 for the second), zeros elsewhere, so column n of the fp32 accumulator
 * collects segment 8 S + n's partial dot product of each row. After a step each lane multiplies its
 * two columns by their blocks' scales into its row sums (fmaf); after the run the parts' sums are added
 * in part order, then the quad's four (xor 1, then 2), and the row's bias and the activation follow as
 * in qk_moe_fc1_task. The sums' order is fixed by the shape alone (repeat calls are bit-identical); it is not qk_moe_fc1v's order:
 * each segment's products are added in the tensor core's fp32 before its scale multiplies them, so
 * the weights are never rounded (fp32((q - z) s) of the reference differs by one rounding), checked
 * under the strict contract's bound like every other decode path. */
#define QK_MOE_SEGS 8 /* 32-value segments per step */

/* the staged input: 8-value word i as the pairs (x0 x4) (x1 x5) (x2 x6) (x3 x7), the order in which
 * a weight word's fields pair up (qk_moe_fc1m_word), so a B fragment is one 8-byte read */
__device__ __forceinline__ uint4 qk_moe_xpairs(uint4 q) {
    return make_uint4(QK_BYTE_PERM(q.x, q.z, 0x5410u), QK_BYTE_PERM(q.x, q.z, 0x7632u), QK_BYTE_PERM(q.y, q.w, 0x5410u),
                      QK_BYTE_PERM(q.y, q.w, 0x7632u));
}

/* word m (0..3, unrolled: a register) of a 16-byte load */
__device__ __forceinline__ qk_u32 qk_moe_word_of(const uint4& v, int m) {
    return m == 0 ? v.x : m == 1 ? v.y : m == 2 ? v.z : v.w;
}

/* (q - z) of a 4-bit word's value pairs, fields h = 0: (v0 v4) (v1 v5), h = 1: (v2 v6) (v3 v7), as exact
 * fp16 pairs: field bits OR 0x6400 is 1024 + q (or 1024 + 16 q), then one fp16 fma; ze / zo are
 * -(1024 + z) and -(64 + z) in both halves */
__device__ __forceinline__ void qk_moe_fc1m_word(qk_u32 w, int h, qk_u32 ze, qk_u32 zo, qk_u32* lo, qk_u32* hi) {
    const qk_u32 src = h ? w >> 8 : w;
    *lo = qk_hfma2(qk_and_or(src, 0x000F000Fu, 0x64006400u), 0x3C003C00u, ze);
    *hi = qk_hfma2(qk_and_or(src, 0x00F000F0u, 0x64006400u), 0x2C002C00u, zo);
}

/* bf16 (q - z) of field f (0..3: values f and f + 4) of a 4-bit word: field bits OR 0x4300 (bf16 128)
 * is 128 + q, then one bf16 fma adds zc = -(128 + z), both halves (exact) */
__device__ __forceinline__ qk_u32 qk_moe_bf_pair(qk_u32 w, int f, qk_u32 zc) {
    return qk_bfma2(qk_and_or(w >> (4 * f), 0x000F000Fu, 0x43004300u), 0x3F803F80u, zc);
}

/* the pair constants for zero point z: qk_moe_fc1m_word's -(1024 + z), -(64 + z) in fp16, or (BF16)
 * qk_moe_bf_pair's -(128 + z) in bf16 */
template <bool BF16>
__device__ __forceinline__ void qk_moe_fc1m_consts(qk_u32 z, qk_u32* ze, qk_u32* zo) {
    *ze = (BF16 ? 0xC300u + z : 0xE400u + z) * 0x10001u;
    *zo = (0xD400u + 16u * z) * 0x10001u;
}

/* the packed zero point of segment `seg` of row `row` (expert e, rr = e * N + row): block seg >> bsh,
 * or the row's */
__device__ __forceinline__ qk_u32 qk_moe_zero_of(const qk_moe_fc& f, int e, qk_i64 rr, int row, int seg, int bsh) {
    return (qk_u32)(f.bs ? qk_field(f.z + rr * f.zp_bytes, 4, seg >> bsh) : qk_field(f.z + (qk_i64)e * f.zp_bytes, 4, row));
}

/* one step's weights of a lane: segments 8 S + t, 8 S + 4 + t of rows g and g + 8 (zeros past the row),
 * their zero points' pair constants (ZP: packed zero points; else the default 8, constants), and the
 * fp16 scales of the segments 8 S + 2 t + i its accumulator columns take (loaded with the weights, so a
 * step's scales are in flight with its weights, not fetched after its mma) */
struct qk_moe_fc1m_step {
    uint4 w[2][2]; /* [row g / g + 8][first / second segment] */
    qk_u32 ze[2][2], zo[2][2];
    float s[2][2]; /* [row g / g + 8][column 2 t / 2 t + 1] */
};

/* a task's rows g and g + 8 (lane 4 g + t): rr = e * N + row, the weight rows (16-byte segments) and the
 * scale rows */
struct qk_moe_rows2 {
    qk_i64 rr[2];
    int row[2];
    const uint4* w[2];
    const qk_u16* s[2];
};

__device__ __forceinline__ qk_moe_rows2 qk_moe_rows_of(const qk_moe_fc& f, int e, int r0, int g, int blocks) {
    qk_moe_rows2 R;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        R.row[r] = r0 + g + 8 * r < f.N ? r0 + g + 8 * r : f.N - 1;
        R.rr[r] = (qk_i64)e * f.N + R.row[r];
        R.w[r] = (const uint4*)(f.w + R.rr[r] * (qk_i64)(f.K / 2));
        R.s[r] = (const qk_u16*)f.s + R.rr[r] * blocks;
    }
    return R;
}

/* segment seg's block: seg >> bsh (bsh = log2(block_size / 32); 31 for per-row scales: block 0) */
template <bool ZP, bool BF16>
__device__ __forceinline__ void qk_moe_fc1m_load(const qk_moe_fc& f, int e, const qk_moe_rows2& R, int S, int t,
                                                 int nseg, int bsh, qk_moe_fc1m_step& st) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int seg = QK_MOE_SEGS * S + 4 * h + t;
            st.w[r][h] = seg < nseg ? R.w[r][seg] : make_uint4(0u, 0u, 0u, 0u);
            qk_u32 z = 8u;
            if (ZP) z = qk_moe_zero_of(f, e, R.rr[r], R.row[r], seg < nseg ? seg : 0, bsh);
            qk_moe_fc1m_consts<BF16>(z, &st.ze[r][h], &st.zo[r][h]);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int seg = QK_MOE_SEGS * S + 2 * t + i;
            st.s[r][i] = seg < nseg ? qk_fp16_to_float(R.s[r][seg >> bsh]) : 0.0f;
        }
    }
}

/* the end of a step: each lane's two columns of c times their scales into its row sums */
__device__ __forceinline__ void qk_moe_fc1m_scale(const float c[4], const qk_moe_fc1m_step& st, float* acc) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        acc[0] = fmaf(c[i], st.s[0][i], acc[0]);
        acc[1] = fmaf(c[2 + i], st.s[1][i], acc[1]);
    }
}

/* the B fragments' source of lane 4 g + t for segments 8 S + 4 h + t: its segment's staged units
 * (uint2: word m, half h at 2 m + h) where column g of B is that segment's, the 8 zero units otherwise */
__device__ __forceinline__ const uint2* qk_moe_bsrc(const uint2* xp, const uint2* zero, int S, int h, int g, int t) {
    const bool mine = g == t + 4 * h; /* column g of B holds segment 8 S + g: lane t's (h 0) or t - 4's */
    return mine ? xp + 8 * (QK_MOE_SEGS * S + 4 * h + t) : zero;
}

/* one step: 16 mma in one chain into c (column n: segment 8 S + n; an h 0 mma adds zeros to columns 4..7,
 * an h 1 mma to 0..3, exactly), then qk_moe_fc1m_scale. B fragments from the staged input xp
 * (qk_moe_bsrc: every lane reads, none branches). One chain, not four added after the step: 12 fp32 adds
 * and 12 registers fewer (docs/perf-notes.md, session 20). */
__device__ __forceinline__ void qk_moe_fc1m_mma(const qk_moe_fc1m_step& st, const uint2* xp, const uint2* zero, int S,
                                                int g, int t, float* acc) {
    float c[4] = {};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const uint2* src = qk_moe_bsrc(xp, zero, S, h, g, t);
#pragma unroll
        for (int m = 0; m < 4; ++m)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                qk_u32 a[4];
                qk_moe_fc1m_word(qk_moe_word_of(st.w[0][h], m), half, st.ze[0][h], st.zo[0][h], &a[0], &a[2]);
                qk_moe_fc1m_word(qk_moe_word_of(st.w[1][h], m), half, st.ze[1][h], st.zo[1][h], &a[1], &a[3]);
                const uint2 v = src[2 * m + half];
                const qk_u32 b[2] = {v.x, v.y};
                qk_mma_16816(c, a, b);
            }
    }
    qk_moe_fc1m_scale(c, st, acc);
}

/* qk_moe_fc1m_mma for qk_moe_fc2m: the weights as bf16 (q - z) and the input as three bf16 parts (the
 * planes xp, xp + ps, xp + 2 ps), each part's mma into the same chain */
__device__ __forceinline__ void qk_moe_fc2m_mma(const qk_moe_fc1m_step& st, const uint2* xp, int ps, const uint2* zero,
                                                int S, int g, int t, float* acc) {
    float c[4] = {};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const uint2* src = qk_moe_bsrc(xp, zero, S, h, g, t);
        const int step = src != zero ? ps : 0;
#pragma unroll
        for (int m = 0; m < 4; ++m)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const qk_u32 w0 = qk_moe_word_of(st.w[0][h], m), w1 = qk_moe_word_of(st.w[1][h], m);
                const qk_u32 a[4] = {qk_moe_bf_pair(w0, 2 * half, st.ze[0][h]), qk_moe_bf_pair(w1, 2 * half, st.ze[1][h]),
                                     qk_moe_bf_pair(w0, 2 * half + 1, st.ze[0][h]),
                                     qk_moe_bf_pair(w1, 2 * half + 1, st.ze[1][h])};
#pragma unroll
                for (int p = 0; p < 3; ++p) {
                    const uint2 v = src[p * step + 2 * m + half];
                    const qk_u32 b[2] = {v.x, v.y};
                    qk_mma_16816_bf16(c, a, b);
                }
            }
    }
    qk_moe_fc1m_scale(c, st, acc);
}

/* a warp's run of one task (rows R of expert e) over steps [s_lo, s_hi), two steps' loads in flight:
 * the lane's row sums (before the quad's are added). BF16: qk_moe_fc2m_mma over the three planes of
 * ps uint2 units, else qk_moe_fc1m_mma. */
template <bool ZP, bool BF16>
__device__ __forceinline__ void qk_moe_m_run(const qk_moe_fc& f, int e, const qk_moe_rows2& R, const uint2* xp,
                                             int ps, const uint2* zero, int s_lo, int s_hi, int g, int t, int nseg,
                                             int bsh, float* acc) {
    if (s_lo >= s_hi) return;
    qk_moe_fc1m_step b0, b1;
    qk_moe_fc1m_load<ZP, BF16>(f, e, R, s_lo, t, nseg, bsh, b0);
    if (s_lo + 1 < s_hi) qk_moe_fc1m_load<ZP, BF16>(f, e, R, s_lo + 1, t, nseg, bsh, b1);
    for (int s = s_lo; s < s_hi; s += 2) {
        if (BF16) qk_moe_fc2m_mma(b0, xp, ps, zero, s, g, t, acc);
        else qk_moe_fc1m_mma(b0, xp, zero, s, g, t, acc);
        if (s + 2 < s_hi) qk_moe_fc1m_load<ZP, BF16>(f, e, R, s + 2, t, nseg, bsh, b0);
        if (s + 1 < s_hi) {
            if (BF16) qk_moe_fc2m_mma(b1, xp, ps, zero, s + 1, g, t, acc);
            else qk_moe_fc1m_mma(b1, xp, zero, s + 1, g, t, acc);
            if (s + 3 < s_hi) qk_moe_fc1m_load<ZP, BF16>(f, e, R, s + 3, t, nseg, bsh, b1);
        }
    }
}

/* log2(block_size / 32) (block_size a power of two >= 32), 31 for per-row scales */
__device__ __forceinline__ int qk_moe_seg_shift(int bs) { return bs ? 26 - __clz(bs) : 31; }

#define QK_MOE_M_WARPS 8 /* warps per CTA of qk_moe_fc1m / qk_moe_fc2m (256 threads) */
#define QK_MOE_F2_BATCH 4 /* qk_moe_fc2m's staging: words a thread loads before converting */

/* routing + fc1 + the activation on the matrix units (above); grid (CTAs per token, T tokens), dynamic
 * shared memory 512 bytes per step of K. `parts` warps (1, 2, 4 or 8; qmoe_tiling.mma_parts, a function
 * of the shape) share a task: part p takes steps [p steps / parts, (p + 1) steps / parts) and part 0
 * adds the parts' sums in part order (through shared memory), so the order is fixed by the shape. Task
 * slot q = warp / parts of CTA x takes tasks base + q G + x (G CTAs): every CTA, so every SM, busy. */
template <bool ZP>
__device__ __forceinline__ void qk_moe_fc1m_body(const void* x, const void* logits, const void* rw, int* sel,
                                                 float* wts, const qk_u8* W, const void* S, const qk_u8* Z,
                                                 const void* Bias, float* A, int E, int K, int N, int units, int k,
                                                 int bs, int zp_bytes, int has_zp, int has_bias, int act,
                                                 float alpha, float beta, float limit, int normalize, int has_rw,
                                                 int at, int parts) {
    __shared__ float s_logit[QK_MOE_EMAX];
    __shared__ int s_sel[QK_MOE_KMAX];
    __shared__ float s_w[QK_MOE_KMAX];
    __shared__ float s_part[QK_MOE_M_WARPS][2][32];
    __shared__ uint2 s_zero[8];
    extern __shared__ uint4 qk_moe_xw[];
    const qk_moe_fc f = {W, S, Z, Bias, N, K, bs, zp_bytes, has_zp, has_bias, 1};
    const qk_i64 t = blockIdx.y;
    const int nseg = K / 32, steps = (nseg + QK_MOE_SEGS - 1) / QK_MOE_SEGS, blocks = bs ? K / bs : 1;
    const int bsh = qk_moe_seg_shift(bs);
    QK_PHASE(0);
    if (threadIdx.x < 8) s_zero[threadIdx.x] = make_uint2(0u, 0u);
    /* the input's 8-value words (zeros past K) staged while the logits load; the loads of 2 rounds in
     * flight together */
    qk_moe_route_cta(logits, rw, t, E, k, normalize, has_rw, 1, s_logit, s_sel, s_w, [&] {
#pragma unroll 2
        for (int i = (int)threadIdx.x; i < steps * 32; i += (int)blockDim.x)
            qk_moe_xw[i] = i < K / 8 ? qk_moe_xpairs(((const uint4*)x)[t * (K / 8) + i]) : make_uint4(0u, 0u, 0u, 0u);
    });
    QK_PHASE(1);
    if (blockIdx.x == 0 && (int)threadIdx.x < k) {
        sel[t * k + threadIdx.x] = s_sel[threadIdx.x];
        wts[t * k + threadIdx.x] = s_w[threadIdx.x];
    }
    const bool glu = act == QK_MOE_SWIGLU;
    const int lane = (int)(threadIdx.x & 31), g = lane >> 2, tq = lane & 3, warp = (int)(threadIdx.x / 32);
    const int tiles = (N + 15) / 16, total = k * tiles, slots = QK_MOE_M_WARPS / parts;
    const int q = warp / parts, part = warp - q * parts;
    const int s_lo = part * steps / parts, s_hi = (part + 1) * steps / parts;
    for (int base = 0; base < total; base += (int)gridDim.x * slots) { /* the same trip count in every warp */
        const int task = base + q * (int)gridDim.x + (int)blockIdx.x;
        const int j = task < total ? task / tiles : 0, r0 = (task - j * tiles) * 16;
        const bool live = task < total && s_w[j] > QK_MOE_SKIP; /* the same in a task's parts */
        const qk_moe_rows2 R = qk_moe_rows_of(f, s_sel[j], r0, g, blocks);
        float acc[2] = {0.0f, 0.0f}, bias[2] = {0.0f, 0.0f};
#if !defined(QK_MOE_BIAS_AT_END)
        if (live && part == 0) /* its rows' biases in flight during the run (added after the parts' barriers) */
#pragma unroll
            for (int r = 0; r < 2; ++r) bias[r] = qk_moe_bias_of(f, R.rr[r]);
#endif
        if (live)
            qk_moe_m_run<ZP, false>(f, s_sel[j], R, (const uint2*)qk_moe_xw, 0, s_zero, s_lo, s_hi, g, tq, nseg, bsh,
                                    acc);
        if (base == 0) QK_PHASE_AFTER(2, __float_as_uint(acc[0]));
        if (parts > 1) { /* part 0 adds the parts in order */
            s_part[warp][0][lane] = acc[0];
            s_part[warp][1][lane] = acc[1];
            __syncthreads();
            if (part == 0)
#pragma unroll
                for (int r = 0; r < 2; ++r)
                    for (int p = 1; p < parts; ++p) acc[r] = QK_FADD(acc[r], s_part[warp + p][r][lane]);
            __syncthreads(); /* read before the next round's parts are stored */
        }
        if (!live || part != 0) continue;
        float h[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            acc[r] = QK_FADD(acc[r], QK_SHFL_XOR(acc[r], 1, 32));
            acc[r] = QK_FADD(acc[r], QK_SHFL_XOR(acc[r], 2, 32));
#if defined(QK_MOE_BIAS_AT_END)
            bias[r] = qk_moe_bias_of(f, R.rr[r]);
#endif
            h[r] = qk_moe_plus_bias(acc[r], f, bias[r]);
        }
        const qk_i64 p = t * k + j;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float l = QK_SHFL(h[r], (lane + 4) & 31, 32); /* row g + 1's (SwiGLU: the linear row) */
            const int row = r0 + g + 8 * r;
            if (tq != 0 || row >= N || (glu && (g & 1))) continue;
            const int u = glu ? row / 2 : row;
            if (u < units) qk_moe_store_a(A, p, units, u, at, qk_moe_act(act, h[r], glu ? l : 0.0f, alpha, beta, limit));
        }
    }
    QK_PHASE(3);
}

/* qk_moe_fc1m: default zero points (8); qk_moe_fc1m_z: packed zero points. No QK_LAUNCH_DEPENDENTS():
 * qk_moe_fc2m (its programmatic dependent) starts as these CTAs exit, 0.4 us faster than from their
 * start (docs/perf-notes.md session 29) */
#define QK_MOE_FC1M(NAME, ZP)                                                                                    \
    extern "C" __global__ void __launch_bounds__(256, 2)                                                        \
    NAME(const void* x, const void* logits, const void* rw, int* sel, float* wts, const qk_u8* W, const void* S, \
         const qk_u8* Z, const void* Bias, float* A, int E, int K, int N, int units, int k, int bs, int zp_bytes,  \
         int has_zp, int has_bias, int act, float alpha, float beta, float limit, int normalize, int has_rw,       \
         int at, int parts) {                                                                                    \
        qk_moe_fc1m_body<ZP>(x, logits, rw, sel, wts, W, S, Z, Bias, A, E, K, N, units, k, bs, zp_bytes, has_zp,  \
                             has_bias, act, alpha, beta, limit, normalize, has_rw, at, parts);                     \
    }
QK_MOE_FC1M(qk_moe_fc1m, false)
QK_MOE_FC1M(qk_moe_fc1m_z, true)

/* ---------------------------------------------------------------- fc2 on the matrix units
 * qk_moe_fc2m: the decode path's fc2 + the weighted sum where the input is fp16 (so the scales, bias and
 * output) and the weights 4-bit: fc1's fp32 output is carried exactly into the mma as three bf16
 * parts a = b1 + b2 + b3 (qk_moe_bf16x3; qk_moe_fc1m stores them as planes, qk_moe_store_planes), the
 * weights as exact bf16 (q - z), so every product is exact in fp32 and each 32-value segment's fp32 sum
 * (its three parts' mma in one chain) is times its scale, as in qk_moe_fc1m. A CTA takes 16 output
 * columns of one token for all k slots: it copies the token's 3 k planes into dynamic shared memory
 * (k x 3 x 512 bytes per step of K), then its warps take the (slot, part) pairs (parts: qmoe_tiling.fc2m_parts, a function of
 * the shape) round the warps; each pair's quad sums go to shared memory, and one thread per column adds
 * a slot's parts in part order, the bias, then the k slots' fp32(w * y) in selection order as
 * qk_moe_fc2v (no atomics: the order is fixed by the shape). The launcher's -DQK_MOE_FC2_SIMT keeps
 * qk_moe_fc2v. */

template <bool ZP>
__device__ __forceinline__ void qk_moe_fc2m_body(const uint4* planes, const int* sel, const float* wts, const qk_u8* W,
                                                 const void* S, const qk_u8* Z, const void* Bias, void* Y, int K,
                                                 int N, int k, int bs, int zp_bytes, int has_zp, int has_bias,
                                                 int parts) {
    __shared__ int s_sel[QK_MOE_KMAX];
    __shared__ float s_w[QK_MOE_KMAX];
    __shared__ float s_dot[QK_MOE_KMAX * 4][16]; /* (slot, part): the 16 columns' sums */
    __shared__ float s_bias[QK_MOE_KMAX][16];    /* (slot, column): the bias, read before the planes' copy */
    __shared__ uint2 s_zero[8];
    extern __shared__ uint4 qk_moe_xw[];
    const qk_moe_fc f = {W, S, Z, Bias, N, K, bs, zp_bytes, has_zp, has_bias, 1};
    const qk_i64 t = blockIdx.y;
    const int n0 = (int)blockIdx.x * 16;
    const int nseg = K / 32, steps = (nseg + QK_MOE_SEGS - 1) / QK_MOE_SEGS, blocks = bs ? K / bs : 1;
    const int words = steps * 32, bsh = qk_moe_seg_shift(bs); /* 16-byte units of a staged plane */
    QK_PHASE(13);
    if ((int)threadIdx.x < k) {
        s_sel[threadIdx.x] = sel[t * k + threadIdx.x];
        s_w[threadIdx.x] = wts[t * k + threadIdx.x];
    }
    if (threadIdx.x < 8) s_zero[threadIdx.x] = make_uint2(0u, 0u);
    __syncthreads();
    QK_PHASE(14);
    /* each live slot's bias of the CTA's columns, in flight during the copy below (two a thread: k <= 32) */
    float bias[2] = {0.0f, 0.0f};
#if !defined(QK_MOE_BIAS_AT_END)
#pragma unroll
    for (int u = 0; u < 2; ++u) {
        const int i = (int)threadIdx.x + u * (int)blockDim.x, j = i >> 4, c = i & 15;
        if (i < 16 * k && s_w[j] > QK_MOE_SKIP && n0 + c < N) bias[u] = qk_moe_bias_of(f, (qk_i64)s_sel[j] * N + n0 + c);
    }
#endif
    /* the token's 3 k planes (qk_moe_store_planes, written by qk_moe_fc1m) copied, zeros past K and for
     * skipped slots (whose planes fc1 never wrote); a thread loads QK_MOE_F2_BATCH units before it stores */
    const int n = 3 * k * words;
    const uint4* src = planes + t * n;
    for (int i0 = (int)threadIdx.x; i0 < n; i0 += QK_MOE_F2_BATCH * (int)blockDim.x) {
        uint4 v[QK_MOE_F2_BATCH];
#pragma unroll
        for (int b = 0; b < QK_MOE_F2_BATCH; ++b) {
            const int i = i0 + b * (int)blockDim.x, jp = i / words, u = i - jp * words;
            v[b] = i < n && u < K / 8 && s_w[jp / 3] > QK_MOE_SKIP ? src[i] : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int b = 0; b < QK_MOE_F2_BATCH; ++b)
            if (i0 + b * (int)blockDim.x < n) qk_moe_xw[i0 + b * (int)blockDim.x] = v[b];
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
        const int i = (int)threadIdx.x + u * (int)blockDim.x;
        if (i < 16 * k) s_bias[i >> 4][i & 15] = bias[u];
    }
    __syncthreads();
    QK_PHASE(15);
    const int lane = (int)(threadIdx.x & 31), g = lane >> 2, tq = lane & 3, warp = (int)(threadIdx.x / 32);
    for (int pi = warp; pi < k * parts; pi += QK_MOE_M_WARPS) {
        const int j = pi / parts, part = pi - j * parts;
        if (!(s_w[j] > QK_MOE_SKIP)) continue; /* the whole warp */
        const qk_moe_rows2 R = qk_moe_rows_of(f, s_sel[j], n0, g, blocks);
        float acc[2] = {0.0f, 0.0f};
        qk_moe_m_run<ZP, true>(f, s_sel[j], R, (const uint2*)(qk_moe_xw + 3 * j * words), 2 * words, s_zero,
                               part * steps / parts, (part + 1) * steps / parts, g, tq, nseg, bsh, acc);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            acc[r] = QK_FADD(acc[r], QK_SHFL_XOR(acc[r], 1, 32));
            acc[r] = QK_FADD(acc[r], QK_SHFL_XOR(acc[r], 2, 32));
            if (tq == 0) s_dot[pi][g + 8 * r] = acc[r];
        }
    }
    __syncthreads();
    QK_PHASE(16);
    const int c = (int)threadIdx.x;
    if (c >= 16 || n0 + c >= N) return;
    float out = 0.0f;
    for (int j = 0; j < k; ++j) {
        const float w = s_w[j];
        if (!(w > QK_MOE_SKIP)) continue;
        float d = s_dot[j * parts][c];
        for (int p = 1; p < parts; ++p) d = QK_FADD(d, s_dot[j * parts + p][c]);
#if defined(QK_MOE_BIAS_AT_END)
        const float y = qk_moe_biased(d, f, (qk_i64)s_sel[j] * N + n0 + c);
#else
        const float y = qk_moe_plus_bias(d, f, s_bias[j][c]);
#endif
        out = qk_ftz(QK_FADD(out, qk_ftz(QK_FMUL(w, y))));
    }
    qk_store_f(Y, t * N + n0 + c, out, 1);
    QK_PHASE(17);
}

/* qk_moe_fc2m: default zero points (8); qk_moe_fc2m_z: packed zero points. grid (ceil(N / 16), T) */
#define QK_MOE_FC2M(NAME, ZP)                                                                                    \
    extern "C" __global__ void __launch_bounds__(256, 2)                                                        \
    NAME(const uint4* planes, const int* sel, const float* wts, const qk_u8* W, const void* S, const qk_u8* Z,   \
         const void* Bias, void* Y, int K, int N, int k, int bs, int zp_bytes, int has_zp, int has_bias,          \
         int parts) {                                                                                            \
        QK_PHASE(12);                                                                                            \
        QK_WAIT_PRIOR_GRID(); /* launched as a dependent of fc1: its routing and planes */                       \
        qk_moe_fc2m_body<ZP>(planes, sel, wts, W, S, Z, Bias, Y, K, N, k, bs, zp_bytes, has_zp, has_bias, parts); \
    }
#if defined(QK_CUDA) /* NVIDIA only: AMD has no bf16 mma here, and the shuffled form of fc2m's 96 mma a loop made a
                       * gfx90a build of this file take tens of minutes; the launcher keeps qk_moe_fc2v there */
QK_MOE_FC2M(qk_moe_fc2m, false)
QK_MOE_FC2M(qk_moe_fc2m_z, true)
#endif

/* fc2 + the weighted sum. grid (tiles of `tile` output columns, T tokens); the CTA's tasks (slot j,
 * 4 columns) go round its 32-lane groups, each column's fp32(dot + bias) into shared memory; then
 * one thread per column adds the k slots in selection order, each fp32(w * y) (skipped slots add
 * nothing), and stores the sum once */
extern "C" __global__ void __launch_bounds__(QK_MOE_BOUNDS)
qk_moe_fc2v(const float* A, const int* sel, const float* wts, const qk_u8* W, const void* S, const qk_u8* Z,
            const void* Bias, void* Y, int K, int N, int k, int bits, int bs, int zp_bytes, int has_zp, int has_bias,
            int x16, int lanes, int vw, int vec, int tile, const qk_i8* qx, const float* sx) {
    __shared__ float s_y[QK_MOE_YMAX];
    __shared__ int s_sel[QK_MOE_KMAX];
    __shared__ float s_w[QK_MOE_KMAX];
    const qk_i64 t = blockIdx.y;
    const int n0 = (int)blockIdx.x * tile;
    if ((int)threadIdx.x < k) {
        s_sel[threadIdx.x] = sel[t * k + threadIdx.x];
        s_w[threadIdx.x] = wts[t * k + threadIdx.x];
    }
    __syncthreads();
    const qk_moe_fc f = {W, S, Z, Bias, N, K, bs, zp_bytes, has_zp, has_bias, x16};
    const int lane = (int)(threadIdx.x & (QK_MOE_GROUP - 1)), li = lane & (lanes - 1);
    const int slots = (int)(blockDim.x / QK_MOE_GROUP) * (QK_MOE_GROUP / lanes), quads = tile / QK_MOE_ROWS;
    const int tasks = k * quads, me = (int)(threadIdx.x / QK_MOE_GROUP) * (QK_MOE_GROUP / lanes) + lane / lanes;
    for (int base = 0; base < tasks; base += slots) { /* the same trip count in every lane */
        const int tau = base + me < tasks ? base + me : tasks - 1, j = tau / quads, c0 = n0 + (tau - j * quads) * 4;
        const bool live = base + me < tasks && s_w[j] > QK_MOE_SKIP;
        const int e = s_sel[j];
        int rows[QK_MOE_ROWS];
        float acc[QK_MOE_ROWS];
#pragma unroll
        for (int r = 0; r < QK_MOE_ROWS; ++r) {
            rows[r] = c0 + r < N ? c0 + r : N - 1;
            acc[r] = 0.0f;
        }
        const qk_i64 pj = t * k + j;
        if (live)
            qk_moe_task_dot<QK_MOE_FC2_XL>(bits, vw, f, e, rows, A, pj * K, 0, 0, qx, sx, pj, li, lanes, vec != 0, acc);
#pragma unroll
        for (int r = 0; r < QK_MOE_ROWS; ++r) acc[r] = qk_moe_group_sum(acc[r], lanes);
        if (live && li == 0) {
#pragma unroll
            for (int r = 0; r < QK_MOE_ROWS; ++r)
                if (c0 + r < N) s_y[j * tile + c0 - n0 + r] = qk_moe_biased(acc[r], f, (qk_i64)e * N + c0 + r);
        }
    }
    __syncthreads();
    for (int i = (int)threadIdx.x; i < tile && n0 + i < N; i += (int)blockDim.x) {
        float out = 0.0f;
        for (int j = 0; j < k; ++j) {
            const float w = s_w[j];
            if (w > QK_MOE_SKIP) out = qk_ftz(QK_FADD(out, qk_ftz(QK_FMUL(w, s_y[j * tile + i]))));
        }
        qk_store_f(Y, t * N + n0 + i, out, x16);
    }
}

/* ================================================================ grouped GEMM (storage=fp16)
 * qmoe_ragged_mm under the contract storage=fp16 (qconform.device.ort.qmoe, docs/contracts.md
 * "GroupQueryAttention and QMoE"): routing as qk_moe_route; the live (token, slot) pairs grouped
 * per expert in pair order (qk_moe_gcount, qk_moe_gscatter: counts, exclusive scans, a stable
 * scatter; integer sums only, no atomics); fc1 and fc2 as grouped GEMMs on the matrix units
 * (qk_moe_gemm1 / qk_moe_gemm2: a CTA takes QK_MOE_GM pairs of one expert x QK_MOE_GN weight rows,
 * qk_mma_16816 fp16 x fp16 -> fp32); then qk_moe_combine adds each token's k slots in selection
 * order. The fc inputs are held in fp16 (the input, fc1's output after the activation); a weight
 * enters the product as (q - z), exact in fp16, and its scale multiplies the fp32 partial sum of
 * its quantization block (per-row scales: the row's whole sum), so no dequantized weight is
 * rounded. Every sum's order is fixed by the tiling, so repeat calls are bit-identical. With
 * -DQK_MOE_RAGGED_V1 in the build options the launcher runs the per-token kernels instead. */
#define QK_MOE_GM 64   /* routed pairs of one expert per CTA */
#define QK_MOE_GN 64   /* weight rows per CTA */
#define QK_MOE_GK 64   /* K values per stage (two sub-chunks of 32: a quantization block is >= 32) */
#define QK_MOE_GT 128  /* threads: 4 groups of 32 lanes, 2 x 2, each 32 pairs x 32 rows */
#define QK_MOE_GPAD 72 /* a staged row in halves: 36 words, so the fragment loads hit 32 banks */
#define QK_MOE_GPER 8  /* pairs per thread and pass of the scatter */

/* the sum of v over the CTA's 256 threads (integers: any order is exact), in every thread */
__device__ __forceinline__ int qk_moe_cta_sum(int v, int* s) {
    __syncthreads();
    s[threadIdx.x] = v;
    __syncthreads();
    for (int h = 128; h > 0; h >>= 1) {
        if ((int)threadIdx.x < h) s[threadIdx.x] += s[threadIdx.x + h];
        __syncthreads();
    }
    return s[0];
}

/* the number of live pairs (weight > QK_MOE_SKIP) routed to expert blockIdx.x; 256 threads */
extern "C" __global__ void __launch_bounds__(256)
qk_moe_gcount(const int* sel, const float* wts, int* counts, int P) {
    __shared__ int s_sum[256];
    const int e = (int)blockIdx.x;
    int c = 0;
    for (int p = (int)threadIdx.x; p < P; p += 256) c += sel[p] == e && wts[p] > QK_MOE_SKIP;
    c = qk_moe_cta_sum(c, s_sum);
    if (threadIdx.x == 0) counts[e] = c;
}

/* expert e = blockIdx.x: offs[e] = the live pairs of experts < e, tiles[e] = their tiles of
 * QK_MOE_GM pairs (offs[E], tiles[E]: the totals), and its live pairs' indices t * k + j in
 * increasing order to order[offs[e] ...] (stable: a pass of 256 * QK_MOE_GPER pairs, each thread
 * its QK_MOE_GPER consecutive pairs, ranked by an exclusive scan of the threads' counts) */
extern "C" __global__ void __launch_bounds__(256)
qk_moe_gscatter(const int* sel, const float* wts, const int* counts, int* order, int* offs, int* tiles, int P,
                int E) {
    __shared__ int s_sum[256];
    __shared__ int s_scan[256];
    const int e = (int)blockIdx.x, tid = (int)threadIdx.x;
    int o = 0, tl = 0;
    for (int i = tid; i < e; i += 256) {
        o += counts[i];
        tl += (counts[i] + QK_MOE_GM - 1) / QK_MOE_GM;
    }
    o = qk_moe_cta_sum(o, s_sum);
    tl = qk_moe_cta_sum(tl, s_sum);
    const int mine = counts[e];
    if (tid == 0) {
        offs[e] = o;
        tiles[e] = tl;
        if (e == E - 1) {
            offs[E] = o + mine;
            tiles[E] = tl + (mine + QK_MOE_GM - 1) / QK_MOE_GM;
        }
    }
    int base = o;
    for (int p0 = 0; p0 < P; p0 += 256 * QK_MOE_GPER) {
        const int first = p0 + tid * QK_MOE_GPER;
        int n = 0;
        for (int i = 0; i < QK_MOE_GPER; ++i) {
            const int p = first + i;
            n += p < P && sel[p] == e && wts[p] > QK_MOE_SKIP;
        }
        __syncthreads();
        s_scan[tid] = n;
        __syncthreads();
        for (int off = 1; off < 256; off <<= 1) { /* inclusive scan (Hillis-Steele) */
            const int v = tid >= off ? s_scan[tid - off] : 0;
            __syncthreads();
            s_scan[tid] += v;
            __syncthreads();
        }
        int at = base + s_scan[tid] - n;
        for (int i = 0; i < QK_MOE_GPER; ++i) {
            const int p = first + i;
            if (p < P && sel[p] == e && wts[p] > QK_MOE_SKIP) order[at++] = p;
        }
        base += s_scan[255];
    }
}

/* fc1's input as fp16 rows of Kp values (Kp a multiple of QK_MOE_GK), zeros past K: one thread
 * per element of X16 (T, Kp) */
extern "C" __global__ void __launch_bounds__(256)
qk_moe_stage_x(const void* x, qk_u16* X16, qk_i64 T, int K, int Kp, int x16) {
    const qk_i64 i = qk_global_thread();
    if (i >= T * Kp) return;
    const qk_i64 t = i / Kp;
    const int c = (int)(i - t * Kp);
    X16[i] = c < K ? qk_fp16_bits(qk_load_f(x, t * K + c, x16)) : (qk_u16)0;
}

/* the CTA's tile: expert *e, pairs [*m0, *m1) of the grouped order; false past the last tile */
__device__ __forceinline__ bool qk_moe_tile(const int* offs, const int* tiles, int E, int* e, int* m0, int* m1) {
    const int i = (int)blockIdx.x;
    if (i >= tiles[E]) return false;
    int lo = 0, hi = E - 1; /* the last expert whose first tile is <= i (experts without pairs have none) */
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (tiles[mid] <= i) lo = mid;
        else hi = mid - 1;
    }
    *e = lo;
    *m0 = offs[lo] + (i - tiles[lo]) * QK_MOE_GM;
    *m1 = offs[lo + 1];
    return true;
}

#ifdef QK_MOE_GEMM_V1
#include "qmoe_gemm_v1.h"
#else
#if defined(QK_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(QK_MMA_EMULATE)
#define QK_MOE_LDMATRIX 1 /* the fragments by ldmatrix and a block's first mma from a zero C (sm_80+) */
#endif

/* the four 8 x 8 fp16 matrices of rows r0..r0+15 and columns c0..c0+15 of a [row][QK_MOE_GPAD]
 * shared tile in qk_mma_16816's A layout: f[i] = T[r0 + 8 (i & 1) + g][c0 + 8 (i >> 1) + 2t ..+1]
 * (B of rows n..n+15: b[ni][0] = f[0], b[ni][1] = f[2], b[ni + 1][0] = f[1], b[ni + 1][1] = f[3]).
 * PTX ISA "ldmatrix": lanes 8i..8i+7 give the row addresses of matrix i, lane l receives row l / 4,
 * halves 2 (l % 4) and 2 (l % 4) + 1 of each; elsewhere four 32-bit shared loads of the same words */
__device__ __forceinline__ void qk_moe_frag(qk_u32 f[4], const qk_u16 (*T)[QK_MOE_GPAD], int r0, int c0) {
    const int lane = (int)(threadIdx.x & 31);
#ifdef QK_MOE_LDMATRIX
    qk_ldmatrix_x4(f, &T[r0 + (lane & 7) + ((lane >> 3) & 1) * 8][c0 + (lane >> 4) * 8]);
#else
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = *(const qk_u32*)&T[r0 + 8 * (i & 1) + g][c0 + 8 * (i >> 1) + 2 * t];
#endif
}

/* d = a b + 0: qk_mma_16816 from a zero accumulator (the same sum as from registers holding +0) */
__device__ __forceinline__ void qk_moe_mma0(float d[4], const qk_u32 a[4], const qk_u32 b[2]) {
#ifdef QK_MOE_LDMATRIX
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %10, %10, %10};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(0.0f));
#else
    d[0] = d[1] = d[2] = d[3] = 0.0f;
    qk_mma_16816(d, a, b);
#endif
}

/* one projection of expert e for the CTA's pairs: acc[mi][ni][4] (this lane's mma fragments of its
 * group's 32 pairs x 32 rows) = sum over the quantization blocks of fp32(scale) * the fp32 mma sum
 * of x (q - z) over the block. X: fp16 rows of Kp values, s_src: the X row of each tile row
 * (qk_moe_rows; rows past the pairs repeat the first one, never stored). Stages of QK_MOE_GK values: the next stage's words loaded into registers while
 * the current one is multiplied. The same fragments, mma calls and folds in the same order as
 * -DQK_MOE_GEMM_V1 (qmoe_gemm_v1.h); fewer instructions: ldmatrix fragments, each block's sums
 * started by an mma from zero (no resets), the block of each chunk by counters (no divisions),
 * a word's codes paired (k, k + PER / 2) by one mask each and the halves permuted after the
 * subtraction (the same fp16 values) */
template <int BITS>
__device__ __forceinline__ void qk_moe_gemm_tile(const qk_moe_fc& f, int e, int n0, const qk_u16* X, int Kp,
                                                 const int* s_src, qk_u16 (*Xs)[QK_MOE_GPAD],
                                                 qk_u16 (*Ws)[QK_MOE_GPAD], float (*Ss)[QK_MOE_GN],
                                                 float acc[2][4][4]) {
    constexpr int PER = 32 / BITS, HP = PER / 2, WPR = QK_MOE_GK / PER, NW = QK_MOE_GN * WPR / QK_MOE_GT;
    constexpr int RS = QK_MOE_GT / WPR; /* weight rows between a thread's words */
    const int tid = (int)threadIdx.x, lane = tid & 31, grp = tid >> 5, t = lane & 3;
    const int wm = (grp >> 1) * 32, wn = (grp & 1) * 32;
    const int words = f.K / PER, blocks = f.bs ? f.K / f.bs : 1;
    const int cpb = f.bs ? f.bs / 32 : 0x7fffffff; /* 32-value chunks a quantization block (bs % 32 == 0) */
    const qk_u32 m2 = ((1u << BITS) - 1u) * 0x10001u;
    const int xc = tid & 7, wr0 = tid / WPR, ww = tid % WPR, sn = tid & (QK_MOE_GN - 1), sh = tid / QK_MOE_GN;
    const qk_u32* wq = (const qk_u32*)f.w + ((qk_i64)e * f.N + n0 + wr0) * words + ww;
    const qk_i64 rstep = (qk_i64)RS * words;
    const qk_i64 srow = ((qk_i64)e * f.N + n0 + sn) * blocks;
    int sblk = 0, srem = 32 * sh; /* the block of value k0 + 32 sh (the next fetch's) and its offset in it */
    while (f.bs && srem >= f.bs) {
        srem -= f.bs;
        ++sblk;
    }
    int ci = 0; /* the current chunk's index in its quantization block */
    uint4 xr[4];
    qk_u32 wr[NW], zr[(NW + 1) / 2]; /* zr: word j's -(1024 + z) in half j % 2 of zr[j / 2] */
    float sr;
    float part[2][4][4]; /* the current quantization block's fp32 sums, carried across chunks and stages */
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
            for (int v = 0; v < 4; ++v) part[mi][ni][v] = 0.0f; /* set by each block's first mma */
    auto fetch = [&](int k0) {
#pragma unroll
        for (int j = 0; j < 4; ++j) /* tile row (tid + QK_MOE_GT j) / 8: its X row (qk_moe_rows: always one) */
            xr[j] = *(const uint4*)(X + (qk_i64)s_src[(tid >> 3) + 16 * j] * Kp + k0 + 8 * xc);
#pragma unroll
        for (int j = 0; j < NW; ++j) {
            const int w = k0 / PER + ww, n = n0 + wr0 + RS * j;
            const bool in = n < f.N && w < words;
            wr[j] = in ? wq[j * rstep + k0 / PER] : 0u;
            int z = 1 << (BITS - 1);
            if (in && f.has_zp) {
                const qk_i64 rr = (qk_i64)e * f.N + n;
                z = f.bs ? qk_field(f.z + rr * f.zp_bytes, BITS, w * PER / f.bs)
                         : qk_field(f.z + (qk_i64)e * f.zp_bytes, BITS, n);
            }
            const qk_u32 zh = 0xE400u | (in ? (qk_u32)z : 0u); /* -(1024 + z) as fp16; a word outside: q = z = 0 */
            zr[j / 2] = (j & 1) ? zr[j / 2] | (zh << 16) : zh;
        }
        const int kk = k0 + 32 * sh, n = n0 + sn;
        sr = n < f.N && kk < f.K ? qk_ftz(qk_load_f(f.s, srow + sblk, f.s16)) : 0.0f;
        srem += QK_MOE_GK;
        while (f.bs && srem >= f.bs) {
            srem -= f.bs;
            ++sblk;
        }
    };
    fetch(0);
    for (int k0 = 0; k0 < f.K; k0 += QK_MOE_GK) {
#pragma unroll
        for (int j = 0; j < 4; ++j) *(uint4*)&Xs[(tid >> 3) + 16 * j][8 * xc] = xr[j];
#pragma unroll
        for (int j = 0; j < NW; ++j) {
            const qk_u32 nz = QK_BYTE_PERM(zr[j / 2], 0u, (j & 1) ? 0x3232u : 0x1010u); /* in both halves */
            qk_u32 p[HP], d[HP];
#pragma unroll
            for (int i = 0; i < HP; ++i) /* codes i and i + PER / 2: (1024 + q) - (1024 + z), exact in fp16 */
                p[i] = qk_hfma2(0x64006400u | ((wr[j] >> (BITS * i)) & m2), 0x3C003C00u, nz);
#pragma unroll
            for (int i = 0; i < HP; i += 2) { /* back to code order: (2i, 2i + 1) */
                d[i / 2] = QK_BYTE_PERM(p[i], p[i + 1], 0x5410u);          /* the low halves */
                d[HP / 2 + i / 2] = QK_BYTE_PERM(p[i], p[i + 1], 0x7632u); /* the high halves */
            }
            qk_u16* dst = &Ws[wr0 + RS * j][ww * PER];
            if (PER == 4) {
                *(uint2*)dst = make_uint2(d[0], d[1 % HP]);
            } else {
#pragma unroll
                for (int i = 0; i < HP; i += 4)
                    *(uint4*)(dst + 2 * i) = make_uint4(d[i % HP], d[(i + 1) % HP], d[(i + 2) % HP], d[(i + 3) % HP]);
            }
        }
        Ss[sh][sn] = sr;
        __syncthreads();
        if (k0 + QK_MOE_GK < f.K) fetch(k0 + QK_MOE_GK);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int kk = k0 + 32 * h;
            if (kk >= f.K) continue; /* h = 1 past K: the last trip (a break would stop clang unrolling it) */
            const bool fresh = ci == 0; /* the block's first chunk: its sums start from zero */
#pragma unroll
            for (int ks = 0; ks < 32; ks += 16) {
                const int c0 = 32 * h + ks;
                qk_u32 a[2][4], b[4][2], fb[4];
                qk_moe_frag(a[0], Xs, wm, c0);
                qk_moe_frag(a[1], Xs, wm + 16, c0);
#pragma unroll
                for (int q = 0; q < 2; ++q) {
                    qk_moe_frag(fb, Ws, wn + 16 * q, c0);
                    b[2 * q][0] = fb[0];
                    b[2 * q][1] = fb[2];
                    b[2 * q + 1][0] = fb[1];
                    b[2 * q + 1][1] = fb[3];
                }
                if (ks == 0 && fresh) {
#pragma unroll
                    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                        for (int ni = 0; ni < 4; ++ni) qk_moe_mma0(part[mi][ni], a[mi], b[ni]);
                } else {
#pragma unroll
                    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                        for (int ni = 0; ni < 4; ++ni) qk_mma_16816(part[mi][ni], a[mi], b[ni]);
                }
            }
            const bool last = kk + 32 >= f.K || ci == cpb - 1; /* the block's last chunk */
            if (last) {
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) {
                    const float s0 = Ss[h][wn + 8 * ni + 2 * t], s1 = Ss[h][wn + 8 * ni + 2 * t + 1];
#pragma unroll
                    for (int mi = 0; mi < 2; ++mi) {
                        acc[mi][ni][0] = fmaf(s0, part[mi][ni][0], acc[mi][ni][0]);
                        acc[mi][ni][1] = fmaf(s1, part[mi][ni][1], acc[mi][ni][1]);
                        acc[mi][ni][2] = fmaf(s0, part[mi][ni][2], acc[mi][ni][2]);
                        acc[mi][ni][3] = fmaf(s1, part[mi][ni][3], acc[mi][ni][3]);
                    }
                }
            }
            ci = last ? 0 : ci + 1;
        }
        __syncthreads();
    }
}
#endif

/* a grouped GEMM CTA's shared memory (19.5 KB) */
struct qk_moe_gsmem {
    __align__(16) qk_u16 xs[QK_MOE_GM][QK_MOE_GPAD]; /* the stage's fp16 inputs, a row per pair */
    __align__(16) qk_u16 ws[QK_MOE_GN][QK_MOE_GPAD]; /* the stage's q - z in fp16, a row per weight row */
    float ss[2][QK_MOE_GN];                          /* each 32-value chunk's scale per weight row */
    int src[QK_MOE_GM], pair[QK_MOE_GM];
};

/* the CTA's tile set-up: s_src (the X row of each tile row: fc1 the pair's token, fc2 the pair's
 * grouped position; past the expert's pairs -1 with -DQK_MOE_GEMM_V1 (zeros), else the tile's
 * first row's: an mma's output row depends on its own A row only, and those rows are never
 * stored), s_pair (the pair t * k + j; -1 past the expert's pairs) */
__device__ __forceinline__ void qk_moe_rows(const int* order, int m0, int m1, int k, int fc, int* s_src, int* s_pair) {
    for (int r = (int)threadIdx.x; r < QK_MOE_GM; r += (int)blockDim.x) {
        const int m = m0 + r, p = m < m1 ? order[m] : -1;
        s_pair[r] = p;
#ifdef QK_MOE_GEMM_V1
        s_src[r] = p < 0 ? -1 : (fc == 1 ? p / k : m);
#else
        s_src[r] = p < 0 ? (fc == 1 ? order[m0] / k : m0) : (fc == 1 ? p / k : m);
#endif
    }
    __syncthreads();
}

template <int BITS>
__device__ __forceinline__ void qk_moe_gemm1_b(qk_moe_gsmem& sm, const qk_moe_fc& f, const qk_u16* X, int Kp, const int* order,
                                               const int* offs, const int* tiles, int E, int k, qk_u16* A, int Ap,
                                               int act, float alpha, float beta, float limit) {
    int e, m0, m1;
    if (!qk_moe_tile(offs, tiles, E, &e, &m0, &m1)) return; /* the whole CTA: no barrier follows */
    const int n0 = (int)blockIdx.y * QK_MOE_GN;
    qk_moe_rows(order, m0, m1, k, 1, sm.src, sm.pair);
    float acc[2][4][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
            for (int v = 0; v < 4; ++v) acc[mi][ni][v] = 0.0f;
    qk_moe_gemm_tile<BITS>(f, e, n0, X, Kp, sm.src, sm.xs, sm.ws, sm.ss, acc);
    const int lane = (int)threadIdx.x & 31, grp = (int)threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int wm = (grp >> 1) * 32, wn = (grp & 1) * 32;
    const bool glu = act == QK_MOE_SWIGLU;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int m = m0 + wm + 16 * mi + 8 * hh + g;
            if (m >= m1) continue;
#pragma unroll
            for (int ni = 0; ni < 4; ++ni) {
                const int c = n0 + wn + 8 * ni + 2 * t; /* even: with SwiGLU the gate, c + 1 its linear row */
                if (c >= f.N) continue;
                const float h0 = qk_moe_biased(acc[mi][ni][2 * hh], f, (qk_i64)e * f.N + c);
                if (glu) {
                    const float l = qk_moe_biased(acc[mi][ni][2 * hh + 1], f, (qk_i64)e * f.N + c + 1);
                    A[(qk_i64)m * Ap + c / 2] = qk_fp16_bits(qk_moe_act(act, h0, l, alpha, beta, limit));
                } else {
                    A[(qk_i64)m * Ap + c] = qk_fp16_bits(qk_moe_act(act, h0, 0.0f, alpha, beta, limit));
                    if (c + 1 < f.N) {
                        const float h1 = qk_moe_biased(acc[mi][ni][2 * hh + 1], f, (qk_i64)e * f.N + c + 1);
                        A[(qk_i64)m * Ap + c + 1] = qk_fp16_bits(qk_moe_act(act, h1, 0.0f, alpha, beta, limit));
                    }
                }
            }
        }
}

template <int BITS>
__device__ __forceinline__ void qk_moe_gemm2_b(qk_moe_gsmem& sm, const qk_moe_fc& f, const qk_u16* A, int Ap, const int* order,
                                               const int* offs, const int* tiles, int E, int k, float* Y) {
    int e, m0, m1;
    if (!qk_moe_tile(offs, tiles, E, &e, &m0, &m1)) return; /* the whole CTA: no barrier follows */
    const int n0 = (int)blockIdx.y * QK_MOE_GN;
    qk_moe_rows(order, m0, m1, k, 2, sm.src, sm.pair);
    float acc[2][4][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
            for (int v = 0; v < 4; ++v) acc[mi][ni][v] = 0.0f;
    qk_moe_gemm_tile<BITS>(f, e, n0, A, Ap, sm.src, sm.xs, sm.ws, sm.ss, acc);
    const int lane = (int)threadIdx.x & 31, grp = (int)threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int wm = (grp >> 1) * 32, wn = (grp & 1) * 32;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int r = wm + 16 * mi + 8 * hh + g, p = sm.pair[r];
            if (p < 0) continue;
#pragma unroll
            for (int ni = 0; ni < 4; ++ni) {
                const int c = n0 + wn + 8 * ni + 2 * t;
#pragma unroll
                for (int v = 0; v < 2; ++v)
                    if (c + v < f.N) Y[(qk_i64)p * f.N + c + v] = qk_moe_biased(acc[mi][ni][2 * hh + v], f, (qk_i64)e * f.N + c + v);
            }
        }
}

/* fc1 + bias + the activation of the grouped pairs (qk_moe_gemm1_u<bits>): grid (tiles bound, fc1
 * rows / QK_MOE_GN); A (pairs in grouped order, Ap fp16 values: the activation of unit u at column
 * u). fc2 + bias (qk_moe_gemm2_u<bits>): grid (tiles bound, H / QK_MOE_GN); Y (T * k pairs, H) fp32
 * in pair order (rows of skipped pairs are not written). A kernel per bit width: one instantiation's
 * registers each */
#define QK_MOE_GEMM(B)                                                                                          \
    extern "C" __global__ void __launch_bounds__(QK_MOE_GT, 3)                                                  \
    qk_moe_gemm1_u##B(const qk_u16* X, int Kp, const int* order, const int* offs, const int* tiles, int E,     \
                      int k, const qk_u8* W, const void* S, const qk_u8* Z, const void* Bias, int N, int K,   \
                      int bs, int zp_bytes, int has_zp, int has_bias, int s16, qk_u16* A, int Ap, int act,    \
                      float alpha, float beta, float limit) {                                                 \
        __shared__ qk_moe_gsmem sm;                                                                           \
        const qk_moe_fc f = {W, S, Z, Bias, N, K, bs, zp_bytes, has_zp, has_bias, s16};                      \
        qk_moe_gemm1_b<B>(sm, f, X, Kp, order, offs, tiles, E, k, A, Ap, act, alpha, beta, limit);           \
    }                                                                                                         \
    extern "C" __global__ void __launch_bounds__(QK_MOE_GT, 3)                                                  \
    qk_moe_gemm2_u##B(const qk_u16* A, int Ap, const int* order, const int* offs, const int* tiles, int E,     \
                      int k, const qk_u8* W, const void* S, const qk_u8* Z, const void* Bias, int N, int K,   \
                      int bs, int zp_bytes, int has_zp, int has_bias, int s16, float* Y) {                    \
        __shared__ qk_moe_gsmem sm;                                                                           \
        const qk_moe_fc f = {W, S, Z, Bias, N, K, bs, zp_bytes, has_zp, has_bias, s16};                      \
        qk_moe_gemm2_b<B>(sm, f, A, Ap, order, offs, tiles, E, k, Y);                                         \
    }
QK_MOE_GEMM(2)
QK_MOE_GEMM(4)
QK_MOE_GEMM(8)

/* the output: one thread per (token t, column n), the k slots in selection order, each
 * fp32(w * y) added in fp32 (skipped slots add nothing: qk_moe_fc2v's sum), rounded once */
extern "C" __global__ void __launch_bounds__(256)
qk_moe_combine(const float* Y, const float* wts, void* out, qk_i64 T, int N, int k, int x16) {
    const qk_i64 i = qk_global_thread();
    if (i >= T * N) return;
    const qk_i64 t = i / N;
    const int n = (int)(i - t * N);
    float o = 0.0f;
    for (int j = 0; j < k; ++j) {
        const float w = wts[t * k + j];
        if (w > QK_MOE_SKIP) o = qk_ftz(QK_FADD(o, qk_ftz(QK_FMUL(w, Y[(t * k + j) * N + n]))));
    }
    qk_store_f(out, i, o, x16);
}

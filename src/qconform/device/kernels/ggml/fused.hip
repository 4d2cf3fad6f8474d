/* ggml's fused producers of Q8_K activations: RMSNorm * gamma and SiLU(gate) * up, each row stored
 * in out_dtype (float32, or bfloat16 bits) and that stored row quantized to Q8_K.
 *
 * Semantics: qconform.oracles.ggml.fused (rms_norm_q8_k, silu_mul_q8_k), after ggml-org/llama.cpp
 * ggml/src/ggml-cpu/ops.cpp ggml_compute_forward_rms_norm_f32 then ggml_mul, vec.cpp
 * ggml_vec_swiglu_f32 with vec.h ggml_v_expf (its SSE2 branch: no FMA, every MADD two roundings),
 * ggml-impl.h ggml_compute_fp32_to_bf16 and ggml-quants.c quantize_row_q8_K_ref. Byte-identical to
 * the oracle with ftz=True: every fp32 operand and result is flushed explicitly (qk_ftz); the
 * oracle does not flush, and the catalogue leaves unchecked the rows where flushing could change a
 * result (ops/ggml/keep_quant.py _ftz_unmodelled). NaN results follow x86 SSE, as the oracle's
 * (qk_x86_nan): the Q8_K code of a NaN is its payload's low bits (qk_nearest_int_x86).
 *
 * ABI: the ops' declared ABI (qconform abi rms_norm_q8_k / silu_mul_q8_k, qconform_abi.h), default
 * launch rows * K work items, lanes 1, 256 threads: one 256-thread CTA per Q8_K block, one value
 * per thread (blockDim.x must be 256). */
#include "ggml/q8_quant.hip" /* qk_q8_k_value, qk_stage_out, QK_K, Q8_K_BYTES (one copy of the Q8_K rules) */
#include "qconform_abi.h"

#define FUSED_GROUPS (QK_K / 32) /* width-32 shuffle groups per CTA: the same on wave32 and wave64 */
#define X86_DEFAULT_NAN 0xFFC00000u
#define QUIET_BIT 0x00400000u
#define F32_INF_BITS 0x7F800000u

/* The NaN an x86 SSE binary operation a (first source) op b returns, given its IEEE result r:
 * a NaN operand quieted, the first source's when both are NaN, else the default NaN 0xFFC00000
 * (Intel SDM vol. 1, 4.8.3.5). The order of the operands is the oracle's (numpy / numba on x86). */
__device__ __forceinline__ float qk_x86_nan(float r, float a, float b) {
    if (!qk_isnan(r)) return r;
    if (qk_isnan(a)) return qk_float(qk_bits(a) | QUIET_BIT);
    if (qk_isnan(b)) return qk_float(qk_bits(b) | QUIET_BIT);
    return qk_float(X86_DEFAULT_NAN);
}

/* f32(a * b), flushed, with x86's NaN */
__device__ __forceinline__ float qk_x86_mul(float a, float b) {
    return qk_x86_nan(qk_ftz(QK_FMUL(qk_ftz(a), qk_ftz(b))), a, b);
}

/* ---------------------------------------------------------------- store, then Q8_K of the stored row */
/* ggml-impl.h ggml_compute_fp32_to_bf16: round to nearest even on the bits; a NaN keeps its top
 * 16 bits with the quiet bit set */
__device__ __forceinline__ qk_u16 qk_bf16_ggml(float v) {
    const qk_u32 u = qk_bits(v);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (qk_u16)((u >> 16) | 0x40u);
    return (qk_u16)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* quantize_row_q8_K_ref's first strict max as an order on (|x| descending, index ascending):
 * take (oa, om, oi) when it is larger, or equal with a lower index (the reference's first index) */
__device__ __forceinline__ void qk_amax_take(float& amax, float& mx, int& idx, float oa, float om, int oi) {
    if (oa > amax || (oa == amax && oi < idx)) { amax = oa; mx = om; idx = oi; }
}

/* Store this thread's value of the row in out_dtype at element i, then quantize the CTA's 256
 * stored values (bfloat16 read back, exact) into the Q8_K block dst: quantize_row_q8_K_ref, the
 * reduction of the cooperative kernel (q8_quant.hip) over the whole CTA. */
__device__ __forceinline__ void qk_store_q8_k(float v, void* y, qk_i64 i, int bf16, qk_u8* dst) {
    __shared__ uint4 ys4[(Q8_K_BYTES + 15) / 16];
    __shared__ float g_amax[FUSED_GROUPS], g_mx[FUSED_GROUPS];
    __shared__ int g_idx[FUSED_GROUPS];
    qk_u8* ys = (qk_u8*)ys4;
    float back = v;
    if (bf16) {
        const qk_u16 h = qk_bf16_ggml(v);
        ((qk_u16*)y)[i] = h;
        back = qk_float((qk_u32)h << 16);
    } else {
        ((float*)y)[i] = v;
    }
    const int t = threadIdx.x, lane = t & 31;
    /* only |x| > 0 takes part: the reference's amax starts at 0, and a NaN compares false */
    const float x = qk_ftz(back), a = fabsf(x);
    float amax = 0.0f, mx = 0.0f;
    int idx = QK_K;
    if (a > 0.0f) { amax = a; mx = x; idx = t; }
    for (int m = 16; m >= 1; m >>= 1) {
        const float oa = QK_SHFL_XOR(amax, m, 32), om = QK_SHFL_XOR(mx, m, 32);
        const int oi = QK_SHFL_XOR(idx, m, 32);
        qk_amax_take(amax, mx, idx, oa, om, oi);
    }
    if (lane == 0) { g_amax[t >> 5] = amax; g_mx[t >> 5] = mx; g_idx[t >> 5] = idx; }
    __syncthreads();
    amax = g_amax[0]; mx = g_mx[0]; idx = g_idx[0];
    for (int g = 1; g < FUSED_GROUPS; ++g) qk_amax_take(amax, mx, idx, g_amax[g], g_mx[g], g_idx[g]);
    /* amax == 0: every value +-0 or NaN; d = 0, every q 0 (and zero bsums: ggml leaves them stale) */
    const bool zero = amax == 0.0f;
    const float iscale = zero ? 0.0f : qk_ftz(QK_FDIV(-127.0f, mx));
    const int q = zero ? 0 : qk_q8_k_value(iscale, back);
    int sum = q; /* bsums: 16 consecutive values, integer (exact in any order) */
    for (int m = 1; m < 16; m <<= 1) sum += QK_SHFL_XOR(sum, m, 16);
    ys[Q8_K_QS + t] = (qk_u8)((qk_u32)q & 0xFFu);
    if ((t & 15) == 0) ((qk_i16*)(ys + Q8_K_BSUMS))[t >> 4] = (qk_i16)sum;
    if (t == 0) *(float*)ys = zero ? 0.0f : qk_ftz(QK_FDIV(1.0f, iscale));
    qk_stage_out(ys, dst, Q8_K_BYTES);
}

/* ------------------------------------------------------------------------------------ RMSNorm */
/* ggml's row sum (ops.cpp ggml_compute_forward_rms_norm_f32) is sequential:
 *   sum = 0 (double); for i in 0..K-1: sum += (double)f32(x_i * x_i)
 * and every CTA of the row needs the result, so each CTA reduces the whole row (256 threads, in
 * any fixed order) and finds the sequential sum from that, exactly:
 *
 * Exact: every term t_i = f32(x_i * x_i) is >= 0 (flushed: never subnormal), a multiple of
 * 2^L, L = the lowest set bit over the nonzero terms (exponent - 23 + trailing zeros of the 24-bit
 * significand). Let E be the exponent of the parallel double total S'. S' is within a factor
 * (1 + gamma_K) of the exact total S, so S < 2^(E+2). If E - L <= 51, every partial sum of any
 * order is a multiple of 2^L below 2^(L+53): a double exactly, so every addition is exact and the
 * sequential loop, the parallel reduction and the exact sum are one value.
 *
 * Bounded: otherwise the sequential sum and S' each lie within gamma_{K-1} S of S (nonnegative
 * terms, any order: Higham 2002, 4.2), so within B = K 2^-50 S' of S' (with room for the
 * roundings of B and S' +- B). The mean (float)(sum / K) is monotone in sum: when the ends
 * S' - B and S' + B give the same mean, the sequential sum gives it too.
 *
 * Otherwise (rare: the mean lies within a relative ~K 2^-50 of an fp32 rounding boundary), one thread
 * runs the sequential loop itself. Special terms: a NaN makes the sum the first NaN's (x86 keeps
 * the first source's: quiet(x_first)), which every later step keeps; +inf (no NaN) makes it +inf. */
struct qk_sumsq {
    double sum;    /* the finite nonzero terms, in double */
    int low;       /* their lowest set bit L (INT_MAX: none) */
    qk_i64 nan_at; /* the first index of a NaN term (K: none) */
    int inf;       /* some term is +inf */
};

__device__ __forceinline__ int qk_low_bit(float t) { /* t normal and > 0 */
    const qk_u32 b = qk_bits(t);
    return (int)((b >> 23) & 0xFFu) - 150 + (__ffs((int)((b & 0x7FFFFFu) | 0x800000u)) - 1);
}

__device__ __forceinline__ void qk_sumsq_add(qk_sumsq& p, double sum, int low, qk_i64 nan_at, int inf) {
    p.sum = __dadd_rn(p.sum, sum);
    p.low = low < p.low ? low : p.low;
    p.nan_at = nan_at < p.nan_at ? nan_at : p.nan_at;
    p.inf |= inf;
}

/* f32(x * x), flushed, with x flushed first (the device reads a subnormal x as 0) */
__device__ __forceinline__ float qk_square(float x) {
    const float f = qk_ftz(x);
    return qk_ftz(QK_FMUL(f, f));
}

/* (float)(sum / K): double division, one rounding to fp32 */
__device__ __forceinline__ float qk_mean(double sum, qk_i64 K) {
    return qk_ftz(__double2float_rn(__ddiv_rn(sum, (double)K)));
}

/* the row's f32(1.0f / f32(sqrtf(f32(mean + eps)))), the same in every CTA of the row */
__device__ __forceinline__ float qk_rms_scale(const float* xr, qk_i64 K, float eps) {
    __shared__ double g_sum[FUSED_GROUPS];
    __shared__ int g_low[FUSED_GROUPS], g_inf[FUSED_GROUPS];
    __shared__ qk_i64 g_nan[FUSED_GROUPS];
    __shared__ double serial;
    const int t = threadIdx.x;
    qk_sumsq p = {0.0, 0x7FFFFFFF, K, 0};
    for (qk_i64 i = t; i < K; i += QK_K) {
        const float sq = qk_square(xr[i]);
        if (qk_isnan(sq)) p.nan_at = p.nan_at < i ? p.nan_at : i;
        else if (sq == qk_float(F32_INF_BITS)) p.inf = 1;
        else if (sq != 0.0f) qk_sumsq_add(p, (double)sq, qk_low_bit(sq), K, 0);
    }
    for (int m = 16; m >= 1; m >>= 1)
        qk_sumsq_add(p, QK_SHFL_XOR(p.sum, m, 32), QK_SHFL_XOR(p.low, m, 32), QK_SHFL_XOR(p.nan_at, m, 32),
                     QK_SHFL_XOR(p.inf, m, 32));
    if ((t & 31) == 0) {
        g_sum[t >> 5] = p.sum; g_low[t >> 5] = p.low; g_nan[t >> 5] = p.nan_at; g_inf[t >> 5] = p.inf;
    }
    __syncthreads();
    qk_sumsq r = {g_sum[0], g_low[0], g_nan[0], g_inf[0]};
    for (int g = 1; g < FUSED_GROUPS; ++g) qk_sumsq_add(r, g_sum[g], g_low[g], g_nan[g], g_inf[g]);
    if (r.nan_at < K) return qk_float(qk_bits(xr[r.nan_at]) | QUIET_BIT); /* NaN through every step */
    float mean;
    if (r.inf) {
        mean = qk_float(F32_INF_BITS);
    } else if (r.sum == 0.0) {
        mean = 0.0f;
    } else if ((int)((__double_as_longlong(r.sum) >> 52) & 0x7FF) - 1023 - r.low <= 51) {
        mean = qk_mean(r.sum, K); /* exact */
    } else {
        const double b = __dmul_rn(r.sum, (double)K * 0x1p-50);
        const float lo = qk_mean(__dsub_rn(r.sum, b), K), hi = qk_mean(__dadd_rn(r.sum, b), K);
        if (lo == hi) {
            mean = lo; /* bounded */
        } else { /* uniform across the CTA: every thread reduced the same values */
            if (t == 0) {
                double s = 0.0;
                for (qk_i64 i = 0; i < K; ++i) s = __dadd_rn(s, (double)qk_square(xr[i]));
                serial = s;
            }
            __syncthreads();
            mean = qk_mean(serial, K);
        }
    }
    const float root = qk_ftz(__fsqrt_rn(qk_ftz(QK_FADD(mean, qk_ftz(eps)))));
    return qk_ftz(QK_FDIV(1.0f, root));
}

/* y = f32(f32(x * scale) * gamma) (ggml_vec_scale_f32, then ggml_mul), then its Q8_K block */
extern "C" __global__ void __launch_bounds__(QK_K) qk_rms_norm_q8_k(QCONFORM_RMS_NORM_Q8_K_PARAMS) {
    const qk_i64 per_row = K / QK_K, blk = blockIdx.x;
    if (blk >= rows * per_row) return;
    const qk_i64 r = blk / per_row, c = (blk - r * per_row) * QK_K + threadIdx.x;
    const float* xr = x + r * K;
    const float scale = qk_rms_scale(xr, K, eps);
    const float v = qk_x86_mul(qk_x86_mul(scale, xr[c]), gamma[c]);
    qk_store_q8_k(v, y, blk * QK_K + threadIdx.x, out_dtype == QCONFORM_DTYPE_BFLOAT16, y_q8_k + blk * Q8_K_BYTES);
}

/* ---------------------------------------------------------------------------------- SiLU * up */
/* vec.h ggml_v_expf, SSE2 (no FMA): MADD(a, b, c) = f32(f32(a*b) + c), NMADD(a, b, c) = f32(c - f32(a*b)) */
__device__ __forceinline__ float qk_madd_sse2(float a, float b, float c) {
    return qk_ftz(QK_FADD(qk_ftz(QK_FMUL(a, b)), c));
}

__device__ __forceinline__ float qk_nmadd_sse2(float a, float b, float c) {
    return qk_ftz(__fsub_rn(c, qk_ftz(QK_FMUL(a, b))));
}

/* ggml_v_expf of a non-NaN x, one lane: n = round(x * log2(e)), b = x - n ln 2 (two parts), j the
 * polynomial of b; 2^n built from z's bits: |n| <= 126 k = 2^n, k + k*j; 126 < |n| <= 192 in two
 * factors s1 * s2 = 2^n (no tiny or huge 2^n formed); |n| > 192 s1 * s1 = +0 or +inf */
__device__ __forceinline__ float qk_v_expf_sse2(float x) {
    const float z = qk_madd_sse2(x, 0x1.715476p+0f, 0x1.8p23f);
    const float n = qk_ftz(__fsub_rn(z, 0x1.8p23f));
    const float b = qk_nmadd_sse2(n, 0x1.7f7d1cp-20f, qk_nmadd_sse2(n, 0x1.62e4p-1f, x));
    const float u = qk_ftz(QK_FMUL(b, b));
    /* j = MADD(MADD(MADD(C7, b, C6), u, MADD(C4, b, C3)), u, f32(C5 * b)) */
    const float c76 = qk_madd_sse2(0x1.0e4020p-7f, b, 0x1.573e2ep-5f);
    const float c43 = qk_madd_sse2(0x1.555e66p-3f, b, 0x1.fffdb6p-2f);
    const float j = qk_madd_sse2(qk_madd_sse2(c76, u, c43), u, qk_ftz(QK_FMUL(0x1.ffffecp-1f, b)));
    const qk_u32 e = qk_bits(z) << 23;
    const float an = fabsf(n);
    if (an > 126.0f) {
        const qk_u32 g = n <= 0.0f ? 0x82000000u : 0u;
        const float s1 = qk_float(g + 0x7F000000u), s2 = qk_float(e - g);
        if (an > 192.0f) return qk_ftz(QK_FMUL(s1, s1));
        return qk_ftz(QK_FMUL(qk_madd_sse2(s2, j, s2), s1));
    }
    const float k = qk_float(e + 0x3F800000u);
    return qk_madd_sse2(k, j, k);
}

/* h = f32(silu(g) * up), silu(g) = f32(g / f32(1 + v_expf(f32(0 - g)))) (vec.cpp ggml_vec_swiglu_f32);
 * a NaN g passes through every step as itself, quieted */
__device__ __forceinline__ float qk_silu_mul(float g, float up) {
    float s = qk_float(qk_bits(g) | QUIET_BIT);
    if (!qk_isnan(g)) {
        const float d = qk_ftz(QK_FADD(1.0f, qk_v_expf_sse2(qk_ftz(__fsub_rn(0.0f, qk_ftz(g))))));
        s = qk_x86_nan(qk_ftz(QK_FDIV(qk_ftz(g), d)), g, d);
    }
    return qk_x86_mul(s, up);
}

extern "C" __global__ void __launch_bounds__(QK_K) qk_silu_mul_q8_k(QCONFORM_SILU_MUL_Q8_K_PARAMS) {
    const qk_i64 blk = blockIdx.x;
    if (blk >= rows * (K / QK_K)) return;
    const qk_i64 i = blk * QK_K + threadIdx.x; /* rows are whole blocks: block blk holds elements 256 blk.. */
    const float h = qk_silu_mul(gate[i], up[i]);
    qk_store_q8_k(h, y, i, out_dtype == QCONFORM_DTYPE_BFLOAT16, y_q8_k + blk * Q8_K_BYTES);
}

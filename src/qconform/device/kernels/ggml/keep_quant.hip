/* ggml's keep-quant linear layer (op matmul_bt_quant) for Q4_K, Q5_K, Q6_K and Q8_0 weights:
 *   Y[m, n] = vec_dot(W row n, Q8 row m)
 * in the float order of ggml's generic vec_dot (ggml-org/llama.cpp ggml/src/ggml-cpu/quants.c
 * ggml_vec_dot_q4_K_q8_K_generic, _q5_K_q8_K_generic, _q6_K_q8_K_generic, _q8_0_q8_0_generic;
 * docs/ggml-formats.md 4), so the result is bit-identical to the generic C built without FMA
 * contraction: every fp32 operation through QK_FMUL / QK_FADD, integers exact in any order.
 *
 * The activation rows are quantized beforehand by the suite's Q8_K / Q8_0 quantize kernels
 * (q8_quant.hip, byte-identical to quantize_row_q8_K_ref / _q8_0_ref); the launcher is
 * qconform/device/ggml/keep_quant.py.
 *
 * K-quants (blocks of 256): the generic C keeps 8 fp32 lanes, lane l summing
 *   aux32[l] = sum over e = l (mod 8) of scale(e) * q8[e] * q[e]     (an exact integer)
 * per super-block, then sums[l] += f32(f32(dx * yd) * (float)aux32[l]) across super-blocks, Q4_K
 * and Q5_K also sumf -= f32(f32(dmx * yd) * (float)sum_g bsums[g] * min[g / 2]), and at the end
 * sumf += sums[0], ..., sums[7]. Here a group of 8 threads owns one weight row, thread l owning
 * fp32 lane l: it reads the weight bytes of elements e = 32s + 8r + l (r = 0..3) of each 32-value
 * segment s as one word, so that one qk_dp4a (four products of one lane and one scale) adds a
 * segment's part of aux32[l]; the activations are regrouped the same way once per call
 * (qk_q8_k_lanes). Each thread runs lane l's fp32 chain over the super-blocks in order; the min
 * part (an integer from the 8 threads, added with shuffles of width 8) and the final lane sum
 * are the same in every thread of the group. 32 groups (256 threads) per CTA, up to KQ_MT
 * activation rows per CTA (gridDim.y tiles the rest).
 *
 * Q8_0 (blocks of 32): sumf += f32((float)sumi * f32(dx * dy)) per block in order; thread l of
 * the group dots bytes 4l..4l+3 (qk_dp4a) and the group adds the 8 parts (shuffles, width 8).
 *
 * Wave-size agnostic: every shuffle has width 8; the groups of a CTA past N or M run the same
 * loop on clamped rows and skip only their stores. */
#include "qk_portable.h"

#define QK_K 256
#define Q8_K_BYTES 292
#define Q8_K_BSUMS 260
#define Q8_0_BYTES 34
#define KQ_ROWS 32 /* weight rows per CTA: groups of 8 threads */
#define KQ_MT 8    /* activation rows per CTA */
#define KQ_LO4 0x0F0F0F0Fu

/* ------------------------------------------------------------------ activation regrouping */
/* aq word (row m, super-block i, thread l, segment s), at ((m * nb + i) * 64 + 8 l + s), holds the
 * Q8_K quants q8[32 s + 8 r + l] as bytes r = 0..3: thread l reads its 8 words as two 16-byte
 * loads. One thread per word; n_blocks = M * nb. */
extern "C" __global__ void __launch_bounds__(256)
qk_q8_k_lanes(const qk_u8* a8, int* aq, qk_i64 n_blocks) {
    const qk_i64 gt = qk_global_thread();
    const qk_i64 blk = gt >> 6;
    if (blk >= n_blocks) return;
    const int l = (int)((gt >> 3) & 7), s = (int)(gt & 7);
    const qk_u8* qs = a8 + blk * Q8_K_BYTES + 4 + 32 * s + l;
    aq[gt] = (int)((qk_u32)qs[0] | ((qk_u32)qs[8] << 8) | ((qk_u32)qs[16] << 16) | ((qk_u32)qs[24] << 24));
}

/* bytes p[0], p[8], p[16], p[24] as one word (byte r = p[8 r]) */
__device__ __forceinline__ qk_u32 kq_column(const qk_u8* p) {
    return (qk_u32)p[0] | ((qk_u32)p[8] << 8) | ((qk_u32)p[16] << 16) | ((qk_u32)p[24] << 24);
}

__device__ __forceinline__ float kq_fp16(const qk_u8* p) { return qk_fp16_to_float(*(const qk_u16*)p); }

/* ------------------------------------------------------------------ K-quant weight blocks */
/* One super-block of one weight row as thread l needs it: the 8 segment words (a signed byte
 * per element), the integer scale of each half segment (bytes r = 0, 1 and r = 2, 3: Q6_K's scales
 * cover 16 values, the others' 32), Q4_K/Q5_K's min of sub-block l (thread l's share of the min
 * part), and the fp16 scales. */
struct kq_block {
    int q[8];
    int sc_lo[8], sc_hi[8];
    int mn;
    float dx, dmx;
};

/* Q4_K / Q5_K (ggml-common.h block_q4_K {half d; half dmin; u8 scales[12]; u8 qs[128]}, 144 bytes;
 * block_q5_K {half d; half dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}, 176 bytes): element
 * e = 64c + 32t + ll is nibble t of qs[32c + ll], plus 16 times bit e / 32 of qh[ll] for Q5_K;
 * scale and min of sub-block j = e / 32 from ggml-quants.c get_scale_min_k4. */
template <int KIND>
__device__ __forceinline__ void kq_load_k4(const qk_u8* b, int l, kq_block& w) {
    const int qs_at = KIND == 5 ? 48 : 16;
    const qk_u8* sc = b + 4;
    w.dx = kq_fp16(b);
    w.dmx = kq_fp16(b + 2);
    qk_u32 hq = 0u;
    if (KIND == 5) hq = kq_column(b + 16 + l);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        const qk_u32 word = kq_column(b + qs_at + 32 * c + l);
#pragma unroll
        for (int t = 0; t < 2; ++t) {
            qk_u32 v = (word >> (4 * t)) & KQ_LO4;
            if (KIND == 5) v |= ((hq >> (2 * c + t)) & 0x01010101u) << 4;
            w.q[2 * c + t] = (int)v;
        }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) w.sc_lo[j] = w.sc_hi[j] = j < 4 ? sc[j] & 63 : (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4);
    w.mn = l < 4 ? sc[l + 4] & 63 : (sc[l + 4] >> 4) | ((sc[l] >> 6) << 4);
}

/* Q6_K (block_q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; half d}, 210 bytes): element
 * e = 128h + 32k + ll is (nibble k / 2 of ql[64h + 32(k % 2) + ll]) | (bits 2k, 2k + 1 of
 * qh[32h + ll]) << 4, minus 32; scale scales[e / 16]. The 6-bit value u becomes the signed byte
 * u - 32 without a borrow between bytes: t = u ^ 32, then bits 6 and 7 set where bit 5 of t is. */
__device__ __forceinline__ void kq_load_q6_k(const qk_u8* b, int l, kq_block& w) {
    const qk_i8* sc = (const qk_i8*)(b + 192);
    w.dx = kq_fp16(b + 208);
    w.dmx = 0.0f;
    w.mn = 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const qk_u32 hi = kq_column(b + 128 + 32 * h + l);
        const qk_u32 lo0 = kq_column(b + 64 * h + l), lo1 = kq_column(b + 64 * h + 32 + l);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const qk_u32 lo = (((k & 1) ? lo1 : lo0) >> (4 * (k >> 1))) & KQ_LO4;
            const qk_u32 u = lo | (((hi >> (2 * k)) & 0x03030303u) << 4);
            const qk_u32 t = u ^ 0x20202020u, sign = t & 0x20202020u;
            const int s = 4 * h + k;
            w.q[s] = (int)(t | (sign << 1) | (sign << 2));
            w.sc_lo[s] = sc[2 * s];
            w.sc_hi[s] = sc[2 * s + 1];
        }
    }
}

template <int KIND>
__device__ __forceinline__ void kq_load(const qk_u8* b, int l, kq_block& w) {
    if (KIND == 6) kq_load_q6_k(b, l, w);
    else kq_load_k4<KIND>(b, l, w);
}

/* aux32[l] of one super-block: the 8 segments' dot products, each times its scale(s) */
template <int KIND>
__device__ __forceinline__ int kq_aux(const kq_block& w, const int a[8]) {
    int aux = 0;
#pragma unroll
    for (int s = 0; s < 8; ++s) {
        if (KIND == 6) {
            aux += w.sc_lo[s] * qk_dp4a(w.q[s] & 0x0000FFFF, a[s], 0);
            aux += w.sc_hi[s] * qk_dp4a((int)((qk_u32)w.q[s] & 0xFFFF0000u), a[s], 0);
        } else {
            aux += w.sc_lo[s] * qk_dp4a(w.q[s], a[s], 0);
        }
    }
    return aux;
}

template <int KIND, int TYPE_SIZE>
__device__ __forceinline__ void kq_gemv(
    const qk_u8* W, const qk_u8* a8, const int* aq, float* Y, qk_i64 M, qk_i64 N, qk_i64 nb) {
    const int l = threadIdx.x & 7;
    const qk_i64 n_raw = (qk_i64)blockIdx.x * KQ_ROWS + (threadIdx.x >> 3);
    const qk_i64 n = n_raw < N ? n_raw : N - 1;
    const qk_i64 m0 = (qk_i64)blockIdx.y * KQ_MT;
    const int mt = (int)(M - m0 < KQ_MT ? M - m0 : KQ_MT);
    const qk_u8* wrow = W + n * nb * TYPE_SIZE;
    float sums[KQ_MT], sumf[KQ_MT];
#pragma unroll
    for (int m = 0; m < KQ_MT; ++m) sums[m] = sumf[m] = 0.0f;
    kq_block w;
    for (qk_i64 i = 0; i < nb; ++i) {
        kq_load<KIND>(wrow + i * TYPE_SIZE, l, w);
#pragma unroll
        for (int m = 0; m < KQ_MT; ++m) {
            if (m >= mt) break;
            const qk_i64 blk = (m0 + m) * nb + i;
            const float yd = *(const float*)(a8 + blk * Q8_K_BYTES);
            const uint4* ap = (const uint4*)(aq + blk * 64 + 8 * l);
            const uint4 a0 = ap[0], a1 = ap[1];
            const int a[8] = {(int)a0.x, (int)a0.y, (int)a0.z, (int)a0.w, (int)a1.x, (int)a1.y, (int)a1.z, (int)a1.w};
            const float d = QK_FMUL(w.dx, yd);
            sums[m] = QK_FADD(sums[m], QK_FMUL(d, __int2float_rn(kq_aux<KIND>(w, a))));
            if (KIND != 6) { /* sumi = sum_g bsums[g] * min[g / 2]: thread l takes g = 2l, 2l + 1 */
                const qk_u32 bs = *(const qk_u32*)(a8 + blk * Q8_K_BYTES + Q8_K_BSUMS + 4 * l);
                int sumi = ((int)(qk_i16)(bs & 0xFFFFu) + (int)(qk_i16)(bs >> 16)) * w.mn;
                sumi += QK_SHFL_XOR(sumi, 1, 8);
                sumi += QK_SHFL_XOR(sumi, 2, 8);
                sumi += QK_SHFL_XOR(sumi, 4, 8);
                const float dmin = QK_FMUL(w.dmx, yd);
                sumf[m] = QK_FADD(sumf[m], -QK_FMUL(dmin, __int2float_rn(sumi)));
            }
        }
    }
#pragma unroll
    for (int m = 0; m < KQ_MT; ++m) {
        if (m >= mt) break;
        float y = sumf[m];
#pragma unroll
        for (int k = 0; k < 8; ++k) y = QK_FADD(y, QK_SHFL(sums[m], k, 8));
        if (l == 0 && n_raw < N) Y[(m0 + m) * N + n_raw] = y;
    }
}

extern "C" __global__ void __launch_bounds__(256)
qk_kq_gemv_q4_k(const qk_u8* W, const qk_u8* a8, const int* aq, float* Y, qk_i64 M, qk_i64 N, qk_i64 nb) {
    kq_gemv<4, 144>(W, a8, aq, Y, M, N, nb);
}

extern "C" __global__ void __launch_bounds__(256)
qk_kq_gemv_q5_k(const qk_u8* W, const qk_u8* a8, const int* aq, float* Y, qk_i64 M, qk_i64 N, qk_i64 nb) {
    kq_gemv<5, 176>(W, a8, aq, Y, M, N, nb);
}

extern "C" __global__ void __launch_bounds__(256)
qk_kq_gemv_q6_k(const qk_u8* W, const qk_u8* a8, const int* aq, float* Y, qk_i64 M, qk_i64 N, qk_i64 nb) {
    kq_gemv<6, 210>(W, a8, aq, Y, M, N, nb);
}

/* ------------------------------------------------------------------------- Q8_0 x Q8_0 */
/* block_q8_0 {half d; i8 qs[32]} (34 bytes, so qs is only 2-byte aligned): bytes 4l..4l+3 as
 * two 16-bit loads */
__device__ __forceinline__ int kq_q8_0_word(const qk_u8* b, int l) {
    const qk_u16* h = (const qk_u16*)(b + 2 + 4 * l);
    return (int)((qk_u32)h[0] | ((qk_u32)h[1] << 16));
}

extern "C" __global__ void __launch_bounds__(256)
qk_kq_gemv_q8_0(const qk_u8* W, const qk_u8* a8, float* Y, qk_i64 M, qk_i64 N, qk_i64 nb) {
    const int l = threadIdx.x & 7;
    const qk_i64 n_raw = (qk_i64)blockIdx.x * KQ_ROWS + (threadIdx.x >> 3);
    const qk_i64 n = n_raw < N ? n_raw : N - 1;
    const qk_i64 m0 = (qk_i64)blockIdx.y * KQ_MT;
    const int mt = (int)(M - m0 < KQ_MT ? M - m0 : KQ_MT);
    const qk_u8* wrow = W + n * nb * Q8_0_BYTES;
    float sumf[KQ_MT];
#pragma unroll
    for (int m = 0; m < KQ_MT; ++m) sumf[m] = 0.0f;
    for (qk_i64 i = 0; i < nb; ++i) {
        const qk_u8* wb = wrow + i * Q8_0_BYTES;
        const float dx = kq_fp16(wb);
        const int wq = kq_q8_0_word(wb, l);
#pragma unroll
        for (int m = 0; m < KQ_MT; ++m) {
            if (m >= mt) break;
            const qk_u8* ab = a8 + ((m0 + m) * nb + i) * Q8_0_BYTES;
            int sumi = qk_dp4a(wq, kq_q8_0_word(ab, l), 0);
            sumi += QK_SHFL_XOR(sumi, 1, 8);
            sumi += QK_SHFL_XOR(sumi, 2, 8);
            sumi += QK_SHFL_XOR(sumi, 4, 8);
            sumf[m] = QK_FADD(sumf[m], QK_FMUL(__int2float_rn(sumi), QK_FMUL(dx, kq_fp16(ab))));
        }
    }
#pragma unroll
    for (int m = 0; m < KQ_MT; ++m) {
        if (m >= mt) break;
        if (l == 0 && n_raw < N) Y[(m0 + m) * N + n_raw] = sumf[m];
    }
}

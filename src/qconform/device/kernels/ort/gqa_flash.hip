/* com.microsoft.GroupQueryAttention prefill on the matrix units: a tiled online-softmax (flash)
 * attention over the present caches that ort/gqa.hip's qk_gqa_append wrote (rotary, new rows).
 *
 * Semantics: qconform.oracles.ort.group_query_attention (docs/ort-ops.md section 4): query s of
 * batch b attends keys [lo, L), L = min(past_b + s + 1, total_b), lo = L - W with a local window
 * of W < L keys; x = fp32(fp32(q.k) * scale), softcap c > 0: c tanh(x / c), then + the bias; a
 * sink logit (head_sink[n], or 0 with smooth_softmax) in the denominator. Upstream:
 * onnxruntime/contrib_ops/cpu/bert/gqa_attention_base.h (ComputeAttentionProbs,
 * ComputeFlashAttention); the tiling is FlashAttention-2's (Dao 2023, "FlashAttention-2", Alg. 1).
 *
 * Rounding (the oracle's precision "kernel", contract storage=fp16): Q, K, V held in fp16 (an
 * fp16 cache is read as stored; an fp32 / int8 / 4-bit cache goes through qk_gqa_prefill_scratch,
 * rows [0, total_b) only), Q K^T by qk_mma_16816 (fp16 products, fp32 sums), online softmax in
 * fp32 per block of 64 keys aligned at key 0 (running max m, the sum l kept per lane and added
 * over the 4 lanes of a row at the end), P rounded to fp16 for the P V product (fp32 sums into the
 * rescaled accumulator), output fp32(acc / l) in the output type. No atomics: deterministic.
 *
 * Kernels: qk_gqa_prefill_h<H> (session 8, below) and, at the end of the file, the default
 * qk_gqa_prefill2_h<H> (session 10: FlashAttention-2's loop, head_size 64 / 128 without softcap or
 * bias); -DQK_GQA_PREFILL_V1 leaves the session-10 kernels out (the launcher then runs session 8's
 * for every case). */
#include "ort_common.h"

#define QK_FL_THREADS 128 /* 4 groups of 32 lanes, 16 query rows each */
#define QK_FL_BM 64       /* query rows of a CTA */
#define QK_FL_BN 64       /* keys of a block */

__device__ __forceinline__ float qk_fl_neg_inf() { return qk_float(0xFF800000u); }

/* two fp32 values as an fp16 pair (low half = the first), round to nearest even */
__device__ __forceinline__ qk_u32 qk_fl_pack(float lo, float hi) {
    return (qk_u32)qk_fp16_bits(lo) | ((qk_u32)qk_fp16_bits(hi) << 16);
}

/* ---------------------------------------------------------------------------- scratch */

/* Rows [0, total_b) of an fp32 (kind 0), int8 (2) or 4-bit (3, element 2i in the low nibble)
 * cache as fp16 (B, Nk, T, H): fp32 values rounded once; codes dequantized as the oracle does,
 * fp32(code * scale), then rounded. One thread per element; rows >= total_b are neither read nor
 * written. */
extern "C" __global__ void __launch_bounds__(256)
    qk_gqa_prefill_scratch(const void* present, qk_u16* scratch, const int* seqlens_k, const float* scale, qk_i64 B,
                         qk_i64 Nk, qk_i64 Tp, qk_i64 T, qk_i64 H, int kind, int per_channel) {
    const qk_i64 t = qk_global_thread();
    if (t >= B * Nk * T * H) return;
    const qk_i64 c = t % H, r = (t / H) % T, bg = t / (H * T);
    if (r >= (qk_i64)seqlens_k[bg / Nk] + 1) return;
    const qk_i64 row = bg * Tp + r;
    float v;
    if (kind == 0) {
        v = ((const float*)present)[row * H + c];
    } else {
        const float s = scale[per_channel ? (bg % Nk) * H + c : 0];
        int code;
        if (kind == 2) {
            code = ((const qk_i8*)present)[row * H + c];
        } else {
            const unsigned byte = ((const qk_u8*)present)[row * (H / 2) + c / 2];
            code = (int)((c & 1) ? (byte >> 4) : (byte & 0x0Fu)) - 8;
        }
        v = QK_FMUL((float)code, s);
    }
    scratch[t] = qk_fp16_bits(v);
}

/* ------------------------------------------------------------------ fragments from shared */

#if defined(QK_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(QK_MMA_EMULATE)
#define QK_FL_LDMATRIX 1
#endif

/* B fragments of Q K^T for keys n0..n0+15, channels k0..k0+15 of a [key][LD] fp16 tile:
 * r[0] = K[n0+g][k0+2t..], r[1] = K[n0+g][k0+8+2t..] (keys n0..n0+7), r[2], r[3] the same for
 * keys n0+8..n0+15 (PTX ldmatrix.x4: lane l gives the row address of matrix l / 8). */
template <int LD>
__device__ __forceinline__ void qk_fl_kfrag(qk_u32 r[4], const qk_u16* tile, int n0, int k0) {
    const int lane = (int)(threadIdx.x & 31);
#if defined(QK_FL_LDMATRIX)
    qk_ldmatrix_x4(r, tile + (n0 + ((lane >> 4) & 1) * 8 + (lane & 7)) * LD + k0 + ((lane >> 3) & 1) * 8);
#else
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < 4; ++i)
        r[i] = *(const qk_u32*)(tile + (n0 + (i >> 1) * 8 + g) * LD + k0 + (i & 1) * 8 + 2 * t);
#endif
}

/* B fragments of P V for keys k0..k0+15, channels c0..c0+15 of a [key][LD] fp16 tile:
 * r[0] = (V[k0+2t][c0+g], V[k0+2t+1][c0+g]), r[1] the same for keys k0+8+2t, r[2], r[3] for
 * channel c0+8+g (ldmatrix.x4.trans). */
template <int LD>
__device__ __forceinline__ void qk_fl_vfrag(qk_u32 r[4], const qk_u16* tile, int k0, int c0) {
    const int lane = (int)(threadIdx.x & 31);
#if defined(QK_FL_LDMATRIX)
    qk_ldmatrix_x4<true>(r, tile + (k0 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + c0 + (lane >> 4) * 8);
#else
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const qk_u16* p = tile + (k0 + (i & 1) * 8 + 2 * t) * LD + c0 + (i >> 1) * 8 + g;
        r[i] = (qk_u32)p[0] | ((qk_u32)p[LD] << 16);
    }
#endif
}

/* rows [j0, j0 + 64) of a (rows, H) fp16 cache into a [key][LD] tile, 16 bytes a copy; rows at
 * or past `end` are zero-filled and never read (a zero V row times p = 0 stays 0) */
template <int H, int LD>
__device__ __forceinline__ void qk_fl_stage(qk_u16* tile, const qk_u16* base, int j0, int end) {
    constexpr int CH = H / 8; /* 16-byte chunks of a row */
    for (int i = (int)threadIdx.x; i < QK_FL_BN * CH; i += QK_FL_THREADS) {
        const int r = i / CH, c = i % CH;
        const bool in = j0 + r < end;
        qk_cp_async16(tile + r * LD + c * 8, base + (in ? (qk_i64)(j0 + r) * H + c * 8 : 0), in ? 16 : 0);
    }
}

/* ------------------------------------------------------------------------------- attention */

/* the key range [lo, L) of query row s (L = 0 for rows s >= S: nothing attended, nothing written) */
__device__ __forceinline__ void qk_fl_range(int s, int S, int past, int total, int window, int& lo, int& L) {
    L = s >= S ? 0 : (past + s + 1 < total ? past + s + 1 : total);
    lo = (window >= 1 && L > window) ? L - window : 0;
}

/* One CTA per (block of 64 query rows, query head n, batch b); group w of 32 lanes takes rows
 * q0 + 16 w .. + 15, lane 4 g + t rows g and g + 8 of them (the mma layout). The CTA loops over
 * the key blocks of [lo(q0), L(last row)), K and V tiles staged by asynchronous copies (V of the
 * block during Q K^T, K of the next block during P V). kv: the fp16 cache (B, Nk, kv_rows, H). */
template <int H>
__device__ __forceinline__ void qk_fl_attend(const float* qrot, const qk_u16* kc, const qk_u16* vc, qk_i64 kv_rows,
                                             const int* seqlens_k, const void* bias, const void* head_sink,
                                             void* output, int S, int N, int Nk, qk_i64 T, int first_prompt,
                                             int window, int bias_batch, int bias_heads, int sink_mode, int is16,
                                             float alpha, float softcap) {
    constexpr int LD = H + 8; /* halves per tile row: ldmatrix rows land on distinct banks */
    constexpr int KS = H / 16, NT = H / 8;
    __shared__ __align__(16) qk_u16 ktile[QK_FL_BN * LD];
    __shared__ __align__(16) qk_u16 vtile[QK_FL_BN * LD];
    const int lane = (int)(threadIdx.x & 31), grp = (int)(threadIdx.x >> 5), g = lane >> 2, t = lane & 3;
    const int q0 = ((int)gridDim.x - 1 - (int)blockIdx.x) * QK_FL_BM; /* the longest rows first */
    const int n = (int)blockIdx.y, b = (int)blockIdx.z;
    const qk_i64 kvh = n / (N / Nk);
    const int total = seqlens_k[b] + 1, past = first_prompt ? 0 : total - S;
    const qk_u16* kbase = kc + ((qk_i64)b * Nk + kvh) * kv_rows * H;
    const qk_u16* vbase = vc + ((qk_i64)b * Nk + kvh) * kv_rows * H;

    int lo_r[2], L_r[2], s_r[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        s_r[h] = q0 + 16 * grp + g + 8 * h;
        qk_fl_range(s_r[h], S, past, total, window, lo_r[h], L_r[h]);
    }
    /* lo and L never decrease with s: the CTA's and the group's key ranges from their end rows */
    const int last = q0 + QK_FL_BM - 1 < S - 1 ? q0 + QK_FL_BM - 1 : S - 1;
    int cta_lo, cta_end, grp_lo, grp_end, unused;
    qk_fl_range(q0, S, past, total, window, cta_lo, unused);
    qk_fl_range(last, S, past, total, window, unused, cta_end);
    const int g_first = q0 + 16 * grp, g_last = g_first + 15 < last ? g_first + 15 : last;
    qk_fl_range(g_first, S, past, total, window, grp_lo, unused);
    qk_fl_range(g_last, S, past, total, window, unused, grp_end);
    const bool active = g_first < S;

    const qk_i64 ostride = (qk_i64)N * H; /* output (B, S, N H) */
    qk_u32 qa[KS][4];
#pragma unroll
    for (int k = 0; k < KS; ++k)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int s = s_r[i & 1], c = 16 * k + 2 * t + (i >> 1) * 8;
            const float* q = qrot + ((qk_i64)b * S + s) * ostride + (qk_i64)n * H + c;
            qa[k][i] = s < S ? qk_fl_pack(q[0], q[1]) : 0u;
        }

    const float sigma = sink_mode == 1 ? qk_load_f(head_sink, n, is16) : 0.0f;
    float m_r[2], l_r[2], acc[NT][4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        m_r[h] = sink_mode ? sigma : qk_fl_neg_inf(); /* the sink is the initial state: m = sigma, l = 1 */
        l_r[h] = sink_mode && t == 0 ? 1.0f : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
    const qk_i64 bias_row = bias_batch ? (qk_i64)(bias_batch == 1 ? 0 : b) * bias_heads : 0;
    const qk_i64 bias_head = bias_heads == 1 ? 0 : n;

    const int jb0 = cta_lo / QK_FL_BN, jb1 = (cta_end + QK_FL_BN - 1) / QK_FL_BN;
    if (jb0 < jb1) qk_fl_stage<H, LD>(ktile, kbase, jb0 * QK_FL_BN, cta_end);
    qk_cp_async_commit();
    for (int jb = jb0; jb < jb1; ++jb) {
        const int j0 = jb * QK_FL_BN;
        qk_cp_async_wait<0>();
        __syncthreads(); /* K of this block landed; every group is done with the last V tile */
        qk_fl_stage<H, LD>(vtile, vbase, j0, cta_end);
        qk_cp_async_commit();
        const bool live = active && j0 < grp_end && j0 + QK_FL_BN > grp_lo;
        qk_u32 pa[4][4];
        if (live) {
            float sc[8][4];
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i) sc[j][i] = 0.0f;
#pragma unroll
            for (int k = 0; k < KS; ++k)
#pragma unroll
                for (int np = 0; np < 4; ++np) {
                    qk_u32 bf[4];
                    qk_fl_kfrag<LD>(bf, ktile, 16 * np, 16 * k);
                    qk_mma_16816(sc[2 * np], qa[k], bf);
                    qk_mma_16816(sc[2 * np + 1], qa[k], bf + 2);
                }
            /* scores: sc[j][i] is row g + 8 (i >> 1), key j0 + 8 j + 2 t + (i & 1) */
            float mx[2] = {qk_fl_neg_inf(), qk_fl_neg_inf()};
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int h = i >> 1, key = j0 + 8 * j + 2 * t + (i & 1);
                    float x = qk_fl_neg_inf();
                    if (key >= lo_r[h] && key < L_r[h]) {
                        x = QK_FMUL(sc[j][i], alpha);
                        if (softcap > 0.0f) x = QK_FMUL(tanhf(QK_FDIV(x, softcap)), softcap);
                        if (bias_batch) {
                            const qk_i64 bi = ((bias_row + bias_head) * S + s_r[h]) * T + key;
                            x = QK_FADD(x, qk_load_f(bias, bi, is16));
                        }
                    }
                    sc[j][i] = x;
                    mx[h] = fmaxf(mx[h], x);
                }
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                mx[h] = fmaxf(mx[h], QK_SHFL_XOR(mx[h], 1, 32));
                mx[h] = fmaxf(mx[h], QK_SHFL_XOR(mx[h], 2, 32));
                const float m_new = fmaxf(m_r[h], mx[h]);
                const bool none = m_new == qk_fl_neg_inf(); /* no key of the row yet */
                const float corr = none ? 1.0f : expf(QK_FADD(m_r[h], -m_new));
                float ps = 0.0f;
#pragma unroll
                for (int j = 0; j < 8; ++j)
#pragma unroll
                    for (int i = 2 * h; i < 2 * h + 2; ++i) {
                        const float p = none ? 0.0f : expf(QK_FADD(sc[j][i], -m_new));
                        sc[j][i] = p;
                        ps = QK_FADD(ps, p);
                    }
                l_r[h] = QK_FADD(QK_FMUL(l_r[h], corr), ps);
                m_r[h] = m_new;
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    acc[j][2 * h] = QK_FMUL(acc[j][2 * h], corr);
                    acc[j][2 * h + 1] = QK_FMUL(acc[j][2 * h + 1], corr);
                }
            }
            /* P as A fragments of keys 16 kk .. 16 kk + 15: score tiles 2 kk and 2 kk + 1 */
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                pa[kk][0] = qk_fl_pack(sc[2 * kk][0], sc[2 * kk][1]);
                pa[kk][1] = qk_fl_pack(sc[2 * kk][2], sc[2 * kk][3]);
                pa[kk][2] = qk_fl_pack(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
                pa[kk][3] = qk_fl_pack(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
            }
        }
        qk_cp_async_wait<0>();
        __syncthreads(); /* V of this block landed; every group is done with this K tile */
        if (jb + 1 < jb1) qk_fl_stage<H, LD>(ktile, kbase, j0 + QK_FL_BN, cta_end);
        qk_cp_async_commit();
        if (live) {
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
#pragma unroll
                for (int cp = 0; cp < NT / 2; ++cp) {
                    qk_u32 bf[4];
                    qk_fl_vfrag<LD>(bf, vtile, 16 * kk, 16 * cp);
                    qk_mma_16816(acc[2 * cp], pa[kk], bf);
                    qk_mma_16816(acc[2 * cp + 1], pa[kk], bf + 2);
                }
        }
    }
    qk_cp_async_wait<0>();

#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float l = QK_FADD(l_r[h], QK_SHFL_XOR(l_r[h], 1, 32));
        l = QK_FADD(l, QK_SHFL_XOR(l, 2, 32));
        if (s_r[h] >= S) continue;
        const qk_i64 o = ((qk_i64)b * S + s_r[h]) * ostride + (qk_i64)n * H;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const int c = 8 * j + 2 * t;
            qk_store_f(output, o + c, QK_FDIV(acc[j][2 * h], l), is16);
            qk_store_f(output, o + c + 1, QK_FDIV(acc[j][2 * h + 1], l), is16);
        }
    }
}

#define QK_GQA_PREFILL(NAME, HS)                                                                                      \
    extern "C" __global__ void __launch_bounds__(QK_FL_THREADS)                                                     \
        NAME(const float* qrot, const qk_u16* kc, const qk_u16* vc, qk_i64 kv_rows,                   \
                           const int* seqlens_k, const void* bias, const void* head_sink, void* output, int S,      \
                           int N, int Nk, qk_i64 T, int first_prompt, int window, int bias_batch, int bias_heads,   \
                           int sink_mode, int is16, float alpha, float softcap) {                                   \
        qk_fl_attend<HS>(qrot, kc, vc, kv_rows, seqlens_k, bias, head_sink, output, S, N, Nk, T, first_prompt,     \
                         window, bias_batch, bias_heads, sink_mode, is16, alpha, softcap);                         \
    }

/* qk_gqa_prefill_h<H>: head_size H */
QK_GQA_PREFILL(qk_gqa_prefill_h16, 16)
QK_GQA_PREFILL(qk_gqa_prefill_h32, 32)
QK_GQA_PREFILL(qk_gqa_prefill_h64, 64)
QK_GQA_PREFILL(qk_gqa_prefill_h128, 128)

/* ------------------------------------------------------------------- session 10: the default */

#if !defined(QK_GQA_PREFILL_V1) /* -DQK_GQA_PREFILL_V1: the session-8 kernels above only (the bench's old variant) */

/* qk_gqa_prefill2_h<H> (H 64 or 128; no softcap, no bias, alpha > 0: the launcher hands every other
 * case to qk_gqa_prefill_h<H> above). FlashAttention-2's forward pass (Dao 2023, Alg. 1 and
 * section 3.3: the scale folded into the exponent, masks only on the diagonal blocks): a CTA of 8
 * groups of 32 lanes takes 128 / hpc query rows of each of hpc heads of one KV head (hpc = 4, 2 or
 * 1, the launcher's heads_per_cta: the K / V tiles are loaded once for all), 16 rows a group. K tiles are
 * double-buffered (K of the next block copied during the whole of this block), V single (copied
 * during Q K^T); tiles are [key][H] with 16-byte chunk c of row r stored at chunk c ^ (r & 7), so
 * the 8 rows an ldmatrix phase reads fall on distinct banks (3 tiles: 48 KiB at H = 128).
 *
 * Rounding: as qk_gqa_prefill_h<H> (Q, K, V, P in fp16, fp32 sums, blocks of 64 keys aligned at key
 * 0), but the exponent is taken base 2 with the scale folded in: with c = fp32(alpha log2 e) and the
 * running shift m2 (fp32, the row's max raw score times c, or fp32(sigma log2 e) from a sink),
 * p = ex2(fma(s, c, -m2)) and the rescale ex2(m2_old - m2_new). Against the bound's steps
 * (qconform.ops.ort.attention_bounds, docs/perf-notes.md "Session 10"): c's rounding is the u a_j
 * of the scale multiply it replaces, the fma's the u (y_j + M) of the subtraction, ex2.approx's
 * 2 ulp within the 8 ulp taken for exp; the shift m2 is one fp32 value for the whole row and block,
 * so its own rounding cancels between numerator and denominator. */

#define QK_FL2_THREADS 256 /* 8 groups of 32 lanes, 16 query rows each */
#define QK_FL2_ROWS 128    /* query rows of a CTA (over its hpc heads) */
#define QK_FL2_LOG2E 1.4426950408889634

/* 2^x; -inf gives 0. NVIDIA: ex2.approx.ftz.f32 (PTX ISA, ex2: max 2 ulp); elsewhere exp2f. */
__device__ __forceinline__ float qk_fl2_exp2(float x) {
#if defined(QK_CUDA) && defined(__CUDA_ARCH__)
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    return exp2f(x);
#endif
}

/* qk_fl_pack (round to nearest even, the first value in the low half) in one conversion on NVIDIA */
__device__ __forceinline__ qk_u32 qk_fl2_pack(float lo, float hi) {
#if defined(QK_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    qk_u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); /* PTX: the first source to the upper half */
    return r;
#else
    return qk_fl_pack(lo, hi);
#endif
}

/* halves offset of 16-byte chunk c of row r of a swizzled [key][H] tile */
template <int H>
__device__ __forceinline__ int qk_fl2_at(int r, int c) {
    return r * H + ((c ^ (r & 7)) << 3);
}

/* qk_fl_kfrag's fragments (keys n0.., channels k0..) from a swizzled tile */
template <int H>
__device__ __forceinline__ void qk_fl2_kfrag(qk_u32 r[4], const qk_u16* tile, int n0, int k0) {
    const int lane = (int)(threadIdx.x & 31);
#if defined(QK_FL_LDMATRIX)
    const qk_u16* p = tile + qk_fl2_at<H>(n0 + ((lane >> 4) & 1) * 8 + (lane & 7), (k0 >> 3) + ((lane >> 3) & 1));
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
#else
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int row = n0 + (i >> 1) * 8 + g;
        r[i] = *(const qk_u32*)(tile + qk_fl2_at<H>(row, (k0 >> 3) + (i & 1)) + 2 * t);
    }
#endif
}

/* qk_fl_vfrag's fragments (keys k0.., channels c0..) from a swizzled tile */
template <int H>
__device__ __forceinline__ void qk_fl2_vfrag(qk_u32 r[4], const qk_u16* tile, int k0, int c0) {
    const int lane = (int)(threadIdx.x & 31);
#if defined(QK_FL_LDMATRIX)
    const qk_u16* p = tile + qk_fl2_at<H>(k0 + ((lane >> 3) & 1) * 8 + (lane & 7), (c0 >> 3) + (lane >> 4));
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
#else
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int key = k0 + (i & 1) * 8 + 2 * t, chunk = (c0 >> 3) + (i >> 1);
        r[i] = (qk_u32)tile[qk_fl2_at<H>(key, chunk) + g] | ((qk_u32)tile[qk_fl2_at<H>(key + 1, chunk) + g] << 16);
    }
#endif
}

/* rows [j0, j0 + 64) of a (rows, H) fp16 cache into a swizzled tile; rows at or past `end`
 * zero-filled (never attended) */
template <int H>
__device__ __forceinline__ void qk_fl2_stage(qk_u16* tile, const qk_u16* base, int j0, int end) {
    constexpr int CH = H / 8;
#pragma unroll
    for (int it = 0; it < QK_FL_BN * CH / QK_FL2_THREADS; ++it) {
        const int i = (int)threadIdx.x + it * QK_FL2_THREADS, r = i / CH, c = i % CH;
        const bool in = j0 + r < end;
        qk_cp_async16(tile + qk_fl2_at<H>(r, c), base + (in ? (qk_i64)(j0 + r) * H + c * 8 : 0), in ? 16 : 0);
    }
}

/* One CTA per (block of 128 / hpc query rows, hpc query heads of one KV head, batch b); group w
 * takes head n0 + w / (8 / hpc), rows q0 + 16 (w % (8 / hpc)) .. + 15 (lane 4 g + t: rows g and
 * g + 8 of them). Launch order (blockIdx.x, the one the block scheduler roughly follows): bands of
 * `chunk` row blocks, the longest (the last rows, the most causal keys) first; inside a band every
 * head block in turn, its row blocks longest first. chunk = 1 (the launcher's pick where every
 * head's K / V fit in L2): the longest row blocks of all heads first, so the short ones fill the
 * tail (2k prompt: ~65 block-times an SM instead of ~79, longest-processing-time list scheduling
 * of 512 CTAs on 132 SMs); chunk = all row blocks: one head's blocks after another (its K / V stay
 * hot in L2), the session-10 round-1 order. The CTA loops over the key blocks of [lo(q0), L(its
 * last row)); a group skips the blocks outside its rows' ranges and masks only the blocks its rows
 * do not all see whole (the causal diagonal, a window's first block, the cache's end). */
template <int H>
__device__ __forceinline__ void qk_fl2_attend(const float* qrot, const qk_u16* kc, const qk_u16* vc, qk_i64 kv_rows,
                                              const int* seqlens_k, const void* head_sink, void* output, int S, int N,
                                              int Nk, int first_prompt, int window, int sink_mode, int is16,
                                              float alpha, int hpc, int chunk) {
    constexpr int KS = H / 16, NT = H / 8;
    __shared__ __align__(16) qk_u16 ktile[2][QK_FL_BN * H];
    __shared__ __align__(16) qk_u16 vtile[QK_FL_BN * H];
    const int lane = (int)(threadIdx.x & 31), grp = (int)(threadIdx.x >> 5), g = lane >> 2, t = lane & 3;
    const int rows = QK_FL2_ROWS / hpc, per = 8 / hpc; /* rows and groups of one head */
    const int hblocks = N / hpc, nrb = (int)gridDim.x / hblocks; /* head blocks, row blocks */
    const int band = (int)blockIdx.x / (chunk * hblocks), rem = (int)blockIdx.x - band * chunk * hblocks;
    const int width = chunk < nrb - band * chunk ? chunk : nrb - band * chunk; /* the last band may be short */
    const int rank = band * chunk + rem % width;                                /* 0: the longest row block */
    const int q0 = (nrb - 1 - rank) * rows;
    const int head0 = (rem / width) * hpc, n = head0 + grp / per, b = (int)blockIdx.z;
    const qk_i64 kvh = head0 / (N / Nk);
    const int total = seqlens_k[b] + 1, past = first_prompt ? 0 : total - S;
    const qk_u16* kbase = kc + ((qk_i64)b * Nk + kvh) * kv_rows * H;
    const qk_u16* vbase = vc + ((qk_i64)b * Nk + kvh) * kv_rows * H;

    const int g_first = q0 + 16 * (grp % per);
    int lo_r[2], L_r[2], s_r[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        s_r[h] = g_first + g + 8 * h;
        qk_fl_range(s_r[h], S, past, total, window, lo_r[h], L_r[h]);
    }
    const int last = q0 + rows - 1 < S - 1 ? q0 + rows - 1 : S - 1;
    const int g_last = g_first + 15 < last ? g_first + 15 : last;
    int cta_lo, cta_end, grp_lo, grp_end, in_lo, in_end;
    qk_fl_range(q0, S, past, total, window, cta_lo, in_end);
    qk_fl_range(last, S, past, total, window, in_lo, cta_end);
    /* the group's keys: [lo(first row), L(last row)); every valid row sees [lo(last), L(first)) */
    qk_fl_range(g_first, S, past, total, window, grp_lo, in_end);
    qk_fl_range(g_last, S, past, total, window, in_lo, grp_end);
    const bool active = g_first < S;

    const qk_i64 ostride = (qk_i64)N * H; /* output (B, S, N H) */
    qk_u32 qa[KS][4];
#pragma unroll
    for (int k = 0; k < KS; ++k)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int s = s_r[i & 1], c = 16 * k + 2 * t + (i >> 1) * 8;
            const float* q = qrot + ((qk_i64)b * S + s) * ostride + (qk_i64)n * H + c;
            qa[k][i] = s < S ? qk_fl_pack(q[0], q[1]) : 0u;
        }

    const float c2 = (float)((double)alpha * QK_FL2_LOG2E); /* fp32(alpha log2 e), rounded once */
    const float sigma = sink_mode == 1 ? qk_load_f(head_sink, n, is16) : 0.0f;
    /* a sink is the initial state: shift fp32(sigma log2 e), its term 1 in lane t = 0's sum */
    const float m2_init = sink_mode ? (float)((double)sigma * QK_FL2_LOG2E) : qk_fl_neg_inf();
    float m2[2] = {m2_init, m2_init};
    float lsum[2];
    lsum[0] = lsum[1] = (sink_mode && t == 0) ? 1.0f : 0.0f;
    float o_acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) o_acc[j][i] = 0.0f;

    const int jb0 = cta_lo / QK_FL_BN, jb1 = (cta_end + QK_FL_BN - 1) / QK_FL_BN;
    if (jb0 < jb1) qk_fl2_stage<H>(ktile[0], kbase, jb0 * QK_FL_BN, cta_end);
    qk_cp_async_commit();
    for (int jb = jb0; jb < jb1; ++jb) {
        const int j0 = jb * QK_FL_BN, buf = (jb - jb0) & 1;
        qk_cp_async_wait<0>();
        __syncthreads(); /* K of this block landed; every group is done with the last V tile and K tile */
        qk_fl2_stage<H>(vtile, vbase, j0, cta_end);
        qk_cp_async_commit();
        if (jb + 1 < jb1) qk_fl2_stage<H>(ktile[buf ^ 1], kbase, j0 + QK_FL_BN, cta_end);
        qk_cp_async_commit();
        const bool live = active && j0 < grp_end && j0 + QK_FL_BN > grp_lo;
        qk_u32 pa[4][4];
        if (live) {
            float sc[8][4];
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i) sc[j][i] = 0.0f;
#pragma unroll
            for (int k = 0; k < KS; ++k)
#pragma unroll
                for (int np = 0; np < 4; ++np) {
                    qk_u32 bf[4];
                    qk_fl2_kfrag<H>(bf, ktile[buf], 16 * np, 16 * k);
                    qk_mma_16816(sc[2 * np], qa[k], bf);
                    qk_mma_16816(sc[2 * np + 1], qa[k], bf + 2);
                }
            /* raw scores: sc[j][i] is row g + 8 (i >> 1), key j0 + 8 j + 2 t + (i & 1) */
            const bool whole = j0 >= in_lo && j0 + QK_FL_BN <= in_end;
            if (!whole) {
#pragma unroll
                for (int j = 0; j < 8; ++j)
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const int h = i >> 1, key = j0 + 8 * j + 2 * t + (i & 1);
                        if (key < lo_r[h] || key >= L_r[h]) sc[j][i] = qk_fl_neg_inf();
                    }
            }
            float mx[2] = {qk_fl_neg_inf(), qk_fl_neg_inf()}, rsc[2];
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i) mx[i >> 1] = fmaxf(mx[i >> 1], sc[j][i]);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                mx[h] = fmaxf(mx[h], QK_SHFL_XOR(mx[h], 1, 32));
                mx[h] = fmaxf(mx[h], QK_SHFL_XOR(mx[h], 2, 32));
                const float m2_new = fmaxf(m2[h], QK_FMUL(mx[h], c2));
                const bool empty = m2_new == qk_fl_neg_inf(); /* no key of the row yet, no sink */
                const float rs = empty ? 1.0f : qk_fl2_exp2(QK_FADD(m2[h], -m2_new));
                const float shift = empty ? 0.0f : m2_new;
                float part = 0.0f;
#pragma unroll
                for (int j = 0; j < 8; ++j)
#pragma unroll
                    for (int i = 2 * h; i < 2 * h + 2; ++i) {
                        const float p = qk_fl2_exp2(fmaf(sc[j][i], c2, -shift));
                        sc[j][i] = p;
                        part = QK_FADD(part, p);
                    }
                lsum[h] = QK_FADD(QK_FMUL(lsum[h], rs), part);
                m2[h] = m2_new;
                rsc[h] = rs;
            }
            /* the accumulator times rs (exact when rs = 1: skipped when no row of the group raised
             * its max, most blocks of a long row) */
            if (rsc[0] != 1.0f || rsc[1] != 1.0f) {
#pragma unroll
                for (int j = 0; j < NT; ++j)
#pragma unroll
                    for (int i = 0; i < 4; ++i) o_acc[j][i] = QK_FMUL(o_acc[j][i], rsc[i >> 1]);
            }
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                pa[kk][0] = qk_fl2_pack(sc[2 * kk][0], sc[2 * kk][1]);
                pa[kk][1] = qk_fl2_pack(sc[2 * kk][2], sc[2 * kk][3]);
                pa[kk][2] = qk_fl2_pack(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
                pa[kk][3] = qk_fl2_pack(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
            }
        }
        qk_cp_async_wait<1>();
        __syncthreads(); /* V of this block landed (K of the next may still be in flight) */
        if (live) {
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
#pragma unroll
                for (int cp = 0; cp < NT / 2; ++cp) {
                    qk_u32 bf[4];
                    qk_fl2_vfrag<H>(bf, vtile, 16 * kk, 16 * cp);
                    qk_mma_16816(o_acc[2 * cp], pa[kk], bf);
                    qk_mma_16816(o_acc[2 * cp + 1], pa[kk], bf + 2);
                }
        }
    }
    qk_cp_async_wait<0>();

#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float l = QK_FADD(lsum[h], QK_SHFL_XOR(lsum[h], 1, 32));
        l = QK_FADD(l, QK_SHFL_XOR(l, 2, 32));
        if (s_r[h] >= S) continue;
        const qk_i64 o = ((qk_i64)b * S + s_r[h]) * ostride + (qk_i64)n * H;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const int c = 8 * j + 2 * t;
            qk_store_f(output, o + c, QK_FDIV(o_acc[j][2 * h], l), is16);
            qk_store_f(output, o + c + 1, QK_FDIV(o_acc[j][2 * h + 1], l), is16);
        }
    }
}

#define QK_GQA_PREFILL2(NAME, HS)                                                                                     \
    extern "C" __global__ void __launch_bounds__(QK_FL2_THREADS, 1)                                                 \
        NAME(const float* qrot, const qk_u16* kc, const qk_u16* vc, qk_i64 kv_rows, const int* seqlens_k,          \
             const void* head_sink, void* output, int S, int N, int Nk, int first_prompt, int window, int sink_mode, \
             int is16, float alpha, int hpc, int chunk) {                                                           \
        qk_fl2_attend<HS>(qrot, kc, vc, kv_rows, seqlens_k, head_sink, output, S, N, Nk, first_prompt, window,      \
                          sink_mode, is16, alpha, hpc, chunk);                                                      \
    }

/* qk_gqa_prefill2_h<H>: head_size H */
QK_GQA_PREFILL2(qk_gqa_prefill2_h64, 64)
QK_GQA_PREFILL2(qk_gqa_prefill2_h128, 128)

#endif /* !QK_GQA_PREFILL_V1 */

/* The session-7 attention kernels of ort/gqa.hip, kept for side-by-side timing only: compiled
 * into gqa.hip with -DQK_GQA_LEGACY (qconform.device.launchers.compile_options), launched by
 * qconform.device.ort.group_query_attention under that option (``python -m qconform.bench.gqa
 * --variants``). One CTA per (query row, split, KV head, block of 8 of its query heads): scores of
 * the split's keys into shared memory (2- or 1-byte loads of a lane's channels, a warp sum per key
 * and head), softmax, then P V; the same outputs and bounds as the flash kernels of gqa.hip.
 * Needs gqa.hip's helpers (qk_gqa_neg_inf, qk_gqa_score, QK_GQA_THREADS) before the include. */
#ifndef QK_GQA_LEGACY_H
#define QK_GQA_LEGACY_H

#define QK_GQA_HEADS 8 /* query heads of one KV head a legacy attention CTA takes */

/* cache element c of a row (KIND 0 fp32, 1 fp16, 2 int8, 3 4-bit codes two a byte, element 2i
 * in the low nibble), dequantized as the oracle does: fp32(code * scale) */
template <int KIND>
__device__ __forceinline__ float qk_gqa_cache(const void* row, int c, float scale) {
    if (KIND == 0) return ((const float*)row)[c];
    if (KIND == 1) return __half2float(((const __half*)row)[c]);
    if (KIND == 2) return QK_FMUL((float)((const qk_i8*)row)[c], scale);
    const unsigned byte = ((const qk_u8*)row)[c >> 1];
    return QK_FMUL((float)((int)((c & 1) ? (byte >> 4) : (byte & 0x0Fu)) - 8), scale);
}

__device__ __forceinline__ float qk_gqa_warp_sum(float v) {
    for (int off = QK_WARP / 2; off > 0; off >>= 1) v += QK_SHFL_XOR(v, off, QK_WARP);
    return v;
}

__device__ __forceinline__ float qk_gqa_warp_max(float v) {
    for (int off = QK_WARP / 2; off > 0; off >>= 1) v = fmaxf(v, QK_SHFL_XOR(v, off, QK_WARP));
    return v;
}


/* One CTA per (query row (b, s), split sp of the keys, KV head g, block of up to QK_GQA_HEADS of
 * g's query heads): keys [max(lo, sp chunk), min(L, (sp + 1) chunk)) of the row's causal range
 * [lo, L), L = min(past_b + s + 1, total_b), lo = L - W with a window of W < L keys. Warp w takes
 * keys in runs of KU; lane l channels l, l + QK_WARP, ... (SLOTS of them). Writes the split's
 * max m, sum of exp(x - m) and unnormalised P V (fp32) per query head. */
template <int KIND, int SLOTS>
__device__ __forceinline__ void qk_gqa_attend(const float* qrot, const void* present_key, const void* present_value,
                                              const int* seqlens_k, const void* attention_bias, const float* k_scale,
                                              const float* v_scale, float* part_m, float* part_l, float* part_acc,
                                              qk_i64 S, qk_i64 N, qk_i64 Nk, qk_i64 H, qk_i64 Tp, qk_i64 T,
                                              int first_prompt, int window, int bias_batch, int bias_heads,
                                              int per_channel, int is16, float alpha, float softcap, int chunk,
                                              int splits) {
    extern __shared__ float qk_gqa_smem[];
    /* key rows a warp loads before using them: more for 1-byte caches, fewer for wide heads */
    constexpr int KU = (KIND >= 2 ? 8 : 4) / (SLOTS >= 8 ? 2 : 1);
    const int nw = QK_GQA_THREADS / QK_WARP, warp = (int)threadIdx.x / QK_WARP, lane = (int)threadIdx.x % QK_WARP;
    const int sp = (int)(blockIdx.x % splits);
    const qk_i64 bs = blockIdx.x / splits, b = bs / S, s = bs % S;
    const qk_i64 G = N / Nk, nhb = (G + QK_GQA_HEADS - 1) / QK_GQA_HEADS;
    const qk_i64 g = blockIdx.y / nhb, h0 = g * G + (blockIdx.y % nhb) * QK_GQA_HEADS;
    const int nh = (int)(G - (blockIdx.y % nhb) * QK_GQA_HEADS < QK_GQA_HEADS ? G - (blockIdx.y % nhb) * QK_GQA_HEADS
                                                                               : QK_GQA_HEADS);
    const qk_i64 total = (qk_i64)seqlens_k[b] + 1, past = first_prompt ? 0 : total - S;
    const qk_i64 L = past + s + 1 < total ? past + s + 1 : total;
    const qk_i64 lo = (window >= 1 && L > window) ? L - window : 0;
    const qk_i64 k0 = lo > (qk_i64)sp * chunk ? lo : (qk_i64)sp * chunk;
    const qk_i64 k1 = L < (qk_i64)(sp + 1) * chunk ? L : (qk_i64)(sp + 1) * chunk;
    const int n = k1 > k0 ? (int)(k1 - k0) : 0;
    const qk_i64 o = (bs * N + h0) * splits + sp; /* head h's slot: o + h * splits */
    if (n == 0) {
        if ((int)threadIdx.x < nh) {
            part_m[o + threadIdx.x * splits] = qk_gqa_neg_inf();
            part_l[o + threadIdx.x * splits] = 0.0f;
        }
        return;
    }
    float* q_s = qk_gqa_smem;                             /* [QK_GQA_HEADS][H] */
    float* stat = q_s + QK_GQA_HEADS * H;                 /* m [QK_GQA_HEADS], l [QK_GQA_HEADS] */
    float* buf = stat + 2 * QK_GQA_HEADS;                 /* scores [QK_GQA_HEADS][chunk], then [nw][HEADS][H] */
    for (qk_i64 i = threadIdx.x; i < nh * H; i += QK_GQA_THREADS) q_s[i] = qrot[(bs * N + h0) * H + i];
    const int kind_bytes = KIND == 0 ? 4 : (KIND == 1 ? 2 : 1);
    const qk_i64 row_bytes = KIND == 3 ? H / 2 : H * kind_bytes;
    const char* kbase = (const char*)present_key + (b * Nk + g) * Tp * row_bytes;
    const char* vbase = (const char*)present_value + (b * Nk + g) * Tp * row_bytes;
    float ks[SLOTS], vs[SLOTS];
#pragma unroll
    for (int sl = 0; sl < SLOTS; ++sl) {
        const int c = lane + sl * QK_WARP;
        const qk_i64 ci = per_channel ? g * H + (c < H ? c : 0) : 0;
        ks[sl] = KIND >= 2 ? k_scale[ci] : 1.0f;
        vs[sl] = KIND >= 2 ? v_scale[ci] : 1.0f;
    }
    const qk_i64 bias_row = bias_batch ? ((bias_batch == 1 ? 0 : b) * bias_heads) : 0;
    __syncthreads();

    /* scores of the split's keys: warp w takes keys [w KU, w KU + KU), then nw KU further on; the
     * KU rows are loaded before any is used (loads in flight) */
    for (int i0 = warp * KU; i0 < n; i0 += nw * KU) {
        float kv[KU][SLOTS];
#pragma unroll
        for (int u = 0; u < KU; ++u) {
            const void* krow = kbase + (k0 + (i0 + u < n ? i0 + u : i0)) * row_bytes;
#pragma unroll
            for (int sl = 0; sl < SLOTS; ++sl) {
                const int c = lane + sl * QK_WARP;
                kv[u][sl] = c < H ? qk_gqa_cache<KIND>(krow, c, ks[sl]) : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < KU; ++u) {
            const int i = i0 + u;
            if (i >= n) break;
#pragma unroll
            for (int h = 0; h < QK_GQA_HEADS; ++h) {
                if (h >= nh) break;
                float d = 0.0f;
#pragma unroll
                for (int sl = 0; sl < SLOTS; ++sl) {
                    const int c = lane + sl * QK_WARP;
                    if (c < H) d = __fmaf_rn(q_s[h * H + c], kv[u][sl], d);
                }
                d = qk_gqa_warp_sum(d);
                if (lane == 0) {
                    const qk_i64 head = bias_heads == 1 ? 0 : h0 + h;
                    const qk_i64 bi = ((bias_row + head) * S + s) * T + k0 + i;
                    buf[h * chunk + i] = qk_gqa_score(d, alpha, softcap, bias_batch ? attention_bias : 0, bi, is16);
                }
            }
        }
    }
    __syncthreads();

    /* per head: m = the split's max, p = exp(x - m) in place, l = sum p */
    for (int h = warp; h < nh; h += nw) {
        float m = qk_gqa_neg_inf();
        for (int i = lane; i < n; i += QK_WARP) m = fmaxf(m, buf[h * chunk + i]);
        m = qk_gqa_warp_max(m);
        float l = 0.0f;
        for (int i = lane; i < n; i += QK_WARP) {
            const float p = expf(QK_FADD(buf[h * chunk + i], -m));
            buf[h * chunk + i] = p;
            l = QK_FADD(l, p);
        }
        l = qk_gqa_warp_sum(l);
        if (lane == 0) {
            stat[h] = m;
            stat[QK_GQA_HEADS + h] = l;
        }
    }
    __syncthreads();

    /* P V of the split's keys */
    float acc[QK_GQA_HEADS][SLOTS];
#pragma unroll
    for (int h = 0; h < QK_GQA_HEADS; ++h)
#pragma unroll
        for (int sl = 0; sl < SLOTS; ++sl) acc[h][sl] = 0.0f;
    for (int i0 = warp * KU; i0 < n; i0 += nw * KU) {
        float vv[KU][SLOTS];
#pragma unroll
        for (int u = 0; u < KU; ++u) {
            const void* vrow = vbase + (k0 + (i0 + u < n ? i0 + u : i0)) * row_bytes;
#pragma unroll
            for (int sl = 0; sl < SLOTS; ++sl) {
                const int c = lane + sl * QK_WARP;
                vv[u][sl] = c < H ? qk_gqa_cache<KIND>(vrow, c, vs[sl]) : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < KU; ++u) {
            if (i0 + u >= n) break;
#pragma unroll
            for (int h = 0; h < QK_GQA_HEADS; ++h) {
                if (h >= nh) break;
                const float p = buf[h * chunk + i0 + u];
#pragma unroll
                for (int sl = 0; sl < SLOTS; ++sl) acc[h][sl] = __fmaf_rn(p, vv[u][sl], acc[h][sl]);
            }
        }
    }
    __syncthreads(); /* buf is reused for the warps' partial sums */
#pragma unroll
    for (int h = 0; h < QK_GQA_HEADS; ++h) {
        if (h >= nh) break;
#pragma unroll
        for (int sl = 0; sl < SLOTS; ++sl) {
            const int c = lane + sl * QK_WARP;
            if (c < H) buf[(warp * QK_GQA_HEADS + h) * H + c] = acc[h][sl];
        }
    }
    __syncthreads();
    for (qk_i64 idx = threadIdx.x; idx < nh * H; idx += QK_GQA_THREADS) {
        const qk_i64 h = idx / H, c = idx % H;
        float a = 0.0f;
        for (int w = 0; w < nw; ++w) a = QK_FADD(a, buf[(w * QK_GQA_HEADS + h) * H + c]);
        part_acc[(o + h * splits) * H + c] = a;
    }
    if ((int)threadIdx.x < nh) {
        part_m[o + threadIdx.x * splits] = stat[threadIdx.x];
        part_l[o + threadIdx.x * splits] = stat[QK_GQA_HEADS + threadIdx.x];
    }
}

#define QK_GQA_ATTEND(NAME, KIND, SLOTS)                                                                             \
    extern "C" __global__ void __launch_bounds__(QK_GQA_THREADS)                                                     \
        NAME(const float* qrot, const void* present_key, const void* present_value, const int* seqlens_k,            \
             const void* attention_bias, const float* k_scale, const float* v_scale, float* part_m, float* part_l,   \
             float* part_acc, qk_i64 S, qk_i64 N, qk_i64 Nk, qk_i64 H, qk_i64 Tp, qk_i64 T, int first_prompt,        \
             int window, int bias_batch, int bias_heads, int per_channel, int is16, float alpha, float softcap,       \
             int chunk, int splits) {                                                                                \
        qk_gqa_attend<KIND, SLOTS>(qrot, present_key, present_value, seqlens_k, attention_bias, k_scale, v_scale,   \
                                   part_m, part_l, part_acc, S, N, Nk, H, Tp, T, first_prompt, window, bias_batch,  \
                                   bias_heads, per_channel, is16, alpha, softcap, chunk, splits);                   \
    }

/* qk_gqa_attend_<cache>_s<SLOTS>: head_size <= SLOTS * QK_WARP */
QK_GQA_ATTEND(qk_gqa_attend_f32_s2, 0, 2)
QK_GQA_ATTEND(qk_gqa_attend_f32_s4, 0, 4)
QK_GQA_ATTEND(qk_gqa_attend_f32_s8, 0, 8)
QK_GQA_ATTEND(qk_gqa_attend_f16_s2, 1, 2)
QK_GQA_ATTEND(qk_gqa_attend_f16_s4, 1, 4)
QK_GQA_ATTEND(qk_gqa_attend_f16_s8, 1, 8)
QK_GQA_ATTEND(qk_gqa_attend_i8_s2, 2, 2)
QK_GQA_ATTEND(qk_gqa_attend_i8_s4, 2, 4)
QK_GQA_ATTEND(qk_gqa_attend_i8_s8, 2, 8)
QK_GQA_ATTEND(qk_gqa_attend_u4_s2, 3, 2)
QK_GQA_ATTEND(qk_gqa_attend_u4_s4, 3, 4)
QK_GQA_ATTEND(qk_gqa_attend_u4_s8, 3, 8)

/* legacy: one thread per output element (b, s, n, c): the splits combined in split order,
 * M = max(m_sp, sink), l = sum l_sp exp(m_sp - M) (+ exp(sink - M)), o = sum acc_sp exp(m_sp - M) / l.
 * sink_mode: 0 none, 1 head_sink[n], 2 a zero logit (smooth_softmax). */
extern "C" __global__ void __launch_bounds__(256)
    qk_gqa_combine_legacy(const float* part_m, const float* part_l, const float* part_acc, const void* head_sink,
                   void* output, qk_i64 rows, qk_i64 N, qk_i64 H, int splits, int sink_mode, int is16) {
    const qk_i64 t = qk_global_thread();
    if (t >= rows * H) return;
    const qk_i64 r = t / H, c = t % H;
    float M = qk_gqa_neg_inf();
    for (int sp = 0; sp < splits; ++sp) M = fmaxf(M, part_m[r * splits + sp]);
    const float sigma = sink_mode == 1 ? qk_load_f(head_sink, r % N, is16) : 0.0f;
    if (sink_mode) M = fmaxf(M, sigma);
    float l = 0.0f, a = 0.0f;
    for (int sp = 0; sp < splits; ++sp) {
        const qk_i64 k = r * splits + sp;
        const float m = part_m[k];
        if (m == qk_gqa_neg_inf()) continue;
        const float f = expf(QK_FADD(m, -M));
        l = QK_FADD(l, QK_FMUL(part_l[k], f));
        a = QK_FADD(a, QK_FMUL(part_acc[k * H + c], f));
    }
    if (sink_mode) l = QK_FADD(l, expf(QK_FADD(sigma, -M)));
    qk_store_f(output, t, QK_FDIV(a, l), is16);
}

#endif /* QK_GQA_LEGACY_H */

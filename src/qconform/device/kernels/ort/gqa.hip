/* com.microsoft.GroupQueryAttention on the device: the append (rotary of the new Q and K, the new
 * K / V rows into present, quantized for an int8 / 4-bit cache, the past rows copied), a split-K
 * attention over the cache and a combine of the splits in fixed split order (no atomics).
 *
 * Semantics: qconform.oracles.ort.group_query_attention (docs/ort-ops.md section 4); upstream
 * onnxruntime/contrib_ops/cpu/bert/gqa_attention_base.h (ConcatStateChunkGQA, the quantized
 * ConcatQuantStateChunkGQA, ComputeAttentionProbs), rotary_embedding.cc and MLAS
 * rotary_embedding_kernel_avx2_fp32.cpp / rotary_embedding.cpp (rotation rounding), MLAS
 * qkv_quant.cpp (QuantizeInt8, QuantizeRowInt4: q = clamp(rint(fp32(x * fp32(1/scale))))).
 *
 * Rounding: the present caches are the oracle's bit for bit -- fp32 rotary as ORT's AVX2 kernel
 * (a' = fma(a, c, -fp32(b t)), b' = fma(a, t, fp32(b c))), fp16 rotary computed in fp32 (the
 * products of fp16 values exact) and rounded once to fp16; K quantized after rotary, half to even.
 * Attention in fp32 (fp32 dot products, exp, softmax and P V; Q, K, V and P never stored in a
 * narrower type): each output within the strict contract's bound (attention_bounds). */
#include "ort_common.h"

#define QK_GQA_THREADS 128 /* threads of an attention CTA */
#define QK_GQA_HEADS 8     /* query heads of one KV head an attention CTA takes (a block of its group) */

__device__ __forceinline__ float qk_gqa_neg_inf() { return qk_float(0xFF800000u); }

/* ---------------------------------------------------------------------------------- append */

/* one element of a rotated pair (a, b) = (x[ia], x[ib]) with c = cos, t = sin: the first
 * a c - b t, the second a t + b c. fp16 inputs: both products exact in fp32, one rounding of the
 * sum, then fp16 (MLAS's scalar fallback, x86 has no fp16 rotary kernel); fp32: the AVX2 kernel's
 * fused form (the product with b rounded first, the other fused). */
__device__ __forceinline__ float qk_gqa_rotate(float a, float b, float c, float t, int second, int is16) {
    if (is16) {
        const float v = second ? QK_FADD(QK_FMUL(a, t), QK_FMUL(b, c)) : QK_FADD(QK_FMUL(a, c), -QK_FMUL(b, t));
        return __half2float(qk_half_rn(v));
    }
    return second ? __fmaf_rn(a, t, QK_FMUL(b, c)) : __fmaf_rn(a, c, -QK_FMUL(b, t));
}

/* the pair of element e of a row under rotary: source indices ia, ib, the frequency index i and
 * which of the pair e is (rotary_interleaved: (2i, 2i+1); else the half split (i, i + rd/2)) */
struct qk_gqa_pair {
    int ia, ib, i, second;
};

__device__ __forceinline__ qk_gqa_pair qk_gqa_pair_of(int e, int rd, int interleaved) {
    qk_gqa_pair p;
    if (interleaved) {
        p.i = e >> 1;
        p.ia = e & ~1;
        p.second = e & 1;
    } else {
        p.second = e >= rd / 2;
        p.i = p.second ? e - rd / 2 : e;
        p.ia = p.i;
    }
    p.ib = interleaved ? p.ia + 1 : p.ia + rd / 2;
    return p;
}

/* q = clamp(rint(fp32(x * inv)), lo, hi), rint half to even, NaN -> 0 (MLAS QuantizeInt8) */
__device__ __forceinline__ int qk_gqa_quantize(float x, float inv, int lo, int hi) {
    const float r = rintf(QK_FMUL(x, inv));
    if (qk_isnan(r)) return 0;
    return r < (float)lo ? lo : (r > (float)hi ? hi : (int)r);
}

/* the rotary position of token s of batch b (position_ids: [0, 0] + s on a first prompt) */
__device__ __forceinline__ qk_i64 qk_gqa_position(const qk_i64* position_ids, qk_i64 pid_stride, qk_i64 b, qk_i64 s,
                                                   qk_i64 past, int first_prompt) {
    if (position_ids) return first_prompt ? position_ids[0] + s : position_ids[b * pid_stride + s];
    return first_prompt ? s : past + s;
}

/* One thread per pair of channels (2i, 2i+1) of one new row: a Q head (rotated into qrot, fp32
 * values of the input type's rounding), a K head (rotated, then quantized) or a V head, written
 * to present rows past_b + s. Rows of present past them are never written. */
extern "C" __global__ void __launch_bounds__(256)
    qk_gqa_append(const void* query, const void* key, const void* value, const int* seqlens_k, const void* cos_cache,
                  const void* sin_cache, const qk_i64* position_ids, const float* k_scale, const float* v_scale,
                  float* qrot, void* present_key, void* present_value, qk_i64 B, qk_i64 S, qk_i64 N, qk_i64 Nk,
                  qk_i64 H, qk_i64 Tp, qk_i64 pid_stride, int first_prompt, int packed, int rotary_dim,
                  int interleaved, int bits, int per_channel, int is16) {
    const qk_i64 t = qk_global_thread();
    const qk_i64 heads = N + 2 * Nk, half_h = H / 2;
    if (t >= B * S * heads * half_h) return;
    const int e0 = (int)(t % half_h) * 2;
    const qk_i64 hh = (t / half_h) % heads, bs = t / (half_h * heads);
    const qk_i64 b = bs / S, s = bs % S;
    const qk_i64 past = first_prompt ? 0 : (qk_i64)seqlens_k[b] + 1 - S;
    const int kind = hh < N ? 0 : (hh < N + Nk ? 1 : 2); /* Q, K, V */
    const qk_i64 kv = kind == 1 ? hh - N : hh - N - Nk;
    const void* base = packed ? query : (kind == 0 ? query : (kind == 1 ? key : value));
    const qk_i64 row_heads = packed ? heads : (kind == 0 ? N : Nk);
    const qk_i64 head = packed ? hh : (kind == 0 ? hh : kv);
    const qk_i64 src = (bs * row_heads + head) * H;
    float y[2];
    const int rotate = kind != 2 && rotary_dim > 0;
    const qk_i64 pos = rotate ? qk_gqa_position(position_ids, pid_stride, b, s, past, first_prompt) : 0;
    for (int k = 0; k < 2; ++k) {
        const int e = e0 + k;
        if (!rotate || e >= rotary_dim) {
            y[k] = qk_load_f(base, src + e, is16);
            continue;
        }
        const qk_gqa_pair p = qk_gqa_pair_of(e, rotary_dim, interleaved);
        const qk_i64 cs = pos * (rotary_dim / 2) + p.i;
        const float c = qk_load_f(cos_cache, cs, is16), sn = qk_load_f(sin_cache, cs, is16);
        if (kind == 0) {
            y[k] = qk_gqa_rotate(qk_load_f(base, src + p.ia, is16), qk_load_f(base, src + p.ib, is16), c, sn,
                                 p.second, is16);
        } else {
            const float ka = qk_load_f(base, src + p.ia, is16), kb = qk_load_f(base, src + p.ib, is16);
            y[k] = qk_gqa_rotate(ka, kb, c, sn, p.second, is16);
        }
    }
    if (kind == 0) {
        qrot[(bs * N + hh) * H + e0] = y[0];
        qrot[(bs * N + hh) * H + e0 + 1] = y[1];
        return;
    }
    void* present = kind == 1 ? present_key : present_value;
    const qk_i64 row = (b * Nk + kv) * Tp + past + s;
    if (bits == 0) {
        qk_store_f(present, row * H + e0, y[0], is16);
        qk_store_f(present, row * H + e0 + 1, y[1], is16);
        return;
    }
    const float* sc = kind == 1 ? k_scale : v_scale;
    int q[2];
    for (int k = 0; k < 2; ++k) {
        const float scale = sc[per_channel ? kv * H + e0 + k : 0];
        q[k] = qk_gqa_quantize(y[k], QK_FDIV(1.0f, scale), bits == 8 ? -128 : -8, bits == 8 ? 127 : 7);
    }
    if (bits == 8) {
        ((qk_i8*)present)[row * H + e0] = (qk_i8)q[0];
        ((qk_i8*)present)[row * H + e0 + 1] = (qk_i8)q[1];
    } else {
        ((qk_u8*)present)[row * half_h + e0 / 2] = (qk_u8)((q[0] + 8) | ((q[1] + 8) << 4));
    }
}

/* present rows [0, past_b) of batch b copied from the past (separate buffers), one thread per
 * 4-byte word of a row (row_words = the row's bytes / 4: every cache row holds a multiple of 4). */
extern "C" __global__ void __launch_bounds__(256)
    qk_gqa_copy_past(const qk_u32* past, qk_u32* present, const int* seqlens_k, qk_i64 B, qk_i64 Nk, qk_i64 P,
                     qk_i64 Tp, qk_i64 S, qk_i64 row_words) {
    const qk_i64 t = qk_global_thread();
    if (t >= B * Nk * P * row_words) return;
    const qk_i64 w = t % row_words, r = (t / row_words) % P, bg = t / (row_words * P);
    const qk_i64 past_b = (qk_i64)seqlens_k[bg / Nk] + 1 - S;
    if (r >= past_b) return;
    present[(bg * Tp + r) * row_words + w] = past[t];
}

/* ------------------------------------------------------------------------------- attention */

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

/* x = fp32(dot * alpha); softcap c > 0: fp32(fp32(tanh(fp32(x / c))) * c); then + the bias */
__device__ __forceinline__ float qk_gqa_score(float dot, float alpha, float softcap, const void* bias, qk_i64 bi,
                                              int is16) {
    float x = QK_FMUL(dot, alpha);
    if (softcap > 0.0f) x = QK_FMUL(tanhf(QK_FDIV(x, softcap)), softcap);
    if (bias) x = QK_FADD(x, qk_load_f(bias, bi, is16));
    return x;
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

/* One thread per output element (b, s, n, c): the splits combined in split order,
 * M = max(m_sp, sink), l = sum l_sp exp(m_sp - M) (+ exp(sink - M)), o = sum acc_sp exp(m_sp - M) / l.
 * sink_mode: 0 none, 1 head_sink[n], 2 a zero logit (smooth_softmax). */
extern "C" __global__ void __launch_bounds__(256)
    qk_gqa_combine(const float* part_m, const float* part_l, const float* part_acc, const void* head_sink,
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

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
 * narrower type): each output within the strict contract's bound (attention_bounds). The matrix-unit
 * kernels (qk_gqa_mma_*, fp16 queries) take Q, K and V as the fp16 values they are (int8 codes are
 * exact in fp16) and P as two fp16 halves (hi + lo, 22 bits: see qk_gqa_mma). */
#include "ort_common.h"
#include "qk_phases.h" /* bench-only -DQK_PHASES: the mma decode's boundaries 0..9 */

#define QK_GQA_THREADS 128 /* threads of an attention CTA */
#define QK_GQA_MAX_SPLITS 512 /* splits the combine takes */
#define QK_GQA_CC 16       /* channels of a combine CTA */
#define QK_GQA_HB 4        /* query heads of one KV head a flash CTA takes (a block of its group) */

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

/* where head hh (Q, then K, then V) of token bs's new row starts in its input: base and element offset */
__device__ __forceinline__ const void* qk_gqa_new_source(const void* query, const void* key, const void* value,
                                                         int packed, qk_i64 N, qk_i64 Nk, qk_i64 H, qk_i64 bs,
                                                         qk_i64 hh, qk_i64& src) {
    const int kind = hh < N ? 0 : (hh < N + Nk ? 1 : 2);
    const qk_i64 kv = kind == 1 ? hh - N : hh - N - Nk;
    const qk_i64 row_heads = packed ? N + 2 * Nk : (kind == 0 ? N : Nk);
    src = (bs * row_heads + (packed ? hh : (kind == 0 ? hh : kv))) * H;
    return packed ? query : (kind == 0 ? query : (kind == 1 ? key : value));
}

/* element e of a new row from base + src, rotated at position pos where rotate and e < rotary_dim
 * (qk_gqa_append's arithmetic: the input type's rounding) */
__device__ __forceinline__ float qk_gqa_new_value(const void* base, qk_i64 src, int e, int rotate, int rotary_dim,
                                                  int interleaved, const void* cos_cache, const void* sin_cache,
                                                  qk_i64 pos, int is16) {
    if (!rotate || e >= rotary_dim) return qk_load_f(base, src + e, is16);
    const qk_gqa_pair p = qk_gqa_pair_of(e, rotary_dim, interleaved);
    const qk_i64 cs = pos * (rotary_dim / 2) + p.i;
    const float c = qk_load_f(cos_cache, cs, is16), sn = qk_load_f(sin_cache, cs, is16);
    return qk_gqa_rotate(qk_load_f(base, src + p.ia, is16), qk_load_f(base, src + p.ib, is16), c, sn, p.second, is16);
}

/* the reads of element e of a new row at base + src (qk_gqa_new_value's): x[0] = x[ia], x[1] = x[ib]
 * of its rotary pair where rot, else element e twice; p its pair (-DQK_GQA_APPEND_LOADS_FIRST) */
__device__ __forceinline__ void qk_gqa_new_inputs(float (&x)[2], qk_gqa_pair& p, const void* base, qk_i64 src, int e,
                                                  int rot, int rotary_dim, int interleaved) {
    p = qk_gqa_pair_of(e, rotary_dim, interleaved);
    x[0] = qk_load_f(base, src + (rot ? p.ia : e), 1);
    x[1] = qk_load_f(base, src + (rot ? p.ib : e), 1);
}

/* qk_gqa_append's outputs, bit for bit (each element by the same arithmetic), one thread per 8
 * channels [e0, e0 + 8) of one new row (H % 8 == 0): blockIdx.x is the token b S + s,
 * blockIdx.y 256 + threadIdx.x the row's head hh (Q, then K, then V) times H / 8 plus the chunk;
 * the index arithmetic in 32 bits (qk_gqa_append's 64-bit divisions per pair of channels are most
 * of its instructions: docs/perf-notes.md "Session 10: ... round 2"). The flash prefill's append
 * (qconform.device.ort.gqa_flash; its -DQK_GQA_PREFILL_V1 build runs qk_gqa_append). */
extern "C" __global__ void __launch_bounds__(256)
    qk_gqa_append8(const void* query, const void* key, const void* value, const int* seqlens_k, const void* cos_cache,
                   const void* sin_cache, const qk_i64* position_ids, const float* k_scale, const float* v_scale,
                   float* qrot, void* present_key, void* present_value, qk_i64 B, qk_i64 S, qk_i64 N, qk_i64 Nk,
                   qk_i64 H, qk_i64 Tp, qk_i64 pid_stride, int first_prompt, int packed, int rotary_dim,
                   int interleaved, int bits, int per_channel, int is16) {
    const int chunks = (int)H / 8, heads = (int)(N + 2 * Nk);
    const int idx = (int)(blockIdx.y * blockDim.x + threadIdx.x);
    if (idx >= heads * chunks) return;
    const int hh = idx / chunks, e0 = (idx - hh * chunks) * 8;
    const int bs32 = (int)blockIdx.x, b32 = bs32 / (int)S;
    const qk_i64 bs = bs32, b = b32, s = bs32 - b32 * (int)S;
    const qk_i64 past = first_prompt ? 0 : (qk_i64)seqlens_k[b] + 1 - S;
    const int kind = hh < N ? 0 : (hh < N + Nk ? 1 : 2); /* Q, K, V */
    const qk_i64 kv = kind == 1 ? hh - N : hh - N - Nk;
    qk_i64 src;
    const void* base = qk_gqa_new_source(query, key, value, packed, N, Nk, H, bs, hh, src);
    float y[8];
    const int rotate = kind != 2 && rotary_dim > 0;
    const qk_i64 pos = rotate ? qk_gqa_position(position_ids, pid_stride, b, s, past, first_prompt) : 0;
#pragma unroll
    for (int k = 0; k < 8; ++k)
        y[k] = qk_gqa_new_value(base, src, e0 + k, rotate, rotary_dim, interleaved, cos_cache, sin_cache, pos, is16);
    if (kind == 0) {
        float* q = qrot + (bs * N + hh) * H + e0;
#pragma unroll
        for (int k = 0; k < 8; ++k) q[k] = y[k];
        return;
    }
    void* present = kind == 1 ? present_key : present_value;
    const qk_i64 row = (b * Nk + kv) * Tp + past + s;
    if (bits == 0) {
#pragma unroll
        for (int k = 0; k < 8; ++k) qk_store_f(present, row * H + e0 + k, y[k], is16);
        return;
    }
    const float* sc = kind == 1 ? k_scale : v_scale;
    int q[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const float scale = sc[per_channel ? kv * H + e0 + k : 0];
        q[k] = qk_gqa_quantize(y[k], QK_FDIV(1.0f, scale), bits == 8 ? -128 : -8, bits == 8 ? 127 : 7);
    }
    if (bits == 8) {
#pragma unroll
        for (int k = 0; k < 8; ++k) ((qk_i8*)present)[row * H + e0 + k] = (qk_i8)q[k];
    } else {
#pragma unroll
        for (int k = 0; k < 8; k += 2)
            ((qk_u8*)present)[row * (H / 2) + (e0 + k) / 2] = (qk_u8)((q[k] + 8) | ((q[k + 1] + 8) << 4));
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

/* x = fp32(dot * alpha); softcap c > 0: fp32(fp32(tanh(fp32(x / c))) * c); then + the bias */
__device__ __forceinline__ float qk_gqa_score(float dot, float alpha, float softcap, const void* bias, qk_i64 bi,
                                              int is16) {
    float x = QK_FMUL(dot, alpha);
    if (softcap > 0.0f) x = QK_FMUL(tanhf(QK_FDIV(x, softcap)), softcap);
    if (bias) x = QK_FADD(x, qk_load_f(bias, bi, is16));
    return x;
}

/* the sum of v over the R lanes of a lane group (R a power of two <= QK_WARP, groups aligned to
 * R): an xor butterfly, so every lane of the group ends with the same bits (each step adds the
 * same two values in either order) */
__device__ __forceinline__ float qk_gqa_group_sum(float v, int R) {
#pragma unroll
    for (int off = QK_WARP / 2; off > 0; off >>= 1)
        if (off < R) v += QK_SHFL_XOR(v, off, QK_WARP);
    return v;
}

/* 32-bit words of a lane's 8 cache elements: fp32 8, fp16 4, int8 2, 4-bit 1 */
template <int KIND>
struct qk_gqa_lane {
    static constexpr int WORDS = KIND == 0 ? 8 : (KIND == 1 ? 4 : (KIND == 2 ? 2 : 1));
};

/* a lane's 8 elements from p (WIDE: 16- / 8-byte loads, p aligned to min(16, 4 WORDS) bytes;
 * else 4-byte words) */
template <int WORDS, int WIDE>
__device__ __forceinline__ void qk_gqa_load(qk_u32 (&w)[WORDS], const qk_u32* p) {
    if (WIDE && WORDS >= 4) {
#pragma unroll
        for (int k = 0; k < WORDS / 4; ++k) {
            const uint4 v = ((const uint4*)p)[k];
            w[4 * k] = v.x;
            w[4 * k + 1] = v.y;
            w[4 * k + 2] = v.z;
            w[4 * k + 3] = v.w;
        }
    } else if (WIDE && WORDS == 2) {
        const uint2 v = *(const uint2*)p;
        w[0] = v.x;
        w[1] = v.y;
    } else {
#pragma unroll
        for (int k = 0; k < WORDS; ++k) w[k] = p[k];
    }
}

/* the query heads of CTA row blockIdx.y: its KV head g, the first of its block of at most HB of g's
 * query heads, h0, and how many there are, nh (G = N / Nk query heads a KV head, ceil(G / HB) blocks).
 * Here, for the mma kernel's batch row and for the new row's split, 32-bit divisions: head counts, grid
 * indices and positions (seqlens_k is int32) are below 2^31, and a 64-bit one is a called routine on
 * NVIDIA, 6 of them before a decode CTA's first K / V load (docs/perf-notes.md, sessions 35-36) */
struct qk_gqa_heads {
    qk_i64 g, h0;
    int nh;
};

template <int HB>
__device__ __forceinline__ qk_gqa_heads qk_gqa_head_block(qk_i64 N, qk_i64 Nk) {
    qk_gqa_heads r;
    const int G = (int)N / (int)Nk, nhb = (G + HB - 1) / HB, y = (int)blockIdx.y;
    r.g = y / nhb;
    r.h0 = r.g * G + (y % nhb) * HB;
    r.nh = G - (y % nhb) * HB < HB ? G - (y % nhb) * HB : HB;
    return r;
}

/* the keys [k0, k0 + n) (n returned) of split sp (chunk keys a split) in the causal range [lo, L)
 * of query row s of batch b: L = min(past_b + s + 1, total_b), lo = L - W with a window of W < L keys */
__device__ __forceinline__ int qk_gqa_split_keys(const int* seqlens_k, qk_i64 b, qk_i64 s, qk_i64 S, int first_prompt,
                                                 int window, int sp, int chunk, qk_i64& k0_out) {
    const qk_i64 total = (qk_i64)seqlens_k[b] + 1, past = first_prompt ? 0 : total - S;
    const qk_i64 L = past + s + 1 < total ? past + s + 1 : total;
    const qk_i64 lo = (window >= 1 && L > window) ? L - window : 0;
    const qk_i64 k0 = lo > (qk_i64)sp * chunk ? lo : (qk_i64)sp * chunk;
    const qk_i64 k1 = L < (qk_i64)(sp + 1) * chunk ? L : (qk_i64)(sp + 1) * chunk;
    k0_out = k0;
    return k1 > k0 ? (int)(k1 - k0) : 0;
}

#ifdef QK_GQA_FLASH_V1
#include "gqa_flash_v1.h"
#else
/* CTAs of a flash kernel resident per SM (__launch_bounds__): 4 (128 registers), 3 where a lane
 * holds 16 words a tile (fp32, int8 per-tensor: tiles of 8 keys) */
#define QK_GQA_FLASH_MIN_CTAS(KIND, U) ((KIND) == 0 || ((KIND) == 2 && (U) == 8) ? 3 : 4)

/* the 8 elements as fp32: fp32 / fp16 values exactly; int8 / 4-bit the integer codes exactly
 * (their scales are applied by the caller), by bits: fp32(2^23 + 128 + code) - (2^23 + 128) (int8:
 * the biased byte placed under the exponent 0x4B by one byte permute), and 4-bit element 2i in
 * the low nibble of byte i, code = nibble - 8 */
template <int KIND>
__device__ __forceinline__ void qk_gqa_unpack(const qk_u32 (&w)[qk_gqa_lane<KIND>::WORDS], float (&f)[8]) {
    if (KIND == 0) {
#pragma unroll
        for (int e = 0; e < 8; ++e) f[e] = qk_float(w[e]);
    } else if (KIND == 1) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            f[2 * k] = qk_fp16_to_float((qk_u16)(w[k] & 0xFFFFu));
            f[2 * k + 1] = qk_fp16_to_float((qk_u16)(w[k] >> 16));
        }
    } else if (KIND == 2) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const qk_u32 biased = w[k] ^ 0x80808080u; /* code + 128 in each byte */
#pragma unroll
            for (int e = 0; e < 4; ++e)
                f[4 * k + e] = QK_FADD(qk_float(QK_BYTE_PERM(biased, 0x4B000000u, 0x7440u | (qk_u32)e)), -8388736.0f);
        }
    } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const qk_u32 nib = (w[0] >> (4 * e)) & 0xFu;
            f[e] = QK_FADD(qk_float(0x4B000000u | nib), -8388616.0f);
        }
    }
}

/* The steps of offsets OFF, OFF / 2, .. 1 of a group sum over the first NV sums d of every lane:
 * while a lane holds two or more, a reduce-scatter (the lane keeps the half its bit of the offset
 * selects, d[k] or d[k + NV / 2], and adds its partner's copy of the same sum: the pair an xor
 * butterfly adds, so the same bits), then butterflies on d[0]. Lane bits OFF .. 1 select the sum:
 * after the steps a lane holds sums [j, j + max(1, NV / (2 OFF))) of the NV. */
template <int NV, int OFF>
struct qk_gqa_scatter {
    template <int N>
    static __device__ __forceinline__ void run(float (&d)[N], int tid) {
        const bool upper = (tid & OFF) != 0;
        if (NV >= 2) {
#pragma unroll
            for (int k = 0; k < NV / 2; ++k) {
                const float keep = upper ? d[k + NV / 2] : d[k];
                const float give = upper ? d[k] : d[k + NV / 2];
                d[k] = QK_FADD(keep, QK_SHFL_XOR(give, OFF, QK_WARP));
            }
        } else {
            d[0] = QK_FADD(d[0], QK_SHFL_XOR(d[0], OFF, QK_WARP));
        }
        qk_gqa_scatter<(NV >= 2 ? NV / 2 : 1), OFF / 2>::run(d, tid);
    }
};
template <int NV>
struct qk_gqa_scatter<NV, 0> {
    template <int N>
    static __device__ __forceinline__ void run(float (&)[N], int) {}
};

/* One CTA of QK_GQA_THREADS per (query row (b, s), split sp of the keys, KV head g, block of up to
 * QK_GQA_HB of g's query heads), so a K / V row is read once for the block's heads: keys
 * [max(lo, sp chunk), min(L, (sp + 1) chunk)) of the row's causal range [lo, L),
 * L = min(past_b + s + 1, total_b), lo = L - W with a window of W < L keys. A group of RG lanes
 * (R = H / 8 rounded up to a power of two, RG = max(R, 16); lanes past H / 8 hold zeros) takes one
 * key row, 8 channels a lane; group rg takes keys rg + i nrg in tiles of U keys (loaded before
 * any is used), keeping an online softmax per head (m, l and the unnormalised P V in fp32,
 * rescaled at most once a tile). The V = U HB (key, head) dots of a tile are summed over the
 * group by the xor tree of a butterfly (offsets RG / 2 .. 1), but from offset 8 down as a
 * reduce-scatter: at each offset a lane keeps the half of its sums that its bit of the offset
 * selects and adds its partner's copy of it -- the same pairs added as by the butterfly, so the
 * same bits -- and ends with max(1, V / 16) of the dots. That lane alone forms their scores and
 * p = exp(x - m); the tile's max per head and the p are then shared by shuffles. The groups are
 * merged in group order in shared memory and the split's m, l, P V (per head) written out.
 * KIND 0 fp32, 1 fp16, 2 int8, 3 4-bit; PC: per-channel scales (K: each element fp32(code * scale)
 * as the oracle; per-tensor: the dot of the codes times the scale); the V scale multiplies the
 * split's P V of the codes once. Every fp32 step is one of the bound's (qconform.ops.ort.attention_bounds):
 * a dot of H terms, the softmax's exp and sums, a rescale at most once a key. */
template <int KIND, int PC, int WIDE, int U>
__device__ __forceinline__ void qk_gqa_flash(const float* qrot, const void* present_key, const void* present_value,
                                             const int* seqlens_k, const void* attention_bias, const float* k_scale,
                                             const float* v_scale, float* part_m, float* part_l, float* part_acc,
                                             qk_i64 S, qk_i64 N, qk_i64 Nk, qk_i64 H, qk_i64 Tp, qk_i64 T,
                                             int first_prompt, int window, int bias_batch, int bias_heads, int is16,
                                             float alpha, float softcap, int chunk, int splits) {
    constexpr int HB = QK_GQA_HB, WORDS = qk_gqa_lane<KIND>::WORDS;
    constexpr int V = U * HB;                           /* (key, head) dots of a group's tile */
    constexpr int NPL = V >= 16 ? V / 16 : 1;           /* of them a lane finishes: heads hl .. hl + NPL - 1 */
    constexpr int LPV = V >= 16 ? 1 : 16 / V;           /* lanes that finish the same ones */
    constexpr int UOFF = 4 * LPV / NPL;                 /* the lowest lane offset between keys of a head */
    static_assert(V <= 64 && HB == 4, "a lane's dots are heads of one key");
    __shared__ float4 s_acc4[QK_GQA_THREADS * 2 * HB]; /* [rg][h][H]: nrg HB H <= THREADS HB 8 floats */
    __shared__ float s_m[QK_GQA_THREADS * HB], s_l[QK_GQA_THREADS * HB], s_f[QK_GQA_THREADS * HB];
    __shared__ float s_stat[2 * HB];
    float* s_acc = (float*)s_acc4;
    const float neg_inf = qk_gqa_neg_inf();
    const int tid = (int)threadIdx.x;
    int R = 1;
    while (R * 8 < H) R <<= 1;
    const int RG = R < 16 ? 16 : R;
    const int nrg = QK_GQA_THREADS / RG, rg = tid / RG, c0 = (tid % RG) * 8;
    const bool active = c0 < H;
    const int jl = (tid % 16) / LPV * NPL;                    /* the lane's first dot: u HB + h */
    const int ul = jl / HB, hl = jl % HB;                     /* its key (of the tile) and first head */
    const int lane0 = (tid % QK_WARP) / 16 * 16;              /* the lane's 16-lane block in the warp */
    const int sp = (int)(blockIdx.x % splits);
    const qk_i64 bs = blockIdx.x / splits, b = bs / S, s = bs % S;
    const qk_gqa_heads blk = qk_gqa_head_block<HB>(N, Nk);
    const qk_i64 g = blk.g, h0 = blk.h0;
    const int nh = blk.nh;
    qk_i64 k0;
    const int n = qk_gqa_split_keys(seqlens_k, b, s, S, first_prompt, window, sp, chunk, k0);
    const qk_i64 o = (bs * N + h0) * splits + sp; /* head h's slot: o + h * splits */
    if (n == 0) {
        if (tid < nh) {
            part_m[o + tid * splits] = neg_inf;
            part_l[o + tid * splits] = 0.0f;
        }
        return;
    }
    float q[HB][8], ks[PC ? 8 : 1];
#pragma unroll
    for (int h = 0; h < HB; ++h) {
        const bool use = active && h < nh;
        const float4* src = (const float4*)(qrot + (bs * N + h0 + (use ? h : 0)) * H + (use ? c0 : 0));
        const float4 a = use ? src[0] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const float4 c = use ? src[1] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        q[h][0] = a.x, q[h][1] = a.y, q[h][2] = a.z, q[h][3] = a.w;
        q[h][4] = c.x, q[h][5] = c.y, q[h][6] = c.z, q[h][7] = c.w;
    }
#pragma unroll
    for (int e = 0; e < (PC ? 8 : 1); ++e) ks[e] = KIND >= 2 ? k_scale[PC ? g * H + (active ? c0 + e : 0) : 0] : 1.0f;
    const int row_bytes = (int)(KIND == 0 ? 4 * H : (KIND == 1 ? 2 * H : (KIND == 2 ? H : H / 2)));
    const qk_i64 first = ((b * Nk + g) * Tp + k0) * row_bytes + (active ? c0 / 8 : 0) * (4 * WORDS);
    const char* kbase = (const char*)present_key + first;
    const char* vbase = (const char*)present_value + first;
    /* the bias of head h0 + h, key k0 + i: bias0 + h bias_hs + i */
    const qk_i64 bias_row = bias_batch ? ((bias_batch == 1 ? 0 : b) * bias_heads) : 0;
    const qk_i64 bias0 = ((bias_row + (bias_heads == 1 ? 0 : h0)) * S + s) * T + k0;
    const qk_i64 bias_hs = bias_heads == 1 ? 0 : S * T;
    float m[HB], l[HB], acc[HB][8], m_own[NPL];
#pragma unroll
    for (int k = 0; k < NPL; ++k) m_own[k] = neg_inf; /* the running max of the lane's heads hl + k */
#pragma unroll
    for (int h = 0; h < HB; ++h) {
        m[h] = neg_inf;
        l[h] = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[h][e] = 0.0f;
    }

    for (int t0 = 0; t0 < n; t0 += nrg * U) { /* the same trips for every lane: the group sums shuffle */
        const int i0 = t0 + rg;
        qk_u32 kw[U][WORDS], vw[U][WORDS];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int i = i0 + u * nrg < n ? i0 + u * nrg : n - 1; /* past the split: a row it reads anyway */
#pragma unroll
            for (int k = 0; k < WORDS; ++k) kw[u][k] = vw[u][k] = 0u;
            if (active) {
                qk_gqa_load<WORDS, WIDE>(kw[u], (const qk_u32*)(kbase + (qk_i64)i * row_bytes));
                qk_gqa_load<WORDS, WIDE>(vw[u], (const qk_u32*)(vbase + (qk_i64)i * row_bytes));
            }
        }
        /* the lane's part of dot u HB + h: 8 products of its channels */
        float d[V];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            float kf[8];
            qk_gqa_unpack<KIND>(kw[u], kf);
            if (PC) {
#pragma unroll
                for (int e = 0; e < 8; ++e) kf[e] = QK_FMUL(kf[e], ks[e]);
            }
#pragma unroll
            for (int h = 0; h < HB; ++h) {
                float t = 0.0f;
#pragma unroll
                for (int e = 0; e < 8; ++e) t = __fmaf_rn(q[h][e], kf[e], t);
                d[u * HB + h] = t;
            }
        }
        /* groups over 16 lanes: the butterfly's first steps (offsets RG / 2 .. 16) on every dot */
#pragma unroll
        for (int off = QK_WARP / 2; off >= 16; off >>= 1) {
            if (off < R) {
#pragma unroll
                for (int j = 0; j < V; ++j) d[j] = QK_FADD(d[j], QK_SHFL_XOR(d[j], off, QK_WARP));
            }
        }
        qk_gqa_scatter<V, 8>::run(d, tid);
        /* the lane's scores (key ul, heads hl + k) and the tile's max per head (over the keys:
         * lane offsets UOFF .. 8), then every head's max in every lane */
        const int il = i0 + ul * nrg;
        float x[NPL], mt[NPL];
#pragma unroll
        for (int k = 0; k < NPL; ++k) {
            float dk = d[k];
            if (KIND >= 2 && !PC) dk = QK_FMUL(dk, ks[0]);
            x[k] = neg_inf;
            if (il < n && hl + k < nh)
                x[k] = qk_gqa_score(dk, alpha, softcap, bias_batch ? attention_bias : 0, bias0 + (hl + k) * bias_hs + il,
                                    is16);
            mt[k] = x[k];
#pragma unroll
            for (int off = UOFF; off <= 8; off <<= 1) mt[k] = fmaxf(mt[k], QK_SHFL_XOR(mt[k], off, QK_WARP));
        }
        /* one rescale a head, as every lane's m and l are the group's */
#pragma unroll
        for (int h = 0; h < HB; ++h) {
            const float mn = fmaxf(m[h], QK_SHFL(mt[h % NPL], lane0 + h / NPL * LPV, QK_WARP));
            const float c = mn == neg_inf ? 1.0f : expf(QK_FADD(m[h], -mn)); /* every score so far -inf: 1 */
            if (c != 1.0f) {
                l[h] = QK_FMUL(l[h], c);
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[h][e] = QK_FMUL(acc[h][e], c);
            }
            m[h] = mn;
        }
        /* p = exp(x - m) of the lane's dots, then every (key, head)'s p in every lane, key by key */
#pragma unroll
        for (int k = 0; k < NPL; ++k) {
            m_own[k] = fmaxf(m_own[k], mt[k]); /* m[hl + k] (up to the sign of a zero) */
            x[k] = x[k] == neg_inf ? 0.0f : expf(QK_FADD(x[k], -m_own[k])); /* a NaN stays NaN */
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            float p[HB], vf[8];
#pragma unroll
            for (int h = 0; h < HB; ++h) {
                p[h] = QK_SHFL(x[(u * HB + h) % NPL], lane0 + (u * HB + h) / NPL * LPV, QK_WARP);
                l[h] = QK_FADD(l[h], p[h]); /* each head's sum in key order */
            }
            qk_gqa_unpack<KIND>(vw[u], vf);
#pragma unroll
            for (int h = 0; h < HB; ++h) {
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[h][e] = __fmaf_rn(p[h], vf[e], acc[h][e]);
            }
        }
    }

    /* the groups merged in group order: M = max m_rg, f_rg = exp(m_rg - M), l = sum l_rg f_rg,
     * P V = sum acc_rg f_rg (groups with m_rg = -inf and l_rg = 0 added nothing and are left out,
     * f_rg = -1; one that met only NaN scores keeps its NaN) */
    if (active) {
#pragma unroll
        for (int h = 0; h < HB; ++h) {
            if (h >= nh) continue;
            float4* dst = (float4*)(s_acc + (rg * HB + h) * H + c0);
            dst[0] = make_float4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]);
            dst[1] = make_float4(acc[h][4], acc[h][5], acc[h][6], acc[h][7]);
        }
    }
    if (tid % RG == 0) {
#pragma unroll
        for (int h = 0; h < HB; ++h) {
            s_m[rg * HB + h] = m[h];
            s_l[rg * HB + h] = l[h];
        }
    }
    __syncthreads();
    if (tid < nh) {
        float M = neg_inf, sum = 0.0f;
        for (int r = 0; r < nrg; ++r) M = fmaxf(M, s_m[r * HB + tid]);
        for (int r = 0; r < nrg; ++r) {
            const float mr = s_m[r * HB + tid], lr = s_l[r * HB + tid];
            const bool empty = mr == neg_inf && lr == 0.0f;
            const float f = empty ? -1.0f : expf(QK_FADD(mr, -M));
            s_f[r * HB + tid] = f;
            if (!empty) sum = QK_FADD(sum, QK_FMUL(lr, f));
        }
        s_stat[tid] = M;
        s_stat[HB + tid] = sum;
    }
    __syncthreads();
    for (int idx = tid; idx < nh * (int)H; idx += QK_GQA_THREADS) {
        const int h = idx / (int)H, c = idx % (int)H;
        float a = 0.0f;
        for (int r = 0; r < nrg; ++r) {
            const float f = s_f[r * HB + h];
            if (f == -1.0f) continue;
            a = QK_FADD(a, QK_FMUL(s_acc[(r * HB + h) * H + c], f));
        }
        if (KIND >= 2) a = QK_FMUL(a, v_scale[PC ? g * H + c : 0]);
        part_acc[(o + h * splits) * H + c] = a;
    }
    if (tid < nh) {
        part_m[o + tid * splits] = s_stat[tid];
        part_l[o + tid * splits] = s_stat[HB + tid];
    }
}
#endif

#define QK_GQA_FLASH(NAME, KIND, PC, WIDE, U)                                                                        \
    extern "C" __global__ void __launch_bounds__(QK_GQA_THREADS, QK_GQA_FLASH_MIN_CTAS(KIND, U))                    \
        NAME(const float* qrot, const void* present_key, const void* present_value, const int* seqlens_k,            \
             const void* attention_bias, const float* k_scale, const float* v_scale, float* part_m, float* part_l,   \
             float* part_acc, qk_i64 S, qk_i64 N, qk_i64 Nk, qk_i64 H, qk_i64 Tp, qk_i64 T, int first_prompt,        \
             int window, int bias_batch, int bias_heads, int is16, float alpha, float softcap, int chunk,             \
             int splits) {                                                                                           \
        qk_gqa_flash<KIND, PC, WIDE, U>(qrot, present_key, present_value, seqlens_k, attention_bias, k_scale,       \
                                        v_scale, part_m, part_l, part_acc, S, N, Nk, H, Tp, T, first_prompt, window, \
                                        bias_batch, bias_heads, is16, alpha, softcap, chunk, splits);               \
    }

/* qk_gqa_flash_<cache>[_pc]_<loads>: per-tensor (t) or per-channel (c) scales of a quantized
 * cache; loads "wide" (16 / 8 bytes, the present buffers aligned to them) or "words" (4 bytes).
 * int8 per-tensor: tiles of 4 keys a group (128 registers, 4 CTAs an SM); -DQK_GQA_I8T_U8: 8 (168
 * registers, 3 CTAs), timed beside it by the bench */
QK_GQA_FLASH(qk_gqa_flash_f32_wide, 0, 0, 1, 2)
QK_GQA_FLASH(qk_gqa_flash_f32_words, 0, 0, 0, 2)
QK_GQA_FLASH(qk_gqa_flash_f16_wide, 1, 0, 1, 4)
QK_GQA_FLASH(qk_gqa_flash_f16_words, 1, 0, 0, 4)
#if defined(QK_GQA_FLASH_V1) || defined(QK_GQA_I8T_U8)
QK_GQA_FLASH(qk_gqa_flash_i8t_wide, 2, 0, 1, 8)
QK_GQA_FLASH(qk_gqa_flash_i8t_words, 2, 0, 0, 8)
#else
QK_GQA_FLASH(qk_gqa_flash_i8t_wide, 2, 0, 1, 4)
QK_GQA_FLASH(qk_gqa_flash_i8t_words, 2, 0, 0, 4)
#endif
QK_GQA_FLASH(qk_gqa_flash_i8c_wide, 2, 1, 1, 4)
QK_GQA_FLASH(qk_gqa_flash_i8c_words, 2, 1, 0, 4)
QK_GQA_FLASH(qk_gqa_flash_u4t_words, 3, 0, 0, 8)
QK_GQA_FLASH(qk_gqa_flash_u4c_words, 3, 1, 0, 4)

/* ------------------------------------------------------------- attention on the matrix units */

#define QK_GQA_MG 4   /* 32-lane groups of an mma CTA (QK_GQA_THREADS / 32) */
#define QK_GQA_MH 8   /* query heads of one KV head an mma CTA takes (the mma's N = 8) */
#define QK_GQA_MK 16  /* keys of a group's tile (two N = 8 tiles of the scores, the K = 16 of P V) */
#define QK_GQA_PS 32768.0f /* P's scale before its split into fp16 halves: p 2^15 <= 2^15 */

/* W bytes of p (aligned to W) into words w[0 .. max(1, W / 4)): 16, 8, 4 or 2 (the low half) */
template <int W>
__device__ __forceinline__ void qk_gqa_ldw(qk_u32* w, const char* p) {
    if (W == 16) {
        const uint4 v = *(const uint4*)p;
        w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else if (W == 8) {
        const uint2 v = *(const uint2*)p;
        w[0] = v.x, w[1] = v.y;
    } else if (W == 4) {
        w[0] = *(const qk_u32*)p;
    } else {
        w[0] = (qk_u32)*(const qk_u16*)p;
    }
}

/* int8 codes x_lo, x_hi (bytes of words already biased by 0x80: code + 128) as an fp16 pair: the
 * biased byte under the exponent of 1024 (fp16 0x64bb = 1024 + code + 128), minus 1152 by one
 * exact fma (codes are exact in fp16) */
__device__ __forceinline__ qk_u32 qk_gqa_i8pair(qk_u32 x, qk_u32 y, qk_u32 sel) {
    const qk_u32 t = qk_and_or(QK_BYTE_PERM(x, y, sel), 0x00FF00FFu, 0x64006400u);
    return qk_hfma2(t, 0x3C003C00u, 0xE480E480u);
}

/* One CTA of QK_GQA_THREADS per (query row (b, s), split sp of the keys, KV head g, block of up to
 * QK_GQA_MH of g's query heads), fp16 queries only (their rotated values are fp16, so exact as
 * the mma's operands), fp16 cache (KIND 1) or int8 with per-tensor scales (KIND 2: codes exact in
 * fp16). The split's keys [k0, k1) as qk_gqa_flash; group grp of 32 lanes (lane = 4 gq + tq) takes
 * the tiles of QK_GQA_MK keys grp, grp + 4, .. and keeps an online softmax per head. A tile:
 *  scores S[head][key] = Q K^T by mma.m16n8k16 (rows: the block's heads, 8 .. 15 zero; columns:
 *   8 keys, two N tiles; k: channels in the order of the loads: kstep s, lane tq, element j is
 *   channel (s / SPL) 16 SPL + tq 4 SPL + (s % SPL) 4 + j, SPL = ksteps of one KW-byte load of a
 *   key row, the same order for Q) in fp32 (products exact, the sum's order the unit's: a dot of
 *   H terms); int8: times the K scale (the dot of the codes, as the SIMT kernel);
 *  lane (gq, tq) holds head gq's scores of keys 2tq, 2tq + 1, 8 + 2tq, 9 + 2tq: the tile's max by
 *   two quad shuffles, one rescale of the head's l and P V (both halves) when it grows, p = exp(x - m)
 *   in fp32, p' = p 2^15 split into hi = fp16(p') and lo = fp16((p' - hi) 2^11) (p' - hi exact):
 *   |p' - hi - lo 2^-11| <= 2^-22 p' + 2^-37 (the rounding of a lo under fp16's normal range; the
 *   2^15 keeps that absolute part below 2^-52 of p);
 *  P V by mma: A = [hi; lo] (rows 0..7 hi, 8..15 lo of the block's heads: the scores' accumulator
 *   fragments are the A fragment of the same lane, no shuffle), B = V (16 keys x 8 channels: n
 *   tile jn, column n is channel (jn / E) 8E + n E + jn % E, E elements of one VW-byte load; a
 *   lane packs its two keys' elements into one fp16 pair), accumulator rows 0..7 P_hi V, 8..15 P_lo V.
 * At the end P V = (hi part + lo part 2^-11) 2^-15, l = the quad's sum of its lanes' p (an xor
 * butterfly); the groups merged in group order in shared memory as qk_gqa_flash, the V scale
 * on the split's P V. Every fp32 step is one of the bound's (qconform.ops.ort.attention_bounds);
 * P's split adds 2^-22 relative to each p (inside the bound's 8 ulp of exp). The launcher runs the
 * SIMT qk_gqa_flash_* kernels instead when built with -DQK_GQA_DECODE_SIMT (the bench's simt variant). */
template <int KIND, int HD, int KW, int VW>
__device__ __forceinline__ void qk_gqa_mma(const float* qrot, const float* qblock, const void* present_key,
                                           const void* present_value,
                                           const int* seqlens_k, const void* attention_bias, const float* k_scale,
                                           const float* v_scale, float* part_m, float* part_l, float* part_acc,
                                           qk_i64 S, qk_i64 N, qk_i64 Nk, qk_i64 Tp, qk_i64 T, int first_prompt,
                                           int window, int bias_batch, int bias_heads, float alpha, float softcap,
                                           int chunk, int splits) {
    constexpr int EB = KIND == 1 ? 2 : 1;       /* bytes of a cache element */
    constexpr int KS = HD / 16;                 /* ksteps of the scores */
    constexpr int SPL = KW / (4 * EB);          /* ksteps of one K load */
    constexpr int KL = KS / SPL;                /* K loads of a key row a lane */
    constexpr int KWD = KW / 4;                 /* words of a K load */
    constexpr int E = VW / EB;                  /* elements of one V load */
    constexpr int VL = HD / (8 * E);            /* V loads of a key row a lane */
    constexpr int VWD = VW >= 4 ? VW / 4 : 1;   /* words of a V load */
    constexpr int NT = HD / 8;                  /* n tiles of P V */
    constexpr int MH = QK_GQA_MH, MG = QK_GQA_MG, MK = QK_GQA_MK;
    static_assert(SPL >= 1 && KS % SPL == 0 && HD % (8 * E) == 0, "head size and load widths");
    __shared__ float s_acc[MG * MH * HD];
    __shared__ float s_m[MG * MH], s_l[MG * MH], s_f[MG * MH], s_stat[2 * MH];
    const float neg_inf = qk_gqa_neg_inf();
    const int tid = (int)threadIdx.x, grp = tid / 32, lane = tid % 32, gq = lane / 4, tq = lane % 4;
    const int sp = (int)(blockIdx.x % splits);
    const int bs32 = (int)blockIdx.x / splits;
    const qk_i64 bs = bs32, b = bs32 / (int)S, s = bs32 % (int)S;
    const qk_gqa_heads blk = qk_gqa_head_block<MH>(N, Nk);
    const qk_i64 g = blk.g, h0 = blk.h0;
    const int nh = blk.nh;
    qk_i64 k0;
    const int n = qk_gqa_split_keys(seqlens_k, b, s, S, first_prompt, window, sp, chunk, k0);
    const qk_i64 o = (bs * N + h0) * splits + sp; /* head h's slot: o + h * splits */
    QK_PHASE_AFTER(4, o + n);
    if (n == 0) {
        if (tid < nh) {
            part_m[o + tid * splits] = neg_inf;
            part_l[o + tid * splits] = 0.0f;
        }
        return;
    }
    /* Q's A fragments of head gq (rows 8 .. 15 zero): a0 = channels j 0, 1 of kstep s, a2 = j 2, 3 */
    qk_u32 qa[KS][2];
    {
        const bool use = gq < nh;
        const float* qrow = qblock ? qblock + (use ? gq : 0) * HD : qrot + (bs * N + h0 + (use ? gq : 0)) * HD;
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            const int c = (ks / SPL) * 16 * SPL + tq * 4 * SPL + (ks % SPL) * 4;
            const float4 v = use ? *(const float4*)(qrow + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            qa[ks][0] = (qk_u32)qk_fp16_bits(v.x) | ((qk_u32)qk_fp16_bits(v.y) << 16);
            qa[ks][1] = (qk_u32)qk_fp16_bits(v.z) | ((qk_u32)qk_fp16_bits(v.w) << 16);
        }
    }
    QK_PHASE_AFTER(5, qa[KS - 1][1]);
    const float ks0 = KIND == 2 ? k_scale[0] : 1.0f;
    const qk_i64 row_bytes = (qk_i64)HD * EB;
    const char* kbase = (const char*)present_key + ((b * Nk + g) * Tp + k0) * row_bytes;
    const char* vbase = (const char*)present_value + ((b * Nk + g) * Tp + k0) * row_bytes;
    const qk_i64 bias_row = bias_batch ? ((bias_batch == 1 ? 0 : b) * bias_heads) : 0;
    const qk_i64 bias0 = ((bias_row + (bias_heads == 1 ? 0 : h0)) * S + s) * T + k0;
    const qk_i64 bias_hs = bias_heads == 1 ? 0 : S * T;
    float acc[NT][4]; /* [0..1] P_hi V of head gq, channels of columns 2tq, 2tq + 1; [2..3] P_lo V */
#pragma unroll
    for (int jn = 0; jn < NT; ++jn) acc[jn][0] = acc[jn][1] = acc[jn][2] = acc[jn][3] = 0.0f;
    float m = neg_inf, l = 0.0f; /* head gq's running max (the quad's) and the lane's sum of p */
    const bool head_ok = gq < nh;

    for (int t0 = grp * MK; t0 < n; t0 += MG * MK) { /* the same trips for the group's 32 lanes */
        /* K rows t0 + gq (tile 0) and t0 + 8 + gq (tile 1), this lane's KW-byte pieces */
        qk_u32 kw[2][KL][KWD], vw[4][VL][VWD];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
            const int i = t0 + nt * 8 + gq < n ? t0 + nt * 8 + gq : n - 1; /* past the split: a row it reads anyway */
            const char* p = kbase + (qk_i64)i * row_bytes + tq * KW;
#pragma unroll
            for (int li = 0; li < KL; ++li) qk_gqa_ldw<KW>(kw[nt][li], p + li * 4 * KW);
        }
        /* V rows t0 + 2tq, + 1, + 8, + 9: channels (lv 8 + gq) E .. + E */
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int kr = 2 * tq + (r & 1) + (r >> 1) * 8;
            const int i = t0 + kr < n ? t0 + kr : n - 1;
            const char* p = vbase + (qk_i64)i * row_bytes + gq * VW;
#pragma unroll
            for (int lv = 0; lv < VL; ++lv) qk_gqa_ldw<VW>(vw[r][lv], p + lv * 8 * VW);
        }
        /* the scores: d[nt][0..1] = S[gq][keys nt 8 + 2tq, + 1] */
        float d[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
            d[nt][0] = d[nt][1] = d[nt][2] = d[nt][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KS; ++ks) {
                const qk_u32 a[4] = {qa[ks][0], 0u, qa[ks][1], 0u};
                qk_u32 bf[2];
                if (KIND == 1) {
                    bf[0] = kw[nt][ks / SPL][2 * (ks % SPL)];
                    bf[1] = kw[nt][ks / SPL][2 * (ks % SPL) + 1];
                } else {
                    const qk_u32 w = kw[nt][ks / SPL][ks % SPL] ^ 0x80808080u;
                    bf[0] = qk_gqa_i8pair(w, 0u, 0x3130u);
                    bf[1] = qk_gqa_i8pair(w, 0u, 0x3332u);
                }
                qk_mma_16816(d[nt], a, bf);
            }
        }
        float x[4], mt = neg_inf;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int kk = (k >> 1) * 8 + 2 * tq + (k & 1), i = t0 + kk;
            float dk = d[k >> 1][k & 1];
            if (KIND == 2) dk = QK_FMUL(dk, ks0);
            x[k] = neg_inf;
            if (i < n && head_ok)
                x[k] = qk_gqa_score(dk, alpha, softcap, bias_batch ? attention_bias : 0, bias0 + gq * bias_hs + i, 1);
            mt = fmaxf(mt, x[k]);
        }
        mt = fmaxf(mt, QK_SHFL_XOR(mt, 1, QK_WARP));
        mt = fmaxf(mt, QK_SHFL_XOR(mt, 2, QK_WARP));
        if (t0 == grp * MK) QK_PHASE_AFTER(6, __float_as_uint(mt));
        const float mn = fmaxf(m, mt);
        const float c = mn == neg_inf ? 1.0f : expf(QK_FADD(m, -mn)); /* every score so far -inf: 1 */
        if (c != 1.0f) {
            l = QK_FMUL(l, c);
#pragma unroll
            for (int jn = 0; jn < NT; ++jn)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[jn][e] = QK_FMUL(acc[jn][e], c);
        }
        m = mn;
        qk_syncwarp(); /* the group's lanes together again before the mma (the rescale is per lane) */
        /* p, its sum, and the A fragment of P V: hi rows (a0 keys 2tq, + 1; a2 keys 8 + 2tq, + 1), lo rows */
        qk_u32 pa[4];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            qk_u32 hi2 = 0u, lo2 = 0u;
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const float xv = x[2 * half + j];
                const float p = xv == neg_inf ? 0.0f : expf(QK_FADD(xv, -mn)); /* a NaN stays NaN */
                l = QK_FADD(l, p);
                const float ps = QK_FMUL(p, QK_GQA_PS);
                const qk_u16 hb = qk_fp16_bits(ps);
                const qk_u16 lb = qk_fp16_bits(QK_FMUL(QK_FADD(ps, -qk_fp16_to_float(hb)), 2048.0f));
                hi2 |= (qk_u32)hb << (16 * j);
                lo2 |= (qk_u32)lb << (16 * j);
            }
            pa[2 * half] = hi2;
            pa[2 * half + 1] = lo2;
        }
        /* P V over the n tiles: b0 = V[keys 2tq, 2tq + 1][channel], b1 = V[keys 8 + 2tq, 9 + 2tq] */
#pragma unroll
        for (int jn = 0; jn < NT; ++jn) {
            const int lv = jn / E, e = jn % E;
            qk_u32 bf[2];
#pragma unroll
            for (int hk = 0; hk < 2; ++hk) {
                const qk_u32* r0 = vw[2 * hk][lv];
                const qk_u32* r1 = vw[2 * hk + 1][lv];
                if (KIND == 1) {
                    bf[hk] = QK_BYTE_PERM(r0[e / 2], r1[e / 2], (e & 1) ? 0x7632u : 0x5410u);
                } else {
                    const qk_u32 sel = (qk_u32)(e % 4) | ((qk_u32)(4 + e % 4) << 8);
                    bf[hk] = qk_gqa_i8pair(r0[e / 4] ^ 0x80808080u, r1[e / 4] ^ 0x80808080u, sel);
                }
            }
            qk_mma_16816(acc[jn], pa, bf);
        }
    }

    /* the quad's sum of p (an xor butterfly), P V = (hi + lo 2^-11) 2^-15, then the groups merged in
     * group order as qk_gqa_flash */
    QK_PHASE_AFTER(7, __float_as_uint(l));
    l = QK_FADD(l, QK_SHFL_XOR(l, 1, QK_WARP));
    l = QK_FADD(l, QK_SHFL_XOR(l, 2, QK_WARP));
    if (head_ok) {
#pragma unroll
        for (int jn = 0; jn < NT; ++jn) {
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int col = 2 * tq + j, ch = (jn / E) * 8 * E + col * E + jn % E;
                const float v = QK_FADD(acc[jn][j], QK_FMUL(acc[jn][2 + j], 1.0f / 2048.0f));
                s_acc[(grp * MH + gq) * HD + ch] = QK_FMUL(v, 1.0f / QK_GQA_PS);
            }
        }
    }
    if (tq == 0) {
        s_m[grp * MH + gq] = m;
        s_l[grp * MH + gq] = l;
    }
    __syncthreads();
    if (tid < nh) {
        float M = neg_inf, sum = 0.0f;
        for (int r = 0; r < MG; ++r) M = fmaxf(M, s_m[r * MH + tid]);
        for (int r = 0; r < MG; ++r) {
            const float mg = s_m[r * MH + tid], lg = s_l[r * MH + tid];
            const bool empty = mg == neg_inf && lg == 0.0f;
            const float f = empty ? -1.0f : expf(QK_FADD(mg, -M)); /* group r's shift */
            s_f[r * MH + tid] = f;
            if (!empty) sum = QK_FADD(sum, QK_FMUL(lg, f));
        }
        s_stat[tid] = M;
        s_stat[MH + tid] = sum;
    }
    __syncthreads();
    for (int idx = tid; idx < nh * HD; idx += QK_GQA_THREADS) {
        const int h = idx / HD, c = idx % HD;
        float a = 0.0f;
        for (int r = 0; r < MG; ++r) {
            const float f = s_f[r * MH + h];
            if (f == -1.0f) continue;
            a = QK_FADD(a, QK_FMUL(s_acc[(r * MH + h) * HD + c], f));
        }
        if (KIND == 2) a = QK_FMUL(a, v_scale[0]);
        part_acc[(o + h * splits) * HD + c] = a;
    }
    if (tid < nh) {
        part_m[o + tid * splits] = s_stat[tid];
        part_l[o + tid * splits] = s_stat[MH + tid];
    }
}

/* The append folded into the mma kernel's launch (decode, S = 1: the default build, where the
 * launcher passes the inputs; with -DQK_GQA_APPEND_V1, or S > 1, qk_gqa_append8 / qk_gqa_append run
 * first): the CTA rotates its block's query heads into shared memory (qk_gqa_new_value: the values
 * qrot would hold), and the CTA whose split holds the new key (split past / chunk) writes the new K
 * row (rotated, then quantized for an int8 cache) and V row of its KV head into present before it
 * reads a key (its threads read them after the barrier; no other split reads that row; with more
 * than QK_GQA_MH query heads a KV head's head blocks write the same bytes). Returns the block's
 * rotated query rows (stride HD). fp16 inputs (the mma kernels' queries), per-tensor int8 scales. */
template <int KIND, int HD>
__device__ __noinline__ const float* qk_gqa_mma_append(const void* query, const void* key, const void* value,
                                                       const int* seqlens_k, const void* cos_cache,
                                                       const void* sin_cache, const qk_i64* position_ids,
                                                       const float* k_scale, const float* v_scale,
                                                       void* present_key, void* present_value, qk_i64 N,
                                                       qk_i64 Nk, qk_i64 Tp, qk_i64 pid_stride, int first_prompt,
                                                       int packed, int rotary_dim, int interleaved, int chunk,
                                                       int splits) {
    constexpr int MH = QK_GQA_MH;
    __shared__ float s_q[MH * HD];
    const int tid = (int)threadIdx.x, sp = (int)(blockIdx.x % splits);
    const qk_i64 b = blockIdx.x / splits; /* S = 1: the query row is its batch's */
    const qk_gqa_heads blk = qk_gqa_head_block<MH>(N, Nk);
    const qk_i64 g = blk.g, h0 = blk.h0;
    const int nh = blk.nh;
    const int rotate = rotary_dim > 0;
    constexpr int QPER = (MH * HD + QK_GQA_THREADS - 1) / QK_GQA_THREADS;
    constexpr int KPER = (2 * HD + QK_GQA_THREADS - 1) / QK_GQA_THREADS;
    float y[QPER];
#if defined(QK_GQA_APPEND_LOADS_FIRST)
    /* bench-only: every slot's reads issued before any value is used (no branch between them), the
     * query's and the new K / V rows' before seqlens_k's, which they do not need; cos / sin after the
     * position; then qk_gqa_new_value's arithmetic, bit for bit. Slots past the block's elements read
     * element 0 (a valid address) and are never stored. */
    float xq[QPER][2], xk[KPER][2], cq[QPER], sq[QPER], ck[KPER], sk[KPER], kv[KPER];
    qk_gqa_pair pq[QPER], pk[KPER];
    int rq[QPER], rk[KPER];
#pragma unroll
    for (int j = 0; j < QPER; ++j) {
        const int i = tid + j * QK_GQA_THREADS < nh * HD ? tid + j * QK_GQA_THREADS : 0;
        qk_i64 src;
        const void* base = qk_gqa_new_source(query, key, value, packed, N, Nk, HD, b, h0 + i / HD, src);
        rq[j] = rotate && i % HD < rotary_dim;
        qk_gqa_new_inputs(xq[j], pq[j], base, src, i % HD, rq[j], rotary_dim, interleaved);
    }
#pragma unroll
    for (int j = 0; j < KPER; ++j) {
        const int i = tid + j * QK_GQA_THREADS < 2 * HD ? tid + j * QK_GQA_THREADS : 0, isv = i / HD;
        qk_i64 src;
        const void* base = qk_gqa_new_source(query, key, value, packed, N, Nk, HD, b, N + isv * Nk + g, src);
        rk[j] = rotate && !isv && i % HD < rotary_dim;
        qk_gqa_new_inputs(xk[j], pk[j], base, src, i % HD, rk[j], rotary_dim, interleaved);
    }
#endif
    const qk_i64 past = first_prompt ? 0 : (qk_i64)seqlens_k[b];
    const qk_i64 pos = rotate ? qk_gqa_position(position_ids, pid_stride, b, 0, past, first_prompt) : 0;
    QK_PHASE_AFTER(1, pos);
#if defined(QK_GQA_APPEND_LOADS_FIRST)
    if (rotate) { /* row pos of the tables: every slot reads one (its own pair's where it rotates) */
        const qk_i64 row = pos * (rotary_dim / 2);
#pragma unroll
        for (int j = 0; j < QPER; ++j) {
            cq[j] = qk_load_f(cos_cache, row + (rq[j] ? pq[j].i : 0), 1);
            sq[j] = qk_load_f(sin_cache, row + (rq[j] ? pq[j].i : 0), 1);
        }
#pragma unroll
        for (int j = 0; j < KPER; ++j) {
            ck[j] = qk_load_f(cos_cache, row + (rk[j] ? pk[j].i : 0), 1);
            sk[j] = qk_load_f(sin_cache, row + (rk[j] ? pk[j].i : 0), 1);
        }
    } else {
#pragma unroll
        for (int j = 0; j < QPER; ++j) cq[j] = sq[j] = 0.0f;
#pragma unroll
        for (int j = 0; j < KPER; ++j) ck[j] = sk[j] = 0.0f;
    }
#pragma unroll
    for (int j = 0; j < QPER; ++j)
        y[j] = rq[j] ? qk_gqa_rotate(xq[j][0], xq[j][1], cq[j], sq[j], pq[j].second, 1) : xq[j][0];
#pragma unroll
    for (int j = 0; j < KPER; ++j)
        kv[j] = rk[j] ? qk_gqa_rotate(xk[j][0], xk[j][1], ck[j], sk[j], pk[j].second, 1) : xk[j][0];
#else
    /* each element's reads and arithmetic in turn (the branches keep the next element's reads behind
     * this one's use: one latency an element; -DQK_GQA_APPEND_LOADS_FIRST issues them all first) */
#pragma unroll
    for (int j = 0; j < QPER; ++j) {
        const int i = tid + j * QK_GQA_THREADS;
        y[j] = 0.0f;
        if (i < nh * HD) {
            qk_i64 src;
            const void* base = qk_gqa_new_source(query, key, value, packed, N, Nk, HD, b, h0 + i / HD, src);
            y[j] = qk_gqa_new_value(base, src, i % HD, rotate, rotary_dim, interleaved, cos_cache, sin_cache, pos, 1);
        }
    }
#endif
    QK_PHASE_AFTER(2, __float_as_uint(y[QPER - 1]));
#pragma unroll
    for (int j = 0; j < QPER; ++j)
        if (tid + j * QK_GQA_THREADS < nh * HD) s_q[tid + j * QK_GQA_THREADS] = y[j];
    if (sp == (int)past / chunk) {
        const qk_i64 row = (b * Nk + g) * Tp + past;
#if !defined(QK_GQA_APPEND_LOADS_FIRST)
        float kv[KPER];
#pragma unroll
        for (int j = 0; j < KPER; ++j) {
            const int i = tid + j * QK_GQA_THREADS, isv = i / HD; /* K then V */
            kv[j] = 0.0f;
            if (i < 2 * HD) {
                qk_i64 src;
                const void* base = qk_gqa_new_source(query, key, value, packed, N, Nk, HD, b, N + isv * Nk + g, src);
                kv[j] = qk_gqa_new_value(base, src, i % HD, rotate && !isv, rotary_dim, interleaved, cos_cache,
                                         sin_cache, pos, 1);
            }
        }
#endif
#pragma unroll
        for (int j = 0; j < KPER; ++j) {
            const int i = tid + j * QK_GQA_THREADS, isv = i / HD, e = i % HD;
            if (i >= 2 * HD) continue;
            void* present = isv ? present_value : present_key;
            if (KIND == 1)
                qk_store_f(present, row * HD + e, kv[j], 1);
            else
                ((qk_i8*)present)[row * HD + e] =
                    (qk_i8)qk_gqa_quantize(kv[j], QK_FDIV(1.0f, (isv ? v_scale : k_scale)[0]), -128, 127);
        }
    }
    __syncthreads();
    return s_q;
}

#if defined(QK_CUDA)
__device__ __forceinline__ float qk_gqa_load_cg(const float* p) { return __ldcg(p); }
__device__ __forceinline__ float4 qk_gqa_load_cg4(const float* p) { return __ldcg((const float4*)p); }
#else
__device__ __forceinline__ float qk_gqa_load_cg(const float* p) { return *(const volatile float*)p; }
__device__ __forceinline__ float4 qk_gqa_load_cg4(const float* p) {
    const volatile float* v = p;
    return make_float4(v[0], v[1], v[2], v[3]);
}
#endif

/* The combine of qk_gqa_combine folded into the mma kernel's launch (where the launcher passes a ticket
 * buffer: up to its FOLD_MAX_SPLITS splits, or always with -DQK_GQA_COMBINE_FOLD; otherwise, or with
 * -DQK_GQA_COMBINE_LAUNCH, it launches qk_gqa_combine; both options are read by the launcher, the
 * kernels are the same): every CTA of a query row's KV-head block, its split's partials stored,
 * makes them visible device-wide (__threadfence) and takes a ticket (an atomic count per block: it
 * only elects a CTA, no value is summed by atomics); the CTA that takes the last ticket (every split
 * stored) resets the count for the next call on the stream and combines the block's heads in split
 * order with qk_gqa_combine's arithmetic, operation for operation: M = max(m_sp, sink),
 * f_sp = exp(m_sp - M) (splits with m_sp = -inf left out), l = sum l_sp f_sp (+ exp(sink - M)) and
 * o = sum acc_sp f_sp, both in split order, then o / l; so the output is the launched combine's, bit
 * for bit, whichever CTA combines. The other CTAs' partials are read past L1 (qk_gqa_load_cg), as
 * few L2 latencies in a row as the registers allow: a pass of up to QK_GQA_CF splits stages their
 * m_sp and l_sp (a thread per (head, split)) while the first CU 16-byte pieces of partial P V of
 * each thread are already in flight; with at most QK_GQA_CF splits M is taken from the staged m_sp,
 * else from a pass over them before. Each thread sums 4 channels of a head (qk_gqa_combine_add).
 * (Session 11's form read l_sp one split at a time behind a branch, 33 L2 latencies in a row at
 * batch 1: docs/perf-notes.md.) */
#define QK_GQA_CF 64 /* splits whose m, l and factors a combine pass stages */
/* 16-byte pieces a combining thread has in flight: 32 where a kernel has the registers (2 CTAs an SM) */
#define QK_GQA_CU(C) ((C) == 2 ? 32 : 16)

/* the thread's P pieces j (piece tid + j T: head idx / (HD / 4), channels 4 (idx % (HD / 4)) ..) of
 * partial P V for the U splits from sp (those of them below cnt, counted from sp) */
template <int HD, int P, int U>
__device__ __forceinline__ void qk_gqa_combine_load(float4 (&v)[P][U], const float* part_acc, qk_i64 row0, int splits,
                                                    int sp, int cnt, int nh, int tid) {
    constexpr int Q4 = HD / 4;
#pragma unroll
    for (int j = 0; j < P; ++j) {
        const int idx = tid + j * QK_GQA_THREADS, h = idx / Q4;
        const float* acc = part_acc + (row0 + h * splits + sp) * HD + (idx % Q4) * 4;
#pragma unroll
        for (int u = 0; u < U; ++u)
            v[j][u] = h < nh && u < cnt ? qk_gqa_load_cg4(acc + (qk_i64)u * HD) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

/* o_j += acc_sp f_sp for those U splits in split order (f = c_f[h QK_GQA_CF + u], -1: left out) */
template <int HD, int P, int U, int PA>
__device__ __forceinline__ void qk_gqa_combine_add(float4 (&a)[PA], const float4 (&v)[P][U], const float* c_f, int cnt,
                                                   int nh, int tid) {
#pragma unroll
    for (int j = 0; j < P; ++j) {
        const int h = (tid + j * QK_GQA_THREADS) / (HD / 4);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const float f = h < nh && u < cnt ? c_f[h * QK_GQA_CF + u] : -1.0f;
            if (f != -1.0f) {
                a[j].x = QK_FADD(a[j].x, QK_FMUL(v[j][u].x, f));
                a[j].y = QK_FADD(a[j].y, QK_FMUL(v[j][u].y, f));
                a[j].z = QK_FADD(a[j].z, QK_FMUL(v[j][u].z, f));
                a[j].w = QK_FADD(a[j].w, QK_FMUL(v[j][u].w, f));
            }
        }
    }
}

/* the combining CTA's passes (P pieces a thread, U splits of each in flight): o in a, l of head tid
 * (tid < nh) returned; c_M holds M where splits > QK_GQA_CF, else the first pass writes it */
template <int HD, int P, int U, int PA>
__device__ __forceinline__ float qk_gqa_combine_passes(float4 (&a)[PA], const float* part_m, const float* part_l,
                                                       const float* part_acc, const void* head_sink, float* c_f,
                                                       float* c_lv, float* c_M, qk_i64 row0, qk_i64 h0, int splits,
                                                       int nh, int sink_mode, int is16) {
    constexpr int T = QK_GQA_THREADS, CF = QK_GQA_CF, FPER = QK_GQA_MH * CF / T;
    const float neg_inf = qk_gqa_neg_inf();
    const int tid = (int)threadIdx.x, lane = tid % 32;
    float l = 0.0f;
    for (int sp0 = 0; sp0 < splits; sp0 += CF) {
        const int cnt = splits - sp0 < CF ? splits - sp0 : CF;
        float4 v[P][U];
        qk_gqa_combine_load<HD>(v, part_acc, row0, splits, sp0, cnt, nh, tid); /* in flight through the factors */
        float m[FPER], lv[FPER];
#pragma unroll
        for (int u = 0; u < FPER; ++u) {
            const int i = tid + u * T, h = i / CF, k = i % CF;
            const bool in = h < nh && k < cnt;
            m[u] = in ? qk_gqa_load_cg(part_m + row0 + h * splits + sp0 + k) : neg_inf;
            lv[u] = in ? qk_gqa_load_cg(part_l + row0 + h * splits + sp0 + k) : 0.0f;
        }
        __syncthreads(); /* the previous pass done with c_f and c_lv */
#pragma unroll
        for (int u = 0; u < FPER; ++u) {
            c_f[tid + u * T] = m[u];
            c_lv[tid + u * T] = lv[u];
        }
        __syncthreads();
        if (splits <= CF) { /* M of head h from the staged m: a warp a head */
            for (int h = tid / 32; h < nh; h += T / 32) {
                float mx = fmaxf(c_f[h * CF + lane], c_f[h * CF + lane + 32]); /* -inf past cnt */
#pragma unroll
                for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, QK_SHFL_XOR(mx, off, 32));
                if (lane == 0) {
                    const float sigma = sink_mode == 1 ? qk_load_f(head_sink, h0 + h, is16) : 0.0f;
                    c_M[h] = sink_mode ? fmaxf(mx, sigma) : mx;
                }
            }
            __syncthreads();
        }
#pragma unroll
        for (int u = 0; u < FPER; ++u) { /* -1: left out */
            const int i = tid + u * T, h = i / CF;
            if (h < nh) c_f[i] = m[u] == neg_inf ? -1.0f : expf(QK_FADD(m[u], -c_M[h]));
        }
        __syncthreads();
        for (int k0 = 0; k0 < cnt; k0 += U) {
            if (k0) qk_gqa_combine_load<HD>(v, part_acc, row0, splits, sp0 + k0, cnt - k0, nh, tid);
            qk_gqa_combine_add<HD>(a, v, c_f + k0, cnt - k0, nh, tid);
        }
        if (tid < nh) {
            for (int k = 0; k < cnt; ++k) {
                const float f = c_f[tid * CF + k];
                if (f != -1.0f) l = QK_FADD(l, QK_FMUL(c_lv[tid * CF + k], f));
            }
        }
    }
    return l;
}

template <int HD, int CU>
__device__ __noinline__ void qk_gqa_mma_combine(const float* part_m, const float* part_l, const float* part_acc,
                                                const void* head_sink, void* output, unsigned* ticket, qk_i64 N,
                                                qk_i64 Nk, int splits, int sink_mode, int is16) {
    constexpr int MH = QK_GQA_MH, T = QK_GQA_THREADS, CF = QK_GQA_CF, Q4 = HD / 4;
    constexpr int PER = (MH * Q4 + T - 1) / T; /* 4-channel pieces of the block's heads a thread */
    static_assert(HD % 4 == 0 && MH * CF % T == 0 && CF == 64, "combine tiling");
    __shared__ float c_f[MH * CF], c_lv[MH * CF], c_M[MH], c_l[MH];
    __shared__ int c_last;
    const float neg_inf = qk_gqa_neg_inf();
    const int tid = (int)threadIdx.x, lane = tid % 32;
    const qk_i64 bs = blockIdx.x / splits;
    const qk_gqa_heads blk = qk_gqa_head_block<MH>(N, Nk);
    const qk_i64 h0 = blk.h0, row0 = (bs * N + h0) * splits; /* head h's split sp: row0 + h splits + sp */
    const int nh = blk.nh;
    __threadfence(); /* this CTA's partials before its ticket */
    __syncthreads();
    if (tid == 0) {
        unsigned* t = ticket + bs * gridDim.y + blockIdx.y;
        c_last = atomicAdd(t, 1u) == (unsigned)splits - 1u;
        if (c_last) *t = 0u; /* every split has taken its ticket: zero for the next call */
    }
    __syncthreads();
    if (!c_last) return;
    __threadfence();
    if (splits > CF) { /* M of head h over every split first: 32 lanes over the splits, 4 loads in flight */
        for (int h = tid / 32; h < nh; h += T / 32) {
            float mx = neg_inf;
            for (int sp0 = lane; sp0 < splits; sp0 += 128) {
                float m4[4];
#pragma unroll
                for (int u = 0; u < 4; ++u)
                    m4[u] = sp0 + 32 * u < splits ? qk_gqa_load_cg(part_m + row0 + h * splits + sp0 + 32 * u) : neg_inf;
#pragma unroll
                for (int u = 0; u < 4; ++u) mx = fmaxf(mx, m4[u]);
            }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, QK_SHFL_XOR(mx, off, 32));
            if (lane == 0) {
                const float sigma = sink_mode == 1 ? qk_load_f(head_sink, h0 + h, is16) : 0.0f;
                c_M[h] = sink_mode ? fmaxf(mx, sigma) : mx;
            }
        }
    }
    float4 a[PER];
#pragma unroll
    for (int j = 0; j < PER; ++j) a[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float l;
    if (PER > 1 && nh * Q4 <= T) /* one piece a thread: all its in-flight loads on it */
        l = qk_gqa_combine_passes<HD, 1, CU>(a, part_m, part_l, part_acc, head_sink, c_f, c_lv, c_M, row0, h0, splits,
                                             nh, sink_mode, is16);
    else
        l = qk_gqa_combine_passes<HD, PER, CU / PER>(a, part_m, part_l, part_acc, head_sink, c_f, c_lv, c_M, row0,
                                                     h0, splits, nh, sink_mode, is16);
    if (tid < nh) {
        if (sink_mode) {
            const float sigma = sink_mode == 1 ? qk_load_f(head_sink, h0 + tid, is16) : 0.0f;
            l = QK_FADD(l, expf(QK_FADD(sigma, -c_M[tid])));
        }
        c_l[tid] = l;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const int idx = tid + j * T, h = idx / Q4, c = (idx % Q4) * 4;
        if (h >= nh) continue;
        const qk_i64 y = (bs * N + h0 + h) * HD + c;
        qk_store_f(output, y, QK_FDIV(a[j].x, c_l[h]), is16);
        qk_store_f(output, y + 1, QK_FDIV(a[j].y, c_l[h]), is16);
        qk_store_f(output, y + 2, QK_FDIV(a[j].z, c_l[h]), is16);
        qk_store_f(output, y + 3, QK_FDIV(a[j].w, c_l[h]), is16);
    }
}

/* qk_gqa_mma_<cache>_h<head size>: fp16 queries; f16 cache or i8t (int8, per-tensor scales); the
 * loads of a K / V row piece (KW / VW bytes) the widest the head size allows (present buffers
 * aligned to 16 bytes); C CTAs an SM (__launch_bounds__: 3, 168 registers; fp16 x 128 channels 2,
 * without spills). The arguments of the flash kernels (H unused), then the folds': with a ticket
 * the CTA whose split completes a block combines it into output (qk_gqa_mma_combine); with the
 * inputs (query non-null; S = 1) the CTAs append the new rows themselves (qk_gqa_mma_append) and
 * qrot is not read. */
#define QK_GQA_MMA(NAME, KIND, HD, KW, VW, C)                                                                         \
    extern "C" __global__ void __launch_bounds__(QK_GQA_THREADS, C)                                                   \
        NAME(const float* qrot, const void* present_key, const void* present_value, const int* seqlens_k,            \
             const void* attention_bias, const float* k_scale, const float* v_scale, float* part_m, float* part_l,   \
             float* part_acc, qk_i64 S, qk_i64 N, qk_i64 Nk, qk_i64 H, qk_i64 Tp, qk_i64 T, int first_prompt,        \
             int window, int bias_batch, int bias_heads, int is16, float alpha, float softcap, int chunk,             \
             int splits, const void* head_sink, void* output, unsigned* ticket, int sink_mode, const void* query,     \
             const void* key, const void* value, const void* cos_cache, const void* sin_cache,                        \
             const qk_i64* position_ids, qk_i64 pid_stride, int packed, int rotary_dim, int interleaved) {            \
        QK_PHASE(0);                                                                                              \
        const float* qblock =                                                                                         \
            query ? qk_gqa_mma_append<KIND, HD>(query, key, value, seqlens_k, cos_cache, sin_cache, position_ids,     \
                                                k_scale, v_scale, (void*)present_key, (void*)present_value, N, Nk,    \
                                                Tp, pid_stride, first_prompt, packed, rotary_dim, interleaved, chunk, \
                                                splits)                                                               \
                  : nullptr;                                                                                          \
        QK_PHASE(3);                                                                                              \
        qk_gqa_mma<KIND, HD, KW, VW>(qrot, qblock, present_key, present_value, seqlens_k, attention_bias, k_scale,   \
                                     v_scale, part_m, part_l, part_acc, S, N, Nk, Tp, T, first_prompt, window,        \
                                     bias_batch, bias_heads, alpha, softcap, chunk, splits);                          \
        QK_PHASE(8);                                                                                              \
        if (ticket)                                                                                                   \
            qk_gqa_mma_combine<HD, QK_GQA_CU(C)>(part_m, part_l, part_acc, head_sink, output, ticket, N, Nk, splits,  \
                                                 sink_mode, is16);                                                    \
        QK_PHASE(9);                                                                                              \
    }

QK_GQA_MMA(qk_gqa_mma_f16_h16, 1, 16, 8, 4, 3)
QK_GQA_MMA(qk_gqa_mma_f16_h32, 1, 32, 16, 8, 3)
QK_GQA_MMA(qk_gqa_mma_f16_h64, 1, 64, 16, 16, 3)
QK_GQA_MMA(qk_gqa_mma_f16_h128, 1, 128, 16, 16, 2)
QK_GQA_MMA(qk_gqa_mma_i8t_h16, 2, 16, 4, 2, 3)
QK_GQA_MMA(qk_gqa_mma_i8t_h32, 2, 32, 8, 4, 3)
QK_GQA_MMA(qk_gqa_mma_i8t_h64, 2, 64, 16, 8, 3)
QK_GQA_MMA(qk_gqa_mma_i8t_h128, 2, 128, 16, 16, 3)

/* One CTA of QK_GQA_THREADS per (output row r = (b, s, n), chunk of QK_GQA_CC channels), splits <=
 * QK_GQA_MAX_SPLITS: the splits combined in split order, M = max(m_sp, sink), l = sum l_sp
 * exp(m_sp - M) (+ exp(sink - M)), o = sum acc_sp exp(m_sp - M) / l, splits with m_sp = -inf left
 * out. Every CTA of a row computes the same M (a max: any order), the same factors exp(m_sp - M)
 * (a thread a split) and the same l (one thread in split order), so the output does not depend on
 * the chunking. The chunk's partial P V of every split is staged in shared memory first (all its
 * loads in flight at once: s_acc, splits x QK_GQA_CC floats of dynamic shared memory), then each
 * channel is summed by its thread in split order while another thread sums l. sink_mode: 0 none,
 * 1 head_sink[n], 2 a zero logit (smooth_softmax). */
extern "C" __global__ void __launch_bounds__(QK_GQA_THREADS)
    qk_gqa_combine(const float* part_m, const float* part_l, const float* part_acc, const void* head_sink,
                   void* output, qk_i64 rows, qk_i64 N, qk_i64 H, int splits, int sink_mode, int is16) {
    extern __shared__ float s_acc[]; /* [splits][QK_GQA_CC] */
    __shared__ float s_m[QK_GQA_MAX_SPLITS], s_f[QK_GQA_MAX_SPLITS], s_l[QK_GQA_MAX_SPLITS];
    __shared__ float s_max[QK_GQA_THREADS / 32], s_stat;
    /* launched as a dependent of the attention kernel (which does not trigger: this kernel starts as its
     * CTAs exit; started at their start it made batch 1 slower, docs/perf-notes.md session 29): its partials */
    QK_WAIT_PRIOR_GRID();
    const float neg_inf = qk_gqa_neg_inf();
    const int chunks = (int)((H + QK_GQA_CC - 1) / QK_GQA_CC);
    const qk_i64 r = blockIdx.x / chunks, c0 = (qk_i64)(blockIdx.x % chunks) * QK_GQA_CC;
    const int tid = (int)threadIdx.x;
    if (r >= rows) return;
    float mx = neg_inf;
    for (int sp = tid; sp < splits; sp += QK_GQA_THREADS) {
        s_m[sp] = part_m[r * splits + sp];
        s_l[sp] = part_l[r * splits + sp];
        mx = fmaxf(mx, s_m[sp]);
    }
    const int n_acc = splits * QK_GQA_CC;
    for (int i0 = tid; i0 < n_acc; i0 += 8 * QK_GQA_THREADS) { /* 8 loads a thread in flight */
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const int i = i0 + u * QK_GQA_THREADS;
            const qk_i64 c = c0 + i % QK_GQA_CC;
            v[u] = i < n_acc && c < H ? part_acc[(r * splits + i / QK_GQA_CC) * H + c] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 8; ++u)
            if (i0 + u * QK_GQA_THREADS < n_acc) s_acc[i0 + u * QK_GQA_THREADS] = v[u];
    }
#pragma unroll
    for (int off = QK_WARP / 2; off > 0; off >>= 1) mx = fmaxf(mx, QK_SHFL_XOR(mx, off, QK_WARP));
    if (tid % QK_WARP == 0) s_max[tid / QK_WARP] = mx;
    __syncthreads();
    const float sigma = sink_mode == 1 ? qk_load_f(head_sink, r % N, is16) : 0.0f;
    float M = neg_inf;
    for (int w = 0; w < QK_GQA_THREADS / QK_WARP; ++w) M = fmaxf(M, s_max[w]);
    if (sink_mode) M = fmaxf(M, sigma);
    for (int sp = tid; sp < splits; sp += QK_GQA_THREADS)
        s_f[sp] = s_m[sp] == neg_inf ? 0.0f : expf(QK_FADD(s_m[sp], -M));
    __syncthreads();
    float a = 0.0f;
    if (tid < QK_GQA_CC) {
        for (int sp0 = 0; sp0 < splits; sp0 += 8) {
            float v[8], f[8];
            bool use[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                const int sp = sp0 + u;
                use[u] = sp0 + u < splits && s_m[sp] != neg_inf;
                v[u] = use[u] ? s_acc[sp * QK_GQA_CC + tid] : 0.0f;
                f[u] = use[u] ? s_f[sp] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < 8; ++u)
                if (use[u]) a = QK_FADD(a, QK_FMUL(v[u], f[u]));
        }
    } else if (tid == QK_GQA_THREADS - 1) {
        float l = 0.0f;
        for (int sp = 0; sp < splits; ++sp)
            if (s_m[sp] != neg_inf) l = QK_FADD(l, QK_FMUL(s_l[sp], s_f[sp]));
        if (sink_mode) l = QK_FADD(l, expf(QK_FADD(sigma, -M)));
        s_stat = l;
    }
    __syncthreads();
    if (tid < QK_GQA_CC && c0 + tid < H) qk_store_f(output, r * H + c0 + tid, QK_FDIV(a, s_stat), is16);
}

#ifdef QK_GQA_LEGACY
#include "gqa_legacy.h"
#endif

/* A worked `hip:` kernel for gqa_decode (com.microsoft.GroupQueryAttention, one new token per
 * sequence), written only against qconform_abi.h (QCONFORM_GQA_DECODE_PARAMS; `qconform abi
 * gqa_decode` prints it and its rules) and qk_portable.h. Naive on purpose: one thread per output
 * element (b, s, n, c), each walking every key of its row twice (max, then sum and P V), all in
 * fp32; float caches only (fp16 or fp32: requires=kv_cache_bit_width==0).
 *
 * What it computes (docs/ort-ops.md section 4):
 * - past_b = seqlens_k[b] + 1 - S (0 on a first prompt); the query attends keys [lo, L),
 *   L = min(past_b + s + 1, total_b), lo = L - W when local_window_size = W >= 1 and L > W;
 * - rotary (rotary_dim > 0) of the new Q and K at position position_ids[b, s] (a first prompt:
 *   position_ids[0, 0] + s), else past_b + s; pairs (i, i + rd/2) or (2i, 2i+1) when interleaved;
 *   fp32: a' = fma(a, c, -fp32(b t)), b' = fma(a, t, fp32(b c)) (ORT's AVX2 kernel);
 *   fp16: the exact products summed once in fp32, rounded to fp16 (MLAS's fallback);
 * - x_j = fp32(q.k_j * scale) (scale 0: 1/sqrt(H)), softcap c: c tanh(x / c), then + bias;
 *   p_j = exp(x_j - m) / (sum exp(x_j - m) + exp(sink - m)) with the optional sink;
 * - present rows [0, past_b) copied from the past, row past_b + s the new K (rotated) / V, written
 *   by the threads of the first query head of each KV head; later rows are not written.
 *
 *   qconform run --ops gqa_decode \
 *     --impl 'hip:examples/hip_kernel/gqa_decode_naive.hip:gqa_decode_naive:requires=kv_cache_bit_width==0'
 *
 * Geometry: the op's default, one thread per output (work = B * S * N * H, 256 threads a CTA). */
#include "qconform_abi.h"
#include "qk_portable.h"

__device__ __forceinline__ float ld(const void* p, long long i, int f16) {
    return f16 ? __half2float(((const __half*)p)[i]) : ((const float*)p)[i];
}

__device__ __forceinline__ void st(void* p, long long i, float v, int f16) {
    if (f16) ((__half*)p)[i] = __float2half_rn(v);
    else ((float*)p)[i] = v;
}

/* channel e of the row at x + off after rotary at position pos (a value of the input's type) */
__device__ float rotated(const void* x, long long off, int e, long long pos, const void* cosc, const void* sinc,
                         int rd, int inter, int f16) {
    if (e >= rd) return ld(x, off + e, f16);
    const int half = rd / 2;
    const int second = inter ? (e & 1) : (e >= half);
    const int i = inter ? e / 2 : (second ? e - half : e);
    const int ia = inter ? 2 * i : i, ib = inter ? 2 * i + 1 : i + half;
    const float a = ld(x, off + ia, f16), b = ld(x, off + ib, f16);
    const float c = ld(cosc, pos * half + i, f16), t = ld(sinc, pos * half + i, f16);
    if (f16) {
        const float v = second ? QK_FADD(QK_FMUL(a, t), QK_FMUL(b, c)) : QK_FADD(QK_FMUL(a, c), -QK_FMUL(b, t));
        return __half2float(__float2half_rn(v));
    }
    return second ? __fmaf_rn(a, t, QK_FMUL(b, c)) : __fmaf_rn(a, c, -QK_FMUL(b, t));
}

extern "C" __global__ void gqa_decode_naive(QCONFORM_GQA_DECODE_PARAMS) {
    const long long B = batch, S = sequence_length, N = num_heads, Nk = kv_num_heads, H = head_size;
    const long long t = qk_global_thread();
    if (t >= B * S * N * H) return;
    const int c = (int)(t % H), f16 = dtype == QCONFORM_DTYPE_FLOAT16;
    const long long n = (t / H) % N, bs = t / (H * N), b = bs / S, s = bs % S;
    const long long g = n / (N / Nk), total = (long long)seqlens_k[b] + 1;
    const long long past = first_prompt ? 0 : total - S;
    const int rd = (int)rotary_dim, inter = (int)rotary_interleaved;
    /* the rows of query / key / value: packed QKV holds the three side by side per token */
    const long long qh = packed_qkv ? N + 2 * Nk : N, kh = packed_qkv ? N + 2 * Nk : Nk;
    const void* kin = packed_qkv ? query : key;
    const void* vin = packed_qkv ? query : value;
    const long long koff0 = packed_qkv ? N : 0, voff0 = packed_qkv ? N + Nk : 0;
    const long long qoff = (bs * qh + n) * H;

    /* the threads of the first query head of KV head g write present (channel c) */
    if (n % (N / Nk) == 0) {
        const long long row = ((b * Nk + g) * present_sequence_length + past + s) * H + c;
        const long long pos = position_ids ? (first_prompt ? position_ids[0] + s : position_ids[b * S + s]) : past + s;
        const float k = rotated(kin, (bs * kh + koff0 + g) * H, c, pos, cos_cache, sin_cache, rd, inter, f16);
        st(present_key, row, k, f16);
        st(present_value, row, ld(vin, (bs * kh + voff0 + g) * H + c, f16), f16);
        if (s == 0 && past_key != present_key) {
            for (long long r = 0; r < past; ++r) {
                const long long src = ((b * Nk + g) * past_sequence_length + r) * H + c;
                const long long dst = ((b * Nk + g) * present_sequence_length + r) * H + c;
                st(present_key, dst, ld(past_key, src, f16), f16);
                st(present_value, dst, ld(past_value, src, f16), f16);
            }
        }
    }

    const long long L = past + s + 1 < total ? past + s + 1 : total;
    const long long lo = (local_window_size >= 1 && L > local_window_size) ? L - local_window_size : 0;
    const long long qpos = position_ids ? (first_prompt ? position_ids[0] + s : position_ids[b * S + s]) : past + s;
    const float alpha = scale != 0.0f ? scale : QK_FDIV(1.0f, sqrtf((float)H));
    const int has_sink = head_sink != 0 || smooth_softmax == 1;
    const float sink = head_sink ? ld(head_sink, n, f16) : 0.0f;

    /* two passes over the keys: m = max x_j (and the sink); then sum p_j and sum p_j v_j */
    float m = has_sink ? sink : qk_float(0xFF800000u), l = 0.0f, acc = 0.0f;
    for (int pass = 0; pass < 2; ++pass) {
        for (long long j = lo; j < L; ++j) {
            /* key j: a past row as stored, or a new token's key rotated at its own position */
            const long long sj = j - past;
            const long long pj = position_ids ? (first_prompt ? position_ids[0] + sj : position_ids[b * S + sj]) : j;
            float dot = 0.0f;
            for (int e = 0; e < H; ++e) {
                const float q = rotated(query, qoff, e, qpos, cos_cache, sin_cache, rd, inter, f16);
                const float k = j < past ? ld(past_key, ((b * Nk + g) * past_sequence_length + j) * H + e, f16)
                                         : rotated(kin, ((b * S + sj) * kh + koff0 + g) * H, e, pj, cos_cache,
                                                   sin_cache, rd, inter, f16);
                dot = __fmaf_rn(q, k, dot);
            }
            float x = QK_FMUL(dot, alpha);
            if (softcap > 0.0f) x = QK_FMUL(tanhf(QK_FDIV(x, softcap)), softcap);
            if (attention_bias) {
                const long long bb = bias_batch == 1 ? 0 : b, bn = bias_heads == 1 ? 0 : n;
                x = QK_FADD(x, ld(attention_bias, ((bb * bias_heads + bn) * S + s) * total_sequence_length + j, f16));
            }
            if (pass == 0) {
                m = fmaxf(m, x);
                continue;
            }
            const float p = expf(QK_FADD(x, -m));
            const float v = j < past ? ld(past_value, ((b * Nk + g) * past_sequence_length + j) * H + c, f16)
                                     : ld(vin, ((b * S + sj) * kh + voff0 + g) * H + c, f16);
            l = QK_FADD(l, p);
            acc = __fmaf_rn(p, v, acc);
        }
    }
    if (has_sink) l = QK_FADD(l, expf(QK_FADD(sink, -m)));
    st(output, t, QK_FDIV(acc, l), f16);
}

/* The session-8 flash-decoding kernels of ort/gqa.hip, kept for side-by-side timing only: compiled
 * into gqa.hip with -DQK_GQA_FLASH_V1 (qconform.device.launchers.compile_options) in place of the
 * default ones (``python -m qconform.bench.gqa --variants flash,flash_v1``). Every lane of a lane
 * group forms every (key, head) dot of the group by an xor butterfly and runs the online softmax of
 * every head; the same outputs (bit for bit) as the default kernels at head sizes over 64.
 * Needs gqa.hip's helpers (qk_gqa_neg_inf, qk_gqa_score, qk_gqa_group_sum, qk_gqa_lane,
 * qk_gqa_load, QK_GQA_THREADS, QK_GQA_HB) before the include. */
#ifndef QK_GQA_FLASH_V1_H
#define QK_GQA_FLASH_V1_H

#define QK_GQA_FLASH_MIN_CTAS(KIND, U) 3 /* CTAs of a flash kernel resident per SM (__launch_bounds__) */

/* the 8 elements as fp32: fp32 / fp16 values exactly; int8 / 4-bit the integer codes exactly
 * (their scales are applied by the caller), by bits: fp32(2^23 + 128 + code) - (2^23 + 128), and
 * 4-bit element 2i in the low nibble of byte i, code = nibble - 8 */
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
        for (int e = 0; e < 8; ++e) {
            const qk_u32 byte = ((w[e >> 2] >> (8 * (e & 3))) & 0xFFu) ^ 0x80u;
            f[e] = QK_FADD(qk_float(0x4B000000u | byte), -8388736.0f);
        }
    } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const qk_u32 nib = (w[0] >> (4 * e)) & 0xFu;
            f[e] = QK_FADD(qk_float(0x4B000000u | nib), -8388616.0f);
        }
    }
}

/* One CTA of QK_GQA_THREADS per (query row (b, s), split sp of the keys, KV head g, block of up to
 * QK_GQA_HB of g's query heads), so a K / V row is read once for the block's heads: keys
 * [max(lo, sp chunk), min(L, (sp + 1) chunk)) of the row's causal range [lo, L),
 * L = min(past_b + s + 1, total_b), lo = L - W with a window of W < L keys. A group of R lanes
 * (R = H / 8 rounded up to a power of two) takes one key row, 8 channels a lane; group rg takes
 * keys rg + i nrg in tiles of U keys (loaded before any is used), keeping an online softmax per
 * head (m, l and the unnormalised P V in fp32, rescaled at most once a tile). The groups are then
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
    __shared__ float4 s_acc4[QK_GQA_THREADS * 2 * HB]; /* [rg][h][H]: nrg HB H <= THREADS HB 8 floats */
    __shared__ float s_m[QK_GQA_THREADS * HB], s_l[QK_GQA_THREADS * HB], s_f[QK_GQA_THREADS * HB];
    __shared__ float s_stat[2 * HB];
    float* s_acc = (float*)s_acc4;
    const float neg_inf = qk_gqa_neg_inf();
    const int tid = (int)threadIdx.x;
    int R = 1;
    while (R * 8 < H) R <<= 1;
    const int nrg = QK_GQA_THREADS / R, rg = tid / R, c0 = (tid % R) * 8;
    const bool active = c0 < H;
    const int sp = (int)(blockIdx.x % splits);
    const qk_i64 bs = blockIdx.x / splits, b = bs / S, s = bs % S;
    const qk_i64 G = N / Nk, nhb = (G + HB - 1) / HB;
    const qk_i64 g = blockIdx.y / nhb, h0 = g * G + (blockIdx.y % nhb) * HB;
    const int nh = (int)(G - (blockIdx.y % nhb) * HB < HB ? G - (blockIdx.y % nhb) * HB : HB);
    const qk_i64 total = (qk_i64)seqlens_k[b] + 1, past = first_prompt ? 0 : total - S;
    const qk_i64 L = past + s + 1 < total ? past + s + 1 : total;
    const qk_i64 lo = (window >= 1 && L > window) ? L - window : 0;
    const qk_i64 k0 = lo > (qk_i64)sp * chunk ? lo : (qk_i64)sp * chunk;
    const qk_i64 k1 = L < (qk_i64)(sp + 1) * chunk ? L : (qk_i64)(sp + 1) * chunk;
    const int n = k1 > k0 ? (int)(k1 - k0) : 0;
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
    float m[HB], l[HB], acc[HB][8];
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
        float x[U][HB];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            float kf[8];
            qk_gqa_unpack<KIND>(kw[u], kf);
            if (PC) {
#pragma unroll
                for (int e = 0; e < 8; ++e) kf[e] = QK_FMUL(kf[e], ks[e]);
            }
            const int i = i0 + u * nrg;
#pragma unroll
            for (int h = 0; h < HB; ++h) {
                x[u][h] = neg_inf;
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < 8; ++e) d = __fmaf_rn(q[h][e], kf[e], d);
                d = qk_gqa_group_sum(d, R);
                if (KIND >= 2 && !PC) d = QK_FMUL(d, ks[0]);
                if (i < n && h < nh)
                    x[u][h] = qk_gqa_score(d, alpha, softcap, bias_batch ? attention_bias : 0, bias0 + h * bias_hs + i,
                                           is16);
            }
        }
        /* the tile's max per head, one rescale, then p = exp(x - m) in place of x */
#pragma unroll
        for (int h = 0; h < HB; ++h) {
            float mt = x[0][h];
#pragma unroll
            for (int u = 1; u < U; ++u) mt = fmaxf(mt, x[u][h]);
            const float mn = fmaxf(m[h], mt);
            const float c = mn == neg_inf ? 1.0f : expf(QK_FADD(m[h], -mn)); /* every score so far -inf: 1 */
            if (c != 1.0f) {
                l[h] = QK_FMUL(l[h], c);
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[h][e] = QK_FMUL(acc[h][e], c);
            }
            m[h] = mn;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                x[u][h] = x[u][h] == neg_inf ? 0.0f : expf(QK_FADD(x[u][h], -mn)); /* a NaN stays NaN */
                l[h] = QK_FADD(l[h], x[u][h]);
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            float vf[8];
            qk_gqa_unpack<KIND>(vw[u], vf);
#pragma unroll
            for (int h = 0; h < HB; ++h) {
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[h][e] = __fmaf_rn(x[u][h], vf[e], acc[h][e]);
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
    if (tid % R == 0) {
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

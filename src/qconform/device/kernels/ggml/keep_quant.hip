/* ggml's keep-quant linear layer (op matmul_bt_quant) for every weight type with a generic vec_dot
 * (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS):
 *   Y[m, n] = vec_dot(W row n, Q8 row m)
 * in the float order of ggml's generic vec_dot (ggml-org/llama.cpp ggml/src/ggml-cpu/quants.c
 * ggml_vec_dot_<type>_<vec_dot_type>_generic; docs/ggml-formats.md 4), so the result is bit-identical
 * to the generic C built without FMA contraction: every fp32 operation through QK_FMUL / QK_FADD,
 * integers exact in any order.
 *
 * The generic C of Q3_K..Q6_K keeps 8 fp32 lanes, lane l summing, per super-block i,
 *   aux32[l] = sum over e = l (mod 8) of scale(e) * q8[e] * q[e]      (an exact integer)
 * then sums[l] += f32(f32(dx * yd) * (float)aux32[l]) over i in order; Q4_K and Q5_K also
 * sumf -= f32(f32(dmx * yd) * (float)sum_g bsums[g] * min[g / 2]); at the end sumf += sums[0],
 * ..., sums[7]. Q8_0: sumf += f32((float)sumi * f32(dx * dy)) per block of 32 in order.
 * The other types keep one chain, sumf += term, with each block's term(s) from exact integers
 * (sumi of the block, or of each of IQ4_XS's 8 sub-blocks) and the block's scales:
 *   Q4_0   f32(f32((float)sumi * dx) * dy)          Q5_0  f32(f32(dx * dy) * (float)sumi)
 *   Q4_1, Q5_1 (Q8_1 activations, fp16 s)  f32(f32(f32(dx * dy) * (float)sumi) + f32(mx * sy))
 *   IQ4_NL f32(f32(dy * dx) * (float)sumi)
 *   Q2_K   f32(f32(f32(yd * dx) * (float)isum) - f32(f32(yd * dmx) * (float)summs))
 *   IQ4_XS per sub-block ib: f32(f32(f32(dx * yd) * (float)(ls - 32)) * (float)sumi_ib), ib = 0..7
 * (isum = sum_g (sc[g] & 15) * the group's q8 * q; summs = sum_g bsums[g] * (sc[g] >> 4)).
 *
 * Only the fp32 chains are sequential, so the kernel works in two phases per chunk of KQ_C
 * blocks of KQ_R weight rows (a CTA of 32 KQ_R threads: warp r = row r, lane j = block j of the
 * chunk; blockIdx.x tiles the activation rows, MT at a time, blockIdx.y the weight rows):
 *   staging: warp r copies row r's chunk (contiguous bytes) and the CTA the chunk's regrouped
 *     activations into shared memory with wide coalesced loads;
 *   integer phase: thread (r, j) reads block j whole; for the 8-lane types it regroups each
 *     32-value segment's bytes by lane (a 4 x 4 byte transpose, QK_BYTE_PERM) so that one qk_dp4a
 *     takes four products of one lane, and writes the 8 exact aux32 (and the min part, or Q8_0's
 *     sumi) of each activation row to shared memory; for the one-chain types it writes the block's
 *     fp32 term(s) (computed from the exact sums exactly as the C does);
 *   fp32 phase: thread (r, l) runs lane l's chain over the chunk's blocks in order (the min /
 *     one-chain sum too, identically in the row's 8 threads), keeping it in registers across
 *     chunks; at the end the row's 8 threads add their lanes in order (shuffles of width 8:
 *     wave-size agnostic) and thread 0 stores.
 * The activations are quantized beforehand by the Q8_K / Q8_0 quantize kernels (q8_quant.hip,
 * byte-identical to quantize_row_q8_K_ref / _q8_0_ref; Q8_1's quants are Q8_0's, its s is added
 * here) and regrouped once per call (qk_q8_k_lanes, qk_q8_k_words, qk_q8_1_words; Q8_0 quantized straight into its words by
 * q8_quant.hip qk_q8_0_quant_words);
 * launcher: qconform/device/ggml/keep_quant.py. */
#include "qk_portable.h"

#define Q8_K_BYTES 292
#define Q8_K_BSUMS 260
#define Q8_0_BYTES 34
#define KQ_R 4  /* weight rows per CTA: a warp each */
#define KQ_C 32 /* blocks of a row per chunk: the lanes of a warp */
#define KQ_AK 76 /* words per regrouped Q8_K block: 64 quants, 8 bsums words, d, 3 unused */
#define KQ_A0 12 /* words per regrouped Q8_0 block: 8 quants, d, 3 unused */
#define KQ_LO4 0x0F0F0F0Fu

/* ------------------------------------------------------------------ activation regrouping */
/* A regrouped Q8_K block (KQ_AK words, 304 bytes: an odd number of 16-byte words, so threads
 * reading consecutive blocks from shared memory hit distinct banks): word 8 s + l holds the quants
 * q8[32 s + 8 r + l] as bytes r = 0..3; words 64..71 the 16 bsums (int16 pairs, as in the block);
 * word 72 d. One thread per word; n_blocks = M * nb. */
extern "C" __global__ void __launch_bounds__(256)
qk_q8_k_lanes(const qk_u8* a8, qk_u32* aq, qk_i64 n_blocks) {
    const qk_i64 gt = qk_global_thread();
    const qk_i64 blk = gt / KQ_AK;
    if (blk >= n_blocks) return;
    const int w = (int)(gt - blk * KQ_AK);
    const qk_u8* b = a8 + blk * Q8_K_BYTES;
    qk_u32 v = 0u;
    if (w < 64) {
        const qk_u8* qs = b + 4 + 32 * (w >> 3) + (w & 7);
        v = (qk_u32)qs[0] | ((qk_u32)qs[8] << 8) | ((qk_u32)qs[16] << 16) | ((qk_u32)qs[24] << 24);
    } else if (w < 72) {
        v = ((const qk_u32*)(b + Q8_K_BSUMS))[w - 64];
    } else if (w == 72) {
        v = *(const qk_u32*)b;
    }
    aq[gt] = v;
}

/* A regrouped Q8_0 block (KQ_A0 words, 48 bytes): the 32 quants as 8 aligned words, word 8 the
 * fp16 scale as fp32, written by q8_quant.hip's qk_q8_0_quant_words as it quantizes (one launch). */

/* A Q8_K block with its quants in element order (Q2_K, IQ4_XS; KQ_AK words): words 0..63 the
 * quants q8[4 w .. 4 w + 3], 64..71 the bsums, 72 d. One thread per word; n_blocks = M * nb. */
extern "C" __global__ void __launch_bounds__(256)
qk_q8_k_words(const qk_u8* a8, qk_u32* aq, qk_i64 n_blocks) {
    const qk_i64 gt = qk_global_thread();
    const qk_i64 blk = gt / KQ_AK;
    if (blk >= n_blocks) return;
    const int w = (int)(gt - blk * KQ_AK);
    const qk_u8* b = a8 + blk * Q8_K_BYTES;
    qk_u32 v = 0u;
    if (w < 72) v = ((const qk_u32*)(b + 4))[w]; /* qs (bytes 4..259) then bsums (260..291) */
    else if (w == 72) v = *(const qk_u32*)b;
    aq[gt] = v;
}

/* A Q8_1 block (ggml-quants.c quantize_row_q8_1_ref) regrouped as qk_q8_0_quant_words does, plus word 9:
 * s = fp16(f32((float)sum(qs) * d)) as fp32, d the fp32 amax / 127 before its fp16 rounding (the
 * quants and fp16 d are Q8_0's, from the Q8_0 quantize kernel: the same computation). amax is the
 * reference's sequential MAX(a, b) = a > b ? a : b from 0; every fp32 value flushed as the
 * quantize kernels flush. x: the fp32 activations, 32 per block. One thread per block. */
extern "C" __global__ void __launch_bounds__(256)
qk_q8_1_words(const float* x, const qk_u8* a8, qk_u32* aq, qk_i64 n_blocks) {
    const qk_i64 blk = qk_global_thread();
    if (blk >= n_blocks) return;
    const qk_u16* h = (const qk_u16*)(a8 + blk * Q8_0_BYTES);
    const float* v = x + blk * 32;
    qk_u32* o = aq + blk * KQ_A0;
    float amax = 0.0f;
    for (int k = 0; k < 32; ++k) {
        const float a = fabsf(qk_ftz(v[k]));
        amax = amax > a ? amax : a;
    }
    const float d = qk_ftz(QK_FDIV(amax, 127.0f));
    int sum = 0;
    for (int k = 0; k < 8; ++k) {
        o[k] = (qk_u32)h[1 + 2 * k] | ((qk_u32)h[2 + 2 * k] << 16);
        sum = qk_dp4a((int)o[k], 0x01010101, sum);
    }
    o[8] = qk_bits(qk_fp16_to_float(h[0]));
    o[9] = qk_bits(qk_fp16_to_float(qk_fp16_bits(qk_ftz(QK_FMUL(__int2float_rn(sum), d)))));
    o[10] = o[11] = 0u;
}

/* --------------------------------------------------------------------- staging */
/* Row r's chunk of blocks [i0, i0 + nc) is contiguous: warp r copies it with consecutive lanes on
 * consecutive 16-byte (Q4_K 144, Q5_K 176: every block 16-byte aligned) or 4-byte words (Q6_K 210,
 * Q8_0 34: blocks start 0 or 2 bytes past a word, so the aligned words around the chunk are
 * copied and its byte 0 sits at (start & 3); a last word reaching past the chunk is copied as 16
 * bits, so no byte past it is read). */
template <int TS>
__device__ __forceinline__ void kq_stage_row(const qk_u8* src, int nbytes, qk_u8* dst, int lane) {
    if (TS % 16 == 0) {
        for (int k = lane; k < nbytes / 16; k += 32) ((uint4*)dst)[k] = ((const uint4*)src)[k];
    } else {
        const int off = (int)((unsigned long long)src & 3u);
        const qk_u32* p = (const qk_u32*)(src - off);
        const int words = (off + nbytes + 3) / 4;
        const bool short_tail = ((off + nbytes) & 3) != 0;
        for (int k = lane; k < words; k += 32)
            ((qk_u32*)dst)[k] = (k == words - 1 && short_tail) ? (qk_u32)*(const qk_u16*)(p + k) : p[k];
    }
}

/* the block at byte b of a staged row, as words from its byte 0 (WORDS * 4 bytes) */
template <int TS, int WORDS>
__device__ __forceinline__ void kq_unstage(const qk_u8* row, int b, qk_u32 (&w)[WORDS]) {
    if (TS % 16 == 0) {
        const uint4* p = (const uint4*)(row + b);
#pragma unroll
        for (int k = 0; k < WORDS / 4; ++k) {
            const uint4 v = p[k];
            w[4 * k] = v.x; w[4 * k + 1] = v.y; w[4 * k + 2] = v.z; w[4 * k + 3] = v.w;
        }
    } else {
        const qk_u32* p = (const qk_u32*)(row + (b & ~3));
        const qk_u32 sel = (b & 3) ? 0x5432u : 0x3210u;
        qk_u32 prev = p[0];
#pragma unroll
        for (int k = 0; k < WORDS; ++k) {
            const qk_u32 next = p[k + 1];
            w[k] = QK_BYTE_PERM(prev, next, sel);
            prev = next;
        }
    }
}

/* 4 x 4 byte transpose: word j of the result holds byte j of a, b, c, d (as bytes 0..3) */
__device__ __forceinline__ void kq_transpose4(qk_u32 a, qk_u32 b, qk_u32 c, qk_u32 d, qk_u32* out) {
    const qk_u32 t0 = QK_BYTE_PERM(a, b, 0x5140u), t1 = QK_BYTE_PERM(a, b, 0x7362u);
    const qk_u32 t2 = QK_BYTE_PERM(c, d, 0x5140u), t3 = QK_BYTE_PERM(c, d, 0x7362u);
    out[0] = QK_BYTE_PERM(t0, t2, 0x5410u);
    out[1] = QK_BYTE_PERM(t0, t2, 0x7632u);
    out[2] = QK_BYTE_PERM(t1, t3, 0x5410u);
    out[3] = QK_BYTE_PERM(t1, t3, 0x7632u);
}

/* 32 bytes (8 words) regrouped by lane: col[l] holds bytes 8r + l, r = 0..3 */
__device__ __forceinline__ void kq_columns(const qk_u32* w, qk_u32 (&col)[8]) {
    kq_transpose4(w[0], w[2], w[4], w[6], col);
    kq_transpose4(w[1], w[3], w[5], w[7], col + 4);
}

__device__ __forceinline__ int kq_byte(const qk_u32* w, int i) { return (int)((w[i >> 2] >> (8 * (i & 3))) & 0xFFu); }

/* ggml-quants.c get_scale_min_k4: the 6-bit scale and min of sub-block j from the 12 bytes */
__device__ __forceinline__ void kq_scale_min_k4(const qk_u32* sc, int j, int& s, int& m) {
    if (j < 4) {
        s = kq_byte(sc, j) & 63;
        m = kq_byte(sc, j + 4) & 63;
    } else {
        s = (kq_byte(sc, j + 4) & 0xF) | ((kq_byte(sc, j - 4) >> 6) << 4);
        m = (kq_byte(sc, j + 4) >> 4) | ((kq_byte(sc, j) >> 6) << 4);
    }
}

/* the 6-bit Q6_K value u of each byte as the signed byte u - 32 (no borrow between bytes:
 * t = u ^ 32, then bits 6 and 7 set where bit 5 of t is) */
__device__ __forceinline__ int kq_q6_signed(qk_u32 u) {
    const qk_u32 t = u ^ 0x20202020u, sign = t & 0x20202020u;
    return (int)(t | (sign << 1) | (sign << 2));
}

/* bytes holding unsigned v in [0, 2B) -> the signed bytes v - B (B a power of two <= 64; no borrow
 * between bytes: t = v ^ B is v - B in log2(2B)-bit two's complement, then its sign extended) */
__device__ __forceinline__ qk_u32 kq_sub_bias(qk_u32 v, qk_u32 B) {
    const qk_u32 t = v ^ (B * 0x01010101u), sign = t & (B * 0x01010101u);
    return t | sign * (256u / B - 2u);
}

/* bits 0..3 of n as bytes 0..3 (each 0 or 1) */
__device__ __forceinline__ qk_u32 kq_bits_to_bytes(qk_u32 n) { return ((n & 15u) * 0x00204081u) & 0x01010101u; }

/* ggml-common.h kvalues_iq4nl as 4 words (byte i = kvalues_iq4nl[i]) */
#define KQ_IQ4_T0 0xBFAD9881u
#define KQ_IQ4_T1 0xF6EADDCFu
#define KQ_IQ4_T2 0x26190D01u
#define KQ_IQ4_T3 0x71594535u

/* kvalues_iq4nl[n] (int8) of each byte's index n = 0..15: byte b's index becomes selector nibble b;
 * indices 0..7 pick from T0:T1, 8..15 from T2:T3, and bit 3 selects between the two */
__device__ __forceinline__ qk_u32 kq_iq4_lookup(qk_u32 n) {
    const qk_u32 x = n | (n >> 4);
    const qk_u32 s = (x & 0xFFu) | ((x >> 8) & 0xFF00u);
    const qk_u32 lo = QK_BYTE_PERM(KQ_IQ4_T0, KQ_IQ4_T1, s & 0x7777u);
    const qk_u32 hi = QK_BYTE_PERM(KQ_IQ4_T2, KQ_IQ4_T3, s & 0x7777u);
    return QK_BYTE_PERM(lo, hi, 0x3210u | ((s & 0x8888u) >> 1));
}

/* the 6-bit Q3_K scale of group g (ggml-quants.c dequantize_row_q3_K's kmask unpacking), minus 32 */
__device__ __forceinline__ int kq_scale_q3_k(const qk_u32* sc, int g) {
    const int lo4 = g < 8 ? kq_byte(sc, g) & 15 : kq_byte(sc, g - 8) >> 4;
    const int hi2 = (kq_byte(sc, 8 + (g & 3)) >> (2 * (g >> 2))) & 3;
    return (lo4 | (hi2 << 4)) - 32;
}

/* --------------------------------------------------------------------------- shared memory */
/* The staged weight rows share their space with the integer phase's results (written after every
 * thread has read its block). aux32 of (row r, lane l, block j) at aux[m][r][l][j]: the integer
 * phase's writes (32 consecutive j) and the fp32 phase's reads (32 (r, l) at one j, stride 33)
 * are free of bank conflicts. */
template <int TS, int AW, int MT>
struct kq_smem {
    union {
        uint4 rows[KQ_R][(KQ_C * TS + 8 + 15) / 16]; /* a staged chunk per row (+ the 4-byte window) */
        struct {
            int aux[MT][KQ_R][8][KQ_C + 1];  /* 8-lane types: aux32 per lane; Q8_0: lane 0 holds sumi;
                                                one-chain types: the bits of the block's fp32 term(s) */
            int mins[MT][KQ_R][KQ_C + 1];    /* Q4_K / Q5_K: sum_g bsums[g] * min[g / 2] */
        } red;
    } u;
    uint4 act[MT][KQ_C][AW / 4];  /* the chunk's regrouped activation blocks */
    float dx[KQ_R][KQ_C + 1], dmx[KQ_R][KQ_C + 1];
};

/* ------------------------------------------------------------------ integer phase per type */
/* Block j of row r against mt activation rows (their regrouped blocks in shared memory): each
 * lane's exact aux32 (Q4_K / Q5_K: and the min part; Q8_0: sumi) and the block's fp32 scales.
 * Element e = 32 s + 8 r' + l of segment s sits in byte r' of column word l. */
template <int TS, int AW, int MT>
__device__ __forceinline__ void kq_put_aux(const int (&aux)[MT][8], int mt, int r, int j, kq_smem<TS, AW, MT>& sm) {
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        if (m >= mt) break;
#pragma unroll
        for (int l = 0; l < 8; ++l) sm.u.red.aux[m][r][l][j] = aux[m][l];
    }
}

/* block_q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; half d}: element 128h + 32k + ll is
 * (nibble k / 2 of ql[64h + 32(k % 2) + ll]) | (bits 2k, 2k + 1 of qh[32h + ll]) << 4, minus 32,
 * scale scales[e / 16]: bytes r' = 0, 1 of a column word take scales[2s], r' = 2, 3 scales[2s + 1] */
template <int MT>
__device__ __forceinline__ void kq_integer_q6_k(const qk_u32 (&w)[53], int mt, int r, int j, kq_smem<210, KQ_AK, MT>& sm) {
    int aux[MT][8];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int l = 0; l < 8; ++l) aux[m][l] = 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        qk_u32 hc[8], lc0[8], lc1[8];
        kq_columns(w + 32 + 8 * h, hc);
        kq_columns(w + 16 * h, lc0);
        kq_columns(w + 16 * h + 8, lc1);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int s = 4 * h + k;
            const int sc0 = (int)(qk_i8)kq_byte(w + 48, 2 * s), sc1 = (int)(qk_i8)kq_byte(w + 48, 2 * s + 1);
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                if (m >= mt) break;
                const uint4 a0 = sm.act[m][j][2 * s], a1 = sm.act[m][j][2 * s + 1];
                const qk_u32 a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
#pragma unroll
                for (int l = 0; l < 8; ++l) {
                    const qk_u32 lo = ((k & 1 ? lc1[l] : lc0[l]) >> (4 * (k >> 1))) & KQ_LO4;
                    const int q = kq_q6_signed(lo | (((hc[l] >> (2 * k)) & 0x03030303u) << 4));
                    aux[m][l] += sc0 * qk_dp4a(q & 0x0000FFFF, (int)a[l], 0);
                    aux[m][l] += sc1 * qk_dp4a((int)((qk_u32)q & 0xFFFF0000u), (int)a[l], 0);
                }
            }
        }
    }
    sm.dx[r][j] = qk_fp16_to_float((qk_u16)(w[52] & 0xFFFFu));
    kq_put_aux(aux, mt, r, j, sm);
}

/* block_q4_K {half d; half dmin; u8 scales[12]; u8 qs[128]}, block_q5_K {..., u8 qh[32]; u8 qs[128]}:
 * element 64c + 32t + ll is nibble t of qs[32c + ll] (+ 16 x bit (2c + t) of qh[ll]), scale and min
 * of sub-block 2c + t; the min part is sum_g bsums[g] * min[g / 2] over the 16 groups of 16 */
template <int KIND, int TS, int WORDS, int MT>
__device__ __forceinline__ void kq_integer_k4(const qk_u32 (&w)[WORDS], int mt, int r, int j, kq_smem<TS, KQ_AK, MT>& sm) {
    int aux[MT][8];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int l = 0; l < 8; ++l) aux[m][l] = 0;
    const int qs_at = KIND == 5 ? 12 : 4;
    qk_u32 hc[8];
    if (KIND == 5) kq_columns(w + 4, hc);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        qk_u32 col[8];
        kq_columns(w + qs_at + 8 * c, col);
        int sc[2], mn;
        kq_scale_min_k4(w + 1, 2 * c, sc[0], mn);
        kq_scale_min_k4(w + 1, 2 * c + 1, sc[1], mn);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            if (m >= mt) break;
            const uint4 a0 = sm.act[m][j][4 * c], a1 = sm.act[m][j][4 * c + 1];
            const uint4 a2 = sm.act[m][j][4 * c + 2], a3 = sm.act[m][j][4 * c + 3];
            const qk_u32 a[16] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w,
                                  a2.x, a2.y, a2.z, a2.w, a3.x, a3.y, a3.z, a3.w};
#pragma unroll
            for (int t = 0; t < 2; ++t)
#pragma unroll
                for (int l = 0; l < 8; ++l) {
                    qk_u32 q = (col[l] >> (4 * t)) & KQ_LO4;
                    if (KIND == 5) q |= ((hc[l] >> (2 * c + t)) & 0x01010101u) << 4;
                    aux[m][l] += sc[t] * qk_dp4a((int)q, (int)a[8 * t + l], 0);
                }
        }
    }
    int mins[8];
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {
        int s;
        kq_scale_min_k4(w + 1, jj, s, mins[jj]);
    }
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        if (m >= mt) break;
        const uint4 b0 = sm.act[m][j][16], b1 = sm.act[m][j][17];
        const qk_u32 bs[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
        int sumi = 0;
#pragma unroll
        for (int g2 = 0; g2 < 8; ++g2) sumi += ((int)(qk_i16)(bs[g2] & 0xFFFFu) + (int)(qk_i16)(bs[g2] >> 16)) * mins[g2];
        sm.u.red.mins[m][r][j] = sumi;
    }
    sm.dx[r][j] = qk_fp16_to_float((qk_u16)(w[0] & 0xFFFFu));
    sm.dmx[r][j] = qk_fp16_to_float((qk_u16)(w[0] >> 16));
    kq_put_aux(aux, mt, r, j, sm);
}

/* block_q8_0 {half d; i8 qs[32]}: sumi = the 32 products (qs starts 2 bytes into the block) */
template <int MT>
__device__ __forceinline__ void kq_integer_q8_0(const qk_u32 (&w)[9], int mt, int r, int j, kq_smem<Q8_0_BYTES, KQ_A0, MT>& sm) {
    int q[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) q[k] = (int)QK_BYTE_PERM(w[k], w[k + 1], 0x5432u);
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        if (m >= mt) break;
        const uint4 a0 = sm.act[m][j][0], a1 = sm.act[m][j][1];
        const qk_u32 a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        int sumi = 0;
#pragma unroll
        for (int k = 0; k < 8; ++k) sumi = qk_dp4a(q[k], (int)a[k], sumi);
        sm.u.red.aux[m][r][0][j] = sumi;
    }
    sm.dx[r][j] = qk_fp16_to_float((qk_u16)(w[0] & 0xFFFFu));
}

/* block_q3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12]; half d}: element 128k + 32t + ll is bits 2t,
 * 2t + 1 of qs[32k + ll], minus 4 where bit 4k + t of hmask[ll] is clear; scale of group e / 16
 * (kq_scale_q3_k): bytes r' = 0, 1 of a column word take group 2s, r' = 2, 3 group 2s + 1 */
template <int WORDS, int MT>
__device__ __forceinline__ void kq_integer_q3_k(const qk_u32 (&w)[WORDS], int mt, int r, int j, kq_smem<110, KQ_AK, MT>& sm) {
    int aux[MT][8];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int l = 0; l < 8; ++l) aux[m][l] = 0;
    qk_u32 hc[8];
    kq_columns(w, hc);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        qk_u32 col[8];
        kq_columns(w + 8 + 8 * k, col);
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            const int s = 4 * k + t;
            const int g0 = kq_scale_q3_k(w + 24, 2 * s), g1 = kq_scale_q3_k(w + 24, 2 * s + 1);
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                if (m >= mt) break;
                const uint4 a0 = sm.act[m][j][2 * s], a1 = sm.act[m][j][2 * s + 1];
                const qk_u32 a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
#pragma unroll
                for (int l = 0; l < 8; ++l) {
                    const qk_u32 low = (col[l] >> (2 * t)) & 0x03030303u, high = (hc[l] >> s) & 0x01010101u;
                    const int q = (int)kq_sub_bias(low | (high << 2), 4u);
                    aux[m][l] += g0 * qk_dp4a((int)((qk_u32)q & 0x0000FFFFu), (int)a[l], 0)
                               + g1 * qk_dp4a((int)((qk_u32)q & 0xFFFF0000u), (int)a[l], 0);
                }
            }
        }
    }
    sm.dx[r][j] = qk_fp16_to_float((qk_u16)(w[27] & 0xFFFFu));
    kq_put_aux(aux, mt, r, j, sm);
}

/* the fp32 activation scale of block j of activation row m (word YD of its regrouped block) */
template <int TS, int AW, int MT>
__device__ __forceinline__ float kq_act_scale(const kq_smem<TS, AW, MT>& sm, int m, int j, int word) {
    return qk_float(((const qk_u32*)&sm.act[m][j][0])[word]);
}

/* block_q2_K {u8 scales[16]; u8 qs[64]; half d; half dmin}: element 128k + 32t + ll is bits 2t,
 * 2t + 1 of qs[32k + ll], group g = e / 16 with scale scales[g] & 15 and min scales[g] >> 4
 * (activations in element order: qk_q8_k_words). The block's term, as the generic C. */
template <int WORDS, int MT>
__device__ __forceinline__ void kq_integer_q2_k(const qk_u32 (&w)[WORDS], int mt, int r, int j, kq_smem<84, KQ_AK, MT>& sm) {
    int isum[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) isum[m] = 0;
#pragma unroll
    for (int k = 0; k < 2; ++k)
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            const int g = 8 * k + 2 * t;
            const int sc0 = kq_byte(w, g) & 15, sc1 = kq_byte(w, g + 1) & 15;
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                if (m >= mt) break;
                const uint4 a0 = sm.act[m][j][g], a1 = sm.act[m][j][g + 1];
                const qk_u32 a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
                int s0 = 0, s1 = 0;
#pragma unroll
                for (int v = 0; v < 4; ++v) {
                    s0 = qk_dp4a((int)((w[4 + 8 * k + v] >> (2 * t)) & 0x03030303u), (int)a[v], s0);
                    s1 = qk_dp4a((int)((w[8 + 8 * k + v] >> (2 * t)) & 0x03030303u), (int)a[4 + v], s1);
                }
                isum[m] += sc0 * s0 + sc1 * s1;
            }
        }
    const float dx = qk_fp16_to_float((qk_u16)(w[20] & 0xFFFFu)), dmx = qk_fp16_to_float((qk_u16)(w[20] >> 16));
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        if (m >= mt) break;
        const uint4 b0 = sm.act[m][j][16], b1 = sm.act[m][j][17];
        const qk_u32 bs[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
        int summs = 0;
#pragma unroll
        for (int g2 = 0; g2 < 8; ++g2)
            summs += (int)(qk_i16)(bs[g2] & 0xFFFFu) * (kq_byte(w, 2 * g2) >> 4) + (int)(qk_i16)(bs[g2] >> 16) * (kq_byte(w, 2 * g2 + 1) >> 4);
        const float yd = kq_act_scale(sm, m, j, 72);
        const float dall = QK_FMUL(yd, dx), dmin = QK_FMUL(yd, dmx);
        const float term = QK_FADD(QK_FMUL(dall, __int2float_rn(isum[m])), -QK_FMUL(dmin, __int2float_rn(summs)));
        sm.u.red.aux[m][r][0][j] = (int)qk_bits(term);
    }
}

/* block_iq4_xs {half d; u16 scales_h; u8 scales_l[4]; u8 qs[128]}: element 32ib + ll of sub-block ib
 * is kvalues_iq4nl[nibble ll / 16 of qs[16ib + ll % 16]]; ls = nibble ib % 2 of scales_l[ib / 2] |
 * bits 2ib, 2ib + 1 of scales_h << 4 (activations in element order: qk_q8_k_words). The 8 terms. */
template <int WORDS, int MT>
__device__ __forceinline__ void kq_integer_iq4_xs(const qk_u32 (&w)[WORDS], int mt, int r, int j, kq_smem<136, KQ_AK, MT>& sm) {
    const float dx = qk_fp16_to_float((qk_u16)(w[0] & 0xFFFFu));
    const qk_u32 sh = w[0] >> 16;
#pragma unroll
    for (int ib = 0; ib < 8; ++ib) {
        qk_u32 lo[4], hi[4];
#pragma unroll
        for (int v = 0; v < 4; ++v) {
            lo[v] = kq_iq4_lookup(w[2 + 4 * ib + v] & KQ_LO4);
            hi[v] = kq_iq4_lookup((w[2 + 4 * ib + v] >> 4) & KQ_LO4);
        }
        const int ls = ((kq_byte(w + 1, ib >> 1) >> (4 * (ib & 1))) & 15) | (int)(((sh >> (2 * ib)) & 3u) << 4);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            if (m >= mt) break;
            const uint4 a0 = sm.act[m][j][2 * ib], a1 = sm.act[m][j][2 * ib + 1];
            const qk_u32 a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            int sumi = 0;
#pragma unroll
            for (int v = 0; v < 4; ++v) sumi = qk_dp4a((int)hi[v], (int)a[4 + v], qk_dp4a((int)lo[v], (int)a[v], sumi));
            const float d4d8 = QK_FMUL(dx, kq_act_scale(sm, m, j, 72));
            const float dl = QK_FMUL(d4d8, __int2float_rn(ls - 32));
            sm.u.red.aux[m][r][ib][j] = (int)qk_bits(QK_FMUL(dl, __int2float_rn(sumi)));
        }
    }
}

/* The 32-value types against Q8_0 / Q8_1 (qk_q8_0_quant_words / qk_q8_1_words: quants words 0..7, d word
 * 8, Q8_1's s word 9): KIND 10 block_q4_0 {half d; u8 qs[16]}, 11 block_q4_1 {half d, m; u8 qs[16]},
 * 12 block_q5_0 {half d; u8 qh[4]; u8 qs[16]}, 13 block_q5_1 {half d, m; u8 qh[4]; u8 qs[16]},
 * 14 block_iq4_nl {half d; u8 qs[16]}: element ll < 16 is the low nibble of qs[ll], element 16 + ll
 * the high one (Q5: bit ll of qh (little-endian u32) as bit 4); Q4_0 / Q5_0 subtract 8 / 16, IQ4_NL
 * maps through kvalues_iq4nl. The block's term, as the generic C. */
template <int KIND, int TS, int WORDS, int MT>
__device__ __forceinline__ void kq_integer_legacy(const qk_u32 (&w)[WORDS], int mt, int r, int j, kq_smem<TS, KQ_A0, MT>& sm) {
    constexpr int QS = KIND == 11 ? 4 : KIND == 12 ? 6 : KIND == 13 ? 8 : 2; /* byte offset of qs */
    const qk_u32 qh = KIND == 12 ? QK_BYTE_PERM(w[0], w[1], 0x5432u) : w[1];
    qk_u32 lo[4], hi[4];
#pragma unroll
    for (int v = 0; v < 4; ++v) {
        const qk_u32 q = QS & 3 ? QK_BYTE_PERM(w[QS / 4 + v], w[QS / 4 + v + 1], 0x5432u) : w[QS / 4 + v];
        lo[v] = q & KQ_LO4;
        hi[v] = (q >> 4) & KQ_LO4;
        if (KIND == 12 || KIND == 13) {
            lo[v] |= kq_bits_to_bytes(qh >> (4 * v)) << 4;
            hi[v] |= kq_bits_to_bytes(qh >> (16 + 4 * v)) << 4;
        }
        if (KIND == 10 || KIND == 12) {
            lo[v] = kq_sub_bias(lo[v], KIND == 10 ? 8u : 16u);
            hi[v] = kq_sub_bias(hi[v], KIND == 10 ? 8u : 16u);
        } else if (KIND == 14) {
            lo[v] = kq_iq4_lookup(lo[v]);
            hi[v] = kq_iq4_lookup(hi[v]);
        }
    }
    const float dx = qk_fp16_to_float((qk_u16)(w[0] & 0xFFFFu)), mx = qk_fp16_to_float((qk_u16)(w[0] >> 16));
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        if (m >= mt) break;
        const uint4 a0 = sm.act[m][j][0], a1 = sm.act[m][j][1], a2 = sm.act[m][j][2];
        const qk_u32 a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        int sumi = 0;
#pragma unroll
        for (int v = 0; v < 4; ++v) sumi = qk_dp4a((int)hi[v], (int)a[4 + v], qk_dp4a((int)lo[v], (int)a[v], sumi));
        const float fi = __int2float_rn(sumi), dy = qk_float(a2.x), sy = qk_float(a2.y);
        float term;
        if (KIND == 10) term = QK_FMUL(QK_FMUL(fi, dx), dy);
        else if (KIND == 12) term = QK_FMUL(QK_FMUL(dx, dy), fi);
        else if (KIND == 14) term = QK_FMUL(QK_FMUL(dy, dx), fi);
        else term = QK_FADD(QK_FMUL(QK_FMUL(dx, dy), fi), QK_FMUL(mx, sy));
        sm.u.red.aux[m][r][0][j] = (int)qk_bits(term);
    }
}

/* ------------------------------------------------------------------------------- the GEMV */
/* KIND 3, 4, 5, 6: Q3_K, Q4_K, Q5_K, Q6_K, the 8 lanes (aq: qk_q8_k_lanes blocks); 2, 7: Q2_K,
 * IQ4_XS (qk_q8_k_words); 0: Q8_0 (qk_q8_0_quant_words); 10..14: Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL
 * (qk_q8_0_quant_words, Q4_1 / Q5_1 qk_q8_1_words). TERMS: the fp32 terms per block of the one-chain
 * types (0: the 8-lane types and Q8_0). The fp32 phase runs in the first 8 KQ_R threads (8
 * consecutive per row). */
template <int KIND, int TS, int MT>
__device__ __forceinline__ void kq_gemv(const qk_u8* W, const qk_u32* aq, float* Y, qk_i64 M, qk_i64 N, qk_i64 nb) {
    constexpr int WORDS = (TS + 3) / 4; /* the block's words from its byte 0 */
    constexpr int AW = KIND == 0 || KIND >= 10 ? KQ_A0 : KQ_AK;
    constexpr int YD = KIND == 0 || KIND >= 10 ? 8 : 72; /* the activation scale's word */
    constexpr bool LANES = KIND >= 3 && KIND <= 6;
    constexpr int TERMS = KIND == 7 ? 8 : KIND == 2 || KIND >= 10 ? 1 : 0;
    __shared__ kq_smem<TS, AW, MT> sm;
    const int t = threadIdx.x, r = t >> 5, j = t & 31;
    const int fr = t >> 3, fl = t & 7; /* fp32 phase (t < 8 KQ_R): row, lane */
    const qk_i64 m0 = (qk_i64)blockIdx.x * MT, n0 = (qk_i64)blockIdx.y * KQ_R;
    const int mt = (int)(M - m0 < MT ? M - m0 : MT);
    const bool row_ok = n0 + r < N;
    float sums[MT], sumf[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) sums[m] = sumf[m] = 0.0f;
    for (qk_i64 i0 = 0; i0 < nb; i0 += KQ_C) {
        const int nc = (int)(nb - i0 < KQ_C ? nb - i0 : KQ_C);
        const qk_u8* src = W + ((n0 + r) * nb + i0) * TS;
        qk_u8* row = (qk_u8*)sm.u.rows[r];
        if (row_ok) kq_stage_row<TS>(src, nc * TS, row, j);
        for (int m = 0; m < mt; ++m) { /* the chunk's activation blocks, contiguous */
            const uint4* a = (const uint4*)(aq + ((m0 + m) * nb + i0) * AW);
            for (int k = t; k < nc * AW / 4; k += 32 * KQ_R) (&sm.act[m][0][0])[k] = a[k];
        }
        __syncthreads();
        const bool valid = row_ok && j < nc;
        qk_u32 w[WORDS];
        if (valid) kq_unstage<TS, WORDS>(row, (int)((unsigned long long)src & 3u) * (TS % 16 != 0) + j * TS, w);
        __syncthreads();
        if (valid) {
            if (KIND == 0) kq_integer_q8_0<MT>(*(const qk_u32(*)[9])w, mt, r, j, *(kq_smem<Q8_0_BYTES, KQ_A0, MT>*)&sm);
            else if (KIND == 6) kq_integer_q6_k<MT>(*(const qk_u32(*)[53])w, mt, r, j, *(kq_smem<210, KQ_AK, MT>*)&sm);
            else if (KIND == 3) kq_integer_q3_k<28, MT>(*(const qk_u32(*)[28])w, mt, r, j, *(kq_smem<110, KQ_AK, MT>*)&sm);
            else if (KIND == 2) kq_integer_q2_k<21, MT>(*(const qk_u32(*)[21])w, mt, r, j, *(kq_smem<84, KQ_AK, MT>*)&sm);
            else if (KIND == 7) kq_integer_iq4_xs<34, MT>(*(const qk_u32(*)[34])w, mt, r, j, *(kq_smem<136, KQ_AK, MT>*)&sm);
            else if (KIND >= 10) kq_integer_legacy<KIND, TS, WORDS, MT>(w, mt, r, j, *(kq_smem<TS, KQ_A0, MT>*)&sm);
            else kq_integer_k4<KIND, TS, WORDS, MT>(w, mt, r, j, *(kq_smem<TS, KQ_AK, MT>*)&sm);
        }
        __syncthreads();
        if (t < 8 * KQ_R) {
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                if (m >= mt) break;
                for (int jj = 0; jj < nc; ++jj) {
                    if (TERMS > 0) {
#pragma unroll
                        for (int k = 0; k < TERMS; ++k) sumf[m] = QK_FADD(sumf[m], qk_float((qk_u32)sm.u.red.aux[m][fr][k][jj]));
                        continue;
                    }
                    const float yd = qk_float(((const qk_u32*)&sm.act[m][jj][0])[YD]);
                    const float d = QK_FMUL(sm.dx[fr][jj], yd);
                    if (KIND == 0) {
                        sumf[m] = QK_FADD(sumf[m], QK_FMUL(__int2float_rn(sm.u.red.aux[m][fr][0][jj]), d));
                    } else {
                        sums[m] = QK_FADD(sums[m], QK_FMUL(d, __int2float_rn(sm.u.red.aux[m][fr][fl][jj])));
                        if (KIND == 4 || KIND == 5) {
                            const float dmin = QK_FMUL(sm.dmx[fr][jj], yd);
                            sumf[m] = QK_FADD(sumf[m], -QK_FMUL(dmin, __int2float_rn(sm.u.red.mins[m][fr][jj])));
                        }
                    }
                }
            }
        }
        __syncthreads();
    }
    if (t >= 8 * KQ_R) return;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        if (m >= mt) break;
        float y = sumf[m];
        if (LANES) {
#pragma unroll
            for (int k = 0; k < 8; ++k) y = QK_FADD(y, QK_SHFL(sums[m], k, 8));
        }
        if (fl == 0 && n0 + fr < N) Y[(m0 + m) * N + n0 + fr] = y;
    }
}

/* (type, KIND, type size) x MT activation rows per CTA */
#define KQ_GEMV(NAME, KIND, TS, MT)                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * KQ_R) qk_kq_gemv_##NAME##_m##MT(                      \
        const qk_u8* W, const qk_u32* aq, float* Y, qk_i64 M, qk_i64 N, qk_i64 nb) {                       \
        kq_gemv<KIND, TS, MT>(W, aq, Y, M, N, nb);                                                           \
    }
#define KQ_GEMV_ALL(MT)          \
    KQ_GEMV(q4_k, 4, 144, MT)    \
    KQ_GEMV(q5_k, 5, 176, MT)    \
    KQ_GEMV(q6_k, 6, 210, MT)    \
    KQ_GEMV(q8_0, 0, Q8_0_BYTES, MT) \
    KQ_GEMV(q3_k, 3, 110, MT)    \
    KQ_GEMV(q2_k, 2, 84, MT)     \
    KQ_GEMV(iq4_xs, 7, 136, MT)  \
    KQ_GEMV(q4_0, 10, 18, MT)    \
    KQ_GEMV(q4_1, 11, 20, MT)    \
    KQ_GEMV(q5_0, 12, 22, MT)    \
    KQ_GEMV(q5_1, 13, 24, MT)    \
    KQ_GEMV(iq4_nl, 14, 18, MT)

KQ_GEMV_ALL(1)
KQ_GEMV_ALL(2)

/* ONNX Runtime quantized-weight family: MatMulNBits on the matrix units.
 * Semantics: qconform.oracles.ort; shared device functions in ort_common.h. Kernels take plain
 * pointer and int arguments (CuPy launches them; qconform.device.ort says how). */
#include "ort_common.h"

/* ------------------------------------------ MatMulNBits on the matrix units (qk_mma_16816) */
/* Bits 2 and 4, fp16 A / scales / Y, block size a multiple of 64. Y (M, N) = A @ W^T (+ bias).
 *
 * A warp owns R tiles of 16 output rows x T groups of 8 tokens over a range of 64-wide K chunks;
 * the WK warps of a CTA split the chunks of one such item and add their partial sums in shared
 * memory in warp order (deterministic); WI items per CTA. Per chunk, lane t of a 4-lane quad
 * reads 16 consecutive K positions of each of its rows, k = 64c + 16t + 0..15: one 32-bit word
 * (u2) or two (u4), coalesced per row. A K chunk lies in one block (block % 64 == 0), so each
 * chunk's partial dot is scaled by its block's scale.
 *
 * Weights become exact fp16 integers: (word & mask) | 0x6400 per half is 1024 + q * 2^p (the
 * field q at bit p of the half), and one exact fp16x2 fma by (2^-p, -1024 * 2^-p) leaves q.
 * The mma's K slots are a permutation of the chunk's positions, the same for weights and
 * activations (qk_slot_pairs); products are exact, sums fp32 (the tensor core's order).
 * Per chunk and row: acc += s * sum(a (q - zi)) + c * sum(a), zi the integer nearest the zero
 * point z within [0, 2^BITS - 1] (folded into the weights: q - zi is an exact fp16 integer, so
 * the mma's products are exact) and c = fp32(-s (z - zi)) (0 for integer zero points: default,
 * packed, integer scalars; then the sum(a) mma and its FFMA are skipped). |z - zi| <= |z - q|
 * for every code q, so neither term is larger than sum |a| |q - z| |s|: the sums' error is the
 * normal accumulation error beside a large activation on weights q = z (docs/perf-notes.md,
 * session 10; the model: tests/nbits_mma_model.py). ORT's float form fp32(q s) + fp32(-s z)
 * (docs/ort-ops.md) is one rounding of s (q - z): q s and s z are exact in fp32 for fp16 s, z
 * and codes of at most 4 bits, so each term is within 2^-24 of s (q - z). The build option
 * -DQK_NBITS_ZP_SUM_V1 keeps the session-3 form (q itself in the weights, c = fp32(-s z) through
 * sum(a) for every kind: cancels beside a large activation on weights q = z). sum(a) per token
 * comes from one more mma with an all-ones A. */

/* the chunk-relative K positions of the fp16 pair in mma m's register P (b[0] / a[0], a[1]) and
 * Q (b[1] / a[2], a[3]): u2 word = 4 bytes x 4 fields, byte b field j at k = 4b + j; the pair
 * (w >> 8i) & (3 << 2m) holds bytes i and i + 2 -> (4i + m, 8 + 4i + m). u4 words w0, w1 =
 * k 0..7, 8..15, nibble pairs (bytes i, i + 2) -> (m, 4 + m) of each word. */
template <int BITS>
__device__ __forceinline__ void qk_slot_pairs(int m, int p[2], int q[2]) {
    if (BITS == 2) { p[0] = m; p[1] = 8 + m; q[0] = 4 + m; q[1] = 12 + m; }
    else { p[0] = m; p[1] = 4 + m; q[0] = 8 + m; q[1] = 12 + m; }
}

/* the fp16 offset pairs -(2^(10 - p) + z) of mma m's field position p (u2: p = 2m, u4: p = 4 (m & 1)):
 * with them qk_q_pair leaves q - z, exactly (z = 0: q itself) */
template <int BITS>
__device__ __forceinline__ void qk_fold_offsets(int z, qk_u32 off[4]) {
#pragma unroll
    for (int m = 0; m < 4; ++m) {
        const int p = BITS == 2 ? 2 * m : (m & 1) * 4;
        const qk_u32 o = qk_fp16_bits(-(float)((1024 >> p) + z));
        off[m] = o | o << 16;
    }
}

/* the exact fp16 pair (q_lo - z, q_hi - z) of the field under mask at bit p of each half: 1024 +
 * q 2^p from the 0x6400 magic, times 2^-p plus the offset pair off in one exact fma */
__device__ __forceinline__ qk_u32 qk_q_pair(qk_u32 v, qk_u32 mask, int p, qk_u32 off) {
    const qk_u32 scale = (qk_u32)(15 - p) << 10;
    return qk_hfma2(qk_and_or(v, mask, 0x64006400u), scale | scale << 16, off);
}

template <int BITS>
__device__ __forceinline__ void qk_weight_pairs(const qk_u32 w[BITS / 2], int m, const qk_u32 off[4], qk_u32* P,
                                                qk_u32* Q) {
    if (BITS == 2) {
        *P = qk_q_pair(w[0], 0x00030003u << (2 * m), 2 * m, off[m]);
        *Q = qk_q_pair(w[0] >> 8, 0x00030003u << (2 * m), 2 * m, off[m]);
    } else {
        const int p = (m & 1) * 4;
        const qk_u32 mask = 0x000F000Fu << p;
        *P = qk_q_pair(w[0] >> (8 * (m >> 1)), mask, p, off[m]);
        *Q = qk_q_pair(w[BITS / 2 - 1] >> (8 * (m >> 1)), mask, p, off[m]);
    }
}

/* the fp16 pair (a[x], a[y]) of a lane's 16 activations h[i] = (a[2i], a[2i + 1]) */
__device__ __forceinline__ qk_u32 qk_act_pair(const qk_u32 h[8], int x, int y) {
    return QK_BYTE_PERM(h[x >> 1], h[y >> 1], ((x & 1) ? 0x32u : 0x10u) | ((y & 1) ? 0x7600u : 0x5400u));
}

/* a lane's 16 activations of token tok: 8 from ka, 8 from kb (zeros past K or past M); 16-byte
 * loads when a_vec */
__device__ __forceinline__ void qk_load_act(qk_u32 h[8], const qk_u16* A, int tok, int M, int K, int ka, int kb,
                                               int a_vec) {
#pragma unroll
    for (int part = 0; part < 2; ++part) {
        const int k0 = part ? kb : ka;
        qk_u32* o = h + 4 * part;
        if (tok >= M || k0 >= K) {
            o[0] = o[1] = o[2] = o[3] = 0u;
            continue;
        }
        const qk_u16* p = A + (qk_i64)tok * K + k0;
        if (a_vec && k0 + 8 <= K) {
            const uint4 v = *(const uint4*)p;
            o[0] = v.x; o[1] = v.y; o[2] = v.z; o[3] = v.w;
            continue;
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const qk_u32 lo = k0 + 2 * i < K ? p[2 * i] : 0u, hi = k0 + 2 * i + 1 < K ? p[2 * i + 1] : 0u;
            o[i] = lo | hi << 16;
        }
    }
}

/* a lane's 16 activations at ka and kb of a row (16-byte aligned, both runs inside it): 16-byte loads */
__device__ __forceinline__ void qk_act16(qk_u32 h[8], const qk_u16* row, int ka, int kb) {
    const uint4 v0 = *(const uint4*)(row + ka), v1 = *(const uint4*)(row + kb);
    h[0] = v0.x; h[1] = v0.y; h[2] = v0.z; h[3] = v0.w;
    h[4] = v1.x; h[5] = v1.y; h[6] = v1.z; h[7] = v1.w;
}

/* the same out of the staged rows (Kp halves each, zero past K) */
__device__ __forceinline__ void qk_load_act_smem(qk_u32 h[8], const qk_u16* sA, int tok, int n_tok, int Kp, int ka,
                                                    int kb) {
    if (tok >= n_tok) {
#pragma unroll
        for (int i = 0; i < 8; ++i) h[i] = 0u;
        return;
    }
    qk_act16(h, sA + tok * Kp, ka, kb);
}

/* one row's words for chunk c, lane t */
template <int BITS>
__device__ __forceinline__ void qk_load_words(qk_u32 w[BITS / 2], const qk_u8* row, int c, int t) {
    const qk_u8* p = row + (qk_i64)c * (8 * BITS) + 2 * BITS * t;
    if (BITS == 2) {
        w[0] = *(const qk_u32*)p;
    } else {
        const uint2 v = *(const uint2*)p;
        w[0] = v.x;
        w[BITS / 2 - 1] = v.y;
    }
}

/* the scale and zero point of row n for block kb in one register: fp16 scale bits | z << 16,
 * z = the fp16 bits of a float zero point, the integer of a packed one, 0 for the others */
__device__ __forceinline__ qk_u32 qk_load_sz(const qk_u16* scales, const void* zp, int n, int kb, int k_blocks,
                                             int bits, int zp_bytes, int zp_kind) {
    const qk_i64 i = (qk_i64)n * k_blocks + kb;
    qk_u32 z = 0u;
    if (zp_kind == ZP_FLOAT) z = ((const qk_u16*)zp)[i];
    else if (zp_kind == ZP_PACKED) z = (qk_u32)qk_field((const qk_u8*)zp + (qk_i64)n * zp_bytes, bits, kb);
    return (qk_u32)scales[i] | z << 16;
}

#ifdef QK_NBITS_ZP_SUM_V1
/* s and c = -s * z from qk_load_sz's register; zconst: the scalar or default zero point */
__device__ __forceinline__ void qk_unpack_sz(qk_u32 v, float zconst, int zp_kind, float* s, float* c) {
    *s = qk_fp16_to_float((qk_u16)v);
    if (zp_kind == ZP_FLOAT) {
        *c = qk_ftz(QK_FMUL(-*s, qk_ftz(qk_fp16_to_float((qk_u16)(v >> 16)))));
        return;
    }
    *c = -*s * (zp_kind == ZP_PACKED ? (float)(v >> 16) : zconst);
}
#endif

/* zi: the integer nearest z within the codes [0, 2^BITS - 1] (0 for NaN), so |z - zi| <= |z - q|
 * for every code q */
template <int BITS>
__device__ __forceinline__ int qk_zero_int(float z) {
    return (int)fminf(fmaxf(rintf(z), 0.0f), (float)((1 << BITS) - 1));
}

/* s, zi and c = fp32(-s (z - zi)) from qk_load_sz's register (z - zi is exact in fp32: z an fp16
 * value, zi an integer of at most 4 bits); zi_const, zf_const: the scalar or default zero point's
 * zi and z - zi */
template <int BITS>
__device__ __forceinline__ void qk_unpack_szi(qk_u32 v, int zi_const, float zf_const, int zp_kind, float* s, int* zi,
                                              float* c) {
    *s = qk_fp16_to_float((qk_u16)v);
    int i = zi_const;
    float f = zf_const;
    if (zp_kind == ZP_PACKED) {
        i = (int)(v >> 16);
        f = 0.0f;
    } else if (zp_kind == ZP_FLOAT) {
        const float z = qk_ftz(qk_fp16_to_float((qk_u16)(v >> 16)));
        i = qk_zero_int<BITS>(z);
        f = QK_FADD(z, -(float)i);
    }
    *zi = i;
    *c = qk_ftz(QK_FMUL(-*s, f));
}

/* qk_fold_offsets for an integer zero point 0 <= zi < 2^BITS without conversions: -(2^(10 - p) +
 * zi) is the fp16 0x8000 | (25 - p) << 10 | zi << p (exponent of 2^(10 - p), zi in the mantissa:
 * zi << p < 2^10, no carry), splatted to both halves */
template <int BITS>
__device__ __forceinline__ void qk_int_offsets(int zi, qk_u32 off[4]) {
    const qk_u32 zz = (qk_u32)zi * 0x00010001u;
#pragma unroll
    for (int m = 0; m < 4; ++m) {
        const int p = BITS == 2 ? 2 * m : (m & 1) * 4;
        const qk_u32 base = 0x8000u | (qk_u32)(25 - p) << 10;
        off[m] = (base | base << 16) + (zz << p);
    }
}

/* the block of chunk c (of n_chunks): c >> cpb_shift, blocks of 64 << cpb_shift */
__device__ __forceinline__ int qk_chunk_block(int c, int cpb_shift, int n_chunks) {
    return c >> cpb_shift;
}

/* the CTA copies rows tok0 .. tok0 + n_tok of A into shared memory, Kp halves each, zeros past K
 * (row by row: no division per 16 bytes) */
__device__ __forceinline__ void qk_stage_act(qk_u16* sA, const qk_u16* A, int tok0, int n_tok, int K, int Kp,
                                             int a_vec) {
    for (int r = 0; r < n_tok; ++r)
        for (int k = 8 * (int)threadIdx.x; k < Kp; k += 8 * (int)blockDim.x) {
            const qk_u16* src = A + (qk_i64)(tok0 + r) * K + k;
            uint4 v;
            if (a_vec && k + 8 <= K) {
                v = *(const uint4*)src;
            } else {
                qk_u32 x[4];
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const qk_u32 lo = k + 2 * j < K ? src[2 * j] : 0u, hi = k + 2 * j + 1 < K ? src[2 * j + 1] : 0u;
                    x[j] = lo | hi << 16;
                }
                v = make_uint4(x[0], x[1], x[2], x[3]);
            }
            *(uint4*)(sA + r * Kp + k) = v;
        }
}

/* the K positions in a chunk of lane t's 16 activations in the ring kernel (two runs of 8, the K
 * slots of its transposed words): u2 16 t and 16 t + 8, u4 8 t and 32 + 8 t */
template <int BITS>
__device__ __forceinline__ int qk_ring_ka(int t) { return BITS == 2 ? 16 * t : 8 * t; }
template <int BITS>
__device__ __forceinline__ int qk_ring_kb(int t) { return BITS == 2 ? 16 * t + 8 : 32 + 8 * t; }

/* The ring kernel's staged activations, paired: rows 0 .. n_tok of A (a_len halves each) into
 * rows of Kp halves, zeros past a_len; the 16 halves lane t reads of chunk c (at ka, kb) stored at
 * 64 c + 16 t in the order of its mma operands, (bf[m][0], bf[m][1]) for m = 0 .. 3 (qk_act_pair of
 * qk_slot_pairs), so that a chunk's operands are two 16-byte loads and no byte permutes. */
/* unit h (16 halves: 2 x 8 from qk_load_act) in the paired layout at `at` */
template <int BITS>
__device__ __forceinline__ void qk_store_act_paired(qk_u16* at, const qk_u32 (&h)[8]) {
    qk_u32 o[8];
#pragma unroll
    for (int m = 0; m < 4; ++m) {
        int pp[2], qq[2];
        qk_slot_pairs<BITS>(m, pp, qq);
        o[2 * m] = qk_act_pair(h, pp[0], pp[1]);
        o[2 * m + 1] = qk_act_pair(h, qq[0], qq[1]);
    }
    uint4* dst = (uint4*)at;
    dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
    dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

#ifndef QK_NBITS_STAGE_BATCH /* u4's units a thread loads before it stores any (session 52); 1: one at a time */
#define QK_NBITS_STAGE_BATCH 4
#endif
/* u2: a unit at a time (loaded, then stored: its stores may alias A for the compiler, so each waits on
 * its load). u4: a thread's NB units (unit i: row i / (Kp / 16)) loaded, then stored, over the rows at
 * once (measured faster for u4, mixed for u2: docs/perf-notes.md, session 52) */
template <int BITS>
__device__ __forceinline__ void qk_stage_act_paired(qk_u16* sA, const qk_u16* A, int n_tok, int a_len, int Kp,
                                                    int a_vec) {
    constexpr int NB = BITS == 4 ? QK_NBITS_STAGE_BATCH : 1;
    if (NB == 1) {
        for (int r = 0; r < n_tok; ++r)
            for (int q = (int)threadIdx.x; q < Kp / 16; q += (int)blockDim.x) {
                const int k0 = 64 * (q >> 2), t = q & 3;
                qk_u32 h[8];
                qk_load_act(h, A, r, n_tok, a_len, k0 + qk_ring_ka<BITS>(t), k0 + qk_ring_kb<BITS>(t), a_vec);
                qk_store_act_paired<BITS>(sA + r * Kp + 16 * q, h);
            }
        return;
    }
    const int units = Kp / 16, all = n_tok * units, step = (int)blockDim.x;
    for (int i0 = (int)threadIdx.x; i0 < all; i0 += NB * step) {
        qk_u32 h[NB][8];
#pragma unroll
        for (int b = 0; b < NB; ++b) {
            const int i = i0 + b * step, r = i / units, q = i - r * units, k0 = 64 * (q >> 2), t = q & 3;
            if (i < all) qk_load_act(h[b], A, r, n_tok, a_len, k0 + qk_ring_ka<BITS>(t), k0 + qk_ring_kb<BITS>(t), a_vec);
        }
#pragma unroll
        for (int b = 0; b < NB; ++b) {
            const int i = i0 + b * step;
            if (i < all) qk_store_act_paired<BITS>(sA + 16 * i, h[b]); /* row r at r Kp = 16 r units */
        }
    }
}

template <int BITS, int R>
__device__ __forceinline__ void qk_load_chunk(qk_u32 w[R][2][BITS / 2], qk_u32 sz[R][2], const qk_u8* const wrow[R][2],
                                              const int rows[R][2], const qk_u16* scales, const void* zp, int c, int t,
                                              int cpb_shift, int n_chunks, int k_blocks, int zp_bytes, int zp_kind) {
    const int kb = qk_chunk_block(c, cpb_shift, n_chunks);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            qk_load_words<BITS>(w[r][h], wrow[r][h], c, t);
            sz[r][h] = qk_load_sz(scales, zp, rows[r][h], kb, k_blocks, BITS, zp_bytes, zp_kind);
        }
}

/* P chunks of weights and scales in flight per warp (a ring of registers, refilled P ahead);
 * the activations staged once per CTA in shared memory (act_smem: one item per CTA, rows fit),
 * else read from global memory one chunk ahead */
template <int BITS, int R, int T, int P>
__device__ __forceinline__ void qk_nbits_mma(const qk_u16* A, const qk_u8* B, const qk_u16* scales, const void* zp,
                                             float zps, const qk_u16* bias, qk_u16* Y, int M, int K, int N,
                                             int cpb_shift, int k_blocks, int zp_bytes, int zp_kind, int has_bias,
                                             int a_vec, int act_smem, int wk_n, int wi_n) {
    extern __shared__ float qk_red[];  /* staged activations first, then the K-split partial sums */
    constexpr int WPR = BITS / 2, NACC = R * T * 4;
    const int lane = (int)(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
    const int warp = (int)(threadIdx.x >> 5), wk = warp % wk_n, wi = warp / wk_n;
    const int row_items = (N + 16 * R - 1) / (16 * R);
    const qk_i64 item = (qk_i64)blockIdx.x * wi_n + wi;
    const bool live = item < (qk_i64)row_items * ((M + 8 * T - 1) / (8 * T));
    const int row0 = (int)(item % row_items) * 16 * R, tok0 = (int)(item / row_items) * 8 * T;
    const int n_chunks = (K + 63) / 64, c_lo = wk * n_chunks / wk_n, c_hi = (wk + 1) * n_chunks / wk_n;
    const qk_i64 row_bytes = (qk_i64)k_blocks * ((64 << cpb_shift) * BITS / 8);
    const int Kp = n_chunks * 64, n_tok = min(8 * T, M - tok0);
    qk_u16* sA = (qk_u16*)qk_red;
    if (act_smem) {
        qk_stage_act(sA, A, tok0, n_tok, K, Kp, a_vec);
        __syncthreads();
    }
    const float zconst = zp_kind == ZP_SCALAR ? zps : (float)(1 << (BITS - 1));
#ifdef QK_NBITS_ZP_SUM_V1
    qk_u32 qoff[4]; /* q itself: the zero point is applied through sum(a) */
    qk_fold_offsets<BITS>(0, qoff);
    const bool frac = true;
#else
    const int zi_const = qk_zero_int<BITS>(zconst);
    const float zf_const = QK_FADD(zconst, -(float)zi_const);
    /* a zero point with a fraction: the sum(a) mma (uniform across the grid) */
    const bool frac = zp_kind == ZP_FLOAT || (zp_kind != ZP_PACKED && zf_const != 0.0f);
#endif

    int rows[R][2];
    const qk_u8* wrow[R][2];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            rows[r][h] = min(row0 + 16 * r + 8 * h + g, N - 1);
            wrow[r][h] = B + rows[r][h] * row_bytes;
        }

    float acc[NACC];
#pragma unroll
    for (int i = 0; i < NACC; ++i) acc[i] = 0.0f;

    if (live && c_lo < c_hi) {
        qk_u32 w[P][R][2][WPR], sz[P][R][2], act[T][8];
#pragma unroll
        for (int j = 0; j < P; ++j)
            if (c_lo + j < c_hi)
                qk_load_chunk<BITS, R>(w[j], sz[j], wrow, rows, scales, zp, c_lo + j, t, cpb_shift, n_chunks, k_blocks,
                                       zp_bytes, zp_kind);
        if (!act_smem) {
#pragma unroll
            for (int tg = 0; tg < T; ++tg)
                qk_load_act(act[tg], A, tok0 + 8 * tg + g, M, K, c_lo * 64 + 16 * t, c_lo * 64 + 16 * t + 8, a_vec);
        }

        for (int cb = c_lo; cb < c_hi; cb += P) {
#pragma unroll
            for (int j = 0; j < P; ++j) {
                const int c = cb + j;
                if (c < c_hi) { /* (no break: AMD clang then fully unrolls the ring) */
                    /* this chunk's operands out of the ring, then the refill P chunks ahead */
                    qk_u32 bf[T][4][2], wc[R][2][WPR], szc[R][2];
                    if (act_smem) {
#pragma unroll
                        for (int tg = 0; tg < T; ++tg)
                            qk_load_act_smem(act[tg], sA, 8 * tg + g, n_tok, Kp, c * 64 + 16 * t, c * 64 + 16 * t + 8);
                    }
#pragma unroll
                    for (int tg = 0; tg < T; ++tg) {
#pragma unroll
                        for (int m = 0; m < 4; ++m) {
                            int p[2], q[2];
                            qk_slot_pairs<BITS>(m, p, q);
                            bf[tg][m][0] = qk_act_pair(act[tg], p[0], p[1]);
                            bf[tg][m][1] = qk_act_pair(act[tg], q[0], q[1]);
                        }
                    }
#pragma unroll
                    for (int r = 0; r < R; ++r)
#pragma unroll
                        for (int h = 0; h < 2; ++h) {
                            szc[r][h] = sz[j][r][h];
#pragma unroll
                            for (int i = 0; i < WPR; ++i) wc[r][h][i] = w[j][r][h][i];
                        }
                    if (c + P < c_hi)
                        qk_load_chunk<BITS, R>(w[j], sz[j], wrow, rows, scales, zp, c + P, t, cpb_shift, n_chunks,
                                               k_blocks, zp_bytes, zp_kind);
                    if (!act_smem && c + 1 < c_hi) {
                        const int k0 = (c + 1) * 64 + 16 * t;
#pragma unroll
                        for (int tg = 0; tg < T; ++tg)
                            qk_load_act(act[tg], A, tok0 + 8 * tg + g, M, K, k0, k0 + 8, a_vec);
                    }
                    const qk_u32 ones[4] = {0x3C003C00u, 0x3C003C00u, 0x3C003C00u, 0x3C003C00u};
                    float asum[T][4];
#pragma unroll
                    for (int tg = 0; tg < T; ++tg) {
#pragma unroll
                        for (int i = 0; i < 4; ++i) asum[tg][i] = 0.0f;
                        if (frac) {
#pragma unroll
                            for (int m = 0; m < 4; ++m) qk_mma_16816(asum[tg], ones, bf[tg][m]);
                        }
                    }
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        float d[T][4], sc[2], cc[2];
#ifdef QK_NBITS_ZP_SUM_V1
                        qk_unpack_sz(szc[r][0], zconst, zp_kind, &sc[0], &cc[0]);
                        qk_unpack_sz(szc[r][1], zconst, zp_kind, &sc[1], &cc[1]);
                        const qk_u32* off0 = qoff;
                        const qk_u32* off1 = qoff;
#else
                        int zi[2];
                        qk_u32 off0[4], off1[4]; /* q - zi of rows g and g + 8 */
                        qk_unpack_szi<BITS>(szc[r][0], zi_const, zf_const, zp_kind, &sc[0], &zi[0], &cc[0]);
                        qk_unpack_szi<BITS>(szc[r][1], zi_const, zf_const, zp_kind, &sc[1], &zi[1], &cc[1]);
                        qk_int_offsets<BITS>(zi[0], off0);
                        qk_int_offsets<BITS>(zi[1], off1);
#endif
#pragma unroll
                        for (int tg = 0; tg < T; ++tg)
#pragma unroll
                            for (int i = 0; i < 4; ++i) d[tg][i] = 0.0f;
#pragma unroll
                        for (int m = 0; m < 4; ++m) {
                            qk_u32 a[4];
                            qk_weight_pairs<BITS>(wc[r][0], m, off0, &a[0], &a[2]);
                            qk_weight_pairs<BITS>(wc[r][1], m, off1, &a[1], &a[3]);
#pragma unroll
                            for (int tg = 0; tg < T; ++tg) qk_mma_16816(d[tg], a, bf[tg][m]);
                        }
#pragma unroll
                        for (int tg = 0; tg < T; ++tg)
#pragma unroll
                            for (int i = 0; i < 4; ++i) {
                                float& x = acc[(r * T + tg) * 4 + i];
                                x = fmaf(sc[i >> 1], d[tg][i], x);
                                if (frac) x = fmaf(cc[i >> 1], asum[tg][i & 1], x);
                            }
                    }
                }
            }
        }
    }

    if (wk_n > 1) {
        if (act_smem) __syncthreads(); /* every warp is done with the staged activations */
        float* red = qk_red + (qk_i64)wi * wk_n * NACC * 32;
#pragma unroll
        for (int i = 0; i < NACC; ++i) red[(wk * NACC + i) * 32 + lane] = acc[i];
        __syncthreads();
        if (wk != 0) return;
#pragma unroll
        for (int i = 0; i < NACC; ++i) {
            float v = red[i * 32 + lane];
            for (int k = 1; k < wk_n; ++k) v += red[(k * NACC + i) * 32 + lane];
            acc[i] = v;
        }
    }
    if (!live) return;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int tg = 0; tg < T; ++tg)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int n = row0 + 16 * r + 8 * (i >> 1) + g, tok = tok0 + 8 * tg + 2 * t + (i & 1);
                if (n >= N || tok >= M) continue;
                float v = acc[(r * T + tg) * 4 + i];
                if (has_bias) v += qk_fp16_to_float(bias[n]);
                Y[(qk_i64)tok * N + n] = __half_as_ushort(qk_half_rn(v));
            }
}

/* ------------------------------------ decode on the matrix units, 16-byte weight loads */
/* The same arithmetic as qk_nbits_mma (one group of 8 tokens), with the weights read 64 bytes
 * per row and quad: lane t loads bytes 16t..16t+15 of a row's 64-byte "superchunk" (4 chunks of
 * u2, 2 of u4) in one 16-byte asynchronous copy into the warp's ring, and reads back the quad's
 * 4 x 4 words transposed (after a warp barrier) so that each lane again holds, per chunk, the
 * words of its own K slots (shuffles did this before: 3-8% slower, docs/perf-notes.md). After the
 * transpose lane t holds word t of each lane's 16 bytes: u2, chunk c: k = 64c + 16t + 0..15 (as
 * qk_nbits_mma); u4, chunk c: k = 64c + 8t + 0..7 and 64c + 32 + 8t + 0..7 (so its activations
 * are read from those two places). Each lane loads one chunk's scale of the superchunk and the
 * quad shares them by shuffle. */

/* the 16-byte slot of a ring piece holding lane 4g + c's copy: XOR-swizzled so that the quad
 * transpose read straight from the ring (lane 4g + t reading word t of the slots of c = 0..3)
 * touches 32 different banks */
__device__ __forceinline__ int qk_ring_slot(int g, int c) { return 4 * g + (c ^ ((g >> 1) & 3)); }

/* Stage j of a warp's ring, per lane: R x 2 weight pieces of 16 bytes, then R x 2 scale words.
 * tr: the word of a piece lane 4 g + t reads for quad lane 0 (word t of slot qk_ring_slot(g, 0));
 * quad lane c's is tr ^ 4 c (the swizzle XORs bits 2-3 of the word index only), so the transposed
 * reads of a stage need no per-read address arithmetic. */
template <int R>
struct QkRing {
    qk_u32* base;
    int lane, tr;
    __device__ __forceinline__ QkRing(qk_u32* b, int l) : base(b), lane(l), tr(qk_ring_slot(l >> 2, 0) * 4 + (l & 3)) {}
    __device__ __forceinline__ uint4* piece(int j, int r, int h) const {
        return (uint4*)base + ((j * R + r) * 2 + h) * 32 + qk_ring_slot(lane >> 2, lane & 3);
    }
    /* word t of quad lane c's piece, for lane 4g + t: the quad transpose, read from shared memory */
    __device__ __forceinline__ qk_u32 transposed(const qk_u32* stage, int r, int h, int c) const {
        return stage[(r * 2 + h) * 128 + (tr ^ (4 * c))];
    }
    /* w[c] = transposed(stage, r, h, c), c = 0..3. CUDA sm_75+: one qk_ldmatrix_x4, matrix c's row g
     * being the slot of quad lane 4g + c's piece (the 8 rows of a matrix sit in 8 different 16-byte
     * bank groups: qk_ring_slot); 4 shared reads a superchunk, not 16 (session 34, H100: faster in 14
     * of 20 ring cells, up to 1.04x, within 0.5% in 4, 0.9% slower at most). Elsewhere (AMD, older
     * CUDA, and the portable control -DQK_MMA_EMULATE, which so runs AMD's read on NVIDIA), and in the
     * bench-only -DQK_NBITS_RING_LDS build, the four reads above. */
    __device__ __forceinline__ void transposed4(const qk_u32* stage, int r, int h, qk_u32 w[4]) const {
#if !defined(QK_NBITS_RING_LDS) && !defined(QK_MMA_EMULATE) && defined(QK_CUDA) && defined(__CUDA_ARCH__) && \
    __CUDA_ARCH__ >= 750
        qk_ldmatrix_x4(w, stage + (r * 2 + h) * 128 + 4 * qk_ring_slot(lane & 7, lane >> 3));
#else
#pragma unroll
        for (int c = 0; c < 4; ++c) w[c] = transposed(stage, r, h, c);
#endif
    }
    __device__ __forceinline__ const qk_u32* stage(int j) const { return base + j * R * 2 * 128; }
    __device__ __forceinline__ qk_u32* scale(int j, int r, int h, int stages) const {
        return base + stages * R * 2 * 32 * 4 + ((j * R + r) * 2 + h) * 32 + lane;
    }
};

/* copy superchunk s into stage j: each lane its 16 bytes of each row (zeros past the row) and
 * the 4-byte word holding the scale of chunk SC s + t % SC (zeros past the K chunks): two fp16
 * scales, or the fp32 scale itself (F32). Row 8 (2 r + h) of the lane's: its 16 bytes of
 * superchunk 0 at wbase + (2 r + h) wstep, its first scale at sbase + (2 r + h) sstep; send: the end
 * of the scales; tail: the low 32 bits of the address of the tensor's last scale word when that
 * word reaches past send (fp16 scales ending 2 bytes into it), else 1 (no 4-aligned word's). FULL
 * (s before the row's last superchunk): every piece inside its row and every chunk inside K, no
 * bounds checked but that word (by the low 32 bits of its address: the scales span < 4 GB); NO_TAIL
 * (tail 1: no scale word of the CTA's rows reaches past send), not that word either. */
template <int BITS, int R, int S, bool F32, bool FULL, bool NO_TAIL = false>
__device__ __forceinline__ void qk_issue_super(const QkRing<R>& ring, int j, const qk_u8* wbase, qk_i64 wstep,
                                               const qk_u8* sbase, qk_i64 sstep, const qk_u8* send, qk_u32 tail,
                                               int s, int t, qk_i64 row_bytes, int n_chunks, int cpb_shift) {
    constexpr int SC = 8 / BITS, E = F32 ? 4 : 2;
    const qk_i64 off = (qk_i64)s * 64;
    const int c = s * SC + t % SC;
    const bool in_k = FULL || c < n_chunks, in_row = FULL || off + 16 * t + 16 <= row_bytes;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const qk_u8* w = wbase + (2 * r + h) * wstep;
            qk_cp_async16(ring.piece(j, r, h), in_row ? w + off : w - 16 * t, in_row ? 16 : 0);
            const qk_u8* p = sbase + (2 * r + h) * sstep + (in_k ? (c >> cpb_shift) * E : 0);
            if (!F32) p = (const qk_u8*)((size_t)p & ~(size_t)3);
            const int bytes = FULL ? (F32 || NO_TAIL || (qk_u32)(size_t)p != tail ? 4 : 2)
                                   : (!in_k ? 0 : (F32 || p + 4 <= send ? 4 : 2));
            qk_cp_async4(ring.scale(j, r, h, S), p, bytes);
        }
}

/* superchunk s into stage j, unchecked before the row's last superchunk (s < s_full), checked up to
 * s_hi, nothing from there. Bench-only -DQK_NBITS_RING_TAIL_SPLIT: the unchecked copies without the
 * scale word's tail test where tail is 1 (under the option, every CTA but the one holding row N - 1:
 * only that row's last scale word can reach past send), one uniform branch a superchunk instead of
 * ~6 instructions a row's scale copy. */
template <int BITS, int R, int S, bool F32>
__device__ __forceinline__ void qk_issue_next(const QkRing<R>& ring, int j, const qk_u8* wbase, qk_i64 wstep,
                                              const qk_u8* sbase, qk_i64 sstep, const qk_u8* send, qk_u32 tail,
                                              int s, int s_full, int s_hi, int t, qk_i64 row_bytes, int n_chunks,
                                              int cpb_shift) {
#if defined(QK_NBITS_RING_TAIL_SPLIT)
    if (!F32 && s < s_full && tail == 1u)
        qk_issue_super<BITS, R, S, F32, true, true>(ring, j, wbase, wstep, sbase, sstep, send, tail, s, t, row_bytes,
                                                    n_chunks, cpb_shift);
    else
#endif
    if (s < s_full)
        qk_issue_super<BITS, R, S, F32, true>(ring, j, wbase, wstep, sbase, sstep, send, tail, s, t, row_bytes,
                                              n_chunks, cpb_shift);
    else if (s < s_hi)
        qk_issue_super<BITS, R, S, F32, false>(ring, j, wbase, wstep, sbase, sstep, send, tail, s, t, row_bytes,
                                               n_chunks, cpb_shift);
}

/* the ring kernel's unchecked chunk paths (qk_ring_chunks<FULL>) on NVIDIA; AMD's compiler spends
 * minutes on their instantiations of the shuffle-emulated mma (hipcc 5.2, gfx90a: 327 s for this
 * file with them, 66 s without), so there every superchunk takes the checked path (the same sums) */
#if defined(QK_CUDA)
#define QK_RING_UNCHECKED 1
#else
#define QK_RING_UNCHECKED 0
#endif

/* qk_nbits_mmaa's chunks of superchunk s: each chunk's 4 mma per 16-row tile (weights ws, the
 * transposed words; scales sc16, the quad's words of the superchunk's chunks), scaled into acc.
 * FULL (s before the row's last superchunk, the activations staged or 16-byte aligned): every
 * chunk inside K, the activations read without bounds from row tok_row = min(g, n_tok - 1) of the
 * staged rows (SMEM) or of A (token columns >= M are never stored, and an mma's output column
 * depends on its own B column alone); else each chunk checked against K and each token against
 * n_tok. */
template <int BITS, int R, bool F32, bool FULL, bool SMEM>
__device__ __forceinline__ void qk_ring_chunks(float acc[R * 4], const qk_u32 ws[R][2][4], const qk_u32 sc16[R][2],
                                               const qk_u32 zoff[4], const qk_u16* sA, const qk_u16* A, int s,
                                               int n_chunks, int g, int tok_row, int n_tok, int Kp, int a_len,
                                               int ka, int kb, int act_bytes, int a_vec) {
    constexpr int WPR = BITS / 2, SC = 8 / BITS;
    const int kq = BITS == 2 ? ka : 2 * ka; /* 16 t: the lane's paired activations in a staged chunk */
#pragma unroll
    for (int cc = 0; cc < SC; ++cc) {
        const int c = s * SC + cc;
        if (!FULL && c >= n_chunks) continue; /* (not break: AMD clang then unrolls the loop) */
        qk_u32 act[8], bf[4][2];
        /* staged: paired by qk_stage_act_paired; from A: paired here */
        const bool paired = FULL ? SMEM : act_bytes != 0;
        if (FULL && SMEM) qk_act16(act, sA + tok_row * Kp, c * 64 + kq, c * 64 + kq + 8);
        else if (FULL) qk_act16(act, A + (qk_i64)tok_row * a_len, c * 64 + ka, c * 64 + kb);
        else if (act_bytes) qk_load_act_smem(act, sA, g, n_tok, Kp, c * 64 + kq, c * 64 + kq + 8);
        else qk_load_act(act, A, g, n_tok, a_len, c * 64 + ka, c * 64 + kb, a_vec);
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            int pp[2], qq[2];
            qk_slot_pairs<BITS>(m, pp, qq);
            bf[m][0] = paired ? act[2 * m] : qk_act_pair(act, pp[0], pp[1]);
            bf[m][1] = paired ? act[2 * m + 1] : qk_act_pair(act, qq[0], qq[1]);
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            /* one chain of the 4 products (two chains of two, added after, were 2-3% slower:
             * docs/perf-notes.md) */
            float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int m = 0; m < 4; ++m) {
                qk_u32 a[4];
                qk_weight_pairs<BITS>(ws[r][0] + cc * WPR, m, zoff, &a[0], &a[2]);
                qk_weight_pairs<BITS>(ws[r][1] + cc * WPR, m, zoff, &a[1], &a[3]);
                qk_mma_16816(d, a, bf[m]);
            }
            const qk_u32 w0 = QK_SHFL(sc16[r][0], cc, 4), w1 = QK_SHFL(sc16[r][1], cc, 4);
            const float s0 = F32 ? qk_float(w0) : qk_fp16_to_float((qk_u16)w0);
            const float s1 = F32 ? qk_float(w1) : qk_fp16_to_float((qk_u16)w1);
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[r * 4 + i] = fmaf(i < 2 ? s0 : s1, d[i], acc[r * 4 + i]);
        }
    }
}

/* M <= 8 (one group of 8 tokens), default zero point (2^(BITS-1), folded into the weights), fp16
 * A / scales / Y: the weights and scales stream through a per-warp ring of S stages in shared
 * memory (asynchronous copies, S - 1 superchunks in flight per warp), each lane reading back
 * only what it copied. A CTA owns 16 R rows, its wk_n warps split the superchunks. Shared memory:
 * the staged activations (act_bytes, 16-byte aligned; 0 when read from global memory), then the
 * warps' rings, reused for the partial sums.
 *
 * F32: fp32 activations / scales / bias / Y, the activations split by qk_nbits_split_a into fp16
 * rows of a token group (token 4 blockIdx.y + j's hi in row 2j, its lo in row 2j + 1; rows of Kp
 * halves, K rounded up to whole superchunks, zeros past K; 2 rows a token of the group below M
 * read): the mma's token columns 2j and 2j + 1 take the two parts, so one mma does both and lane t
 * of a quad holds the hi and lo sums of token t. The epilogue adds them, each part times its exact
 * power of two (inv: 2^-e, 2^-(e + 12) per token). F32 is launched as a programmatic dependent of the
 * split (qconform.device.pdl), started as the split's CTAs exit: its first S - 1 superchunks are
 * issued before QK_WAIT_PRIOR_GRID() (the split's writes flushed),
 * after which it reads the split's rows and flags; for a group the split flagged it returns false
 * (no barrier passed, its copies drained) and the wrapper computes the CTA's outputs with
 * qk_nbits_f32_tile; true otherwise.
 *
 * The order of the superchunks: u2, each warp one contiguous range of n_super / wk_n superchunks (its
 * own part of the row); u4, strided: warp wk takes superchunks wk, wk + wk_n, ... (the CTA's warps read
 * adjacent pieces of each row at about the same time; for u4 measured faster in 7 of 10 cells and
 * level in 2, the lm_head 1.11x; mixed for u2: docs/perf-notes.md, sessions 32 and 33). Either order
 * is a fixed partition of the superchunks over the warps and a fixed sum of the warps' parts, so
 * repeat calls are bit-identical. Bench-only build options (qconform.bench.nbits --variants ring):
 * -DQK_NBITS_RING_CONTIGUOUS, the contiguous order for u4 too (the build before session 33);
 * -DQK_NBITS_RING_STRIDED, the strided order for u2 too; -DQK_NBITS_RING_LDS, the transposed words
 * by four shared reads, not ldmatrix (QkRing::transposed4; the build before session 34);
 * -DQK_NBITS_RING_TAIL_SPLIT, the unchecked scale copies without the tensor-end test (qk_issue_next);
 * -DQK_NBITS_RING_LOADS_ONLY, the copies and waits without the
 * chunks' arithmetic (a diagnostic: its outputs are zeros). */
/* a token group with an activation the split does not carry (qk_nbits_split_a's flags) */
__device__ __forceinline__ bool qk_group_flagged(const int* flags, int grp) {
    const int4 f = *(const int4*)(flags + 4 * grp);
    return (f.x | f.y | f.z | f.w) != 0;
}

template <int BITS, int R, int S, bool F32>
__device__ __forceinline__ bool qk_nbits_mmaa(const qk_u16* A, const qk_u8* B, const void* scales, const void* bias,
                                              void* Y, const float* inv, const int* flags, int M, int K, int N,
                                              int cpb_shift, int k_blocks, int has_bias, int a_vec, int act_bytes,
                                              int wk_n) {
    extern __shared__ float qk_red[];
    constexpr int NACC = R * 4, SC = 8 / BITS;
    constexpr int RING_WORDS = S * R * 2 * 32 * 5;
    const int lane = (int)(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
    const int wk = (int)(threadIdx.x >> 5);
    const int row0 = (int)blockIdx.x * 16 * R;
    const int n_chunks = (K + 63) / 64, n_super = (n_chunks + SC - 1) / SC;
#if defined(QK_NBITS_RING_STRIDED)
    constexpr bool strided = true;
#elif defined(QK_NBITS_RING_CONTIGUOUS)
    constexpr bool strided = false;
#else
    constexpr bool strided = BITS == 4;
#endif
    const int s_lo = strided ? wk : wk * n_super / wk_n, s_hi = strided ? n_super : (wk + 1) * n_super / wk_n;
    const int s_step = strided ? wk_n : 1;
    const qk_i64 row_bytes = (qk_i64)k_blocks * ((64 << cpb_shift) * BITS / 8);
    const qk_i64 n_scales = (qk_i64)N * k_blocks;
    const int grp = F32 ? (int)blockIdx.y : 0; /* F32: the token group (4 tokens) of this CTA */
    const int Kp = n_super * SC * 64, n_tok = F32 ? 2 * min(4, M - 4 * grp) : min(8, M); /* F32: hi, lo rows */
    if (F32) A += (qk_i64)grp * 8 * Kp;
    const int a_len = F32 ? Kp : K; /* the activation rows' length */
    qk_u16* sA = (qk_u16*)qk_red;
    const QkRing<R> ring((qk_u32*)((char*)qk_red + act_bytes) + wk * RING_WORDS, lane);
    const int ka = qk_ring_ka<BITS>(t), kb = qk_ring_kb<BITS>(t);
    const int tok_row = min(g, n_tok - 1);
    qk_u32 zoff[4]; /* q - z, the default zero point folded in */
    qk_fold_offsets<BITS>(1 << (BITS - 1), zoff);

    /* the CTA's rows: 16 R from row0, shifted down to end at N in the last CTA (N >= 16 R: the
     * launcher's rule), so that every row read is a row of B (the rows below row0 are stored by
     * the CTA before); lane 4 g + t's rows are rbase + g + 8 (2 r + h) */
    const int rbase = min(row0, N - 16 * R);
    constexpr int E = F32 ? 4 : 2;
    const qk_u8* wbase = B + (rbase + g) * row_bytes + 16 * t;
    const qk_u8* sbase = (const qk_u8*)scales + (qk_i64)(rbase + g) * k_blocks * E;
    const qk_i64 wstep = 8 * row_bytes, sstep = (qk_i64)8 * k_blocks * E;
    const qk_u8* send = (const qk_u8*)scales + n_scales * E;
#if defined(QK_NBITS_RING_TAIL_SPLIT) /* only the CTA ending at row N - 1 holds the tensor's last scale */
    const qk_u32 tail = (size_t)send & 3 && rbase + 16 * R == N ? (qk_u32)(size_t)(send - 2) : 1u;
#else
    const qk_u32 tail = (size_t)send & 3 ? (qk_u32)(size_t)(send - 2) : 1u;
#endif
    const int n_full = n_super - 1; /* superchunks before the last: no bounds to check */
    const int s_full = min(s_hi, n_full);
    /* the first S - 1 superchunks start before the activations are staged */
#pragma unroll
    for (int j = 0; j < S - 1; ++j) {
        qk_issue_next<BITS, R, S, F32>(ring, j, wbase, wstep, sbase, sstep, send, tail, s_lo + j * s_step, s_full,
                                       s_hi, t, row_bytes, n_chunks, cpb_shift);
        qk_cp_async_commit();
    }
    if (F32) { /* launched as a dependent of qk_nbits_split_a: the weights above need nothing of it */
        QK_WAIT_PRIOR_GRID();
        if (qk_group_flagged(flags, grp)) { /* uniform: the whole CTA, before any barrier */
            qk_cp_async_wait<0>();
            return false;
        }
    }
    if (act_bytes) {
        qk_stage_act_paired<BITS>(sA, A, n_tok, a_len, Kp, a_vec);
        __syncthreads();
    }

    float acc[NACC];
#pragma unroll
    for (int i = 0; i < NACC; ++i) acc[i] = 0.0f;

    for (int s = s_lo, j = 0; s < s_hi; s += s_step, j = j + 1 == S ? 0 : j + 1) {
        const int jn = j == 0 ? S - 1 : j - 1; /* the stage read last iteration: refilled S - 1 ahead */
        qk_syncwarp(); /* the quad read each other's copies of stage jn: all done before it is refilled */
        qk_issue_next<BITS, R, S, F32>(ring, jn, wbase, wstep, sbase, sstep, send, tail, s + (S - 1) * s_step, s_full,
                                       s_hi, t, row_bytes, n_chunks, cpb_shift);
        qk_cp_async_commit();
        qk_cp_async_wait<S - 1>();
        qk_syncwarp(); /* stage j: every lane's copies landed, visible to the quad */
        qk_u32 ws[R][2][4], sc16[R][2];
        const qk_u32* stage = ring.stage(j);
        /* the fp16 scale's half of its word: the same for every row (sstep is a multiple of 16) */
        const bool upper = (size_t)(sbase + ((s * SC + t % SC) >> cpb_shift) * 2) & 2;
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                ring.transposed4(stage, r, h, ws[r][h]);
                const qk_u32 word = *ring.scale(j, r, h, S);
                sc16[r][h] = F32 ? word : (upper ? word >> 16 : word & 0xFFFFu);
            }
#if defined(QK_NBITS_RING_LOADS_ONLY)
        if (false)
#elif QK_RING_UNCHECKED
        if (s < n_full && act_bytes)
            qk_ring_chunks<BITS, R, F32, true, true>(acc, ws, sc16, zoff, sA, A, s, n_chunks, g, tok_row, n_tok, Kp,
                                                     a_len, ka, kb, act_bytes, a_vec);
        else if (s < n_full && a_vec)
            qk_ring_chunks<BITS, R, F32, true, false>(acc, ws, sc16, zoff, sA, A, s, n_chunks, g, tok_row, n_tok, Kp,
                                                      a_len, ka, kb, act_bytes, a_vec);
        else
#endif
            qk_ring_chunks<BITS, R, F32, false, false>(acc, ws, sc16, zoff, sA, A, s, n_chunks, g, tok_row, n_tok, Kp,
                                                       a_len, ka, kb, act_bytes, a_vec);
    }

    if (wk_n > 1) {
        qk_cp_async_wait<0>();
        __syncthreads(); /* every warp is done with its ring and the staged activations */
#pragma unroll
        for (int i = 0; i < NACC; ++i) qk_red[(wk * NACC + i) * 32 + lane] = acc[i];
        __syncthreads();
        if (wk != 0) return true;
#pragma unroll
        for (int i = 0; i < NACC; ++i) {
            float v = qk_red[i * 32 + lane];
            for (int k = 1; k < wk_n; ++k) v += qk_red[(k * NACC + i) * 32 + lane];
            acc[i] = v;
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int n = rbase + 16 * r + 8 * (i >> 1) + g;
            float v = acc[r * 4 + i];
            if (F32) {
                /* lane t holds token 4 grp + t's hi sums (even i) and lo sums (odd i) of the same
                 * row, each part times its power of two: y = fma(lo, 2^-(e + 12), hi 2^-e) */
                const int tok = 4 * grp + t;
                if ((i & 1) || n < row0 || tok >= M) continue;
                v = fmaf(acc[r * 4 + i + 1], inv[2 * tok + 1], QK_FMUL(v, inv[2 * tok]));
                if (has_bias) v = QK_FADD(v, ((const float*)bias)[n]);
                ((float*)Y)[(qk_i64)tok * N + n] = v;
            } else {
                const int tok = 2 * t + (i & 1);
                if (n < row0 || tok >= M) continue;
                if (has_bias) v += qk_fp16_to_float(((const qk_u16*)bias)[n]);
                ((qk_u16*)Y)[(qk_i64)tok * N + n] = __half_as_ushort(qk_half_rn(v));
            }
        }
    return true;
}

/* The fp32 activations of the F32 ring kernel as fp16 pairs: per token m (blockIdx.y), e with
 * max|a| 2^e in [2^14, 2^15) (clamped to [-113, 114]: 2^-e and 2^-(e + 12) normal), x = a 2^e (exact
 * but for flushed subnormals), hi = fp16(x), lo = fp16((x - hi) 2^12) (x - hi exact: |lo| <= 2^15; 0
 * where hi is not finite). S: groups of 8 rows of Kp halves, token 4q + j's hi in row 2j of group q
 * and its lo in row 2j + 1 (the mma's token columns: lane t of a quad then holds both parts of one
 * token), zeros past K; rows of tokens >= M are not written (the ring kernel reads 2 rows a token).
 * inv[2m], inv[2m + 1] = 2^-e, 2^-(e + 12). flags[m] = 1 when a finite nonzero activation of token
 * m (after flush-to-zero) has |x| < QK_SPLIT_FLOOR = 2^-14 (x flushed included): from 2^-14 up hi +
 * lo carry x to 2^-23 of itself, below they may not (fp16's range); 0 otherwise and for M <= m <
 * 4 ceil(M / 4). x is nondecreasing in |a|, so that is the row's smallest such |a| scaled the same
 * way. The ring kernel computes a flagged token's group of 4 with qk_nbits_f32_tile instead.
 * The error model: tests/nbits_f32_model.py.
 * Each CTA reads its token's whole row for the two statistics (max and min are exact in any order:
 * every CTA of a token finds the same e) and converts K slice blockIdx.x of gridDim.x, 4 consecutive
 * K a thread (16-byte loads when a_vec). */
#define QK_SPLIT_FLOOR 6.103515625e-05f
__device__ __forceinline__ void qk_split_load4(float v[4], const float* a, int k, int K, int a_vec) {
    if (a_vec && k + 4 <= K) {
        const float4 x = *(const float4*)(a + k);
        v[0] = x.x; v[1] = x.y; v[2] = x.z; v[3] = x.w;
        return;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = k + i < K ? a[k + i] : 0.0f;
}

extern "C" __global__ void __launch_bounds__(512) qk_nbits_split_a(const float* A, qk_u16* S, float* inv, int* flags,
                                                                   int M, int K, int Kp, int a_vec) {
    __shared__ float red[2][16]; /* per 32-lane group: max |a|, min nonzero |a| */
    /* no QK_LAUNCH_DEPENDENTS(): the ring kernel (its dependent) starts as these CTAs exit; started
     * at their start, its weight copies slowed this kernel, which every output waits for (measured,
     * docs/perf-notes.md session 29) */
    const int m = (int)blockIdx.y, tid = (int)threadIdx.x, nt = (int)blockDim.x;
    const float* a = A + (qk_i64)m * K;
    float amax = 0.0f, amin = qk_float(0x7f800000u);
#pragma unroll 4
    for (int k = 4 * tid; k < K; k += 4 * nt) {
        float v[4];
        qk_split_load4(v, a, k, K, a_vec);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float x = fabsf(qk_ftz(v[i]));
            if (x <= 3.4028234663852886e38f) { /* finite values only */
                amax = fmaxf(amax, x);
                if (x != 0.0f) amin = fminf(amin, x);
            }
        }
    }
    for (int off = 16; off > 0; off >>= 1) {
        amax = fmaxf(amax, QK_SHFL_XOR(amax, off, 32));
        amin = fminf(amin, QK_SHFL_XOR(amin, off, 32));
    }
    if ((tid & 31) == 0) {
        red[0][tid >> 5] = amax;
        red[1][tid >> 5] = amin;
    }
    __syncthreads();
    amax = red[0][0];
    amin = red[1][0];
    for (int i = 1; i < nt >> 5; ++i) {
        amax = fmaxf(amax, red[0][i]);
        amin = fminf(amin, red[1][i]);
    }
    const int ex = (int)((qk_bits(amax) >> 23) & 0xFFu) - 127; /* floor(log2 amax), amax normal */
    const int e = amax > 0.0f ? min(max(14 - ex, -113), 114) : 0;
    const float scale = qk_float((qk_u32)(127 + e) << 23);
    if (blockIdx.x == 0 && tid == 0) {
        inv[2 * m] = qk_float((qk_u32)(127 - e) << 23);
        inv[2 * m + 1] = qk_float((qk_u32)(127 - e - 12) << 23);
        flags[m] = fabsf(qk_ftz(QK_FMUL(amin, scale))) < QK_SPLIT_FLOOR; /* amin infinite: no such activation */
    }
    if (blockIdx.x == 0 && m == M - 1)
        for (int j = M + tid; j < ((M + 3) & ~3); j += nt) flags[j] = 0;
    qk_u16* hi = S + ((qk_i64)(m >> 2) * 8 + 2 * (m & 3)) * Kp;
    qk_u16* lo = hi + Kp;
    const int slice = 4 * ((Kp / 4 + (int)gridDim.x - 1) / (int)gridDim.x); /* Kp: a multiple of 64 */
    const int k_end = min(Kp, ((int)blockIdx.x + 1) * slice);
    for (int k = (int)blockIdx.x * slice + 4 * tid; k < k_end; k += 4 * nt) {
        float v[4];
        qk_u32 h[4], l[4];
        qk_split_load4(v, a, k, K, a_vec);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float x = qk_ftz(QK_FMUL(qk_ftz(v[i]), scale));
            h[i] = qk_fp16_bits(x);
            const float hf = qk_fp16_to_float((qk_u16)h[i]);
            l[i] = fabsf(hf) <= 65504.0f ? qk_fp16_bits(qk_ftz(QK_FMUL(qk_ftz(QK_FADD(x, -hf)), 4096.0f))) : 0u;
        }
        *(uint2*)(hi + k) = make_uint2(h[0] | h[1] << 16, h[2] | h[3] << 16);
        *(uint2*)(lo + k) = make_uint2(l[0] | l[1] << 16, l[2] | l[3] << 16);
    }
}

/* The outputs of a flagged token group's tile (qk_nbits_split_a's flags: the ring kernel's CTA
 * computes them so instead): rows row0 .. row0 + rows - 1 of tokens 4 grp + 0..3 below M, in fp32
 * as the per-output kernel's element path. The CTA's 32-lane groups take the outputs in turn;
 * lane l sums fmaf(a[k], w[k]) over k = l (mod 32), w = fp32((q - z) s) the dequantized weight
 * (as qk_nbits_dequant), then a width-32 butterfly; + bias. Default zero point, fp32 A / scales /
 * bias / Y; no barrier (a group leaves on its own). Out of line: the ring's registers stay its own. */
__device__ __noinline__ void qk_nbits_f32_tile(const float* A, const qk_u8* B, const float* scales, const float* bias,
                                               float* Y, int M, int K, int N, int row0, int rows, int grp, int bits,
                                               int bs, int k_blocks, int has_bias) {
    const int lane = (int)(threadIdx.x & 31), blob = bs * bits / 8;
    for (int i = (int)(threadIdx.x >> 5); i < 4 * rows; i += (int)(blockDim.x >> 5)) { /* per 32-lane group */
        const int m = 4 * grp + i / rows, n = row0 + i % rows;
        if (m >= M || n >= N) continue;
        const qk_u8* row = B + (qk_i64)n * k_blocks * blob;
        const float* a = A + (qk_i64)m * K;
        float acc = 0.0f;
        for (int k = lane; k < K; k += 32) {
            const int kb = k / bs;
            const qk_block_q b = qk_block(scales, B, 0.0f, n, kb, k_blocks, bits, 0, ZP_DEFAULT, 0, 0);
            acc = fmaf(a[k], qk_weight(b, qk_field(row + (qk_i64)kb * blob, bits, k - kb * bs)), acc);
        }
        for (int off = 16; off > 0; off >>= 1) acc += QK_SHFL_XOR(acc, off, 32);
        if (lane == 0) Y[(qk_i64)m * N + n] = has_bias ? QK_FADD(acc, bias[n]) : acc;
    }
}

/* qk_nbits_mmaa_u{bits}_r{R}_s{S}: M <= 8, default zero point, 16 R rows per CTA, wk_n warps; and its
 * fp32 twin qk_nbits_mmaf_u{bits}_r{R}_s{S} (split activations, a token group of 4 per blockIdx.y).
 * QK_NBITS_MMAA: registers as the compiler chooses; QK_NBITS_MMAA_O (symbols ending _o{O}): for O
 * CTAs of 256 threads an SM (registers capped at 65536 / (256 O); a minimum of 1 is not the
 * compiler's choice: it took 165 registers). The launcher picks (docs/perf-notes.md, session 14). */
#define QK_NBITS_MMAA_DEF(BITS, R, S, BOUNDS, SUFFIX)                                                                  \
    extern "C" __global__ void BOUNDS qk_nbits_mmaa_u##BITS##_r##R##_s##S##SUFFIX(                                     \
        const qk_u16* A, const qk_u8* B, const qk_u16* scales, const qk_u16* bias, qk_u16* Y, int M, int K, int N,     \
        int cpb_shift, int k_blocks, int has_bias, int a_vec, int act_bytes, int wk_n) {                               \
        qk_nbits_mmaa<BITS, R, S, false>(A, B, scales, bias, Y, nullptr, nullptr, M, K, N, cpb_shift, k_blocks,        \
                                         has_bias, a_vec, act_bytes, wk_n);                                            \
    }                                                                                                                  \
    extern "C" __global__ void BOUNDS qk_nbits_mmaf_u##BITS##_r##R##_s##S##SUFFIX(                                     \
        const qk_u16* A, const qk_u8* B, const float* scales, const float* bias, float* Y, const float* inv,           \
        const int* flags, const float* A32, int M, int K, int N, int cpb_shift, int k_blocks, int has_bias, int a_vec, \
        int act_bytes, int wk_n) {                                                                                     \
        if (!qk_nbits_mmaa<BITS, R, S, true>(A, B, scales, bias, Y, inv, flags, M, K, N, cpb_shift, k_blocks,          \
                                             has_bias, a_vec, act_bytes, wk_n)) /* a flagged group */                  \
            qk_nbits_f32_tile(A32, B, scales, bias, Y, M, K, N, (int)blockIdx.x * 16 * R, 16 * R, (int)blockIdx.y,     \
                              BITS, 64 << cpb_shift, k_blocks, has_bias);                                              \
    }
#define QK_NBITS_MMAA(BITS, R, S) QK_NBITS_MMAA_DEF(BITS, R, S, __launch_bounds__(256), )
#if defined(QK_CUDA)
#define QK_NBITS_MMAA_O(BITS, R, S, O) QK_NBITS_MMAA_DEF(BITS, R, S, __launch_bounds__(256, O), _o##O)
#else /* AMD: the same symbols, the compiler's registers */
#define QK_NBITS_MMAA_O(BITS, R, S, O) QK_NBITS_MMAA_DEF(BITS, R, S, __launch_bounds__(256), _o##O)
#endif

/* the instantiations the launcher picks from: qk_nbits_mma_u{bits}_r{R}_t{T}_p{P}_o{O}, at least O
 * CTAs of 256 threads per SM (registers capped at 65536 / (256 O)) */
#define QK_NBITS_MMA(BITS, R, T, P, O)                                                                                 \
    extern "C" __global__ void __launch_bounds__(256, O) qk_nbits_mma_u##BITS##_r##R##_t##T##_p##P##_o##O(             \
        const qk_u16* A, const qk_u8* B, const qk_u16* scales, const void* zp, float zps, const qk_u16* bias,          \
        qk_u16* Y, int M, int K, int N, int cpb_shift, int k_blocks, int zp_bytes, int zp_kind, int has_bias,          \
        int a_vec, int act_smem, int wk_n, int wi_n) {                                                                 \
        qk_nbits_mma<BITS, R, T, P>(A, B, scales, zp, zps, bias, Y, M, K, N, cpb_shift, k_blocks, zp_bytes, zp_kind,   \
                                    has_bias, a_vec, act_smem, wk_n, wi_n);                                            \
    }
/* the shapes in MMA_SHAPES (qconform.device.registry), then the bench's other decode candidates
 * (left out with -DQK_MMA_DEFAULT_ONLY: the mutant and emulation builds compile faster) */
#ifdef QK_MMA_DEFAULT_ONLY
#define QK_NBITS_MMA_CANDIDATES(BITS)
#else
#define QK_NBITS_MMA_CANDIDATES(BITS)                                                                                  \
    QK_NBITS_MMAA(BITS, 2, 4)                                                                                          \
    QK_NBITS_MMAA(BITS, 1, 4)                                                                                          \
    QK_NBITS_MMAA(BITS, 2, 2)                                                                                          \
    QK_NBITS_MMAA(BITS, 1, 6)                                                                                          \
    QK_NBITS_MMAA(BITS, 4, 2)                                                                                          \
    QK_NBITS_MMA(BITS, 2, 1, 2, 3)                                                                                     \
    QK_NBITS_MMA(BITS, 2, 1, 4, 2)                                                                                     \
    QK_NBITS_MMA(BITS, 4, 1, 2, 2)                                                                                     \
    QK_NBITS_MMA(BITS, 1, 1, 4, 4)
#endif
#define QK_NBITS_MMA_BITS(BITS)                                                                                        \
    QK_NBITS_MMAA_O(BITS, 2, 3, 2)                                                                                     \
    QK_NBITS_MMAA(BITS, 2, 3)                                                                                          \
    QK_NBITS_MMAA_O(BITS, 1, 4, 3)                                                                                     \
    QK_NBITS_MMA(BITS, 2, 1, 2, 1)                                                                                     \
    QK_NBITS_MMA(BITS, 2, 4, 2, 1)                                                                                     \
    QK_NBITS_MMA_CANDIDATES(BITS)
QK_NBITS_MMA_BITS(2)
QK_NBITS_MMA_BITS(4)

/* ------------------------------------------------ prefill: a tiled GEMM on the matrix units */
/* qk_nbits_gemm_u{BITS}_r{R}_n{WN}_m{WM}_s{S}[_z]: any M (the launcher's: M >= 16), the default zero
 * point (or packed ones: ZP, symbols ending _z), K % 8 == 0, 16-byte aligned A and B, 4-byte aligned
 * scales and zero points. A CTA owns 16 R WN weight rows x 32 WM tokens; each of its WN x WM warps
 * owns 16 R rows x 32 tokens (R tiles of 16 rows, T = 4 groups of 8 tokens). Per 64-wide K chunk c
 * the CTA copies, S - 1 chunks ahead, into stage c % S of a shared-memory ring (cp.async): its rows'
 * 8 BITS weight bytes of the chunk, the 4-byte word holding each row's scale (the half-word is
 * picked when read; 2 bytes copied for the tensor's last scale), ZP: the 4-byte word holding each
 * row's packed zero point (its field picked when read), and its tokens' 64 activations (zeros past
 * M and K; rows padded by 16 bytes, so that a warp's 16-byte reads of 8 tokens x 4 lanes touch every
 * bank once). The arithmetic per chunk and row is qk_nbits_mma's (the same K slots, qk_slot_pairs;
 * q - zi folded into the weights; d from 0 over the chunk's 4 mma in slot order; acc = fma(s, d,
 * acc) in chunk order; bias added in fp32, one rounding to fp16), so Y is bit-identical to the
 * prefill shape's qk_nbits_mma on the same device. The outputs go through shared memory and are
 * stored 16 bytes at a time where N % 8 == 0 and Y is 16-byte aligned (y_vec). */
/* One stage of the ring, in bytes from its start: BN rows x WB weight bytes, BN scale words, ZP: BN
 * zero-point words, BM token rows x AROW halves (registry.GemmShape.smem says the same) */
template <int BITS, int BN, int BM, bool ZP>
struct QkGemmStage {
    static constexpr int WB = 8 * BITS; /* weight bytes of a row per chunk */
    static constexpr int AROW = 72;     /* halves per staged token row: 64 + 8 of padding */
    static constexpr int SCALES = BN * WB, ZPS = SCALES + BN * 4, ACT = ZPS + (ZP ? BN * 4 : 0);
    static constexpr int BYTES = ACT + BM * AROW * 2;
};

/* A thread's share of a chunk's copies into a stage (weights, scale words, activations of a CTA of
 * THREADS threads, BN rows and BM tokens): its sources, destinations and bounds computed once, so a
 * chunk's copies are its pointers plus the chunk's offset. Piece i of a kind is thread i % THREADS's. */
template <int BITS, int BN, int BM, int THREADS, bool ZP>
struct QkGemmCopies {
    typedef QkGemmStage<BITS, BN, BM, ZP> Stage;
    static constexpr int WB = Stage::WB, AROW = Stage::AROW;
    static constexpr int NW = (BN * WB / 16 + THREADS - 1) / THREADS, NA = BM * 8 / THREADS;
    static_assert(BN <= THREADS && (BM * 8) % THREADS == 0, "one scale word a thread at most; whole activation rounds");
    const qk_u8* w[NW];  /* weight piece j of chunk 0, or nullptr past the CTA's pieces */
    const qk_u8* z;      /* its row's packed zero points, or nullptr (none, or past the CTA's rows) */
    const qk_u8* z_end;
    const qk_u16* a;     /* activation piece 0 of chunk 0 (row tok0 + tid / 8, k 8 (tid % 8)) */
    qk_i64 a_step;       /* halves between its activation pieces (THREADS / 8 rows) */
    qk_i64 s_idx;        /* its scale row's first index (row * k_blocks), -1 past the CTA's rows */
    qk_i64 n_scales;
    const qk_u16* scales;
    const qk_u16* A;
    int a_rows;          /* its activation pieces inside M: j < a_rows */
    int ak, K, cpb_shift;

    __device__ __forceinline__ QkGemmCopies(const qk_u16* A_, const qk_u8* B, const qk_u16* scales_, const qk_u8* zp,
                                            int zp_bytes, int row0, int tok0, int M, int K_, int N, qk_i64 row_bytes,
                                            int cpb_shift_, int k_blocks) {
        const int tid = (int)threadIdx.x;
#pragma unroll
        for (int j = 0; j < NW; ++j) {
            const int i = tid + j * THREADS, r = i / (WB / 16), p = i % (WB / 16);
            w[j] = i < BN * WB / 16 ? B + (qk_i64)min(row0 + r, N - 1) * row_bytes + 16 * p : nullptr;
        }
        s_idx = tid < BN ? (qk_i64)min(row0 + tid, N - 1) * k_blocks : -1;
        z = ZP && tid < BN ? zp + (qk_i64)min(row0 + tid, N - 1) * zp_bytes : nullptr;
        z_end = ZP ? zp + (qk_i64)N * zp_bytes : nullptr;
        n_scales = (qk_i64)N * k_blocks;
        scales = scales_;
        A = A_;
        ak = 8 * (tid & 7);
        const int r0 = tok0 + (tid >> 3);
        a = A_ + (qk_i64)min(r0, M - 1) * K_ + ak;
        a_step = (qk_i64)(THREADS / 8) * K_;
        a_rows = r0 < M ? (M - 1 - r0) / (THREADS / 8) + 1 : 0;
        K = K_;
        cpb_shift = cpb_shift_;
    }

    /* chunk c into stage (weights: BN rows x WB bytes; scale words: BN x 4 bytes; ZP: the 4-byte
     * words holding the rows' packed zero points, 4-aligned from the tensor's start, zeros past its
     * end: BN x 4 bytes; activations: BM rows of AROW halves, zeros past M and K) */
    __device__ __forceinline__ void issue(qk_u8* stage, int c) const {
        const int tid = (int)threadIdx.x;
#pragma unroll
        for (int j = 0; j < NW; ++j)
            if (w[j] != nullptr) qk_cp_async16(stage + 16 * (tid + j * THREADS), w[j] + (qk_i64)c * WB, 16);
        if (s_idx >= 0) {
            const qk_i64 idx = s_idx + (c >> cpb_shift);
            qk_cp_async4(stage + Stage::SCALES + 4 * tid, scales + (idx & ~(qk_i64)1), (idx | 1) < n_scales ? 4 : 2);
        }
        if (ZP && z != nullptr) {
            const qk_u8* word = (const qk_u8*)((size_t)(z + (((c >> cpb_shift) * BITS) >> 3)) & ~(size_t)3);
            qk_cp_async4(stage + Stage::ZPS + 4 * tid, word, (int)min((qk_i64)4, (qk_i64)(z_end - word)));
        }
        qk_u16* sA = (qk_u16*)(stage + Stage::ACT) + (tid >> 3) * AROW + ak;
        const bool in_k = 64 * c + ak < K;
#pragma unroll
        for (int j = 0; j < NA; ++j) {
            const bool in = in_k && j < a_rows;
            qk_cp_async16(sA + j * (THREADS / 8) * AROW, in ? a + j * a_step + 64 * c : A, in ? 16 : 0);
        }
    }
};

/* the CTA's outputs (acc: a warp's R tiles x 4 token groups) plus bias, rounded to fp16, through
 * shared memory (tokens x (16 R WN + 8) halves) into Y: 16-byte stores where y_vec */
template <int R, int WN, int WM>
__device__ __forceinline__ void qk_gemm_store(const float acc[R * 16], qk_u8* smem, const qk_u16* bias, qk_u16* Y,
                                              int M, int N, int row0, int tok0, int has_bias, int y_vec) {
    constexpr int T = 4, BN = 16 * R * WN, BM = 32 * WM;
    const int lane = (int)(threadIdx.x & 31), g = lane >> 2, t = lane & 3, warp = (int)(threadIdx.x >> 5);
    const int wn = warp % WN, wm = warp / WN;
    constexpr int YROW = BN + 8; /* halves per staged token row of outputs */
    qk_u16* sY = (qk_u16*)smem;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int ln = 16 * R * wn + 16 * r + 8 * h + g;
            const float b = has_bias && row0 + ln < N ? qk_fp16_to_float(bias[row0 + ln]) : 0.0f;
#pragma unroll
            for (int tg = 0; tg < T; ++tg)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float v = acc[(r * T + tg) * 4 + 2 * h + e];
                    if (has_bias) v += b;
                    sY[(32 * wm + 8 * tg + 2 * t + e) * YROW + ln] = __half_as_ushort(qk_half_rn(v));
                }
        }
    __syncthreads();
    for (int i = (int)threadIdx.x; i < BM * (BN / 8); i += 32 * WN * WM) {
        const int tl = i / (BN / 8), n = row0 + 8 * (i % (BN / 8)), tok = tok0 + tl;
        if (tok >= M || n >= N) continue;
        const qk_u16* src = sY + tl * YROW + (n - row0);
        qk_u16* dst = Y + (qk_i64)tok * N + n;
        if (y_vec) {
            *(uint4*)dst = *(const uint4*)src;
            continue;
        }
        for (int e = 0; e < 8 && n + e < N; ++e) dst[e] = src[e];
    }
}

template <int BITS, int R, int WN, int WM, int S, bool ZP>
__device__ __forceinline__ void qk_nbits_gemm(const qk_u16* A, const qk_u8* B, const qk_u16* scales, const qk_u8* zp,
                                              const qk_u16* bias, qk_u16* Y, int M, int K, int N, int cpb_shift,
                                              int k_blocks, int zp_bytes, int has_bias, int y_vec) {
    extern __shared__ float qk_red[];
    constexpr int T = 4, WPR = BITS / 2, BN = 16 * R * WN, BM = 32 * WM;
    typedef QkGemmStage<BITS, BN, BM, ZP> Stage;
    constexpr int WB = Stage::WB, AROW = Stage::AROW, STAGE = Stage::BYTES;
    qk_u8* smem = (qk_u8*)qk_red;
    const int lane = (int)(threadIdx.x & 31), g = lane >> 2, t = lane & 3, warp = (int)(threadIdx.x >> 5);
    const int wn = warp % WN, wm = warp / WN;
    const int row0 = (int)blockIdx.x * BN, tok0 = (int)blockIdx.y * BM;
    const int n_chunks = (K + 63) / 64;
    const qk_i64 row_bytes = (qk_i64)k_blocks * ((64 << cpb_shift) * BITS / 8);

    qk_u32 off[4]; /* q - z for the default zero point 2^(BITS - 1) (an integer: no sum(a) term) */
    qk_int_offsets<BITS>(1 << (BITS - 1), off);
    /* per row n: bit 0 the half of its scale word holding its block-0 scale ((n k_blocks) & 1), bits
     * 3-4 the byte of its zero-point word where its packed zero points start ((n zp_bytes) & 3) */
    int rowbits[R][2];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const qk_i64 n = min(row0 + 16 * R * wn + 16 * r + 8 * h + g, N - 1);
            rowbits[r][h] = (int)((n * k_blocks) & 1) | (ZP ? (int)((n * zp_bytes) & 3) << 3 : 0);
        }

    float acc[R * T * 4];
#pragma unroll
    for (int i = 0; i < R * T * 4; ++i) acc[i] = 0.0f;

    const QkGemmCopies<BITS, BN, BM, 32 * WN * WM, ZP> copies(A, B, scales, zp, zp_bytes, row0, tok0, M, K, N,
                                                             row_bytes, cpb_shift, k_blocks);
#pragma unroll
    for (int j = 0; j < S - 1; ++j) {
        if (j < n_chunks) copies.issue(smem + j * STAGE, j);
        qk_cp_async_commit();
    }
    for (int c = 0; c < n_chunks; ++c) {
        qk_cp_async_wait<S - 2>();
        __syncthreads(); /* chunk c is in its stage for every thread; stage (c - 1) % S is free */
        if (c + S - 1 < n_chunks) copies.issue(smem + ((c + S - 1) % S) * STAGE, c + S - 1);
        qk_cp_async_commit();

        const qk_u8* stage = smem + (c % S) * STAGE;
        const qk_u32* sW = (const qk_u32*)stage;
        const qk_u32* sS = (const qk_u32*)(stage + Stage::SCALES);
        const qk_u32* sZ = (const qk_u32*)(stage + Stage::ZPS);
        const qk_u16* sA = (const qk_u16*)(stage + Stage::ACT);
        qk_u32 bf[T][4][2];
#pragma unroll
        for (int tg = 0; tg < T; ++tg) {
            qk_u32 act[8];
            const qk_u16* row = sA + (32 * wm + 8 * tg + g) * AROW;
            qk_act16(act, row, 16 * t, 16 * t + 8);
#pragma unroll
            for (int m = 0; m < 4; ++m) {
                int p[2], q[2];
                qk_slot_pairs<BITS>(m, p, q);
                bf[tg][m][0] = qk_act_pair(act, p[0], p[1]);
                bf[tg][m][1] = qk_act_pair(act, q[0], q[1]);
            }
        }
        const int kb = c >> cpb_shift;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            qk_u32 w[2][WPR], zoff[2][4];
            float sc[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int lr = 16 * R * wn + 16 * r + 8 * h + g;
#pragma unroll
                for (int i = 0; i < WPR; ++i) w[h][i] = sW[lr * (WB / 4) + WPR * t + i];
                sc[h] = qk_fp16_to_float((qk_u16)(sS[lr] >> (16 * ((rowbits[r][h] ^ kb) & 1))));
                if (ZP) { /* packed zero points */
                    const int zi = (int)(sZ[lr] >> (((rowbits[r][h] & 0x18) + kb * BITS) & 31)) & ((1 << BITS) - 1);
                    qk_int_offsets<BITS>(zi, zoff[h]);
                } else {
#pragma unroll
                    for (int m = 0; m < 4; ++m) zoff[h][m] = off[m];
                }
            }
            float d[T][4];
#pragma unroll
            for (int tg = 0; tg < T; ++tg)
#pragma unroll
                for (int i = 0; i < 4; ++i) d[tg][i] = 0.0f;
#pragma unroll
            for (int m = 0; m < 4; ++m) {
                qk_u32 a[4];
                qk_weight_pairs<BITS>(w[0], m, zoff[0], &a[0], &a[2]);
                qk_weight_pairs<BITS>(w[1], m, zoff[1], &a[1], &a[3]);
#pragma unroll
                for (int tg = 0; tg < T; ++tg) qk_mma_16816(d[tg], a, bf[tg][m]);
            }
#pragma unroll
            for (int tg = 0; tg < T; ++tg)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    float& x = acc[(r * T + tg) * 4 + i];
                    x = fmaf(sc[i >> 1], d[tg][i], x);
                }
        }
    }
    qk_cp_async_wait<0>();
    __syncthreads(); /* every warp is done with the stages: they become the output tile */

    qk_gemm_store<R, WN, WM>(acc, smem, bias, Y, M, N, row0, tok0, has_bias, y_vec);
}

/* the instantiations the launcher picks from (qconform.device.registry.GEMM_SHAPES), then the bench's
 * other candidates; 32 WN WM threads a CTA, one CTA an SM at least. Dynamic shared memory: S stages or
 * the output tile, the larger (registry.GemmShape.smem) */
#define QK_NBITS_GEMM_DEF(BITS, R, WN, WM, S, ZP, SUFFIX)                                                              \
    extern "C" __global__ void __launch_bounds__(32 * WN * WM, 1)                                                      \
        qk_nbits_gemm_u##BITS##_r##R##_n##WN##_m##WM##_s##S##SUFFIX(                                                   \
        const qk_u16* A, const qk_u8* B, const qk_u16* scales, const qk_u8* zp, const qk_u16* bias, qk_u16* Y, int M,  \
        int K, int N, int cpb_shift, int k_blocks, int zp_bytes, int has_bias, int y_vec) {                            \
        qk_nbits_gemm<BITS, R, WN, WM, S, ZP>(A, B, scales, zp, bias, Y, M, K, N, cpb_shift, k_blocks, zp_bytes,       \
                                              has_bias, y_vec);                                                        \
    }
/* QK_NBITS_GEMM: the default zero point (zp not read); QK_NBITS_GEMM_Z the same tiles with packed
 * zero points as well (symbol ending _z) */
#define QK_NBITS_GEMM(BITS, R, WN, WM, S) QK_NBITS_GEMM_DEF(BITS, R, WN, WM, S, false, )
#define QK_NBITS_GEMM_Z(BITS, R, WN, WM, S)                                                                            \
    QK_NBITS_GEMM_DEF(BITS, R, WN, WM, S, false, )                                                                     \
    QK_NBITS_GEMM_DEF(BITS, R, WN, WM, S, true, _z)
#ifdef QK_MMA_DEFAULT_ONLY
#define QK_NBITS_GEMM_CANDIDATES(BITS)
#else
#define QK_NBITS_GEMM_CANDIDATES(BITS)                                                                                 \
    QK_NBITS_GEMM(BITS, 4, 4, 2, 3)                                                                                    \
    QK_NBITS_GEMM(BITS, 2, 4, 4, 4)                                                                                    \
    QK_NBITS_GEMM(BITS, 2, 4, 2, 4)
#endif
#define QK_NBITS_GEMM_BITS(BITS)                                                                                       \
    QK_NBITS_GEMM_Z(BITS, 4, 2, 4, 4)                                                                                  \
    QK_NBITS_GEMM_Z(BITS, 4, 4, 2, 4)                                                                                  \
    QK_NBITS_GEMM_CANDIDATES(BITS)
QK_NBITS_GEMM_BITS(2)
QK_NBITS_GEMM_BITS(4)

/* ggml's keep-quant linear layer (op matmul_bt_quant), Y[m, n] = vec_dot(W row n, Q8 row m), in its
 * own reduction order: the kernel run under the contract order=any (docs/contracts.md, "ggml
 * keep-quant GEMV"), for Q4_K, Q5_K, Q6_K (Q8_K activations) and Q8_0 (Q8_0 activations). The
 * bit-exact kernel of ggml's generic order is keep_quant.hip; this one is laid out as llama.cpp's
 * CUDA mmvq (ggml-org/llama.cpp ggml/src/ggml-cuda/mmvq.cu mul_mat_vec_q: a group of threads per
 * weight row, each thread a slice of a block, a warp reduction at the end; vecdotq.cuh
 * vec_dot_q4_K_q8_1_impl_vmmq / vec_dot_q5_K_q8_1_impl_vmmq / vec_dot_q6_K_q8_1_impl_mmvq /
 * vec_dot_q8_0_q8_1_impl: int32 dp4a sums per sub-block, the sub-block scale applied to the exact
 * integer sum, the fp32 block scales once per term).
 *
 * Arithmetic of one thread's term (its 32 values of one block, two sub-blocks or scale groups):
 *   isum = sc_a * sumi_a + sc_b * sumi_b          (exact int32: |isum| < 2^24 for every type)
 *   Q4_K / Q5_K: acc += f32(dx * yd) * isum  and  acc -= f32(dmx * yd) * (m_a * bsum_a + m_b * bsum_b)
 *   Q6_K: sumi = dp4a(u, q8) - 32 * bsum (u the unsigned 6-bit values; the bsum of the same 16
 *         values, so sumi is the exact sum of (u - 32) q8): acc += f32(dx * yd) * isum
 *   Q8_0: acc += f32(dx * dy) * sumi (16 values)
 * each accumulation an fmaf (one rounding), the integers converted exactly; then the 8 threads of a
 * row add their sums (xor shuffles of width 8), and the CTA's 4 groups their partial rows in group
 * order. Every term is a product of exact integers and at most two rounded fp32 products, within
 * the contract's n = K + 4 (docs/contracts.md).
 *
 * Geometry (Q4_K / Q5_K since session 10 round 2: kf2_gemv below, one activation slice for the 4 rows;
 * round 1's layout with -DQK_KQ_FAST_V1): a CTA of 4 groups of 32 threads (wave-size agnostic: groups
 * are threadIdx / 32, the shuffles have width 8) takes 4 weight rows (blockIdx.y) and MT activation rows (blockIdx.x);
 * group w takes the blocks ib = w, w + 4, ... (Q8_0: the quads of blocks), lane 8 r + c row r and
 * slice c of each. Weight slices are 16-byte loads for Q4_K (144 bytes) and Q5_K (176): every block
 * 16-byte aligned. Q6_K (210) and Q8_0 (34) blocks are 2-byte aligned: a step (a Q6_K block, 4 Q8_0
 * blocks) is staged through shared memory by consecutive aligned words (kf_stage_q8_0 / _q6_k), the
 * slices read back and realigned by halves (kf_align16); no byte outside the weight buffer is
 * read (the partial Q8_0 quad at a row's end: kf_raw16 straight from global). Q8_K activations are read as the quantize
 * kernel writes them (q8_quant.hip; no regrouping launch): a slice's 16 quants from the two aligned
 * 16-byte words around them, shifted by whole words (kf_act16); Q8_0 activations come regrouped by
 * the bit-exact kernel's qk_q8_0_quant_words (12 words a block, d as fp32 at word 8), 16-byte loads.
 * Q4_K / Q5_K at M = 1 are one launch (qk_kq_one_<t>, at the end of the file): its first CTAs quantize
 * the activation row for the others, which then run kf2_gemv's arithmetic on resident CTAs, each CTA's
 * row groups as one stream of trips (kf_roll_rows).
 * Q6_K / Q8_0 at M = 1 where nb is a multiple of 8 (rows 16-byte aligned): the rows' stages brought into
 * shared memory by the bulk copy engine (qk_kq_bulk_<t>, kf_bulk_gemv), Q6_K in one launch as Q4_K
 * (qk_kq_one_bulk_q6_k).
 * Launcher: qconform/device/ggml/keep_quant.py (order="any"). */
#include "qk_portable.h"
/* bench-only -DQK_PHASES: the Q4_K / Q5_K GEMV's boundaries 0..4 (kf2_rows, kf_roll_rows), its producers'
 * 5..8 (kf_produce), the bulk GEMV's (Q6_K, Q8_0) 10..14 (kf_bulk_gemv); the one launch's CTAs' SMs in
 * slot KF_SM_SLOT (qconform.bench.phases.KQ_SM_SLOT) */
#include "qk_phases.h"
#define KF_SM_SLOT 9

#define KF_Q8K 292 /* bytes per block_q8_K {float d; i8 qs[256]; i16 bsums[16]} */
#define KF_A0 48   /* bytes per regrouped Q8_0 block (q8_quant.hip qk_q8_0_quant_words: KQ_A0 words) */
#define KF_ROWS 4  /* weight rows per CTA: 8 threads each in every group */
#define KF_GROUPS 4 /* groups of 32 threads per CTA, splitting a row's blocks */
/* The GEMV (not qk_kq_one_<t>) is launched as a programmatic dependent of the activations' quantize
 * (qconform.device.pdl) and waits for it (QK_WAIT_PRIOR_GRID) before it reads an activation. By
 * default at entry; bench-only -DQK_KF_LOADS_FIRST: after a thread's first trip of weight loads is
 * issued (the weights need nothing of the quantize), so the first wave's weights are in flight while
 * the quantize runs (sm_90: the wait is ACQBULK, which waits on no load's scoreboard); a thread without
 * a trip waits before its sums. */
#ifdef QK_KF_LOADS_FIRST
#define KF_WAIT_AT_ENTRY()
#define KF_WAIT_AFTER_LOADS(first)        \
    do {                                  \
        if (first) QK_WAIT_PRIOR_GRID();  \
    } while (0)
#else
#define KF_WAIT_AT_ENTRY() QK_WAIT_PRIOR_GRID()
#define KF_WAIT_AFTER_LOADS(first) \
    do {                           \
    } while (0) /* waited at entry */
#endif
#define KF_LO4 0x0F0F0F0Fu

/* 16 bytes at the 2-byte aligned address p, in two steps so that a thread's loads of several blocks
 * are all issued before the first is used: kf_raw16 loads the 4 aligned words from base = p & ~3
 * and the half word at base + 16 (p 2 past a word) or base + 14 (aligned: a repeat), reading only
 * [base, p + 16) (where p is not aligned, the 2 bytes before it: in the same block or the one before
 * it in the buffer, whose byte 0 is 4-byte aligned, so never before the buffer); kf_align16 realigns
 * them by QK_BYTE_PERM. */
__device__ __forceinline__ void kf_raw16(const qk_u8* p, qk_u32* r) {
    const int mis = (int)((unsigned long long)p & 2u);
    const qk_u32* q = (const qk_u32*)(p - mis);
    r[0] = q[0];
    r[1] = q[1];
    r[2] = q[2];
    r[3] = q[3];
    r[4] = *(const qk_u16*)((const qk_u8*)q + 14 + mis);
}

__device__ __forceinline__ void kf_align16(const qk_u32* r, const qk_u8* p, qk_u32 (&w)[4]) {
    const qk_u32 sel = ((unsigned long long)p & 2u) ? 0x5432u : 0x3210u;
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = QK_BYTE_PERM(r[k], r[k + 1], sel);
}

/* ggml-quants.c get_scale_min_k4 for the sub-blocks 2g and 2g + 1, without a branch: scale 2g in
 * byte 0 of sc01, 2g + 1 in byte 1, the mins likewise in mn01 (sc: the 12 scale bytes as words; as
 * llama.cpp's vecdotq.cuh vec_dot_q4_K_q8_1 unpacks them with kmask1..3) */
__device__ __forceinline__ void kf_scale_min_pair(const qk_u32 (&sc)[3], int g, qk_u32& sc01, qk_u32& mn01) {
    const int sh = 16 * (g & 1);
    const qk_u32 a = sc[0] >> sh, b = sc[1] >> sh, c = sc[2] >> sh;
    const bool lo = g < 2; /* sub-blocks 0..3: the low 6 bits of bytes j and j + 4 */
    sc01 = lo ? a & 0x3F3Fu : (c & 0x0F0Fu) | ((a >> 2) & 0x3030u);
    mn01 = lo ? b & 0x3F3Fu : ((c >> 4) & 0x0F0Fu) | ((b >> 2) & 0x3030u);
}

__device__ __forceinline__ int kf_dot4(const qk_u32 (&q)[4], const qk_u32 (&a)[4]) {
    return qk_dp4a((int)q[3], (int)a[3], qk_dp4a((int)q[2], (int)a[2], qk_dp4a((int)q[1], (int)a[1], qk_dp4a((int)q[0], (int)a[0], 0))));
}

/* 16 bytes at the 4-byte aligned address p of a Q8_K activation block (its quants start 4 bytes into
 * a 292-byte block: 16-byte aligned only every fourth block) as 4 words: the two aligned 16-byte
 * words from p & ~15, then the word shift (p / 4) % 4, the same for every thread of a group (one
 * activation block), picked in two selects. Reads [p & ~15, (p & ~15) + 32): inside the activation
 * rows for every slice of a block (p - 4 is a block's byte 0 plus at most 240; the first block is
 * 16-byte aligned). */
__device__ __forceinline__ void kf_act16(const qk_u8* p, qk_u32 (&w)[4]) {
    const unsigned long long ip = (unsigned long long)p;
    const uint4* q = (const uint4*)(ip & ~15ull);
    const uint4 v0 = q[0], v1 = q[1];
    const qk_u32 r[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
    const int sh = (int)(ip >> 2) & 3;
    qk_u32 t[6];
#pragma unroll
    for (int k = 0; k < 6; ++k) t[k] = (sh & 2) ? r[k + 2] : r[k];
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = (sh & 1) ? t[k + 1] : t[k];
}

__device__ __forceinline__ int kf_half(qk_u32 w, int hi) { return (int)(qk_i16)(hi ? w >> 16 : w & 0xFFFFu); }

/* One thread's slice c of block ib of a weight row (blk: the block's byte 0) against MT activation
 * rows (act: block ib of activation row 0, rows astride bytes apart), added to acc.
 *   Q4_K {half d, dmin; u8 scales[12]; u8 qs[128]}, Q5_K {half d, dmin; u8 scales[12]; u8 qh[32];
 *   u8 qs[128]} (ggml-common.h): slice c holds qs bytes 16c .. 16c + 15 of group g = c / 2, their
 *   low nibbles elements 64g + 16(c % 2) + i (sub-block 2g), high nibbles 32 further (2g + 1); Q5_K's
 *   bit 2g / 2g + 1 of qh[16(c % 2) + i] is bit 4 (dequantize_row_q5_K).
 *   Q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; half d}: slice c = 4h + p holds ql bytes 64h + 16p ..
 *   + 15; with k = p / 2, ll = 16(p % 2) + i their low nibbles are elements 128h + 32k + ll, high
 *   nibbles 128h + 32(k + 2) + ll, the 2 bits 2k' .. 2k' + 1 of qh[32h + ll] on top, scale
 *   scales[8h + 2k' + p % 2] (k' = k, k + 2; dequantize_row_q6_K).
 *   Q8_0 {half d; i8 qs[32]}: slice c is bytes 16(c % 2) .. + 15 of the quants of block ib. */
#define KF_WR(KIND) ((KIND) == 4 ? 8 : (KIND) == 5 ? 12 : (KIND) == 6 ? 12 : 6) /* raw words of a slice */

/* the raw words of slice c of the block at blk: Q4_K header, qs; Q5_K header, qh, qs; Q6_K ql and
 * qh as kf_raw16 words, the two scale bytes and d; Q8_0 the quants as kf_raw16 words and d */
template <int KIND>
__device__ __forceinline__ void kf_wload(const qk_u8* blk, int c, qk_u32 (&r)[KF_WR(KIND)]) {
    if (KIND == 4 || KIND == 5) {
        const uint4 hd = *(const uint4*)blk;
        const uint4 qv = *(const uint4*)(blk + (KIND == 5 ? 48 : 16) + 16 * c);
        r[0] = hd.x; r[1] = hd.y; r[2] = hd.z; r[3] = hd.w;
        r[4] = qv.x; r[5] = qv.y; r[6] = qv.z; r[7] = qv.w;
        if (KIND == 5) {
            const uint4 hv = *(const uint4*)(blk + 16 + 16 * (c & 1));
            r[8 % KF_WR(KIND)] = hv.x; r[9 % KF_WR(KIND)] = hv.y; r[10 % KF_WR(KIND)] = hv.z; r[11 % KF_WR(KIND)] = hv.w;
        }
    } else if (KIND == 6) {
        const int h = c >> 2, p = c & 3, i0 = 8 * h + 2 * (p >> 1) + (p & 1);
        kf_raw16(blk + 64 * h + 16 * p, r);
        kf_raw16(blk + 128 + 32 * h + 16 * (p & 1), r + 5);
        r[10 % KF_WR(KIND)] = (qk_u32)blk[192 + i0] | ((qk_u32)blk[196 + i0] << 8);
        r[11 % KF_WR(KIND)] = *(const qk_u16*)(blk + 208);
    } else {
        kf_raw16(blk + 2 + 16 * (c & 1), r);
        r[5] = *(const qk_u16*)blk;
    }
}

/* One Q4_K / Q5_K row's term of slice c (r: kf_wload's words) against one activation row's slice:
 * alo / ahi its 16 quants of sub-blocks 2g and 2g + 1, bs0 / bs1 the bsums words 4g, 4g + 1 and
 * 4g + 2, 4g + 3 (g = c / 2), yd its d (the arithmetic in the header), added to acc. */
template <int KIND>
__device__ __forceinline__ void kf_q45_row(const qk_u32 (&r)[KF_WR(KIND)], int c, const qk_u32 (&alo)[4], const qk_u32 (&ahi)[4],
                                           qk_u32 bs0, qk_u32 bs1, float yd, float& acc) {
    const int g = c >> 1, half = c & 1;
    qk_u32 lo[4], hi[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        lo[k] = r[4 + k] & KF_LO4;
        hi[k] = (r[4 + k] >> 4) & KF_LO4;
        if (KIND == 5) {
            lo[k] |= ((r[(8 + k) % KF_WR(KIND)] >> (2 * g)) & 0x01010101u) << 4;
            hi[k] |= ((r[(8 + k) % KF_WR(KIND)] >> (2 * g + 1)) & 0x01010101u) << 4;
        }
    }
    const qk_u32 sc[3] = {r[1], r[2], r[3]};
    qk_u32 sc01, mn01;
    kf_scale_min_pair(sc, g, sc01, mn01);
    const int s0 = (int)(sc01 & 0xFFu), s1 = (int)(sc01 >> 8), m0 = (int)(mn01 & 0xFFu), m1 = (int)(mn01 >> 8);
    const float dx = qk_fp16_to_float((qk_u16)(r[0] & 0xFFFFu)), dmx = qk_fp16_to_float((qk_u16)(r[0] >> 16));
    const qk_u32 bs[2] = {bs0, bs1};
    const int isum = s0 * kf_dot4(lo, alo) + s1 * kf_dot4(hi, ahi);
    const int imin = m0 * kf_half(bs[0], half) + m1 * kf_half(bs[1], half);
    acc = fmaf(QK_FMUL(dx, yd), __int2float_rn(isum), acc);
    acc = fmaf(-QK_FMUL(dmx, yd), __int2float_rn(imin), acc);
}

/* Q6_K slice c = 4h + p of a block (the layout above): its 32 weights as unsigned 6-bit values (lo: the
 * low nibbles' 16, scale group 8h + j; hi: the high nibbles', 8h + j + 4; j = 2(p / 2) + p % 2), their
 * two scales and d, from kf_wload<6>'s words r (blk: the block's byte 0, for the halves' alignment) */
struct kf_q6_w {
    qk_u32 lo[4], hi[4];
    int s0, s1;
    float dx;
};
template <int WR> /* KF_WR(6); any other WR only in branches of other types never taken */
__device__ __forceinline__ kf_q6_w kf_q6_unpack(const qk_u32 (&r)[WR], const qk_u8* blk, int c) {
    const int h = c >> 2, p = c & 3, k = p >> 1;
    kf_q6_w q;
    qk_u32 ql[4], qh[4];
    kf_align16(r, blk + 64 * h + 16 * p, ql);
    kf_align16(r + 5 % WR, blk + 128 + 32 * h + 16 * (p & 1), qh);
#pragma unroll
    for (int v = 0; v < 4; ++v) {
        q.lo[v] = (ql[v] & KF_LO4) | (((qh[v] >> (2 * k)) & 0x03030303u) << 4);
        q.hi[v] = ((ql[v] >> 4) & KF_LO4) | (((qh[v] >> (2 * k + 4)) & 0x03030303u) << 4);
    }
    const qk_u32 scw = r[10 % WR];
    q.s0 = (int)(qk_i8)(scw & 0xFFu);
    q.s1 = (int)(qk_i8)(scw >> 8);
    q.dx = qk_fp16_to_float((qk_u16)r[11 % WR]);
    return q;
}

/* the Q8_K activation block a's part of slice c: the 16 quants under lo, the 16 under hi, the bsums of
 * their scale groups (8h + j, 8h + j + 4); and where d is */
struct kf_q6_a {
    qk_u32 lo[4], hi[4];
    int b0, b1;
    const float* d;
};
__device__ __forceinline__ kf_q6_a kf_q6_act(const qk_u8* a, int c) {
    const int h = c >> 2, p = c & 3, k = p >> 1, j = 2 * k + (p & 1);
    kf_q6_a v;
    kf_act16(a + 4 + 128 * h + 32 * k + 16 * (p & 1), v.lo);
    kf_act16(a + 4 + 128 * h + 32 * k + 64 + 16 * (p & 1), v.hi);
    const qk_i16* bs = (const qk_i16*)(a + 260) + 8 * h + j;
    v.b0 = (int)bs[0];
    v.b1 = (int)bs[4];
    v.d = (const float*)a;
    return v;
}

/* acc + f32(dx * yd) * sum of the slice's (u - 32) q8 products by scale (the exact int32 in the header) */
__device__ __forceinline__ float kf_q6_term(const kf_q6_w& q, const kf_q6_a& a, float acc) {
    const int isum = q.s0 * (kf_dot4(q.lo, a.lo) - 32 * a.b0) + q.s1 * (kf_dot4(q.hi, a.hi) - 32 * a.b1);
    return fmaf(QK_FMUL(q.dx, *a.d), __int2float_rn(isum), acc);
}

/* Slice c of block ib of a weight row (blk: the block's byte 0, r: kf_wload's words) against MT
 * activation rows (act: block ib of activation row 0, rows astride bytes apart: Q8_K blocks as
 * quantized, Q8_0 blocks regrouped), added to acc.
 *   Q4_K {half d, dmin; u8 scales[12]; u8 qs[128]}, Q5_K {half d, dmin; u8 scales[12]; u8 qh[32];
 *   u8 qs[128]} (ggml-common.h): slice c holds qs bytes 16c .. 16c + 15 of group g = c / 2, their
 *   low nibbles elements 64g + 16(c % 2) + i (sub-block 2g), high nibbles 32 further (2g + 1); Q5_K's
 *   bit 2g / 2g + 1 of qh[16(c % 2) + i] is bit 4 (dequantize_row_q5_K).
 *   Q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; half d}: slice c = 4h + p holds ql bytes 64h + 16p ..
 *   + 15; with k = p / 2, ll = 16(p % 2) + i their low nibbles are elements 128h + 32k + ll, high
 *   nibbles 128h + 32(k + 2) + ll, the 2 bits 2k' .. 2k' + 1 of qh[32h + ll] on top, scale
 *   scales[8h + 2k' + p % 2] (k' = k, k + 2; dequantize_row_q6_K).
 *   Q8_0 {half d; i8 qs[32]}: slice c is bytes 16(c % 2) .. + 15 of the quants of block ib.
 * Activation rows past M (m >= mt) read row mt - 1; their sums are never stored. */
template <int KIND, int MT>
__device__ __forceinline__ void kf_block(const qk_u32 (&r)[KF_WR(KIND)], const qk_u8* blk, const qk_u8* act, qk_i64 astride,
                                         int mt, int c, float (&acc)[MT]) {
    if (KIND == 4 || KIND == 5) {
        const int g = c >> 1, half = c & 1;
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            const qk_u8* a = act + (m < mt ? m : mt - 1) * astride;
            qk_u32 alo[4], ahi[4];
            kf_act16(a + 4 + 64 * g + 16 * half, alo);
            kf_act16(a + 4 + 64 * g + 32 + 16 * half, ahi);
            const qk_u32* bs = (const qk_u32*)(a + 260 + 8 * g); /* bsums 4g .. 4g + 3 */
            kf_q45_row<KIND>(r, c, alo, ahi, bs[0], bs[1], *(const float*)a, acc[m]);
        }
    } else if (KIND == 6) {
        const kf_q6_w q = kf_q6_unpack(r, blk, c);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            const kf_q6_a a = kf_q6_act(act + (m < mt ? m : mt - 1) * astride, c);
            acc[m] = kf_q6_term(q, a, acc[m]);
        }
    } else {
        qk_u32 q[4];
        kf_align16(r, blk + 2 + 16 * (c & 1), q);
        const float dx = qk_fp16_to_float((qk_u16)r[5]);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            const qk_u32* a = (const qk_u32*)(act + (m < mt ? m : mt - 1) * astride);
            const uint4 av = *(const uint4*)(a + 4 * (c & 1));
            const qk_u32 aw[4] = {av.x, av.y, av.z, av.w};
            const int sumi = kf_dot4(q, aw);
            acc[m] = fmaf(QK_FMUL(dx, qk_float(a[8])), __int2float_rn(sumi), acc[m]);
        }
    }
}

/* Q8_0 rows through shared memory: the 136 bytes of a step (4 blocks) from S, 2-byte aligned, as the
 * aligned words from S & ~3, thread c of the row taking words c, c + 8, ... (one 32-byte run of
 * the row per load instruction, where a thread's own 16-byte slices would spread each instruction
 * over two lines), the last word as its half when the step ends 2 past a word (no byte past the
 * step is read); then each thread takes its slice's 5 words (kf_raw16's) and its block's d. */
#define KF_SW(KIND) ((KIND) == 0 ? 36 : (KIND) == 6 ? 54 : 1) /* staged words a step: Q8_0 136 + 2 bytes, Q6_K 210 + 2 */
#define KF_SV 7 /* staged words a thread loads per step (Q8_0 5, Q6_K 7) */
__device__ __forceinline__ void kf_stage_q8_0(const qk_u8* S, int c, qk_u32 (&v)[KF_SV]) {
    const int mis = (int)((unsigned long long)S & 2u);
    const qk_u32* base = (const qk_u32*)(S - mis);
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = base[c + 8 * k];
    /* words 32, 33 (threads 0, 1) and, 2 past a word, the low half of word 34 (thread 2) */
    v[4] = c < 2 ? base[32 + c] : (c == 2 && mis) ? (qk_u32) * (const qk_u16*)(base + 34) : 0u;
}

__device__ __forceinline__ void kf_stage_put_q8_0(int c, const qk_u32 (&v)[KF_SV], qk_u32* stg) {
#pragma unroll
    for (int k = 0; k < 4; ++k) stg[c + 8 * k] = v[k];
    if (c < 3) stg[32 + c] = v[4];
}

template <int WR>
__device__ __forceinline__ void kf_unstage_q8_0(const qk_u8* S, int c, const qk_u32* stg, qk_u32 (&r)[WR]) {
    const int mis = (int)((unsigned long long)S & 2u);
    const int od = mis + 34 * (c >> 1), o = od + 2 + 16 * (c & 1); /* the block's d, the slice */
#pragma unroll
    for (int k = 0; k < 5; ++k) r[k] = stg[(o >> 2) + k];
    r[5] = (stg[od >> 2] >> (8 * (od & 2))) & 0xFFFFu;
}

/* Q6_K likewise, a step being one 210-byte block: words c, c + 8, ... of the 53 aligned words from
 * blk & ~3 (the last one's half when the block starts on a word: no byte past it is read), then the
 * words kf_wload<6> takes from the block, from shared memory. */
__device__ __forceinline__ void kf_stage_q6_k(const qk_u8* blk, int c, qk_u32 (&v)[KF_SV]) {
    const int mis = (int)((unsigned long long)blk & 2u);
    const qk_u32* base = (const qk_u32*)(blk - mis);
#pragma unroll
    for (int k = 0; k < 6; ++k) v[k] = base[c + 8 * k];
    /* words 48..51 (threads 0..3) and word 52, d's (thread 4: its low half where the block is aligned) */
    v[6] = c < 4 ? base[48 + c] : c == 4 ? (mis ? base[52] : (qk_u32) * (const qk_u16*)(base + 52)) : 0u;
}

__device__ __forceinline__ void kf_stage_put_q6_k(int c, const qk_u32 (&v)[KF_SV], qk_u32* stg) {
#pragma unroll
    for (int k = 0; k < 6; ++k) stg[c + 8 * k] = v[k];
    if (c < 5) stg[48 + c] = v[6];
}

template <int WR>
__device__ __forceinline__ void kf_unstage_q6_k(const qk_u8* blk, int c, const qk_u32* stg, qk_u32 (&r)[WR]) {
    const int mis = (int)((unsigned long long)blk & 2u);
    const int h = c >> 2, p = c & 3, i0 = 8 * h + 2 * (p >> 1) + (p & 1);
    const int oql = mis + 64 * h + 16 * p, oqh = mis + 128 + 32 * h + 16 * (p & 1);
#pragma unroll
    for (int k = 0; k < 5; ++k) {
        r[k] = stg[(oql >> 2) + k];
        r[5 + k] = stg[(oqh >> 2) + k];
    }
    const int o0 = mis + 192 + i0, o1 = o0 + 4, od = mis + 208;
    const qk_u32 b0 = (stg[o0 >> 2] >> (8 * (o0 & 3))) & 0xFFu, b1 = (stg[o1 >> 2] >> (8 * (o1 & 3))) & 0xFFu;
    r[10 % WR] = b0 | (b1 << 8);
    r[11 % WR] = (stg[od >> 2] >> (8 * (od & 2))) & 0xFFFFu;
}

/* v summed over the W lanes of its xor group (shuffles of width W: 8 lanes a row, or a warp) */
template <int W>
__device__ __forceinline__ float kf_xor_sum(float v) {
#pragma unroll
    for (int m = W / 2; m >= 1; m /= 2) v += QK_SHFL_XOR(v, m, W);
    return v;
}

/* The CTA's outputs: after a barrier, thread rr * MT + m adds the 4 groups' partial sums of row
 * n0 + rr, activation row m0 + m in group order and stores the rows that exist. */
template <int MT>
__device__ __forceinline__ void kf_store(const float (&part)[KF_GROUPS][KF_ROWS][MT], int t, qk_i64 m0, qk_i64 n0, int mt, qk_i64 N,
                                         float* Y) {
    __syncthreads();
    if (t < KF_ROWS * MT) {
        const int rr = t / MT, m = t % MT;
        const qk_i64 nn = n0 + rr;
        if (m < mt && nn < N) {
            float y = part[0][rr][m];
#pragma unroll
            for (int g = 1; g < KF_GROUPS; ++g) y += part[g][rr][m];
            Y[(m0 + m) * N + nn] = y;
        }
    }
}

/* KIND 4, 5, 6: Q4_K, Q5_K, Q6_K (256 values a block, 8 slices; aq: the Q8_K rows); 0: Q8_0
 * (32 values, 2 slices: a row's 8 threads take 4 consecutive blocks; aq: qk_q8_0_quant_words blocks).
 * UNROLL: the blocks of a row a thread loads before it computes the first. */
template <int KIND, int TS, int MT, int UNROLL>
__device__ __forceinline__ void kf_gemv(const qk_u8* __restrict__ W, const qk_u8* __restrict__ aq, float* __restrict__ Y,
                                        qk_i64 M, qk_i64 N, qk_i64 nb) {
    constexpr int AW = KIND == 0 ? KF_A0 : KF_Q8K; /* bytes per activation block */
    constexpr int BPS = KIND == 0 ? 4 : 1; /* blocks of a row per step of its 8 threads */
    __shared__ float part[KF_GROUPS][KF_ROWS][MT];
    __shared__ qk_u32 stg[KF_GROUPS][KF_ROWS][KF_SW(KIND) > 1 ? UNROLL : 1][KF_SW(KIND)];
    const int t = threadIdx.x, w = t >> 5, r = (t >> 3) & 3, c = t & 7;
    const qk_i64 m0 = (qk_i64)blockIdx.x * MT, n = (qk_i64)blockIdx.y * KF_ROWS + r;
    const int mt = (int)(M - m0 < MT ? M - m0 : MT);
    float acc[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[m] = 0.0f;
    const bool rowok = n < N;
    const qk_u8* row = W + (rowok ? n : 0) * nb * TS;
    const qk_u8* a0 = aq + m0 * nb * AW;
    const int sub = KIND == 0 ? c >> 1 : 0;
    const qk_i64 full = nb / BPS; /* steps whose BPS blocks all exist */
    for (qk_i64 s0 = w; s0 < full; s0 += KF_GROUPS * UNROLL) { /* every thread of a group: the same trips */
        qk_u32 raw[UNROLL][KF_WR(KIND)];
        if (KIND == 0 || KIND == 6) { /* Q8_0, Q6_K: the steps staged, then each slice's words read back */
            qk_u32 v[UNROLL][KF_SV];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) { /* every load of the UNROLL steps first */
                const qk_u8* S = row + (s0 + KF_GROUPS * u) * (BPS * TS);
                if (rowok && s0 + KF_GROUPS * u < full) {
                    if (KIND == 0) kf_stage_q8_0(S, c, v[u]);
                    else kf_stage_q6_k(S, c, v[u]);
                }
            }
            KF_WAIT_AFTER_LOADS(s0 == w);
            qk_syncwarp(); /* the previous trip's reads of stg are done */
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                qk_u32* st = stg[w][r][KF_SW(KIND) > 1 ? u : 0];
                if (rowok && s0 + KF_GROUPS * u < full) {
                    if (KIND == 0) kf_stage_put_q8_0(c, v[u], st);
                    else kf_stage_put_q6_k(c, v[u], st);
                }
            }
            qk_syncwarp(); /* each slice's words are read back just before its block is computed */
        } else {
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) /* every load of the UNROLL blocks first */
                if (rowok && s0 + KF_GROUPS * u < full) kf_wload<KIND>(row + ((s0 + KF_GROUPS * u) * BPS + sub) * TS, c, raw[u]);
            KF_WAIT_AFTER_LOADS(s0 == w);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const qk_i64 ib = (s0 + KF_GROUPS * u) * BPS + sub;
            if (rowok && s0 + KF_GROUPS * u < full) {
                const qk_u8* S = row + (s0 + KF_GROUPS * u) * (BPS * TS);
                const qk_u32* st = stg[w][r][KF_SW(KIND) > 1 ? u : 0];
                if (KIND == 0) kf_unstage_q8_0(S, c, st, raw[u]);
                if (KIND == 6) kf_unstage_q6_k(S, c, st, raw[u]);
                kf_block<KIND, MT>(raw[u], row + ib * TS, a0 + ib * AW, nb * AW, mt, c, acc);
            }
        }
    }
    KF_WAIT_AFTER_LOADS(w >= full); /* a group without a trip */
    if (rowok && BPS > 1 && nb % BPS != 0 && full % KF_GROUPS == w) { /* Q8_0: the last, partial quad */
        const qk_i64 ib = full * BPS + sub;
        if (ib < nb) {
            qk_u32 raw[KF_WR(KIND)];
            kf_wload<KIND>(row + ib * TS, c, raw);
            kf_block<KIND, MT>(raw, row + ib * TS, a0 + ib * AW, nb * AW, mt, c, acc);
        }
    }
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        const float v = kf_xor_sum<8>(acc[m]);
        if (c == 0) part[w][r][m] = v;
    }
    kf_store<MT>(part, t, m0, (qk_i64)blockIdx.y * KF_ROWS, mt, N, Y);
}

#ifndef QK_KQ_FAST_V1
/* Q4_K / Q5_K, session 10 round 2 (without -DQK_KQ_FAST_V1; with it, kf_gemv above as in round 1):
 * a thread takes slice c = t % 8 of the blocks ib = t / 8, t / 8 + 16, ... of all 4 rows of the CTA,
 * so one activation slice (two kf_act16, the bsums and d: ~30 instructions and 6 loads) serves 4
 * rows instead of one; a warp reads 4 consecutive blocks of each row (4 runs of 128 bytes of qs per
 * load instruction). The loads of UNROLL such steps (4 rows each) are issued before the first is
 * computed. Rows past N read row N - 1 and are never stored. Each thread's terms are kf_q45_row's
 * (the arithmetic of round 1), then xor shuffles of width 32 over the warp's 4 block columns x 8
 * slices, and kf_store adds the 4 warps' partial rows in warp order. */
template <int KIND, int TS, int MT, int UNROLL, class AfterLoads>
__device__ __forceinline__ void kf2_rows(const qk_u8* __restrict__ W, const qk_u8* __restrict__ aq, float* __restrict__ Y,
                                         qk_i64 M, qk_i64 N, qk_i64 nb, qk_i64 m0, qk_i64 n0, AfterLoads& after_loads) {
    constexpr int COLS = 4 * KF_GROUPS; /* block columns of a CTA: 8 slices each */
    __shared__ float part[KF_GROUPS][KF_ROWS][MT];
    const int t = threadIdx.x, w = t >> 5, c = t & 7, kc = t >> 3, g = c >> 1, half = c & 1;
    const int mt = (int)(M - m0 < MT ? M - m0 : MT);
    const qk_u8* rows[KF_ROWS];
#pragma unroll
    for (int rr = 0; rr < KF_ROWS; ++rr) rows[rr] = W + (n0 + rr < N ? n0 + rr : N - 1) * nb * TS;
    const qk_u8* a0 = aq + m0 * nb * KF_Q8K;
    float acc[KF_ROWS][MT];
#pragma unroll
    for (int rr = 0; rr < KF_ROWS; ++rr)
#pragma unroll
        for (int m = 0; m < MT; ++m) acc[rr][m] = 0.0f;
    QK_PHASE(0);
    for (qk_i64 ib0 = kc; ib0 < nb; ib0 += COLS * UNROLL) { /* the same trips for the 8 threads of a block */
        qk_u32 raw[UNROLL][KF_ROWS][KF_WR(KIND)];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) /* every weight load of the UNROLL steps first */
            if (ib0 + COLS * u < nb)
#pragma unroll
                for (int rr = 0; rr < KF_ROWS; ++rr) kf_wload<KIND>(rows[rr] + (ib0 + COLS * u) * TS, c, raw[u][rr]);
        after_loads(ib0 == kc);
        if (ib0 == kc) {
            QK_PHASE(1);
            QK_PHASE_AFTER(2, raw[0][0][4]);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const qk_i64 ib = ib0 + COLS * u;
            if (ib < nb) {
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    const qk_u8* a = a0 + (m < mt ? m : mt - 1) * nb * KF_Q8K + ib * KF_Q8K;
                    qk_u32 alo[4], ahi[4];
                    kf_act16(a + 4 + 64 * g + 16 * half, alo);
                    kf_act16(a + 4 + 64 * g + 32 + 16 * half, ahi);
                    const qk_u32* bs = (const qk_u32*)(a + 260 + 8 * g); /* bsums 4g .. 4g + 3 */
                    const qk_u32 bs0 = bs[0], bs1 = bs[1];
                    const float yd = *(const float*)a;
#pragma unroll
                    for (int rr = 0; rr < KF_ROWS; ++rr) kf_q45_row<KIND>(raw[u][rr], c, alo, ahi, bs0, bs1, yd, acc[rr][m]);
                }
            }
        }
    }
    after_loads(kc >= nb); /* a block column without a trip */
    QK_PHASE(3);
#pragma unroll
    for (int rr = 0; rr < KF_ROWS; ++rr)
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            const float v = kf_xor_sum<32>(acc[rr][m]);
            if ((t & 31) == 0) part[w][rr][m] = v;
        }
    kf_store<MT>(part, t, m0, n0, mt, N, Y);
    QK_PHASE(4);
}

/* kf2_rows' call once a thread's first loads are issued (first: true then, or where it has no trip) */
struct kf_prior_wait {
    __device__ __forceinline__ void operator()(bool first) const { KF_WAIT_AFTER_LOADS(first); }
};

/* the CTA's rows: activation rows blockIdx.x * MT .., weight rows blockIdx.y * 4 .. */
template <int KIND, int TS, int MT, int UNROLL>
__device__ __forceinline__ void kf2_gemv(const qk_u8* __restrict__ W, const qk_u8* __restrict__ aq, float* __restrict__ Y,
                                         qk_i64 M, qk_i64 N, qk_i64 nb) {
    kf_prior_wait wait;
    kf2_rows<KIND, TS, MT, UNROLL>(W, aq, Y, M, N, nb, (qk_i64)blockIdx.x * MT, (qk_i64)blockIdx.y * KF_ROWS, wait);
}
#define KF_GEMV_Q45(NAME, KIND, TS, MT, UNROLL, UNROLL2) kf2_gemv<KIND, TS, MT, UNROLL2>
#else
#define KF_GEMV_Q45(NAME, KIND, TS, MT, UNROLL, UNROLL2) kf_gemv<KIND, TS, MT, UNROLL>
#endif

/* (type, KIND, type size) x MT activation rows per CTA */
#define KF_GEMV(NAME, KIND, TS, MT, UNROLL, FN)                                                        \
    extern "C" __global__ void __launch_bounds__(32 * KF_GROUPS) qk_kq_fast_##NAME##_m##MT(          \
        const qk_u8* W, const qk_u8* aq, float* Y, qk_i64 M, qk_i64 N, qk_i64 nb) {                  \
        KF_WAIT_AT_ENTRY(); /* launched as a dependent of the activations' quantize */                \
        FN(W, aq, Y, M, N, nb);                                                                       \
    }
/* UNROLL: round 1's blocks in flight per thread; UNROLL2: round 2's steps of 4 rows (Q4_K / Q5_K) */
#define KF_GEMV_ALL(MT, UNROLL, UNROLL2)                                                        \
    KF_GEMV(q4_k, 4, 144, MT, UNROLL, KF_GEMV_Q45(q4_k, 4, 144, MT, UNROLL, UNROLL2))           \
    KF_GEMV(q5_k, 5, 176, MT, UNROLL, KF_GEMV_Q45(q5_k, 5, 176, MT, UNROLL, UNROLL2))           \
    KF_GEMV(q6_k, 6, 210, MT, UNROLL, (kf_gemv<6, 210, MT, UNROLL>))                            \
    KF_GEMV(q8_0, 0, 34, MT, UNROLL, (kf_gemv<0, 34, MT, UNROLL>))

#ifndef QK_KF_STEPS_M1
#define QK_KF_STEPS_M1 1 /* round 2: steps in flight a thread at M tile 1 (one since session 41: faster than two on every
                          * layer timed, docs/perf-notes.md; ptxas then sinks loads); the two launches' kernel
                          * since session 44 (the one launch: kf_roll_rows) */
#endif
KF_GEMV_ALL(1, 4, QK_KF_STEPS_M1)
KF_GEMV_ALL(2, 2, 1)
KF_GEMV_ALL(4, 1, 1)

/* Q6_K and Q8_0 at M tile 1 with the weights in shared memory (session 41): qk_kq_bulk_<t>(W, aq, Y, M,
 * N, nb), M = 1, for W 16-byte aligned and nb a multiple of 8 (each row then 16-byte aligned: 210 nb or
 * 34 nb bytes; the launcher's condition, else qk_kq_fast_<t>_m1). The resident CTAs take the row groups
 * c, c + C, ... (C = gridDim.x); a row group's blocks come in stages of KB_CB blocks of each of its 4
 * rows (16 Q6_K blocks, 64 Q8_0 ones; the last stage of a row nb % KB_CB blocks, a multiple of 8, so
 * every copy is a multiple of 16 bytes), row rr's part at rr * cnt * type size in the stage. On sm_90
 * thread 0 has the bulk copy engine bring the stages KB_S - 1 ahead into a ring (qk_bulk.h: one mbarrier
 * a slot; the CTA barrier after a stage's sums frees its slot), the first ones before the wait for the
 * activations' quantize (the weights need nothing of it), so no register holds a weight in flight;
 * elsewhere (AMD, the host stand-ins) all threads copy each stage with 16-byte loads into one slot, then
 * a barrier. A thread takes slice c = t % SL of the stage's block column kc = t / SL (SL the slices of a
 * block: Q6_K 8, Q8_0 2) for all 4 rows: one activation part for the 4 rows, each row's slice read back
 * from the stage as the staged kernel reads it (kf_unstage_q6_k; kf_raw16), the terms kf_block's. A
 * thread adds its columns' terms stage by stage, then xor shuffles over the warp and kf_store's warp
 * order. Rows past N copy row N - 1 and are never stored. Q6_K's call is one launch (qk_kq_one_bulk_q6_k,
 * below) unless bench-only -DQK_KF_TWO_LAUNCH. Bench-only -DQK_KF_BULK_STAGES=S: S slots
 * (default 3); -DQK_KF_STAGED: no such kernels (M = 1 as before, qk_kq_fast_<t>_m1). Measured against
 * qk_kq_fast_<t>_m1: docs/perf-notes.md, session 41. */
#include "qk_bulk.h"
#ifndef QK_KF_BULK_STAGES
#define QK_KF_BULK_STAGES 3 /* ring slots (sm_90) */
#endif
#define KB_S (QK_BULK ? QK_KF_BULK_STAGES : 1)
#define KB_SL(KIND) ((KIND) == 6 ? 8 : 2) /* slices a block */
#define KB_CB(KIND) (32 * KF_GROUPS / KB_SL(KIND)) /* blocks of each row a stage: a column a thread group */

/* a stage of the CTA's sequence: its row group's first row, its first block and blocks of each row; the
 * rows between its row groups */
template <int CB>
struct kb_stage_at {
    qk_i64 n0, step;
    int k0, cnt;
    __device__ __forceinline__ void set_cnt(int nb) { cnt = nb - k0 < CB ? nb - k0 : CB; }
    __device__ __forceinline__ void next(int nb) { /* the stage after it */
        k0 += CB;
        if (k0 >= nb) {
            k0 = 0;
            n0 += step;
        }
        set_cnt(nb);
    }
};

/* the stage's 4 row parts into dst (each cnt * TS bytes, rows past N row N - 1's) */
template <int TS, int CB>
__device__ __forceinline__ void kb_fetch(qk_u8* dst, const qk_u8* W, const kb_stage_at<CB>& a, qk_i64 N, int nb,
                                         unsigned long long* bar) {
    const qk_u32 bytes = (qk_u32)a.cnt * TS;
#if QK_BULK
    qk_mbar_expect(qk_smem_addr(bar), KF_ROWS * bytes);
#pragma unroll
    for (int rr = 0; rr < KF_ROWS; ++rr) {
        const qk_i64 n = a.n0 + rr < N ? a.n0 + rr : N - 1;
        qk_bulk_copy(qk_smem_addr(dst + rr * bytes), W + (n * nb + a.k0) * TS, bytes, qk_smem_addr(bar));
    }
#else
    (void)bar;
    for (int rr = 0; rr < KF_ROWS; ++rr) {
        const qk_i64 n = a.n0 + rr < N ? a.n0 + rr : N - 1;
        const uint4* src = (const uint4*)(W + (n * nb + a.k0) * TS);
        uint4* d = (uint4*)(dst + rr * bytes);
        for (int i = threadIdx.x; i < (int)(bytes / 16); i += 32 * KF_GROUPS) d[i] = src[i];
    }
#endif
}

/* slice c of block column kc of the stage st (cnt blocks a row) for the 4 rows against the activation
 * block a (Q8_K as quantized; Q8_0 as qk_q8_0_quant_words writes it), added to acc */
template <int KIND, int TS>
__device__ __forceinline__ void kb_terms(const qk_u8* st, int cnt, int kc, int c, const qk_u8* a, float (&acc)[KF_ROWS]) {
    if (KIND == 6) {
        const kf_q6_a av = kf_q6_act(a, c);
#pragma unroll
        for (int rr = 0; rr < KF_ROWS; ++rr) {
            const qk_u8* blk = st + (rr * cnt + kc) * TS;
            const int mis = (int)((unsigned long long)blk & 2u);
            qk_u32 raw[KF_WR(6)];
            kf_unstage_q6_k(blk, c, (const qk_u32*)(blk - mis), raw);
            acc[rr] = kf_q6_term(kf_q6_unpack(raw, blk, c), av, acc[rr]);
        }
    } else {
        const uint4 av = *(const uint4*)(a + 16 * c);
        const qk_u32 aw[4] = {av.x, av.y, av.z, av.w};
        const float yd = qk_float(((const qk_u32*)a)[8]);
#pragma unroll
        for (int rr = 0; rr < KF_ROWS; ++rr) {
            const qk_u8* blk = st + (rr * cnt + kc) * TS;
            qk_u32 raw[5], q[4];
            kf_raw16(blk + 2 + 16 * c, raw);
            kf_align16(raw, blk + 2 + 16 * c, q);
            const float dx = qk_fp16_to_float(*(const qk_u16*)blk);
            acc[rr] = fmaf(QK_FMUL(dx, yd), __int2float_rn(kf_dot4(q, aw)), acc[rr]);
        }
    }
}

/* the row groups c, c + C, ... (c = cta, C = ctas); wait(): before the first activation read;
 * wait.copies_after(): whether the first stages' copies come after it (bench-only
 * -DQK_KF_FIRST_AFTER_WAIT: 1 every CTA, 3 those on a quantizing CTA's SM) */
template <int KIND, int TS, class Wait>
__device__ __forceinline__ void kf_bulk_gemv(const qk_u8* __restrict__ W, const qk_u8* __restrict__ aq, float* __restrict__ Y,
                                             qk_i64 N, int nb, qk_i64 cta, qk_i64 ctas, const Wait& wait) {
    constexpr int SL = KB_SL(KIND), CB = KB_CB(KIND), AW = KIND == 0 ? KF_A0 : KF_Q8K;
    __shared__ __align__(16) qk_u8 ring[KB_S][KF_ROWS * CB * TS];
    __shared__ unsigned long long bar[KB_S]; /* mbarriers (sm_90) */
    __shared__ float part[KF_GROUPS][KF_ROWS][1];
    const int t = threadIdx.x, w = t >> 5, c = t % SL, kc = t / SL;
    kb_stage_at<CB> a{cta * KF_ROWS, ctas * KF_ROWS, 0, 0}; /* the stage being summed */
    a.set_cnt(nb);
    QK_PHASE(10);
    QK_PHASE_SM(KF_SM_SLOT);
#if QK_BULK
    kb_stage_at<CB> f = a; /* the next stage to fetch */
    int fslot = 0;
    if (t == 0) {
        for (int u = 0; u < KB_S; ++u) qk_mbar_init(qk_smem_addr(&bar[u]));
        qk_mbar_init_fence();
    }
/* the first KB_S - 1 stages' copies (thread 0); a macro, not a lambda: the lambda moves the default SASS */
#define KB_FIRST_FETCHES()                                                                    \
    for (int u = 0; u < KB_S - 1; ++u, f.next(nb), fslot = fslot + 1 == KB_S ? 0 : fslot + 1) \
        if (t == 0 && f.n0 < N) kb_fetch<TS>(ring[fslot], W, f, N, nb, &bar[fslot])
#if defined(QK_KF_FIRST_AFTER_WAIT)
    const bool after = wait.copies_after(); /* CTA-uniform */
    if (!after)
#endif
        KB_FIRST_FETCHES();
#endif
    wait();
    __syncthreads(); /* the barriers' inits (sm_90) */
#if QK_BULK && defined(QK_KF_FIRST_AFTER_WAIT)
    if (after) KB_FIRST_FETCHES();
#endif
#undef KB_FIRST_FETCHES
    QK_PHASE(11);
    float acc[KF_ROWS] = {0.0f, 0.0f, 0.0f, 0.0f};
    int slot = 0, parity = 0;
    for (; a.n0 < N; a.next(nb)) {
        qk_u8* st = ring[slot];
#if QK_BULK
        if (t == 0 && f.n0 < N) kb_fetch<TS>(ring[fslot], W, f, N, nb, &bar[fslot]); /* the slot stage - 1 freed */
        f.next(nb);
        fslot = fslot + 1 == KB_S ? 0 : fslot + 1;
        qk_mbar_wait(qk_smem_addr(&bar[slot]), parity);
#else
        (void)parity;
        kb_fetch<TS>(st, W, a, N, nb, bar);
        __syncthreads();
#endif
        if (a.n0 == cta * KF_ROWS && a.k0 == 0) QK_PHASE(12);
        if (kc < a.cnt) kb_terms<KIND, TS>(st, a.cnt, kc, c, aq + (a.k0 + kc) * AW, acc);
        if (a.k0 + CB >= nb) { /* the row group's last stage: its sums */
            QK_PHASE(13);
#pragma unroll
            for (int rr = 0; rr < KF_ROWS; ++rr) {
                const float v = kf_xor_sum<32>(acc[rr]);
                if ((t & 31) == 0) part[w][rr][0] = v;
                acc[rr] = 0.0f;
            }
            kf_store<1>(part, t, 0, a.n0, 1, N, Y);
            QK_PHASE(14);
        }
        __syncthreads(); /* the stage's slot and the partial sums free */
        if (++slot == KB_S) {
            slot = 0;
            parity ^= 1;
        }
    }
}

struct kb_prior_wait { /* launched as a dependent of the activations' quantize */
    __device__ __forceinline__ void operator()() const { QK_WAIT_PRIOR_GRID(); }
    __device__ __forceinline__ bool copies_after() const { return false; }
};

/* reached through the launcher only (as qk_kq_one_<t>), with the GEMV's arguments (M = 1) */
#define KF_BULK(NAME, KIND, TS)                                                                             \
    extern "C" __global__ void __launch_bounds__(32 * KF_GROUPS)                                            \
        qk_kq_bulk_##NAME(const qk_u8* W, const qk_u8* aq, float* Y, qk_i64 M, qk_i64 N, qk_i64 nb) {       \
        (void)M;                                                                                            \
        kf_bulk_gemv<KIND, TS>(W, aq, Y, N, (int)nb, blockIdx.x, gridDim.x, kb_prior_wait());              \
    }
#ifndef QK_KF_STAGED /* bench-only: without them, so the launcher takes qk_kq_fast_<t>_m1 at M = 1 */
KF_BULK(q6_k, 6, 210)
KF_BULK(q8_0, 0, 34)
#endif

#if !defined(QK_KF_TWO_LAUNCH) && !defined(QK_KQ_FAST_V1) /* round 1 (-DQK_KQ_FAST_V1) has no kf2_rows */
/* Q4_K / Q5_K at M = 1 in one launch (session 40; bench-only -DQK_KF_TWO_LAUNCH leaves it out, and the
 * launcher then makes the call as the quantize and qk_kq_fast_<t>_m1): qk_kq_one_<t>(X, W, Y, N, nb,
 * act, count). CTAs 0 .. P - 1 (P = ceil(nb / 4)) quantize the fp32 activation row X to Q8_K, a warp a
 * super-block by qk_q8_k_quant_w32's arithmetic (q8_quant.hip qk_q8_k_block_lanes<32>: the same
 * bytes), into the launcher's global act (nb rounded up to 4 blocks of 292 bytes; the warps past nb
 * quantize zeros into the spare slots), make them visible (__threadfence) and count themselves in
 * count[0]. They wait on nothing, and the launcher's grid is no more than the CTAs resident at once,
 * lower blockIdx dispatched first, so the others' wait ends. The other CTAs take the row groups c, c +
 * C, ... (c = blockIdx.x - P, C = gridDim.x - P) as one stream of trips (kf_roll_rows, since session
 * 44), each waiting for count[0] = P after its first row group's first weight loads (where every thread
 * has a first trip, nb >= 16; else before them) -- kf2_gemv's arithmetic on the same bytes, so the two
 * launches' bits. The last of them to finish (count[1], a ticket) zeroes both counts for the next call
 * (the launcher's per-stream buffer, as GQA's folded combine's tickets). A wait that outlasts KF_POLLS polls (seconds: producers that
 * never ran) traps instead of hanging. Measured against the two launches: docs/perf-notes.md, session 40. */
#include "ggml/q8_quant.hip" /* qk_q8_k_block_lanes, QK_K (its kernels come along, unused) */
#define KF_PASS KF_GROUPS  /* super-blocks a producer CTA: a warp each */
#define KF_SM_TICKETS 3     /* -DQK_KF_FIRST_AFTER_WAIT=3: quantizing CTA p's SM + 1 in count[3 + p] */

/* the SM this CTA runs on (CUDA %smid; 0 elsewhere) */
__device__ __forceinline__ unsigned kf_smid() {
    unsigned id = 0u;
#if defined(QK_CUDA)
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
#endif
    return id;
}
#define KF_POLLS (1u << 26) /* polls of count[0] before a waiting CTA traps */

/* producer p: super-blocks p * KF_PASS .. of X into act's slots, lane l of a warp its float4s 32 k + l */
__device__ __forceinline__ void kf_quantize_pass(const float* __restrict__ X, qk_u8* act, qk_i64 nb, qk_i64 p) {
    const int l = threadIdx.x & 31;
    const qk_i64 ib = p * KF_PASS + threadIdx.x / 32;
    const float4* x4 = (const float4*)X;
    float4 v[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) v[k] = ib < nb ? x4[ib * (QK_K / 4) + 32 * k + l] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    QK_PHASE_AFTER(6, qk_bits(v[0].x));
    qk_q8_k_block_lanes<32>(v, l, act, (int)ib);
}

/* *at once it is at least v (KF_POLLS polls, then a trap), its value then */
__device__ __forceinline__ unsigned kf_poll_at_least(const unsigned* at, unsigned v) {
    unsigned polls = 0u, got;
    while ((got = *(const volatile unsigned*)at) < v)
        if (++polls == KF_POLLS) QK_TRAP();
    return got;
}

__device__ __forceinline__ void kf_wait_published(const unsigned* count, unsigned producers) {
    if (threadIdx.x == 0) {
        kf_poll_at_least(count, producers);
        __threadfence();
    }
    __syncthreads();
}

#if defined(QK_KF_FIRST_AFTER_WAIT)
/* whether a quantizing CTA runs on this CTA's SM: thread 0 polls their SM tickets until each is
 * published (a HIP or host build: every CTA on "SM 0", so every CTA waits first); CTA-uniform */
__device__ __forceinline__ bool kf_on_a_producer_sm(const unsigned* count, unsigned producers) {
    __shared__ unsigned near;
    if (threadIdx.x == 0) {
        const unsigned me = kf_smid() + 1u;
        unsigned hit = 0u;
        for (unsigned p = 0; p < producers; ++p) hit |= kf_poll_at_least(count + KF_SM_TICKETS + p, 1u) == me;
        near = hit;
    }
    __syncthreads();
    return near != 0u;
}
#endif

/* Before its wait, a CTA asks L2 for the weights of its next KF_PREFETCH row groups (bytes [from, end) of
 * W: the rows n0 + C * 4 .., C the row-group CTAs), 128-byte lines (CUDA; no-op elsewhere) -- where
 * 16 <= nb < KF_PREFETCH_BELOW, which since session 41 is no row length: with one step in flight a
 * thread, running it (below 32, session 40's threshold) cost 1.5-1.9 us on 4096 x 14336, while the build
 * without its code (bench-only -DQK_KF_ONE_PREFETCH=0) is 0.6-0.9 us slower on 8192 x 8192 (ptxas
 * schedules the row-group loop otherwise; docs/perf-notes.md session 41): the code stays, unrun. */
#ifndef QK_KF_ONE_PREFETCH
#define QK_KF_ONE_PREFETCH 1
#endif
#define KF_PREFETCH QK_KF_ONE_PREFETCH
#define KF_PREFETCH_BELOW 16
__device__ __forceinline__ void kf_prefetch_l2(const qk_u8* p) {
#if defined(QK_CUDA)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
    (void)p;
#endif
}

/* kf_roll_rows' call after a thread's first loads: the wait, where todo; before it
 * the prefetch of PF row groups (where nb < KF_PREFETCH_BELOW) */
template <int PF>
struct kf_wait_once {
    const unsigned* count;
    unsigned producers;
    bool todo;
    const qk_u8* W;
    qk_i64 group_bytes, stride_bytes, end; /* a row group's bytes, the CTA's step between its groups, W's */
    qk_i64 from;                           /* the CTA's first group's first byte */
    qk_i64 row_block;                      /* a weight block's bytes */
#if defined(QK_KF_FIRST_AFTER_WAIT)
    __device__ __forceinline__ bool on_a_producer_sm() const { return kf_on_a_producer_sm(count, producers); }
#endif
    __device__ __forceinline__ void operator()(bool first) {
        if (first && todo) {
            todo = false;
            for (int g = 1; g <= PF && group_bytes < (qk_i64)KF_ROWS * KF_PREFETCH_BELOW * row_block; ++g)
                for (qk_i64 o = from + g * stride_bytes + 128 * (qk_i64)threadIdx.x; o < from + g * stride_bytes + group_bytes && o < end;
                     o += 128 * 32 * KF_GROUPS)
                    kf_prefetch_l2(W + o);
            kf_wait_published(count, producers);
        }
    }
};

/* a one-launch kernel's quantizing CTAs (the first kf_producers<KIND>(nb)): the row into act (Q8_K
 * blocks, KF_PASS a CTA; KIND 0: Q8_0 as qk_q8_0_quant_words writes them, 64 blocks a CTA, 2 lanes a
 * block), then counted in count[0]; true where this CTA is one of them */
#define KF_PASS_Q8_0 (32 * KF_GROUPS / 2)
template <int KIND>
__device__ __forceinline__ bool kf_produce(const float* __restrict__ X, qk_u8* act, qk_i64 nb, unsigned* count, unsigned producers) {
    if (blockIdx.x >= producers) return false;
    QK_PHASE(5);
    QK_PHASE_SM(KF_SM_SLOT);
#if defined(QK_KF_FIRST_AFTER_WAIT) && QK_KF_FIRST_AFTER_WAIT == 3
    if (threadIdx.x == 0) atomicExch(count + KF_SM_TICKETS + blockIdx.x, kf_smid() + 1u);
#endif
    if (KIND == 0) {
        qk_q8_0_words_lane(X, (qk_u32*)act, (qk_i64)blockIdx.x * KF_PASS_Q8_0 + threadIdx.x / 2, (int)(threadIdx.x & 1), nb);
    } else {
        kf_quantize_pass(X, act, nb, blockIdx.x);
    }
    QK_PHASE(7);
    __threadfence(); /* this thread's bytes before the count */
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(count, 1u);
    QK_PHASE(8);
    return true;
}

/* a one-launch kernel's row-group CTA done: the last of the consumers zeroes both counts (and the
 * bench-only -DQK_KF_FIRST_AFTER_WAIT=3's SM tickets) for the next call */
__device__ __forceinline__ void kf_consumed(unsigned* count, qk_i64 consumers, unsigned producers) {
    if (threadIdx.x == 0 && atomicAdd(count + 1, 1u) == (unsigned)consumers - 1u) { /* every consumer is past its wait */
        atomicExch(count, 0u);
        atomicExch(count + 1, 0u);
#if defined(QK_KF_FIRST_AFTER_WAIT) && QK_KF_FIRST_AFTER_WAIT == 3
        for (unsigned p = 0; p < producers; ++p) atomicExch(count + KF_SM_TICKETS + p, 0u);
#else
        (void)producers;
#endif
    }
}

template <int KIND>
__device__ __forceinline__ unsigned kf_producers(qk_i64 nb) {
    const int pass = KIND == 0 ? KF_PASS_Q8_0 : KF_PASS;
    return (unsigned)((nb + pass - 1) / pass);
}

/* A one-launch CTA's (session 44) row groups n0, n0 + step, ... as one stream of trips a thread (its
 * block columns kc, kc + 16, ... of each group in turn): row rr's words of the next trip are loaded
 * into its registers as soon as this trip's term of row rr is formed, so a thread has the next trip's
 * loads in flight while it finishes this trip, sums and stores a group, without a second register set.
 * The terms, their order and the sums are kf2_rows' at M tile 1: the same bits. (ptxas issues the next
 * trip's loads after this trip's dots, so they fly over the sums, the store, the barriers and the next
 * trip's activation reads. Measured against kf2_rows a group at a time: docs/perf-notes.md, session 44.
 * Each CTA's groups after its first taken from a count instead, on this kernel and on the bulk one, were
 * measured slower and taken out: docs/perf-notes.md, session 49.) */
template <int KIND, int TS, class AfterLoads>
__device__ __forceinline__ void kf_roll_rows(const qk_u8* __restrict__ W, const qk_u8* __restrict__ aq, float* __restrict__ Y,
                                             qk_i64 N, qk_i64 nb, qk_i64 n0, qk_i64 step, AfterLoads& after_loads) {
    constexpr int COLS = 4 * KF_GROUPS;
    __shared__ float part[KF_GROUPS][KF_ROWS][1];
    const int t = threadIdx.x, w = t >> 5, c = t & 7, kc = t >> 3, g = c >> 1, half = c & 1;
    qk_u32 raw[KF_ROWS][KF_WR(KIND)];
    QK_PHASE(0);
    QK_PHASE_SM(KF_SM_SLOT);
#if defined(QK_KF_FIRST_AFTER_WAIT)
    /* bench-only diagnostic: the first trip's words loaded after the wait, by every CTA (1) or by those
     * on an SM that a quantizing CTA published (3), so that no weight load waits in those SMs' queues
     * ahead of the quantize (session 47's 2, a guess at those CTAs by index, named none of them and is
     * taken out: docs/perf-notes.md, session 48) */
    if (QK_KF_FIRST_AFTER_WAIT == 1 || after_loads.on_a_producer_sm()) after_loads(true);
#endif
    if (kc < nb && n0 < N)
#pragma unroll
        for (int rr = 0; rr < KF_ROWS; ++rr) kf_wload<KIND>(W + ((n0 + rr < N ? n0 + rr : N - 1) * nb + kc) * TS, c, raw[rr]);
    after_loads(true); /* once: a no-op where the wait came first */
    QK_PHASE(1);
    QK_PHASE_AFTER(2, raw[0][4]);
    for (; n0 < N; n0 += step) {
        const qk_i64 n_after = n0 + step;
        float acc[KF_ROWS];
#pragma unroll
        for (int rr = 0; rr < KF_ROWS; ++rr) acc[rr] = 0.0f;
        for (qk_i64 ib = kc; ib < nb; ib += COLS) {
            const bool same = ib + COLS < nb; /* the next trip: this group's next column, else the next group's first */
            const qk_i64 nn = same ? n0 : n_after, nib = same ? ib + COLS : kc;
            const qk_u8* a = aq + ib * KF_Q8K;
            qk_u32 alo[4], ahi[4];
            kf_act16(a + 4 + 64 * g + 16 * half, alo);
            kf_act16(a + 4 + 64 * g + 32 + 16 * half, ahi);
            const qk_u32* bs = (const qk_u32*)(a + 260 + 8 * g);
            const qk_u32 bs0 = bs[0], bs1 = bs[1];
            const float yd = *(const float*)a;
#pragma unroll
            for (int rr = 0; rr < KF_ROWS; ++rr) {
                kf_q45_row<KIND>(raw[rr], c, alo, ahi, bs0, bs1, yd, acc[rr]);
                if (nn < N) kf_wload<KIND>(W + ((nn + rr < N ? nn + rr : N - 1) * nb + nib) * TS, c, raw[rr]);
            }
        }
        QK_PHASE(3);
#pragma unroll
        for (int rr = 0; rr < KF_ROWS; ++rr) {
            const float v = kf_xor_sum<32>(acc[rr]);
            if ((t & 31) == 0) part[w][rr][0] = v;
        }
        kf_store<1>(part, t, 0, n0, 1, N, Y);
        QK_PHASE(4);
        __syncthreads(); /* kf_store's reads of the partial sums before the next group writes them */
    }
}

template <int KIND, int TS, int PF>
__device__ __forceinline__ void kf_one_gemv(const float* __restrict__ X, const qk_u8* __restrict__ W, float* __restrict__ Y,
                                            qk_i64 N, qk_i64 nb, qk_u8* act, unsigned* count) {
    const unsigned producers = kf_producers<KIND>(nb);
    if (kf_produce<KIND>(X, act, nb, count, producers)) return;
    const qk_i64 c = blockIdx.x - producers, consumers = gridDim.x - producers;
    const qk_i64 group_bytes = KF_ROWS * nb * TS;
    /* every thread a first trip where nb >= 16: the same call */
    kf_wait_once<PF> after{count, producers, nb >= 4 * KF_GROUPS, W, group_bytes, consumers * group_bytes, N * nb * TS, c * group_bytes, TS};
    if (!after.todo) kf_wait_published(count, producers);
    kf_roll_rows<KIND, TS>(W, act, Y, N, nb, c * KF_ROWS, consumers * KF_ROWS, after);
    kf_consumed(count, consumers, producers);
}

#define KF_ONE(NAME, KIND, TS, PF)                                                                                 \
    extern "C" __global__ void __launch_bounds__(32 * KF_GROUPS) qk_kq_one_##NAME(                                \
        const float* X, const qk_u8* W, float* Y, qk_i64 N, qk_i64 nb, qk_u8* act, unsigned* count) {             \
        QK_WAIT_PRIOR_GRID(); /* launched as a programmatic dependent of the kernel before: X may be its output */ \
        kf_one_gemv<KIND, TS, PF>(X, W, Y, N, nb, act, count);                                                     \
    }
KF_ONE(q4_k, 4, 144, KF_PREFETCH)
KF_ONE(q5_k, 5, 176, KF_PREFETCH)

#ifndef QK_KF_STAGED
/* Q6_K (session 41) and Q8_0 (session 42) at M = 1 in one launch on the bulk kernel's ring,
 * qk_kq_one_bulk_<t>(X, W, Y, N, nb, act, count), where qk_kq_bulk_<t> would take the call: the first
 * kf_producers<KIND>(nb) CTAs quantize the row (kf_produce: Q6_K's Q8_K as qk_kq_one_<t>'s do, Q8_0's
 * words), the others take the row groups as qk_kq_bulk_<t>'s CTAs, waiting for the count
 * after their first stages' copies are issued; the last of them zeroes the counts. The same bits as the
 * two launches (bench-only -DQK_KF_TWO_LAUNCH). (Q4_K and Q5_K on this ring in one launch were measured
 * slower than qk_kq_one_<t>: docs/perf-notes.md, session 41.) */
struct kb_published_wait {
    const unsigned* count;
    unsigned producers;
    __device__ __forceinline__ void operator()() const { kf_wait_published(count, producers); }
    __device__ __forceinline__ bool copies_after() const {
#if defined(QK_KF_FIRST_AFTER_WAIT)
        return QK_KF_FIRST_AFTER_WAIT == 1 || kf_on_a_producer_sm(count, producers);
#else
        return false;
#endif
    }
};

#define KF_ONE_BULK(NAME, KIND, TS)                                                                                    \
    extern "C" __global__ void __launch_bounds__(32 * KF_GROUPS) qk_kq_one_bulk_##NAME(                                \
        const float* X, const qk_u8* W, float* Y, qk_i64 N, qk_i64 nb, qk_u8* act, unsigned* count) {                  \
        QK_WAIT_PRIOR_GRID(); /* launched as a programmatic dependent of the kernel before: X may be its output */     \
        const unsigned producers = kf_producers<KIND>(nb);                                                             \
        if (kf_produce<KIND>(X, act, nb, count, producers)) return;                                                    \
        const qk_i64 consumers = gridDim.x - producers;                                                                \
        kf_bulk_gemv<KIND, TS>(W, act, Y, N, (int)nb, blockIdx.x - producers, consumers,                               \
                               kb_published_wait{count, producers});                                                   \
        kf_consumed(count, consumers, producers);                                                                      \
    }
KF_ONE_BULK(q6_k, 6, 210)
KF_ONE_BULK(q8_0, 0, 34)
#endif
#endif

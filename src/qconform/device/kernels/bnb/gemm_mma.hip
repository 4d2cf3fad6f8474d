/* bitsandbytes 4-bit family: gemm_4bit's default (cpu) reading on the matrix units, fp16 / bf16
 * activations, M <= 16 tokens: C[m, n] = T(sum_k A[m, k] * w[n, k] + bias[n]).
 *
 * Semantics: qconform.ops.bnb.gemm (variant cpu, the suite's default contract), facts
 * docs/bnb-4bit.md 5.2. Upstream (bitsandbytes-foundation/bitsandbytes): bitsandbytes/backends/
 * default/ops.py _gemm_4bit_default_impl (dequantize_4bit to A's dtype T, then F.linear) and the
 * sm80 MMA path of csrc/kernels.cu; the weights as qconform.oracles.bnb.dequantize_4bit (variant
 * cpu) rounds them: w = T(fl32(code[q] * absmax[block])), one rounding to T (RNE, no flush), the
 * native table (FP4 code 8 is -0, which only signs a zero product). Products of two T values are
 * exact in fp32 (the tensor core's), the sums fp32 in the hardware's order, the bias added in fp32,
 * C rounded once to T: the reading's "fp32 sums in any order", checked within the op's bound.
 *
 * Geometry (qconform.device.bnb.gemm, symbols qk_gemm_4bit_mma_n{1,2}, _n1_r1): a CTA of 8 warps
 * takes a tile of 16 RT weight rows (RT 16-row tiles, n0 = 16 (RT tile + rt); tiles stride over the
 * grid) and splits K among its warps in steps of 128: warp w takes the steps w, w + 8, ... A step
 * takes all RT 16-row tiles against the same activation fragments. Per step and 16-row tile a lane
 * (g = lane / 4, t = lane % 4) loads 16 bytes (32 values, k = 128 s + 32 t ..) of rows n0 + g and
 * n0 + g + 8 with their two absmax (K % blocksize == 0 and blocksize >= 32: the 32 values share one
 * block), 4 steps (n2: 3; RT 2: 2) ahead in registers. mma.sync m16n8k16 takes the weight rows as
 * its 16 rows and the tokens as its 8 columns (n-tile 1: tokens 0..7, n-tile 2: tokens 8..15). The sums run over k in any order, so
 * the k axis of mma i (0..7) of a step is permuted: its logical columns 2t, 2t + 1 are the lane's
 * values 4i, 4i + 1 (byte 2i of its 16: the weight pair in one byte, element 2j in the high nibble)
 * and 2t + 8, 2t + 9 the values 4i + 2, 4i + 3 (byte 2i + 1); so B's fragment is the lane's 4
 * consecutive activations of token g at 128 s + 32 t + 4 i: 8 bytes of A, as loaded.
 * A byte of W decodes to its T pair through a shared table of the 256 bytes' centroid pairs
 * (float2 (code[hi], code[lo]); lane l reads copy l % QK_BNBM_COPIES, so the lanes of a half-warp
 * never conflict: 32 copies and 64 KiB on CUDA, 16 and 32 KiB elsewhere, QK_BNBM_COPIES below), two
 * fp32 multiplies by the block's absmax and one packed conversion to T.
 * The warps' 16 x 8 fp32 partials meet in shared memory and one thread per output adds them in warp
 * order, then the bias: a fixed order, so repeated calls are bit-identical (no atomics).
 * K must be a multiple of 32 (the 16-byte loads) and of blocksize (the launcher declines others);
 * A and B 16-byte aligned; blockDim.x == 256.
 * -DQK_BNBM_NO_TABLE_READS (bench-only diagnostic, CUDA's 32-copy table only, wrong outputs): each
 * pair's table read replaced by its offset's bits as two floats, the rest of the arithmetic kept: the
 * time without the table's shared-memory traffic (measured in docs/perf-notes.md, session 45).
 * -DQK_BNBM_LOADS_ONLY (bench-only diagnostic, wrong outputs): each step's weight, scale and activation
 * loads kept and folded by XOR into one partial, with no decode and no mma: the time of the kernel's
 * loads, ring, reductions and stores alone, against the read-only roofline.
 * -DQK_BNB_CPU_SIMT: the session-8 build, this file empty: the launcher (CPU_SIMT_OPTION) runs the
 * cpu reading on bnb/gemm_simt.hip's qk_gemm_4bit_m<MT> instead (the bench's old variant, the
 * device suite's control), and a launch of the mma symbols would fail to load. */
#if !defined(QK_BNB_CPU_SIMT)
#include "qk_portable.h"

#include "qconform_abi.h" /* the enum codes, generated from the catalogue */

#include "gemm_common.h" /* the centroid tables, qk_gemm_bf16_bits, qk_bnb_pair_at, qk_bnb_weights */

#define QK_BNBM_WARPS 8    /* warps per CTA (the launcher's THREADS / 32) */
#define QK_BNBM_STEP 128   /* K values per warp step: 4 lanes x 32 */
/* copies of the pair table: on CUDA 32 in dynamic shared memory (64 KiB, byte e's copy c at 256 e + 8 c:
 * a byte's offset is one PRMT); on HIP (64 KiB of LDS a work-group) and under -DQK_BNBM_TAB16 16
 * static copies (byte e's copy c at 128 e + 8 c: a shift and a LOP3) */
#if defined(QK_CUDA) && !defined(QK_BNBM_TAB16)
#define QK_BNBM_PRMT
#define QK_BNBM_COPIES 32
#else
#define QK_BNBM_COPIES 16
#endif

/* (lo, hi) rounded to T (nearest even) and packed, lo in the low half */
template <int DT>
__device__ __forceinline__ qk_u32 qk_bnbm_pack(float lo, float hi) {
#if defined(QK_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    qk_u32 d; /* cvt.rn.{f16x2,bf16x2}.f32 d, a, b: a to the upper half, b to the lower */
    if (DT == QCONFORM_DTYPE_FLOAT16) asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    else asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
#else
    if (DT == QCONFORM_DTYPE_FLOAT16) return (qk_u32)qk_fp16_bits(lo) | ((qk_u32)qk_fp16_bits(hi) << 16);
    return (qk_u32)qk_gemm_bf16_bits(lo) | ((qk_u32)qk_gemm_bf16_bits(hi) << 16);
#endif
}

template <int DT>
__device__ __forceinline__ void qk_bnbm_mma(float d[4], const qk_u32 a[4], const qk_u32 b[2]) {
    if (DT == QCONFORM_DTYPE_FLOAT16) qk_mma_16816(d, a, b);
    else qk_mma_16816_bf16(d, a, b);
}

/* byte j (0..3) of w as its T pair (element 2j, the high nibble, in the low half), the block's
 * scale s: T(fl32(code * s)) each */
template <int DT>
__device__ __forceinline__ qk_u32 qk_bnbm_decode(const float2* tab, qk_u32 w, int j, qk_u32 low, float s) {
#if defined(QK_BNBM_PRMT)
    /* byte j of w to byte 1, low (the copy's 8 c < 256) in byte 0: the entry at 256 byte + 8 c */
    const qk_u32 at = __byte_perm(w, low, 0x5504u | ((qk_u32)j << 4));
#if defined(QK_BNBM_NO_TABLE_READS)
    const float2 c = make_float2(qk_float(at), qk_float(at << 8));
#else
    const float2 c = *(const float2*)((const qk_u8*)tab + at);
#endif
#else
    const float2 c = *(const float2*)((const qk_u8*)tab + qk_bnb_pair_at(w, j, low));
#endif
    return qk_bnbm_pack<DT>(QK_FMUL(c.x, s), QK_FMUL(c.y, s));
}

/* one step's loads for a lane: 16 bytes of rows r0 and r1 at k and their absmax; zeros (and a zero
 * scale: no inf * 0 from a zeroed lane) past K or past the last step */
__device__ __forceinline__ void qk_bnbm_load(const qk_u8* B, const float* absmax, qk_i64 r0, qk_i64 r1, qk_i64 K,
                                             qk_i64 k, int bs_shift, uint4 w[2], float sc[2]) {
    if (k < K) {
        w[0] = qk_bnb_weights(B + ((r0 * K + k) >> 1));
        w[1] = qk_bnb_weights(B + ((r1 * K + k) >> 1));
        sc[0] = absmax[(r0 * K + k) >> bs_shift];
        sc[1] = absmax[(r1 * K + k) >> bs_shift];
    } else {
        w[0] = make_uint4(0u, 0u, 0u, 0u);
        w[1] = w[0];
        sc[0] = 0.0f;
        sc[1] = 0.0f;
    }
}

__device__ __forceinline__ qk_u32 qk_bnbm_word(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/* steps of W loaded ahead per warp (registers: 128 at most with __launch_bounds__(256, 2)); RT, the
 * 16-row tiles a step takes: qk_gemm_4bit_mma_n1 / _n2 2, _n1_r1 1 (the launcher's mma_row_tiles) */
template <int NT, int RT>
__device__ __forceinline__ int qk_bnbm_depth() {
    return RT == 2 ? 2 : NT == 1 ? 4 : 3;
}

/* lane rows (g, g + 8) of 16-row tile rt of CTA tile `tile`, clamped to N - 1 (not stored) */
template <int RT>
__device__ __forceinline__ void qk_bnbm_rows(qk_i64 N, qk_i64 tile, int rt, int g, qk_i64& r0, qk_i64& r1) {
    const qk_i64 n0 = 16 * (RT * tile + rt);
    r0 = n0 + g < N ? n0 + g : N - 1;
    r1 = n0 + g + 8 < N ? n0 + g + 8 : N - 1;
}

/* the ring's first steps of a tile: warp w's steps w, w + 8, ... */
template <int NT, int RT>
__device__ __forceinline__ void qk_bnbm_first(const qk_u8* B, const float* absmax, qk_i64 N, qk_i64 K, qk_i64 steps,
                                              qk_i64 tile, int g, int t, int warp, int bs_shift, uint4 wq[4][RT][2],
                                              float sc[4][RT][2]) {
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
        qk_i64 r0, r1;
        qk_bnbm_rows<RT>(N, tile, rt, g, r0, r1);
#pragma unroll
        for (int p = 0; p < qk_bnbm_depth<NT, RT>(); ++p) {
            const qk_i64 s = warp + (qk_i64)p * QK_BNBM_WARPS;
            qk_bnbm_load(B, absmax, r0, r1, s < steps ? K : 0, QK_BNBM_STEP * s + 32 * t, bs_shift, wq[p][rt],
                         sc[p][rt]);
        }
    }
}

/* a step's activations for a lane: token nt * 8 + g, values k + 8 q .. k + 8 q + 7 for q in [Q0, Q1)
 * (zeros past M or K) */
template <int NT, int Q0 = 0, int Q1 = 4>
__device__ __forceinline__ void qk_bnbm_act(const qk_u16* A, qk_i64 M, qk_i64 K, qk_i64 k, int g, uint4 act[NT][4]) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const qk_i64 tok = nt * 8 + g;
#pragma unroll
        for (int q = Q0; q < Q1; ++q)
            act[nt][q] = tok < M && k < K ? *(const uint4*)(A + tok * K + k + 8 * q) : make_uint4(0u, 0u, 0u, 0u);
    }
}

/* one step of a warp: the lane's RT x 2 x 16 bytes of W (decoded here) against NT n-tiles of tokens;
 * -DQK_BNBM_A_AHEAD=P (bench-only, `python -m qconform.bench.bnb_gemv --variants mma`): the step's
 * first P of its 4 activation pieces come loaded a step before (`ahead`), the rest are loaded here;
 * one n-tile of tokens only (qk_bnbm_ahead: n2's ring leaves no registers for them). Measured on an
 * H100 (docs/perf-notes.md, session 33): P = 2 0.7 us faster on 14336 x 4096 at M = 1, 0.3 us slower
 * on 4096 x 14336 (where it spills), so not the default */
#if defined(QK_BNBM_A_AHEAD)
template <int NT>
__device__ constexpr int qk_bnbm_ahead() {
    return NT == 1 ? QK_BNBM_A_AHEAD : 0;
}
#endif

template <int DT, int NT, int RT>
__device__ __forceinline__ void qk_bnbm_step(const qk_u16* A, const float2* tab, qk_i64 M, qk_i64 K, qk_i64 k, int g,
                                             qk_u32 low, const uint4 w[RT][2], const float sc[RT][2],
                                             float d[RT][NT][4]
#if defined(QK_BNBM_A_AHEAD)
                                             ,
                                             const uint4 ahead[NT][4]
#endif
) {
    uint4 act[NT][4];
#if defined(QK_BNBM_A_AHEAD)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int q = 0; q < qk_bnbm_ahead<NT>(); ++q) act[nt][q] = ahead[nt][q];
    qk_bnbm_act<NT, qk_bnbm_ahead<NT>(), 4>(A, M, K, k, g, act);
#else
    qk_bnbm_act<NT>(A, M, K, k, g, act);
#endif
#if defined(QK_BNBM_LOADS_ONLY)
    /* diagnostic: every load of the step kept, folded by XOR into one partial (no table, no scaling, no mma) */
    qk_u32 x = 0u;
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            x ^= w[rt][h].x ^ w[rt][h].y ^ w[rt][h].z ^ w[rt][h].w ^ qk_bits(sc[rt][h]);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int q = 0; q < 4; ++q) x ^= act[nt][q].x ^ act[nt][q].y ^ act[nt][q].z ^ act[nt][q].w;
    d[0][0][0] = QK_FADD(d[0][0][0], qk_float(x & 0x3FFFFFFFu));
#else
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int word = i >> 1, j0 = 2 * (i & 1);
#pragma unroll
        for (int rt = 0; rt < RT; ++rt) {
            const qk_u32 w0 = qk_bnbm_word(w[rt][0], word), w1 = qk_bnbm_word(w[rt][1], word);
            qk_u32 a[4];
            a[0] = qk_bnbm_decode<DT>(tab, w0, j0, low, sc[rt][0]);     /* row g, values 4i, 4i + 1 */
            a[1] = qk_bnbm_decode<DT>(tab, w1, j0, low, sc[rt][1]);     /* row g + 8 */
            a[2] = qk_bnbm_decode<DT>(tab, w0, j0 + 1, low, sc[rt][0]); /* row g, values 4i + 2, 4i + 3 */
            a[3] = qk_bnbm_decode<DT>(tab, w1, j0 + 1, low, sc[rt][1]);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const uint4 v = act[nt][i >> 1];
                const qk_u32 b[2] = {(i & 1) ? v.z : v.x, (i & 1) ? v.w : v.y};
                qk_bnbm_mma<DT>(d[rt][nt], a, b);
            }
        }
    }
#endif
}

/* the pair table of quant_type: every thread's share of the CTA's copies */
__device__ __forceinline__ void qk_bnbm_fill(float2* tab, qk_i64 quant_type) {
    const qk_u32* bits = quant_type == QCONFORM_QUANT_TYPE_NF4 ? QK_GEMM_NF4_BITS : QK_GEMM_FP4_BITS;
    for (int i = (int)threadIdx.x; i < 256 * QK_BNBM_COPIES; i += (int)blockDim.x) {
        const int e = i / QK_BNBM_COPIES; /* byte e: the high nibble is the lower element */
        tab[i] = make_float2(qk_float(bits[e >> 4]), qk_float(bits[e & 15]));
    }
    __syncthreads();
}

/* the tiles: the table is filled here, after the ring's first steps are issued, their loads in flight
 * during the fill; -DQK_BNBM_FILL_FIRST (bench-only, `python -m qconform.bench.bnb_gemv --variants mma`):
 * the caller fills it before any load, session 19's order (the same arithmetic, so the same output bits) */
template <int DT, int NT, int RT>
__device__ __forceinline__ void qk_bnbm_run(const void* A, const qk_u8* B, const float* absmax, const void* bias,
                                            void* C, qk_i64 M, qk_i64 N, qk_i64 K, qk_i64 blocksize,
                                            float2* tab, float* red, qk_i64 quant_type) {
    const int lane = (int)(threadIdx.x & 31), warp = (int)(threadIdx.x >> 5), g = lane >> 2, t = lane & 3;
    const int bs_shift = __ffsll(blocksize) - 1; /* blocksize: a power of two */
    const qk_u32 low = 8u * (qk_u32)(lane & (QK_BNBM_COPIES - 1));
    const qk_i64 tiles = (N + 16 * RT - 1) / (16 * RT), steps = (K + QK_BNBM_STEP - 1) / QK_BNBM_STEP;
    const qk_u16* a16 = (const qk_u16*)A;
    const int depth = qk_bnbm_depth<NT, RT>();
    constexpr int PER = 4 * NT * 32; /* a 16-row tile's partials a warp */
    uint4 wq[4][RT][2];
    float sc[4][RT][2];
    if ((qk_i64)blockIdx.x < tiles) qk_bnbm_first<NT, RT>(B, absmax, N, K, steps, blockIdx.x, g, t, warp, bs_shift, wq, sc);
#if defined(QK_BNBM_A_AHEAD)
    uint4 ahead_act[NT][4]; /* pieces [0, qk_bnbm_ahead<NT>()) of the warp's next step */
    qk_bnbm_act<NT, 0, qk_bnbm_ahead<NT>()>(a16, M, K, QK_BNBM_STEP * warp + 32 * t, g, ahead_act);
#endif
#if !defined(QK_BNBM_FILL_FIRST)
    qk_bnbm_fill(tab, quant_type);
#endif
    for (qk_i64 tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        qk_i64 r0[RT], r1[RT];
#pragma unroll
        for (int rt = 0; rt < RT; ++rt) qk_bnbm_rows<RT>(N, tile, rt, g, r0[rt], r1[rt]);
        float d[RT][NT][4];
#pragma unroll
        for (int rt = 0; rt < RT; ++rt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int r = 0; r < 4; ++r) d[rt][nt][r] = 0.0f;
#pragma unroll 1
        for (qk_i64 s0 = warp; s0 < steps; s0 += depth * QK_BNBM_WARPS) {
#pragma unroll
            for (int p = 0; p < depth; ++p) {
                const qk_i64 s = s0 + (qk_i64)p * QK_BNBM_WARPS; /* the same for the whole warp */
                if (s >= steps) break;
                uint4 w[RT][2];
                float f[RT][2];
                const qk_i64 ahead = s + depth * QK_BNBM_WARPS;
#pragma unroll
                for (int rt = 0; rt < RT; ++rt) {
                    w[rt][0] = wq[p][rt][0];
                    w[rt][1] = wq[p][rt][1];
                    f[rt][0] = sc[p][rt][0];
                    f[rt][1] = sc[p][rt][1];
                    qk_bnbm_load(B, absmax, r0[rt], r1[rt], ahead < steps ? K : 0, QK_BNBM_STEP * ahead + 32 * t,
                                 bs_shift, wq[p][rt], sc[p][rt]);
                }
#if defined(QK_BNBM_A_AHEAD)
                /* this step's first pieces; the warp's next step's (the next tile's first after the last) */
                uint4 now[NT][4];
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int q = 0; q < qk_bnbm_ahead<NT>(); ++q) now[nt][q] = ahead_act[nt][q];
                const qk_i64 next = s + QK_BNBM_WARPS < steps ? s + QK_BNBM_WARPS : (qk_i64)warp;
                qk_bnbm_act<NT, 0, qk_bnbm_ahead<NT>()>(a16, M, K, QK_BNBM_STEP * next + 32 * t, g, ahead_act);
                qk_bnbm_step<DT, NT, RT>(a16, tab, M, K, QK_BNBM_STEP * s + 32 * t, g, low, w, f, d, now);
#else
                qk_bnbm_step<DT, NT, RT>(a16, tab, M, K, QK_BNBM_STEP * s + 32 * t, g, low, w, f, d);
#endif
            }
        }
        /* the next tile's first steps in flight during the reduction (the ring is free: its last
         * loads above were past the steps) */
        if (tile + gridDim.x < tiles)
            qk_bnbm_first<NT, RT>(B, absmax, N, K, steps, tile + gridDim.x, g, t, warp, bs_shift, wq, sc);
        /* the warps' partials: red[warp][rt][4 nt + r][lane], then one thread per output in warp order */
#pragma unroll
        for (int rt = 0; rt < RT; ++rt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int r = 0; r < 4; ++r) red[((warp * RT + rt) * 4 * NT + 4 * nt + r) * 32 + lane] = d[rt][nt][r];
        __syncthreads();
        for (int e = (int)threadIdx.x; e < RT * PER; e += (int)blockDim.x) {
            const int rt = e / PER, l = e & 31, r = (e % PER) >> 5, nt = r >> 2, rr = r & 3;
            const qk_i64 n = 16 * (RT * tile + rt) + (l >> 2) + 8 * (rr >> 1), tok = 8 * nt + 2 * (l & 3) + (rr & 1);
            float v = red[e];
            for (int w = 1; w < QK_BNBM_WARPS; ++w) v = QK_FADD(v, red[w * RT * PER + e]);
            if (n < N && tok < M) {
                const qk_u16* b16 = (const qk_u16*)bias;
                qk_u16* c16 = (qk_u16*)C;
                if (DT == QCONFORM_DTYPE_FLOAT16) {
                    if (bias != 0) v = QK_FADD(v, qk_fp16_to_float(b16[n]));
                    c16[tok * N + n] = qk_fp16_bits(v);
                } else {
                    if (bias != 0) v = QK_FADD(v, qk_float((qk_u32)b16[n] << 16));
                    c16[tok * N + n] = qk_gemm_bf16_bits(v);
                }
            }
        }
        __syncthreads(); /* red is reused by the next tile */
    }
}

/* the CTA's table and tiles (qk_bnbm_run); fp32 A is not this kernel's (the launcher keeps
 * it on the SIMT kernel): nothing is written for it */
template <int NT, int RT>
__device__ __forceinline__ void qk_gemm_4bit_mma(const void* A, const qk_u8* B, const float* absmax, const void* bias,
                                                 void* C, qk_i64 M, qk_i64 N, qk_i64 K, qk_i64 blocksize,
                                                 qk_i64 quant_type, qk_i64 a_dtype) {
#if defined(QK_BNBM_PRMT)
    extern __shared__ float2 qk_bnbm_smem[]; /* the table (64 KiB), then red (the launcher's bytes) */
    float2* tab = qk_bnbm_smem;
    float* red = (float*)(qk_bnbm_smem + 256 * QK_BNBM_COPIES);
#else
    __shared__ float2 tab[256 * QK_BNBM_COPIES];
    __shared__ float red[QK_BNBM_WARPS * RT * 4 * NT * 32];
#endif
#if defined(QK_BNBM_FILL_FIRST)
    qk_bnbm_fill(tab, quant_type);
#endif
    if (a_dtype == QCONFORM_DTYPE_FLOAT16)
        qk_bnbm_run<QCONFORM_DTYPE_FLOAT16, NT, RT>(A, B, absmax, bias, C, M, N, K, blocksize, tab, red, quant_type);
    else if (a_dtype == QCONFORM_DTYPE_BFLOAT16)
        qk_bnbm_run<QCONFORM_DTYPE_BFLOAT16, NT, RT>(A, B, absmax, bias, C, M, N, K, blocksize, tab, red, quant_type);
}

/* n1: M <= 8 (one n-tile of tokens), n2: M <= 16; RT 2, n1_r1 RT 1 */
extern "C" __global__ void __launch_bounds__(256, 2) qk_gemm_4bit_mma_n1(QCONFORM_GEMM_4BIT_PARAMS) {
    qk_gemm_4bit_mma<1, 2>(A, B, absmax, bias, C, M, N, K, blocksize, quant_type, a_dtype);
}
extern "C" __global__ void __launch_bounds__(256, 2) qk_gemm_4bit_mma_n1_r1(QCONFORM_GEMM_4BIT_PARAMS) {
    qk_gemm_4bit_mma<1, 1>(A, B, absmax, bias, C, M, N, K, blocksize, quant_type, a_dtype);
}
extern "C" __global__ void __launch_bounds__(256, 2) qk_gemm_4bit_mma_n2(QCONFORM_GEMM_4BIT_PARAMS) {
    qk_gemm_4bit_mma<2, 2>(A, B, absmax, bias, C, M, N, K, blocksize, quant_type, a_dtype);
}

#endif /* QK_BNB_CPU_SIMT */

/* bitsandbytes 4-bit family: the fused SIMT 4-bit GEMV / small-M GEMM (gemm_4bit),
 * C[m, n] = sum_k A[m, k] * w[n, k] + bias[n], W the packed NF4 / FP4 weight [N, K] (nn.Linear).
 *
 * Semantics: qconform.ops.bnb.gemm (gemm_4bit), facts docs/bnb-4bit.md 5.2. Upstream
 * (bitsandbytes-foundation/bitsandbytes, the commit docs/bnb-4bit.md names): csrc/gemm_4bit_simt.cu
 * gemm_4bit_simt<T, M_BLOCK>. The sums are upstream's: per output 32 lane partials, partial l the
 * sequential sum over the 32-value chunks k0 = 1024 g + 32 l (16 bytes of W, one scale: K %
 * blocksize == 0, so a chunk never straddles a block), then a 32-lane tree (offsets 16, 8, 4, 2, 1),
 * lane 0 stores. A group of 32 lanes (a wave64 holds two: every shuffle has width 32) takes
 * QK_BNB_COLS adjacent columns and MT rows of A: each 16-byte load of W and each decoded weight
 * serve the MT rows, each load of A the QK_BNB_COLS columns; the next chunk's W and scales are
 * loaded before this chunk is summed (the same order). Groups stride over the launch.
 *
 * Two readings, one family of symbols each (the op's declared ABI: qconform abi gemm_4bit):
 * - qk_gemm_4bit_m<MT> (the suite's default contract, bitsandbytes' CPU path / MMA / fallback:
 *   dequantize_4bit to T, then a GEMM with fp32 sums): w = T(fl32(code[q] * absmax)) rounded once,
 *   products exact (fused into the fp32 sums by fmaf, natural order), C = T(sum + bias).
 * - qk_gemm_4bit_simt_m<MT> (--contract variant=cuda: gemm_4bit_simt on CUDA, bit for bit, the
 *   oracle's order "simt", qconform.oracles.bnb.gemm): fp16 / bf16: cen = T(code[q]) (the native
 *   table: FP4 code 8 is -0), b = T(cen * T(absmax)), per pair of values
 *   acc = fl32(acc + fl32(T(a0 * b0) + T(a1 * b1))) in natural order; fp32: b = fl32(code[q] *
 *   absmax) and acc = fmaf(a, b, acc) in the element order 0,4,1,5,2,6,3,7 of each 8; then the
 *   lanes' tree and C = T(fl32(acc + bias)), one rounding (the bias fused, as upstream from 0.50).
 *   fp16 / bf16 pairs as upstream computes them: one byte of W holds a pair (element 2j in the high
 *   nibble), so a shared table of the 256 pairs (T(cen_hi), T(cen_lo)), one copy per lane (no bank
 *   conflicts), gives both centroids with one load; b and the products T(a * b) are packed
 *   multiplies (mul.rn.f16x2 / fma.rn.bf16x2 with -0: one rounding each, as upstream's __hmul2).
 * Every fp32 operation is rounded on its own, never contracted by the compiler, and flushed to zero
 * (inputs and result: PTX .ftz on NVIDIA, what CuPy's -ftz=true build does to __fadd_rn; qk_ftz
 * elsewhere) as bitsandbytes' fast-math build does. fp16 / bf16 products of two T values are exact
 * in fp32, so one rounding to T is RNE of the exact product (a bf16 product below fp32's normal
 * range then flushes in the next fp32 add: no catalogue input comes near).
 * The launcher (qconform.device.bnb.gemm) declines K % blocksize != 0 (bitsandbytes' SIMT kernel
 * needs it; the chunks' 16-byte loads need K % 32 == 0) and checks A and B are 16-byte aligned.
 * -DQK_BNB_GEMM_V1 builds session 7's kernel instead (gemm_simt_v1.h: the bench's old variant).
 * The cpu reading with fp16 / bf16 A and M <= 16 runs on bnb/gemm_mma.hip (session 10) unless the
 * module is built with -DQK_BNB_CPU_SIMT (qconform.device.bnb.gemm.CPU_SIMT_OPTION), which keeps it
 * here: this file's symbols are the same in both builds. */
#include "qk_portable.h"

#include "qconform_abi.h" /* the enum codes, generated from the catalogue */

#if defined(QK_BNB_GEMM_V1)
#include "gemm_simt_v1.h"
#else

#define QK_BNB_GROUP 32    /* lanes per output column */
#define QK_BNB_CHUNK 32    /* values per lane per step: 16 bytes of W */
#define QK_BNB_STRIDE 1024 /* QK_BNB_GROUP * QK_BNB_CHUNK */
#define QK_BNB_COLS 2      /* adjacent output columns per group (the launcher's COLS) */
#define QK_BNB_PAIRS 8192  /* the pair table: 256 bytes x 32 lane copies (32 KiB) */

#include "gemm_common.h" /* the centroid tables, qk_gemm_bf16_bits, qk_bnb_pair_at, qk_bnb_weights */

/* v rounded to the element type DT (nearest even): its bits, and as a float */
template <int DT>
__device__ __forceinline__ qk_u16 qk_gemm_tbits(float v) {
    return DT == QCONFORM_DTYPE_FLOAT16 ? qk_fp16_bits(v) : qk_gemm_bf16_bits(v);
}
template <int DT>
__device__ __forceinline__ float qk_gemm_round(float v) {
    if (DT == QCONFORM_DTYPE_FLOAT16) return qk_fp16_to_float(qk_fp16_bits(v));
    if (DT == QCONFORM_DTYPE_BFLOAT16) return qk_float((qk_u32)qk_gemm_bf16_bits(v) << 16);
    return v;
}

/* the same rounding in the inner loop: one conversion on CUDA (a NaN keeps no payload there, and
 * every use is an fmaf whose NaN result is canonical anyway) */
template <int DT>
__device__ __forceinline__ float qk_bnb_round(float v) {
#if defined(QK_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (DT == QCONFORM_DTYPE_FLOAT16) return __half2float(__float2half_rn(v));
    if (DT == QCONFORM_DTYPE_BFLOAT16) {
        qk_u16 h;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
        return qk_float((qk_u32)h << 16);
    }
    return v;
#else
    return qk_gemm_round<DT>(v);
#endif
}

/* fp32 a + b, a * b, fmaf(a, b, c): one rounding (RNE), subnormal inputs and result flushed */
__device__ __forceinline__ float qk_bnb_add(float a, float b) {
#if defined(QK_CUDA) && defined(__CUDA_ARCH__)
    float d;
    asm("add.rn.ftz.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
#else
    return qk_ftz(QK_FADD(a, b));
#endif
}
__device__ __forceinline__ float qk_bnb_mul(float a, float b) {
#if defined(QK_CUDA) && defined(__CUDA_ARCH__)
    float d;
    asm("mul.rn.ftz.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
#else
    return qk_ftz(QK_FMUL(a, b));
#endif
}
__device__ __forceinline__ float qk_bnb_fma(float a, float b, float c) {
#if defined(QK_CUDA) && defined(__CUDA_ARCH__)
    float d;
    asm("fma.rn.ftz.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(a), "f"(b), "f"(c));
    return d;
#else
    return qk_ftz(__fmaf_rn(a, b, c));
#endif
}

/* the two T values of a packed pair (low half = the lower index) as floats (exact) */
template <int DT>
__device__ __forceinline__ float qk_bnb_lo(qk_u32 w) {
    return DT == QCONFORM_DTYPE_FLOAT16 ? qk_fp16_to_float((qk_u16)w) : qk_float(w << 16);
}
template <int DT>
__device__ __forceinline__ float qk_bnb_hi(qk_u32 w) {
    return DT == QCONFORM_DTYPE_FLOAT16 ? qk_fp16_to_float((qk_u16)(w >> 16)) : qk_float(w & 0xFFFF0000u);
}

/* fl32(lo + hi) of a packed T pair (both widened exactly; fp16 on CUDA: one half-select convert each) */
template <int DT>
__device__ __forceinline__ float qk_bnb_pair_sum(qk_u32 w) {
#if defined(QK_CUDA) && defined(__CUDA_ARCH__)
    if (DT == QCONFORM_DTYPE_FLOAT16) {
        float lo, hi;
        asm("{ .reg .f16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h; }"
            : "=f"(lo), "=f"(hi) : "r"(w));
        return qk_bnb_add(lo, hi);
    }
#endif
    return qk_bnb_add(qk_bnb_lo<DT>(w), qk_bnb_hi<DT>(w));
}

/* T(x * y) per half of two packed T pairs, one rounding each (upstream's __hmul2) */
template <int DT>
__device__ __forceinline__ qk_u32 qk_bnb_mul2(qk_u32 x, qk_u32 y) {
#if defined(QK_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    qk_u32 d;
    if (DT == QCONFORM_DTYPE_FLOAT16) asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(x), "r"(y));
    else asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(x), "r"(y), "r"(0x80008000u));
    return d;
#else
    const qk_u32 lo = qk_gemm_tbits<DT>(QK_FMUL(qk_bnb_lo<DT>(x), qk_bnb_lo<DT>(y)));
    const qk_u32 hi = qk_gemm_tbits<DT>(QK_FMUL(qk_bnb_hi<DT>(x), qk_bnb_hi<DT>(y)));
    return lo | (hi << 16);
#endif
}

/* the 8 values of A from element `at` (a multiple of 8) as floats (exact) */
template <int DT>
__device__ __forceinline__ void qk_gemm_load8(const void* A, qk_i64 at, float a[8]) {
    if (DT == QCONFORM_DTYPE_FLOAT32) {
        const float4 lo = *(const float4*)((const float*)A + at), hi = *(const float4*)((const float*)A + at + 4);
        a[0] = lo.x; a[1] = lo.y; a[2] = lo.z; a[3] = lo.w;
        a[4] = hi.x; a[5] = hi.y; a[6] = hi.z; a[7] = hi.w;
        return;
    }
    const uint4 v = *(const uint4*)((const qk_u16*)A + at);
    const qk_u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        a[2 * j] = qk_bnb_lo<DT>(w[j]);
        a[2 * j + 1] = qk_bnb_hi<DT>(w[j]);
    }
}

__device__ __forceinline__ float qk_gemm_load1(const void* p, qk_i64 i, int dt) {
    if (dt == QCONFORM_DTYPE_FLOAT16) return qk_fp16_to_float(((const qk_u16*)p)[i]);
    if (dt == QCONFORM_DTYPE_BFLOAT16) return qk_float((qk_u32)((const qk_u16*)p)[i] << 16);
    return ((const float*)p)[i];
}

__device__ __forceinline__ void qk_gemm_store(void* C, qk_i64 i, int dt, float v) {
    if (dt == QCONFORM_DTYPE_FLOAT16) ((qk_u16*)C)[i] = qk_fp16_bits(v);
    else if (dt == QCONFORM_DTYPE_BFLOAT16) ((qk_u16*)C)[i] = qk_gemm_bf16_bits(v);
    else ((float*)C)[i] = v;
}

/* the shift of element e's (0..7) nibble in a little-endian word: byte e/2, high nibble first */
__device__ __forceinline__ int qk_gemm_shift(int e) { return 8 * (e >> 1) + ((e & 1) ? 0 : 4); }

/* the nibble at bit `sh` of w times 128, or-ed with `low` (< 128): the byte offset of the centroid
 * table's entry in the copy `low` / 4 */
__device__ __forceinline__ qk_u32 qk_bnb_nibble_at(qk_u32 w, int sh, qk_u32 low) {
    return qk_and_or(sh <= 7 ? w << (7 - sh) : w >> (sh - 7), 0x780u, low);
}

/* one group: columns n0 .. n0 + QK_BNB_COLS - 1 (those below N) of rows row0 .. row0 + MT - 1
 * (those below M). tab: the shared table, entry i's copy for lane l at tab[32 i + l] (the pairs of
 * the fp16 / bf16 SIMT reading, else the 16 float32 centroids) */
template <int DT, int MT, bool SIMT>
__device__ __forceinline__ void qk_gemm_group(const void* A, const qk_u8* B, const float* absmax, const void* bias,
                                              void* C, qk_i64 M, qk_i64 N, qk_i64 K, qk_i64 blocksize, qk_i64 n0,
                                              qk_i64 row0, int lane, const qk_u32* tab) {
    const bool pairs = SIMT && DT != QCONFORM_DTYPE_FLOAT32;
    const qk_u32 lane4 = 4u * (qk_u32)lane;
    const int bs_shift = __ffsll(blocksize) - 1; /* blocksize: a power of two */
    float acc[QK_BNB_COLS][MT];
    qk_i64 wbase[QK_BNB_COLS];
#pragma unroll
    for (int c = 0; c < QK_BNB_COLS; ++c) {
        wbase[c] = (n0 + c < N ? n0 + c : N - 1) * K; /* a column past N reads the last (not stored) */
#pragma unroll
        for (int m = 0; m < MT; ++m) acc[c][m] = 0.0f;
    }
    qk_i64 k0 = (qk_i64)QK_BNB_CHUNK * lane;
    uint4 wq_next[QK_BNB_COLS];
    float scale_next[QK_BNB_COLS];
#pragma unroll
    for (int c = 0; c < QK_BNB_COLS; ++c) {
        wq_next[c] = make_uint4(0u, 0u, 0u, 0u);
        scale_next[c] = 0.0f;
        if (k0 < K) {
            wq_next[c] = qk_bnb_weights(B + ((wbase[c] + k0) >> 1));
            scale_next[c] = absmax[(wbase[c] + k0) >> bs_shift];
        }
    }
#pragma unroll 1
    for (; k0 < K; k0 += QK_BNB_STRIDE) {
        qk_u32 words[QK_BNB_COLS][4];
        float scale[QK_BNB_COLS];
        qk_u32 scale2[QK_BNB_COLS]; /* T(scale) twice, packed */
#pragma unroll
        for (int c = 0; c < QK_BNB_COLS; ++c) {
            words[c][0] = wq_next[c].x; words[c][1] = wq_next[c].y;
            words[c][2] = wq_next[c].z; words[c][3] = wq_next[c].w;
            scale[c] = scale_next[c];
            if (pairs) scale2[c] = (qk_u32)qk_gemm_tbits<DT>(scale[c]) * 0x10001u;
        }
        if (k0 + QK_BNB_STRIDE < K) {
#pragma unroll
            for (int c = 0; c < QK_BNB_COLS; ++c) {
                wq_next[c] = qk_bnb_weights(B + ((wbase[c] + k0 + QK_BNB_STRIDE) >> 1));
                scale_next[c] = absmax[(wbase[c] + k0 + QK_BNB_STRIDE) >> bs_shift];
            }
        }
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const qk_i64 at = k0 + 8 * s; /* the 8 values of word s */
            if (pairs) {
                qk_u32 b[QK_BNB_COLS][4]; /* T(T(cen) * T(scale)) of elements (2j, 2j + 1) */
#pragma unroll
                for (int c = 0; c < QK_BNB_COLS; ++c)
#pragma unroll
                    for (int j = 0; j < 4; ++j)
                        b[c][j] = qk_bnb_mul2<DT>(*(const qk_u32*)((const qk_u8*)tab + qk_bnb_pair_at(words[c][s], j, lane4)),
                                                  scale2[c]);
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    if (row0 + m >= M) break;
                    const uint4 av = *(const uint4*)((const qk_u16*)A + (row0 + m) * K + at);
                    const qk_u32 a2[4] = {av.x, av.y, av.z, av.w};
#pragma unroll
                    for (int c = 0; c < QK_BNB_COLS; ++c)
#pragma unroll
                        for (int j = 0; j < 4; ++j) {
                            const qk_u32 p = qk_bnb_mul2<DT>(a2[j], b[c][j]);
                            acc[c][m] = qk_bnb_add(acc[c][m], qk_bnb_pair_sum<DT>(p));
                        }
                }
            } else {
                float b[QK_BNB_COLS][8];
#pragma unroll
                for (int c = 0; c < QK_BNB_COLS; ++c)
#pragma unroll
                    for (int e = 0; e < 8; ++e) {
                        const qk_u32 at = qk_bnb_nibble_at(words[c][s], qk_gemm_shift(e), lane4);
                        const float w = qk_bnb_mul(qk_float(*(const qk_u32*)((const qk_u8*)tab + at)), scale[c]);
                        b[c][e] = SIMT ? w : qk_bnb_round<DT>(w);
                    }
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    if (row0 + m >= M) break;
                    float a[8];
                    qk_gemm_load8<DT>(A, (row0 + m) * K + at, a);
#pragma unroll
                    for (int c = 0; c < QK_BNB_COLS; ++c)
#pragma unroll
                        for (int j = 0; j < 8; ++j) {
                            const int e = SIMT ? (j >> 1) + ((j & 1) ? 4 : 0) : j; /* simt: 0,4,1,5,2,6,3,7 */
                            acc[c][m] = qk_bnb_fma(a[e], b[c][e], acc[c][m]);
                        }
                }
            }
        }
    }
#pragma unroll
    for (int c = 0; c < QK_BNB_COLS; ++c) {
        const qk_i64 n = n0 + c;
        const float bv = bias != 0 && n < N ? qk_gemm_load1(bias, n, DT) : 0.0f;
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            float v = acc[c][m];
#pragma unroll
            for (int off = QK_BNB_GROUP / 2; off > 0; off >>= 1) v = qk_bnb_add(v, QK_SHFL_XOR(v, off, QK_BNB_GROUP));
            if (lane == 0 && n < N && row0 + m < M) {
                if (bias != 0) v = qk_bnb_add(v, bv);
                qk_gemm_store(C, (row0 + m) * N + n, DT, v);
            }
        }
    }
}

/* the launch (blockDim.x a multiple of 32, any grid: the groups stride over it, so the op's default
 * geometry of M * N groups works as well as the launcher's) -> groups of (row tile, QK_BNB_COLS
 * columns); the table staged first */
template <int MT, bool SIMT>
__device__ __forceinline__ void qk_gemm_4bit(const void* A, const qk_u8* B, const float* absmax, const void* bias,
                                             void* C, qk_i64 M, qk_i64 N, qk_i64 K, qk_i64 blocksize,
                                             qk_i64 quant_type, qk_i64 a_dtype) {
    __shared__ uint4 tab4[(SIMT ? QK_BNB_PAIRS : 16 * QK_BNB_GROUP) / 4];
    __shared__ qk_u32 cen_t[16];
    qk_u32* tab = (qk_u32*)tab4;
    const qk_u32* bits = quant_type == QCONFORM_QUANT_TYPE_NF4 ? QK_GEMM_NF4_BITS : QK_GEMM_FP4_BITS;
    if (SIMT && a_dtype != QCONFORM_DTYPE_FLOAT32) {
        if (threadIdx.x < 16) {
            const float c = qk_float(bits[threadIdx.x]);
            cen_t[threadIdx.x] = a_dtype == QCONFORM_DTYPE_FLOAT16 ? qk_gemm_tbits<QCONFORM_DTYPE_FLOAT16>(c)
                                                                   : qk_gemm_tbits<QCONFORM_DTYPE_BFLOAT16>(c);
        }
        __syncthreads();
        /* byte e: element 2j = the high nibble in the low half, 2j + 1 = the low nibble in the high half */
        for (int i = threadIdx.x; i < QK_BNB_PAIRS / 4; i += blockDim.x) {
            const int e = i >> 3; /* 4 copies per store, 32 per byte */
            const qk_u32 w = cen_t[e >> 4] | (cen_t[e & 15] << 16);
            tab4[i] = make_uint4(w, w, w, w);
        }
    } else {
        for (int i = threadIdx.x; i < 16 * QK_BNB_GROUP; i += blockDim.x) tab[i] = bits[i / QK_BNB_GROUP];
    }
    __syncthreads();
    const qk_i64 cols = (N + QK_BNB_COLS - 1) / QK_BNB_COLS, groups = cols * ((M + MT - 1) / MT);
    const qk_i64 stride = (qk_i64)gridDim.x * (blockDim.x / QK_BNB_GROUP);
    const int lane = (int)(threadIdx.x % QK_BNB_GROUP);
    for (qk_i64 g = qk_global_thread() / QK_BNB_GROUP; g < groups; g += stride) { /* the whole group of 32 lanes */
        const qk_i64 n0 = (g % cols) * QK_BNB_COLS, row0 = (g / cols) * MT;
        if (a_dtype == QCONFORM_DTYPE_FLOAT16)
            qk_gemm_group<QCONFORM_DTYPE_FLOAT16, MT, SIMT>(A, B, absmax, bias, C, M, N, K, blocksize, n0, row0, lane, tab);
        else if (a_dtype == QCONFORM_DTYPE_BFLOAT16)
            qk_gemm_group<QCONFORM_DTYPE_BFLOAT16, MT, SIMT>(A, B, absmax, bias, C, M, N, K, blocksize, n0, row0, lane, tab);
        else
            qk_gemm_group<QCONFORM_DTYPE_FLOAT32, MT, SIMT>(A, B, absmax, bias, C, M, N, K, blocksize, n0, row0, lane, tab);
    }
}

#endif /* QK_BNB_GEMM_V1 */

/* the op's declared ABI (qconform abi gemm_4bit): MT rows of A per group (the launcher takes the
 * smallest tile holding M, else 16); _simt: the CUDA SIMT reading */
extern "C" __global__ void __launch_bounds__(256) qk_gemm_4bit_m1(QCONFORM_GEMM_4BIT_PARAMS) {
    qk_gemm_4bit<1, false>(A, B, absmax, bias, C, M, N, K, blocksize, quant_type, a_dtype);
}
extern "C" __global__ void __launch_bounds__(256) qk_gemm_4bit_simt_m1(QCONFORM_GEMM_4BIT_PARAMS) {
    qk_gemm_4bit<1, true>(A, B, absmax, bias, C, M, N, K, blocksize, quant_type, a_dtype);
}
extern "C" __global__ void __launch_bounds__(256) qk_gemm_4bit_m2(QCONFORM_GEMM_4BIT_PARAMS) {
    qk_gemm_4bit<2, false>(A, B, absmax, bias, C, M, N, K, blocksize, quant_type, a_dtype);
}
extern "C" __global__ void __launch_bounds__(256) qk_gemm_4bit_simt_m2(QCONFORM_GEMM_4BIT_PARAMS) {
    qk_gemm_4bit<2, true>(A, B, absmax, bias, C, M, N, K, blocksize, quant_type, a_dtype);
}
extern "C" __global__ void __launch_bounds__(256) qk_gemm_4bit_m4(QCONFORM_GEMM_4BIT_PARAMS) {
    qk_gemm_4bit<4, false>(A, B, absmax, bias, C, M, N, K, blocksize, quant_type, a_dtype);
}
extern "C" __global__ void __launch_bounds__(256) qk_gemm_4bit_simt_m4(QCONFORM_GEMM_4BIT_PARAMS) {
    qk_gemm_4bit<4, true>(A, B, absmax, bias, C, M, N, K, blocksize, quant_type, a_dtype);
}
extern "C" __global__ void __launch_bounds__(256) qk_gemm_4bit_m8(QCONFORM_GEMM_4BIT_PARAMS) {
    qk_gemm_4bit<8, false>(A, B, absmax, bias, C, M, N, K, blocksize, quant_type, a_dtype);
}
extern "C" __global__ void __launch_bounds__(256) qk_gemm_4bit_simt_m8(QCONFORM_GEMM_4BIT_PARAMS) {
    qk_gemm_4bit<8, true>(A, B, absmax, bias, C, M, N, K, blocksize, quant_type, a_dtype);
}
extern "C" __global__ void __launch_bounds__(256) qk_gemm_4bit_m16(QCONFORM_GEMM_4BIT_PARAMS) {
    qk_gemm_4bit<16, false>(A, B, absmax, bias, C, M, N, K, blocksize, quant_type, a_dtype);
}
extern "C" __global__ void __launch_bounds__(256) qk_gemm_4bit_simt_m16(QCONFORM_GEMM_4BIT_PARAMS) {
    qk_gemm_4bit<16, true>(A, B, absmax, bias, C, M, N, K, blocksize, quant_type, a_dtype);
}

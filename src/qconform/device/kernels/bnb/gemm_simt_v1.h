/* bitsandbytes 4-bit family: the first fused SIMT gemm_4bit (session 7), kept for side-by-side
 * timing: gemm_simt.hip includes it instead of the current code when built with -DQK_BNB_GEMM_V1
 * (qconform.bench.bnb_gemv --variants). Same entry points, same readings, bit for bit the same
 * outputs; one group of 32 lanes per output column, the fp16 / bf16 arithmetic emulated in fp32.
 * Launch: 128 threads, N * ceil(M / MT) groups (qconform.device.bnb.gemm). */
#ifndef QK_BNB_GEMM_SIMT_V1_H
#define QK_BNB_GEMM_SIMT_V1_H

#define QK_BNB_GROUP 32    /* lanes per output column */
#define QK_BNB_CHUNK 32    /* values per lane per step: 16 bytes of W */
#define QK_BNB_STRIDE 1024 /* QK_BNB_GROUP * QK_BNB_CHUNK */

#include "gemm_common.h" /* the centroid tables, qk_gemm_bf16_bits */

#define QK_BNB_FMA(a, b, c) __fmaf_rn((a), (b), (c))

/* v rounded to the element type DT (nearest even), as a float */
template <int DT>
__device__ __forceinline__ float qk_gemm_round(float v) {
    if (DT == QCONFORM_DTYPE_FLOAT16) return qk_fp16_to_float(qk_fp16_bits(v));
    if (DT == QCONFORM_DTYPE_BFLOAT16) return qk_float((qk_u32)qk_gemm_bf16_bits(v) << 16);
    return v;
}

/* the 8 values of A row `row` from k (a multiple of 8) as floats (exact) */
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
        if (DT == QCONFORM_DTYPE_FLOAT16) {
            a[2 * j] = qk_fp16_to_float((qk_u16)w[j]);
            a[2 * j + 1] = qk_fp16_to_float((qk_u16)(w[j] >> 16));
        } else {
            a[2 * j] = qk_float(w[j] << 16);
            a[2 * j + 1] = qk_float(w[j] & 0xFFFF0000u);
        }
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

/* the nibble of element e (0..7) of a little-endian word: byte e/2, high nibble first */
__device__ __forceinline__ int qk_gemm_nibble(qk_u32 word, int e) {
    return (int)((word >> (8 * (e >> 1) + ((e & 1) ? 0 : 4))) & 0xFu);
}

/* one group's column n for rows row0 .. row0 + MT - 1 (those below M) */
template <int DT, int MT, bool SIMT>
__device__ __forceinline__ void qk_gemm_column(const void* A, const qk_u8* B, const float* absmax, const void* bias,
                                               void* C, qk_i64 M, qk_i64 N, qk_i64 n, qk_i64 K, qk_i64 blocksize, qk_i64 row0,
                                               int lane, const float* lut, const float* lut_t) {
    float acc[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[m] = 0.0f;
    const qk_i64 wbase = n * K;
    /* the next chunk's 16 bytes and scale are loaded before this chunk is summed (same order) */
    qk_i64 k0 = (qk_i64)QK_BNB_CHUNK * lane;
    uint4 wq_next = make_uint4(0u, 0u, 0u, 0u);
    float scale_next = 0.0f;
    if (k0 < K) {
        wq_next = *(const uint4*)(B + ((wbase + k0) >> 1));
        scale_next = absmax[(wbase + k0) / blocksize];
    }
    for (; k0 < K; k0 += QK_BNB_STRIDE) {
        const uint4 wq = wq_next;
        const float scale = scale_next; /* flushed by the fp32 multiply */
        if (k0 + QK_BNB_STRIDE < K) {
            wq_next = *(const uint4*)(B + ((wbase + k0 + QK_BNB_STRIDE) >> 1));
            scale_next = absmax[(wbase + k0 + QK_BNB_STRIDE) / blocksize];
        }
        const float scale_t = qk_gemm_round<DT>(scale);
        const qk_u32 words[4] = {wq.x, wq.y, wq.z, wq.w};
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            float b[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const int q = qk_gemm_nibble(words[s], e);
                if (SIMT && DT != QCONFORM_DTYPE_FLOAT32) b[e] = qk_gemm_round<DT>(QK_FMUL(lut_t[q], scale_t));
                else b[e] = qk_gemm_round<DT>(qk_ftz(QK_FMUL(lut[q], scale)));
            }
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                if (row0 + m >= M) break;
                float a[8];
                qk_gemm_load8<DT>(A, (row0 + m) * K + k0 + 8 * s, a);
                if (SIMT && DT != QCONFORM_DTYPE_FLOAT32) {
#pragma unroll
                    for (int e = 0; e < 8; e += 2) {
                        const float p0 = qk_gemm_round<DT>(QK_FMUL(a[e], b[e]));
                        const float p1 = qk_gemm_round<DT>(QK_FMUL(a[e + 1], b[e + 1]));
                        acc[m] = qk_ftz(QK_FADD(acc[m], qk_ftz(QK_FADD(p0, p1))));
                    }
                } else if (SIMT) {
#pragma unroll
                    for (int j = 0; j < 8; ++j) {
                        const int e = (j >> 1) + ((j & 1) ? 4 : 0); /* 0,4,1,5,2,6,3,7 */
                        acc[m] = qk_ftz(QK_BNB_FMA(a[e], b[e], acc[m]));
                    }
                } else {
#pragma unroll
                    for (int e = 0; e < 8; ++e) acc[m] = qk_ftz(QK_BNB_FMA(a[e], b[e], acc[m]));
                }
            }
        }
    }
    const float bv = bias != 0 ? qk_gemm_load1(bias, n, DT) : 0.0f;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        float v = acc[m];
#pragma unroll
        for (int off = QK_BNB_GROUP / 2; off > 0; off >>= 1) v = qk_ftz(QK_FADD(v, QK_SHFL_XOR(v, off, QK_BNB_GROUP)));
        if (lane == 0 && row0 + m < M) {
            if (bias != 0) v = qk_ftz(QK_FADD(v, bv));
            qk_gemm_store(C, (row0 + m) * N + n, DT, v);
        }
    }
}

/* group g of the launch (blockDim.x a multiple of 32, any grid: the op's default geometry of
 * M * N groups covers the N * ceil(M / MT) this needs) -> (row tile, column); the centroids staged */
template <int MT, bool SIMT>
__device__ __forceinline__ void qk_gemm_4bit(const void* A, const qk_u8* B, const float* absmax, const void* bias,
                                             void* C, qk_i64 M, qk_i64 N, qk_i64 K, qk_i64 blocksize,
                                             qk_i64 quant_type, qk_i64 a_dtype) {
    __shared__ float lut[16], lut_t[16];
    if (threadIdx.x < 16) {
        const float c = qk_float((quant_type == QCONFORM_QUANT_TYPE_NF4 ? QK_GEMM_NF4_BITS : QK_GEMM_FP4_BITS)[threadIdx.x]);
        lut[threadIdx.x] = c;
        lut_t[threadIdx.x] = a_dtype == QCONFORM_DTYPE_FLOAT16    ? qk_gemm_round<QCONFORM_DTYPE_FLOAT16>(c)
                             : a_dtype == QCONFORM_DTYPE_BFLOAT16 ? qk_gemm_round<QCONFORM_DTYPE_BFLOAT16>(c)
                                                                  : c;
    }
    __syncthreads();
    const qk_i64 group = qk_global_thread() / QK_BNB_GROUP, tiles = (M + MT - 1) / MT;
    if (group >= N * tiles) return; /* the whole group of 32 lanes */
    const qk_i64 n = group % N, row0 = (group / N) * MT;
    const int lane = (int)(threadIdx.x % QK_BNB_GROUP);
    if (a_dtype == QCONFORM_DTYPE_FLOAT16)
        qk_gemm_column<QCONFORM_DTYPE_FLOAT16, MT, SIMT>(A, B, absmax, bias, C, M, N, n, K, blocksize, row0, lane, lut, lut_t);
    else if (a_dtype == QCONFORM_DTYPE_BFLOAT16)
        qk_gemm_column<QCONFORM_DTYPE_BFLOAT16, MT, SIMT>(A, B, absmax, bias, C, M, N, n, K, blocksize, row0, lane, lut, lut_t);
    else
        qk_gemm_column<QCONFORM_DTYPE_FLOAT32, MT, SIMT>(A, B, absmax, bias, C, M, N, n, K, blocksize, row0, lane, lut, lut_t);
}

#endif /* QK_BNB_GEMM_SIMT_V1_H */

/* bitsandbytes 4-bit family: NF4 / FP4 quantization (quantize_4bit, no nested statistics), one
 * thread per block of `blocksize` values of the flattened input.
 *
 * Semantics: qconform.ops.bnb.quantize (nf4_quantize / fp4_quantize), whose oracle is
 * qconform.oracles.bnb.quantize_4bit; facts docs/bnb-4bit.md 2.1-2.3. Output y: n_blocks float32
 * absmax (little-endian bytes), then the packed codes, element 2j in the high nibble of byte j
 * (functional.py quantize_4bit); an odd n pads the last low nibble with the code of 0.0.
 *
 * Two readings, one symbol each (the same ABI: qconform abi nf4_quantize):
 * - qk_{nf4,fp4}_quantize: the suite's default contract, bitsandbytes' CPU backend
 *   (bitsandbytes/backends/default/ops.py quantize_4bit), with flush-to-zero inputs as CuPy builds
 *   device code (oracle ftz=True: fp32 / bf16 subnormal inputs read as zeros, a subnormal absmax
 *   stored as +0). absmax = max |x| (a NaN makes it NaN, stored 0x7FC00000); full blocks scale by
 *   s = fl32(x * fl32(1 / absmax)), the tail block by s = fl32(x / absmax) (a true division); the
 *   code is the number of float32 midpoints of the sorted table below s (torch.bucketize,
 *   right=False: a tie goes to the lower value; NaN past every midpoint), FP4 remapped by the
 *   table's argsort. s is never flushed there (torch on the CPU keeps subnormals), so s and the
 *   reciprocal are computed in double and rounded once to float32 with subnormals (qk_f32_round:
 *   the double result of a float32 product is exact, and of a quotient close enough that the one
 *   rounding is correct: 53 >= 2 * 24 + 2 bits), and compared in double.
 * - qk_{nf4,fp4}_quantize_cuda: --contract variant=cuda, csrc/kernels.cu kQuantizeBlockwise with
 *   dQuantizeNF4 / dQuantizeFP4: inputs flushed, absmax = fmaxf over |x| from -FLT_MAX (a NaN
 *   never wins; a tail block's zero padding takes part, so its max starts at 0), r = 1 / absmax
 *   correctly rounded (the oracle's exact-IEEE reciprocal; bitsandbytes' fast-math build uses
 *   rcp.approx, which the oracle models only through a measured table) then flushed,
 *   t = ftz(x * r), and the strict-'>' decision trees on the float32 values of the source's
 *   decimal literals (4 of the 15 NF4 thresholds sit one ulp off the midpoints); NaN -> code 0. */
#include "qk_portable.h"

#include "qconform_abi.h" /* the enum codes, generated from the catalogue */

/* CPU reading: the 15 float32 midpoints (code[o_k] + code[o_k+1]) / 2 of the sorted tables
 * (backends/default/ops.py _get_4bit_quantize_bounds), and FP4's remap order = argsort(code) */
__constant__ qk_u32 QK_NF4_CPU_BOUNDS[15] = {
    0xBF591CD8u, 0xBF1C5270u, 0xBEEB8480u, 0xBEADEA76u, 0xBE703CECu, 0xBE0D38BCu, 0xBD3A7871u, 0x3D22FAFFu,
    0x3DF64862u, 0x3E5067E0u, 0x3E9582D4u, 0x3EC753F9u, 0x3F006D04u, 0x3F248DAFu, 0x3F5C89DAu,
};
__constant__ qk_u32 QK_FP4_CPU_BOUNDS[15] = {
    0xBF555556u, 0xBF155556u, 0xBED55556u, 0xBE955556u, 0xBE555556u, 0xBDB00000u, 0xBB2AAAABu, 0x00000000u,
    0x3B2AAAABu, 0x3DB00000u, 0x3E555556u, 0x3E955556u, 0x3ED55556u, 0x3F155556u, 0x3F555556u,
};
__constant__ qk_u8 QK_FP4_CPU_ORDER[16] = {11, 10, 13, 12, 15, 14, 9, 0, 8, 1, 6, 7, 4, 5, 2, 3};

/* CUDA reading: dQuantizeNF4's thresholds (q = #{t_k < s}) and dQuantizeFP4's on |s|
 * (code FP4_MAG[#{T_k < |s|}] | sign), as float32 bit patterns of the decimal literals */
__constant__ qk_u32 QK_NF4_CUDA_THRESHOLDS[15] = {
    0xBF591CD9u, 0xBF1C5270u, 0xBEEB8480u, 0xBEADEA76u, 0xBE703CECu, 0xBE0D38BCu, 0xBD3A7871u, 0x3D22FAFFu,
    0x3DF64863u, 0x3E5067E0u, 0x3E9582D4u, 0x3EC753F9u, 0x3F006D03u, 0x3F248DAFu, 0x3F5C89D9u,
};
__constant__ qk_u32 QK_FP4_CUDA_THRESHOLDS[7] = {
    0x3B2AAAB9u, 0x3DB00000u, 0x3E555555u, 0x3E955555u, 0x3ED55556u, 0x3F155550u, 0x3F555555u,
};
__constant__ qk_u8 QK_FP4_CUDA_MAG[8] = {0, 1, 6, 7, 4, 5, 2, 3};

#define QK_F32_MAX_BITS 0x7F7FFFFFu
#define QK_NAN_BITS 0x7FC00000u

/* element i of A widened to fp32 (exact), flushed to zero as a flush-to-zero build reads it (an
 * fp16 subnormal widens to a normal fp32 and is kept) */
__device__ __forceinline__ float qk_bnb_load(const void* A, qk_i64 i, qk_i64 a_dtype) {
    if (a_dtype == QCONFORM_DTYPE_FLOAT16) return qk_fp16_to_float(((const qk_u16*)A)[i]);
    if (a_dtype == QCONFORM_DTYPE_BFLOAT16) return qk_ftz(qk_float((qk_u32)((const qk_u16*)A)[i] << 16));
    return qk_ftz(((const float*)A)[i]);
}

/* a double rounded once to the nearest float32 (ties to even), subnormals kept, returned as a
 * double: the conversion instruction flushes a subnormal result in a flush-to-zero build */
__device__ __forceinline__ double qk_f32_round(double d) {
    if (!(fabs(d) < 1.1754943508222875e-38)) return (double)__double2float_rn(d); /* normal, 0, inf, NaN */
    return rint(d * 7.1362384635297994e+44) * 1.4012984643248171e-45;            /* 2^149, 2^-149: exact */
}

__device__ __forceinline__ void qk_bnb_store_absmax(qk_u8* y, qk_i64 b, qk_u32 bits) {
    qk_u8* p = y + 4 * b;
    p[0] = (qk_u8)bits;
    p[1] = (qk_u8)(bits >> 8);
    p[2] = (qk_u8)(bits >> 16);
    p[3] = (qk_u8)(bits >> 24);
}

/* CPU reading: the code of a scaled value s (a float32 value held in a double) */
template <bool NF4>
__device__ __forceinline__ int qk_bnb_cpu_code(double s) {
    const qk_u32* bounds = NF4 ? QK_NF4_CPU_BOUNDS : QK_FP4_CPU_BOUNDS;
    int q = 15; /* NaN: past every midpoint */
    if (!isnan(s)) {
        q = 0;
#pragma unroll
        for (int k = 0; k < 15; ++k) q += (double)qk_float(bounds[k]) < s ? 1 : 0;
    }
    return NF4 ? q : (int)QK_FP4_CPU_ORDER[q];
}

/* CUDA reading: the decision tree of a scaled value t (flushed float32) */
template <bool NF4>
__device__ __forceinline__ int qk_bnb_cuda_code(float t) {
    if (qk_isnan(t)) return 0;
    int q = 0;
    if (NF4) {
#pragma unroll
        for (int k = 0; k < 15; ++k) q += t > qk_float(QK_NF4_CUDA_THRESHOLDS[k]) ? 1 : 0;
        return q;
    }
    const float a = fabsf(t);
#pragma unroll
    for (int k = 0; k < 7; ++k) q += a > qk_float(QK_FP4_CUDA_THRESHOLDS[k]) ? 1 : 0;
    return (int)QK_FP4_CUDA_MAG[q] | (t < 0.0f ? 8 : 0);
}

/* the codes of elements lo..hi-1, two per byte (blocksize is even, so a block owns its bytes); the
 * pad nibble of an odd n is `pad` */
template <typename CodeOf>
__device__ __forceinline__ void qk_bnb_pack(qk_u8* packed, const void* A, qk_i64 a_dtype, qk_i64 lo, qk_i64 hi,
                                            int pad, const CodeOf& code_of) {
    for (qk_i64 i = lo; i < hi; i += 2) {
        const int hi_q = code_of(qk_bnb_load(A, i, a_dtype));
        const int lo_q = i + 1 < hi ? code_of(qk_bnb_load(A, i + 1, a_dtype)) : pad;
        packed[i >> 1] = (qk_u8)((hi_q << 4) | lo_q);
    }
}

template <bool NF4, bool CUDA>
__device__ __forceinline__ void qk_bnb_quantize(const void* A, qk_u8* y, qk_i64 n, qk_i64 blocksize, qk_i64 n_blocks,
                                                qk_i64 a_dtype) {
    const qk_i64 b = qk_global_thread();
    if (b >= n_blocks) return;
    const qk_i64 lo = b * blocksize, hi = lo + blocksize < n ? lo + blocksize : n;
    const bool full = hi - lo == blocksize;
    qk_u8* packed = y + 4 * n_blocks;
    if (CUDA) {
        float m = full ? -qk_float(QK_F32_MAX_BITS) : 0.0f;
        for (qk_i64 i = lo; i < hi; ++i) {
            const float a = fabsf(qk_bnb_load(A, i, a_dtype));
            if (a > m) m = a; /* fmaxf: a NaN never wins */
        }
        qk_bnb_store_absmax(y, b, qk_bits(m));
        const float r = qk_ftz(QK_FDIV(1.0f, m));
        const int pad = qk_bnb_cuda_code<NF4>(qk_ftz(QK_FMUL(0.0f, r)));
        qk_bnb_pack(packed, A, a_dtype, lo, hi, pad,
                    [r](float x) { return qk_bnb_cuda_code<NF4>(qk_ftz(QK_FMUL(x, r))); });
        return;
    }
    float m = 0.0f;
    bool nan = false;
    for (qk_i64 i = lo; i < hi; ++i) {
        const float a = fabsf(qk_bnb_load(A, i, a_dtype));
        nan |= qk_isnan(a);
        if (a > m) m = a;
    }
    qk_bnb_store_absmax(y, b, nan ? QK_NAN_BITS : qk_bits(m));
    const double md = (double)m, r = qk_f32_round(1.0 / md);
    /* a NaN block: every s is NaN; a zero block scales to zeros (full: 0 * fl32(1 / 1e-38); the
     * tail: 0 / 1e-38, whose absmax 1e-38 is subnormal and stored as +0) */
    const int mode = nan ? 0 : m == 0.0f ? 1 : full ? 2 : 3;
    qk_bnb_pack(packed, A, a_dtype, lo, hi, qk_bnb_cpu_code<NF4>(0.0), [=](float x) {
        const double s = mode == 0   ? __longlong_as_double(0x7FF8000000000000LL)
                         : mode == 1 ? 0.0
                         : mode == 2 ? qk_f32_round((double)x * r)
                                     : qk_f32_round((double)x / md);
        return qk_bnb_cpu_code<NF4>(s);
    });
}

/* the ops' declared ABI (qconform abi nf4_quantize / fp4_quantize), one thread per block */
extern "C" __global__ void __launch_bounds__(256) qk_nf4_quantize(QCONFORM_NF4_QUANTIZE_PARAMS) {
    qk_bnb_quantize<true, false>(A, y, n, blocksize, n_blocks, a_dtype);
}

extern "C" __global__ void __launch_bounds__(256) qk_fp4_quantize(QCONFORM_FP4_QUANTIZE_PARAMS) {
    qk_bnb_quantize<false, false>(A, y, n, blocksize, n_blocks, a_dtype);
}

extern "C" __global__ void __launch_bounds__(256) qk_nf4_quantize_cuda(QCONFORM_NF4_QUANTIZE_PARAMS) {
    qk_bnb_quantize<true, true>(A, y, n, blocksize, n_blocks, a_dtype);
}

extern "C" __global__ void __launch_bounds__(256) qk_fp4_quantize_cuda(QCONFORM_FP4_QUANTIZE_PARAMS) {
    qk_bnb_quantize<false, true>(A, y, n, blocksize, n_blocks, a_dtype);
}

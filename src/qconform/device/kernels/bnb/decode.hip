/* bitsandbytes 4-bit family: NF4 / FP4 dequantization (dequantize_4bit), one thread per output.
 *
 * Semantics: qconform.oracles.bnb.dequantize_4bit; facts docs/bnb-4bit.md 1.1, 1.2 and 3. Upstream
 * (bitsandbytes-foundation/bitsandbytes, the commit docs/bnb-4bit.md names): csrc/kernels.cu
 * kDequantizeBlockwise with dDequantizeNF4 / dDequantizeFP4Tree (CUDA), csrc/cpu_ops.cpp
 * dequantizeBlockwise4bitCpu (the CPU scalar path) and bitsandbytes/backends/default/ops.py
 * _dequantize_4bit_compute (what the CPU backend runs for an odd last dimension).
 *
 * y[i] = T(fl32(code[q_i] * absmax[i / blocksize])), i over the flattened (rows, cols) output:
 * one IEEE fp32 multiply (QK_FMUL, never fused) flushed to zero as CuPy builds device code
 * (qk_ftz; a subnormal absmax is flushed first), then one rounding to T = y_dtype, nearest even.
 * Byte j holds element 2j in its high nibble and 2j + 1 in its low one (functional.py
 * quantize_4bit packs q[2j] << 4 | q[2j+1]); for odd n the last low nibble is never read.
 *
 * The reading is the suite's default contract, bitsandbytes' CPU backend (variant=cpu) with
 * ftz=True, bit for bit, NaN bits included:
 * - FP4 code 8 is -0 for an even last dimension (cpu_ops.cpp fp4_lut, as kernels.cu
 *   dDequantizeFP4Tree) and +0 for an odd one (the Python table get_4bit_type("fp4"));
 * - bf16 for an even last dimension: cpu_ops.h float_to_bf16, (bits + 0x7FFF + lsb) >> 16 with no
 *   NaN guard; for an odd one: nearest even with every NaN -> 0x7FC0 (torch);
 * - a NaN product has the bits x86 SSE gives the oracle: code * NaN is that NaN quieted (bit 22
 *   set, sign kept), 0 * inf the default NaN 0xFFC00000; fp16 NaN -> sign | 0x7E00.
 * Under --contract variant=cuda (kernels.cu) the odd-width FP4 zero and bf16 NaN bits differ. */
#include "qk_portable.h"

#include "qconform_abi.h" /* the enum codes, generated from the catalogue */

/* the float32 bit patterns of the NF4 table (functional.py get_4bit_type("nf4"), the literals of
 * kernels.cu dDequantizeNF4) and of the native FP4 table (code 8 is -0) */
__constant__ qk_u32 QK_NF4_BITS[16] = {
    0xBF800000u, 0xBF3239B1u, 0xBF066B30u, 0xBECA32A0u, 0xBE91A24Du, 0xBE3D353Fu, 0xBDBA7871u, 0x00000000u,
    0x3DA2FAFFu, 0x3E24CAE3u, 0x3E7C04DDu, 0x3EAD033Au, 0x3EE1A4B8u, 0x3F1007ABu, 0x3F3913B3u, 0x3F800000u,
};
__constant__ qk_u32 QK_FP4_BITS[16] = {
    0x00000000u, 0x3BAAAAABu, 0x3F2AAAABu, 0x3F800000u, 0x3EAAAAABu, 0x3F000000u, 0x3E2AAAABu, 0x3E800000u,
    0x80000000u, 0xBBAAAAABu, 0xBF2AAAABu, 0xBF800000u, 0xBEAAAAABu, 0xBF000000u, 0xBE2AAAABu, 0xBE800000u,
};

/* fl32(code * a) as bits, flushed to zero; NaNs as x86 makes them (see the top) */
__device__ __forceinline__ qk_u32 qk_bnb_product(float code, float a) {
    if (qk_isnan(a)) return qk_bits(a) | 0x00400000u;
    if (code == 0.0f && (qk_bits(a) & 0x7FFFFFFFu) == 0x7F800000u) return 0xFFC00000u;
    return qk_bits(qk_ftz(QK_FMUL(code, a)));
}

/* fp32 bits -> bf16 bits, nearest even by (u + 0x7FFF + lsb) >> 16 (mod 2^32); nan_guard: every
 * NaN -> 0x7FC0 instead */
__device__ __forceinline__ qk_u16 qk_bnb_bf16(qk_u32 u, int nan_guard) {
    if (nan_guard && (u & 0x7FFFFFFFu) > 0x7F800000u) return (qk_u16)0x7FC0u;
    return (qk_u16)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ void qk_bnb_decode(const qk_u8* packed, const float* absmax, void* y, qk_i64 rows,
                                              qk_i64 cols, qk_i64 blocksize, qk_i64 y_dtype, const qk_u32* table,
                                              int fp4) {
    const qk_i64 n = rows * cols, i = qk_global_thread();
    if (i >= n) return;
    const int odd = (int)(cols & 1); /* the CPU backend's odd-width path: FP4 +0, bf16 with a NaN guard */
    const unsigned byte = packed[i >> 1];
    const int q = (i & 1) ? (int)(byte & 0x0Fu) : (int)(byte >> 4);
    const qk_u32 code = (fp4 && odd && q == 8) ? 0u : table[q];
    const qk_i64 blk = i / blocksize;
    const qk_u32 v = qk_bnb_product(qk_float(code), qk_ftz(absmax[blk]));
    if (y_dtype == QCONFORM_DTYPE_FLOAT16) ((qk_u16*)y)[i] = qk_fp16_bits(qk_float(v));
    else if (y_dtype == QCONFORM_DTYPE_BFLOAT16) ((qk_u16*)y)[i] = qk_bnb_bf16(v, odd);
    else ((qk_u32*)y)[i] = v;
}

/* the ops' declared ABI (qconform abi nf4_decode / fp4_decode), one thread per output element */
extern "C" __global__ void __launch_bounds__(256) qk_nf4_decode(QCONFORM_NF4_DECODE_PARAMS) {
    qk_bnb_decode(packed, absmax, y, rows, cols, blocksize, y_dtype, QK_NF4_BITS, 0);
}

extern "C" __global__ void __launch_bounds__(256) qk_fp4_decode(QCONFORM_FP4_DECODE_PARAMS) {
    qk_bnb_decode(packed, absmax, y, rows, cols, blocksize, y_dtype, QK_FP4_BITS, 1);
}

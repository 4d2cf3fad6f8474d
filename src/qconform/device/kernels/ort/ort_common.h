/* ONNX Runtime quantized-weight family: the device functions its kernels share.
 *
 * Semantics: qconform.oracles.ort (docs and upstream sources cited there). Weights are packed
 * along K, low bits first (qk_field); zero-point kinds: ZP_DEFAULT 2^(bits-1), ZP_PACKED uint8,
 * ZP_FLOAT per block in ORT's two-rounding form fp32(q*s) + fp32(-s*z), ZP_SCALAR one float in the
 * kernel form (q - z) * s. Every rounding-relevant fp32 operation is QK_FMUL/QK_FADD/QK_FDIV
 * followed by qk_ftz, so the dequantized values are the oracle's bit for bit. */
#ifndef QK_ORT_COMMON_H
#define QK_ORT_COMMON_H
#include "qk_portable.h"

#include "qconform_abi.h" /* the enum codes, generated from the catalogue */

#define ZP_DEFAULT QCONFORM_ZP_KIND_NONE
#define ZP_PACKED QCONFORM_ZP_KIND_PACKED
#define ZP_FLOAT QCONFORM_ZP_KIND_FLOAT
#define ZP_SCALAR QCONFORM_ZP_KIND_SCALAR

__device__ __forceinline__ float qk_load_f(const void* p, qk_i64 i, int is_f16) {
    return is_f16 ? __half2float(((const __half*)p)[i]) : ((const float*)p)[i];
}

__device__ __forceinline__ void qk_store_f(void* p, qk_i64 i, float v, int is_f16) {
    if (is_f16) ((__half*)p)[i] = qk_half_rn(v);
    else ((float*)p)[i] = v;
}

/* element j of a low-bits-first bit stream; bits 2, 3, 4 or 8 (3-bit fields may straddle bytes) */
__device__ __forceinline__ int qk_field(const qk_u8* row, int bits, qk_i64 j) {
    const qk_i64 off = j * bits;
    const int shift = (int)(off & 7);
    unsigned v = row[off >> 3];
    if (shift + bits > 8) v |= (unsigned)row[(off >> 3) + 1] << 8;
    return (int)((v >> shift) & ((1u << bits) - 1u));
}

/* the scale and zero point of block kb of column n, and the weight of a quantized value q */
struct qk_block_q {
    float s, z, negsz;  /* z: integer or float zero point as float; negsz = fp32(-s*z) (ZP_FLOAT) */
    int kind;
};

__device__ __forceinline__ qk_block_q qk_block(const void* scales, const void* zp, float zps, qk_i64 n, int kb,
                                               int k_blocks, int bits, int zp_bytes, int zp_kind, int s16, int z16) {
    qk_block_q b;
    b.kind = zp_kind;
    b.s = qk_ftz(qk_load_f(scales, n * k_blocks + kb, s16));
    b.negsz = 0.0f;
    if (zp_kind == ZP_FLOAT) {
        b.z = qk_ftz(qk_load_f(zp, n * k_blocks + kb, z16));
        b.negsz = qk_ftz(QK_FMUL(-b.s, b.z));
    } else if (zp_kind == ZP_SCALAR) {
        b.z = zps;
    } else if (zp_kind == ZP_PACKED) {
        b.z = (float)qk_field((const qk_u8*)zp + n * zp_bytes, bits, kb);
    } else {
        b.z = (float)(1 << (bits - 1));
    }
    return b;
}

__device__ __forceinline__ float qk_weight(const qk_block_q& b, int q) {
    if (b.kind == ZP_FLOAT) return qk_ftz(QK_FADD(qk_ftz(QK_FMUL((float)q, b.s)), b.negsz));
    if (b.kind == ZP_SCALAR) return qk_ftz(QK_FMUL(qk_ftz(QK_FADD((float)q, -b.z)), b.s));
    return qk_ftz(QK_FMUL((float)(q - (int)b.z), b.s));
}

/* ----------------------------------------------------------------------- Q / DQ helpers */
/* ONNX QuantizeLinear: clip(rint(x / s) + zp, lo, hi), true division, half to even; NaN -> zp */
__device__ __forceinline__ int qk_quantize(float x, float s, int zp, int lo, int hi) {
    float r = rintf(qk_ftz(QK_FDIV(qk_ftz(x), s)));
    if (qk_isnan(r)) r = 0.0f;
    r = fminf(fmaxf(r, -1099511627776.0f), 1099511627776.0f);  /* +-2^40, then the integer range */
    const float q = fminf(fmaxf(QK_FADD(r, (float)zp), (float)lo), (float)hi);
    return (int)q;
}

__device__ __forceinline__ float qk_dequantize(int q, float s, int zp) { return qk_ftz(QK_FMUL((float)(q - zp), s)); }

#endif /* QK_ORT_COMMON_H */

/* WRONG TWIN of matmul_nbits_u2_gemv.hip, for showing what the suite reports: identical except
 * for ONE broken rule, marked BUG below: the four 2-bit fields of a byte are read HIGH bits first
 * (field t from bits 6-2t .. 7-2t), where the ABI says low bits first. qconform run fails it with
 * matches_oracle (relL2 far above the bound, and the output with the largest error). */
/* A worked `hip:` kernel for matmul_nbits (com.microsoft.MatMulNBits), written only against the
 * two headers qconform puts on every kernel's include path:
 *   qconform_abi.h   the argument list QCONFORM_MATMUL_NBITS_PARAMS and the enum codes
 *                    (`qconform abi matmul_nbits` prints the same declaration and its rules);
 *   qk_portable.h    one source for HIP (hiprtc, wave64 and wave32) and CUDA (NVRTC): shuffles,
 *                    fp16, never-fused fp32 operations.
 *
 * What it computes: Y[m, n] = sum_k A[m, k] * w[n, k] (+ bias[n]) for 2-bit weights, fp16 or fp32 A.
 * What it declines: everything else (other bit widths, accuracy_level 4's int8 activations); the
 * user says so on the command line, and those cases are counted as declined, not failed:
 *
 *   qconform run --ops matmul_nbits --leaf Xfp16_Wu2_Yfp16 \
 *     --impl 'hip:examples/hip_kernel/matmul_nbits_u2_gemv.hip:matmul_nbits_u2_gemv:requires=bits==2 and accuracy_level<4'
 * (the same for Xfp32_Wu2_Yfp32; without --leaf the other bit widths show SKIP: every case declined)
 *
 * Geometry: the op's default (qconform abi matmul_nbits): work = M * N outputs, 32 lanes each,
 * 256 threads per CTA, gridDim.x = ceil(M * N * 32 / 256). So one group of 32 consecutive
 * threads computes one output; a wave64 (AMD gfx9) holds two groups, which is why every shuffle
 * below is a width-32 shuffle.
 *
 * The weights (the ABI's notes): B is (N, k_blocks, block_size / 4) bytes for 2 bits. The value
 * q of column n at K index k is field j = k % block_size of block kb = k / block_size: bits
 * [2j, 2j + 2) counted from bit 0 of the block's first byte, LOW bits first. Blocks are stored
 * back to back, so the bytes of column n are one run of k_blocks * block_size / 4 bytes, and
 * byte i of that run holds K indices 4i .. 4i + 3 (its bits 0-1, 2-3, 4-5, 6-7). The last block
 * is padded up to a whole block: fields at k >= K are padding and are never used.
 *
 * Dequantization, exactly as the oracle (qconform.oracles.ort.matmul_nbits) rounds:
 *   zp_kind none    z = 2^(bits-1) = 2           w = fp32((q - z) * s)           one rounding
 *   zp_kind packed  z = field kb of zero_points row n (packed like B, low bits first), same formula
 *   zp_kind float   z = zero_points[n, kb]       w = fp32(q * s) + fp32(-s * z)  ORT's two roundings
 *   zp_kind scalar  z = one float32              w = fp32(fp32(q - z) * s)
 * QK_FMUL / QK_FADD are __fmul_rn / __fadd_rn: never contracted into an FMA, so each rounding
 * happens where the formula says. The sum over K is in fp32 in this kernel's own order (each lane
 * a strided part, then a butterfly of shuffles): the suite checks it within its K-derived bound.
 */
#include "qconform_abi.h"
#include "qk_portable.h"

#define GROUP 32 /* lanes per output: the ABI's default lanes for matmul_nbits */

/* element i of A, scales or bias: fp16 or fp32 (a_dtype says which) */
__device__ __forceinline__ float load_act(const void* p, qk_i64 i, bool fp16) {
    return fp16 ? __half2float(((const __half*)p)[i]) : ((const float*)p)[i];
}

/* the scale and zero point of block kb of column n */
struct BlockQuant {
    float s;     /* scale */
    int zi;      /* integer zero point (kinds none and packed) */
    float zf;    /* float zero point (kinds float and scalar) */
    float negsz; /* fp32(-s * z), kind float */
};

__device__ __forceinline__ BlockQuant block_quant(const void* scales, const void* zero_points, qk_i64 n, qk_i64 kb,
                                                  qk_i64 k_blocks, long long zp_kind, bool fp16) {
    BlockQuant b;
    b.s = load_act(scales, n * k_blocks + kb, fp16);
    b.zi = 2; /* 2^(bits-1) for bits = 2 */
    b.zf = 0.0f;
    b.negsz = 0.0f;
    if (zp_kind == QCONFORM_ZP_KIND_PACKED) {
        const qk_i64 zp_bytes = (k_blocks * 2 + 7) / 8; /* ceil(k_blocks * bits / 8) */
        const qk_u8 byte = ((const qk_u8*)zero_points)[n * zp_bytes + kb / 4];
        b.zi = (byte >> (2 * (int)(kb % 4))) & 3;
    } else if (zp_kind == QCONFORM_ZP_KIND_FLOAT) {
        b.zf = load_act(zero_points, n * k_blocks + kb, fp16); /* in the scales' dtype */
        b.negsz = qk_ftz(QK_FMUL(-b.s, b.zf));
    } else if (zp_kind == QCONFORM_ZP_KIND_SCALAR) {
        b.zf = *(const float*)zero_points; /* always float32 */
    }
    return b;
}

/* w for the 2-bit value q, by the zero-point kind's formula */
__device__ __forceinline__ float dequant(const BlockQuant& b, int q, long long zp_kind) {
    if (zp_kind == QCONFORM_ZP_KIND_FLOAT) return qk_ftz(QK_FADD(qk_ftz(QK_FMUL((float)q, b.s)), b.negsz));
    if (zp_kind == QCONFORM_ZP_KIND_SCALAR) return qk_ftz(QK_FMUL(qk_ftz(QK_FADD((float)q, -b.zf)), b.s));
    return qk_ftz(QK_FMUL((float)(q - b.zi), b.s)); /* q - z is an exact integer: one rounding */
}

extern "C" __global__ void matmul_nbits_u2_gemv(QCONFORM_MATMUL_NBITS_PARAMS) {
    if (bits != 2) return; /* never launched so: `requires=bits==2` declines those cases */
    const qk_i64 output = qk_global_thread() / GROUP;
    const int lane = (int)(threadIdx.x % GROUP);
    if (output >= M * N) return; /* the 32 lanes of a group leave together */
    const qk_i64 m = output / N, n = output % N;
    const bool fp16 = a_dtype == QCONFORM_DTYPE_FLOAT16;
    const qk_i64 k_blocks = (K + block_size - 1) / block_size;
    const qk_i64 row_bytes = k_blocks * block_size / 4;
    const qk_u8* column = B + n * row_bytes; /* the bytes of column n, block after block */
    const qk_i64 a_row = m * K;

    float acc = 0.0f;
    for (qk_i64 i = lane; i < row_bytes; i += GROUP) { /* byte i: K indices 4i .. 4i+3, one block */
        const qk_u8 byte = column[i];
        const qk_i64 k0 = 4 * i;
        const BlockQuant b = block_quant(scales, zero_points, n, k0 / block_size, k_blocks, zp_kind, fp16);
        for (int t = 0; t < 4; ++t) {
            if (k0 + t >= K) break; /* the padding of the last block */
            const int q = (byte >> (6 - 2 * t)) & 3; /* BUG: field t read high bits first */
            acc = fmaf(load_act(A, a_row + k0 + t, fp16), dequant(b, q, zp_kind), acc);
        }
    }
    for (int offset = GROUP / 2; offset > 0; offset /= 2) acc += QK_SHFL_XOR(acc, offset, GROUP);

    if (lane != 0) return;
    if (bias != 0) acc += load_act(bias, n, fp16);
    const qk_i64 y = m * N + n;
    if (fp16) ((__half*)Y)[y] = qk_half_rn(acc); /* fp16 Y: the fp32 sum rounded once */
    else ((float*)Y)[y] = qk_ftz(acc);
}

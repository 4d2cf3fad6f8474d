/* ONNX Runtime quantized-weight family: MatMulNBits dequantization, the per-output GEMV and the accuracy_level 4 int8 path.
 * Semantics: qconform.oracles.ort; shared device functions in ort_common.h. qk_nbits_dequant takes its
 * op's declared ABI; the others plain pointer and int arguments (qconform.device.ort says how). */
#include "ort_common.h"

/* W (N, K) fp32, one thread per element; the op's declared ABI (qconform abi dequantize_nbits) */
extern "C" __global__ void __launch_bounds__(256) qk_nbits_dequant(QCONFORM_DEQUANTIZE_NBITS_PARAMS) {
    const qk_i64 t = qk_global_thread();
    if (t >= N * K) return;
    const int bs = (int)block_size, k_blocks = (int)((K + block_size - 1) / block_size);
    const int blob = bs * (int)bits / 8, zp_bytes = (k_blocks * (int)bits + 7) / 8, s16 = s_dtype == QCONFORM_DTYPE_FLOAT16;
    const float zps = zp_kind == ZP_SCALAR ? ((const float*)zero_points)[0] : 0.0f;
    const qk_i64 n = t / K;
    const int k = (int)(t - n * K), kb = k / bs;
    const qk_block_q b = qk_block(scales, zero_points, zps, n, kb, k_blocks, (int)bits, zp_bytes, (int)zp_kind, s16, s16);
    Y[t] = qk_weight(b, qk_field(B + (n * k_blocks + kb) * blob, (int)bits, k - kb * bs));
}

/* Y (M, N) = A (M, K) @ W^T (+ bias): a group of 32 lanes per output element (width-32 shuffles:
 * a wave64 holds two groups). 2- and 4-bit weights are read as 32-bit words (one word never
 * spans two blocks: a block is at least 16 values), the block's scale and zero point once per
 * word; every element is dequantized as qk_nbits_dequant does (w = fp32((q - z) s), or ORT's
 * fp32(q s) + fp32(-s z) for float zero points) and chained by fmaf(a, w): no sum(a) correction,
 * whose cancellation loses the small products beside a large activation on weights q = z.
 * Other widths take the element path. */
extern "C" __global__ void __launch_bounds__(256)
qk_nbits_gemv(const void* A, const qk_u8* B, const void* scales, const void* zp, float zps, const void* bias, void* Y,
              int M, int K, int N, int bits, int bs, int k_blocks, int blob, int zp_bytes, int zp_kind, int a16,
              int s16, int z16, int has_bias) {
    const qk_i64 g = qk_global_thread() >> 5;
    const int lane = (int)(threadIdx.x & 31);
    if (g >= (qk_i64)M * N) return;  /* whole groups leave together */
    const qk_i64 m = g / N, n = g - (g / N) * N;
    const qk_u8* row = B + n * k_blocks * blob;
    const qk_i64 arow = m * K;
    float acc = 0.0f;
    if (bits == 2 || bits == 4) {
        const int per = 32 / bits, wpb = blob / 4, words = k_blocks * wpb;
        for (int w = lane; w < words; w += 32) {
            const qk_u32 word = ((const qk_u32*)row)[w];
            const int kb = w / wpb, k0 = kb * bs + (w - kb * wpb) * per;
            const qk_block_q b = qk_block(scales, zp, zps, n, kb, k_blocks, bits, zp_bytes, zp_kind, s16, z16);
            if (k0 + per <= K) {
                const int fields = 8 / bits;  /* per byte */
                for (int j = 0; j < fields; ++j) {
                    const qk_u32 v = (word >> (bits * j)) & (bits == 2 ? 0x03030303u : 0x0F0F0F0Fu);
                    for (int by = 0; by < 4; ++by) {
                        const float av = qk_load_f(A, arow + k0 + fields * by + j, a16);
                        acc = fmaf(av, qk_weight(b, (int)((v >> (8 * by)) & 0xFFu)), acc);
                    }
                }
            } else {
                for (int e = 0; e < per && k0 + e < K; ++e) {
                    const float av = qk_load_f(A, arow + k0 + e, a16);
                    acc = fmaf(av, qk_weight(b, (int)((word >> (bits * e)) & ((1u << bits) - 1u))), acc);
                }
            }
        }
    } else {
        for (int k = lane; k < K; k += 32) {
            const int kb = k / bs;
            const qk_block_q b = qk_block(scales, zp, zps, n, kb, k_blocks, bits, zp_bytes, zp_kind, s16, z16);
            const float w = qk_weight(b, qk_field(row + (qk_i64)kb * blob, bits, k - kb * bs));
            acc = fmaf(qk_load_f(A, arow + k, a16), w, acc);
        }
    }
    for (int off = 16; off > 0; off >>= 1) acc += QK_SHFL_XOR(acc, off, 32);
    if (lane == 0) {
        if (has_bias) acc += qk_load_f(bias, n, a16);
        qk_store_f(Y, g, acc, a16);
    }
}

/* accuracy_level 4 (ORT's CompInt8): A quantized per row and K block, one thread per block:
 * amax, sa = fp32(amax/127), inv = fp32(127/amax) or 0, qa = clamp(rint(fp32(a*inv)), -128, 127) */
extern "C" __global__ void __launch_bounds__(256)
qk_quantize_a_int8(const void* A, int* qa, float* sa, int M, int K, int bs, int k_blocks, int a16) {
    const qk_i64 t = qk_global_thread();
    if (t >= (qk_i64)M * k_blocks) return;
    const qk_i64 m = t / k_blocks;
    const int b = (int)(t - m * k_blocks), k0 = b * bs, k1 = min(K, k0 + bs);
    float amax = 0.0f;
    for (int k = k0; k < k1; ++k) amax = fmaxf(amax, fabsf(qk_ftz(qk_load_f(A, m * K + k, a16))));
    sa[t] = qk_ftz(QK_FDIV(amax, 127.0f));
    const float inv = amax != 0.0f ? qk_ftz(QK_FDIV(127.0f, amax)) : 0.0f;
    for (int k = k0; k < k1; ++k) {
        const float r = rintf(qk_ftz(QK_FMUL(qk_ftz(qk_load_f(A, m * K + k, a16)), inv)));
        qa[m * K + k] = (int)fminf(fmaxf(r, -128.0f), 127.0f);
    }
}

/* the int8 product: a group of 32 lanes per output, lanes over K blocks; per block the exact
 * integer dot of qa and (q - z), times fp32(sa * s), summed in fp32 */
extern "C" __global__ void __launch_bounds__(256)
qk_nbits_gemv_int8(const int* qa, const float* sa, const qk_u8* B, const void* scales, const void* zp,
                   const void* bias, void* Y, int M, int K, int N, int bits, int bs, int k_blocks, int blob,
                   int zp_bytes, int zp_kind, int y16, int s16, int has_bias) {
    const qk_i64 g = qk_global_thread() >> 5;
    const int lane = (int)(threadIdx.x & 31);
    if (g >= (qk_i64)M * N) return;
    const qk_i64 m = g / N, n = g - (g / N) * N;
    float acc = 0.0f;
    for (int kb = lane; kb < k_blocks; kb += 32) {
        const qk_block_q b = qk_block(scales, zp, 0.0f, n, kb, k_blocks, bits, zp_bytes, zp_kind, s16, 0);
        const qk_u8* blk = B + (n * k_blocks + kb) * blob;
        int dot = 0;
        for (int i = 0; i < bs && kb * bs + i < K; ++i) dot += qa[m * K + kb * bs + i] * (qk_field(blk, bits, i) - (int)b.z);
        acc += QK_FMUL(sa[m * k_blocks + kb], b.s) * (float)dot;
    }
    for (int off = 16; off > 0; off >>= 1) acc += QK_SHFL_XOR(acc, off, 32);
    if (lane == 0) {
        if (has_bias) acc += qk_load_f(bias, n, y16);
        qk_store_f(Y, g, acc, y16);
    }
}

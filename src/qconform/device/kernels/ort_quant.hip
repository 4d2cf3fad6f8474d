/* ONNX Runtime quantized-weight family: MatMulNBits dequant and GEMV, GatherBlockQuantized,
 * fake quantization (Q then DQ) and the quantized SwiGLU chain (fused, and its unfused steps).
 *
 * Semantics: qconform.oracles.ort (../shared/specs/ort-ops.md sections 1-3). Weights are packed
 * along K, low bits first (qk_field); zero-point kinds: ZP_DEFAULT 2^(bits-1), ZP_PACKED uint8,
 * ZP_FLOAT per block in ORT's two-rounding form fp32(q*s) + fp32(-s*z), ZP_SCALAR one float in the
 * kernel form (q - z) * s. Every rounding-relevant fp32 operation is QK_FMUL/QK_FADD/QK_FDIV
 * followed by qk_ftz, so the dequantized values are the oracle's bit for bit; the GEMV sums in
 * fp32 in its own order (checked within the accumulation bound). Kernels take plain pointer and
 * int arguments (CuPy launches them; qconform.device.ort_launch says how). */
#include "qk_portable.h"

#define ZP_DEFAULT 0
#define ZP_PACKED 1
#define ZP_FLOAT 2
#define ZP_SCALAR 3

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

/* W (N, K) fp32, one thread per element */
extern "C" __global__ void __launch_bounds__(256)
qk_nbits_dequant(const qk_u8* B, const void* scales, const void* zp, float zps, float* out, int K, int N, int bits,
                 int bs, int k_blocks, int blob, int zp_bytes, int zp_kind, int s16, int z16) {
    const qk_i64 t = qk_global_thread();
    if (t >= (qk_i64)N * K) return;
    const qk_i64 n = t / K;
    const int k = (int)(t - n * K), kb = k / bs;
    const qk_block_q b = qk_block(scales, zp, zps, n, kb, k_blocks, bits, zp_bytes, zp_kind, s16, z16);
    out[t] = qk_weight(b, qk_field(B + (n * k_blocks + kb) * blob, bits, k - kb * bs));
}

/* Y (M, N) = A (M, K) @ W^T (+ bias): a group of 32 lanes per output element (width-32 shuffles:
 * a wave64 holds two groups). 2- and 4-bit weights are read as 32-bit words (one word never
 * spans two blocks: a block is at least 16 values) and turned into floats with the 2^23 magic
 * (byte_perm builds 0x4B0000qq): per block, sum a*q and sum a, then s*(sum a q - z*sum a), or
 * s*sum a q + fp32(-s*z)*sum a for float zero points. Other widths take the element path. */
__device__ __forceinline__ float qk_magic(qk_u32 v, int b) {
    return qk_float(QK_BYTE_PERM(v, 0x4B000000u, 0x7440u | (qk_u32)b)) - 8388608.0f;
}

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
            float dot = 0.0f, asum = 0.0f;
            if (k0 + per <= K) {
                const int fields = 8 / bits;  /* per byte */
                for (int j = 0; j < fields; ++j) {
                    const qk_u32 v = (word >> (bits * j)) & (bits == 2 ? 0x03030303u : 0x0F0F0F0Fu);
                    for (int by = 0; by < 4; ++by) {
                        const float av = qk_load_f(A, arow + k0 + fields * by + j, a16);
                        dot = fmaf(av, qk_magic(v, by), dot);
                        asum += av;
                    }
                }
            } else {
                for (int e = 0; e < per && k0 + e < K; ++e) {
                    const float av = qk_load_f(A, arow + k0 + e, a16);
                    dot = fmaf(av, (float)((word >> (bits * e)) & ((1u << bits) - 1u)), dot);
                    asum += av;
                }
            }
            if (b.kind == ZP_FLOAT) acc += b.s * dot + b.negsz * asum;
            else acc += b.s * (dot - b.z * asum);
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

/* ------------------------------------------------------------------ GatherBlockQuantized */
#define DT_UINT8 0
#define DT_INT4 1
#define DT_UINT4 2
#define DT_E4M3FN 3
#define DT_E5M2 4

/* fp8 codes -> float, exact (OCP/ONNX: e4m3fn bias 7, no inf, NaN = S.1111.111; e5m2 bias 15) */
__device__ __forceinline__ float qk_fp8(qk_u8 c, int e5m2) {
    const int sign = c >> 7;
    int e, m, mbits, bias;
    if (e5m2) { e = (c >> 2) & 31; m = c & 3; mbits = 2; bias = 15; }
    else { e = (c >> 3) & 15; m = c & 7; mbits = 3; bias = 7; }
    float v;
    if (e5m2 && e == 31) v = m ? qk_float(0x7FC00000u) : qk_float(0x7F800000u);
    else if (!e5m2 && e == 15 && m == 7) v = qk_float(0x7FC00000u);
    else if (e == 0) v = ldexpf((float)m, 1 - bias - mbits);
    else v = ldexpf((float)((1 << mbits) + m), e - bias - mbits);
    return sign ? -v : v;
}

extern "C" __global__ void __launch_bounds__(256)
qk_gather_block_quantized(const qk_u8* data, const qk_i64* indices, const void* scales, const qk_u8* zp, void* out,
                          int rows, int cols, int n_idx, int bits, int bs, int n_blocks, int dtype, int has_zp,
                          int s16, int row_bytes, int zp_row_bytes) {
    const qk_i64 t = qk_global_thread();
    if (t >= (qk_i64)n_idx * cols) return;
    const qk_i64 i = t / cols;
    const int c = (int)(t - i * cols), blk = c / bs;
    qk_i64 r = indices[i];
    if (r < 0) r += rows;
    if (r < 0 || r >= rows) { qk_store_f(out, t, 0.0f, s16); return; }
    const float s = qk_ftz(qk_load_f(scales, r * n_blocks + blk, s16));
    float v;
    if (dtype == DT_E4M3FN || dtype == DT_E5M2) {
        v = qk_ftz(QK_FMUL(qk_fp8(data[r * cols + c], dtype == DT_E5M2), s));
    } else {
        int d, z;
        if (dtype == DT_UINT8) {
            d = qk_field(data + r * row_bytes, bits, c);
            z = has_zp ? qk_field(zp + r * zp_row_bytes, bits, blk) : (1 << (bits - 1));
        } else {
            d = qk_field(data, 4, r * cols + c);
            z = has_zp ? qk_field(zp, 4, r * n_blocks + blk) : 0;
            if (dtype == DT_INT4) { d = d >= 8 ? d - 16 : d; z = z >= 8 ? z - 16 : z; }
        }
        v = qk_ftz(QK_FMUL((float)(d - z), s));
    }
    qk_store_f(out, t, v, s16);
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

/* fake_quantize on (rows, cols): granularity 0 per tensor, 1 per column (axis 1), 2 blocked
 * along axis 1 by bs; zero points widened to int32 by the launcher */
extern "C" __global__ void __launch_bounds__(256)
qk_fake_quantize(const void* x, const void* scale, const int* zp, void* y, int rows, int cols, int gran, int bs,
                 int lo, int hi, int x16, int has_zp) {
    const qk_i64 t = qk_global_thread();
    if (t >= (qk_i64)rows * cols) return;
    const qk_i64 r = t / cols;
    const int c = (int)(t - r * cols);
    const qk_i64 p = gran == 0 ? 0 : gran == 1 ? c : r * ((cols + bs - 1) / bs) + c / bs;
    const float s = qk_ftz(qk_load_f(scale, p, x16));
    const int z = has_zp ? zp[p] : 0;
    qk_store_f(y, t, qk_dequantize(qk_quantize(qk_load_f(x, t, x16), s, z, lo, hi), s, z), x16);
}

/* ------------------------------------------------------------------------ quantized SwiGLU */
/* sigmoid as the device computes it: 1 / (1 + expf(-g)), expf within 2 ulp (CUDA) -- the one
 * step of the chain that is not the oracle's bit for bit (qconform.oracles.ort.qswiglu) */
__device__ __forceinline__ float qk_sigmoid(float g) { return QK_FDIV(1.0f, QK_FADD(1.0f, expf(-g))); }

__device__ __forceinline__ int qk_load_q(const void* p, qk_i64 i, int is16) {
    return is16 ? (int)((const qk_u16*)p)[i] : (int)((const qk_u8*)p)[i];
}

__device__ __forceinline__ void qk_store_q(void* p, qk_i64 i, int v, int is16) {
    if (is16) ((qk_u16*)p)[i] = (qk_u16)v;
    else ((qk_u8*)p)[i] = (qk_u8)v;
}

/* the whole chain per element; p = {gate_s, up_s, sig_s, silu_s, out_s}, z likewise */
extern "C" __global__ void __launch_bounds__(256)
qk_qswiglu_fused(const void* gate, const void* up, void* out, qk_i64 n, float gs, int gz, float us, int uz, float ss,
                 int sz, float hs, int hz, float os, int oz, int hi, int is16) {
    const qk_i64 t = qk_global_thread();
    if (t >= n) return;
    const float g = qk_dequantize(qk_load_q(gate, t, is16), gs, gz);
    const float u = qk_dequantize(qk_load_q(up, t, is16), us, uz);
    const float sd = qk_dequantize(qk_quantize(qk_sigmoid(g), ss, sz, 0, hi), ss, sz);
    const float hd = qk_dequantize(qk_quantize(qk_ftz(QK_FMUL(g, sd)), hs, hz, 0, hi), hs, hz);
    qk_store_q(out, t, qk_quantize(qk_ftz(QK_FMUL(hd, u)), os, oz, 0, hi), is16);
}

/* the unfused steps: DQ to fp32, Q(Sigmoid(x)), and Q(a * b) */
extern "C" __global__ void __launch_bounds__(256)
qk_step_dequantize(const void* q, float* y, qk_i64 n, float s, int z, int is16) {
    const qk_i64 t = qk_global_thread();
    if (t < n) y[t] = qk_dequantize(qk_load_q(q, t, is16), s, z);
}

extern "C" __global__ void __launch_bounds__(256)
qk_step_sigmoid_quantize(const float* x, void* q, qk_i64 n, float s, int z, int hi, int is16) {
    const qk_i64 t = qk_global_thread();
    if (t < n) qk_store_q(q, t, qk_quantize(qk_sigmoid(x[t]), s, z, 0, hi), is16);
}

extern "C" __global__ void __launch_bounds__(256)
qk_step_mul_quantize(const float* a, const float* b, void* q, qk_i64 n, float s, int z, int hi, int is16) {
    const qk_i64 t = qk_global_thread();
    if (t < n) qk_store_q(q, t, qk_quantize(qk_ftz(QK_FMUL(a[t], b[t])), s, z, 0, hi), is16);
}

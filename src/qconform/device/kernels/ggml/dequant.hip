/* ggml weight-format dequantize kernels: Q4_0, Q4_K, Q5_K, Q6_K.
 *
 * Semantics: ggml-org/llama.cpp ggml/src/ggml-quants.c dequantize_row_q4_0, dequantize_row_q4_K
 * (with get_scale_min_k4), dequantize_row_q5_K, dequantize_row_q6_K; block layouts ggml-common.h
 *   block_q4_0 {fp16 d; u8 qs[16]}                                           18 bytes, 32 values
 *   block_q4_K {fp16 d; fp16 dmin; u8 scales[12]; u8 qs[128]}                144 bytes, 256 values
 *   block_q5_K {fp16 d; fp16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}     176 bytes, 256 values
 *   block_q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; fp16 d}                210 bytes, 256 values
 * (docs/ggml-formats.md 3.6, 3.9-3.11 and qconform.oracles.ggml give each rule).
 *
 * Rounding: every product and difference is one IEEE fp32 operation rounded to nearest even, in
 * ggml's C order, never contracted into an FMA (QK_FMUL, __fsub_rn), and each operand and result
 * is flushed (qk_ftz): bit-identical to oracles.ggml.dequantize(data, qtype, ftz=True).
 *   Q4_0        y = (float)(nibble - 8) * d
 *   Q4_K, Q5_K  d1 = d * sc, m1 = dmin * m (per sub-block of 32), y = d1 * q - m1
 *   Q6_K        dl = d * sc (per sub-block of 16, sc signed), y = dl * (q - 32)
 *
 * Launch ABI (the same for a user's hip: kernel, README "Kernel ABIs"):
 *   extern "C" __global__ void k(const void* in, void* out, long long n_blocks)
 *   blockDim.x = THREADS, gridDim.x = ceil(n_blocks * LANES / THREADS)
 * with (LANES, THREADS) per kernel in qconform/device/registry.py: Q4_0 4 x 256, the K-quants
 * 32 x 256. Each thread writes two float4 (16-byte stores; consecutive lanes write consecutive
 * float4, so a block's lanes cover its output in two contiguous runs). No shuffles and no
 * barriers: a thread past the last block returns at once. Inputs are read with loads no wider
 * than the block's alignment: 4 bytes for Q4_K / Q5_K (144 and 176 are multiples of 16), 2 bytes
 * for Q4_0 and Q6_K (18 and 210 are even only). */
#include "qk_portable.h"

#define Q4_0_VALUES 32
#define Q4_0_BYTES 18
#define QK_K 256
#define Q4_K_BYTES 144
#define Q5_K_BYTES 176
#define Q6_K_BYTES 210
#define KQ_LANES 32 /* lanes per K-quant super-block: 2 float4 each */

/* the four bytes at p, low byte first, p only 2-byte aligned */
__device__ __forceinline__ qk_u32 qk_load4_a2(const qk_u8* p) {
    const qk_u16* h = (const qk_u16*)p;
    return (qk_u32)h[0] | ((qk_u32)h[1] << 16);
}

/* ---------------------------------------------------------------------------------- Q4_0 */
/* Lane l (0..3) reads qs[4l .. 4l+3]: their low nibbles are values 4l .. 4l+3 (float4 l), their
 * high nibbles values 16+4l .. 16+4l+3 (float4 l+4). ggml: x0 = (qs[j] & 0x0F) - 8, y = x0 * d. */
__device__ __forceinline__ float qk_q4_0_value(float d, qk_u32 q, int b) {
    return qk_ftz(QK_FMUL((float)((int)((q >> (8 * b)) & 0xFu) - 8), d));
}

__device__ __forceinline__ float4 qk_q4_0_four(float d, qk_u32 q) {
    return make_float4(qk_q4_0_value(d, q, 0), qk_q4_0_value(d, q, 1), qk_q4_0_value(d, q, 2),
                       qk_q4_0_value(d, q, 3));
}

extern "C" __global__ void __launch_bounds__(256)
qk_q4_0_dequant(const void* in, void* out, qk_i64 n_blocks) {
    const qk_i64 gt = qk_global_thread();
    const qk_i64 blk = gt >> 2;
    if (blk >= n_blocks) return;
    const int l = (int)(gt & 3);
    const qk_u8* b = (const qk_u8*)in + blk * Q4_0_BYTES;
    const float d = qk_ftz(qk_fp16_to_float(*(const qk_u16*)b));
    const qk_u32 q = qk_load4_a2(b + 2 + 4 * l);
    float4* y = (float4*)out + blk * (Q4_0_VALUES / 4);
    y[l] = qk_q4_0_four(d, q);
    y[l + 4] = qk_q4_0_four(d, q >> 4);
}

/* ------------------------------------------------------------------------------ Q4_K, Q5_K */
/* Lane l = 8j + w (j = 0..3, w = 0..7) writes float4 l (values 32j + 4w .., sub-block j) and
 * float4 l + 32 (values 128 + 32j + 4w .., sub-block j + 4). Value e = 64c + 32t + i sits in
 * nibble t of qs[32c + i] (and, Q5_K, in bit e/32 of qh[i]): sub-blocks j and j + 4 share t =
 * j & 1 and i = 4w .. 4w+3, with c = j >> 1 and c + 2. */

/* get_scale_min_k4 (ggml-quants.c) of sub-blocks j (< 4) and j + 4 from the 12 packed bytes s:
 * j < 4:  sc = s[j] & 63,                       m = s[j+4] & 63
 * j >= 4: sc = (s[j+4] & 15) | (s[j-4] >> 6) << 4, m = (s[j+4] >> 4) | (s[j] >> 6) << 4 */
struct qk_scale_min_pair {
    int sc_lo, m_lo, sc_hi, m_hi;
};

__device__ __forceinline__ qk_scale_min_pair qk_scale_min_k4(const qk_u8* s, int j) {
    const int a = s[j], b = s[j + 4], c = s[j + 8];
    qk_scale_min_pair r;
    r.sc_lo = a & 63;
    r.m_lo = b & 63;
    r.sc_hi = (c & 0xF) | ((a >> 6) << 4);
    r.m_hi = (c >> 4) | ((b >> 6) << 4);
    return r;
}

/* y = d1 * q - m1 for the four unsigned byte codes of qv: two roundings, ggml's order */
__device__ __forceinline__ float qk_kq_value(float d1, float m1, qk_u32 qv, int b) {
    const float p = qk_ftz(QK_FMUL(d1, (float)((qv >> (8 * b)) & 0xFFu)));
    return qk_ftz(__fsub_rn(p, m1));
}

__device__ __forceinline__ float4 qk_kq_four(float d1, float m1, qk_u32 qv) {
    return make_float4(qk_kq_value(d1, m1, qv, 0), qk_kq_value(d1, m1, qv, 1), qk_kq_value(d1, m1, qv, 2),
                       qk_kq_value(d1, m1, qv, 3));
}

/* the shared body: blk's header is d and dmin (one 4-byte load) then scales[12] at byte 4;
 * lo, hi are the byte codes of the lane's two float4 (sub-blocks j and j + 4) */
__device__ __forceinline__ void qk_kq_store(const qk_u8* b, float4* y, int l, qk_u32 lo, qk_u32 hi) {
    const qk_u32 dd = *(const qk_u32*)b;
    const float d = qk_ftz(qk_fp16_to_float((qk_u16)(dd & 0xFFFFu)));
    const float dmin = qk_ftz(qk_fp16_to_float((qk_u16)(dd >> 16)));
    const qk_scale_min_pair sm = qk_scale_min_k4(b + 4, l >> 3);
    const float d1_lo = qk_ftz(QK_FMUL(d, (float)sm.sc_lo)), m1_lo = qk_ftz(QK_FMUL(dmin, (float)sm.m_lo));
    const float d1_hi = qk_ftz(QK_FMUL(d, (float)sm.sc_hi)), m1_hi = qk_ftz(QK_FMUL(dmin, (float)sm.m_hi));
    y[l] = qk_kq_four(d1_lo, m1_lo, lo);
    y[l + KQ_LANES] = qk_kq_four(d1_hi, m1_hi, hi);
}

extern "C" __global__ void __launch_bounds__(256)
qk_q4_k_dequant(const void* in, void* out, qk_i64 n_blocks) {
    const qk_i64 gt = qk_global_thread();
    const qk_i64 blk = gt >> 5;
    if (blk >= n_blocks) return;
    const int l = (int)(gt & 31), j = l >> 3, w = l & 7;
    const qk_u8* b = (const qk_u8*)in + blk * Q4_K_BYTES;
    const qk_u32* qs = (const qk_u32*)(b + 16 + 32 * (j >> 1)) + w;
    const int t = 4 * (j & 1);
    const qk_u32 lo = (qs[0] >> t) & 0x0F0F0F0Fu;
    const qk_u32 hi = (qs[64 / 4] >> t) & 0x0F0F0F0Fu;
    qk_kq_store(b, (float4*)out + blk * (QK_K / 4), l, lo, hi);
}

extern "C" __global__ void __launch_bounds__(256)
qk_q5_k_dequant(const void* in, void* out, qk_i64 n_blocks) {
    const qk_i64 gt = qk_global_thread();
    const qk_i64 blk = gt >> 5;
    if (blk >= n_blocks) return;
    const int l = (int)(gt & 31), j = l >> 3, w = l & 7;
    const qk_u8* b = (const qk_u8*)in + blk * Q5_K_BYTES;
    const qk_u32* qs = (const qk_u32*)(b + 48 + 32 * (j >> 1)) + w;
    const qk_u32 qh = ((const qk_u32*)(b + 16))[w];
    const int t = 4 * (j & 1);
    /* q = nibble + 16 * bit (sub-block j: bit j of qh[i]) */
    const qk_u32 lo = ((qs[0] >> t) & 0x0F0F0F0Fu) | (((qh >> j) & 0x01010101u) << 4);
    const qk_u32 hi = ((qs[64 / 4] >> t) & 0x0F0F0F0Fu) | (((qh >> (j + 4)) & 0x01010101u) << 4);
    qk_kq_store(b, (float4*)out + blk * (QK_K / 4), l, lo, hi);
}

/* ---------------------------------------------------------------------------------- Q6_K */
/* Lane l = 8k + w (k = 0..3, w = 0..7) writes float4 l + 32h for h = 0, 1: values
 * e = 128h + 32k + 4w .. +3. ggml: lo4 = nibble k >> 1 of ql[64h + 32(k & 1) + i], hi2 = bits
 * 2k, 2k+1 of qh[32h + i] (i = e % 32), q = (lo4 | hi2 << 4) - 32, sub-block g = e / 16 =
 * 8h + 2k + (w >> 2) with the signed scale scales[g]; y = d * sc * q evaluated as (d * sc) * q. */
__device__ __forceinline__ float qk_q6_value(float dl, qk_u32 qv, int b) {
    return qk_ftz(QK_FMUL(dl, (float)((int)((qv >> (8 * b)) & 0x3Fu) - 32)));
}

__device__ __forceinline__ float4 qk_q6_four(const qk_u8* b, float d, int k, int w, int h) {
    const qk_u32 ql = qk_load4_a2(b + 64 * h + 32 * (k & 1) + 4 * w);
    const qk_u32 qh = qk_load4_a2(b + 128 + 32 * h + 4 * w);
    const qk_u32 qv = ((ql >> (4 * (k >> 1))) & 0x0F0F0F0Fu) | (((qh >> (2 * k)) & 0x03030303u) << 4);
    const int g = 8 * h + 2 * k + (w >> 2);
    const float dl = qk_ftz(QK_FMUL(d, (float)(qk_i8)b[192 + g]));
    return make_float4(qk_q6_value(dl, qv, 0), qk_q6_value(dl, qv, 1), qk_q6_value(dl, qv, 2),
                       qk_q6_value(dl, qv, 3));
}

extern "C" __global__ void __launch_bounds__(256)
qk_q6_k_dequant(const void* in, void* out, qk_i64 n_blocks) {
    const qk_i64 gt = qk_global_thread();
    const qk_i64 blk = gt >> 5;
    if (blk >= n_blocks) return;
    const int l = (int)(gt & 31), k = l >> 3, w = l & 7;
    const qk_u8* b = (const qk_u8*)in + blk * Q6_K_BYTES;
    const float d = qk_ftz(qk_fp16_to_float(*(const qk_u16*)(b + 208)));
    float4* y = (float4*)out + blk * (QK_K / 4);
    y[l] = qk_q6_four(b, d, k, w, 0);
    y[l + KQ_LANES] = qk_q6_four(b, d, k, w, 1);
}

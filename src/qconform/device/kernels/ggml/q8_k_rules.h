/* ggml's Q8_K activation quantization, one super-block's arithmetic: ggml-org/ggml src/ggml-quants.c
 * quantize_row_q8_K_ref as built for x86-64 (qconform.oracles.ggml documents each rule), block_q8_K
 * {float d; int8 qs[256]; int16 bsums[16]} (ggml-common.h, 292 bytes). Shared by the quantize kernels
 * (q8_quant.hip) and the keep-quant GEMV that quantizes its activation row itself
 * (keep_quant_fast.hip, -DQK_KF_FUSED); the includer brings qk_portable.h. */
#ifndef QK_Q8_K_RULES_H
#define QK_Q8_K_RULES_H

#define QK_K 256
#define Q8_K_BYTES 292
#define Q8_K_QS 4
#define Q8_K_BSUMS 260

/* ggml nearest_int(f) (ggml-quants.c:621) on x86-64: f + 1.5*2^23 in fp32, low 22 mantissa
 * bits; round half to even. x86 keeps an input NaN's payload through the multiply and add
 * (quieting sets bit 22), a NaN made by the arithmetic (0 * inf) is the default NaN and gives 0. */
__device__ __forceinline__ int qk_nearest_int_x86(float f, float src) {
    if (qk_isnan(f)) return qk_isnan(src) ? (int)(qk_bits(src) & 0x3FFFFFu) : 0;
    float v = QK_FADD(f, 12582912.0f);
    return (int)(qk_bits(v) & 0x7FFFFFu) - 0x400000;
}

/* one Q8_K value: MIN(127, nearest_int(iscale * x)) as int8 (two's-complement wrap) */
__device__ __forceinline__ int qk_q8_k_value(float iscale, float x) {
    float p = qk_ftz(QK_FMUL(iscale, qk_ftz(x)));
    int q = qk_nearest_int_x86(p, x);
    return (int)(qk_i8)(q < 127 ? q : 127);
}

/* One super-block by LANES lanes of a shuffle group (width LANES, so the same on wave32 and wave64):
 * lane l holds float4 number LANES k + l of it in v[k] and writes those quants, its bsums (group
 * (LANES k + l) / 4 summed over a quad of lanes) and, lane 0, d to block slot of the blocks at ys. Each lane takes the
 * first strict max of |x| over its values in index order, then the lanes reduce (|x|, index) with
 * shuffles: larger |x| wins, on equal |x| the lower index -- exactly the reference's first strict
 * max. Every lane of the group takes part (the shuffles). */
template <int LANES>
__device__ __forceinline__ void qk_q8_k_block_lanes(const float4 (&v)[64 / LANES], int l, qk_u8* ys, int slot) {
    constexpr int NV = 64 / LANES; /* float4 a lane */
    float amax = 0.0f, mx = 0.0f;
    int idx = QK_K;
    for (int k = 0; k < NV; ++k) {
        const float c[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
        for (int b = 0; b < 4; ++b) {
            float x = qk_ftz(c[b]);
            float a = fabsf(x);
            if (a > amax) { amax = a; mx = x; idx = 4 * (LANES * k + l) + b; }
        }
    }
    for (int m = 1; m < LANES; m <<= 1) {
        float oa = QK_SHFL_XOR(amax, m, LANES);
        float om = QK_SHFL_XOR(mx, m, LANES);
        int oi = QK_SHFL_XOR(idx, m, LANES);
        if (oa > amax || (oa == amax && oi < idx)) { amax = oa; mx = om; idx = oi; }
    }
    const bool zero = amax == 0.0f;
    const float iscale = zero ? 0.0f : qk_ftz(QK_FDIV(-127.0f, mx));
    qk_u8* y = ys + slot * Q8_K_BYTES;
    for (int k = 0; k < NV; ++k) {
        const float c[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
        qk_u32 word = 0u;
        int sum = 0;
        for (int b = 0; b < 4; ++b) {
            int q = zero ? 0 : qk_q8_k_value(iscale, c[b]);
            sum += q;
            word |= ((qk_u32)q & 0xFFu) << (8 * b);
        }
        sum += QK_SHFL_XOR(sum, 1, LANES);
        sum += QK_SHFL_XOR(sum, 2, LANES);
        ((qk_u32*)(y + Q8_K_QS))[LANES * k + l] = word;
        if ((l & 3) == 0) ((qk_i16*)(y + Q8_K_BSUMS))[(LANES / 4) * k + (l >> 2)] = (qk_i16)sum;
    }
    if (l == 0) *(float*)y = zero ? 0.0f : qk_ftz(QK_FDIV(1.0f, iscale));
}

#endif

/* bitsandbytes 4-bit GEMM kernels' shared pieces (bnb/gemm_simt.hip, bnb/gemm_mma.hip): the float32
 * centroid tables, the bf16 rounding, the pair-table offsets of a byte of W and the streamed 16-byte
 * loads of W. Include after qk_portable.h. */
#ifndef QK_BNB_GEMM_COMMON_H
#define QK_BNB_GEMM_COMMON_H

/* the float32 tables (functional.py get_4bit_type("nf4"); the native FP4 table, code 8 is -0) */
__constant__ qk_u32 QK_GEMM_NF4_BITS[16] = {
    0xBF800000u, 0xBF3239B1u, 0xBF066B30u, 0xBECA32A0u, 0xBE91A24Du, 0xBE3D353Fu, 0xBDBA7871u, 0x00000000u,
    0x3DA2FAFFu, 0x3E24CAE3u, 0x3E7C04DDu, 0x3EAD033Au, 0x3EE1A4B8u, 0x3F1007ABu, 0x3F3913B3u, 0x3F800000u,
};
__constant__ qk_u32 QK_GEMM_FP4_BITS[16] = {
    0x00000000u, 0x3BAAAAABu, 0x3F2AAAABu, 0x3F800000u, 0x3EAAAAABu, 0x3F000000u, 0x3E2AAAABu, 0x3E800000u,
    0x80000000u, 0xBBAAAAABu, 0xBF2AAAABu, 0xBF800000u, 0xBEAAAAABu, 0xBF000000u, 0xBE2AAAABu, 0xBE800000u,
};

/* fp32 bits -> bf16 bits, round to nearest even; NaN -> 0x7FC0 */
__device__ __forceinline__ qk_u16 qk_gemm_bf16_bits(float v) {
    const qk_u32 u = qk_bits(v);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (qk_u16)0x7FC0u;
    return (qk_u16)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* byte j (0..3) of w times 128, or-ed with `low` (< 128): the byte offset of the pair table's entry
 * for that byte in the copy `low` / 4 (a shift and one LOP3) */
__device__ __forceinline__ qk_u32 qk_bnb_pair_at(qk_u32 w, int j, qk_u32 low) {
    return qk_and_or(j == 0 ? w << 7 : w >> (8 * j - 7), 0x7F80u, low);
}

/* 16 bytes of W, read once (streamed past L1 on CUDA) */
__device__ __forceinline__ uint4 qk_bnb_weights(const qk_u8* p) {
#if defined(QK_CUDA) && defined(__CUDA_ARCH__)
    uint4 v; /* what __ldcs emits, without relying on NVRTC's headers */
    asm("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
#else
    return *(const uint4*)p;
#endif
}

#endif /* QK_BNB_GEMM_COMMON_H */

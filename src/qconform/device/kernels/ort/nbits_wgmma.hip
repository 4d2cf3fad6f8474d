/* ONNX Runtime quantized-weight family: MatMulNBits prefill on Hopper's warpgroup matrix units.
 * Semantics: qconform.oracles.ort; the sums are qk_nbits_gemm's (ort/nbits_mma.hip): per 64-wide K
 * chunk d = sum over the chunk of a (q - z), exact fp16 products summed in fp32 by the matrix unit
 * (here wgmma's order), then acc = fma(s, d, acc) in chunk order, bias added in fp32, one rounding
 * to fp16. Facts (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate" and its
 * "Matrix Descriptor" and "Shared Memory Matrix Layout" sections): wgmma.mma_async reads both
 * operands from shared memory through 64-bit descriptors (start address >> 4 in bits 0-13, leading
 * byte offset >> 4 in 16-29, stride byte offset >> 4 in 32-45, swizzle in 62-63: 1 = 128-byte);
 * with the 128-byte swizzle a K-major tile's row of 64 halves is 128 bytes whose 16-byte pieces are
 * permuted by piece ^ (row % 8), 8 rows (1024 bytes, the stride byte offset) to a core-matrix group,
 * the tile 1024-byte aligned; a k16 step is the start address plus 32 bytes. The accumulator of
 * m64nNk16 (f32): warp w of the warpgroup holds rows 16 w + g and 16 w + g + 8 (g = lane / 4),
 * columns 8 j + 2 t, + 1 (t = lane % 4) in d[4 j .. 4 j + 3]. Writes to shared memory by ordinary
 * stores and cp.async reach wgmma after fence.proxy.async. wgmma exists on sm_90a only
 * (__CUDA_ARCH_FEAT_SM90_ALL); elsewhere these kernels trap and the launcher never picks them.
 *
 * A CTA of two warpgroups owns 128 tokens (wgmma's M, 64 a warpgroup) x 128 weight rows (its N). Per
 * 64-wide K chunk c, S - 1 chunks ahead, cp.async copies the activations (into the swizzled layout)
 * and the raw weight bytes and scale words (ZP: and the word holding the row's packed zero point,
 * its field picked when converting, as qk_nbits_gemm's _z twin does); one chunk ahead, each thread turns the weight bytes it
 * copied into the exact fp16 pairs q - z (1024 + q from the 0x6400 magic, minus 1024 + z) of the
 * swizzled fp16 stage, and its scale into fp32; one barrier a chunk. Chunk c's wgmma runs while
 * chunk c - 1's sums are scaled into acc (two sets of sums, alternating). */
#include "ort_common.h"
#include "qk_bulk.h"

#if defined(QK_CUDA) && defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define QK_WGMMA 1
#else
#define QK_WGMMA 0
#endif

#if QK_WGMMA
typedef unsigned long long qk_u64;

/* the descriptor of a K-major, 128-byte swizzled tile at shared address addr (1024-aligned, plus
 * 32 bytes a k16 step) */
__device__ __forceinline__ qk_u64 qk_wgmma_desc(qk_u32 addr) {
    return (qk_u64)((addr & 0x3FFFFu) >> 4) | (qk_u64)1 << 16 | (qk_u64)(1024 >> 4) << 32 | (qk_u64)1 << 62;
}

/* d (+)= A (64 x 16, desc a) B^T (128 x 16, desc b); scale_d 0: d = A B^T */
__device__ __forceinline__ void qk_wgmma_m64n128k16(float d[64], qk_u64 a, qk_u64 b, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(a), "l"(b), "r"(scale_d));
}

/* d (+)= A (64 x 16: this thread's fragment a, registers) B^T (256 x 16, desc b); the fragment of A
 * (PTX ISA, "Register Fragments and Shared Memory Matrix Layouts", matrix A of .f16 in registers, as
 * mma.m16n8k16's A a warp): warp w of the warpgroup holds rows 16 w + g (a0, a2) and 16 w + g + 8 (a1,
 * a3), a0 / a1 columns 2 t, + 1 and a2 / a3 columns 2 t + 8, + 9; d: d[0] columns 0..127, d[1] 128..255 */
__device__ __forceinline__ void qk_wgmma_m64n256k16_rs(float (&d)[2][64], const qk_u32 (&a)[4], qk_u64 b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[0][4]), "+f"(d[0][5]), "+f"(d[0][6]), "+f"(d[0][7]),
          "+f"(d[0][8]), "+f"(d[0][9]), "+f"(d[0][10]), "+f"(d[0][11]), "+f"(d[0][12]), "+f"(d[0][13]), "+f"(d[0][14]), "+f"(d[0][15]),
          "+f"(d[0][16]), "+f"(d[0][17]), "+f"(d[0][18]), "+f"(d[0][19]), "+f"(d[0][20]), "+f"(d[0][21]), "+f"(d[0][22]), "+f"(d[0][23]),
          "+f"(d[0][24]), "+f"(d[0][25]), "+f"(d[0][26]), "+f"(d[0][27]), "+f"(d[0][28]), "+f"(d[0][29]), "+f"(d[0][30]), "+f"(d[0][31]),
          "+f"(d[0][32]), "+f"(d[0][33]), "+f"(d[0][34]), "+f"(d[0][35]), "+f"(d[0][36]), "+f"(d[0][37]), "+f"(d[0][38]), "+f"(d[0][39]),
          "+f"(d[0][40]), "+f"(d[0][41]), "+f"(d[0][42]), "+f"(d[0][43]), "+f"(d[0][44]), "+f"(d[0][45]), "+f"(d[0][46]), "+f"(d[0][47]),
          "+f"(d[0][48]), "+f"(d[0][49]), "+f"(d[0][50]), "+f"(d[0][51]), "+f"(d[0][52]), "+f"(d[0][53]), "+f"(d[0][54]), "+f"(d[0][55]),
          "+f"(d[0][56]), "+f"(d[0][57]), "+f"(d[0][58]), "+f"(d[0][59]), "+f"(d[0][60]), "+f"(d[0][61]), "+f"(d[0][62]), "+f"(d[0][63]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[1][4]), "+f"(d[1][5]), "+f"(d[1][6]), "+f"(d[1][7]),
          "+f"(d[1][8]), "+f"(d[1][9]), "+f"(d[1][10]), "+f"(d[1][11]), "+f"(d[1][12]), "+f"(d[1][13]), "+f"(d[1][14]), "+f"(d[1][15]),
          "+f"(d[1][16]), "+f"(d[1][17]), "+f"(d[1][18]), "+f"(d[1][19]), "+f"(d[1][20]), "+f"(d[1][21]), "+f"(d[1][22]), "+f"(d[1][23]),
          "+f"(d[1][24]), "+f"(d[1][25]), "+f"(d[1][26]), "+f"(d[1][27]), "+f"(d[1][28]), "+f"(d[1][29]), "+f"(d[1][30]), "+f"(d[1][31]),
          "+f"(d[1][32]), "+f"(d[1][33]), "+f"(d[1][34]), "+f"(d[1][35]), "+f"(d[1][36]), "+f"(d[1][37]), "+f"(d[1][38]), "+f"(d[1][39]),
          "+f"(d[1][40]), "+f"(d[1][41]), "+f"(d[1][42]), "+f"(d[1][43]), "+f"(d[1][44]), "+f"(d[1][45]), "+f"(d[1][46]), "+f"(d[1][47]),
          "+f"(d[1][48]), "+f"(d[1][49]), "+f"(d[1][50]), "+f"(d[1][51]), "+f"(d[1][52]), "+f"(d[1][53]), "+f"(d[1][54]), "+f"(d[1][55]),
          "+f"(d[1][56]), "+f"(d[1][57]), "+f"(d[1][58]), "+f"(d[1][59]), "+f"(d[1][60]), "+f"(d[1][61]), "+f"(d[1][62]), "+f"(d[1][63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(1));
}

/* the accumulators are not touched across this point (the compiler keeps them in place) */
__device__ __forceinline__ void qk_wgmma_fence_operands(float d[64]) {
    asm volatile(""
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                 "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                 "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                 "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                 "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                 "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                 "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 :
                 : "memory");
}

__device__ __forceinline__ void qk_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void qk_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void qk_wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void qk_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ void qk_cp_async8(qk_u32 dst, const void* src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void qk_cp_async16s(qk_u32 dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void qk_cp_async4s(qk_u32 dst, const void* src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

/* the box at (x, y) (x the inner dimension, in elements) of the 2-D tensor map at tmap into dst, completing
 * on the mbarrier bar (PTX ISA "cp.async.bulk.tensor"; the mbarriers: qk_bulk.h); the tensor map is a
 * kernel parameter (__grid_constant__), addressed generically */
__device__ __forceinline__ void qk_tma_2d(qk_u32 dst, qk_u64 tmap, int x, int y, qk_u32 bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                 ::"r"(dst), "l"(tmap), "r"(x), "r"(y), "r"(bar)
                 : "memory");
}

__device__ __forceinline__ qk_u32 qk_sub_f16x2(qk_u32 a, qk_u32 b) {
    qk_u32 r;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

__device__ __forceinline__ qk_u32 qk_mul_f16x2(qk_u32 a, qk_u32 b) {
    qk_u32 r;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

__device__ __forceinline__ qk_u32 qk_fma_f16x2(qk_u32 a, qk_u32 b, qk_u32 c) {
    qk_u32 r;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

/* the byte_perm selector of qk_wg_pair's (and qk_wg_code_pair's) byte: (byte of lo, byte of hi) twice */
__device__ __forceinline__ qk_u32 qk_wg_pair_selector(int byte) {
    return (qk_u32)(byte | byte << 4 | (4 + byte) << 8 | (4 + byte) << 12);
}
/* prmt.b32 in its default mode: sel's nibbles already below 8 (__byte_perm masks them first) */
__device__ __forceinline__ qk_u32 qk_prmt(qk_u32 a, qk_u32 b, qk_u32 sel) {
    qk_u32 r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}
/* the fold kernel's code pair without shifting the word: its byte (selector qk_wg_pair_selector(byte)) in
 * both halves, each half's code kept where it lies (mask: bits e .. e + BITS - 1 of the half), so the half is
 * the fp16 1024 + 2^e q. Then fma(x, 2^-e, -(1024 2^-e + z)) is q - z exactly: the product is exact and the
 * sum a small integer */
__device__ __forceinline__ qk_u32 qk_wg_code_pair(qk_u32 w, qk_u32 sel, qk_u32 mask) {
    return qk_and_or(qk_prmt(w, w, sel), mask, 0x64006400u);
}
/* the exact fp16 pair (q_lo - z, q_hi - z): lo / hi the words whose byte `byte` holds the two codes
 * in its low bits (mask), off = the pair 1024 + z */
__device__ __forceinline__ qk_u32 qk_wg_pair(qk_u32 lo, qk_u32 hi, int byte, qk_u32 mask, qk_u32 off) {
    return qk_sub_f16x2(qk_and_or(__byte_perm(lo, hi, qk_wg_pair_selector(byte)), mask, 0x64006400u), off);
}

/* x itself, through a shuffle from the lane's own register (src_lane: the caller's lane): the fold kernel's
 * per-thread constants, made once before its chunks, which ptxas otherwise makes again in every chunk from
 * the thread index (it does not remake a shuffle's result) */
__device__ __forceinline__ qk_u32 qk_wg_pin(qk_u32 x, int src_lane) { return QK_SHFL(x, src_lane, 32); }
__device__ __forceinline__ int qk_wg_pin(int x, int src_lane) { return QK_SHFL(x, src_lane, 32); }
__device__ __forceinline__ qk_u64 qk_wg_pin64(qk_u64 x, int src_lane) {
    return (qk_u64)qk_wg_pin((qk_u32)x, src_lane) | (qk_u64)qk_wg_pin((qk_u32)(x >> 32), src_lane) << 32;
}

/* the staged output tile (TOK token rows of YROW halves, ROWS outputs each) to Y (M x N, token-major):
 * 16 bytes a thread (y_vec: N % 8 == 0 and Y 16-byte aligned) or single halves at the tails; 256 threads */
template <int TOK, int ROWS, int YROW>
__device__ __forceinline__ void qk_wg_store_tile(const qk_u16* sY, qk_u16* Y, int tok0, int row0, int M, int N, int y_vec) {
    for (int i = (int)threadIdx.x; i < TOK * (ROWS / 8); i += 256) {
        const int tl = i / (ROWS / 8), n = row0 + 8 * (i % (ROWS / 8)), tok = tok0 + tl;
        if (tok >= M || n >= N) continue;
        const qk_u16* src = sY + tl * YROW + (n - row0);
        qk_u16* dst = Y + (qk_i64)tok * N + n;
        if (y_vec) {
            *(uint4*)dst = *(const uint4*)src;
            continue;
        }
        for (int e = 0; e < 8 && n + e < N; ++e) dst[e] = src[e];
    }
}

/* Shared memory (from a 1024-aligned base): S activation stages (BM tokens x 128 bytes, swizzled;
 * warpgroup w's 64 tokens at 8 KB w), 3 fp16 weight stages (BN rows x 128 bytes, swizzled: chunk c's
 * is written while chunks c - 1 and c - 2 may still be read), S raw weight stages (BN rows x 8 BITS
 * bytes), S raw scale-word stages (BN x 4 bytes), 4 fp32 scale stages (BN floats in the order the
 * accumulators read them: 4 runs of 32, 36 floats apart, conflict-free 16-byte reads); ZP: S stages of
 * the 4-byte word holding each thread's row's packed zero point (2 BN words). The output tile reuses
 * the activation stages. registry.wgmma_smem says the same. */
template <int BITS, int S, bool ZP>
struct QkWgLayout {
    static constexpr int BN = 128, BM = 128;
    static constexpr int A_STAGE = BM * 128, B_STAGE = BN * 128, W_STAGE = BN * 8 * BITS;
    static constexpr int A0 = 0, B0 = A0 + S * A_STAGE, W0 = B0 + 3 * B_STAGE, SC0 = W0 + S * W_STAGE;
    static constexpr int SF_STAGE = 4 * 36 * 4; /* 4 lane quads' 32 scales, 36 floats apart */
    static constexpr int SF0 = SC0 + S * BN * 4, ZW0 = SF0 + 4 * SF_STAGE;
    static constexpr int BYTES = ZW0 + (ZP ? S * 2 * BN * 4 : 0); /* ZP: a zero-point word a thread */
};

template <int BITS, int S, bool ZP>
__device__ __forceinline__ void qk_nbits_wgmma(const qk_u16* A, const qk_u8* B, const qk_u16* scales, const qk_u8* zp,
                                               const qk_u16* bias, qk_u16* Y, int M, int K, int N, int cpb_shift,
                                               int k_blocks, int zp_bytes, int has_bias, int y_vec) {
    typedef QkWgLayout<BITS, S, ZP> L;
    extern __shared__ __align__(1024) qk_u8 qk_wg_smem[];
    const qk_u32 raw_base = (qk_u32)__cvta_generic_to_shared(qk_wg_smem);
    const qk_u32 base = (raw_base + 1023u) & ~1023u;
    qk_u8* const gbase = qk_wg_smem + (base - raw_base);
    const int tid = (int)threadIdx.x, wg = tid >> 7, wt = tid & 127, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int wq = wt >> 5; /* the warp in its warpgroup */
    const int tok0 = (int)blockIdx.x * L::BM, row0 = (int)blockIdx.y * L::BN;
    const int n_chunks = (K + 63) >> 6;
    const qk_i64 row_bytes = (qk_i64)k_blocks * ((64 << cpb_shift) * BITS / 8);

    /* this thread's copies: activations (4 pieces of 16 bytes: tokens wt / 8 + 16 j of its warpgroup,
     * K 8 (wt % 8)), raw weights (row tid / 2, half tid % 2 of the chunk's bytes), a scale word (tid < BN) */
    const int a_tok = wt >> 3, a_q = wt & 7;
    const qk_u32 a_dst = (qk_u32)(wg * 8192 + a_tok * 128 + ((a_q ^ (a_tok & 7)) << 4));
    const qk_u16* a_src = A + (qk_i64)min(tok0 + 64 * wg + a_tok, M - 1) * K + 8 * a_q;
    int a_rows = 0; /* its pieces j < a_rows lie inside M */
#pragma unroll
    for (int j = 0; j < 4; ++j) a_rows += tok0 + 64 * wg + a_tok + 16 * j < M ? 1 : 0;
    const int w_row = tid >> 1, w_half = tid & 1;
    int b_off[4]; /* the swizzled 16-byte pieces 4 half + i of its row in an fp16 weight stage */
#pragma unroll
    for (int i = 0; i < 4; ++i) b_off[i] = w_row * 128 + (((4 * w_half + i) ^ (w_row & 7)) << 4);
    const qk_u8* w_src = B + (qk_i64)min(row0 + w_row, N - 1) * row_bytes + w_half * 4 * BITS;
    const qk_i64 s_idx = tid < L::BN ? (qk_i64)min(row0 + tid, N - 1) * k_blocks : -1;
    const qk_i64 n_scales = (qk_i64)N * k_blocks;
    /* ZP: its row's packed zero points and the bit of its first field in the 4-byte word holding them
     * (the words 4-aligned from the tensor's start; zeros past its end) */
    const qk_u8* const z_row = ZP ? zp + (qk_i64)min(row0 + w_row, N - 1) * zp_bytes : nullptr;
    const qk_u8* const z_end = ZP ? zp + (qk_i64)N * zp_bytes : nullptr;
    const int z_bit = ZP ? (int)(((qk_i64)min(row0 + w_row, N - 1) * zp_bytes) & 3) * 8 : 0;
    /* row tid's place in an fp32 scale stage: lane quad t's 32 scales (rows 8 j + 2 t, + 1) at 36 t */
    const int sf_pos = ((tid >> 1) & 3) * 36 + 2 * (tid >> 3) + (tid & 1);

    auto issue = [&](int c) {
        const int st = c % S;
        const bool in_k = 64 * c + 8 * a_q < K;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const bool in = in_k && j < a_rows;
            qk_cp_async16s(base + L::A0 + st * L::A_STAGE + a_dst + j * 2048,
                           in ? (const void*)(a_src + (qk_i64)16 * j * K + 64 * c) : (const void*)A, in ? 16 : 0);
        }
        const qk_u32 wd = base + L::W0 + st * L::W_STAGE + tid * 4 * BITS;
        if (BITS == 4) qk_cp_async16s(wd, w_src + (qk_i64)c * 32, 16);
        else qk_cp_async8(wd, w_src + (qk_i64)c * 16, 8);
        if (ZP) {
            const qk_u8* word = (const qk_u8*)((size_t)(z_row + (((c >> cpb_shift) * BITS) >> 3)) & ~(size_t)3);
            qk_cp_async4s(base + L::ZW0 + st * 2 * L::BN * 4 + tid * 4, word, (int)min((qk_i64)4, (qk_i64)(z_end - word)));
        }
        if (s_idx >= 0) {
            const qk_i64 idx = s_idx + (c >> cpb_shift);
            qk_cp_async4s(base + L::SC0 + st * L::BN * 4 + tid * 4, scales + (idx & ~(qk_i64)1),
                          (idx | 1) < n_scales ? 4 : 2);
        }
    };
    /* chunk c's raw weights and scale (this thread's own copies) -> fp16 stage c % 3, fp32 scales c % 4 */
    const qk_u32 zdef = 0x64006400u + (qk_u32)(1 << (BITS - 1)) * 0x00010001u;
    auto dequant = [&](int c) {
        const int st = c % S;
        qk_u32 zoff = zdef; /* the pair 1024 + z: the default zero point, or its row's packed one */
        if (ZP) {
            const qk_u32 word = *(const qk_u32*)(gbase + L::ZW0 + st * 2 * L::BN * 4 + tid * 4);
            const qk_u32 zi = (word >> ((z_bit + (c >> cpb_shift) * BITS) & 31)) & ((1u << BITS) - 1u);
            zoff = 0x64006400u + zi * 0x00010001u;
        }
        const qk_u32* raw = (const qk_u32*)(gbase + L::W0 + st * L::W_STAGE + tid * 4 * BITS);
        qk_u8* const bh = gbase + L::B0 + (c % 3) * L::B_STAGE;
        if (BITS == 4) {
            const uint4 v = *(const uint4*)raw;
            const qk_u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int j = 0; j < 4; ++j) { /* K 32 half + 8 j .. + 7: piece 4 half + j */
                const qk_u32 hi = w[j] >> 4;
                uint4 o;
                o.x = qk_wg_pair(w[j], hi, 0, 0x000F000Fu, zoff);
                o.y = qk_wg_pair(w[j], hi, 1, 0x000F000Fu, zoff);
                o.z = qk_wg_pair(w[j], hi, 2, 0x000F000Fu, zoff);
                o.w = qk_wg_pair(w[j], hi, 3, 0x000F000Fu, zoff);
                *(uint4*)(bh + b_off[j]) = o;
            }
        } else {
            const uint2 v = *(const uint2*)raw;
            const qk_u32 w[2] = {v.x, v.y};
#pragma unroll
            for (int j = 0; j < 2; ++j) { /* K 32 half + 16 j .. + 15: pieces 4 half + 2 j, + 1 */
                const qk_u32 v1 = w[j] >> 2, v2 = w[j] >> 4, v3 = w[j] >> 6;
                uint4 o0, o1;
                o0.x = qk_wg_pair(w[j], v1, 0, 0x00030003u, zoff);
                o0.y = qk_wg_pair(v2, v3, 0, 0x00030003u, zoff);
                o0.z = qk_wg_pair(w[j], v1, 1, 0x00030003u, zoff);
                o0.w = qk_wg_pair(v2, v3, 1, 0x00030003u, zoff);
                o1.x = qk_wg_pair(w[j], v1, 2, 0x00030003u, zoff);
                o1.y = qk_wg_pair(v2, v3, 2, 0x00030003u, zoff);
                o1.z = qk_wg_pair(w[j], v1, 3, 0x00030003u, zoff);
                o1.w = qk_wg_pair(v2, v3, 3, 0x00030003u, zoff);
                *(uint4*)(bh + b_off[2 * j]) = o0;
                *(uint4*)(bh + b_off[2 * j + 1]) = o1;
            }
        }
        if (s_idx >= 0) {
            const qk_i64 idx = s_idx + (c >> cpb_shift);
            const qk_u32 word = *(const qk_u32*)(gbase + L::SC0 + st * L::BN * 4 + tid * 4);
            ((float*)(gbase + L::SF0 + (c & 3) * L::SF_STAGE))[sf_pos] = qk_fp16_to_float((qk_u16)(word >> (16 * (idx & 1))));
        }
    };

    float acc[64], d0[64], d1[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    /* acc += s d for chunk c's sums d (its scales: fp32 stage c % 4) */
    auto scale_add = [&](const float (&d)[64], int c) {
        const float4* sf = (const float4*)(gbase + L::SF0 + (c & 3) * L::SF_STAGE + 144 * t);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const float4 q = sf[j >> 1];
            const float2 sc = (j & 1) ? make_float2(q.z, q.w) : make_float2(q.x, q.y);
            acc[4 * j + 0] = fmaf(sc.x, d[4 * j + 0], acc[4 * j + 0]);
            acc[4 * j + 1] = fmaf(sc.y, d[4 * j + 1], acc[4 * j + 1]);
            acc[4 * j + 2] = fmaf(sc.x, d[4 * j + 2], acc[4 * j + 2]);
            acc[4 * j + 3] = fmaf(sc.y, d[4 * j + 3], acc[4 * j + 3]);
        }
    };
    const qk_u64 da0 = qk_wgmma_desc(base + L::A0 + wg * 8192), db0 = qk_wgmma_desc(base + L::B0);
    /* chunk c's wgmma into dc, once its stages are complete for every thread (issued, not waited for) */
    auto mma = [&](int c, float (&dc)[64]) {
        qk_cp_async_wait<S - 3>();
        qk_fence_proxy_async();
        __syncthreads(); /* chunk c's fp16 weights and activations are in place for every thread */
        qk_wgmma_fence_operands(dc);
        qk_wgmma_fence();
        /* the stages' descriptors: the start address field (16-byte units) advanced */
        const qk_u64 da = da0 + (qk_u64)((c % S) * (L::A_STAGE >> 4)), db = db0 + (qk_u64)((c % 3) * (L::B_STAGE >> 4));
#pragma unroll
        for (int k = 0; k < 4; ++k) qk_wgmma_m64n128k16(dc, da + 2 * k, db + 2 * k, k);
        qk_wgmma_commit();
        if (c + 1 < n_chunks) dequant(c + 1);
    };
    /* chunk c - 1's stages refilled with chunk c + S - 2's copies (its wgmma is done) */
    auto refill = [&](int c) {
        if (c + S - 2 < n_chunks) issue(c + S - 2);
        qk_cp_async_commit();
    };

#pragma unroll
    for (int j = 0; j < S - 1; ++j) {
        if (j < n_chunks) issue(j);
        qk_cp_async_commit();
    }
    qk_cp_async_wait<S - 2>();
    dequant(0);
    /* groups of 4 chunks, two sets of sums: chunk c's wgmma runs while chunk c - 1's sums are scaled
     * (ptxas keeps wgmma in flight only in straight-line code, so the group ends with every wgmma
     * waited for, and the chunks past the last whole group go one at a time) */
    int c0 = 0;
    for (; c0 + 4 <= n_chunks; c0 += 4) {
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            float(&dc)[64] = (u & 1) ? d1 : d0;
            float(&dp)[64] = (u & 1) ? d0 : d1;
            mma(c0 + u, dc);
            if (u > 0) {
                qk_wgmma_wait<1>();
                qk_wgmma_fence_operands(dp);
            }
            refill(c0 + u + 1);
            if (u > 0) scale_add(dp, c0 + u - 1);
        }
        qk_wgmma_wait<0>();
        qk_wgmma_fence_operands(d1);
        scale_add(d1, c0 + 3);
    }
    for (; c0 < n_chunks; ++c0) {
        mma(c0, d0);
        qk_wgmma_wait<0>();
        qk_wgmma_fence_operands(d0);
        refill(c0 + 1);
        scale_add(d0, c0);
    }
    qk_cp_async_wait<0>();
    __syncthreads(); /* every warpgroup is done with the stages: they become the output tile */

    constexpr int YROW = L::BN + 8; /* halves per staged token row of outputs */
    qk_u16* sY = (qk_u16*)(gbase + L::A0);
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int col = 8 * j + 2 * t + e;
            const float b = has_bias && row0 + col < N ? qk_fp16_to_float(bias[row0 + col]) : 0.0f;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float v = acc[4 * j + 2 * h + e];
                if (has_bias) v += b;
                sY[(64 * wg + 16 * wq + g + 8 * h) * YROW + col] = __half_as_ushort(qk_half_rn(v));
            }
        }
    __syncthreads();
    qk_wg_store_tile<L::BM, L::BN, YROW>(sY, Y, tok0, row0, M, N, y_vec);
}

/* The storage=fp16 form on wgmma with the weights in registers (qk_nbits_wgmma_fold_*): a CTA of two
 * warpgroups owns 128 weight rows (wgmma's M: warpgroup w rows 64 w ..) x 256 tokens (its N). Per
 * 64-wide K chunk, S - D chunks ahead (D: chunks of wgmma in flight, 2 from S = 5), threads 0 and 128 issue
 * the tensor copies (cp.async.bulk.tensor) of the activations (256 token rows of 128 bytes, 128-byte
 * swizzled by the copy, the B operand) and of the raw weight bytes, and cp.async copies each row's scale
 * word (and packed zero-point word), all completing on the stage's mbarrier; each thread turns its
 * fragment's weights (rows g and g + 8 of its warp's 16, the columns of A's register fragment: in natural
 * K order, u4 byte t of each 4-byte word, u2 the 2-bit pairs of bytes t / 2 and 2 + t / 2) into the fp16
 * pairs (q - z) s
 * (exact q - z from the 0x6400 magic, one rounding by the product; past 65504 inf, as in any kernel
 * holding fp16 weights) in registers, one chunk ahead of the wgmma that reads them, once the stage's
 * mbarrier phase has completed; the sums run over all of K in fp32 (the matrix unit's order); one
 * barrier a chunk (no stage refilled while a warp still reads it).
 * SPLIT (qk_nbits_wgmma_fold_split_*, the launcher's choice where the last wave of tiles is part-empty,
 * registry.fold_tail_split): a 1-D grid, each tile of that last wave split by K over parts CTAs whose fp32
 * sums one of them adds in part order (qk_fold_parts_summed). */
template <int BITS, int S, bool ZP>
struct QkWgRsLayout {
    static constexpr int ROWS = 128, TOK = 256;
    static constexpr int A_STAGE = TOK * 128, W_STAGE = ROWS * 8 * BITS;
    static constexpr int A0 = 0, W0 = A0 + S * A_STAGE, SC0 = W0 + S * W_STAGE, ZW0 = SC0 + S * ROWS * 4;
    static constexpr int BAR0 = ZW0 + (ZP ? S * ROWS * 4 : 0); /* a stage's mbarrier: 8 bytes */
    static constexpr int BYTES = BAR0 + S * 8;
};

/* a split tile's part (the SPLIT fold kernels): this CTA's sums acc stored in slot part of
 * the tile's n_parts slots of 128 floats a thread (float4 i of thread x at 4 (256 i + x)), then counted; the
 * CTA that counts last reads every slot back (through L2: other SMs wrote them) and leaves in acc their sum
 * in part order, ((P0 + P1) + P2) ..., the same bits whichever CTA is last, and zeroes the count for the
 * next call; true in that CTA only (CUDA's threadFenceReduction sample: stores, fence, count; count, fence,
 * loads) */
__device__ __forceinline__ bool qk_fold_parts_summed(float (&acc)[2][64], float* slots, int* count, int part,
                                                     int n_parts) {
    __shared__ int s_last;
    const int tid = (int)threadIdx.x;
    float4* const mine = (float4*)(slots + (qk_i64)part * 32768);
#pragma unroll
    for (int i = 0; i < 32; ++i) {
        const float* a = &acc[i >> 4][4 * (i & 15)];
        mine[256 * i + tid] = make_float4(a[0], a[1], a[2], a[3]);
    }
    __threadfence();
    __syncthreads();
    if (tid == 0) s_last = atomicAdd(count, 1) == n_parts - 1;
    __syncthreads();
    if (!s_last) return false;
    __threadfence();
    for (int k = 0; k < n_parts; ++k) { /* every part from its slot, this CTA's own too (the same bits) */
        const float4* const slot = (const float4*)(slots + (qk_i64)k * 32768);
#pragma unroll
        for (int i = 0; i < 32; ++i) {
            float* a = &acc[i >> 4][4 * (i & 15)];
            const float4 v = __ldcg(slot + 256 * i + tid);
            if (k == 0) a[0] = v.x, a[1] = v.y, a[2] = v.z, a[3] = v.w;
            else a[0] += v.x, a[1] += v.y, a[2] += v.z, a[3] += v.w;
            if ((i & 7) == 7) asm volatile("" ::: "memory"); /* 8 loads in flight: the registers acc leaves */
        }
    }
    if (tid == 0) *count = 0;
    return true;
}

template <int BITS, int S, bool ZP, bool SPLIT, int D = (S >= 5 ? 2 : 1)>
__device__ __forceinline__ void qk_nbits_wgmma_rs(qk_u64 amap, qk_u64 bmap, const qk_u16* scales, const qk_u8* zp,
                                                  const qk_u16* bias, qk_u16* Y, int M, int K, int N, int cpb_shift,
                                                  int k_blocks, int zp_bytes, int has_bias, int y_vec, float* part_ws,
                                                  int* part_count, int full, int parts) {
    typedef QkWgRsLayout<BITS, S, ZP> L;
    extern __shared__ __align__(1024) qk_u8 qk_wg_smem[];
    const qk_u32 raw_base = (qk_u32)__cvta_generic_to_shared(qk_wg_smem);
    const qk_u32 base = (raw_base + 1023u) & ~1023u;
    qk_u8* const gbase = qk_wg_smem + (base - raw_base);
    const int tid = (int)threadIdx.x, lane = tid & 31, g = lane >> 2, t = lane & 3;
    /* SPLIT: a 1-D grid, CTAs below full each own tile blockIdx.x (token tiles fastest, as the 2-D grid
     * orders them), tile full + q / parts split over the parts CTAs full + q, its part q % parts taking
     * chunks [part n / parts, (part + 1) n / parts); else the 2-D grid (token tile blockIdx.x, row tile
     * blockIdx.y), all of K. cb: the first chunk (of all K's) of this CTA's n_chunks */
    const int n_all = (K + 63) >> 6, n_tok_tiles = (M + L::TOK - 1) / L::TOK, q = SPLIT ? (int)blockIdx.x - full : -1;
    const int tile = q < 0 ? (int)blockIdx.x : full + q / parts, part = q < 0 ? 0 : q % parts, n_parts = q < 0 ? 1 : parts;
    const int row0 = SPLIT ? tile / n_tok_tiles * L::ROWS : (int)blockIdx.y * L::ROWS;
    const int tok0 = SPLIT ? tile % n_tok_tiles * L::TOK : (int)blockIdx.x * L::TOK;
    const int cb = SPLIT ? part * n_all / n_parts : 0, n_chunks = SPLIT ? (part + 1) * n_all / n_parts - cb : n_all;
    const qk_u32 bar0 = base + L::BAR0;

    /* Every per-thread address, row and selector below is made once, before the chunks: each chunk then
     * adds only its stage's offset and its block (ncu on the step as it was, H100, 5120 x 17920 M 4096 u2:
     * 229 instructions a warp a chunk, about half of them this arithmetic made again each chunk, and a
     * warp's step, not the matrix unit, set the pace; docs/perf-notes.md, session 56). The stages go by a
     * counter (st: chunk c's stage c % S, ph: the parity c / S of its mbarrier phase), not by division.
     *
     * Chunk c's copies all complete on stage st's mbarrier: its activations (256 tokens x 64 K: amap's box,
     * 128-byte swizzled, zeros past M and K) by the tensor copy issued by thread 0, its raw weights (128
     * rows x 8 BITS bytes: bmap's box, zeros past N) by the one issued by thread 128 (each announcing its
     * own bytes), and by cp.async (each copying lane's arrival once its copy has landed: BAR_COUNT), lane
     * l < 16 of warp w the scale word of the CTA's row 16 w + l (one of the rows its warp converts), lane
     * 16 + l (ZP) that row's packed zero-point word. The scale word of chunk c: scales + (n k_blocks + blk
     * & ~1) halves, n = min(row0 + row, N - 1), blk = (cb + c) >> cpb_shift, 2 of its bytes where it
     * would reach past the tensor's last scale. */
    const int c_row = 16 * (tid >> 5) + (lane & 15), c_n = min(row0 + c_row, N - 1);
    const qk_i64 c_q = (qk_i64)c_n * k_blocks, n_scales = (qk_i64)N * k_blocks;
    /* the row's first scale's word */
    const qk_u16* const c_sbase = (const qk_u16*)qk_wg_pin64((qk_u64)(scales + (c_q & ~(qk_i64)1)), lane);
    const int c_odd = qk_wg_pin((int)(c_q & 1), lane);
    /* the halves from c_sbase to the tensor's end (at most 2^30: only a few past a row's blocks matter) */
    const int c_rem = qk_wg_pin((int)min(n_scales - (c_q & ~(qk_i64)1), (qk_i64)1 << 30), lane);
    const qk_u32 c_dst = qk_wg_pin(base + (lane < 16 ? L::SC0 : L::ZW0) + c_row * 4, lane);
    const qk_u8* const c_zrow = ZP ? (const qk_u8*)qk_wg_pin64((qk_u64)(zp + (qk_i64)c_n * zp_bytes), lane) : nullptr;
    const qk_u8* const z_end = ZP ? zp + (qk_i64)N * zp_bytes : nullptr;

    /* arrivals a phase: the two tensor copies' issuers and the copying lanes */
    constexpr qk_u32 BAR_COUNT = 2 + 128 * (ZP ? 2 : 1);
    /* chunk c's copies into stage st (the wgmma of its chunk c - S is done) */
    auto refill = [&](int c, int st) {
        if (c >= n_chunks) return;
        const qk_u32 bar = bar0 + 8 * st;
        if (tid == 0) {
            qk_mbar_expect(bar, L::A_STAGE);
            qk_tma_2d(base + L::A0 + st * L::A_STAGE, amap, 64 * (cb + c), tok0, bar);
        } else if (tid == 128) {
            qk_mbar_expect(bar, L::W_STAGE);
            qk_tma_2d(base + L::W0 + st * L::W_STAGE, bmap, 8 * BITS * (cb + c), row0, bar);
        }
        const int blk = (cb + c) >> cpb_shift;
        if (lane < 16) {
            const int off = (c_odd + blk) & ~1;
            qk_cp_async4s(c_dst + st * L::ROWS * 4, c_sbase + off, off + 1 < c_rem ? 4 : 2);
            qk_mbar_arrive_cp_async(bar);
        } else if (ZP) {
            const qk_u8* word = (const qk_u8*)((size_t)(c_zrow + ((blk * BITS) >> 3)) & ~(size_t)3);
            qk_cp_async4s(c_dst + st * L::ROWS * 4, word, (int)min((qk_i64)4, (qk_i64)(z_end - word)));
            qk_mbar_arrive_cp_async(bar);
        }
    };

    /* this thread's fragment rows (of the CTA's 128): r[0] = 16 warp + g, r[1] = r[0] + 8; for each, the
     * byte_perm selector of its scale's half (the word's upper half where n k_blocks + blk is odd: the
     * selector 0x3232, else 0x1010; blk odd flips it) and (ZP) the bit of its packed zero-point word's
     * first code */
    const int r[2] = {16 * (tid >> 5) + g, 16 * (tid >> 5) + g + 8};
    qk_u32 ssel[2];
    int zbit[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int n = min(row0 + r[h], N - 1);
        ssel[h] = qk_wg_pin(((qk_i64)n * k_blocks) & 1 ? 0x3232u : 0x1010u, lane);
        zbit[h] = ZP ? qk_wg_pin((int)(((qk_i64)n * zp_bytes) & 3) * 8, lane) : 0;
    }
    const qk_u32 sc_off = qk_wg_pin(L::SC0 + r[0] * 4, lane), raw_off = qk_wg_pin(L::W0 + r[0] * 8 * BITS, lane);
    /* the byte_perm selectors of qk_wg_code_pair for this lane's code bytes: u4 byte t; u2 bytes t / 2, 2 + t / 2 */
    const qk_u32 psel0 = qk_wg_pin(qk_wg_pair_selector(BITS == 4 ? t : t >> 1), lane);
    const qk_u32 psel1 = qk_wg_pin(qk_wg_pair_selector(2 + (t >> 1)), lane);
    /* the conversion's per-lane constants (qk_wg_code_pair; docs/perf-notes.md, sessions 57-58): the mask, the
     * halves' 2^-e (nmul) and the addend -(1024 2^-e) with z's unit in each half (zmul: the addend is
     * add0 + z zmul). u4: codes at bits 0-3 and 4-7 of the byte; u2: at bits 4 (t % 2) + 0-1 and + 2-3. */
    const bool odd = BITS == 2 && (t & 1);
    const qk_u32 nmask = qk_wg_pin(BITS == 4 ? 0x00F0000Fu : odd ? 0x00C00030u : 0x000C0003u, lane);
    const qk_u32 nmul = qk_wg_pin(BITS == 4 ? 0x2C003C00u : odd ? 0x24002C00u : 0x34003C00u, lane);
    const qk_u32 add0 = qk_wg_pin(BITS == 4 ? 0xD400E400u : odd ? 0xCC00D400u : 0xDC00E400u, lane);
    const qk_u32 zmul = qk_wg_pin(BITS == 4 ? 0x00100001u : odd ? 0x00400010u : 0x00040001u, lane);
    const qk_u32 zdef = add0 + (qk_u32)(1 << (BITS - 1)) * zmul; /* the addend of the default zero point */
    /* chunk c's fragment of A: f[4 s + i] for k16 step s, register i (rows r[i & 1], columns 8 (i >> 1)
     * + 2 t, + 1 of the step) */
    auto convert = [&](int c, int st, int ph, qk_u32 (&f)[16]) {
        const int blk = (cb + c) >> cpb_shift;
        const qk_u32 flip = blk & 1 ? 0x2222u : 0u;
        qk_mbar_wait(bar0 + 8 * st, ph); /* all its copies (the activations too) have landed */
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const qk_u32 sw = *(const qk_u32*)(gbase + sc_off + st * L::ROWS * 4 + 32 * h);
            const qk_u32 sp = qk_prmt(sw, 0, ssel[h] ^ flip); /* the scale, in both halves */
            qk_u32 off = zdef; /* the fma's addend, -(1024 2^-e + z) */
            if (ZP) {
                const qk_u32 zw = *(const qk_u32*)(gbase + sc_off + (L::ZW0 - L::SC0) + st * L::ROWS * 4 + 32 * h);
                const int bit = zbit[h] + blk * BITS;
                off = add0 + ((zw >> (bit & 31)) & ((1u << BITS) - 1u)) * zmul;
            }
            const qk_u8* raw = gbase + raw_off + st * L::W_STAGE + 64 * BITS * h;
            if (BITS == 4) { /* word 2 s + e: K 16 s + 8 e .. + 7, byte t the pair 2 t, + 1 */
                const uint4 v0 = *(const uint4*)raw, v1 = *(const uint4*)(raw + 16);
                const qk_u32 w[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
                for (int j = 0; j < 8; ++j)
                    f[4 * (j >> 1) + 2 * (j & 1) + h] =
                        qk_mul_f16x2(qk_fma_f16x2(qk_wg_code_pair(w[j], psel0, nmask), nmul, off), sp);
            } else { /* word s: K 16 s .. + 15, the pair 2 t, + 1 in byte t / 2 at bit 4 (t % 2), 2 t + 8 in byte 2 + t / 2 */
                const uint4 v = *(const uint4*)raw;
                const qk_u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const qk_u32 x0 = qk_wg_code_pair(w[j], psel0, nmask), x1 = qk_wg_code_pair(w[j], psel1, nmask);
                    f[4 * j + h] = qk_mul_f16x2(qk_fma_f16x2(x0, nmul, off), sp);
                    f[4 * j + 2 + h] = qk_mul_f16x2(qk_fma_f16x2(x1, nmul, off), sp);
                }
            }
        }
    };

    float acc[2][64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[0][i] = acc[1][i] = 0.0f;
    qk_u32 fr[D + 1][16]; /* chunk c's fragment: fr[c % (D + 1)] */
    const qk_u64 db0 = qk_wgmma_desc(base + L::A0);
    /* chunk c (in stage st, phase parity ph, both advanced to chunk c + 1's): its wgmma issued (D chunks'
     * stay in flight); chunk c - D's waited for, by every thread; chunk c + 1's copies in place for every
     * thread; chunk c + S - D's copies issued into chunk c - D's stage; chunk c + 1 converted into chunk c -
     * D's fragment */
    auto step = [&](int c, int& st, int& ph, const qk_u32 (&cur)[16], qk_u32 (&nxt)[16]) {
        qk_wgmma_fence_operands(acc[0]);
        qk_wgmma_fence_operands(acc[1]);
        qk_wgmma_fence();
        const qk_u64 db = db0 + (qk_u64)(st * (L::A_STAGE >> 4));
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const qk_u32 a[4] = {cur[4 * k], cur[4 * k + 1], cur[4 * k + 2], cur[4 * k + 3]};
            qk_wgmma_m64n256k16_rs(acc, a, db + 2 * k);
        }
        qk_wgmma_commit();
        qk_wgmma_wait<D>();
        /* No proxy fence before the refill (the strict kernel has one: its wgmma reads what its threads
         * stored). Here the threads only read the stages (ld.shared of the raw weights and scale words,
         * consumed before this point); the async proxy writes them (the tensor copies, issued after the
         * barrier) and reads the activations (the wgmma, waited for above). CUTLASS's PipelineTmaAsync
         * releases a stage the same way, by an mbarrier arrival alone. Measured without it: 0.3-1.2%
         * faster on every prefill shape, bit-identical (docs/perf-notes.md, session 57). */
        __syncthreads(); /* no warp reads chunk c - D's stage any more */
        refill(c + S - D, st >= D ? st - D : st + S - D);
        st = st + 1 == S ? 0 : st + 1;
        ph ^= st == 0;
        if (c + 1 < n_chunks) convert(c + 1, st, ph, nxt);
    };

    if (tid == 0) {
#pragma unroll
        for (int st = 0; st < S; ++st) qk_mbar_init_n(bar0 + 8 * st, BAR_COUNT);
        qk_mbar_init_fence();
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < S - D; ++j) refill(j, j);
    if (n_chunks > 0) convert(0, 0, 0, fr[0]);
    /* D + 1 chunks an iteration: the fragments' indices stay constants (a wgmma in flight across a
     * branch that picks its registers would be serialized by ptxas) */
    int c = 0, st = 0, ph = 0;
    for (; c + D < n_chunks; c += D + 1) {
#pragma unroll
        for (int u = 0; u <= D; ++u) step(c + u, st, ph, fr[u], fr[(u + 1) % (D + 1)]);
    }
#pragma unroll
    for (int u = 0; u < D; ++u)
        if (c + u < n_chunks) step(c + u, st, ph, fr[u], fr[(u + 1) % (D + 1)]);
    qk_wgmma_wait<0>();
    qk_wgmma_fence_operands(acc[0]);
    qk_wgmma_fence_operands(acc[1]);
    qk_cp_async_wait<0>();
    __syncthreads(); /* every warp is done with the stages: they become the output tile */
    if (SPLIT && n_parts > 1 &&
        !qk_fold_parts_summed(acc, part_ws + (qk_i64)(tile - full) * parts * 32768, part_count + (tile - full), part,
                              n_parts))
        return; /* another part's CTA sums the tile */

    constexpr int YROW = L::ROWS + 8; /* halves per staged token row of outputs */
    qk_u16* sY = (qk_u16*)(gbase + L::A0);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int n = row0 + r[h];
        const float b = has_bias && n < N ? qk_fp16_to_float(bias[n]) : 0.0f;
#pragma unroll
        for (int j = 0; j < 32; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) { /* d[4 j + 2 h + e]: row r[h], token 8 j + 2 t + e */
                float x = acc[j >> 4][4 * (j & 15) + 2 * h + e];
                if (has_bias) x += b;
                sY[(8 * j + 2 * t + e) * YROW + r[h]] = __half_as_ushort(qk_half_rn(x));
            }
    }
    __syncthreads();
    qk_wg_store_tile<L::TOK, L::ROWS, YROW>(sY, Y, tok0, row0, M, N, y_vec);
}
#endif

/* qk_nbits_wgmma_u{BITS}_s{S}[_z]: M >= 1, the default zero point 2^(BITS - 1) (or packed ones: _z),
 * K % 8 == 0, 16-byte aligned A and B, 4-byte aligned scales and packed zero points; a CTA of two
 * warpgroups owns 128 tokens (blockIdx.x) x 128 weight rows (blockIdx.y), each warpgroup 64 of the
 * tokens; dynamic shared memory QkWgLayout::BYTES + 1024.
 * qk_nbits_wgmma_fold_u{BITS}_s{S}[_z]: the same arguments but A and B given as tensor maps (amap: A
 * as fp16 [M, K], boxes of 64 x 256 tokens, 128-byte swizzle; bmap: B as bytes [N, row bytes], boxes of
 * 8 BITS bytes x 128 rows; both reading zeros outside), the weights held as fp16 (q - z) s in registers
 * (the contract storage=fp16); a CTA owns 256 tokens (blockIdx.x) x 128 weight rows; dynamic shared
 * memory QkWgRsLayout::BYTES + 1024. */
#if QK_WGMMA
#define QK_NBITS_WGMMA_BODY(FN, BITS, S, ZP)                                                                           \
    FN<BITS, S, ZP>(A, B, scales, zp, bias, Y, M, K, N, cpb_shift, k_blocks, zp_bytes, has_bias, y_vec);
#define QK_NBITS_WGMMA_FOLD_BODY(BITS, S, ZP, SPLIT)                                                                   \
    qk_nbits_wgmma_rs<BITS, S, ZP, SPLIT>((qk_u64)&amap, (qk_u64)&bmap, scales, zp, bias, Y, M, K, N, cpb_shift,       \
                                          k_blocks, zp_bytes, has_bias, y_vec, part_ws, part_count, full, parts);
#elif defined(QK_CUDA)
#define QK_NBITS_WGMMA_BODY(FN, BITS, S, ZP) __trap();
#define QK_NBITS_WGMMA_FOLD_BODY(BITS, S, ZP, SPLIT) __trap();
#else
#define QK_NBITS_WGMMA_BODY(FN, BITS, S, ZP) __builtin_trap();
#define QK_NBITS_WGMMA_FOLD_BODY(BITS, S, ZP, SPLIT) __builtin_trap();
#endif
#ifdef QK_CUDA
#define QK_GRID_CONSTANT __grid_constant__
#else
#define QK_GRID_CONSTANT
#endif
/* a CUtensorMap (CUDA's driver API, cuda.h: 16 opaque 64-bit words, 128-byte aligned), made on the host
 * by cuTensorMapEncodeTiled (qconform.device.tensormap) */
struct __align__(128) QkTensorMap {
    unsigned long long opaque[16];
};
#define QK_NBITS_WGMMA_DEF(NAME, FN, BITS, S, ZP)                                                                      \
    extern "C" __global__ void __launch_bounds__(256, 1)                                                               \
        NAME(const qk_u16* A, const qk_u8* B, const qk_u16* scales, const qk_u8* zp, const qk_u16* bias, qk_u16* Y,    \
             int M, int K, int N, int cpb_shift, int k_blocks, int zp_bytes, int has_bias, int y_vec) {                \
        QK_NBITS_WGMMA_BODY(FN, BITS, S, ZP)                                                                           \
    }
/* the default zero point (zp not read), and the same with packed zero points (symbol ending _z) */
#define QK_NBITS_WGMMA(BITS, S)                                                                                        \
    QK_NBITS_WGMMA_DEF(qk_nbits_wgmma_u##BITS##_s##S, qk_nbits_wgmma, BITS, S, false)                                 \
    QK_NBITS_WGMMA_DEF(qk_nbits_wgmma_u##BITS##_s##S##_z, qk_nbits_wgmma, BITS, S, true)
#define QK_NBITS_WGMMA_FOLD_DEF(NAME, BITS, S, ZP, SPLIT)                                                              \
    extern "C" __global__ void __launch_bounds__(256, 1)                                                               \
        NAME(const QK_GRID_CONSTANT QkTensorMap amap, const QK_GRID_CONSTANT QkTensorMap bmap, const qk_u16* scales,   \
             const qk_u8* zp, const qk_u16* bias, qk_u16* Y, int M, int K, int N, int cpb_shift, int k_blocks,          \
             int zp_bytes, int has_bias, int y_vec, float* part_ws, int* part_count, int full, int parts) {            \
        QK_NBITS_WGMMA_FOLD_BODY(BITS, S, ZP, SPLIT)                                                                   \
    }
/* the 2-D grid, each tile on one CTA, and the tail-split form's 1-D grid (qk_nbits_wgmma_fold_split_*) */
#define QK_NBITS_WGMMA_FOLD(BITS, S)                                                                                   \
    QK_NBITS_WGMMA_FOLD_DEF(qk_nbits_wgmma_fold_u##BITS##_s##S, BITS, S, false, false)                                \
    QK_NBITS_WGMMA_FOLD_DEF(qk_nbits_wgmma_fold_u##BITS##_s##S##_z, BITS, S, true, false)                             \
    QK_NBITS_WGMMA_FOLD_DEF(qk_nbits_wgmma_fold_split_u##BITS##_s##S, BITS, S, false, true)                           \
    QK_NBITS_WGMMA_FOLD_DEF(qk_nbits_wgmma_fold_split_u##BITS##_s##S##_z, BITS, S, true, true)
QK_NBITS_WGMMA(2, 4)
QK_NBITS_WGMMA(4, 4)
QK_NBITS_WGMMA_FOLD(2, 5)
QK_NBITS_WGMMA_FOLD(4, 5)

/* 1 where this build has the wgmma kernels (compiled for sm_90a), else 0: the launcher reads it
 * before it takes them. -DQK_NBITS_NO_WGMMA (a device control: the device mutants of qk_nbits_gemm)
 * makes it 0, so the launcher runs qk_nbits_gemm at every M. */
#if QK_WGMMA && !defined(QK_NBITS_NO_WGMMA)
extern "C" __device__ int qk_nbits_wgmma_built = 1;
#else
extern "C" __device__ int qk_nbits_wgmma_built = 0;
#endif

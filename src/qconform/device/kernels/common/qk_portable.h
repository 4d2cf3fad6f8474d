/* qk_portable.h: the one portability layer every qconform kernel is written against, so each
 * kernel is one source for hiprtc / hipcc (AMD) and NVRTC / nvcc (NVIDIA).
 * Facts: docs/device-tooling.md B1-B5 (CuPy RawModule, HIP warp builtins, fp16/bf16 RNE,
 * integer dot products); ROCm/HIP amd_warp_functions.h (__shfl_xor, no mask), HIP docs
 * hip_cpp_language_extensions.rst (wave64 on gfx8/gfx9 only), llama.cpp ggml-cuda/vendors/hip.h.
 * Rules: every helper is __device__ __forceinline__, no std::, no <cstdint> (NVRTC and hiprtc
 * >= 7 have none), and every fp32 operation whose rounding matters goes through QK_FMUL /
 * QK_FADD / QK_FDIV (never contracted into an FMA: HIP defaults to -ffp-contract=fast, nvcc to
 * --fmad=true) followed by qk_ftz, so results do not depend on the compiler's denormal mode. */
#ifndef QK_PORTABLE_H
#define QK_PORTABLE_H

#if defined(__HIPCC_RTC__) || defined(__HIPCC__) || defined(__HIP__)
#define QK_HIP 1
#if !defined(__HIPCC_RTC__)
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#endif
#if defined(__GFX8__) || defined(__GFX9__)
#define QK_WARP 64
#else
#define QK_WARP 32
#endif
/* AMD: no mask argument (the _sync forms static_assert a 64-bit mask and exist only from 6.2) */
#define QK_SHFL_XOR(v, m, w) __shfl_xor((v), (m), (w))
#define QK_SHFL(v, src, w) __shfl((v), (src), (w))
#else
#define QK_CUDA 1
#include <cuda_fp16.h>
#define QK_WARP 32
#define QK_SHFL_XOR(v, m, w) __shfl_xor_sync(0xffffffffu, (v), (m), (w))
#define QK_SHFL(v, src, w) __shfl_sync(0xffffffffu, (v), (src), (w))
#endif

typedef signed char qk_i8;
typedef unsigned char qk_u8;
typedef short qk_i16;
typedef unsigned short qk_u16;
typedef int qk_i32;
typedef unsigned int qk_u32;
typedef long long qk_i64;

/* IEEE fp32 operations, round to nearest even, never fused */
#define QK_FMUL(a, b) __fmul_rn((a), (b))
#define QK_FADD(a, b) __fadd_rn((a), (b))
#define QK_FSUB(a, b) __fsub_rn((a), (b))
#define QK_FDIV(a, b) __fdiv_rn((a), (b))

__device__ __forceinline__ qk_u32 qk_bits(float v) { return __float_as_uint(v); }
__device__ __forceinline__ float qk_float(qk_u32 b) { return __uint_as_float(b); }

/* flush a subnormal to the zero of its sign (what CuPy's -ftz / -fcuda-flush-denormals-to-zero
 * does to every fp32 operand and result), by bits so it holds in any compile mode */
__device__ __forceinline__ float qk_ftz(float v) {
    qk_u32 b = qk_bits(v);
    return (b & 0x7F800000u) == 0u ? qk_float(b & 0x80000000u) : v;
}

__device__ __forceinline__ bool qk_isnan(float v) { return (qk_bits(v) & 0x7FFFFFFFu) > 0x7F800000u; }

/* Programmatic dependent launch (PTX ISA griddepcontrol, sm_90+; qconform.device.pdl launches the
 * dependent kernel): QK_LAUNCH_DEPENDENTS() lets the next kernel on the stream start before this one
 * ends; QK_WAIT_PRIOR_GRID() waits until the kernel before has finished and its writes are visible.
 * A kernel launched as a dependent must wait before it reads what that kernel wrote or writes what
 * it touches. Both are no-ops elsewhere (AMD, older GPUs) and when the launch was in stream order.
 * Without QK_LAUNCH_DEPENDENTS() the dependent starts as the kernel before's CTAs exit. Bench-only
 * -DQK_PDL_TRIGGER_AT_EXIT drops every QK_LAUNCH_DEPENDENTS() (qconform.bench.ggml_gemv's trigger_at_exit). */
#if defined(QK_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#if defined(QK_PDL_TRIGGER_AT_EXIT)
#define QK_LAUNCH_DEPENDENTS()
#else
#define QK_LAUNCH_DEPENDENTS() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#endif
#define QK_WAIT_PRIOR_GRID() asm volatile("griddepcontrol.wait;" ::: "memory")
#else
#define QK_LAUNCH_DEPENDENTS()
#define QK_WAIT_PRIOR_GRID()
#endif

/* end the kernel with a device error (a wait that can no longer end: better an error than a hang) */
#if defined(QK_CUDA)
#define QK_TRAP() __trap()
#else
#define QK_TRAP() __builtin_trap()
#endif

/* fp32 -> fp16 bits, round to nearest even (CUDA __float2half_rn and HIP's _Float16 cast both
 * matched numpy bit for bit: specs B4); NaN -> sign | 0x7E00 as ggml's GGML_FP32_TO_FP16 */
__device__ __forceinline__ qk_u16 qk_fp16_bits(float v) {
    if (qk_isnan(v)) return (qk_u16)(((qk_bits(v) >> 16) & 0x8000u) | 0x7E00u);
    return __half_as_ushort(__float2half_rn(v));
}

__device__ __forceinline__ float qk_fp16_to_float(qk_u16 h) { return __half2float(__ushort_as_half(h)); }

/* fp32 -> fp16 value, round to nearest even (NaN stays NaN) */
__device__ __forceinline__ __half qk_half_rn(float v) { return __float2half_rn(v); }

/* bytes of the 8-byte {y:x} selected by the nibbles of s: CUDA __byte_perm, HIP __byte_perm */
#define QK_BYTE_PERM(x, y, s) __byte_perm((x), (y), (s))

/* (v & mask) | bits in one instruction: written as C with two constants, ptxas emits two LOP3 of
 * one immediate each (docs/perf-notes.md, session 7: 12% of the u2 decode GEMV's time) */
__device__ __forceinline__ qk_u32 qk_and_or(qk_u32 v, qk_u32 mask, qk_u32 bits) {
#if defined(QK_CUDA) && defined(__CUDA_ARCH__)
    qk_u32 x;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(x) : "r"(v), "r"(mask), "r"(bits));
    return x;
#else
    return (v & mask) | bits;
#endif
}

/* c + the dot product of the four signed bytes of a and b (exact; no saturation): NVIDIA dp4a
 * (sm_61+); AMD v_dot4_i32_i8 (__builtin_amdgcn_sdot4 without clamp) on the targets that have it
 * (gfx906/908/90a/94x, gfx1011/1012/103x: LLVM's AMDGPU dot1/dot7 instructions; RDNA3 and later only
 * have the mixed-sign sudot4, used with both operands signed); four integer multiply-adds elsewhere. */
__device__ __forceinline__ int qk_dp4a(int a, int b, int c) {
#if defined(QK_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 610
    return __dp4a(a, b, c);
#elif defined(QK_HIP) && (defined(__gfx906__) || defined(__gfx908__) || defined(__gfx90a__) || \
    defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__) || defined(__gfx1011__) || \
    defined(__gfx1012__) || defined(__gfx1030__) || defined(__gfx1031__) || defined(__gfx1032__))
    return __builtin_amdgcn_sdot4(a, b, c, false);
#elif defined(QK_HIP) && (defined(__gfx1100__) || defined(__gfx1101__) || defined(__gfx1102__))
    return __builtin_amdgcn_sudot4(true, a, true, b, c, false);
#else
    for (int k = 0; k < 32; k += 8) c += ((a << (24 - k)) >> 24) * ((b << (24 - k)) >> 24);
    return c;
#endif
}

/* the index of this thread in the launch, 64-bit (grids of more than 2^31 threads) */
__device__ __forceinline__ qk_i64 qk_global_thread() {
    return (qk_i64)blockIdx.x * (qk_i64)blockDim.x + (qk_i64)threadIdx.x;
}

/* ---------------------------------------------------------------- matrix units */
/* Packed fp16 pairs travel as qk_u32 (low half = the lower index). */

/* (x * m + c) per fp16 half (CUDA fma.rn.f16x2; AMD: fused or not as the compiler contracts).
 * The callers only use it where x * m and the result are exact, so it is exact everywhere. */
__device__ __forceinline__ qk_u32 qk_hfma2(qk_u32 x, qk_u32 m, qk_u32 c) {
#if defined(QK_CUDA)
    qk_u32 d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(x), "r"(m), "r"(c));
    return d;
#else
    typedef _Float16 h2 __attribute__((ext_vector_type(2)));
    const h2 r = __builtin_bit_cast(h2, x) * __builtin_bit_cast(h2, m) + __builtin_bit_cast(h2, c);
    return __builtin_bit_cast(qk_u32, r);
#endif
}

/* the same per bf16 half (CUDA fma.rn.bf16x2, sm_80+; elsewhere each half in fp32, whose upper 16 bits
 * are the bf16 result where it is exact: the callers only use it where x * m and the result are). */
__device__ __forceinline__ qk_u32 qk_bfma2(qk_u32 x, qk_u32 m, qk_u32 c) {
#if defined(QK_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    qk_u32 d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(x), "r"(m), "r"(c));
    return d;
#else
    const float lo = fmaf(qk_float(x << 16), qk_float(m << 16), qk_float(c << 16));
    const float hi = fmaf(qk_float(x & 0xFFFF0000u), qk_float(m & 0xFFFF0000u), qk_float(c & 0xFFFF0000u));
    return (qk_bits(lo) >> 16) | (qk_bits(hi) & 0xFFFF0000u);
#endif
}

__device__ __forceinline__ float qk_h2dot(qk_u32 a, qk_u32 b) {
    const float p = qk_fp16_to_float((qk_u16)a) * qk_fp16_to_float((qk_u16)b);
    return fmaf(qk_fp16_to_float((qk_u16)(a >> 16)), qk_fp16_to_float((qk_u16)(b >> 16)), p);
}

/* the same for packed bf16 pairs (widened exactly by a shift) */
__device__ __forceinline__ float qk_bf2dot(qk_u32 a, qk_u32 b) {
    const float p = qk_float(a << 16) * qk_float(b << 16);
    return fmaf(qk_float(a & 0xFFFF0000u), qk_float(b & 0xFFFF0000u), p);
}

/* the portable form of qk_mma_16816 / qk_mma_16816_bf16: width-32 shuffles and fp32 FMAs */
template <bool BF16>
__device__ __forceinline__ void qk_mma_16816_shuffled(float d[4], const qk_u32 a[4], const qk_u32 b[2]) {
    const int lane = (int)(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
        const int src_a = 4 * g + s;
        const qk_u32 a0 = QK_SHFL(a[0], src_a, 32), a1 = QK_SHFL(a[1], src_a, 32);
        const qk_u32 a2 = QK_SHFL(a[2], src_a, 32), a3 = QK_SHFL(a[3], src_a, 32);
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const int src_b = 4 * (2 * t + c) + s;
            const qk_u32 b0 = QK_SHFL(b[0], src_b, 32), b1 = QK_SHFL(b[1], src_b, 32);
            if (BF16) {
                d[c] += qk_bf2dot(a0, b0) + qk_bf2dot(a2, b1);
                d[2 + c] += qk_bf2dot(a1, b0) + qk_bf2dot(a3, b1);
            } else {
                d[c] += qk_h2dot(a0, b0) + qk_h2dot(a2, b1);
                d[2 + c] += qk_h2dot(a1, b0) + qk_h2dot(a3, b1);
            }
        }
    }
}

/* D (16x8 fp32) += A (16x16 fp16, row-major) * B (16x8 fp16, column-major) over a group of 32
 * lanes, in the register layout of PTX mma.m16n8k16.row.col.f32.f16.f16.f32 (PTX ISA, "Matrix
 * Fragments for mma.m16n8k16 with floating point type"): lane = 4 g + t;
 * a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..2t+1], a[2] = A[g][2t+8..2t+9], a[3] = A[g+8][2t+8..2t+9];
 * b[0] = B[2t..2t+1][g], b[1] = B[2t+8..2t+9][g];
 * d[0..1] = D[g][2t..2t+1], d[2..3] = D[g+8][2t..2t+1].
 * Products of fp16 values are exact in fp32; only the order and rounding of the sums differ
 * between the tensor-core instruction (sm_80+) and the portable form (width-32 shuffles and
 * fp32 FMAs: AMD, older NVIDIA, or -DQK_MMA_EMULATE). All 32 lanes of the group must call it. */
__device__ __forceinline__ void qk_mma_16816(float d[4], const qk_u32 a[4], const qk_u32 b[2]) {
#if defined(QK_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(QK_MMA_EMULATE)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    qk_mma_16816_shuffled<false>(d, a, b);
#endif
}

/* the same with bf16 A and B (PTX mma.m16n8k16.row.col.f32.bf16.bf16.f32, the same fragments);
 * products of bf16 values are exact in fp32 */
__device__ __forceinline__ void qk_mma_16816_bf16(float d[4], const qk_u32 a[4], const qk_u32 b[2]) {
#if defined(QK_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(QK_MMA_EMULATE)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    qk_mma_16816_shuffled<true>(d, a, b);
#endif
}

/* ---------------------------------------------------------------- matrix loads from shared */
/* Four 8 x 8 b16 matrices from shared memory (PTX ldmatrix.sync.aligned.m8n8.x4, sm_75+: "Data
 * Movement and Conversion Instructions: ldmatrix"): lanes 8i..8i+7 give, in row, the addresses of the
 * 16-byte rows 0..7 of matrix i; lane l receives r[i] = word l % 4 of row l / 4 of matrix i (TRANS:
 * of the transposed matrix, the .trans form). NVIDIA only: callers keep shared-memory reads of the
 * same words for AMD. */
#if defined(QK_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
template <bool TRANS = false>
__device__ __forceinline__ void qk_ldmatrix_x4(qk_u32 r[4], const void* row) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
}
#endif

/* ---------------------------------------------------------------- asynchronous copies */
/* Global -> shared copies that the thread waits for later (PTX cp.async, sm_80+: "Data Movement
 * and Conversion Instructions: cp.async"): `bytes` of 16 (qk_cp_async16) or 4 (qk_cp_async4)
 * from src, the first src_bytes of them read and the rest zero-filled (src_bytes 0: nothing is
 * read). One qk_cp_async_commit closes a group; qk_cp_async_wait<N> waits until at most N groups
 * are in flight. Elsewhere (AMD, older NVIDIA) the copy is done at once and the waits do nothing.
 * A thread that reads back only what it copied needs no barrier. */
#if defined(QK_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
__device__ __forceinline__ void qk_cp_async16(void* dst, const void* src, int src_bytes) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(a), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void qk_cp_async4(void* dst, const void* src, int src_bytes) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(a), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void qk_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void qk_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
#else
__device__ __forceinline__ void qk_cp_async16(void* dst, const void* src, int src_bytes) {
    const qk_u8* s = (const qk_u8*)src;
    qk_u32 w[4] = {0u, 0u, 0u, 0u};
    if (src_bytes == 16) {
        const uint4 v = *(const uint4*)src;
        w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
    } else {
        for (int i = 0; i < src_bytes; ++i) w[i >> 2] |= (qk_u32)s[i] << (8 * (i & 3));
    }
    *(uint4*)dst = make_uint4(w[0], w[1], w[2], w[3]);
}
__device__ __forceinline__ void qk_cp_async4(void* dst, const void* src, int src_bytes) {
    const qk_u8* s = (const qk_u8*)src;
    qk_u32 w = 0u;
    for (int i = 0; i < src_bytes; ++i) w |= (qk_u32)s[i] << (8 * i);
    *(qk_u32*)dst = w;
}
__device__ __forceinline__ void qk_cp_async_commit() {}
template <int N>
__device__ __forceinline__ void qk_cp_async_wait() {}
#endif

/* the lanes of a warp meet, and their shared-memory writes (asynchronous copies waited for
 * included) are visible to each other; an AMD wavefront runs its lanes in lockstep and keeps its
 * LDS operations in order, so only the compiler is told */
__device__ __forceinline__ void qk_syncwarp() {
#if defined(QK_CUDA)
    __syncwarp();
#else
    __builtin_amdgcn_wave_barrier();
#endif
}

#endif /* QK_PORTABLE_H */

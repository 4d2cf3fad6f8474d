/* qk_portable.h: the one portability layer every qconform kernel is written against, so each
 * kernel is one source for hiprtc / hipcc (AMD) and NVRTC / nvcc (NVIDIA).
 * Facts: ../shared/specs/tooling.md B1-B5 (CuPy RawModule, HIP warp builtins, fp16/bf16 RNE,
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
#else
#define QK_CUDA 1
#include <cuda_fp16.h>
#define QK_WARP 32
#define QK_SHFL_XOR(v, m, w) __shfl_xor_sync(0xffffffffu, (v), (m), (w))
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

/* the index of this thread in the launch, 64-bit (grids of more than 2^31 threads) */
__device__ __forceinline__ qk_i64 qk_global_thread() {
    return (qk_i64)blockIdx.x * (qk_i64)blockDim.x + (qk_i64)threadIdx.x;
}

#endif /* QK_PORTABLE_H */

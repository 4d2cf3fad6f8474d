/* Host stand-in for kernels/common/qk_portable.h (tests/test_keep_quant_fast_host.py,
 * tests/test_bnb_gemm_mma_host.py): enough of the portability layer to compile keep_quant_fast.hip and
 * bnb/gemm_mma.hip with g++ and run their device functions on the CPU. dp4a and byte_perm as the PTX
 * ISA defines them (dp4a.s32.s32, prmt.b32 default mode); fp32 operations in IEEE single precision
 * (g++ -ffp-contract=off). The kernels run one CTA at a time as host threads (keep_quant_fast_cta.cpp,
 * bnb_gemm_mma_host.cpp): thread-local threadIdx / blockIdx, __shared__ as one static array,
 * __syncthreads a barrier (qk_syncwarp one per 32 threads), xor shuffles within a warp through slots. */
#ifndef QK_PORTABLE_H /* the real header's guard: a source including another includes it twice */
#define QK_PORTABLE_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <atomic>
#include <barrier>
#include <chrono>
#include <thread>
#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__
struct dim3s { unsigned x, y, z; };
/* a CTA runs as host threads (keep_quant_fast_cta.cpp): each its own threadIdx, one barrier */
static thread_local dim3s threadIdx, blockIdx;
static dim3s gridDim, blockDim;
static std::barrier<>* qk_host_barrier = nullptr;
static std::barrier<>* qk_host_group_barriers = nullptr; /* one per 32 threads: qk_syncwarp */
static unsigned qk_host_slots[1024];
static inline void __syncthreads() { qk_host_barrier->arrive_and_wait(); }
static inline void qk_syncwarp() { qk_host_group_barriers[threadIdx.x >> 5].arrive_and_wait(); }
/* __shfl_xor_sync within a warp's segment of width w (m < w <= 32) of a 4-byte value: through a slot
 * per thread, between two of the warp's barriers (every lane of the warp takes part) */
template <typename T>
static inline T QK_SHFL_XOR(T v, int m, int w) {
    static_assert(sizeof(T) == 4, "4-byte shuffles");
    (void)w;
    memcpy(&qk_host_slots[threadIdx.x], &v, 4);
    qk_syncwarp();
    T r;
    memcpy(&r, &qk_host_slots[threadIdx.x ^ (unsigned)m], 4);
    qk_syncwarp();
    return r;
}
#define QK_TRAP() abort()
typedef signed char qk_i8; typedef unsigned char qk_u8; typedef short qk_i16; typedef unsigned short qk_u16;
typedef int qk_i32; typedef unsigned int qk_u32; typedef long long qk_i64;
/* the drivers' input files: the bytes of `path` (nullptr for "-"), 256-byte aligned; its size in *size */
static inline void* qk_host_load(const char* path, size_t* size = nullptr) {
    if (path[0] == '-') return nullptr;
    FILE* f = fopen(path, "rb");
    if (!f) exit(3);
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    if (size) *size = (size_t)n;
    rewind(f);
    void* p = aligned_alloc(256, (size_t)(n + 255) / 256 * 256);
    if (fread(p, 1, (size_t)n, f) != (size_t)n) exit(3);
    fclose(f);
    return p;
}
struct uint4 { qk_u32 x, y, z, w; };
struct float4 { float x, y, z, w; };
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
struct uint2 { qk_u32 x, y; };
/* programmatic dependent launch (qk_portable.h). keep_quant_fast_cta.cpp stands in for the kernel
 * before (the activations' quantize), CTA by CTA: the activation buffer holds stale bytes until every
 * thread of the CTA has called QK_WAIT_PRIOR_GRID(), and then this call's; a thread that waits while
 * another never does gives up after a second, so the stale bytes stay. No stand-in (qk_host_prior_bytes
 * 0): nothing to wait for. */
#define QK_LAUNCH_DEPENDENTS()
static std::atomic<int> qk_host_waits{0};
static std::atomic<bool> qk_host_prior_done{false};
static void* qk_host_prior_dst = nullptr;
static const void* qk_host_prior_src = nullptr;
static size_t qk_host_prior_bytes = 0;
static int qk_host_cta_threads = 0;
static inline void qk_host_wait_prior_grid() {
    if (qk_host_prior_bytes == 0) return;
    if (++qk_host_waits == qk_host_cta_threads) {
        memcpy(qk_host_prior_dst, qk_host_prior_src, qk_host_prior_bytes);
        qk_host_prior_done = true;
        return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    while (!qk_host_prior_done && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1)) std::this_thread::yield();
}
#define QK_WAIT_PRIOR_GRID() qk_host_wait_prior_grid()
#define QK_FMUL(a, b) ((float)(a) * (float)(b))
#define QK_FDIV(a, b) ((float)(a) / (float)(b))
static inline float __int2float_rn(int i) { return (float)i; }
static inline int __float2int_rz(float v) { return (int)v; } /* in range: ggml/q8_quant.hip's callers */
static inline qk_i64 qk_global_thread() { return (qk_i64)blockIdx.x * blockDim.x + threadIdx.x; }
static inline qk_u32 qk_bits(float v) { qk_u32 b; memcpy(&b, &v, 4); return b; }
static inline float qk_float(qk_u32 b) { float v; memcpy(&v, &b, 4); return v; }
static inline float qk_fp16_to_float(qk_u16 h) { _Float16 x; memcpy(&x, &h, 2); return (float)x; }
static inline qk_u32 QK_BYTE_PERM(qk_u32 x, qk_u32 y, qk_u32 s) {
    uint64_t v = ((uint64_t)y << 32) | x; qk_u32 r = 0;
    for (int i = 0; i < 4; ++i) r |= (qk_u32)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
    return r;
}
static inline int qk_dp4a(int a, int b, int c) {
    for (int k = 0; k < 4; ++k) c += (int)(qk_i8)(a >> (8 * k)) * (int)(qk_i8)(b >> (8 * k));
    return c;
}
/* bnb/gemm_mma.hip (tests/test_bnb_gemm_mma_host.py): the centroid tables as host constants, the
 * rounding to fp16 (RNE; NaN as qk_portable.h writes it), and the m16n8k16 matrix op per warp: each lane
 * posts its fragments in a slot, the warp meets (qk_syncwarp), and each lane forms its four outputs
 * from the PTX ISA's fragment layout (qk_portable.h's qk_mma_16816 comment): products exact in fp32,
 * the sums in k order, every fp32 operation rounded on its own */
#define __constant__ static const
struct float2 { float x, y; };
static inline float2 make_float2(float x, float y) { return {x, y}; }
static inline uint4 make_uint4(qk_u32 x, qk_u32 y, qk_u32 z, qk_u32 w) { return {x, y, z, w}; }
static inline int __ffsll(long long v) { return __builtin_ffsll(v); }
#define QK_FADD(a, b) ((float)(a) + (float)(b))
/* device-wide counts (the CTAs run one after another on the host: plain read-modify-writes would do) */
static inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned atomicExch(unsigned* p, unsigned v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
static inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
static inline bool qk_isnan(float v) { return (qk_bits(v) & 0x7FFFFFFFu) > 0x7F800000u; }
static inline float qk_ftz(float v) { return (qk_bits(v) & 0x7F800000u) == 0u ? qk_float(qk_bits(v) & 0x80000000u) : v; }
static inline qk_u16 qk_fp16_bits(float v) {
    if (qk_isnan(v)) return (qk_u16)(((qk_bits(v) >> 16) & 0x8000u) | 0x7E00u);
    const _Float16 h = (_Float16)v;
    qk_u16 b;
    memcpy(&b, &h, 2);
    return b;
}
static inline qk_u32 qk_and_or(qk_u32 v, qk_u32 mask, qk_u32 bits) { return (v & mask) | bits; }
static qk_u32 qk_host_frag[1024][6]; /* a lane's a[0..3], b[0..1] */
static inline float qk_host_half(qk_u32 w, int hi, bool bf16) {
    const qk_u16 h = (qk_u16)(hi ? w >> 16 : w);
    return bf16 ? qk_float((qk_u32)h << 16) : qk_fp16_to_float(h);
}
/* element (row, col) of the warp's 16 x 16 A, (col k, token n) of its 16 x 8 B */
static inline float qk_host_a(const qk_u32 (*f)[6], int row, int k, bool bf16) {
    const int lane = 4 * (row & 7) + ((k & 7) >> 1), reg = (row >> 3) + 2 * (k >> 3);
    return qk_host_half(f[lane][reg], k & 1, bf16);
}
static inline float qk_host_b(const qk_u32 (*f)[6], int k, int n, bool bf16) {
    const int lane = 4 * n + ((k & 7) >> 1);
    return qk_host_half(f[lane][4 + (k >> 3)], k & 1, bf16);
}
template <bool BF16>
static inline void qk_host_mma(float d[4], const qk_u32 a[4], const qk_u32 b[2]) {
    const int lane = (int)(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
    qk_u32(*f)[6] = qk_host_frag + (threadIdx.x & ~31u);
    for (int i = 0; i < 4; ++i) f[lane][i] = a[i];
    f[lane][4] = b[0];
    f[lane][5] = b[1];
    qk_syncwarp();
    for (int r = 0; r < 4; ++r) {
        const int row = g + 8 * (r >> 1), n = 2 * t + (r & 1);
        for (int k = 0; k < 16; ++k) d[r] += qk_host_a(f, row, k, BF16) * qk_host_b(f, k, n, BF16);
    }
    qk_syncwarp();
}
static inline void qk_mma_16816(float d[4], const qk_u32 a[4], const qk_u32 b[2]) { qk_host_mma<false>(d, a, b); }
static inline void qk_mma_16816_bf16(float d[4], const qk_u32 a[4], const qk_u32 b[2]) { qk_host_mma<true>(d, a, b); }
#endif

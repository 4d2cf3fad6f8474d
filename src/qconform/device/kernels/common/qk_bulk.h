/* Hopper's bulk copy engine and its mbarriers (PTX ISA: "Parallel Synchronization and Communication
 * Instructions: mbarrier", "Data Movement and Conversion Instructions: cp.async.bulk"), sm_90+ only:
 * a barrier's phase completes when its one arrival (the issuing thread's arrive.expect_tx) and the
 * copies' announced bytes have landed; a thread waits on a phase's parity. Barrier and destination
 * addresses are shared-window addresses (qk_smem_addr). QK_BULK is 1 where these exist; callers keep
 * a path of plain loads for the other targets (AMD, older NVIDIA, the host stand-ins). */
#pragma once
#if defined(QK_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define QK_BULK 1
__device__ __forceinline__ qk_u32 qk_smem_addr(const void* p) { return (qk_u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void qk_mbar_init(qk_u32 bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
}
/* the same, its phases completing on count arrivals */
__device__ __forceinline__ void qk_mbar_init_n(qk_u32 bar, qk_u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
/* one arrival on bar, made once every cp.async this thread issued before has landed; the arrival is
 * not counted in advance (.noinc): bar's count must include it */
__device__ __forceinline__ void qk_mbar_arrive_cp_async(qk_u32 bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
/* the inits visible to the copy engine before the first copy completes on them (then a CTA barrier) */
__device__ __forceinline__ void qk_mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
__device__ __forceinline__ void qk_mbar_expect(qk_u32 bar, qk_u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void qk_mbar_wait(qk_u32 bar, int parity) {
    qk_u32 done = 0;
    while (!done)
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
}
/* bytes (a multiple of 16) from the 16-byte aligned global src to the 16-byte aligned shared dst,
 * completing on the mbarrier bar */
__device__ __forceinline__ void qk_bulk_copy(qk_u32 dst, const void* src, qk_u32 bytes, qk_u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
#else
#define QK_BULK 0
#endif

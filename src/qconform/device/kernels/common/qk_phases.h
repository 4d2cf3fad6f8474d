/* Bench-only phase stamps (qconform.bench.phases). With -DQK_PHASES, thread 0 of each CTA of a kernel that
 * marks QK_PHASE(i) writes its SM clock (clock64) and a device-wide clock (CUDA %globaltimer, in ns; HIP
 * wall_clock64) into qk_phase_clock[CTA][i][2], CTA = blockIdx.x + gridDim.x blockIdx.y (the first
 * QK_PHASE_CTAS of them); QK_PHASE_AFTER(i, v) first makes the stamp wait for the value v (a load's
 * result); QK_PHASE_SM(i) writes the CTA's SM instead (below). The kernels of one module take separate
 * boundaries i < QK_PHASE_SLOTS. Without the option the
 * macros do nothing and nothing else is defined. */
#pragma once

#if defined(QK_PHASES)
#define QK_PHASE_CTAS 4096
#define QK_PHASE_SLOTS 24
__device__ unsigned long long qk_phase_clock[QK_PHASE_CTAS * QK_PHASE_SLOTS * 2];
__device__ __forceinline__ void qk_phase(int i) {
    if (threadIdx.x != 0) return;
    const unsigned cta = blockIdx.x + gridDim.x * blockIdx.y;
    if (cta >= QK_PHASE_CTAS) return;
#if defined(QK_CUDA)
    unsigned long long wall;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(wall));
#else
    const unsigned long long wall = wall_clock64();
#endif
    unsigned long long* slot = qk_phase_clock + (cta * QK_PHASE_SLOTS + i) * 2;
    slot[0] = (unsigned long long)clock64();
    slot[1] = wall;
}
/* QK_PHASE_SM(i): slot i's first word the CTA's SM (CU on HIP) plus one, not a clock */
__device__ __forceinline__ void qk_phase_sm(int i) {
    if (threadIdx.x != 0) return;
    const unsigned cta = blockIdx.x + gridDim.x * blockIdx.y;
    if (cta >= QK_PHASE_CTAS) return;
#if defined(QK_CUDA)
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
#else
    const unsigned sm = __smid();
#endif
    qk_phase_clock[(cta * QK_PHASE_SLOTS + i) * 2] = sm + 1ull;
}
#define QK_PHASE(i) qk_phase(i)
#define QK_PHASE_AFTER(i, v)                              \
    do {                                                  \
        asm volatile("" ::"r"((unsigned)(v)) : "memory"); \
        qk_phase(i);                                      \
    } while (0)
#define QK_PHASE_SM(i) qk_phase_sm(i)
#else /* a statement still (``if (c) QK_PHASE(i);`` keeps a body) */
#define QK_PHASE(i) ((void)0)
#define QK_PHASE_AFTER(i, v) ((void)0)
#define QK_PHASE_SM(i) ((void)0)
#endif

/* Host run of keep_quant_fast.hip's kernels, whole (tests/test_keep_quant_fast_host.py): every CTA of
 * the launcher's grid (qconform/device/ggml/keep_quant.py: MT 1, 2 or 4 activation rows, 4 weight
 * rows, 128 threads), one CTA at a time as 128 host threads (tests/kernel_host/qk_portable.h).
 * Arguments: KIND M N nb W-file A-file Y-file (float32 M x N out) stale-file [C]; A as the kernel reads it,
 * the stale file as many bytes: what each CTA's activation buffer holds until all its threads have
 * waited for the kernel before (QK_WAIT_PRIOR_GRID, tests/kernel_host/qk_portable.h). With C (Q6_K or
 * Q8_0, M = 1): qk_kq_bulk_<t> on a grid of C CTAs taking the row groups in turn. */
#include "keep_quant_fast.hip"
#include <stdio.h>
#include <stdlib.h>
#include <thread>
#include <vector>

typedef void (*kf_kernel)(const qk_u8*, const qk_u8*, float*, qk_i64, qk_i64, qk_i64);

static kf_kernel pick(int kind, int mt) {
    const kf_kernel t[4][3] = {
        {qk_kq_fast_q8_0_m1, qk_kq_fast_q8_0_m2, qk_kq_fast_q8_0_m4},
        {qk_kq_fast_q4_k_m1, qk_kq_fast_q4_k_m2, qk_kq_fast_q4_k_m4},
        {qk_kq_fast_q5_k_m1, qk_kq_fast_q5_k_m2, qk_kq_fast_q5_k_m4},
        {qk_kq_fast_q6_k_m1, qk_kq_fast_q6_k_m2, qk_kq_fast_q6_k_m4},
    };
    return t[kind == 0 ? 0 : kind - 3][mt == 1 ? 0 : mt == 2 ? 1 : 2];
}

int main(int argc, char** argv) {
    if (argc != 9 && argc != 10) return 2;
    const int kind = atoi(argv[1]), M = atoi(argv[2]), N = atoi(argv[3]), nb = atoi(argv[4]);
    const qk_u8* W = (const qk_u8*)qk_host_load(argv[5]);
    size_t bytes = 0;
    const qk_u8* A = (const qk_u8*)qk_host_load(argv[6], &bytes);
    const qk_u8* stale = (const qk_u8*)qk_host_load(argv[8]); /* the buffer's bytes before the quantize wrote it */
    qk_u8* Abuf = (qk_u8*)qk_host_load(argv[8]);
    qk_host_prior_dst = Abuf;
    qk_host_prior_src = A;
    qk_host_prior_bytes = bytes;
    qk_host_cta_threads = 128;
    const int mt = M <= 1 ? 1 : M <= 2 ? 2 : 4; /* keep_quant.py act_tile(M, FAST_TILES) */
    std::vector<float> Y((size_t)M * N, -12345.0f);
    kf_kernel k = pick(kind, mt);
    std::barrier<> bar(128);
    qk_host_barrier = &bar;
    std::barrier<> groups[4] = {std::barrier<>(32), std::barrier<>(32), std::barrier<>(32), std::barrier<>(32)};
    qk_host_group_barriers = groups;
    unsigned gy = (unsigned)((N + 3) / 4); /* row groups of 4 weight rows */
    gridDim = {(unsigned)((M + mt - 1) / mt), gy, 1};
    if (argc == 10) {
        if (M != 1 || (kind != 6 && kind != 0)) return 2;
        k = kind == 6 ? qk_kq_bulk_q6_k : qk_kq_bulk_q8_0;
        gy = 1;
        gridDim = {(unsigned)atoi(argv[9]), 1, 1};
    }
    for (unsigned by = 0; by < gy; ++by)
        for (unsigned bx = 0; bx < gridDim.x; ++bx) {
            memcpy(Abuf, stale, bytes); /* each CTA: the quantize not yet done until its threads wait */
            qk_host_waits = 0;
            qk_host_prior_done = false;
            std::vector<std::thread> th;
            for (unsigned t = 0; t < 128; ++t)
                th.emplace_back([=, &Y] {
                    threadIdx = {t, 0, 0};
                    blockIdx = {bx, by, 0};
                    k(W, Abuf, Y.data(), M, N, nb);
                });
            for (auto& x : th) x.join();
        }
    FILE* f = fopen(argv[7], "wb");
    fwrite(Y.data(), sizeof(float), Y.size(), f);
    fclose(f);
    return 0;
}

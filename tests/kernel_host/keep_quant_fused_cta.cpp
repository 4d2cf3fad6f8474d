/* Host run of keep_quant_fast.hip's one-launch M = 1 kernels (-DQK_KF_FUSED, qk_kq_fused_q4_k / _q5_k;
 * tests/test_keep_quant_fast_host.py): every CTA of a grid of G, one CTA at a time as 128 host threads
 * (tests/kernel_host/qk_portable.h), each quantizing the fp32 row itself and then taking the row groups
 * blockIdx.x, blockIdx.x + G, ...; the shared memory holds stale bytes (0x7F) at each CTA's start. With
 * -DQK_KFQ_PUBLISH the first CTAs quantize the row into a global buffer for the others (lower blockIdx
 * first, as the device dispatches them), and the counts must be back to zero after the launch.
 * Arguments: KIND N nb G W-file X-file Y-file (float32 1 x N out, every element -12345 until stored). */
#include "keep_quant_fast.hip"
#include <stdio.h>
#include <stdlib.h>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
    if (argc != 8) return 2;
    const int kind = atoi(argv[1]), N = atoi(argv[2]), nb = atoi(argv[3]), G = atoi(argv[4]);
    const qk_u8* W = (const qk_u8*)qk_host_load(argv[5]);
    const float* X = (const float*)qk_host_load(argv[6]);
    std::vector<float> Y((size_t)N, -12345.0f);
#ifdef QK_KFQ_PUBLISH /* the row quantized once into act by the first CTAs, counted in count[0] */
    static unsigned count[2] = {0u, 0u};
    const size_t slots = (size_t)(nb + 31) / 32 * 32 * 292; /* the launcher's: 32-block passes */
    qk_u8* act = (qk_u8*)aligned_alloc(256, slots);
    memset(act, 0x7F, slots); /* stale, as the shared memory */
    auto k = [&](const float* x, const qk_u8* w, float* y, qk_i64 n, qk_i64 b) {
        (kind == 4 ? qk_kq_fused_pub_q4_k : qk_kq_fused_pub_q5_k)(x, w, y, n, b, act, count);
    };
#else
    auto k = kind == 4 ? qk_kq_fused_q4_k : qk_kq_fused_q5_k;
#endif
    std::barrier<> bar(128);
    qk_host_barrier = &bar;
    std::barrier<> groups[4] = {std::barrier<>(32), std::barrier<>(32), std::barrier<>(32), std::barrier<>(32)};
    qk_host_group_barriers = groups;
    gridDim = {(unsigned)G, 1, 1};
    for (unsigned bx = 0; bx < (unsigned)G; ++bx) {
        memset(qk_host_dyn_smem, 0x7F, sizeof qk_host_dyn_smem); /* stale: d 3.4e38, every quant 127 */
        std::vector<std::thread> th;
        for (unsigned t = 0; t < 128; ++t)
            th.emplace_back([=, &Y] {
                threadIdx = {t, 0, 0};
                blockIdx = {bx, 0, 0};
                k(X, W, Y.data(), N, nb);
            });
        for (auto& x : th) x.join();
    }
#ifdef QK_KFQ_PUBLISH
    if (count[0] != 0u || count[1] != 0u) return 5; /* the counts not zeroed for the next call */
#endif
    FILE* f = fopen(argv[7], "wb");
    fwrite(Y.data(), sizeof(float), Y.size(), f);
    fclose(f);
    return 0;
}

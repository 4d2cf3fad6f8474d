/* Host run of keep_quant_fast.hip's one-launch M = 1 kernels (qk_kq_one_q4_k / _q5_k, qk_kq_one_bulk_q6_k
 * and qk_kq_one_bulk_q8_0;
 * tests/test_keep_quant_fast_host.py): every CTA of a grid of G, one CTA at a time as 128 host threads
 * (tests/kernel_host/qk_portable.h), in blockIdx order as the device dispatches them: the first
 * ceil(nb / 4) quantize the fp32 row into the global act buffer (stale bytes 0x7F before the launch)
 * and count themselves, the others take the row groups; the counts (and any SM tickets of the quantizing
 * CTAs after them) must be back to zero after the launch (exit status 5 otherwise).
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
    /* the two counts, then the bench-only builds' tickets (-DQK_KF_FIRST_AFTER_WAIT=3's) */
    static unsigned count[3 + 64] = {};
    /* the launcher's: whole producer passes (Q8_0, kind 0: 64 blocks of 48 bytes a pass) */
    const size_t slots = kind == 0 ? (size_t)(nb + 63) / 64 * 64 * 48 : (size_t)(nb + 3) / 4 * 4 * 292;
    qk_u8* act = (qk_u8*)aligned_alloc(256, slots);
    memset(act, 0x7F, slots); /* stale: d 3.4e38, every quant 127 */
    auto k = kind == 4 ? qk_kq_one_q4_k : qk_kq_one_q5_k;
    if (kind == 6) k = qk_kq_one_bulk_q6_k;
    if (kind == 0) k = qk_kq_one_bulk_q8_0;
    std::barrier<> bar(128);
    qk_host_barrier = &bar;
    std::barrier<> groups[4] = {std::barrier<>(32), std::barrier<>(32), std::barrier<>(32), std::barrier<>(32)};
    qk_host_group_barriers = groups;
    gridDim = {(unsigned)G, 1, 1};
    for (unsigned bx = 0; bx < (unsigned)G; ++bx) {
        std::vector<std::thread> th;
        for (unsigned t = 0; t < 128; ++t)
            th.emplace_back([=, &Y] {
                threadIdx = {t, 0, 0};
                blockIdx = {bx, 0, 0};
                k(X, W, Y.data(), N, nb, act, count);
            });
        for (auto& x : th) x.join();
    }
    for (unsigned c : count)
        if (c != 0u) return 5; /* the counts not zeroed for the next call */
    FILE* f = fopen(argv[7], "wb");
    fwrite(Y.data(), sizeof(float), Y.size(), f);
    fclose(f);
    return 0;
}

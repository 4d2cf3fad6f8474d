/* Host run of bnb/gemm_mma.hip's kernels, whole (tests/test_bnb_gemm_mma_host.py): every CTA of the
 * launcher's grid (qconform/device/bnb/gemm.py mma_geometry: 256 threads, the tiles striding over the
 * grid), one CTA at a time as 256 host threads (tests/kernel_host/qk_portable.h), the pair table in its
 * 16 static copies (the HIP build's). Arguments: SYMBOL (n1, n1_r1, n2) M N K blocksize quant_type
 * a_dtype grid A-file B-file absmax-file bias-file ("-": none) C-file. The launch runs twice (as two
 * calls on a stream); C comes back as the 16-bit words the second left, each 0xFFFF until written, and
 * the exit status is 4 where the two calls' words differ. */
#include "gemm_mma.hip"
#include <stdio.h>
#include <stdlib.h>
#include <thread>
#include <vector>

typedef void (*bnbm_kernel)(QCONFORM_GEMM_4BIT_PARAMS);

int main(int argc, char** argv) {
    if (argc != 14) return 2;
    const char* sym = argv[1];
    const bnbm_kernel k = !strcmp(sym, "n1") ? qk_gemm_4bit_mma_n1 : !strcmp(sym, "n2") ? qk_gemm_4bit_mma_n2
                                                                                         : qk_gemm_4bit_mma_n1_r1;
    const long long M = atoll(argv[2]), N = atoll(argv[3]), K = atoll(argv[4]), bs = atoll(argv[5]);
    const long long qt = atoll(argv[6]), dt = atoll(argv[7]);
    const unsigned grid = (unsigned)atoi(argv[8]);
    const void* A = qk_host_load(argv[9]);
    const qk_u8* B = (const qk_u8*)qk_host_load(argv[10]);
    const float* absmax = (const float*)qk_host_load(argv[11]);
    const void* bias = qk_host_load(argv[12]);
    std::barrier<> bar(256);
    qk_host_barrier = &bar;
    std::barrier<> groups[8] = {std::barrier<>(32), std::barrier<>(32), std::barrier<>(32), std::barrier<>(32),
                                std::barrier<>(32), std::barrier<>(32), std::barrier<>(32), std::barrier<>(32)};
    qk_host_group_barriers = groups;
    gridDim = {grid, 1, 1};
    blockDim = {256, 1, 1};
    std::vector<qk_u16> first, C;
    for (int call = 0; call < 2; ++call) { /* two calls: the second must repeat the first's bits */
        first.swap(C);
        C.assign((size_t)(M * N), 0xFFFFu);
        for (unsigned bx = 0; bx < grid; ++bx) {
            std::vector<std::thread> th;
            for (unsigned t = 0; t < 256; ++t)
                th.emplace_back([=, &C] {
                    threadIdx = {t, 0, 0};
                    blockIdx = {bx, 0, 0};
                    k(A, B, absmax, bias, C.data(), M, N, K, bs, qt, dt);
                });
            for (auto& x : th) x.join();
        }
    }
    FILE* f = fopen(argv[13], "wb");
    fwrite(C.data(), sizeof(qk_u16), C.size(), f);
    fclose(f);
    return first == C ? 0 : 4;
}

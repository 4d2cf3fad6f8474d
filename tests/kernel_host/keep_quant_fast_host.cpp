#include "keep_quant_fast.hip"
#include <stdio.h>
#include <stdlib.h>
/* Host driver of keep_quant_fast.hip's per-thread functions (tests/test_keep_quant_fast_host.py):
 * y[m][n] = the sum, in double, of every (block, slice) thread term kf_wload + kf_block form in fp32
 * (the kernel's work without its shuffles and group sums). Arguments: KIND M N nb (weight blocks a
 * row) W-file (the weight blocks) A-file (the activation blocks: Q8_K as quantized, Q8_0 in the
 * qk_q8_0_quant_words layout) Y-file (float64 M x N out). */
template <int KIND, int TS>
static void run(const qk_u8* W, const qk_u8* aq, int M, int N, int nb, double* y) {
    constexpr int AW = KIND == 0 ? KF_A0 : KF_Q8K; /* bytes per activation block */
    for (int n = 0; n < N; ++n)
        for (int ib = 0; ib < nb; ++ib)
            for (int c = 0; c < 8; ++c) {
                if (KIND == 0 && c >= 2) continue;
                const qk_u8* blk = W + ((qk_i64)n * nb + ib) * TS;
                qk_u32 r[KF_WR(KIND)];
                kf_wload<KIND>(blk, c, r);
                float acc[4] = {0, 0, 0, 0};
                kf_block<KIND, 4>(r, blk, aq + (qk_i64)ib * AW, (qk_i64)nb * AW, M, c, acc);
                for (int m = 0; m < M; ++m) y[(qk_i64)m * N + n] += acc[m];
            }
}
int main(int argc, char** argv) {
    if (argc != 8) return 2;
    int kind = atoi(argv[1]), M = atoi(argv[2]), N = atoi(argv[3]), nb = atoi(argv[4]);
    FILE* f = fopen(argv[5], "rb"); fseek(f, 0, SEEK_END); long nw = ftell(f); rewind(f);
    qk_u8* W = (qk_u8*)aligned_alloc(16, (nw + 15) / 16 * 16); fread(W, 1, nw, f); fclose(f);
    f = fopen(argv[6], "rb"); fseek(f, 0, SEEK_END); long na = ftell(f); rewind(f);
    qk_u8* A = (qk_u8*)aligned_alloc(16, (na + 15) / 16 * 16); fread(A, 1, na, f); fclose(f);
    double* y = (double*)calloc((size_t)M * N, sizeof(double));
    if (kind == 4) run<4, 144>(W, A, M, N, nb, y);
    if (kind == 5) run<5, 176>(W, A, M, N, nb, y);
    if (kind == 6) run<6, 210>(W, A, M, N, nb, y);
    if (kind == 0) run<0, 34>(W, A, M, N, nb, y);
    f = fopen(argv[7], "wb"); fwrite(y, sizeof(double), (size_t)M * N, f); fclose(f);
    return 0;
}

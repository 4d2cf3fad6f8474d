/* Mutant so: launcher that never checks anything and always returns 0: a call with
 * n_blocks = -1 makes a zero-sized grid whose launch fails, and the failure is reported as
 * success. The pending-error property's bad call must fail it. */
#include "ggml/q8_quant.hip"

extern "C" int qk_q8_k_quantize(const void* in, void* out, long long n_blocks, void* stream) {
    long long grid = (n_blocks * 8 + 255) / 256;
    qk_q8_k_quant_coop<<<(unsigned)(grid > 0 ? grid : 0), 256, 0, (cudaStream_t)stream>>>(in, out, n_blocks);
    return 0;
}

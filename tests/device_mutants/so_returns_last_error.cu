/* Mutant so: launcher: <<<>>> then `return cudaGetLastError()`. With a foreign error pending it
 * returns that error as its own (and swallows it): the pending-error property must fail it. */
#include "ggml/q8_quant.hip"

extern "C" int qk_q8_k_quantize(const void* in, void* out, long long n_blocks, void* stream) {
    if (n_blocks <= 0) return n_blocks < 0 ? (int)cudaErrorInvalidValue : 0;
    qk_q8_k_quant_coop<<<(unsigned)((n_blocks * 8 + 255) / 256), 256, 0, (cudaStream_t)stream>>>(in, out, n_blocks);
    return (int)cudaGetLastError();
}

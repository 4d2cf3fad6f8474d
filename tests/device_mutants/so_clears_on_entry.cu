/* A launcher that clears the last error on entry by design, then reports its launch through
 * cudaGetLastError(): correct status and output, but the caller's pending error is gone. The
 * pending-error property reports it as a warning and does not fail it. */
#include "ggml/q8_quant.hip"

extern "C" int qk_q8_k_quantize(const void* in, void* out, long long n_blocks, void* stream) {
    (void)cudaGetLastError();
    if (n_blocks <= 0) return n_blocks < 0 ? (int)cudaErrorInvalidValue : 0;
    qk_q8_k_quant_coop<<<(unsigned)((n_blocks * 8 + 255) / 256), 256, 0, (cudaStream_t)stream>>>(in, out, n_blocks);
    return (int)cudaGetLastError();
}

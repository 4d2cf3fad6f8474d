/* Mutant: the cooperative Q8_K kernel returns early in the last grid block when it is partial
 * (n_blocks * 8 not a multiple of 256), leaving those super-blocks unwritten.
 * Launch: mutant_q8_k_skip_last, lanes=8. */
#include "ggml/q8_quant.hip"

extern "C" __global__ void __launch_bounds__(256) mutant_q8_k_skip_last(const void* in, void* out, qk_i64 n_blocks) {
    if (blockIdx.x == gridDim.x - 1 && (n_blocks * 8) % blockDim.x != 0) return;
    qk_q8_k_quant_coop_body(in, out, n_blocks);
}

/* Mutant: Q8_K values rounded half away from zero (roundf) instead of ggml's nearest_int (half to
 * even). Launch: qk_q8_k_quant_coop, lanes=8. */
#include "qk_portable.h"

__device__ __forceinline__ int mutant_round_away(float f, float src) {
    (void)src;
    return fabsf(f) < 1073741824.0f ? (int)roundf(f) : 0;
}
#define QK_Q8K_ROUND mutant_round_away
#include "ggml/q8_quant.hip"

/* Mutant: the cooperative Q8_K amax reduction breaks equal-|x| ties toward the higher index, so
 * the sign of d flips when the largest |x| occurs with both signs in different lanes.
 * Launch: qk_q8_k_quant_coop, lanes=8. */
#define QK_COOP_TIE_LOWER(mine, other) ((other) > (mine))
#include "ggml/q8_quant.hip"

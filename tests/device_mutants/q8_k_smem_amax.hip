/* A cooperative Q8_K kernel whose 8 lanes per super-block sit in 8 different warps (lane l of
 * super-block s is thread 32*l + s) and meet in shared memory for the amax. q8k_smem_amax has the
 * __syncthreads() between writing and reading the partial maxima and must pass;
 * mutant_q8k_smem_amax_race leaves it out (a race) and must be caught. Lane l quantizes values
 * 32l..32l+31, so its two bsums are its own. Launch: lanes=8, threads=256. */
#include "ggml/q8_quant.hip"

template <bool BARRIER>
__device__ __forceinline__ void smem_amax_body(const void* in, void* out, qk_i64 n_blocks) {
    __shared__ float s_amax[8][32];
    __shared__ float s_mx[8][32];
    __shared__ int s_idx[8][32];
    const int s = threadIdx.x % 32, l = threadIdx.x / 32;
    const qk_i64 sb = (qk_i64)blockIdx.x * 32 + s;
    const bool active = sb < n_blocks;
    const float* x = (const float*)in + sb * QK_K + 32 * l;
    float amax = 0.0f, mx = 0.0f;
    int idx = QK_K;
    if (active) {
        for (int j = 0; j < 32; ++j) {
            float v = qk_ftz(x[j]);
            if (fabsf(v) > amax) { amax = fabsf(v); mx = v; idx = 32 * l + j; }
        }
    }
    s_amax[l][s] = amax;
    s_mx[l][s] = mx;
    s_idx[l][s] = idx;
    if (BARRIER) __syncthreads();
    for (int o = 0; o < 8; ++o) {  /* lanes in index order: ties keep the lower index */
        if (s_amax[o][s] > amax || (s_amax[o][s] == amax && s_idx[o][s] < idx)) {
            amax = s_amax[o][s]; mx = s_mx[o][s]; idx = s_idx[o][s];
        }
    }
    if (!active) return;
    qk_u8* y = (qk_u8*)out + sb * Q8_K_BYTES;
    const bool zero = amax == 0.0f;
    const float iscale = zero ? 0.0f : qk_ftz(QK_FDIV(-127.0f, mx));
    for (int g = 0; g < 2; ++g) {
        int sum = 0;
        for (int j = 0; j < 16; ++j) {
            int q = zero ? 0 : qk_q8_k_value(iscale, x[16 * g + j]);
            sum += q;
            y[Q8_K_QS + 32 * l + 16 * g + j] = (qk_u8)(q & 0xFF);
        }
        ((qk_i16*)(y + Q8_K_BSUMS))[2 * l + g] = (qk_i16)sum;
    }
    if (l == 0) *(float*)y = zero ? 0.0f : qk_ftz(QK_FDIV(1.0f, iscale));
}

extern "C" __global__ void __launch_bounds__(256) q8k_smem_amax(const void* in, void* out, qk_i64 n_blocks) {
    smem_amax_body<true>(in, out, n_blocks);
}

extern "C" __global__ void __launch_bounds__(256) mutant_q8k_smem_amax_race(const void* in, void* out, qk_i64 n_blocks) {
    smem_amax_body<false>(in, out, n_blocks);
}

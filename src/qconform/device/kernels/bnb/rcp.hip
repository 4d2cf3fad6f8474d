/* The device's approximate fp32 reciprocal, measured: the table of qconform.oracles.bnb.rcp.
 *
 * bitsandbytes' CUDA quantize kernels compute the block reciprocal as 1.0f / absmax under
 * --use_fast_math (csrc/kernels.cu kQuantizeBlockwise, CMakeLists.txt), which nvcc lowers to the
 * PTX instruction rcp.approx.ftz.f32; HIP's fast math lowers it to v_rcp_f32
 * (__builtin_amdgcn_rcpf). Neither is IEEE. docs/bnb-4bit.md 2.1 describes the table.
 *
 * qk_rcp_table: table[k] = bits(rcp_approx(m_k)) - bits(fl32(1 / m_k)), m_k the float32 with bits
 * 0x3F800000 | k, k < 2^23 (one thread each); the difference is stored as int8, and a difference
 * outside [-128, 127] is reported through *overflow (the table format cannot hold it).
 * qk_rcp_scaled: y[i] = bits(rcp_approx(x[i])) for arbitrary x (the 2^k scaling and the special
 * values are checked against the table's rule on the host). */
#include "qk_portable.h"

__device__ __forceinline__ float qk_rcp_approx(float x) {
#if defined(QK_CUDA)
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
#else
    return __builtin_amdgcn_rcpf(x);
#endif
}

extern "C" __global__ void __launch_bounds__(256) qk_rcp_table(qk_i8* table, qk_i64 n, int* overflow) {
    const qk_i64 k = qk_global_thread();
    if (k >= n) return;
    const float m = qk_float(0x3F800000u | (qk_u32)k);
    const int d = (int)(qk_bits(qk_rcp_approx(m)) - qk_bits(QK_FDIV(1.0f, m)));
    if (d < -128 || d > 127) atomicOr(overflow, 1);
    table[k] = (qk_i8)d;
}

extern "C" __global__ void __launch_bounds__(256) qk_rcp_scaled(const float* x, qk_u32* y, qk_i64 n) {
    const qk_i64 i = qk_global_thread();
    if (i < n) y[i] = qk_bits(qk_rcp_approx(x[i]));
}

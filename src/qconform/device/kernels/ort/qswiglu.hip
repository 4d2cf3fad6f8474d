/* ONNX Runtime quantized-weight family: the quantized SwiGLU chain, fused and its unfused steps.
 * Semantics: qconform.oracles.ort; shared device functions in ort_common.h. The fused kernel takes
 * its op's declared ABI (qconform_abi.h); the unfused steps plain arguments. */
#include "ort_common.h"

/* ------------------------------------------------------------------------ quantized SwiGLU */
/* sigmoid as the device computes it: 1 / (1 + expf(-g)), expf within 2 ulp (CUDA) -- the one
 * step of the chain that is not the oracle's bit for bit (qconform.oracles.ort.qswiglu) */
__device__ __forceinline__ float qk_sigmoid(float g) { return QK_FDIV(1.0f, QK_FADD(1.0f, expf(-g))); }

__device__ __forceinline__ int qk_load_q(const void* p, qk_i64 i, int is16) {
    return is16 ? (int)((const qk_u16*)p)[i] : (int)((const qk_u8*)p)[i];
}

__device__ __forceinline__ void qk_store_q(void* p, qk_i64 i, int v, int is16) {
    if (is16) ((qk_u16*)p)[i] = (qk_u16)v;
    else ((qk_u8*)p)[i] = (qk_u8)v;
}

/* the whole chain per element, the op's declared ABI (qconform abi qswiglu) */
extern "C" __global__ void __launch_bounds__(256) qk_qswiglu_fused(QCONFORM_QSWIGLU_PARAMS) {
    const qk_i64 t = qk_global_thread();
    if (t >= n) return;
    const int is16 = dtype == QCONFORM_DTYPE_UINT16, hi = is16 ? 65535 : 255;
    const float g = qk_dequantize(qk_load_q(gate_q, t, is16), gate_scale, (int)gate_zp);
    const float u = qk_dequantize(qk_load_q(up_q, t, is16), up_scale, (int)up_zp);
    const float sd = qk_dequantize(qk_quantize(qk_sigmoid(g), sig_scale, (int)sig_zp, 0, hi), sig_scale, (int)sig_zp);
    const float h = qk_ftz(QK_FMUL(g, sd));
    const float hd = qk_dequantize(qk_quantize(h, silu_scale, (int)silu_zp, 0, hi), silu_scale, (int)silu_zp);
    qk_store_q(Y, t, qk_quantize(qk_ftz(QK_FMUL(hd, u)), out_scale, (int)out_zp, 0, hi), is16);
}

/* the unfused steps: DQ to fp32, Q(Sigmoid(x)), and Q(a * b) */
extern "C" __global__ void __launch_bounds__(256)
qk_step_dequantize(const void* q, float* y, qk_i64 n, float s, int z, int is16) {
    const qk_i64 t = qk_global_thread();
    if (t < n) y[t] = qk_dequantize(qk_load_q(q, t, is16), s, z);
}

extern "C" __global__ void __launch_bounds__(256)
qk_step_sigmoid_quantize(const float* x, void* q, qk_i64 n, float s, int z, int hi, int is16) {
    const qk_i64 t = qk_global_thread();
    if (t < n) qk_store_q(q, t, qk_quantize(qk_sigmoid(x[t]), s, z, 0, hi), is16);
}

extern "C" __global__ void __launch_bounds__(256)
qk_step_mul_quantize(const float* a, const float* b, void* q, qk_i64 n, float s, int z, int hi, int is16) {
    const qk_i64 t = qk_global_thread();
    if (t < n) qk_store_q(q, t, qk_quantize(qk_ftz(QK_FMUL(a[t], b[t])), s, z, 0, hi), is16);
}

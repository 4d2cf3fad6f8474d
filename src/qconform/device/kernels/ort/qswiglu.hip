/* ONNX Runtime quantized-weight family: the quantized SwiGLU chain, fused and its unfused steps.
 * Semantics: qconform.oracles.ort; shared device functions in ort_common.h. Kernels take plain
 * pointer and int arguments (CuPy launches them; qconform.device.ort says how). */
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

/* the whole chain per element; p = {gate_s, up_s, sig_s, silu_s, out_s}, z likewise */
extern "C" __global__ void __launch_bounds__(256)
qk_qswiglu_fused(const void* gate, const void* up, void* out, qk_i64 n, float gs, int gz, float us, int uz, float ss,
                 int sz, float hs, int hz, float os, int oz, int hi, int is16) {
    const qk_i64 t = qk_global_thread();
    if (t >= n) return;
    const float g = qk_dequantize(qk_load_q(gate, t, is16), gs, gz);
    const float u = qk_dequantize(qk_load_q(up, t, is16), us, uz);
    const float sd = qk_dequantize(qk_quantize(qk_sigmoid(g), ss, sz, 0, hi), ss, sz);
    const float hd = qk_dequantize(qk_quantize(qk_ftz(QK_FMUL(g, sd)), hs, hz, 0, hi), hs, hz);
    qk_store_q(out, t, qk_quantize(qk_ftz(QK_FMUL(hd, u)), os, oz, 0, hi), is16);
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

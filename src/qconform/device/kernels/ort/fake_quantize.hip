/* ONNX Runtime quantized-weight family: fake quantization (QuantizeLinear then DequantizeLinear).
 * Semantics: qconform.oracles.ort; shared device functions in ort_common.h. The kernel takes its
 * op's declared ABI (qconform_abi.h). */
#include "ort_common.h"

/* fake_quantize on (rows, cols), the op's declared ABI (qconform abi fake_quantize): granularity
 * tensor / per column (axis 1) / blocked along axis 1 by block_size; zero points widened to int32 */
extern "C" __global__ void __launch_bounds__(256) qk_fake_quantize(QCONFORM_FAKE_QUANTIZE_PARAMS) {
    const qk_i64 t = qk_global_thread();
    if (t >= rows * cols) return;
    const qk_i64 r = t / cols, c = t - r * cols;
    const int x16 = x_dtype == QCONFORM_DTYPE_FLOAT16;
    const qk_i64 p = granularity == QCONFORM_GRANULARITY_TENSOR ? 0
                     : granularity == QCONFORM_GRANULARITY_AXIS ? c
                                                                : r * ((cols + block_size - 1) / block_size) + c / block_size;
    const float s = qk_ftz(qk_load_f(scale, p, x16));
    const int z = zero_point ? zero_point[p] : 0;
    qk_store_f(Y, t, qk_dequantize(qk_quantize(qk_load_f(x, t, x16), s, z, (int)qmin, (int)qmax), s, z), x16);
}

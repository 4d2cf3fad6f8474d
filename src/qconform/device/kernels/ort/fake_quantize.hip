/* ONNX Runtime quantized-weight family: fake quantization (QuantizeLinear then DequantizeLinear).
 * Semantics: qconform.oracles.ort; shared device functions in ort_common.h. Kernels take plain
 * pointer and int arguments (CuPy launches them; qconform.device.ort says how). */
#include "ort_common.h"

/* fake_quantize on (rows, cols): granularity 0 per tensor, 1 per column (axis 1), 2 blocked
 * along axis 1 by bs; zero points widened to int32 by the launcher */
extern "C" __global__ void __launch_bounds__(256)
qk_fake_quantize(const void* x, const void* scale, const int* zp, void* y, int rows, int cols, int gran, int bs,
                 int lo, int hi, int x16, int has_zp) {
    const qk_i64 t = qk_global_thread();
    if (t >= (qk_i64)rows * cols) return;
    const qk_i64 r = t / cols;
    const int c = (int)(t - r * cols);
    const qk_i64 p = gran == 0 ? 0 : gran == 1 ? c : r * ((cols + bs - 1) / bs) + c / bs;
    const float s = qk_ftz(qk_load_f(scale, p, x16));
    const int z = has_zp ? zp[p] : 0;
    qk_store_f(y, t, qk_dequantize(qk_quantize(qk_load_f(x, t, x16), s, z, lo, hi), s, z), x16);
}

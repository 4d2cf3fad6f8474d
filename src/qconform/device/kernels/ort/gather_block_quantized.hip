/* ONNX Runtime quantized-weight family: GatherBlockQuantized.
 * Semantics: qconform.oracles.ort; shared device functions in ort_common.h. Kernels take plain
 * pointer and int arguments (CuPy launches them; qconform.device.ort says how). */
#include "ort_common.h"

/* ------------------------------------------------------------------ GatherBlockQuantized */
#define DT_UINT8 0
#define DT_INT4 1
#define DT_UINT4 2
#define DT_E4M3FN 3
#define DT_E5M2 4

/* fp8 codes -> float, exact (OCP/ONNX: e4m3fn bias 7, no inf, NaN = S.1111.111; e5m2 bias 15) */
__device__ __forceinline__ float qk_fp8(qk_u8 c, int e5m2) {
    const int sign = c >> 7;
    int e, m, mbits, bias;
    if (e5m2) { e = (c >> 2) & 31; m = c & 3; mbits = 2; bias = 15; }
    else { e = (c >> 3) & 15; m = c & 7; mbits = 3; bias = 7; }
    float v;
    if (e5m2 && e == 31) v = m ? qk_float(0x7FC00000u) : qk_float(0x7F800000u);
    else if (!e5m2 && e == 15 && m == 7) v = qk_float(0x7FC00000u);
    else if (e == 0) v = ldexpf((float)m, 1 - bias - mbits);
    else v = ldexpf((float)((1 << mbits) + m), e - bias - mbits);
    return sign ? -v : v;
}

extern "C" __global__ void __launch_bounds__(256)
qk_gather_block_quantized(const qk_u8* data, const qk_i64* indices, const void* scales, const qk_u8* zp, void* out,
                          int rows, int cols, int n_idx, int bits, int bs, int n_blocks, int dtype, int has_zp,
                          int s16, int row_bytes, int zp_row_bytes) {
    const qk_i64 t = qk_global_thread();
    if (t >= (qk_i64)n_idx * cols) return;
    const qk_i64 i = t / cols;
    const int c = (int)(t - i * cols), blk = c / bs;
    qk_i64 r = indices[i];
    if (r < 0) r += rows;
    if (r < 0 || r >= rows) { qk_store_f(out, t, 0.0f, s16); return; }
    const float s = qk_ftz(qk_load_f(scales, r * n_blocks + blk, s16));
    float v;
    if (dtype == DT_E4M3FN || dtype == DT_E5M2) {
        v = qk_ftz(QK_FMUL(qk_fp8(data[r * cols + c], dtype == DT_E5M2), s));
    } else {
        int d, z;
        if (dtype == DT_UINT8) {
            d = qk_field(data + r * row_bytes, bits, c);
            z = has_zp ? qk_field(zp + r * zp_row_bytes, bits, blk) : (1 << (bits - 1));
        } else {
            d = qk_field(data, 4, r * cols + c);
            z = has_zp ? qk_field(zp, 4, r * n_blocks + blk) : 0;
            if (dtype == DT_INT4) { d = d >= 8 ? d - 16 : d; z = z >= 8 ? z - 16 : z; }
        }
        v = qk_ftz(QK_FMUL((float)(d - z), s));
    }
    qk_store_f(out, t, v, s16);
}

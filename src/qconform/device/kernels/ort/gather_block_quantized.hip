/* ONNX Runtime quantized-weight family: GatherBlockQuantized.
 * Semantics: qconform.oracles.ort; shared device functions in ort_common.h. The kernel takes its
 * op's declared ABI (qconform_abi.h). */
#include "ort_common.h"

/* ------------------------------------------------------------------ GatherBlockQuantized */
#define DT_UINT8 QCONFORM_DATA_TYPE_UINT8
#define DT_INT4 QCONFORM_DATA_TYPE_INT4
#define DT_UINT4 QCONFORM_DATA_TYPE_UINT4
#define DT_E4M3FN QCONFORM_DATA_TYPE_FLOAT8E4M3FN
#define DT_E5M2 QCONFORM_DATA_TYPE_FLOAT8E5M2

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

/* the op's declared ABI (qconform abi gather_block_quantized), one thread per output element */
extern "C" __global__ void __launch_bounds__(256) qk_gather_block_quantized(QCONFORM_GATHER_BLOCK_QUANTIZED_PARAMS) {
    const qk_u8* zp = zero_points;
    void* out = Y;
    const int bs = (int)block_size, dtype = (int)data_type, has_zp = zero_points != 0;
    const int s16 = y_dtype == QCONFORM_DTYPE_FLOAT16;
    const qk_i64 n_blocks = (cols + block_size - 1) / block_size;
    const qk_i64 row_bytes = cols * bits / 8, zp_row_bytes = (n_blocks * bits + 7) / 8;
    const qk_i64 t = qk_global_thread();
    if (t >= n_indices * cols) return;
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
            d = qk_field(data + r * row_bytes, (int)bits, c);
            z = has_zp ? qk_field(zp + r * zp_row_bytes, (int)bits, blk) : (1 << (bits - 1));
        } else {
            d = qk_field(data, 4, r * cols + c);
            z = has_zp ? qk_field(zp, 4, r * n_blocks + blk) : 0;
            if (dtype == DT_INT4) { d = d >= 8 ? d - 16 : d; z = z >= 8 ? z - 16 : z; }
        }
        v = qk_ftz(QK_FMUL((float)(d - z), s));
    }
    qk_store_f(out, t, v, s16);
}

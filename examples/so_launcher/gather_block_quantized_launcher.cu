/* A worked `so:` launcher for gather_block_quantized (com.microsoft.GatherBlockQuantized): the
 * kernel and its C launcher in one file, written against qconform_abi.h (the argument list
 * QCONFORM_GATHER_BLOCK_QUANTIZED_PARAMS and the enum codes; `qconform abi gather_block_quantized`
 * prints the same declaration and its rules) and qk_portable.h (HIP and CUDA from one source).
 *
 *   extern "C" int gather_block_quantized_launcher(QCONFORM_GATHER_BLOCK_QUANTIZED_PARAMS, void* stream);
 *
 * Build and run (README "Kernel ABIs"; qconform.device.solib.build_launcher runs the same):
 *   NVIDIA: nvcc --cudart shared -shared -Xcompiler -fPIC -arch=sm_90 -I src/qconform/device/kernels/common \
 *             -o libgather.so examples/so_launcher/gather_block_quantized_launcher.cu
 *   AMD:    HIP_PLATFORM=amd hipcc -shared -fPIC --offload-arch=gfx90a -x hip -I src/qconform/device/kernels/common \
 *             -o libgather.so examples/so_launcher/gather_block_quantized_launcher.cu
 *   qconform run --ops gather_block_quantized --impl so:./libgather.so:gather_block_quantized_launcher
 *
 * Y[i, c] = fp(float(d - zp) * scale) of table row r = indices[i], column c:
 *   - r < 0 wraps to r + rows; an r outside [0, rows) after that gives a row of zeros;
 *   - the code d of (r, c), by data_type:
 *       uint8         bits 2/4/8 packed along the row, low bits first: row r is cols * bits / 8 bytes;
 *                     zero points packed the same way along the blocks, default 2^(bits-1)
 *       int4 / uint4  ONNX flat nibbles over the whole rows x cols table, low nibble first (value
 *                     r * cols + c); int4 sign-extended; zero points flat over rows x n_blocks, default 0
 *       float8e4m3fn / float8e5m2: one byte per value, decoded exactly; no zero point
 *   - the scale of block c / block_size of row r: scales (rows, n_blocks) in Y's dtype;
 *   - one fp32 multiply (float(d - zp) * scale), then fp16 Y rounded once, round to nearest even.
 *
 * The error-state rule it follows: launch with cudaLaunchKernel / hipLaunchKernel and return THAT
 * status (0 = success). Never call cudaGetLastError()/hipGetLastError(): it would return (and
 * clear) an error the caller left pending, reporting it as this launch's. */
#include "qconform_abi.h"
#include "qk_portable.h"

#if defined(QK_HIP)
typedef hipStream_t stream_t;
#define LAUNCH_KERNEL hipLaunchKernel
#define INVALID_VALUE hipErrorInvalidValue
#else
typedef cudaStream_t stream_t;
#define LAUNCH_KERNEL cudaLaunchKernel
#define INVALID_VALUE cudaErrorInvalidValue
#endif

#define THREADS 256 /* one thread per output element */

/* field j of a low-bits-first stream of `bits`-bit fields (bits 2, 4 or 8: never across bytes) */
__device__ __forceinline__ int field(const qk_u8* stream, long long bits, long long j) {
    const long long bit = j * bits;
    return (stream[bit / 8] >> (int)(bit % 8)) & ((1 << bits) - 1);
}

__device__ __forceinline__ int sign_extend_nibble(int v) { return v >= 8 ? v - 16 : v; }

/* an fp8 code as float, exactly (OCP 8-bit floats, as ONNX defines them):
 * e4m3fn: 4 exponent bits (bias 7), 3 mantissa bits, no infinities, S.1111.111 is NaN;
 * e5m2:   5 exponent bits (bias 15), 2 mantissa bits, IEEE-like (exponent 31: inf or NaN) */
__device__ __forceinline__ float decode_fp8(qk_u8 code, bool e5m2) {
    const int mbits = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
    const int e = (code & 0x7F) >> mbits, m = code & ((1 << mbits) - 1);
    float v;
    if (e5m2 && e == 31) v = m == 0 ? __int_as_float(0x7F800000) : __int_as_float(0x7FC00000);
    else if (!e5m2 && e == 15 && m == 7) v = __int_as_float(0x7FC00000);
    else if (e == 0) v = ldexpf((float)m, 1 - bias - mbits); /* subnormal: m * 2^(1 - bias - mbits) */
    else v = ldexpf((float)((1 << mbits) | m), e - bias - mbits);
    return (code & 0x80) ? -v : v;
}

extern "C" __global__ void gather_block_quantized_kernel(QCONFORM_GATHER_BLOCK_QUANTIZED_PARAMS) {
    const long long t = qk_global_thread();
    if (t >= n_indices * cols) return;
    const long long i = t / cols, c = t % cols;
    const bool fp16 = y_dtype == QCONFORM_DTYPE_FLOAT16;

    long long r = indices[i];
    if (r < 0) r += rows; /* negative indices count from the end */
    float v = 0.0f;       /* out of range: a row of zeros */
    if (r >= 0 && r < rows) {
        const long long n_blocks = (cols + block_size - 1) / block_size, blk = c / block_size;
        const float s = fp16 ? __half2float(((const __half*)scales)[r * n_blocks + blk])
                             : ((const float*)scales)[r * n_blocks + blk];
        if (data_type == QCONFORM_DATA_TYPE_FLOAT8E4M3FN || data_type == QCONFORM_DATA_TYPE_FLOAT8E5M2) {
            const bool e5m2 = data_type == QCONFORM_DATA_TYPE_FLOAT8E5M2;
            v = QK_FMUL(decode_fp8(data[r * cols + c], e5m2), s);
        } else {
            int d, z;
            if (data_type == QCONFORM_DATA_TYPE_UINT8) {
                d = field(data + r * (cols * bits / 8), bits, c);
                z = zero_points ? field(zero_points + r * ((n_blocks * bits + 7) / 8), bits, blk) : 1 << (bits - 1);
            } else { /* int4 / uint4: flat nibbles over the whole table */
                d = field(data, 4, r * cols + c);
                z = zero_points ? field(zero_points, 4, r * n_blocks + blk) : 0;
                if (data_type == QCONFORM_DATA_TYPE_INT4) {
                    d = sign_extend_nibble(d);
                    z = sign_extend_nibble(z);
                }
            }
            v = QK_FMUL((float)(d - z), s); /* d - z is an exact integer: one rounding */
        }
    }
    if (fp16) ((__half*)Y)[t] = qk_half_rn(v);
    else ((float*)Y)[t] = qk_ftz(v); /* the fp32 output flushed as CuPy-compiled kernels flush it */
}

extern "C" int gather_block_quantized_launcher(QCONFORM_GATHER_BLOCK_QUANTIZED_PARAMS, void* stream) {
    /* sizes first: the suite calls this once with rows = -1 and requires a non-zero status */
    if (rows < 0 || cols < 0 || n_indices < 0 || bits < 0 || block_size < 0) return (int)INVALID_VALUE;
    switch (data_type) {
    case QCONFORM_DATA_TYPE_UINT8:
        if (bits != 2 && bits != 4 && bits != 8) return (int)INVALID_VALUE;
        if ((cols * bits) % 8 != 0) return (int)INVALID_VALUE;
        break;
    case QCONFORM_DATA_TYPE_INT4:
    case QCONFORM_DATA_TYPE_UINT4:
        if (bits != 4) return (int)INVALID_VALUE;
        break;
    case QCONFORM_DATA_TYPE_FLOAT8E4M3FN:
    case QCONFORM_DATA_TYPE_FLOAT8E5M2:
        if (zero_points != 0) return (int)INVALID_VALUE;
        break;
    default:
        return QCONFORM_STATUS_DECLINED; /* a data type this library does not know */
    }
    if (y_dtype != QCONFORM_DTYPE_FLOAT16 && y_dtype != QCONFORM_DTYPE_FLOAT32) return QCONFORM_STATUS_DECLINED;
    if (n_indices == 0 || cols == 0) return 0; /* nothing to write */
    if (block_size == 0) return (int)INVALID_VALUE;
    if (n_indices > 0x7FFFFFFFFFFFFFFFLL / cols) return (int)INVALID_VALUE;
    if (Y == 0 || indices == 0 || (rows > 0 && (data == 0 || scales == 0))) return (int)INVALID_VALUE;

    const long long work = n_indices * cols, grid = work / THREADS + (work % THREADS != 0);
    if (grid > 0x7FFFFFFFLL) return (int)INVALID_VALUE;
    void* args[] = {(void*)&data, (void*)&indices,   (void*)&scales, (void*)&zero_points,
                    (void*)&Y,    (void*)&rows,      (void*)&cols,   (void*)&n_indices,
                    (void*)&bits, (void*)&block_size, (void*)&data_type, (void*)&y_dtype};
    return (int)LAUNCH_KERNEL((const void*)gather_block_quantized_kernel, dim3((unsigned)grid), dim3(THREADS), args, 0,
                              (stream_t)stream);
}

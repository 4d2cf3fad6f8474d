/* A worked `so:` launcher: qconform's cooperative Q8_K quantize kernel behind the C ABI
 *   int qk_q8_k_quantize(const void* in, void* out, long long n_blocks, void* stream)
 * returning the status of its own launch (0 = success).
 *
 * Build (README "Kernel ABIs"; qconform.device.solib.build_launcher runs the same):
 *   NVIDIA: nvcc --cudart shared -shared -Xcompiler -fPIC -arch=sm_90 \
 *             -I src/qconform/device/kernels -o libqk_q8_k.so examples/so_launcher/q8_k_launcher.cu
 *   AMD:    HIP_PLATFORM=amd hipcc -shared -fPIC --offload-arch=gfx90a -x hip \
 *             -I src/qconform/device/kernels -o libqk_q8_k.so examples/so_launcher/q8_k_launcher.cu
 * `--cudart shared` makes the library use the process's one libcudart.so, so the suite can plant a
 * foreign pending error where this library would see it (docs/device-tooling.md C2-C4).
 *
 * The error-state rule it follows: launch with cudaLaunchKernel / hipLaunchKernel and return THAT
 * status. Never call cudaGetLastError()/hipGetLastError(): it would return (and swallow) an error
 * the caller left pending, reporting it as this launch's. */
#include "ggml/q8_quant.hip"

#if defined(QK_HIP)
typedef hipStream_t qk_stream_t;
#define QK_LAUNCH_KERNEL hipLaunchKernel
#define QK_INVALID_VALUE hipErrorInvalidValue
#else
typedef cudaStream_t qk_stream_t;
#define QK_LAUNCH_KERNEL cudaLaunchKernel
#define QK_INVALID_VALUE cudaErrorInvalidValue
#endif

#define Q8_K_LANES 8
#define Q8_K_THREADS 256

extern "C" int qk_q8_k_quantize(const void* in, void* out, long long n_blocks, void* stream) {
    if (n_blocks < 0 || (n_blocks > 0 && (in == 0 || out == 0))) return (int)QK_INVALID_VALUE;
    if (n_blocks == 0) return 0;
    const long long grid = (n_blocks * Q8_K_LANES + Q8_K_THREADS - 1) / Q8_K_THREADS;
    if (grid > 0x7FFFFFFFLL) return (int)QK_INVALID_VALUE;
    void* args[] = {(void*)&in, (void*)&out, (void*)&n_blocks};
    return (int)QK_LAUNCH_KERNEL((const void*)qk_q8_k_quant_coop, dim3((unsigned)grid), dim3(Q8_K_THREADS), args, 0,
                                 (qk_stream_t)stream);
}

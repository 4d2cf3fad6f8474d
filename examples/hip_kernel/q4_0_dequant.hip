/* A worked `hip:` kernel for q4_0_dequant (ggml's dequantize_row_q4_0), written only against the
 * two headers qconform puts on every kernel's include path:
 *   qconform_abi.h   the argument list QCONFORM_Q4_0_DEQUANT_PARAMS
 *                    (`qconform abi q4_0_dequant` prints the same declaration and its rules);
 *   qk_portable.h    one source for HIP (hiprtc) and CUDA (NVRTC): fp16, never-fused fp32 operations.
 *
 * What it computes: data holds n_blocks Q4_0 blocks of 18 bytes back to back (ggml-common.h
 * block_q4_0: fp16 d at byte 0, then qs[16]). Byte qs[j] holds value j in its low nibble and
 * value j + 16 in its high nibble, and each value is
 *   y = (float)(nibble - 8) * d        one fp32 multiply, rounded to nearest even
 * QK_FMUL is __fmul_rn. No value here can be an fp32 subnormal (an fp16 d is a normal fp32), so
 * CuPy's flush-to-zero changes nothing; a NaN or infinite d gives what IEEE says.
 *
 *   qconform run --ops q4_0_dequant \
 *     --impl hip:examples/hip_kernel/q4_0_dequant.hip:q4_0_dequant:lanes=1:threads=256
 *
 * Geometry: the op's default (qconform abi q4_0_dequant): work = n_blocks, one thread per block
 * (lanes=1), 256 threads per CTA, gridDim.x = ceil(n_blocks / 256); the lanes and threads on the
 * command line above are those defaults, written out. Threads past the last block return.
 * The suite checks the output bit for bit (a NaN matches any NaN). */
#include "qconform_abi.h"
#include "qk_portable.h"

#define VALUES 32      /* values per Q4_0 block */
#define BLOCK_BYTES 18 /* fp16 d + 16 bytes of nibbles */

extern "C" __global__ void q4_0_dequant(QCONFORM_Q4_0_DEQUANT_PARAMS) {
    const long long blk = qk_global_thread();
    if (blk >= n_blocks) return;
    const unsigned char* b = data + blk * BLOCK_BYTES;
    const float d = qk_fp16_to_float((qk_u16)(b[0] | (b[1] << 8)));
    float* out = y + blk * VALUES;
    for (int j = 0; j < VALUES / 2; ++j) {
        const int lo = b[2 + j] & 0x0F, hi = b[2 + j] >> 4;
        out[j] = QK_FMUL((float)(lo - 8), d);
        out[j + VALUES / 2] = QK_FMUL((float)(hi - 8), d);
    }
}

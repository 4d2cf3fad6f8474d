/* WRONG TWIN of qmoe_launcher.cu, for showing what the suite reports: identical except for ONE
 * broken rule, marked BUG below: after its own launches succeed it returns cudaGetLastError() /
 * hipGetLastError(), which hands back (and clears) an error the caller left pending as if this
 * launch had failed. Its outputs are right, so matches_oracle passes; survives_pending_error fails
 * it: with a foreign error planted before the call, the call "fails" with that error's code. */
/* A worked `so:` launcher for com.microsoft.QMoE (qmoe_decode and qmoe_ragged_mm: one ABI, one
 * symbol): qconform's own QMoE kernels (kernels/ort/qmoe.hip, included below) launched in the
 * sequence of qconform's CuPy launcher (qconform.device.ort.qmoe._qmoe), behind the C ABI that
 * `qconform abi qmoe_decode` prints (qconform_abi.h: QCONFORM_QMOE_DECODE_PARAMS):
 *
 *   extern "C" int qmoe_launcher(QCONFORM_QMOE_DECODE_PARAMS, void* stream);
 *
 * Build and run (README "Kernel ABIs"; qconform.device.solib.build_launcher runs the same):
 *   NVIDIA: nvcc --cudart shared -shared -Xcompiler -fPIC -arch=sm_90 -I src/qconform/device/kernels \
 *             -I src/qconform/device/kernels/common -o libqmoe.so examples/so_launcher/qmoe_launcher.cu
 *   AMD:    HIP_PLATFORM=amd hipcc -shared -fPIC --offload-arch=gfx90a -x hip -I src/qconform/device/kernels \
 *             -I src/qconform/device/kernels/common -o libqmoe.so examples/so_launcher/qmoe_launcher.cu
 *   qconform run --ops qmoe_decode,qmoe_ragged_mm --impl so:./libqmoe.so:qmoe_launcher
 *
 * The sequence, all on the given stream: qk_moe_route (top-k and the mixing weights, into scratch),
 * [qk_moe_quantize of fc1's input], qk_moe_fc1 (+ the activation, into an fp32 scratch),
 * [qk_moe_quantize of fc2's input], qk_moe_fc2 (+ the weighted sum of the k experts, into output).
 * The bracketed int8 steps run where ORT's CPU quantizes that fc's input (block-wise weights of
 * 8 bits, or of 4 bits at accuracy_level 4: qconform.oracles.ort.qmoe.uses_int8_activations).
 * The scratch is stream-ordered (cudaMallocAsync / cudaFreeAsync on the same stream).
 *
 * Declined (QCONFORM_STATUS_DECLINED), as qconform's launcher declines them: dtypes other than
 * float16 / float32, block sizes not a multiple of 32, rows whose K * bits is not whole 32-bit
 * words, an input not 16-byte aligned or weights not 4-byte aligned, sizes past the kernels' int
 * arguments or a grid past 2^31 - 1 blocks.
 *
 * The error-state rule it follows: every runtime call's own return value is the status
 * (cudaLaunchKernel / hipLaunchKernel, the scratch's allocation and release); the first non-zero
 * one is returned. Never cudaGetLastError()/hipGetLastError(): it would return (and clear) an
 * error the caller left pending, reporting it as this launch's (docs/device-tooling.md C2-C4). */
#include "ort/qmoe.hip"

#if defined(QK_HIP)
#define RT(name) hip##name /* the runtime API: hipLaunchKernel, hipMallocAsync, ... */
#else
#define RT(name) cuda##name /* cudaLaunchKernel, cudaMallocAsync, ... */
#endif
typedef RT(Stream_t) stream_t;
#define INVALID_VALUE RT(ErrorInvalidValue)

#define THREADS 256            /* qconform.device.ort.qmoe.THREADS */
#define INT_LIMIT 0x7FFFFFFFLL /* the kernels take int sizes; a grid at most 2^31 - 1 blocks */

/* the largest power of two <= n (n >= 1), at most 32 */
static int pow2_lanes(long long n) {
    int lanes = 1;
    while (lanes < 32 && 2LL * lanes <= n) lanes *= 2;
    return lanes;
}

/* qconform.device.ort.qmoe.tiling: (lanes per output, 32-bit words per lane and step) of rows of
 * K bits-bit values, a function of the shape alone */
static void tiling(long long K, long long bits, int* lanes, int* unroll) {
    const long long words = K * bits / 32;
    *unroll = (words % 4 == 0 && words / 4 >= 8) ? 4 : (words % 2 == 0 && words / 2 >= 8) ? 2 : 1;
    const long long steps = words / *unroll;
    *lanes = pow2_lanes(steps < 1 ? 1 : steps);
}

/* one fc's launch shape: int8 activations (ORT CPU's CompInt8 path) or the fp32 product */
struct fc_plan {
    int int8, lanes, unroll, zp_bytes;
};

static fc_plan plan_fc(long long N, long long K, long long bits, long long bs, long long level) {
    fc_plan p;
    p.int8 = bs != 0 && (bits == 8 || (bits == 4 && level == 4));
    if (p.int8) {
        p.lanes = pow2_lanes(K / bs); /* qconform.device.ort.qmoe.tiling_int8 */
        p.unroll = 1;
    } else {
        tiling(K, bits, &p.lanes, &p.unroll);
    }
    /* zero points: per row, packed along N; block-wise, per row packed along its K / bs blocks */
    p.zp_bytes = (int)(((bs ? K / bs : N) * bits + 7) / 8);
    return p;
}

static long long grid_of(long long groups, int lanes) { return (groups * lanes + THREADS - 1) / THREADS; }

static int launch(const void* kernel, long long grid, void** args, stream_t stream) {
    if (grid == 0) return 0; /* nothing to compute (a launch of 0 blocks is an invalid configuration) */
    return (int)RT(LaunchKernel)(kernel, dim3((unsigned)grid), dim3(THREADS), args, 0, stream);
}

/* scratch offsets, each rounded up to 256 bytes */
static long long carve(long long* total, long long bytes) {
    const long long at = *total;
    *total += (bytes + 255) / 256 * 256;
    return at;
}

extern "C" int qmoe_launcher(QCONFORM_QMOE_DECODE_PARAMS, void* stream) {
    /* sizes first: the suite calls this once with tokens = -1 and requires a non-zero status */
    if (tokens < 0 || hidden_size < 0 || inter_size < 0 || num_experts < 0 || k < 0 || block_size < 0)
        return (int)INVALID_VALUE;
    if (expert_weight_bits != 2 && expert_weight_bits != 4 && expert_weight_bits != 8) return (int)INVALID_VALUE;
    if (activation_type < QCONFORM_MOE_ACTIVATION_RELU || activation_type > QCONFORM_MOE_ACTIVATION_SWIGLU)
        return (int)INVALID_VALUE;
    if (k < 1 || k > num_experts || accuracy_level < 0 || accuracy_level > 4) return (int)INVALID_VALUE;
    if (block_size != 0 && (hidden_size % block_size != 0 || inter_size % block_size != 0)) return (int)INVALID_VALUE;
    if (dtype != QCONFORM_DTYPE_FLOAT16 && dtype != QCONFORM_DTYPE_FLOAT32) return QCONFORM_STATUS_DECLINED;
    if (tokens == 0 || hidden_size == 0) return 0; /* nothing to write */
    if (input == 0 || router_probs == 0 || fc1_experts_weights == 0 || fc1_scales == 0 || fc2_experts_weights == 0 ||
        fc2_scales == 0 || output == 0)
        return (int)INVALID_VALUE;

    const long long T = tokens, H = hidden_size, I = inter_size, E = num_experts, bits = expert_weight_bits;
    const long long bs = block_size, f = activation_type == QCONFORM_MOE_ACTIVATION_SWIGLU ? 2 : 1;
    /* what the kernels do not cover (qconform.device.ort.qmoe._check_domain) */
    if (bs % 32 != 0 || (H * bits) % 32 != 0 || (I * bits) % 32 != 0) return QCONFORM_STATUS_DECLINED;
    if ((unsigned long long)input % 16 != 0 || (unsigned long long)fc1_experts_weights % 4 != 0 ||
        (unsigned long long)fc2_experts_weights % 4 != 0)
        return QCONFORM_STATUS_DECLINED;
    if (T > INT_LIMIT || H > INT_LIMIT || f * I > INT_LIMIT || E > INT_LIMIT || T * k > INT_LIMIT)
        return QCONFORM_STATUS_DECLINED;

    fc_plan p1 = plan_fc(f * I, H, bits, bs, accuracy_level), p2 = plan_fc(H, I, bits, bs, accuracy_level);
    const long long g_route = grid_of(T, 1), g_fc1 = grid_of(T * k * I, p1.lanes), g_fc2 = grid_of(T * H, p2.lanes);
    const long long g_q1 = bs ? grid_of(T * (H / bs), 1) : 0, g_q2 = bs ? grid_of(T * k * (I / bs), 1) : 0;
    if (g_route > INT_LIMIT || g_fc1 > INT_LIMIT || g_fc2 > INT_LIMIT || g_q1 > INT_LIMIT || g_q2 > INT_LIMIT)
        return QCONFORM_STATUS_DECLINED;

    /* scratch: sel, wts (T, k); fc1's output A (T * k, I) fp32; the int8 codes and scales */
    long long bytes = 0;
    const long long o_sel = carve(&bytes, T * k * 4), o_wts = carve(&bytes, T * k * 4);
    const long long o_a = carve(&bytes, T * k * I * 4);
    const long long o_qx1 = p1.int8 ? carve(&bytes, T * H) : 0, o_sx1 = p1.int8 ? carve(&bytes, T * (H / bs) * 4) : 0;
    const long long o_qx2 = p2.int8 ? carve(&bytes, T * k * I) : 0;
    const long long o_sx2 = p2.int8 ? carve(&bytes, T * k * (I / bs) * 4) : 0;
    const stream_t s = (stream_t)stream;
    void* scratch = 0;
    int status = (int)RT(MallocAsync)(&scratch, (size_t)bytes, s);
    if (status != 0) return status;
    char* base = (char*)scratch;

    /* the kernels' arguments: a variable of each parameter's type (pointers differ only in const) */
    int* sel = (int*)(base + o_sel);
    float* wts = (float*)(base + o_wts);
    float* a = (float*)(base + o_a);
    float* no_wts = 0;
    qk_i8* qx1 = p1.int8 ? (qk_i8*)(base + o_qx1) : 0;
    float* sx1 = p1.int8 ? (float*)(base + o_sx1) : 0;
    qk_i8* qx2 = p2.int8 ? (qk_i8*)(base + o_qx2) : 0;
    float* sx2 = p2.int8 ? (float*)(base + o_sx2) : 0;
    int Ti = (int)T, Hi = (int)H, Ii = (int)I, Ei = (int)E, ki = (int)k, bitsi = (int)bits, bsi = (int)bs;
    int N1 = (int)(f * I), normalize = (int)normalize_routing_weights, has_rw = router_weights != 0;
    int x16 = dtype == QCONFORM_DTYPE_FLOAT16, not16 = 0, act = (int)activation_type;
    int has_zp1 = fc1_zero_points != 0, has_zp2 = fc2_zero_points != 0;
    int has_b1 = fc1_experts_bias != 0, has_b2 = fc2_experts_bias != 0;
    long long rows1 = T, rows2 = T * k;

    void* route[] = {(void*)&router_probs, (void*)&router_weights, (void*)&sel,    (void*)&wts,    (void*)&Ti,
                     (void*)&Ei,           (void*)&ki,             (void*)&normalize, (void*)&has_rw, (void*)&x16};
    status = launch((const void*)qk_moe_route, g_route, route, s);
    if (status == 0 && p1.int8) {
        void* q[] = {(void*)&input, (void*)&qx1, (void*)&sx1, (void*)&no_wts,
                     (void*)&rows1, (void*)&Hi,  (void*)&bsi, (void*)&x16};
        status = launch((const void*)qk_moe_quantize, g_q1, q, s);
    }
    if (status == 0) {
        void* fc1[] = {(void*)&input,          (void*)&sel,        (void*)&wts,         (void*)&fc1_experts_weights,
                       (void*)&fc1_scales,     (void*)&fc1_zero_points, (void*)&fc1_experts_bias, (void*)&a,
                       (void*)&Ti,             (void*)&Hi,         (void*)&N1,          (void*)&Ii,
                       (void*)&ki,             (void*)&bitsi,      (void*)&bsi,         (void*)&p1.zp_bytes,
                       (void*)&has_zp1,        (void*)&has_b1,     (void*)&x16,         (void*)&act,
                       (void*)&activation_alpha, (void*)&activation_beta, (void*)&swiglu_limit, (void*)&p1.lanes,
                       (void*)&p1.unroll,      (void*)&qx1,        (void*)&sx1};
        status = launch((const void*)qk_moe_fc1, g_fc1, fc1, s);
    }
    if (status == 0 && p2.int8) {
        void* q[] = {(void*)&a,     (void*)&qx2, (void*)&sx2, (void*)&wts,
                     (void*)&rows2, (void*)&Ii,  (void*)&bsi, (void*)&not16};
        status = launch((const void*)qk_moe_quantize, g_q2, q, s);
    }
    if (status == 0) {
        void* fc2[] = {(void*)&a,          (void*)&sel,        (void*)&wts,     (void*)&fc2_experts_weights,
                       (void*)&fc2_scales, (void*)&fc2_zero_points, (void*)&fc2_experts_bias, (void*)&output,
                       (void*)&Ti,         (void*)&Ii,         (void*)&Hi,      (void*)&ki,
                       (void*)&bitsi,      (void*)&bsi,        (void*)&p2.zp_bytes, (void*)&has_zp2,
                       (void*)&has_b2,     (void*)&x16,        (void*)&p2.lanes, (void*)&p2.unroll,
                       (void*)&qx2,        (void*)&sx2};
        status = launch((const void*)qk_moe_fc2, g_fc2, fc2, s);
    }
    const int freed = (int)RT(FreeAsync)(scratch, s); /* after the kernels, in stream order */
    return status != 0 ? status : freed != 0 ? freed : (int)RT(GetLastError)(); /* BUG: a foreign error */
}

/* qmoe_ragged_mm declares the same argument list, so the one symbol serves both ops (a list that
 * differed would make this redeclaration a compile error) */
extern "C" int qmoe_launcher(QCONFORM_QMOE_RAGGED_MM_PARAMS, void* stream);

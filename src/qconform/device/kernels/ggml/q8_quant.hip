/* ggml activation quantization kernels: Q8_K and Q8_0, quantize and dequantize.
 *
 * Semantics: ggml-org/ggml src/ggml-quants.c quantize_row_q8_K_ref, quantize_row_q8_0_ref,
 * dequantize_row_q8_K, dequantize_row_q8_0 as built for x86-64 (qconform.oracles.ggml documents
 * each rule); block layouts ggml-common.h block_q8_K {float d; int8 qs[256]; int16 bsums[16]}
 * (292 bytes) and block_q8_0 {fp16 d; int8 qs[32]} (34 bytes). Byte-identical to the oracle with
 * ftz=True: every operand and result is flushed explicitly (qk_ftz).
 *
 * Launch ABI (the same for a user's hip: kernel, README "Kernel ABIs"):
 *   extern "C" __global__ void k(const void* in, void* out, long long n_blocks)
 *   blockDim.x = THREADS, gridDim.x = ceil(n_blocks * LANES / THREADS)
 * with (LANES, THREADS) per kernel in qconform/device/kernels.py. */
#include "qk_portable.h"

#define QK8_0 32
#define Q8_0_BYTES 34
#define QK_K 256
#define Q8_K_BYTES 292
#define Q8_K_QS 4
#define Q8_K_BSUMS 260

/* ggml nearest_int(f) (ggml-quants.c:621) on x86-64: f + 1.5*2^23 in fp32, low 22 mantissa
 * bits; round half to even. x86 keeps an input NaN's payload through the multiply and add
 * (quieting sets bit 22), a NaN made by the arithmetic (0 * inf) is the default NaN and gives 0. */
__device__ __forceinline__ int qk_nearest_int_x86(float f, float src) {
    if (qk_isnan(f)) return qk_isnan(src) ? (int)(qk_bits(src) & 0x3FFFFFu) : 0;
    float v = QK_FADD(f, 12582912.0f);
    return (int)(qk_bits(v) & 0x7FFFFFu) - 0x400000;
}

/* one Q8_K value: MIN(127, nearest_int(iscale * x)) as int8 (two's-complement wrap) */
__device__ __forceinline__ int qk_q8_k_value(float iscale, float x) {
    float p = qk_ftz(QK_FMUL(iscale, qk_ftz(x)));
    int q = qk_nearest_int_x86(p, x);
    return (int)(qk_i8)(q < 127 ? q : 127);
}

/* (int8_t)roundf(v) on x86-64: ties away from zero; cvttss2si gives INT_MIN (low byte 0) for
 * NaN, inf and |v| >= 2^31. Truncating v + copysign(0.49999997f, v), rounded once in fp32, is
 * roundf for every float below 2^31 (checked over all 2^32 patterns: tests/test_oracle_semantics). */
__device__ __forceinline__ qk_u32 qk_roundf_byte(float v) {
    if (!(fabsf(v) < 2147483648.0f)) return 0u;
    return (qk_u32)__float2int_rz(QK_FADD(v, copysignf(0x1.fffffep-2f, v))) & 0xFFu;
}

/* Copy a CTA's output, staged in shared memory, to global memory with wide coalesced stores.
 * Direct per-thread stores of 292- or 34-byte blocks leave 32-byte sectors partly written by
 * different warps at different times, which costs the memory system a read-modify-write per
 * sector: staging took Q8_0 quantize from 44% to 82% of copy bandwidth on the H200. */
__device__ __forceinline__ void qk_stage_out(const qk_u8* ys, qk_u8* dst, int nbytes) {
    __syncthreads();
    const unsigned long long a = (unsigned long long)dst;
    if ((a & 15u) == 0u && (nbytes & 15) == 0) {
        for (int w = threadIdx.x; w < nbytes / 16; w += blockDim.x) ((uint4*)dst)[w] = ((const uint4*)ys)[w];
    } else if ((a & 3u) == 0u && (nbytes & 3) == 0) {
        for (int w = threadIdx.x; w < nbytes / 4; w += blockDim.x) ((qk_u32*)dst)[w] = ((const qk_u32*)ys)[w];
    } else {
        for (int w = threadIdx.x; w < nbytes; w += blockDim.x) dst[w] = ys[w];
    }
}

/* blocks of this CTA still inside the array */
__device__ __forceinline__ int qk_cta_blocks(qk_i64 first, qk_i64 n_blocks, int per_cta) {
    const qk_i64 left = n_blocks - first;
    return left <= 0 ? 0 : (int)(left < per_cta ? left : per_cta);
}

/* ---------------------------------------------------------------- Q8_K quantize, reference */
/* One thread per 256-value super-block, in the reference order: a first pass scans its values
 * 0..255 for the first strict max, a second quantizes them. A 32-thread CTA serves 32
 * super-blocks and streams them through shared memory 32 values ("a chunk") at a time: the CTA
 * loads chunk c of its 32 super-blocks coalesced (128 contiguous bytes per super-block), then
 * each thread works through its own row of the chunk (row stride 33 floats: conflict-free both
 * ways). The second pass reloads the chunks, which the first pass has just brought into L2, and
 * builds the 32 result blocks in shared memory for one coalesced store. LANES = 1, THREADS = 32. */
#define REF_SB 32
#define REF_CHUNK 32
#define REF_STRIDE (REF_CHUNK + 1)

/* chunk c of the CTA's super-blocks: float4 number f = threadIdx.x + 32r is value 4q.. of
 * super-block s = f / 8 (q = f % 8), so 8 threads read 128 contiguous bytes */
struct qk_ref_chunk {
    float4 v[REF_CHUNK / 4]; /* 32 super-blocks x 8 float4 over 32 threads */
};

__device__ __forceinline__ qk_ref_chunk qk_ref_load(const float4* src, int nsb, int c) {
    qk_ref_chunk k;
#pragma unroll
    for (int r = 0; r < REF_CHUNK / 4; ++r) {
        const int f = threadIdx.x + REF_SB * r, s = f / (REF_CHUNK / 4), q = f % (REF_CHUNK / 4);
        k.v[r] = s < nsb ? src[(qk_i64)s * (QK_K / 4) + c * (REF_CHUNK / 4) + q] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    return k;
}

__device__ __forceinline__ void qk_ref_store(float* xs, const qk_ref_chunk& k) {
#pragma unroll
    for (int r = 0; r < REF_CHUNK / 4; ++r) {
        const int f = threadIdx.x + REF_SB * r, s = f / (REF_CHUNK / 4), q = f % (REF_CHUNK / 4);
        float* row = xs + s * REF_STRIDE + 4 * q;
        row[0] = k.v[r].x; row[1] = k.v[r].y; row[2] = k.v[r].z; row[3] = k.v[r].w;
    }
}

extern "C" __global__ void __launch_bounds__(REF_SB)
qk_q8_k_quant_ref(const void* in, void* out, qk_i64 n_blocks) {
    __shared__ float xs[REF_SB * REF_STRIDE];
    __shared__ uint4 ys4[REF_SB * Q8_K_BYTES / 16];
    qk_u8* ys = (qk_u8*)ys4;
    const qk_i64 first = (qk_i64)blockIdx.x * REF_SB;
    if (first >= n_blocks) return;
    const int t = threadIdx.x;
    const int nsb = qk_cta_blocks(first, n_blocks, REF_SB);
    const float4* src = (const float4*)in + first * (QK_K / 4);
    const float* x = xs + t * REF_STRIDE;
    /* chunk i = 0..15: pass 1 scans chunks 0..7, pass 2 quantizes them again; the next chunk's
     * loads are in flight while this one is worked on (H200: 38% of copy bandwidth against 20%
     * without; two chunks ahead gave no more: the thread's serial work bounds it then) */
    const int n_chunks = 2 * (QK_K / REF_CHUNK);
    qk_ref_chunk next = qk_ref_load(src, nsb, 0);
    float amax = 0.0f, mx = 0.0f, iscale = 0.0f;
    bool zero = false;
    qk_u8* y = ys + t * Q8_K_BYTES;
    for (int i = 0; i < n_chunks; ++i) {
        const int c = i % (QK_K / REF_CHUNK);
        __syncthreads();
        qk_ref_store(xs, next);
        __syncthreads();
        if (i + 1 < n_chunks) next = qk_ref_load(src, nsb, (i + 1) % (QK_K / REF_CHUNK));
        if (i < QK_K / REF_CHUNK) {
            for (int j = 0; j < REF_CHUNK; ++j) {  /* first strict max; a NaN never wins */
                float v = qk_ftz(x[j]);
                float a = fabsf(v);
                if (a > amax) { amax = a; mx = v; }
            }
            if (i + 1 == QK_K / REF_CHUNK) {
                zero = amax == 0.0f;
                iscale = zero ? 0.0f : qk_ftz(QK_FDIV(-127.0f, mx));
            }
            continue;
        }
        int sums[2] = {0, 0};
        for (int w = 0; w < REF_CHUNK / 4; ++w) {
            qk_u32 word = 0u;
            for (int b = 0; b < 4; ++b) {
                int q = zero ? 0 : qk_q8_k_value(iscale, x[4 * w + b]);
                sums[w / 4] += q;
                word |= ((qk_u32)q & 0xFFu) << (8 * b);
            }
            ((qk_u32*)(y + Q8_K_QS))[c * (REF_CHUNK / 4) + w] = word;
        }
        /* bsums[2c] and bsums[2c + 1], int16 each, at byte 260 + 4c */
        ((qk_u32*)(y + Q8_K_BSUMS))[c] = ((qk_u32)sums[0] & 0xFFFFu) | ((qk_u32)sums[1] << 16);
    }
    *(float*)y = zero ? 0.0f : qk_ftz(QK_FDIV(1.0f, iscale));
    qk_stage_out(ys, (qk_u8*)out + first * Q8_K_BYTES, nsb * Q8_K_BYTES);
}

/* -------------------------------------------------------------- Q8_K quantize, cooperative */
/* One super-block by LANES lanes of a shuffle group (width LANES, so the same on wave32 and wave64):
 * lane l holds float4 number LANES k + l of it in v[k] and writes those quants, its bsums (group
 * (LANES k + l) / 4 summed over a quad of lanes) and, lane 0, d to block slot of the blocks at ys.
 * Each lane takes the first strict max of |x| over its values in index order, then the lanes reduce
 * (|x|, index) with shuffles: larger |x| wins, on equal |x| the lower index -- exactly the
 * reference's first strict max. Every lane of the group takes part (the shuffles). Also the
 * quantize of the keep-quant call at M = 1 in one launch (keep_quant_fast.hip qk_kq_one_<t>). */
template <int LANES>
__device__ __forceinline__ void qk_q8_k_block_lanes(const float4 (&v)[64 / LANES], int l, qk_u8* ys, int slot) {
    constexpr int NV = 64 / LANES; /* float4 a lane */
    float amax = 0.0f, mx = 0.0f;
    int idx = QK_K;
    for (int k = 0; k < NV; ++k) {
        const float c[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
        for (int b = 0; b < 4; ++b) {
            float x = qk_ftz(c[b]);
            float a = fabsf(x);
            if (a > amax) { amax = a; mx = x; idx = 4 * (LANES * k + l) + b; }
        }
    }
    for (int m = 1; m < LANES; m <<= 1) {
        float oa = QK_SHFL_XOR(amax, m, LANES);
        float om = QK_SHFL_XOR(mx, m, LANES);
        int oi = QK_SHFL_XOR(idx, m, LANES);
        if (oa > amax || (oa == amax && oi < idx)) { amax = oa; mx = om; idx = oi; }
    }
    const bool zero = amax == 0.0f;
    const float iscale = zero ? 0.0f : qk_ftz(QK_FDIV(-127.0f, mx));
    qk_u8* y = ys + slot * Q8_K_BYTES;
    for (int k = 0; k < NV; ++k) {
        const float c[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
        qk_u32 word = 0u;
        int sum = 0;
        for (int b = 0; b < 4; ++b) {
            int q = zero ? 0 : qk_q8_k_value(iscale, c[b]);
            sum += q;
            word |= ((qk_u32)q & 0xFFu) << (8 * b);
        }
        sum += QK_SHFL_XOR(sum, 1, LANES);
        sum += QK_SHFL_XOR(sum, 2, LANES);
        ((qk_u32*)(y + Q8_K_QS))[LANES * k + l] = word;
        if ((l & 3) == 0) ((qk_i16*)(y + Q8_K_BSUMS))[(LANES / 4) * k + (l >> 2)] = (qk_i16)sum;
    }
    if (l == 0) *(float*)y = zero ? 0.0f : qk_ftz(QK_FDIV(1.0f, iscale));
}

/* LANES lanes per super-block (a shuffle group of width LANES, so the same for wave32 and wave64):
 * coop 8 lanes, w32 32 (a warp a super-block, for short rows such as a GEMV's activation: K = 8192
 * is 32 super-blocks, one coop CTA whose lanes each run a chain over 32 values; w32's run over 8).
 * Lane l reads float4 number LANES k + l (k = 0 .. 64 / LANES - 1, in index order): LANES lanes read
 * 16 LANES contiguous bytes at a time; the super-block's arithmetic is qk_q8_k_block_lanes
 * (the reference's first strict max, so both kernels write the same bytes). Results are
 * staged in shared memory for one coalesced store. THREADS <= 256 (a multiple of LANES).
 * Out-of-range groups still take part in every shuffle and barrier. */
template <int LANES>
__device__ __forceinline__ void qk_q8_k_quant_lanes_body(const void* in, void* out, qk_i64 n_blocks) {
    constexpr int NV = 64 / LANES; /* float4 a lane */
    __shared__ uint4 ys4[(256 / LANES) * Q8_K_BYTES / 16]; /* the CTA's results */
    qk_u8* ys = (qk_u8*)ys4;
    const qk_i64 gt = qk_global_thread();
    const qk_i64 sb = (qk_i64)((unsigned long long)gt / LANES);
    const int l = (int)((unsigned long long)gt % LANES);
    const bool active = sb < n_blocks;
    float4 v[NV];
    const float4* src = (const float4*)in + sb * (QK_K / 4);
    for (int k = 0; k < NV; ++k) {
        if (active) v[k] = src[LANES * k + l];
        else v[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    qk_q8_k_block_lanes<LANES>(v, l, ys, threadIdx.x / LANES);
    const int per_cta = blockDim.x / LANES;
    const qk_i64 first = (qk_i64)blockIdx.x * per_cta;
    qk_stage_out(ys, (qk_u8*)out + first * Q8_K_BYTES, qk_cta_blocks(first, n_blocks, per_cta) * Q8_K_BYTES);
}

__device__ __forceinline__ void qk_q8_k_quant_coop_body(const void* in, void* out, qk_i64 n_blocks) {
    qk_q8_k_quant_lanes_body<8>(in, out, n_blocks);
}

extern "C" __global__ void __launch_bounds__(256)
qk_q8_k_quant_coop(const void* in, void* out, qk_i64 n_blocks) {
    qk_q8_k_quant_coop_body(in, out, n_blocks);
}

extern "C" __global__ void __launch_bounds__(256)
qk_q8_k_quant_w32(const void* in, void* out, qk_i64 n_blocks) {
    QK_LAUNCH_DEPENDENTS(); /* the keep-quant GEMV after it may start: it waits for these bytes */
    qk_q8_k_quant_lanes_body<32>(in, out, n_blocks);
}

/* -------------------------------------------------------------------------- Q8_0 quantize */
/* 2 lanes per 32-value block, 16 consecutive values (four float4) each. ggml's amax is a
 * sequential MAX(a, b) = a > b ? a : b, so a NaN makes it NaN and the next value replaces it: the
 * result is NaN when the last value is NaN, else the max over the values after the last NaN. A
 * lane summarises its values as (has_nan, value); the pair combines them in index order (lane 0
 * first), which reproduces the sequential scan exactly. Results are staged in shared memory for
 * one coalesced store. LANES = 2, THREADS <= 256 (even). */
__device__ __forceinline__ float qk_seq_max(float m, float a) { return m > a ? m : a; }

/* Lane l (0 or 1) of Q8_0 block blk: the quants of values 16 l .. 16 l + 15 as 4 words (little
 * endian, the block's byte order) and the block's d as fp16 bits. */
__device__ __forceinline__ void qk_q8_0_lane(const void* in, qk_i64 blk, int l, bool active, qk_u32 (&w)[4],
                                             qk_u16& h) {
    float c[16];
    const float4* src = (const float4*)in + blk * 8 + 4 * l;
    for (int k = 0; k < 4; ++k) {
        float4 v = active ? src[k] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        c[4 * k] = qk_ftz(v.x); c[4 * k + 1] = qk_ftz(v.y); c[4 * k + 2] = qk_ftz(v.z); c[4 * k + 3] = qk_ftz(v.w);
    }
    /* this lane's values as a function of the incoming amax m: has_nan ? val : seq_max(m, val) */
    bool has_nan = false;
    float val = 0.0f;
    for (int b = 0; b < 16; ++b) {
        float a = fabsf(c[b]);
        if (qk_isnan(a)) { has_nan = true; val = a; }
        else val = qk_isnan(val) ? a : qk_seq_max(val, a);
    }
    const bool o_nan = QK_SHFL_XOR((int)has_nan, 1, 2) != 0;
    const float o_val = QK_SHFL_XOR(val, 1, 2);
    const bool f_nan = l == 0 ? has_nan : o_nan, s_nan = l == 0 ? o_nan : has_nan;
    const float f_val = l == 0 ? val : o_val, s_val = l == 0 ? o_val : val;
    float amax;
    if (s_nan) amax = s_val;
    else if (f_nan) amax = qk_isnan(f_val) ? s_val : qk_seq_max(f_val, s_val);
    else amax = qk_seq_max(0.0f, qk_seq_max(f_val, s_val));
    const float d = qk_ftz(QK_FDIV(amax, 127.0f));
    const float id = d != 0.0f ? qk_ftz(QK_FDIV(1.0f, d)) : 0.0f;
    for (int j = 0; j < 4; ++j) {
        w[j] = 0u;
        for (int b = 0; b < 4; ++b) w[j] |= qk_roundf_byte(qk_ftz(QK_FMUL(c[4 * j + b], id))) << (8 * b);
    }
    h = qk_fp16_bits(d);
}

extern "C" __global__ void __launch_bounds__(256)
qk_q8_0_quant(const void* in, void* out, qk_i64 n_blocks) {
    __shared__ uint4 ys4[128 * Q8_0_BYTES / 16];  /* the CTA's results: 256 threads / 2 lanes */
    qk_u8* ys = (qk_u8*)ys4;
    const qk_i64 gt = qk_global_thread();
    const qk_i64 blk = gt >> 1;
    const int l = (int)(gt & 1);
    qk_u32 w[4];
    qk_u16 h;
    qk_q8_0_lane(in, blk, l, blk < n_blocks, w, h);
    qk_u16* y = (qk_u16*)(ys + (threadIdx.x >> 1) * Q8_0_BYTES); /* blocks are 2-byte aligned */
    for (int j = 0; j < 4; ++j) {
        y[1 + 8 * l + 2 * j] = (qk_u16)(w[j] & 0xFFFFu);
        y[2 + 8 * l + 2 * j] = (qk_u16)(w[j] >> 16);
    }
    if (l == 0) y[0] = h;
    const qk_i64 first = (qk_i64)blockIdx.x * (blockDim.x >> 1);
    qk_stage_out(ys, (qk_u8*)out + first * Q8_0_BYTES, qk_cta_blocks(first, n_blocks, blockDim.x >> 1) * Q8_0_BYTES);
}

/* The keep-quant GEMVs' Q8_0 activation in one launch: qk_q8_0_quant's blocks written straight in
 * the regrouped layout the GEMVs read (keep_quant.hip KQ_A0, keep_quant_fast.hip KF_A0: 12 words a
 * block, the 8 words of quants, word 8 d as fp32 (the fp16 d widened), words 9..11 zero), which a
 * quantize and a regrouping launch wrote until session 11. Lane l stores words 4 l .. 4 l + 3,
 * lane 0 also words 8 .. 11 (16-byte stores: aq 16-byte aligned, 48 bytes a block). LANES = 2,
 * THREADS <= 256 (even). */
#define Q8_0_WORDS 12
/* lane l of block blk into its words (nothing past n_blocks); also the keep-quant one launch's
 * (keep_quant_fast.hip, qk_kq_one_bulk_q8_0) */
__device__ __forceinline__ void qk_q8_0_words_lane(const void* in, qk_u32* aq, qk_i64 blk, int l, qk_i64 n_blocks) {
    const bool active = blk < n_blocks;
    qk_u32 w[4];
    qk_u16 h;
    qk_q8_0_lane(in, blk, l, active, w, h);
    if (!active) return;
    uint4* o = (uint4*)(aq + blk * Q8_0_WORDS);
    o[l] = make_uint4(w[0], w[1], w[2], w[3]);
    if (l == 0) o[2] = make_uint4(qk_bits(qk_fp16_to_float(h)), 0u, 0u, 0u);
}

extern "C" __global__ void __launch_bounds__(256)
qk_q8_0_quant_words(const void* in, qk_u32* aq, qk_i64 n_blocks) {
    QK_LAUNCH_DEPENDENTS(); /* the keep-quant GEMV after it may start: it waits for these words */
    const qk_i64 gt = qk_global_thread();
    qk_q8_0_words_lane(in, aq, gt >> 1, (int)(gt & 1), n_blocks);
}

/* -------------------------------------------------------------------------------- dequant */
/* y = d * (float)qs in fp32, one thread per 4 outputs (a float4 store).
 * Q8_K: LANES = 64, THREADS = 256; Q8_0: LANES = 8, THREADS = 256. */
__device__ __forceinline__ float4 qk_scale4(float d, qk_u32 q) {
    float4 r;
    r.x = qk_ftz(QK_FMUL(d, (float)(qk_i8)(q & 0xFFu)));
    r.y = qk_ftz(QK_FMUL(d, (float)(qk_i8)((q >> 8) & 0xFFu)));
    r.z = qk_ftz(QK_FMUL(d, (float)(qk_i8)((q >> 16) & 0xFFu)));
    r.w = qk_ftz(QK_FMUL(d, (float)(qk_i8)(q >> 24)));
    return r;
}

extern "C" __global__ void __launch_bounds__(256)
qk_q8_k_dequant(const void* in, void* out, qk_i64 n_blocks) {
    const qk_i64 gt = qk_global_thread();
    const qk_i64 blk = gt >> 6;
    if (blk >= n_blocks) return;
    const int l = (int)(gt & 63);
    const qk_u8* b = (const qk_u8*)in + blk * Q8_K_BYTES;
    const float d = qk_ftz(*(const float*)b);
    ((float4*)out)[gt] = qk_scale4(d, ((const qk_u32*)(b + Q8_K_QS))[l]);
}

extern "C" __global__ void __launch_bounds__(256)
qk_q8_0_dequant(const void* in, void* out, qk_i64 n_blocks) {
    const qk_i64 gt = qk_global_thread();
    const qk_i64 blk = gt >> 3;
    if (blk >= n_blocks) return;
    const int l = (int)(gt & 7);
    const qk_u16* b = (const qk_u16*)((const qk_u8*)in + blk * Q8_0_BYTES);
    const float d = qk_ftz(qk_fp16_to_float(b[0]));
    const qk_u32 q = (qk_u32)b[1 + 2 * l] | ((qk_u32)b[2 + 2 * l] << 16);
    ((float4*)out)[gt] = qk_scale4(d, q);
}

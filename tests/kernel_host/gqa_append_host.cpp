/* qk_gqa_append and qk_gqa_append8 (kernels/ort/gqa.hip) on the host (tests/test_gqa_append8_host.py):
 * the test writes gqa.hip's text from qk_gqa_rotate through qk_gqa_append8 to gqa_append_slice.inc;
 * this prelude stands in for the portability layer (fp16 as _Float16, conversions round to nearest
 * even; fp32 operations in IEEE single precision, g++ -ffp-contract=off), every thread of both
 * launches runs in turn, and the two kernels' outputs are compared byte for byte.
 * argv: B S N Nk H rotary_dim interleaved packed first_prompt bits per_channel is16 pos_ids; prints
 * "same" or the first difference (exit 1). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(x)
#define QK_FMUL(a, b) ((float)(a) * (float)(b))
#define QK_FADD(a, b) ((float)(a) + (float)(b))
#define QK_FDIV(a, b) ((float)(a) / (float)(b))
typedef signed char qk_i8; typedef unsigned char qk_u8; typedef unsigned short qk_u16; typedef long long qk_i64;
typedef _Float16 __half;
struct dim3s { unsigned x, y, z; };
static dim3s threadIdx, blockIdx, blockDim;
static inline float __half2float(__half h) { return (float)h; }
static inline __half qk_half_rn(float v) { return (__half)v; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline bool qk_isnan(float v) { return v != v; }
static inline qk_i64 qk_global_thread() { return (qk_i64)blockIdx.x * blockDim.x + threadIdx.x; }
static inline float qk_load_f(const void* p, qk_i64 i, int is_f16) {
    return is_f16 ? __half2float(((const __half*)p)[i]) : ((const float*)p)[i];
}
static inline void qk_store_f(void* p, qk_i64 i, float v, int is_f16) {
    if (is_f16) ((__half*)p)[i] = qk_half_rn(v);
    else ((float*)p)[i] = v;
}
#include "gqa_append_slice.inc"

static uint64_t rng_state = 88172645463325252ull;
static float rnd() { /* xorshift64, uniform in [-2, 2) */
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * (1.0 / 9007199254740992.0)) * 4.0f - 2.0f;
}

int main(int argc, char** argv) {
    if (argc != 14) return 2;
    const qk_i64 B = atoll(argv[1]), S = atoll(argv[2]), N = atoll(argv[3]), Nk = atoll(argv[4]), H = atoll(argv[5]);
    const int rd = atoi(argv[6]), inter = atoi(argv[7]), packed = atoi(argv[8]), first = atoi(argv[9]);
    const int bits = atoi(argv[10]), per_channel = atoi(argv[11]), is16 = atoi(argv[12]), use_pid = atoi(argv[13]);
    const qk_i64 past = first ? 0 : 5, Tp = past + S + 3, heads = N + 2 * Nk, el = is16 ? 2 : 4;
    std::vector<int> seqlens(B);
    for (qk_i64 b = 0; b < B; ++b) seqlens[b] = (int)(past + S - 1);
    const qk_i64 maxpos = Tp + 64;
    auto fill = [&](std::vector<unsigned char>& v, qk_i64 n) {
        v.assign(n * el, 0);
        for (qk_i64 i = 0; i < n; ++i) {
            const float x = rnd();
            if (is16) { const __half h = (__half)x; memcpy(&v[i * 2], &h, 2); } else memcpy(&v[i * 4], &x, 4);
        }
    };
    std::vector<unsigned char> q, k, v, cosc, sinc;
    fill(q, B * S * (packed ? heads : N) * H);
    fill(k, B * S * Nk * H);
    fill(v, B * S * Nk * H);
    fill(cosc, maxpos * (rd / 2 > 0 ? rd / 2 : 1));
    fill(sinc, maxpos * (rd / 2 > 0 ? rd / 2 : 1));
    std::vector<qk_i64> pid(B * S);
    for (qk_i64 i = 0; i < B * S; ++i) pid[i] = 3 + (i * 7) % 50;
    std::vector<float> ks(Nk * H), vs(Nk * H);
    for (auto& x : ks) x = 0.01f + fabsf(rnd()) * 0.05f;
    for (auto& x : vs) x = 0.01f + fabsf(rnd()) * 0.05f;
    const qk_i64 cache_bytes = B * Nk * Tp * (bits == 0 ? H * el : bits == 8 ? H : H / 2);
    std::vector<unsigned char> outs[2][3];
    for (int kern = 0; kern < 2; ++kern) {
        outs[kern][0].assign(B * S * N * H * 4, 0xAB);
        outs[kern][1].assign(cache_bytes, 0xCD);
        outs[kern][2].assign(cache_bytes, 0xCD);
        void* a[] = {q.data(), packed ? nullptr : k.data(), packed ? nullptr : v.data()};
        float* qrot = (float*)outs[kern][0].data();
#define ARGS a[0], a[1], a[2], seqlens.data(), cosc.data(), sinc.data(), use_pid ? pid.data() : nullptr, ks.data(), \
             vs.data(), qrot, outs[kern][1].data(), outs[kern][2].data(), B, S, N, Nk, H, Tp, (qk_i64)(use_pid ? S : 0), \
             first, packed, rd, inter, bits, per_channel, is16
        blockDim = {256, 1, 1};
        if (kern == 0) {
            const qk_i64 n = B * S * heads * (H / 2);
            for (qk_i64 t = 0; t < (n + 255) / 256 * 256; ++t) {
                blockIdx = {(unsigned)(t / 256), 0, 0};
                threadIdx = {(unsigned)(t % 256), 0, 0};
                qk_gqa_append(ARGS);
            }
        } else {
            const qk_i64 ny = (heads * (H / 8) + 255) / 256;
            for (qk_i64 x = 0; x < B * S; ++x)
                for (qk_i64 y = 0; y < ny; ++y)
                    for (unsigned t = 0; t < 256; ++t) {
                        blockIdx = {(unsigned)x, (unsigned)y, 0};
                        threadIdx = {t, 0, 0};
                        qk_gqa_append8(ARGS);
                    }
        }
    }
    const char* names[] = {"qrot", "present_key", "present_value"};
    for (int o = 0; o < 3; ++o)
        for (size_t i = 0; i < outs[0][o].size(); ++i)
            if (outs[0][o][i] != outs[1][o][i]) {
                printf("%s byte %zu: %02x vs %02x\n", names[o], i, outs[0][o][i], outs[1][o][i]);
                return 1;
            }
    printf("same\n");
    return 0;
}

/* qk_moe_rows_dot (kernels/ort/qmoe.hip, the QMoE decode inner loop) on the host: its text (the
 * slice tests/test_qmoe_rows_host.py cuts out) compiled with g++ against the stand-ins below, every
 * lane of 4-row tasks of two experts run for u4 chunks of 4 / 2 / 1 words, fp16 and fp32 scales,
 * the staged (fc1) and chunk-transposed (fc2) activations, per-row and block scales, zero points
 * or none, 16-byte and 4-byte loads; prints a hash of the partial sums per shape. Built once as
 * shipped and once with -DQK_MOE_DECODE_V2 (session 9's loop): the hashes must agree. */
#include <cmath>
#include <cstring>
#include <cstdint>
#define QK_CUDA 1
#define QK_PORTABLE_H
#define __device__
#define __forceinline__ inline
#define __global__
#define __shared__ static
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
struct u3 { unsigned x, y, z; };
static u3 threadIdx, blockIdx, blockDim, gridDim;
static inline void __syncthreads() {}
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
static inline float2 make_float2(float a, float b) { return {a, b}; }
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
static inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
typedef signed char qk_i8; typedef unsigned char qk_u8; typedef short qk_i16; typedef unsigned short qk_u16;
typedef int qk_i32; typedef unsigned int qk_u32; typedef long long qk_i64;
typedef unsigned short __half;
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
static inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
static inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
#define QK_FMUL(a, b) __fmul_rn((a), (b))
#define QK_FADD(a, b) __fadd_rn((a), (b))
#define QK_FDIV(a, b) __fdiv_rn((a), (b))
#define QK_WARP 32
#define QK_SHFL_XOR(v, m, w) (v)
#define QK_SHFL(v, s, w) (v)
static inline qk_u32 qk_bits(float v) { qk_u32 b; memcpy(&b, &v, 4); return b; }
static inline float qk_float(qk_u32 b) { float v; memcpy(&v, &b, 4); return v; }
static inline float qk_ftz(float v) { qk_u32 b = qk_bits(v); return (b & 0x7F800000u) == 0u ? qk_float(b & 0x80000000u) : v; }
static inline bool qk_isnan(float v) { return (qk_bits(v) & 0x7FFFFFFFu) > 0x7F800000u; }
static inline float qk_fp16_to_float(qk_u16 h) {
    unsigned s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023; float v;
    if (e == 0) v = std::ldexp((float)m, -24); else if (e == 31) v = m ? NAN : INFINITY; else v = std::ldexp((float)(m | 1024), (int)e - 25);
    return s ? -v : v; }
static inline qk_u32 __byte_perm(qk_u32 x, qk_u32 y, qk_u32 s) {
    qk_u32 b[8]; for (int i = 0; i < 4; ++i) { b[i] = (x >> (8 * i)) & 255; b[4 + i] = (y >> (8 * i)) & 255; }
    qk_u32 r = 0; for (int i = 0; i < 4; ++i) r |= b[(s >> (4 * i)) & 7] << (8 * i); return r; }
#define QK_BYTE_PERM(x, y, s) __byte_perm((x), (y), (s))
static inline qk_u32 qk_and_or(qk_u32 v, qk_u32 mask, qk_u32 bits) { return (v & mask) | bits; }
static inline int qk_dp4a(int a, int b, int c) { for (int k = 0; k < 32; k += 8) c += ((a << (24 - k)) >> 24) * ((b << (24 - k)) >> 24); return c; }
static inline qk_i64 qk_global_thread() { return 0; }
static inline float qk_load_f(const void* p, qk_i64 i, int is_f16) {
    return is_f16 ? qk_fp16_to_float(((const qk_u16*)p)[i]) : ((const float*)p)[i]; }
static inline int qk_field(const qk_u8* row, int bits, qk_i64 j) {
    const qk_i64 off = j * bits; const int shift = (int)(off & 7); unsigned v = row[off >> 3];
    if (shift + bits > 8) v |= (unsigned)row[(off >> 3) + 1] << 8; return (int)((v >> shift) & ((1u << bits) - 1u)); }
static inline bool qk_moe_above(float v, int e, float bv, int be) { return v > bv || (v == bv && e > be); }
#define QK_MOE_SKIP 1e-8f
#include "qmoe_rows_slice.inc"
#include <cstdio>
#include <vector>
#include <random>
/* fp16 bits of f, the mantissa truncated (any fp16 value will do as a scale) */
static qk_u16 f2h(float f) {
    if (f == 0) return 0; int e; float m = std::frexp(std::fabs(f), &e); int E = e + 14; unsigned s = f < 0;
    if (E <= 0) { unsigned mm = (unsigned)std::ldexp(std::fabs(f), 24); return (s << 15) | mm; }
    unsigned mm = (unsigned)std::ldexp(m * 2 - 1, 10); return (s << 15) | (E << 10) | mm; }
template <int V, bool S16, int XL>
unsigned long long run(int K, int N, int bs, int has_zp, int L, std::mt19937& g, int& cnt) {
    const int BITS = 4, per = 8, E = 2, words = K / per, blocks = bs ? K / bs : 1;
    std::vector<qk_u32> W((size_t)E * N * words); for (auto& w : W) w = g();
    std::vector<qk_u16> Sh((size_t)E * N * blocks); std::vector<float> Sf(Sh.size());
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (size_t i = 0; i < Sh.size(); ++i) { Sh[i] = f2h(u(g) * 0.01f); Sf[i] = S16 ? qk_fp16_to_float(Sh[i]) : u(g) * 0.01f; }
    const int zpb = bs ? (blocks * BITS + 7) / 8 : (N * BITS + 7) / 8;
    std::vector<qk_u8> Z((size_t)E * (bs ? N : 1) * zpb); for (auto& z : Z) z = g();
    std::vector<float> x(K); for (auto& v : x) v = u(g);
    std::vector<float4> xs((K / 4 + 7) / 8 * 8);
    for (int un = 0; un < K / 4; ++un) xs[qk_moe_swz(un)] = make_float4(x[4 * un], x[4 * un + 1], x[4 * un + 2], x[4 * un + 3]);
    const int cv = V * per; std::vector<float> xt(K);
    for (int v = 0; v < K; ++v) xt[qk_moe_apos(v, cv, K)] = x[v];
    qk_moe_fc f = {(const qk_u8*)W.data(), S16 ? (const void*)Sh.data() : (const void*)Sf.data(), Z.data(), nullptr, N, K, bs, zpb, has_zp, 0, S16};
    unsigned long long h = 1469598103934665603ull;
    for (int e = 0; e < E; ++e)
        for (int r0 = 0; r0 < N; r0 += 4) {
            int rows[4]; for (int r = 0; r < 4; ++r) rows[r] = r0 + r < N ? r0 + r : N - 1;
            for (int li = 0; li < L; ++li) for (int vec = 0; vec < 2; ++vec) {
                float acc[4] = {0, 0, 0, 0};
                qk_moe_rows_dot<BITS, V, S16, XL>(f, e, rows, XL == QK_MOE_XT ? (const void*)xt.data() : (const void*)x.data(), 0, 0, xs.data(), li, L, vec, acc);
                for (int r = 0; r < 4; ++r) { float a = acc[r] == 0.0f ? 0.0f : acc[r]; qk_u32 b = qk_bits(a); h = (h ^ b) * 1099511628211ull; }
                ++cnt;
            }
        }
    return h;
}
int main() {
    std::mt19937 g(7); int cnt = 0;
    struct C { int K, N, bs, zp, L; } cs[] = {{2880, 12, 32, 0, 32}, {2048, 8, 128, 0, 32}, {768, 8, 128, 1, 8}, {256, 6, 0, 0, 4}, {256, 6, 0, 1, 2},
        {384, 5, 64, 1, 4}, {96, 4, 32, 1, 1}, {2880, 4, 32, 1, 16}, {640, 4, 128, 0, 2}};
    for (auto c : cs) {
        printf("K%d N%d bs%d zp%d L%d: %016llx %016llx %016llx %016llx %016llx %016llx\n", c.K, c.N, c.bs, c.zp, c.L,
               run<4, true, QK_MOE_XS>(c.K, c.N, c.bs, c.zp, c.L, g, cnt), run<4, true, QK_MOE_XT>(c.K, c.N, c.bs, c.zp, c.L, g, cnt),
               run<2, true, QK_MOE_XS>(c.K, c.N, c.bs, c.zp, c.L, g, cnt), run<1, true, QK_MOE_XS>(c.K, c.N, c.bs, c.zp, c.L, g, cnt),
               run<4, false, QK_MOE_XS>(c.K, c.N, c.bs, c.zp, c.L, g, cnt), run<4, false, QK_MOE_XT>(c.K, c.N, c.bs, c.zp, c.L, g, cnt));
    }
    printf("calls %d\n", cnt);
}

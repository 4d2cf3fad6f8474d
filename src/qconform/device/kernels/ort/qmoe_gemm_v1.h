/* The session-10 (round 1) tile loop of the grouped QMoE GEMMs (ort/qmoe.hip, qk_moe_gemm{1,2}_u*),
 * kept for side-by-side timing only: compiled into qmoe.hip with -DQK_MOE_GEMM_V1
 * (qconform.device.launchers.compile_options) in place of the default one
 * (``python -m qconform.bench.qmoe --prefill --variants grouped,grouped_v1``). Fragments by 32-bit
 * shared loads, divisions for the block of each chunk, partial sums reset by moves; the same
 * fragments, mma calls and folds in the same order as the default loop, so the same output bits. */
#pragma once

/* one projection of expert e for the CTA's pairs: acc[mi][ni][4] (this lane's mma fragments of its
 * group's 32 pairs x 32 rows) = sum over the quantization blocks of fp32(scale) * the fp32 mma sum
 * of x (q - z) over the block. X: fp16 rows of Kp values, s_src: the X row of each tile row (-1:
 * none, zeros). Stages of QK_MOE_GK values: the next stage's words loaded into registers while
 * the current one is multiplied */
template <int BITS>
__device__ __forceinline__ void qk_moe_gemm_tile(const qk_moe_fc& f, int e, int n0, const qk_u16* X, int Kp,
                                                 const int* s_src, qk_u16 (*Xs)[QK_MOE_GPAD],
                                                 qk_u16 (*Ws)[QK_MOE_GPAD], float (*Ss)[QK_MOE_GN],
                                                 float acc[2][4][4]) {
    constexpr int PER = 32 / BITS, WPR = QK_MOE_GK / PER, NW = QK_MOE_GN * WPR / QK_MOE_GT;
    const int tid = (int)threadIdx.x, lane = tid & 31, grp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int wm = (grp >> 1) * 32, wn = (grp & 1) * 32;
    const int words = f.K / PER, blocks = f.bs ? f.K / f.bs : 1;
    const qk_u32 mask = (1u << BITS) - 1u;
    uint4 xr[4];
    qk_u32 wr[NW], zr[NW];
    float sr;
    float part[2][4][4]; /* the current quantization block's fp32 sums, carried across chunks and stages */
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
            for (int v = 0; v < 4; ++v) part[mi][ni][v] = 0.0f;
    auto fetch = [&](int k0) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int idx = tid + QK_MOE_GT * j, r = idx >> 3, c = idx & 7;
            const int src = s_src[r];
            xr[j] = src >= 0 ? *(const uint4*)(X + (qk_i64)src * Kp + k0 + 8 * c) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int j = 0; j < NW; ++j) {
            const int idx = tid + QK_MOE_GT * j, r = idx / WPR, w = k0 / PER + idx % WPR, n = n0 + r;
            const bool in = n < f.N && w < words;
            const qk_i64 rr = (qk_i64)e * f.N + n;
            wr[j] = in ? ((const qk_u32*)f.w)[rr * words + w] : 0u;
            int z = 1 << (BITS - 1);
            if (in && f.has_zp) z = f.bs ? qk_field(f.z + rr * f.zp_bytes, BITS, w * PER / f.bs)
                                         : qk_field(f.z + (qk_i64)e * f.zp_bytes, BITS, n);
            zr[j] = in ? 0xE400u | (qk_u32)z : 0x8000u; /* -(1024 + z) as fp16; a word outside: q - z = 0 */
        }
        {
            const int r = tid & (QK_MOE_GN - 1), h = tid / QK_MOE_GN, kk = k0 + 32 * h, n = n0 + r;
            const qk_i64 rr = (qk_i64)e * f.N + n;
            sr = n < f.N && kk < f.K ? qk_ftz(qk_load_f(f.s, rr * blocks + (f.bs ? kk / f.bs : 0), f.s16)) : 0.0f;
        }
    };
    fetch(0);
    for (int k0 = 0; k0 < f.K; k0 += QK_MOE_GK) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int idx = tid + QK_MOE_GT * j, r = idx >> 3, c = idx & 7;
            *(uint4*)&Xs[r][8 * c] = xr[j];
        }
#pragma unroll
        for (int j = 0; j < NW; ++j) {
            const int idx = tid + QK_MOE_GT * j, r = idx / WPR, w = idx % WPR;
            const qk_u32 nz = zr[j] * 0x10001u;
            qk_u32 d[PER / 2];
#pragma unroll
            for (int i = 0; i < PER / 2; ++i) { /* (1024 + q) - (1024 + z): exact in fp16 */
                const qk_u32 lo = (wr[j] >> (2 * BITS * i)) & mask, hi = (wr[j] >> (2 * BITS * i + BITS)) & mask;
                const qk_u32 q2 = 0x64006400u | lo | (hi << 16);
                d[i] = (zr[j] & 0x4000u) ? qk_hfma2(q2, 0x3C003C00u, nz) : 0u;
            }
            if (PER == 4) {
                *(uint2*)&Ws[r][w * PER] = make_uint2(d[0], d[1 % (PER / 2)]);
            } else {
#pragma unroll
                for (int i = 0; i < PER / 2; i += 4)
                    *(uint4*)&Ws[r][w * PER + 2 * i] = make_uint4(d[i % (PER / 2)], d[(i + 1) % (PER / 2)],
                                                                  d[(i + 2) % (PER / 2)], d[(i + 3) % (PER / 2)]);
            }
        }
        Ss[tid / QK_MOE_GN][tid & (QK_MOE_GN - 1)] = sr;
        __syncthreads();
        if (k0 + QK_MOE_GK < f.K) fetch(k0 + QK_MOE_GK);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int kk = k0 + 32 * h;
            if (kk >= f.K) break;
#pragma unroll
            for (int ks = 0; ks < 32; ks += 16) {
                const int c = 32 * h + ks + 2 * t;
                qk_u32 a[2][4], b[4][2];
#pragma unroll
                for (int mi = 0; mi < 2; ++mi) {
                    const int r = wm + 16 * mi + g;
                    a[mi][0] = *(const qk_u32*)&Xs[r][c];
                    a[mi][1] = *(const qk_u32*)&Xs[r + 8][c];
                    a[mi][2] = *(const qk_u32*)&Xs[r][c + 8];
                    a[mi][3] = *(const qk_u32*)&Xs[r + 8][c + 8];
                }
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) {
                    const int r = wn + 8 * ni + g;
                    b[ni][0] = *(const qk_u32*)&Ws[r][c];
                    b[ni][1] = *(const qk_u32*)&Ws[r][c + 8];
                }
#pragma unroll
                for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                    for (int ni = 0; ni < 4; ++ni) qk_mma_16816(part[mi][ni], a[mi], b[ni]);
            }
            const bool last = kk + 32 >= f.K || (f.bs && (kk + 32) % f.bs == 0); /* the block's last chunk */
            if (last) {
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) {
                    const float s0 = Ss[h][wn + 8 * ni + 2 * t], s1 = Ss[h][wn + 8 * ni + 2 * t + 1];
#pragma unroll
                    for (int mi = 0; mi < 2; ++mi) {
                        acc[mi][ni][0] = fmaf(s0, part[mi][ni][0], acc[mi][ni][0]);
                        acc[mi][ni][1] = fmaf(s1, part[mi][ni][1], acc[mi][ni][1]);
                        acc[mi][ni][2] = fmaf(s0, part[mi][ni][2], acc[mi][ni][2]);
                        acc[mi][ni][3] = fmaf(s1, part[mi][ni][3], acc[mi][ni][3]);
                        part[mi][ni][0] = part[mi][ni][1] = part[mi][ni][2] = part[mi][ni][3] = 0.0f;
                    }
                }
            }
        }
        __syncthreads();
    }
}


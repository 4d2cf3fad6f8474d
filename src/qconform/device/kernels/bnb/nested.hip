/* bitsandbytes 4-bit family: the nested absmax (compress_statistics=True), one thread per 4-bit block.
 *
 * Semantics: qconform.ops.bnb.nested (nested_absmax), oracle qconform.oracles.bnb.nested_absmax; facts
 * docs/bnb-4bit.md 4. Upstream (bitsandbytes-foundation/bitsandbytes, the commit docs/bnb-4bit.md
 * names): bitsandbytes/functional.py dequantize_4bit / dequantize_blockwise (two roundings) and
 * csrc/gemm_4bit_simt.cu (one fmaf). code8 is the dynamic map, functional.py create_dynamic_map().
 *
 * The ABI (qconform abi nested_absmax), flush-to-zero as CuPy builds device code (the oracle's
 * ftz=True, which reads as variant cuda):
 * - mode two_round: prod = ftz(fl32(code8[q] * absmax2[j / 256])) (the CUDA dequantize kernel, fast
 *   math), then y = fl32(prod + offset) unflushed (torch's add after it: no flush-to-zero), so the
 *   sum is done in double (exact inputs, innocuous double rounding: 53 >= 2 * 24 + 2) and rounded
 *   once to float32 with subnormals;
 * - mode fma: y = ftz(fmaf(code8[q], absmax2[j / 256], offset)) of the exact operands: the hardware
 *   fmaf where no operand is subnormal (a flush-to-zero fmaf would read one as 0); else the exact
 *   product in double and the oracle's correction of the double sum (TwoSum: a double result on a
 *   float32 midpoint moves toward the exact sum), then flushed. */
#include "qk_portable.h"

#include "qconform_abi.h" /* the enum codes, generated from the catalogue */

/* functional.py create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8) as float32 bits */
__constant__ qk_u32 QK_DYNAMIC_MAP[256] = {
    0xBF7E3333u, 0xBF7A999Au, 0xBF770000u, 0xBF736666u, 0xBF6FCCCDu, 0xBF6C3333u, 0xBF68999Au, 0xBF650000u,
    0xBF616666u, 0xBF5DCCCDu, 0xBF5A3333u, 0xBF56999Au, 0xBF530000u, 0xBF4F6666u, 0xBF4BCCCDu, 0xBF483333u,
    0xBF44999Au, 0xBF410000u, 0xBF3D6666u, 0xBF39CCCDu, 0xBF363334u, 0xBF32999Au, 0xBF2F0000u, 0xBF2B6666u,
    0xBF27CCCDu, 0xBF243334u, 0xBF20999Au, 0xBF1D0000u, 0xBF196666u, 0xBF15CCCDu, 0xBF123334u, 0xBF0E999Au,
    0xBF0B0000u, 0xBF076666u, 0xBF03CCCCu, 0xBF003333u, 0xBEF93332u, 0xBEF20000u, 0xBEEACCCCu, 0xBEE3999Au,
    0xBEDC6666u, 0xBED53333u, 0xBECE0000u, 0xBEC6CCCCu, 0xBEBF999Au, 0xBEB86666u, 0xBEB13333u, 0xBEAA0000u,
    0xBEA2CCCCu, 0xBE9B999Au, 0xBE946666u, 0xBE8D3334u, 0xBE860000u, 0xBE7D9999u, 0xBE6F3333u, 0xBE60CCCDu,
    0xBE526666u, 0xBE440000u, 0xBE35999Au, 0xBE273333u, 0xBE18CCCDu, 0xBE0A6666u, 0xBDF80000u, 0xBDDB3334u,
    0xBDC9EB85u, 0xBDC428F7u, 0xBDBE6667u, 0xBDB8A3D7u, 0xBDB2E148u, 0xBDAD1EB8u, 0xBDA75C2Au, 0xBDA1999Au,
    0xBD9BD70Au, 0xBD96147Bu, 0xBD9051EBu, 0xBD8A8F5Du, 0xBD84CCCDu, 0xBD7E147Bu, 0xBD728F5Du, 0xBD670A3Du,
    0xBD5B851Fu, 0xBD500000u, 0xBD447AE1u, 0xBD38F5C3u, 0xBD2D70A3u, 0xBD21EB85u, 0xBD166667u, 0xBD0AE148u,
    0xBCFEB852u, 0xBCE7AE15u, 0xBCD0A3D7u, 0xBCB9999Au, 0xBCA28F5Du, 0xBC8B851Fu, 0xBC68F5C3u, 0xBC3AE148u,
    0xBC1F3B64u, 0xBC160418u, 0xBC0CCCCDu, 0xBC039581u, 0xBBF4BC6Au, 0xBBE24DD3u, 0xBBCFDF3Bu, 0xBBBD70A4u,
    0xBBAB020Du, 0xBB989374u, 0xBB8624DDu, 0xBB676C8Au, 0xBB428F5Cu, 0xBB1DB22Du, 0xBAF1A9FCu, 0xBAA7EF9Du,
    0xBA7765FFu, 0xBA59E83Eu, 0xBA3C6A80u, 0xBA1EECC1u, 0xBA016F01u, 0xB9C7E283u, 0xB98CE705u, 0xB923D70Bu,
    0xB8BA1F4Bu, 0xB88AEFB3u, 0xB8378034u, 0xB7B24206u, 0xB70205FFu, 0xB65A1A94u, 0xB513A3B7u, 0x00000000u,
    0x3513A3B7u, 0x365A1A94u, 0x370205FFu, 0x37B24206u, 0x38378034u, 0x388AEFB3u, 0x38BA1F4Bu, 0x3923D70Bu,
    0x398CE705u, 0x39C7E283u, 0x3A016F01u, 0x3A1EECC1u, 0x3A3C6A80u, 0x3A59E83Eu, 0x3A7765FFu, 0x3AA7EF9Du,
    0x3AF1A9FCu, 0x3B1DB22Du, 0x3B428F5Cu, 0x3B676C8Au, 0x3B8624DDu, 0x3B989374u, 0x3BAB020Du, 0x3BBD70A4u,
    0x3BCFDF3Bu, 0x3BE24DD3u, 0x3BF4BC6Au, 0x3C039581u, 0x3C0CCCCDu, 0x3C160418u, 0x3C1F3B64u, 0x3C3AE148u,
    0x3C68F5C3u, 0x3C8B851Fu, 0x3CA28F5Du, 0x3CB9999Au, 0x3CD0A3D7u, 0x3CE7AE15u, 0x3CFEB852u, 0x3D0AE148u,
    0x3D166667u, 0x3D21EB85u, 0x3D2D70A3u, 0x3D38F5C3u, 0x3D447AE1u, 0x3D500000u, 0x3D5B851Fu, 0x3D670A3Du,
    0x3D728F5Du, 0x3D7E147Bu, 0x3D84CCCDu, 0x3D8A8F5Du, 0x3D9051EBu, 0x3D96147Bu, 0x3D9BD70Au, 0x3DA1999Au,
    0x3DA75C2Au, 0x3DAD1EB8u, 0x3DB2E148u, 0x3DB8A3D7u, 0x3DBE6667u, 0x3DC428F7u, 0x3DC9EB85u, 0x3DDB3334u,
    0x3DF80000u, 0x3E0A6666u, 0x3E18CCCDu, 0x3E273333u, 0x3E35999Au, 0x3E440000u, 0x3E526666u, 0x3E60CCCDu,
    0x3E6F3333u, 0x3E7D9999u, 0x3E860000u, 0x3E8D3334u, 0x3E946666u, 0x3E9B999Au, 0x3EA2CCCCu, 0x3EAA0000u,
    0x3EB13333u, 0x3EB86666u, 0x3EBF999Au, 0x3EC6CCCCu, 0x3ECE0000u, 0x3ED53333u, 0x3EDC6666u, 0x3EE3999Au,
    0x3EEACCCCu, 0x3EF20000u, 0x3EF93332u, 0x3F003333u, 0x3F03CCCCu, 0x3F076666u, 0x3F0B0000u, 0x3F0E999Au,
    0x3F123334u, 0x3F15CCCDu, 0x3F196666u, 0x3F1D0000u, 0x3F20999Au, 0x3F243334u, 0x3F27CCCDu, 0x3F2B6666u,
    0x3F2F0000u, 0x3F32999Au, 0x3F363334u, 0x3F39CCCDu, 0x3F3D6666u, 0x3F410000u, 0x3F44999Au, 0x3F483333u,
    0x3F4BCCCDu, 0x3F4F6666u, 0x3F530000u, 0x3F56999Au, 0x3F5A3333u, 0x3F5DCCCDu, 0x3F616666u, 0x3F650000u,
    0x3F68999Au, 0x3F6C3333u, 0x3F6FCCCDu, 0x3F736666u, 0x3F770000u, 0x3F7A999Au, 0x3F7E3333u, 0x3F800000u,
};

#define QK_F32_MIN_NORMAL 1.1754943508222875e-38 /* 2^-126 */
#define QK_TWO_149 7.1362384635297994e+44        /* 2^149 */
#define QK_TWO_M149 1.4012984643248171e-45       /* 2^-149 */

/* a float32 as a double, subnormals included (the conversion instruction may flush one) */
__device__ __forceinline__ double qk_f64_of(float v) {
    const qk_u32 b = qk_bits(v);
    if ((b & 0x7F800000u) != 0u) return (double)v;
    const double m = (double)(b & 0x007FFFFFu) * QK_TWO_M149;
    return (b & 0x80000000u) ? -m : m;
}

/* the float32 nearest a double (ties to even), subnormals kept, as bits */
__device__ __forceinline__ qk_u32 qk_f32_bits_of(double d) {
    if (!(fabs(d) < QK_F32_MIN_NORMAL)) return qk_bits(__double2float_rn(d)); /* normal, inf, NaN */
    const qk_u32 m = (qk_u32)rint(fabs(d) * QK_TWO_149);                      /* <= 2^23: exact */
    return (signbit(d) ? 0x80000000u : 0u) | m;
}

__device__ __forceinline__ bool qk_subnormal(float v) { return (qk_bits(v) & 0x7F800000u) == 0u && (qk_bits(v) << 1) != 0u; }

/* the float32 next to r (bits) toward the sign of `dir` */
__device__ __forceinline__ double qk_f32_next(qk_u32 r, double dir) {
    qk_u32 b;
    if ((r & 0x7FFFFFFFu) == 0u) b = dir > 0 ? 1u : 0x80000001u;
    else b = ((dir > 0) == !(r & 0x80000000u)) ? r + 1u : r - 1u;
    return qk_f64_of(qk_float(b));
}

/* fmaf(c, a, o) of the exact operands, rounded once, then flushed */
__device__ __forceinline__ float qk_fma_exact(float c, float a, float o) {
    if (!qk_subnormal(a) && !qk_subnormal(o)) return qk_ftz(__fmaf_rn(c, a, o));
    const double p = qk_f64_of(c) * qk_f64_of(a), q = qk_f64_of(o); /* p exact: 24 + 24 bits */
    const double s = __dadd_rn(p, q), bb = __dsub_rn(s, p);
    const double err = __dadd_rn(__dsub_rn(p, __dsub_rn(s, bb)), __dsub_rn(q, bb)); /* p + q = s + err */
    qk_u32 r = qk_f32_bits_of(s);
    const double rd = qk_f64_of(qk_float(r)), d = __dsub_rn(s, rd);
    if (d != 0.0 && (r & 0x7FFFFFFFu) < 0x7F800000u) {
        const double other = qk_f32_next(r, d);
        if (fabs(d) * 2.0 == fabs(other - rd) && err != 0.0 && (err > 0.0) == (d > 0.0)) r = qk_f32_bits_of(other);
    }
    return qk_ftz(qk_float(r));
}

extern "C" __global__ void __launch_bounds__(256) qk_nested_absmax(QCONFORM_NESTED_ABSMAX_PARAMS) {
    const qk_i64 j = qk_global_thread();
    if (j >= n_blocks) return;
    const float c = qk_float(QK_DYNAMIC_MAP[qabsmax[j]]), a = absmax2[j >> 8];
    if (mode == QCONFORM_NESTED_MODE_FMA) {
        y[j] = qk_fma_exact(c, a, offset);
        return;
    }
    const float prod = qk_ftz(QK_FMUL(c, a));
    y[j] = qk_float(qk_f32_bits_of(__dadd_rn(qk_f64_of(prod), qk_f64_of(offset))));
}

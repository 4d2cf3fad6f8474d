"""fp32 fused multiply-add ``fmaf(a, b, c) = round32(a*b + c)`` (one rounding), numpy and numba.

Models what GCC emits (``vfmadd*ss``, ``vfnmadd*ss``, ``vfmsub*ss``) when it contracts ggml's C under
``-mfma`` and GNU C's default ``-ffp-contract=fast`` (docs/ggml-formats.md 8.8).

numpy has no fmaf; ``fmaf`` computes it exactly in float64: the product of two fp32 values is exact
in float64 (48 significant bits), the sum ``p + c`` is rounded *to odd* (round to nearest, then, if
inexact and the last bit is even, step one ulp towards the exact value, found with TwoSum), and the
float64 result is rounded to fp32. Rounding to odd at 53 bits then to nearest at 24 bits is the
correctly rounded fp32 result (Boldo and Melquiond, "Emulation of FMA and correctly rounded sums:
proved algorithms using rounding to odd", IEEE Trans. Computers 57(4), 2008), subnormal fp32 results
included. The numba twin calls LLVM's ``llvm.fma.f32`` (one ``vfmadd`` on a CPU with FMA, the libm
``fmaf`` otherwise). Infinite and NaN results are IEEE's; NaN payloads are not modelled.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic


def fmaf(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Elementwise ``fmaf(a, b, c)`` of fp32 arrays (broadcasting), correctly rounded."""
    with np.errstate(all="ignore"):
        a64 = np.asarray(a, np.float32).astype(np.float64)
        b64 = np.asarray(b, np.float32).astype(np.float64)
        c64 = np.asarray(c, np.float32).astype(np.float64)
        p = a64 * b64  # exact
        s = p + c64
        bv = s - p  # TwoSum: e = (p + c) - s exactly
        e = (p - (s - bv)) + (c64 - bv)
        even = (s.view(np.int64) & 1) == 0
        step = np.isfinite(s) & (e != 0) & even
        s = np.where(step, np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)
        return s.astype(np.float32)


@intrinsic
def _llvm_fma_f32(typingctx, a, b, c):
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32, f32, f32]), "llvm.fma.f32")
        return builder.call(fn, args)

    return sig, codegen


@njit(cache=True, inline="always")
def fmaf_nb(a, b, c):
    """``fmaf(a, b, c)`` on fp32 scalars inside numba code."""
    return _llvm_fma_f32(np.float32(a), np.float32(b), np.float32(c))

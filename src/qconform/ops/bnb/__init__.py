"""The bitsandbytes family's catalogue entries (4-bit NF4/FP4; oracles: ``qconform.oracles.bnb``).

Ops and leaves (named as the kernels' unit tests name them):
  nf4_quantize, fp4_quantize   Xfp32_Ynf4, Xfp16_Ynf4, Xbf16_Ynf4 (fp4 likewise)   shape (rows, cols) of A
  nf4_decode, fp4_decode       Xnf4_Yfp32, Xnf4_Yfp16, Xnf4_Ybf16 (fp4 likewise)   shape (rows, cols) of y
  nested_absmax                Xu8_Yfp32 (two roundings), Xu8_Yfp32_fma (one)      shape (rows, cols) of W
  gemm_4bit                    Xfp32_W4_Yfp32, Xfp16_W4_Yfp16, Xbf16_W4_Ybf16      shape (M, K, N)
bfloat16 arrays are their uint16 bit patterns. A ``py:`` drop-in is called as the oracle is, with
bitsandbytes' argument names (``fn(A, blocksize)``, ``fn(packed, absmax, rows=, cols=, blocksize=,
dtype=)``, ``fn(qabsmax, absmax2, offset, mode=)``, ``fn(A, B, absmax, bias, K=, blocksize=,
quant_type=)``), and ``out=`` when it takes one.

Variant. bitsandbytes computes these ops differently per backend (docs/bnb-4bit.md 2.3, 4.5, 5):
the catalogue checks its CPU backend by default -- the reading proven byte for byte against
bitsandbytes 0.50.2 (tests/test_upstream_bnb.py), and the one the golden sets store. A kernel that
follows bitsandbytes' CUDA kernels (the float32 literal thresholds, NaN skipped, flush-to-zero, the
fused nested scale, gemm_4bit's SIMT order) declares it in its numeric contract:
``qconform run --impl ... --contract variant=cuda``, ``:contract=variant=cuda`` on the ``--impl``
string, or ``my_kernel.__qconform_contract__ = "variant=cuda"`` on a ``py:`` callable
(``variant=rocm``: the CUDA rules without flush-to-zero, from the source only). The call itself
never carries the variant: the oracles' ``variant`` keyword is the catalogue's, not the kernel's.
The CUDA reading uses the IEEE reciprocal ``1/absmax``; a kernel built with ``rcp.approx`` differs
from it where a scaled value lies within an ulp of a threshold.
"""

from __future__ import annotations

from qconform.ops.bnb.decode import FP4_DECODE, NF4_DECODE
from qconform.ops.bnb.gemm import GEMM_4BIT
from qconform.ops.bnb.nested import NESTED_ABSMAX
from qconform.ops.bnb.quantize import FP4_QUANTIZE, NF4_QUANTIZE
from qconform.ops.spec import OpSpec

OPS: tuple[OpSpec, ...] = (NF4_QUANTIZE, FP4_QUANTIZE, NF4_DECODE, FP4_DECODE, NESTED_ABSMAX, GEMM_4BIT)

__all__ = ["OPS"]

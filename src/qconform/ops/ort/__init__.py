"""The ONNX Runtime family's catalogue entries, one module per op (siblings share one).

Ops and leaves (named as the kernels' unit tests name them):
  matmul_nbits            X{fp16,fp32}_Wu{2,3,4,8}_Y{fp16,fp32}   shape (M, K, N)
  dequantize_nbits        Wu{2,3,4,8}_Yfp32                        shape (K, N)
  gather_block_quantized  Xi64_Wu4_Yfp16, Xi64_Wu8_Yfp16, Xi64_Wi4_Yfp16, Xi64_Wfp8_Yfp16
                                                                   shape (rows, cols, n_indices)
  fake_quantize           Xfp32_Q{u8,i8,u16,i16,u4,i4}_Yfp32, Xfp16_Qu8_Yfp16   shape (rows, cols)
  qswiglu                 Xu16_Yu16, Xu8_Yu8                       shape (rows, cols)
  gqa_decode, gqa_prefill Xfp16_Wfp16_Yfp16, Xfp32_Wfp32_Yfp32, Xfp16_Wi8_Yfp16, Xfp16_Wu4_Yfp16 (W: the KV cache)
                                                                   shape (B, S, P, N, Nk, H)
  qmoe_decode, qmoe_ragged_mm  Xfp16_Wu4_Yfp16, Xfp16_Wu8_Yfp16, Xfp32_Wu4_Yfp32   shape (tokens, H, I, E)
A ``py:`` drop-in is called as the oracle is: ``fn(*call_args)`` with the ONNX op's argument and
attribute names. Zero-point kinds in the MatMulNBits cases: none (default 2**(bits-1)), packed
uint8, float (per block), uniform (every float zero point equal: dequantize_nbits compares those in
the kernel form ``(q - z) * s`` with one scalar zero point, matmul_nbits in ORT's form), and for
matmul_nbits scalar (the decode kernels' uniform path: one zero point, the kernel form).
No case holds an fp32 subnormal, so the oracles' ftz changes nothing here.
"""

from __future__ import annotations

from qconform.ops.ort.fake_quantize import FAKE_QUANTIZE
from qconform.ops.ort.gather_block_quantized import GATHER
from qconform.ops.ort.group_query_attention import GQA_DECODE, GQA_PREFILL
from qconform.ops.ort.matmul_nbits import DEQUANTIZE_NBITS, MATMUL_NBITS
from qconform.ops.ort.qmoe import QMOE_DECODE, QMOE_RAGGED_MM
from qconform.ops.ort.qswiglu import QSWIGLU
from qconform.ops.spec import OpSpec

OPS: tuple[OpSpec, ...] = (
    MATMUL_NBITS,
    DEQUANTIZE_NBITS,
    GATHER,
    FAKE_QUANTIZE,
    QSWIGLU,
    GQA_DECODE,
    GQA_PREFILL,
    QMOE_DECODE,
    QMOE_RAGGED_MM,
)

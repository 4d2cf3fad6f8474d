"""ONNX Runtime quantized-weight family: oracles with the ONNX ops' argument and attribute names.

Each module states its source (docs/ort-ops.md and the ORT code it cites) and its
rounding: ``matmul_nbits`` (MatMulNBits, its dequantization in ORT's and a kernel's form, the
int8 activation path), ``gather_block_quantized``, ``qdq`` (QuantizeLinear, DequantizeLinear,
fake quantization), ``qswiglu`` (the quantized SwiGLU chain), ``packing`` (low-bits-first),
``group_query_attention`` (GroupQueryAttention, with ``rotary`` and ``kv_cache``: its rotary
embedding and int8/4-bit KV cache), ``qmoe`` (QMoE and MoE, routing in ``moe_routing``).
"""

from qconform.oracles.ort._out import check_out
from qconform.oracles.ort.gather_block_quantized import check_gather_args, gather_block_quantized
from qconform.oracles.ort.group_query_attention import (
    check_gqa_args,
    defined_output_rows,
    defined_present_rows,
    group_query_attention,
)
from qconform.oracles.ort.matmul_nbits import check_a, check_nbits_args, dequantize_nbits, matmul_nbits
from qconform.oracles.ort.moe_routing import route
from qconform.oracles.ort.packing import pack_bits, unpack_bits
from qconform.oracles.ort.qdq import check_fake_quantize_args, dequantize_linear, fake_quantize, quantize_linear
from qconform.oracles.ort.qmoe import check_moe_args, check_qmoe_args, moe, qmoe
from qconform.oracles.ort.qswiglu import check_activations, check_qparams, qswiglu, sigmoid_fp32

__all__ = [
    "check_a",
    "check_activations",
    "check_fake_quantize_args",
    "check_gather_args",
    "check_gqa_args",
    "check_moe_args",
    "check_out",
    "check_qparams",
    "check_nbits_args",
    "check_qmoe_args",
    "defined_output_rows",
    "defined_present_rows",
    "dequantize_linear",
    "dequantize_nbits",
    "fake_quantize",
    "gather_block_quantized",
    "group_query_attention",
    "matmul_nbits",
    "moe",
    "pack_bits",
    "qmoe",
    "qswiglu",
    "quantize_linear",
    "route",
    "sigmoid_fp32",
    "unpack_bits",
]

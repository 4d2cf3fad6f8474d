"""Launchers of ggml's fused producers of Q8_K activations (kernels ``ggml/fused.hip``):
``rms_norm_q8_k`` and ``silu_mul_q8_k`` with the oracles' call shapes on CuPy arrays, through the
ops' declared ABI (``qconform abi rms_norm_q8_k``): one 256-thread CTA per Q8_K block. Each returns
(the row in ``out_dtype``: float32, or bfloat16 as uint16 bits; its Q8_K bytes), into ``out`` (a
pair of buffers) when given; byte-identical to the oracles with flush-to-zero (the rows the
catalogue's ftz reading leaves unchecked aside)."""

from __future__ import annotations

from typing import Any

from qconform.device.launchers import launch_abi
from qconform.ops.ggml.keep_quant import RMS_NORM_Q8_K, SILU_MUL_Q8_K

SOURCE = "ggml/fused.hip"


def rms_norm_q8_k(x: Any, gamma: Any, eps: float, out_dtype: str = "float32", *, out: Any = None) -> Any:
    """ggml's RMSNorm times ``gamma`` (the sum of squares in double, in ggml's order), stored in
    ``out_dtype``, and that stored row's Q8_K bytes."""
    return launch_abi(RMS_NORM_Q8_K, SOURCE, "qk_rms_norm_q8_k", (x, gamma, eps, out_dtype), {}, out)


def silu_mul_q8_k(gate: Any, up: Any, out_dtype: str = "float32", *, out: Any = None) -> Any:
    """ggml's SiLU(gate) * up (``ggml_v_expf``'s SSE2 branch), stored in ``out_dtype``, and that
    stored row's Q8_K bytes."""
    return launch_abi(SILU_MUL_Q8_K, SOURCE, "qk_silu_mul_q8_k", (gate, up, out_dtype), {}, out)

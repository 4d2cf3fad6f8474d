"""Launcher of qswiglu (kernels ``ort/qswiglu.hip``): the fused chain, or its unfused steps."""

from __future__ import annotations

from typing import Any

import cupy
import numpy as np

from qconform.device.abi import out_buffer
from qconform.device.launchers import contiguous, launch, launch_abi
from qconform.ops.ort.qswiglu import QSWIGLU
from qconform.oracles.ort.qdq import QTYPES
from qconform.oracles.ort.qswiglu import check_activations, check_qparams

SOURCE = "ort/qswiglu.hip"


def qswiglu(gate_q, up_q, *, dtype="uint16", out=None, fused=True, **qparams):
    """The quantized SwiGLU chain: one fused kernel (the op's declared ABI, ``qconform abi
    qswiglu``), or (``fused=False``) its unfused steps as separate kernels; the two are
    byte-identical (same device functions)."""
    if fused:
        return launch_abi(QSWIGLU, SOURCE, "qk_qswiglu_fused", (gate_q, up_q), {**qparams, "dtype": dtype}, out)
    np_dtype = check_activations(gate_q, up_q, dtype, cupy.ndarray)
    contiguous(gate_q=gate_q, up_q=up_q)
    checked = check_qparams({k: _host(v) for k, v in qparams.items()}, np_dtype)
    p = {k: (np.float32(sc), np.int32(zp)) for k, (sc, zp) in checked.items()}
    y = out_buffer(out, gate_q.shape, np_dtype, gate_q, up_q)
    n, hi, is16 = np.int64(gate_q.size), np.int32(QTYPES[dtype][2]), np.int32(dtype == "uint16")
    g, u, t = (cupy.empty(gate_q.shape, cupy.float32) for _ in range(3))
    q = cupy.empty(gate_q.shape, np_dtype)
    launch("qswiglu", SOURCE, "qk_step_dequantize", int(n), (gate_q, g, n, *p["gate"], is16))
    launch("qswiglu", SOURCE, "qk_step_dequantize", int(n), (up_q, u, n, *p["up"], is16))
    launch("qswiglu", SOURCE, "qk_step_sigmoid_quantize", int(n), (g, q, n, *p["sig"], hi, is16))
    launch("qswiglu", SOURCE, "qk_step_dequantize", int(n), (q, t, n, *p["sig"], is16))
    launch("qswiglu", SOURCE, "qk_step_mul_quantize", int(n), (g, t, q, n, *p["silu"], hi, is16))
    launch("qswiglu", SOURCE, "qk_step_dequantize", int(n), (q, t, n, *p["silu"], is16))
    launch("qswiglu", SOURCE, "qk_step_mul_quantize", int(n), (t, u, y, n, *p["out"], hi, is16))
    return y


def _host(v: Any) -> Any:
    return cupy.asnumpy(v) if isinstance(v, cupy.ndarray) else v

"""The quantized SwiGLU chain as ONNX nodes: DequantizeLinear, Sigmoid, QuantizeLinear, Mul.

The chain (every Q/DQ per tensor, one scale and zero point each; activations uint16 or uint8):
  g  = DQ(gate_q)                   u  = DQ(up_q)
  s  = Q(Sigmoid(g))  -> sd = DQ(s)           sigmoid quantized on its own scale
  h  = Q(fp32(g * sd)) -> hd = DQ(h)          silu = g * sigmoid(g)
  y  = Q(fp32(hd * u))                         the output, quantized
Q/DQ are ``qdq.quantize_linear`` / ``dequantize_linear`` (true fp32 division, half to even).

Sigmoid is defined as the correctly rounded fp32 value of 1 / (1 + exp(-g)): evaluated in
float64 and rounded once (float64's error is far below half an fp32 ulp for every fp32 g).
ONNX leaves Sigmoid's accuracy to the runtime: ORT's CPU uses MLAS's own rational
approximation (measured against this definition on the uint16 grid of g: absolute error at most
1.2e-7, i.e. up to 8 ulp for g >= -2 and thousands of ulp of the tiny values near g = -8), a GPU
kernel ``expf`` / ``__expf``. The result depends on that only where sigmoid(g) / sig_scale lands
within that error of a .5 rounding boundary of Q(Sigmoid): there s moves by one step, which moves
g * sd by |g| sig_scale, so h by up to |g| sig_scale / silu_scale steps (plus one), and y by up to
|u| silu_scale / out_scale times h's move (plus one). With the catalogue's calibrations those
ratios keep y within one step (ORT 1.32 CPU: 14 of 65536 uint16 outputs one step off, 0 of 16384
uint8; tests/test_upstream_ort.py); other scales can move it by tens of steps (a sigmoid scale
large against the silu scale).
Everything after Sigmoid is exact given s. A device kernel is therefore checked as "within one
output step, differing elements counted" against this oracle on the catalogue's cases, and bit
for bit against the device's own unfused chain.
"""

from __future__ import annotations

import numpy as np

from qconform.errors import ArgumentError
from qconform.oracles.ort._out import check_out, deliver
from qconform.oracles.ort.qdq import dequantize_linear, quantize_linear

ACTIVATION_TYPES = ("uint16", "uint8")
STEPS = ("gate", "up", "sig", "silu", "out")  # each has a ``<step>_scale`` and a ``<step>_zp``


def sigmoid_fp32(g: np.ndarray) -> np.ndarray:
    """fp32(1 / (1 + exp(-g))), correctly rounded (see the module docstring)."""
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-np.asarray(g, np.float64)))).astype(np.float32)


def _scalar(name: str, v: object, dtype: np.dtype | None) -> np.ndarray:
    a = np.asarray(v)
    if a.size != 1:
        raise ArgumentError(f"{name}: must be a per-tensor scalar, got shape {a.shape}")
    if dtype is not None and a.dtype != dtype:
        raise ArgumentError(f"{name}: dtype must be {dtype}, got {a.dtype}")
    if dtype is None and a.dtype != np.float32:
        raise ArgumentError(f"{name}: must be float32, got {a.dtype}")
    return a.reshape(())


def check_qparams(qparams: dict[str, object], np_dtype: np.dtype) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{step: (scale, zero point)} as 0-d arrays, after checking each is a per-tensor float32
    scale and a zero point of the activation type (host values; the device launcher passes its
    copies)."""
    return {
        k: (_scalar(f"{k}_scale", qparams[f"{k}_scale"], None), _scalar(f"{k}_zp", qparams[f"{k}_zp"], np_dtype))
        for k in STEPS
    }


def check_activations(gate_q: object, up_q: object, dtype: str, array_type: type = np.ndarray) -> np.dtype:
    """The activation dtype, after checking gate and up are arrays of it with one shape (the
    device launcher passes CuPy's array type)."""
    if dtype not in ACTIVATION_TYPES:
        raise ArgumentError(f"dtype: must be one of {ACTIVATION_TYPES}, got {dtype!r}")
    np_dtype = np.dtype(dtype)
    for name, a in (("gate_q", gate_q), ("up_q", up_q)):
        if not isinstance(a, array_type) or a.dtype != np_dtype:
            raise ArgumentError(f"{name}: must be a {array_type.__module__.split('.')[0]} {dtype} array")
    if gate_q.shape != up_q.shape:
        raise ArgumentError(f"up_q: shape must equal gate_q's {gate_q.shape}, got {up_q.shape}")
    return np_dtype


def qswiglu(
    gate_q: np.ndarray,
    up_q: np.ndarray,
    *,
    gate_scale: object,
    gate_zp: object,
    up_scale: object,
    up_zp: object,
    sig_scale: object,
    sig_zp: object,
    silu_scale: object,
    silu_zp: object,
    out_scale: object,
    out_zp: object,
    dtype: str = "uint16",
    out: np.ndarray | None = None,
    ftz: bool = False,
) -> np.ndarray:
    """Quantized gate and up (same shape, ``dtype``) -> quantized SwiGLU output (``dtype``).
    ``ftz`` is accepted for the device comparison and changes nothing: no value in the chain is
    an fp32 subnormal unless a scale is."""
    np_dtype = check_activations(gate_q, up_q, dtype)
    check_out(out, gate_q.shape, np_dtype, gate_q, up_q)
    given = {
        "gate_scale": gate_scale,
        "gate_zp": gate_zp,
        "up_scale": up_scale,
        "up_zp": up_zp,
        "sig_scale": sig_scale,
        "sig_zp": sig_zp,
        "silu_scale": silu_scale,
        "silu_zp": silu_zp,
        "out_scale": out_scale,
        "out_zp": out_zp,
    }
    p = check_qparams(given, np_dtype)

    def q(v: np.ndarray, k: str) -> np.ndarray:
        return quantize_linear(v, p[k][0], p[k][1], output_dtype=dtype)

    def dq(v: np.ndarray, k: str) -> np.ndarray:
        return dequantize_linear(v, p[k][0], p[k][1], x_dtype=dtype)

    g, u = dq(gate_q, "gate"), dq(up_q, "up")
    sd = dq(q(sigmoid_fp32(g), "sig"), "sig")
    hd = dq(q((g * sd).astype(np.float32), "silu"), "silu")
    return deliver(q((hd * u).astype(np.float32), "out"), out)

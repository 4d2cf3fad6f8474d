"""4-bit (NF4/FP4) quantize and dequantize: the numpy spec and the numba twin, byte-identical
(docs/bnb-4bit.md 2.1, 2.2, 2.3, 3).

Layout (bitsandbytes-foundation/bitsandbytes bitsandbytes/functional.py ``quantize_4bit``): the input is
``A.reshape(-1)`` (row-major), block b is ``[b*bs, min((b+1)*bs, n))``, and byte j holds element 2j in
the high nibble and 2j+1 in the low nibble. An odd n gets one pad nibble: the quantization of 0.0 with
the last block's scale.

Quantize rules (``rule``):
- ``"cpu"``: bitsandbytes/backends/default/ops.py ``quantize_4bit`` (the CPU backend registers no
  4-bit quantize, so this runs on CPU): see ``blockwise.default_scale`` for the absmax and the scaled
  value s (IEEE reciprocal times x on full blocks, x / absmax on the tail, 1e-38 clamp, NaN propagates),
  then ``q`` = the number of float32 midpoints below s (ties to the lower value, NaN -> 15) and, for
  FP4, ``order[q]``.
- ``"cuda"``: csrc/kernels.cu ``kQuantizeBlockwise``/``kQuantizeBlockwiseSmall`` with ``dQuantizeNF4``/
  ``dQuantizeFP4``: see ``blockwise.cuda_scale`` (``fmaxf`` absmax, flush-to-zero, reciprocal), then
  the strict-``>`` trees on the literal thresholds of ``codes``: NF4 ``q = #{t_k < s}``, NaN -> 0;
  FP4 sign bit 8 if s < 0, magnitude code from ``|s|``, NaN -> 0.
Dequantize: ``out_i = fl32(table[q_i] * absmax[block(i)])``, flushed when ``ftz``; ``block(i)`` is
``i // bs`` (``"flat"``) or, for the AVX-512 kernel of csrc/cpu_ops.cpp ``dequantizeBlockwise4bitCpu``,
``row * (ncols // bs) + col // bs`` (``"rows"``), which differs from the flat index when
``ncols % bs != 0``. The rounding to the output dtype is the caller's (``bnb._to_dtype``).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from qconform.formats.ftz import F32_MIN_NORMAL, flush
from qconform.oracles.bnb.blockwise import F32_MAX, ONE, TINY, cuda_scale, default_scale
from qconform.oracles.bnb.codes import (
    CPU_BOUNDS,
    CPU_ORDER,
    FP4_CUDA_MAGNITUDE_CODES,
    FP4_CUDA_THRESHOLDS,
    NF4_CUDA_THRESHOLDS,
)
from qconform.oracles.bnb.rcp import flush_nb, reciprocal

F32_NAN = np.uint32(0x7FC00000).view(np.float32)


def canonical_nan(a: np.ndarray) -> np.ndarray:
    """Every NaN -> 0x7FC00000 (the payload of a NaN absmax is not part of the contract)."""
    return np.where(np.isnan(a), F32_NAN, a).astype(np.float32)


def pack_nibbles(nib: np.ndarray) -> np.ndarray:
    """Even-length nibbles -> bytes, element 2j in the high nibble."""
    return ((nib[0::2] << 4) | nib[1::2]).astype(np.uint8)


def unpack_nibbles(packed: np.ndarray, n: int) -> np.ndarray:
    """Bytes -> the first ``n`` nibbles, high nibble first."""
    p = np.asarray(packed, np.uint8).reshape(-1)
    return np.stack([p >> 4, p & 0x0F], axis=1).reshape(-1)[:n]


def _cuda_nibbles(t: np.ndarray, quant_type: str) -> np.ndarray:
    if quant_type == "nf4":
        q = np.searchsorted(NF4_CUDA_THRESHOLDS, t, side="left")
        return np.where(np.isnan(t), 0, q).astype(np.uint8)
    a = np.abs(t)
    k = np.where(np.isnan(a), 0, np.searchsorted(FP4_CUDA_THRESHOLDS, a, side="left"))
    return (FP4_CUDA_MAGNITUDE_CODES[k] | np.where(t < 0, 8, 0)).astype(np.uint8)


def quantize_numpy(
    x: np.ndarray, bs: int, quant_type: str, rule: str, ftz: bool = True, rcp_table: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Flat float32 ``x`` -> (packed bytes, float32 absmax per block). The readable spec."""
    n = x.size
    if rule == "cpu":
        s, absmax = default_scale(x, bs)
        if n % 2:
            s = np.append(s, np.float32(0))
        q = np.searchsorted(CPU_BOUNDS[quant_type], s, side="left")
        if quant_type == "fp4":
            q = CPU_ORDER["fp4"][q]
        return pack_nibbles(q.astype(np.uint8)), canonical_nan(absmax)
    t, absmax = cuda_scale(x, bs, ftz, rcp_table)
    nib = _cuda_nibbles(t.reshape(-1)[: n + n % 2], quant_type)
    return pack_nibbles(nib), absmax


def block_index(n: int, bs: int, ncols: int, index: str) -> np.ndarray:
    """The absmax slot of each element: ``"flat"`` i // bs, ``"rows"`` row*(ncols//bs) + col//bs."""
    i = np.arange(n, dtype=np.int64)
    if index == "rows":
        return (i // ncols) * (ncols // bs) + (i % ncols) // bs
    return i // bs


def dequantize_numpy(
    packed: np.ndarray, absmax: np.ndarray, bs: int, table: np.ndarray, n: int, ncols: int, index: str, ftz: bool
) -> np.ndarray:
    """Packed bytes -> float32 ``fl32(table[q] * absmax[block])`` (before the output rounding)."""
    q = unpack_nibbles(packed, n)
    with np.errstate(invalid="ignore", over="ignore"):
        return flush((table[q] * absmax[block_index(n, bs, ncols, index)]).astype(np.float32), ftz)


# ---- numba twin ---------------------------------------------------------------------------------


@njit(cache=True, inline="always")
def _count_below(bounds, s):
    q = 0
    for k in range(bounds.size):
        if bounds[k] < s:
            q += 1
    return q


@njit(cache=True, inline="always")
def _cpu_nibble(s, bounds, order, remap):
    q = bounds.size if s != s else _count_below(bounds, s)
    return order[q] if remap else np.uint8(q)


@njit(cache=True, inline="always")
def _clamp1(v):
    if v < -ONE:
        return -ONE
    if v > ONE:
        return ONE
    return v


@njit(cache=True, parallel=True)
def _quantize_cpu_nb(x, bs, bounds, order, remap, nib, absmax):
    n = x.size
    nb = absmax.size
    for b in prange(nb):
        lo = b * bs
        hi = min(n, lo + bs)
        m = np.float32(0.0)
        nan = False
        for i in range(lo, hi):
            a = abs(x[i])
            if a != a:
                nan = True
            elif a > m:
                m = a
        tail = hi - lo < bs
        if nan:
            absmax[b] = F32_NAN
            m = F32_NAN
        elif tail:
            m = max(m, TINY)
            absmax[b] = m
        else:
            absmax[b] = m
        r = np.float32(ONE / (m if (m != m or m >= TINY) else TINY))
        for i in range(lo, hi):
            s = np.float32(x[i] / m) if tail else np.float32(x[i] * r)
            nib[i] = _cpu_nibble(_clamp1(s), bounds, order, remap)
        if b == nb - 1 and n % 2:
            nib[n] = _cpu_nibble(np.float32(0.0), bounds, order, remap)


@njit(cache=True, parallel=True)
def _absmax_cuda_nb(x, bs, ftz, absmax):
    n = x.size
    for b in prange(absmax.size):
        lo = b * bs
        hi = min(n, lo + bs)
        m = -F32_MAX if hi - lo == bs else np.float32(0.0)
        for i in range(lo, hi):
            a = abs(flush_nb(x[i], ftz))
            if a > m:
                m = a
        absmax[b] = m


@njit(cache=True, inline="always")
def _cuda_nibble(t, nf4, thresholds, magnitude_codes):
    if t != t:
        return np.uint8(0)
    if nf4:
        return np.uint8(_count_below(thresholds, t))
    sign = 8 if t < 0 else 0
    return np.uint8(magnitude_codes[_count_below(thresholds, abs(t))] | sign)


@njit(cache=True, parallel=True)
def _quantize_cuda_nb(x, bs, r, ftz, nf4, thresholds, magnitude_codes, nib):
    n = x.size
    nb = r.size
    for b in prange(nb):
        lo = b * bs
        hi = min(n, lo + bs)
        for i in range(lo, hi):
            t = flush_nb(np.float32(flush_nb(x[i], ftz) * r[b]), ftz)
            nib[i] = _cuda_nibble(t, nf4, thresholds, magnitude_codes)
        if b == nb - 1 and n % 2:
            t = flush_nb(np.float32(np.float32(0.0) * r[b]), ftz)
            nib[n] = _cuda_nibble(t, nf4, thresholds, magnitude_codes)


def quantize_numba(
    x: np.ndarray, bs: int, quant_type: str, rule: str, ftz: bool = True, rcp_table: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The fast twin of ``quantize_numpy`` (same arguments, same bytes)."""
    n = x.size
    nb = -(-n // bs)
    nib = np.empty(n + n % 2, np.uint8)
    absmax = np.empty(nb, np.float32)
    if rule == "cpu":
        _quantize_cpu_nb(x, bs, CPU_BOUNDS[quant_type], CPU_ORDER[quant_type], quant_type == "fp4", nib, absmax)
        return pack_nibbles(nib), absmax
    _absmax_cuda_nb(x, bs, ftz, absmax)
    r = reciprocal(absmax, ftz, rcp_table)
    thresholds = NF4_CUDA_THRESHOLDS if quant_type == "nf4" else FP4_CUDA_THRESHOLDS
    _quantize_cuda_nb(x, bs, r, ftz, quant_type == "nf4", thresholds, FP4_CUDA_MAGNITUDE_CODES, nib)
    return pack_nibbles(nib), absmax


@njit(cache=True, parallel=True)
def _dequantize_nb(packed, absmax, bs, table, n, ncols, rows, ftz, out):
    per_row = ncols // bs
    for j in prange((n + 1) // 2):
        byte = np.int64(packed[j])
        for h in range(2):
            i = 2 * j + h
            if i < n:
                q = (byte >> 4) if h == 0 else (byte & 0x0F)
                blk = (i // ncols) * per_row + (i % ncols) // bs if rows else i // bs
                v = np.float32(table[q] * absmax[blk])
                if ftz and v != 0 and abs(v) < F32_MIN_NORMAL:
                    v = np.float32(np.copysign(np.float32(0.0), v))
                out[i] = v


def dequantize_numba(
    packed: np.ndarray, absmax: np.ndarray, bs: int, table: np.ndarray, n: int, ncols: int, index: str, ftz: bool
) -> np.ndarray:
    """The fast twin of ``dequantize_numpy``."""
    out = np.empty(n, np.float32)
    p = np.ascontiguousarray(packed, np.uint8).reshape(-1)
    _dequantize_nb(p, np.ascontiguousarray(absmax, np.float32), bs, table, n, ncols, index == "rows", ftz, out)
    return out

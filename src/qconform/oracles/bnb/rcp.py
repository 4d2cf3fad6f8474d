"""The block reciprocal ``1.0f / absmax`` of bitsandbytes' CUDA quantize kernels, and flush-to-zero
(docs/bnb-4bit.md 2.1).

Source: csrc/kernels.cu ``kQuantizeBlockwise`` (``smem_absmax_value[0] = 1.0f / local_abs_max``),
built with ``--use_fast_math`` (CMakeLists.txt), which lowers the division to the PTX instruction
``rcp.approx.ftz.f32``. That instruction is not IEEE: over the 2^23 mantissas of [1, 2) it is one
ulp off the correctly rounded 1/m in about 13% of cases (measured on sm_90). It scales exactly by
2^k, so one table of 2^23 int8 differences describes it:

    table[k] = bits(rcp_approx(m_k)) - bits(fl32(1 / m_k)),   m_k = the float32 with bits 0x3F800000 | k.

qconform does not ship that table (it is measured on a GPU: ``python -m qconform.device.bnb.rcp
--out table.npz``). By default the oracle uses the exact IEEE
reciprocal; a caller with a table passes it as ``rcp_table`` (``load_rcp_table`` reads and checks one).
Special values follow the instruction: rcp(+-0) = +-inf, rcp(+-inf) = +-0, NaN -> NaN, a subnormal
input is a zero (ftz) and a subnormal result flushes to a zero of the same sign.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from numba import njit

from qconform.errors import ArgumentError
from qconform.formats.ftz import F32_MIN_NORMAL, flush

RCP_TABLE_SIZE = 1 << 23
RCP_TABLE_SHA256 = "862bea101da795bf5fd46df9dfe5142a79c29edd831e2da30aa84385d885e8fe"  # sm_90, raw int8 bytes
ONE = np.float32(1.0)


def check_rcp_table(table: object) -> np.ndarray | None:
    """``rcp_table`` must be None or an int8 array of 2^23 entries."""
    if table is None:
        return None
    if not isinstance(table, np.ndarray) or table.dtype != np.int8 or table.shape != (RCP_TABLE_SIZE,):
        what = f"{type(table).__name__} {getattr(table, 'dtype', '')} {getattr(table, 'shape', '')}"
        raise ArgumentError(f"rcp_table: must be None or an int8 numpy array of shape ({RCP_TABLE_SIZE},), got {what}")
    return table


def load_rcp_table(path: str | Path, sha256: str | None = RCP_TABLE_SHA256) -> np.ndarray:
    """Read a reciprocal table (raw int8 bytes, ``.npy``, or ``.npz`` with one array) and check its
    sha256 (of the raw int8 bytes) when ``sha256`` is given; the default is the sm_90 table's."""
    path = Path(path)
    if path.suffix == ".npz":
        with np.load(path) as z:
            table = z[z.files[0]]
    elif path.suffix == ".npy":
        table = np.load(path)
    else:
        table = np.fromfile(path, dtype=np.int8)
    table = check_rcp_table(np.ascontiguousarray(table))
    if sha256 is not None and hashlib.sha256(table.tobytes()).hexdigest() != sha256:
        raise ArgumentError(f"rcp_table: {path} does not have sha256 {sha256}")
    return table


def reciprocal(m: np.ndarray, ftz: bool, table: np.ndarray | None = None) -> np.ndarray:
    """``1.0f / m`` in float32: IEEE (``table`` None; flushed when ``ftz``) or ``rcp.approx.ftz.f32``."""
    m = flush(np.asarray(m, np.float32), ftz or table is not None)
    with np.errstate(divide="ignore", over="ignore"):
        exact = (ONE / m).astype(np.float32)
    if table is None:
        return flush(exact, ftz)
    u = m.view(np.uint32)
    mant = u & np.uint32(0x7FFFFF)
    exp = ((u >> np.uint32(23)) & np.uint32(0xFF)).astype(np.int64) - 127
    unit = (np.uint32(0x3F800000) | mant).view(np.float32)
    r1 = ((ONE / unit).astype(np.float32).view(np.uint32).astype(np.int64) + table[mant]).astype(np.uint32)
    r64 = np.ldexp(r1.view(np.float32).astype(np.float64), -exp)  # exact in float64
    r = np.where(np.abs(r64) < float(F32_MIN_NORMAL), 0.0, r64).astype(np.float32)  # a subnormal result flushes
    r = np.copysign(r, m).astype(np.float32)
    finite = np.isfinite(m) & (m != 0)
    return np.where(finite, r, exact).astype(np.float32)


@njit(cache=True, inline="always")
def flush_nb(v: np.float32, ftz: bool) -> np.float32:
    """One value: a subnormal becomes a zero of the same sign when ``ftz``."""
    if ftz and v != 0 and abs(v) < F32_MIN_NORMAL:
        return np.float32(np.copysign(np.float32(0.0), v))
    return v

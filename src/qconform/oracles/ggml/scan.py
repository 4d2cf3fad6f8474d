"""Block scans for the fast paths, on the bit patterns of the values.

The reference scans one element at a time (``if (fabsf(x[j]) > amax) {amax = fabsf(x[j]);
max = x[j];}``, or Q8_0's ``MAX`` macro). With the sign bit cleared, the bit patterns of non-NaN
floats order exactly like their magnitudes, so the largest |x| is an integer max -- a reduction
numba vectorizes, where a float max with the reference's NaN rules stays one compare at a time --
and a pattern above 0x7F800000 means a NaN, for which callers take the reference's own loop.
The first index holding the maximum is then found by a forward search: the first occurrence.
"""

from __future__ import annotations

import numpy as np
from numba import njit

ABS_MASK = np.int32(0x7FFFFFFF)
INF_BITS = np.int32(0x7F800000)
POW2 = np.array([2.0 ** (e - 150) for e in range(256)])  # biased exponent e -> 2^(e-127-23)


@njit(cache=True, inline="always")
def abs_bits_max_nb(xbits, i):
    """The largest sign-cleared bit pattern in ``xbits[i, :]`` (int32 view of float32 rows)."""
    top = np.int32(0)
    for j in range(xbits.shape[1]):  # a run-time trip count: the loop vectorizes as a reduction
        top = max(top, np.int32(xbits[i, j] & ABS_MASK))
    return top


@njit(cache=True, inline="always")
def f32_from_abs_bits_nb(b):
    """The non-negative float32 whose bit pattern is ``b`` (not NaN), exactly, without a view."""
    e = b >> 23
    m = b & 0x7FFFFF
    if e > 0:
        return np.float32(np.float64(m | 0x800000) * POW2[e])
    return np.float32(np.float64(m) * POW2[1])  # subnormal: m * 2^-149


@njit(cache=True, inline="always")
def first_index_of_nb(xbits, i, top):
    """The first j whose sign-cleared pattern is ``top`` (taken from the row): the reference's max."""
    j = 0
    while (xbits[i, j] & ABS_MASK) != top:
        j += 1
    return j

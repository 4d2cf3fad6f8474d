"""Block scans for the fast paths. The reference scans one element at a time
(``if (fabsf(x[j]) > amax) {amax = fabsf(x[j]); max = x[j];}``, or Q8_0's ``MAX`` macro); without
NaN every order gives the same maximum, so it is taken in eight independent lanes, branch-free,
and the first index holding it is then found by a forward search: the reference's first
occurrence. The scan reports whether it saw a NaN, so callers take the reference's own loop where
NaN has further rules (Q8_0's MAX macro, Q8_K's payloads).
"""

from __future__ import annotations

import numpy as np
from numba import njit

LANES = 8


@njit(cache=True, inline="always")
def _gt(a, m):
    return a if a > m else m


@njit(cache=True, inline="always")
def abs_max_nb(x, i, n):
    """(max |x| over ``x[i, :n]``, saw a NaN); n a multiple of 8. Without NaN this is the value
    of any max scan, whatever its order."""
    z = np.float32(0.0)
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = z
    nan = False
    for j in range(0, n, LANES):
        a0, a1, a2, a3 = abs(x[i, j]), abs(x[i, j + 1]), abs(x[i, j + 2]), abs(x[i, j + 3])
        a4, a5, a6, a7 = abs(x[i, j + 4]), abs(x[i, j + 5]), abs(x[i, j + 6]), abs(x[i, j + 7])
        nan |= (a0 != a0) | (a1 != a1) | (a2 != a2) | (a3 != a3) | (a4 != a4) | (a5 != a5) | (a6 != a6) | (a7 != a7)
        m0, m1, m2, m3 = _gt(a0, m0), _gt(a1, m1), _gt(a2, m2), _gt(a3, m3)
        m4, m5, m6, m7 = _gt(a4, m4), _gt(a5, m5), _gt(a6, m6), _gt(a7, m7)
    return _gt(_gt(_gt(m0, m4), _gt(m2, m6)), _gt(_gt(m1, m5), _gt(m3, m7))), nan


@njit(cache=True, inline="always")
def first_index_nb(x, i, amax):
    """The first j with |x[i, j]| == amax (amax taken from the row): the reference's ``max``."""
    j = 0
    while abs(x[i, j]) != amax:
        j += 1
    return j

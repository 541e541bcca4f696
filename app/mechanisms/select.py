"""O(n) order statistics of float arrays, compiled: the ``k``-th smallest by radix
selection and the count and largest value below a threshold.
"""

from __future__ import annotations

import numba
import numpy as np

NEG_INF = -np.inf


#: Radix selection works on 16-bit digits of a double's order-preserving key: 4 passes.
_DIGIT_BITS = 16


_DIGITS = 1 << _DIGIT_BITS


_SIGN = np.uint64(1 << 63)


_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)


@numba.njit(cache=True, nogil=True, inline="always")
def _order_key(bits: np.uint64) -> np.uint64:
    """A double's bits mapped so that unsigned order is numeric order (no NaNs)."""
    if bits & _SIGN:
        return bits ^ _ALL
    return bits | _SIGN


@numba.njit(cache=True, nogil=True)
def kth_smallest(x: np.ndarray, k: int) -> float:
    """The ``k``-th smallest (0-based) of the doubles ``x`` (no NaNs; ``0 <= k < x.size``).

    Radix selection on the order-preserving 64-bit keys of the values, 16 bits per pass:
    at most 4 passes, each over the candidates the previous one kept, so O(n) in the worst
    case whatever the order of ``x`` and however many values are tied. The same value as
    ``np.partition(x, k)[k]``, whose introselect took 8x longer on some orders of heavily
    tied data (the log widths of grid histograms: most gaps are one grid step) than on
    others of the same distribution. (-0.0 counts as smaller than 0.0.)
    """
    keys = x.view(np.uint64)
    n = keys.size
    counts = np.zeros(_DIGITS, dtype=np.int64)
    top = np.uint64(64 - _DIGIT_BITS)
    for i in range(n):
        counts[_order_key(keys[i]) >> top] += 1
    digit = 0
    while k >= counts[digit]:
        k -= counts[digit]
        digit += 1
    key = np.uint64(digit) << top  # the answer's digits found so far
    m = counts[digit]
    buf = np.empty(m, dtype=np.uint64)  # the candidates: keys whose digits so far match
    kept = 0
    for i in range(n):
        u = _order_key(keys[i])
        if u >> top == digit:
            buf[kept] = u
            kept += 1
    shift = 64 - 2 * _DIGIT_BITS
    while True:
        counts[:] = 0
        for i in range(m):
            counts[(buf[i] >> np.uint64(shift)) & np.uint64(_DIGITS - 1)] += 1
        digit = 0
        while k >= counts[digit]:
            k -= counts[digit]
            digit += 1
        key |= np.uint64(digit) << np.uint64(shift)
        if shift == 0:
            break
        if counts[digit] < m:  # drop the candidates with another digit
            kept = 0
            for i in range(m):
                if (buf[i] >> np.uint64(shift)) & np.uint64(_DIGITS - 1) == digit:
                    buf[kept] = buf[i]
                    kept += 1
            m = kept
        shift -= _DIGIT_BITS
    bits = key ^ _SIGN if key & _SIGN else key ^ _ALL
    out = np.empty(1, dtype=np.uint64)
    out[0] = bits
    return float(out.view(np.float64)[0])


@numba.njit(cache=True, nogil=True)
def max_below(x: np.ndarray, v: float) -> tuple[int, float]:
    """How many of ``x`` are below ``v``, and the largest of them (-inf if none)."""
    count = 0
    best = NEG_INF
    for i in range(x.size):
        if x[i] < v:
            count += 1
            if x[i] > best:
                best = x[i]
    return count, best

"""What one pass of a tilted forward pass's certificate may have dropped, row by row
(:class:`Spans`), and the sources of an error pass's row 1 (:func:`first_sources`):
:mod:`~app.mechanisms.jointexp.certificate` reads both."""

from __future__ import annotations

import math

import numba
import numpy as np


class Spans:
    """Per row j = 1..m of one pass (the forward rows or an error pass): the first index
    where it may have dropped something (left of it, the exact transition of what the row
    before holds is 0.0), one past its last non-zero entry, the log of its maximum and its
    truncation floor, on the pass's common scale; and, for an error pass, the envelope of
    the sources it was given past position ``src_star`` (``e^{src_env - (c + mu) P}``, which
    it may have left out where they are below its floor; -inf for the rows)."""

    def __init__(self, m: int) -> None:
        self.lo = np.zeros(m + 1, dtype=np.int64)
        self.hi = np.zeros(m + 1, dtype=np.int64)
        self.g = np.full(m + 1, -math.inf)
        self.t = np.full(m + 1, -math.inf)
        self.src_env = np.full(m + 1, -math.inf)
        self.src_star = np.full(m + 1, -math.inf)

    def record(self, j: int, lo: int, hi: int, g: float, t: float) -> None:
        self.lo[j], self.hi[j], self.g[j], self.t[j] = lo, hi, g, t


@numba.njit(cache=True, nogil=True)
def first_sources(
    logw: np.ndarray,
    P: np.ndarray,
    n_1: float,
    c: float,
    mu: float,
    g0: float,
    cap: float,
    window: float = 760.0,
) -> tuple[np.ndarray, int]:
    """``min(log closed form of row 1, cap)`` (on the common scale: less ``g0``) over the
    intervals where it is within ``window`` e-folds of its largest value (the rest would be
    flushed by a linear error pass, which then drops it; the pass in logs takes every
    interval: ``window`` inf), and the first of those intervals."""
    n = logw.size
    vals = np.empty(n)
    top = -np.inf
    for i in range(n):
        x = P[i] - n_1
        v = min(logw[i] - c * abs(x) - mu * x - g0, cap)
        vals[i] = v
        top = max(top, v)
    a = 0
    while a < n and not (vals[a] >= top - window):
        a += 1
    b = n
    while b > a and not (vals[b - 1] >= top - window):
        b -= 1
    return vals[a:b].copy(), a

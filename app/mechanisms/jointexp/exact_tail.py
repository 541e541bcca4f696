"""The certificate's last error pass, in logs: nothing dropped, so no max-norm remainder.

A linear error pass (:func:`~app.mechanisms.jointexp.certificate.error_row`) drops what
lies ~708 e-folds below its own rows and leaves it to the next pass, and what the last one
drops is charged by the position-aware max-norm bound of
:mod:`~app.mechanisms.jointexp.error_bound`. That bound cannot see where the error rows'
mass lies: at large ε on heavy atoms the last draw's kernel is 10⁴ e-folds and more below
the rows wherever they hold their mass, and the bound, which lets every dropped entry sit
where that kernel is largest, stays thousands of e-folds above the target whatever the
number of linear passes (docs/mechanisms.md, "Where it does not certify").

This pass computes the same recursion, ``E_1 = s_1``, ``E_j = Ā'_j E_{j-1} + s_j``, on the
same sources (:class:`~app.mechanisms.jointexp.certificate.Level` documents them), with
every entry held as its logarithm over every interval from the first one a source or a
transition reaches to the last: an entry 10⁵ e-folds below the row's largest is kept like
any other, so the pass drops nothing and its result ``b^T E_m`` is the whole bound on what
its source pass dropped. ``Ā'_j`` is the majorant transition
(:func:`~app.mechanisms.jointexp.kernels_linear.transition_majorant`: the tilted kernel
summed over *every* entry of the previous row, also those at or right of the target, plus
the repeat term ``w_i e^{-(c - mu) n_j} / 2`` at the same interval), entry-wise at least the
exact transition, so the bound stays an upper bound; without a window it is two decaying
scans, one from each end, each a running ``log(e^a + e^b)``.

Rounding: every operation on a log value ``x`` (a sum with a product of a rate and a
distance, or a ``log(e^a + e^b)``) errs by at most ``2u(|x| + 4)`` in the log, and the
scans are 1-Lipschitz in their inputs, so an entry of row j carries at most the error of
row j - 1 plus ``2u(|x|_max + 4)`` per operation of its row (at most ``3 (d + 1) + 8``).
:func:`log_error_row` returns the largest magnitude it met; the pass adds the sum over its
rows to its result (:attr:`LogLevel.rounding`).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from app.mechanisms.jointexp.error_bound import _lae_nb as _lae

_U = 2.0**-52


@numba.njit(cache=True, nogil=True, inline="always")
def _mag(x: float) -> float:
    """|x| where finite, else 0 (an -inf entry is exact)."""
    return abs(x) if abs(x) < np.inf else 0.0


@numba.njit(cache=True, nogil=True)
def log_error_row(
    le_prev: np.ndarray,
    lo_prev: int,
    t_src: float,
    src_lo: int,
    env: float,
    p_star: float,
    lw: np.ndarray,
    P: np.ndarray,
    nj: float,
    c: float,
    mu: float,
) -> tuple[np.ndarray, int, float]:
    """Row j of the pass in logs: ``log E_j`` from ``log E_{j-1}`` (``le_prev``, intervals
    from ``lo_prev`` on, absolute logs on the pass's common scale), plus the sources
    ``e^{t_src}`` up to position ``p_star`` and ``min(e^{t_src}, e^{env - (c + mu) P_i})``
    past it, from interval ``src_lo`` on. ``lw``: log widths (normalised, -inf for a zero
    width). Returns the row over intervals ``base .. d`` (``base`` the smaller of the two
    starts; -inf where nothing reaches), ``base``, and the largest magnitude of a log value
    it formed (for the rounding bound)."""
    n1 = lw.size
    n_t = le_prev.size
    rf = c + mu  # the kernel's rate where the target is past the source: x > 0
    rn = c - mu  # and where it is not (x <= 0; the majorant's part)
    base = min(lo_prev, src_lo)
    out = np.full(n1 - base, -np.inf)
    big = 0.0
    if n_t > 0:
        # far part (into ``out``, read back by the near part's scan): sources u with
        # P_u < P_v - n_j, weight e^{-(c + mu)(P_v - n_j - P_u)}
        acc = -np.inf
        pref = 0.0
        k = 0
        for v in range(lo_prev, n1):
            pv = float(P[v]) - nj
            while k < n_t and float(P[lo_prev + k]) < pv:
                pu = float(P[lo_prev + k])
                x = le_prev[k]
                if x > -np.inf:
                    acc = x if acc == -np.inf else _lae(acc - rf * (pu - pref), x)
                    pref = pu
                    big = max(big, _mag(acc), _mag(x))
                k += 1
            if acc > -np.inf:
                out[v - base] = acc - rf * (pv - pref)
        # near part: every stored u with P_u >= P_v - n_j (also u >= v: the majorant),
        # weight e^{-(c - mu)(P_u - (P_v - n_j))}, a suffix scan
        acc = -np.inf
        pref = 0.0
        k = n_t - 1
        stay = math.log(0.5) - rn * nj
        for v in range(n1 - 1, lo_prev - 1, -1):
            pv = float(P[v]) - nj
            while k >= 0 and float(P[lo_prev + k]) >= pv:
                pu = float(P[lo_prev + k])
                x = le_prev[k]
                if x > -np.inf:
                    acc = x if acc == -np.inf else _lae(acc - rn * (pref - pu), x)
                    pref = pu
                    big = max(big, _mag(acc))
                k -= 1
            near = acc - rn * (pref - pv) if acc > -np.inf else -np.inf
            lwv = lw[v]
            far = out[v - base]
            if lwv == -np.inf:
                out[v - base] = -np.inf
                continue
            s = _lae(far, near)
            if v < lo_prev + n_t and le_prev[v - lo_prev] > -np.inf:
                s = _lae(s, stay + le_prev[v - lo_prev])
            out[v - base] = lwv + s
            big = max(big, _mag(out[v - base]), _mag(far), abs(pv) * max(rf, rn))
    rate = c + mu
    for i in range(src_lo, n1):
        if lw[i] == -np.inf:  # a zero width: every row's entry is exactly 0, none dropped
            continue
        p = float(P[i])
        ls = t_src if p <= p_star else min(t_src, env - rate * p)
        big = max(big, _mag(ls), _mag(env), rate * abs(p))
        out[i - base] = _lae(out[i - base], ls)
    return out, base, big


@numba.njit(cache=True, nogil=True)
def log_result(
    le: np.ndarray, lo: int, P: np.ndarray, t: float, c: float, mu: float
) -> tuple[float, float]:
    """``log b^T E_m``: the row through the last draw's kernel ``e^{-c|x| - mu x}``,
    ``x = t - P_i`` (``t = n - n_{m+1}``), and the largest magnitude met."""
    top = -np.inf
    vals = np.empty(le.size)
    big = 0.0
    for v in range(le.size):
        x = t - float(P[lo + v])
        y = le[v] - c * abs(x) - mu * x if le[v] > -np.inf else -np.inf
        vals[v] = y
        if y > -np.inf:
            top = max(top, y)
            big = max(big, _mag(y), _mag(le[v]), (c + abs(mu)) * abs(x))
    if top == -np.inf:
        return top, big
    s = 0.0
    for v in range(le.size):
        if vals[v] > -np.inf:
            s += math.exp(vals[v] - top)
    return top + math.log(s), big


def rounding(big: float, ops: int) -> float:
    """The log error ``ops`` operations on values of magnitude at most ``big`` can make."""
    return 2.0 * _U * (big + 4.0) * ops

"""Smooth: smooth-sensitivity Laplace mechanism (Nissim, Raskhodnikova & Smith 2007; paper 5.1.2).

Per quantile ``q`` the released statistic is the order statistic ``x_{j*}`` of the sorted,
clamped data with ``j* = max(1, ceil(q n))`` (the smallest ``x`` with empirical CDF ``>= q``;
for odd n and q = 1/2 the usual median ``x_{(n+1)/2}``). With ``x_i = a`` for ``i < 1`` and
``x_i = b`` for ``i > n`` (paper Lemma 13, NRS Prop. 3.4) its t-smooth sensitivity is

    S^t(X) = max_{k=0..n} e^{-t k} max_{l=0..k+1} (x_{j*+l} - x_{j*+l-k-1}).

Writing ``u = j* + l`` and ``v = u - k - 1`` this is the maximum, over ``0 <= v <= j* <= u <=
n + 1``, of ``(x_u - x_v) e^{-t (u - v - 1)}`` — exactly a maximum over pairs of entries of the
``edges`` array ``[a, x_1, ..., x_n, b]`` (indices below 0 / above n + 1 repeat a / b at a larger
distance, so they never win). For fixed ``v`` let ``u*(v)`` be the largest maximiser of
``(x_u - x_v) e^{-t u}``. The map is log-supermodular in (v, u), so ``u*`` is nondecreasing
in ``v``; NRS's divide and conquer computes ``u*`` at the middle ``v`` by a scan and recurses on
the two halves with the ``u`` range split at ``u*``. Every level of the recursion scans
O(n) candidates in total, so the computation is O(n log n) (O(n) space, explicit stack).
Pairs farther apart than ``K = ln((b - a) / L) / t``, with ``L`` a value attained by some pair,
cannot reach the maximum and are skipped exactly, so the work is O(K log K) for K <= n.

Guarantee (paper Lemma 14 = NRS Lemmas 2.6, 2.9): releasing
``x_{j*} + S^t(X) Z / (eps' / 2)`` with ``Z ~ Lap(1)`` and ``t = eps' / (2 ln(2 / delta'))`` is
(eps', delta')-DP. Each of the m quantiles gets (epsilon/m, delta/m), so the release is
(epsilon, delta)-DP by basic composition. Outputs are clamped to [lower, upper] and sorted
(post-processing).

Neighbours: the NRS analysis (and Lemma 13's formula) is for swap neighbours on datasets of a
fixed size n. Under add/remove the statistic's index ``ceil(q n)`` moves with n and Lemma 13 is
not a smooth upper bound on the add/remove local sensitivity, so ``neighbors="add_remove"`` is
refused with :class:`MechanismInputError` rather than released with an unproven guarantee.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numba
import numpy as np
from numpy.typing import ArrayLike

from app.mechanisms.base import (
    FloatArray,
    Mechanism,
    MechanismInputError,
    Prepared,
    PrivacyNotion,
    check_delta,
    make_rng,
    prepare,
)


def quantile_index(q: float, n: int) -> int:
    """1-based index ``j* = max(1, ceil(q n))``, computed exactly in rational arithmetic.

    ``q`` is read as the shortest decimal that round-trips to the float (``repr``), so
    ``q = 0.1, n = 1000`` gives 100, not 101 (0.1 is stored as 0.1000000000000000055...).
    Depends only on public q and n.
    """
    return min(n, max(1, math.ceil(Fraction(repr(float(q))) * n)))


@numba.njit(cache=True, nogil=True)
def _log_lower_bound(edges: FloatArray, j: int, t: float) -> float:  # pragma: no cover
    """log of a value attained by some admissible pair, hence a lower bound on log S^t.

    Evaluates one pair per distance k in {0, 1, 2, 4, ..., n} (centred on j where possible)
    and the whole-range pair (a, b) at k = n. O(log n).
    """
    last = edges.size - 1  # n + 1
    n = last - 1
    best = math.log(edges[last] - edges[0]) - t * n
    k = 0
    while k <= n:
        u = j + (k + 1) // 2
        v = u - k - 1
        if v < 0:
            v, u = 0, k + 1
        if u > last:
            u, v = last, last - k - 1
        if 0 <= v <= j <= u <= last:
            d = edges[u] - edges[v]
            if d > 0.0:
                val = math.log(d) - t * k
                if val > best:
                    best = val
        k = 1 if k == 0 else 2 * k
    return best


@numba.njit(cache=True, nogil=True)
def _log_smooth_sensitivity(edges: FloatArray, j: int, t: float) -> float:  # pragma: no cover
    """log max_{0<=v<=j<=u<=n+1} (edges[u] - edges[v]) e^{-t (u - v - 1)}, O(n log n).

    Exact pruning: with ``L`` a value attained by some pair (:func:`_log_lower_bound`), any
    pair with ``u - v - 1 > K = (log(b - a) - log L) / t`` is worth at most
    ``(b - a) e^{-t (K + 1)} < L`` and is skipped, so v runs over ``[j - K - 1, j]`` and u over
    ``[j, j + K + 1]`` only.

    Divide and conquer over v with an explicit stack of (v_lo, v_hi, u_lo, u_hi): all v in
    [v_lo, v_hi] have a maximiser u*(v) in [u_lo, u_hi] (monotonicity of the largest maximiser
    of the log-supermodular ``(x_u - x_v) e^{-t u}``). For fixed v the scan maximises
    ``(x_u - x_v) E[u - j]`` with ``E[d] = e^{-t d}`` tabulated once (no log per pair); when
    ``E`` could underflow inside the window (``log((b - a) / L) > 600``) the scan is done in
    log space instead.
    """
    last = edges.size - 1  # = n + 1
    log_range = math.log(edges[last] - edges[0])
    log_low = _log_lower_bound(edges, j, t)
    span = (log_range - log_low) / t
    kmax = last if span >= last else int(span) + 1
    v_first = j - kmax - 1 if j - kmax - 1 > 0 else 0
    u_final = j + kmax + 1 if j + kmax + 1 < last else last
    linear = log_range - log_low + t <= 600.0
    table = np.empty(u_final - j + 1 if linear else 1, dtype=np.float64)
    if linear:
        for d in range(u_final - j + 1):
            table[d] = math.exp(-t * d)
    best = log_low
    stack = np.empty((64, 4), dtype=np.int64)
    stack[0, 0] = v_first
    stack[0, 1] = j
    stack[0, 2] = j
    stack[0, 3] = u_final
    top = 1
    while top > 0:
        top -= 1
        v_lo = stack[top, 0]
        v_hi = stack[top, 1]
        u_lo = stack[top, 2]
        u_hi = stack[top, 3]
        v = (v_lo + v_hi) // 2
        xv = edges[v]
        arg = u_hi
        if linear:
            val = 0.0
            for u in range(u_lo, u_hi + 1):
                s = (edges[u] - xv) * table[u - j]
                if s >= val and s > 0.0:  # ">=": keep the largest maximiser
                    val = s
                    arg = u
            if val > 0.0:
                # (x_u - x_v) e^{-t(u - v - 1)} = (x_u - x_v) E[u - j] e^{-t (j - v - 1)}
                cand = math.log(val) - t * (j - v - 1)
                if cand > best:
                    best = cand
        else:
            lval = -np.inf
            for u in range(u_lo, u_hi + 1):
                d = edges[u] - xv
                if d > 0.0:
                    s = math.log(d) - t * u
                    if s >= lval:
                        lval = s
                        arg = u
            if lval > -np.inf:
                cand = lval + t * (v + 1)
                if cand > best:
                    best = cand
        # Left half keeps u in [u_lo, arg]; right half u in [arg, u_hi]. Depth <= log2(n) + 2.
        if v_lo <= v - 1:
            stack[top, 0] = v_lo
            stack[top, 1] = v - 1
            stack[top, 2] = u_lo
            stack[top, 3] = arg
            top += 1
        if v + 1 <= v_hi:
            stack[top, 0] = v + 1
            stack[top, 1] = v_hi
            stack[top, 2] = arg
            stack[top, 3] = u_hi
            top += 1
    return best


def smooth_sensitivity(edges: FloatArray, j: int, t: float) -> float:
    """t-smooth sensitivity (paper Lemma 13) of the order statistic ``x_j`` (1-based ``j``).

    ``edges`` is ``[a, x_1, ..., x_n, b]`` with x sorted and clamped to [a, b], ``a < b``.
    O(n log n) worst case, O(K log K) with the exact pruning window K (see
    :func:`_log_smooth_sensitivity`).
    """
    n = edges.size - 2
    if not 1 <= j <= n:
        raise ValueError("j must lie in [1, n]")
    if not t > 0.0:
        raise ValueError("t must be > 0")
    if not edges[-1] > edges[0]:
        raise ValueError("the bounds must satisfy a < b")
    return math.exp(float(_log_smooth_sensitivity(edges, int(j), float(t))))


def reject_add_remove(prep: Prepared, method: str) -> None:
    if prep.neighbors != "swap":
        raise MechanismInputError(
            "neighbors",
            f"method {method!r} supports only 'swap': its smooth-sensitivity analysis is for "
            "datasets of a fixed size",
        )


def smooth(
    data: ArrayLike,
    quantiles: ArrayLike,
    *,
    epsilon: float,
    lower: float,
    upper: float,
    neighbors: str = "swap",
    rng: np.random.Generator | None = None,
    delta: float | None = None,
) -> FloatArray:
    """Smooth: per quantile, the order statistic plus Laplace noise scaled to smooth sensitivity.

    Per quantile ``eps' = epsilon / m``, ``delta' = delta / m``, ``t = eps' / (2 ln(2/delta'))``
    and the release is ``x_{j*} + S^t(X) * Z / (eps' / 2)``, ``Z ~ Lap(1)``; clamped to
    [lower, upper], sorted.

    Guarantee: (epsilon, delta)-DP under swap neighbours (NRS Lemmas 2.6/2.9 and basic
    composition). ``neighbors="add_remove"`` is refused.

    Complexity: O(n log n) for the sort plus O(n log n) per quantile: O(m n log n) time, O(n)
    memory.

    Raises:
        MechanismInputError: for invalid input, a delta outside (0, 1), or add/remove neighbours.
    """
    d = check_delta(delta)
    prep = prepare(data, quantiles, epsilon=epsilon, lower=lower, upper=upper, neighbors=neighbors)
    reject_add_remove(prep, "smooth")
    gen = make_rng(rng)
    m = int(prep.quantiles.size)
    n = prep.n
    eps_q = prep.epsilon / m
    delta_q = d / m
    t = eps_q / (2.0 * math.log(2.0 / delta_q))
    out = np.empty(m, dtype=np.float64)
    for k, q in enumerate(prep.quantiles):
        j = quantile_index(float(q), n)
        s = smooth_sensitivity(prep.edges, j, t)
        out[k] = prep.edges[j] + s * gen.laplace() / (eps_q / 2.0)
    np.clip(out, prep.lower, prep.upper, out=out)
    out.sort()
    return out


SMOOTH = Mechanism(
    name="smooth",
    fn=smooth,
    notion=PrivacyNotion.APPROX_DP,
    summary="Smooth-sensitivity Laplace mechanism (Nissim-Raskhodnikova-Smith), swap only.",
    requires_delta=True,
    method_params=("delta",),
    neighbors=("swap",),
)

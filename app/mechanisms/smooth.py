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
On (distinct values, counts) only run boundaries can maximise (the first rank of each value
for u, the last for v), so the same divide and conquer runs over O(d) candidates: O(d log d).
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

from app.mechanisms.errors import MechanismInputError
from app.mechanisms.histogram import Support, support_from_values
from app.mechanisms.registry import Mechanism, PrivacyNotion
from app.mechanisms.rng import make_rng
from app.mechanisms.validation import FloatArray, IntArray, check_delta


def quantile_index(q: float, n: int) -> int:
    """1-based index ``j* = max(1, ceil(q n))``, computed exactly in rational arithmetic.

    ``q`` is read as the shortest decimal that round-trips to the float (``repr``), so
    ``q = 0.1, n = 1000`` gives 100, not 101 (0.1 is stored as 0.1000000000000000055...).
    Depends only on public q and n.
    """
    return min(n, max(1, math.ceil(Fraction(repr(float(q))) * n)))


@numba.njit(cache=True, nogil=True)
def _rank_value(edges: FloatArray, cum: IntArray, r: int) -> float:  # pragma: no cover
    """x_r for 0 <= r <= n + 1 (x_0 = a, x_{n+1} = b) from the cumulative counts."""
    n = cum[cum.size - 1]
    if r <= 0:
        return float(edges[0])
    if r > n:
        return float(edges[edges.size - 1])
    return float(edges[np.searchsorted(cum, r, side="left")])


@numba.njit(cache=True, nogil=True)
def _log_smooth_sensitivity(  # pragma: no cover - compiled
    edges: FloatArray, cum: IntArray, j: int, t: float
) -> float:
    """log max_{0<=v<=j<=u<=n+1} (x_u - x_v) e^{-t (u - v - 1)} on (distinct values, counts).

    Candidates: x_u is constant on the ranks of one distinct value, so for u >= j only the
    smallest rank of each value run (and j itself, and n + 1) can maximise, and for v <= j
    only the largest rank of each run (and j, and 0). Exact pruning as for dense data: with
    ``L`` a value attained by some pair (one pair per distance 0, 1, 2, 4, ..., n), pairs with
    ``u - v - 1 > K = (log(b - a) - log L) / t`` cannot win, so only candidates with ranks in
    ``[j - K - 1, j + K + 1]`` are scanned. Divide and conquer over the v candidates with the
    u range split at the largest maximiser (monotone: ``(x_u - x_v) e^{-t u}`` is
    log-supermodular, also on the candidate sub-chains). O((d + 1) log d) at worst.
    """
    d = edges.size - 2
    n = int(cum[d])
    last = n + 1
    tj = int(np.searchsorted(cum, j, side="left"))  # run of rank j: cum[tj - 1] < j <= cum[tj]
    # lower bound
    log_range = math.log(edges[d + 1] - edges[0])
    best = log_range - t * n
    k = 0
    while k <= n:
        u = j + (k + 1) // 2
        v = u - k - 1
        if v < 0:
            v, u = 0, k + 1
        if u > last:
            u, v = last, last - k - 1
        if 0 <= v <= j <= u <= last:
            diff = _rank_value(edges, cum, u) - _rank_value(edges, cum, v)
            if diff > 0.0:
                val = math.log(diff) - t * k
                if val > best:
                    best = val
        k = 1 if k == 0 else 2 * k
    span = (log_range - best) / t
    kmax = last if span >= last else int(span) + 1
    v_first = j - kmax - 1 if j - kmax - 1 > 0 else 0
    u_final = j + kmax + 1 if j + kmax + 1 < last else last
    # v candidates (ranks ascending): 0, the last rank of each run ending below j, j
    nv_max = tj + 2
    RV = np.empty(nv_max, dtype=np.int64)
    XV = np.empty(nv_max, dtype=np.float64)
    nv = 0
    if v_first == 0:
        RV[nv] = 0
        XV[nv] = edges[0]
        nv += 1
    t_lo = int(np.searchsorted(cum, v_first, side="left"))  # first run with cum[t] >= v_first
    for tt in range(max(t_lo, 1), tj):
        if cum[tt] < j and cum[tt] >= v_first and cum[tt] > 0:
            RV[nv] = cum[tt]
            XV[nv] = edges[tt]
            nv += 1
    RV[nv] = j
    XV[nv] = edges[tj]
    nv += 1
    # u candidates: j, the first rank of each run starting above j, n + 1
    RU = np.empty(d - tj + 2, dtype=np.int64)
    XU = np.empty(d - tj + 2, dtype=np.float64)
    nu = 0
    RU[nu] = j
    XU[nu] = edges[tj]
    nu += 1
    for tt in range(tj + 1, d + 1):
        r = cum[tt - 1] + 1
        if r > u_final:
            break
        RU[nu] = r
        XU[nu] = edges[tt]
        nu += 1
    if u_final == last:
        RU[nu] = last
        XU[nu] = edges[d + 1]
        nu += 1
    stack = np.empty((64, 4), dtype=np.int64)
    stack[0, 0] = 0
    stack[0, 1] = nv - 1
    stack[0, 2] = 0
    stack[0, 3] = nu - 1
    top = 1
    while top > 0:
        top -= 1
        v_lo = stack[top, 0]
        v_hi = stack[top, 1]
        u_lo = stack[top, 2]
        u_hi = stack[top, 3]
        vi = (v_lo + v_hi) // 2
        xv = XV[vi]
        arg = u_hi
        lval = -np.inf
        for ui in range(u_lo, u_hi + 1):
            diff = XU[ui] - xv
            if diff > 0.0:
                s = math.log(diff) - t * RU[ui]
                if s >= lval:  # ">=": keep the largest maximiser
                    lval = s
                    arg = ui
        if lval > -np.inf:
            cand = lval + t * (RV[vi] + 1)
            if cand > best:
                best = float(cand)
        if v_lo <= vi - 1:
            stack[top, 0] = v_lo
            stack[top, 1] = vi - 1
            stack[top, 2] = u_lo
            stack[top, 3] = arg
            top += 1
        if vi + 1 <= v_hi:
            stack[top, 0] = vi + 1
            stack[top, 1] = v_hi
            stack[top, 2] = arg
            stack[top, 3] = u_hi
            top += 1
    return float(best)


def support_of_dense(edges: FloatArray) -> tuple[FloatArray, IntArray]:
    """(distinct edges, cumulative counts) of dense edges ``[a, x_1 <= ... <= x_n, b]``."""
    x = edges[1:-1]
    ends = np.flatnonzero(x[1:] != x[:-1]) + 1
    out_edges = np.concatenate(([edges[0]], x[:1], x[ends], [edges[-1]]))
    cum = np.concatenate(([0], ends, [x.size])).astype(np.int64)
    return out_edges, cum


def smooth_sensitivity(
    edges: FloatArray, j: int, t: float, *, cum: IntArray | None = None
) -> float:
    """t-smooth sensitivity (paper Lemma 13) of the order statistic ``x_j`` (1-based ``j``).

    With ``cum=None``, ``edges`` is the dense ``[a, x_1, ..., x_n, b]`` (x sorted, clamped to
    [a, b], ``a < b``); otherwise ``edges = [a, v_1, ..., v_d, b]`` are the distinct values and
    ``cum`` their cumulative counts (a :class:`Support`). O(d log d) worst case, less with the
    exact pruning window (see :func:`_log_smooth_sensitivity`).
    """
    if cum is None:
        edges, cum = support_of_dense(np.asarray(edges, dtype=np.float64))
    n = int(cum[-1])
    if not 1 <= j <= n:
        raise ValueError("j must lie in [1, n]")
    if not t > 0.0:
        raise ValueError("t must be > 0")
    if not edges[-1] > edges[0]:
        raise ValueError("the bounds must satisfy a < b")
    return math.exp(float(_log_smooth_sensitivity(edges, cum, int(j), float(t))))


def reject_add_remove(sup: Support, method: str) -> None:
    if sup.neighbors != "swap":
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
    check_delta(delta)
    sup = support_from_values(
        data, quantiles, epsilon=epsilon, lower=lower, upper=upper, neighbors=neighbors
    )
    return np.asarray(smooth_core(sup, make_rng(rng), delta=delta), dtype=np.float64)


def smooth_core(
    sup: Support, rng: np.random.Generator, *, delta: float | None = None
) -> FloatArray:
    """Smooth on a prepared support (order statistics from cumulative counts).

    On a grid support the statistic and the noise are in grid units; the registry rounds
    the noisy value to the nearest grid index (post-processing).
    """
    d = check_delta(delta)
    reject_add_remove(sup, "smooth")
    m = int(sup.quantiles.size)
    n = sup.n
    eps_q = sup.epsilon / m
    delta_q = d / m
    t = eps_q / (2.0 * math.log(2.0 / delta_q))
    out = np.empty(m, dtype=np.float64)
    for k, q in enumerate(sup.quantiles):
        j = quantile_index(float(q), n)
        s = smooth_sensitivity(sup.edges, j, t, cum=sup.cum)
        out[k] = sup.value_of_rank(j) + s * rng.laplace() / (eps_q / 2.0)
    np.clip(out, sup.lower, sup.upper, out=out)
    out.sort()
    return out


SMOOTH = Mechanism(
    name="smooth",
    fn=smooth,
    core=smooth_core,
    notion=PrivacyNotion.APPROX_DP,
    summary="Smooth-sensitivity Laplace mechanism (Nissim-Raskhodnikova-Smith), swap only.",
    requires_delta=True,
    method_params=("delta",),
    neighbors=("swap",),
)

"""AppIndExp: IndExp with the Dong–Durfee–Rogers bounded-range composition (paper Sec. 5.1.1).

Each of the m quantiles is estimated by the single-quantile exponential mechanism with the same
per-quantile parameter ``eps0`` (utility ``-|#{x <= o} - q n|``, ``c = eps0 / (2 Delta)``,
``Delta = 1`` under swap and ``max(q, 1 - q)`` under add/remove — exactly IndExp's
calibration). An exponential mechanism calibrated this way is ``eps0``-bounded-range
(its log-density ratio between neighbours ranges over an interval of width ``<= 2 c Delta =
eps0``) under either neighbour relation, so the non-adaptive composition theorem of
Dong, Durfee & Rogers (ICML 2020, Thm. 3; paper Lemma 12) applies:

    t*_l  = clip((eps_g + (l + 1) eps0) / (m + 1), 0, eps0),   l = 0..m
    p_t   = (e^{-t} - e^{-eps0}) / (1 - e^{-eps0})
    delta(eps_g) = max_l  sum_{i=0}^{m} C(m, i) p^{m-i} (1 - p)^i (e^{m t - i eps0} - e^{eps_g})_+

The composition is (eps_g, delta(eps_g))-DP. :func:`per_quantile_epsilon` returns the largest
``eps0`` (to within 1e-4, rounded down) whose ``delta`` at ``eps_g = epsilon`` is at most the
requested delta. ``delta(eps0)`` is nondecreasing in ``eps0`` (the class of eps0-BR mechanisms
grows with eps0 and the DDR bound is the exact worst case over it), so bisection is valid.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import gammaln, logsumexp

from app.mechanisms.errors import MechanismInputError
from app.mechanisms.histogram import Support, support_from_values
from app.mechanisms.indexp import independent_exponential
from app.mechanisms.registry import Mechanism, PrivacyNotion
from app.mechanisms.rng import make_rng
from app.mechanisms.validation import FloatArray, IntArray, check_delta, check_epsilon

#: Width of the final bisection bracket on the per-quantile epsilon.
EPS_TOLERANCE = 1e-6


def _log_binomials(m: int) -> FloatArray:
    i = np.arange(m + 1, dtype=np.float64)
    out: FloatArray = gammaln(m + 1.0) - gammaln(i + 1.0) - gammaln(m - i + 1.0)
    return out


def ddr_log_delta_at(eps_g: float, eps0: float, m: int, t: float) -> float:
    """log of the DDR sum for one ``t`` in [0, eps0] (``-inf`` when the sum is zero).

    All terms are formed in log space: log-binomials by ``gammaln``, ``log p_t`` and
    ``log(1 - p_t)`` with ``expm1`` (no cancellation near t = 0 or t = eps0), and
    ``log(e^{L} - e^{eps_g}) = L + log(-expm1(eps_g - L))`` for privacy loss ``L > eps_g``.
    """
    i = np.arange(m + 1, dtype=np.float64)
    loss = m * t - i * eps0  # privacy loss when i of the m mechanisms take their low value
    keep = loss > eps_g
    if not np.any(keep):
        return -math.inf
    log_norm = math.log(-math.expm1(-eps0))
    # p_t = (e^{-t} - e^{-eps0}) / (1 - e^{-eps0});  1 - p_t = (1 - e^{-t}) / (1 - e^{-eps0})
    log_p = -t + math.log(-math.expm1(t - eps0)) - log_norm if t < eps0 else -math.inf
    log_q = math.log(-math.expm1(-t)) - log_norm if t > 0.0 else -math.inf
    ik = i[keep]
    lk = loss[keep]
    with np.errstate(invalid="ignore"):
        # 0 * log(0) is 0: a zero exponent contributes nothing even where p or 1 - p is 0.
        a = np.where(m - ik > 0, (m - ik) * log_p, 0.0)
        b = np.where(ik > 0, ik * log_q, 0.0)
    terms = _log_binomials(m)[keep] + a + b + lk + np.log(-np.expm1(eps_g - lk))
    return float(logsumexp(terms))


def ddr_candidate_ts(eps_g: float, eps0: float, m: int) -> FloatArray:
    """The DDR maximising points ``t*_l = clip((eps_g + (l + 1) eps0) / (m + 1), 0, eps0)``."""
    ell = np.arange(m + 1, dtype=np.float64)
    out: FloatArray = np.clip((eps_g + (ell + 1.0) * eps0) / (m + 1.0), 0.0, eps0)
    return out


def ddr_delta(eps_g: float, eps0: float, m: int) -> float:
    """Paper Lemma 12: the delta at which m eps0-BR mechanisms compose to (eps_g, delta)-DP.

    Vectorised over all (t*_l, i) pairs at once; the same log-space terms as
    :func:`ddr_log_delta_at` (which is kept as the scalar reference). O(m^2) time and memory.
    """
    if eps0 * m <= eps_g:
        return 0.0  # basic composition already gives eps_g
    ts = ddr_candidate_ts(eps_g, eps0, m)[:, None]
    i = np.arange(m + 1, dtype=np.float64)[None, :]
    loss = m * ts - i * eps0
    keep = loss > eps_g
    log_norm = math.log(-math.expm1(-eps0))
    with np.errstate(divide="ignore", invalid="ignore"):
        log_p = -ts + np.log(-np.expm1(ts - eps0)) - log_norm  # -inf at t = eps0
        log_q = np.log(-np.expm1(-ts)) - log_norm  # -inf at t = 0
        a = np.where(m - i > 0, (m - i) * log_p, 0.0)  # 0 * log 0 = 0
        b = np.where(i > 0, i * log_q, 0.0)
        tail = np.log(-np.expm1(np.where(keep, eps_g - loss, -1.0)))
    terms = np.where(keep, _log_binomials(m)[None, :] + a + b + loss + tail, -np.inf)
    best = float(np.max(logsumexp(terms, axis=1)))
    return math.exp(best)


@functools.lru_cache(maxsize=4096)
def per_quantile_epsilon(epsilon: float, delta: float, m: int) -> float:
    """Largest per-mechanism eps0 with ``ddr_delta(epsilon, eps0, m) <= delta``.

    Bisection on the nondecreasing map eps0 -> delta(eps0), starting from ``epsilon / m``
    (basic composition, delta = 0). The lower end of the final bracket is returned, so the
    guarantee always holds; the bracket is narrower than :data:`EPS_TOLERANCE` (well under the
    required 1e-4). Data-independent, cached on (epsilon, delta, m).
    """
    eps = check_epsilon(epsilon)
    d = check_delta(delta)
    if m < 1:
        raise MechanismInputError("quantiles", "must not be empty")
    lo = eps / m  # invariant: ddr_delta(eps, lo, m) <= d
    hi = max(eps, lo) * 2.0  # grown until ddr_delta(eps, hi, m) > d
    while ddr_delta(eps, hi, m) <= d:
        lo, hi = hi, hi * 2.0
        if hi > 1e6:  # delta so large that any eps0 qualifies; cap the per-quantile budget
            return lo
    while hi - lo > EPS_TOLERANCE * max(1.0, lo):
        mid = 0.5 * (lo + hi)
        if ddr_delta(eps, mid, m) <= d:
            lo = mid
        else:
            hi = mid
    return lo


def appindexp(
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
    """AppIndExp: m exponential mechanisms at the DDR-composed per-quantile epsilon.

    Guarantee: (epsilon, delta)-DP under the requested neighbour relation (swap or
    add/remove): each mechanism is eps0-bounded-range under either relation with IndExp's
    calibration, and DDR's non-adaptive composition (paper Lemma 12) of m eps0-BR mechanisms
    is (epsilon, delta)-DP for ``eps0 = per_quantile_epsilon(epsilon, delta, m)``.

    Complexity: O(n log n) to sort and count, then O(m d) at worst, O(d) memory; the eps0
    search is O(m^2 log(1/tol)),
    data-independent and cached.

    Raises:
        MechanismInputError: for invalid data, quantiles, epsilon, bounds, neighbours or delta.
    """
    check_delta(delta)
    sup = support_from_values(
        data, quantiles, epsilon=epsilon, lower=lower, upper=upper, neighbors=neighbors
    )
    return np.asarray(appindexp_core(sup, make_rng(rng), delta=delta), dtype=np.float64)


def appindexp_core(
    sup: Support, rng: np.random.Generator, *, delta: float | None = None
) -> FloatArray | IntArray:
    """AppIndExp on a prepared support."""
    d = check_delta(delta)
    eps0 = per_quantile_epsilon(sup.epsilon, d, int(sup.quantiles.size))
    return independent_exponential(sup, eps0, rng)


APPINDEXP = Mechanism(
    name="appindexp",
    fn=appindexp,
    core=appindexp_core,
    notion=PrivacyNotion.APPROX_DP,
    summary="Independent exponential mechanisms with Dong–Durfee–Rogers composition.",
    requires_delta=True,
    method_params=("delta",),
)

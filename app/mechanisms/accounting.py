"""Privacy accounting helpers: zCDP to (epsilon, delta)-DP conversions.

A mechanism that is rho-zCDP (Bun & Steinke 2016) satisfies Renyi DP of every order
``alpha > 1`` with ``D_alpha <= alpha * rho``. Two sound conversions to (epsilon, delta)-DP:

* Bun & Steinke (2016), Proposition 1.3: ``epsilon = rho + 2 sqrt(rho ln(1/delta))``.
* Canonne, Kamath & Steinke (2020), Proposition 12 (tighter): for every ``alpha > 1``,
  ``epsilon = alpha rho + (ln(1/delta) + (alpha - 1) ln(1 - 1/alpha) - ln(alpha)) / (alpha - 1)``.

Every ``alpha > 1`` gives a valid bound, so the numerical minimisation over ``alpha`` can only
make the reported epsilon larger than the infimum, never unsound. :func:`zcdp_to_approx_dp`
returns the smaller of the two bounds (both are valid, so the minimum is valid).

The inverse direction, :func:`calibrate_rho`, is what a zCDP mechanism uses when the query's
(epsilon, delta) is the guarantee of the whole release: the largest rho whose converted
epsilon (:func:`zcdp_to_approx_dp`) does not exceed the request, found by bisection and
rounded down (the safe direction).
"""

from __future__ import annotations

import functools
import math

from scipy.optimize import minimize_scalar

from app.mechanisms.errors import MechanismInputError
from app.mechanisms.validation import check_delta, check_epsilon

#: Bisection stops once the bracket ``[lo, hi]`` (``f(lo) <= epsilon < f(hi)``) is this narrow
#: relative to ``hi``: the rho returned is within this factor of the largest admissible rho
#: (``f`` = :func:`zcdp_to_approx_dp`, increasing in rho).
RHO_REL_TOL = 1e-12


def _check_rho(rho: float) -> float:
    try:
        r = float(rho)
    except (TypeError, ValueError):
        raise MechanismInputError("rho", "must be a number") from None
    if not math.isfinite(r) or r < 0.0:
        raise MechanismInputError("rho", f"must be finite and >= 0 (got {rho!r})")
    return r


def zcdp_epsilon_bun_steinke(rho: float, delta: float) -> float:
    """Bun–Steinke (TCC 2016, Prop. 1.3): rho-zCDP implies (rho + 2 sqrt(rho ln 1/delta), delta)."""
    r = _check_rho(rho)
    d = check_delta(delta)
    return r + 2.0 * math.sqrt(r * math.log(1.0 / d))


def cks_epsilon_at_order(rho: float, delta: float, alpha: float) -> float:
    """The Canonne–Kamath–Steinke (NeurIPS 2020, Prop. 12) epsilon at Renyi order ``alpha > 1``.

    ``alpha rho + (ln(1/delta) + (alpha - 1) ln(1 - 1/alpha) - ln(alpha)) / (alpha - 1)``.
    Valid (sound) for every ``alpha > 1``.
    """
    if not alpha > 1.0:
        raise MechanismInputError("alpha", f"must be > 1 (got {alpha!r})")
    am1 = alpha - 1.0
    return (
        alpha * rho
        + (math.log(1.0 / delta) + am1 * math.log1p(-1.0 / alpha) - math.log(alpha)) / am1
    )


def cks_delta_at_order(rho: float, epsilon: float, alpha: float) -> float:
    """Inverse form of Prop. 12: the delta certified at ``epsilon`` by Renyi order ``alpha``.

    ``exp((alpha - 1)(alpha rho - epsilon)) / alpha * (1 - 1/alpha)^(alpha - 1)``.
    """
    if not alpha > 1.0:
        raise MechanismInputError("alpha", f"must be > 1 (got {alpha!r})")
    am1 = alpha - 1.0
    log_d = am1 * (alpha * rho - epsilon) - math.log(alpha) + am1 * math.log1p(-1.0 / alpha)
    return math.exp(min(log_d, 0.0))


def zcdp_epsilon_cks(rho: float, delta: float) -> float:
    """Tightest Canonne–Kamath–Steinke epsilon for rho-zCDP at ``delta`` (min over alpha > 1).

    The objective is minimised in ``log(alpha - 1)`` by bounded Brent search; the value returned
    is the objective evaluated at the order found, hence sound whatever the optimiser's accuracy.
    """
    r = _check_rho(rho)
    d = check_delta(delta)
    if r == 0.0:
        return 0.0

    def objective(log_am1: float) -> float:
        return cks_epsilon_at_order(r, d, 1.0 + math.exp(log_am1))

    # The unconstrained optimum is near alpha - 1 ~ sqrt(ln(1/delta) / rho); search a wide
    # bracket around it (orders from 1 + 1e-9 to 1 + 1e12).
    res = minimize_scalar(
        objective,
        bounds=(math.log(1e-9), math.log(1e12)),
        method="bounded",
        options={"xatol": 1e-10},
    )
    guess = math.log(math.sqrt(math.log(1.0 / d) / r))
    best = min(float(res.fun), objective(min(max(guess, math.log(1e-9)), math.log(1e12))))
    return max(best, 0.0)


def zcdp_to_approx_dp(rho: float, delta: float) -> float:
    """Sound epsilon such that rho-zCDP implies (epsilon, delta)-DP: min of the two bounds."""
    return min(zcdp_epsilon_cks(rho, delta), zcdp_epsilon_bun_steinke(rho, delta))


def bun_steinke_rho(epsilon: float, delta: float) -> float:
    """Inverse of Bun–Steinke Prop. 1.3: the rho with ``rho + 2 sqrt(rho L) = epsilon``.

    ``rho = (sqrt(L + epsilon) - sqrt(L))^2`` with ``L = ln(1/delta)``, written as
    ``epsilon^2 / (sqrt(L + epsilon) + sqrt(L))^2`` to avoid cancellation.
    """
    ll = math.log(1.0 / delta)
    return epsilon**2 / (math.sqrt(ll + epsilon) + math.sqrt(ll)) ** 2


@functools.lru_cache(maxsize=4096)
def calibrate_rho(epsilon: float, delta: float) -> float:
    """The largest rho (to :data:`RHO_REL_TOL`) with ``zcdp_to_approx_dp(rho, delta) <= epsilon``.

    A mechanism that is rho-zCDP for the returned rho is (epsilon, delta)-DP: the returned
    rho is always the lower end ``lo`` of a bracket with ``zcdp_to_approx_dp(lo, delta) <=
    epsilon`` checked by evaluating that (sound) conversion itself, so rounding only ever
    errs on the safe side; and ``zcdp_to_approx_dp(hi, delta) > epsilon`` for some
    ``hi <= lo (1 + RHO_REL_TOL)``, so nothing is given away beyond that factor.

    Bracket: Bun–Steinke's closed-form inverse is admissible (the conversion is the minimum of
    the two bounds, so it is at most Bun–Steinke's epsilon); the upper end doubles from it
    until it is inadmissible. Then bisection (geometric midpoint) on ``[lo, hi]``.
    Cost: about 45 conversions (each a bounded Brent search), cached per (epsilon, delta).

    Raises:
        MechanismInputError: for epsilon or delta outside their domains.
    """
    eps = check_epsilon(epsilon)
    d = check_delta(delta)

    def admissible(rho: float) -> bool:
        return zcdp_to_approx_dp(rho, d) <= eps

    lo = bun_steinke_rho(eps, d)
    while lo > 0.0 and not admissible(lo):  # rounding in the closed form: step down
        lo *= 1.0 - 1e-9
    if not lo > 0.0:
        raise MechanismInputError("epsilon", f"is too small to calibrate (got {epsilon!r})")
    hi = 2.0 * lo
    while admissible(hi):
        lo, hi = hi, 2.0 * hi
        if not math.isfinite(hi):
            raise MechanismInputError("epsilon", f"is too large to calibrate (got {epsilon!r})")
    while hi - lo > RHO_REL_TOL * hi:
        mid = math.sqrt(lo * hi)
        if not lo < mid < hi:
            break
        if admissible(mid):
            lo = mid
        else:
            hi = mid
    return lo

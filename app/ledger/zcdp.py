"""zCDP tables: rho and the (epsilon, delta) guarantee it gives, through ``dp-accounting``.

The guarantee of a table that has spent rho is Google's ``dp-accounting`` RDP accountant's
epsilon for one ``ZCDpEvent(rho)`` at the table's delta (rho-zCDP is Renyi DP of every order
alpha with D_alpha <= alpha rho; the accountant minimises the conversion of Canonne, Kamath &
Steinke 2020 over its fixed orders, so every figure it returns is sound), or Bun & Steinke's
closed form where that is smaller, so the figure is never looser than it. Composition adds
rho, so k releases of rho_1 are one event of k rho_1.

Decimals meet floats in two places only, each rounded in the safe direction: the epsilon
reported is rounded up (:data:`EPSILON_QUANTUM`), and the rho a grant of (epsilon, delta) buys
is the largest multiple of :data:`RHO_QUANTUM` whose guarantee is at most epsilon (checked
on the rounded value itself, never on the float it came from).
"""

from __future__ import annotations

import functools
import math
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

from app.core.amounts import Amount, Budget

#: Reported epsilons are rounded up to this quantum.
EPSILON_QUANTUM = Decimal("1e-12")
#: Granted rho is rounded down to this quantum.
RHO_QUANTUM = Decimal("1e-15")


@functools.lru_cache(maxsize=4096)
def _epsilon_float(rho: float, delta: float) -> float:
    """dp-accounting's epsilon, or Bun & Steinke's rho + 2 sqrt(rho ln(1/delta)) where that is
    smaller (both are valid bounds; the accountant's fixed orders can lose to it when the best
    order lies beyond them, e.g. at very small rho)."""
    from dp_accounting import dp_event, rdp

    accountant = rdp.RdpAccountant()
    accountant.compose(dp_event.ZCDpEvent(rho))
    accounted = float(accountant.get_epsilon(delta))
    bun_steinke = rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))
    # the closed form in doubles may round down by a few ulps: pad it before comparing
    return min(accounted, bun_steinke * (1.0 + 1e-12))


def epsilon_of(rho: Decimal, delta: Decimal) -> Decimal:
    """The epsilon that ``rho``-zCDP gives at ``delta`` (0 for rho = 0), rounded up.

    The float handed to the accountant is the smallest double >= rho (the accountant's
    epsilon grows with rho) and the largest double <= delta (it shrinks with delta)."""
    if rho <= 0:
        return Decimal(0)
    r = float(rho)
    if Decimal(r) < rho:
        r = math.nextafter(r, math.inf)
    d = float(delta)
    if Decimal(d) > delta:
        d = math.nextafter(d, -math.inf)
    return Decimal(_epsilon_float(r, d)).quantize(EPSILON_QUANTUM, rounding=ROUND_CEILING)


def rho_for(epsilon: Decimal, delta: Decimal) -> Decimal:
    """The largest rho (a multiple of :data:`RHO_QUANTUM`) whose guarantee at ``delta`` is
    at most ``epsilon``: what a grant of ``epsilon`` adds to a zCDP table.

    Converting each grant on its own is conservative: the inverse of a concave increasing
    conversion is convex with value 0 at 0, hence superadditive (rho(a) + rho(b) <= rho(a+b)).
    """
    if epsilon <= 0:
        return Decimal(0)
    lo, hi = 0.0, float(epsilon)  # rho <= epsilon: the conversion's epsilon is above rho
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        if epsilon_of(Decimal(mid), delta) <= epsilon:
            lo = mid
        else:
            hi = mid
    rho = Decimal(lo).quantize(RHO_QUANTUM, rounding=ROUND_FLOOR)
    while rho > 0 and epsilon_of(rho, delta) > epsilon:  # pragma: no cover - rounding guard
        rho -= RHO_QUANTUM
    return rho


def releases_left(left: Decimal, each: Decimal) -> int | None:
    """How many more releases costing ``each`` fit in ``left`` (None when each costs 0)."""
    if each <= 0:
        return None
    return max(int(left // each), 0)


def guarantee(budget: Budget) -> Amount:
    """The (epsilon, delta) a zCDP table's spent rho gives at its delta ((0, 0) before any
    release)."""
    assert budget.guarantee_delta is not None
    if budget.spent.rho <= 0:
        return Amount(Decimal(0), Decimal(0))
    delta = budget.guarantee_delta
    return Amount(epsilon_of(budget.spent.rho, delta), delta)


def remaining(budget: Budget) -> Amount:
    """What a table has left, as (epsilon, delta): pure, granted minus spent; zCDP, the
    target epsilon not yet reached by the guarantee, at the table's delta (and rho left)."""
    if budget.accounting != "zcdp":
        return budget.remaining
    assert budget.guarantee_delta is not None
    reached = guarantee(budget).epsilon
    return Amount(
        max(budget.granted.epsilon - reached, Decimal(0)),
        budget.guarantee_delta,
        budget.remaining.rho,
    )

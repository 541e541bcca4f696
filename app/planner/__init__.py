"""The planner: expected error of a query per method, and the method to use.

Pure: numpy and the mechanism registry only (no database, no web). It never looks at data:
its inputs are the method, a size ``n`` that is *public* (the dataset's n under ``swap``
neighbours; the admin-declared ``size_hint`` under ``add_remove``, where n is private), the
quantile levels, ε, δ and the neighbour relation. The error model and its validation are
described in :mod:`app.planner.model` and docs/experiments.md.

* :func:`expected_error` -> ``(mean, bound90)`` missed points per quantile, or ``None`` when
  the method has no fitted model (e.g. registered after the committed map was fitted).
* :func:`eligible_methods`: the methods a query may resolve to: the dataset's neighbour
  relation must be covered, pure ε-DP methods are always allowed, approximate ones only when
  the query gives δ.
* :func:`recommend`: the method ``auto`` runs: the fastest of the eligible methods whose
  expected error is within 10 % of the lowest, within the release time limit, with
  ``jointexp_smooth`` in JointExp's place (robust to ties the planner cannot see).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from app.mechanisms import MECHANISMS, MechanismInputError
from app.planner.model import load_models

#: ``n`` used to rank methods for ``auto`` when no public size is known (add_remove without
#: a size hint): a fixed, public figure, so the choice still depends on public inputs only.
NOMINAL_N = 10_000


def expected_error(
    method: str,
    n: int,
    quantiles: Sequence[float],
    epsilon: float,
    delta: float | None,
    neighbors: str,
) -> tuple[float, float] | None:
    """Predicted mean missed points per quantile and its 90 % bound, from public figures.

    Args:
        method: A registered method name.
        n: The public size (n under swap, the size hint under add_remove); >= 1.
        quantiles: The m quantile levels (only m enters the model).
        epsilon: The query's ε for the whole release.
        delta: The query's δ (the model was fitted at δ = 10⁻⁶; not otherwise used).
        neighbors: ``swap`` or ``add_remove`` (the model was fitted under swap).

    Returns:
        ``(mean, bound90)``, or ``None`` when the method has no fitted model.
    """
    del delta, neighbors  # see the docstring: fitted at δ = 1e-6 under swap
    model = load_models().get(method)
    if model is None or n < 1 or epsilon <= 0 or not quantiles:
        return None
    m = len(quantiles)
    mean = model.mean(float(n), m, float(epsilon))
    bound = min(mean * model.ratio90(m), float(n))
    return mean, max(bound, mean)


def eligible_methods(*, delta_given: bool, neighbors: str) -> list[str]:
    """Registered methods a query may use: neighbours covered; δ-using ones only with δ."""
    return [
        name
        for name, mech in MECHANISMS.items()
        if neighbors in mech.neighbors and (delta_given or not mech.uses_delta)
    ]


#: ``auto`` treats methods whose expected errors are within this factor of the lowest as
#: equally accurate and takes the fastest of them.
NEAR = 1.10


def ties_forced(n: int, grid_points: int | None) -> bool:
    """Whether the public figures force tied values: more records than grid points."""
    return grid_points is not None and n > grid_points


def recommend(
    n: int | None,
    quantiles: Sequence[float],
    epsilon: float,
    delta: float | None,
    neighbors: str,
    only: Collection[str] | None = None,
    *,
    grid_points: int | None = None,
    seconds: Callable[[str], float] | None = None,
    time_limit_s: float | None = None,
) -> str:
    """The method ``auto`` runs: among the eligible methods (with ``only``, among those),
    the fastest whose expected error is within :data:`NEAR` of the lowest.

    ``n=None`` (no public size) ranks at :data:`NOMINAL_N`. Never recommended: methods
    without a model; methods whose declared cost at these parameters exceeds the requested
    (ε, δ) (a method proven in another notion and not calibrated to the request: ``auto``
    never spends more than was asked); methods whose run time (``seconds(name)``, the
    service's public bound) exceeds ``time_limit_s``, unless every method's does (then the
    fastest). ``jointexp_smooth`` (the same mechanism on jittered records) takes JointExp's
    place wherever both are left: ties and atoms (integer-valued or rounded data, values
    clamped at a bound) are private, so the planner cannot see them, and there JointExp
    misses 4-30x more points on the committed map (median; 100x and more at n = 10^5), while
    on continuous data JointExp is ahead by 5 % at the median (90th percentile 1.6x;
    docs/experiments.md §10). Where the public figures force ties (``n`` above
    ``grid_points``) every other model, fitted on distinct values, fails: the other methods
    miss 10-1,000x more points there (§10.1), and ``jointexp_smooth`` is taken outright.
    Without ``seconds``, the registry's order breaks near-ties.
    If nothing is left, the registry's first eligible method.
    """
    size = NOMINAL_N if n is None else n
    candidates = eligible_methods(delta_given=delta is not None, neighbors=neighbors)
    if only is not None:
        candidates = [name for name in candidates if name in only]
    order = {name: i for i, name in enumerate(MECHANISMS)}
    scored: list[tuple[float, float, int, str]] = []
    for name in candidates:
        if not _costs_what_was_asked(name, epsilon, delta):
            continue
        err = expected_error(name, size, quantiles, epsilon, delta, neighbors)
        if err is not None:
            took = 0.0 if seconds is None else float(seconds(name))
            scored.append((err[0], took, order[name], name))
    if not scored:
        return candidates[0]
    if time_limit_s is not None:
        in_time = [s for s in scored if s[1] <= time_limit_s]
        scored = in_time or [min(scored, key=lambda s: (s[1], s[2]))]
    if {"jointexp", "jointexp_smooth"} <= {s[3] for s in scored}:
        scored = [s for s in scored if s[3] != "jointexp"]
    if ties_forced(size, grid_points) and "jointexp_smooth" in {s[3] for s in scored}:
        return "jointexp_smooth"
    best = min(s[0] for s in scored)
    near = [s for s in scored if s[0] <= NEAR * best]
    return min(near, key=lambda s: (s[1], s[2]))[3]


def _costs_what_was_asked(name: str, epsilon: float, delta: float | None) -> bool:
    mech = MECHANISMS[name]
    try:
        eps_cost, delta_cost = mech.dp_cost(
            epsilon=epsilon, delta=delta if mech.uses_delta else None
        )
    except (MechanismInputError, ValueError):
        return False
    return eps_cost <= epsilon * (1 + 1e-9) and delta_cost <= (delta or 0.0) * (1 + 1e-9)


__all__ = ["NEAR", "NOMINAL_N", "eligible_methods", "expected_error", "recommend", "ties_forced"]

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
* :func:`recommend`: the eligible method with the lowest expected error.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

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


#: Methods ``auto`` never picks. ``jointexp_smooth`` is JointExp on data jittered within one
#: grid step: its advantage is on tied data (atoms), which a planner that never looks at the
#: data cannot see, and on continuous data it is JointExp again (its fitted model differs
#: from JointExp's by noise) at up to 10x the run time. Analysts with tied data ask for it
#: by name (docs/experiments.md §8.5); quotes still show its figures.
NOT_AUTO = frozenset({"jointexp_smooth"})


def recommend(
    n: int | None,
    quantiles: Sequence[float],
    epsilon: float,
    delta: float | None,
    neighbors: str,
    only: Collection[str] | None = None,
) -> str:
    """The eligible method with the lowest expected error (ties: registry order), outside
    :data:`NOT_AUTO` (and, with ``only``, among those methods).

    ``n=None`` (no public size) ranks at :data:`NOMINAL_N`. Methods without a model are
    never recommended, nor methods whose declared cost at these parameters exceeds the
    requested (ε, δ) (a method proven in another notion and not calibrated to the request:
    ``auto`` never spends more than was asked). If nothing is left, the registry's first
    eligible method is returned.
    """
    size = NOMINAL_N if n is None else n
    candidates = eligible_methods(delta_given=delta is not None, neighbors=neighbors)
    if only is not None:
        candidates = [name for name in candidates if name in only]
    best: tuple[float, str] | None = None
    for name in candidates:
        if name in NOT_AUTO or not _costs_what_was_asked(name, epsilon, delta):
            continue
        err = expected_error(name, size, quantiles, epsilon, delta, neighbors)
        if err is not None and (best is None or err[0] < best[0]):
            best = (err[0], name)
    if best is not None:
        return best[1]
    return candidates[0]


def _costs_what_was_asked(name: str, epsilon: float, delta: float | None) -> bool:
    mech = MECHANISMS[name]
    try:
        eps_cost, delta_cost = mech.dp_cost(
            epsilon=epsilon, delta=delta if mech.uses_delta else None
        )
    except (MechanismInputError, ValueError):
        return False
    return eps_cost <= epsilon * (1 + 1e-9) and delta_cost <= (delta or 0.0) * (1 + 1e-9)


__all__ = ["NOMINAL_N", "NOT_AUTO", "eligible_methods", "expected_error", "recommend"]

"""The planner: expected error of a query per method, and the method to use.

Pure: numpy and the mechanism registry only (no database, no web). It never looks at data:
its inputs are the method, a size ``n`` that is *public* (the dataset's n under ``swap``
neighbours; the admin-declared ``size_hint`` under ``add_remove``, where n is private), the
quantile levels, ε, δ and the neighbour relation. The error model and its validation are
described in :mod:`app.planner.model` and docs/experiments.md.

* :func:`expected_error` -> ``(mean, bound90, bound90_each, bound90_each_atom)`` missed
  points per quantile (:class:`ErrorFigures`: ``bound90`` bounds their mean over the
  release's quantiles, ``bound90_each`` any one estimate, what error bars span,
  ``bound90_each_atom`` the same with an atom at a public bound), or ``None`` when the
  method has no fitted model (e.g. registered after the committed map was fitted).
* :func:`eligible_methods`: the methods a query may resolve to: the dataset's neighbour
  relation must be covered, pure ε-DP methods are always allowed, approximate ones only when
  the query gives δ.
* :func:`recommend`: the method ``auto`` runs: the eligible method (within the release time
  limit) least behind the best *in every regime the public figures leave open* (distinct
  values, ties, a clamped share), the fastest of those within 10 % (bounds compared in
  quarter-second steps).

Three model sets (:mod:`app.planner.model`): ``continuous`` (fitted on distinct values),
``tied`` (integer-valued data, every quantile on a run of ties) and ``clamped`` (a share
clamped at a bound). Ties are private, so the planner cannot tell which one a data set
follows, except that more records than grid points force some (:func:`ties_forced`);
quotes then come from the tied set, else from the continuous one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from typing import NamedTuple

from app.mechanisms import MECHANISMS, MechanismInputError
from app.planner.model import OFFSET, REGIMES, MethodModel, load_models

#: ``n`` used to rank methods for ``auto`` when no public size is known (add_remove without
#: a size hint): a fixed, public figure, so the choice still depends on public inputs only.
NOMINAL_N = 10_000


class ErrorFigures(NamedTuple):
    """A method's a-priori error at some public figures, in missed points per quantile."""

    #: The expected missed points per quantile (averaged over the release's quantiles).
    mean: float
    #: That average over the release's m quantiles stayed below this in 90 % of trials.
    bound90: float
    #: Any *one* estimate's missed points stayed below this in 90 % of trials: the span of
    #: its error bar (:mod:`app.planner.intervals`). A mean of m varies less than any one
    #: of them, so this is the mean times the model's spread at m = 1 (``ratio90(1)``,
    #: ≈ ln 10 ≈ 2.3, the 90 % point of an exponential tail), never below ``bound90``.
    bound90_each: float
    #: ``bound90_each`` where the data hold an atom at a public bound (values clamped there):
    #: the clamped model set's, never below ``bound90_each``. Which applies is private, but a
    #: release that puts an estimate at a bound shows it, so its bars span this one
    #: (:func:`app.releases.runner.intervals_of`: post-processing of the release).
    bound90_each_atom: float


def expected_error(
    method: str,
    n: int,
    quantiles: Sequence[float],
    epsilon: float,
    delta: float | None,
    neighbors: str,
    *,
    grid_points: int | None = None,
    regime: str | None = None,
) -> ErrorFigures | None:
    """Predicted mean missed points per quantile and its 90 % bounds, from public figures.

    Args:
        method: A registered method name.
        n: The public size (n under swap, the size hint under add_remove); >= 1.
        quantiles: The m quantile levels (only m enters the model).
        epsilon: The query's ε for the whole release.
        delta: The query's δ (the model was fitted at δ = 10⁻⁶; not otherwise used).
        neighbors: ``swap`` or ``add_remove`` (the model was fitted under swap).
        grid_points: The column's grid size, if any: with more records than grid points
            (:func:`ties_forced`) the tied model set answers.
        regime: A model set by name (one of :data:`REGIMES`), overriding the choice from
            ``grid_points``.

    Returns:
        ``(mean, bound90, bound90_each, bound90_each_atom)`` (:class:`ErrorFigures`), each
        within ``[mean, n]``, or ``None`` when the method has no fitted model.
    """
    del delta, neighbors  # see the docstring: fitted at δ = 1e-6 under swap
    if regime is None:
        regime = "tied" if ties_forced(n, grid_points) else "continuous"
    model = load_models(regime).get(method)
    if model is None or n < 1 or epsilon <= 0 or not quantiles:
        return None
    m = len(quantiles)
    mean = model.mean(float(n), m, float(epsilon))
    each = _each(model, float(n), m, float(epsilon), mean)
    clamped = load_models("clamped").get(method)
    atom = each if clamped is None else max(each, _each(clamped, float(n), m, float(epsilon)))
    return ErrorFigures(
        mean,
        max(min(mean * model.ratio90(m), float(n)), mean),
        each,
        atom,
    )


def _each(model: MethodModel, n: float, m: int, epsilon: float, mean: float | None = None) -> float:
    """One estimate's 90 % bound under ``model``: its mean times its spread at m = 1 (or at m,
    where wider), within ``[mean, n]``."""
    mean = model.mean(n, m, epsilon) if mean is None else mean
    return max(min(mean * max(model.ratio90(m), model.ratio90(1)), n), mean)


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
#: ... comparing their run-time bounds in steps of this many seconds: waits that differ by
#: less are the same to a caller, and the registry's order then decides. (Where every
#: method's error model saturates, at tiny epsilon on small data, all are "near" and a
#: bound of 0.02 s against 0.05 s would otherwise decide: AQ's, measured 1.1-1.5x behind
#: IndExp there on seeds 20261222 and 20261228.)
SPEED_STEP_S = 0.25


#: How far behind the best a method may be, in a regime the public figures leave open but
#: data rarely follow (ties, a share clamped at a bound), before ``auto`` holds it against
#: the method: chosen on the committed maps (docs/experiments.md §10.5).
TOLERANCE = 3.0


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
    the one least behind the best in every regime the public figures leave open.

    Ties and atoms (integer-valued or rounded data, values clamped at a bound) are private,
    so the planner never knows which of its model sets (:data:`REGIMES`: continuous, tied,
    clamped) a data set follows. A method's *regret* is the largest factor, over the open
    regimes (:func:`open_regimes`), by which its expected error exceeds the lowest of the
    methods left, ``(E + 1/4) / (E_best + 1/4)``, divided by the regime's tolerance (1 for
    distinct values, :data:`TOLERANCE` for ties and a clamped share; never below 1).
    ``auto`` takes the fastest of the methods whose regret is within :data:`NEAR` of the
    lowest, run times compared in steps of :data:`SPEED_STEP_S` (within a step, and without
    ``seconds``, the first in registry order). So a method best on distinct values but far
    behind where a clamped atom holds some of the quantiles (AQ before its bounds' cells
    were stretched: hundreds of times, docs/experiments.md §10.5) gives way to a method
    close to the best on both.

    ``jointexp_smooth`` (the same mechanism on jittered records) takes JointExp's place
    wherever both are left: JointExp's utility goes flat on atoms heavier than the gaps
    between target ranks (ratings 1-5: 100x more missed points), which no model fitted on
    one tied shape can foresee, while on distinct values it is ahead by 5 % at the median
    (§10.1). Where the public figures force ties (more records than grid points), the
    smoothed one is taken unless the continuous models put it more than
    :data:`TOLERANCE` behind the best (many quantiles at small ε, where each quantile's
    noise dwarfs the atoms and AQ is 3-5x ahead); then the tied models rank the others.
    The tied models are fitted on one tied shape (about 40 values in use on 201 grid
    points); on heavier atoms (ratings 1-5: 20 records per value at n = 100) they
    underrate the smoothed method by 10x, so they do not overrule it (§10.7).

    ``n=None`` (no public size) ranks at :data:`NOMINAL_N`. Never recommended: methods
    without a model; methods whose declared cost at these parameters exceeds the requested
    (ε, δ) (a method proven in another notion and not calibrated to the request: ``auto``
    never spends more than was asked); methods whose run time (``seconds(name)``, the
    service's public bound) exceeds ``time_limit_s``, unless every method's does (then the
    fastest, the least behind of equally fast ones). If nothing is left, the registry's first
    eligible method.
    """
    size = NOMINAL_N if n is None else n
    candidates = eligible_methods(delta_given=delta is not None, neighbors=neighbors)
    if only is not None:
        candidates = [name for name in candidates if name in only]
    order = {name: i for i, name in enumerate(MECHANISMS)}
    regimes = open_regimes(size, grid_points)
    # (errors per model set, seconds, registry order, name)
    scored: list[tuple[dict[str, float], float, int, str]] = []
    for name in candidates:
        if not _costs_what_was_asked(name, epsilon, delta):
            continue
        errs = {}
        for regime in REGIMES:
            err = expected_error(name, size, quantiles, epsilon, delta, neighbors, regime=regime)
            errs[regime] = math.nan if err is None else err[0]
        if not math.isnan(errs["continuous"]):  # a method without a model is never picked
            took = 0.0 if seconds is None else float(seconds(name))
            scored.append((errs, took, order[name], name))
    if not scored:
        return candidates[0]
    if time_limit_s is not None:
        in_time = [s for s in scored if s[1] <= time_limit_s]
        # none in time: the fastest, and among equally fast ones the least behind (the
        # bounds of methods that share a run-time model tie: IndExp and AppIndExp)
        fastest = min(s[1] for s in scored)
        scored = in_time or [s for s in scored if s[1] == fastest]
    if {"jointexp", "jointexp_smooth"} <= {s[3] for s in scored}:
        scored = [s for s in scored if s[3] != "jointexp"]
    smooth = [s for s in scored if s[3] == "jointexp_smooth"]
    if ties_forced(size, grid_points) and smooth:
        lowest_c = min(s[0]["continuous"] for s in scored)
        if (smooth[0][0]["continuous"] + OFFSET) / (lowest_c + OFFSET) <= TOLERANCE:
            return "jointexp_smooth"
        scored = [s for s in scored if s[3] != "jointexp_smooth"]
    best = {
        r: min((s[0][r] for s in scored if not math.isnan(s[0][r])), default=math.nan)
        for r, _ in regimes
    }

    def regret(errs: dict[str, float]) -> float:
        """The largest factor, over the open regimes, by which the method's expected error
        exceeds the lowest, beyond the regime's tolerance (a regime without a model for
        the method counts for nothing)."""
        return max(
            (
                max(1.0, (errs[r] + OFFSET) / (best[r] + OFFSET) / tol)
                for r, tol in regimes
                if not math.isnan(errs[r])
            ),
            default=1.0,
        )

    lowest = min(regret(s[0]) for s in scored)
    near = [s for s in scored if regret(s[0]) <= NEAR * lowest]
    return min(near, key=lambda s: (math.ceil(s[1] / SPEED_STEP_S), s[2]))[3]


def open_regimes(n: int, grid_points: int | None) -> list[tuple[str, float]]:
    """The model sets a data set of public size ``n`` on a grid of ``grid_points`` may
    follow, each with the factor by which ``auto`` lets a method trail the best there
    before that counts: with ties forced (:func:`ties_forced`) the tied set alone; else
    the continuous set, and the tied and clamped ones at :data:`TOLERANCE`."""
    if ties_forced(n, grid_points):
        return [("tied", 1.0)]
    return [("continuous", 1.0), ("tied", TOLERANCE), ("clamped", TOLERANCE)]


def _costs_what_was_asked(name: str, epsilon: float, delta: float | None) -> bool:
    mech = MECHANISMS[name]
    try:
        eps_cost, delta_cost = mech.dp_cost(
            epsilon=epsilon, delta=delta if mech.uses_delta else None
        )
    except (MechanismInputError, ValueError):
        return False
    return eps_cost <= epsilon * (1 + 1e-9) and delta_cost <= (delta or 0.0) * (1 + 1e-9)


__all__ = [
    "NEAR",
    "NOMINAL_N",
    "REGIMES",
    "TOLERANCE",
    "ErrorFigures",
    "eligible_methods",
    "expected_error",
    "open_regimes",
    "recommend",
    "ties_forced",
]

"""Planning and quoting a release on a dataset's public figures: method, price, expected error.

Everything here reads only the query, the dataset's public description (its neighbour
relation and public size), its budget and the calling key's cap — never a data value — so
a quote's figures and a reservation's debit come from the same :func:`plan_query` path.
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app import planner
from app.auth.models import ApiKey
from app.codec.grid import grid_size
from app.core.amounts import Amount, Budget
from app.core.config import Settings
from app.core.errors import DpquantError, invalid, not_found
from app.core.principal import Principal
from app.datasets.models import Dataset
from app.datasets.service import ensure_live
from app.ledger import zcdp
from app.ledger.service import dataset_with_budget, mechanism_float, price
from app.mechanisms import (
    MECHANISMS,
    Mechanism,
    MechanismInputError,
    check_epsilon_share,
    get_mechanism,
)
from app.releases import grouping as grouped
from app.releases import schedule
from app.releases.schemas import AUTO, QuantileQuery


@dataclass(frozen=True)
class Priced:
    """A validated query: its mechanism and exact cost."""

    mechanism: Mechanism
    cost: Amount


def _parameter_error(exc: MechanismInputError) -> DpquantError:
    return invalid(f"body.{exc.parameter}", exc.problem)


def quote(
    mech: Mechanism, query: QuantileQuery, rows_per_unit: int = 1, accounting: str = "pure"
) -> Amount:
    """Validate the privacy parameters with the mechanism and price the release exactly.

    The mechanism will run with :func:`~app.ledger.service.mechanism_float` of the requested
    figures (never above them); its declared cost at those floats is what is priced. With
    ``rows_per_unit`` k > 1 the release is private per unit of k rows: the row-level
    parameters (ε/k for the pure methods) are validated here, so a release never fails
    for them after it is paid for. In a zCDP table (``accounting``) the cost also carries
    the release's rho (:meth:`~app.mechanisms.Mechanism.zcdp_cost`, exact, rounded up to
    :data:`RHO_QUANTUM`), computed on the requested decimal epsilon (the run uses at most
    that much); a method without a zCDP bound is refused (422).
    """
    try:
        epsilon = mechanism_float(query.epsilon)
        delta = None if query.delta is None else mechanism_float(query.delta)
        eps_cost, delta_cost = mech.dp_cost(epsilon=epsilon, delta=delta)
        eps_row, _ = mech.row_level(epsilon, delta, rows_per_unit)
        check_epsilon_share(eps_row, len(query.quantiles))
        rho = Decimal(0)
        if accounting == "zcdp":
            if mech.zcdp_fn is None:
                raise invalid(
                    "body.method",
                    f"method {mech.name!r} is proven only in (epsilon, delta)-DP: this table's "
                    "accounting is zcdp, which needs a rho per release (use jointexp, indexp, "
                    "aq, jointexp_smooth or csmooth)",
                )
            exact = mech.zcdp_cost(epsilon=Fraction(query.epsilon), delta=delta,
                                   m=len(query.quantiles))  # fmt: skip
            rho = _ceil(exact)
        return Amount(price(query.epsilon, eps_cost), price(query.delta, delta_cost), rho)
    except MechanismInputError as exc:
        raise _parameter_error(exc) from None
    except ValueError:
        raise invalid("body.epsilon", "these privacy parameters have no finite cost") from None


#: A release's rho is rounded up to this quantum (exact below it).
RHO_QUANTUM = Decimal("1e-30")


def _ceil(value: Fraction) -> Decimal:
    """``value`` rounded up to :data:`RHO_QUANTUM` (exact integer arithmetic)."""
    scale = 10**30
    units = -((-value.numerator * scale) // value.denominator)
    return Decimal(units).scaleb(-30)


def request_fingerprint(query: QuantileQuery) -> str:
    """SHA-256 of the canonical query; equal bodies (after parsing) give equal fingerprints."""
    canonical: dict[str, object] = {
        "method": query.method,
        "quantiles": [float(q).hex() for q in query.quantiles],
        "epsilon": str(query.epsilon.normalize()),
        "delta": None if query.delta is None else str(query.delta.normalize()),
    }
    if query.column is not None:  # (absent: the fingerprints of earlier releases)
        canonical["column"] = query.column
    if query.group_by is not None:
        canonical["group_by"] = query.group_by
        canonical["keys"] = query.keys
        if query.selection is not None:
            canonical["selection"] = query.selection.model_dump(mode="json")
        if query.size_hints:  # (absent or empty: the fingerprints of earlier releases)
            canonical["size_hints"] = query.size_hints
    return hashlib.sha256(json.dumps(canonical, sort_keys=True).encode()).hexdigest()


def check_min_epsilon(query: QuantileQuery, min_epsilon: Decimal) -> None:
    """422 on ``body.epsilon`` below the service's minimum (``DPQUANT_MIN_EPSILON``).

    Why: releases at ε = 10^-30 cost nothing, so one key could queue runs without end
    and hold every other tenant's release behind them. With a minimum, a dataset's budget
    pays for at most budget / minimum releases (see the setting for the default's argument).
    """
    if query.epsilon < min_epsilon:
        raise invalid(
            "body.epsilon",
            f"must be at least {min_epsilon.normalize()} (this service's DPQUANT_MIN_EPSILON)",
        )


def price_query(
    query: QuantileQuery, *, max_quantiles: int, rows_per_unit: int = 1, accounting: str = "pure"
) -> Priced:
    """Everything about a query that needs no database: limits, method, cost.

    ``auto`` must be resolved first (:func:`plan_query`), since it depends on the dataset.
    """
    if len(query.quantiles) > max_quantiles:
        raise invalid("body.quantiles", f"at most {max_quantiles} quantiles per query")
    try:
        mech = get_mechanism(query.method)
    except MechanismInputError as exc:
        raise invalid("body.method", exc.problem) from None
    return Priced(mech, quote(mech, query, rows_per_unit, accounting))


#: A release warns when its expected error is at least this share of the ranks.
WARN_SHARE = 0.05


@dataclass(frozen=True, slots=True)
class PublicFigures:
    """What the planner may know of a dataset: its neighbour relation and its public size
    (n under swap, where n is public; otherwise only the admin-declared size hint)."""

    neighbors: str
    size: int | None
    #: k: rows one privacy unit may contribute (fixed at creation)
    rows_per_unit: int = 1
    #: the numeric columns' names, in declared order (fixed at creation)
    numeric: tuple[str, ...] = ("value",)
    #: how releases compose (``pure`` or ``zcdp``; fixed at creation)
    accounting: str = "pure"
    #: the categorical columns (name, declared keys or None), in declared order
    categorical: tuple[tuple[str, tuple[str, ...] | None], ...] = ()
    #: each numeric column's grid (lower, upper, granularity), in ``numeric``'s order
    grids: tuple[tuple[float, float, float], ...] = ()

    @classmethod
    def of(cls, dataset: Dataset) -> PublicFigures:
        """The figures of a dataset row (``release_reserve()`` computes the same in SQL)."""
        k = dataset.max_rows_per_unit
        numeric = tuple(c.name for c in dataset.columns if c.numeric)
        size = dataset.n if dataset.neighbors == "swap" and dataset.n is not None else None
        if size is None:
            size = dataset.size_hint
        categorical = tuple(
            (c.name, None if c.keys is None else tuple(c.keys))
            for c in dataset.columns
            if not c.numeric
        )
        grids = tuple(
            (float(c.lower), float(c.upper), float(c.granularity))
            for c in dataset.columns
            if c.numeric and c.lower is not None and c.upper is not None and c.granularity
        )
        return cls(dataset.neighbors, size, k, numeric, dataset.accounting, categorical, grids)

    def column(self, name: str | None) -> str:
        """The numeric column a query reads: the one named, or the only one (422 else)."""
        if name is None:
            if len(self.numeric) == 1:
                return self.numeric[0]
            raise invalid(
                "body.column",
                f"is required: this dataset has {len(self.numeric)} numeric columns",
            )
        if name not in self.numeric:
            raise invalid("body.column", "is not a numeric column of this dataset")
        return name

    def grid(self, column: str) -> tuple[float, float, float] | None:
        """A numeric column's public grid (lower, upper, granularity), if known."""
        if len(self.grids) != len(self.numeric) or column not in self.numeric:
            return None
        return self.grids[self.numeric.index(column)]

    def row_epsilon(self, epsilon: float) -> float:
        """What one row gets of a unit's ε (the planner's figure; ε/k)."""
        return epsilon / self.rows_per_unit

    def row_delta(self, delta: float | None) -> float | None:
        """What one row gets of a unit's δ (the planner's figure; δ/k)."""
        return None if delta is None else delta / self.rows_per_unit


@dataclass(frozen=True)
class RunLimits:
    """The service's limits ``auto`` weighs run time with: the cell and value limits that
    bound a run's public figures and the release time limit (settings)."""

    max_cells: int
    max_values: int
    time_limit_s: float

    @classmethod
    def of(cls, settings: Settings) -> RunLimits:
        return cls(settings.max_cells, settings.max_values, settings.run_timeout_s)

    def seconds(
        self,
        query: QuantileQuery,
        figures: PublicFigures,
        column: str,
        grouping: grouped.Grouping | None,
    ) -> Callable[[str], float] | None:
        """A method's public run-time bound for ``query`` at publish scale 1 (what a worker
        would publish it at), or None when the column's grid is unknown."""
        grid = figures.grid(column)
        if grid is None:
            return None
        row: dict[str, Any] = {
            "lower": grid[0], "upper": grid[1], "granularity": grid[2],
            "neighbors": figures.neighbors,
            "public_n": figures.size if figures.neighbors == "swap" else None,
            "size_hint": figures.size if figures.neighbors != "swap" else None,
            "quantiles": query.quantiles, "epsilon": float(query.epsilon),
            "max_rows_per_unit": figures.rows_per_unit,
            "group_keys": None if grouping is None else grouping.stored_keys(),
        }  # fmt: skip

        def seconds(method: str) -> float:
            return schedule.bound_of_claim(
                {**row, "method": method}, scale=1.0, max_cells=self.max_cells,
                max_values=self.max_values, cap_s=math.inf,
            )  # fmt: skip

        return seconds


@dataclass(frozen=True)
class Plan:
    """A query resolved against a dataset's public figures: method, price, expected error.

    ``query`` is the query as it will run (``auto`` resolved; δ dropped when the method chosen
    is pure ε-DP); ``fingerprint`` is that of the query as sent, so an idempotent replay
    matches whatever the planner would choose today.
    """

    query: QuantileQuery
    priced: Priced
    fingerprint: str
    expected: list[dict[str, float]] | None
    warnings: list[str]
    #: the numeric column the release reads
    column: str = "value"
    #: a grouped query's keys and calibration (None: not grouped)
    grouping: grouped.Grouping | None = None
    #: a grouped query's expected error by group size
    group_error: dict[str, object] | None = None


def resolve(
    query: QuantileQuery,
    *,
    figures: PublicFigures,
    method: str | None = None,
    grouping: grouped.Grouping | None = None,
    limits: RunLimits | None = None,
) -> QuantileQuery:
    """The query with ``method`` (default: the query's, ``auto`` through the planner).

    A pure ε-DP method is always allowed: given one, a δ in the query is dropped (it buys
    nothing and is not charged) rather than refused.
    """
    name = method or query.method
    column = query.column or (figures.numeric[0] if len(figures.numeric) == 1 else "")
    timing: dict[str, Any] = {"grid_points": grid_points(query, figures)}
    if limits is not None and name == AUTO:
        timing["seconds"] = limits.seconds(query, figures, column, grouping)
        timing["time_limit_s"] = limits.time_limit_s
    if name == AUTO and grouping is not None:
        # one method for every group, ranked at the typical group size (public figures)
        name = planner.recommend(
            grouping.typical_size(figures.size),
            query.quantiles,
            float(query.epsilon) / grouping.chain,
            None if query.delta is None else float(query.delta) / grouping.chain,
            "add_remove",
            only=grouped.GROUPED_METHODS,
            **timing,
        )
    elif name == AUTO:
        name = planner.recommend(
            figures.size,
            query.quantiles,
            figures.row_epsilon(float(query.epsilon)),
            figures.row_delta(None if query.delta is None else float(query.delta)),
            figures.neighbors,
            **timing,
        )
        if figures.accounting == "zcdp" and MECHANISMS[name].zcdp_fn is None:
            name = "jointexp"  # the planner's pick has no zCDP bound: the core method
    elif method is None:
        return query
    mech = MECHANISMS.get(name)
    delta = query.delta if mech is not None and mech.uses_delta else None
    return query.model_copy(update={"method": name, "delta": delta})


def grid_points(query: QuantileQuery, figures: PublicFigures) -> int | None:
    """The size of the public grid of the column ``query`` reads, if known."""
    grid = figures.grid(query.column or (figures.numeric[0] if len(figures.numeric) == 1 else ""))
    return None if grid is None else grid_size(*grid)


def _figures(value: float) -> float:
    return float(f"{value:.4g}")


def expectation(
    query: QuantileQuery, *, figures: PublicFigures
) -> tuple[list[dict[str, float]] | None, list[str]]:
    """A-priori expected error per quantile (missed points) and warnings; public figures only."""
    size = figures.size
    if size is None:
        if figures.neighbors == "add_remove":
            why = "the dataset declares no size_hint (n is private under add_remove neighbours)"
        else:
            why = "the dataset has no values yet"
        return None, [f"expected error unknown: {why}"]
    err = planner.expected_error(
        query.method,
        size,
        query.quantiles,
        figures.row_epsilon(float(query.epsilon)),
        figures.row_delta(None if query.delta is None else float(query.delta)),
        figures.neighbors,
        grid_points=grid_points(query, figures),
    )
    if err is None:
        return None, [f"expected error unknown: no error model for method {query.method!r}"]
    figures_ = {name: _figures(value) for name, value in err._asdict().items()}
    expected = [{"quantile": q, **figures_, "size": size} for q in query.quantiles]
    mean = figures_["mean"]
    warnings: list[str] = []
    share = mean / size
    m = len(query.quantiles)
    if share >= WARN_SHARE:
        warnings.append(
            f"this ε is too small for {m} quantile{'s' if m > 1 else ''} with method "
            f"{query.method!r}: expected error is {100 * share:.0f} % of the ranks"
        )
    return expected, warnings


def plan_query(
    query: QuantileQuery,
    *,
    figures: PublicFigures,
    max_quantiles: int,
    limits: RunLimits | None = None,
) -> Plan:
    """Resolve, validate and price ``query`` for a dataset's public figures; the one path of
    quotes and reservations (so a quote's cost is the debit of the release that follows).
    Reads no data value: only the dataset's public description (and n under swap)."""
    column = figures.column(query.column)
    grouping = grouped.resolve_grouping(
        query,
        categorical=figures.categorical,
        neighbors=figures.neighbors,
        rows_per_unit=figures.rows_per_unit,
        accounting=figures.accounting,
    )
    resolved = resolve(query, figures=figures, grouping=grouping, limits=limits)
    if grouping is not None:
        grouped.check_method(resolved.method)
        priced = price_query(
            resolved,
            max_quantiles=max_quantiles,
            rows_per_unit=grouping.chain,
            accounting=figures.accounting,
        )
        if grouping.selection is not None:
            total = priced.cost.plus(grouped.selection_cost(grouping))
            priced = Priced(priced.mechanism, total)
        group_error, warnings = grouped.expectation(
            resolved, grouping, grid_points=grid_points(resolved, figures)
        )
        return Plan(resolved, priced, request_fingerprint(query), None, warnings, column,
                    grouping, group_error)  # fmt: skip
    priced = price_query(
        resolved,
        max_quantiles=max_quantiles,
        rows_per_unit=figures.rows_per_unit,
        accounting=figures.accounting,
    )
    check_runs_on(priced.mechanism, neighbors=figures.neighbors)
    expected, warnings = expectation(resolved, figures=figures)
    return Plan(resolved, priced, request_fingerprint(query), expected, warnings, column)


def check_runs_on(mech: Mechanism, *, neighbors: str) -> None:
    """Refuse (422, before anything is paid) a method whose analysis does not cover the
    dataset's neighbour relation (e.g. smooth sensitivity is for fixed-size datasets)."""
    if neighbors not in mech.neighbors:
        raise invalid(
            "body.method",
            f"method {mech.name!r} supports only {' and '.join(mech.neighbors)} neighbours; "
            f"this dataset uses {neighbors!r}",
        )


def _calling_key(session: Session, principal: Principal) -> ApiKey | None:
    return session.scalars(
        select(ApiKey)
        .where(ApiKey.id == principal.key_id)
        .execution_options(populate_existing=True)
    ).first()


def within_cap(key: ApiKey | None, cost: Amount) -> bool:
    """True when ``cost`` keeps the key within its cap (or it has none)."""
    if key is None or (key.max_epsilon is None and key.max_delta is None):
        return True
    with localcontext() as ctx:
        ctx.prec = 200  # exact: budget figures have at most 40 digits
        after = Amount(key.spent_epsilon + cost.epsilon, key.spent_delta + cost.delta)
    return (key.max_epsilon is None or after.epsilon <= key.max_epsilon) and (
        key.max_delta is None or after.delta <= key.max_delta
    )


class FiguresCache:
    """The public figures each dataset was last planned with, per web process.

    Only a guess: ``release_reserve()`` compares the figures a query was planned with against
    the locked dataset row and answers ``replan`` (with the row's figures) when they differ,
    so a stale entry costs one more round trip and never a wrong price. Bounded (LRU).
    """

    def __init__(self, max_items: int = 10_000) -> None:
        self.max_items = max_items
        self._items: OrderedDict[uuid.UUID, PublicFigures] = OrderedDict()

    def get(self, dataset_id: uuid.UUID) -> PublicFigures | None:
        figures = self._items.get(dataset_id)
        if figures is not None:
            self._items.move_to_end(dataset_id)
        return figures

    def put(self, dataset_id: uuid.UUID, figures: PublicFigures) -> None:
        self._items[dataset_id] = figures
        self._items.move_to_end(dataset_id)
        while len(self._items) > self.max_items:
            self._items.popitem(last=False)


@dataclass(frozen=True)
class QuoteLine:
    """One method's figures in a quote."""

    method: str
    cost: Amount
    remaining_after: Amount | None
    affordable: bool
    expected: list[dict[str, float]] | None
    zcdp: bool = False
    releases_left: int | None = None
    group_error: dict[str, object] | None = None


@dataclass(frozen=True)
class Quote:
    """The quote of a query: the resolved method's figures, warnings, every alternative."""

    chosen: QuoteLine
    warnings: list[str]
    alternatives: list[QuoteLine]


def quote_query(
    session: Session,
    *,
    principal: Principal,
    dataset_id: uuid.UUID,
    query: QuantileQuery,
    max_quantiles: int,
    limits: RunLimits | None = None,
) -> Quote:
    """What :func:`reserve_release` would debit for ``query`` (same :func:`plan_query`
    path), whether it is affordable, and the expected error of every eligible method.

    Free: writes nothing, takes no lock, reads no data value; the answer depends only on the
    query, the dataset's public description, its budget and the calling key's cap.
    """
    if not principal.can_see(dataset_id):
        raise not_found("dataset")
    if len(query.quantiles) > max_quantiles:
        raise invalid("body.quantiles", f"at most {max_quantiles} quantiles per query")
    found = dataset_with_budget(session, dataset_id=dataset_id)
    if found is None:
        raise not_found("dataset")
    dataset, budget = found
    ensure_live(dataset)
    remaining = budget.remaining
    figures = PublicFigures.of(dataset)
    key = _calling_key(session, principal) if principal.capped else None

    zcdp_table = budget.accounting == "zcdp"

    held = dataset.restore_hold_since is not None

    def line(plan: Plan) -> QuoteLine:
        cost = plan.priced.cost
        ok = not held and budget.affords(cost) and within_cap(key, cost)
        after = None
        if ok:
            spent = Budget(budget.granted, budget.spent.plus(cost), budget.accounting,
                           budget.guarantee_delta)  # fmt: skip
            after = zcdp.remaining(spent)
        if zcdp_table:
            left = zcdp.releases_left(remaining.rho, cost.rho)
        else:
            counts = [
                zcdp.releases_left(remaining.epsilon, cost.epsilon),
                zcdp.releases_left(remaining.delta, cost.delta),
            ]
            known = [c for c in counts if c is not None]
            left = min(known) if known else None
        return QuoteLine(plan.query.method, cost, after, ok, plan.expected, zcdp_table, left,
                         plan.group_error)  # fmt: skip

    plan = plan_query(query, figures=figures, max_quantiles=max_quantiles, limits=limits)
    alternatives: list[QuoteLine] = []
    for name in planner.eligible_methods(
        delta_given=query.delta is not None,
        neighbors="add_remove" if plan.grouping is not None else dataset.neighbors,
    ):
        try:
            alt = plan_query(
                resolve(query, figures=figures, method=name),
                figures=figures,
                max_quantiles=max_quantiles,
            )
        except DpquantError:  # e.g. parameters outside what this method accepts, or no
            continue  # zCDP bound in a zCDP table
        alternatives.append(line(alt))
    warnings = list(plan.warnings)
    if held:
        warnings.append(
            "budget on hold: the database was restored from a backup, and an admin must "
            "confirm what was spent since before any release"
        )
    return Quote(line(plan), warnings, alternatives)

"""Grouped queries on public figures: which keys a release answers, at what calibration, and
the expected error as a function of group size.

A grouped release answers the same quantiles of one numeric column once per key of a
categorical column (``group_by``). The keys are public: typed by the caller (``keys``) or
declared on the column; none is read from the data. Each group's mechanism runs under
row-level add/remove neighbours, calibrated for the chain of row changes one unit's
neighbour makes (k under add/remove, 2k under swap:
:func:`app.mechanisms.grouped.chain_length`), so the whole release costs the ε asked.

Group sizes are private under either relation (a unit's rows may move between groups), so
the planner gives no figure per group from the data: it gives the expected error at a
ladder of group sizes and the size below which an answer is mostly noise, and, for keys the
caller gives a size hint (``size_hints``: public, typed by the caller), the expected error
at that hint, from which the release's error bars per group follow.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from app import planner
from app.core.amounts import Amount
from app.core.errors import invalid
from app.mechanisms import MechanismInputError
from app.mechanisms.grouped import GROUPED_METHODS, chain_length
from app.releases.schemas import MAX_GROUPED_ESTIMATES, QuantileQuery, Selection

#: The group sizes a grouped release's expected error is given at.
SIZE_LADDER = (10, 100, 1_000, 10_000, 100_000, 1_000_000)
#: An answer is "mostly noise" when its expected error is at least this share of the ranks.
NOISE_SHARE = 0.05


@dataclass(frozen=True)
class Grouping:
    """A grouped query resolved against the table's schema."""

    group_by: str
    #: the public keys, or None when they are discovered
    keys: list[str] | None
    #: row-level add/remove steps one unit's neighbour makes (the calibration)
    chain: int
    #: ``"keys": "discover"``: the selection's parameters
    selection: Selection | None = None
    #: the caller's public size hints, by key (None: none given)
    size_hints: dict[str, int] | None = None

    @property
    def key_count(self) -> int:
        """The most keys the release answers (public)."""
        if self.keys is not None:
            return len(self.keys)
        assert self.selection is not None
        return self.selection.max_keys

    def typical_size(self, public_size: int | None) -> int | None:
        """The group size ``auto`` ranks methods at: the median hint when every listed key
        has one, else the public size over the keys (public figures either way)."""
        hints = self.size_hints or {}
        if self.keys is not None and self.keys and all(k in hints for k in self.keys):
            return max(1, round(statistics.median(hints[k] for k in self.keys)))
        return group_size(public_size, self.key_count)

    def stored_keys(self) -> list[str] | dict[str, Any]:
        """What ``release.group_keys`` holds: the keys, or the selection's parameters."""
        if self.keys is not None:
            return self.keys
        assert self.selection is not None
        return {"discover": {"epsilon": str(self.selection.epsilon),
                             "delta": str(self.selection.delta),
                             "max_keys": self.selection.max_keys}}  # fmt: skip


def resolve_grouping(
    query: QuantileQuery,
    *,
    categorical: Sequence[tuple[str, tuple[str, ...] | None]],
    neighbors: str,
    rows_per_unit: int,
    accounting: str = "pure",
) -> Grouping | None:
    """The query's grouping (None: not grouped), or 422 naming the field and the problem."""
    if query.group_by is None:
        if query.keys is not None:
            raise invalid("body.keys", "is only used with group_by")
        if query.size_hints is not None:
            raise invalid("body.size_hints", "is only used with group_by")
        if query.selection is not None:
            raise invalid("body.selection", 'is only used with "keys": "discover"')
        return None
    declared = dict(categorical)
    if query.group_by not in declared:
        raise invalid("body.group_by", "is not a categorical column of this dataset")
    if query.keys == "discover":
        found = _discovery(query, neighbors, rows_per_unit, accounting)
        return replace(found, size_hints=query.size_hints)
    if query.selection is not None:
        raise invalid("body.selection", 'is only used with "keys": "discover"')
    keys = query.keys if query.keys is not None else declared[query.group_by]
    if keys is None:
        raise invalid(
            "body.keys",
            f"is required: column {query.group_by!r} declares no keys (name the keys to "
            "answer; keys read from the data would reveal them)",
        )
    if len(keys) * len(query.quantiles) > MAX_GROUPED_ESTIMATES:
        raise invalid(
            "body.keys",
            f"{len(keys)} keys x {len(query.quantiles)} quantiles is more than "
            f"{MAX_GROUPED_ESTIMATES} estimates in one release",
        )
    if query.size_hints is not None:
        listed = set(keys)
        for position, key in enumerate(query.size_hints):
            if key not in listed:
                raise invalid(
                    "body.size_hints",
                    f"entry {position + 1} names a key that is not answered (size hints "
                    "are for the keys asked)",
                )
    try:
        chain = chain_length(neighbors, rows_per_unit)
    except MechanismInputError as exc:
        raise invalid("body.group_by", exc.problem) from None
    return Grouping(query.group_by, list(keys), chain, None, query.size_hints)


def _discovery(
    query: QuantileQuery, neighbors: str, rows_per_unit: int, accounting: str
) -> Grouping:
    assert query.group_by is not None
    selection = query.selection
    if selection is None:
        raise invalid(
            "body.selection",
            'is required with "keys": "discover": the selection\'s epsilon and delta '
            "(debited on top of the release's)",
        )
    if accounting == "zcdp":
        raise invalid(
            "body.keys",
            '"discover" is (epsilon, delta)-DP partition selection, which a zcdp table '
            "cannot account for: name the keys",
        )
    if selection.max_keys * len(query.quantiles) > MAX_GROUPED_ESTIMATES:
        raise invalid(
            "body.selection.max_keys",
            f"{selection.max_keys} keys x {len(query.quantiles)} quantiles is more than "
            f"{MAX_GROUPED_ESTIMATES} estimates in one release",
        )
    try:
        chain = chain_length(neighbors, rows_per_unit)
    except MechanismInputError as exc:
        raise invalid("body.group_by", exc.problem) from None
    return Grouping(query.group_by, None, chain, selection)


def check_method(method: str) -> None:
    """422 on ``body.method`` for a method grouped releases cannot use."""
    if method not in GROUPED_METHODS:
        raise invalid(
            "body.method",
            f"method {method!r} cannot answer grouped queries (each group runs under "
            "add/remove neighbours and may be empty); use one of " + ", ".join(GROUPED_METHODS),
        )


def selection_cost(grouping: Grouping) -> Amount:
    """What the selection adds to the release's debit (zero without one)."""
    if grouping.selection is None:
        return Amount(Decimal(0), Decimal(0))
    return Amount(grouping.selection.epsilon, grouping.selection.delta)


def group_size(public_size: int | None, keys: int) -> int | None:
    """The typical group size ``auto`` ranks methods at: the public size over the keys."""
    return None if public_size is None else max(1, public_size // max(1, keys))


def expectation(
    query: QuantileQuery, grouping: Grouping, *, grid_points: int | None = None
) -> tuple[dict[str, Any], list[str]]:
    """The expected error by group size (public figures only) and warnings; sizes above
    ``grid_points`` (the column's grid) are quoted from the tied model set."""
    epsilon = float(query.epsilon) / grouping.chain
    delta = None if query.delta is None else float(query.delta) / grouping.chain
    rows: list[dict[str, float | int]] = []
    for size in SIZE_LADDER:
        err = planner.expected_error(
            query.method, size, query.quantiles, epsilon, delta, "add_remove",
            grid_points=grid_points,
        )  # fmt: skip
        if err is None:
            return {"by_size": None, "min_size": None}, [
                f"expected error unknown: no error model for method {query.method!r}"
            ]
        rows.append({"size": size, **_error_row(err)})
    min_size = noise_floor(query, epsilon, delta, grid_points=grid_points)
    warnings = []
    if min_size is not None:
        warnings.append(
            f"groups with fewer than {min_size} rows get answers that are mostly noise at "
            f"this epsilon (expected error at least {100 * NOISE_SHARE:.0f} % of their ranks)"
        )
    by_key: list[dict[str, Any]] | None = None
    if grouping.size_hints:
        by_key = []
        small = 0
        for key, hint in grouping.size_hints.items():
            err = planner.expected_error(
                query.method, hint, query.quantiles, epsilon, delta, "add_remove",
                grid_points=grid_points,
            )  # fmt: skip
            if err is None:
                continue
            by_key.append({"key": key, "size": hint, **_error_row(err)})
            small += min_size is not None and hint < min_size
        if small:
            warnings.append(
                f"{small} of the hinted keys {'has' if small == 1 else 'have'} a size hint "
                f"below {min_size} rows: {'its answer is' if small == 1 else 'their answers are'}"
                " mostly noise at this epsilon"
            )
    return {"by_size": rows, "min_size": min_size, "by_key": by_key}, warnings


def noise_floor(
    query: QuantileQuery, epsilon: float, delta: float | None, *, grid_points: int | None = None
) -> int | None:
    """The smallest size (on a ladder of 10^(1/8) steps, rounded to 2 figures) whose expected
    error is below :data:`NOISE_SHARE` of the ranks; None if none up to 10^9 is."""
    for step in range(8, 73):
        size = int(float(f"{10 ** (step / 8):.2g}"))
        err = planner.expected_error(
            query.method, size, query.quantiles, epsilon, delta, "add_remove",
            grid_points=grid_points,
        )  # fmt: skip
        if err is None:
            return None
        if err[0] < NOISE_SHARE * size:
            return size
    return None


def _error_row(err: planner.ErrorFigures) -> dict[str, float]:
    """A stored expected-error row's figures, at four significant digits."""
    return {name: _figures(value) for name, value in err._asdict().items()}


def _figures(value: float) -> float:
    return float(f"{value:.4g}")


__all__ = [
    "GROUPED_METHODS",
    "NOISE_SHARE",
    "SIZE_LADDER",
    "Grouping",
    "check_method",
    "expectation",
    "group_size",
    "noise_floor",
    "resolve_grouping",
]

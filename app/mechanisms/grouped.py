"""Grouped releases: the same quantiles of one numeric column in every group of a
categorical column, in one release that is private for a unit as a whole.

**Derivation** (docs/mechanisms.md, "Grouped releases"). The groups partition the rows, and
a unit owns at most ``k = max_rows_per_unit`` rows in all (the table's bound, kept at
upload), so it touches at most k groups. Each group's answer is the method run on that
group's rows alone, under *row-level add/remove* neighbours at ``ε_row``, with independent
randomness. Unit-level neighbours are joined by a chain of row-level steps, each of which
adds or removes one row of one group and so changes exactly one group's input:

* table ``add_remove`` (a unit and all its rows added or removed): at most k steps;
* table ``swap`` (a unit's rows change, and with them possibly their groups): a row that
  moves from group A to group B is a removal from A and an addition to B, so at most 2k
  steps.

One step changes one group's input by one row, so the joint law of all groups (a product
of independent laws) moves by at most the one group mechanism's row-level guarantee; the
chain of ``r`` steps (``r = k`` or ``2k``) gives ``r ε_row`` (pure), ``(r ε_row, r
e^{(r-1) ε_row} δ_row)`` (approximate DP) by group privacy, exactly the arithmetic of
:mod:`app.mechanisms.units` with ``r`` rows. So a grouped release costs the ε asked, however
many groups it answers, and no bound on the number of groups a unit touches is needed
beyond k. A group with no rows is answered too: the method's law on the empty dataset (every
exponential-mechanism method is defined there: one interval, the whole range), since its
absence would reveal that the group is empty.

Eligible methods: those with a grid core whose analysis covers add/remove neighbours and
which are defined on an empty input (jointexp, indexp, appindexp, aq, and jointexp_smooth,
whose jitter of no record is no record: JointExp on the empty refined grid). The
smooth-sensitivity methods assume a fixed size (swap only).

Pure math: no service imports.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from app.mechanisms.errors import MechanismInputError
from app.mechanisms.histogram import GridHistogram, Support, support_from_grid
from app.mechanisms.registry import Mechanism
from app.mechanisms.rng import make_rng
from app.mechanisms.units import MAX_ROWS_PER_UNIT
from app.mechanisms.validation import IntArray, check_neighbors

#: Methods a grouped release can use (module docstring).
GROUPED_METHODS: tuple[str, ...] = ("jointexp", "indexp", "appindexp", "aq", "jointexp_smooth")


def chain_length(neighbors: str, rows_per_unit: int) -> int:
    """Row-level add/remove steps joining two unit-level neighbours of a grouped release:
    k under ``add_remove``, 2k under ``swap`` (a moved row leaves one group, joins another)."""
    relation = check_neighbors(neighbors)
    steps = rows_per_unit * (2 if relation == "swap" else 1)
    if steps > MAX_ROWS_PER_UNIT:
        raise MechanismInputError(
            "max_rows_per_unit",
            f"a grouped release under {relation} neighbours is calibrated for {steps} "
            f"row changes, more than {MAX_ROWS_PER_UNIT}",
        )
    return steps


def check_grouped_method(mechanism: Mechanism) -> None:
    """422 on ``method`` for a method a grouped release cannot use (module docstring)."""
    if mechanism.name not in GROUPED_METHODS:
        raise MechanismInputError(
            "method",
            f"method {mechanism.name!r} cannot answer grouped queries (each group is "
            "released under add/remove neighbours and may be empty); use one of "
            + ", ".join(GROUPED_METHODS),
        )


def empty_support(
    grid_points: int, quantiles: ArrayLike, *, epsilon: float, neighbors: str
) -> Support:
    """The support of a group with no rows: one interval, the whole grid ``[0, K]``."""
    probe = GridHistogram.from_arrays([0], [1], grid_points)  # validates the grid size
    sup = support_from_grid(probe, quantiles, epsilon=epsilon, neighbors=neighbors)
    return Support(
        edges=np.array([0.0, float(grid_points)]),
        cum=np.zeros(1, dtype=np.int64),
        quantiles=sup.quantiles,
        epsilon=sup.epsilon,
        neighbors=sup.neighbors,
        grid=True,
    )


def run_groups(
    mechanism: Mechanism,
    groups: Sequence[GridHistogram | None],
    quantiles: ArrayLike,
    *,
    grid_points: int,
    epsilon: float,
    delta: float | None,
    neighbors: str,
    rows_per_unit: int = 1,
    rng: np.random.Generator | None = None,
) -> list[IntArray]:
    """One sorted array of m grid indices per group (``None``: a group with no rows), the
    whole release private for one unit of ``rows_per_unit`` rows at (``epsilon``,
    ``delta``) under the table's ``neighbors`` (module docstring)."""
    check_grouped_method(mechanism)
    if mechanism.core is None:  # pragma: no cover - every grouped method has one
        raise MechanismInputError("method", f"method {mechanism.name!r} has no grid entry point")
    steps = chain_length(neighbors, rows_per_unit)
    eps_row, extra = mechanism.row_level(epsilon, delta, steps)
    gen = make_rng(rng)
    out: list[IntArray] = []
    for hist in groups:
        if hist is None:
            sup = empty_support(grid_points, quantiles, epsilon=eps_row, neighbors="add_remove")
        else:
            if hist.grid_points != grid_points:
                raise MechanismInputError("groups", "every group must be on the same grid")
            sup = support_from_grid(hist, quantiles, epsilon=eps_row, neighbors="add_remove")
        raw = np.asarray(mechanism.core(sup, gen, **extra), dtype=np.int64)
        out.append(raw)
    return out


__all__ = ["GROUPED_METHODS", "chain_length", "check_grouped_method", "empty_support", "run_groups"]

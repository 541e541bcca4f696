"""Privacy units: the per-row parameters that make a release private for a unit of k rows.

A table's privacy unit (a person) may own up to ``k = max_rows_per_unit`` rows of the column
a release reads. Unit-level neighbours are

* ``swap``: the values of one unit's rows change (at most k rows; the number of rows each
  unit owns is not changed by the relation);
* ``add_remove``: one unit is added or removed with all of its rows (at most k).

Either way the two datasets are joined by a chain of at most k row-level neighbours of the
same relation, so a release that is private for one row is private for one unit with the
guarantee grown by group privacy. :func:`row_parameters` turns the unit-level request into
the per-row parameters, by the method's privacy notion:

* pure ε-DP: ``ε_row = ε / k``. An ε_row-DP mechanism is kε_row-DP for groups of k (chain the
  k steps). For the exponential-mechanism methods this is the same calibration as a utility
  of sensitivity kΔ (every utility here is a sum of per-row Lipschitz terms, so k row changes
  move it by at most kΔ): ``c = ε / (2kΔ)``.
* (ε, δ)-DP (AppIndExp, Smooth): ``ε_row = ε / k`` and ``δ_row = δ / (k e^{(k-1)ε/k})``. An
  (ε_r, δ_r)-DP mechanism is (kε_r, k e^{(k-1)ε_r} δ_r)-DP for groups of k (Dwork & Roth
  2014, Lemma 2.2, by induction over the chain: step i contributes ``e^{(i-1)ε_r} δ_r``).
* ρ-zCDP (CSmooth): ``ρ_row = ρ / k²``: ρ-zCDP is k²ρ-zCDP for groups of k (Bun & Steinke 2016,
  Proposition 27), and the conversion to (ε, δ) is then made on the unit-level ρ.

The divisions are rounded towards zero (``k ε_row <= ε`` exactly, ``δ_row`` under the
bound with a relative margin for the exponential's rounding), so a row-level guarantee never
exceeds its share. ``k = 1`` returns the request unchanged.

Pure math: no service imports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from app.mechanisms.errors import MechanismInputError
from app.mechanisms.validation import EPSILON_MIN

#: The largest ``max_rows_per_unit`` a release accepts. A unit of k rows leaves each row
#: ε/k; past 10^4 rows per unit no quantile release says anything useful at any ε the
#: service accepts (ε ≤ 100 leaves 0.01 per row).
MAX_ROWS_PER_UNIT = 10_000


@dataclass(frozen=True)
class RowParameters:
    """What the row-level mechanism runs at so that the release is private per unit.

    ``epsilon``: the row-level ε (the method's own parameter; zCDP methods keep the request's
    ε and δ, which fix the unit-level ρ). ``delta``: the row-level δ where the method takes
    one. ``rho_divisor``: zCDP methods divide their calibrated ρ by it (k², 1 otherwise).
    """

    epsilon: float
    delta: float | None
    rho_divisor: int


def check_rows_per_unit(rows: object) -> int:
    """A unit's row bound: an integer in [1, MAX_ROWS_PER_UNIT]."""
    if isinstance(rows, bool) or not isinstance(rows, int):
        raise MechanismInputError("max_rows_per_unit", "must be an integer")
    if not 1 <= rows <= MAX_ROWS_PER_UNIT:
        raise MechanismInputError(
            "max_rows_per_unit", f"must lie between 1 and {MAX_ROWS_PER_UNIT} (got {rows})"
        )
    return rows


def share_down(total: float, parts: int) -> float:
    """The largest double ``x <= total / parts`` (exactly: ``parts * x <= total``)."""
    x = total / parts
    while Fraction(x) * parts > Fraction(total):
        x = math.nextafter(x, 0.0)
    return x


#: Relative margin on δ_row for the rounding of ``exp`` and the two divisions (each within
#: one ulp; 2^-40 leaves room for a platform exp a few ulps off).
_DELTA_MARGIN = 1.0 - 2.0**-40


def group_delta_factor(epsilon_row: float, rows: int) -> float:
    """``k e^{(k-1) ε_row}``: what group privacy multiplies a row-level δ by for k rows."""
    return rows * math.exp((rows - 1) * epsilon_row)


def row_parameters(notion: str, epsilon: float, delta: float | None, rows: int) -> RowParameters:
    """The per-row parameters for a release at unit-level (``epsilon``, ``delta``) over units
    of at most ``rows`` rows, for a method proven in ``notion`` ("pure_dp", "approx_dp",
    "zcdp"; :class:`~app.mechanisms.registry.PrivacyNotion` values)."""
    k = check_rows_per_unit(rows)
    if k == 1:
        return RowParameters(epsilon, delta, 1)
    if notion == "zcdp":
        return RowParameters(epsilon, delta, k * k)
    eps_row = share_down(epsilon, k)
    if eps_row < EPSILON_MIN:
        raise MechanismInputError(
            "epsilon",
            f"leaves {eps_row:.3g} per row for units of {k} rows, below the smallest epsilon "
            f"a mechanism accepts ({EPSILON_MIN:g})",
        )
    if notion == "pure_dp" or delta is None:
        return RowParameters(eps_row, delta, 1)
    delta_row = delta / group_delta_factor(eps_row, k) * _DELTA_MARGIN
    return RowParameters(eps_row, delta_row, 1)


__all__ = [
    "MAX_ROWS_PER_UNIT",
    "RowParameters",
    "check_rows_per_unit",
    "group_delta_factor",
    "row_parameters",
    "share_down",
]

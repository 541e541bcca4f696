"""The registry entry: one mechanism, its two entry points and its declared guarantee."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from app.mechanisms.errors import MechanismInputError
from app.mechanisms.histogram import (
    GridHistogram,
    Support,
    support_from_grid,
)
from app.mechanisms.rng import make_rng
from app.mechanisms.units import RowParameters, row_parameters
from app.mechanisms.validation import FloatArray, IntArray, check_delta, check_epsilon


class PrivacyNotion(StrEnum):
    """The privacy definition a mechanism is proven in."""

    PURE_DP = "pure_dp"  # epsilon-DP
    APPROX_DP = "approx_dp"  # (epsilon, delta)-DP
    ZCDP = "zcdp"  # rho-zCDP, converted to (epsilon, delta)-DP for pricing


CostFn = Callable[[float, float | None], tuple[float, float]]
#: ``rho(epsilon, delta, m)``: the zCDP parameter one release with these parameters
#: satisfies (for the privacy unit; see :meth:`Mechanism.zcdp_cost`), exactly: epsilon and
#: the result are fractions, so the ledger can debit it without rounding error.
ZcdpFn = Callable[[Fraction, float | None, int], Fraction]
#: ``core(support, rng, **method_params)``: sorted outputs, doubles on a value support and
#: int64 grid indices on a grid support.
CoreFn = Callable[..., FloatArray | IntArray]


@dataclass(frozen=True)
class Mechanism:
    """A registry entry: the sampling functions plus the declared privacy guarantee.

    Calling the entry calls ``fn``, the raw-array form::

        f(data, quantiles, *, epsilon, lower, upper, neighbors="swap", rng=None,
          **method_params) -> np.ndarray  # m estimates, ascending, inside [lower, upper]

    which builds (distinct clamped values, counts) and runs ``core`` on it, returning doubles
    drawn inside the chosen intervals. :meth:`run_grid` runs ``core`` on a
    :class:`GridHistogram` and returns grid indices. ``dp_cost(epsilon, delta)`` is the
    (epsilon, delta)-DP cost of one release with those parameters: the figures the service
    debits. Failure-injection tests replace ``fn`` (raw-array path) or ``core`` (run_grid).
    """

    name: str
    fn: Callable[..., FloatArray]
    notion: PrivacyNotion
    summary: str
    requires_delta: bool = False
    method_params: tuple[str, ...] = ()
    cost_fn: CostFn | None = field(default=None, repr=False)
    core: CoreFn | None = field(default=None, repr=False)
    #: The release's zCDP parameter, where the method is proven in zCDP or bounded range;
    #: None: (epsilon, delta)-DP only, not accountable in a zCDP table.
    zcdp_fn: ZcdpFn | None = field(default=None, repr=False)
    #: One line: why ``zcdp_fn`` holds (or why there is none), with the citation.
    zcdp_basis: str = ""
    #: Neighbour relations the mechanism's privacy analysis covers.
    neighbors: tuple[str, ...] = ("swap", "add_remove")

    def _check_params(self, method_params: dict[str, Any]) -> None:
        unknown = sorted(set(method_params) - set(self.method_params))
        if unknown:
            raise MechanismInputError(unknown[0], f"is not a parameter of method {self.name!r}")

    def __call__(
        self,
        data: ArrayLike,
        quantiles: ArrayLike,
        *,
        epsilon: float,
        lower: float,
        upper: float,
        neighbors: str = "swap",
        rng: np.random.Generator | None = None,
        **method_params: Any,
    ) -> FloatArray:
        self._check_params(method_params)
        return self.fn(
            data,
            quantiles,
            epsilon=epsilon,
            lower=lower,
            upper=upper,
            neighbors=neighbors,
            rng=rng,
            **method_params,
        )

    @property
    def uses_delta(self) -> bool:
        """True when a release must name a delta: the function takes one or the cost needs one."""
        return self.requires_delta or self.notion is not PrivacyNotion.PURE_DP

    def _delta_kwargs(self, delta: float | None) -> dict[str, Any]:
        """Refuse a delta the method has no use for; require one where it is used."""
        if delta is not None and not self.uses_delta:
            raise MechanismInputError("delta", f"is not used by method {self.name!r}")
        if self.uses_delta:
            check_delta(delta)
        return {"delta": delta} if "delta" in self.method_params else {}

    def row_level(
        self, epsilon: float, delta: float | None, rows_per_unit: int
    ) -> tuple[float, dict[str, Any]]:
        """The row-level epsilon and extra arguments for a release that is private for one
        unit of up to ``rows_per_unit`` rows at the requested (epsilon, delta)
        (:mod:`app.mechanisms.units`). The same checks of delta as :meth:`run`."""
        check_epsilon(epsilon)
        extra = self._delta_kwargs(delta)
        row: RowParameters = row_parameters(
            self.notion.value, epsilon, extra.get("delta"), rows_per_unit
        )
        if "delta" in extra:
            extra["delta"] = row.delta
        if row.rho_divisor != 1:
            extra["rho_divisor"] = row.rho_divisor
        return row.epsilon, extra

    def run(
        self,
        data: ArrayLike,
        quantiles: ArrayLike,
        *,
        epsilon: float,
        delta: float | None,
        lower: float,
        upper: float,
        neighbors: str = "swap",
        rng: np.random.Generator | None = None,
        rows_per_unit: int = 1,
    ) -> FloatArray:
        """Call the mechanism with ``delta`` passed exactly when the method takes one.

        A delta given to a method that has no use for it is refused rather than ignored, so a
        caller never believes it bought something it did not. ``rows_per_unit``: the release
        is private for one unit owning up to that many rows (:meth:`row_level`).
        """
        eps_row, extra = self.row_level(epsilon, delta, rows_per_unit)
        # extra holds only what row_level formed (delta, a zCDP method's rho_divisor)
        return self.fn(
            data,
            quantiles,
            epsilon=eps_row,
            lower=lower,
            upper=upper,
            neighbors=neighbors,
            rng=rng,
            **extra,
        )

    def run_grid(
        self,
        hist: GridHistogram,
        quantiles: ArrayLike,
        *,
        epsilon: float,
        delta: float | None,
        neighbors: str = "swap",
        rng: np.random.Generator | None = None,
        rows_per_unit: int = 1,
    ) -> IntArray:
        """Run the mechanism on a grid histogram; m grid indices, ascending, in [0, K].

        The output space is the grid itself. The exponential-mechanism methods (jointexp,
        indexp, appindexp, aq) draw exactly on it: block weights are numbers of grid points
        and the point inside a block is a uniform integer from raw generator words. The
        noise-adding methods (smooth, csmooth) add their floating-point noise in grid units
        and round to the nearest index (post-processing). Same delta and unit rules as
        :meth:`run`.
        """
        eps_row, extra = self.row_level(epsilon, delta, rows_per_unit)
        if self.core is None:
            raise MechanismInputError("method", f"method {self.name!r} has no grid entry point")
        sup = support_from_grid(hist, quantiles, epsilon=eps_row, neighbors=neighbors)
        raw = np.asarray(self.core(sup, make_rng(rng), **extra))
        if raw.dtype == np.int64:
            return raw.astype(np.int64, copy=False)
        # noise-adding methods: round to the grid (post-processing)
        out = np.clip(np.rint(raw), 0, hist.grid_points - 1).astype(np.int64)
        out.sort()
        return out

    def dp_cost(self, *, epsilon: float, delta: float | None = None) -> tuple[float, float]:
        """The (epsilon, delta)-DP guarantee of one release with these parameters."""
        check_epsilon(epsilon)
        if self.uses_delta:
            if delta is None:
                raise MechanismInputError("delta", f"is required for method {self.name!r}")
            check_delta(delta)
        elif delta is not None:
            raise MechanismInputError("delta", f"is not used by method {self.name!r}")
        if self.cost_fn is not None:
            return self.cost_fn(epsilon, delta)
        if self.notion is PrivacyNotion.PURE_DP:
            return (epsilon, 0.0)
        if delta is None:  # unreachable: uses_delta checked above
            raise MechanismInputError("delta", "is required for this method")
        return (epsilon, delta)

    def zcdp_cost(self, *, epsilon: Fraction | float, delta: float | None, m: int) -> Fraction:
        """The rho of one release of ``m`` quantiles at (``epsilon``, ``delta``): what a zCDP
        table debits. Holds for the privacy unit too: a row-level mechanism run at epsilon/k
        that is (epsilon/k)-bounded-range is epsilon-bounded-range for a unit of k rows (the
        privacy loss telescopes along the k single-row changes, and ranges add), and a
        rho/k^2-zCDP row-level run is rho-zCDP for the unit (group privacy of zCDP).
        :class:`MechanismInputError` on ``method`` when the method has no zCDP bound."""
        if self.zcdp_fn is None:
            raise MechanismInputError(
                "method",
                f"method {self.name!r} is proven only in (epsilon, delta)-DP and cannot be "
                "accounted in zCDP",
            )
        self.dp_cost(epsilon=float(epsilon), delta=delta)  # the checks of the (e, d) price
        return self.zcdp_fn(Fraction(epsilon), delta, m)


def bounded_range_rho(epsilon: Fraction) -> Fraction:
    """An epsilon-bounded-range mechanism is (epsilon^2 / 8)-zCDP (Cesar & Rogers 2021,
    Lemma 3.2; Dong, Durfee & Rogers 2020)."""
    return epsilon * epsilon / 8


def pure_dp_rho(epsilon: Fraction) -> Fraction:
    """Any epsilon-DP mechanism is (epsilon^2 / 2)-zCDP (Bun & Steinke 2016, Prop. 1.4)."""
    return epsilon * epsilon / 2


__all__ = [
    "CoreFn",
    "CostFn",
    "Mechanism",
    "PrivacyNotion",
    "Support",
    "ZcdpFn",
    "bounded_range_rho",
    "pure_dp_rho",
]

"""Validation of the arguments every mechanism shares; array type aliases."""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from app.mechanisms.errors import MechanismInputError

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
Neighbors = Literal["swap", "add_remove"]
NEIGHBORS: tuple[str, ...] = ("swap", "add_remove")


#: The largest epsilon any mechanism accepts. The exactness arguments of the exponential-
#: mechanism samplers (docs/mechanisms.md, "What floating point does") hold up to it: with
#: c = epsilon / (2 sensitivity) <= 100 every kernel factor of one position step, e^-c, is a
#: normal double far from underflow, and the log kernels' mantissa factors e^-(c f) never
#: leave the range their exponent bookkeeping assumes (they do from c ~ 700 on).
#: Beyond ~20 an epsilon offers no meaningful privacy; 100 leaves room for tests and demos.
EPSILON_MAX = 100.0
#: Smallest epsilon any method accepts. The single-quantile picks run at a parameter lowered
#: by their floating-point slack (~10^-12, ``exponential.run_parameter``); at 10^-7 split
#: over 1,000 quantiles each pick's ``c`` is still 5·10^-11, above it. Far below any
#: useful epsilon (the service's own floor is 0.001 by default).
EPSILON_MIN = 1e-7
#: Smallest epsilon per quantile: a method that splits epsilon over m quantiles gives each
#: pick at least ``epsilon / (2 m sensitivity)``, and at 10^-10 per quantile that is still
#: above the picks' slack. It binds only past 1,000 quantiles at EPSILON_MIN.
EPSILON_PER_QUANTILE_MIN = EPSILON_MIN / 1000


def check_epsilon(epsilon: float) -> float:
    try:
        eps = float(epsilon)
    except (TypeError, ValueError):
        raise MechanismInputError("epsilon", "must be a number") from None
    if not math.isfinite(eps) or eps <= 0.0:
        raise MechanismInputError("epsilon", f"must be finite and > 0 (got {epsilon!r})")
    if eps < EPSILON_MIN:
        raise MechanismInputError(
            "epsilon",
            f"must be at least {EPSILON_MIN:g} (got {epsilon!r}): below it the samplers' "
            "floating-point guarantee cannot be given",
        )
    if eps > EPSILON_MAX:
        raise MechanismInputError(
            "epsilon",
            f"must be at most {EPSILON_MAX:g} (got {epsilon!r}): the samplers' exactness is "
            "proven up to that value",
        )
    return eps


def check_epsilon_share(epsilon: float, quantiles: int) -> None:
    """Refuse an epsilon below :data:`EPSILON_PER_QUANTILE_MIN` per quantile."""
    if quantiles > 0 and epsilon / quantiles < EPSILON_PER_QUANTILE_MIN:
        raise MechanismInputError(
            "epsilon",
            f"must be at least {EPSILON_PER_QUANTILE_MIN:g} per quantile "
            f"({quantiles} quantiles need at least {quantiles * EPSILON_PER_QUANTILE_MIN:g}): "
            "below it the samplers' floating-point guarantee cannot be given",
        )


def check_delta(delta: float | None) -> float:
    if delta is None:
        raise MechanismInputError("delta", "is required for this method")
    try:
        d = float(delta)
    except (TypeError, ValueError):
        raise MechanismInputError("delta", "must be a number") from None
    if not math.isfinite(d) or not 0.0 < d < 1.0:
        raise MechanismInputError("delta", f"must lie strictly between 0 and 1 (got {delta!r})")
    return d


def check_bounds(lower: float, upper: float) -> tuple[float, float]:
    try:
        lo, hi = float(lower), float(upper)
    except (TypeError, ValueError):
        raise MechanismInputError("lower", "bounds must be numbers") from None
    if not math.isfinite(lo):
        raise MechanismInputError("lower", f"must be finite (got {lower!r})")
    if not math.isfinite(hi):
        raise MechanismInputError("upper", f"must be finite (got {upper!r})")
    if not lo < hi:
        raise MechanismInputError("upper", f"must be greater than lower (got {lo!r} >= {hi!r})")
    if not math.isfinite(hi - lo):
        raise MechanismInputError("upper", "upper - lower overflows a double")
    return lo, hi


def check_neighbors(neighbors: str) -> Neighbors:
    if neighbors == "swap":
        return "swap"
    if neighbors == "add_remove":
        return "add_remove"
    raise MechanismInputError(
        "neighbors", f"must be one of {', '.join(NEIGHBORS)} (got {neighbors!r})"
    )


def check_quantiles(quantiles: ArrayLike) -> FloatArray:
    try:
        q = np.asarray(quantiles, dtype=np.float64)
    except (TypeError, ValueError):
        raise MechanismInputError("quantiles", "must be a sequence of numbers") from None
    if q.ndim == 0:
        q = q.reshape(1)
    if q.ndim != 1:
        raise MechanismInputError("quantiles", "must be one-dimensional")
    if q.size == 0:
        raise MechanismInputError("quantiles", "must not be empty")
    # Valid exactly when strictly increasing from above 0 to below 1: every comparison with
    # a NaN is False, and a strictly increasing sequence inside (0, 1) is finite. Only a
    # refused input goes on to the checks that name the problem.
    if q[0] > 0.0 and q[-1] < 1.0 and (q.size == 1 or (q[1:] > q[:-1]).all()):
        return q
    if not np.all(np.isfinite(q)):
        raise MechanismInputError("quantiles", "must be finite numbers")
    if np.any(q <= 0.0) or np.any(q >= 1.0):
        raise MechanismInputError("quantiles", "every quantile must lie strictly inside (0, 1)")
    d = np.diff(q)
    if np.any(d == 0.0):
        raise MechanismInputError("quantiles", "must not contain duplicates")
    if np.any(d < 0.0):
        raise MechanismInputError("quantiles", "must be sorted in strictly increasing order")
    return q


def check_data(data: ArrayLike) -> FloatArray:
    """Return ``data`` as a 1-D float64 array; never echoes a data value in an error."""
    try:
        x = np.asarray(data, dtype=np.float64)
    except (TypeError, ValueError):
        raise MechanismInputError("data", "must be a one-dimensional array of numbers") from None
    if x.ndim != 1:
        raise MechanismInputError("data", "must be one-dimensional")
    if x.size == 0:
        raise MechanismInputError("data", "must not be empty")
    finite = np.isfinite(x)
    if not finite.all():
        first = int(np.argmin(finite))
        raise MechanismInputError("data", f"contains a non-finite value at index {first}")
    return x

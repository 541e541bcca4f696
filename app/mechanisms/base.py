"""Shared pieces of every quantile mechanism: validation, randomness, intervals, sampling.

Everything here is pure numpy/numba. No web, database or logging imports: this package
must stay usable as a library and must never emit data-dependent output on its own.

Conventions used throughout ``app.mechanisms``:

* ``edges`` is the sorted, clamped data with the public bounds prepended and appended:
  ``edges = [a, x_1, ..., x_n, b]`` (length ``n + 2``). Interval ``i`` (``0 <= i <= n``) is
  ``[edges[i], edges[i + 1])``; for ``o`` inside interval ``i`` exactly ``i`` data points are
  ``<= o`` (and ``< o``). Ties and clamped points give zero-width intervals, which carry zero
  weight and can never be output.
* Every sampler receives an ``np.random.Generator``; ``rng=None`` is replaced by a fresh
  generator keyed from the OS CSPRNG (:func:`make_rng`).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

import numba
import numpy as np
from numpy.typing import ArrayLike, NDArray
from randomgen import ChaCha

FloatArray = NDArray[np.float64]
Neighbors = Literal["swap", "add_remove"]
NEIGHBORS: tuple[str, ...] = ("swap", "add_remove")


class MechanismInputError(ValueError):
    """Invalid input to a mechanism; ``parameter`` names the offending argument.

    Messages name the parameter and the problem. They may repeat a bad *parameter* value
    (epsilon, bounds, quantiles: all chosen by the caller) but never a data value: for data
    problems only the position of the first bad element is given.
    """

    def __init__(self, parameter: str, problem: str) -> None:
        super().__init__(f"{parameter}: {problem}")
        self.parameter = parameter
        self.problem = problem


class PrivacyNotion(StrEnum):
    """The privacy definition a mechanism is proven in."""

    PURE_DP = "pure_dp"  # epsilon-DP
    APPROX_DP = "approx_dp"  # (epsilon, delta)-DP
    ZCDP = "zcdp"  # rho-zCDP, converted to (epsilon, delta)-DP for pricing


CostFn = Callable[[float, float | None], tuple[float, float]]


def _pure_cost(epsilon: float, delta: float | None) -> tuple[float, float]:
    return (epsilon, 0.0)


def _approx_cost(epsilon: float, delta: float | None) -> tuple[float, float]:
    if delta is None:
        raise MechanismInputError("delta", "is required for this method")
    return (epsilon, delta)


@dataclass(frozen=True)
class Mechanism:
    """A registry entry: the sampling function plus its declared privacy guarantee.

    Calling the entry calls the function with the shared signature::

        f(data, quantiles, *, epsilon, lower, upper, neighbors="swap", rng=None,
          **method_params) -> np.ndarray  # m estimates, ascending, inside [lower, upper]

    ``dp_cost(epsilon, delta)`` returns the (epsilon, delta)-DP cost of one release made with
    those parameters: the figures the service debits.
    """

    name: str
    fn: Callable[..., FloatArray]
    notion: PrivacyNotion
    summary: str
    requires_delta: bool = False
    method_params: tuple[str, ...] = ()
    cost_fn: CostFn | None = field(default=None, repr=False)

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
        unknown = sorted(set(method_params) - set(self.method_params))
        if unknown:
            raise MechanismInputError(unknown[0], f"is not a parameter of method {self.name!r}")
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
    ) -> FloatArray:
        """Call the mechanism with ``delta`` passed exactly when the method takes one.

        A delta given to a method that has no use for it is refused rather than ignored, so a
        caller never believes it bought something it did not.
        """
        if delta is not None and not self.uses_delta:
            raise MechanismInputError("delta", f"is not used by method {self.name!r}")
        if self.uses_delta:
            check_delta(delta)
        extra: dict[str, Any] = {"delta": delta} if "delta" in self.method_params else {}
        return self(
            data,
            quantiles,
            epsilon=epsilon,
            lower=lower,
            upper=upper,
            neighbors=neighbors,
            rng=rng,
            **extra,
        )

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
            return _pure_cost(epsilon, delta)
        return _approx_cost(epsilon, delta)


# --------------------------------------------------------------------------- validation


def check_epsilon(epsilon: float) -> float:
    try:
        eps = float(epsilon)
    except (TypeError, ValueError):
        raise MechanismInputError("epsilon", "must be a number") from None
    if not math.isfinite(eps) or eps <= 0.0:
        raise MechanismInputError("epsilon", f"must be finite and > 0 (got {epsilon!r})")
    return eps


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


@dataclass(frozen=True)
class Prepared:
    """Validated inputs shared by all mechanisms."""

    edges: FloatArray  # [a, sorted clamped data..., b], length n + 2
    quantiles: FloatArray
    epsilon: float
    lower: float
    upper: float
    neighbors: Neighbors

    @property
    def n(self) -> int:
        return int(self.edges.size - 2)

    @property
    def widths(self) -> FloatArray:
        return np.diff(self.edges)

    @property
    def sorted_data(self) -> FloatArray:
        return self.edges[1:-1]


def prepare(
    data: ArrayLike,
    quantiles: ArrayLike,
    *,
    epsilon: float,
    lower: float,
    upper: float,
    neighbors: str,
) -> Prepared:
    """Validate every common argument and build the clamped, sorted interval edges."""
    eps = check_epsilon(epsilon)
    lo, hi = check_bounds(lower, upper)
    nb = check_neighbors(neighbors)
    q = check_quantiles(quantiles)
    x = check_data(data)
    edges = np.empty(x.size + 2, dtype=np.float64)
    edges[0] = lo
    edges[-1] = hi
    np.clip(x, lo, hi, out=edges[1:-1])
    edges[1:-1].sort(kind="quicksort")
    return Prepared(edges=edges, quantiles=q, epsilon=eps, lower=lo, upper=hi, neighbors=nb)


# --------------------------------------------------------------------------- randomness


def make_rng(rng: np.random.Generator | None) -> np.random.Generator:
    """Return ``rng`` or, when None, a fresh generator keyed with 128 bits from the OS CSPRNG.

    The production bit stream is ChaCha with 20 rounds (a cryptographically strong stream
    cipher), keyed from :mod:`secrets`; numpy's global state is never touched.
    """
    if rng is None:
        return np.random.Generator(ChaCha(seed=secrets.randbits(128), rounds=20))
    if not isinstance(rng, np.random.Generator):
        raise MechanismInputError("rng", "must be a numpy.random.Generator or None")
    return rng


# --------------------------------------------------------------------------- sampling


@numba.njit(cache=True, nogil=True)
def _inverse_cdf_pick(weights: FloatArray, u: float) -> int:
    """Index of the first cumulative weight exceeding ``u * total`` (never a zero weight)."""
    total = 0.0
    for k in range(weights.size):
        total += weights[k]
    target = u * total
    acc = 0.0
    last_positive = -1
    for k in range(weights.size):
        wk = weights[k]
        if wk > 0.0:
            acc += wk
            last_positive = k
            if acc > target:
                return k
    return last_positive


def sample_index(weights: FloatArray, rng: np.random.Generator) -> int:
    """Draw index ``k`` with probability ``weights[k] / weights.sum()`` using one uniform.

    ``weights`` must be non-negative with a positive, finite sum. Zero weights are never
    returned.
    """
    k = int(_inverse_cdf_pick(weights, rng.random()))
    if k < 0:
        raise FloatingPointError("sampling weights are all zero")
    return k


def uniform_in_intervals(
    edges: FloatArray, idx: NDArray[np.int64], rng: np.random.Generator
) -> FloatArray:
    """One uniform draw inside each interval ``[edges[i], edges[i+1])``, returned sorted."""
    left = edges[idx]
    right = edges[idx + 1]
    out = left + rng.random(idx.size) * (right - left)
    # Rounding can land exactly on the right end; keep the half-open interval half-open.
    hit = out >= right
    if np.any(hit):
        out[hit] = np.nextafter(right[hit], -np.inf)
    np.maximum(out, left, out=out)
    out.sort()
    return out


@numba.njit(cache=True, nogil=True)
def _exp_mech_weights(log_widths: FloatArray, target: float, c: float, out: FloatArray) -> None:
    """out[i] = exp(log_widths[i] - c|i - target| - max_k(...)): max-normalised weights."""
    n1 = log_widths.size
    top = -np.inf
    for i in range(n1):
        s = log_widths[i] - c * abs(i - target)
        out[i] = s
        if s > top:
            top = s
    for i in range(n1):
        s = out[i]
        out[i] = math.exp(s - top) if s > -np.inf else 0.0


def log_widths(edges: FloatArray) -> FloatArray:
    """Natural log of the interval widths; zero-width intervals get -inf (never sampled)."""
    w = np.diff(edges)
    with np.errstate(divide="ignore"):
        return np.log(w)


@numba.njit(cache=True, nogil=True)
def _exp_mech_window(w: FloatArray, target: float, c: float, lo: int, out: FloatArray) -> float:
    """out[v] = w[lo + v] * exp(-c |lo + v - target|) over the window; returns the max."""
    top = 0.0
    for v in range(out.size):
        x = w[lo + v] * math.exp(-c * abs(lo + v - target))
        out[v] = x
        if x > top:
            top = x
    return top


EM_GUARD = 2.0**-100  # a window whose best weight is below this falls back to log space


def exponential_mechanism_interval(
    logw: FloatArray,
    target: float,
    c: float,
    rng: np.random.Generator,
    w: FloatArray | None = None,
) -> int:
    """Sample interval ``i`` with probability proportional to ``width_i * exp(-c|i - target|)``.

    This is the single-quantile exponential mechanism of Smith (2011) over the ``n + 1``
    intervals between sorted, clamped data points: score ``-|i - target|`` where ``i`` is the
    number of points below the output, and ``c = epsilon / (2 * sensitivity)``. ``logw`` is
    :func:`log_widths` of the edges; ``w`` (optional, for repeated calls) is
    ``exp(logw - max(logw))``.

    Fast path: with widths scaled to at most 1, every weight farther than ``746 / c`` from the
    target is exactly 0.0 in double precision, so only that window is formed, in linear space.
    If the window's best weight is below 2^-100 (tiny widths or a long run of ties near the
    target), the weights are formed in log space over all intervals and max-normalised, which
    is exact for any range. One uniform draw either way. O(min(n, 1/c)) time on the fast path.
    """
    if w is None:
        w = np.exp(logw - float(np.max(logw)))
    n1 = logw.size
    reach = math.ceil(746.0 / c) + 1
    lo = max(0, math.floor(target) - reach)
    hi = min(n1, math.ceil(target) + reach + 1)
    if hi > lo:
        out = np.empty(hi - lo)
        top = _exp_mech_window(w, float(target), float(c), lo, out)
        if top >= EM_GUARD:
            return lo + sample_index(out, rng)
    full = np.empty_like(logw)
    _exp_mech_weights(logw, float(target), float(c), full)
    return sample_index(full, rng)


def as_list(values: Sequence[float] | FloatArray) -> list[float]:
    return [float(v) for v in values]

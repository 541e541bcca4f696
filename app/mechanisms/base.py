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
    #: Neighbour relations the mechanism's privacy analysis covers.
    neighbors: tuple[str, ...] = ("swap", "add_remove")

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


# --------------------------------------------------------------------------- single-quantile EM
# One implementation of the single-quantile exponential mechanism (Smith 2011) over the
# intervals of a *node*: the sorted points ``edges[lo:hi]`` inside the domain [left, right].
# IndExp and AppIndExp use it on the whole data set, AQ on the nodes of its recursion.

#: Weights below ``2**-1000`` (widths normalised by the node's domain, so every weight <= 1)
#: are not formed; the row maximum must then be at least ``2**-900`` (else the exact log-domain
#: path is used), so every dropped weight is below ``2**-100`` times the row maximum — far
#: inside the package's exactness standard (each weight within ``2**-50`` x row max).
_LOG_CUT = 1000.0 * math.log(2.0)
_MIN_TOP = 2.0**-900


@numba.njit(cache=True, nogil=True, inline="always")
def _width(edges: FloatArray, lo: int, k: int, j: int, left: float, right: float) -> float:
    """Width of interval j of the node (points ``edges[lo:lo+k]``, domain [left, right])."""
    a = left if j == 0 else edges[lo + j - 1]
    b = right if j == k else edges[lo + j]
    return b - a


@numba.njit(cache=True, nogil=True)
def _fill_weights(  # pragma: no cover - compiled
    edges: FloatArray,
    lo: int,
    hi: int,
    left: float,
    right: float,
    target: float,
    c: float,
    buf: FloatArray,
) -> tuple[int, int, float]:
    """Linear-domain weights ``(width_j / (right - left)) e^{-c |j - target|}`` near the target.

    Writes the weights of intervals ``j0 .. j0 + cnt - 1`` into ``buf[0:cnt]`` and returns
    ``(j0, cnt, row_max)``. No transcendental per point: ``e^{-c d}`` for integer distances
    ``d = 64 h + l`` is the product of two tabulated exponentials (``A[h] B[l]``) and a
    fractional factor, so each weight carries at most ~5 roundings (< 2**-50 relative).
    Intervals whose factor is below ``2**-1000`` are outside ``[j0, j0 + cnt)``.
    """
    k = hi - lo
    inv = 1.0 / (right - left)
    ti = math.floor(target)
    if ti > k:
        ti = k
    fl = target - ti
    span = _LOG_CUT / c
    dmax = k + 1 if span >= k + 1 else int(span)
    j0 = ti - dmax if ti - dmax > 0 else 0
    j1 = ti + 1 + dmax if ti + 1 + dmax < k else k
    na = dmax // 64 + 2
    tab_a = np.empty(na, dtype=np.float64)
    for h in range(na):
        tab_a[h] = math.exp(-c * 64.0 * h)
    tab_b = np.empty(64, dtype=np.float64)
    for h in range(64):
        tab_b[h] = math.exp(-c * h)
    f_left = math.exp(-c * fl)  # j <= ti: |j - target| = fl + (ti - j)
    f_right = math.exp(-c * (1.0 - fl))  # j > ti: |j - target| = (1 - fl) + (j - ti - 1)
    # Interior intervals (1 <= j <= k - 1) read two adjacent data points; the end intervals
    # j = 0 and j = k (bounded by the node's domain) are patched in afterwards. Distances are
    # walked in blocks of 64 so that the inner loop is a contiguous multiply by tab_b.
    top = 0.0
    jl_lo = max(j0, 1)
    jl_hi = min(ti, k - 1)  # left side: d = ti - j in [ti - jl_hi, ti - jl_lo]
    if jl_hi >= jl_lo:
        d = ti - jl_hi
        while d <= ti - jl_lo:
            h = d >> 6
            base = inv * f_left * tab_a[h]
            stop = min((h + 1) << 6, ti - jl_lo + 1)
            for dd in range(d, stop):
                j = ti - dd
                w = (edges[lo + j] - edges[lo + j - 1]) * base * tab_b[dd & 63]
                buf[j - j0] = w
                top = max(top, w)
            d = stop
    jr_lo = max(ti + 1, 1)
    jr_hi = min(j1, k - 1)  # right side: d = j - ti - 1
    if jr_hi >= jr_lo:
        d = jr_lo - ti - 1
        while d <= jr_hi - ti - 1:
            h = d >> 6
            base = inv * f_right * tab_a[h]
            stop = min((h + 1) << 6, jr_hi - ti)
            off = lo + ti + 1
            for dd in range(d, stop):
                w = (edges[off + dd] - edges[off + dd - 1]) * base * tab_b[dd & 63]
                buf[ti + 1 + dd - j0] = w
                top = max(top, w)
            d = stop
    sl = inv * f_left
    sr = inv * f_right
    for j in (0, k):
        if j0 <= j <= j1:
            if j <= ti:
                d = ti - j
                w = _width(edges, lo, k, j, left, right) * sl * tab_a[d >> 6] * tab_b[d & 63]
            else:
                d = j - ti - 1
                w = _width(edges, lo, k, j, left, right) * sr * tab_a[d >> 6] * tab_b[d & 63]
            buf[j - j0] = w
            top = max(top, w)
    return j0, j1 - j0 + 1, top


@numba.njit(cache=True, nogil=True)
def _fill_weights_log(  # pragma: no cover - compiled
    edges: FloatArray,
    lo: int,
    hi: int,
    left: float,
    right: float,
    target: float,
    c: float,
    buf: FloatArray,
) -> tuple[int, int, float]:
    """Exact fallback: all k + 1 weights formed in log space and max-normalised (max = 1)."""
    k = hi - lo
    top = -np.inf
    for j in range(k + 1):
        w = _width(edges, lo, k, j, left, right)
        s = (math.log(w) if w > 0.0 else -np.inf) - c * abs(j - target)
        buf[j] = s
        if s > top:
            top = s
    for j in range(k + 1):
        s = buf[j]
        buf[j] = math.exp(s - top) if s > -np.inf else 0.0
    return 0, k + 1, 1.0 if top > -np.inf else 0.0


@numba.njit(cache=True, nogil=True)
def _node_pick(  # pragma: no cover - compiled
    edges: FloatArray,
    lo: int,
    hi: int,
    left: float,
    right: float,
    target: float,
    c: float,
    u: float,
    buf: FloatArray,
) -> int:
    """Sample interval j in 0..k of the node with probability proportional to its weight.

    Interval j is ``[L_j, R_j)`` with ``L_0 = left``, ``L_j = edges[lo + j - 1]``,
    ``R_j = edges[lo + j]``, ``R_k = right``; its weight is ``width_j e^{-c |j - target|}``.
    Zero widths have weight 0 and are never returned. One uniform ``u``, inverse CDF.
    Returns -1 only if every weight is zero (impossible when right > left).
    """
    j0, cnt, top = _fill_weights(edges, lo, hi, left, right, target, c, buf)
    if not top >= _MIN_TOP:
        j0, cnt, top = _fill_weights_log(edges, lo, hi, left, right, target, c, buf)
    # Inverse CDF in two stages: block sums of 64 weights (a reassociated, vectorisable
    # reduction: positive terms, so the error bound is that of sequential summation), then a
    # scan over blocks and one scan inside the chosen block.
    nb = (cnt + 63) >> 6
    sums = np.empty(nb, dtype=np.float64)
    _block_sums(buf, cnt, sums)
    total = 0.0
    for b in range(nb):
        total += sums[b]
    goal = u * total
    acc = 0.0
    before = 0.0  # sum of the blocks preceding the chosen one
    chosen = -1
    for b in range(nb):
        sb = sums[b]
        if sb > 0.0:
            chosen = b
            before = acc
            if acc + sb > goal:
                break
            acc += sb
    if chosen < 0:
        return -1
    # If no block crossed the goal (u * total rounded up to total) the last positive block is
    # chosen and its last positive weight returned below.
    acc = before
    last = -1
    for i in range(chosen << 6, min(cnt, (chosen + 1) << 6)):
        w = buf[i]
        if w > 0.0:
            acc += w
            last = i
            if acc > goal:
                return j0 + i
    # Rounding between the block sum and its elements: the block's last positive weight.
    return j0 + last


@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def _block_sums(buf: FloatArray, cnt: int, out: FloatArray) -> None:  # pragma: no cover
    """out[b] = sum(buf[64 b : min(cnt, 64 b + 64)])."""
    for b in range(out.size):
        s = 0.0
        for i in range(b << 6, min(cnt, (b + 1) << 6)):
            s += buf[i]
        out[b] = s


def exponential_mechanism_interval(
    edges: FloatArray,
    target: float,
    c: float,
    rng: np.random.Generator,
    buf: FloatArray | None = None,
) -> int:
    """Sample interval ``i`` with probability proportional to ``width_i * exp(-c|i - target|)``.

    The single-quantile exponential mechanism of Smith (2011) over the ``n + 1`` intervals of
    ``edges = [a, x_1..x_n, b]``: score ``-|i - target|`` where ``i`` is the number of points
    below the output, ``c = epsilon / (2 * sensitivity)``. Weights are formed only where they
    exceed 2^-1000 of the best possible one (linear domain, tabulated exponentials); if the
    best formed weight is below 2^-900 they are formed in log space over all intervals. One
    uniform draw; zero-width intervals are never returned. O(min(n, 700 / c)) time.
    """
    n = edges.size - 2
    if buf is None:
        buf = np.empty(n + 1, dtype=np.float64)
    j = int(
        _node_pick(edges, 1, n + 1, edges[0], edges[-1], float(target), float(c), rng.random(), buf)
    )
    if j < 0:
        raise FloatingPointError("exponential-mechanism weights are all zero")
    return j


def as_list(values: Sequence[float] | FloatArray) -> list[float]:
    return [float(v) for v in values]

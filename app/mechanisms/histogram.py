"""Datasets as (distinct value, count) pairs: the grid histogram and the prepared support.

Every mechanism runs on a :class:`Support`: the distinct clamped data values
``v_1 < ... < v_d`` with their counts, framed by the public bounds. Interval ``t``
(``0 <= t <= d``) is ``[edges[t], edges[t + 1])`` with ``edges = [a, v_1, ..., v_d, b]``;
its *position* ``cum[t] = #{x <= v_t}`` (``cum[0] = 0``, ``cum[d] = n``) is the number of
data points at or below any output inside it. Values are distinct, so only the two end
intervals can have zero width (points clamped to, or lying on, a bound); they carry weight
zero and are never output. Work and memory are O(d), whatever n is.

Two kinds of support:

* **values** (the raw-array call): ``a, b`` are the real bounds, outputs are doubles drawn
  uniformly inside the chosen intervals (``left + u * width``, as in the paper).
* **grid** (:meth:`app.mechanisms.registry.Mechanism.run_grid`): the output space is the
  integer grid ``0 .. K`` (``grid_points = K + 1``); ``edges = [0, v_1, ..., v_d, K + 1]``
  with integer cells ``v``. The block of grid points ``y`` with ``#{x <= y} = cum[t]`` is
  exactly the integers of ``[edges[t], edges[t + 1])``, so an interval's width *is* the
  number of grid points it holds (an exact integer in a double, since ``K + 1 <= 2^53``),
  and the final point is a uniform integer drawn with integer arithmetic only
  (:func:`app.mechanisms.rng.uniform_integer`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from app.mechanisms.errors import MechanismInputError
from app.mechanisms.rng import uniform_integer
from app.mechanisms.validation import (
    FloatArray,
    IntArray,
    Neighbors,
    check_bounds,
    check_data,
    check_epsilon,
    check_epsilon_share,
    check_neighbors,
    check_quantiles,
)

#: Largest grid (K + 1 points) a histogram may have: every grid point and every block size is
#: an exact integer in a double, and every count sum fits an int64 with room to spare.
GRID_POINTS_MAX = 2**53
#: Largest total count n: positions are exact in a double (the dynamic program's kernels
#: take differences of positions in floating point only through exact integers).
N_MAX = 2**53
#: Histograms of at most this many cells keep what mechanisms derive from their intervals
#: alone (:attr:`Support.memo`: a few arrays of d + 1 numbers, under 3 MiB), so repeated
#: releases on one histogram skip that O(d) work; larger ones derive it per run, where it is
#: a small part of the O(m d) dynamic program and would hold tens of MiB per histogram.
MEMO_MAX_CELLS = 2**16


def _int_array(values: ArrayLike, name: str) -> IntArray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise MechanismInputError(name, "must be one-dimensional")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise MechanismInputError(name, "must hold integers")
    return np.ascontiguousarray(arr, dtype=np.int64)


def _read_only(arr: IntArray) -> IntArray:
    view = arr.view()
    view.flags.writeable = False
    return view


@dataclass(frozen=True)
class GridHistogram:
    """A dataset as counts on its public grid ``0 .. grid_points - 1``.

    ``cells`` are strictly increasing grid indices in ``[0, grid_points - 1]`` and
    ``counts`` (same length, each >= 1) the number of records in each; ``n = counts.sum()``.
    The service maps index ``k`` to the value ``lower + k * granularity``; mechanisms never
    see values, only indices. Validated on construction (errors name ``cells``, ``counts``
    or ``grid_points`` and never repeat a count or a cell), O(d).

    Immutable: ``cells`` and ``counts`` are read-only views of the arrays given (not
    copies), which must not change afterwards either. A histogram of at most
    ``MEMO_MAX_CELLS`` cells keeps what the mechanisms derive from its intervals alone
    (``memo``, see :attr:`Support.memo`), so a caller that runs several releases on one
    dataset should keep the histogram rather than build a new one from the same arrays.
    """

    cells: IntArray
    counts: IntArray
    grid_points: int
    memo: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        cells = _int_array(self.cells, "cells")
        counts = _int_array(self.counts, "counts")
        if isinstance(self.grid_points, bool) or not isinstance(self.grid_points, int | np.integer):
            raise MechanismInputError("grid_points", "must be an integer")
        k1 = int(self.grid_points)
        if not 2 <= k1 <= GRID_POINTS_MAX:
            raise MechanismInputError(
                "grid_points", f"must lie in [2, 2**53] (got {self.grid_points!r})"
            )
        if cells.size == 0:
            raise MechanismInputError("cells", "must not be empty")
        if counts.size != cells.size:
            raise MechanismInputError("counts", "must have the same length as cells")
        if cells[0] < 0 or cells[-1] > k1 - 1:
            raise MechanismInputError("cells", "every cell must lie in [0, grid_points - 1]")
        if cells.size > 1 and not np.all(cells[1:] > cells[:-1]):
            first = int(np.argmin(cells[1:] > cells[:-1])) + 1
            raise MechanismInputError("cells", f"must be strictly increasing (index {first})")
        if not np.all(counts >= 1):
            first = int(np.argmin(counts >= 1))
            raise MechanismInputError("counts", f"must be >= 1 (index {first})")
        # The exact total without wrap-around: a float64 sum first (within a relative
        # size * 2^-53 of it, so below 2^55 when it is at most 2^54), then the exact uint64
        # sum, which cannot wrap below 2^64. Summing in uint64 alone wrapped: 4,096 counts of
        # 2^52 would sum to 0 and pass.
        approx = float(counts.sum(dtype=np.float64))
        total = int(counts.sum(dtype=np.uint64)) if approx <= 2.0 * N_MAX else N_MAX + 1
        if total > N_MAX:
            raise MechanismInputError("counts", "the total count exceeds 2**53")
        object.__setattr__(self, "cells", _read_only(cells))
        object.__setattr__(self, "counts", _read_only(counts))
        object.__setattr__(self, "grid_points", k1)

    @property
    def n(self) -> int:
        return int(self.counts.sum())

    @classmethod
    def from_arrays(cls, cells: ArrayLike, counts: ArrayLike, grid_points: int) -> GridHistogram:
        """Build and validate; arrays of a non-integer dtype are refused, not truncated."""
        return cls(np.asarray(cells), np.asarray(counts), grid_points)

    @classmethod
    def from_values(
        cls, values: ArrayLike, lower: float, upper: float, granularity: float
    ) -> GridHistogram:
        """Tests and experiments only: clamp, map to the nearest grid index, count.

        The grid is ``lower + k * granularity`` for ``k = 0 .. floor((upper - lower) /
        granularity)`` (the count of steps taken in decimal, as the service does). The
        service has its own exact cell map.
        """
        lo, hi = check_bounds(lower, upper)
        x = check_data(values)
        k_max = int((Decimal(repr(hi)) - Decimal(repr(lo))) / Decimal(repr(float(granularity))))
        k = np.clip(np.rint((np.clip(x, lo, hi) - lo) / granularity), 0, k_max).astype(np.int64)
        cells, counts = np.unique(k, return_counts=True)
        return cls(cells.astype(np.int64), counts.astype(np.int64), k_max + 1)


@dataclass(frozen=True)
class Support:
    """Validated mechanism input: intervals between distinct clamped values, with positions.

    ``edges`` has length d + 2 and ``cum`` length d + 1 (see the module docstring).
    ``memo`` holds what a mechanism derives from the intervals alone (``edges`` and ``cum``,
    never the quantiles, epsilon or neighbours), under a key of its own, for later runs on
    the same data: a small grid histogram's own ``memo`` (which also keeps ``edges`` and
    ``cum`` themselves), else a fresh dict. Nothing writes to a support's arrays or to what
    is stored there, and it is the same whichever run computed it.
    """

    edges: FloatArray
    cum: IntArray
    quantiles: FloatArray
    epsilon: float
    neighbors: Neighbors
    grid: bool
    memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def n(self) -> int:
        return int(self.cum[-1])

    @property
    def d(self) -> int:
        """Number of distinct (clamped) data values."""
        return int(self.edges.size - 2)

    @property
    def widths(self) -> FloatArray:
        """Interval widths (grid: the number of grid points in each block, exact)."""
        return np.diff(self.edges)

    @property
    def lower(self) -> float:
        return float(self.edges[0])

    @property
    def upper(self) -> float:
        """The largest possible output (grid: the last grid index K)."""
        return float(self.edges[-1] - 1.0) if self.grid else float(self.edges[-1])

    def value_of_rank(self, j: int) -> float:
        """The order statistic x_(j), 1-based, from the cumulative counts (O(log d))."""
        t = int(np.searchsorted(self.cum, j, side="left"))
        return float(self.edges[t])

    def points_in(self, idx: IntArray, rng: np.random.Generator) -> FloatArray | IntArray:
        """One uniform output inside each interval ``idx[k]``, returned sorted.

        Values: ``left + u * width`` (half-open under rounding). Grid: a uniform integer in
        ``[edges[t], edges[t + 1])`` from raw generator words, integer arithmetic only.
        """
        if self.grid:
            out = np.empty(idx.size, dtype=np.int64)
            for k, t in enumerate(idx.tolist()):
                out[k] = uniform_integer(int(self.edges[t]), int(self.edges[t + 1]), rng)
            out.sort()
            return out
        return uniform_in_intervals(self.edges, idx, rng)


def uniform_in_intervals(edges: FloatArray, idx: IntArray, rng: np.random.Generator) -> FloatArray:
    """One uniform double inside each interval ``[edges[i], edges[i+1])``, returned sorted."""
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


def _common(
    quantiles: ArrayLike, epsilon: float, neighbors: str
) -> tuple[FloatArray, float, Neighbors]:
    eps = check_epsilon(epsilon)
    nb = check_neighbors(neighbors)
    q = check_quantiles(quantiles)
    check_epsilon_share(eps, q.size)
    return q, eps, nb


def support_from_values(
    data: ArrayLike,
    quantiles: ArrayLike,
    *,
    epsilon: float,
    lower: float,
    upper: float,
    neighbors: str,
) -> Support:
    """Validate the raw-array call and build (distinct clamped values, counts). O(n log n)."""
    eps = check_epsilon(epsilon)
    lo, hi = check_bounds(lower, upper)
    nb = check_neighbors(neighbors)
    q = check_quantiles(quantiles)
    check_epsilon_share(eps, q.size)
    x = check_data(data)
    xs = np.clip(x, lo, hi)
    xs.sort(kind="quicksort")
    ends = np.flatnonzero(xs[1:] != xs[:-1]) + 1  # first index of each new value
    d = ends.size + 1
    edges = np.empty(d + 2, dtype=np.float64)
    edges[0], edges[-1] = lo, hi
    edges[1] = xs[0]
    edges[2:-1] = xs[ends]
    cum = np.empty(d + 1, dtype=np.int64)
    cum[0] = 0
    cum[1:-1] = ends
    cum[-1] = xs.size
    return Support(edges=edges, cum=cum, quantiles=q, epsilon=eps, neighbors=nb, grid=False)


def support_from_grid(
    hist: GridHistogram, quantiles: ArrayLike, *, epsilon: float, neighbors: str
) -> Support:
    """Validate a grid call: edges ``[0, cells..., K + 1]`` (exact doubles), cumulative counts.

    The arrays are formed once per small histogram (kept in its ``memo``), O(d) otherwise.
    """
    if not isinstance(hist, GridHistogram):
        raise MechanismInputError("hist", "must be a GridHistogram")
    q, eps, nb = _common(quantiles, epsilon, neighbors)
    memo = hist.memo if hist.cells.size <= MEMO_MAX_CELLS else {}
    arrays = memo.get(_SUPPORT_KEY)
    if arrays is None:
        arrays = memo[_SUPPORT_KEY] = _grid_support_arrays(hist)
    edges, cum = arrays
    return Support(
        edges=edges, cum=cum, quantiles=q, epsilon=eps, neighbors=nb, grid=True, memo=memo
    )


#: The key of a grid support's (edges, cum) in its histogram's ``memo``.
_SUPPORT_KEY = "support.arrays"


def _grid_support_arrays(hist: GridHistogram) -> tuple[FloatArray, IntArray]:
    d = hist.cells.size
    edges = np.empty(d + 2, dtype=np.float64)
    edges[0] = 0.0
    edges[1:-1] = hist.cells
    edges[-1] = float(hist.grid_points)
    cum = np.empty(d + 1, dtype=np.int64)
    cum[0] = 0
    np.cumsum(hist.counts, out=cum[1:])
    return edges, cum


# ----------------------------------------------------------------- the bounds' cells

#: Each end cell of the grid (a public bound, where clamping piles records up) weighs about
#: this share of the whole grid in the base measure of the smoothed JointExp and of AQ
#: (:func:`stretch_bits`); on the raw-value path the domain reaches this share of
#: (upper - lower) beyond each bound (the smoothed JointExp jitters the records at a bound
#: over it).
BOUND_SHARE = 2.0**-7


def stretch_bits(grid_points: int, bits: int) -> int:
    """``s``: each of the grid's two end cells spans ``2^s`` times the positions of the others
    on the refined grid (:func:`warp`), the smallest power of two at least
    ``BOUND_SHARE * grid_points``, lowered while the stretched grid would pass 2^53 points;
    0 on grids of fewer than 3 points. Public quantities only."""
    k1 = int(grid_points)
    if k1 < 3:
        return 0
    s = 0
    while (1 << s) < BOUND_SHARE * k1:
        s += 1
    while s > 0 and stretched_points(k1, bits, s) > 2**53:
        s -= 1
    return s


def stretched_points(grid_points: int, bits: int, stretch: int) -> int:
    """The size of the refined grid with both end cells stretched (:func:`warp`)."""
    r, k1 = 1 << bits, int(grid_points)
    if k1 < 3:
        return k1 * r
    return 2 * (r << stretch) + (k1 - 2) * r


def warp(fine: IntArray, grid_points: int, bits: int, stretch: int) -> IntArray:
    """Refined cells (``k 2^bits + o``) to positions on the stretched grid: the first and last
    cells' sub-cells ``2^stretch`` apart (each end cell spans ``2^(bits+stretch)`` positions),
    the others one apart after the first cell. Increasing, so sorted input stays sorted."""
    fine = np.asarray(fine, dtype=np.int64)
    k1 = int(grid_points)
    if stretch == 0 or k1 < 3:
        return fine.copy()
    r, big = np.int64(1 << bits), np.int64(1 << stretch)
    top = (k1 - 1) * r
    out = fine + r * (big - 1)
    out = np.where(fine < r, fine * big, out)
    return np.where(fine >= top, r * big + (k1 - 2) * r + (fine - top) * big, out)


def unwarp_cells(y: IntArray, grid_points: int, bits: int, stretch: int) -> IntArray:
    """Positions on the stretched grid to the original grid cells holding them."""
    y = np.asarray(y, dtype=np.int64)
    k1 = int(grid_points)
    if stretch == 0 or k1 < 3:
        return y >> np.int64(bits)
    if bits == 0:  # one position a cell between the end cells' spans: a shift and a clip
        cells: IntArray = np.clip(y - np.int64((1 << stretch) - 1), 0, k1 - 1)
        return cells
    r, span = np.int64(1 << bits), np.int64(1 << (bits + stretch))
    top = span + (k1 - 2) * r
    middle = 1 + (y - span) // r
    return np.where(y < span, 0, np.where(y >= top, k1 - 1, middle)).astype(np.int64)

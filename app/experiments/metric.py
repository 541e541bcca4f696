"""The paper's error metric: missed (misclassified) points per quantile.

Definitions, for a sample ``x_(1) <= ... <= x_(n)`` and a quantile level ``q`` in (0, 1):

* **Rank of a value.** ``rank(v) = #{i : x_i <= v}``. A value inside the interval
  ``[x_(k), x_(k+1))`` has rank ``k``; values below ``x_(1)`` have rank 0 and values at or
  above ``x_(n)`` have rank ``n``. This is the same convention as the mechanisms' intervals
  (``app.mechanisms.histogram``: inside interval ``t`` exactly ``cum[t]`` points are ``<= o``)
  and as the utility ``#{x <= o} - qn`` of IndExp.
* **True quantile.** ``t = x_(r)`` with ``r = ceil(q n)`` (1-based), i.e. the smallest sample
  value whose empirical CDF reaches ``q``: ``min{v : rank(v) >= q n}``. ``ceil`` is taken
  with a relative tolerance of 1e-9 so that ``q n`` computed as ``(j / (m + 1)) * n`` that
  should be an integer is not pushed up by rounding.
* **Missed points.** ``missed(t, e) = |rank(e) - rank(t)|``: the number of data points in the
  half-open interval ``(min(t, e), max(t, e)]``. Points tied with the smaller of the two
  values are not counted, points tied with the larger one are. An estimate equal to the true
  quantile (or anywhere in ``[t, next distinct value)``) misses 0 points; an estimate below
  the whole sample misses ``rank(t)`` points, one above it ``n - rank(t)``.

This is the metric of the paper's reference code (dp_multiq ``misclassified_points_error``,
which computes ``|#{x > t} - #{x > e}|``, the same quantity). The code's true quantile is
``np.quantile(x, q, method="lower")`` = ``x_(floor((n - 1) q) + 1)``; it equals ours except
when ``frac(q n) < q``, where it is one order statistic lower.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]


def true_quantile_ranks(n: int, quantiles: ArrayLike) -> IntArray:
    """1-based order-statistic indices ``r_j = ceil(q_j n)`` of the true quantiles.

    Args:
        n: Sample size, at least 1.
        quantiles: Quantile levels, each in (0, 1).

    Returns:
        Integer array of ranks in ``[1, n]``.

    Raises:
        ValueError: If ``n < 1`` or a level lies outside (0, 1).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1 (got {n})")
    qs = np.asarray(quantiles, dtype=np.float64).reshape(-1)
    if np.any(~np.isfinite(qs)) or np.any(qs <= 0.0) or np.any(qs >= 1.0):
        raise ValueError("quantile levels must lie strictly inside (0, 1)")
    ranks = np.empty(qs.size, dtype=np.int64)
    for j, q in enumerate(qs):
        qn = float(q) * n
        ranks[j] = math.ceil(qn - 1e-9 * max(1.0, qn))
    return np.clip(ranks, 1, n)


def true_quantiles(sorted_data: ArrayLike, quantiles: ArrayLike) -> FloatArray:
    """The true quantiles ``x_(ceil(q n))`` of an ascending sample.

    Args:
        sorted_data: Sample sorted ascending (not checked beyond its length).
        quantiles: Quantile levels in (0, 1).

    Returns:
        One sample value per level.
    """
    xs = np.asarray(sorted_data, dtype=np.float64).reshape(-1)
    ranks = true_quantile_ranks(xs.size, quantiles)
    return xs[ranks - 1]


def missed_points(sorted_data: ArrayLike, quantiles: ArrayLike, estimates: ArrayLike) -> IntArray:
    """Missed points per quantile: data points between each true quantile and its estimate.

    The estimates are matched to the levels in order (``estimates[j]`` estimates
    ``quantiles[j]``); every mechanism returns its estimates sorted, and the levels are
    increasing, so this is the natural pairing.

    Args:
        sorted_data: Sample sorted ascending, length ``n >= 1``.
        quantiles: Increasing quantile levels in (0, 1), length ``m``.
        estimates: ``m`` estimates; any real values, also outside the data range.

    Returns:
        ``|rank(estimate_j) - rank(true_j)|`` for each ``j`` (see the module docstring).

    Raises:
        ValueError: On length mismatch, an unsorted or empty sample, or non-finite estimates.

    Complexity: O(m log n).
    """
    xs = np.asarray(sorted_data, dtype=np.float64).reshape(-1)
    est = np.asarray(estimates, dtype=np.float64).reshape(-1)
    qs = np.asarray(quantiles, dtype=np.float64).reshape(-1)
    if xs.size == 0:
        raise ValueError("the sample is empty")
    if est.size != qs.size:
        raise ValueError(f"got {est.size} estimates for {qs.size} quantile levels")
    if np.any(np.diff(xs) < 0):
        raise ValueError("sorted_data must be sorted ascending")
    if not np.all(np.isfinite(est)):
        raise ValueError("estimates must be finite")
    truth = true_quantiles(xs, qs)
    rank_true = np.searchsorted(xs, truth, side="right").astype(np.int64)
    rank_est = np.searchsorted(xs, est, side="right").astype(np.int64)
    missed: IntArray = np.abs(rank_est - rank_true)
    return missed

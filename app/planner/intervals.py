"""Error bars in the data's units, by post-processing a release (no budget).

A release gives the estimates ``x_1 .. x_m`` of the quantile levels ``q_1 < .. < q_m`` and the
planner's 90 % bound ``b`` on each estimate's rank error (missed points, at the public size
``n``). In 90 % of runs at most ``b`` data points lie between the estimate of ``q_j`` and
the true ``q_j``-quantile, which is itself a data point: the truth is then at most ``b + 1``
points away, between the values at the ranks ``q_j n - b - 1`` and ``q_j n + b + 1``. Those
values are unknown, but the release itself is an estimate of the quantile function: the
interval is read off the piecewise-linear curve through ``(q_k, x_k)``, between the levels
``q_j -/+ (b + 1)/n``.

Beyond the outermost estimates the curve continues with its nearest segment's slope,
doubled (a distribution's density usually thins towards its tails, so the quantile function
steepens there), and stops at the public bounds; with one estimate the curve runs from the
lower bound through it to the upper bound. The interval is widened to the grid points
around it and always contains the estimate.

Everything here is in grid indices (``0 .. steps``): a value is ``lower + k * granularity``,
an affine map, so the curve and the levels are the same in either unit; the caller turns
the indices into values with the codec that made the estimates
(:func:`app.codec.grid.grid_values`), so the ends are the same doubles as released values.

This is an approximation, not a guarantee: it inherits the planner's bound (fitted, not
proven) and assumes the data's quantile function is close to linear between released
levels. Its coverage is measured per data shape in docs/experiments.md.

Pure: depends on public figures and the release's own output only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

#: The slope factor beyond the outermost estimates (see the module docstring).
TAIL_STEEPENING = 2.0


def interval_cells(
    quantiles: Sequence[float],
    cells: Sequence[int],
    *,
    steps: int,
    bound90: float,
    size: int,
) -> list[tuple[int, int]] | None:
    """One ``(low, high)`` pair of grid indices per estimate, or None when the figures do
    not allow one (no public size, a non-finite bound, a shape mismatch).

    Args:
        quantiles: The release's levels, strictly increasing in (0, 1).
        cells: The released estimates' grid indices, one per level (sorted first where a
            method's independent picks cross: the curve is monotone).
        steps: The grid's last index (``grid_size - 1``).
        bound90: The planner's 90 % bound on missed points per quantile.
        size: The public size the bound is computed at (rows).
    """
    m = len(quantiles)
    if (
        m == 0
        or len(cells) != m
        or size < 1
        or not math.isfinite(bound90)
        or bound90 < 0
        or steps < 1
    ):
        return None
    levels = np.asarray(quantiles, dtype=np.float64)
    if not np.all(np.diff(levels) > 0):
        return None
    half = min((bound90 + 1.0) / size, 1.0)
    curve = _curve(levels, np.sort(np.asarray(cells, dtype=np.float64)), float(steps))
    out: list[tuple[int, int]] = []
    for q, k in zip(levels.tolist(), cells, strict=True):
        lo = math.floor(curve(max(q - half, 0.0)) + 1e-9)
        hi = math.ceil(curve(min(q + half, 1.0)) - 1e-9)
        out.append((max(0, min(lo, int(k))), min(steps, max(hi, int(k)))))
    return out


def _curve(levels: np.ndarray, values: np.ndarray, top: float) -> Callable[[float], float]:
    """The piecewise-linear quantile curve on [0, top]: through the estimates; beyond the
    outermost ones at :data:`TAIL_STEEPENING` times the nearest segment's slope; within the
    bounds. With one estimate: from the lower bound through it to the upper bound."""
    if levels.size == 1:
        knots_p = np.array([0.0, levels[0], 1.0])
        knots_v = np.array([0.0, values[0], top])
        return lambda p: float(np.interp(p, knots_p, knots_v))
    first, last = float(levels[0]), float(levels[-1])
    low_slope = TAIL_STEEPENING * (values[1] - values[0]) / (levels[1] - levels[0])
    high_slope = TAIL_STEEPENING * (values[-1] - values[-2]) / (levels[-1] - levels[-2])

    def curve(p: float) -> float:
        if p < first:
            v = float(values[0] - low_slope * (first - p))
        elif p > last:
            v = float(values[-1] + high_slope * (p - last))
        else:
            v = float(np.interp(p, levels, values))
        return min(max(v, 0.0), top)

    return curve


__all__ = ["TAIL_STEEPENING", "interval_cells"]

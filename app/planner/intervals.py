"""Error bars in the data's units, by post-processing a release (no budget).

A release gives the estimates ``x_1 .. x_m`` of the quantile levels ``q_1 < .. < q_m`` and the
planner's 90 % bound ``b`` on one estimate's rank error (missed points, at the public size
``n``: ``bound90_each`` of :func:`app.planner.expected_error`, wider than ``bound90``, the
bound on their mean over the release's quantiles: one estimate varies more than a mean of
m). In 90 % of runs at most ``b`` data points lie between the estimate of ``q_j`` and
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

from collections.abc import Sequence

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
        bound90: The planner's 90 % bound on one estimate's missed points
            (``bound90_each`` of :func:`app.planner.expected_error`).
        size: The public size the bound is computed at (rows).
    """
    if len(cells) != len(quantiles):
        return None
    out = interval_cells_many(quantiles, [cells], steps=steps, bound90=[bound90], size=[size])
    if out is None or out[0] is None:
        return None
    return out[0]


def interval_cells_many(
    quantiles: Sequence[float],
    cells: Sequence[Sequence[int]],
    *,
    steps: int,
    bound90: Sequence[float],
    size: Sequence[int],
) -> list[list[tuple[int, int]] | None] | None:
    """:func:`interval_cells` for many releases of the same levels at once (a grouped
    release's groups: one row of ``cells``, one bound and one size each), in array
    operations; an entry is None where its bound or size does not allow bars, the whole
    None where the levels or the shapes do not."""
    m, g = len(quantiles), len(cells)
    if m == 0 or steps < 1 or len(bound90) != g or len(size) != g:
        return None
    if any(len(row) != m for row in cells):
        return None
    levels = np.asarray(quantiles, dtype=np.float64)
    if not np.all(np.diff(levels) > 0):
        return None
    raw = np.asarray(cells, dtype=np.float64).reshape(g, m)
    bounds = np.asarray(bound90, dtype=np.float64)
    sizes = np.asarray(size, dtype=np.float64)
    ok = np.isfinite(bounds) & (bounds >= 0) & (sizes >= 1)
    half = np.minimum((np.where(ok, bounds, 0.0) + 1.0) / np.maximum(sizes, 1.0), 1.0)
    values = np.sort(raw, axis=1)
    top = float(steps)
    low_p = np.maximum(levels[None, :] - half[:, None], 0.0)
    high_p = np.minimum(levels[None, :] + half[:, None], 1.0)
    lo = np.floor(_curve(levels, values, top, low_p) + 1e-9)
    hi = np.ceil(_curve(levels, values, top, high_p) - 1e-9)
    lo = np.maximum(0.0, np.minimum(lo, raw)).astype(np.int64)
    hi = np.minimum(top, np.maximum(hi, raw)).astype(np.int64)
    return [
        list(zip(lo[i].tolist(), hi[i].tolist(), strict=True)) if ok[i] else None for i in range(g)
    ]


def _curve(levels: np.ndarray, values: np.ndarray, top: float, p: np.ndarray) -> np.ndarray:
    """The piecewise-linear quantile curves (one per row of ``values``) on [0, top] at the
    levels ``p`` (same shape): through the estimates; beyond the outermost ones at
    :data:`TAIL_STEEPENING` times the nearest segment's slope; within the bounds. With one
    estimate: from the lower bound through it to the upper bound. Inside, each value is
    ``np.interp``'s: ``slope (p - x_j) + y_j``, the knot's own value at a knot."""
    if levels.size == 1:
        xs = np.array([0.0, levels[0], 1.0])
        ys = np.stack([np.zeros(len(values)), values[:, 0], np.full(len(values), top)], axis=1)
        single: np.ndarray = np.clip(_interp(xs, ys, p), 0.0, top)
        return single
    first, last = levels[0], levels[-1]
    low_slope = TAIL_STEEPENING * (values[:, 1] - values[:, 0]) / (levels[1] - levels[0])
    high_slope = TAIL_STEEPENING * (values[:, -1] - values[:, -2]) / (levels[-1] - levels[-2])
    inside = _interp(levels, values, np.clip(p, first, last))
    below = values[:, :1] - low_slope[:, None] * (first - p)
    above = values[:, -1:] + high_slope[:, None] * (p - last)
    v = np.where(p < first, below, np.where(p > last, above, inside))
    return np.clip(v, 0.0, top)


def _interp(xs: np.ndarray, ys: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Row-wise ``np.interp(p[i], xs, ys[i])`` for ``xs[0] <= p <= xs[-1]``, with numpy's
    arithmetic (the same doubles)."""
    j = np.clip(np.searchsorted(xs, p, side="right") - 1, 0, xs.size - 2)
    rows = np.arange(ys.shape[0])[:, None]
    y0, y1 = ys[rows, j], ys[rows, j + 1]
    slope = (y1 - y0) / (xs[j + 1] - xs[j])
    out = slope * (p - xs[j]) + y0
    out = np.where(p == xs[j], y0, out)
    return np.where(p >= xs[-1], ys[:, -1:], out)


__all__ = ["TAIL_STEEPENING", "interval_cells", "interval_cells_many"]

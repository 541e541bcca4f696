"""Grouped releases: measured run time against the public publication bound.

Runs :func:`app.mechanisms.grouped.run_groups` in process (warm) over grouped shapes chosen
to be slow — every group filling its grid (normal), 10 % of each group clamped at a bound,
heavy ties (a few cells), Zipf group sizes — across groups, m, epsilon and grids, and prints
the run time next to :func:`app.releases.schedule.grouped_bound_s` (scale 1) and their ratio.
A ratio above 1 is an overrun (the release would be published at its finish, not at the
bound); the design keeps the worst ratio at or below ~1/3.

Usage::

    python -m benchmarks.grouped_timing [--rows 1000000] [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np

from app.mechanisms import MECHANISMS, GridHistogram
from app.mechanisms.grouped import run_groups
from app.releases.schedule import cells_bound, grouped_bound_s


def groups_of(shape: str, count: int, rows: int, points: int, rng: np.random.Generator) -> list:
    if shape == "zipf":
        w = 1.0 / np.arange(1, count + 1)
        sizes = np.maximum(1, np.floor(w / w.sum() * rows)).astype(int)
    else:
        sizes = np.full(count, max(1, rows // count))
    out = []
    for i, size in enumerate(sizes):
        if shape == "ties":
            v = rng.integers(0, min(points, 5), size)
        elif shape == "clamped":
            v = np.rint(rng.normal(points * 0.8, points * 0.2, size))
        else:
            v = np.rint(rng.normal(points * (0.3 + 0.4 * i / count), points * 0.15, size))
        cells, counts = np.unique(np.clip(v, 0, points - 1).astype(np.int64), return_counts=True)
        out.append(GridHistogram(cells, counts, points))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=10**6)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rng = np.random.default_rng(7)
    counts = [10, 100, 1000] if args.quick else [10, 100, 1000, 10_000]
    ms = [3, 19] if args.quick else [1, 3, 9, 19, 99]
    eps = [0.1, 1.0] if args.quick else [0.01, 0.1, 1.0, 10.0]
    grids = [1001] if args.quick else [6, 1001, 100_001]
    shapes = ["normal", "clamped", "ties", "zipf"]
    worst = 0.0
    print(f"{'method':<10}{'shape':<9}{'groups':>7}{'grid':>8}{'m':>4}{'eps':>6}"
          f"{'run s':>9}{'bound s':>9}{'ratio':>8}")  # fmt: skip
    for shape, count, points in itertools.product(shapes, counts, grids):
        hists = groups_of(shape, count, args.rows, points, rng)
        cells = cells_bound(grid_points=points, neighbors="add_remove", n=None,
                            size_hint=args.rows, max_cells=10**6)  # fmt: skip
        for method, m, e in itertools.product(["jointexp", "aq", "indexp"], ms, eps):
            q = np.linspace(0, 1, m + 2)[1:-1]
            mech = MECHANISMS[method]
            run_groups(mech, hists[:2], q, grid_points=points, epsilon=e, delta=None,
                       neighbors="add_remove")  # fmt: skip
            t0 = time.perf_counter()
            run_groups(mech, hists, q, grid_points=points, epsilon=e, delta=None,
                       neighbors="add_remove")  # fmt: skip
            run = time.perf_counter() - t0
            bound = grouped_bound_s(groups=count, m=m, cells=cells, size=args.rows, scale=1.0,
                                    cap_s=1e9, method=method, epsilon=e)  # fmt: skip
            worst = max(worst, run / bound)
            print(f"{method:<10}{shape:<9}{count:>7}{points:>8}{m:>4}{e:>6}"
                  f"{run:>9.3f}{bound:>9.2f}{run / bound:>8.3f}", flush=True)  # fmt: skip
    print(f"worst run / bound: {worst:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

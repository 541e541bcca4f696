"""Grouped runs in process: the median time of :func:`app.mechanisms.grouped.run_groups`.

``G`` groups of Zipf-distributed sizes (exponent 1.1) over 10^7 rows on a grid of 10,001
points: ``ratings`` (five values, heavy ties in every group) or ``continuous`` (a rounded
normal), ``m`` evenly spaced quantiles, ε = 1, add/remove. Meant for before/after
comparisons of the mechanism layer (run it from two checkouts alternately; the interpreter
imports ``app`` from the working directory).

Usage::

    NUMBA_NUM_THREADS=1 python -m benchmarks.grouped_runs [--groups 1000] [--kind ratings] [--m 9]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from app.mechanisms import MECHANISMS, GridHistogram
from app.mechanisms.grouped import run_groups

GRID = 10_001


def groups_of(count: int, kind: str, rng: np.random.Generator) -> list[GridHistogram]:
    w = 1.0 / np.arange(1, count + 1) ** 1.1
    sizes = np.maximum(1, (1e7 * w / w.sum()).astype(int))
    out = []
    for size in sizes:
        if kind == "ratings":
            vals = rng.integers(1, 6, size) * 2000
        else:
            vals = np.clip(rng.normal(5000, 1500, size).astype(int), 0, GRID - 1)
        cells, counts = np.unique(vals, return_counts=True)
        out.append(GridHistogram(cells.astype(np.int64), counts.astype(np.int64), GRID))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--kind", choices=["ratings", "continuous"], default="ratings")
    parser.add_argument("--m", type=int, default=9)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--method", default="jointexp")
    args = parser.parse_args()
    groups = groups_of(args.groups, args.kind, np.random.default_rng(5))
    q = np.linspace(0.0, 1.0, args.m + 2)[1:-1]
    mech = MECHANISMS[args.method]

    def once() -> float:
        t = time.perf_counter()
        run_groups(
            mech, groups, q, grid_points=GRID, epsilon=1.0, delta=None, neighbors="add_remove"
        )
        return time.perf_counter() - t

    run_groups(
        mech, groups[:20], q, grid_points=GRID, epsilon=1.0, delta=None, neighbors="add_remove"
    )
    times = [once() for _ in range(args.runs)]
    print("| groups | kind | m | method | median (s) | runs (s) |")
    print("|---|---|---|---|---|---|")
    runs = ", ".join(f"{t:.3f}" for t in times)
    print(
        f"| {args.groups} | {args.kind} | {args.m} | {args.method} | "
        f"{statistics.median(times):.3f} | {runs} |"
    )


if __name__ == "__main__":
    main()

"""How often a run outlives its public bound (issue 28; app/releases/schedule.py).

A release is published at its run's start plus a bound computed from public figures only;
a run that takes longer is published when it finishes, and that lateness is what a
non-admin can still observe. This benchmark runs every method on the benchmark shapes of
``bench_mechanisms`` (N(0, 5^2) values: continuous, rounded to 0.1, integers, 5 % clamped
above, below, both, 10 % clamped both, 5 % at one inner point), placed on the service's
default grid (bounds [-100, 100], 2·10^6 + 1 points), for n in ``--sizes``, m in ``--ms``
and epsilon in ``--eps``, and compares each run's wall time (in this process, kernels
warm, the slowest of ``--runs``) with the bound the worker would compute for it: under
swap neighbours (n public) and under add/remove with the size hint n.

Usage::

    python -m benchmarks.bench_publication [--sizes 1e3 1e5 1e6] [--ms 1 9 99]
        [--eps 0.01 1] [--runs 2] [--methods jointexp indexp ...]

Prints one row per (method, shape, n, m, epsilon) that overran, then a summary table per
method: runs, overruns, the median and the largest ratio of run time to bound.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

from app.mechanisms import MECHANISMS, GridHistogram
from app.releases.schedule import bound_of_claim
from benchmarks.bench_mechanisms import CASES, _case_data

LOWER, UPPER, GRANULARITY = -100.0, 100.0, 1e-4
POINTS = round((UPPER - LOWER) / GRANULARITY) + 1
MAX_CELLS = 10**7
MAX_VALUES = 10**9
CAP_S = 120.0


def histogram(case: str, n: int, seed: int) -> GridHistogram:
    """The shape's values on the default grid, as the service stores them."""
    x = np.clip(_case_data(case, n, seed), LOWER, UPPER)
    cells = np.floor((x - LOWER) / GRANULARITY + 0.5).astype(np.int64)
    uniq, counts = np.unique(cells, return_counts=True)
    return GridHistogram.from_arrays(uniq, counts.astype(np.int64), POINTS)


def bound(method: str, m: int, eps: float, neighbors: str, n: int) -> float:
    row: dict[str, Any] = {
        "lower": LOWER,
        "upper": UPPER,
        "granularity": GRANULARITY,
        "neighbors": neighbors,
        "public_n": n if neighbors == "swap" else None,
        "size_hint": n if neighbors == "add_remove" else None,
        "method": method,
        "quantiles": [0.5] * m,
        "epsilon": eps,
    }
    return bound_of_claim(row, scale=1.0, max_cells=MAX_CELLS, max_values=MAX_VALUES, cap_s=CAP_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["1e3", "1e5", "1e6"])
    parser.add_argument("--ms", nargs="+", type=int, default=[1, 9, 99])
    parser.add_argument("--eps", nargs="+", type=float, default=[0.01, 1.0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--methods", nargs="+", default=list(MECHANISMS))
    parser.add_argument("--cases", nargs="+", default=list(CASES))
    args = parser.parse_args()
    ratios: dict[str, list[float]] = {name: [] for name in args.methods}
    overruns: dict[str, int] = dict.fromkeys(args.methods, 0)
    warm = histogram("integer", 2000, 0)
    for name in args.methods:
        mech = MECHANISMS[name]
        for nb in mech.neighbors:
            delta = 1e-6 if mech.uses_delta else None
            mech.run_grid(warm, [0.25, 0.5], epsilon=1.0, delta=delta, neighbors=nb)
    print("| method | shape | n | m | epsilon | neighbours | run s | bound s | ratio |")
    print("|---|---|---:|---:|---:|---|---:|---:|---:|")
    for size in args.sizes:
        n = int(float(size))
        for case in args.cases:
            if case == "hist1e8":
                continue
            hist = histogram(case, n, 1)
            for name in args.methods:
                mech = MECHANISMS[name]
                delta = 1e-6 if mech.uses_delta else None
                for m in args.ms:
                    q = np.arange(1, m + 1) / (m + 1)
                    for eps in args.eps:
                        for nb in mech.neighbors:
                            times = []
                            for r in range(args.runs):
                                t0 = time.perf_counter()
                                mech.run_grid(
                                    hist,
                                    q,
                                    epsilon=eps,
                                    delta=delta,
                                    neighbors=nb,
                                    rng=np.random.default_rng(r),
                                )
                                times.append(time.perf_counter() - t0)
                            run = max(times)
                            b = bound(name, m, eps, nb, n)
                            ratios[name].append(run / b)
                            if run > b:
                                overruns[name] += 1
                                print(
                                    f"| {name} | {case} | {n} | {m} | {eps:g} | {nb} "
                                    f"| {run:.3f} | {b:.3f} | {run / b:.2f} |",
                                    flush=True,
                                )
    print()
    print("| method | runs | overruns | median run/bound | largest run/bound |")
    print("|---|---:|---:|---:|---:|")
    for name in args.methods:
        rs = ratios[name]
        print(
            f"| {name} | {len(rs)} | {overruns[name]} | {statistics.median(rs):.3f} "
            f"| {max(rs):.2f} |"
        )


if __name__ == "__main__":
    main()

"""How often a release's error bars cover the true quantile, per data shape.

    python -m benchmarks.interval_coverage [--cells 40] [--trials 10] [--seed 20261205]

Cells are drawn at random with the fixed seed (log-uniform n in [10^3, 10^5], m in [1, 99],
epsilon in [0.05, 10]; shapes cycled over the error map's five, ``app.experiments.errormap``);
none of them is tuned on. Each cell runs the method ``auto`` picks (the planner, as a release
does) ``trials`` times on fresh samples; each estimate's interval (the release worker's
``intervals_of`` over ``app.planner.intervals``, from the planner's ``bound90_each`` at the true n,
the public bounds [-100, 100] and the service's default grid step for them, 10^-4, or 1 for
the integer-valued shape) is checked, as a release runs (``run_grid`` on the data's grid
histogram), against the data's true quantile (the ``ceil(q n)``-th smallest value). Prints,
per shape and overall: the share of (trial, quantile) pairs covered (nominal 90 %), the share
of cells whose own coverage is within 85-95 %, the median interval width as a share of
the data's interquartile range; and how honest the quote is: the share of trials whose mean
missed points per quantile stayed within the quoted ``bound90``, and of cells whose measured
mean is within 1.5x of the quoted mean (both on (error + 1), so cells near 0 count).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import defaultdict

import numpy as np

from app.codec.grid import cell_of, grid_size, grid_values
from app.experiments.errormap import LOWER, SHAPES, UPPER, sample_shape
from app.experiments.runner import evenly_spaced_quantiles, stream
from app.mechanisms import MECHANISMS
from app.mechanisms.histogram import GridHistogram
from app.planner import expected_error, recommend
from app.releases.runner import intervals_of

#: The service's default grid step for the bounds [-100, 100]; integer-valued data are
#: declared with step 1 (as an analyst would: docs/analysts.md).
STEP = 1e-4
STEPS = {"integer": 1.0}


def draw_cells(count: int, seed: int) -> list[tuple[str, int, int, float]]:
    """``count`` cells (shape, n, m, epsilon) from the fixed seed."""
    rng = np.random.default_rng(seed)
    shapes = list(SHAPES)
    cells = []
    for i in range(count):
        n = int(round(10 ** rng.uniform(3, 5)))
        m = int(round(10 ** rng.uniform(0, math.log10(99))))
        eps = float(f"{10 ** rng.uniform(math.log10(0.05), 1):.3g}")
        cells.append((shapes[i % len(shapes)], n, m, eps))
    return cells


def run(cells: int, trials: int, seed: int) -> int:
    covered: dict[str, list[float]] = defaultdict(list)
    cell_ok: dict[str, list[bool]] = defaultdict(list)
    widths: dict[str, list[float]] = defaultdict(list)
    held: dict[str, list[bool]] = defaultdict(list)  # a trial's mean missed <= bound90
    honest: dict[str, list[bool]] = defaultdict(list)  # quoted mean within 1.5x of measured
    start = time.perf_counter()
    print(
        f"{'shape':<10} {'n':>7} {'m':>3} {'eps':>6} {'method':<16} {'cover':>6} {'width/IQR':>9} "
        f"{'quoted':>8} {'measured':>8}"
    )
    for shape, n, m, eps in draw_cells(cells, seed):
        qs = evenly_spaced_quantiles(m)
        step = STEPS.get(shape, STEP)
        points = grid_size(LOWER, UPPER, step)
        method = recommend(n, list(qs), eps, None, "swap", grid_points=points)
        err = expected_error(method, n, list(qs), eps, None, "swap", grid_points=points)
        assert err is not None
        mech = MECHANISMS[method]
        hits: list[bool] = []
        missed: list[float] = []
        for t in range(trials):
            data = sample_shape(shape, stream(seed, f"{shape}-{n}-{m}-{eps}-{t}"), n)
            step = STEPS.get(shape, STEP)
            cells_, counts = np.unique(cell_of(data, LOWER, UPPER, step), return_counts=True)
            hist = GridHistogram(cells_, counts, grid_size(LOWER, UPPER, step))
            picked = mech.run_grid(
                hist, qs, epsilon=eps, delta=None, neighbors="swap",
                rng=stream(seed + 1, f"run-{shape}-{n}-{m}-{eps}-{t}"),
            )  # fmt: skip
            est = grid_values(picked, LOWER, step)
            data = grid_values(np.repeat(cells_, counts), LOWER, step)
            bars = intervals_of(
                {"quantiles": list(qs), "lower": LOWER, "upper": UPPER, "granularity": step,
                 "expected_error": [{**err._asdict(), "size": n}]},
                [float(e) for e in est],
            )  # fmt: skip
            assert bars is not None
            target = np.asarray(qs) * n
            below = np.searchsorted(data, est, "left")
            above = np.searchsorted(data, est, "right")
            miss = np.maximum(np.maximum(below - target, target - above), 0.0)
            missed.append(float(miss.mean()))
            held[shape].append(missed[-1] <= err[1])
            iqr = float(np.quantile(data, 0.75) - np.quantile(data, 0.25)) or 1.0
            for q, bar in zip(qs, bars, strict=True):
                lo, hi = bar["low"], bar["high"]
                truth = float(data[max(math.ceil(q * n), 1) - 1])
                hits.append(lo <= truth <= hi)
                widths[shape].append((hi - lo) / iqr)
        share = float(np.mean(hits))
        measured = float(np.mean(missed))
        honest[shape].append(1 / 1.5 <= (err[0] + 1) / (measured + 1) <= 1.5)
        covered[shape].extend(float(h) for h in hits)
        cell_ok[shape].append(0.85 <= share <= 0.95)
        width = float(np.median(widths[shape][-len(hits) :]))
        print(
            f"{shape:<10} {n:>7} {m:>3} {eps:>6.3g} {method:<16} {share:>6.1%} {width:>9.3f} "
            f"{err[0]:>8.3g} {measured:>8.3g}"
        )
    print()
    print(
        "| shape | cells | estimates | covered (nominal 90 %) | cells within 85-95 % "
        "| median width / IQR | trials within bound90 | quoted mean within 1.5x |"
    )
    print("|---|---|---|---|---|---|---|---|")
    every: list[float] = []
    for shape in SHAPES:
        if not covered[shape]:
            continue
        every.extend(covered[shape])
        print(
            f"| {shape} | {len(cell_ok[shape])} | {len(covered[shape])} | "
            f"{np.mean(covered[shape]):.1%} | {sum(cell_ok[shape])} of {len(cell_ok[shape])} | "
            f"{np.median(widths[shape]):.3f} | {np.mean(held[shape]):.1%} | "
            f"{sum(honest[shape])} of {len(honest[shape])} |"
        )
    total_ok = sum(sum(v) for v in cell_ok.values())
    print(
        f"| all | {cells} | {len(every)} | {np.mean(every):.1%} | {total_ok} of {cells} | "
        f"{np.median([w for v in widths.values() for w in v]):.3f} | "
        f"{np.mean([h for v in held.values() for h in v]):.1%} | "
        f"{sum(sum(v) for v in honest.values())} of {cells} |"
    )
    print(f"\n{time.perf_counter() - start:.0f} s; seed {seed}, {trials} trials per cell")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=40)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--seed", type=int, default=20261205)
    args = parser.parse_args(argv)
    return run(args.cells, args.trials, args.seed)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""How often a grouped release's per-group error bars cover the true quantile, and how much
that depends on the size hints the caller gives.

    python -m benchmarks.grouped_intervals [--trials 10] [--seed 20261219]

Each cell (shape x m x epsilon) is a table of ``--groups`` groups whose sizes fall as
``1/rank`` (``--rows`` rows in all: ~5,600 down to ~280 at the defaults), fresh samples per
trial. The release runs as the service runs a grouped release: ``run_groups`` on the groups'
grid histograms (the service's default grid step for the bounds [-100, 100], 10^-4, or 1
for the integer-valued shape), add/remove neighbours, the method ``auto`` picks at the
median hint. Each group's bars are the release worker's
(``app.releases.runner.group_intervals_of``) from its hint's ``bound90_each``
(``app.planner.expected_error`` at the hint, as the quote computes it), with the hints
exact, half the rows and twice the rows: the same release, three sets of bars (the method
is the one picked at the exact hints). A bar covers when the group's true quantile (the
``ceil(q n)``-th smallest of its snapped values) lies within it. Prints the share covered
per shape and hint factor, and for the smaller and larger half of the groups.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import defaultdict
from itertools import product

import numpy as np

from app.codec.grid import cell_of, grid_size, grid_values
from app.experiments.errormap import LOWER, UPPER, sample_shape
from app.experiments.runner import evenly_spaced_quantiles, stream
from app.mechanisms import MECHANISMS
from app.mechanisms.grouped import GROUPED_METHODS, run_groups
from app.mechanisms.histogram import GridHistogram
from app.planner import expected_error, recommend
from app.releases.runner import group_intervals_of

STEP = 1e-4
STEPS = {"integer": 1.0}
SHAPES = ("gaussian", "lognormal", "integer")
FACTORS = (1.0, 0.5, 2.0)


def sizes(groups: int, rows: int) -> list[int]:
    """Group sizes falling as 1/rank, ``rows`` in all."""
    weights = 1.0 / np.arange(1, groups + 1)
    return [max(1, int(round(rows * w))) for w in weights / weights.sum()]


def run(trials: int, seed: int, groups: int, rows: int) -> int:
    keys = [f"g{i:02d}" for i in range(groups)]
    truth_sizes = sizes(groups, rows)
    covered: dict[tuple[str, float, str], list[bool]] = defaultdict(list)
    start = time.perf_counter()
    print(f"{'shape':<10} {'m':>3} {'eps':>5} {'method':<16} " + " ".join(
        f"{'hint x' + format(f, 'g'):>9}" for f in FACTORS))  # fmt: skip
    for shape, m, eps in product(SHAPES, (5, 19), (0.5, 2.0)):
        qs = evenly_spaced_quantiles(m)
        step = STEPS.get(shape, STEP)
        points = grid_size(LOWER, UPPER, step)
        median = int(np.median(truth_sizes))
        method = recommend(median, list(qs), eps, None, "add_remove", grid_points=points,
                           only=GROUPED_METHODS)  # fmt: skip
        by_factor = {}
        for factor in FACTORS:
            rows_ = []
            for key, size in zip(keys, truth_sizes, strict=True):
                hint = max(1, int(round(size * factor)))
                err = expected_error(method, hint, list(qs), eps, None, "add_remove",
                                     grid_points=points)  # fmt: skip
                assert err is not None
                rows_.append({"key": key, "size": hint, **err._asdict()})
            by_factor[factor] = rows_
        cell: dict[float, list[bool]] = defaultdict(list)
        for t in range(trials):
            hists, datas = [], []
            for g, size in enumerate(truth_sizes):
                data = sample_shape(shape, stream(seed, f"{shape}-{m}-{eps}-{t}-{g}"), size)
                cells_, counts = np.unique(cell_of(data, LOWER, UPPER, step), return_counts=True)
                hists.append(GridHistogram(cells_, counts, points))
                datas.append(grid_values(np.repeat(cells_, counts), LOWER, step))
            picked = run_groups(
                MECHANISMS[method], hists, qs, grid_points=points, epsilon=eps, delta=None,
                neighbors="add_remove", rng=stream(seed + 1, f"run-{shape}-{m}-{eps}-{t}"),
            )  # fmt: skip
            estimates = [float(v) for p in picked for v in grid_values(p, LOWER, step)]
            for factor in FACTORS:
                params = {"group_by": "k", "group_keys": keys, "quantiles": list(qs),
                          "lower": LOWER, "upper": UPPER, "granularity": step,
                          "group_error": {"by_key": by_factor[factor]}}  # fmt: skip
                bars = group_intervals_of(params, estimates)
                assert bars is not None
                for g, (data, size) in enumerate(zip(datas, truth_sizes, strict=True)):
                    group_bars = bars[g]
                    assert group_bars is not None
                    half = "small" if g >= groups // 2 else "large"
                    for q, bar in zip(qs, group_bars, strict=True):
                        truth = float(data[max(math.ceil(q * size), 1) - 1])
                        hit = bar["low"] <= truth <= bar["high"]
                        cell[factor].append(hit)
                        covered[(shape, factor, half)].append(hit)
        print(f"{shape:<10} {m:>3} {eps:>5g} {method:<16} " + " ".join(
            f"{np.mean(cell[f]):>9.1%}" for f in FACTORS))  # fmt: skip
    print()
    print("| shape | hint | covered, all groups | larger half | smaller half |")
    print("|---|---|---|---|---|")
    for shape, factor in product(SHAPES, FACTORS):
        big, small = covered[(shape, factor, "large")], covered[(shape, factor, "small")]
        print(f"| {shape} | x{factor:g} | {np.mean(big + small):.1%} | {np.mean(big):.1%} | "
              f"{np.mean(small):.1%} |")  # fmt: skip
    print(f"\n{time.perf_counter() - start:.0f} s; seed {seed}, {trials} trials per cell, "
          f"{groups} groups of {truth_sizes[-1]}-{truth_sizes[0]} rows")  # fmt: skip
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--seed", type=int, default=20261219)
    parser.add_argument("--groups", type=int, default=20)
    parser.add_argument("--rows", type=int, default=20_000)
    args = parser.parse_args(argv)
    return run(args.trials, args.seed, args.groups, args.rows)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Does smoothing fix JointExp on atoms? The service's path (run_grid).

Run from the repository root (takes ~10 min on 2 cores):
``nice -n 19 .venv/bin/python docs/results/evidence/atoms_smoothing.py [trials] [workers]``.

For the error map's shapes ``integer`` (round(N(0, 5²)): ~40 atoms), ``clamped`` (N(80, 20²)
with ~16 % at the bound 100) and ``gaussian`` (continuous), bounds [−100, 100], swap
neighbours: each trial draws one sample, builds its grid histogram (granularity 1 — the
integers' own resolution — or 10⁻⁴, the service's default grid for these bounds) and runs
``run_grid`` of jointexp, jointexp_smooth, indexp and aq on it. Error: mean missed points per
quantile on the ORIGINAL sample (app/experiments/metric.py) of the grid values
``lower + k·granularity``. A (configuration, m, ε, method) whose call took more than
``MAX_SECONDS`` at n = 10⁴ is skipped at n = 10⁵ (projected 10×).
"""

from __future__ import annotations

import itertools
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import numpy as np

from app.experiments.errormap import LOWER, UPPER, sample_shape
from app.experiments.metric import missed_points
from app.experiments.runner import evenly_spaced_quantiles, stream

METHODS = ("jointexp", "jointexp_smooth", "indexp", "aq")
CONFIGS = (("integer", 1.0), ("integer", 1e-4), ("clamped", 1e-4), ("gaussian", 1e-4))
NS = (1_000, 10_000, 100_000)
MS = (9, 19, 49, 99)
EPSILONS = (0.1, 1.0, 10.0)
MAX_SECONDS = 0.8


def run_task(task: tuple[str, float, int, float], trials: int) -> list[tuple[object, ...]]:
    """Every n of one (shape, granularity, m, ε); rows (shape, g, n, m, ε, method, mean, se)."""
    from app.mechanisms import MECHANISMS, GridHistogram

    shape, g, m, eps = task
    qs = evenly_spaced_quantiles(m)
    rows: list[tuple[object, ...]] = []
    slow: set[str] = set()
    for n in NS:
        vals: dict[str, list[float]] = {k: [] for k in METHODS}
        secs: dict[str, list[float]] = {k: [] for k in METHODS}
        for t in range(trials):
            x = sample_shape(shape, stream(3, "atoms", shape, n, m, eps, t), n)
            hist = GridHistogram.from_values(x, LOWER, UPPER, g)
            for name in METHODS:
                if name in slow:
                    continue
                rng = stream(3, "atoms", shape, g, n, m, eps, t, name)
                start = time.perf_counter()
                idx = MECHANISMS[name].run_grid(hist, qs, epsilon=eps, delta=None, rng=rng)
                secs[name].append(time.perf_counter() - start)
                est = LOWER + idx.astype(np.float64) * g
                vals[name].append(float(missed_points(x, qs, est).mean()))
        for name in METHODS:
            v = np.asarray(vals[name])
            if v.size:
                se = float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else float("nan")
                rows.append((shape, g, n, m, eps, name, float(v.mean()), se))
                if np.mean(secs[name]) > MAX_SECONDS:
                    slow.add(name)
            else:
                rows.append((shape, g, n, m, eps, name, float("nan"), float("nan")))
    return rows


def main() -> None:
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    tasks = [(s, g, m, e) for (s, g), m, e in itertools.product(CONFIGS, MS, EPSILONS)]
    start = time.perf_counter()
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        results = list(pool.map(run_task, tasks, [trials] * len(tasks)))
    rows = sorted(r for res in results for r in res)
    print(f"{trials} trials per cell; mean ± SE missed points per quantile; nan = skipped")
    print("shape,granularity,n,m,epsilon," + ",".join(f"{k},{k}_se" for k in METHODS))
    by = {}
    for shape, g, n, m, eps, name, mean, se in rows:
        by.setdefault((shape, g, n, m, eps), {})[name] = (mean, se)
    order = {c: i for i, c in enumerate(CONFIGS)}
    for key in sorted(by, key=lambda k: (order[(k[0], k[1])], k[2], k[3], k[4])):
        cells = ",".join(f"{by[key][k][0]:.4g},{by[key][k][1]:.2g}" for k in METHODS)
        print(f"{key[0]},{key[1]:g},{key[2]},{key[3]},{key[4]:g},{cells}")
    print(f"wall {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()

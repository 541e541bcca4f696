"""Wall time and peak memory of the mechanisms, each case in its own process.

Usage::

    python -m benchmarks.bench_mechanisms                  # the issue-9 table (JointExp, m=99)
    python -m benchmarks.bench_mechanisms --runs 7 --markdown table.md
    python -m benchmarks.bench_mechanisms --grid --methods jointexp aq --sizes 1e6 --ms 99

Default table (issue 9): JointExp, m = 99 (q_j = j/100), epsilon = 1, swap neighbours, data
N(0, 5^2), bounds [-100, 100]:

* n = 10^6 values through the raw-array call, four shapes: continuous; rounded to 0.1;
  rounded to integers; 5 % of the values moved above the upper bound (150.0, clamped);
  and more tied shapes than the issue names: 5 % below the lower bound, 5 % and 10 %
  beyond each bound, and 5 % of the values exactly at 0.0, the data's centre (a tied block
  inside the data, as zero-inflated data have).
  ``np.sort`` of the same array is timed in the same process (median of the same number of
  runs) and the ratio reported; targets: <= 20x np.sort, peak RSS <= 1 GB.
* n = 10^8 records given as a grid histogram (granularity 3.2e-5 on [-100, 100]: about 10^6
  non-empty cells; counts drawn as one multinomial, never 10^8 values) through
  ``run_grid``; target <= 1 s.

Every case runs in a child process, so its peak RSS (``ru_maxrss``: interpreter, numpy and
numba included, ~180 MB) is its own. The child builds its input, warms the JIT caches on a
small input, then times ``--runs`` calls (default 5) and reports the median. Timings on the
shared 2-core machine are noisy: compare medians from one run of this script.

``--worker-malloc`` runs each case under the release workers' allocator settings
(``app.runtime.worker.keep_freed_memory``). By default a case runs in a plain process, whose glibc
gives the rows' memory back to the OS after every call and faults it in again on the next
(on 5 %-clamped data ~40,000 page faults, ~60 ms, per call); the service's workers keep it.

``--grid`` keeps the older benchmark: every (method, n, m) of N(0, 1) data, bounds ±100,
delta = 1e-6 for the approximate methods.

``--slice-prototype TRIALS`` (issue 10 item 5) measures the ACCURACY of a SliceQuantiles
prototype against JointExp (mean missed points per quantile, app/experiments/metric.py) on
grid histograms. The prototype is not a mechanism: it is not registered and NO privacy
guarantee is claimed for it (see docs/mechanisms.md, "SliceQuantiles: status"). Its
"oracle" column uses no rank noise at all (not private): the best error the slicing
approach could reach at that EM budget.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

DEFAULT_SIZES = ["1e3", "1e4", "1e5", "1e6", "1e7"]
DEFAULT_MS = [1, 9, 29, 99]
CASES = [
    "continuous",
    "round0.1",
    "integer",
    "clamped5pct",
    "clamped5pct_lower",
    "clamped5pct_both",
    "clamped10pct_both",
    "pointmass5pct",
    "hist1e8",
]
TARGET_RATIO = 20.0
TARGET_RSS_MB = 1024.0
TARGET_HIST_S = 1.0


def _peak_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _case_data(case: str, n: int, seed: int) -> Any:
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 5.0, size=n)
    if case == "round0.1":
        x = np.round(x, 1)
    elif case == "integer":
        x = np.round(x)
    elif case == "clamped5pct":
        x[rng.random(n) < 0.05] = 150.0
    elif case == "clamped5pct_lower":
        x[rng.random(n) < 0.05] = -150.0
    elif case == "clamped5pct_both":
        u = rng.random(n)
        x[u < 0.05] = 150.0
        x[u > 0.95] = -150.0
    elif case == "clamped10pct_both":
        u = rng.random(n)
        x[u < 0.10] = 150.0
        x[u > 0.90] = -150.0
    elif case == "pointmass5pct":
        x[rng.random(n) < 0.05] = 0.0  # zero-inflated: a tied block inside the data
    return x


def _hist_1e8(seed: int) -> Any:
    """10^8 N(0, 5^2) records on the grid -100 + k * 3.2e-5, as a GridHistogram."""
    import numpy as np
    from scipy import stats

    from app.mechanisms import GridHistogram

    step = 3.2e-5
    k1 = round(200.0 / step) + 1
    edges = -100.0 + (np.arange(k1 + 1) - 0.5) * step  # cell k holds values rounding to k
    cdf = stats.norm.cdf(edges, scale=5.0)
    p = np.diff(cdf)
    p[0] += cdf[0]
    p[-1] += 1.0 - cdf[-1]
    counts = np.random.default_rng(seed).multinomial(10**8, p / p.sum())
    cells = np.flatnonzero(counts)
    return GridHistogram.from_arrays(cells.astype(np.int64), counts[cells].astype(np.int64), k1)


def _child_case(case: str, runs: int, seed: int) -> dict[str, Any]:
    import numpy as np

    from app.mechanisms import MECHANISMS

    mech = MECHANISMS["jointexp"]
    q = np.arange(1, 100) / 100.0
    kw: dict[str, Any] = {"epsilon": 1.0, "delta": None}
    warm = np.random.default_rng(0).normal(0.0, 5.0, size=2000)
    mech.run(np.round(warm), q, lower=-100.0, upper=100.0, rng=np.random.default_rng(1), **kw)
    mech.run(warm, q, lower=-100.0, upper=100.0, rng=np.random.default_rng(1), **kw)
    times: list[float] = []
    sort_times: list[float] = []
    if case == "hist1e8":
        hist = _hist_1e8(seed)
        small = _hist_small(hist)
        mech.run_grid(small, q, rng=np.random.default_rng(1), **kw)
        for r in range(runs):
            t = time.perf_counter()
            mech.run_grid(hist, q, rng=np.random.default_rng(r), **kw)
            times.append(time.perf_counter() - t)
        n, d = hist.n, int(hist.cells.size)
    else:
        x = _case_data(case, 10**6, seed)
        for r in range(runs):
            t = time.perf_counter()
            np.sort(x)
            sort_times.append(time.perf_counter() - t)
            t = time.perf_counter()
            mech.run(x, q, lower=-100.0, upper=100.0, rng=np.random.default_rng(r), **kw)
            times.append(time.perf_counter() - t)
        n, d = x.size, int(np.unique(np.clip(x, -100.0, 100.0)).size)
    return {
        "case": case,
        "n": n,
        "d": d,
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "sort_median_s": statistics.median(sort_times) if sort_times else None,
        "peak_rss_mb": _peak_mb(),
    }


def _hist_small(hist: Any) -> Any:
    from app.mechanisms import GridHistogram

    return GridHistogram.from_arrays(hist.cells[:2000], hist.counts[:2000], hist.grid_points)


def _child_grid(method: str, n: int, m: int, runs: int, seed: int) -> dict[str, Any]:
    import numpy as np

    from app.mechanisms import MECHANISMS

    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    q = np.arange(1, m + 1) / (m + 1)
    sort_times = []
    for _ in range(runs):
        t = time.perf_counter()
        np.sort(x)
        sort_times.append(time.perf_counter() - t)
    mech = MECHANISMS[method]
    delta = 1e-6 if mech.uses_delta else None
    kw = {"epsilon": 1.0, "delta": delta, "lower": -100.0, "upper": 100.0}
    mech.run(x[: min(n, 1000)], q, rng=np.random.default_rng(1), **kw)  # warm JIT caches
    times: list[float] = []
    for r in range(runs):
        t = time.perf_counter()
        mech.run(x, q, rng=np.random.default_rng(r), **kw)
        times.append(time.perf_counter() - t)
    return {
        "median_s": statistics.median(times),
        "sort_median_s": statistics.median(sort_times),
        "peak_rss_mb": _peak_mb(),
    }


def _spawn(args: list[str], timeout: float) -> dict[str, Any] | str:
    cmd = [sys.executable, "-m", "benchmarks.bench_mechanisms", *args]
    env = dict(os.environ, NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1")
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        return f"> {timeout:.0f} s"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["failed"])[-1]
        return f"error: {last[:60]}"
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _issue_table(runs: int, timeout: float, worker_malloc: bool = False) -> list[str]:
    header = (
        "| case | n | distinct d | median (s) | min–max (s) | np.sort (s) | × np.sort "
        "| peak RSS (MB) | target | met |"
    )
    lines = [header, "|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    print(header)
    print(lines[1], flush=True)
    for case in CASES:
        extra = ["--worker-malloc"] if worker_malloc else []
        res = _spawn(["--child-case", case, "--runs", str(runs), *extra], timeout)
        if isinstance(res, str):
            line = f"| {case} | | | {res} | | | | | | no |"
        elif res["sort_median_s"] is None:
            ok = res["median_s"] <= TARGET_HIST_S and res["peak_rss_mb"] <= TARGET_RSS_MB
            line = (
                f"| {case} (run_grid) | {res['n']:.0e} | {res['d']} | {res['median_s']:.3f} | "
                f"{res['min_s']:.3f}–{res['max_s']:.3f} | — | — | {res['peak_rss_mb']:.0f} | "
                f"≤ {TARGET_HIST_S:g} s, ≤ 1 GB | {'yes' if ok else 'no'} |"
            )
        else:
            ratio = res["median_s"] / res["sort_median_s"]
            ok = ratio <= TARGET_RATIO and res["peak_rss_mb"] <= TARGET_RSS_MB
            line = (
                f"| {case} | {res['n']:.0e} | {res['d']} | {res['median_s']:.3f} | "
                f"{res['min_s']:.3f}–{res['max_s']:.3f} | {res['sort_median_s']:.4f} | "
                f"{ratio:.1f} | {res['peak_rss_mb']:.0f} | ≤ {TARGET_RATIO:g}×, ≤ 1 GB | "
                f"{'yes' if ok else 'no'} |"
            )
        print(line, flush=True)
        lines.append(line)
    return lines


def _grid_table(args: argparse.Namespace) -> list[str]:
    from app.mechanisms import MECHANISMS

    methods = args.methods or list(MECHANISMS)
    sizes = [int(float(s)) for s in args.sizes]
    header = "| method | n | m | median time (s) | peak RSS (MB) | np.sort (s) | time / sort |"
    lines = [header, "|---|---:|---:|---:|---:|---:|---:|"]
    print(header)
    print(lines[1])
    for method in methods:
        for n in sizes:
            for m in args.ms:
                child = ["--child", method, str(n), str(m), "--runs", str(args.runs)]
                res = _spawn(child, args.timeout)
                if isinstance(res, str):
                    line = f"| {method} | {n:.0e} | {m} | {res} | | | |"
                else:
                    ratio = res["median_s"] / res["sort_median_s"]
                    line = (
                        f"| {method} | {n:.0e} | {m} | {res['median_s']:.4f} | "
                        f"{res['peak_rss_mb']:.0f} | {res['sort_median_s']:.4f} | {ratio:.1f} |"
                    )
                print(line, flush=True)
                lines.append(line)
    return lines


def _tree_prefix_noise(m: int, eps_tree: float, rng: Any) -> Any:
    """Binary-tree continual counting: ``Z_i`` = sum of the dyadic node noises covering [1, i].

    Each stream position lies in one node per level (``h`` levels); shifting ``Z`` by one
    on an index interval changes two stream positions, so node noise is discrete Laplace
    with parameter ``exp(-eps_tree / (2 h))``.
    """
    import math

    import numpy as np

    h = max(1, math.ceil(math.log2(m))) + 1
    a = math.exp(-eps_tree / (2.0 * h))
    z = np.zeros(m, dtype=np.int64)
    for lev in range(h):
        size = 1 << lev
        k = m // size + 1
        nodes = rng.geometric(1 - a, size=k) - rng.geometric(1 - a, size=k)
        for i in range(1, m + 1):
            if i & size:
                z[i - 1] += nodes[i >> (lev + 1)]
    return z


def _slice_prototype(hist: Any, qs: Any, eps: float, rng: Any, *, oracle: bool) -> Any:
    """SliceQuantiles shape (Imola et al. 2025) on a grid; the grid step replaces the min gap.

    Half the budget to the rank noise, the other half / 2 to each slice's EM median (the
    public code's split); slice half-width ``l = ceil(2/eps_em ln(m (K+1) / beta) - 1)``,
    beta = 1e-6 (the public code's 0.05 lets ~5 % of runs put one estimate outside its
    slice, which dominates the mean error); fallback (uniform grid points) when the noisy
    ranks are closer than ``2 l + 1`` or leave [l + 1, n - l], and with probability 1e-3.
    Each slice's EM runs over the whole grid (not chained to the previous estimate, so one
    escape costs one quantile); the estimates are sorted. Returns (estimates, fell_back, l).
    """
    import math

    import numpy as np

    from app.mechanisms.histogram import support_from_grid
    from app.mechanisms.rng import uniform_integer

    sup = support_from_grid(hist, qs, epsilon=eps, neighbors="swap")
    n, m, k1 = sup.n, len(qs), hist.grid_points
    eps_em = eps * 0.5 / 2.0
    half = math.ceil((2.0 / eps_em) * math.log(m * k1 / 1e-6) - 1.0)
    ranks = np.floor(np.asarray(qs) * n).astype(np.int64)
    if not oracle:
        ranks = ranks + _tree_prefix_noise(m, eps * 0.5, rng)
    if (
        rng.random() < 1e-3
        or np.any(np.diff(ranks) < 2 * half + 1)
        or ranks[0] - half < 1
        or ranks[-1] + half > n
    ):
        return np.sort(rng.integers(0, k1, size=m)), True, half
    c = eps_em / 2.0
    out = np.empty(m, dtype=np.int64)
    width = np.diff(sup.edges)
    ok = width > 0
    for i in range(m):
        pos = np.clip(sup.cum - (ranks[i] - half - 1), 0, 2 * half + 1)
        logw = np.full(width.shape, -np.inf)
        logw[ok] = np.log(width[ok]) - c * np.abs(pos[ok] - (half + 0.5))
        t = int(np.argmax(logw + rng.gumbel(size=width.size)))
        out[i] = uniform_integer(int(sup.edges[t]), int(sup.edges[t + 1]), rng)
    out.sort()
    return out, False, half


def _slice_table(trials: int) -> list[str]:
    import numpy as np

    from app.experiments.metric import missed_points
    from app.mechanisms import MECHANISMS, GridHistogram

    rng = np.random.default_rng(20261130)
    lines = [
        "| data | n | m | ε | l | fallbacks | slice | slice oracle (not private) | jointexp"
        " | jointexp / slice |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    print("\n".join(lines), flush=True)
    for shape in ("normal", "lognormal"):
        lo, hi = (-10.0, 10.0) if shape == "normal" else (0.0, 100.0)
        for n in (10**5, 10**6):
            for m in (49, 99):
                qs = np.arange(1, m + 1) / (m + 1)
                for eps in (0.1, 1.0):
                    err: dict[str, list[float]] = {"slice": [], "oracle": [], "jointexp": []}
                    falls, half = 0, 0
                    for _ in range(trials):
                        x = rng.normal(size=n) if shape == "normal" else rng.lognormal(size=n)
                        hist = GridHistogram.from_values(x, lo, hi, 1e-4)
                        vals = np.repeat(hist.cells, hist.counts)
                        est, fell, half = _slice_prototype(hist, qs, eps, rng, oracle=False)
                        falls += int(fell)
                        err["slice"].append(float(missed_points(vals, qs, est).mean()))
                        est, _, _ = _slice_prototype(hist, qs, eps, rng, oracle=True)
                        err["oracle"].append(float(missed_points(vals, qs, est).mean()))
                        je = MECHANISMS["jointexp"].run_grid(
                            hist, qs, epsilon=eps, delta=None, rng=rng
                        )
                        err["jointexp"].append(float(missed_points(vals, qs, je).mean()))
                    s, o, j = (float(np.mean(err[k])) for k in ("slice", "oracle", "jointexp"))
                    line = (
                        f"| {shape} | {n:.0e} | {m} | {eps:g} | {half} | {falls}/{trials} |"
                        f" {s:.1f} | {o:.1f} | {j:.1f} | {j / s:.2f} |"
                    )
                    lines.append(line)
                    print(line, flush=True)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--grid", action="store_true", help="the (method, n, m) grid instead")
    parser.add_argument("--methods", nargs="*", help="--grid: registry names (default: all)")
    parser.add_argument("--sizes", nargs="*", default=DEFAULT_SIZES, help="--grid: values of n")
    parser.add_argument("--ms", nargs="*", type=int, default=DEFAULT_MS, help="--grid: m values")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per case (median)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per case")
    parser.add_argument("--markdown", help="also write the table to this file")
    parser.add_argument("--child", nargs=3, metavar=("METHOD", "N", "M"), help=argparse.SUPPRESS)
    parser.add_argument("--child-case", help=argparse.SUPPRESS)
    parser.add_argument(
        "--worker-malloc",
        action="store_true",
        help="run each case under the release workers' glibc settings (app.runtime.worker."
        "keep_freed_memory: freed rows stay in the heap, not faulted in again per run)",
    )
    parser.add_argument(
        "--slice-prototype", type=int, metavar="TRIALS", help="SliceQuantiles accuracy table"
    )
    args = parser.parse_args(argv)

    if args.child:
        method, n, m = args.child
        print(json.dumps(_child_grid(method, int(n), int(m), args.runs, seed=12345)))
        return 0
    if args.child_case:
        if args.worker_malloc:
            from app.runtime.worker import keep_freed_memory

            keep_freed_memory()
        print(json.dumps(_child_case(args.child_case, args.runs, seed=12345)))
        return 0

    if args.slice_prototype:
        lines = _slice_table(args.slice_prototype)
    elif args.grid:
        lines = _grid_table(args)
    else:
        lines = _issue_table(args.runs, args.timeout, args.worker_malloc)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

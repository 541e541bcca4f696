"""Wall time and peak memory of the mechanisms, each case in its own process.

Usage::

    python -m benchmarks.bench_mechanisms                  # the issue-9 table (JointExp, m=99)
    python -m benchmarks.bench_mechanisms --runs 7 --markdown table.md
    python -m benchmarks.bench_mechanisms --grid --methods jointexp aq --sizes 1e6 --ms 99

Default table (issue 9): JointExp, m = 99 (q_j = j/100), epsilon = 1, swap neighbours, data
N(0, 5^2), bounds [-100, 100]:

* n = 10^6 values through the raw-array call, four shapes: continuous; rounded to 0.1;
  rounded to integers; 5 % of the values moved above the upper bound (150.0, clamped).
  ``np.sort`` of the same array is timed in the same process (median of the same number of
  runs) and the ratio reported; targets: <= 20x np.sort, peak RSS <= 1 GB.
* n = 10^8 records given as a grid histogram (granularity 3.2e-5 on [-100, 100]: about 10^6
  non-empty cells; counts drawn as one multinomial, never 10^8 values) through
  ``run_grid``; target <= 1 s.

Every case runs in a child process, so its peak RSS (``ru_maxrss``: interpreter, numpy and
numba included, ~180 MB) is its own. The child builds its input, warms the JIT caches on a
small input, then times ``--runs`` calls (default 5) and reports the median. Timings on the
shared 2-core machine are noisy: compare medians from one run of this script.

``--grid`` keeps the older benchmark: every (method, n, m) of N(0, 1) data, bounds ±100,
delta = 1e-6 for the approximate methods.
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
CASES = ["continuous", "round0.1", "integer", "clamped5pct", "hist1e8"]
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


def _issue_table(runs: int, timeout: float) -> list[str]:
    header = (
        "| case | n | distinct d | median (s) | min–max (s) | np.sort (s) | × np.sort "
        "| peak RSS (MB) | target | met |"
    )
    lines = [header, "|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    print(header)
    print(lines[1], flush=True)
    for case in CASES:
        res = _spawn(["--child-case", case, "--runs", str(runs)], timeout)
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
    args = parser.parse_args(argv)

    if args.child:
        method, n, m = args.child
        print(json.dumps(_child_grid(method, int(n), int(m), args.runs, seed=12345)))
        return 0
    if args.child_case:
        print(json.dumps(_child_case(args.child_case, args.runs, seed=12345)))
        return 0

    lines = _grid_table(args) if args.grid else _issue_table(args.runs, args.timeout)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Wall time and peak memory of every registered mechanism on Gaussian data.

Usage::

    python -m benchmarks.bench_mechanisms                      # the full grid (slow: ~15 min)
    python -m benchmarks.bench_mechanisms --methods jointexp aq --sizes 1e6 --ms 99
    python -m benchmarks.bench_mechanisms --markdown results.md

Every (method, n, m) cell runs in its own child process, so its peak RSS is its own: the
child generates the data, warms the JIT caches on a small input, then times ``--runs`` calls
(default 5) and reports the median and the process's peak resident set size. ``np.sort``
of the same data is timed alongside as a reference. Data: N(0, 1), bounds [-100, 100],
epsilon = 1, delta = 1e-6 for the approximate methods, swap neighbours, quantiles
j / (m + 1). Timings on a shared 2-core machine are noisy: compare medians from one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

DEFAULT_SIZES = ["1e3", "1e4", "1e5", "1e6", "1e7"]
DEFAULT_MS = [1, 9, 29, 99]


def _child(method: str, n: int, m: int, runs: int, seed: int) -> None:
    import resource

    import numpy as np

    from app.mechanisms import MECHANISMS

    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    q = np.arange(1, m + 1) / (m + 1)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    sort_times = []
    for _ in range(runs):
        t = time.perf_counter()
        np.sort(x)
        sort_times.append(time.perf_counter() - t)
    times: list[float] = []
    if method != "np.sort":
        mech = MECHANISMS[method]
        delta = 1e-6 if mech.uses_delta else None
        kw = {"epsilon": 1.0, "delta": delta, "lower": -100.0, "upper": 100.0}
        mech.run(x[: min(n, 1000)], q, rng=np.random.default_rng(1), **kw)  # warm JIT caches
        for r in range(runs):
            t = time.perf_counter()
            mech.run(x, q, rng=np.random.default_rng(r), **kw)
            times.append(time.perf_counter() - t)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {
                "median_s": statistics.median(times) if times else statistics.median(sort_times),
                "sort_median_s": statistics.median(sort_times),
                "peak_rss_mb": peak / 1024.0,
                "base_rss_mb": base_rss / 1024.0,
            }
        )
    )


def _run_cell(method: str, n: int, m: int, runs: int, timeout: float) -> dict[str, float] | str:
    cmd = [sys.executable, "-m", "benchmarks.bench_mechanisms", "--child", method, str(n), str(m)]
    cmd += ["--runs", str(runs)]
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
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="*", help="registry names (default: all)")
    parser.add_argument("--sizes", nargs="*", default=DEFAULT_SIZES, help="values of n")
    parser.add_argument("--ms", nargs="*", type=int, default=DEFAULT_MS, help="values of m")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per cell (median)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per cell")
    parser.add_argument("--markdown", help="also write the table to this file")
    parser.add_argument("--child", nargs=3, metavar=("METHOD", "N", "M"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        method, n, m = args.child
        _child(method, int(n), int(m), args.runs, seed=12345)
        return 0

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
                res = _run_cell(method, n, m, args.runs, args.timeout)
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
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Random hostile inputs through JointExp's raw-array call: failures and slow cases.

Usage::

    python -m benchmarks.fuzz_jointexp --seed 1 --seconds 240
    python -m benchmarks.fuzz_jointexp --seed 2 --cases 34,3009,4694   # re-run those cases

Each case has its own generator (``default_rng([seed, case])``), so a case number names the
same input on any checkout. A case: n = 3 to 10^5 values N(0, 5^2), up to three tied masses
of up to 60 % each (at 0.0, 3.0, at or beyond either bound), sometimes rounded to integers or
to 0.1, m = 1 to 119 quantiles (evenly spaced or random), epsilon log-uniform in
[10^-2.5, 10^2] (above 100 is refused), swap or add/remove neighbours, bounds [-100, 100].
Every output must be sorted and inside the bounds; any exception is printed with its case
and re-raised. Prints the number of cases run, every case slower than ``--slow`` seconds, and
every case whose run took longer than the service's public run-time bound for its figures
(:func:`app.releases.schedule.run_bound_s` at scale 1, with n as the number of cells and
records, the most the public figures allow): a release of such data would be published late
by the excess (docs/security.md, "How often a run outlives its bound").
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from app.mechanisms import MECHANISMS
from app.releases.schedule import run_bound_s


def case_input(seed: int, case: int) -> tuple[np.ndarray, np.ndarray, float, str]:
    """The data, quantiles, epsilon and neighbour notion of one case."""
    rng = np.random.default_rng([seed, case])
    n = int(10 ** rng.uniform(0.5, 5))
    x = rng.normal(0.0, 5.0, n)
    for _ in range(int(rng.integers(0, 4))):
        frac = rng.uniform(0.0, 0.6)
        x[rng.random(n) < frac] = rng.choice([0.0, 150.0, -150.0, 3.0, 100.0, -100.0])
    if rng.random() < 0.3:
        x = np.round(x, int(rng.integers(0, 2)))
    m = int(rng.integers(1, 120))
    if rng.random() < 0.5:
        q = np.unique(np.sort(rng.uniform(0.001, 0.999, m)))
    else:
        q = np.arange(1, m + 1) / (m + 1)
    eps = float(10 ** rng.uniform(-2.5, 2.0))  # the samplers accept epsilon <= 100
    neighbors = "swap" if rng.random() < 0.5 else "add_remove"
    return x, q, eps, neighbors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=120.0, help="stop after this long")
    parser.add_argument("--cases", default="", help="comma-separated case numbers only")
    parser.add_argument("--slow", type=float, default=1.0, help="report cases slower than this")
    args = parser.parse_args()
    only = sorted(int(v) for v in args.cases.split(",") if v)
    todo = iter(only) if only else iter(range(10**9))
    mech = MECHANISMS["jointexp"]
    start, runs, slow, over = time.perf_counter(), 0, [], []
    for case in todo:
        if not only and time.perf_counter() - start > args.seconds:
            break
        x, q, eps, neighbors = case_input(args.seed, case)
        t = time.perf_counter()
        try:
            out = mech(x, q, epsilon=eps, lower=-100.0, upper=100.0, neighbors=neighbors)
            if not (np.all(np.diff(out) >= 0) and np.all((out >= -100.0) & (out <= 100.0))):
                raise AssertionError("outputs not sorted or outside the bounds")
        except Exception:
            print(f"FAILED case {case}: n={x.size} m={q.size} eps={eps:.4g} {neighbors}")
            raise
        took = time.perf_counter() - t
        runs += 1
        bound = run_bound_s(
            m=q.size, cells=x.size, scale=1.0, cap_s=float("inf"), epsilon=eps, size=x.size
        )
        if took > bound:
            over.append(
                f"case {case}: n={x.size} m={q.size} eps={eps:.4g} {neighbors} {took:.2f} s "
                f"against {bound:.2f} s ({took / bound:.1f}x)"
            )
        if took > args.slow:
            slow.append(
                f"case {case}: n={x.size} m={q.size} eps={eps:.4g} {neighbors} {took:.2f} s"
            )
    print(f"{runs} cases, no failure; {len(slow)} slower than {args.slow} s")
    for line in slow:
        print("  " + line)
    print(f"{len(over)} over the public run-time bound")
    for line in over:
        print("  " + line)


if __name__ == "__main__":
    main()

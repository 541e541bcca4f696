"""Longer sweep of JointExp's sound error bound against the errors it bounds.

Usage::

    python -m benchmarks.error_bound_sweep --cases 3000
    python -m benchmarks.error_bound_sweep --cases 500 --start 10000

Same stress supports as the CI tier (``tests/mechanisms/test_jointexp_errors.py``,
``_case(seed)``: edge widths 10^16 times the rest, scattered or central wide intervals,
heavy atoms, close quantiles, c from 0.05 to 3, a log range of 8 to 40 e-folds so that the
dropped mass is large enough to measure). For every case, row and 9 positions per row it
measures the total error of a draw's weights against the dense log pass and compares it
with :mod:`app.mechanisms.jointexp.error_bound`'s bound. Prints the number of cases and
measurements, how many exceed the bound (must be 0), and the distribution over cases of
each case's largest ``log(measured) - log(bound)`` (e-folds; negative: below the bound, and
how far says how conservative it is).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

# ``tests`` is a namespace package at the repository root: put the root on the path.
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests.mechanisms.test_jointexp_errors import _check  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--start", type=int, default=0, help="first seed")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    slack: list[float] = []
    measured = 0
    over: list[tuple[int, float]] = []
    for seed in range(args.start, args.start + args.cases):
        checked, worst = _check(seed)
        measured += checked
        if checked:
            slack.append(worst)
        if worst > 1e-9:
            over.append((seed, worst))
    took = time.perf_counter() - t0
    q = np.percentile(slack, [0, 10, 50, 90, 100]) if slack else [math.nan] * 5
    print(f"cases {args.cases} (seeds {args.start}..{args.start + args.cases - 1}), ", end="")
    print(f"measurements {measured}, {took:.0f} s")
    # per case: the largest (measured - bound) over its rows and positions, in e-folds
    print("| above the bound | max | p90 | median | p10 | min |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(f"| {len(over)} | {q[4]:.1f} | {q[3]:.1f} | {q[2]:.1f} | {q[1]:.1f} | {q[0]:.1f} |")
    for seed, worst in over[:20]:
        print(f"seed {seed}: measured error above the bound by {worst:.3g} e-folds")
    return 1 if over else 0


if __name__ == "__main__":
    raise SystemExit(main())

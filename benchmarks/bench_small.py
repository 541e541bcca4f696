"""JointExp on small stored datasets, as the service runs it (not a timed test).

Times ``run_grid`` on the grid histogram the service stores for N(50, 20^2) data with
bounds -100..200 and the default granularity (the datasets of ``bench_service.py``), for
n in {10^3, 10^4} and m in {9, 99}: the median of ``--runs`` draws per case, one process.
``--digest`` also prints a hash of the outputs of 48 seeded raw-array runs (continuous,
tied, integer and clamped data; m = 9 and 99; epsilon 1 and 0.1), so two checkouts can be
compared for identical draws.

``--code DIR`` imports ``app`` from another checkout (e.g. a ``git worktree`` of an older
commit); run the two alternately, several times, on a shared machine.

Usage::

    python -m benchmarks.bench_small [--runs 25] [--digest] [--code DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_service import grid_histogram  # imports app only when called

DECILES = [round(0.1 * k, 1) for k in range(1, 10)]
PERCENTILES = [round(0.01 * k, 2) for k in range(1, 100)]


def _histogram(n: int) -> Any:
    import numpy as np

    return grid_histogram(np.random.default_rng(1).normal(50.0, 20.0, n))


def _digest() -> str:
    import numpy as np

    from app.mechanisms import MECHANISMS

    mech = MECHANISMS["jointexp"]
    h = hashlib.sha256()
    for seed in range(6):
        rng = np.random.default_rng(seed)
        for kind in ("continuous", "tied", "clamped", "integer"):
            n = (500, 3000, 20000)[seed % 3]
            x = rng.normal(0.0, 5.0, n)
            if kind == "tied":
                x = np.round(x, 1)
            elif kind == "integer":
                x = np.round(x)
            elif kind == "clamped":
                x[rng.random(n) < 0.1] = 150.0
            for m in (9, 99):
                q = np.arange(1, m + 1) / (m + 1)
                out = mech.run(
                    x,
                    q,
                    epsilon=(1.0, 0.1)[seed % 2],
                    delta=None,
                    lower=-100.0,
                    upper=100.0,
                    rng=np.random.default_rng(seed),
                )
                h.update(np.asarray(out, dtype="<f8").tobytes())
    return h.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=25)
    parser.add_argument("--digest", action="store_true", help="hash of 48 seeded outputs")
    parser.add_argument("--code", type=Path, default=None, help="import app from this checkout")
    args = parser.parse_args()
    if args.code is not None:
        sys.path.insert(0, str(args.code.resolve()))

    from app.mechanisms import get_mechanism

    mech = get_mechanism("jointexp")
    out = sys.stdout
    out.write(f"code: {args.code or 'this checkout'}\n")
    out.write(f"{'n':>7} | {'m':>3} | {'median ms':>9} | {'min ms':>7}\n")
    for n in (10**3, 10**4):
        hist = _histogram(n)
        for qs in (DECILES, PERCENTILES):
            mech.run_grid(hist, qs, epsilon=1.0, delta=None)  # JIT and caches
            times = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                mech.run_grid(hist, qs, epsilon=1.0, delta=None)
                times.append(time.perf_counter() - t0)
            out.write(
                f"{n:>7} | {len(qs):>3} | {1000 * statistics.median(times):>9.2f} | "
                f"{1000 * min(times):>7.2f}\n"
            )
    if args.digest:
        out.write(f"digest of 48 seeded outputs: {_digest()}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

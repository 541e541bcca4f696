"""Longer law-level audit of JointExp's sampler: exact implementation law vs the paper's law.

Usage::

    python -m benchmarks.law_audit_sweep --cases 20000 --seed 1
    python -m benchmarks.law_audit_sweep --cases 5000 --seed 20261203 --max-intervals 7 --max-m 3
    python -m benchmarks.law_audit_sweep --seed 1 --only 44,1093     # re-run those cases

Same generator as the CI tier (``tests/mechanisms/law_audit.py``, :func:`make_case`: case
``i`` is ``default_rng([seed, i])``, the same input on any checkout), by default with larger
supports (d + 1 <= 9 intervals, m <= 4). Every case runs on every path of ``PATHS``; prints
per path the number of cases, the worst total variation, how many exceed ``--tv`` and the
seconds spent, then every (case, path) over it with its rounding scale (the expected size of
one rounding per kernel exponent, :func:`rounding_scale`) and the worst one in full.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path as _FsPath

# ``tests`` is not a package (a namespace package at the repository root, as the suite
# imports it under ``python -m pytest``): put the root on the path when run as a script or
# from elsewhere.
_ROOT = str(_FsPath(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests.mechanisms import law_audit as LA  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-intervals", type=int, default=9)
    ap.add_argument("--max-m", type=int, default=4)
    ap.add_argument("--tv", type=float, default=1e-12, help="threshold reported as over")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--only", type=str, default="", help="comma-separated case indices")
    args = ap.parse_args(argv)
    indices = [int(s) for s in args.only.split(",") if s] or list(range(args.cases))
    t0 = time.perf_counter()
    rows = LA.sweep(
        args.seed,
        indices,
        max_intervals=args.max_intervals,
        max_m=args.max_m,
        tv_max=args.tv,
        workers=args.workers,
    )
    wall = time.perf_counter() - t0
    print(
        f"seed={args.seed} cases={len(indices)} max_intervals={args.max_intervals} "
        f"max_m={args.max_m} workers={args.workers} wall={wall:.1f}s"
    )
    print(f"{'path':12s} {'cases':>7s} {'worst TV':>10s} {'over':>6s} {'seconds':>8s}")
    for name in LA.PATH_NAMES:
        mine = [r for r in rows if r.path == name]
        worst = max(r.tv for r in mine)
        over = sum(r.tv > args.tv for r in mine)
        secs = sum(r.seconds for r in mine)
        print(f"{name:12s} {len(mine):7d} {worst:10.3e} {over:6d} {secs:8.1f}")
    over_rows = sorted((r for r in rows if r.tv > args.tv), key=lambda r: -r.tv)
    if over_rows:
        print(f"\n(case, path) over TV {args.tv:g}: TV, rounding scale, TV / scale")
        for r in over_rows:
            ratio = r.tv / r.scale if r.scale > 0.0 else float("inf")
            print(f"  {r.index:6d} {r.path:12s} {r.tv:.3e} {r.scale:.3e} {ratio:.3f}")
        worst_row = over_rows[0]
        case = LA.make_case(
            args.seed, worst_row.index, max_intervals=args.max_intervals, max_m=args.max_m
        )
        path = next(p for p in LA.PATHS if p.name == worst_row.path)
        (res,) = LA.audit(case, paths=(path,))
        print("\nworst:\n" + LA.describe_failure(case, res))
    return 1 if over_rows else 0


if __name__ == "__main__":
    raise SystemExit(main())

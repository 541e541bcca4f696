"""Grouped quantiles against the peers: dpquant vs PipelineDP vs Tumult Analytics.

Same data, same total ε, same trial: 20 groups of 500-1,500 rows (each group its own
location), three shapes — ``gaussian`` (N(μ_g, 10²) on [0, 100], grid step 0.01),
``integer`` (rounded N(μ_g, 8²) on [0, 100], step 1: heavy ties), ``lognormal``
(exp(N(log μ_g, 0.8)) clamped to [0, 500], step 0.01) — m = 5 and 19 evenly spaced
quantiles, ε ∈ {0.5, 2}. Metric: mean missed points per quantile (the paper's, from
:mod:`app.experiments.metric`, on each group's raw values), averaged over groups, quantiles
and trials, with its standard error over trials.

* dpquant: :func:`app.mechanisms.grouped.run_groups` on the groups' grid histograms (what a
  grouped release runs), JointExp and AQ, add/remove neighbours, one row per person.
* PipelineDP (``Metrics.PERCENTILE``, LocalBackend, public partitions) and Tumult Analytics
  (``groupby(KeySet).quantile``, one query per quantile at ε/m), both with add/remove-one-row
  neighbours and pure DP, run in their own virtual environment by
  ``benchmarks/peers_grouped_peer.py`` (never dpquant dependencies):

      python3 -m venv /work/peers-venv
      /work/peers-venv/bin/pip install pipeline-dp tmlt.analytics   # pyspark, Java 17

Usage::

    python -m benchmarks.peers_grouped [--trials 10] [--peer-trials 5] [--out FILE]
        [--peers-python /work/peers-venv/bin/python] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from app.experiments.metric import missed_points
from app.mechanisms import MECHANISMS, GridHistogram
from app.mechanisms.grouped import run_groups

HERE = Path(__file__).resolve().parent
SHAPES = {"gaussian": (0.0, 100.0, 0.01), "integer": (0.0, 100.0, 1.0),
          "lognormal": (0.0, 500.0, 0.01)}  # fmt: skip
GROUPS = 20
#: dpquant's methods: JointExp, its smoothed form (the one to ask for on tied data) and AQ
OURS = ("jointexp", "jointexp_smooth", "aq")


def make_groups(shape: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for g in range(GROUPS):
        size = int(rng.integers(500, 1501))
        mu = 25.0 + 50.0 * g / (GROUPS - 1)
        if shape == "gaussian":
            x = np.clip(rng.normal(mu, 10.0, size), 0, 100)
        elif shape == "integer":
            x = np.clip(np.rint(rng.normal(mu, 8.0, size)), 0, 100)
        else:
            x = np.clip(np.exp(rng.normal(np.log(mu), 0.8, size)), 0, 500)
        out[f"g{g:02d}"] = np.sort(x)
    return out


def error(groups: dict[str, np.ndarray], qs: list[float], est: dict[str, list[float]]) -> float:
    """Mean missed points per quantile over the groups."""
    return float(np.mean([missed_points(x, qs, sorted(est[k])).mean()
                          for k, x in groups.items()]))  # fmt: skip


def dpquant(
    method: str, groups: dict[str, np.ndarray], qs: list[float], eps: float, grid: tuple
) -> dict[str, list[float]]:
    lo, hi, step = grid
    hists = [GridHistogram.from_values(x, lo, hi, step) for x in groups.values()]
    points = hists[0].grid_points
    idx = run_groups(MECHANISMS[method], hists, qs, grid_points=points, epsilon=eps,
                     delta=None, neighbors="add_remove")  # fmt: skip
    return {k: [lo + int(i) * step for i in cells] for k, cells in zip(groups, idx, strict=True)}


def peers(python: str, jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """Run the peers on every job (one trial's data each) in one process of their venv."""
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.json", Path(tmp) / "out.json"
        src.write_text(json.dumps({"jobs": jobs}))
        env = os.environ | {"PYSPARK_PYTHON": python}
        subprocess.run([python, str(HERE / "peers_grouped_peer.py"), str(src), str(dst)],
                       check=True, env=env, cwd=tmp, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)  # fmt: skip
        out: dict[str, Any] = json.loads(dst.read_text())
        return out


def version(python: str, package: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({package!r}))"
    return subprocess.run([python, "-c", code], capture_output=True, text=True).stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--peer-trials", type=int, default=5)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--peers-python", default="/work/peers-venv/bin/python")
    parser.add_argument("--out", default=str(HERE.parent / "docs/results/peers_grouped.md"))
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    cells = [(s, m, e) for s in SHAPES for m in (5, 19) for e in (0.5, 2.0)]
    if args.quick:
        cells, args.trials, args.peer_trials = cells[:1], 2, 1
    rows = []
    started = time.perf_counter()
    for shape, m, eps in cells:
        qs = [round((j + 1) / (m + 1), 6) for j in range(m)]
        grid = SHAPES[shape]
        rng = np.random.default_rng([args.seed, m, int(eps * 10), len(shape)])
        errs: dict[str, list[float]] = {m: [] for m in (*OURS, "pipelinedp", "tumult")}
        secs: dict[str, list[float]] = {m: [] for m in OURS}
        jobs, kept = [], []
        for trial in range(args.trials):
            groups = make_groups(shape, rng)
            for method in OURS:
                t0 = time.perf_counter()
                est = dpquant(method, groups, qs, eps, grid)
                secs[method].append(time.perf_counter() - t0)
                errs[method].append(error(groups, qs, est))
            if trial < args.peer_trials:
                kept.append(groups)
                jobs.append({"groups": {k: x.tolist() for k, x in groups.items()},
                             "quantiles": qs, "epsilon": eps, "lower": grid[0],
                             "upper": grid[1]})  # fmt: skip
        got = peers(args.peers_python, jobs)
        for name in ("pipelinedp", "tumult"):
            errs[name] = [error(g, qs, est) for g, est in zip(kept, got[name], strict=True)]
            secs[name] = [got["seconds"][name]]
        mean = {k: statistics.mean(v) for k, v in errs.items()}
        se = {k: statistics.stdev(v) / len(v) ** 0.5 if len(v) > 1 else float("nan")
              for k, v in errs.items()}  # fmt: skip
        rows.append((shape, m, eps, mean, se, {k: statistics.median(v) for k, v in secs.items()}))
        print(f"{shape:<10} m={m:<3} eps={eps:<4} "
              + " ".join(f"{k} {v:.2f}" for k, v in mean.items()), flush=True)  # fmt: skip
    lines = [
        "# Grouped quantiles: dpquant against PipelineDP and Tumult Analytics",
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on a shared 2-core machine in "
        f"{time.perf_counter() - started:.0f} s: `python -m benchmarks.peers_grouped "
        f"--trials {args.trials} --peer-trials {args.peer_trials} --seed {args.seed}`. "
        f"pipeline-dp {version(args.peers_python, 'pipeline-dp')}, tmlt.analytics "
        f"{version(args.peers_python, 'tmlt.analytics')} (own virtual environment).",
        "",
        f"{GROUPS} groups of 500-1,500 rows, same data and total ε for every tool in a trial, "
        "add/remove-one-row neighbours, public keys. Mean missed points per quantile "
        f"(± standard error over trials; dpquant {args.trials} trials, peers "
        f"{args.peer_trials}); ratios: dpquant jointexp and jointexp_smooth over the better "
        "peer; seconds per grouped release (median; Tumult's first release includes Spark's "
        "start).",
        "",
        "| shape | m | ε | jointexp | jointexp_smooth | aq | PipelineDP | Tumult | "
        "jointexp ÷ best peer | smooth ÷ best peer | s jointexp | s smooth | s PipelineDP | "
        "s Tumult |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for shape, m, eps, mean, se, sec in rows:

        def f(k: str, mean: dict = mean, se: dict = se) -> str:
            return f"{mean[k]:.2f} ± {se[k]:.2f}"

        best = min(mean["pipelinedp"], mean["tumult"])
        lines.append(
            f"| {shape} | {m} | {eps} | {f('jointexp')} | {f('jointexp_smooth')} | {f('aq')} | "
            f"{f('pipelinedp')} | {f('tumult')} | {mean['jointexp'] / best:.2f} | "
            f"{mean['jointexp_smooth'] / best:.2f} | {sec['jointexp']:.3f} | "
            f"{sec['jointexp_smooth']:.3f} | {sec['pipelinedp']:.2f} | {sec['tumult']:.1f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.quick:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Grouped quantile releases, side by side: dpquant vs PipelineDP vs Tumult Analytics.

**What is compared.** One grouped release answers the same m quantiles of one numeric column
in each of 20 groups (public keys), private for one row under add/remove neighbours at a
total ε. In every trial all tools get the same data and the same total ε:

* data: 20 groups of 500-1,500 rows (sizes drawn per trial), each group with its own location,
  in three shapes: ``gaussian`` (N(μ_g, 10²), μ_g from 30 to 70, clamped to [0, 100]),
  ``integer`` (ratings/ages: N(μ_g, 8²) rounded, μ_g from 20 to 80, clamped to the integers
  0-100: heavy ties), ``lognormal`` (exp(N(λ_g, 1)), λ_g from 2.6 to 3.4, clamped to
  [0, 500]);
* m = 5 and m = 19 levels q_j = j / (m + 1); ε ∈ {0.5, 2};
* dpquant: :func:`app.mechanisms.grouped.run_groups` (what the service runs for a grouped
  release) on each group's :class:`~app.mechanisms.GridHistogram` on the grid ``lower + i *
  granularity`` (step 1 for ``integer``, (upper - lower) / 10⁵ otherwise), add/remove
  neighbours, one row per unit; methods ``jointexp``, ``jointexp_smooth`` (the method meant for
  tied data) and ``aq``;
* PipelineDP: ``Metrics.PERCENTILE`` per level on ``LocalBackend``, public partitions,
  ``NaiveBudgetAccountant(total_epsilon=ε, total_delta=0)``, Laplace noise (pure ε-DP), one
  contribution per unit;
* Tumult Analytics: ``groupby(KeySet).quantile(column, q, low, high)``, one query per level at
  ``PureDPBudget(ε / m)`` in a session of ``PureDPBudget(ε)`` with ``AddOneRow()``.

The peers run in ``benchmarks/peers_grouped_peer.py`` under their own virtual environment
(details of their calls there); this script writes each cell's data as ``.npy`` files to a
temporary directory, runs the helper there once per cell, and reads its JSON answer.

**Metric.** Missed points per quantile (:func:`app.experiments.metric.missed_points`, the
paper's metric) on each group's raw values against the released estimate, averaged over
groups and quantiles per trial; the table gives the mean over trials ± its standard error,
and the ratios of dpquant's mean to each peer's (target: ≤ 0.5). Seconds: median wall time of
one grouped release (dpquant: ``run_groups`` on ready histograms, as in the service; peers:
including loading the rows into their own structures).

**Setup of the peers** (once; never dpquant dependencies)::

    python3 -m venv /work/peers-venv
    /work/peers-venv/bin/pip install pipeline-dp tmlt.analytics
    java -version    # Tumult's pyspark needs Java 17

**Run** (from the repository root, with the project's venv)::

    .venv/bin/python -m benchmarks.peers_grouped --trials 10 [--seed 2026]
        [--peers-python /work/peers-venv/bin/python] [--out docs/results/peers_grouped.md]
    .venv/bin/python -m benchmarks.peers_grouped --quick    # smoke test, writes no file
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.experiments.metric import missed_points
from app.mechanisms import MECHANISMS, GridHistogram
from app.mechanisms.grouped import run_groups

FloatArray = NDArray[np.float64]
Groups = dict[str, FloatArray]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
HELPER = HERE / "peers_grouped_peer.py"
DEFAULT_OUT = ROOT / "docs" / "results" / "peers_grouped.md"
DEFAULT_PEERS_PYTHON = "/work/peers-venv/bin/python"

N_GROUPS = 20
SIZE_RANGE = (500, 1500)
OURS = ("jointexp", "jointexp_smooth", "aq")
PEERS = ("pipelinedp", "tumult")
TOOLS = (*OURS, *PEERS)
LABEL = {
    "jointexp": "dpquant jointexp",
    "jointexp_smooth": "dpquant jointexp_smooth",
    "aq": "dpquant aq",
    "pipelinedp": "PipelineDP",
    "tumult": "Tumult",
}
TARGET = 0.5


def _gaussian(rng: np.random.Generator, g: float, n: int) -> FloatArray:
    return np.clip(rng.normal(30.0 + 40.0 * g, 10.0, n), 0.0, 100.0)


def _integer(rng: np.random.Generator, g: float, n: int) -> FloatArray:
    return np.clip(np.rint(rng.normal(20.0 + 60.0 * g, 8.0, n)), 0.0, 100.0)


def _lognormal(rng: np.random.Generator, g: float, n: int) -> FloatArray:
    return np.clip(np.exp(rng.normal(2.6 + 0.8 * g, 1.0, n)), 0.0, 500.0)


@dataclass(frozen=True)
class Shape:
    """A data shape: public bounds, dpquant's grid step and one group's sampler (``g`` in
    [0, 1] is the group's position, which sets its location)."""

    lower: float
    upper: float
    granularity: float
    draw: Callable[[np.random.Generator, float, int], FloatArray]


SHAPES: dict[str, Shape] = {
    "gaussian": Shape(0.0, 100.0, 100.0 / 1e5, _gaussian),
    "integer": Shape(0.0, 100.0, 1.0, _integer),
    "lognormal": Shape(0.0, 500.0, 500.0 / 1e5, _lognormal),
}


@dataclass
class Cell:
    """One (shape, m, ε) cell: per-trial errors and release times of every tool."""

    shape: str
    m: int
    epsilon: float
    errors: dict[str, list[float]] = field(default_factory=lambda: {t: [] for t in TOOLS})
    seconds: dict[str, list[float]] = field(default_factory=lambda: {t: [] for t in TOOLS})

    def mean(self, tool: str) -> float:
        return statistics.fmean(self.errors[tool])

    def stderr(self, tool: str) -> float:
        v = self.errors[tool]
        return statistics.stdev(v) / len(v) ** 0.5 if len(v) > 1 else float("nan")

    def ratio(self, ours: str, peer: str) -> float:
        return self.mean(ours) / self.mean(peer)


def levels(m: int) -> list[float]:
    """``q_j = j / (m + 1)``, j = 1..m."""
    return [j / (m + 1) for j in range(1, m + 1)]


def make_groups(shape: str, seed: int, trial: int) -> Groups:
    """The trial's data: the same for every tool, every m and every ε of the shape."""
    rng = np.random.default_rng([seed, list(SHAPES).index(shape), trial])
    sizes = rng.integers(SIZE_RANGE[0], SIZE_RANGE[1] + 1, N_GROUPS)
    draw = SHAPES[shape].draw
    return {
        f"g{g:02d}": np.sort(draw(rng, g / (N_GROUPS - 1), int(n))) for g, n in enumerate(sizes)
    }


def mean_missed(groups: Groups, qs: list[float], estimates: list[list[float]]) -> float:
    """Missed points per quantile, averaged over the groups (estimates in group order)."""
    per_group = [
        float(missed_points(x, qs, np.sort(np.asarray(est, dtype=np.float64))).mean())
        for x, est in zip(groups.values(), estimates, strict=True)
    ]
    return statistics.fmean(per_group)


def dpquant_release(
    method: str,
    hists: list[GridHistogram],
    shape: Shape,
    qs: list[float],
    epsilon: float,
    rng: np.random.Generator,
) -> tuple[list[list[float]], float]:
    """One grouped release with dpquant: estimates per group and the seconds it took."""
    t0 = time.perf_counter()
    idx = run_groups(
        MECHANISMS[method],
        hists,
        qs,
        grid_points=hists[0].grid_points,
        epsilon=epsilon,
        delta=None,
        neighbors="add_remove",
        rows_per_unit=1,
        rng=rng,
    )
    seconds = time.perf_counter() - t0
    return [[shape.lower + int(i) * shape.granularity for i in cells] for cells in idx], seconds


def warm_up() -> None:
    """Compile dpquant's kernels (numba) before anything is timed."""
    shape = SHAPES["gaussian"]
    rng = np.random.default_rng(0)
    groups = make_groups("gaussian", 0, 0)
    hists = [
        GridHistogram.from_values(x, shape.lower, shape.upper, shape.granularity)
        for x in list(groups.values())[:2]
    ]
    for method in OURS:
        dpquant_release(method, hists, shape, levels(5), 1.0, rng)


def run_peers(
    python: str, datasets: list[Groups], shape: Shape, qs: list[float], epsilon: float
) -> dict[str, Any]:
    """Run the peer helper on one cell's trials, in a temporary directory of its own (Spark
    writes a warehouse where it runs)."""
    with tempfile.TemporaryDirectory(prefix="peers_grouped_") as tmp:
        job_dir = Path(tmp)
        job = {
            "keys": list(datasets[0]),
            "quantiles": qs,
            "epsilon": epsilon,
            "lower": shape.lower,
            "upper": shape.upper,
            "trials": len(datasets),
        }
        (job_dir / "job.json").write_text(json.dumps(job))
        for t, groups in enumerate(datasets):
            np.save(job_dir / f"values_{t}.npy", np.concatenate(list(groups.values())))
            np.save(job_dir / f"sizes_{t}.npy", np.array([x.size for x in groups.values()]))
        log = job_dir / "peer.log"
        env = os.environ | {"PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python}
        with log.open("w") as err:
            done = subprocess.run(
                [python, str(HELPER), str(job_dir)],
                cwd=job_dir,
                env=env,
                stdout=err,
                stderr=err,
                check=False,
            )
        if done.returncode != 0:
            tail = "\n".join(log.read_text().splitlines()[-40:])
            raise RuntimeError(f"peer helper failed ({done.returncode}):\n{tail}")
        out: dict[str, Any] = json.loads((job_dir / "out.json").read_text())
        return out


def run_cell(
    shape_name: str, m: int, epsilon: float, trials: int, seed: int, peers_python: str
) -> tuple[Cell, dict[str, Any]]:
    shape = SHAPES[shape_name]
    qs = levels(m)
    cell = Cell(shape_name, m, epsilon)
    rng = np.random.default_rng([seed, 1000 + list(SHAPES).index(shape_name), m, int(10 * epsilon)])
    datasets = [make_groups(shape_name, seed, t) for t in range(trials)]
    for groups in datasets:
        hists = [
            GridHistogram.from_values(x, shape.lower, shape.upper, shape.granularity)
            for x in groups.values()
        ]
        for method in OURS:
            est, seconds = dpquant_release(method, hists, shape, qs, epsilon, rng)
            cell.errors[method].append(mean_missed(groups, qs, est))
            cell.seconds[method].append(seconds)
    peers = run_peers(peers_python, datasets, shape, qs, epsilon)
    for peer in PEERS:
        for groups, est in zip(datasets, peers["estimates"][peer], strict=True):
            cell.errors[peer].append(mean_missed(groups, qs, est))
        cell.seconds[peer] = list(peers["seconds"][peer])
    return cell, peers


def fmt_ratio(r: float) -> str:
    return f"{r:.2f}" + (" ✓" if r <= TARGET else " ✗")


def tables(cells: list[Cell]) -> list[str]:
    """The three Markdown tables: accuracy, ratios, seconds."""
    acc = [
        "| shape | m | ε | " + " | ".join(LABEL[t] for t in TOOLS) + " |",
        "|---|---|---|" + "---|" * len(TOOLS),
    ]
    ratios = [
        "| shape | m | ε | " + " | ".join(f"{o} ÷ {LABEL[p]}" for o in OURS for p in PEERS) + " |",
        "|---|---|---|" + "---|" * (len(OURS) * len(PEERS)),
    ]
    secs = [
        "| shape | m | ε | " + " | ".join(LABEL[t] for t in TOOLS) + " |",
        "|---|---|---|" + "---|" * len(TOOLS),
    ]
    for c in cells:
        head = f"| {c.shape} | {c.m} | {c.epsilon:g} | "
        acc.append(head + " | ".join(f"{c.mean(t):.2f} ± {c.stderr(t):.2f}" for t in TOOLS) + " |")
        ratios.append(
            head + " | ".join(fmt_ratio(c.ratio(o, p)) for o in OURS for p in PEERS) + " |"
        )
        secs.append(
            head + " | ".join(f"{statistics.median(c.seconds[t]):.3g}" for t in TOOLS) + " |"
        )
    return [
        "### Mean missed points per quantile (± standard error over trials)",
        "",
        *acc,
        "",
        f"### Ratio of dpquant's mean to the peer's (✓: ≤ {TARGET}, the target)",
        "",
        *ratios,
        "",
        "### Seconds per grouped release (median over trials)",
        "",
        *secs,
    ]


def report(
    cells: list[Cell], args: argparse.Namespace, command: str, elapsed: float, peers: dict[str, Any]
) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in peers["versions"].items())
    budget = peers["budget"]
    pdp = "; ".join(
        f"{s['name']} ε={s['eps']:g} δ={s['delta']:g} ({s['noise']})"
        for s in budget["pipelinedp"]["mechanisms"]
    )
    tu = budget["tumult"]
    met = sum(c.ratio(o, p) <= TARGET for c in cells for o in ("jointexp",) for p in PEERS)
    lines = [
        "# Grouped quantiles: dpquant vs PipelineDP vs Tumult Analytics",
        "",
        f"- Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC in {elapsed / 60:.1f} min on a "
        "shared 2-core machine, one process at a time.",
        f"- Command: `{command}`",
        f"- Trials: {args.trials} per cell (every tool on the same data in each trial); "
        f"{N_GROUPS} groups of {SIZE_RANGE[0]}-{SIZE_RANGE[1]} rows; the data of a trial is the "
        "same across the m and ε of its shape.",
        f"- Peers (own virtual environment `{args.peers_python}`): {versions}.",
        f"- Budget as the peers report it (last release of the last cell): PipelineDP {pdp}; "
        f"Tumult {tu['queries']} queries at ε={tu['per_query_epsilon']:g} each, remaining "
        f"{tu['remaining']}.",
        "- Neighbours: add/remove one row for every tool; public keys; pure ε-DP for every tool.",
        "- dpquant grid: step (upper - lower) / 10⁵ for gaussian ([0, 100]) and lognormal "
        "([0, 500]), step 1 for integer ([0, 100]).",
        f"- jointexp within {TARGET}× of a peer in {met} of {len(cells) * len(PEERS)} "
        "(cell, peer) pairs.",
        "",
        "See the docstring of `benchmarks/peers_grouped.py` for what is compared and how.",
        "",
        *tables(cells),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trials", type=int, default=10, help="trials per cell (default 10)")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--out", type=Path, default=None, help=f"Markdown ({DEFAULT_OUT})")
    parser.add_argument("--peers-python", default=DEFAULT_PEERS_PYTHON)
    parser.add_argument("--quick", action="store_true", help="2 trials, 2 cells, no file")
    args = parser.parse_args(argv)
    command = shlex.join(["python", "-m", "benchmarks.peers_grouped", *sys.argv[1:]])
    grid = [(s, m, e) for s in SHAPES for m in (5, 19) for e in (0.5, 2.0)]
    if args.quick:
        grid = [("gaussian", 5, 2.0), ("integer", 5, 0.5)]
        args.trials = 2
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    warm_up()
    out = args.out if args.out is not None else (None if args.quick else DEFAULT_OUT)
    started = time.perf_counter()
    cells: list[Cell] = []
    peers: dict[str, Any] = {}
    for shape, m, eps in grid:
        t0 = time.perf_counter()
        cell, peers = run_cell(shape, m, eps, args.trials, args.seed, args.peers_python)
        cells.append(cell)
        summary = "  ".join(f"{t} {cell.mean(t):.2f}" for t in TOOLS)
        print(f"[{time.perf_counter() - t0:6.0f} s] {shape} m={m} ε={eps:g}: {summary}", flush=True)
        if out is not None and len(cells) < len(grid):  # keep what is done if stopped early
            partial = report(cells, args, command, time.perf_counter() - started, peers)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(f"**Partial: {len(cells)} of {len(grid)} cells.**\n\n{partial}")
    text = report(cells, args, command, time.perf_counter() - started, peers)
    print()
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

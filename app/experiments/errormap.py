"""The error map: mean missed points per quantile over (shape, n, m, ε, method).

``dpquant experiments map`` runs every registered method (pure and approximate; methods
registered later are picked up from :data:`app.mechanisms.MECHANISMS` automatically) on the
same sample per trial (a paired comparison) over a grid of

* n ∈ {10³, 10⁴, 10⁵, 10⁶}, m ∈ {1, 3, 9, 19, 49, 99} evenly spaced quantiles, ε ∈ {0.1, 1, 10};
* shapes (:data:`SHAPES`): Gaussian, log-normal, bimodal, integer-valued (heavy ties) and
  partly clamped (≈16 % of the points at the upper bound);

with δ = 10⁻⁶ for the methods that take one, swap neighbours and public bounds [−100, 100].
It writes ``map.csv`` (one row per cell and method: mean and standard error of the per-trial
mean missed points per quantile, the 90th percentile over trials, mean seconds, failures),
``best.csv`` (per cell: the best method, the runner-up and the margin), ``trials.csv`` (the
per-trial means behind ``map.csv``), ``run.json`` and the
plots ``best_method.png`` / ``margin.png``.

``--path grid`` runs every call as a release does (:data:`GRID_STEPS`): on the grid histogram
of the data snapped to the shape's public grid, where a tied value is itself a possible
output; the default ``--path raw`` calls the mechanisms on the raw values.

A call that would take too long is not made: once a method's measured time at some n
projects past ``--max-seconds`` for the next n of the same (shape, m, ε), the larger sizes
are recorded as ``skipped`` for that method.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from decimal import Decimal
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from app.experiments.metric import missed_points
from app.experiments.runner import (
    evenly_spaced_quantiles,
    single_threaded_env,
    stream,
    warm_up,
)

if TYPE_CHECKING:  # the registry is imported lazily, as run_cell does
    from app.mechanisms.histogram import GridHistogram

FloatArray = np.ndarray
LOWER, UPPER = -100.0, 100.0


def _gaussian(rng: np.random.Generator, n: int) -> FloatArray:
    return rng.normal(0.0, 5.0, size=n)


def _lognormal(rng: np.random.Generator, n: int) -> FloatArray:
    return np.asarray(5.0 * rng.lognormal(0.0, 1.0, size=n))


def _bimodal(rng: np.random.Generator, n: int) -> FloatArray:
    side = rng.integers(0, 2, size=n)
    return np.where(side == 0, rng.normal(-20.0, 3.0, size=n), rng.normal(20.0, 3.0, size=n))


def _integer(rng: np.random.Generator, n: int) -> FloatArray:
    # about 40 distinct values: every quantile sits on a long run of ties
    return np.round(rng.normal(0.0, 5.0, size=n))


def _clamped(rng: np.random.Generator, n: int) -> FloatArray:
    # N(80, 20^2): about 16 % of the points lie above the public upper bound and are clamped
    return rng.normal(80.0, 20.0, size=n)


#: name -> (label, sampler of n unsorted points; clamping to the bounds happens afterwards)
SHAPES: dict[str, tuple[str, Callable[[np.random.Generator, int], FloatArray]]] = {
    "gaussian": ("Gaussian N(0, 5²)", _gaussian),
    "lognormal": ("log-normal 5·e^N(0,1)", _lognormal),
    "bimodal": ("bimodal N(±20, 3²)", _bimodal),
    "integer": ("integer-valued round(N(0, 5²))", _integer),
    "clamped": ("partly clamped N(80, 20²) at 100", _clamped),
}

#: ``--path grid`` runs each shape on the public grid a release of it would use, through the
#: service's path (``run_grid`` on the grid histogram of the snapped data): step 1 for the
#: integer-valued shape (a column declared integer), else the service's default step for the
#: bounds [-100, 100] (the largest power of ten <= their range / 10^6). On a grid a value
#: held by many records is itself a possible output; on the raw path (``--path raw``, the
#: default) an estimate inside an atom's gap misses the whole atom.
GRID_STEPS = {"integer": 1.0}
DEFAULT_GRID_STEP = 1e-4
PATHS = ("raw", "grid")


def grid_step(shape: str) -> float:
    """The public grid step a release of ``shape`` runs on (see :data:`GRID_STEPS`)."""
    return GRID_STEPS.get(shape, DEFAULT_GRID_STEP)


FULL_NS = (1_000, 10_000, 100_000, 1_000_000)
FULL_MS = (1, 3, 9, 19, 49, 99)
FULL_EPSILONS = (0.1, 1.0, 10.0)

MAP_FIELDS = (
    "shape",
    "n",
    "m",
    "epsilon",
    "delta",
    "method",
    "trials",
    "missed_mean",
    "missed_se",
    "missed_q90",
    "seconds_mean",
    "status",
)
BEST_FIELDS = (
    "shape",
    "n",
    "m",
    "epsilon",
    "best",
    "best_missed",
    "runner_up",
    "runner_missed",
    "margin",
)


@dataclass(frozen=True)
class MapConfig:
    """One error-map run."""

    methods: tuple[str, ...]
    shapes: tuple[str, ...] = tuple(SHAPES)
    ns: tuple[int, ...] = FULL_NS
    ms: tuple[int, ...] = FULL_MS
    epsilons: tuple[float, ...] = FULL_EPSILONS
    trials: int = 10
    delta: float = 1e-6
    seed: int = 0
    max_seconds: float = 30.0
    workers: int = 1
    path: str = "raw"


@dataclass(frozen=True)
class MapTask:
    """One (shape, m, ε) across the sizes n, ascending (so slow methods stop early)."""

    shape: str
    m: int
    epsilon: float


def sample_shape(shape: str, rng: np.random.Generator, n: int) -> FloatArray:
    """``n`` sorted points of ``shape`` clamped to the public bounds."""
    return np.sort(np.clip(SHAPES[shape][1](rng, n), LOWER, UPPER))


@dataclass(frozen=True)
class Gridded:
    """Sorted data as a release of it sees them: snapped to a public grid of ``step`` within
    the bounds, as the grid histogram the mechanisms run on and as the snapped values' grid
    indices (missed points are counted in index space: the grid's map to values is
    increasing, so the counts are the same)."""

    hist: GridHistogram
    snapped: FloatArray


def on_grid(data: FloatArray, step: float) -> Gridded:
    """``data`` (sorted, within the bounds) on the grid of ``step`` (:class:`Gridded`):
    each value to its nearest grid point ``LOWER + k step``, as the service snaps uploads
    (app.codec, which this pure package does not import: half-way values round up, the
    last index is taken in decimal)."""
    from app.mechanisms.histogram import GridHistogram

    # the last grid index, in decimal as the service takes it (repr: the shortest decimals)
    last = int((Decimal(repr(UPPER)) - Decimal(repr(LOWER))) / Decimal(repr(step)))
    index = np.clip(np.floor((np.asarray(data) - LOWER) / step + 0.5), 0, last).astype(np.int64)
    cells, counts = np.unique(index, return_counts=True)
    hist = GridHistogram(cells, counts, last + 1)
    return Gridded(hist, np.repeat(cells, counts).astype(np.float64))


def run_cell(
    method: str,
    data: FloatArray,
    qs: FloatArray,
    *,
    epsilon: float,
    delta: float,
    rng: np.random.Generator,
    grid: Gridded | None = None,
) -> tuple[float, float]:
    """(mean missed points per quantile, seconds) of one call of ``method`` on sorted data:
    on the raw values, or, given ``grid`` (:func:`on_grid` of ``data``), as a release runs:
    on the grid histogram, missed points counted on the snapped data (the data a release
    sees; seconds: the mechanism's call only)."""
    from app.mechanisms import MECHANISMS

    mech = MECHANISMS[method]
    if grid is not None:
        start = time.perf_counter()
        picked = mech.run_grid(
            grid.hist, qs, epsilon=epsilon, delta=delta if mech.uses_delta else None,
            neighbors="swap", rng=rng,
        )  # fmt: skip
        seconds = time.perf_counter() - start
        est = np.asarray(picked, dtype=np.float64)
        return float(missed_points(grid.snapped, qs, est).mean()), seconds
    start = time.perf_counter()
    est = mech.run(
        data,
        qs,
        epsilon=epsilon,
        delta=delta if mech.uses_delta else None,
        lower=LOWER,
        upper=UPPER,
        neighbors="swap",
        rng=rng,
    )
    seconds = time.perf_counter() - start
    return float(missed_points(data, qs, np.asarray(est, dtype=np.float64)).mean()), seconds


def run_map_task(task: MapTask, cfg: MapConfig) -> list[dict[str, Any]]:
    """Every n of one (shape, m, ε): one summary row per (n, method)."""
    from app.mechanisms import MECHANISMS

    qs = evenly_spaced_quantiles(task.m)
    step = grid_step(task.shape) if cfg.path == "grid" else None
    rows: list[dict[str, Any]] = []
    last_time: dict[str, tuple[int, float]] = {}
    skipped: dict[str, str] = {}
    # One untimed call per method at this (m, ε): data-independent precomputation cached per
    # (ε, m) (CSmooth's tuning of t, AppIndExp's composition solve) and JIT compilation are
    # not what a size projection should extrapolate.
    warm = sample_shape(task.shape, stream(cfg.seed, "map-warm", task.shape, task.m), 200)
    warm_grid = None if step is None else on_grid(warm, step)
    for method in cfg.methods:
        with contextlib.suppress(Exception):
            run_cell(
                method, warm, qs, epsilon=task.epsilon, delta=cfg.delta, rng=stream(0, "w"),
                grid=warm_grid,
            )  # fmt: skip
    for n in sorted(cfg.ns):
        per: dict[str, list[float]] = {m: [] for m in cfg.methods}
        secs: dict[str, list[float]] = {m: [] for m in cfg.methods}
        status: dict[str, str] = {m: "ok" for m in cfg.methods}
        for method in cfg.methods:
            if method in skipped:
                status[method] = skipped[method]
            elif method in last_time:
                n0, t0 = last_time[method]
                projected = t0 * n / n0
                if projected > cfg.max_seconds:
                    skipped[method] = f"skipped: projected {projected:.3g} s per call"
                    status[method] = skipped[method]
        for trial in range(cfg.trials):
            data = sample_shape(
                task.shape, stream(cfg.seed, "map", task.shape, n, task.m, task.epsilon, trial), n
            )
            gridded = None if step is None else on_grid(data, step)
            for method in cfg.methods:
                if status[method] != "ok":
                    continue
                rng = stream(cfg.seed, "map", task.shape, n, task.m, task.epsilon, trial, method)
                try:
                    missed, seconds = run_cell(
                        method, data, qs, epsilon=task.epsilon, delta=cfg.delta, rng=rng,
                        grid=gridded,
                    )  # fmt: skip
                except Exception as exc:  # recorded, never silently dropped
                    status[method] = f"error: {type(exc).__name__}: {exc}"[:200]
                    continue
                per[method].append(missed)
                secs[method].append(seconds)
        for method in cfg.methods:
            vals = np.asarray(per[method])
            if secs[method]:
                last_time[method] = (n, float(np.mean(secs[method])))
            rows.append(
                {
                    "shape": task.shape,
                    "n": n,
                    "m": task.m,
                    "epsilon": task.epsilon,
                    "delta": cfg.delta if MECHANISMS[method].uses_delta else "",
                    "method": method,
                    "trials": vals.size,
                    "missed_mean": float(vals.mean()) if vals.size else math.nan,
                    "missed_se": float(vals.std(ddof=1) / math.sqrt(vals.size))
                    if vals.size > 1
                    else math.nan,
                    "missed_q90": float(np.quantile(vals, 0.9)) if vals.size else math.nan,
                    "seconds_mean": float(np.mean(secs[method])) if secs[method] else math.nan,
                    "status": status[method],
                    "values": [float(v) for v in vals],
                }
            )
    return rows


def _init(methods: tuple[str, ...]) -> None:
    try:
        import numba

        numba.set_num_threads(1)
    except Exception:
        pass
    warm_up(methods)


def run_map(
    cfg: MapConfig, *, progress: Callable[[int], None] | None = None
) -> list[dict[str, Any]]:
    """All tasks of ``cfg`` (in ``cfg.workers`` processes); rows in a canonical order."""
    tasks = [
        MapTask(s, m, e)
        for m in sorted(cfg.ms, reverse=True)
        for s in cfg.shapes
        for e in cfg.epsilons
    ]
    rows: list[dict[str, Any]] = []
    if cfg.workers == 1:
        warm_up(cfg.methods)
        for t in tasks:
            rows += run_map_task(t, cfg)
            if progress:
                progress(1)
    else:
        with (
            single_threaded_env(),
            ProcessPoolExecutor(
                max_workers=cfg.workers,
                mp_context=get_context("spawn"),
                initializer=_init,
                initargs=(cfg.methods,),
            ) as pool,
        ):
            futures = [pool.submit(run_map_task, t, cfg) for t in tasks]
            for fut in as_completed(futures):
                rows += fut.result()
                if progress:
                    progress(1)
    order = {name: i for i, name in enumerate(cfg.methods)}
    sorder = {name: i for i, name in enumerate(cfg.shapes)}
    rows.sort(key=lambda r: (sorder[r["shape"]], r["n"], r["m"], r["epsilon"], order[r["method"]]))
    return rows


def best_per_cell(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (shape, n, m, ε): the method with the lowest mean, the runner-up, and the margin
    (runner-up / best, ≥ 1; ``inf`` when the best missed no point and the runner-up did)."""
    cells: dict[tuple[Any, ...], list[tuple[float, str]]] = {}
    for r in rows:
        if r["status"] == "ok" and math.isfinite(r["missed_mean"]):
            key = (r["shape"], r["n"], r["m"], r["epsilon"])
            cells.setdefault(key, []).append((r["missed_mean"], r["method"]))
    out: list[dict[str, Any]] = []
    for key, vals in cells.items():
        vals.sort()
        best, runner = vals[0], (vals[1] if len(vals) > 1 else (math.nan, ""))
        margin = runner[0] / best[0] if best[0] > 0 else 1.0 if runner[0] == 0 else math.inf
        out.append(
            dict(
                zip(
                    BEST_FIELDS,
                    (*key, best[1], best[0], runner[1], runner[0], margin),
                    strict=True,
                )
            )
        )
    return out


def write_csv(path: Path, fields: Sequence[str], rows: Sequence[dict[str, Any]]) -> None:
    """Rows to CSV (floats with 6 significant digits)."""
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(fields))
        w.writeheader()
        for r in rows:
            w.writerow(
                {
                    k: (f"{v:.6g}" if isinstance(v, float) else v)
                    for k, v in r.items()
                    if k in fields
                }
            )


def plot_best(best: Sequence[dict[str, Any]], out: Path, methods: Sequence[str]) -> None:
    """``best_method.png`` (colour = best method, text = margin over the runner-up) and
    ``margin.png`` (the margin alone, log colour scale): one panel per (shape, ε), n × m."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap, LogNorm

    shapes = sorted({b["shape"] for b in best}, key=list(SHAPES).index)
    epsilons = sorted({b["epsilon"] for b in best})
    ns = sorted({b["n"] for b in best})
    ms = sorted({b["m"] for b in best})
    index = {m: i for i, m in enumerate(methods)}
    palette = [plt.get_cmap("tab10")(i % 10) for i in range(max(1, len(methods)))]
    cmap = ListedColormap(palette)
    lookup = {(b["shape"], b["epsilon"], b["n"], b["m"]): b for b in best}
    for kind in ("best_method", "margin"):
        fig, axes = plt.subplots(
            len(shapes),
            len(epsilons),
            figsize=(3.2 * len(epsilons) + 1.5, 2.4 * len(shapes) + 0.8),
            squeeze=False,
        )
        for i, s in enumerate(shapes):
            for j, e in enumerate(epsilons):
                ax = axes[i][j]
                grid = np.full((len(ms), len(ns)), np.nan)
                for a, m in enumerate(ms):
                    for b_, n in enumerate(ns):
                        cell = lookup.get((s, e, n, m))
                        if cell is None:
                            continue
                        if kind == "best_method":
                            grid[a, b_] = index[cell["best"]]
                            txt = cell["best"][:6]
                            mg = cell["margin"]
                            txt += "\n" + ("∞" if not math.isfinite(mg) else f"{mg:.2g}×")
                        else:
                            mg = cell["margin"]
                            grid[a, b_] = min(mg, 100.0) if math.isfinite(mg) else 100.0
                            txt = cell["best"][:6]
                        ax.text(b_, a, txt, ha="center", va="center", fontsize=6)
                if kind == "best_method":
                    ax.imshow(
                        grid,
                        cmap=cmap,
                        vmin=-0.5,
                        vmax=len(methods) - 0.5,
                        aspect="auto",
                        alpha=0.6,
                    )
                else:
                    ax.imshow(grid, cmap="viridis", norm=LogNorm(1.0, 100.0), aspect="auto")
                ax.set_xticks(range(len(ns)), [f"{n:.0e}" for n in ns], fontsize=7)
                ax.set_yticks(range(len(ms)), [str(m) for m in ms], fontsize=7)
                ax.set_title(f"{s}, ε={e:g}", fontsize=8)
                if j == 0:
                    ax.set_ylabel("m")
                if i == len(shapes) - 1:
                    ax.set_xlabel("n")
        title = (
            "best method per cell (text: name, margin over the runner-up)"
            if kind == "best_method"
            else "margin of the best method over the runner-up (runner-up / best)"
        )
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        fig.savefig(out / f"{kind}.png", dpi=110)
        plt.close(fig)


def _int_list(text: str) -> tuple[int, ...]:
    return tuple(int(float(t)) for t in text.split(",") if t.strip())


def _float_list(text: str) -> tuple[float, ...]:
    return tuple(float(t) for t in text.split(",") if t.strip())


def _str_list(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def build_parser() -> argparse.ArgumentParser:
    """Options of ``dpquant experiments map``."""
    p = argparse.ArgumentParser(
        prog="dpquant experiments map",
        description="Error map: mean missed points per quantile of every registered method "
        "over shapes x n x m x epsilon (defaults: the full grid).",
    )
    p.add_argument("--out", type=Path, default=Path("error-map"), help="output directory")
    p.add_argument("--shapes", type=_str_list, default=tuple(SHAPES), help=",".join(SHAPES))
    p.add_argument("--ns", type=_int_list, default=FULL_NS, help="default 1e3,1e4,1e5,1e6")
    p.add_argument("--ms", type=_int_list, default=FULL_MS, help="default 1,3,9,19,49,99")
    p.add_argument("--epsilons", type=_float_list, default=FULL_EPSILONS, help="default 0.1,1,10")
    p.add_argument("--methods", type=_str_list, default=None, help="default: every registered")
    p.add_argument("--trials", type=int, default=10, help="trials per cell (default 10)")
    p.add_argument("--delta", type=float, default=1e-6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-seconds", type=float, default=30.0, help="skip slower calls")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--no-plots", action="store_true")
    p.add_argument(
        "--path", choices=PATHS, default="raw",
        help="raw: the mechanisms on the raw values (default); grid: as a release runs, on "
        "the grid histogram of each shape's public grid (step 1 for the integer shape)",
    )  # fmt: skip
    return p


def main(argv: Sequence[str]) -> int:
    """Entry point of ``dpquant experiments map``; 1 when a call failed (rows still written)."""
    from app.mechanisms import MECHANISMS

    args = build_parser().parse_args(list(argv))
    methods = tuple(args.methods) if args.methods else tuple(MECHANISMS)
    bad = [m for m in methods if m not in MECHANISMS] + [s for s in args.shapes if s not in SHAPES]
    if bad:
        raise SystemExit(f"unknown method(s) or shape(s): {', '.join(bad)}")
    cfg = MapConfig(
        methods=methods,
        shapes=tuple(args.shapes),
        ns=tuple(args.ns),
        ms=tuple(args.ms),
        epsilons=tuple(args.epsilons),
        trials=args.trials,
        delta=args.delta,
        seed=args.seed,
        max_seconds=args.max_seconds,
        workers=max(1, args.workers),
        path=args.path,
    )
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    total = len(cfg.shapes) * len(cfg.ms) * len(cfg.epsilons)
    done = [0]

    def progress(k: int) -> None:
        done[0] += k
        print(f"\r{done[0]}/{total} (shape, m, ε) tasks", end="", file=sys.stderr, flush=True)

    start = time.perf_counter()
    load = os.getloadavg()[0]
    rows = run_map(cfg, progress=progress)
    wall = time.perf_counter() - start
    print(file=sys.stderr)
    best = best_per_cell(rows)
    write_csv(out / "map.csv", MAP_FIELDS, rows)
    write_csv(out / "best.csv", BEST_FIELDS, best)
    write_csv(
        out / "trials.csv",
        ("shape", "n", "m", "epsilon", "method", "trial", "missed_mean"),
        [
            {
                **{k: r[k] for k in ("shape", "n", "m", "epsilon", "method")},
                "trial": i,
                "missed_mean": v,
            }
            for r in rows
            for i, v in enumerate(r["values"])
        ],
    )
    if not args.no_plots and best:
        plot_best(best, out, methods)
    failed = [r for r in rows if r["status"].startswith("error")]
    meta = {
        "config": asdict(cfg),
        "wall_seconds": round(wall, 1),
        "load_average_1min": {"before": load, "after": os.getloadavg()[0]},
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "failed_cells": len(failed),
        "argv": list(argv),
    }
    (out / "run.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}/map.csv ({len(rows)} rows) in {wall:.1f} s")
    return 1 if failed else 0

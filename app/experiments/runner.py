"""Running the experiments: task list, seeding, worker processes, raw result rows.

Two experiments share one process pool and one progress bar:

* **Accuracy** (paper Figures 3 and 6, timing of Figure 4): for every dataset, ε and m, and
  every trial, draw one sample of ``n`` points and run *every* selected method on that same
  sample (paired comparison, as the paper's code does), recording the missed points and the
  wall time of the mechanism call. One task = one (dataset, ε, m) with all its trials.
* **Scaling** (not in the paper): time vs n for fixed m on Gaussian data. One task = one
  (method, m) chain over increasing n; the chain stops early when the projected time of the
  next size exceeds ``scaling_max_seconds`` per call (those sizes are reported as skipped).

Reproducibility: every random stream is a child of ``np.random.SeedSequence(seed)`` whose
spawn key is derived from stable names (experiment, dataset, ε, m, trial, method), exactly as
``SeedSequence.spawn`` builds children but independent of task order, worker count and the
``--methods`` filter. numpy's global random state is never used. Timings are not
reproducible, by nature.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing import get_context
from typing import Any

import numpy as np

from app.experiments.datasets import DATASETS
from app.experiments.metric import missed_points

THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMBA_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)

ACCURACY_FIELDS = (
    "dataset",
    "method",
    "epsilon",
    "delta",
    "m",
    "trial",
    "n",
    "missed_mean",
    "missed_sum",
    "missed_max",
    "seconds",
    "error",
)
SCALING_FIELDS = (
    "method",
    "m",
    "n",
    "trial",
    "epsilon",
    "delta",
    "seconds",
    "missed_mean",
    "status",
)

Row = dict[str, Any]


@dataclass(frozen=True)
class ExperimentConfig:
    """Everything that determines a run (besides the mechanisms' code and the clock)."""

    methods: tuple[str, ...]
    datasets: tuple[str, ...] = ("gaussian", "uniform", "ratings", "pages")
    epsilons: tuple[float, ...] = (1.0, 0.1)
    ms: tuple[int, ...] = tuple(range(1, 30))
    n: int = 1000
    trials: int = 20
    delta: float = 1e-6
    lower: float = -100.0
    upper: float = 100.0
    neighbors: str = "swap"
    seed: int = 0
    scaling_ns: tuple[int, ...] = (1_000, 3_000, 10_000, 30_000, 100_000, 300_000, 1_000_000)
    scaling_ms: tuple[int, ...] = (9, 29)
    scaling_trials: int = 5
    scaling_epsilon: float = 1.0
    scaling_dataset: str = "gaussian"
    scaling_max_seconds: float = 20.0
    workers: int = 1

    def __post_init__(self) -> None:
        if not self.methods:
            raise ValueError("no methods selected")
        unknown = [d for d in self.datasets if d not in DATASETS]
        if unknown or self.scaling_dataset not in DATASETS:
            raise ValueError(f"unknown dataset(s): {unknown or [self.scaling_dataset]}")
        if self.trials < 1 or self.scaling_trials < 1 or self.n < 1 or self.workers < 1:
            raise ValueError("trials, scaling_trials, n and workers must be >= 1")
        if any(m < 1 for m in (*self.ms, *self.scaling_ms)):
            raise ValueError("every m must be >= 1")
        if any(e <= 0 for e in (*self.epsilons, self.scaling_epsilon)):
            raise ValueError("every epsilon must be > 0")


def evenly_spaced_quantiles(m: int) -> np.ndarray:
    """The paper's levels ``q_j = j / (m + 1)``, j = 1..m."""
    return np.arange(1, m + 1, dtype=np.float64) / (m + 1)


# --------------------------------------------------------------------------- seeding


def _key(part: str | int | float) -> int:
    if isinstance(part, str):
        return zlib.crc32(part.encode("utf-8"))
    if isinstance(part, float):
        return zlib.crc32(repr(part).encode("ascii"))
    return int(part)


def stream(seed: int, *parts: str | int | float) -> np.random.Generator:
    """Independent generator for the named stream ``parts`` of run ``seed``.

    Equivalent to descending ``SeedSequence(seed).spawn(...)`` along the child indices
    ``parts`` (strings and floats mapped to stable 32-bit keys).
    """
    root = np.random.SeedSequence(seed)
    child = np.random.SeedSequence(
        root.entropy, spawn_key=(*root.spawn_key, *(_key(p) for p in parts))
    )
    return np.random.Generator(np.random.PCG64(child))


# --------------------------------------------------------------------------- tasks


@dataclass(frozen=True)
class AccuracyTask:
    """All trials of one (dataset, ε, m) for every selected method."""

    dataset: str
    epsilon: float
    m: int

    def calls(self, cfg: ExperimentConfig) -> int:
        return cfg.trials * len(cfg.methods)


@dataclass(frozen=True)
class ScalingTask:
    """Time vs n for one (method, m), n increasing, stopping early when too slow."""

    method: str
    m: int

    def calls(self, cfg: ExperimentConfig) -> int:
        return cfg.scaling_trials * len(cfg.scaling_ns)


Task = AccuracyTask | ScalingTask


def build_tasks(cfg: ExperimentConfig, *, scaling: bool) -> list[Task]:
    """Tasks ordered most expensive first (better packing on few workers)."""
    tasks: list[Task] = []
    if scaling:
        tasks += [
            ScalingTask(meth, m)
            for m in sorted(cfg.scaling_ms, reverse=True)
            for meth in cfg.methods
        ]
    tasks += [
        AccuracyTask(d, e, m)
        for m in sorted(cfg.ms, reverse=True)
        for d in cfg.datasets
        for e in cfg.epsilons
    ]
    return tasks


# --------------------------------------------------------------------------- worker side


def _delta_for(method: str, delta: float) -> float | None:
    from app.mechanisms import MECHANISMS

    return delta if MECHANISMS[method].uses_delta else None


def _timed_run(
    method: str,
    sorted_data: np.ndarray,
    qs: np.ndarray,
    *,
    epsilon: float,
    cfg: ExperimentConfig,
    rng: np.random.Generator,
) -> tuple[np.ndarray, float]:
    from app.mechanisms import MECHANISMS

    mech = MECHANISMS[method]
    delta = cfg.delta if mech.uses_delta else None
    start = time.perf_counter()
    est = mech.run(
        sorted_data,
        qs,
        epsilon=epsilon,
        delta=delta,
        lower=cfg.lower,
        upper=cfg.upper,
        neighbors=cfg.neighbors,
        rng=rng,
    )
    return np.asarray(est, dtype=np.float64), time.perf_counter() - start


def run_accuracy_task(task: AccuracyTask, cfg: ExperimentConfig) -> list[Row]:
    """Run one accuracy task; one row per (trial, method). Failures become rows with ``error``."""
    dataset = DATASETS[task.dataset]
    qs = evenly_spaced_quantiles(task.m)
    _warm_config(cfg.methods, dataset.sample, cfg.n, qs, task.epsilon, cfg)
    rows: list[Row] = []
    for trial in range(cfg.trials):
        data_rng = stream(cfg.seed, "accuracy", task.dataset, task.epsilon, task.m, trial, "data")
        data = np.sort(dataset.sample(data_rng, cfg.n))
        for method in cfg.methods:
            rng = stream(cfg.seed, "accuracy", task.dataset, task.epsilon, task.m, trial, method)
            row: Row = {
                "dataset": task.dataset,
                "method": method,
                "epsilon": task.epsilon,
                "delta": _delta_for(method, cfg.delta),
                "m": task.m,
                "trial": trial,
                "n": cfg.n,
                "missed_mean": math.nan,
                "missed_sum": math.nan,
                "missed_max": math.nan,
                "seconds": math.nan,
                "error": "",
            }
            try:
                est, seconds = _timed_run(method, data, qs, epsilon=task.epsilon, cfg=cfg, rng=rng)
                missed = missed_points(data, qs, est)
                row.update(
                    missed_mean=float(missed.mean()),
                    missed_sum=int(missed.sum()),
                    missed_max=int(missed.max()),
                    seconds=seconds,
                )
            except Exception as exc:  # recorded, reported by the CLI, never silently dropped
                row["error"] = f"{type(exc).__name__}: {exc}"
            rows.append(row)
    return rows


def _warm_config(
    methods: Sequence[str],
    sample: Callable[[np.random.Generator, int], np.ndarray],
    n: int,
    qs: np.ndarray,
    epsilon: float,
    cfg: ExperimentConfig,
) -> None:
    """One untimed call per method at this (n, m, ε) before the timed trials.

    Methods may cache data-independent precomputation per (ε, m) (AppIndExp's composition
    solve, CSmooth's public tuning of t); the paper excludes those from its timings, and so do
    we. The call uses its own random stream and its result is discarded.
    """
    rng = stream(cfg.seed, "warm-up", n, qs.size, epsilon)
    data = np.sort(sample(rng, n))
    for method in methods:
        with contextlib.suppress(Exception):  # failures show up in the timed calls
            _timed_run(method, data, qs, epsilon=epsilon, cfg=cfg, rng=rng)


def _projected_seconds(times: Sequence[tuple[int, float]], next_n: int) -> float:
    """Extrapolate the per-call time to ``next_n`` from the measured (n, seconds) points.

    Uses the growth exponent of the last two sizes, clipped to [1, 3] (never assume better
    than linear), or linear growth when only one size was measured.
    """
    n_last, t_last = times[-1]
    exponent = 1.0
    if len(times) >= 2:
        n_prev, t_prev = times[-2]
        if t_prev > 0 and t_last > 0:
            exponent = math.log(t_last / t_prev) / math.log(n_last / n_prev)
        exponent = min(3.0, max(1.0, exponent))
    return float(t_last * (next_n / n_last) ** exponent)


def run_scaling_task(task: ScalingTask, cfg: ExperimentConfig) -> list[Row]:
    """Run one scaling chain; rows with status ``ok``, ``error`` or ``skipped``."""
    dataset = DATASETS[cfg.scaling_dataset]
    qs = evenly_spaced_quantiles(task.m)
    delta = _delta_for(task.method, cfg.delta)
    rows: list[Row] = []
    measured: list[tuple[int, float]] = []
    stop_reason = ""
    _warm_config((task.method,), dataset.sample, min(cfg.scaling_ns), qs, cfg.scaling_epsilon, cfg)
    for n in sorted(cfg.scaling_ns):
        if stop_reason:
            rows.append(_scaling_row(task, cfg, n, -1, delta, math.nan, math.nan, stop_reason))
            continue
        if dataset.max_n is not None and n > dataset.max_n:
            stop_reason = f"skipped: dataset has {dataset.max_n} rows"
            rows.append(_scaling_row(task, cfg, n, -1, delta, math.nan, math.nan, stop_reason))
            continue
        if measured:
            projected = _projected_seconds(measured, n)
            if projected > cfg.scaling_max_seconds:
                stop_reason = (
                    f"skipped: projected {projected:.3g} s per call > {cfg.scaling_max_seconds:g} s"
                )
                rows.append(_scaling_row(task, cfg, n, -1, delta, math.nan, math.nan, stop_reason))
                continue
        seconds_at_n: list[float] = []
        for trial in range(cfg.scaling_trials):
            data_rng = stream(cfg.seed, "scaling", cfg.scaling_dataset, n, task.m, trial, "data")
            data = np.sort(dataset.sample(data_rng, n))
            rng = stream(cfg.seed, "scaling", cfg.scaling_dataset, n, task.m, trial, task.method)
            try:
                est, seconds = _timed_run(
                    task.method, data, qs, epsilon=cfg.scaling_epsilon, cfg=cfg, rng=rng
                )
                missed = float(missed_points(data, qs, est).mean())
                status = "ok"
            except Exception as exc:
                seconds, missed = math.nan, math.nan
                status = f"error: {type(exc).__name__}: {exc}"
                stop_reason = "skipped: error at a smaller n"
            rows.append(_scaling_row(task, cfg, n, trial, delta, seconds, missed, status))
            if status != "ok":
                break
            seconds_at_n.append(seconds)
        if seconds_at_n:
            measured.append((n, float(np.mean(seconds_at_n))))
    return rows


def _scaling_row(
    task: ScalingTask,
    cfg: ExperimentConfig,
    n: int,
    trial: int,
    delta: float | None,
    seconds: float,
    missed: float,
    status: str,
) -> Row:
    return {
        "method": task.method,
        "m": task.m,
        "n": n,
        "trial": trial,
        "epsilon": cfg.scaling_epsilon,
        "delta": delta,
        "seconds": seconds,
        "missed_mean": missed,
        "status": status,
    }


def run_task(task: Task, cfg: ExperimentConfig) -> tuple[Task, list[Row]]:
    """Dispatch one task (module-level so that worker processes can unpickle it)."""
    if isinstance(task, ScalingTask):
        return task, run_scaling_task(task, cfg)
    return task, run_accuracy_task(task, cfg)


def warm_up(methods: Iterable[str]) -> None:
    """Call every method once on a small sample so JIT compilation is not timed."""
    from app.mechanisms import MECHANISMS

    rng = np.random.Generator(np.random.PCG64(12345))
    data = np.sort(rng.normal(0.0, 5.0, size=200))
    qs = evenly_spaced_quantiles(3)
    for method in methods:
        mech = MECHANISMS[method]
        # A broken method is reported by the real runs, not here.
        with contextlib.suppress(Exception):
            mech.run(
                data,
                qs,
                epsilon=1.0,
                delta=1e-6 if mech.uses_delta else None,
                lower=-100.0,
                upper=100.0,
                neighbors="swap",
                rng=rng,
            )


def _init_worker(methods: tuple[str, ...]) -> None:
    try:
        import numba

        numba.set_num_threads(1)
    except Exception:  # numba absent or already pinned by NUMBA_NUM_THREADS
        pass
    warm_up(methods)


@contextmanager
def single_threaded_env() -> Iterator[None]:
    """Pin BLAS/OpenMP/numba thread pools of *spawned* workers to one thread each."""
    saved = {k: os.environ.get(k) for k in THREAD_ENV_VARS}
    os.environ.update({k: "1" for k in THREAD_ENV_VARS})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@dataclass
class RunResults:
    """Raw rows of a run."""

    accuracy: list[Row] = field(default_factory=list)
    scaling: list[Row] = field(default_factory=list)


def run_experiments(
    cfg: ExperimentConfig,
    *,
    scaling: bool = True,
    progress: Callable[[int], None] | None = None,
) -> RunResults:
    """Run every task, spread over ``cfg.workers`` processes (in-process when 1).

    Args:
        cfg: The configuration.
        scaling: Whether to run the time-vs-n experiment.
        progress: Called with the number of mechanism calls each finished task covered.

    Returns:
        Rows sorted in a canonical order (independent of completion order).
    """
    tasks = build_tasks(cfg, scaling=scaling)
    results = RunResults()

    def collect(task: Task, rows: list[Row]) -> None:
        (results.scaling if isinstance(task, ScalingTask) else results.accuracy).extend(rows)
        if progress is not None:
            progress(task.calls(cfg))

    if cfg.workers == 1:
        warm_up(cfg.methods)
        for task in tasks:
            collect(*run_task(task, cfg))
    else:
        with (
            single_threaded_env(),
            ProcessPoolExecutor(
                max_workers=cfg.workers,
                mp_context=get_context("spawn"),
                initializer=_init_worker,
                initargs=(cfg.methods,),
            ) as pool,
        ):
            futures: list[Future[tuple[Task, list[Row]]]] = [
                pool.submit(run_task, t, cfg) for t in tasks
            ]
            try:
                for fut in as_completed(futures):
                    collect(*fut.result())
            except BaseException:
                for fut in futures:
                    fut.cancel()
                raise
    order = {name: i for i, name in enumerate(cfg.methods)}
    dorder = {name: i for i, name in enumerate(cfg.datasets)}
    results.accuracy.sort(
        key=lambda r: (dorder[r["dataset"]], -r["epsilon"], r["m"], order[r["method"]], r["trial"])
    )
    results.scaling.sort(key=lambda r: (r["m"], order[r["method"]], r["n"], r["trial"]))
    return results

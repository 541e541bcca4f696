"""``dpquant experiments``: run the paper's experiments and write tables and plots.

Outputs in ``--out`` (default ``./experiment-results``):

* ``results.csv``          one row per (dataset, method, ε, m, trial)
* ``summary.csv``          mean ± SE per (dataset, method, ε, m): missed points per quantile,
                           missed points summed over the m quantiles, seconds per call
* ``scaling.csv``          one row per (method, m, n, trial) of the time-vs-n experiment
* ``scaling_summary.csv``  mean ± SE seconds per (method, m, n), or why a size was skipped
* ``claims.md``            the paper's claims (a)–(e) next to ours
* ``error_eps1.png``, ``error_eps0.1.png``, ``time_vs_m.png``, ``time_vs_n.png``
* ``run.json``             configuration, methods, versions and wall time

``dpquant experiments map ...`` runs the error map instead (:mod:`app.experiments.errormap`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

from app.experiments.datasets import DATASETS
from app.experiments.runner import (
    ACCURACY_FIELDS,
    SCALING_FIELDS,
    ExperimentConfig,
    run_experiments,
)

QUICK_MS = (1, 3, 9, 15, 29)
QUICK_TRIALS = 3
QUICK_SCALING_NS = (1_000, 10_000)


def _csv_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _int_list(text: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in _csv_list(text):
        if "-" in part:
            a, b = part.split("-", 1)
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(float(part)))
    return tuple(out)


def _float_list(text: str) -> tuple[float, ...]:
    return tuple(float(t) for t in _csv_list(text))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used by the docs to list the options)."""
    p = argparse.ArgumentParser(
        prog="dpquant experiments",
        description=(
            "Reproduce the experiments of 'Differentially Private Quantiles' (Gillenwater, "
            "Joseph, Kulesza 2021) with every method in the registry."
        ),
    )
    p.add_argument("--out", type=Path, default=Path("experiment-results"), help="output dir")
    p.add_argument("--seed", type=int, default=0, help="root seed (default 0)")
    p.add_argument("--trials", type=int, default=None, help="trials per point (default 20)")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_TRIALS} trials, m in {QUICK_MS}, scaling n up to 10^4 (< 1 minute)",
    )
    p.add_argument("--methods", type=_csv_list, default=None, help="comma list (default: all)")
    p.add_argument(
        "--datasets",
        type=_csv_list,
        default=None,
        help=f"comma list of {', '.join(DATASETS)} (default: all)",
    )
    p.add_argument("--epsilons", type=_float_list, default=None, help="default 1,0.1")
    p.add_argument("--ms", type=_int_list, default=None, help="e.g. 1-29 or 1,5,9 (default 1-29)")
    p.add_argument("--n", type=int, default=1000, help="points per trial (default 1000)")
    p.add_argument("--delta", type=float, default=1e-6, help="delta for approximate methods")
    p.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="processes (default: cores)"
    )
    p.add_argument("--no-scaling", action="store_true", help="skip the time-vs-n experiment")
    p.add_argument("--scaling-ns", type=_int_list, default=None, help="default 1e3,3e3,1e4,...,1e6")
    p.add_argument("--scaling-ms", type=_int_list, default=(9, 29), help="default 9,29")
    p.add_argument("--scaling-trials", type=int, default=None, help="default 5 (quick: 1)")
    p.add_argument(
        "--scaling-max-seconds",
        type=float,
        default=20.0,
        help="skip larger n once the projected time per call exceeds this (default 20)",
    )
    p.add_argument("--no-plots", action="store_true", help="tables only")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def config_from_args(args: argparse.Namespace) -> tuple[ExperimentConfig, bool]:
    """Resolve defaults, ``--quick`` and the registry into a config; also return ``scaling``."""
    from app.mechanisms import MECHANISMS

    registered = list(MECHANISMS)
    if args.methods:
        unknown = [m for m in args.methods if m not in MECHANISMS]
        if unknown:
            raise SystemExit(
                f"unknown method(s) {', '.join(unknown)}; registered: {', '.join(registered)}"
            )
        methods = tuple(dict.fromkeys(args.methods))
    else:
        methods = tuple(registered)
    if args.datasets:
        bad = [d for d in args.datasets if d not in DATASETS]
        if bad:
            raise SystemExit(f"unknown dataset(s) {', '.join(bad)}; known: {', '.join(DATASETS)}")
    cfg = ExperimentConfig(methods=methods)
    quick = bool(args.quick)
    cfg = replace(
        cfg,
        seed=args.seed,
        n=args.n,
        delta=args.delta,
        workers=max(1, args.workers),
        trials=args.trials or (QUICK_TRIALS if quick else cfg.trials),
        ms=args.ms or (QUICK_MS if quick else cfg.ms),
        datasets=tuple(args.datasets) if args.datasets else cfg.datasets,
        epsilons=args.epsilons or cfg.epsilons,
        scaling_ns=args.scaling_ns or (QUICK_SCALING_NS if quick else cfg.scaling_ns),
        scaling_ms=tuple(args.scaling_ms),
        scaling_trials=args.scaling_trials or (1 if quick else cfg.scaling_trials),
        scaling_max_seconds=args.scaling_max_seconds,
    )
    return cfg, not args.no_scaling


def _versions() -> dict[str, str]:
    import matplotlib
    import numpy
    import scipy

    out = {
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
        "matplotlib": matplotlib.__version__,
    }
    try:
        import numba

        out["numba"] = numba.__version__
    except ImportError:
        pass
    return out


def _git_state() -> dict[str, str]:
    """Commit of the source tree and whether app/mechanisms differs from it (best effort)."""
    root = Path(__file__).resolve().parents[2]
    out: dict[str, str] = {}
    try:
        out["git_commit"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "app/mechanisms"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        out["mechanisms_uncommitted_changes"] = "yes" if dirty else "no"
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``dpquant experiments`` and ``python -m app.experiments``.

    Args:
        argv: Arguments after ``experiments`` (``sys.argv[1:]`` when None).

    Returns:
        0 on success; 1 when any mechanism call failed (outputs are still written).
    """
    arglist = list(argv) if argv is not None else sys.argv[1:]
    if arglist[:1] == ["map"]:
        from app.experiments.errormap import main as map_main

        return map_main(arglist[1:])
    args = build_parser().parse_args(arglist)
    cfg, scaling = config_from_args(args)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    from app.experiments import summary as sm

    scaling_text = "n " + ",".join(map(str, cfg.scaling_ns)) if scaling else "off"
    print(
        f"dpquant experiments: methods {', '.join(cfg.methods)}; datasets "
        f"{', '.join(cfg.datasets)}; ε {', '.join(f'{e:g}' for e in cfg.epsilons)}; "
        f"{len(cfg.ms)} m values; {cfg.trials} trials; n={cfg.n}; workers={cfg.workers}; "
        f"seed={cfg.seed}; scaling={scaling_text}",
        flush=True,
    )
    from tqdm import tqdm

    from app.experiments.runner import build_tasks

    total = sum(t.calls(cfg) for t in build_tasks(cfg, scaling=scaling))
    load_before = os.getloadavg()
    start = time.perf_counter()
    with tqdm(
        total=total, unit="call", disable=args.no_progress, dynamic_ncols=True, file=sys.stderr
    ) as bar:
        results = run_experiments(cfg, scaling=scaling, progress=bar.update)
    wall = time.perf_counter() - start

    summary = sm.summarize_accuracy(results.accuracy)
    scaling_summary = sm.summarize_scaling(results.scaling)
    sm.write_csv(out / "results.csv", ACCURACY_FIELDS, results.accuracy)
    sm.write_csv(out / "summary.csv", sm.SUMMARY_FIELDS, summary)
    if scaling:
        sm.write_csv(out / "scaling.csv", SCALING_FIELDS, results.scaling)
        sm.write_csv(out / "scaling_summary.csv", sm.SCALING_SUMMARY_FIELDS, scaling_summary)
    claims = sm.evaluate_claims(summary)
    (out / "claims.md").write_text(
        "# Paper claims vs this run\n\n"
        "Error = mean missed points per quantile (averaged over trials). A claim of the form\n"
        "'≈ k×' is marked as holding when our ratio is at least k/2.\n\n"
        + sm.claims_markdown(claims),
        encoding="utf-8",
    )
    if not args.no_plots:
        from app.experiments import plots

        for eps in cfg.epsilons:
            plots.plot_error(summary, eps, out / f"error_eps{eps:g}.png", cfg.methods)
        if "gaussian" in cfg.datasets and 1.0 in cfg.epsilons:
            plots.plot_time_vs_m(summary, out / "time_vs_m.png", cfg.methods)
        if scaling:
            plots.plot_time_vs_n(scaling_summary, out / "time_vs_n.png", cfg.methods)
    failures = [r for r in results.accuracy if r["error"]] + [
        r for r in results.scaling if r["status"].startswith("error")
    ]
    meta = {
        "config": asdict(cfg),
        "scaling": scaling,
        "quick": bool(args.quick),
        "wall_seconds": round(wall, 2),
        "cpu_count": os.cpu_count(),
        # Other processes on the machine inflate timings; the 1-minute load average before and
        # after the run tells a reader how busy it was.
        "load_average_1min": {"before": load_before[0], "after": os.getloadavg()[0]},
        "platform": platform.platform(),
        "versions": _versions(),
        **_git_state(),
        "failed_calls": len(failures),
        "argv": list(argv) if argv is not None else sys.argv[1:],
    }
    (out / "run.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}/ in {wall:.1f} s of computation")
    print(sm.claims_markdown(claims))
    if failures:
        first = failures[0]
        print(
            f"WARNING: {len(failures)} mechanism call(s) failed; first: "
            f"{first.get('method')}: {first.get('error') or first.get('status')}",
            file=sys.stderr,
        )
        return 1
    return 0

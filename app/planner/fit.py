"""Fit the planner's coefficients from error maps: ``python -m app.planner.fit``.

Reads ``map.csv`` and ``trials.csv`` (written by ``dpquant experiments map``) of the
committed maps and writes ``app/planner/coefficients.json``: three model sets
(:data:`SETS`). The *continuous* one (shapes :data:`FIT_SHAPES`) is fitted on distinct
values; the *tied* one on integer-valued data (every quantile on a long run of ties), the
*clamped* one on data with about 16 % of the points clamped at the upper bound (one heavy
atom). On ties and atoms each method's missed points follow another law (JointExp's
utility goes flat on atoms, the smoothed variant's jitter restores it, AQ's splits land
inside the atom). The planner never sees which one a data set follows (app.planner).
Cells where a method is saturated (mean ≥ n/8: the answer carries almost no information)
are left out of the least-squares fit; the model's soft cap covers them.
"""

from __future__ import annotations

import csv
import json
import sys
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from app.planner.model import OFFSET, MethodModel, features

FIT_SHAPES = ("gaussian", "lognormal", "bimodal")
TIED_SHAPES = ("integer",)
CLAMPED_SHAPES = ("clamped",)
OUT = Path(__file__).with_name("coefficients.json")
#: The committed maps the continuous models are fitted on (docs/experiments.md §10.3).
DEFAULT_MAPS = (
    "docs/results/errormap_dense",
    "docs/results/errormap_eps001",
    "docs/results/errormap_m499",
    "docs/results/errormap_large_grid",
    "docs/results/errormap_small_grid",
)
#: The committed maps the tied and clamped models are fitted on: the integer-valued shape run
#: as a release runs it, on its grid (docs/experiments.md §10.7); the clamped shape, whose
#: raw-value and grid runs agree (§10.5). Every set also takes ``errormap_small_grid``
#: (n = 100-220, every shape on its grid, 40 trials; §10.9): below it the models extrapolate.
TIED_MAPS = ("docs/results/errormap_tied_grid", "docs/results/errormap_small_grid")
CLAMPED_MAPS = ("docs/results/errormap_ties", "docs/results/errormap_small_grid")
#: Each model set (app.planner.model.REGIMES): the maps and shapes it is fitted on.
SETS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "continuous": (DEFAULT_MAPS, FIT_SHAPES),
    "tied": (TIED_MAPS, TIED_SHAPES),
    "clamped": (CLAMPED_MAPS, CLAMPED_SHAPES),
}
#: The noise-adding methods take the ``value`` feature form; every other method (the
#: exponential-mechanism family, and methods registered later) the ``rank`` form.
VALUE_FORM = frozenset({"smooth", "csmooth"})
#: The knees k tried for the ``rank`` form's hinge softplus(k − log g); the one with the
#: lowest held-out error is kept.
KNEES = tuple(0.5 * i for i in range(13))


Cell = tuple[int, int, float, float]  # (n, m, epsilon, mean missed points)


MapDirs = Path | Sequence[Path]


def _dirs(map_dirs: MapDirs) -> list[Path]:
    return [map_dirs] if isinstance(map_dirs, Path) else [Path(d) for d in map_dirs]


def _rows(map_dirs: MapDirs, name: str) -> Iterator[dict[str, str]]:
    for map_dir in _dirs(map_dirs):
        with (map_dir / name).open(encoding="utf-8") as fh:
            yield from csv.DictReader(fh)


def _map_cells(map_dirs: MapDirs, shapes: tuple[str, ...]) -> list[tuple[str, str, Cell]]:
    """(method, shape, cell) of every measured cell of the maps' ``map.csv`` on ``shapes``."""
    return [
        (r["method"], r["shape"],
         (int(r["n"]), int(r["m"]), float(r["epsilon"]), float(r["missed_mean"])))
        for r in _rows(map_dirs, "map.csv")
        if r["status"] == "ok" and r["shape"] in shapes
    ]  # fmt: skip


def _model(rows: list[Cell], form: str, knee: float) -> MethodModel:
    """The model of ``form`` / ``knee`` fitted by least squares on ``rows`` (no bounds)."""
    x = np.array([features(n, m, e, form, knee) for n, m, e, _ in rows])
    # the model's soft cap undone (rows hold unsaturated cells, mean < n/8), so the
    # features fit the law the cap is then applied to
    y = np.log(OFFSET + np.array([_uncapped(mean, n) for n, _, _, mean in rows]))
    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    return MethodModel(tuple(float(b) for b in beta), (1.0,), (1.0,), len(rows), form, knee)


def _uncapped(mean: float, n: int) -> float:
    """The raw E whose soft cap at n/4 is ``mean`` (:meth:`MethodModel.mean`)."""
    return mean if mean <= 0 else float((mean**-2 - (n / 4.0) ** -2) ** -0.5)


def _log_errors(model: MethodModel, rows: list[Cell]) -> list[float]:
    return [float(np.log((model.mean(n, m, e) + 1) / (mean + 1))) for n, m, e, mean in rows]


def _held_out(rows: list[Cell], form: str, knee: float) -> list[float]:
    """Log errors on each level of n, m and ε left out in turn (edges included, so half
    the folds extrapolate), the model fitted on the rest's unsaturated cells."""
    errors: list[float] = []
    for axis in range(3):
        for level in sorted({row[axis] for row in rows}):
            train = [row for row in rows if row[axis] != level and row[3] < row[0] / 8]
            if len(train) >= 8:
                model = _model(train, form, knee)
                errors += _log_errors(model, [row for row in rows if row[axis] == level])
    return errors


def _choose(method: str, rows: list[Cell]) -> tuple[str, float, list[float]]:
    """(form, knee, held-out log errors) of the method: its form, the knee with the lowest
    held-out RMS."""
    if method in VALUE_FORM:
        return "value", 0.0, _held_out(rows, "value", 0.0)
    scored = []
    for knee in KNEES:
        errors = _held_out(rows, "rank", knee)
        scored.append((float(np.mean(np.square(errors))), knee, errors))
    _, knee, errors = min(scored, key=lambda s: s[:2])
    return "rank", knee, errors


def fit(map_dirs: MapDirs, shapes: tuple[str, ...] = FIT_SHAPES) -> dict[str, object]:
    """Coefficients per method (see :mod:`app.planner.model`) on the maps' ``shapes``."""
    cells: dict[str, list[Cell]] = defaultdict(list)  # unsaturated: the least-squares rows
    every: dict[str, list[Cell]] = defaultdict(list)  # all: the held-out check's rows
    cell_mean: dict[tuple[str, str, int, int, float], float] = {}
    for method, shape, (n, m, e, mean) in _map_cells(map_dirs, shapes):
        cell_mean[(method, shape, n, m, e)] = mean
        every[method].append((n, m, e, mean))
        if mean < n / 8:
            cells[method].append((n, m, e, mean))
    ratios: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in _rows(map_dirs, "trials.csv"):
        key = (r["method"], r["shape"], int(r["n"]), int(r["m"]), float(r["epsilon"]))
        cm = cell_mean.get(key)
        if cm is not None and 0 < cm < key[2] / 8:
            ratios[r["method"]][key[3]].append(float(r["missed_mean"]) / cm)
    methods: dict[str, object] = {}
    for method, rows in sorted(cells.items()):
        form, knee, held_out = _choose(method, every[method])
        model = _model(rows, form, knee)
        ms = sorted(ratios[method])
        r90 = [max(1.0, float(np.quantile(ratios[method][m], 0.9))) for m in ms]
        methods[method] = {
            "form": form,
            "knee": knee,
            "beta": [round(float(b), 6) for b in model.beta],
            "r90_ms": ms,
            "r90": [round(v, 4) for v in r90],
            "fit_cells": len(rows),
            "rms_log_residual": round(_rms(_log_errors(model, rows)), 4),
            "cv_rms_log_residual": round(_rms(held_out), 4),
        }
    root = Path(__file__).resolve().parents[2]
    sources = [
        str(d.resolve().relative_to(root)) if d.resolve().is_relative_to(root) else str(d)
        for d in _dirs(map_dirs)
    ]
    return {"source": sources, "shapes": list(shapes), "methods": methods}


def _rms(errors: list[float]) -> float:
    return float(np.sqrt(np.mean(np.square(errors))))


def cross_validate(
    map_dirs: MapDirs, shapes: tuple[str, ...] = FIT_SHAPES
) -> dict[str, tuple[float, float, int]]:
    """Held-out error of the model per method: leave out one level of n, of m or of ε at a
    time (edges included, so half the folds extrapolate), fit on the rest as :func:`fit`
    does, predict the held-out cells. Returns ``(RMS of log((pred + 1)/(meas + 1)), share of
    held-out cells within 1.5x, cells)`` per method (the knee is the one :func:`fit` picks)."""
    cells: dict[str, list[Cell]] = defaultdict(list)
    for method, _, cell in _map_cells(map_dirs, shapes):
        cells[method].append(cell)
    out: dict[str, tuple[float, float, int]] = {}
    for method, rows in sorted(cells.items()):
        errors = _choose(method, rows)[2]
        out[method] = (
            _rms(errors),
            float(np.mean(np.abs(errors) < np.log(1.5))),
            len(errors),
        )
    return out


def main(argv: list[str]) -> int:
    """Write every model set (:data:`SETS`) fitted on the committed maps; with ``--cv``,
    print their held-out validation (:func:`cross_validate`) instead."""
    if argv and argv[0] == "--cv":
        for label, (maps, shapes) in SETS.items():
            sys.stdout.write(f"{label} ({', '.join(shapes)}):\n")
            for name, (rms, within, count) in cross_validate(_paths(maps), shapes).items():
                sys.stdout.write(
                    f"  {name:16s} held-out cells={count:4d} rms(log)={rms:.3f} "
                    f"within 1.5x={100 * within:.0f} %\n"
                )
        return 0
    parts = {label: fit(_paths(maps), shapes) for label, (maps, shapes) in SETS.items()}
    out = {**parts["continuous"], "regimes": {k: v for k, v in parts.items() if k != "continuous"}}
    OUT.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    for label, part in parts.items():
        methods: dict[str, dict[str, Any]] = part["methods"]  # type: ignore[assignment]
        for name, entry in methods.items():
            sys.stdout.write(
                f"{label:10s} {name:16s} cells={entry['fit_cells']:3d} "
                f"rms(log)={entry['rms_log_residual']} cv={entry['cv_rms_log_residual']}\n"
            )
    return 0


def _paths(maps: Sequence[str]) -> list[Path]:
    """The committed maps, relative to the repository root."""
    root = Path(__file__).resolve().parents[2]
    return [root / d for d in maps]


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

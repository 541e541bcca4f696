"""Fit the planner's coefficients from error maps: ``python -m app.planner.fit``.

Reads ``map.csv`` and ``trials.csv`` (written by ``dpquant experiments map``) of the
committed maps and writes ``app/planner/coefficients.json``: three model sets
(:data:`SETS`). The *continuous* one (shapes :data:`FIT_SHAPES`) is fitted on distinct
values; the *tied* one on integer-valued data (every quantile on a long run of ties), the
*clamped* one on data with about 16 % of the points clamped at the upper bound (one heavy
atom). On ties and atoms each method's missed points follow another law (JointExp's
utility goes flat on atoms, the smoothed variant's jitter restores it, AQ's splits land
inside the atom). The planner never sees which one a data set follows (app.planner).
The fit is least squares in log space of the model's own prediction, soft cap included
(:meth:`MethodModel.mean`), over every measured cell, saturated ones too (mean near n/4:
the answer carries almost no information). Leaving those out (as before 2026-12-07) fitted
each method only where it did well, so its model ran low where it did not (AQ at n = 180,
m = 4, ε = 0.5: 13 predicted, 32 measured), which is where ``auto`` most needs it.
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
from scipy.optimize import least_squares

from app.planner.model import OFFSET, FloatArray, MethodModel, features

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
    """The model of ``form`` / ``knee`` fitted on ``rows``: least squares of
    ``log(prediction + 1/4) - log(mean + 1/4)``, the prediction with its soft cap at n/4
    (:meth:`MethodModel.mean`), from the linear fit of the uncapped law on the unsaturated
    rows (mean < n/8, where undoing the cap is stable)."""
    x = np.array([features(n, m, e, form, knee) for n, m, e, _ in rows])
    sizes = np.array([n for n, _, _, _ in rows], dtype=np.float64)
    y = np.log(OFFSET + np.array([mean for _, _, _, mean in rows]))
    start = [i for i, (n, _, _, mean) in enumerate(rows) if mean < n / 8] or list(range(len(rows)))
    y0 = np.log(OFFSET + np.array([_uncapped(rows[i][3], rows[i][0]) for i in start]))
    beta0, *_ = np.linalg.lstsq(x[start], y0, rcond=None)

    def residuals(beta: FloatArray) -> FloatArray:
        raw = np.maximum(np.exp(x @ beta) - OFFSET, 1e-3)
        pred = (raw**-2 + (sizes / 4.0) ** -2) ** -0.5
        out: FloatArray = np.log(OFFSET + pred) - y
        return out

    beta = least_squares(residuals, beta0, method="trf").x if len(rows) > x.shape[1] else beta0
    return MethodModel(tuple(float(b) for b in beta), (1.0,), (1.0,), len(rows), form, knee)


def _uncapped(mean: float, n: int) -> float:
    """The raw E whose soft cap at n/4 is ``mean`` (:meth:`MethodModel.mean`)."""
    return mean if mean <= 0 else float((mean**-2 - (n / 4.0) ** -2) ** -0.5)


def _log_errors(model: MethodModel, rows: list[Cell]) -> list[float]:
    return [float(np.log((model.mean(n, m, e) + 1) / (mean + 1))) for n, m, e, mean in rows]


def _held_out(rows: list[Cell], form: str, knee: float) -> list[float]:
    """Log errors on each level of n, m and ε left out in turn (edges included, so half
    the folds extrapolate), the model fitted on the rest."""
    errors: list[float] = []
    for axis in range(3):
        for level in sorted({row[axis] for row in rows}):
            train = [row for row in rows if row[axis] != level]
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
    cells: dict[str, list[Cell]] = defaultdict(list)
    cell_mean: dict[tuple[str, str, int, int, float], float] = {}
    for method, shape, (n, m, e, mean) in _map_cells(map_dirs, shapes):
        cell_mean[(method, shape, n, m, e)] = mean
        cells[method].append((n, m, e, mean))
    ratios: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in _rows(map_dirs, "trials.csv"):
        key = (r["method"], r["shape"], int(r["n"]), int(r["m"]), float(r["epsilon"]))
        cm = cell_mean.get(key)
        if cm is not None and 0 < cm < key[2] / 8:
            ratios[r["method"]][key[3]].append(float(r["missed_mean"]) / cm)
    methods: dict[str, object] = {}
    for method, rows in sorted(cells.items()):
        form, knee, held_out = _choose(method, rows)
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

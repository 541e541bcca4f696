"""Fit the planner's coefficients from an error map: ``python -m app.planner.fit MAP_DIR``.

Reads ``MAP_DIR/map.csv`` and ``MAP_DIR/trials.csv`` (written by ``dpquant experiments
map``) and writes ``app/planner/coefficients.json``. Only the continuous shapes
(:data:`FIT_SHAPES`) are used: the planner cannot see ties (it never looks at the data),
and on heavily tied data every method's missed-point count is dominated by the tie runs.
Cells where a method is saturated (mean ≥ n/8: the answer carries almost no information)
are left out of the least-squares fit; the model's soft cap covers them.
"""

from __future__ import annotations

import csv
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from app.planner.model import features

FIT_SHAPES = ("gaussian", "lognormal", "bimodal")
OUT = Path(__file__).with_name("coefficients.json")


def fit(map_dir: Path, shapes: tuple[str, ...] = FIT_SHAPES) -> dict[str, object]:
    """Coefficients per method (see :mod:`app.planner.model`)."""
    cells: dict[str, list[tuple[float, float, float, float]]] = defaultdict(list)
    cell_mean: dict[tuple[str, str, int, int, float], float] = {}
    with (map_dir / "map.csv").open(encoding="utf-8") as fh:
        for r in csv.DictReader(fh):
            if r["status"] != "ok" or r["shape"] not in shapes:
                continue
            n, m, e, mean = int(r["n"]), int(r["m"]), float(r["epsilon"]), float(r["missed_mean"])
            cell_mean[(r["method"], r["shape"], n, m, e)] = mean
            if mean < n / 8:
                cells[r["method"]].append((n, m, e, mean))
    ratios: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    with (map_dir / "trials.csv").open(encoding="utf-8") as fh:
        for r in csv.DictReader(fh):
            key = (r["method"], r["shape"], int(r["n"]), int(r["m"]), float(r["epsilon"]))
            cm = cell_mean.get(key)
            if cm is not None and 0 < cm < key[2] / 8:
                ratios[r["method"]][key[3]].append(float(r["missed_mean"]) / cm)
    methods: dict[str, object] = {}
    for method, rows in sorted(cells.items()):
        x = np.array([features(n, m, e) for n, m, e, _ in rows])
        y = np.log1p(np.array([mean for *_, mean in rows]))
        beta, *_ = np.linalg.lstsq(x, y, rcond=None)
        ms = sorted(ratios[method])
        r90 = [max(1.0, float(np.quantile(ratios[method][m], 0.9))) for m in ms]
        methods[method] = {
            "beta": [round(float(b), 6) for b in beta],
            "r90_ms": ms,
            "r90": [round(v, 4) for v in r90],
            "fit_cells": len(rows),
            "rms_log_residual": round(float(np.sqrt(np.mean((x @ beta - y) ** 2))), 4),
        }
    return {"source": str(map_dir), "shapes": list(shapes), "methods": methods}


def main(argv: list[str]) -> int:
    """Write the coefficients fitted on ``argv[0]`` (default docs/results/errormap)."""
    map_dir = Path(argv[0]) if argv else Path("docs/results/errormap")
    out = fit(map_dir)
    OUT.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    for name, entry in out["methods"].items():  # type: ignore[attr-defined]
        sys.stdout.write(
            f"{name:10s} cells={entry['fit_cells']:3d} rms(log)={entry['rms_log_residual']}\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

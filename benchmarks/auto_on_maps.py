"""``auto`` on every cell of the committed error maps: ``python -m benchmarks.auto_on_maps``.

For each (shape, n, m, ε) cell of the maps (default: the five the planner is fitted on,
:data:`app.planner.fit.SETS`), the method :func:`app.planner.recommend` picks among the
methods measured there (pure ε-DP ones, and with ``--delta`` every method), given the
shape's public grid (:func:`app.experiments.errormap.grid_step`: 201 points on [-100, 100]
for the integer-valued shape, a column declared integer), against the best measured method.
Prints per shape the share of cells with ``auto`` within 1.25x and 2x of the best, the
geometric mean and the worst of (auto + 1/4) / (best + 1/4), and the worst cells. In sample
for the models (they are fitted on these maps): it compares selection rules, not
generalisation (that is ``benchmarks.heldout_random``).
"""

from __future__ import annotations

import argparse
import csv
import math
from collections import defaultdict
from pathlib import Path

from app.codec.grid import grid_size
from app.experiments.errormap import LOWER, UPPER, grid_step
from app.experiments.runner import evenly_spaced_quantiles
from app.mechanisms import MECHANISMS
from app.planner import recommend
from app.planner.fit import SETS, _paths

Cell = tuple[str, int, int, float]


def load(maps: list[Path], shapes: tuple[str, ...] | None = None) -> dict[Cell, dict[str, float]]:
    """Measured mean missed points per method of every cell of ``maps`` (of ``shapes``)."""
    cells: dict[Cell, dict[str, float]] = defaultdict(dict)
    for d in maps:
        with (d / "map.csv").open(encoding="utf-8") as fh:
            for r in csv.DictReader(fh):
                if r["status"] == "ok" and (shapes is None or r["shape"] in shapes):
                    key = (r["shape"], int(r["n"]), int(r["m"]), float(r["epsilon"]))
                    cells[key][r["method"]] = float(r["missed_mean"])
    return cells


def ratios(
    cells: dict[Cell, dict[str, float]], delta: float | None
) -> list[tuple[float, Cell, str, str]]:
    """(ratio, cell, auto's pick, best) per cell with at least three methods measured."""
    out = []
    for cell, measured in sorted(cells.items()):
        shape, n, m, eps = cell
        names = [x for x in measured if delta is not None or not MECHANISMS[x].uses_delta]
        if len(names) < 3:
            continue
        grid = grid_size(LOWER, UPPER, grid_step(shape))
        qs = list(evenly_spaced_quantiles(m))
        pick = recommend(n, qs, eps, delta, "swap", only=names, grid_points=grid)
        best = min(names, key=measured.__getitem__)
        out.append(((measured[pick] + 0.25) / (measured[best] + 0.25), cell, pick, best))
    return out


def table(rows: list[tuple[float, Cell, str, str]]) -> str:
    """The markdown summary per shape and overall."""
    groups: dict[str, list[float]] = defaultdict(list)
    for ratio, cell, _, _ in rows:
        groups[cell[0]].append(ratio)
        groups["all"].append(ratio)
    lines = [
        "| shape | cells | auto ≤ 1.25× best | ≤ 2× | geometric mean | worst |",
        "|---|---|---|---|---|---|",
    ]
    for shape, rs in groups.items():
        k = len(rs)
        lines.append(
            f"| {shape} | {k} | {100 * sum(r <= 1.25 for r in rs) / k:.0f} % | "
            f"{100 * sum(r <= 2 for r in rs) / k:.0f} % | "
            f"{math.exp(sum(map(math.log, rs)) / k):.2f} | {max(rs):.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("maps", nargs="*", type=Path, help="map directories (default: the fitted)")
    p.add_argument("--delta", action="store_true", help="δ = 1e-6 given: every method")
    p.add_argument("--worst", type=int, default=8, help="list this many worst cells")
    args = p.parse_args(argv)
    if args.maps:
        cells = load(args.maps)
    else:  # each fitted map with the shapes its model set is fitted on
        cells = {}
        for maps, shapes in SETS.values():
            cells.update(load(_paths(maps), shapes))
    rows = ratios(cells, 1e-6 if args.delta else None)
    print(table(rows))
    for ratio, cell, pick, best in sorted(rows, reverse=True)[: args.worst]:
        print(f"{ratio:8.2f}  {cell}  auto={pick}  best={best}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

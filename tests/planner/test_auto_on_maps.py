"""benchmarks.auto_on_maps: auto's pick on map cells against the best measured method."""

from __future__ import annotations

import csv
from pathlib import Path

from app.experiments.runner import evenly_spaced_quantiles
from app.planner import recommend
from benchmarks.auto_on_maps import load, ratios, table


def test_each_cell_is_scored_by_auto_s_pick_against_the_best(tmp_path: Path) -> None:
    measured = {"jointexp": 4.0, "jointexp_smooth": 5.0, "aq": 2.0, "indexp": 9.0}
    rows = [
        {"shape": shape, "n": 5000, "m": 9, "epsilon": 0.1, "method": method,
         "missed_mean": value, "status": "ok"}
        for shape in ("gaussian", "integer")
        for method, value in measured.items()
    ]  # fmt: skip
    rows.append({**rows[0], "method": "appindexp", "status": "skipped: projected 9 s"})
    with (tmp_path / "map.csv").open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    cells = load([tmp_path])
    assert set(cells) == {("gaussian", 5000, 9, 0.1), ("integer", 5000, 9, 0.1)}
    assert "appindexp" not in cells[("gaussian", 5000, 9, 0.1)]  # skipped: not measured
    assert set(load([tmp_path], ("integer",))) == {("integer", 5000, 9, 0.1)}
    scored = ratios(cells, None)
    assert len(scored) == 2
    qs = list(evenly_spaced_quantiles(9))
    for ratio, cell, pick, best in scored:
        grid = 201 if cell[0] == "integer" else 2_000_001  # steps 1 and 10^-4 on [-100, 100]
        assert pick == recommend(5000, qs, 0.1, None, "swap", only=list(measured),
                                 grid_points=grid)  # fmt: skip
        assert best == "aq"
        assert ratio == (measured[pick] + 0.25) / (measured["aq"] + 0.25)
    text = table(scored)
    assert "| all | 2 |" in text and "| integer | 1 |" in text

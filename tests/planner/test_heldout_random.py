"""The random held-out evaluation (benchmarks/heldout_random.py): its cells and one run."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from benchmarks.heldout_random import SEED, Cell, draw_cells, evaluate, main, summary


def test_cells_are_drawn_from_the_seed_within_the_stated_ranges() -> None:
    cells = draw_cells(60)
    assert cells == draw_cells(60, SEED)  # the committed seed is the default
    assert cells != draw_cells(60, SEED + 1)
    for c in cells:
        assert 100 <= c.n <= 1_000_000
        assert 1 <= c.m <= min(999, c.n // 2)
        assert 0.0099 <= c.epsilon <= 10.01
        assert c.delta in (None, 1e-6)
    assert {c.shape for c in cells} <= {"gaussian", "lognormal", "bimodal", "integer", "clamped"}
    # log-uniform: about half of the draws below the geometric middle of each range
    assert 15 <= sum(c.n < 10_000 for c in cells) <= 45
    assert 15 <= sum(c.epsilon < math.sqrt(0.1) for c in cells) <= 45


def test_a_cell_compares_auto_with_every_method_that_ran() -> None:
    cell = Cell(0, "gaussian", 400, 3, 1.0, None)
    result = evaluate(cell, trials=3, max_seconds=10.0, seed=5)
    rows = result["methods"]
    ran = {name for name, row in rows.items() if row["ran"]}
    assert result["auto"] in rows and result["best"] in ran
    assert all(rows[name]["measured"] >= rows[result["best"]]["measured"] for name in ran)
    assert result["auto_vs_best"] >= 1.0
    assert all(row["measured"] is None for name, row in rows.items() if name not in ran)
    text = summary([result], 3, 5)
    assert "| all | 1 |" in text
    # a limit below every bound runs nothing, and auto's pick is then out of the comparison
    starved = evaluate(cell, trials=1, max_seconds=1e-9, seed=5)
    assert starved["best"] is None and starved["auto_vs_best"] == math.inf


def test_quotes_are_judged_as_plain_ratios_and_on_the_model_s_offset(tmp_path: Path) -> None:
    """A cell measured at 0 missed points: a quote of 0.05 is never within 1.5x as a plain
    ratio, and is on (error + 1/4); a quote of 0.5 is on neither."""

    def result(quote: float, measured: float) -> dict[str, Any]:
        row = {"ran": True, "error": None, "bound_seconds": 0.1, "quoted_mean": quote,
               "bound90": 3 * quote, "measured": measured, "within_bound90": 1.0}  # fmt: skip
        cell = {"index": 0, "shape": "integer", "n": 1000, "m": 3, "epsilon": 1.0, "delta": None}
        return {
            "cell": cell,
            "auto": "jointexp_smooth",
            "best": "jointexp_smooth",
            "auto_vs_best": 1.0,
            "quote_over_measured": round(quote / max(measured, 1e-9), 3),
            "methods": {"jointexp_smooth": row},
        }

    rows = [result(0.05, 0.0), result(0.5, 0.0), result(10.0, 12.0)]
    text = summary(rows, 20, 1)
    line = next(x for x in text.splitlines() if x.startswith("| all |"))
    cells = [x.strip() for x in line.split("|")[1:-1]]
    assert cells[:7] == ["all", "3", "3", "3", "1", "2", "100.0 %"]
    path = tmp_path / "done.json"
    path.write_text(json.dumps(rows), encoding="utf-8")
    assert main(["--summarize", str(path), "--trials", "20", "--seed", "1"]) == 0

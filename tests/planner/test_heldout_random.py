"""The random held-out evaluation (benchmarks/heldout_random.py): its cells and one run."""

from __future__ import annotations

import math

from benchmarks.heldout_random import SEED, Cell, draw_cells, evaluate, summary


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

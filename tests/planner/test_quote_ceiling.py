"""The ceiling of any public-only quote (benchmarks/quote_ceiling.py): its counting, its
probabilities and its twins."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from app.experiments.errormap import grid_step
from benchmarks.quote_ceiling import (
    DEFAULT_GRID,
    INTEGER_TWINS,
    _sample,
    at_least,
    ceilings,
    cell_row,
    map_ceilings,
    map_report,
    measure,
    most_within,
    report,
    twins_of,
    within,
)


def test_one_quote_covers_values_spanning_at_most_factor_squared() -> None:
    assert most_within([1.0, 2.0, 2.25, 2.3]) == 3
    assert most_within([1.0, 10.0, 100.0]) == 1
    assert most_within([5.0, 5.0, 5.0, 5.0]) == 4
    assert most_within([0.0, 0.0, 1.0]) == 1  # a measured 0 is never within a ratio
    assert most_within([0.0]) == 0
    assert most_within([]) == 0


def test_most_within_equals_a_brute_force_search_over_quotes() -> None:
    rng = np.random.default_rng(7)
    for _ in range(300):
        values = list(np.exp(rng.normal(0.0, 1.0, size=int(rng.integers(1, 6)))))
        if rng.random() < 0.2:
            values.append(0.0)
        # an optimal quote sits at some value times 1.5 (the top of its window)
        candidates = [v * f for v in values for f in (1.5, 1 / 1.5, 1.0)]
        brute = max(sum(within(q, v) for v in values) for q in candidates)
        assert most_within(values) == brute


def test_within_is_the_harness_test() -> None:
    assert within(1.5, 1.0) and within(1 / 1.5, 1.0)
    assert not within(1.51, 1.0) and not within(0.66, 1.0)
    assert not within(0.0, 0.0) and not within(1e-3, 0.0)  # q / max(0, 1e-9)
    assert not within(None, 1.0)


def test_at_least_is_the_poisson_binomial_tail() -> None:
    assert at_least([0.3] * 10, 4) == pytest.approx(stats.binom.sf(3, 10, 0.3), rel=1e-12)
    probs = [0.9, 0.5, 0.2, 1.0]
    for k in range(6):
        exact = sum(
            math.prod(p if hit else 1 - p for p, hit in zip(probs, hits, strict=True))
            for hits in itertools.product((False, True), repeat=len(probs))
            if sum(hits) >= k
        )
        assert at_least(probs, k) == pytest.approx(exact, abs=1e-12)


def test_twins_share_every_public_figure() -> None:
    for shape in DEFAULT_GRID:
        twins = twins_of(shape)
        assert set(twins) == set(DEFAULT_GRID) - {shape}
        assert {grid_step(s) for s in (shape, *twins)} == {grid_step("gaussian")}
    assert set(twins_of("integer")) == set(INTEGER_TWINS)
    rng = np.random.default_rng(1)
    for name in INTEGER_TWINS:
        data = _sample(name, rng, 5_000)
        assert np.all(data == np.round(data)) and data.min() >= -100 and data.max() <= 100
        assert np.all(np.diff(data) >= 0)
    with pytest.raises(ValueError, match="no twins"):
        twins_of("uniform")


def _result(shape: str, quote: float, measured: float) -> dict[str, Any]:
    cell = {"index": 0, "shape": shape, "n": 1000, "m": 3, "epsilon": 1.0, "delta": None}
    row = {"quoted_mean": quote, "measured": measured}
    return {"cell": cell, "auto": "aq", "methods": {"aq": row}}


def test_ceilings_count_what_one_quote_can_reach() -> None:
    # four default-grid shapes at 10, 12, 20, 100: one quote reaches three (10-20 span 2x)
    wide = cell_row(_result("gaussian", 11.0, 10.0),
                    {"lognormal": 12.0, "bimodal": 20.0, "clamped": 100.0})  # fmt: skip
    assert (wide["best"], wide["quote_count"]) == (3, 2)
    # an integer cell measured at 0.5 with twins at 5 and 6: the harness grants it
    tied = cell_row(_result("integer", 5.5, 0.5), {"integer_wide": 5.0, "ratings": 6.0})
    assert (tied["best"], tied["quote_count"]) == (2, 2)
    got = ceilings([wide, tied])
    assert got["plain/harness"]["ceiling"] == pytest.approx((3 / 4 + 1.0) / 2)
    assert got["plain/extended"]["ceiling"] == pytest.approx((3 / 4 + 2 / 3) / 2)
    # the harness reading of the actual quote: 5.5 against the integer cell's own 0.5 fails
    assert got["plain/harness"]["actual"] == pytest.approx((2 / 4 + 0.0) / 2)
    assert got["plain/extended"]["p_pass"] == pytest.approx(3 / 4 * 2 / 3)
    # on (error + 1/4) the 0 cell is within reach of a small quote
    assert tied["best_offset"] == 2
    assert got["offset/harness"]["ceiling"] == pytest.approx((3 / 4 + 1.0) / 2)
    # an integer cell measured above 0 is granted on the plain reading; one at 0 is not
    zero = cell_row(_result("integer", 0.1, 0.0), {"integer_wide": 5.0, "ratings": 6.0})
    assert ceilings([wide, zero])["plain/harness"]["ceiling"] == pytest.approx(3 / 8)
    assert ceilings([wide, zero])["offset/harness"]["ceiling"] == pytest.approx(7 / 8)
    text = report([wide, tied], 10, 1)
    assert "| 0 | gaussian | 1000 | 3 | 1 | aq | 11.0 |" in text
    assert "3 of 4 | 2 of 4 |" in text


def test_a_twin_is_measured_as_the_harness_measures_and_from_its_seed() -> None:
    cell = {"index": 3, "shape": "gaussian", "n": 300, "m": 3, "epsilon": 1.0, "delta": None}
    a = measure(cell, "clamped", "aq", trials=2, seed=11)
    assert a == measure(cell, "clamped", "aq", trials=2, seed=11)
    assert 0.0 <= a <= 300
    values = {measure(cell, "ratings", "aq", trials=2, seed=s) for s in (11, 12, 13)}
    assert all(0.0 <= v <= 300 for v in values)


def test_map_ceilings_use_only_cells_holding_all_four_default_grid_shapes(
    tmp_path: Path,
) -> None:
    head = ",".join(
        ("shape", "n", "m", "epsilon", "delta", "method", "trials", "missed_mean",
         "missed_se", "missed_q90", "seconds_mean", "status")
    )  # fmt: skip
    lines = [head]
    # cell A: 10, 11, 12, 30 -> 3 of 4; cell B: 5 each -> 4 of 4; cell C lacks clamped
    for shape, value in zip(DEFAULT_GRID, (10, 11, 12, 30), strict=True):
        lines.append(f"{shape},1000,3,1.0,,aq,10,{value},1,1,0.1,ok")
    for shape in DEFAULT_GRID:
        lines.append(f"{shape},1000,3,0.1,,aq,10,5,1,1,0.1,ok")
    for shape in DEFAULT_GRID[:3]:
        lines.append(f"{shape},3000,3,1.0,,aq,10,5,1,1,0.1,ok")
    lines.append("integer,1000,3,1.0,,aq,10,0,0,0,0.1,ok")  # not a default-grid shape
    lines.append("clamped,3000,3,1.0,,aq,10,5,1,1,0.1,timeout")  # not measured
    (tmp_path / "map.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert map_ceilings([tmp_path]) == {"aq": (2, pytest.approx((3 / 4 + 1.0) / 2))}
    assert "| aq | 2 | 87.5 % |" in map_report([tmp_path])

"""The error map's grid path (``--path grid``): each shape measured as a release runs it."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from app.codec.grid import cell_of, grid_size
from app.datasets.service import default_granularity
from app.experiments import errormap
from app.experiments.errormap import LOWER, UPPER, grid_step, on_grid, run_cell, sample_shape
from app.experiments.runner import evenly_spaced_quantiles


def test_each_shape_runs_on_the_grid_a_release_of_it_would_use() -> None:
    # an integer column is declared integer (step 1); the others take the service's default
    assert grid_step("integer") == 1.0
    for shape in ("gaussian", "lognormal", "bimodal", "clamped"):
        assert grid_step(shape) == default_granularity(LOWER, UPPER)
    data = sample_shape("integer", np.random.default_rng(0), 3_000)
    g = on_grid(data, 1.0)
    assert g.hist.grid_points == grid_size(LOWER, UPPER, 1.0) == 201
    assert int(np.sum(g.hist.counts)) == data.size
    assert np.array_equal(g.snapped, data + 100)  # grid indices: integers are grid points


def test_on_a_grid_a_tied_value_is_itself_an_answer() -> None:
    """A median inside a heavy atom: the grid path answers the atom's value (0 missed
    points), and the missed points are counted on the data as snapped to the grid."""
    rng = np.random.default_rng(1)
    data = np.sort(np.concatenate([rng.integers(-3, 4, 2_000).astype(float), np.zeros(4_000)]))
    qs = evenly_spaced_quantiles(1)
    grid = on_grid(data, grid_step("integer"))
    on = [
        run_cell("jointexp_smooth", data, qs, epsilon=2.0, delta=1e-6,
                 rng=np.random.default_rng(seed), grid=grid)[0]
        for seed in range(10)
    ]  # fmt: skip
    assert max(on) == 0.0
    # off-grid data are counted as snapped, as the service snaps them (app.codec.grid)
    shifted = np.sort(np.concatenate([np.full(100, 0.4), np.full(101, 0.6), [-250.0, 99.7]]))
    for step in (1.0, 0.3, 1e-4):
        want = cell_of(np.clip(shifted, LOWER, UPPER), LOWER, UPPER, step)
        got = on_grid(np.clip(shifted, LOWER, UPPER), step)
        assert np.array_equal(got.snapped, np.sort(want))
        assert got.hist.grid_points == grid_size(LOWER, UPPER, step)


def test_on_distinct_values_the_grid_and_raw_paths_agree() -> None:
    data = sample_shape("gaussian", np.random.default_rng(2), 5_000)
    qs = evenly_spaced_quantiles(9)
    grid = on_grid(data, grid_step("gaussian"))
    on = [run_cell("aq", data, qs, epsilon=1.0, delta=1e-6, rng=np.random.default_rng(s),
                   grid=grid)[0] for s in range(20)]  # fmt: skip
    raw = [run_cell("aq", data, qs, epsilon=1.0, delta=1e-6, rng=np.random.default_rng(s))[0]
           for s in range(20)]  # fmt: skip
    assert 0.6 < (np.mean(on) + 1) / (np.mean(raw) + 1) < 1.6


def test_the_map_command_takes_the_grid_path(tmp_path: Path) -> None:
    argv = ["--out", str(tmp_path), "--ns", "2000", "--ms", "3", "--epsilons", "3"]
    argv += ["--shapes", "integer", "--trials", "3", "--workers", "1", "--no-plots"]
    argv += ["--methods", "jointexp,jointexp_smooth", "--path", "grid"]
    assert errormap.main(argv) == 0
    run = json.loads((tmp_path / "run.json").read_text(encoding="utf-8"))
    assert run["config"]["path"] == "grid"
    with (tmp_path / "map.csv").open(encoding="utf-8") as fh:
        rows = {r["method"]: float(r["missed_mean"]) for r in csv.DictReader(fh)}
    # ~40 tied values: the smoothed method lands on the right one, JointExp's utility is flat
    assert rows["jointexp_smooth"] < 5 < rows["jointexp"]

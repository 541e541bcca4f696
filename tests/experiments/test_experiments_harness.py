"""The experiment harness end to end (tiny --quick configurations) and its pieces."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from app.experiments.cli import main
from app.experiments.datasets import DATASETS, GOODREADS_ROWS, goodreads_columns
from app.experiments.runner import ACCURACY_FIELDS, SCALING_FIELDS, _projected_seconds, stream
from app.experiments.summary import (
    SCALING_SUMMARY_FIELDS,
    SUMMARY_FIELDS,
    evaluate_claims,
    mean_se,
    summarize_accuracy,
)


def _read(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or []), list(reader)


TINY = [
    "--quick",
    "--methods",
    "jointexp,indexp",
    "--datasets",
    "gaussian",
    "--epsilons",
    "1",
    "--ms",
    "9",
    "--trials",
    "10",
    "--scaling-ns",
    "1000,2000",
    "--scaling-ms",
    "9",
    "--no-progress",
    "--seed",
    "11",
]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    assert main([*TINY, "--out", str(out), "--workers", "1"]) == 0
    return out


def test_outputs_and_columns(tiny_run: Path) -> None:
    for name in (
        "results.csv",
        "summary.csv",
        "scaling.csv",
        "scaling_summary.csv",
        "claims.md",
        "run.json",
        "error_eps1.png",
        "time_vs_m.png",
        "time_vs_n.png",
    ):
        assert (tiny_run / name).stat().st_size > 0, name
    assert (tiny_run / "error_eps1.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    fields, rows = _read(tiny_run / "results.csv")
    assert fields == list(ACCURACY_FIELDS)
    assert len(rows) == 10 * 2  # trials x methods
    assert {r["method"] for r in rows} == {"jointexp", "indexp"}
    assert all(r["error"] == "" and r["m"] == "9" and r["n"] == "1000" for r in rows)
    for r in rows:
        assert math.isclose(float(r["missed_mean"]) * 9, float(r["missed_sum"]))
        assert float(r["seconds"]) > 0

    fields, summary = _read(tiny_run / "summary.csv")
    assert fields == list(SUMMARY_FIELDS)
    assert len(summary) == 2 and all(r["trials"] == "10" for r in summary)

    fields, scaling = _read(tiny_run / "scaling.csv")
    assert fields == list(SCALING_FIELDS)
    assert {(r["method"], r["n"]) for r in scaling} == {
        (meth, n) for meth in ("jointexp", "indexp") for n in ("1000", "2000")
    }
    fields, _ = _read(tiny_run / "scaling_summary.csv")
    assert fields == list(SCALING_SUMMARY_FIELDS)

    meta = json.loads((tiny_run / "run.json").read_text())
    assert meta["config"]["methods"] == ["jointexp", "indexp"]
    assert meta["failed_calls"] == 0


def test_jointexp_beats_indexp_at_m9_on_gaussian(tiny_run: Path) -> None:
    _, summary = _read(tiny_run / "summary.csv")
    err = {r["method"]: float(r["missed_mean"]) for r in summary}
    assert err["jointexp"] < err["indexp"], err


def test_seeded_runs_reproduce_across_worker_counts(tiny_run: Path, tmp_path: Path) -> None:
    """Same seed, two worker processes instead of one: identical results except timings."""
    assert main([*TINY, "--out", str(tmp_path), "--workers", "2", "--no-plots"]) == 0
    _, a = _read(tiny_run / "results.csv")
    _, b = _read(tmp_path / "results.csv")
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in a]
    assert strip == [{k: v for k, v in r.items() if k != "seconds"} for r in b]


def test_different_seeds_differ() -> None:
    a = stream(1, "accuracy", "gaussian", 1.0, 9, 0, "data").random(4)
    b = stream(2, "accuracy", "gaussian", 1.0, 9, 0, "data").random(4)
    c = stream(1, "accuracy", "gaussian", 1.0, 9, 1, "data").random(4)
    assert not np.array_equal(a, b) and not np.array_equal(a, c)
    assert np.array_equal(a, stream(1, "accuracy", "gaussian", 1.0, 9, 0, "data").random(4))


def test_unknown_method_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["--methods", "nosuchmethod", "--out", str(tmp_path)])


def test_datasets() -> None:
    cols = goodreads_columns()
    assert cols["average_rating"].shape == (GOODREADS_ROWS,)
    rng = np.random.Generator(np.random.PCG64(0))
    pages = DATASETS["pages"].sample(rng, 1000)
    assert pages.shape == (1000,) and pages.max() <= cols["num_pages"].max() / 100
    assert np.isin(np.rint(pages * 100), cols["num_pages"]).all()
    ratings = DATASETS["ratings"].sample(rng, GOODREADS_ROWS)  # without replacement: all rows
    assert np.array_equal(np.sort(ratings), np.sort(cols["average_rating"]))
    with pytest.raises(ValueError):
        DATASETS["ratings"].sample(rng, GOODREADS_ROWS + 1)
    g = DATASETS["gaussian"].sample(rng, 20_000)
    assert abs(g.std() - 5.0) < 0.2
    u = DATASETS["uniform"].sample(rng, 20_000)
    assert u.min() >= -5 and u.max() <= 5


def test_mean_se() -> None:
    m, se = mean_se([1.0, 2.0, 3.0, float("nan")])
    assert m == 2.0 and math.isclose(se, 1.0 / math.sqrt(3))
    assert math.isnan(mean_se([5.0])[1])


def test_projection_never_assumes_sublinear_growth() -> None:
    assert _projected_seconds([(1000, 1.0)], 10_000) == pytest.approx(10.0)
    # measured exponent 2 between 1e3 and 1e4 -> 100x for the next decade
    assert _projected_seconds([(1000, 0.01), (10_000, 1.0)], 100_000) == pytest.approx(100.0)
    # measured sub-linear (overhead-dominated) -> clipped to linear
    assert _projected_seconds([(1000, 1.0), (10_000, 1.1)], 100_000) == pytest.approx(11.0)


def test_claims_from_a_handmade_summary() -> None:
    rows = []
    errs = {"jointexp": 2.0, "indexp": 30.0, "smooth": 8.0, "aq": 1.0}
    for d in ("gaussian", "uniform"):
        for m in (3, 6, 9, 15, 19):
            for eps in (1.0, 0.1):
                for meth, e in errs.items():
                    for trial in range(2):
                        rows.append(
                            {
                                "dataset": d,
                                "method": meth,
                                "epsilon": eps,
                                "m": m,
                                "trial": trial,
                                "missed_mean": e * (m if meth == "indexp" else 1),
                                "missed_sum": e * m,
                                "seconds": {"jointexp": 3.0}.get(meth, 1.0),
                                "error": "",
                            }
                        )
    claims = {c.key: c for c in evaluate_claims(summarize_accuracy(rows))}
    assert claims["(a) gaussian"].holds is True
    # (b): best of the paper's competitors is smooth at 8 -> 4x; aq is reported separately
    assert claims["(b) gaussian, m=6"].holds is True
    assert claims["(b) gaussian, m=6"].ours.startswith("4±0× (best of paper's: smooth 8±0 ")
    assert "aq 1±0 (0.5×)" in claims["(b) gaussian, m=6"].ours
    assert claims["(b) gaussian, m=15"].holds is False  # 4x < 10/2
    # (c): indexp error 30*m vs 2 -> 135x at m=9
    assert claims["(c) uniform, m=9"].ours.startswith("135±0×")
    assert claims["(d) uniform, ε=0.1, m=3"].holds is False  # 4x < 5x
    assert claims["(e) time, Gaussian ε=1, m=19"].holds is True


def test_module_entry_point() -> None:
    """``python -m app.experiments`` reaches the same parser."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "app.experiments", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "dpquant experiments" in proc.stdout and "--quick" in proc.stdout

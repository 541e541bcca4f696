"""The planner (pure) and the error-map harness (issue 10)."""

from __future__ import annotations

import csv
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from app.experiments import errormap
from app.mechanisms import MECHANISMS
from app.planner import NEAR, eligible_methods, expected_error, recommend
from app.planner.model import load_models

QS9 = [j / 10 for j in range(1, 10)]


def test_the_planner_imports_no_database_or_web_code() -> None:
    code = (
        "import sys, app.planner; "
        "bad = [m for m in ('sqlalchemy', 'fastapi', 'psycopg', 'starlette', 'app.core.db', "
        "'app.releases', 'app.datasets') if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_registered_method_has_a_model() -> None:
    assert set(load_models()) == set(MECHANISMS)


@pytest.mark.parametrize("method", sorted(MECHANISMS))
def test_expected_error_is_sane(method: str) -> None:
    delta = 1e-6 if MECHANISMS[method].uses_delta else None
    errors = [expected_error(method, 10_000, QS9, eps, delta, "swap") for eps in (0.1, 1.0, 10.0)]
    assert all(e is not None for e in errors)
    means = [e[0] for e in errors if e is not None]
    for e in errors:
        assert e is not None and 0 <= e[0] <= e[1] <= 10_000
    assert means[0] >= means[2]  # more privacy, more error (0.1 vs 10)
    assert all(m <= 10_000 / 4 + 1e-9 for m in means)  # capped at a data-blind answer


def test_unknown_methods_have_no_expected_error() -> None:
    assert expected_error("not-a-method", 1000, QS9, 1.0, None, "swap") is None


def test_recommend_respects_delta_neighbours_and_cost() -> None:
    for n in (500, 10_000, 1_000_000):
        for eps in (0.05, 1.0, 8.0):
            pure = recommend(n, QS9, eps, None, "swap")
            assert not MECHANISMS[pure].uses_delta
            approx = recommend(n, QS9, eps, 1e-6, "add_remove")
            assert "add_remove" in MECHANISMS[approx].neighbors
            # auto never spends more than asked: a method whose cost exceeds (ε, δ) is skipped
            mech = MECHANISMS[approx]
            cost = mech.dp_cost(epsilon=eps, delta=1e-6 if mech.uses_delta else None)
            assert cost[0] <= eps * (1 + 1e-9) and cost[1] <= 1e-6 * (1 + 1e-9)
    assert recommend(None, QS9, 1.0, None, "add_remove") in eligible_methods(
        delta_given=False, neighbors="add_remove"
    )


def test_recommend_takes_the_fastest_of_the_methods_least_behind_in_every_open_regime() -> None:
    """auto's rule, recomputed from the committed models: a method's regret is the largest
    factor, over the regimes the public figures leave open, by which its expected error
    exceeds the lowest, beyond that regime's tolerance; the pick is the first in registry
    order (or the fastest) of those within NEAR of the lowest regret (JointExp's place is
    the smoothed one's)."""
    from app.planner import TOLERANCE, open_regimes, ties_forced
    from app.planner.model import OFFSET

    assert open_regimes(10_001, 10_000) == [("tied", 1.0)]
    assert [r for r, _ in open_regimes(10_000, 10_000)] == ["continuous", "tied", "clamped"]
    assert [t for _, t in open_regimes(10, None)] == [1.0, TOLERANCE, TOLERANCE]
    every = [m for m in eligible_methods(delta_given=False, neighbors="swap") if m != "jointexp"]
    picks = set()
    cases = ((500, None), (20_000, None), (10**6, None), (5_000, 201), (10**6, 2001))
    for n, grid in cases:
        for eps in (0.03, 1.0, 5.0):
            regimes = open_regimes(n, grid)
            errs = {
                m: [expected_error(m, n, QS9, eps, None, "swap", regime=r) for r, _ in regimes]
                for m in every
            }
            means = {m: [e[0] for e in row if e is not None] for m, row in errs.items()}
            assert all(len(row) == len(regimes) for row in means.values())
            best = [min(row[k] for row in means.values()) for k in range(len(regimes))]
            regret = {
                m: max(
                    max(1.0, (e + OFFSET) / (b + OFFSET) / tol)
                    for e, b, (_, tol) in zip(row, best, regimes, strict=True)
                )
                for m, row in means.items()
            }
            if ties_forced(n, grid):
                cont = {
                    m: expected_error(m, n, QS9, eps, None, "swap", regime="continuous")
                    for m in every
                }
                low = min(e[0] for e in cont.values() if e is not None)
                smooth = cont["jointexp_smooth"]
                assert smooth is not None
                if (smooth[0] + OFFSET) / (low + OFFSET) <= TOLERANCE:
                    assert recommend(n, QS9, eps, None, "swap", grid_points=grid) == (
                        "jointexp_smooth"
                    )
                    picks.add("jointexp_smooth")
                    continue
                rest = [m for m in every if m != "jointexp_smooth"]
                best = [min(means[m][k] for m in rest) for k in range(len(regimes))]
                regret = {
                    m: max(
                        max(1.0, (e + OFFSET) / (b + OFFSET) / tol)
                        for e, b, (_, tol) in zip(means[m], best, regimes, strict=True)
                    )
                    for m in rest
                }
            lowest = min(regret.values())
            near = [m for m in every if m in regret and regret[m] <= NEAR * lowest]
            got = recommend(n, QS9, eps, None, "swap", grid_points=grid)
            assert got == near[0], (n, eps, near)
            picks.add(got)
            for fastest in near:
                took = {m: (0.5 if m == fastest else 2.0) for m in [*every, "jointexp"]}
                assert (
                    recommend(n, QS9, eps, None, "swap", seconds=took.__getitem__, grid_points=grid)
                    == fastest
                )
    assert len(picks) >= 2  # the rule does not collapse onto one method


def fake_errors(
    monkeypatch: pytest.MonkeyPatch,
    errors: dict[str, float],
    tied: dict[str, float] | None = None,
) -> None:
    """The planner's expected error replaced by ``errors`` (the continuous model set) and
    ``tied`` (the tied one; default: the same figures), read at each call so a test may
    change them; methods not in them have no model."""
    import app.planner as planner

    def fake(method: str, n: int, *a: object, grid_points: int | None = None,
             regime: str | None = None, **k: object) -> planner.ErrorFigures | None:  # fmt: skip
        if regime is None:
            regime = "tied" if planner.ties_forced(n, grid_points) else "continuous"
        table = errors if regime == "continuous" or tied is None else tied
        return planner.ErrorFigures(*[table[method]] * 4) if method in table else None

    monkeypatch.setattr(planner, "expected_error", fake)


def test_auto_never_picks_a_method_past_the_time_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    import app.planner as planner

    errors = {"jointexp": 1.0, "aq": 3.0, "indexp": 9.0}
    fake_errors(monkeypatch, errors)
    took = {"jointexp": 100.0, "aq": 1.0, "indexp": 0.1}.__getitem__
    # no limit: the lowest error, however slow (the others are not within 10 %)
    assert planner.recommend(10_000, QS9, 1.0, None, "swap", seconds=took) == "jointexp"
    assert planner.recommend(10_000, QS9, 1.0, None, "swap", seconds=took,
                             time_limit_s=200.0) == "jointexp"  # fmt: skip
    assert planner.recommend(10_000, QS9, 1.0, None, "swap", seconds=took,
                             time_limit_s=50.0) == "aq"  # fmt: skip
    # every method past the limit: the fastest
    assert planner.recommend(10_000, QS9, 1.0, None, "swap", seconds=took,
                             time_limit_s=0.01) == "indexp"  # fmt: skip
    # ... and of equally fast ones the least behind, whatever the registry's order (AQ and
    # IndExp share a run-time bound: held-out cell #41 of seed 20261216 named IndExp at 14x
    # AQ's expected error)
    tied_bounds = {"jointexp": 100.0, "aq": 0.1, "indexp": 0.1}.__getitem__
    assert planner.recommend(10_000, QS9, 1.0, None, "swap", seconds=tied_bounds,
                             time_limit_s=0.01) == "aq"  # fmt: skip
    errors["aq"] = 20.0
    assert planner.recommend(10_000, QS9, 1.0, None, "swap", seconds=tied_bounds,
                             time_limit_s=0.01) == "indexp"  # fmt: skip


def test_a_method_that_fails_on_ties_loses_to_one_close_to_the_best_in_both_regimes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ties are private, so the planner cannot see them: the smoothed JointExp, close to the
    best in every regime, takes JointExp's place whatever the public figures; without it
    (time limit, ``only``), a method far behind on ties loses to one close to the best on
    both, beyond the ties' tolerance."""
    import app.planner as planner

    errors = {"jointexp": 1.0, "jointexp_smooth": 1.05, "aq": 5.0, "indexp": 9.0}
    tied = {"jointexp": 40.0, "jointexp_smooth": 1.0, "aq": 6.0, "indexp": 12.0}
    fake_errors(monkeypatch, errors, tied)
    took = {"jointexp": 1.0, "jointexp_smooth": 3.0, "aq": 0.1, "indexp": 0.1}.__getitem__
    pick = planner.recommend
    for n in (10, 10_000, 10**7, None):
        assert pick(n, QS9, 1.0, None, "swap", seconds=took) == "jointexp_smooth"
        assert pick(n, QS9, 1.0, None, "swap") == "jointexp_smooth"
        assert pick(n, QS9, 1.0, None, "swap", grid_points=5) == "jointexp_smooth"
    # the smoothed one over the time limit or not allowed: JointExp, 6.4x behind AQ on ties
    # (40.25 / 6.25, 2.15 beyond the tolerance of 3), beats AQ, 4.2x behind on distinct values
    assert pick(10_000, QS9, 1.0, None, "swap", seconds=took, time_limit_s=2.0) == "jointexp"
    assert pick(10_000, QS9, 1.0, None, "swap", only={"jointexp", "aq"}) == "jointexp"
    # ... but not where ties are forced (the tied models alone): AQ
    assert pick(10_000, QS9, 1.0, None, "swap", only={"jointexp", "aq"}, grid_points=5) == "aq"
    # far enough behind on ties, JointExp loses to AQ even where ties are not forced
    tied["jointexp"] = 100.0
    assert pick(10_000, QS9, 1.0, None, "swap", only={"jointexp", "aq"}) == "aq"
    # the smoothed one takes JointExp's place whatever the models say (atoms heavier than
    # the gaps, e.g. ratings, flatten JointExp's utility: no tied model foresees that)
    tied["jointexp"] = 0.5
    assert pick(10_000, QS9, 1.0, None, "swap") == "jointexp_smooth"
    assert pick(10_000, QS9, 1.0, None, "swap", grid_points=5) == "jointexp_smooth"
    # a method that leads in both regimes is taken
    errors["aq"] = tied["aq"] = 0.5
    assert pick(10_000, QS9, 1.0, None, "swap", seconds=took) == "aq"


def test_forced_ties_keep_the_smoothed_jointexp_unless_it_trails_far_on_distinct_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """More records than grid points: jointexp_smooth, unless the continuous models put it
    more than TOLERANCE behind the best (many quantiles at small ε); then the tied models
    alone rank the others."""
    import app.planner as planner

    errors = {"jointexp": 10.0, "jointexp_smooth": 10.0, "aq": 3.5, "indexp": 9.0}
    tied = {"jointexp": 50.0, "jointexp_smooth": 1.0, "aq": 4.0, "indexp": 2.0}
    fake_errors(monkeypatch, errors, tied)
    pick = planner.recommend
    # 10.25 / 3.75 = 2.7 <= 3: the smoothed one keeps its place
    assert pick(10_000, QS9, 0.1, None, "swap", grid_points=201) == "jointexp_smooth"
    errors["aq"] = 2.0  # 10.25 / 2.25 = 4.6 > 3: out; the tied models pick IndExp
    assert pick(10_000, QS9, 0.1, None, "swap", grid_points=201) == "indexp"
    # not forced: the regret over all three sets takes AQ (1 on distinct values, 4.25 / 1.25
    # / 3 = 1.13 on ties; the smoothed one 4.6 on distinct values)
    assert pick(10_000, QS9, 0.1, None, "swap") == "aq"


def test_forced_ties_are_quoted_from_the_tied_models() -> None:
    """More records than grid points (public figures) force ties: the quote then comes from
    the model set fitted on tied data; otherwise from the continuous one."""
    import app.planner as planner

    assert set(load_models("tied")) == set(MECHANISMS)
    for method in MECHANISMS:
        delta = 1e-6 if MECHANISMS[method].uses_delta else None
        for n, grid in ((10_001, 10_000), (10_000, 10_000), (10**6, None), (5_000, 201)):
            regime = "tied" if planner.ties_forced(n, grid) else "continuous"
            got = expected_error(method, n, QS9, 0.5, delta, "swap", grid_points=grid)
            want = expected_error(method, n, QS9, 0.5, delta, "swap", regime=regime)
            assert got == want is not None
    # the two sets differ where ties matter: JointExp on ties misses far more
    cont = expected_error("jointexp", 10**5, QS9, 1.0, None, "swap", regime="continuous")
    tied = expected_error("jointexp", 10**5, QS9, 1.0, None, "swap", regime="tied")
    assert cont is not None and tied is not None and tied[0] > 3 * cont[0]
    assert planner.ties_forced(6, 5) and not planner.ties_forced(5, 5)
    assert not planner.ties_forced(10**9, None)


def test_error_map_picks_up_every_registered_method(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    late = dataclasses.replace(MECHANISMS["indexp"], name="late_method")
    monkeypatch.setitem(MECHANISMS, "late_method", late)
    argv = ["--out", str(tmp_path), "--ns", "300", "--ms", "1,3", "--epsilons", "1"]
    argv += ["--shapes", "gaussian,integer", "--trials", "2", "--workers", "1"]
    assert errormap.main(argv) == 0
    with (tmp_path / "map.csv").open(encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["method"] for r in rows} == set(MECHANISMS)
    assert len(rows) == 2 * 2 * len(MECHANISMS)
    assert all(r["status"] == "ok" and int(r["trials"]) == 2 for r in rows)
    with (tmp_path / "best.csv").open(encoding="utf-8") as fh:
        best = list(csv.DictReader(fh))
    assert len(best) == 4 and all(float(b["margin"]) >= 1 for b in best)
    assert (tmp_path / "best_method.png").stat().st_size > 0
    assert (tmp_path / "margin.png").stat().st_size > 0
    with (tmp_path / "trials.csv").open(encoding="utf-8") as fh:
        assert len(list(csv.DictReader(fh))) == 2 * len(rows)


def test_error_map_is_reachable_from_the_experiments_command(tmp_path: Path) -> None:
    from app.experiments.cli import main

    argv = ["map", "--out", str(tmp_path), "--ns", "200", "--ms", "1", "--epsilons", "1"]
    argv += ["--shapes", "clamped", "--trials", "1", "--workers", "1", "--no-plots"]
    argv += ["--methods", "jointexp,aq"]
    assert main(argv) == 0
    assert (tmp_path / "map.csv").exists()


def test_held_out_validation_of_the_committed_maps() -> None:
    """The models' error on map levels they were not fitted on (app.planner.fit --cv): every
    fitted method of both sets is validated, and the exponential-mechanism methods'
    held-out error stays where docs/experiments.md §10.3 and §10.5 report it (a worse form
    or a broken fit fails here)."""
    from app.planner.fit import (
        CLAMPED_MAPS,
        CLAMPED_SHAPES,
        DEFAULT_MAPS,
        FIT_SHAPES,
        TIED_MAPS,
        TIED_SHAPES,
        _paths,
        cross_validate,
    )

    report = cross_validate(_paths(DEFAULT_MAPS), FIT_SHAPES)
    assert set(load_models()) <= set(report)
    for method in ("jointexp", "jointexp_smooth", "aq", "indexp", "appindexp"):
        rms, within, cells = report[method]
        assert cells > 2000 and 0.0 < rms < 0.35 and within > 0.8, (method, report[method])
    # the tied set: the exponential-mechanism methods but the smoothed one follow the rank
    # form on ties too; the smoothed one (0 missed points once its jitter lands in the right
    # atom, hundreds when not) and the clamped set (an atom holding the top 16 %) are
    # validated and reported, not held to a bound (docs/experiments.md §10.5, §10.7)
    tied = cross_validate(_paths(TIED_MAPS), TIED_SHAPES)
    assert set(load_models("tied")) <= set(tied)
    for method in ("jointexp", "indexp", "appindexp"):
        rms, within, cells = tied[method]
        assert cells > 1000 and 0.0 < rms < 0.5 and within > 0.7, (method, tied[method])
    # AQ on ties at n = 100-220 (errormap_small_grid) nears the no-information level, which
    # the soft cap at n/4 underrates: 0.53 and 68 % there (§10.9); held to that
    rms, within, cells = tied["aq"]
    assert cells > 1000 and 0.0 < rms < 0.55 and within > 0.65, tied["aq"]
    clamped = cross_validate(_paths(CLAMPED_MAPS), CLAMPED_SHAPES)
    assert set(load_models("clamped")) <= set(clamped)
    assert all(0.0 < rms < 2.0 for rms, _, _ in clamped.values())


def test_the_90_percent_bound_is_widened_by_the_held_out_error() -> None:
    """bound90 / mean combines the trials' spread with 1.28 sigma, sigma the larger of the
    in-sample and the held-out RMS log error (the committed coefficients carry both)."""
    import dataclasses
    import math

    from app.planner.model import Z90, load_models

    committed = load_models()["jointexp"]
    assert committed.cv_sigma > 0 and committed.sigma > 0  # the coefficients carry both
    spread_only = dataclasses.replace(committed, sigma=0.0, cv_sigma=0.0)
    for low, high in ((0.2, 0.4), (0.4, 0.2)):  # held-out above, then below, in-sample
        model = dataclasses.replace(committed, sigma=low, cv_sigma=high)
        in_sample = dataclasses.replace(model, cv_sigma=0.0)
        for m in (1, 9, 99):
            spread = math.log(spread_only.ratio90(m))
            expected = math.exp(math.hypot(spread, Z90 * max(low, high)))
            assert math.isclose(model.ratio90(m), expected, rel_tol=1e-12)
            assert model.ratio90(m) >= in_sample.ratio90(m)
            assert (model.ratio90(m) > in_sample.ratio90(m)) == (high > low)


def test_the_rank_form_bends_where_the_gaps_between_target_ranks_close() -> None:
    """The hinge softplus(k - log g), g = ε·n/(m + 1): zero for wide gaps, growing like
    -log g as they close; the value form has no hinge and keeps log n."""
    import math

    from app.planner.model import features

    wide = features(1e7, 9, 10.0, "rank", 2.0)
    assert wide[-1] < 1e-6  # g = 10^7: no crowding
    narrow = features(1e3, 99, 0.01, "rank", 2.0)
    g = 0.01 * 1e3 / 100
    assert math.isclose(narrow[-1], 2.0 - math.log(g), rel_tol=0.05)
    assert math.isclose(narrow[4], math.log(g))
    value = features(1e3, 99, 0.01, "value")
    assert math.isclose(value[4], math.log(1e3)) and math.isclose(
        value[5], math.log(0.01) * value[4]
    )


def test_the_fit_keeps_the_knee_with_the_lowest_held_out_error(tmp_path: Path) -> None:
    """On a synthetic map whose errors follow a rank-form law with knee 3, the fit recovers
    that knee and the law (and the noise-adding methods take the value form)."""
    import math

    import numpy as np

    from app.planner import fit as fit_mod
    from app.planner.model import OFFSET, MethodModel, features

    truth = np.array([0.5, 0.8, 0.05, -1.0, -0.1, 1.5])
    rows, trials = [], []
    for n in (300, 1000, 10_000, 100_000):
        for m in (1, 3, 9, 49, 99):
            for eps in (0.03, 0.3, 1.0, 10.0):
                raw = math.exp(float(truth @ features(n, m, eps, "rank", 3.0))) - OFFSET
                if raw < 0.05:  # below the offset the law is not a mean error
                    continue
                mean = (raw**-2 + (n / 4) ** -2) ** -0.5  # the model's soft cap
                for method in ("jointexp", "smooth"):
                    rows.append(
                        {
                            "shape": "gaussian",
                            "n": n,
                            "m": m,
                            "epsilon": eps,
                            "method": method,
                            "missed_mean": mean,
                            "status": "ok",
                        }
                    )
                    trials += [{**rows[-1], "missed_mean": mean * f} for f in (0.8, 1.2)]
    for name, table in (("map.csv", rows), ("trials.csv", trials)):
        with (tmp_path / name).open("w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(table[0]))
            writer.writeheader()
            writer.writerows(table)
    out = fit_mod.fit(tmp_path)["methods"]
    je, smooth = out["jointexp"], out["smooth"]  # type: ignore[index]
    assert je["form"] == "rank" and je["knee"] == 3.0
    assert smooth["form"] == "value"
    model = MethodModel(tuple(je["beta"]), (1.0,), (1.0,), 1, "rank", 3.0)
    raw = math.exp(float(truth @ features(5_000, 19, 0.5, "rank", 3.0))) - OFFSET
    assert math.isclose(model.mean(5_000, 19, 0.5), (raw**-2 + 1250**-2) ** -0.5, rel_tol=1e-3)
    assert je["cv_rms_log_residual"] < 0.01


def test_run_times_a_caller_cannot_tell_apart_leave_the_pick_to_the_registry_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Methods within NEAR of each other: the faster is taken only when its bound is a
    SPEED_STEP_S step below the other's; within one step the registry's order decides (where
    every error model saturates, 0.02 s against 0.05 s must not pick the less accurate)."""
    import app.planner as planner

    fake_errors(monkeypatch, {"indexp": 30.0, "aq": 30.0})
    pick = planner.recommend
    close = {"indexp": 0.05, "aq": 0.02}.__getitem__
    assert pick(300, QS9, 0.01, None, "swap", seconds=close) == "indexp"
    apart = {"indexp": 0.05 + planner.SPEED_STEP_S, "aq": 0.02}.__getitem__
    assert pick(300, QS9, 0.01, None, "swap", seconds=apart) == "aq"
    slower_aq = {"indexp": 0.02, "aq": 0.05 + planner.SPEED_STEP_S}.__getitem__
    assert pick(300, QS9, 0.01, None, "swap", seconds=slower_aq) == "indexp"

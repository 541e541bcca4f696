"""Error bars in the data's units (app.planner.intervals, turned into values by the worker's
``intervals_of`` as a release stores them): their shape, and their coverage where the
planner's bound is calibrated."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.codec.grid import cell_of, grid_size, grid_values
from app.experiments.errormap import LOWER, UPPER, sample_shape
from app.experiments.runner import evenly_spaced_quantiles, stream
from app.mechanisms import MECHANISMS
from app.mechanisms.histogram import GridHistogram
from app.planner import expected_error
from app.planner.intervals import TAIL_STEEPENING, interval_cells_many
from app.releases.runner import group_intervals_of, intervals_of


def estimate_intervals(
    quantiles: list[float],
    estimates: list[float],
    *,
    lower: float,
    upper: float,
    granularity: float,
    bound90: float,
    size: int,
) -> list[tuple[float, float]] | None:
    """The (low, high) values a release with these figures stores."""
    params = {
        "quantiles": quantiles, "lower": lower, "upper": upper, "granularity": granularity,
        "expected_error": [{"quantile": q, "bound90": bound90, "size": size} for q in quantiles]
        or [{"bound90": bound90, "size": size}],
    }  # fmt: skip
    bars = intervals_of(params, estimates)
    return None if bars is None else [(bar["low"], bar["high"]) for bar in bars]


def on_grid(x: float, lower: float, step: float) -> bool:
    k = (x - lower) / step
    return abs(k - round(k)) < 1e-6


@st.composite
def releases(draw: st.DrawFn) -> tuple[list[float], list[float], float, float, float]:
    m = draw(st.integers(1, 30))
    levels = sorted(set(draw(st.lists(st.integers(1, 999), min_size=m, max_size=m))))
    quantiles = [k / 1000 for k in levels]
    lower = draw(st.sampled_from([-100.0, 0.0, 3.5]))
    step = draw(st.sampled_from([0.001, 0.25, 1.0]))
    points = draw(st.integers(10, 5000))
    upper = float(grid_values([points], lower, step)[0])  # the grid's own top point, exactly
    cells = draw(st.lists(st.integers(0, points), min_size=len(quantiles), max_size=len(quantiles)))
    # released values are the codec's grid points, in any order (independent picks may cross)
    estimates = grid_values(cells, lower, step).tolist()
    return quantiles, estimates, lower, upper, step


@settings(max_examples=300, deadline=None)
@given(releases(), st.floats(0, 5000), st.integers(1, 10**7))
def test_each_interval_holds_its_estimate_on_grid_points_within_the_bounds(
    release: tuple[list[float], list[float], float, float, float], bound: float, size: int
) -> None:
    quantiles, estimates, lower, upper, step = release
    bars = estimate_intervals(
        quantiles, estimates, lower=lower, upper=upper, granularity=step, bound90=bound, size=size
    )
    assert bars is not None and len(bars) == len(estimates)
    for (lo, hi), x in zip(bars, estimates, strict=True):
        assert lower <= lo <= x <= hi <= upper
        assert on_grid(lo, lower, step) and on_grid(hi, lower, step)
    # a larger bound never gives a narrower interval
    wider = estimate_intervals(
        quantiles, estimates, lower=lower, upper=upper, granularity=step,
        bound90=2 * bound + 1, size=size,
    )  # fmt: skip
    assert wider is not None
    for (lo, hi), (wlo, whi) in zip(bars, wider, strict=True):
        assert wlo <= lo and hi <= whi


def test_on_a_linear_quantile_function_the_interval_spans_the_levels_q_pm_b_plus_1_over_n() -> None:
    # data uniform on [0, 100]: the quantile function is 100 q; estimates exactly on it. At
    # most b points between estimate and truth: the truth is at most b + 1 points away
    quantiles = [0.2, 0.4, 0.6, 0.8]
    estimates = [20.0, 40.0, 60.0, 80.0]
    bars = estimate_intervals(
        quantiles, estimates, lower=0.0, upper=100.0, granularity=0.01, bound90=49, size=1000
    )
    assert bars is not None
    # half-width 0.05 in level = 5 in value inside; beyond the outermost estimates the slope
    # is doubled (10 in value) and the curve stops at the bounds
    assert bars[1] == pytest.approx((35.0, 45.0)) and bars[2] == pytest.approx((55.0, 65.0))
    assert bars[0] == pytest.approx((20.0 - 0.05 * 100 * TAIL_STEEPENING, 25.0))
    assert bars[3] == pytest.approx((75.0, 80.0 + 0.05 * 100 * TAIL_STEEPENING))
    near_edge = estimate_intervals(
        [0.01, 0.5], [1.0, 50.0], lower=0.0, upper=100.0, granularity=0.01, bound90=49, size=1000
    )
    assert near_edge is not None and near_edge[0][0] == 0.0  # stopped at the lower bound


def test_one_estimate_runs_the_curve_from_the_lower_bound_through_it_to_the_upper() -> None:
    bars = estimate_intervals(
        [0.5], [50.0], lower=0.0, upper=100.0, granularity=0.1, bound90=19, size=1000
    )
    assert bars == [(pytest.approx(48.0), pytest.approx(52.0))]


def reference_cells(
    quantiles: list[float], cells: list[int], steps: int, bound90: float, size: int
) -> list[tuple[int, int]] | None:
    """The rule stated point by point (module docstring), each curve value from np.interp."""
    if size < 1 or not math.isfinite(bound90) or bound90 < 0:
        return None
    levels = np.asarray(quantiles)
    values = np.sort(np.asarray(cells, dtype=np.float64))
    half = min((bound90 + 1.0) / size, 1.0)

    def curve(p: float) -> float:
        if levels.size == 1:
            return float(np.interp(p, [0.0, levels[0], 1.0], [0.0, values[0], float(steps)]))
        if p < levels[0]:
            slope = TAIL_STEEPENING * (values[1] - values[0]) / (levels[1] - levels[0])
            v = float(values[0] - slope * (levels[0] - p))
        elif p > levels[-1]:
            slope = TAIL_STEEPENING * (values[-1] - values[-2]) / (levels[-1] - levels[-2])
            v = float(values[-1] + slope * (p - levels[-1]))
        else:
            v = float(np.interp(p, levels, values))
        return min(max(v, 0.0), float(steps))

    out = []
    for q, k in zip(quantiles, cells, strict=True):
        lo = math.floor(curve(max(q - half, 0.0)) + 1e-9)
        hi = math.ceil(curve(min(q + half, 1.0)) - 1e-9)
        out.append((max(0, min(lo, k)), min(steps, max(hi, k))))
    return out


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_the_batched_bars_are_the_point_by_point_rule_exactly(data: st.DataObject) -> None:
    """A grouped release's groups go through :func:`interval_cells_many` in array
    operations; each group's bars are the rule applied point by point, bit for bit (levels
    on and off the knots, bounds and sizes that allow no bars, one level and many)."""
    m = data.draw(st.integers(1, 25))
    levels = sorted(set(data.draw(st.lists(st.integers(1, 999), min_size=m, max_size=m))))
    quantiles = [k / 1000 for k in levels]
    steps = data.draw(st.integers(1, 5000))
    groups = data.draw(st.integers(1, 8))
    cells = [
        data.draw(st.lists(st.integers(0, steps), min_size=len(levels), max_size=len(levels)))
        for _ in range(groups)
    ]
    bound = st.one_of(
        st.integers(0, 2000).map(float), st.floats(-5, 1e4), st.sampled_from([math.inf, -1.0])
    )
    bounds = [data.draw(st.one_of(bound, st.just(math.nan))) for _ in range(groups)]
    sizes = [data.draw(st.one_of(st.sampled_from([0, 1, 1000]), st.integers(1, 10**6)))
             for _ in range(groups)]  # fmt: skip
    got = interval_cells_many(quantiles, cells, steps=steps, bound90=bounds, size=sizes)
    assert got is not None and len(got) == groups
    for row, bound, size, bars in zip(cells, bounds, sizes, got, strict=True):
        assert bars == reference_cells(quantiles, row, steps, bound, size)


def test_no_interval_without_the_figures_it_needs() -> None:
    good = {"lower": 0.0, "upper": 1.0, "granularity": 0.1, "bound90": 1.0, "size": 10}
    assert estimate_intervals([0.5], [0.5], **good) is not None
    assert estimate_intervals([0.5], [0.5], **(good | {"size": 0})) is None
    assert estimate_intervals([0.5], [0.5], **(good | {"bound90": math.nan})) is None
    assert estimate_intervals([0.5], [0.5, 0.6], **good) is None
    assert estimate_intervals([], [], **good) is None
    assert estimate_intervals([0.5, 0.5], [0.5, 0.6], **good) is None


def coverage(shape: str, n: int, m: int, eps: float, trials: int, scale: float = 1.0) -> float:
    """Share of (trial, quantile) pairs whose interval holds the data's true quantile, for
    JointExp on the grid as a release runs it, with the planner's bound times ``scale``."""
    qs = evenly_spaced_quantiles(m)
    err = expected_error("jointexp", n, list(qs), eps, None, "swap")
    assert err is not None
    bound = err.bound90_each
    step = 1e-3
    hits: list[bool] = []
    for t in range(trials):
        data = sample_shape(shape, stream(2026, "cover", t), n)
        cells, counts = np.unique(cell_of(data, LOWER, UPPER, step), return_counts=True)
        hist = GridHistogram(cells, counts, grid_size(LOWER, UPPER, step))
        picked = MECHANISMS["jointexp"].run_grid(
            hist, qs, epsilon=eps, delta=None, neighbors="swap", rng=stream(2026, "run", t)
        )
        est = grid_values(picked, LOWER, step)
        values = grid_values(np.repeat(cells, counts), LOWER, step)
        bars = estimate_intervals(
            list(qs), [float(e) for e in est], lower=LOWER, upper=UPPER, granularity=step,
            bound90=scale * bound, size=n,
        )  # fmt: skip
        assert bars is not None
        truth = values[np.maximum(np.ceil(qs * n).astype(int), 1) - 1]
        hits.extend(lo <= x <= hi for (lo, hi), x in zip(bars, truth, strict=True))
    return float(np.mean(hits))


def test_where_the_bound_is_calibrated_the_intervals_cover_about_90_percent() -> None:
    # Gaussian data, a cell inside the planner's map (docs/experiments.md has the per-shape
    # table); 30 trials x 9 quantiles
    covered = coverage("gaussian", 20_000, 9, 1.0, trials=30)
    assert 0.8 <= covered <= 0.99
    # the check can fail: a bound ten times too small covers far less
    assert coverage("gaussian", 20_000, 9, 1.0, trials=30, scale=0.1) < 0.6


@pytest.mark.parametrize("regime", ["continuous", "tied", "clamped"])
def test_one_estimates_bound_is_never_below_the_bound_on_the_mean(regime: str) -> None:
    # A mean over m quantiles varies less than any one of them: the bars' bound (one
    # estimate's) is bound90 at m = 1 and never narrower than it.
    for method in ("jointexp", "jointexp_smooth", "aq", "indexp"):
        for m in (1, 5, 49):
            qs = list(evenly_spaced_quantiles(m))
            err = expected_error(method, 20_000, qs, 1.0, None, "swap", regime=regime)
            assert err is not None
            each = err.bound90_each
            assert each >= err[1] >= err[0]
            if m == 1:
                assert each == pytest.approx(err[1])
            elif regime == "continuous":  # (a sparse map's fitted spread may rise with m)
                assert each > err[1], (method, m)
            assert each <= 20_000


def test_bars_span_one_estimates_bound_and_fall_back_to_the_mean_bound() -> None:
    # a release stored with bound90_each spans it; one stored before it existed, bound90
    quantiles, estimates = [0.25, 0.5, 0.75], [25.0, 50.0, 75.0]
    base = {"quantiles": quantiles, "lower": 0.0, "upper": 100.0, "granularity": 0.01}
    rows = [{"quantile": q, "bound90": 9.0, "size": 1000} for q in quantiles]
    legacy = intervals_of(base | {"expected_error": rows}, estimates)
    each = intervals_of(
        base | {"expected_error": [r | {"bound90_each": 49.0} for r in rows]}, estimates
    )
    wide = intervals_of(base | {"expected_error": [r | {"bound90": 49.0} for r in rows]}, estimates)
    assert legacy is not None and each is not None
    assert each == wide != legacy
    # the linear case: (49 + 1) / 1000 of the levels either side is 5 in value (10 beyond
    # the outermost estimates, where the curve steepens twofold)
    assert [(b["low"], b["high"]) for b in each] == [(15.0, 30.0), (45.0, 55.0), (70.0, 85.0)]


def test_the_atom_bound_is_the_clamped_models_and_never_narrower() -> None:
    for method in ("jointexp", "jointexp_smooth", "aq", "indexp"):
        for n, m, eps in ((2_845, 57, 0.74), (20_000, 5, 1.0), (300, 1, 0.1)):
            qs = list(evenly_spaced_quantiles(m))
            err = expected_error(method, n, qs, eps, None, "swap")
            clamped = expected_error(method, n, qs, eps, None, "swap", regime="clamped")
            assert err is not None and clamped is not None
            assert err.bound90_each_atom == max(err.bound90_each, clamped.bound90_each)
            assert err.bound90_each <= err.bound90_each_atom <= n
    # many quantiles near an atom: the clamped model's bound is the wider, by far for
    # JointExp (whose utility goes flat on the atom), a little for the smoothed JointExp;
    # for AQ, whose bounds' cells are stretched and spread, no wider
    qs = list(evenly_spaced_quantiles(57))
    plain = expected_error("jointexp", 2_845, qs, 0.74, None, "swap")
    smooth = expected_error("jointexp_smooth", 2_845, qs, 0.74, None, "swap")
    aq = expected_error("aq", 2_845, qs, 0.74, None, "swap")
    assert plain is not None and plain.bound90_each_atom > 5 * plain.bound90_each
    assert smooth is not None and smooth.bound90_each < smooth.bound90_each_atom
    assert aq is not None and aq.bound90_each_atom < 1.5 * aq.bound90_each


def test_bars_span_the_atom_bound_only_where_an_estimate_lies_at_a_public_bound() -> None:
    quantiles = [0.25, 0.5, 0.75]
    base = {"quantiles": quantiles, "lower": 0.0, "upper": 100.0, "granularity": 0.01}
    rows = [{"quantile": q, "bound90": 9.0, "bound90_each": 19.0, "size": 1000}
            for q in quantiles]  # fmt: skip
    atom = base | {"expected_error": [r | {"bound90_each_atom": 99.0} for r in rows]}
    plain = base | {"expected_error": rows}
    wide = base | {"expected_error": [r | {"bound90_each": 99.0} for r in rows]}
    inside, top, bottom = [25.0, 50.0, 75.0], [25.0, 50.0, 100.0], [0.0, 50.0, 75.0]
    assert intervals_of(atom, inside) == intervals_of(plain, inside) != intervals_of(wide, inside)
    for estimates in (top, bottom):
        assert intervals_of(atom, estimates) == intervals_of(wide, estimates)
        # stored before the atom bound existed: one estimate's bound, as before
        assert intervals_of(plain, estimates) != intervals_of(wide, estimates)
    # grouped: per group, by its own estimates
    grouped = base | {
        "group_by": "region", "group_keys": ["a", "b"],
        "group_error": {"by_key": [{"key": k, "size": 1000, "mean": 5.0, "bound90": 9.0,
                                    "bound90_each": 19.0, "bound90_each_atom": 99.0}
                                   for k in ("a", "b")]},
    }  # fmt: skip
    bars = group_intervals_of(grouped, inside + top)
    assert bars is not None
    assert bars[0] == intervals_of(plain, inside) and bars[1] == intervals_of(wide, top)

"""Smooth: O(n log n) smooth sensitivity vs the O(n^2) definition, noise law, parameters."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from scipy import stats

from app.mechanisms import MECHANISMS, MechanismInputError, PrivacyNotion
from app.mechanisms.smooth import quantile_index, smooth, smooth_sensitivity
from tests.mechanisms.exact import assert_rejects, dense_edges


def brute_smooth_sensitivity(edges: np.ndarray, j: int, t: float) -> float:
    """Paper Lemma 13 literally: max_k e^{-tk} max_{l=0..k+1} (x_{j+l} - x_{j+l-k-1}), O(n^2)."""
    n = edges.size - 2
    a, b = float(edges[0]), float(edges[-1])

    def x(i: int) -> float:
        return a if i < 1 else b if i > n else float(edges[i])

    return max(
        math.exp(-t * k) * max(x(j + i) - x(j + i - k - 1) for i in range(k + 2))
        for k in range(n + 1)
    )


def random_edges(rng: np.random.Generator, n: int) -> np.ndarray:
    raw = rng.normal(size=n) * rng.choice([0.2, 1.0, 4.0])
    raw = np.round(raw, int(rng.integers(0, 3)))  # rounding makes ties
    return dense_edges(raw, -2.0, 2.5)


def test_fast_matches_brute_force_on_random_inputs() -> None:
    rng = np.random.default_rng(2024)
    checked = 0
    for _ in range(1500):
        n = int(rng.integers(1, 40))
        edges = random_edges(rng, n)
        j = int(rng.integers(1, n + 1))
        t = float(rng.choice([1e-4, 1e-2, 0.1, 0.7, 3.0, 60.0]))
        want = brute_smooth_sensitivity(edges, j, t)
        assert smooth_sensitivity(edges, j, t) == pytest.approx(want, rel=1e-12, abs=0.0)
        checked += 1
    assert checked == 1500


@pytest.mark.parametrize(
    "data",
    [
        [1.0] * 9,  # all tied
        [-5.0, -5.0, 7.0, 7.0, 7.0],  # everything clamped to the bounds
        [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 2.0],
        [0.5],
    ],
)
def test_fast_matches_brute_force_on_degenerate_inputs(data: list[float]) -> None:
    edges = dense_edges(data, -2.0, 2.5)
    n = edges.size - 2
    for j in range(1, n + 1):
        for t in (1e-3, 0.3, 5.0):
            assert smooth_sensitivity(edges, j, t) == pytest.approx(
                brute_smooth_sensitivity(edges, j, t), rel=1e-12
            )


@pytest.mark.parametrize(("t", "bound"), [(0.02, 1e3), (0.05, 10.0), (0.3, 1e6), (2.0, 1e200)])
def test_fast_matches_brute_force_where_the_window_prunes(t: float, bound: float) -> None:
    # n = 400 with a wide domain: the exact pruning window is much shorter than n (and for
    # t = 2, bound = 1e200 the linear-domain table would underflow: log-space scan).
    rng = np.random.default_rng(int(t * 100))
    x = np.round(rng.standard_cauchy(size=400), 2)
    edges = dense_edges(x, -bound, bound)
    for j in (1, 37, 200, 399, 400):
        assert smooth_sensitivity(edges, j, t) == pytest.approx(
            brute_smooth_sensitivity(edges, j, t), rel=1e-12
        )


def test_large_input_is_subquadratic() -> None:
    # The O(n^2) definition would need ~10^11 operations here.
    x = np.random.default_rng(0).normal(size=300_000)
    edges = dense_edges(x, -10.0, 10.0)
    smooth_sensitivity(edges, 150_000, 1e-3)  # compile / warm
    t0 = time.perf_counter()
    s = smooth_sensitivity(edges, 150_000, 1e-4)
    assert time.perf_counter() - t0 < 2.0
    assert s >= 20.0 * math.exp(-1e-4 * 300_000)  # at least the whole-range term


@pytest.mark.parametrize(
    ("q", "n", "j"),
    [
        (0.3, 10, 3),
        (0.5, 5, 3),
        (0.5, 4, 2),
        (0.01, 10, 1),
        (0.999, 10, 10),
        (0.1, 1000, 100),
        (0.7, 10, 7),
        (0.29, 100, 29),
    ],
)
def test_quantile_index_is_exact(q: float, n: int, j: int) -> None:
    assert quantile_index(q, n) == j


def test_noise_is_laplace_scaled_to_smooth_sensitivity() -> None:
    rng = np.random.default_rng(5)
    data = rng.uniform(0.0, 1.0, size=60)
    eps, delta, q = 2.0, 1e-3, 0.4
    lower, upper = -1e4, 1e4  # far bounds: clamping never bites
    edges = dense_edges(data, lower, upper)
    j = quantile_index(q, 60)
    t = eps / (2.0 * math.log(2.0 / delta))
    scale = smooth_sensitivity(edges, j, t) / (eps / 2.0)
    draws = np.array(
        [
            smooth(data, [q], epsilon=eps, lower=lower, upper=upper, rng=rng, delta=delta)[0]
            for _ in range(4000)
        ]
    )
    assert stats.kstest(draws, stats.laplace(loc=edges[j], scale=scale).cdf).pvalue > 1e-3
    # Negative control: a 1.3x wider (or narrower) scale is detected.
    assert stats.kstest(draws, stats.laplace(loc=edges[j], scale=1.3 * scale).cdf).pvalue < 1e-4
    assert stats.kstest(draws, stats.laplace(loc=edges[j], scale=scale / 1.3).cdf).pvalue < 1e-4


def test_per_quantile_budget_is_epsilon_over_m() -> None:
    data = np.linspace(0.0, 10.0, 101)
    qs = [0.2, 0.5, 0.8]
    eps, delta, m = 1.5, 1e-5, 3
    edges = dense_edges(data, -50.0, 60.0)
    got = smooth(
        data, qs, epsilon=eps, lower=-50.0, upper=60.0, rng=np.random.default_rng(9), delta=delta
    )
    replay = np.random.default_rng(9)
    t = (eps / m) / (2.0 * math.log(2.0 * m / delta))
    want = []
    for q in qs:
        j = quantile_index(q, 101)
        want.append(edges[j] + smooth_sensitivity(edges, j, t) * replay.laplace() / (eps / m / 2.0))
    np.testing.assert_allclose(got, np.sort(np.clip(want, -50.0, 60.0)), rtol=1e-12)


def test_outputs_sorted_in_bounds_and_reasonable_on_gaussian_data() -> None:
    rng = np.random.default_rng(3)
    errs = []
    for _ in range(20):
        x = rng.normal(size=1000)
        est = smooth(x, [0.5], epsilon=1.0, lower=-100.0, upper=100.0, rng=rng, delta=1e-6)
        errs.append(abs(int(np.searchsorted(np.sort(x), est[0])) - 500))
    assert np.mean(errs) < 80  # paper Fig. 3: tens of missed points at m = 1
    out = smooth(
        rng.normal(size=500),
        np.linspace(0.05, 0.95, 19),
        epsilon=0.5,
        lower=-3.0,
        upper=3.0,
        rng=rng,
        delta=1e-6,
    )
    assert np.all(np.diff(out) >= 0) and out.min() >= -3.0 and out.max() <= 3.0


def test_add_remove_is_refused() -> None:
    with pytest.raises(MechanismInputError) as info:
        smooth(
            [1.0, 2.0], [0.5], epsilon=1.0, lower=0.0, upper=3.0, neighbors="add_remove", delta=1e-6
        )
    assert info.value.parameter == "neighbors"


def test_registry_entry() -> None:
    mech = MECHANISMS["smooth"]
    assert mech.notion is PrivacyNotion.APPROX_DP
    assert mech.requires_delta and mech.method_params == ("delta",)
    assert mech.dp_cost(epsilon=1.0, delta=1e-6) == (1.0, 1e-6)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"delta": None}, "delta"),
        ({"delta": 0.0}, "delta"),
        ({"delta": 2.0}, "delta"),
        ({"delta": 1e-6, "epsilon": 0.0}, "epsilon"),
        ({"delta": 1e-6, "quantiles": [0.5, 0.2]}, "quantiles"),
        ({"delta": 1e-6, "data": []}, "data"),
    ],
)
def test_validation_names_parameter(kwargs: dict[str, object], param: str) -> None:
    assert_rejects(smooth, kwargs, param)

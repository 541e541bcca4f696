"""AppIndExp: the Dong–Durfee–Rogers composition bound, the epsilon search, and the sampler."""

from __future__ import annotations

import collections
import itertools
import math

import numpy as np
import pytest
from scipy import stats

from app.mechanisms import MECHANISMS, MechanismInputError, PrivacyNotion
from app.mechanisms.appindexp import (
    appindexp,
    ddr_candidate_ts,
    ddr_delta,
    ddr_log_delta_at,
    per_quantile_epsilon,
)
from tests.mechanisms.exact import dense_edges

# --------------------------------------------------------------------- references


def ddr_delta_direct(eps_g: float, eps0: float, m: int, t: float) -> float:
    """Lemma 12's sum for one t, evaluated literally in plain floats (small m only)."""
    p = (math.exp(-t) - math.exp(-eps0)) / (1.0 - math.exp(-eps0))
    return sum(
        math.comb(m, i)
        * p ** (m - i)
        * (1 - p) ** i
        * max(math.exp(m * t - i * eps0) - math.exp(eps_g), 0.0)
        for i in range(m + 1)
    )


def kov_delta(eps_g: float, eps0: float, m: int) -> float:
    """Exact optimal m-fold composition of eps0-DP mechanisms (Kairouz–Oh–Viswanath 2015).

    The worst case is randomized response: privacy loss +eps0 w.p. e^eps0/(1+e^eps0), -eps0
    otherwise; delta = E_P[(1 - e^{eps_g - L})_+].
    """
    total = 0.0
    for k in range(m + 1):  # k mechanisms with loss -eps0
        loss = (m - 2 * k) * eps0
        if loss > eps_g:
            total += math.comb(m, k) * math.exp((m - k) * eps0) * (1.0 - math.exp(eps_g - loss))
    return total / (1.0 + math.exp(eps0)) ** m


def em_probs(edges: np.ndarray, q: float, eps0: float, sens: float) -> np.ndarray:
    n = edges.size - 2
    w = np.diff(edges)
    with np.errstate(divide="ignore"):
        logp = np.log(w) - eps0 / (2 * sens) * np.abs(np.arange(n + 1) - q * n)
    p = np.exp(logp - logp.max())
    return p / p.sum()


def chi_square_p(observed: dict[object, int], expected: dict[object, float], draws: int) -> float:
    """Chi-square p-value; cells with expected count < 5 are pooled into one."""
    obs, exp_, pool_o, pool_e = [], [], 0, 0.0
    for key, pr in expected.items():
        e = pr * draws
        if e < 5:
            pool_o += observed.get(key, 0)
            pool_e += e
        else:
            obs.append(observed.get(key, 0))
            exp_.append(e)
    stray = sum(v for k, v in observed.items() if k not in expected)
    pool_o += stray
    if pool_e > 0 or pool_o > 0:
        obs.append(pool_o)
        exp_.append(max(pool_e, 1e-9))
    return float(stats.chisquare(obs, exp_).pvalue)


# --------------------------------------------------------------------- the composition bound


@pytest.mark.parametrize(("m", "eps0"), [(1, 1.3), (2, 0.6), (3, 0.5), (5, 0.3), (10, 0.2)])
def test_log_space_sum_matches_direct_evaluation(m: int, eps0: float) -> None:
    eps_g = 1.0
    for t in np.linspace(0.0, eps0, 41):
        direct = ddr_delta_direct(eps_g, eps0, m, float(t))
        logv = ddr_log_delta_at(eps_g, eps0, m, float(t))
        got = 0.0 if logv == -math.inf else math.exp(logv)
        assert got == pytest.approx(direct, rel=1e-10, abs=1e-300)


@pytest.mark.parametrize(("m", "eps0"), [(2, 0.7), (5, 0.35), (9, 0.17), (29, 0.09), (99, 0.05)])
def test_candidate_points_attain_the_max_over_t(m: int, eps0: float) -> None:
    eps_g = 1.0
    dense = max(ddr_log_delta_at(eps_g, eps0, m, float(t)) for t in np.linspace(0, eps0, 2001))
    cands = max(
        ddr_log_delta_at(eps_g, eps0, m, float(t)) for t in ddr_candidate_ts(eps_g, eps0, m)
    )
    assert math.exp(cands) >= math.exp(dense) * (1 - 1e-9)
    assert ddr_delta(eps_g, eps0, m) == pytest.approx(math.exp(cands))


@pytest.mark.parametrize("m", [2, 5, 9, 29])
def test_sandwiched_by_optimal_dp_composition(m: int) -> None:
    # eps0-BR implies eps0-DP, so DDR <= KOV(eps0); eps0-DP implies 2 eps0-BR, so
    # KOV(eps0) <= DDR(2 eps0).
    eps_g = 1.0
    for eps0 in np.linspace(eps_g / m, 3 * eps_g / math.sqrt(m), 9):
        ddr = ddr_delta(eps_g, float(eps0), m)
        assert ddr <= kov_delta(eps_g, float(eps0), m) * (1 + 1e-9) + 1e-300
        assert kov_delta(eps_g, float(eps0), m) <= ddr_delta(eps_g, 2 * float(eps0), m) * (1 + 1e-9)


@pytest.mark.parametrize("m", [1, 3, 9, 99])
def test_delta_is_monotone_in_eps0(m: int) -> None:
    grid = np.linspace(1.0 / m, 2.0, 200)
    vals = [ddr_delta(1.0, float(e), m) for e in grid]
    assert all(b >= a * (1 - 1e-12) for a, b in itertools.pairwise(vals))
    assert vals[0] == 0.0  # basic composition


@pytest.mark.parametrize("m", [1, 2, 9, 29, 99])
@pytest.mark.parametrize(("eps", "delta"), [(1.0, 1e-6), (0.1, 1e-6), (5.0, 1e-9)])
def test_per_quantile_epsilon_is_the_largest_valid(m: int, eps: float, delta: float) -> None:
    e0 = per_quantile_epsilon(eps, delta, m)
    assert e0 >= eps / m
    assert ddr_delta(eps, e0, m) <= delta
    assert ddr_delta(eps, e0 + 1e-4, m) > delta  # within the required 1e-4


def test_per_quantile_epsilon_known_ordering_and_cache() -> None:
    per_quantile_epsilon.cache_clear()
    e9 = per_quantile_epsilon(1.0, 1e-6, 9)
    assert per_quantile_epsilon(1.0, 1e-6, 9) == e9
    assert per_quantile_epsilon.cache_info().hits >= 1
    # Better than basic composition, worse than the whole budget; more delta buys more eps0.
    assert 1.0 / 9 < e9 < 1.0
    assert per_quantile_epsilon(1.0, 1e-3, 9) > e9
    assert per_quantile_epsilon(1.0, 1e-6, 1) > 1.0  # one BR mechanism with delta > 0


# --------------------------------------------------------------------- the mechanism


TINY = [0.3, 1.7, 1.7, 4.0, -2.0, 9.0]  # a tie and two points clamped to [0, 5]


@pytest.mark.parametrize("neighbors", ["swap", "add_remove"])
def test_sorted_pair_distribution_is_exact(neighbors: str) -> None:
    eps, delta, qs = 2.0, 1e-4, [0.3, 0.7]
    edges = dense_edges(TINY, 0.0, 5.0)
    e0 = per_quantile_epsilon(eps, delta, 2)

    def pair_probs(scale: float) -> dict[tuple[int, ...], float]:
        sens = [1.0 if neighbors == "swap" else max(q, 1 - q) for q in qs]
        p1, p2 = (em_probs(edges, q, scale * e0, s) for q, s in zip(qs, sens, strict=True))
        out: dict[tuple[int, ...], float] = collections.defaultdict(float)
        for i, j in itertools.product(range(edges.size - 1), repeat=2):
            out[tuple(sorted((i, j)))] += p1[i] * p2[j]
        return {k: v for k, v in out.items() if v > 0}

    draws = 20_000
    rng = np.random.default_rng(7)
    counts: collections.Counter[tuple[int, ...]] = collections.Counter()
    for _ in range(draws):
        o = appindexp(
            TINY, qs, epsilon=eps, lower=0.0, upper=5.0, neighbors=neighbors, rng=rng, delta=delta
        )
        counts[tuple(int(i) for i in np.searchsorted(edges, o, side="right") - 1)] += 1
    assert chi_square_p(counts, pair_probs(1.0), draws) > 1e-4
    assert chi_square_p(counts, pair_probs(1.5), draws) < 1e-4  # negative control


def test_accuracy_beats_indexp_on_gaussian_data() -> None:
    rng = np.random.default_rng(11)
    qs = np.linspace(0.1, 0.9, 9)
    errs: dict[str, list[float]] = {"appindexp": [], "indexp": []}
    for _ in range(20):
        x = rng.normal(size=1000)
        xs = np.sort(x)
        true_rank = np.ceil(qs * 1000)
        for name in errs:
            kw = {"delta": 1e-6} if name == "appindexp" else {}
            est = MECHANISMS[name](x, qs, epsilon=1.0, lower=-100.0, upper=100.0, rng=rng, **kw)
            errs[name].append(float(np.mean(np.abs(np.searchsorted(xs, est) - true_rank))))
    assert np.mean(errs["appindexp"]) < np.mean(errs["indexp"])
    assert np.mean(errs["appindexp"]) < 30


def test_registry_entry() -> None:
    mech = MECHANISMS["appindexp"]
    assert mech.notion is PrivacyNotion.APPROX_DP
    assert mech.requires_delta and mech.method_params == ("delta",)
    assert mech.dp_cost(epsilon=1.0, delta=1e-6) == (1.0, 1e-6)
    out = mech.run([1.0, 2.0, 3.0], [0.5], epsilon=1.0, delta=1e-6, lower=0.0, upper=4.0)
    assert out.shape == (1,) and 0.0 <= out[0] <= 4.0


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"delta": None}, "delta"),
        ({"delta": 0.0}, "delta"),
        ({"delta": 1.0}, "delta"),
        ({"delta": math.nan}, "delta"),
        ({"delta": 1e-6, "epsilon": -1.0}, "epsilon"),
        ({"delta": 1e-6, "neighbors": "bogus"}, "neighbors"),
        ({"delta": 1e-6, "lower": 5.0}, "upper"),
    ],
)
def test_validation_names_parameter(kwargs: dict[str, object], param: str) -> None:
    args: dict[str, object] = {"epsilon": 1.0, "lower": 0.0, "upper": 4.0}
    args.update(kwargs)
    with pytest.raises(MechanismInputError) as info:
        appindexp([1.0, 2.0], [0.5], **args)  # type: ignore[arg-type]
    assert info.value.parameter == param

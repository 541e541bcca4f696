"""AQ: exact single-quantile law, exact node weights, and the privacy ratio of the whole release."""

from __future__ import annotations

import collections
import itertools
import math
import time
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

import app.mechanisms.aq as aqmod
from app.mechanisms import MECHANISMS, PrivacyNotion
from app.mechanisms.aq import aq, recursion_depth
from app.mechanisms.exponential import (
    fill_weights,
    fill_weights_log,
    min_top,
    node_pick,
    node_weights,
    run_parameter,
    split_target,
)
from app.mechanisms.sampling import inverse_cdf_pick
from app.mechanisms.smooth import support_of_dense
from tests.mechanisms.exact import assert_rejects, dense_edges

# --------------------------------------------------------------------- helpers


def clamp_sort(data: list[float], lower: float, upper: float) -> list[float]:
    return sorted(min(max(float(x), lower), upper) for x in data)


def em_interval_probs(edges: np.ndarray, q: float, c: float) -> np.ndarray:
    """Single-quantile EM over the n + 1 intervals: P(i) ∝ w_i exp(-c |i - q n|)."""
    n = edges.size - 2
    with np.errstate(divide="ignore"):
        logp = np.log(np.diff(edges)) - c * np.abs(np.arange(n + 1) - q * n)
    p = np.exp(logp - logp.max())
    return p / p.sum()


def chi_square_p(counts: collections.Counter[int], probs: np.ndarray, draws: int) -> float:
    obs, exp_, pool_o, pool_e = [], [], 0, 0.0
    for i, pr in enumerate(probs):
        if pr * draws < 5:
            pool_o += counts.get(i, 0)
            pool_e += pr * draws
        else:
            obs.append(counts.get(i, 0))
            exp_.append(pr * draws)
    pool_o += sum(v for k, v in counts.items() if k >= probs.size or probs[k] == 0)
    if pool_e > 0 or pool_o > 0:
        obs.append(pool_o)
        exp_.append(max(pool_e, 1e-9))
    return float(stats.chisquare(obs, exp_).pvalue)


def node_nodes_per_level(m: int) -> list[int]:
    """Independent simulation of the splitting rule: number of nodes on each level."""
    sizes, out = [m], []
    while sizes:
        out.append(len(sizes))
        nxt = []
        for r in sizes:
            left = (r - 1) // 2
            right = r - 1 - left
            nxt += [s for s in (left, right) if s > 0]
        sizes = nxt
    return out


def node_c(eps_l: float, rel: float, relation: str, nodes_on_level: int) -> float:
    """A node's exponential-mechanism parameter, from the calibration in aq.py's docstring:
    ``eps_L / (2 Delta)`` under add/remove, ``eps_L / 2`` on a single-node swap level,
    ``eps_L / (4 Delta)`` on a swap level with several nodes (``Delta = max(q', 1 - q')``)."""
    sens = max(rel, 1 - rel)
    if relation == "add_remove":
        return eps_l / (2 * sens)
    if nodes_on_level == 1:
        return eps_l / 2
    return eps_l / (4 * sens)


def aq_log_density(
    data: list[float],
    qs: list[float],
    out: list[float],
    *,
    epsilon: float,
    lower: float,
    upper: float,
    neighbors: str,
    scale: float = 1.0,
    reach: float = 0.0,
) -> float:
    """log density of AQ's output vector ``out`` on ``data`` (product of node EM densities).

    Written from the algorithm's definition: node EM density at v is
    exp(-c |#{y <= v} - q' k|) / sum_j width_j exp(-c |j - q' k|) on [left, right], the
    root's domain ``[lower - reach, upper + reach]`` (``data`` already spread there).
    ``scale`` multiplies every node's c (negative control: an over-spending calibration).
    """
    m = len(qs)
    per_level = node_nodes_per_level(m)
    eps_l = epsilon / len(per_level)
    total = 0.0
    a, b = lower - reach, upper + reach
    level = [(clamp_sort(data, a, b), a, b, 0, m, 0.0, 1.0)]
    depth = 0
    while level:
        nxt = []
        for pts, left, right, qa, qb, qlo, qhi in level:
            mid = qa + (qb - qa - 1) // 2
            rel = (qs[mid] - qlo) / (qhi - qlo)
            c = node_c(eps_l, rel, neighbors, per_level[depth]) * scale
            k = len(pts)
            target = rel * k
            ends = [left, *pts, right]
            z = sum((ends[j + 1] - ends[j]) * math.exp(-c * abs(j - target)) for j in range(k + 1))
            v = out[mid]
            below = sum(1 for y in pts if y <= v)
            total += -c * abs(below - target) - math.log(z)
            if qa < mid:
                nxt.append(([y for y in pts if y <= v], left, v, qa, mid, qlo, qs[mid]))
            if mid + 1 < qb:
                nxt.append(([y for y in pts if y > v], v, right, mid + 1, qb, qs[mid], qhi))
        level = nxt
        depth += 1
    return total


# --------------------------------------------------------------------- structure


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 29, 99, 100, 1000])
def test_recursion_depth(m: int) -> None:
    assert recursion_depth(m) == len(node_nodes_per_level(m))
    assert recursion_depth(m) == math.floor(math.log2(m)) + 1
    assert recursion_depth(m) <= math.ceil(math.log2(m)) + 1  # never more than KSS's count


# --------------------------------------------------------------------- exact law for m = 1

TINY = [0.3, 1.7, 1.7, 4.0, -2.0, 9.0, 2.2]  # a tie and two points clamped to [0, 5]


def spread_single_law(q: float, c: float, *, stretched: bool = True) -> np.ndarray:
    """The law of AQ's clipped output with m = 1 on TINY in [0, 5], by class: ``[at 0,
    (0, 0.3), (0.3, 1.7), (1.7, 2.2), (2.2, 4), (4, 5), at 5]``.

    From the definition: TINY's one record below 0 sits at ``-u1 REACH`` and its one record
    above 5 at ``5 + u2 REACH`` (u1, u2 uniform, independent), the exponential mechanism
    runs on ``[-REACH, 5 + REACH]``, and every output beyond a bound is clipped to it; the law
    is the average over (u1, u2), by the midpoint rule on a 64 x 64 grid (the integrand is
    smooth in u). ``stretched=False``: the mechanism without the reach (the law before it:
    the records at a bound in zero-width intervals, never output).
    """
    inner, n = [0.3, 1.7, 2.2, 4.0], 7
    ranks = [1, 2, 4, 5, 6]  # records <= any output in (0, .3), (.3, 1.7), ..., (4, 5)
    widths = np.diff([0.0, *inner, 5.0])
    t = q * n
    mid = np.exp(-c * np.abs(np.array(ranks) - t)) * widths
    if not stretched:
        return np.concatenate(([0.0], mid, [0.0])) / mid.sum()
    law = np.zeros(7)
    us = (np.arange(64) + 0.5) / 64
    for u1 in us:
        for u2 in us:
            at0 = REACH * (1 - u1) * math.exp(-c * t) + REACH * u1 * math.exp(-c * abs(1 - t))
            at5 = REACH * u2 * math.exp(-c * abs(6 - t)) + REACH * (1 - u2) * math.exp(-c * (n - t))
            row = np.concatenate(([at0], mid, [at5]))
            law += row / row.sum()
    return law / law.sum()


@pytest.mark.parametrize(("neighbors", "q"), [("swap", 0.5), ("swap", 0.2), ("add_remove", 0.2)])
def test_single_quantile_is_the_exponential_mechanism(neighbors: str, q: float) -> None:
    """m = 1 on raw values: the exponential mechanism on the domain reaching 2^-7 of the
    range beyond each bound, the records at a bound spread over that reach, the output
    clipped; the law without the reach and the law at 1.5 epsilon are rejected."""
    eps, lower, upper = 2.0, 0.0, 5.0
    sens = 1.0 if neighbors == "swap" else max(q, 1 - q)
    draws = 20_000
    rng = np.random.default_rng(17)
    counts: collections.Counter[int] = collections.Counter()
    cuts = [0.3, 1.7, 2.2, 4.0]
    for _ in range(draws):
        o = aq(TINY, [q], epsilon=eps, lower=lower, upper=upper, neighbors=neighbors, rng=rng)
        v = float(o[0])
        counts[0 if v == lower else 6 if v == upper else 1 + int(np.searchsorted(cuts, v))] += 1
    c = eps / (2 * sens)
    assert chi_square_p(counts, spread_single_law(q, c), draws) > 1e-4
    assert chi_square_p(counts, spread_single_law(q, 1.5 * c), draws) < 1e-4
    # without the reach no output lies on a bound (probability 0); here 80-340 of 20,000 do
    assert spread_single_law(q, c, stretched=False)[[0, 6]].sum() == 0.0
    assert counts[0] + counts[6] >= 20


def test_log_domain_fallback_on_fully_tied_data() -> None:
    # 4000 tied points: every positive-width interval is 2000 ranks from the target, so the
    # linear-domain weights underflow and the exact log-domain path must take over.
    data = [0.5] * 4000
    rng = np.random.default_rng(3)
    draws = 4000
    low = sum(
        aq(data, [0.5], epsilon=1.0, lower=0.0, upper=2.0, rng=rng)[0] < 0.5 for _ in range(draws)
    )
    # Equal rank distance on both sides: P(left) = 0.5 / (0.5 + 1.5).
    assert stats.binomtest(low, draws, 0.25).pvalue > 1e-4
    assert stats.binomtest(low, draws, 0.5).pvalue < 1e-4


# --------------------------------------------------------------------- exact node weights


def exact_weights(
    edges: np.ndarray,
    cum: np.ndarray,
    lo: int,
    hi: int,
    left: float,
    right: float,
    target: float,
    c: float,
) -> np.ndarray:
    """Node weights straight from the definition: width_j exp(-c |pos_j - target|)."""
    ends = np.concatenate(([left], edges[lo:hi], [right]))
    pos = cum[lo - 1 : hi] - cum[lo - 1]
    with np.errstate(divide="ignore"):
        s = np.log(np.diff(ends)) - c * np.abs(pos - target)
    return np.exp(s - s.max())


def test_fast_weights_are_exact_to_2_pow_minus_50() -> None:
    rng = np.random.default_rng(99)
    for _ in range(400):
        n = int(rng.integers(1, 3000))
        x = np.round(rng.normal(size=n) * rng.choice([0.01, 1.0, 100.0]), int(rng.integers(0, 4)))
        edges, cum = support_of_dense(dense_edges(x, -5.0, 5.0))  # distinct values, counts
        d = edges.size - 2
        lo = int(rng.integers(1, d + 1))
        hi = int(rng.integers(lo, d + 2))
        left = float(edges[lo - 1]) - float(rng.uniform(0, 0.5))
        right = float(edges[hi]) + float(rng.uniform(0, 0.5)) if hi <= d else 5.0
        k = hi - lo
        target = float(rng.uniform(0, 1)) * float(cum[hi - 1] - cum[lo - 1])
        c = float(10 ** rng.uniform(-5, 1.5))
        buf = np.empty(d + 1)
        ti = math.floor(target)
        fl = target - ti  # exact for a double
        j0, cnt, top = fill_weights(edges, cum, lo, hi, left, right, ti, fl, c, buf)
        want = exact_weights(edges, cum, lo, hi, left, right, target, c)
        if top < min_top(c):
            j0, cnt, top = fill_weights_log(edges, cum, lo, hi, left, right, ti, fl, c, buf)
        got = np.zeros(k + 1)
        got[j0 : j0 + cnt] = buf[:cnt] / top
        assert np.max(np.abs(got - want)) <= 2.0**-50
        outside = np.ones(k + 1, dtype=bool)
        outside[j0 : j0 + cnt] = False
        assert np.all(want[outside] <= 2.0**-90)


class _Words:
    """A stand-in generator whose raw words are given (then drawn from a seeded one)."""

    def __init__(self, *words: int) -> None:
        self.words = list(words)
        self.rest = np.random.default_rng(5).bit_generator
        self.bit_generator = self

    def random_raw(self) -> int:
        return self.words.pop(0) if self.words else int(self.rest.random_raw())


def _exact_pick(weights: np.ndarray, word: int) -> int | None:
    """The index every uniform in [word, word + 1) 2^-64 picks in exact rational arithmetic
    (C_{i-1} <= U S < C_i over the doubles given), or None where that interval straddles a
    cut point."""
    prefix = list(itertools.accumulate(Fraction(float(w)) for w in weights))
    total = prefix[-1]
    lo, hi = Fraction(word, 2**64) * total, Fraction(word + 1, 2**64) * total
    before = Fraction(0)
    for i, cut in enumerate(prefix):
        if lo < cut:
            return i if before <= lo and hi <= cut else None
        before = cut
    return None


def test_node_pick_is_the_exact_share_of_its_weights() -> None:
    """node_pick picks the interval the exact rational inverse CDF of node_weights' doubles
    picks, at random words and at words next to every cut point (where the doubles' rounding
    could decide), and never a zero width."""
    rng = np.random.default_rng(12)
    # Ties, clamped points at both ends, and more than 64 intervals.
    raw = np.concatenate(([-9.0, -9.0], np.round(rng.uniform(0, 3, size=300), 1), [9.0]))
    edges, cum = support_of_dense(dense_edges(raw, 0.0, 3.0))
    n = edges.size - 2
    buf = np.empty(n + 1)
    checked = 0
    for c in (1e-4, 0.05, 2.0, 40.0):
        target = 0.37 * int(cum[-1])
        ti, fl = split_target(0.37, int(cum[-1]))
        j0, cnt = node_weights(edges, cum, 1, n + 1, 0.0, 3.0, ti, fl, run_parameter(c), buf)
        weights = buf[:cnt].copy()
        want_law = exact_weights(edges, cum, 1, n + 1, 0.0, 3.0, target, c)
        assert np.all(want_law[:j0] <= 2.0**-90) and np.all(want_law[j0 + cnt :] <= 2.0**-90)
        cuts = np.cumsum([Fraction(float(w)) for w in weights])
        total = cuts[-1]
        words = [int(x) for x in rng.integers(0, 2**64, size=200, dtype=np.uint64)]
        for cut in cuts[:-1]:  # the words on both sides of each cut point
            at = int(cut / total * 2**64)  # the total itself where only zeros follow
            words += [min(max(x, 0), 2**64 - 1) for x in (at - 1, at, at + 1)]
        for word in words:
            got = node_pick(edges, cum, 1, n + 1, 0.0, 3.0, 0.37, c, _Words(word), buf)
            assert weights[got - j0] > 0.0
            want = _exact_pick(weights, word)
            if want is not None:
                assert got == j0 + want
                checked += 1
    assert checked > 800


def test_node_pick_gives_a_tiny_weight_its_share() -> None:
    """An interval whose weight is ~1e-18 of the total (below one 53-bit uniform's
    resolution, which gave it probability 0) is picked by the words that land in it."""
    edges = np.array([-1.0, 0.0, 1e-18, 1.0])  # middle interval 1e-18 wide
    cum = np.array([0, 1, 2, 3], dtype=np.int64)
    buf = np.empty(3)
    j0, cnt = node_weights(edges, cum, 1, 3, -1.0, 1.0, 1, 0.5, run_parameter(1e-9), buf)
    weights = buf[:cnt].copy()
    assert cnt == 3 and 0.0 < weights[1] < 1e-17 * weights.sum()
    cut = Fraction(float(weights[0])) / sum(Fraction(float(w)) for w in weights)
    word = int(cut * 2**64) + 1  # U just above the first cut: inside the tiny interval
    assert _exact_pick(weights, word) == 1
    got = node_pick(edges, cum, 1, 3, -1.0, 1.0, 0.75, 1e-9, _Words(word), buf)  # 1.5 of 2
    assert got == j0 + 1
    # The 53-bit inverse CDF it replaces cannot reach it from any uniform near that point.
    u53 = (word >> 11) * 2.0**-53
    assert inverse_cdf_pick(weights, u53) != 1
    assert inverse_cdf_pick(weights, u53 + 2.0**-53) != 1


# --------------------------------------------------------------------- privacy of the release


#: 2^-7 of the range [0, 5]: how far AQ's raw-value domain reaches beyond each bound.
REACH = 5.0 / 128.0


def spread(v: float, u: float) -> float:
    """A value clamped to [0, 5] as AQ places it: at a bound, ``u * REACH`` beyond it."""
    return -u * REACH if v <= 0.0 else 5.0 + u * REACH if v >= 5.0 else v


def neighbours(data: list[float], rng: np.random.Generator, relation: str) -> list[list[float]]:
    """Neighbours of ``data`` (inside (0, 5)); a new value clamped to a bound is spread
    beyond it by a uniform share of REACH (the ratio bound holds for every spread)."""
    out = []
    for _ in range(12):
        i = int(rng.integers(len(data)))
        new = spread(float(rng.uniform(-1.0, 6.0)), float(rng.random()))
        if relation == "swap":
            out.append([*data[:i], new, *data[i + 1 :]])
        else:
            out.append([*data[:i], *data[i + 1 :]])
            out.append([*data, new])
    return out


def worst_log_ratio(relation: str, qs: list[float], scale: float) -> float:
    """Largest |log f_X(o) - log f_X'(o)| over random small datasets, neighbours and outputs."""
    eps, lower, upper = 1.0, 0.0, 5.0
    rng = np.random.default_rng(31)
    kw = {
        "epsilon": eps, "lower": lower, "upper": upper, "neighbors": relation, "scale": scale,
        "reach": REACH,
    }  # fmt: skip
    worst = -math.inf
    for _ in range(25):
        data = list(rng.uniform(lower, upper, size=int(rng.integers(2, 7))))
        outs = [
            list(aq(data, qs, epsilon=eps, lower=lower, upper=upper, neighbors=relation, rng=rng))
            for _ in range(4)
        ] + [sorted(rng.uniform(lower, upper, size=len(qs))) for _ in range(4)]
        for other in neighbours(data, rng, relation):
            for o in outs:
                gap = aq_log_density(data, qs, o, **kw) - aq_log_density(other, qs, o, **kw)
                worst = max(worst, abs(gap))
    return worst


@pytest.mark.parametrize("relation", ["swap", "add_remove"])
@pytest.mark.parametrize("qs", [[0.5, 0.9], [0.1, 0.2, 0.9], [0.2, 0.4, 0.6, 0.8]])
def test_release_density_ratio_is_bounded_by_e_epsilon(relation: str, qs: list[float]) -> None:
    assert worst_log_ratio(relation, qs, 1.0) <= 1.0 + 1e-9


@pytest.mark.parametrize("relation", ["swap", "add_remove"])
def test_density_ratio_check_detects_overspending(relation: str) -> None:
    # Negative control: the same search catches a calibration that spends 3 epsilon.
    assert worst_log_ratio(relation, [0.1, 0.2, 0.9], 3.0) > 1.0


def node_log_density(
    pts: list[float], left: float, right: float, c: float, rel: float, v: float
) -> float:
    ends = [left, *pts, right]
    target = rel * len(pts)
    z = sum((ends[j + 1] - ends[j]) * math.exp(-c * abs(j - target)) for j in range(len(pts) + 1))
    return -c * abs(sum(1 for y in pts if y <= v) - target) - math.log(z)


def sup_log_ratio(
    p: list[float],
    r: list[float],
    node: tuple[float, float, int, int, float, float, int],
    qs: list[float],
    calib: tuple[list[int], float, str],
    grid: int = 6,
) -> tuple[float, float]:
    """(sup, -inf) of the log density ratio of X vs X' over all outputs of this subtree.

    A node's log-ratio is piecewise constant between the points of both datasets; a leaf is
    evaluated once per piece, an inner node on a grid inside each piece (its children depend
    on v through their domains). Children outputs are separate coordinates, so their sups add.
    """
    left, right, qa, qb, q_lo, q_hi, depth = node
    per_level, eps_l, relation = calib
    mid = qa + (qb - qa - 1) // 2
    rel = (qs[mid] - q_lo) / (q_hi - q_lo)
    c = node_c(eps_l, rel, relation, per_level[depth])
    cuts = sorted({left, right, *p, *r})
    inner = qa < mid or mid + 1 < qb
    fracs = np.linspace(0.001, 0.999, grid) if inner else [0.5]
    best = (-math.inf, -math.inf)
    for b0, b1 in itertools.pairwise(cuts):
        for f in fracs:
            v = b0 + (b1 - b0) * float(f)
            g = node_log_density(p, left, right, c, rel, v) - node_log_density(
                r, left, right, c, rel, v
            )
            up, down = g, -g
            if qa < mid:
                a, b = sup_log_ratio(
                    [y for y in p if y <= v],
                    [y for y in r if y <= v],
                    (left, v, qa, mid, q_lo, qs[mid], depth + 1),
                    qs,
                    calib,
                    grid,
                )
                up, down = up + a, down + b
            if mid + 1 < qb:
                a, b = sup_log_ratio(
                    [y for y in p if y > v],
                    [y for y in r if y > v],
                    (v, right, mid + 1, qb, qs[mid], q_hi, depth + 1),
                    qs,
                    calib,
                    grid,
                )
                up, down = up + a, down + b
            best = (max(best[0], up), max(best[1], down))
    return best


@pytest.mark.parametrize("relation", ["swap", "add_remove"])
@pytest.mark.parametrize("qs", [[0.1, 0.2, 0.9], [0.05, 0.5, 0.95], [0.2, 0.4, 0.6, 0.8]])
def test_privacy_loss_sup_over_all_outputs(relation: str, qs: list[float]) -> None:
    rng = np.random.default_rng(77)
    per_level = node_nodes_per_level(len(qs))
    # spend = 1: the real calibration for epsilon = 1; spend = 3: a 3x over-spending negative
    # control, which the same search must catch.
    worst = {1.0: -math.inf, 3.0: -math.inf}
    for _ in range(12):
        n = int(rng.integers(2, 8))
        powers = rng.uniform(0, 5, size=n) ** rng.choice([1.0, 3.0, 0.3])
        x = [spread(min(float(v), 5.0), float(rng.random())) for v in powers]
        i = int(rng.integers(n))
        if relation == "swap":
            other = [*x[:i], spread(float(rng.uniform(-1, 6)), float(rng.random())), *x[i + 1 :]]
        else:
            other = [*x[:i], *x[i + 1 :]]
        for spend in worst:
            calib = (per_level, spend / len(per_level), relation)
            root = (-REACH, 5.0 + REACH, 0, len(qs), 0.0, 1.0, 0)
            up, down = sup_log_ratio(sorted(x), sorted(other), root, qs, calib)
            worst[spend] = max(worst[spend], up, down)
    assert worst[1.0] <= 1.0 + 1e-9
    assert worst[3.0] > 1.0


@pytest.mark.parametrize("relation", ["swap", "add_remove"])
def test_sampler_uses_the_calibrated_node_parameters(
    monkeypatch: pytest.MonkeyPatch, relation: str
) -> None:
    qs = [0.1, 0.2, 0.5, 0.9]
    eps = 1.3
    per_level = node_nodes_per_level(len(qs))
    eps_l = eps / len(per_level)
    seen: list[tuple[int, float, float]] = []
    real = aqmod.node_pick

    def spy(edges, cum, lo, hi, left, right, target, c, rng, buf):  # type: ignore[no-untyped-def]
        seen.append((int(cum[hi - 1] - cum[lo - 1]), target, c))
        return real(edges, cum, lo, hi, left, right, target, c, rng, buf)

    monkeypatch.setattr(aqmod, "node_pick", spy)
    data = np.random.default_rng(0).normal(size=200)
    out = aq(
        data,
        qs,
        epsilon=eps,
        lower=-5.0,
        upper=5.0,
        neighbors=relation,
        rng=np.random.default_rng(1),
    )
    # Expected (relative quantile, level) per node in the order the sampler visits them.
    order = [(0.2, 0.0, 1.0), (0.1, 0.0, 0.2), (0.5, 0.2, 1.0), (0.9, 0.5, 1.0)]
    levels = [0, 1, 1, 2]
    assert len(seen) == len(qs)
    for (_k, target, c), (q, qlo, qhi), lev in zip(seen, order, levels, strict=True):
        rel = (q - qlo) / (qhi - qlo)
        assert c == pytest.approx(node_c(eps_l, rel, relation, per_level[lev]), rel=1e-12)
        assert target == pytest.approx(rel, rel=1e-12)  # the fraction of the node's count
    assert np.all(np.diff(out) >= 0)


# --------------------------------------------------------------------- accuracy and speed


def test_accuracy_beats_indexp_on_gaussian_data() -> None:
    rng = np.random.default_rng(5)
    qs = np.linspace(0.1, 0.9, 9)
    errs: dict[str, list[float]] = {"aq": [], "indexp": []}
    for _ in range(20):
        x = rng.normal(size=1000)
        xs = np.sort(x)
        for name in errs:
            est = MECHANISMS[name](x, qs, epsilon=1.0, lower=-100.0, upper=100.0, rng=rng)
            errs[name].append(float(np.mean(np.abs(np.searchsorted(xs, est) - np.ceil(qs * 1000)))))
    assert np.mean(errs["aq"]) < np.mean(errs["indexp"])
    assert np.mean(errs["aq"]) < 20


def test_million_points_ninety_nine_quantiles_is_fast() -> None:
    x = np.random.default_rng(0).normal(size=1_000_000)
    qs = np.linspace(0.01, 0.99, 99)
    aq(x[:100], qs, epsilon=1.0, lower=-10.0, upper=10.0, rng=np.random.default_rng(0))
    t0 = time.perf_counter()
    out = aq(x, qs, epsilon=1.0, lower=-10.0, upper=10.0, rng=np.random.default_rng(0))
    assert time.perf_counter() - t0 < 1.0  # ~0.015 s measured; O(n^2) or a per-node copy+sort
    truth = np.quantile(x, qs)
    assert np.max(np.abs(out - truth)) < 0.05


def test_registry_entry() -> None:
    mech = MECHANISMS["aq"]
    assert mech.notion is PrivacyNotion.PURE_DP
    assert not mech.requires_delta and mech.method_params == ()
    assert mech.dp_cost(epsilon=0.7) == (0.7, 0.0)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"epsilon": -0.1}, "epsilon"),
        ({"upper": -1.0}, "upper"),
        ({"neighbors": "replace"}, "neighbors"),
        ({"quantiles": [0.3, 0.3]}, "quantiles"),
        ({"quantiles": []}, "quantiles"),
        ({"data": [[1.0]]}, "data"),
        ({"rng": 3}, "rng"),
    ],
)
def test_validation_names_parameter(kwargs: dict[str, object], param: str) -> None:
    assert_rejects(aq, kwargs, param)

"""JointExp's acceptance step (``app/mechanisms/jointexp/accept.py``).

The exact log ratio against a 60-digit reference on inputs chosen to break a double
evaluation (exponents of 10^9 e-folds, targets with fractional parts, long repeat runs,
probabilities far below the smallest double); the probability product at any depth; the run
parameter's account at the service's limits in exact rationals; and the retry path (a large
margin forces rejections) against the law-level walker.
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest

from app.mechanisms.jointexp import accept as A
from app.mechanisms.jointexp import mechanism as jx
from app.mechanisms.jointexp import range_rule as RR
from app.mechanisms.validation import EPSILON_MAX, EPSILON_MIN
from tests.mechanisms import law_audit as LA

U = 2.0**-53


def _reference(
    seq: np.ndarray,
    pos: np.ndarray,
    logw: np.ndarray,
    gaps: np.ndarray,
    c: float,
    log_c: float,
    mant: float,
    expo: int,
) -> mpmath.mpf:
    """log W(s) - log C - log P̂ in 60 digits, written from the definition."""
    with mpmath.workdps(60):
        n = int(pos[-1])
        total = mpmath.mpf(0)
        prev = 0
        points = [int(pos[i]) for i in seq] + [n]
        for g, p in zip(gaps.tolist(), points, strict=True):
            total -= mpmath.mpf(c) * abs(mpmath.mpf(p - prev) - mpmath.mpf(g))
            prev = p
        for i in seq:
            total += mpmath.mpf(float(logw[i]))
        runs: dict[int, int] = {}
        for i in seq.tolist():
            runs[i] = runs.get(i, 0) + 1
        for k in runs.values():
            total -= mpmath.log(mpmath.factorial(k))
        total -= mpmath.mpf(log_c)
        total -= mpmath.log(mpmath.mpf(mant)) + expo * mpmath.log(2)
        return total


def _random_input(
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    d1 = int(rng.integers(2, 40))
    steps = rng.integers(1, 2 ** int(rng.integers(1, 40)), size=d1 - 1)
    pos = np.concatenate(([0], np.cumsum(steps))).astype(np.int64)
    logw = np.log(rng.random(d1)) * float(10.0 ** rng.uniform(0, 3))
    m = int(rng.integers(1, 60))
    seq = np.sort(rng.integers(0, d1, size=m))
    if rng.random() < 0.3:  # long repeat runs
        seq[: m // 2] = seq[0]
    q = np.sort(rng.random(m))
    gaps = np.diff(np.concatenate(([0.0], q, [1.0]))) * float(pos[-1])
    c = float(10.0 ** rng.uniform(-7, 2))
    return seq.astype(np.int64), pos, logw, gaps, c


def test_log_acceptance_is_exact_to_one_rounding() -> None:
    """2,000 random inputs with kernel exponents up to ~10^13 e-folds and probabilities down
    to 2^-200,000: the ratio is within a few ulps of the reference plus the rounding of the
    terms that are not exact (log k!, log of the mantissa), never ~u times the exponents.
    A double evaluation misses by ~u c cost (checked: the control below is far off)."""
    rng = np.random.default_rng(20261204)
    worst = 0.0
    for _ in range(2000):
        seq, pos, logw, gaps, c = _random_input(rng)
        prob = A.ProbabilityProduct()
        for p in rng.random(int(rng.integers(1, 2 * seq.size + 1))) ** 50:
            prob.times(float(max(p, 1e-300)))
        prob.times(2.0**-1000, 2.0**100)  # a share no double holds
        ref = _reference(seq, pos, logw, gaps, c, 0.0, prob.mantissa, prob.exponent)
        # log C chosen near log W - log P̂ so the ratio is small, as in the sampler
        log_c = float(ref)
        ref -= mpmath.mpf(log_c)
        got = A.log_acceptance(seq, pos, logw, gaps, c, log_c, prob)
        slack = U * (math.lgamma(seq.size + 1.0) + 8.0)
        err = abs(mpmath.mpf(got) - ref)
        worst = max(worst, float(err / slack))
        assert err <= slack, (got, ref)
    assert worst > 0.0  # the comparison is not vacuous


def test_a_double_evaluation_would_miss() -> None:
    """Control: evaluating ``log W`` in doubles (as the passes do) on a deep input misses
    the reference by far more than the exact evaluation's slack."""
    pos = np.array([0, 2**40 + 3, 2**41 + 5], dtype=np.int64)
    logw = np.zeros(3)
    seq = np.array([1, 1, 2], dtype=np.int64)
    gaps = np.array([1.1e12, 0.3, 0.2, float(pos[-1]) - 1.1e12 - 0.5])
    c = 37.3
    prob = A.ProbabilityProduct()
    ref = _reference(seq, pos, logw, gaps, c, 0.0, prob.mantissa, prob.exponent)
    naive = -c * sum(
        abs(float(p - q) - g)
        for p, q, g in zip(
            [*pos[seq].tolist(), pos[-1]], [0, *pos[seq].tolist()], gaps.tolist(), strict=True
        )
    ) - math.lgamma(3.0)
    got = A.log_acceptance(seq, pos, logw, gaps, c, 0.0, prob)
    assert abs(mpmath.mpf(got) - ref) <= abs(ref) * 4 * U
    assert abs(mpmath.mpf(naive) - ref) > 1e-3  # the doubles lose whole e-folds here


def test_probability_product_has_no_floor() -> None:
    """10^4 factors of 1e-300 (a probability of 10^-3,000,000): the product keeps it, and its
    log matches the sum of the factors' logs to a few ulps per factor."""
    prob = A.ProbabilityProduct()
    for _ in range(10_000):
        prob.times(1e-300)
    assert 0.5 <= prob.mantissa < 1.0
    got = math.log(prob.mantissa) + prob.exponent * A.LN2_HI + prob.exponent * A.LN2_LO
    want = 10_000 * mpmath.log(mpmath.mpf(1e-300))
    assert abs(mpmath.mpf(got) - want) <= abs(want) * 1e4 * U
    with pytest.raises(FloatingPointError):
        prob.times(0.0)
    with pytest.raises(FloatingPointError):
        prob.times(1.5)
    # shares below the smallest normal double, formed from the two numbers' exponents
    deep = A.ProbabilityProduct()
    deep.times(2.0**-1022, 2.0**1000)
    deep.times(3.0e-300, 7.0e300)
    got = math.log(deep.mantissa) + deep.exponent * A.LN2_HI + deep.exponent * A.LN2_LO
    with mpmath.workdps(40):
        want = mpmath.log(mpmath.mpf(2) ** -2022 * mpmath.mpf(3.0e-300) / mpmath.mpf(7.0e300))
    assert abs(mpmath.mpf(got) - want) <= abs(want) * 8 * U


def test_ln2_pair_is_ln2_to_106_bits() -> None:
    with mpmath.workdps(60):
        err = mpmath.mpf(A.LN2_HI) + mpmath.mpf(A.LN2_LO) - mpmath.log(2)
        assert abs(err) < mpmath.mpf(2) ** -106


@pytest.mark.parametrize("neighbors", ["swap", "add_remove"])
def test_run_parameter_closes_the_account_at_the_limits(neighbors: str) -> None:
    """In exact rationals, at m in {1, 7, 99, 1000}, epsilon from the smallest to the largest
    the API accepts and counts up to 2^53: the implemented release's loss bound
    ``2 c' (Δ + Δ_fp) + 4ρ + 2D`` is at most epsilon, and the parameter keeps almost all of c
    (relative cost below 1e-6 from epsilon = 0.01 on, at n <= 10^9)."""
    for m in (1, 7, 99, 1000):
        q = np.arange(1, m + 1) / (m + 1)
        delta_u = jx.jointexp_sensitivity(q, neighbors)
        for eps in (EPSILON_MIN * m, 1e-3, 0.01, 1.0, 10.0, EPSILON_MAX):
            for n in (10, 10**6, 10**9, 2**53):
                c = eps / (2.0 * delta_u)
                add = neighbors == "add_remove"
                c_run = A.run_parameter(c, m, n, delta_u, add)
                extra = Fraction(0)
                if add:
                    uu = Fraction(1, 2**53)
                    extra = uu * (2 * n + 1) * (1 + (m + 1) * uu) + 2 * (m + 1) * uu
                rho = Fraction(A.rounding_slack(m))
                # plus 2D, D <= 7.6e-13 e^-ε where the passes certify it (DROPPED_MAX >= D)
                dropped = Fraction(A.DROPPED_MAX)
                loss = 2 * Fraction(c_run) * (Fraction(delta_u) + extra) + 4 * rho + 2 * dropped
                assert loss <= Fraction(eps), (m, eps, n)
                if eps >= 0.01 and n <= 10**9:
                    assert c_run >= c * (1 - 1e-6), (m, eps, n, c_run / c)


def test_rounding_slack_covers_its_parts() -> None:
    """ρ at m = 1000 is ~3.3e-10: the bound the run parameter charges (8.2 ulps per block,
    the log widths' 3,000 ulps, log m!, 16 ulps); it grows linearly in m."""
    rho = A.rounding_slack(1000)
    assert 3.0e-10 < rho < 4.0e-10
    assert A.rounding_slack(2000) / rho == pytest.approx(2.0, rel=0.01)


def test_margin_is_clamped() -> None:
    assert A.acceptance_margin(1, 1e-7, 10) == A.MARGIN_MIN
    assert A.acceptance_margin(1000, 100.0, 10**12) == A.MARGIN_MAX
    mid = A.acceptance_margin(99, 0.25, 10**6)
    assert A.MARGIN_MIN < mid < A.MARGIN_MAX


@pytest.mark.parametrize("index", range(6))
def test_rejections_keep_the_law_exact(monkeypatch: pytest.MonkeyPatch, index: int) -> None:
    """With a margin of 0.7 (about half of the proposals rejected) the sampler's retry loop
    draws what the walker draws (same sequences, same uniforms consumed, over 20 seeds each)
    and the walker's law is still the exact one: the retries start from the same pass and
    propose from the same law."""
    monkeypatch.setattr(A, "acceptance_margin", lambda m, c, n: 0.7)
    monkeypatch.setattr(jx, "acceptance_margin", lambda m, c, n: 0.7)
    case = LA.make_case(LA_SEED, index)
    _, c = LA.mechanism_parameters(case.support)
    path = LA.PATHS[index % len(LA.PATHS)]
    for seed in range(20):
        same, got, want = LA.walker_matches_sampler(
            case.support, seed, patches=path.patches, **path.options_for(c)
        )
        assert same, (seed, got, want)
    (res,) = LA.audit(case, paths=(path,))
    assert res.tv <= 1e-12, LA.describe_failure(case, res)
    assert res.log_accept_max < -0.5


def test_rejections_happen_at_the_margins_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    """At a margin of 0.7 the sampler draws again in ~1 - e^-0.7 = 50 % of attempts: the
    number of uniforms it consumes shows it (each attempt takes its blocks' words and one
    coin)."""
    monkeypatch.setattr(jx, "acceptance_margin", lambda m, c, n: 0.7)
    case = LA.make_case(LA_SEED, 1)
    gaps, c = LA.mechanism_parameters(case.support)
    inputs = jx.support_inputs(case.support)
    attempts = 0
    trials = 400
    for seed in range(trials):
        counter = _CountingGenerator(seed)
        jx.sample_prepared_sequence(inputs, gaps, c, counter)  # type: ignore[arg-type]
        attempts += counter.coins
    rate = 1.0 - trials / attempts
    assert abs(rate - (1.0 - math.exp(-0.7))) < 0.08, rate


class _CountingGenerator:
    """A numpy generator that counts ``random()`` calls (the acceptance coins)."""

    def __init__(self, seed: int) -> None:
        self._g = np.random.default_rng(seed)
        self.bit_generator = self._g.bit_generator
        self.coins = 0

    def random(self) -> float:
        self.coins += 1
        return float(self._g.random())


LA_SEED = 20261204


def test_the_dropped_mass_floors_keep_delta_below_1e12() -> None:
    """The three floors that bound the mass D a pass drops (range_rule), at every c the API
    allows (up to ε = 100 with Δ >= 1) and m up to 1,000: truncation (e^-last_headroom, the
    sound bound or the certificate at the last draw), pruned levels (floor × m(m + 1)/2) and
    flushed draw weights (2^30 × 2^-1022 / tiny_draw per draw, 2^10 draws). The pass built
    after g rebuilds of a backward sweep gets the share 2^-(g + 2) of 7.6e-13 e^-4c, and a
    sweep loses at most twice the sum of its passes' D (docs/mechanisms.md, "Passes changed
    mid-sweep"): at most 7.6e-13 e^-4c over any number of rebuilds, so e^ε D (1 + 2D) <=
    10^-12 for ε <= 4c; and D <= DROPPED_MAX, which the run parameter charges to ε."""
    for m in (1, 2, 9, 99, 999, 1000):
        for c in (1e-9, 1e-3, 0.25, 1.0, 5.0, 25.0, 50.0, 100.0):
            with mpmath.workdps(40):
                total = mpmath.mpf(0)
                for g in range(60):
                    trunc = mpmath.exp(-mpmath.mpf(RR.last_headroom(c, m, g)))
                    pruned = mpmath.mpf(RR.prune_floor(c, m, g)) * m * (m + 1) / 2
                    flushed = mpmath.mpf(2) ** (30 - 1022 + 10) / mpmath.mpf(RR.tiny_draw(c, g))
                    share = mpmath.mpf("7.6e-13") * mpmath.mpf(2) ** -(g + 2)
                    assert (trunc + pruned + flushed) * mpmath.exp(4 * c) <= share, (m, c, g)
                    total += 2 * (trunc + pruned + flushed)
                # the shares' tail past g = 59 is below 2^-60 of the budget
                tail = mpmath.mpf("7.6e-13") * mpmath.mpf(2) ** -60 * mpmath.exp(-4 * c)
                dropped = total + tail
                assert dropped * mpmath.exp(4 * c) <= mpmath.mpf("7.6e-13"), (m, c)
                assert dropped * mpmath.exp(4 * c) * (1 + 2 * dropped) <= mpmath.mpf("1e-12")
                assert dropped <= mpmath.mpf(A.DROPPED_MAX)
            # the floors only tighten: never below the headroom, pruning and draw floor used
            # before the dropped mass was budgeted, and tighter for each rebuild
            assert RR.last_headroom(c, m) >= RR.headroom(m)
            assert RR.prune_floor(c, m) <= 2.0**-60
            assert RR.tiny_draw(c) >= 2.0**-900
            assert RR.last_headroom(c, m, 3) >= RR.last_headroom(c, m, 2)
            assert RR.prune_floor(c, m, 3) <= RR.prune_floor(c, m, 2)
            assert RR.tiny_draw(c, 3) >= RR.tiny_draw(c, 2)

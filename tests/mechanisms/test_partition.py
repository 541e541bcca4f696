"""Partition selection: the exact discrete Laplace sampler, and (ε, δ) for one unit from the
exact law of the selected key set."""

from __future__ import annotations

import inspect
import itertools
import math
import random
import secrets
from fractions import Fraction

import mpmath
import pytest
from scipy import stats

from app.mechanisms import partition
from app.mechanisms.partition import bernoulli_exp, discrete_laplace, select_keys, threshold


@pytest.mark.parametrize("gamma", [Fraction(0), Fraction(1, 3), Fraction(1), Fraction(5, 2)])
def test_bernoulli_exp_has_probability_e_to_minus_gamma(gamma: Fraction) -> None:
    rng = random.Random(int(gamma * 6))
    n = 40_000
    hits = sum(bernoulli_exp(gamma, rng.randrange) for _ in range(n))
    p = math.exp(-float(gamma))
    assert stats.binomtest(hits, n, p).pvalue > 1e-4


@pytest.mark.parametrize("scale", [Fraction(1, 2), Fraction(3), Fraction(7, 3)])
def test_discrete_laplace_follows_its_law(scale: Fraction) -> None:
    rng = random.Random(int(scale * 3))
    n = 30_000
    seen: dict[int, int] = {}
    for _ in range(n):
        z = discrete_laplace(scale, rng.randrange)
        seen[z] = seen.get(z, 0) + 1
    p = math.exp(-1.0 / float(scale))
    law = {z: (1 - p) / (1 + p) * p ** abs(z) for z in range(-60, 61)}
    # pool the tails into one bin each side so every expected count is >= 5
    edge = max(z for z in range(61) if law[z] * n >= 5)
    bins = {z: seen.get(z, 0) for z in range(-edge + 1, edge)}
    observed = [*bins.values(), sum(c for z, c in seen.items() if z >= edge),
                sum(c for z, c in seen.items() if z <= -edge)]  # fmt: skip
    tail = p**edge / (1 + p)
    expected = [law[z] * n for z in bins] + [tail * n, tail * n]
    assert stats.chisquare(observed, expected).pvalue > 1e-4


def selection_law(
    counts: dict[str, int], keys: list[str], tau: int, eps: Fraction, steps: int
) -> dict[tuple[str, ...], mpmath.mpf]:
    """The exact law of the selected key set (independent keys; P(c + Z >= tau))."""
    p = mpmath.exp(-mpmath.mpf(eps.numerator) / eps.denominator / steps)

    def kept(c: int) -> mpmath.mpf:
        if c == 0:
            return mpmath.mpf(0)
        t = tau - c
        return p**t / (1 + p) if t >= 0 else 1 - p ** (-t + 1) / (1 + p)

    law = {}
    for chosen in itertools.product((False, True), repeat=len(keys)):
        prob = mpmath.mpf(1)
        for key, on in zip(keys, chosen, strict=True):
            q = kept(counts.get(key, 0))
            prob *= q if on else 1 - q
        law[tuple(k for k, on in zip(keys, chosen, strict=True) if on)] = prob
    return law


def hockey_stick(a: dict, b: dict, eps: Fraction) -> mpmath.mpf:
    e = mpmath.exp(mpmath.mpf(eps.numerator) / eps.denominator)
    return max(sum(max(mpmath.mpf(0), x[s] - e * y[s]) for s in x) for x, y in ((a, b), (b, a)))


def unit_pairs(k: int, swap: bool) -> list[tuple[dict[str, int], dict[str, int]]]:
    """Per-key row counts of tables that differ in one unit of up to k rows: its rows in
    existing keys or in new ones (at most k), removed (add/remove) or moved (swap)."""
    base = {"a": 3, "b": 9}
    out = []
    for spread in itertools.product(["a", "b", "n1", "n2"], repeat=k):
        with_unit = dict(base)
        for key in spread:
            with_unit[key] = with_unit.get(key, 0) + 1
        if swap:
            for target in itertools.product(["a", "b", "n3"], repeat=k):
                other = dict(base)
                for key in target:
                    other[key] = other.get(key, 0) + 1
                out.append((with_unit, other))
        else:
            out.append((with_unit, dict(base)))
    return out


@pytest.mark.parametrize(("k", "swap"), [(1, False), (2, False), (1, True), (2, True)])
def test_selection_is_epsilon_delta_private_for_one_unit(k: int, swap: bool) -> None:
    mpmath.mp.dps = 40
    eps, delta = Fraction(1, 2), 1e-3
    steps = 2 * k if swap else k
    tau = threshold(eps, delta, steps, k)
    naive = tau - steps - 1  # without the shift for a new key's own count and the rounding step
    keys = ["a", "b", "n1", "n2", "n3"]
    worst = worst_naive = mpmath.mpf(0)
    for x, y in unit_pairs(k, swap):
        worst = max(worst, hockey_stick(selection_law(x, keys, tau, eps, steps),
                                        selection_law(y, keys, tau, eps, steps), eps))  # fmt: skip
        worst_naive = max(worst_naive, hockey_stick(selection_law(x, keys, naive, eps, steps),
                                                    selection_law(y, keys, naive, eps, steps),
                                                    eps))  # fmt: skip
    assert worst <= delta
    assert worst_naive > delta  # the check has teeth


def test_the_threshold_is_the_least_that_holds_up_to_its_rounding_step() -> None:
    for eps, delta, steps, k in [(Fraction(1), 1e-6, 1, 1), (Fraction(1, 10), 1e-9, 4, 2),
                                 (Fraction(3), 1e-3, 10, 5)]:  # fmt: skip
        tau = threshold(eps, delta, steps, k)
        p = math.exp(-float(eps) / steps)
        assert k * p ** (tau - steps) / (1 + p) <= delta
        assert k * p ** (tau - steps - 2) / (1 + p) > delta  # at most one step of margin
    with pytest.raises(partition.MechanismInputError):
        threshold(Fraction(1), 1.0, 1, 1)


def test_big_keys_are_kept_small_ones_not_and_the_order_is_by_key() -> None:
    rng = random.Random(5)
    counts = {"zeta": 5000, "alpha": 4000, "tiny": 1, "mid": 2}
    kept = select_keys(counts, epsilon=Fraction(1), delta=1e-6, steps=1, new_keys=1,
                       randbelow=rng.randrange)  # fmt: skip
    assert kept == ["alpha", "zeta"]


def test_production_noise_comes_from_the_os_csprng() -> None:
    for fn in (select_keys, discrete_laplace):
        assert inspect.signature(fn).parameters["randbelow"].default is secrets.randbelow

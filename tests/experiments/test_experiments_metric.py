"""The missed-points metric against hand-computed cases."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from app.experiments.metric import missed_points, true_quantile_ranks, true_quantiles

FIVE = [1.0, 2.0, 3.0, 4.0, 5.0]


@pytest.mark.parametrize(
    ("estimate", "expected"),
    [
        (3.0, 0),  # exactly the true median x_(3)
        (3.5, 0),  # same interval [x_(3), x_(4)): 3 points <= estimate, as for the truth
        (4.0, 1),  # counts x_(4) = 4 (half-open (3, 4])
        (2.9, 1),  # counts x_(3) = 3 itself: (2.9, 3]
        (2.0, 1),  # (2, 3] holds only 3
        (1.5, 2),  # (1.5, 3] holds 2 and 3
        (-50.0, 3),  # below the data range: every point <= truth is missed
        (100.0, 2),  # above the data range: 4 and 5
    ],
)
def test_median_of_five(estimate: float, expected: int) -> None:
    assert missed_points(FIVE, [0.5], [estimate]).tolist() == [expected]


@pytest.mark.parametrize(
    ("estimate", "expected"),
    [
        (2.0, 0),  # the tied true value itself
        (2.5, 0),  # just above the tie block: still 4 points <= estimate
        (1.9, 3),  # just below the tie block: all three 2s are between (1.9, 2]
        (1.0, 3),  # (1, 2] holds the three 2s, not the 1
        (3.0, 1),  # (2, 3]
        (0.0, 4),  # below the range
        (7.0, 1),  # above the range
    ],
)
def test_ties(estimate: float, expected: int) -> None:
    data = [1.0, 2.0, 2.0, 2.0, 3.0]
    assert true_quantiles(data, [0.5]).tolist() == [2.0]
    assert missed_points(data, [0.5], [estimate]).tolist() == [expected]


def test_several_quantiles_are_paired_in_order() -> None:
    data = np.arange(1.0, 11.0)  # 1..10
    qs = [0.25, 0.5, 0.75]  # ranks ceil(2.5)=3, 5, ceil(7.5)=8 -> truths 3, 5, 8
    assert true_quantiles(data, qs).tolist() == [3.0, 5.0, 8.0]
    missed = missed_points(data, qs, [0.0, 5.2, 10.5])
    # 0.0: rank 0 vs 3 -> 3; 5.2: rank 5 vs 5 -> 0; 10.5: rank 10 vs 8 -> 2
    assert missed.tolist() == [3, 0, 2]
    assert int(missed.sum()) == 5


def test_all_data_tied_and_clamped_estimates() -> None:
    data = [4.0] * 6
    # truth 4 has rank 6; anything below 4 misses all 6, anything >= 4 misses none
    assert missed_points(data, [0.1, 0.9], [-100.0, 100.0]).tolist() == [6, 0]


def test_exact_fractions_are_not_pushed_up_by_rounding() -> None:
    assert true_quantile_ranks(5, [0.2, 0.4, 0.6, 0.8]).tolist() == [1, 2, 3, 4]
    n = 1000
    for m in range(1, 30):
        qs = np.arange(1, m + 1) / (m + 1)
        exact = [-((-Fraction(j, m + 1) * n) // 1) for j in range(1, m + 1)]  # ceil
        assert true_quantile_ranks(n, qs).tolist() == exact, m


def test_matches_brute_force_and_reference_formula() -> None:
    rng = np.random.Generator(np.random.PCG64(7))
    for _ in range(50):
        n = int(rng.integers(1, 60))
        data = np.sort(rng.integers(0, 8, size=n).astype(float))  # many ties
        m = int(rng.integers(1, 6))
        qs = np.arange(1, m + 1) / (m + 1)
        est = np.sort(rng.uniform(-2, 10, size=m))
        est[rng.random(m) < 0.3] = rng.choice(data)  # some estimates on data values
        est.sort()
        got = missed_points(data, qs, est)
        truth = true_quantiles(data, qs)
        brute = [
            sum(1 for x in data if min(t, e) < x <= max(t, e))
            for t, e in zip(truth, est, strict=True)
        ]
        reference = [
            abs(np.sum(data > t) - np.sum(data > e)) for t, e in zip(truth, est, strict=True)
        ]
        assert got.tolist() == brute == reference


@pytest.mark.parametrize(
    ("data", "qs", "est"),
    [
        ([], [0.5], [0.0]),
        ([1.0, 2.0], [0.5], [0.0, 1.0]),
        ([2.0, 1.0], [0.5], [0.0]),
        ([1.0, 2.0], [1.0], [0.0]),
        ([1.0, 2.0], [0.5], [float("nan")]),
    ],
)
def test_rejects_bad_input(data: list[float], qs: list[float], est: list[float]) -> None:
    with pytest.raises(ValueError):
        missed_points(data, qs, est)

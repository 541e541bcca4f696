"""JointExp's backward draws: weights formed in the units they are compared in.

A draw's linear weights are the row's entries times the kernel scaled by up to e^300. The
kernel tables hold the *unscaled* factors and end (or flush to 0.0) ~745 e-folds down, so
forming a scaled factor as "table entry times e^lscale" dropped every factor deeper than the
table however large the scale made it, and the acceptance test compared the scaled largest
weight with an unscaled row maximum. Where a kernel peak sat inside a heavy atom the dominant
interval's weight was exactly 0.0: a median inside an atom at epsilon = 1 was never drawn on
one dataset and drawn with probability 0.37 on its neighbour (issue 27). These tests pin the
law on that family of neighbours, the kernel factors themselves, and the inputs the same
review found (raw widths whose ratio underflows, epsilon beyond the proven range).
"""

from __future__ import annotations

import collections
import math

import numpy as np
import pytest

from app.mechanisms import MECHANISMS, GridHistogram, MechanismInputError
from app.mechanisms.fpmode import flush_subnormals
from app.mechanisms.jointexp import kernels_linear as K
from tests.mechanisms import law_audit as LA
from tests.mechanisms.exact import chi_square_p

EPS = 1.0
#: (a, b, draws): counts (a, b, a - 1) on grid points 0, 1, 2 and the neighbour (a, b + 1, a - 2),
#: one record moved from 2 to 1. Both the sampled values of 0 and 1 and their neighbours
#: were wrong before the fix: (853, 7273) never drew 1, (1673, 21051) always did.
PAIRS = [(853, 7273, 10_000), (1673, 21051, 10_000)]
#: a larger pair whose runs take the slow path: its whole law is walked instead of sampled
LARGE_PAIR = (40_000, 300_001)


def _hist(counts: tuple[int, int, int]) -> GridHistogram:
    return GridHistogram(
        cells=np.array([0, 1, 2], dtype=np.int64),
        counts=np.array(counts, dtype=np.int64),
        grid_points=3,
    )


def _exact_median_law(counts: tuple[int, int, int], epsilon: float) -> dict[int, float]:
    """The median's law on grid points 0, 1, 2 from the definition, independently of the
    implementation: utility -|pos - n/2| - |n - pos - n/2| = -2 |pos - n/2| (pos(y) =
    #{x <= y}), sensitivity 2 under swap, so P(y) ∝ exp(-(epsilon / 4) 2 |pos(y) - n/2|)."""
    a, b, c = counts
    n = a + b + c
    pos = np.array([a, a + b, n], dtype=np.float64)
    logp = -(epsilon / 4.0) * 2.0 * np.abs(pos - n / 2.0)
    p = np.exp(logp - logp.max())
    p /= p.sum()
    return {y: float(p[y]) for y in range(3) if p[y] > 0.0}


@pytest.mark.parametrize(("a", "b", "draws"), PAIRS)
def test_a_median_inside_a_heavy_atom_is_drawn_with_its_exact_law_on_both_neighbours(
    a: int, b: int, draws: int
) -> None:
    """10,000 grid draws on each neighbour: chi-square against the exact law (p >= 0.01),
    and the exact laws' density ratio, which the draws then follow, is within e^epsilon."""
    pair = [(a, b, a - 1), (a, b + 1, a - 2)]
    laws = [_exact_median_law(x, EPS) for x in pair]
    for y in (0, 1):
        assert math.exp(-EPS) <= laws[0][y] / laws[1][y] <= math.exp(EPS)
    assert laws[0][1] == pytest.approx(0.3775, abs=1e-4)
    assert laws[1][1] == pytest.approx(0.2689, abs=1e-4)
    rng = np.random.default_rng(27)
    freqs = []
    for counts, law in zip(pair, laws, strict=True):
        hist = _hist(counts)
        seen: collections.Counter[int] = collections.Counter()
        for _ in range(draws):
            est = MECHANISMS["jointexp"].run_grid(hist, [0.5], epsilon=EPS, delta=None, rng=rng)
            seen[int(est[0])] += 1
        assert chi_square_p(dict(seen), law, draws) >= 0.01, (counts, seen, law)
        freqs.append({y: seen[y] / draws for y in (0, 1)})
    for y in (0, 1):  # the observed frequencies on the two neighbours stay within e^epsilon
        assert freqs[0][y] / freqs[1][y] <= math.exp(EPS) * 1.1
        assert freqs[1][y] / freqs[0][y] <= math.exp(EPS) * 1.1


def test_a_median_inside_a_larger_heavy_atom_has_its_exact_law_on_both_neighbours() -> None:
    """The pair (40,000, 300,001): the implementation's whole output law on each neighbour,
    walked branch by branch with the weights it uses, on every forced path
    (tests/mechanisms/law_audit.py), equals the law from the definition to 10^-12, whose
    density ratio is within e^epsilon."""
    a, b = LARGE_PAIR
    pair = [(a, b, a - 1), (a, b + 1, a - 2)]
    laws = [_exact_median_law(x, EPS) for x in pair]
    for y in (0, 1):
        assert math.exp(-EPS) <= laws[0][y] / laws[1][y] <= math.exp(EPS)
    for counts, law in zip(pair, laws, strict=True):
        case = LA.reproducer_case(counts)
        for res in LA.audit(case):
            # support interval y + 1 is grid point y (interval 0, below the grid, has no width)
            got = {y: res.implementation.get((y + 1,), 0.0) for y in range(3)}
            assert sum(got.values()) == pytest.approx(1.0, abs=1e-12)
            for y, p in law.items():
                assert abs(got[y] - p) <= 1e-12, (counts, res.path, got, law)
            assert res.tv <= 1e-12, LA.describe_failure(case, res)


def test_scaled_kernel_factors_below_the_table_are_formed_from_their_exponent() -> None:
    """Every factor e^lscale k(D) that is a normal double is formed, also where the table of
    unscaled factors holds 0.0 (past ~745 e-folds, or flushed): equal to the closed form to
    a few ulps, and none of them zero."""
    c, mu, nj = 0.37, 0.0, 3.25
    pw = np.exp(-(c - mu) * np.arange(2100, dtype=np.float64))  # ~777 e-folds deep
    pw[pw < 2.0**-1022] = 0.0  # what flush-to-zero leaves in the table
    pos = np.arange(0, 4000, dtype=np.int64)
    pos_ref = 3990
    total = np.ones(pos.size)
    out = np.empty(pos.size)
    lscale = 300.0
    with flush_subnormals():
        top = K.step_weights_linear(
            total, 0, pos.size, pos_ref, pos, nj, c, mu, lscale, pw, pw, out
        )
    e = pos_ref - pos - nj
    log_ref = lscale - c * np.abs(e) - mu * e
    normal = log_ref > -700.0
    assert normal.sum() > 2500  # deeper than the table by hundreds of positions
    np.testing.assert_allclose(out[normal], np.exp(log_ref[normal]), rtol=1e-12)
    assert np.all(out[normal] > 0.0)
    assert top == out.max()


def test_raw_widths_far_below_the_largest_stay_positive() -> None:
    """20,000 points 1e-304 apart inside bounds of +-1e20: their widths are ~1e-324 of the
    outer ones, a quotient that underflows to 0.0. The median is nonetheless inside the data
    (the data's intervals carry almost all of the mass: the outer ones are 10^4 ranks away
    at c = 0.25, a factor e^-2500 that no width ratio below 10^1000 can make up)."""
    x = np.arange(20_000, dtype=np.float64) * 1e-304
    rng = np.random.default_rng(3)
    for _ in range(10):
        est = MECHANISMS["jointexp"](x, [0.5], epsilon=1.0, lower=-1e20, upper=1e20, rng=rng)
        assert x[0] <= est[0] <= x[-1]


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_epsilon_beyond_the_proven_range_is_refused_by_every_method(name: str) -> None:
    """epsilon above 100 is refused with the parameter named (the service turns it into a
    422 on body.epsilon before anything is reserved or debited); 100 itself is accepted."""
    mech = MECHANISMS[name]
    delta = 1e-6 if mech.uses_delta else None
    with pytest.raises(MechanismInputError) as info:
        mech.dp_cost(epsilon=100.5, delta=delta)
    assert info.value.parameter == "epsilon"
    assert "at most 100" in str(info.value)
    eps, dlt = mech.dp_cost(epsilon=100.0, delta=delta)
    assert eps <= 100.0 and dlt >= 0.0

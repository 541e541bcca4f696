"""zCDP accounting of the exponential-mechanism family: bounded range, checked on exact laws.

A mechanism is epsilon-bounded-range (BR) when, for every pair of neighbours D, D', the
privacy loss log p(y|D)/p(y|D') varies by at most epsilon over the outputs y; then it is
(epsilon^2/8)-zCDP (Cesar & Rogers 2021). The zCDP tables debit JointExp at epsilon^2/8 on
that claim, so it is checked here on every neighbouring pair of a small domain, for both
relations, from the grid law of the definition (``grid_tuple_probs``; the implementation's
grid sampler draws exactly that law: ``tests/mechanisms/test_grid.py``) at the scale the
implementation computes (``jointexp_sensitivity``). A scale twice too large is caught.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from app.mechanisms import MECHANISMS
from app.mechanisms.accounting import calibrate_rho
from app.mechanisms.aq import recursion_depth
from app.mechanisms.jointexp import jointexp_sensitivity
from tests.mechanisms.test_grid import grid_tuple_probs

K1 = 4  # grid points 0 .. 3


def datasets(n: int) -> list[list[int]]:
    return [list(x) for x in itertools.combinations_with_replacement(range(K1), n)]


def neighbours(nb: str) -> list[tuple[list[int], list[int]]]:
    """Every neighbouring pair of datasets of 1 to 3 records on the grid (swap: one record
    changed; add/remove: one record added)."""
    pairs = []
    for n in (1, 2, 3):
        for x in datasets(n):
            if nb == "swap":
                for i, v in itertools.product(range(n), range(K1)):
                    if v != x[i]:
                        pairs.append((x, sorted([*x[:i], v, *x[i + 1 :]])))
            else:
                pairs += [(x, sorted([*x, v])) for v in range(K1)]
    return pairs


def loss_range(p: dict, r: dict) -> float:
    """max_y log p/r - min_y log p/r (inf when the supports differ)."""
    if set(p) != set(r) or any(p[y] == 0 or r[y] == 0 for y in p):
        return math.inf
    losses = [math.log(p[y] / r[y]) for y in p]
    return max(losses) - min(losses)


QUANTILE_SETS = [[0.5], [0.25, 0.75], [0.1, 0.5, 0.9]]


@pytest.mark.parametrize("nb", ["swap", "add_remove"])
@pytest.mark.parametrize("q", QUANTILE_SETS, ids=lambda q: f"m{len(q)}")
@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_jointexp_is_epsilon_bounded_range_on_every_neighbouring_pair(
    nb: str, q: list[float], eps: float
) -> None:
    sens = jointexp_sensitivity(np.asarray(q), nb)
    worst = 0.0
    for x, y in neighbours(nb):
        p = grid_tuple_probs(x, q, epsilon=eps, grid_points=K1, neighbors=nb, sensitivity=sens)
        r = grid_tuple_probs(y, q, epsilon=eps, grid_points=K1, neighbors=nb, sensitivity=sens)
        worst = max(worst, loss_range(p, r))
    assert worst <= eps * (1 + 1e-9)
    assert worst > 0.2 * eps  # the check sees real losses


@pytest.mark.parametrize("nb", ["swap", "add_remove"])
def test_a_scale_twice_too_large_breaks_the_range(nb: str) -> None:
    q, eps = [0.25, 0.75], 2.0
    sens = jointexp_sensitivity(np.asarray(q), nb) / 2  # c = eps / Delta: miscalibrated
    worst = max(
        loss_range(
            grid_tuple_probs(x, q, epsilon=eps, grid_points=K1, neighbors=nb, sensitivity=sens),
            grid_tuple_probs(y, q, epsilon=eps, grid_points=K1, neighbors=nb, sensitivity=sens),
        )
        for x, y in neighbours(nb)
    )
    assert worst > eps * 1.01


@pytest.mark.parametrize("nb", ["swap", "add_remove"])
def test_each_single_quantile_mechanism_of_indexp_is_bounded_range_at_its_share(nb: str) -> None:
    eps, m = 1.5, 3
    worst = 0.0
    for qj in (0.1, 0.5, 0.9):
        sens = 1.0 if nb == "swap" else max(qj, 1 - qj)
        for x, y in neighbours(nb):
            args = dict(
                epsilon=eps / m, grid_points=K1, neighbors=nb, sensitivity=sens, single=True
            )
            worst = max(worst, loss_range(grid_tuple_probs(x, [qj], **args),
                                          grid_tuple_probs(y, [qj], **args)))  # fmt: skip
    assert worst <= eps / m * (1 + 1e-9)


@pytest.mark.parametrize("m", [1, 2, 5, 19])
def test_each_method_debits_its_documented_rho(m: int) -> None:
    eps = Fraction("0.3")
    em = eps * eps / 8
    assert MECHANISMS["jointexp"].zcdp_cost(epsilon=eps, delta=None, m=m) == em
    assert MECHANISMS["indexp"].zcdp_cost(epsilon=eps, delta=None, m=m) == em / m
    depth = recursion_depth(m)
    assert MECHANISMS["aq"].zcdp_cost(epsilon=eps, delta=None, m=m) == em / depth
    assert MECHANISMS["jointexp_smooth"].zcdp_cost(epsilon=eps, delta=None, m=m) == eps * eps / 2
    assert MECHANISMS["csmooth"].zcdp_cost(epsilon=eps, delta=1e-6, m=m) == Fraction(
        calibrate_rho(0.3, 1e-6)
    )
    for name in ("appindexp", "smooth"):
        with pytest.raises(Exception, match="only in \\(epsilon, delta\\)-DP"):
            MECHANISMS[name].zcdp_cost(epsilon=eps, delta=1e-6, m=m)


def test_every_registered_method_states_its_zcdp_standing() -> None:
    for name, mech in MECHANISMS.items():
        assert mech.zcdp_basis or mech.zcdp_fn is None, name
        assert (mech.zcdp_fn is None) == (name in ("appindexp", "smooth")), name

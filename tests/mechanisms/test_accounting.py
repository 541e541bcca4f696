"""zCDP -> (epsilon, delta)-DP conversions: known values, soundness and tightness checks."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import norm

from app.mechanisms import MechanismInputError
from app.mechanisms.accounting import (
    RHO_REL_TOL,
    bun_steinke_rho,
    calibrate_rho,
    cks_delta_at_order,
    cks_epsilon_at_order,
    zcdp_epsilon_bun_steinke,
    zcdp_epsilon_cks,
    zcdp_to_approx_dp,
)

RHOS = [1e-4, 0.01, 0.125, 0.5, 2.0, 10.0]
DELTAS = [1e-3, 1e-6, 1e-10]


def gaussian_exact_epsilon(rho: float, delta: float) -> float:
    """Exact (Balle–Wang 2018) epsilon of the Gaussian mechanism that is exactly rho-zCDP.

    Sensitivity 1, sigma = 1/sqrt(2 rho): delta(eps) = Phi(1/(2s) - eps s) - e^eps Phi(-1/(2s)
    - eps s). Any sound zCDP conversion must certify at least this epsilon.
    """
    s = 1.0 / math.sqrt(2.0 * rho)

    def excess(e: float) -> float:
        return (
            norm.cdf(-e * s + 1.0 / (2.0 * s))
            - math.exp(e) * norm.cdf(-e * s - 1.0 / (2.0 * s))
            - delta
        )

    return float(brentq(excess, 0.0, 200.0, xtol=1e-12))


def test_bun_steinke_known_value() -> None:
    # Paper Sec. 5.1.3: a 1/2-zCDP algorithm is (eps, 1e-6)-DP for eps >= 5.76 (BS16 Prop 1.3).
    assert zcdp_epsilon_bun_steinke(0.5, 1e-6) == pytest.approx(5.7565, abs=1e-4)
    assert zcdp_epsilon_bun_steinke(0.0, 1e-6) == 0.0


@pytest.mark.parametrize("rho", RHOS)
@pytest.mark.parametrize("delta", DELTAS)
def test_cks_is_sound_and_tighter(rho: float, delta: float) -> None:
    cks = zcdp_epsilon_cks(rho, delta)
    bs = zcdp_epsilon_bun_steinke(rho, delta)
    exact_gauss = gaussian_exact_epsilon(rho, delta)
    # Sound: never below the exact epsilon of a mechanism that is exactly rho-zCDP.
    assert cks >= exact_gauss - 1e-9
    # Tighter than Bun–Steinke, and not absurdly loose.
    assert cks <= bs + 1e-12
    assert cks <= exact_gauss + 0.25 * max(1.0, exact_gauss)
    assert zcdp_to_approx_dp(rho, delta) == min(cks, bs)


@pytest.mark.parametrize("rho", [0.01, 0.5, 10.0])
def test_cks_minimises_over_orders(rho: float) -> None:
    delta = 1e-6
    orders = 1.0 + np.logspace(-6, 6, 20001)
    grid_min = min(cks_epsilon_at_order(rho, delta, float(a)) for a in orders)
    got = zcdp_epsilon_cks(rho, delta)
    assert got <= grid_min + 1e-9
    assert got >= grid_min - 1e-3  # the grid is fine enough to be near the infimum


def test_cks_epsilon_and_delta_forms_agree() -> None:
    rho, delta = 0.5, 1e-6
    for alpha in (1.5, 3.0, 7.25, 40.0):
        eps = cks_epsilon_at_order(rho, delta, alpha)
        assert cks_delta_at_order(rho, eps, alpha) == pytest.approx(delta, rel=1e-9)


@pytest.mark.parametrize("epsilon", [1e-4, 0.01, 0.1, 0.5, 1.0, 5.0, 50.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-6, 1e-12])
def test_calibrated_rho_is_safe_and_within_1e_9_of_the_largest(epsilon, delta) -> None:
    rho = calibrate_rho(epsilon, delta)
    # Safe: the converted guarantee of the chosen rho never exceeds the request.
    assert zcdp_to_approx_dp(rho, delta) <= epsilon
    # Tight: 1e-9 more rho already converts above the request (the conversion increases in rho).
    assert zcdp_to_approx_dp(rho * (1.0 + 1e-9), delta) > epsilon
    assert zcdp_to_approx_dp(rho, delta) >= epsilon * (1.0 - 1e-8)
    # It beats either conversion alone: at least Bun–Steinke's closed-form inverse.
    assert rho >= bun_steinke_rho(epsilon, delta) * (1.0 - 1e-12)
    assert RHO_REL_TOL <= 1e-9


def test_calibrated_rho_scan_is_monotone_and_the_csmooth_example() -> None:
    rhos = [calibrate_rho(e, 1e-6) for e in np.linspace(0.05, 3.0, 40)]
    assert all(b > a for a, b in itertools.pairwise(rhos))
    # epsilon = 0.5, delta = 1e-6: the figure quoted in csmooth's docstring.
    assert calibrate_rho(0.5, 1e-6) == pytest.approx(6.64e-3, rel=2e-3)
    # The former reading (rho = epsilon^2 / 2) would have converted to ~2.42 (issue 10).
    assert zcdp_to_approx_dp(0.125, 1e-6) == pytest.approx(2.419, abs=1e-3)


def test_bun_steinke_rho_inverts_prop_1_3() -> None:
    for eps, delta in [(0.5, 1e-6), (3.0, 1e-3), (1e-5, 1e-9)]:
        rho = bun_steinke_rho(eps, delta)
        assert zcdp_epsilon_bun_steinke(rho, delta) == pytest.approx(eps, rel=1e-12)


@pytest.mark.parametrize(
    ("call", "param"),
    [
        (lambda: zcdp_to_approx_dp(-1.0, 1e-6), "rho"),
        (lambda: zcdp_to_approx_dp(math.nan, 1e-6), "rho"),
        (lambda: zcdp_to_approx_dp(0.5, 0.0), "delta"),
        (lambda: zcdp_to_approx_dp(0.5, 1.0), "delta"),
        (lambda: calibrate_rho(1.0, None), "delta"),
        (lambda: calibrate_rho(0.0, 1e-6), "epsilon"),
        (lambda: cks_epsilon_at_order(0.5, 1e-6, 1.0), "alpha"),
    ],
)
def test_validation_names_parameter(call: object, param: str) -> None:
    with pytest.raises(MechanismInputError) as info:
        call()  # type: ignore[operator]
    assert info.value.parameter == param
    assert param in str(info.value)

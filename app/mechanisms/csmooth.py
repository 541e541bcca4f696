"""CSmooth: smooth sensitivity with Laplace-log-normal noise under CDP (paper 5.1.3, App. E.2).

Noise (Bun & Steinke, NeurIPS 2019, "Average-case averages", LLN; paper Lemma 15): with
``Z = X e^{sigma Y}``, ``X ~ Lap(1)``, ``Y ~ N(0, 1)``, releasing ``f(X) + S^t(X) Z / s`` is
``eps'``-CDP, i.e. ``(eps'^2 / 2)``-zCDP, for ``eps' = t / sigma + e^{1.5 sigma^2} s``, where
``S^t`` is the t-smooth sensitivity (paper Lemma 13; computed by :mod:`app.mechanisms.smooth`).

Parameters (Bun–Steinke Sec. 3.1.1 / 7.1, paper App. E.2), for a per-quantile ``eps'``:

* for each ``t`` of a grid: ``sigma`` is the positive root of ``5 eps' sigma^3 - 5 t sigma^2 - t``
  (it minimises the noise variance ``2 S^2 e^{5 sigma^2} / (eps' - t/sigma)^2`` over sigma
  for this t) and ``s = e^{-1.5 sigma^2} (eps' - t / sigma)`` (> 0 at that root);
* ``t`` is chosen to minimise ``S^t(P) e^{2.5 sigma^2} / (eps' - t / sigma)`` (the noise
  standard deviation up to a constant) where ``P`` is PUBLIC synthetic data: 1000 draws from
  N(0, 1) with a fixed public seed, clamped to [-100, 100] — the paper's tuning set. The private
  data is never looked at; the tuning is deterministic and cached per (eps', q). Every
  (t, s, sigma) triple satisfies Lemma 15 exactly, so the tuning affects only accuracy.

Calibration to the request: a query's ``(epsilon, delta)`` is the (epsilon, delta)-DP
guarantee of the whole m-quantile release. ``rho = calibrate_rho(epsilon, delta)``
(:mod:`app.mechanisms.accounting`) is the largest zCDP parameter whose conversion — the
tighter of Canonne–Kamath–Steinke (Prop. 12, minimised over the Renyi order) and Bun–Steinke
(Prop. 1.3) — is at most ``epsilon`` at ``delta``; bisection returns the lower end of a
bracket whose conversion was checked to be ``<= epsilon``, within a relative 1e-12 of the
largest such rho. Each of the m quantiles then uses the CDP parameter
``eps' = sqrt(2 rho / m)``: m releases of ``(eps'^2/2)``-zCDP compose to ``rho``-zCDP
(Bun–Steinke 2016, Lemma 2.3 / paper Lemma 9), hence (epsilon, delta)-DP. The registry entry
declares ZCDP and its ``dp_cost`` is exactly the request ``(epsilon, delta)``: the ledger
debits what was asked. Example: epsilon = 0.5, delta = 1e-6 gives rho ~ 6.64e-3 (the former
reading rho = epsilon^2 / 2 = 0.125 converts to epsilon' ~ 2.42 and was charged as such).

Neighbours: swap only (the smooth-sensitivity analysis is for fixed-size datasets);
``neighbors="add_remove"`` raises :class:`MechanismInputError`, as for ``smooth``.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import brentq

from app.mechanisms.accounting import calibrate_rho
from app.mechanisms.errors import MechanismInputError
from app.mechanisms.histogram import Support, support_from_values
from app.mechanisms.registry import Mechanism, PrivacyNotion
from app.mechanisms.rng import make_rng
from app.mechanisms.smooth import quantile_index, reject_add_remove, smooth_sensitivity
from app.mechanisms.validation import FloatArray, check_delta

#: Public tuning set (paper App. E.2): size, bounds and a fixed, published seed.
TUNING_N = 1000
TUNING_BOUNDS = (-100.0, 100.0)
TUNING_SEED = 20210217
#: t grid relative to eps': log-spaced over three decades up to eps' (61 points).
T_GRID_REL: FloatArray = np.logspace(-3.0, 0.0, 61)


def lln_sigma(eps: float, t: float) -> float:
    """Positive root of ``5 eps sigma^3 - 5 t sigma^2 - t`` (unique by Descartes' rule)."""
    if not (eps > 0.0 and t > 0.0):
        raise ValueError("eps and t must be > 0")

    def poly(sig: float) -> float:
        return 5.0 * eps * sig**3 - 5.0 * t * sig**2 - t

    lo = t / eps  # poly(lo) = -t < 0
    hi = 2.0 * lo + 1.0
    while poly(hi) <= 0.0:
        hi *= 2.0
    return float(brentq(poly, lo, hi, xtol=1e-15, rtol=4.0 * np.finfo(float).eps, maxiter=500))


def lln_parameters(eps: float, t: float) -> tuple[float, float]:
    """(sigma, s) for Lemma 15 at CDP parameter ``eps`` and smoothness ``t``.

    Invariant: ``t / sigma + e^{1.5 sigma^2} s == eps`` (up to rounding) and ``s > 0``.
    """
    sigma = lln_sigma(eps, t)
    s = math.exp(-1.5 * sigma**2) * (eps - t / sigma)
    if not s > 0.0:
        raise FloatingPointError("Laplace-log-normal scale is not positive")
    return sigma, s


@functools.cache
def _tuning_edges() -> FloatArray:
    gen = np.random.Generator(np.random.PCG64(TUNING_SEED))
    a, b = TUNING_BOUNDS
    x = np.sort(np.clip(gen.standard_normal(TUNING_N), a, b))
    out: FloatArray = np.concatenate(([a], x, [b]))
    return out


@functools.lru_cache(maxsize=65536)
def tuned_t(eps: float, q: float) -> float:
    """The t minimising the LLN noise scale for quantile q on the public tuning set.

    Data-independent (depends only on eps', q and the public constants above); cached.
    """
    edges = _tuning_edges()
    j = quantile_index(q, TUNING_N)
    best_t = float("nan")
    best_log = math.inf
    for rel in T_GRID_REL:
        t = float(rel) * eps
        sigma, _ = lln_parameters(eps, t)
        score = (
            math.log(smooth_sensitivity(edges, j, t)) + 2.5 * sigma**2 - math.log(eps - t / sigma)
        )
        if score < best_log:
            best_log, best_t = score, t
    return best_t


def csmooth(
    data: ArrayLike,
    quantiles: ArrayLike,
    *,
    epsilon: float,
    lower: float,
    upper: float,
    neighbors: str = "swap",
    rng: np.random.Generator | None = None,
    delta: float | None = None,
    rho_divisor: int = 1,
) -> FloatArray:
    """CSmooth: order statistics plus Laplace-log-normal noise scaled to smooth sensitivity.

    ``rho = calibrate_rho(epsilon, delta)``; per quantile ``eps' = sqrt(2 rho / m)``;
    ``t = tuned_t(eps', q)`` (public tuning); ``(sigma, s) = lln_parameters(eps', t)``; release
    ``x_{j*} + S^t(X) * Lap(1) * exp(sigma N(0,1)) / s``; clamp to [lower, upper]; sort.

    Guarantee: rho-zCDP under swap neighbours (paper Lemmas 15 and 9), hence
    (epsilon, delta)-DP for the whole release (rho calibrated so that the conversion is
    ``<= epsilon``). ``neighbors="add_remove"`` is refused. ``rho_divisor`` (an integer >= 1)
    runs each row at ``rho / rho_divisor``: k^2 makes the release rho-zCDP for units of k rows
    (app.mechanisms.units).

    Complexity: O(m n log n) time (one smooth sensitivity per quantile), O(n) memory; the
    first call for a new (eps', q) also tunes t on the 1000-point public set (61 smooth
    sensitivities of 1000 points), then it is cached.

    Raises:
        MechanismInputError: for invalid input, a delta outside (0, 1), or add/remove
            neighbours.
    """
    check_delta(delta)
    sup = support_from_values(
        data, quantiles, epsilon=epsilon, lower=lower, upper=upper, neighbors=neighbors
    )
    return csmooth_core(sup, make_rng(rng), delta=delta, rho_divisor=rho_divisor)


def per_quantile_cdp(epsilon: float, delta: float, m: int, rho_divisor: int = 1) -> float:
    """Per-quantile CDP parameter: ``sqrt(2 calibrate_rho(epsilon, delta) / (m rho_divisor))``."""
    return math.sqrt(2.0 * calibrate_rho(float(epsilon), float(delta)) / (m * rho_divisor))


def csmooth_core(
    sup: Support, rng: np.random.Generator, *, delta: float | None = None, rho_divisor: int = 1
) -> FloatArray:
    """CSmooth on a prepared support (order statistics from cumulative counts)."""
    d = check_delta(delta)
    reject_add_remove(sup, "csmooth")
    if isinstance(rho_divisor, bool) or not isinstance(rho_divisor, int) or rho_divisor < 1:
        raise MechanismInputError("rho_divisor", "must be an integer >= 1")
    m = int(sup.quantiles.size)
    n = sup.n
    eps_q = per_quantile_cdp(sup.epsilon, d, m, rho_divisor)
    out = np.empty(m, dtype=np.float64)
    for k, q in enumerate(sup.quantiles):
        t = tuned_t(eps_q, float(q))
        sigma, s = lln_parameters(eps_q, t)
        j = quantile_index(float(q), n)
        sens = smooth_sensitivity(sup.edges, j, t, cum=sup.cum)
        z = rng.laplace() * math.exp(sigma * rng.standard_normal())
        out[k] = sup.value_of_rank(j) + sens * z / s
    np.clip(out, sup.lower, sup.upper, out=out)
    out.sort()
    return out


def csmooth_cost(epsilon: float, delta: float | None) -> tuple[float, float]:
    """Exactly the request: rho is calibrated so that the release is (epsilon, delta)-DP."""
    return (float(epsilon), check_delta(delta))


CSMOOTH = Mechanism(
    name="csmooth",
    fn=csmooth,
    core=csmooth_core,
    notion=PrivacyNotion.ZCDP,
    summary=(
        "Smooth sensitivity, Laplace-log-normal noise (Bun-Steinke), zCDP calibrated to the"
        " requested (epsilon, delta), swap only."
    ),
    requires_delta=True,
    method_params=("delta",),
    cost_fn=csmooth_cost,
    neighbors=("swap",),
    zcdp_fn=lambda epsilon, delta, _m: Fraction(calibrate_rho(float(epsilon), check_delta(delta))),
    zcdp_basis="rho-zCDP by construction (the rho its noise is calibrated to, from the "
    "query's epsilon and delta): debited as is",
)

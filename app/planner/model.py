"""The planner's error model: features, the fitted coefficients, prediction.

For a method, the mean missed points per quantile (the paper's metric, averaged over the m
quantiles and over the mechanism's randomness) is modelled as

    log(E + 1/4) = β · φ(n, m, ε)

and then softly capped at the error of an answer that ignores the data (n/4 missed points):
``E' = (E⁻² + (n/4)⁻²)^(-1/2)``. Two feature forms, from the analysis of the methods:

* **rank** (the exponential-mechanism methods: JointExp and its smoothed variant, IndExp,
  AppIndExp, ApproximateQuantiles): φ = (1, ℓ, ℓ², log ε, log g, softplus(k − log g)) with
  ℓ = log(m + 1) and g = ε·n/(m + 1), the gap between target ranks in units of 1/ε. An
  exponential-mechanism quantile at privacy ε' misses O(1/ε') points (its output is a
  two-sided geometric of rate ε'/2 in rank around the target, plus a tail term logarithmic
  in the spread of the data): IndExp (ε' = ε/m) ≈ c·m/ε, AppIndExp (advanced composition,
  ε' ≈ ε/√(m log 1/δ)) ≈ c·√m/ε, ApproximateQuantiles (ε split over log₂(m + 1) levels)
  ≈ c·log(m + 1)/ε: linear in log ε, polynomial or logarithmic in m, hence ℓ and ℓ². JointExp
  (Gillenwater et al., Thm 3) pays O(log(·)/ε) per quantile while the gaps are wide
  (g large) and breaks down when neighbouring quantiles' kernels overlap (g of order one):
  the hinge softplus(k − log g), with the knee k chosen per method by held-out error, is
  zero for wide gaps and grows like −log g when they close. The other methods feel the
  same crowding when the error approaches the gap;
* **value** (the noise-adding methods, Smooth and CSmooth): φ = (1, ℓ, ℓ², log ε, log n,
  log ε · log n). They add noise in value space, so their missed points grow with n (the
  density of points at the quantile), and the noise scale shrinks with ε at a rate that
  itself depends on n (smooth sensitivity).

The offset 1/4 (rather than 1) keeps the 1/ε law visible at small errors (at ε = 10 most
methods miss well under one point) without letting exact zeros dominate the fit.
β and k are fitted per method by least squares on the committed error map (``python -m
app.planner.fit``); the 90 % bound is the mean times the 90th percentile of
(trial mean / cell mean) pooled per m over the same map, widened by the model's held-out
error (leave out a whole level of n, m or ε, :func:`app.planner.fit.cross_validate`;
:meth:`MethodModel.ratio90`). All of it lives in ``coefficients.json``.
The model sees only public figures: method, n (or the size hint), m, ε, δ.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
#: The 90 % point of the standard normal.
Z90 = 1.2816


#: log(E + OFFSET) is what the features predict.
OFFSET = 0.25


def features(
    n: float, m: float, epsilon: float, form: str = "rank", knee: float = 0.0
) -> FloatArray:
    """φ(n, m, ε) of the module docstring, in ``form`` (``rank`` with its ``knee`` k)."""
    ell = math.log(m + 1.0)
    le, ln = math.log(epsilon), math.log(n)
    if form == "value":
        return np.array([1.0, ell, ell * ell, le, ln, le * ln], dtype=np.float64)
    lg = le + ln - ell
    hinge = float(np.logaddexp(0.0, knee - lg))
    return np.array([1.0, ell, ell * ell, le, lg, hinge], dtype=np.float64)


@dataclass(frozen=True)
class MethodModel:
    """Fitted coefficients of one method and its bound ratios per m."""

    beta: tuple[float, ...]
    r90_ms: tuple[float, ...]
    r90: tuple[float, ...]
    fit_cells: int
    form: str = "rank"
    knee: float = 0.0
    #: RMS of log((prediction + 1) / (measured + 1)) over the fitted cells, in sample.
    sigma: float = 0.0
    #: RMS log error on map levels left out of the fit (``app.planner.fit --cv``): the
    #: model's uncertainty on cells it has not seen, which is what a quote is asked about.
    cv_sigma: float = 0.0

    def mean(self, n: float, m: int, epsilon: float) -> float:
        phi = features(n, m, epsilon, self.form, self.knee)
        raw = max(math.exp(float(np.dot(np.asarray(self.beta), phi))) - OFFSET, 1e-3)
        cap = n / 4.0
        return float((raw**-2 + cap**-2) ** -0.5)

    def ratio90(self, m: int) -> float:
        """bound90 / mean: the randomness of one release (the pooled 90th percentile of
        trial / cell mean at this m) combined in log space with the model's uncertainty
        (1.2816 σ, the 90 % point of a normal residual), σ the held-out error where known
        (else the in-sample one)."""
        spread = math.log(float(np.interp(math.log(m), np.log(self.r90_ms), self.r90)))
        return math.exp(math.hypot(spread, Z90 * max(self.sigma, self.cv_sigma)))


@cache
def _coefficients() -> dict[str, Any]:
    """``app/planner/coefficients.json``, read once for every model set."""
    text = resources.files("app.planner").joinpath("coefficients.json").read_text("utf-8")
    out: dict[str, Any] = json.loads(text)
    return out


#: The model sets: ``continuous`` fitted on distinct values, ``tied`` on integer-valued data
#: (every quantile on a long run of ties), ``clamped`` on data with a share clamped at a
#: bound (one heavy atom); :mod:`app.planner.fit`.
REGIMES = ("continuous", "tied", "clamped")


@cache
def load_models(regime: str = "continuous") -> dict[str, MethodModel]:
    """The committed coefficients (``app/planner/coefficients.json``) of one model set, read
    once: ``continuous`` (the file's top-level ``methods``) or another of :data:`REGIMES`
    (``regimes.<name>.methods``)."""
    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}")
    raw = _coefficients()
    part = raw if regime == "continuous" else raw["regimes"][regime]
    return {
        name: MethodModel(
            beta=tuple(float(b) for b in entry["beta"]),
            r90_ms=tuple(float(x) for x in entry["r90_ms"]),
            r90=tuple(float(x) for x in entry["r90"]),
            fit_cells=int(entry["fit_cells"]),
            form=str(entry.get("form", "rank")),
            knee=float(entry.get("knee", 0.0)),
            sigma=float(entry.get("rms_log_residual", 0.0)),
            cv_sigma=float(entry.get("cv_rms_log_residual", 0.0)),
        )
        for name, entry in part["methods"].items()
    }

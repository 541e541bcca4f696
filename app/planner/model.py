"""The planner's error model: features, the fitted coefficients, prediction.

For a method, the mean missed points per quantile (the paper's metric, averaged over the m
quantiles and over the mechanism's randomness) is modelled as

    log(1 + E) = β · φ(n, m, ε),   φ = (1, ℓ, ℓ², log ε, log n, log ε · log n),  ℓ = log(m + 1)

and then softly capped at the error of an answer that ignores the data (n/4 missed points):
``E' = (E⁻² + (n/4)⁻²)^(-1/2)``. The form is chosen from the analysis of the methods:

* an exponential-mechanism quantile at privacy ε' misses O(1/ε') points in expectation (its
  output is a two-sided geometric of rate ε'/2 in rank around the target, plus a tail term
  logarithmic in the grid), so IndExp (ε' = ε/m) is ≈ c·m/ε, AppIndExp (advanced
  composition, ε' ≈ ε/√(m log 1/δ)) ≈ c·√m/ε and ApproximateQuantiles (ε split over
  log₂(m+1) levels) ≈ c·log(m+1)/ε: all linear in log ε and polynomial/logarithmic in m,
  hence ℓ and ℓ²;
* JointExp's error per quantile (Gillenwater et al., Thm 3) grows with m and 1/ε and depends
  on the gaps n/(m+1) between target ranks: captured by ℓ, ℓ², log n;
* the noise-adding methods (Smooth, CSmooth) add noise in value space, so their missed
  points grow with n (the density of points at the quantile) and the noise scale shrinks
  with ε at a rate that itself depends on n (smooth sensitivity): hence log n and
  log ε · log n.

β is fitted per method by least squares on the committed error map (``python -m
app.planner.fit``); the 90 % bound is the mean times the 90th percentile of
(trial mean / cell mean) pooled per m over the same map, widened by the model's held-out
error (leave-one-level-out, :func:`app.planner.fit.cross_validate`;
:meth:`MethodModel.ratio90`). Both live in ``coefficients.json``.
The model sees only public figures: method, n (or the size hint), m, ε, δ.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from importlib import resources

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
#: The 90 % point of the standard normal.
Z90 = 1.2816


def features(n: float, m: float, epsilon: float) -> FloatArray:
    """φ(n, m, ε) of the module docstring."""
    ell = math.log(m + 1.0)
    le, ln = math.log(epsilon), math.log(n)
    return np.array([1.0, ell, ell * ell, le, ln, le * ln], dtype=np.float64)


@dataclass(frozen=True)
class MethodModel:
    """Fitted coefficients of one method and its bound ratios per m."""

    beta: tuple[float, ...]
    r90_ms: tuple[float, ...]
    r90: tuple[float, ...]
    fit_cells: int
    #: RMS residual of the fit in log(1 + E), in sample.
    sigma: float = 0.0
    #: RMS log error on map levels left out of the fit (``app.planner.fit --cv``): the
    #: model's uncertainty on cells it has not seen, which is what a quote is asked about.
    cv_sigma: float = 0.0

    def mean(self, n: float, m: int, epsilon: float) -> float:
        raw = math.exp(float(np.dot(np.asarray(self.beta), features(n, m, epsilon)))) - 1.0
        raw = max(raw, 1e-3)
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
def load_models() -> dict[str, MethodModel]:
    """The committed coefficients (``app/planner/coefficients.json``), read once."""
    text = resources.files("app.planner").joinpath("coefficients.json").read_text("utf-8")
    raw = json.loads(text)
    return {
        name: MethodModel(
            beta=tuple(float(b) for b in entry["beta"]),
            r90_ms=tuple(float(x) for x in entry["r90_ms"]),
            r90=tuple(float(x) for x in entry["r90"]),
            fit_cells=int(entry["fit_cells"]),
            sigma=float(entry.get("rms_log_residual", 0.0)),
            cv_sigma=float(entry.get("cv_rms_log_residual", 0.0)),
        )
        for name, entry in raw["methods"].items()
    }

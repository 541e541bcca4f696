"""IndExp: m independent single-quantile exponential mechanisms (Smith 2011; paper Sec. 5.1.1)."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from app.mechanisms.exponential import exponential_mechanism_interval
from app.mechanisms.histogram import Support, support_from_values
from app.mechanisms.registry import Mechanism, PrivacyNotion, bounded_range_rho
from app.mechanisms.rng import make_rng
from app.mechanisms.validation import FloatArray, IntArray


def indexp_sensitivity(q: float, neighbors: str) -> float:
    """Sensitivity of ``u(X, o) = -|#{x <= o} - q n|``: 1 under swap, max(q, 1-q) add/remove."""
    return 1.0 if neighbors == "swap" else max(q, 1.0 - q)


def independent_exponential(
    sup: Support, per_quantile_epsilon: float, rng: np.random.Generator
) -> FloatArray | IntArray:
    """Run the single-quantile exponential mechanism once per quantile, each at the given epsilon.

    Shared by IndExp (epsilon/m each, basic composition) and AppIndExp (epsilon from the
    bounded-range composition bound). O(m (log d + min(d, 700 / c))) time on the support.
    """
    buf = np.empty(sup.d + 1, dtype=np.float64)
    idx = np.empty(sup.quantiles.size, dtype=np.int64)
    for j, q in enumerate(sup.quantiles):
        c = per_quantile_epsilon / (2.0 * indexp_sensitivity(float(q), sup.neighbors))
        idx[j] = exponential_mechanism_interval(sup.edges, sup.cum, float(q), c, rng, buf)
    return sup.points_in(idx, rng)


def indexp_core(sup: Support, rng: np.random.Generator) -> FloatArray | IntArray:
    """IndExp on a prepared support (epsilon / m per quantile)."""
    return independent_exponential(sup, sup.epsilon / sup.quantiles.size, rng)


def indexp(
    data: ArrayLike,
    quantiles: ArrayLike,
    *,
    epsilon: float,
    lower: float,
    upper: float,
    neighbors: str = "swap",
    rng: np.random.Generator | None = None,
) -> FloatArray:
    """IndExp: each of the m quantiles by its own exponential mechanism with epsilon/m.

    Guarantee: epsilon-DP by basic composition (paper Lemma 1, Lemma 7).
    Complexity: O(n log n) to sort and count, then O(m d) at worst; O(d) memory.
    """
    sup = support_from_values(
        data, quantiles, epsilon=epsilon, lower=lower, upper=upper, neighbors=neighbors
    )
    return np.asarray(indexp_core(sup, make_rng(rng)), dtype=np.float64)


INDEXP = Mechanism(
    name="indexp",
    fn=indexp,
    core=indexp_core,
    notion=PrivacyNotion.PURE_DP,
    summary="Independent exponential mechanisms, epsilon/m each (Smith 2011).",
    zcdp_fn=lambda epsilon, _delta, m: m * bounded_range_rho(epsilon / m),
    zcdp_basis="m exponential mechanisms at epsilon/m, each (epsilon/m)-bounded-range: "
    "rho = m (epsilon/m)^2/8 = epsilon^2/(8m)",
)

"""IndExp: m independent single-quantile exponential mechanisms (Smith 2011; paper Sec. 5.1.1)."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from app.mechanisms.base import (
    FloatArray,
    Mechanism,
    Prepared,
    PrivacyNotion,
    exponential_mechanism_interval,
    make_rng,
    prepare,
    uniform_in_intervals,
)


def indexp_sensitivity(q: float, neighbors: str) -> float:
    """Sensitivity of ``u(X, o) = -|#{x <= o} - q n|``: 1 under swap, max(q, 1-q) add/remove."""
    return 1.0 if neighbors == "swap" else max(q, 1.0 - q)


def independent_exponential(
    prep: Prepared, per_quantile_epsilon: float, rng: np.random.Generator
) -> FloatArray:
    """Run the single-quantile exponential mechanism once per quantile, each at the given epsilon.

    Shared by IndExp (epsilon/m each, basic composition) and AppIndExp (epsilon from the
    bounded-range composition bound). O(m n) time after the O(n log n) sort.
    """
    buf = np.empty(prep.n + 1, dtype=np.float64)
    n = prep.n
    idx = np.empty(prep.quantiles.size, dtype=np.int64)
    for j, q in enumerate(prep.quantiles):
        c = per_quantile_epsilon / (2.0 * indexp_sensitivity(float(q), prep.neighbors))
        idx[j] = exponential_mechanism_interval(prep.edges, float(q) * n, c, rng, buf)
    return uniform_in_intervals(prep.edges, idx, rng)


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
    Complexity: O(n log n + m n) time, O(n) memory.
    """
    prep = prepare(data, quantiles, epsilon=epsilon, lower=lower, upper=upper, neighbors=neighbors)
    gen = make_rng(rng)
    return independent_exponential(prep, prep.epsilon / prep.quantiles.size, gen)


INDEXP = Mechanism(
    name="indexp",
    fn=indexp,
    notion=PrivacyNotion.PURE_DP,
    summary="Independent exponential mechanisms, epsilon/m each (Smith 2011).",
)

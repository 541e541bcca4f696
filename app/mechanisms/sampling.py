"""Inverse-CDF sampling over max-normalised weights with one uniform per draw."""

from __future__ import annotations

import numba
import numpy as np

from app.mechanisms.validation import FloatArray


@numba.njit(cache=True, nogil=True)
def inverse_cdf_pick(weights: FloatArray, u: float) -> int:  # pragma: no cover - compiled
    """Index of the first cumulative weight exceeding ``u * total`` (never a zero weight).

    Returns the last positive index when rounding leaves ``u * total`` at the total, and -1
    only when every weight is zero.
    """
    total = 0.0
    for k in range(weights.size):
        total += weights[k]
    target = u * total
    acc = 0.0
    last_positive = -1
    for k in range(weights.size):
        wk = weights[k]
        if wk > 0.0:
            acc += wk
            last_positive = k
            if acc > target:
                return k
    return last_positive


def sample_index(weights: FloatArray, rng: np.random.Generator) -> int:
    """Draw index ``k`` with probability ``weights[k] / weights.sum()`` using one uniform.

    ``weights`` must be non-negative with a positive, finite sum. Zero weights are never
    returned.
    """
    k = int(inverse_cdf_pick(weights, rng.random()))
    if k < 0:
        raise FloatingPointError("sampling weights are all zero")
    return k

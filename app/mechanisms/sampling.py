"""Sampling an index in proportion to computed weights.

:func:`pick_weights` is exact with respect to the doubles it is given: every exponential-
mechanism pick uses it (JointExp's draws, and the single-quantile mechanism of IndExp,
AppIndExp and AQ, :func:`app.mechanisms.exponential.node_pick`). :func:`inverse_cdf_pick`
is the inverse CDF over one 53-bit uniform that they used before, kept for the law audit's
reconstruction of the earlier draw (its negative control).
"""

from __future__ import annotations

import bisect
import itertools
import math

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


#: Unit roundoff of a double, and the smallest normal double.
_U = 2.0**-53
_MIN_NORMAL = 2.0**-1022
#: Weights totalling less than this are always resolved in exact arithmetic (their margins
#: below could meet the subnormal range, which the passes flush to 0.0).
_SMALL_TOTAL = 2.0**-900


@numba.njit(cache=True, nogil=True)
def pick_word(weights: FloatArray, word: np.uint64) -> int:  # pragma: no cover - compiled
    """The index an ideal uniform ``U`` picks when its first 64 bits are ``word``, if certain.

    The pick is the index ``i`` with ``C_{i-1} <= U S < C_i``, where ``C`` are the exact
    prefix sums of the weights (real numbers: no rounding) and ``S`` their total, so
    ``P(i) = weights[i] / S`` exactly. ``U`` lies in ``[word, word + 1) / 2^64``; the
    prefix sums are formed in doubles, whose recursive sum of n non-negative terms is
    within ``γ_n = n u / (1 - n u)`` of the exact one (Higham, Accuracy and Stability of
    Numerical Algorithms, 2002, eq. 4.4), and the targets ``word 2^-64 S`` are within 3 u
    more. Returns ``i`` when both ends of ``U``'s interval pick ``i`` with a margin of
    ``5 (γ_n + 3u)`` that covers every rounding, -1 when every weight is zero, and -2 when
    the interval is too close to a cut point to decide in doubles (probability ~10 n u;
    :func:`pick_weights` then decides exactly). Zero weights are never picked.
    """
    n = weights.size
    total = 0.0
    for k in range(n):
        total += weights[k]
    if not total > 0.0:
        return -1
    if total < _SMALL_TOTAL or not math.isfinite(total):
        return -2
    eta = 5.0 * ((n + 1.0) * _U / (1.0 - (n + 1.0) * _U) + 3.0 * _U)
    t_lo = (float(word) * 2.0**-64) * total
    t_hi = ((float(word) + 1.0) * 2.0**-64) * total
    acc = 0.0
    for k in range(n):
        wk = weights[k]
        if wk > 0.0:
            before = acc
            acc += wk
            if acc > t_lo:
                if before * (1.0 + eta) <= t_lo and t_hi * (1.0 + eta) < acc:
                    return k
                return -2
    return -2


def resolve_exactly(weights: FloatArray, word: int, rng: np.random.Generator) -> int:
    """The pick of :func:`pick_word` in exact integer arithmetic, with more bits of ``U``.

    Every double is an integer multiple of 2^-1074, so the weights scaled by 2^1074 and
    their prefix sums are exact Python integers. ``U``'s binary expansion is extended 64
    bits at a time (raw generator words) until ``[N, N + 1) 2^-B S`` lies inside one
    ``[C_{i-1}, C_i)``: the pick is then the one every completion of ``U`` makes.
    """
    scaled = []
    for w in weights.tolist():
        if w < _MIN_NORMAL:  # subnormals count as 0.0, as the flushed passes treat them
            scaled.append(0)
            continue
        p, q = float(w).as_integer_ratio()
        scaled.append(p * ((1 << 1074) // q))
    prefix = list(itertools.accumulate(scaled))
    total = prefix[-1]
    if total <= 0:
        return -1
    numer, bits = int(word), 64
    raw = rng.bit_generator.random_raw
    while True:
        lo, hi = numer * total, (numer + 1) * total  # U S in [lo, hi) / 2^bits
        k = bisect.bisect_right(prefix, lo >> bits)
        while k < len(prefix) and prefix[k] << bits <= lo:
            k += 1
        before = prefix[k - 1] << bits if k > 0 else 0
        if before <= lo and hi <= prefix[k] << bits:
            return k
        numer, bits = (numer << 64) | int(raw()), bits + 64


def pick_weights(weights: FloatArray, word: int, rng: np.random.Generator) -> int:
    """Index ``k`` with probability exactly ``weights[k] / sum(weights)``, the first 64 bits
    of the uniform being ``word`` (a raw generator word); -1 when every weight is zero.

    Exact with respect to the doubles given: no rounding of a cumulative sum or of a 53-bit
    uniform enters the law (an inverse CDF over doubles moves each outcome's probability by
    up to its cut points' rounding, ~n u of the total, and cannot give a weight below
    2^-53 of the total its share). ``rng`` supplies further bits only in the rare case
    :func:`pick_word` cannot decide in doubles. One raw word per pick otherwise, as
    ``rng.random()`` consumes, so the generator's stream advances as it did.
    """
    w = np.ascontiguousarray(weights, dtype=np.float64)
    k = int(pick_word(w, np.uint64(word)))
    if k == -2:
        k = resolve_exactly(w, int(word), rng)
    return k

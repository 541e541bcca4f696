"""The range rule of JointExp's rows and draws, with its constants and their derivation.

Rows are exact only down to a truncation floor: a linear row to the smallest normal double
below its maximum (``LINEAR_RANGE``, less the log of the terms an entry sums), a log row to
``keep`` e-folds below it. What a row drops is an absolute error that later rows carry
forward, growing per row by at most ``kappa`` (:func:`log_kappa`, the kernel's sum) times
the width of the entry it lands on. The rule (:func:`range_holds`) requires every earlier
floor, grown that way, to stay 2^-52 m (``headroom``) below the current row's maximum, and
below each draw's largest weight. It charges the growth at the median positive width
(:func:`median_log_width`), which is not a worst-case bound; untilted passes are also held
to the sound bound of :mod:`~app.mechanisms.jointexp.error_bound` at every draw, tilted ones
to the certificate of :mod:`~app.mechanisms.jointexp.certificate` at their last draw
(docs/mechanisms.md, "Range rule").

A pass that breaks the rule raises one of the exceptions below; the caller retries with
more range (tilted linear rows, the log pass, a wider log pass), so no draw is ever made
from rows that lack range.
"""

from __future__ import annotations

import math

import numpy as np

from app.mechanisms import select
from app.mechanisms.validation import FloatArray

#: What a linear row can lose: each entry sums at most ~4 (d + 1) terms, each exact to the
#: smallest normal double (2^-1022 = e^-708.4) of the larger of its own and the previous row's
#: maximum; ``LINEAR_RANGE - log(4 (d + 1))`` e-folds is the row's truncation floor.
LINEAR_RANGE = 708.0
#: Required headroom (e-folds) between the propagated truncation error and a row's maximum:
#: 2^-52 (36.04) plus the number of repeat levels (<= m, added as log) and slack.
HEADROOM = 40.0


class LinearGuardTripped(Exception):
    """A linear-space row lost too much range; the log-space pass must be used."""


class SoundGuardTripped(LinearGuardTripped):
    """An untilted linear pass's draw met the median-width rule but not the sound error bound
    (error_bound), or a tilted pass's last draw did not meet the certificate of its
    dropped mass (certificate): the retry is the log pass, not a (further) tilted one."""


class LogGuardTripped(Exception):
    """A log-space row fell further than its kept range allows; keep more and start over."""

    def __init__(self, needed_keep: float = 0.0) -> None:
        super().__init__(needed_keep)
        self.needed_keep = needed_keep


def linear_floor(intervals: int) -> float:
    """e-folds below a linear row's maximum where its truncation floor lies: each entry
    sums at most ~4 x ``intervals`` terms, each exact to the smallest normal double
    (see LINEAR_RANGE)."""
    return LINEAR_RANGE - math.log(4.0 * intervals)


def headroom(m: int) -> float:
    """e-folds required between the propagated truncation error and a row's maximum:
    HEADROOM plus the log of the repeat levels (at most m + 1)."""
    return HEADROOM + math.log(m + 1.0)


# -- the dropped mass a release may lose (δ; docs/mechanisms.md, "The acceptance step") ----------
#
# The acceptance step makes the law exact on every sequence the passes keep; what it cannot
# restore is the mass D of the sequences they drop, which enters the guarantee as
# δ = e^ε D (1 + 2D). Three floors bound D on every pass, each scaled by e^-4c (ε = 2cΔ <= 4c)
# so that e^ε D stays below 10^-12 at any ε the service accepts: the truncation floors (the
# sound error bound or the certificate at the last draw, ``last_headroom``), the pruned
# repeat levels (``prune_floor``) and the draws' flushed weights (``tiny_draw``). A backward
# sweep that rebuilds its pass mid-way loses at most twice the sum of its passes' D
# (docs/mechanisms.md, "Passes changed mid-sweep"), so the pass built after g rebuilds
# (``generation`` g) gets the share 2^-(g + 2) of the budget: the shares sum to 1/2 over
# any number of rebuilds, and twice that is the budget.


def _share(generation: int) -> float:
    """log of the pass's share of the dropped-mass budget, 2^-(generation + 2)."""
    return -(generation + 2.0) * math.log(2.0)


def last_headroom(c: float, m: int, generation: int = 0) -> float:
    """e-folds the sound error bound (or a tilted pass's certificate) must leave below the
    last draw's largest weight, so that the truncated mass is at most ``e^-29 e^-4c / (m +
    1)`` of the total (2.5e-13 e^-4c) times the pass's share; never less than the headroom
    of the other draws."""
    return max(headroom(m), 29.0 - _share(generation) + 4.0 * c + math.log(m + 1.0))


def prune_floor(c: float, m: int, generation: int = 0) -> float:
    """Repeat levels below this fraction of level 1 at the same interval are dropped. The
    mass they drop is at most ``floor m (m + 1) / 2`` of the total (each dropped entry's
    completions are at most ``floor`` of a kept prefix's, at most j levels per row j):
    ``2^-41 e^-4c`` (4.5e-13 e^-4c) times the pass's share at most, and never more than 2^-60
    per entry."""
    budget = math.exp(-41.0 * math.log(2.0) + _share(generation) - 4.0 * c)
    return min(2.0**-60, budget / (0.5 * m * (m + 1.0)))


def tiny_draw(c: float, generation: int = 0) -> float:
    """A linear draw's largest weight must be at least this (in its scaled units), else its
    weights are formed in log space. The weights a linear draw loses are products below
    2^-1022, fewer than 2^30 of them, so at most ``2^-992 / top`` of the largest; over at
    most 2^10 draws, with ``top >= 2^-938 e^4c`` over the pass's share, at most ``2^-44
    e^-4c`` times the share of the total. At least 2^-900 (the floor before δ was
    budgeted)."""
    return max(2.0**-900, math.exp(-938.0 * math.log(2.0) - _share(generation) + 4.0 * c))


def range_room(intervals: int, m: int) -> float:
    """e-folds a linear row over ``intervals`` intervals keeps above its truncation floor
    less the headroom for ``m`` quantiles: the range the range rule leaves to a tilt."""
    return linear_floor(intervals) - headroom(m)


def range_holds(peak: float, j: int, log_growth: float, gmax: float, room: float) -> bool:
    """Whether every earlier truncation, grown per row, is ``room`` e-folds below ``gmax``.

    With ``g = log_growth`` (kappa times the median width) and
    ``peak = max_l (floor_l - l g)`` this is ``floor_l + (j - l) g <= gmax - room``
    for all ``l <= j``: the absolute error any row's dropped entries can have caused in
    row j stays 2^-52 m below its maximum (``room`` = :func:`headroom`). Unlike a bound on
    the fall from the previous row alone, it also catches several rows in a row falling
    (each fall spends range that the earlier rows' truncation no longer has).
    """
    return peak + j * log_growth <= gmax - room


def log_kappa(c: float, mu: float, n1: int) -> float:
    """log kappa: one row's error growth bound for the kernel tilted by ``mu`` (0: untilted).

    The near part sums to at most ``e^(-(c-mu) f) / (1 - e^-(c-mu))``, the far part to
    ``e^(-(c+mu)(1-f)) / (1 - e^-(c+mu))``; both are convex in f, so the larger end
    (f = 0 or 1) bounds their sum (untilted: ``(1 + r) / (1 - r)`` at either end). At most
    ``n1`` terms, each <= 1; the repeat levels add at most 1/2.
    """
    qa, qb = -math.expm1(-(c - mu)), -math.expm1(-(c + mu))
    kern = max(1.0 / qa + math.exp(-(c + mu)) / qb, math.exp(-(c - mu)) / qa + 1.0 / qb)
    return math.log(min(kern, float(n1)) + 0.5)


def median_log_width(logw: FloatArray) -> float:
    """log of the median positive width (0.0 if none): the width errors are charged at.

    ``logw`` holds no NaN (-inf marks a zero width). np.median's value (the mean of the two
    middle values for an even count) by one radix selection over the whole array (the -inf
    entries sort first, so the k-th positive width is entry ``k + zeros``) and one pass for
    the value below it: O(d) whatever the order and the ties (numpy's introselect took from
    12 to 104 ms on two samples of one distribution; a grid's log widths are heavily tied).
    """
    x = np.ascontiguousarray(logw, dtype=np.float64)
    zeros = x.size - int(np.count_nonzero(x > -math.inf))
    size = x.size - zeros
    if size == 0:
        return 0.0
    half = size // 2
    if x.size <= _SORT_BELOW:  # small: a sort costs less than the selection's tables
        s = np.sort(x)
        if size % 2:
            return float(s[zeros + half])
        return float((s[zeros + half - 1] + s[zeros + half]) / 2.0)
    upper = select.kth_smallest(x, zeros + half)
    if size % 2:
        return upper
    below, largest = select.max_below(x, upper)
    lower = largest if below - zeros == half else upper  # else upper is also the (half-1)-th
    return float((lower + upper) / 2.0)


#: Inputs up to this size take :func:`median_log_width`'s sort instead of the selection.
_SORT_BELOW = 1 << 12

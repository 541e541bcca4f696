"""Speed-only choices of JointExp: which tilts to try and how far to widen a log pass.

Nothing here decides the law. The functions take numbers (the privacy parameter, the
positions and gaps, and the range the law's rule leaves, ``range_room`` and
``linear_range``, computed by :mod:`~app.mechanisms.jointexp.range_rule`) and return the
tilts or ranges to try; every pass they choose checks its own range rule, and one that
fails is retried another way. This module imports nothing from the package.

Terms: ``c = epsilon / (2 Δ)``; a pass tilted by ``mu`` stores row j as
``alpha e^(-mu (P - T_j))`` with ``T_j = n_1 + .. + n_j``; ``range_room`` is a linear row's
range less the headroom the range rule requires (e-folds); ``linear_range`` the e-folds a
linear row spans (``LINEAR_RANGE``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


LOG_KEEP = 3000.0  # log-space rows keep entries within this many e-folds of their maximum
PROBE_KEEP = 750.0  # range of the probe pass that sizes LOG_KEEP from the rows' falls


#: Tilts tried, as mu = c (1 - 2^-k) for k in quarter steps: the smaller c - mu, the
#: further below its maximum a linear row reaches (~745 / (c - mu) positions) and the wider
#: (slower, larger) it is, so the least tilt that holds is worth finding finely: on 5 %
#: clamped data mu = 0.92 c holds where the next power of two, 0.9375 c, is 25 % slower.
TILT_STEPS = tuple(k / 4.0 for k in range(4, 49))


#: e-folds kept in hand when a tilt is judged from the probe's rows. The probe's maxima are
#: lower bounds; on rows that fall they are far too low (they lack the deep tail the tilt
#: lifts: on 5 %-clamped data tilts whose estimate fell short by ~120 e-folds held), on the
#: others within ~2 e-folds. A chosen tilt whose forward rows trip is followed by larger
#: ones (TILT_RETRIES, while c - mu >= c / 64) before the log pass.
TILT_MARGIN = 10.0


#: steps of k (mu = c (1 - 2^-k)) tried after a chosen tilt trips, before the log pass
TILT_RETRIES = (0.5, 1.0)


#: steps of k after the deficit's first tilt (:func:`deficit_tilts`): on continuous data
#: its first holds, on rounded data (positions in steps of 10 to 1000) up to 1.5 steps
#: more, whose shorter steps trip within a few rows (n = 10^6 rounded to 10^-3 with 5 %
#: clamped: four tilted tries, 0.05 s in all)
DEFICIT_STEPS = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0)


#: e-folds the model's depth keeps in hand (:func:`deficit_tilts`): the model fell short
#: of the real need by ~10 e-folds for one clamped bound and ~32 for both
DEFICIT_MARGIN = 32.0


#: Longest decay table a tilted pass may build (entries; 32 MiB). A tilted row's near part
#: decays at c - mu, so its table reaches ``750 / (c - mu)`` positions (capped by the data's
#: last position, which is private under add/remove neighbours: one atom of 5·10^7 records at
#: epsilon = 0.001 built tables of 5·10^7 entries, 0.4 s and 400 MB, against 2 ms for 10
#: records). Tilts are speed-only; one whose table would be longer is not tried, and the
#: pass runs untilted or in log space, so time and memory are bounded by public figures.
DECAY_TABLE_MAX = 1 << 22


def larger_tilt(c: float, mu: float, step: float) -> float:
    """The tilt ``step`` further along mu = c (1 - 2^-k): c - mu shrinks by 2^-step."""
    return c * (1.0 - (1.0 - mu / c) * math.pow(2.0, -step))


def larger_tilts(c: float, mu: float) -> list[float]:
    """The tilts tried after ``mu`` trips (TILT_RETRIES steps further), while their rows stay
    narrow enough to be worth it (c - mu >= c / 64)."""
    return [t for t in (larger_tilt(c, mu, s) for s in TILT_RETRIES) if c - t >= c / 64]


def keep_after(needed_keep: float) -> float:
    """The range the exact log pass starts with: enough for the falls a probe saw
    (``needed_keep``, 0.0: none)."""
    return LOG_KEEP if needed_keep == 0.0 else max(LOG_KEEP, needed_keep + 200.0)


def choose_tilt(
    c: float,
    gaps: FloatArray,
    gmaxes: FloatArray,
    modes: FloatArray,
    prof_pos: FloatArray,
    prof_val: FloatArray,
    linear_floor: float,
    headroom: float,
    growth: Callable[[float], float],
) -> float:
    """The tilt under which linear rows should hold a probe's falls (0.0: none found).

    A tilted row j is stored as ``alpha e^(-mu (P - T_j))`` (``T_j = n_1 + .. + n_j``), so
    its maximum is at least the tilted value at the probe's mode,
    ``gmax_j - mu (mode_j - T_j)``, and at each of the row's profiled columns (``prof_pos``,
    ``prof_val``: logs on the common scale). Rows whose mass is pushed below their targets
    (data clamped at a bound, a quantile inside a tie) rise by the tilt as much as they fell.
    Each candidate is judged by the linear pass's own range rule on those estimated
    maxima (``linear_floor``, ``headroom``), with the tilted kernel's growth per row
    (``growth(mu)``: log kappa plus the median log width); the least tilt that passes is
    chosen (the narrowest rows). The pass that runs checks its own range, so this only
    decides speed.
    """
    m = gaps.size - 1
    targets = np.cumsum(gaps[:m])
    idx = np.arange(1, m + 1, dtype=np.float64)
    for k in TILT_STEPS:
        mu = c * (1.0 - math.pow(2.0, -k))
        g = growth(mu)
        # the tilted maximum is at least the tilted value at the mode and at every
        # profiled column (all lower bounds: the probe's rows lack range)
        gm = np.maximum(
            gmaxes - mu * (modes - targets),
            np.max(prof_val - mu * (prof_pos - targets[:, None]), axis=1),
        )
        floors = np.maximum(gm, np.concatenate(([gm[0]], gm[:-1]))) - linear_floor
        shifted = gm - idx * g
        later_min = np.minimum.accumulate(shifted[::-1])[::-1]
        if np.all(floors - idx * g <= later_min - headroom - TILT_MARGIN):
            return mu
    return 0.0


def wider(keep: float, needed: float) -> float:
    new = max(needed + 200.0, 1.5 * keep)
    return new if new < 1e6 else math.inf  # inf: dense, nothing dropped


def undershoot_depth(a: float, m: int) -> float:
    """e-folds between a tilted last row's maximum and its undershoot's mode.

    Model (continuous positions of even density, the cut's deficit ``Δ`` carried by the
    sequences that only undershoot): the m + 1 undershoots are uniform on the simplex of
    sum ``Δ``, so the last row's undershoot ``U_m`` has density ``∝ u^(m - 1)`` on
    ``[0, Δ]``, largest at ``u = Δ``, and the tilted row over it is
    ``e^(-(c - mu) u) u^(m - 1)`` (the simplex's volume), largest at
    ``u = (m - 1) / (c - mu)``. With ``a = (c - mu) Δ / (m + 1)`` (e-folds of undershoot per
    gap) the posterior's mode lies ``a (m + 1) - (m - 1) (1 + log(a (m + 1) / (m - 1)))``
    e-folds below the row's maximum (``a (m + 1)`` for m = 1); the draws need it within
    the rows' range. Zero where the two meet (``a (m + 1) = m - 1``), larger on both sides.
    """
    t = a * (m + 1.0)
    if m == 1:
        return t
    return t - (m - 1) * (1.0 + math.log(t / (m - 1)))


def deficit_tilts(
    c: float, pos: IntArray, gaps: FloatArray, range_room: float, linear_range: float
) -> list[float]:
    """Tilts sized by what the heavy-atom cut removed (none when nothing was cut).

    The cut positions end ``deficit = n - P_last`` short of the targets' sum, and the
    sequences push that much undershoot below the rows' maxima. The first tilt is the
    least quarter step of k (mu = c (1 - 2^-k), from k = 1/4) under which the last row's
    undershoot (:func:`undershoot_depth`) lies within the linear rows' range (the
    truncation floor less the headroom, ``range_room``, as the range rule counts them, and
    DEFICIT_MARGIN); then DEFICIT_STEPS further, while the reach stays within twice the
    positions' span. None when the untilted rows already reach it.

    Measured (n = 10^6; 5 % beyond the upper or the lower bound or at an inner point,
    uniform, lognormal data with tight bounds, 2.5 % beyond each bound, 10 % and 2 %
    clamped; m = 29 and 99; epsilon 0.3, 1 and 3; forced tilts, two samples each): of
    the 41 cases with a deficit, the least tilt under which the forward rows and every
    draw hold was the first one in 30 and a quarter step less in 8, never more; the
    zero-inflated shape at m = 29 (3 cases) held at none of the steps (the probe's choice
    serves it). The probe (:func:`choose_tilt`) alone chose a quarter to half a step more
    on one-sided clamps (k = 3.75 or 4 where 3.5 holds: rows ~20 % narrower) and less at
    inner atoms, whose draws then tripped and took a second pass. Also used where the
    probe's rows cannot see the deficit (they keep 750 e-folds; 5 % at one inner point at
    epsilon = 10 had no tilt from the probe and ran the log pass, ~2 s).
    """
    span = float(pos[-1] - pos[0])
    deficit = float(gaps.sum()) - span
    m = gaps.size - 1
    if deficit < 1.0:
        return []
    room = range_room - DEFICIT_MARGIN
    a0 = c * deficit / (m + 1.0)  # untilted
    if a0 * (m + 1.0) <= m - 1 or undershoot_depth(a0, m) <= room:
        return []  # the untilted rows reach the undershoot
    # The depth falls as k grows until the mode reaches the row's maximum (a (m + 1) =
    # m - 1, depth 0) and rises after it. A quarter step can jump over the dip when m is
    # large (hundreds of thousands of quantiles: a step changes the depth there by more
    # than the room; the search then went on until 2^-k underflowed and the log raised),
    # so it also stops at the first step past the dip.
    k = 0.25
    while (a := a0 * math.pow(2.0, -k)) * (m + 1.0) > m - 1 and undershoot_depth(a, m) > room:
        k += 0.25
    tilts = [c * (1.0 - math.pow(2.0, -(k + s))) for s in DEFICIT_STEPS]
    return [t for t in tilts if t < c and (c - t) * 2.0 * span >= linear_range]


def tilt_candidates(
    c: float,
    chosen: float,
    pos: IntArray,
    gaps: FloatArray,
    range_room: float,
    linear_range: float,
) -> list[float]:
    """The tilts worth trying, ascending: the chosen one (0.0: none) and its larger steps
    (:func:`larger_tilts`), and those the cut's deficit sizes (:func:`deficit_tilts`),
    from the deficit's first on. Ascending, because the least tilt that holds has the
    narrowest rows; none below the deficit's first, which no measured case held below
    (n = 10^6 with 2 % below the lower bound at epsilon = 3: the probe chose 0.5 c, and the
    draws tripped at it and at three larger steps before the deficit's 0.875 c)."""
    tries = [chosen, *larger_tilts(c, chosen)] if chosen > 0.0 else []
    deficit = deficit_tilts(c, pos, gaps, range_room, linear_range)
    return sorted(
        {
            t
            for t in tries + deficit
            if (not deficit or t >= deficit[0]) and decay_reach(c, t) <= DECAY_TABLE_MAX
        }
    )


def decay_reach(c: float, mu: float) -> float:
    """Entries of the near-part decay table of a pass tilted by ``mu``, before the cap by the
    data's last position: ``750 / (c - mu)`` (the forward pass builds it)."""
    return 750.0 / (c - mu) + 2.0

"""The single-quantile exponential mechanism (Smith 2011) over the intervals of a node.

One implementation serves IndExp and AppIndExp (the node is the whole support) and AQ (the
nodes of its recursion). A *node* is a run ``edges[lo:hi]`` of distinct values (``k = hi -
lo`` of them) inside a domain ``[left, right]``; its interval ``j`` (``0 <= j <= k``) is
``[L_j, R_j)`` with ``L_0 = left``, ``L_j = edges[lo + j - 1]``, ``R_j = edges[lo + j]``,
``R_k = right``, and its position ``pos_j = cum[lo - 1 + j] - cum[lo - 1]`` counts the node's
points ``<=`` any output in it. The weight of interval j is
``(width_j / (right - left)) * exp(-c |pos_j - target|)``.

The target ``t = fraction * count`` is carried as an integer part and a fractional part
(:func:`split_target`, exact up to one rounding of the fraction), so no quantile's target
moves with the size of the data. The linear weights are formed from tabulated exponentials
whose arguments stay below ~700 e-folds; the log-space weights (when the largest linear
weight is small) form every exponent relative to the largest weight from exact integer
distances, so no argument carries a rounding of a deep exponent. Every weight formed is a
normal double within ``exp(±rounding_bound(c))`` of its exact value; weights that would be
subnormal, and linear factors below ``2**-1000``, are not formed.

Privacy of the implemented pick (proof in docs/mechanisms.md, "The single-quantile picks
with floating point"). With every formed weight within ``e^{±ρ}`` of its exact value and the
pick exact with respect to the formed weights, each outcome's probability is within
``e^{±(2ρ + 2D)}`` of the ideal mechanism's at the same ``c`` (D the dropped share, below
2^-67), except on outcomes not formed, whose ideal probability is below ``2^-67 e^{-4c}``. The
pick therefore runs at :func:`run_parameter` ``(c) = c (1 - 8u) - (4ρ + 4cu + 2^-64)``: its
loss against any neighbour is at most the ideal mechanism's at ``c`` (what the caller's
calibration and the ledger account), plus ``δ <= 2^-67`` per pick.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numba
import numpy as np

from app.mechanisms.errors import MechanismInputError
from app.mechanisms.sampling import pick_word, resolve_exactly
from app.mechanisms.validation import FloatArray, IntArray

_LOG_CUT = 1000.0 * math.log(2.0)
#: Unit roundoff of a double, and the smallest normal double.
_U = 2.0**-53
_MIN_NORMAL = 2.0**-1022
#: log2 of the smallest largest-weight the linear path accepts at c = 0; it grows by
#: (4c + 1) / ln 2 so that the factors not formed (< 2^-1000 each, < 2^-1000 together since
#: the width fractions sum to 1) stay below 2^-100 e^-(4c+1) of the largest weight.
_LOG_MIN_TOP0 = -900.0 * math.log(2.0)


def split_target(fraction: float, count: int) -> tuple[int, float]:
    """``fraction * count`` exactly, as ``(integer part, fractional part)``.

    The product of a double and an integer needs up to ~106 bits; formed in doubles it
    moves by up to ``2^-53 * fraction * count``, which under add/remove would change the
    target by more than ``q`` between neighbours once ``count`` is large. Here only the
    fractional part is rounded, once (absolute error <= 2^-54).
    """
    t = Fraction(fraction) * int(count)
    ti = math.floor(t)
    fl = float(t - ti)
    if fl >= 1.0:  # t - ti within 2^-54 of 1 rounds up
        return ti + 1, 0.0
    return ti, fl


def rounding_bound(c: float) -> float:
    """ρ(c): every weight :func:`node_weights` forms is within ``e^{±ρ}`` of its exact value
    (log path: of its exact value times one common factor, which the pick cannot see).

    Linear path: ``c fl`` (<= c u), the table arguments ``64 c h`` (<= 700 u) and ``c l``
    (<= 63 c u), three exponentials (one ulp each), three products and the width's
    rounding: ``(710 + 64 c) u``. Log path: the logs of two widths (<= 745 e-folds each,
    one ulp), ``c φ`` twice, the differences, ``c Δdd`` (a survivor's is <= 2,200 e-folds)
    and one exponential: below ``(9,000 + 10 c) u``. Both under ``(9,000 + 64 c) u``,
    assuming the platform's ``exp`` and ``log`` err by at most one ulp (checked by a test).
    """
    return (9000.0 + 64.0 * c) * _U


def run_parameter(c: float) -> float:
    """The parameter a pick runs at so that the *implemented* pick loses no more than the
    ideal exponential mechanism at ``c`` (proof in the module docstring).

    ``c`` itself may carry a few roundings of the caller's calibration (``epsilon / (2 Δ)``,
    at most ~3u relative): ``(1 - 8u)`` covers them; ``4ρ`` the two laws' weight errors;
    ``4cu`` the target's rounding (neighbours whose counts differ have targets ``q ± 2^-53``
    apart); ``2^-64`` twice the dropped share. Every calibration has ``2Δ >= 1``, so
    lowering ``c`` by this much lowers the loss by at least as much.
    """
    c_run = c * (1.0 - 8.0 * _U) - (4.0 * rounding_bound(c) + 4.0 * c * _U + 2.0**-64)
    if not c_run > 0.0:
        raise MechanismInputError(
            "epsilon",
            "is too small per quantile: the exponential mechanism's floating-point "
            "guarantee needs epsilon / (2 sensitivity) above 1e-11 for each pick",
        )
    return c_run


@numba.njit(cache=True, nogil=True)
def min_top(c: float) -> float:  # pragma: no cover - compiled
    """The smallest largest-weight the linear path accepts (else the log path runs)."""
    return math.exp(min(_LOG_MIN_TOP0 + 4.0 * c + 1.0, 0.0))


@numba.njit(cache=True, nogil=True, inline="always")
def _width(edges: FloatArray, lo: int, k: int, j: int, left: float, right: float) -> float:
    a = left if j == 0 else edges[lo + j - 1]
    b = right if j == k else edges[lo + j]
    return b - a


@numba.njit(cache=True, nogil=True)
def fill_weights(  # pragma: no cover - compiled
    edges: FloatArray,
    cum: IntArray,
    lo: int,
    hi: int,
    left: float,
    right: float,
    ti: int,
    fl: float,
    c: float,
    buf: FloatArray,
) -> tuple[int, int, float]:
    """Linear-domain weights of the node's intervals whose factor exceeds ``2**-1000``.

    Writes the weights of intervals ``j0 .. j0 + cnt - 1`` into ``buf[0:cnt]`` and returns
    ``(j0, cnt, row_max)``. The window is found by binary search on the positions. No
    transcendental per interval: ``e^{-c d}`` for an integer distance ``d = 64 h + l`` is the
    product of two tabulated exponentials and a fractional factor (<= 5 roundings per weight),
    unless the tables would outnumber the window's weights (then one exponential each).
    O(log k + window + min(span, window's largest distance) / 64) time. The target is
    ``ti + fl`` (:func:`split_target`).
    A product below the smallest normal double is not formed (0.0): the error bound
    :func:`rounding_bound` holds for normal products only.
    """
    k = hi - lo
    base = cum[lo - 1]
    total = cum[hi - 1] - base
    span_w = right - left
    if ti > total:
        fl = fl + (ti - total)
        ti = total
    span = _LOG_CUT / c
    dmax = total + 1 if span >= total + 1 else int(span) + 1
    pos = cum[lo - 1 : hi]  # pos[j] + base
    j0 = int(np.searchsorted(pos, base + (ti - dmax), side="left"))
    j1 = int(np.searchsorted(pos, base + (ti + 1 + dmax), side="right")) - 1
    if j1 > k:
        j1 = k
    # The tables cover the window's largest distance; where that would take many more
    # entries than the window has weights (few values far apart in rank: heavy atoms, small
    # c), each factor is one exponential instead, so memory stays O(window).
    far = 0
    if j1 >= j0:
        far = max(ti - (pos[j0] - base), (pos[j1] - base) - ti - 1, 0)
    na = min(far + 1, dmax) // 64 + 2
    direct = na > 4 * (j1 - j0 + 1) + 64
    if direct:
        na = 1
    tab_a = np.empty(na, dtype=np.float64)
    for h in range(na):
        tab_a[h] = math.exp(-c * 64.0 * h)
    tab_b = np.empty(64, dtype=np.float64)
    for h in range(64):
        tab_b[h] = math.exp(-c * h)
    # Every factor is at most 1 (the width fraction too), so each partial product is at
    # least the weight: a weight that is a normal double was formed from normal doubles only.
    s_left = math.exp(-c * fl)  # p <= ti: |p - target| = fl + (ti - p)
    s_right = math.exp(-c * (1.0 - fl))  # p > ti: (1 - fl) + (p - ti - 1)
    top = 0.0
    for j in range(j0, j1 + 1):
        p = pos[j] - base
        if p <= ti:
            dd = ti - p
            s = s_left
        else:
            dd = p - ti - 1
            s = s_right
        if dd >= dmax:
            w = 0.0
        else:
            if direct:
                w = (_width(edges, lo, k, j, left, right) / span_w) * s * math.exp(-c * float(dd))
            else:
                w = (_width(edges, lo, k, j, left, right) / span_w) * s
                w = w * tab_a[dd >> 6] * tab_b[dd & 63]
            if w < _MIN_NORMAL:
                w = 0.0
        buf[j - j0] = w
        if w > top:
            top = w
    return j0, j1 - j0 + 1, top


@numba.njit(cache=True, nogil=True)
def fill_weights_log(  # pragma: no cover - compiled
    edges: FloatArray,
    cum: IntArray,
    lo: int,
    hi: int,
    left: float,
    right: float,
    ti: int,
    fl: float,
    c: float,
    buf: FloatArray,
) -> tuple[int, int, float]:
    """Exact fallback: all k + 1 weights, relative to the largest, formed in log space.

    The exponent of interval j is ``a_j - c dd_j`` with ``a_j = log width_j - c φ_j``
    (``φ_j`` the fractional part of its distance to the target, ``fl`` or ``1 - fl``) and
    ``dd_j`` its integer part. ``c dd_j`` can be millions of e-folds, and one rounding of it
    would move a weight by ~10^-10; every exponent is therefore formed relative to the
    largest one as ``(a_j - a_b) - c (dd_j - dd_b)``, the integer difference exact, so its
    rounding is relative to what survives (<= ~2,200 e-folds). The largest is found by the
    same pairwise differences. Weights below the smallest normal double are not formed.
    """
    k = hi - lo
    base = cum[lo - 1]
    total = cum[hi - 1] - base
    if ti > total:
        fl = fl + (ti - total)
        ti = total
    dist = np.empty(k + 1, dtype=np.int64)
    best = -1
    for j in range(k + 1):
        w = _width(edges, lo, k, j, left, right)
        p = cum[lo - 1 + j] - base
        if p <= ti:
            dist[j] = ti - p
            phi = fl
        else:
            dist[j] = p - ti - 1
            phi = 1.0 - fl
        if w > 0.0:
            a = math.log(w) - c * phi
            buf[j] = a
            if best < 0 or (a - buf[best]) - c * float(dist[j] - dist[best]) > 0.0:
                best = j
        else:
            buf[j] = -np.inf
    if best < 0:
        for j in range(k + 1):
            buf[j] = 0.0
        return 0, k + 1, 0.0
    a_b = buf[best]
    d_b = dist[best]
    top = 0.0
    for j in range(k + 1):
        a = buf[j]
        if a > -np.inf:
            v = math.exp((a - a_b) - c * float(dist[j] - d_b))
            if v < _MIN_NORMAL:
                v = 0.0
        else:
            v = 0.0
        buf[j] = v
        if v > top:
            top = v
    return 0, k + 1, top


@numba.njit(cache=True, nogil=True)
def node_weights(  # pragma: no cover - compiled
    edges: FloatArray,
    cum: IntArray,
    lo: int,
    hi: int,
    left: float,
    right: float,
    ti: int,
    fl: float,
    c: float,
    buf: FloatArray,
) -> tuple[int, int]:
    """The node's weights as a pick uses them: ``buf[0:cnt]`` holds intervals ``j0 ..
    j0 + cnt - 1``; returns ``(j0, cnt)``.

    Linear weights (:func:`fill_weights`) when the largest is at least :func:`min_top`
    ``(c) = 2^-900 e^{4c + 1}``, else every weight in log space (:func:`fill_weights_log`).
    Not formed: linear factors below ``2^-1000`` (below 2^-1000 together, as the width
    fractions sum to at most 1) and products below ``2^-1022`` (at most ``(k + 1) 2^-1022``
    together), so at most ``2^-67 e^{-(4c + 1)}`` of the largest weight; in log space at
    most ``(k + 1) 2^-1022`` of it.
    """
    j0, cnt, top = fill_weights(edges, cum, lo, hi, left, right, ti, fl, c, buf)
    if not top >= min_top(c):
        j0, cnt, top = fill_weights_log(edges, cum, lo, hi, left, right, ti, fl, c, buf)
    return j0, cnt


@numba.njit(cache=True, nogil=True)
def _node_pick_word(  # pragma: no cover - compiled
    edges: FloatArray,
    cum: IntArray,
    lo: int,
    hi: int,
    left: float,
    right: float,
    ti: int,
    fl: float,
    c: float,
    word: np.uint64,
    buf: FloatArray,
) -> tuple[int, int, int]:
    """:func:`node_weights` and :func:`~app.mechanisms.sampling.pick_word` in one compiled
    call: ``(j0, cnt, k)`` with ``k`` the pick among ``buf[0:cnt]`` (-1: all zero, -2: to be
    decided exactly)."""
    j0, cnt = node_weights(edges, cum, lo, hi, left, right, ti, fl, c, buf)
    return j0, cnt, pick_word(buf[:cnt], word)


def node_pick(
    edges: FloatArray,
    cum: IntArray,
    lo: int,
    hi: int,
    left: float,
    right: float,
    fraction: float,
    c: float,
    rng: np.random.Generator,
    buf: FloatArray,
) -> int:
    """Interval j in 0..k of the node, with probability exactly its formed weight's share.

    The target is ``fraction`` times the node's count (exactly, :func:`split_target`); the
    weights are formed at :func:`run_parameter` ``(c)``, so the implemented pick's privacy
    loss is at most the ideal mechanism's at ``c``.

    The weights of :func:`node_weights`, picked as :func:`~app.mechanisms.sampling.
    pick_weights` picks (one raw 64-bit word, as ``rng.random()`` consumes; more bits only
    where a cut point's rounding could decide): no rounding of a cumulative sum or of a
    53-bit uniform enters the law, and a weight below 2^-53 of the total keeps its share.
    Zero widths have weight 0 and are never returned; -1 only if every weight is zero.
    """
    ti, fl = split_target(fraction, int(cum[hi - 1] - cum[lo - 1]))
    c_run = run_parameter(c)
    word = int(rng.bit_generator.random_raw())
    j0, cnt, k = _node_pick_word(
        edges, cum, lo, hi, left, right, ti, fl, c_run, np.uint64(word), buf
    )
    if k == -2:
        k = resolve_exactly(buf[:cnt], word, rng)
    return -1 if k < 0 else j0 + k


def exponential_mechanism_interval(
    edges: FloatArray,
    cum: IntArray,
    fraction: float,
    c: float,
    rng: np.random.Generator,
    buf: FloatArray | None = None,
) -> int:
    """Sample interval ``t`` of the whole support ∝ ``width_t * exp(-c |cum[t] - q n|)``,
    ``q = fraction``, ``n`` the support's count.

    The single-quantile exponential mechanism of Smith (2011) over the d + 1 intervals of
    ``edges = [a, v_1..v_d, b]``: score ``-|pos - target|`` where ``pos`` is the number of
    points ``<=`` the output, ``c = epsilon / (2 * sensitivity)``. One exact pick
    (:func:`node_pick`); zero-width intervals are never returned. O(log d + min(d, 700 / c)) time.
    """
    d = edges.size - 2
    if buf is None:
        buf = np.empty(d + 1, dtype=np.float64)
    j = node_pick(edges, cum, 1, d + 1, edges[0], edges[-1], float(fraction), float(c), rng, buf)
    if j < 0:
        raise FloatingPointError("exponential-mechanism weights are all zero")
    return j

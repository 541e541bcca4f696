"""The single-quantile exponential mechanism (Smith 2011) over the intervals of a node.

One implementation serves IndExp and AppIndExp (the node is the whole support) and AQ (the
nodes of its recursion). A *node* is a run ``edges[lo:hi]`` of distinct values (``k = hi -
lo`` of them) inside a domain ``[left, right]``; its interval ``j`` (``0 <= j <= k``) is
``[L_j, R_j)`` with ``L_0 = left``, ``L_j = edges[lo + j - 1]``, ``R_j = edges[lo + j]``,
``R_k = right``, and its position ``pos_j = cum[lo - 1 + j] - cum[lo - 1]`` counts the node's
points ``<=`` any output in it. The weight of interval j is
``(width_j / (right - left)) * exp(-c |pos_j - target|)``.

Weights below ``2**-1000`` (every weight is <= 1) are not formed; if the largest formed
weight is below ``2**-900`` all weights are formed in log space instead, so every dropped
weight is below ``2**-100`` times the row maximum — far inside the package's exactness
standard (each weight within ``2**-50`` x row max). A pick is exact with respect to the
weights formed (:func:`node_pick`): its law is their shares, with no rounding of its own.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from app.mechanisms.sampling import pick_word, resolve_exactly
from app.mechanisms.validation import FloatArray, IntArray

_LOG_CUT = 1000.0 * math.log(2.0)
_MIN_TOP = 2.0**-900


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
    target: float,
    c: float,
    buf: FloatArray,
) -> tuple[int, int, float]:
    """Linear-domain weights of the node's intervals whose factor exceeds ``2**-1000``.

    Writes the weights of intervals ``j0 .. j0 + cnt - 1`` into ``buf[0:cnt]`` and returns
    ``(j0, cnt, row_max)``. The window is found by binary search on the positions. No
    transcendental per interval: ``e^{-c d}`` for an integer distance ``d = 64 h + l`` is the
    product of two tabulated exponentials and a fractional factor (<= 5 roundings per weight).
    O(log k + window + span / 64) time.
    """
    k = hi - lo
    base = cum[lo - 1]
    total = cum[hi - 1] - base
    inv = 1.0 / (right - left)
    ti = math.floor(target)
    if ti > total:
        ti = total
    fl = target - ti
    span = _LOG_CUT / c
    dmax = total + 1 if span >= total + 1 else int(span) + 1
    pos = cum[lo - 1 : hi]  # pos[j] + base
    j0 = int(np.searchsorted(pos, base + (ti - dmax), side="left"))
    j1 = int(np.searchsorted(pos, base + (ti + 1 + dmax), side="right")) - 1
    if j1 > k:
        j1 = k
    na = dmax // 64 + 2
    tab_a = np.empty(na, dtype=np.float64)
    for h in range(na):
        tab_a[h] = math.exp(-c * 64.0 * h)
    tab_b = np.empty(64, dtype=np.float64)
    for h in range(64):
        tab_b[h] = math.exp(-c * h)
    s_left = inv * math.exp(-c * fl)  # p <= ti: |p - target| = fl + (ti - p)
    s_right = inv * math.exp(-c * (1.0 - fl))  # p > ti: (1 - fl) + (p - ti - 1)
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
            w = _width(edges, lo, k, j, left, right) * s * tab_a[dd >> 6] * tab_b[dd & 63]
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
    target: float,
    c: float,
    buf: FloatArray,
) -> tuple[int, int, float]:
    """Exact fallback: all k + 1 weights formed in log space and max-normalised (max = 1)."""
    k = hi - lo
    base = cum[lo - 1]
    top = -np.inf
    for j in range(k + 1):
        w = _width(edges, lo, k, j, left, right)
        s = (math.log(w) if w > 0.0 else -np.inf) - c * abs((cum[lo - 1 + j] - base) - target)
        buf[j] = s
        if s > top:
            top = s
    for j in range(k + 1):
        s = buf[j]
        buf[j] = math.exp(s - top) if s > -np.inf else 0.0
    return 0, k + 1, 1.0 if top > -np.inf else 0.0


@numba.njit(cache=True, nogil=True)
def node_weights(  # pragma: no cover - compiled
    edges: FloatArray,
    cum: IntArray,
    lo: int,
    hi: int,
    left: float,
    right: float,
    target: float,
    c: float,
    buf: FloatArray,
) -> tuple[int, int]:
    """The node's weights as a pick uses them: ``buf[0:cnt]`` holds intervals ``j0 ..
    j0 + cnt - 1``; returns ``(j0, cnt)``.

    Linear weights (:func:`fill_weights`) when the largest is at least ``2**-900``, else
    every weight in log space (:func:`fill_weights_log`): the weights not formed are each
    below ``2**-1000``, so together below ``(k + 1) 2**-100`` of the largest.
    """
    j0, cnt, top = fill_weights(edges, cum, lo, hi, left, right, target, c, buf)
    if not top >= _MIN_TOP:
        j0, cnt, top = fill_weights_log(edges, cum, lo, hi, left, right, target, c, buf)
    return j0, cnt


@numba.njit(cache=True, nogil=True)
def _node_pick_word(  # pragma: no cover - compiled
    edges: FloatArray,
    cum: IntArray,
    lo: int,
    hi: int,
    left: float,
    right: float,
    target: float,
    c: float,
    word: np.uint64,
    buf: FloatArray,
) -> tuple[int, int, int]:
    """:func:`node_weights` and :func:`~app.mechanisms.sampling.pick_word` in one compiled
    call: ``(j0, cnt, k)`` with ``k`` the pick among ``buf[0:cnt]`` (-1: all zero, -2: to be
    decided exactly)."""
    j0, cnt = node_weights(edges, cum, lo, hi, left, right, target, c, buf)
    return j0, cnt, pick_word(buf[:cnt], word)


def node_pick(
    edges: FloatArray,
    cum: IntArray,
    lo: int,
    hi: int,
    left: float,
    right: float,
    target: float,
    c: float,
    rng: np.random.Generator,
    buf: FloatArray,
) -> int:
    """Interval j in 0..k of the node, with probability exactly its formed weight's share.

    The weights of :func:`node_weights`, picked as :func:`~app.mechanisms.sampling.
    pick_weights` picks (one raw 64-bit word, as ``rng.random()`` consumes; more bits only
    where a cut point's rounding could decide): no rounding of a cumulative sum or of a
    53-bit uniform enters the law, and a weight below 2^-53 of the total keeps its share.
    Zero widths have weight 0 and are never returned; -1 only if every weight is zero.
    """
    word = int(rng.bit_generator.random_raw())
    j0, cnt, k = _node_pick_word(edges, cum, lo, hi, left, right, target, c, np.uint64(word), buf)
    if k == -2:
        k = resolve_exactly(buf[:cnt], word, rng)
    return -1 if k < 0 else j0 + k


def exponential_mechanism_interval(
    edges: FloatArray,
    cum: IntArray,
    target: float,
    c: float,
    rng: np.random.Generator,
    buf: FloatArray | None = None,
) -> int:
    """Sample interval ``t`` of the whole support ∝ ``width_t * exp(-c |cum[t] - target|)``.

    The single-quantile exponential mechanism of Smith (2011) over the d + 1 intervals of
    ``edges = [a, v_1..v_d, b]``: score ``-|pos - target|`` where ``pos`` is the number of
    points ``<=`` the output, ``c = epsilon / (2 * sensitivity)``. One exact pick
    (:func:`node_pick`); zero-width intervals are never returned. O(log d + min(d, 700 / c)) time.
    """
    d = edges.size - 2
    if buf is None:
        buf = np.empty(d + 1, dtype=np.float64)
    j = node_pick(edges, cum, 1, d + 1, edges[0], edges[-1], float(target), float(c), rng, buf)
    if j < 0:
        raise FloatingPointError("exponential-mechanism weights are all zero")
    return j

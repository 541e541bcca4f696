"""A sound bound on the error JointExp's truncated forward rows carry into each draw.

Every forward row drops what lies below its truncation floor (a linear row: the terms
below the smallest normal double of its scale; a log row: the entries more than ``keep``
e-folds below its maximum). Each entry of row j then errs by at most ``e^{t_j}`` (its floor
on the pass's common log scale) plus what the earlier rows' errors became through the
recursion, which multiplies an error landing on interval i by i's width. The draws read the
rows through a kernel, so what matters is the error *near the sampled position*, relative
to the draw's largest weight. This module bounds it without assuming anything about the
widths (the speed rule in :func:`~app.mechanisms.jointexp.range_rule.range_holds` charges the
median width, which is not a worst-case bound).

**The weighted norm.** For a region ``Z_j = [T_j - R - D, T_j + R]`` around row j's target
position ``T_j = n_1 + ... + n_j`` (it moves by exactly ``n_j`` per row; ``D`` the heavy-atom
cut's deficit or 0) and the weight ``psi_j(p) = j dl (left_j - p)+ + j dr (p - right_j)+``
with ``m dl = f (c + mu)`` and ``m dr = f (c - mu)``, ``0 < f < 1``, let

    N_j = max_{0 < i < d} e_j(i) exp(-psi_j(P_i)),

``e_j(i)`` the absolute error of row j's entry i summed over its repeat levels, in the
row's own (tilted, for a tilt ``mu``) units. The single-copy transition sums
``w_i K(x) e_{j-1}(i')`` with ``x = P_i - P_i' - n_j`` and ``K(x) = e^{-c|x| - mu x}``; since
``Z_{j-1} = Z_j - n_j``, moving the source by ``x`` changes the previous row's weight by at
most ``dl x`` (source to the left) or ``dr |x|`` (to the right), and a repeat by ``dr n_j``
with a factor ``<= w_i e^{-(c - mu) n_j} / 2``. Summing the geometric series over distinct
integer positions (each term ``<= 1``, at most ``d + 1`` of them):

    N_j <= N_{j-1} (k_{j-1} + e^{-(c - mu - (j-1) dr) n_j} / 2) W_j + (end terms) + e^{t_j},
    k_j = min(1/(1 - e^{-(c + mu - j dl)}) + 1/(1 - e^{-(c - mu - j dr)}), d + 1),
    W_j = max_{0 < i < d} w_i exp(-dl (left_j - P_i)+ - dr (P_i - right_j)+),

and ``N_1 = e^{t_1}`` (row 1 is formed from its closed form). The maximum runs over the
inner intervals ``1 .. d - 1``; the two end intervals (the gaps to loose bounds, typically
the widest by far) are tracked on their own, since interval 0 receives no transition
(only repeats) and the last one passes its error only to itself and to the draws
(:class:`ErrorBound`; docs/mechanisms.md has the recursions). ``W_j`` is the largest width
*discounted by its distance from where the row's mass is meant to be*: a wide interval far
from every target (the gaps to loose bounds, a continuous sample's tails) costs little, and
one at the target costs its full width, as it should.

**At a draw** over the weights ``row_j(i) K(t - P_i)``, ``t = P_next - n_{j+1}``, the
weights' total error is at most

    N_j exp(psi_j(t)) k_j + (the end intervals' errors times their kernel factors),

and the draw goes ahead only if that is ``e^{-H}`` below its largest weight (``H`` the
headroom of :func:`~app.mechanisms.jointexp.range_rule.headroom`). Any ``(R, D, f)`` gives a valid
bound; a few are tracked side by side and the smallest is used. ``W_j`` is read from the
widths' block maxima (:func:`width_blocks`): a block that meets the region counts at its
widest interval, one that does not at its widest discounted from its nearest end, an upper
bound either way. The bound is linear in the
floors' ``e^{t_l}``: a log pass that widens ``keep`` by ``s`` e-folds lowers it by ``s``.

JointExp holds its untilted passes (linear and log) to this bound at every draw; tilted
linear passes are held to the certificate of :mod:`~app.mechanisms.jointexp.certificate` at
their last draw, because with rates limited by ``c - mu`` the bound asks more range than
tilted rows have on clamped data (measured in docs/mechanisms.md); the certificate uses this
bound only for what lies far below its own error passes.

What it does not cover (bounded elsewhere, docs/mechanisms.md): repeat levels pruned below
2^-60 of level 1 (a relative loss at the same interval), the rows' relative rounding, and
the draws' own weights below the smallest normal double (``TINY_DRAW``).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from app.mechanisms.validation import FloatArray, IntArray

#: The norms tracked side by side: (radius as a multiple of the largest gap, the rates'
#: final values as a fraction f of their limits, whether the region reaches down by the
#: heavy-atom cut's deficit). Radius 0 discounts every width off the targets; a radius of
#: one gap leaves sampled positions that miss their target undiscounted; the deficit covers
#: sequences that the cut pushes below their targets; a larger f discounts more and lets the
#: kernel's sum grow more in the last rows (9/10 holds a 5 % point mass at epsilon = 0.1,
#: m = 99, where 1/2 asks ~100 e-folds more range than the linear rows have).
CONFIGS: tuple[tuple[float, float, bool], ...] = (
    (0.0, 0.5, False),
    (1.0, 0.5, True),
    (0.0, 0.9, True),
)
#: intervals per block of the widths' block maxima (:func:`block_maxima`): a block that
#: meets a row's region counts at its widest interval, one that does not at its widest
#: discounted from its nearest end
BLOCK = 64
NEG_INF = -np.inf
_U = 2.0**-52


def width_blocks(logw: FloatArray, pos: IntArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    """The block maxima of the inner intervals' widths (1 .. d - 1; the two end intervals
    are tracked on their own), with each block's first and last position: what
    :class:`ErrorBound` reads of the widths. They depend on the intervals alone, so a
    histogram keeps them (``Inputs``)."""
    inner = max(0, logw.size - 2)
    nb = -(-inner // BLOCK)
    bmax, bfirst, blast = np.empty(nb), np.empty(nb), np.empty(nb)
    if nb:
        block_maxima(logw[: logw.size - 1], pos, 1, BLOCK, bmax, bfirst, blast)
    return bmax, bfirst, blast


def _lae(a: float, b: float) -> float:
    """log(e^a + e^b) on Python floats (numpy's logaddexp costs ~1 us a call here)."""
    if a < b:
        a, b = b, a
    if b == -math.inf:
        return a
    return a + math.log1p(math.exp(b - a))


class ErrorBound:
    """The norms of the module docstring for one forward pass: ``N_j`` over the inner
    intervals (one per entry of :data:`CONFIGS`) and the errors of the two end intervals,
    which are tracked on their own (interval 0 receives no transition, only repeats; the
    last one passes its error only to itself and to the draws), so that the gaps to loose
    bounds, typically the widest intervals by far, are never charged to the others.

    The pass calls :meth:`norms` once its rows' log floors are known and :meth:`at_draw`
    before each draw. O(m + d / BLOCK) per norm from :func:`width_blocks`.
    """

    def __init__(
        self,
        logw: FloatArray,
        pos: IntArray,
        gaps: FloatArray,
        c: float,
        mu: float,
        blocks: tuple[FloatArray, FloatArray, FloatArray] | None = None,
    ) -> None:
        """``blocks``: :func:`width_blocks` of ``logw`` and ``pos`` (formed here if None)."""
        m = gaps.size - 1
        n1 = logw.size
        self.m, self.c, self.mu = m, c, mu
        self.p0, self.pd = float(pos[0]), float(pos[-1])
        self.lw0, self.lwd = float(logw[0]), float(logw[-1])
        self.last = n1 - 1
        self.gaps = gaps
        centers = np.cumsum(gaps[:m])  # T_1..T_m
        deficit = max(0.0, float(gaps.sum()) - float(pos[-1]))
        big_gap = float(gaps.max())
        count = len(CONFIGS)
        self.lefts = np.empty((count, m))
        self.rights = np.empty((count, m))
        self.d_left = np.array([frac * (c + mu) / m for _, frac, _ in CONFIGS])
        self.d_right = np.array([frac * (c - mu) / m for _, frac, _ in CONFIGS])
        self.hop = np.full((count, m + 1), -math.inf)  # log W_j
        self.draw_k = np.full((count, m + 1), math.inf)  # log k_j
        bmax, bfirst, blast = width_blocks(logw, pos) if blocks is None else blocks
        finite = bmax[bmax > -math.inf]
        lwmag = float(np.max(np.abs(finite))) if finite.size else 0.0
        self.inner_top = float(finite.max()) if finite.size else -math.inf
        reach = float(pos[-1]) + float(gaps.sum()) + deficit
        self.margin = np.empty(count)
        hop = np.empty(m)
        rows = np.arange(1, m + 1, dtype=np.float64)
        for s, (rad, _, below) in enumerate(CONFIGS):
            radius = rad * big_gap
            dl, dr = float(self.d_left[s]), float(self.d_right[s])
            self.lefts[s] = centers - radius - (deficit if below else 0.0)
            self.rights[s] = centers + radius
            if bmax.size:
                discounted_max_blocks(
                    bmax, bfirst, blast, self.lefts[s], self.rights[s], dl, dr, hop
                )
                self.hop[s, 1:] = hop
            self.margin[s] = 8.0 * _U * (max(dl, dr) * (reach + radius) + lwmag) + 1e-9
            ka, kb = c + mu - rows * dl, c - mu - rows * dr  # both > 0: frac < 1
            kern = -1.0 / np.expm1(-ka) - 1.0 / np.expm1(-kb)
            self.draw_k[s, 1:] = np.log(np.minimum(kern, float(n1)))

    def _psi(self, s: int, j: int, p: float) -> float:
        """log weight ``psi_j(p)`` of norm s."""
        below = max(float(self.lefts[s, j - 1]) - p, 0.0)
        above = max(p - float(self.rights[s, j - 1]), 0.0)
        return j * (float(self.d_left[s]) * below + float(self.d_right[s]) * above)

    def _log_k(self, x: float) -> float:
        """log of the (tilted) kernel ``e^{-c |x| - mu x}``."""
        return -self.c * abs(x) - self.mu * x

    def norms(self, floors: FloatArray) -> FloatArray:
        """For j = 1..m (row 0 unused): ``log N_j`` of each norm (columns ``0 .. count -
        1``), the log error of interval 0 (column ``count``: the same for every norm) and
        that of the last interval as bounded with each norm (columns ``count + 1 + s``)
        (:func:`norms_kernel`)."""
        return norms_kernel(
            np.asarray(floors, dtype=np.float64),
            np.asarray(self.gaps, dtype=np.float64),
            self.hop,
            self.draw_k,
            self.d_left,
            self.d_right,
            self.margin,
            self.lefts,
            self.rights,
            self.c,
            self.mu,
            self.lw0,
            self.lwd,
            self.inner_top,
            self.p0,
            self.pd,
        )

    def at_draw(self, norms: FloatArray, j: int, t: float, i_end: int) -> float:
        """log of the bound on the total weight error of a draw from row j at ``t = P_next -
        n_{j+1}`` over the intervals below ``i_end`` (the smallest over the norms; ``norms``
        is row j of :meth:`norms`)."""
        count = len(CONFIGS)
        edge0 = float(norms[count]) + self._log_k(t - self.p0)
        best = math.inf
        for s in range(count):
            v = float(norms[s]) + self._psi(s, j, t) + float(self.draw_k[s, j])
            v = _lae(v, edge0)
            if i_end > self.last:
                v = _lae(v, float(norms[count + 1 + s]) + self._log_k(t - self.pd))
            best = min(best, v)
        return best


@numba.njit(cache=True, nogil=True)
def block_maxima(
    logw: np.ndarray,
    pos: np.ndarray,
    first: int,
    block: int,
    bmax: np.ndarray,
    bfirst: np.ndarray,
    blast: np.ndarray,
) -> None:
    """Per block of ``block`` consecutive intervals from ``first`` on: the largest log width
    (-inf if the block holds only zero widths) and the block's first and last positions, for
    :func:`discounted_max_blocks`. One pass over the intervals."""
    n = logw.size
    for b in range(bmax.size):
        lo = first + b * block
        hi = min(n, lo + block)
        best = NEG_INF
        for i in range(lo, hi):
            if logw[i] > best:
                best = logw[i]
        bmax[b] = best
        bfirst[b] = float(pos[lo])
        blast[b] = float(pos[hi - 1])


@numba.njit(cache=True, nogil=True)
def discounted_max_blocks(
    bmax: np.ndarray,
    bfirst: np.ndarray,
    blast: np.ndarray,
    lefts: np.ndarray,
    rights: np.ndarray,
    delta_left: float,
    delta_right: float,
    out: np.ndarray,
) -> None:
    """An upper bound of ``max_i logw[i] - delta_left (lefts[j] - pos[i])+ - delta_right
    (pos[i] - rights[j])+`` for each window j, from :func:`block_maxima`: a block wholly
    left of the window counts at its largest width discounted from its last position, one
    wholly right of it from its first position, and a block that meets the window at its
    largest width. ``lefts``, ``rights`` ascending: O(blocks + m) plus the blocks that meet
    each window."""
    nb = bmax.size
    m = lefts.size
    ref = 0.5 * (bfirst[0] + blast[nb - 1])
    # blocks left of a window: max of bmax + delta_left (blast - ref), a running maximum as
    # the window moves right; right of it: suffix maxima of bmax - delta_right (bfirst - ref)
    suf = np.empty(nb + 1)
    suf[nb] = NEG_INF
    for b in range(nb - 1, -1, -1):
        v = bmax[b] - delta_right * (bfirst[b] - ref) if bmax[b] > NEG_INF else NEG_INF
        suf[b] = max(suf[b + 1], v)
    pre = NEG_INF
    lo = 0  # first block whose last position is >= the window's left end
    hi = 0  # first block whose first position is > the window's right end
    for j in range(m):
        left = lefts[j]
        right = rights[j]
        while lo < nb and blast[lo] < left:
            if bmax[lo] > NEG_INF:
                pre = max(pre, bmax[lo] + delta_left * (blast[lo] - ref))
            lo += 1
        while hi < nb and bfirst[hi] <= right:
            hi += 1
        res = NEG_INF
        for b in range(lo, hi):
            res = max(res, bmax[b])
        res = max(res, pre - delta_left * (left - ref))
        res = max(res, suf[max(hi, lo)] + delta_right * (right - ref))
        out[j] = res


@numba.njit(cache=True, nogil=True, inline="always")
def _lae_nb(a: float, b: float) -> float:
    """log(e^a + e^b), as :func:`_lae`."""
    if a < b:
        a, b = b, a
    if b == NEG_INF:
        return a
    return a + math.log1p(math.exp(b - a))


@numba.njit(cache=True, nogil=True)
def norms_kernel(
    floors: np.ndarray,
    gaps: np.ndarray,
    hop: np.ndarray,
    draw_k: np.ndarray,
    d_left: np.ndarray,
    d_right: np.ndarray,
    margin: np.ndarray,
    lefts: np.ndarray,
    rights: np.ndarray,
    c: float,
    mu: float,
    lw0: float,
    lwd: float,
    inner_top: float,
    p0: float,
    pd: float,
) -> np.ndarray:
    """:meth:`ErrorBound.norms`: the recursions of the module docstring, row by row, in the
    same operations and order as the reference in the tests (one double per step)."""
    count = hop.shape[0]
    m = floors.size - 1
    rows = np.full((m + 1, 2 * count + 1), NEG_INF)
    # an end interval of zero width holds exactly 0.0 in every row: it drops nothing
    end0 = lw0 > NEG_INF
    endd = lwd > NEG_INF
    if m >= 1:
        rows[1, :] = floors[1]
        if not end0:
            rows[1, count] = NEG_INF
        if not endd:
            rows[1, count + 1 :] = NEG_INF
    half = math.log(0.5)
    for j in range(2, m + 1):
        nj = gaps[j - 1]
        fl = floors[j]
        stay = half - (c - mu) * nj  # a repeat's kernel factor, before its width
        e0_prev = rows[j - 1, count]
        rows[j, count] = _lae_nb(e0_prev + lw0 + stay, fl if end0 else NEG_INF)
        for s in range(count):
            n_prev = rows[j - 1, s]
            ed_prev = rows[j - 1, count + 1 + s]
            dr = d_right[s]
            k_prev = draw_k[s, j - 1]
            # inner intervals: transitions and repeats of inner errors, and transitions
            # from interval 0 (one source, each target's kernel factor <= 1)
            rep = half - (c - mu - (j - 1) * dr) * nj
            inner = n_prev + _lae_nb(k_prev, rep) + hop[s, j]
            inner = _lae_nb(inner, e0_prev + inner_top)
            rows[j, s] = _lae_nb(inner, fl) + margin[s]
            rows[j, count + 1 + s] = last_interval(
                n_prev, e0_prev, ed_prev, k_prev, lefts[s, j - 2], rights[s, j - 2],
                d_left[s], dr, j, nj, fl if endd else NEG_INF, c, mu, p0, pd, lwd,
            )  # fmt: skip
    return rows


@numba.njit(cache=True, nogil=True, inline="always")
def last_interval(
    n_prev: float,
    e0_prev: float,
    ed_prev: float,
    k_prev: float,
    left: float,
    right: float,
    dl: float,
    dr: float,
    j: int,
    nj: float,
    fl: float,
    c: float,
    mu: float,
    p0: float,
    pd: float,
    lwd: float,
) -> float:
    """The last interval's log error at row j: transitions from the inner ones (their
    weighted sum at the target ``n - n_j``, row j - 1's region ``[left, right]``) and from
    interval 0, its own repeats, and its floor ``fl`` (-inf where it has zero width)."""
    p = pd - nj
    below = max(left - p, 0.0)
    above = max(p - right, 0.0)
    psi = (j - 1) * (dl * below + dr * above)
    into = n_prev + psi + k_prev
    x = pd - p0 - nj
    into = _lae_nb(into, e0_prev + (-c * abs(x) - mu * x))
    into = _lae_nb(into, ed_prev + (math.log(0.5) - (c - mu) * nj))
    return _lae_nb(lwd + into, fl)

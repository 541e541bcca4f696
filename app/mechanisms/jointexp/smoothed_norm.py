"""The max-norm bound with the widths smoothed by the kernel: the certificate's remainder.

:mod:`~app.mechanisms.jointexp.error_bound` multiplies its norm at every row by the kernel's
sum ``k`` and the widest width near the target, ``W_j``. On data whose intervals have
widths that vary from one to the next (any continuous sample: the spacings are roughly
exponential), the widest of ~10⁶ is ~e⁵ times the typical one, so over m = 499 rows the
bound lands ~2,600 e-folds above what the certificate's error passes compute exactly.
Here the width is read where the recursion actually meets it: at the *source*.

Split each inner error as ``e_j = a_j + w ∘ u_j``: ``a_j`` what row j itself dropped (at
most ``F_j = e^{t_j}`` per entry, row 1's whole error) and ``u_j(i)`` the transition's sum
before the target's width,

    u_j(i) = sum_{i'} K(P_i - P_i' - n_j) e_{j-1}(i') + rep_j e_{j-1}(i) + (interval 0),

with ``rep_j = e^{-(c - mu) n_j} / 2`` the repeat. :mod:`error_bound`'s weight is ``psi_j =
j phi_j``, ``phi_j(p) = dl (left_j - p)+ + dr (p - right_j)+``, and ``phi_j(p + n_j) <=
phi_j(P_i) + dl x`` (source left of the target's ``p = P_i - n_j`` by x) or ``+ dr |x|``
(right). Weighing ``u`` one row less, ``U_j = max_i u_j(i) e^{-(j - 1) phi_j(P_i)}``, a
source's weight moves to the target's at the rates ``(j - 2) dl``, ``(j - 2) dr`` (at most
``(j - 1)``), less ``phi_j(P_i)``, and ``e_{j-1}(i') <= F_{j-1} + w_i' U_{j-1} e^{(j - 2)
phi_{j-1}(P_i')}`` gives

    U_j <= (k_{j-1} + rep_j) F_{j-1} + H_j U_{j-1} + e0_{j-1},
    H_j = max_i e^{-phi_j(P_i)} T_j(P_i - n_j) + rep_j W_j,
    T_j(p) = sum_{i' inner} w_i' e^{-r_j |p - P_i'|}  (rate rl_j = c + mu - (j - 1) dl left
             of p, rr_j = c - mu - (j - 1) dr right of it),

and, from ``e_j = a_j + w ∘ u_j`` (``w_i e^{-phi_j(P_i)} <= W_j``), ``N_j <= F_j + W_j U_j``;
and from the norm itself
``U_j <= (k_{j-1} + rep_j) N_{j-1} + e0_{j-1}``. Both routes are kept and every row takes the
smaller ``N_j`` (so this bound is never above :mod:`error_bound`'s recursion, which the same
inequalities give). ``H_j`` is the kernel-weighted *sum* of the widths around the target
instead of the largest one times the kernel's sum: on continuous data ~2.5 e-folds a row
lower.

``T_j`` is read without evaluating it at every ``P_i - n_j``: for ``P_a <= p < P_{a+1}``
(consecutive inner positions) the sources at or left of p are at or left of ``P_a`` and
those right of it at or right of ``P_{a+1}``, so ``T_j(p) <= G(a) = L(a) + R(a + 1)`` with
``L(a) = sum_{i' <= a} w_i' e^{-rl (P_a - P_i')}`` and ``R(b) = sum_{i' >= b} w_i' e^{-rr
(P_i' - P_b)}`` (two passes); below ``P_1``, ``T_j <= R(1)``. The target's discount is read
over the segment: ``phi_j(P_i) = phi_{j-1}(p)`` (the region moves by ``n_j``), at least its
value at the segment's nearer end, so block maxima of ``G`` discounted as in
:func:`~app.mechanisms.jointexp.error_bound.discounted_max_blocks` against row j - 1's
region give ``H_j``. The rates fall with j; rows are taken in :data:`GROUPS` groups, each
with the rates of its last row (smaller rates, larger ``T``: an upper bound).

The sums are of non-negative terms, in doubles relative to the largest width, with every
width held at least 2^-1000 (an upper bound, never an underflow to zero); their rounding
is charged as a relative ``(4 d + 16) u``. Speed only (the certificate is sound with either
remainder): it costs two passes over the intervals per group, so the certificate reads it
only where :mod:`error_bound`'s remainder does not certify.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from app.mechanisms.jointexp.error_bound import (
    BLOCK,
    CONFIGS,
    NEG_INF,
    ErrorBound,
    _lae_nb,
    discounted_max_blocks,
    last_interval,
)
from app.mechanisms.validation import FloatArray, IntArray

#: groups of rows sharing one pair of rates (the rates of the group's last row)
GROUPS = 4
#: the smallest width a source is held at, relative to the largest (an upper bound)
WIDTH_FLOOR = 2.0**-1000
_U = 2.0**-52


@numba.njit(cache=True, nogil=True)
def segment_sums(w: np.ndarray, pos: np.ndarray, rl: float, rr: float, out: np.ndarray) -> None:
    """``G`` of the module docstring over the inner intervals' relative widths ``w`` (``w[t]``
    at ``pos[t]``, t = 0 .. k - 1): ``out[0] = R(0)`` (positions below the first),
    ``out[t + 1] = L(t) + R(t + 1)`` (``R(k) = 0``). Linear, every term <= its width."""
    k = w.size
    out[k] = 0.0  # R(k); out[t] = R(t) after this pass, then L(t - 1) is added in place
    for t in range(k - 1, -1, -1):
        f = math.exp(-rr * float(pos[t + 1] - pos[t])) if t + 1 < k else 0.0
        out[t] = w[t] + f * out[t + 1]
    left = 0.0
    for t in range(k):
        f = math.exp(-rl * float(pos[t] - pos[t - 1])) if t > 0 else 0.0
        left = w[t] + f * left
        out[t + 1] += left


@numba.njit(cache=True, nogil=True)
def segment_blocks(
    sums: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    block: int,
    log_top: float,
    bmax: np.ndarray,
    bfirst: np.ndarray,
    blast: np.ndarray,
) -> None:
    """Block maxima of ``log(sums) + log_top`` with each block's lowest and highest position
    (segments' ``lo`` and ``hi``), for :func:`discounted_max_blocks`."""
    n = sums.size
    for b in range(bmax.size):
        a = b * block
        z = min(n, a + block)
        best = 0.0
        for t in range(a, z):
            if sums[t] > best:
                best = sums[t]
        bmax[b] = math.log(best) + log_top if best > 0.0 else NEG_INF
        bfirst[b] = lo[a]
        blast[b] = hi[z - 1]


@numba.njit(cache=True, nogil=True)
def smoothed_norms_kernel(
    floors: np.ndarray,
    gaps: np.ndarray,
    old: np.ndarray,
    hop: np.ndarray,
    smooth: np.ndarray,
    draw_k: np.ndarray,
    d_left: np.ndarray,
    d_right: np.ndarray,
    margin: np.ndarray,
    lefts: np.ndarray,
    rights: np.ndarray,
    c: float,
    mu: float,
    lwd: float,
    p0: float,
    pd: float,
) -> np.ndarray:
    """The rows of :meth:`ErrorBound.norms` with every inner norm the smaller of the two
    routes of the module docstring (``old``: :meth:`ErrorBound.norms`, whose interval-0
    column is unchanged; the last interval's columns recomputed from the smaller norms)."""
    count = hop.shape[0]
    m = floors.size - 1
    rows = old.copy()
    endd = lwd > NEG_INF
    half = math.log(0.5)
    for s in range(count):
        u = NEG_INF  # row 1 is formed from its closed form: its whole error is a_1
        for j in range(2, m + 1):
            nj = gaps[j - 1]
            fl_prev = floors[j - 1]
            e0_prev = rows[j - 1, count]
            n_prev = rows[j - 1, s]
            dr = d_right[s]
            k_prev = draw_k[s, j - 1]
            rep = half - (c - mu - (j - 1) * dr) * nj
            kr = _lae_nb(k_prev, rep)
            h = _lae_nb(smooth[s, j], rep + hop[s, j])
            hu = h + u if u > NEG_INF else NEG_INF
            route = _lae_nb(fl_prev + kr, hu)
            u = _lae_nb(min(n_prev + kr, route), e0_prev) + margin[s]
            cand = _lae_nb(floors[j], hop[s, j] + u) + margin[s]
            if cand < rows[j, s]:
                rows[j, s] = cand
            # the last interval, as in norms_kernel, from the (smaller) norm of row j - 1
            rows[j, count + 1 + s] = last_interval(
                n_prev, e0_prev, rows[j - 1, count + 1 + s], k_prev, lefts[s, j - 2],
                rights[s, j - 2], d_left[s], dr, j, nj, floors[j] if endd else NEG_INF,
                c, mu, p0, pd, lwd,
            )  # fmt: skip
    return rows


def smoothed_hops(eb: ErrorBound, logw: FloatArray, pos: IntArray) -> FloatArray:
    """``log`` of the smoothed part of ``H_j`` (module docstring), per norm of ``CONFIGS`` and
    row j = 2 .. m (row 0 and 1 unused: +inf); +inf where it does not apply (fewer than two
    inner intervals, a rate not positive)."""
    m, c, mu = eb.m, eb.c, eb.mu
    count = len(CONFIGS)
    out = np.full((count, m + 1), math.inf)
    inner_logw = np.ascontiguousarray(logw[1 : logw.size - 1], dtype=np.float64)
    k = inner_logw.size
    finite = inner_logw[inner_logw > -math.inf]
    if m < 2 or k < 2 or not finite.size:
        return out
    top = float(finite.max())
    w = np.maximum(np.exp(inner_logw - top), WIDTH_FLOOR)
    ipos = np.ascontiguousarray(pos[1 : logw.size - 1], dtype=np.int64)
    lo = np.empty(k + 1)
    hi = np.empty(k + 1)
    lo[0], hi[0] = float(ipos[0]) - float(eb.gaps.max()), float(ipos[0])
    lo[1:] = ipos
    hi[1:k] = ipos[1:]
    hi[k] = ipos[-1]
    log_top = top + (4.0 * k + 16.0) * _U
    sums = np.empty(k + 1)
    nb = -(-(k + 1) // BLOCK)
    bmax, bfirst, blast = np.empty(nb), np.empty(nb), np.empty(nb)
    res = np.empty(m - 1)
    edges = np.linspace(2, m + 1, GROUPS + 1).astype(np.int64)
    cache: dict[tuple[float, float], tuple[FloatArray, FloatArray, FloatArray]] = {}
    for s in range(count):
        dl, dr = float(eb.d_left[s]), float(eb.d_right[s])
        lefts = np.ascontiguousarray(eb.lefts[s, : m - 1])
        rights = np.ascontiguousarray(eb.rights[s, : m - 1])
        for g in range(GROUPS):
            j0, j1 = int(edges[g]), int(edges[g + 1]) - 1
            if j1 < j0:
                continue
            rl, rr = c + mu - (j1 - 1) * dl, c - mu - (j1 - 1) * dr
            if not (rl > 0.0 and rr > 0.0):
                continue
            key = (rl, rr)
            if key not in cache:
                segment_sums(w, ipos, rl, rr, sums)
                segment_blocks(sums, lo, hi, BLOCK, log_top, bmax, bfirst, blast)
                cache[key] = (bmax.copy(), bfirst.copy(), blast.copy())
            b_max, b_first, b_last = cache[key]
            discounted_max_blocks(b_max, b_first, b_last, lefts, rights, dl, dr, res)
            out[s, j0 : j1 + 1] = res[j0 - 2 : j1 - 1]
    return out


class SmoothedNorms:
    """:meth:`ErrorBound.norms` with the smaller inner norms of the module docstring, for the
    problem ``eb`` was formed on (``logw``, ``pos``); the smoothed hops are formed at the
    first call (two passes over the intervals per group) and kept."""

    def __init__(self, eb: ErrorBound, logw: FloatArray, pos: IntArray) -> None:
        self.eb, self.logw, self.pos = eb, logw, pos
        self.hops: FloatArray | None = None

    def __call__(self, floors: FloatArray) -> FloatArray:
        eb = self.eb
        if self.hops is None:
            self.hops = smoothed_hops(eb, self.logw, self.pos)
        floors = np.asarray(floors, dtype=np.float64)
        return smoothed_norms_kernel(
            floors,
            np.asarray(eb.gaps, dtype=np.float64),
            eb.norms(floors),
            eb.hop,
            self.hops,
            eb.draw_k,
            eb.d_left,
            eb.d_right,
            eb.margin,
            eb.lefts,
            eb.rights,
            eb.c,
            eb.mu,
            eb.lwd,
            eb.p0,
            eb.pd,
        )

"""Numba kernels for JointExp's forward rows and backward draws over uneven positions.

Index ``i`` runs over the d + 1 intervals between distinct clamped values; ``P[i]`` is the
position of interval i (the number of data points <= any output in it; strictly increasing
integers); ``T`` is the previous row summed over repeat counts; ``c = epsilon / (2 * Δ)``,
``r = exp(-c)``. The transition weight from ``i'`` to ``i > i'`` for quantile gap ``nj`` is
``r ** |D - nj|`` with ``D = P[i] - P[i']`` (an integer >= 1). Writing ``L = floor(nj)``,
``f = nj - L``:

* near part, ``1 <= D <= L``: weight ``r**f * r**(L - D)``;
* far part,  ``D >= L + 1``:  weight ``r**(1 - f) * r**(D - L - 1)``.

For output i let ``t(i)`` be the last i' with ``P[i'] <= P[i] - L - 1`` (monotone in i).
The far part is ``r**(1-f) * G(t) * r**(P[i] - P[t] - L - 1)`` with the causal geometric
recursion ``G(t) = T[t] + r**(P[t] - P[t-1]) G(t-1)``. The near part is a window sum over
``i' in (t(i), i)`` whose two ends only move forward: it is kept as a two-stack queue (the
front holds suffix sums ``SA[k] = sum_{u=k}^{B-1} T[u] r**(P[u] - P[k])``, recomputed when
the front empties; the back a running sum relative to ``P[B]``), so every element enters one
suffix recomputation at most once: O(d) per row, O(1) amortised per output. Every sum adds
non-negative terms only (no subtraction, no cancellation), and every partial sum carries a
factor no smaller than the one it finally gets, so a term can only underflow if its final
contribution is below the smallest normal double (times the row scale).

``pw[e] = exp(-c e)`` is a table of exact powers for integer ``e``; entries past its end are
zero (they underflow a double). The same recursions run in log space in
:mod:`~app.mechanisms.jointexp.kernels_log` and in extended-range linear arithmetic in
:mod:`~app.mechanisms.jointexp.kernels_scaled`. This module also holds the linear weights of
the backward draws and the position helpers of the inputs.
"""

from __future__ import annotations

import math

import numba
import numpy as np

NEG_INF = -np.inf


@numba.njit(cache=True, nogil=True, inline="always")
def decay_power(pw: np.ndarray, e: int) -> float:
    if e < pw.size:
        return float(pw[e])
    return 0.0


@numba.njit(cache=True, nogil=True)
def transition_linear(
    T: np.ndarray,
    lo: int,
    scale: float,
    w: np.ndarray,
    P: np.ndarray,
    nj: float,
    c: float,
    mu: float,
    pw: np.ndarray,
    pwf: np.ndarray,
    SA: np.ndarray,
    S: np.ndarray,
) -> tuple[int, float]:
    """Single-copy transition in linear space over a row stored from global index ``lo``.

    ``T[u]`` is the previous row (summed over repeats) at global index ``lo + u``, zero
    outside. Writes ``S[v] = w[lo + v] * scale * sum_{u < v} T[u] k(P[lo+v] - P[lo+u])``
    for ``v = 0, 1, ...`` and returns ``(count, max)``: entries from ``count`` on are exactly
    zero (the far tail has underflowed to 0.0), so the loop stops there. ``SA`` is scratch of
    at least ``T.size`` entries; ``S`` holds up to ``d + 1 - lo`` entries.

    The kernel is ``k(D) = r**|D - nj| * exp(-mu (D - nj))``: the module's kernel for
    ``mu = 0``; with a tilt ``0 <= mu < c`` (rows stored as ``alpha e^(-mu P)``, see
    ``jointexp.Forward``) its near part decays at rate ``c - mu`` (table ``pw``) and its far
    part at ``c + mu`` (table ``pwf``; the same table when ``mu = 0``).
    """
    nT = T.size
    n_out = min(S.size, w.size - lo)
    Pl = P[lo : lo + n_out]
    wl_ = w[lo : lo + n_out]
    L = int(math.floor(nj))
    f = nj - L
    r_f = math.exp(-(c - mu) * f)
    r_1mf = math.exp(-(c + mu) * (1.0 - f))
    top = 0.0
    t = -1  # far pointer (local index)
    G = 0.0
    B = 0  # first index of the back stack; front = [wl, B)
    PB = Pl[0]  # its position
    BA = 0.0  # sum_{u=B}^{wh} T[u] r**(P[u] - P[B])
    wh = -1  # last index in the window
    S[0] = 0.0
    count = 1
    # Outputs whose whole window is at distance L - D >= pw.size from the kernel's peak get a
    # near factor of exactly 0.0 from the table (and have no far part yet): they are 0.0, as
    # the loop would compute. Start at the first output that can be non-zero, with the
    # window's suffix sums built over the elements already in it.
    v0 = 1
    reach = L - pw.size  # P[lo + v] - P[lo] <= reach: output v is exactly 0.0
    if reach >= 1:
        v0 = max(1, int(np.searchsorted(Pl, Pl[0] + reach, side="right")))
    if v0 > 1:
        for v in range(1, v0):
            S[v] = 0.0
        wh = min(v0 - 2, nT - 1)
        if wh >= 0:
            acc = T[wh]
            SA[wh] = acc
            for k in range(wh - 1, -1, -1):
                acc = T[k] + decay_power(pw, Pl[k + 1] - Pl[k]) * acc
                SA[k] = acc
        B = wh + 1
        PB = Pl[B] if n_out > B else 0  # (unused while the back stack is empty)
        count = v0
    Ptp = 0  # P at the far pointer t (used once t >= 0)
    for v in range(v0, n_out):
        pv = Pl[v]
        u = v - 1
        if u < nT:  # u joins the back of the window
            if u >= B:
                BA += T[u] * decay_power(pw, Pl[u] - PB)
            else:
                B = u
                PB = Pl[u]
                BA = T[u]
            wh = u
        lim = pv - L - 1
        while t + 1 < nT and Pl[t + 1] <= lim:
            t += 1
            pt = Pl[t]
            G = T[t] + (decay_power(pwf, pt - Ptp) * G if t > 0 else 0.0)
            Ptp = pt
        a = 0.0
        wl = t + 1
        if wl <= wh:
            if wl >= B:  # front empty: rebuild suffix sums over [wl, wh]
                acc = T[wh]
                SA[wh] = acc
                for k in range(wh - 1, wl - 1, -1):
                    acc = T[k] + decay_power(pw, Pl[k + 1] - Pl[k]) * acc
                    SA[k] = acc
                B = wh + 1
                PB = Pl[B] if n_out > B else 0  # (unused while the back stack is empty)
                BA = 0.0
            agg = SA[wl]
            pwl = Pl[wl]
            if BA > 0.0:
                agg += decay_power(pw, PB - pwl) * BA
            a = r_f * decay_power(pw, L - (pv - pwl)) * agg
        far = 0.0
        if t >= 0:
            far = r_1mf * G * decay_power(pwf, pv - Ptp - L - 1)
            a += far
        val = wl_[v] * (scale * a)
        S[v] = val
        top = max(top, val)
        count = v + 1
        if t == nT - 1 and far == 0.0:
            break  # window past the row and the geometric tail is exactly zero
    return count, top


@numba.njit(cache=True, nogil=True)
def transition_majorant(
    T: np.ndarray,
    lo: int,
    scale: float,
    w: np.ndarray,
    P: np.ndarray,
    nj: float,
    c: float,
    mu: float,
    pw: np.ndarray,
    pwf: np.ndarray,
    SA: np.ndarray,
    S: np.ndarray,
) -> tuple[int, float]:
    """An entry-wise upper bound of :func:`transition_linear` (same arguments and outputs):
    the kernel summed over *every* stored ``u``, also ``u >= v`` (where ``D = P[lo+v] -
    P[lo+u] <= 0``: each such term is at most ``e^{-(c - mu) nj}`` of ``T[u]``). Without the
    window the near part is one suffix sum, ``H[k] = sum_{u >= k} T[u] r**(P[u] - P[k])``
    (into ``SA``), read at the first ``u`` past the far pointer: two recursions and no
    window stacks. Every sum adds non-negative terms whose partial sums carry a factor no
    smaller than the one they finally get, as in :func:`transition_linear`. For the
    certificate's error passes, where an upper bound is all that is asked."""
    nT = T.size
    n_out = min(S.size, w.size - lo)
    Pl = P[lo : lo + n_out]
    Pt = P[lo : lo + nT]
    wl_ = w[lo : lo + n_out]
    L = int(math.floor(nj))
    f = nj - L
    r_f = math.exp(-(c - mu) * f)
    r_1mf = math.exp(-(c + mu) * (1.0 - f))
    acc = 0.0
    for k in range(nT - 1, -1, -1):
        step = decay_power(pw, Pt[k + 1] - Pt[k]) if k < nT - 1 else 0.0
        acc = T[k] + step * acc
        SA[k] = acc
    top = 0.0
    t = -1  # far pointer: the last u with P[u] <= P[v] - L - 1
    G = 0.0
    Ptp = 0
    count = 0
    for v in range(n_out):
        pv = Pl[v]
        lim = pv - L - 1
        while t + 1 < nT and Pt[t + 1] <= lim:
            t += 1
            pt = Pt[t]
            G = T[t] + (decay_power(pwf, pt - Ptp) * G if t > 0 else 0.0)
            Ptp = pt
        a = 0.0
        if t + 1 < nT:  # near part: every u > t (P[u] >= P[v] - L)
            a = r_f * decay_power(pw, Pt[t + 1] - (pv - L)) * SA[t + 1]
        far = 0.0
        if t >= 0:
            far = r_1mf * G * decay_power(pwf, pv - Ptp - L - 1)
            a += far
        val = wl_[v] * (scale * a)
        S[v] = val
        top = max(top, val)
        count = v + 1
        if t == nT - 1 and far == 0.0:
            break  # past the row and the geometric tail is exactly zero
    return count, top


@numba.njit(cache=True, nogil=True, inline="always")
def _nonzero_span(x: np.ndarray, lo: int, hi: int) -> tuple[int, int]:
    """The first and one past the last index in [lo, hi) where ``x`` is not 0.0 (an empty
    span at ``lo`` if there is none), by scans from both ends."""
    while lo < hi and x[lo] == 0.0:
        lo += 1
    while hi > lo and x[hi - 1] == 0.0:
        hi -= 1
    return lo, hi


@numba.njit(cache=True, nogil=True)
def linear_levels_step(
    lev: np.ndarray,
    ids: np.ndarray,
    w_here: np.ndarray,
    stay: float,
    lev1: np.ndarray,
    prune: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float, int, int]:
    """The repeat levels of a linear row, its sum over levels, span, maximum and argmax.

    ``lev`` (stored levels x n_t) is the previous row, ``ids`` the repeat count of each
    stored level (ascending; ``ids[0] = 1``), ``lev1`` the new single-copy entries
    (``count >= n_t``). Level k + 1 of the new row is ``level k * w_here * (stay / (k + 1))``,
    set to 0.0 where below ``prune`` times the single-copy entry at the same interval.
    A level that is 0.0 everywhere is not stored (level 1 always is): its successors would
    be 0.0 too, so only the levels that hold something are carried (at small n the rows
    hold the path with every quantile in the first interval, level j at one column, and a
    few low levels: j levels dense, ~5 stored). Returns ``(levels, total, ids, top, a,
    at)``: the stored levels cut to the columns from the first to the last whose sum over
    levels is non-zero (starting at column ``a``), that sum over levels on the same columns,
    the stored levels' repeat counts, its largest value ``top`` and the column ``at`` of it
    (0.0 and an empty row if all are 0). Each level is formed only over the span where its
    source level is non-zero, and the output is written once: the same doubles as the
    dense recurrence (``test_levels_that_are_zero_everywhere_are_not_stored``).
    """
    nprev, n_t = lev.shape
    count = lev1.size
    if stay <= 0.0:
        nprev = 0
    tot = lev1.copy()
    new_ids = np.empty(nprev + 1, dtype=np.int64)
    new_ids[0] = 1
    # Level k + 1 is formed only over the columns [s0, s1) where stored level k is non-zero
    # (elsewhere it is 0.0 * w * f = 0.0, which the dense loop also wrote): on clamped data
    # the levels above 2 hold a few thousand of ~60,000 columns. Its values go to ``buf``,
    # and it is trimmed to its own non-zero columns [f0, f1) before it is stored.
    spans = np.empty((nprev, 2), dtype=np.int64)
    cap = 0
    for k in range(nprev):
        s0, s1 = _nonzero_span(lev[k], 0, n_t)
        spans[k, 0] = s0
        spans[k, 1] = s1
        cap += s1 - s0
    buf = np.empty(cap)
    f0s = np.empty(nprev + 1, dtype=np.int64)
    f1s = np.empty(nprev + 1, dtype=np.int64)
    offs = np.empty(nprev + 1, dtype=np.int64)
    nkeep = 1
    pos = 0
    for k in range(nprev):
        fk = stay / (ids[k] + 1.0)
        src = lev[k]
        s0 = spans[k, 0]
        s1 = spans[k, 1]
        seg = buf[pos : pos + (s1 - s0)]
        # branch-free (the loop vectorises); a kept 0.0 and a dropped entry are the same
        # value, so ``y >= prune * lev1`` decides alone
        for v in range(s0, s1):
            y = src[v] * w_here[v] * fk
            seg[v - s0] = y if y >= prune * lev1[v] else 0.0
        f0, f1 = _nonzero_span(seg, 0, s1 - s0)
        f0 += s0
        f1 += s0
        if f1 > f0:  # level k + 1 holds something: stored
            for v in range(f0, f1):
                tot[v] += seg[v - s0]
            f0s[nkeep] = f0
            f1s[nkeep] = f1
            offs[nkeep] = pos + (f0 - s0)
            new_ids[nkeep] = ids[k] + 1
            nkeep += 1
        pos += s1 - s0
    # The first and last column with a positive sum, its largest value and the first column
    # holding it. Non-negative doubles order as their bit patterns, so the maximum is an
    # integer reduction (it vectorises; a float maximum does not without fastmath).
    a = 0
    while a < count and not (tot[a] > 0.0):
        a += 1
    b = count
    while b > a and not (tot[b - 1] > 0.0):
        b -= 1
    if b <= a:
        return np.zeros((1, 0)), np.zeros(0), new_ids[:1].copy(), 0.0, 0, 0
    bits = tot.view(np.int64)
    hi = bits[a]
    for v in range(a + 1, b):
        hi = max(hi, bits[v])
    at = a
    while at < b - 1 and bits[at] != hi:
        at += 1
    top = tot[at]
    out = np.empty((nkeep, b - a))
    out[0, :] = lev1[a:b]
    for i in range(1, nkeep):
        row = out[i]
        f0 = f0s[i]
        f1 = f1s[i]
        o = offs[i]
        for v in range(a, f0):
            row[v - a] = 0.0
        for v in range(f0, f1):
            row[v - a] = buf[o + v - f0]
        for v in range(f1, b):
            row[v - a] = 0.0
    if a == 0 and b == count:
        return out, tot, new_ids[:nkeep].copy(), top, a, at
    return out, tot[a:b].copy(), new_ids[:nkeep].copy(), top, a, at


@numba.njit(cache=True, nogil=True)
def linear_row(
    total: np.ndarray,
    lev: np.ndarray,
    ids: np.ndarray,
    lo: int,
    scale: float,
    stay: float,
    n_out: int,
    w: np.ndarray,
    P: np.ndarray,
    nj: float,
    c: float,
    mu: float,
    pw: np.ndarray,
    pwf: np.ndarray,
    prune: float,
    prof_pos: np.ndarray,
    prof_val: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float, int, int]:
    """One linear row from the previous one, in one call: :func:`transition_linear` (its
    single-copy entries, up to ``n_out`` of them), then :func:`linear_levels_step` (the
    repeat levels, ``w[lo:]`` the widths under the previous row), and, when ``prof_val``
    has room, :func:`profile_columns` of the new row's sum over levels. The same calls a
    caller would make one by one (a row costs one dispatch instead of three); returns what
    :func:`linear_levels_step` returns.
    """
    n_t = total.size
    s = np.empty(n_out)
    count, _ = transition_linear(total, lo, scale, w, P, nj, c, mu, pw, pwf, np.empty(n_t), s)
    out, tot, new_ids, top, a, at = linear_levels_step(
        lev, ids, w[lo : lo + n_t], stay, s[:count], prune
    )
    if prof_val.size > 0 and tot.size > 0:
        profile_columns(tot, P, lo + a, prof_pos, prof_val)
    return out, tot, new_ids, top, a, at


@numba.njit(cache=True, nogil=True)
def replay_levels(
    firsts: np.ndarray,
    stays: np.ndarray,
    base: np.ndarray,
    wg: float,
    prune: float,
    out: np.ndarray,
) -> None:
    """The levels of a compact linear row at one interval, formed again from its chain.

    ``firsts[i]`` and ``stays[i]`` are level 1 at the interval and the repeat factor of the
    chain's i-th row (row j - i); ``base`` the levels of the complete row that ends the chain
    (empty when the chain ends at level 1). Level k + 1 of row i is level k of row i + 1
    times ``wg * (stay_i / (k + 1))``, 0.0 where below ``prune`` times its level 1: the
    operations of :func:`linear_levels_step`, in its order, so the same doubles. Writes the
    ``out.size`` levels of row j (the chain's first).
    """
    depth = firsts.size
    # Row i has out.size - i levels; the chain is formed from its end (the deepest row) back
    # up, in place in ``out`` (row i's levels fill out[: out.size - i]).
    nb = base.size
    for k in range(nb):
        out[k] = base[k]
    size = nb
    for i in range(depth - 1, -1, -1):
        stay = stays[i]
        first = firsts[i]
        lim = prune * first
        # level k + 1 (index k) of row i from level k (index k - 1) of row i + 1: from the
        # top down, so each entry is read before it is overwritten
        for k in range(size, 0, -1):
            y = out[k - 1] * wg * (stay / (k + 1.0))
            out[k] = y if y >= lim else 0.0
        out[0] = first
        size += 1


@numba.njit(cache=True, nogil=True)
def profile_columns(
    values: np.ndarray, P: np.ndarray, lo: int, out_pos: np.ndarray, out_val: np.ndarray
) -> None:
    """``values`` and the positions ``P[lo + col]`` at ``out_val.size`` columns spread evenly.

    Columns ``k * (size - 1) // (points - 1)`` for ``k = 0 .. points - 1`` (``size`` is
    ``values.size``, ``points`` is ``out_val.size``): ``np.linspace(0, size - 1, points)``
    truncated, in integers (the same columns when ``points - 1`` is a power of two, as
    linspace's steps are then exact). Values are copied as they are.
    """
    size = values.size
    points = out_val.size
    for k in range(points):
        col = k * (size - 1) // (points - 1)
        out_pos[k] = P[lo + col]
        out_val[k] = values[col]


@numba.njit(cache=True, nogil=True)
def first_window(
    live_pos: np.ndarray,
    live_idx: np.ndarray,
    logw: np.ndarray,
    P: np.ndarray,
    n1: float,
    c: float,
    mu: float,
    reach: float,
) -> tuple[int, int]:
    """Intervals ``[i0, i1)`` outside which row 1 is more than ``reach`` e-folds (finite)
    below its maximum.

    Row 1 in logs is ``log w_i - c |P_i - n1| - mu (P_i - n1)`` with ``log w_i <= 0``, so
    it is below ``-(c - mu) (n1 - P)`` left of n1 and ``-(c + mu) (P - n1)`` right of it;
    the live intervals next to n1 (positions ``live_pos``, indices ``live_idx``) give a
    value ``m0`` the maximum is at least. O(log d).
    """
    k = np.searchsorted(live_pos, math.ceil(n1))
    m0 = NEG_INF
    for kk in (k - 1, k):
        if 0 <= kk < live_pos.size:
            e = float(live_pos[kk]) - n1
            lv = logw[live_idx[kk]] - c * abs(e) - mu * e
            m0 = max(m0, lv)
    span = reach - m0 + 1.0
    i0 = np.searchsorted(P, math.floor(n1 - span / (c - mu)))
    i1 = np.searchsorted(P, math.ceil(n1 + span / (c + mu)), side="right")
    return int(i0), int(i1)


#: Decay-table entries at least this large are used as they are by the draws; below it (the
#: table's subnormal range, flushed to 0.0, or past its end) the factor is formed from its
#: exponent (:func:`step_weights_linear`).
_TABLE_NORMAL = 2.0**-1000


@numba.njit(cache=True, nogil=True, inline="always")
def _scaled_factor(table: float, scaled_rest: float, log_factor: float) -> float:
    """``scaled_rest * table`` where the table entry is a normal double, else
    ``exp(log_factor)``: the same scaled kernel factor, formed whatever the table holds."""
    if table >= _TABLE_NORMAL:
        return scaled_rest * table
    return math.exp(log_factor)


@numba.njit(cache=True, nogil=True)
def step_weights_linear(
    total: np.ndarray,
    lo: int,
    count: int,
    pos_ref: int,
    P: np.ndarray,
    nj: float,
    c: float,
    mu: float,
    lscale: float,
    pw: np.ndarray,
    pwf: np.ndarray,
    out: np.ndarray,
) -> float:
    """out[v] = total[v] * e^lscale * k(pos_ref - P[lo + v]) for v < count; their max.

    ``total`` is the row summed over repeat counts: one weight per interval, from which a
    draw picks the interval (then the count from its levels, :func:`level_weights`). ``k`` is
    :func:`transition_linear`'s kernel (tilt ``mu``, tables ``pw`` and ``pwf``);
    ``lscale`` <= -log(max k over the candidates) keeps every factor <= 1.

    Every scaled factor ``e^lscale k(D)`` is formed whenever it is a normal double: from the
    tables where their entry is normal (the tables hold ``k`` *unscaled* and end, or flush to
    0.0, ~745 e-folds down), else from its exponent directly. Forming it as table entry times
    ``e^lscale`` alone dropped every factor deeper than the table, however large the scale
    made it: with ``lscale`` = 300 a factor of e^-445 after scaling became 0.0, and the
    interval it belonged to could be the dominant one.
    """
    L = int(math.floor(nj))
    f = nj - L
    kscale = math.exp(lscale)
    r_f = kscale * math.exp(-(c - mu) * f)
    r_1mf = kscale * math.exp(-(c + mu) * (1.0 - f))
    top = 0.0
    for v in range(count):
        d = pos_ref - P[lo + v]
        if d <= L:
            e = L - d
            kern = _scaled_factor(decay_power(pw, e), r_f, lscale - (c - mu) * (e + f))
        else:
            e = d - L - 1
            kern = _scaled_factor(decay_power(pwf, e), r_1mf, lscale - (c + mu) * (e + 1.0 - f))
        x = total[v] * kern
        out[v] = x
        if x > top:
            top = x
    return top


@numba.njit(cache=True, nogil=True)
def largest_step(pos: np.ndarray) -> int:
    """The largest ``pos[i] - pos[i - 1]`` (0 for fewer than two positions)."""
    best = 0
    for i in range(1, pos.size):
        step = pos[i] - pos[i - 1]
        if step > best:
            best = step
    return best


@numba.njit(cache=True, nogil=True)
def capped_positions(pos: np.ndarray, cap: int, out: np.ndarray) -> None:
    """``out``: ``pos`` with every step ``pos[i] - pos[i - 1]`` larger than ``cap`` cut to
    ``cap`` (``out[0] = pos[0]``). Integers: the same as a cumulative sum of the cut steps."""
    acc = pos[0]
    out[0] = acc
    for i in range(1, pos.size):
        acc += min(pos[i] - pos[i - 1], cap)
        out[i] = acc

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
zero (they underflow a double). The ``_log`` variants run the same recursions in log space;
:func:`transition_ext` runs them on log-space rows in extended-range linear arithmetic
(double mantissa times an integer power of e), which neither underflows nor needs a
``logaddexp`` per addition.
"""

from __future__ import annotations

import math

import numba
import numpy as np

NEG_INF = -np.inf


@numba.njit(cache=True, nogil=True, inline="always")
def _pw(pw: np.ndarray, e: int) -> float:
    if e < pw.size:
        return float(pw[e])
    return 0.0


@numba.njit(cache=True, nogil=True, inline="always")
def _lae(a: float, b: float) -> float:
    """log(exp(a) + exp(b)) without overflow or underflow."""
    if a == NEG_INF:
        return b
    if b == NEG_INF:
        return a
    if a > b:
        return a + math.log1p(math.exp(b - a))
    return b + math.log1p(math.exp(a - b))


# --------------------------------------------------------------------------- linear space


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
    ``jointexp._Forward``) its near part decays at rate ``c - mu`` (table ``pw``) and its far
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
                acc = T[k] + _pw(pw, Pl[k + 1] - Pl[k]) * acc
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
                BA += T[u] * _pw(pw, Pl[u] - PB)
            else:
                B = u
                PB = Pl[u]
                BA = T[u]
            wh = u
        lim = pv - L - 1
        while t + 1 < nT and Pl[t + 1] <= lim:
            t += 1
            pt = Pl[t]
            G = T[t] + (_pw(pwf, pt - Ptp) * G if t > 0 else 0.0)
            Ptp = pt
        a = 0.0
        wl = t + 1
        if wl <= wh:
            if wl >= B:  # front empty: rebuild suffix sums over [wl, wh]
                acc = T[wh]
                SA[wh] = acc
                for k in range(wh - 1, wl - 1, -1):
                    acc = T[k] + _pw(pw, Pl[k + 1] - Pl[k]) * acc
                    SA[k] = acc
                B = wh + 1
                PB = Pl[B] if n_out > B else 0  # (unused while the back stack is empty)
                BA = 0.0
            agg = SA[wl]
            pwl = Pl[wl]
            if BA > 0.0:
                agg += _pw(pw, PB - pwl) * BA
            a = r_f * _pw(pw, L - (pv - pwl)) * agg
        far = 0.0
        if t >= 0:
            far = r_1mf * G * _pw(pwf, pv - Ptp - L - 1)
            a += far
        val = wl_[v] * (scale * a)
        S[v] = val
        top = max(top, val)
        count = v + 1
        if t == nT - 1 and far == 0.0:
            break  # window past the row and the geometric tail is exactly zero
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


@numba.njit(cache=True, nogil=True)
def first_row_log(logw: np.ndarray, P: np.ndarray, n1: float, c: float, out: np.ndarray) -> None:
    """out[i] = log(w_i) - c |P[i] - n1|  (log of alpha(1, i, 1) up to a constant)."""
    for i in range(logw.size):
        out[i] = logw[i] - c * abs(P[i] - n1)


@numba.njit(cache=True, nogil=True)
def exp_normalise(lx: np.ndarray, out: np.ndarray) -> float:
    """out = exp(lx - max(lx)); returns max(lx)."""
    top = NEG_INF
    for i in range(lx.size):
        if lx[i] > top:
            top = lx[i]
    lo_x = top - 746.0  # exp of anything below this is 0.0 in a double: skip the call
    for i in range(lx.size):
        v = lx[i]
        out[i] = math.exp(v - top) if v > lo_x else 0.0
    return top


# --------------------------------------------------------------------------- log space


@numba.njit(cache=True, nogil=True)
def transition_log(
    lT: np.ndarray,
    lo: int,
    logw: np.ndarray,
    suf_logw: np.ndarray,
    P: np.ndarray,
    nj: float,
    c: float,
    keep: float,
    lSA: np.ndarray,
    lS: np.ndarray,
) -> tuple[int, float]:
    """Log-space twin of :func:`transition_linear` (exact for any dynamic range).

    Writes ``lS[v] = logw[lo + v] + log sum_{u < v} exp(lT[u]) r**|P[lo+v] - P[lo+u] - nj|``
    and returns ``(count, max)``. Once the window has passed the row, values only fall (by at
    least ``c`` per position, times the widths ahead, bounded by ``suf_logw``, the suffix
    maximum of ``logw``); the loop stops when none can come within ``keep`` of the maximum.
    """
    nT = lT.size
    n_out = min(lS.size, logw.size - lo)
    L = int(math.floor(nj))
    f = nj - L
    lr = -c
    top = NEG_INF
    t = -1
    lG = NEG_INF
    B = 0
    lBA = NEG_INF
    wh = -1
    lS[0] = NEG_INF
    count = 1
    for v in range(1, n_out):
        pv = P[lo + v]
        u = v - 1
        if u < nT:
            if u >= B:
                lBA = _lae(lBA, lT[u] + lr * (P[lo + u] - P[lo + B]))
            else:
                B = u
                lBA = lT[u]
            wh = u
        while t + 1 < nT and P[lo + t + 1] <= pv - L - 1:
            t += 1
            lG = _lae(lT[t], lr * (P[lo + t] - P[lo + t - 1]) + lG) if t > 0 else lT[t]
        a = NEG_INF
        wl = t + 1
        if wl <= wh:
            if wl >= B:
                acc = lT[wh]
                lSA[wh] = acc
                for k in range(wh - 1, wl - 1, -1):
                    acc = _lae(lT[k], lr * (P[lo + k + 1] - P[lo + k]) + acc)
                    lSA[k] = acc
                B = wh + 1
                lBA = NEG_INF
            agg = lSA[wl]
            if lBA > NEG_INF:
                agg = _lae(agg, lr * (P[lo + B] - P[lo + wl]) + lBA)
            a = lr * f + lr * (L - (pv - P[lo + wl])) + agg
        lfar = NEG_INF
        if t >= 0:
            lfar = lr * (1.0 - f) + lG + lr * (pv - P[lo + t] - L - 1)
            a = _lae(a, lfar)
        val = logw[lo + v] + a
        lS[v] = val
        if val > top:
            top = val
        count = v + 1
        if t == nT - 1 and lfar + suf_logw[lo + v] < top - keep:
            break
    return count, top


# --------------------------------------------------------------------------- extended range

#: exp(-k) for k = 0..745 (aligning two extended numbers whose exponents differ by k)
EXP_NEG = np.exp(-np.arange(746, dtype=np.float64))
_XLO = math.exp(-30.0)  # mantissas below this are renormalised (they stay normal doubles)


def ext_decay_table(c: float, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``exp(-c k) = pm[k] * e**(-pe[k])`` for k < size, with integer ``pe[k] = floor(c k)``.

    The mantissas lie in (1/e, 1], so no decay by a tabled distance can underflow. ``c k``
    is rounded once, as in the log-space kernel's ``-c * k``.
    """
    x = c * np.arange(size, dtype=np.float64)
    pe = np.floor(x)
    return np.exp(pe - x), pe.astype(np.int64)


@numba.njit(cache=True, nogil=True, inline="always")
def _xnorm(m: float, e: int) -> tuple[float, int]:
    """Bring a positive mantissa back to [1, e) (exact up to one rounding of the scale)."""
    if m >= _XLO:
        return m, e
    if m == 0.0:
        return 0.0, e
    k = int(math.floor(math.log(m)))
    return m * math.exp(-float(k)), e + k


@numba.njit(cache=True, nogil=True, inline="always")
def _xadd(m1: float, e1: int, m2: float, e2: int) -> tuple[float, int]:
    """m1 e^e1 + m2 e^e2 on the larger exponent (a term 746+ e-folds down is dropped)."""
    if m2 == 0.0:
        return m1, e1
    if m1 == 0.0:
        return m2, e2
    if e1 >= e2:
        d = e1 - e2
        if d < 746:
            m1 += m2 * EXP_NEG[d]
        return m1, e1
    d = e2 - e1
    if d < 746:
        m2 += m1 * EXP_NEG[d]
    return m2, e2


@numba.njit(cache=True, nogil=True, inline="always")
def _xdecay(
    m: float, e: int, dist: int, c: float, pm: np.ndarray, pe: np.ndarray
) -> tuple[float, int]:
    """(m e^e) * exp(-c dist) for an integer distance >= 0."""
    if dist < pm.size:
        return _xnorm(m * pm[dist], e - pe[dist])
    x = c * dist
    k = math.floor(x)
    return _xnorm(m * math.exp(k - x), e - int(k))


@numba.njit(cache=True, nogil=True)
def transition_ext(
    lT: np.ndarray,
    lo: int,
    logw: np.ndarray,
    suf_logw: np.ndarray,
    P: np.ndarray,
    nj: float,
    c: float,
    keep: float,
    pm: np.ndarray,
    pe: np.ndarray,
    Tm: np.ndarray,
    Te: np.ndarray,
    SAm: np.ndarray,
    SAe: np.ndarray,
    lS: np.ndarray,
) -> tuple[int, float]:
    """:func:`transition_log` computed in extended-range linear arithmetic.

    Same input and output (log-space rows, the same stopping rule), but every sum is formed
    as ``m * e**E`` with a double mantissa ``m`` in [e^-30, ~e^2) and an integer exponent
    ``E``: one ``exp`` per input entry and one ``log`` per output entry instead of a
    ``logaddexp`` per operation. Additions align on the larger exponent (exactly the double
    addition of the two values, up to one rounding of the alignment factor ``e**-d``), decays
    ``exp(-c D)`` split into an integer exponent and a mantissa factor in (1/e, 1] (table
    ``pm, pe`` from :func:`ext_decay_table`, the same ``c D`` rounding as the log kernel), so
    nothing underflows whatever the dynamic range; terms are only ever added.
    ``Tm, Te, SAm, SAe`` are scratch of at least ``lT.size`` entries.
    """
    nT = lT.size
    n_out = min(lS.size, logw.size - lo)
    L = int(math.floor(nj))
    f = nj - L
    r_f = math.exp(-c * f)
    r_1mf = math.exp(-c * (1.0 - f))
    for u in range(nT):
        x = lT[u]
        if x == NEG_INF:
            Tm[u] = 0.0
            Te[u] = 0
        else:
            k = math.floor(x)
            Tm[u] = math.exp(x - k)
            Te[u] = int(k)
    top = NEG_INF
    t = -1
    Gm = 0.0
    Ge = 0
    B = 0
    BAm = 0.0
    BAe = 0
    wh = -1
    lS[0] = NEG_INF
    count = 1
    for v in range(1, n_out):
        pv = P[lo + v]
        u = v - 1
        if u < nT:
            if u >= B:
                xm, xe = _xdecay(Tm[u], Te[u], P[lo + u] - P[lo + B], c, pm, pe)
                BAm, BAe = _xadd(BAm, BAe, xm, xe)
            else:
                B = u
                BAm = Tm[u]
                BAe = Te[u]
            wh = u
        while t + 1 < nT and P[lo + t + 1] <= pv - L - 1:
            t += 1
            if t > 0:
                Gm, Ge = _xdecay(Gm, Ge, P[lo + t] - P[lo + t - 1], c, pm, pe)
                Gm, Ge = _xadd(Gm, Ge, Tm[t], Te[t])
            else:
                Gm = Tm[t]
                Ge = Te[t]
        am = 0.0
        ae = 0
        wl = t + 1
        if wl <= wh:
            if wl >= B:
                accm = Tm[wh]
                acce = Te[wh]
                SAm[wh] = accm
                SAe[wh] = acce
                for k in range(wh - 1, wl - 1, -1):
                    accm, acce = _xdecay(accm, acce, P[lo + k + 1] - P[lo + k], c, pm, pe)
                    accm, acce = _xadd(accm, acce, Tm[k], Te[k])
                    SAm[k] = accm
                    SAe[k] = acce
                B = wh + 1
                BAm = 0.0
                BAe = 0
            aggm = SAm[wl]
            agge = SAe[wl]
            if BAm > 0.0:
                xm, xe = _xdecay(BAm, BAe, P[lo + B] - P[lo + wl], c, pm, pe)
                aggm, agge = _xadd(aggm, agge, xm, xe)
            am, ae = _xdecay(aggm, agge, L - (pv - P[lo + wl]), c, pm, pe)
            am *= r_f
        lfar = NEG_INF
        if t >= 0:
            fm, fe = _xdecay(Gm, Ge, pv - P[lo + t] - L - 1, c, pm, pe)
            fm *= r_1mf
            am, ae = _xadd(am, ae, fm, fe)
            if t == nT - 1 and fm > 0.0:
                lfar = math.log(fm) + fe
        val = logw[lo + v] + math.log(am) + ae if am > 0.0 else NEG_INF
        lS[v] = val
        if val > top:
            top = val
        count = v + 1
        if t == nT - 1 and lfar + suf_logw[lo + v] < top - keep:
            break
    return count, top


# ------------------------------------------------------------------ scaled (coarse exponent)

#: Exponent step of the scaled kernel: a value is ``m * e**(SCALE_STEP * k)``, integer k.
SCALE_STEP = 350.0
_SLO = math.exp(-0.5 * SCALE_STEP)  # mantissas are kept in [e^-175, e^175) ...
_SHI = math.exp(0.5 * SCALE_STEP)
_SUP = math.exp(SCALE_STEP)  # ... by multiplying with e^(+-350) when they leave it
_SDN = math.exp(-SCALE_STEP)


def scaled_decay_table(c: float, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``exp(-c k) = qm[k] * e**(-SCALE_STEP * qe[k])`` for k < size, mantissas in (e^-350, 1].

    ``qe[k] = floor(c k / SCALE_STEP)``; ``c k`` is rounded once (as in the log kernel) and
    ``c k - SCALE_STEP qe[k]`` is then exact, so each factor carries one rounding (its exp).
    """
    x = c * np.arange(size, dtype=np.float64)
    qe = np.floor(x / SCALE_STEP)
    return np.exp(qe * SCALE_STEP - x), qe.astype(np.int64)


@numba.njit(cache=True, nogil=True, inline="always")
def _snorm(m: float, k: int) -> tuple[float, int]:
    """Bring a mantissa back to [e^-175, e^175): one exact-range multiply by e^(+-350).

    Callers only form mantissas in [e^-526, 2 e^175) (a normalised mantissa times a factor
    in (e^-351, 1], or the sum of two), so one step suffices and nothing is subnormal.
    """
    if m < _SLO:
        if m == 0.0:
            return 0.0, k
        return m * _SUP, k - 1
    if m >= _SHI:
        return m * _SDN, k + 1
    return m, k


@numba.njit(cache=True, nogil=True, inline="always")
def _sadd(m1: float, k1: int, m2: float, k2: int) -> tuple[float, int]:
    """m1 e^(350 k1) + m2 e^(350 k2). Equal exponents (the common case) add directly; one
    step apart, the smaller is scaled by e^-350 (one rounding); further apart it is below
    e^-350 of the larger (both mantissas in [e^-175, e^175)) and is dropped."""
    if m2 == 0.0:
        return m1, k1
    if m1 == 0.0:
        return m2, k2
    if k1 == k2:
        return _snorm(m1 + m2, k1)
    if k1 == k2 + 1:
        return _snorm(m1 + m2 * _SDN, k1)
    if k2 == k1 + 1:
        return _snorm(m2 + m1 * _SDN, k2)
    if k1 > k2:
        return m1, k1
    return m2, k2


@numba.njit(cache=True, nogil=True, inline="always")
def _sdecay(
    m: float, k: int, dist: int, c: float, qm: np.ndarray, qe: np.ndarray
) -> tuple[float, int]:
    """(m e^(350 k)) * exp(-c dist) for an integer distance >= 0."""
    if dist < qm.size:
        return _snorm(m * qm[dist], k - qe[dist])
    x = c * dist
    j = math.floor(x / SCALE_STEP)
    return _snorm(m * math.exp(j * SCALE_STEP - x), k - int(j))


@numba.njit(cache=True, nogil=True)
def split_scaled(lx: np.ndarray, xr: np.ndarray, xe: np.ndarray) -> None:
    """``lx = xr + SCALE_STEP * xe`` with integer ``xe`` and ``|xr| <= 175`` (exact).

    ``exp(xr)`` (taken by numpy, vectorised) is then the mantissa of ``exp(lx)`` in the
    scaled form; ``-inf`` maps to ``xr = -inf`` (mantissa 0).
    """
    for u in range(lx.size):
        x = lx[u]
        if x == NEG_INF:
            xr[u] = NEG_INF
            xe[u] = 0
        else:
            k = math.floor(x / SCALE_STEP + 0.5)
            xr[u] = x - k * SCALE_STEP  # exact: a multiple of ulp(x) below 2^8 in size
            xe[u] = int(k)


@numba.njit(cache=True, nogil=True, inline="always")
def _sgreater(m1: float, k1: int, m2: float, k2: int) -> bool:
    """m1 e^(350 k1) > m2 e^(350 k2) for mantissas from :func:`_snorm` (or 0)."""
    if m1 == 0.0:
        return False
    if m2 == 0.0:
        return True
    if k1 == k2:
        return m1 > m2
    if k1 == k2 + 1:
        return m1 * _SUP > m2
    if k2 == k1 + 1:
        return m1 > m2 * _SUP
    return k1 > k2


@numba.njit(cache=True, nogil=True)
def transition_scaled(
    Tm: np.ndarray,
    Te: np.ndarray,
    lo: int,
    wm: np.ndarray,
    we: np.ndarray,
    suf_logw: np.ndarray,
    P: np.ndarray,
    nj: float,
    c: float,
    keep: float,
    qm: np.ndarray,
    qe: np.ndarray,
    SAm: np.ndarray,
    SAe: np.ndarray,
    Sm: np.ndarray,
    Se: np.ndarray,
) -> int:
    """:func:`transition_ext` on rows in scaled form: every value is ``m * e**(350 k)``.

    Input ``T[u] = Tm[u] e^(350 Te[u])`` (from :func:`split_scaled`), widths
    ``w = wm e^(350 we)``; output ``S[v] = Sm[v] e^(350 Se[v])`` for ``v < count`` (the
    return value): the same sums as :func:`transition_log` / :func:`transition_ext`
    (``logw`` included), with no ``exp`` or ``log`` per entry -- the caller converts rows with
    vectorised numpy. Mantissas stay in [e^-176, e^175) (:func:`_snorm`), so values whose
    exponents are equal -- nearly all, an exponent only moves after 175 e-folds -- add as
    plain doubles, a decay is one multiply by a tabled factor in (e^-350, 1]
    (:func:`scaled_decay_table`) and renormalising is one multiply by e^(+-350). Nothing
    underflows at any depth, only non-negative terms are added, and a term is dropped only
    when it is below e^-348 of the sum it joins.

    Stopping: once the window has passed the row, values only fall (see
    :func:`transition_log`); the same test, ``far + suf_logw < top - keep``, is made at every
    8th output (and whenever the far part is zero), so the loop may run up to 7 outputs
    longer than the log kernel's; those are computed exactly like the rest. ``SAm, SAe`` are
    scratch of at least ``Tm.size`` entries.
    """
    nT = Tm.size
    n_out = min(Sm.size, wm.size - lo)
    L = int(math.floor(nj))
    f = nj - L
    r_f = math.exp(-c * f)
    r_1mf = math.exp(-c * (1.0 - f))
    topm = 0.0
    tope = 0
    t = -1
    Gm = 0.0
    Ge = 0
    B = 0
    BAm = 0.0
    BAe = 0
    wh = -1
    Sm[0] = 0.0
    Se[0] = 0
    count = 1
    for v in range(1, n_out):
        pv = P[lo + v]
        u = v - 1
        if u < nT:
            if u >= B:
                xm, xe = _sdecay(Tm[u], Te[u], P[lo + u] - P[lo + B], c, qm, qe)
                BAm, BAe = _sadd(BAm, BAe, xm, xe)
            else:
                B = u
                BAm = Tm[u]
                BAe = Te[u]
            wh = u
        while t + 1 < nT and P[lo + t + 1] <= pv - L - 1:
            t += 1
            if t > 0:
                Gm, Ge = _sdecay(Gm, Ge, P[lo + t] - P[lo + t - 1], c, qm, qe)
                Gm, Ge = _sadd(Gm, Ge, Tm[t], Te[t])
            else:
                Gm = Tm[t]
                Ge = Te[t]
        am = 0.0
        ae = 0
        wl = t + 1
        if wl <= wh:
            if wl >= B:
                accm = Tm[wh]
                acce = Te[wh]
                SAm[wh] = accm
                SAe[wh] = acce
                for k in range(wh - 1, wl - 1, -1):
                    accm, acce = _sdecay(accm, acce, P[lo + k + 1] - P[lo + k], c, qm, qe)
                    accm, acce = _sadd(accm, acce, Tm[k], Te[k])
                    SAm[k] = accm
                    SAe[k] = acce
                B = wh + 1
                BAm = 0.0
                BAe = 0
            aggm = SAm[wl]
            agge = SAe[wl]
            if BAm > 0.0:
                xm, xe = _sdecay(BAm, BAe, P[lo + B] - P[lo + wl], c, qm, qe)
                aggm, agge = _sadd(aggm, agge, xm, xe)
            am, ae = _sdecay(aggm, agge, L - (pv - P[lo + wl]), c, qm, qe)
            am *= r_f
        fm = 0.0
        fe = 0
        if t >= 0:
            fm, fe = _sdecay(Gm, Ge, pv - P[lo + t] - L - 1, c, qm, qe)
            fm *= r_1mf
            am, ae = _sadd(am, ae, fm, fe)
        Sm[v] = am
        Se[v] = ae
        vm, ve = _snorm(am * wm[lo + v], ae + we[lo + v])
        if _sgreater(vm, ve, topm, tope):
            topm = vm
            tope = ve
        count = v + 1
        if t == nT - 1 and (fm == 0.0 or (v & 7) == 0) and topm > 0.0:
            lfar = math.log(fm) + fe * SCALE_STEP if fm > 0.0 else NEG_INF
            if lfar + suf_logw[lo + v] < math.log(topm) + tope * SCALE_STEP - keep:
                break
    return count


# --------------------------------------------------------------------------- backward draws


@numba.njit(cache=True, nogil=True)
def kernel_peak_log(
    live_pos: np.ndarray,
    live_idx: np.ndarray,
    i_end: int,
    pos_ref: int,
    nj: float,
    c: float,
    mu: float,
) -> float:
    """The largest log kernel factor ``-c |e| - mu e`` (``e = pos_ref - P - nj``) over the
    intervals of positive width below ``i_end`` (positions ``live_pos``, indices
    ``live_idx``, both ascending); -inf if there are none.

    The log factor is unimodal in P with its peak at ``pos_ref - nj``, so the largest one is
    at the live neighbours of that point: the last below and the first at or above
    ``ceil(pos_ref - nj)`` (an integer bound, compared with the integer positions). O(log d).
    """
    n_live = np.searchsorted(live_idx, i_end)
    at = np.searchsorted(live_pos[:n_live], math.ceil(pos_ref - nj))
    best = NEG_INF
    for k in (at - 1, at):
        if 0 <= k < n_live:
            e = float(pos_ref) - float(live_pos[k]) - nj
            best = max(best, -c * abs(e) - mu * e)
    return best


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
            kern = _scaled_factor(_pw(pw, e), r_f, lscale - (c - mu) * (e + f))
        else:
            e = d - L - 1
            kern = _scaled_factor(_pw(pwf, e), r_1mf, lscale - (c + mu) * (e + 1.0 - f))
        x = total[v] * kern
        out[v] = x
        if x > top:
            top = x
    return top


@numba.njit(cache=True, nogil=True)
def step_weights_log(
    ltotal: np.ndarray,
    lo: int,
    count: int,
    pos_ref: int,
    P: np.ndarray,
    nj: float,
    c: float,
    mu: float,
    out: np.ndarray,
) -> float:
    """Max-normalised exp(ltotal[v] + log k(pos_ref - P[lo + v]) - max) for v < count.

    ``ltotal`` is the log of the row summed over repeat counts (as :func:`step_weights_linear`);
    ``log k(D) = -c |D - nj| - mu (D - nj)`` (:func:`transition_linear`'s kernel). Returns
    the max (in the units of ``ltotal``).
    """
    top = NEG_INF
    for v in range(count):
        e = pos_ref - P[lo + v] - nj
        x = ltotal[v] - c * abs(e) - mu * e
        out[v] = x
        if x > top:
            top = x
    lo_x = top - 746.0  # exp of anything below this is 0.0 in a double: skip the call
    for v in range(count):
        x = out[v]
        out[v] = math.exp(x - top) if x > lo_x else 0.0
    return top


@numba.njit(cache=True, nogil=True)
def level_weights(
    levels: np.ndarray, ids: np.ndarray, nlev: int, v: int, log_space: bool, out: np.ndarray
) -> int:
    """The weights a draw picks the repeat count from: the stored levels 1..nlev at column v,
    relative to the largest (log levels exponentiated, linear ones divided by it), in
    ``out[:ns]``; returns ns, the number of stored levels at or below nlev (their repeat
    counts are ``ids[:ns]``). All zero when the column holds nothing."""
    ns = 0
    while ns < ids.size and ids[ns] <= nlev:
        ns += 1
    mx = NEG_INF if log_space else 0.0
    for s in range(ns):
        if levels[s, v] > mx:
            mx = levels[s, v]
    for s in range(ns):
        x = levels[s, v]
        if log_space:
            out[s] = math.exp(x - mx) if mx > NEG_INF else 0.0
        else:
            out[s] = x / mx if mx > 0.0 else 0.0
    return ns


@numba.njit(cache=True, nogil=True)
def logsumexp_rows(x: np.ndarray, out: np.ndarray) -> None:
    """out[v] = log sum_k exp(x[k, v]) (max-shifted: one exp per term, one log per column)."""
    nk, nv = x.shape
    for v in range(nv):
        mx = NEG_INF
        for k in range(nk):
            if x[k, v] > mx:
                mx = x[k, v]
        if mx == NEG_INF:
            out[v] = NEG_INF
            continue
        acc = 0.0
        for k in range(nk):
            if x[k, v] > NEG_INF:
                acc += math.exp(x[k, v] - mx)
        out[v] = mx + math.log(acc)


@numba.njit(cache=True, nogil=True)
def log_of(x: np.ndarray, out: np.ndarray) -> None:
    for i in range(x.size):
        out[i] = math.log(x[i]) if x[i] > 0.0 else NEG_INF


# --------------------------------------------------------------------------- repeat levels


@numba.njit(cache=True, nogil=True, inline="always")
def _lse_col(x: np.ndarray, v: int) -> float:
    """log sum_k exp(x[k, v]), exactly as :func:`logsumexp_rows` computes it for one column.

    A column with a single finite entry is that entry (``mx + log(exp(0))`` is ``mx``).
    """
    mx = NEG_INF
    nfin = 0
    for k in range(x.shape[0]):
        if x[k, v] > NEG_INF:
            nfin += 1
            if x[k, v] > mx:
                mx = x[k, v]
    if nfin <= 1:
        return mx
    acc = 0.0
    for k in range(x.shape[0]):
        if x[k, v] > NEG_INF:
            acc += math.exp(x[k, v] - mx)
    return mx + math.log(acc)


@numba.njit(cache=True, nogil=True)
def log_levels_step(
    lev: np.ndarray,
    lw_here: np.ndarray,
    lstay: float,
    l1: np.ndarray,
    lprune: float,
    keep: float,
) -> tuple[np.ndarray, np.ndarray, int, float]:
    """The repeat levels of a log-space row, its sum over levels, span and normalisation.

    ``lev`` (levels x n_t) is the previous row's levels (logs), ``l1`` the new single-copy
    entries (``count >= n_t`` of them). Level k + 1 of the new row is
    ``lev[k] + lw_here + lstay - log(k + 2)``, dropped where below ``l1 + lprune`` (PRUNE of
    the single-copy entry at the same interval); trailing empty levels go. The row is then
    cut to the columns whose sum over levels is within ``keep`` of its maximum ``top`` and
    shifted by ``-top``; with repeat levels, entries below ``-keep`` are dropped as well,
    trailing empty levels go, and the columns that lost an entry have their sum formed again
    from what is kept.

    Returns ``(levels, total, a, top)``: the new levels (logs, max-normalised), their sum over
    levels (an empty array when a single level is left), the first kept column, and ``top``.
    Sums are :func:`logsumexp_rows` column by column; a column whose sum over levels is not
    changed by the cut keeps ``sum - top`` (the numpy formulation this replaces formed
    ``logsumexp(levels - top)`` again for columns holding any empty level: the same value to
    rounding). Only the columns where a repeat entry survives are summed with ``exp``.
    """
    nprev, n_t = lev.shape
    count = l1.size
    # The repeat entries that survive the pruning lie in the columns [h0, h1). Outside them
    # a column is its single-copy entry alone, and every sum below is that entry (a one-term
    # logsumexp), so only the hull is worked column by column.
    h0 = n_t
    h1 = 0
    nrep = 0  # which levels survive the pruning (only trailing empty ones are removed)
    for k in range(nprev):
        sh = lstay - math.log(k + 2.0)
        first = -1
        for v in range(n_t):
            y = lev[k, v]
            if y > NEG_INF and not y + lw_here[v] + sh < l1[v] + lprune:
                first = v
                break
        if first < 0:
            continue
        nrep = k + 1
        last = first
        for v in range(n_t - 1, first, -1):
            y = lev[k, v]
            if y > NEG_INF and not y + lw_here[v] + sh < l1[v] + lprune:
                last = v
                break
        h0 = min(h0, first)
        h1 = max(h1, last + 1)
    nl = 1 + nrep
    if nrep == 0:
        h0 = 0
        h1 = 0
    hw = h1 - h0
    # the hull's columns, all levels (level 0 is l1); outside it only l1 is non-empty
    hull = np.empty((nl, hw))
    for v in range(hw):
        hull[0, v] = l1[h0 + v]
    for k in range(nrep):
        sh = lstay - math.log(k + 2.0)
        for v in range(hw):
            x = NEG_INF
            y = lev[k, h0 + v]
            if y > NEG_INF:
                y = y + lw_here[h0 + v] + sh
                if not y < l1[h0 + v] + lprune:
                    x = y
            hull[k + 1, v] = x
    htot = np.empty(hw)
    top = NEG_INF
    for v in range(hw):
        s = _lse_col(hull, v)
        htot[v] = s
        if s > top:
            top = s
    for v in range(count):
        if (v < h0 or v >= h1) and l1[v] > top:
            top = l1[v]
    if top == NEG_INF:
        return hull[:, :0], htot[:0], 0, top
    a = 0
    while not (htot[a - h0] if h0 <= a < h1 else l1[a]) >= top - keep:
        a += 1
    b = count
    while not (htot[b - 1 - h0] if h0 <= b - 1 < h1 else l1[b - 1]) >= top - keep:
        b -= 1
    if nl == 1:
        lv = np.empty((1, b - a))
        for v in range(a, b):
            lv[0, v - a] = l1[v] - top
        return lv, htot[:0], a, top
    # entries more than keep e-folds down are dropped wherever they are; trailing empty
    # levels go (outside the hull only level 0 can hold an entry)
    last = 0
    for k in range(1, nl):
        for v in range(max(a, h0), min(b, h1)):
            if not hull[k, v - h0] - top < -keep:
                last = k
                break
    lv = np.empty((last + 1, b - a))
    total = np.empty(b - a)
    for v in range(a, b):
        if h0 <= v < h1:
            lost = False
            for k in range(nl):
                x = hull[k, v - h0] - top
                if x < -keep:
                    if x > NEG_INF:  # an entry is dropped: the sum is formed again
                        lost = True
                    x = NEG_INF
                if k <= last:
                    lv[k, v - a] = x
            total[v - a] = _lse_col(lv, v - a) if lost else htot[v - h0] - top
        else:  # the repeat levels are empty here: the sum is the kept single-copy entry
            x = l1[v] - top
            if x < -keep:
                x = NEG_INF
            lv[0, v - a] = x
            for k in range(1, last + 1):
                lv[k, v - a] = NEG_INF
            total[v - a] = x
    return lv, total, a, top


# --------------------------------------------------------------------------- inputs


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


# --------------------------------------------------------------------------- order statistics

#: Radix selection works on 16-bit digits of a double's order-preserving key: 4 passes.
_DIGIT_BITS = 16
_DIGITS = 1 << _DIGIT_BITS
_SIGN = np.uint64(1 << 63)
_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)


@numba.njit(cache=True, nogil=True, inline="always")
def _order_key(bits: np.uint64) -> np.uint64:
    """A double's bits mapped so that unsigned order is numeric order (no NaNs)."""
    if bits & _SIGN:
        return bits ^ _ALL
    return bits | _SIGN


@numba.njit(cache=True, nogil=True)
def kth_smallest(x: np.ndarray, k: int) -> float:
    """The ``k``-th smallest (0-based) of the doubles ``x`` (no NaNs; ``0 <= k < x.size``).

    Radix selection on the order-preserving 64-bit keys of the values, 16 bits per pass:
    at most 4 passes, each over the candidates the previous one kept, so O(n) in the worst
    case whatever the order of ``x`` and however many values are tied. The same value as
    ``np.partition(x, k)[k]``, whose introselect took 8x longer on some orders of heavily
    tied data (the log widths of grid histograms: most gaps are one grid step) than on
    others of the same distribution. (-0.0 counts as smaller than 0.0.)
    """
    keys = x.view(np.uint64)
    n = keys.size
    counts = np.zeros(_DIGITS, dtype=np.int64)
    top = np.uint64(64 - _DIGIT_BITS)
    for i in range(n):
        counts[_order_key(keys[i]) >> top] += 1
    digit = 0
    while k >= counts[digit]:
        k -= counts[digit]
        digit += 1
    key = np.uint64(digit) << top  # the answer's digits found so far
    m = counts[digit]
    buf = np.empty(m, dtype=np.uint64)  # the candidates: keys whose digits so far match
    kept = 0
    for i in range(n):
        u = _order_key(keys[i])
        if u >> top == digit:
            buf[kept] = u
            kept += 1
    shift = 64 - 2 * _DIGIT_BITS
    while True:
        counts[:] = 0
        for i in range(m):
            counts[(buf[i] >> np.uint64(shift)) & np.uint64(_DIGITS - 1)] += 1
        digit = 0
        while k >= counts[digit]:
            k -= counts[digit]
            digit += 1
        key |= np.uint64(digit) << np.uint64(shift)
        if shift == 0:
            break
        if counts[digit] < m:  # drop the candidates with another digit
            kept = 0
            for i in range(m):
                if (buf[i] >> np.uint64(shift)) & np.uint64(_DIGITS - 1) == digit:
                    buf[kept] = buf[i]
                    kept += 1
            m = kept
        shift -= _DIGIT_BITS
    bits = key ^ _SIGN if key & _SIGN else key ^ _ALL
    out = np.empty(1, dtype=np.uint64)
    out[0] = bits
    return float(out.view(np.float64)[0])


@numba.njit(cache=True, nogil=True)
def max_below(x: np.ndarray, v: float) -> tuple[int, float]:
    """How many of ``x`` are below ``v``, and the largest of them (-inf if none)."""
    count = 0
    best = NEG_INF
    for i in range(x.size):
        if x[i] < v:
            count += 1
            if x[i] > best:
                best = x[i]
    return count, best


# --------------------------------------------------------------------------- error bound


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

"""Numba kernels for JointExp's log-space rows: the recursions of
:mod:`~app.mechanisms.jointexp.kernels_linear` run on logs (a ``logaddexp`` per addition),
the repeat levels of log rows, and the log weights of the backward draws.
"""

from __future__ import annotations

import math

import numba
import numpy as np

NEG_INF = -np.inf


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


@numba.njit(cache=True, nogil=True)
def compensated_sum(x: np.ndarray) -> float:
    """Neumaier's compensated sum: for non-negative terms within ``2u + n u^2`` (relative)
    of the exact sum, whatever n (a plain running sum: ``(n - 1) u``)."""
    s = 0.0
    comp = 0.0
    for i in range(x.size):
        v = x[i]
        t = s + v
        if abs(s) >= abs(v):
            comp += (s - t) + v
        else:
            comp += (v - t) + s
        s = t
    return s + comp

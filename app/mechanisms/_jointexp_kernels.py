"""Numba kernels for JointExp's forward rows and backward draws.

Index ``i`` runs over the ``n + 1`` intervals between sorted clamped points; ``T`` is the
previous row summed over repeat counts; ``c = epsilon / (2 * sensitivity)``; the transition
weight from ``i'`` to ``i > i'`` for quantile gap ``nj`` is ``r ** |i - i' - nj|`` with
``r = exp(-c)``. Writing ``L = floor(nj)`` and ``f = nj - L``:

* ``d = i - i'`` in ``[1, L]``: weight ``r**f * r**(L - d)`` (rising part, a window of length L);
* ``d >= L + 1``:             weight ``r**(1 - f) * r**(d - L - 1)`` (a causal geometric filter).

The window sums ``W(t) = sum_{e<L} T(t + e) r**e`` are formed van Herk / Gil-Werman style from a
suffix sum inside t's block of length L plus a prefix sum inside the next block, so every sum
adds non-negative terms only: there is no subtraction and hence no cancellation. The same
recursions run in linear space (rows max-normalised) and in log space (``_log`` variants,
exact for any dynamic range).

``pw[e] = exp(-c e)`` (and ``lpw[e] = -c e``) is a table of exact powers; entries past its end
are zero (they underflow a double).
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
    nj: float,
    c: float,
    pw: np.ndarray,
    P: np.ndarray,
    S: np.ndarray,
) -> tuple[int, float]:
    """Single-copy transition in linear space over a row stored from global index ``lo``.

    ``T[u]`` is the previous row (summed over repeats) at global index ``lo + u`` and is zero
    outside. Writes ``S[v] = w[lo + v] * scale * sum_{u < v} T[u] r**|v - u - nj|`` for
    ``v = 0, 1, ...`` and returns ``(count, max)``: entries from ``count`` on are exactly zero
    (the geometric tail has underflowed to 0.0, as the dense loop would also find), so the
    loop stops there. ``P`` is scratch of at least ``T.size`` entries; ``S`` must hold up to
    ``n + 1 - lo`` entries. Only non-negative terms are ever added.
    """
    nT = T.size
    n_out = min(S.size, w.size - lo)
    L = int(math.floor(nj))
    f = nj - L
    r = math.exp(-c)
    r_f = math.exp(-c * f)
    r_1mf = math.exp(-c * (1.0 - f))
    if L >= 1:
        # P[t] = sum_{u = t}^{end of t's block} T[u] r**(u - t); blocks [bL, (b+1)L).
        bt = (nT - 1) % L
        acc = 0.0
        for t in range(nT - 1, -1, -1):
            acc = T[t] if bt == L - 1 or t == nT - 1 else T[t] + r * acc
            P[t] = acc
            bt = L - 1 if bt == 0 else bt - 1
    top = 0.0
    C = 0.0  # C(tb) = sum_{u <= tb} T[u] r**(tb - u), tb = v - L - 1
    Q = 0.0  # Q(u) = sum_{u' = block start}^{u} T[u'] r**(u' - block start), u = v - 1
    bq = 0  # (v - 1) mod L
    bt = 0  # (v - L) mod L once v >= L
    S[0] = 0.0
    count = 1
    for v in range(1, n_out):
        a = 0.0
        if L >= 1 and v <= nT - 1 + L:
            u = v - 1
            tu = T[u] if u < nT else 0.0
            if bq == 0:
                Q = tu
            else:
                Q += tu * _pw(pw, bq)
            bq = 0 if bq == L - 1 else bq + 1
            t = v - L
            if t >= 0:
                W = P[t] if bt == 0 else P[t] + _pw(pw, L - bt) * Q
                bt = 0 if bt == L - 1 else bt + 1
            else:
                W = _pw(pw, -t) * Q
            a = r_f * W
        tb = v - L - 1
        if tb >= 0:
            C = (T[tb] if tb < nT else 0.0) + r * C
            a += r_1mf * C
        val = w[lo + v] * (scale * a)
        S[v] = val
        if val > top:
            top = val
        count = v + 1
        if tb >= nT - 1 and C == 0.0:
            break  # window past the row and the geometric tail is exactly zero
    return count, top


@numba.njit(cache=True, nogil=True)
def first_row_log(logw: np.ndarray, n1: float, c: float, out: np.ndarray) -> None:
    """out[i] = log(w_i) - c |i - n1|  (log of alpha(1, i, 1) up to a constant)."""
    for i in range(logw.size):
        out[i] = logw[i] - c * abs(i - n1)


@numba.njit(cache=True, nogil=True)
def exp_normalise(lx: np.ndarray, out: np.ndarray) -> float:
    """out = exp(lx - max(lx)); returns max(lx)."""
    top = NEG_INF
    for i in range(lx.size):
        if lx[i] > top:
            top = lx[i]
    for i in range(lx.size):
        v = lx[i]
        out[i] = math.exp(v - top) if v > NEG_INF else 0.0
    return top


# --------------------------------------------------------------------------- log space


@numba.njit(cache=True, nogil=True)
def transition_log(
    lT: np.ndarray,
    lo: int,
    logw: np.ndarray,
    suf_logw: np.ndarray,
    nj: float,
    c: float,
    keep: float,
    lP: np.ndarray,
    lS: np.ndarray,
) -> tuple[int, float]:
    """Log-space twin of :func:`transition_linear` (exact for any dynamic range).

    ``lT`` holds log weights at global indices ``lo + u`` (``-inf`` outside). Writes
    ``lS[v] = logw[lo + v] + log sum_{u < v} exp(lT[u]) r**|v - u - nj|`` and returns
    ``(count, max)``. Once the window has passed the row, values only fall (by ``c`` per step,
    times the widths ahead, bounded by ``suf_logw``, the suffix maximum of ``logw``); the loop
    stops when none of them can come within ``keep`` of the running maximum.
    """
    nT = lT.size
    n_out = min(lS.size, logw.size - lo)
    L = int(math.floor(nj))
    f = nj - L
    lr = -c
    if L >= 1:
        bt = (nT - 1) % L
        acc = NEG_INF
        for t in range(nT - 1, -1, -1):
            acc = lT[t] if bt == L - 1 or t == nT - 1 else _lae(lT[t], lr + acc)
            lP[t] = acc
            bt = L - 1 if bt == 0 else bt - 1
    top = NEG_INF
    lC = NEG_INF
    lQ = NEG_INF
    bq = 0
    bt = 0
    lS[0] = NEG_INF
    count = 1
    for v in range(1, n_out):
        a = NEG_INF
        if L >= 1 and v <= nT - 1 + L:
            u = v - 1
            tu = lT[u] if u < nT else NEG_INF
            lQ = tu if bq == 0 else _lae(lQ, tu + lr * bq)
            bq = 0 if bq == L - 1 else bq + 1
            t = v - L
            if t >= 0:
                lW = lP[t] if bt == 0 else _lae(lP[t], lr * (L - bt) + lQ)
                bt = 0 if bt == L - 1 else bt + 1
            else:
                lW = lr * (-t) + lQ
            a = lr * f + lW
        tb = v - L - 1
        if tb >= 0:
            lC = _lae(lT[tb] if tb < nT else NEG_INF, lr + lC)
            a = _lae(a, lr * (1.0 - f) + lC)
        val = logw[lo + v] + a
        lS[v] = val
        if val > top:
            top = val
        count = v + 1
        if tb >= nT - 1 and lr * (1.0 - f) + lC + suf_logw[lo + v] < top - keep:
            break
    return count, top


# --------------------------------------------------------------------------- backward draws


@numba.njit(cache=True, nogil=True)
def step_weights_linear(
    levels: np.ndarray,
    lo: int,
    nlev: int,
    count: int,
    d_ref: int,
    nj: float,
    c: float,
    pw: np.ndarray,
    out: np.ndarray,
) -> float:
    """out[k * count + v] = levels[k, v] * r**|d_ref - (lo + v) - nj| for v < count; max."""
    L = int(math.floor(nj))
    f = nj - L
    r_f = math.exp(-c * f)
    r_1mf = math.exp(-c * (1.0 - f))
    top = 0.0
    for v in range(count):
        d = d_ref - (lo + v)
        kern = r_f * _pw(pw, L - d) if d <= L else r_1mf * _pw(pw, d - L - 1)
        for k in range(nlev):
            x = levels[k, v] * kern
            out[k * count + v] = x
            if x > top:
                top = x
    return top


@numba.njit(cache=True, nogil=True)
def step_weights_log(
    llevels: np.ndarray,
    lo: int,
    nlev: int,
    count: int,
    d_ref: int,
    nj: float,
    c: float,
    out: np.ndarray,
) -> None:
    """Max-normalised exp(llevels[k, v] - c|d_ref - (lo + v) - nj| - max) for v < count."""
    top = NEG_INF
    for v in range(count):
        lk = -c * abs(d_ref - (lo + v) - nj)
        for k in range(nlev):
            x = llevels[k, v] + lk
            out[k * count + v] = x
            if x > top:
                top = x
    for j in range(nlev * count):
        x = out[j]
        out[j] = math.exp(x - top) if x > NEG_INF else 0.0


@numba.njit(cache=True, nogil=True)
def log_of(x: np.ndarray, out: np.ndarray) -> None:
    for i in range(x.size):
        out[i] = math.log(x[i]) if x[i] > 0.0 else NEG_INF

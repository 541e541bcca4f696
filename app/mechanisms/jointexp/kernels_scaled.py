"""Numba kernels that run JointExp's recursions on log-space rows in extended-range linear
arithmetic, which neither underflows nor needs a ``logaddexp`` per addition: ``ext`` (a
double mantissa times an integer power of e per value) and ``scaled`` (a double mantissa
times ``e**(SCALE_STEP * k)``, the default log kernel). The recursions are those of
:mod:`~app.mechanisms.jointexp.kernels_linear`.
"""

from __future__ import annotations

import math

import numba
import numpy as np

NEG_INF = -np.inf


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

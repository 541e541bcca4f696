"""JointExp's acceptance step: the drawn sequence is kept with probability ∝ its exact weight
over the probability the draws gave it, so the released law is the mechanism's own law and
not the floating-point approximation the forward rows and draws compute.

The backward draws (:mod:`~app.mechanisms.jointexp.draws`) pick each block exactly in
proportion to the weights they formed, so the probability ``P̂(s)`` with which they produce a
sequence ``s`` is the product of their picks' shares, and those shares are known at the draw
(``ProbabilityProduct``). The weights themselves carry the forward rows' rounding (positive
sums, relative errors) and the rounding of kernel exponents of up to millions of e-folds. The
mechanism's law is ``P(s) = W(s) / Z`` with

    log W(s) = sum_j log w(i_j) - sum_runs log(k!) - c sum_{j=1}^{m+1} |D_j - n_j|

on the positions and log widths the passes use (``D_j`` integer rank differences, ``n_j``
the gap targets: the doubles given are taken as exact numbers). :func:`log_acceptance`
forms ``log W(s) - log C - log P̂(s)`` in exact rational arithmetic and rounds it once, with
``C = Ẑ e^margin`` for ``Ẑ`` the normaliser the pass computed. Kept with probability
``W(s) / (C P̂(s))`` and drawn again otherwise, the result has law
``∝ min(P̂(s), W(s) / C)``: exactly ``W(s) / Z`` wherever the draws' probability is at least
``e^-margin Z / Ẑ`` of the exact one, whatever rounding the passes made (proof in
docs/mechanisms.md, "The acceptance step"). A sequence is rejected with probability about
``margin``, so the step costs one more backward sweep in ~``1/margin`` releases.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from app.mechanisms.validation import FloatArray, IntArray

#: ln 2 as a double-double (hi + lo), for the exponents of the probability product: the
#: product's log is ``log(mantissa) + e ln 2`` with ``|e|`` up to ~10^6, and a one-double
#: ln 2 would add ~e 10^-17.
LN2_HI = 0.6931471805599453
LN2_LO = 2.3190468138462996e-17

#: Smallest and largest margin (log C - log Ẑ). A sequence is rejected with probability
#: about the margin; the margin must cover the relative error of the draws' probabilities.
MARGIN_MIN = 2.0**-24
MARGIN_MAX = 2.0**-10
_U = 2.0**-53


#: Per-factor bound (in ulps) on the error of a log width as the passes hold it:
#: ``log(width / max)`` (or ``log(width) - log(max)`` where the quotient underflows) is
#: within ``u (|log width| + |log max| + |log(width / max)| + 2)`` of the exact log ratio;
#: widths are doubles in (2^-1074, 2^1024), so each of the three logs is below 745 + 710
#: e-folds in size: 3,000 ulps covers every input, grid or raw.
LOG_WIDTH_ULPS = 3000.0


#: Twice the dropped mass D the untilted and log passes certify (at most 7.6e-13 e^-ε; see
#: :mod:`~app.mechanisms.jointexp.range_rule`), charged to ε as a constant.
DROPPED_MAX = 1e-12


def rounding_slack(m: int) -> float:
    """ρ: a bound on ``|η(s)|``, the log of the ratio between the law the acceptance step
    gives a kept sequence and the mechanism's exact law at the same parameter (for every
    sequence the draws cover within the margin; docs/mechanisms.md, "The acceptance step").

    Per block: two shares, each a compensated sum (2u + n u^2 with n < 2^40: < 2.1u) and
    two roundings in the probability product (a product and a quotient of mantissas):
    8.2u. Per sequence: the m log widths (``LOG_WIDTH_ULPS`` each), ``log k!`` of the
    repeat runs (``lgamma``, within ``u (log m! + 1)`` together), and a constant for the
    final rounding of the log ratio,
    ``log`` of the mantissa, ``exp`` and the 53-bit coin (16u).
    """
    return _U * ((8.2 + LOG_WIDTH_ULPS) * m + math.lgamma(m + 1.0) + 1.0 + 16.0)


def run_parameter(c: float, m: int, n: int, delta_u: float, add_remove: bool) -> float:
    """The parameter JointExp runs at so that what it releases loses at most ``2 c Δ``.

    The kept law is within ``e^±ρ`` (:func:`rounding_slack`) of the exponential mechanism
    whose utility uses the gap targets as computed (``n_j = fl(fl(q_j - q_{j-1}) n)``); two
    such laws on neighbours differ by at most ``e^(2 c' (Δ + Δ_fp) + 4ρ)``, where ``Δ_fp``
    bounds how far the computed targets move the utility beyond Δ: under swap they are the
    same on both sides (0); under add/remove the counts differ by one and each target is
    rounded on each side (``u g_j (2n + 1)``, summing to ``u (2n + 1)(1 + (m + 1) u)``), and
    the rounded gaps ``g_j`` sum to 1 within ``(m + 1) u`` (Lemma 10 uses that sum). The
    mass D the passes drop adds ``2D`` (``DROPPED_MAX`` >= D where it is certified). So
    ``c' = (c (1 - 8u) Δ - 2ρ - DROPPED_MAX) / (Δ + Δ_fp)``, rounded down, and
    ``2c'(Δ + Δ_fp) + 4ρ + 2D <= ε``; ``1 - 8u`` covers the roundings of ``c = ε / (2Δ)``.
    Raises ValueError where ``c'`` is not positive.
    """
    rho = rounding_slack(m)
    extra = 0.0
    if add_remove:
        extra = _U * (2.0 * float(n) + 3.0) * (1.0 + (m + 1) * _U) + 2.0 * (m + 1) * _U
    c_run = (c * (1.0 - 8.0 * _U) * delta_u - 2.0 * rho - DROPPED_MAX) / (delta_u + extra)
    c_run *= 1.0 - 4.0 * _U
    if not c_run > 0.0:
        raise ValueError("epsilon is too small for JointExp's floating-point guarantee")
    return c_run


def acceptance_margin(m: int, c: float, n: int) -> float:
    """log C - log Ẑ: a bound on the draws' relative error, from public sizes.

    Each of the ``m + 1`` kernel exponents ``c |D - n_j| <= c n`` is rounded once or a few
    times in the passes (absolute error ``~u c n`` each) and each forward row's positive sums
    carry relative errors of a few ulps per operation on the path a term took; 64 ulps per
    e-fold and step covers both with room. Clamped to [2^-24, 2^-10] (a larger error is
    beyond the margin: see docs/mechanisms.md on what that costs).
    """
    est = 64.0 * _U * (m + 1) * (1.0 + c * float(n) + 64.0)
    return min(MARGIN_MAX, max(MARGIN_MIN, est))


class ProbabilityProduct:
    """A product of probabilities in (0, 1] as a mantissa and a binary exponent (no
    underflow at any depth), each share adding two roundings."""

    __slots__ = ("exponent", "mantissa")

    def __init__(self) -> None:
        self.mantissa = 1.0
        self.exponent = 0

    def times(self, weight: float, total: float = 1.0) -> None:
        """Multiply by the share ``weight / total`` (0 < weight <= total), formed from the
        two numbers' mantissas and exponents: no quotient or product below the smallest
        normal double is ever formed (the passes flush those to 0.0)."""
        if not 0.0 < weight <= total:
            raise FloatingPointError("JointExp: a pick's share is not a probability")
        mw, ew = math.frexp(weight)
        mt, et = math.frexp(total)
        mant, e = math.frexp(self.mantissa * mw / mt)
        self.mantissa = mant
        self.exponent += e + ew - et


def _dyadic(x: float) -> tuple[int, int]:
    """(a, k) with x = a / 2^k exactly (k >= 0)."""
    num, den = x.as_integer_ratio()
    return num, den.bit_length() - 1


class _ExactSum:
    """An exact sum of dyadic rationals (integers times powers of two)."""

    __slots__ = ("k", "num")

    def __init__(self) -> None:
        self.num = 0
        self.k = 0

    def add(self, num: int, k: int) -> None:
        if k > self.k:
            self.num <<= k - self.k
            self.k = k
        self.num += num << (self.k - k)

    def add_float(self, x: float) -> None:
        self.add(*_dyadic(x))

    def value(self) -> float:
        """The sum, rounded once (Python's int / int division is correctly rounded)."""
        return self.num / (1 << self.k)


def log_weight_parts(
    seq: IntArray, pos: IntArray, logw: FloatArray, gaps: FloatArray
) -> tuple[list[float], int, int]:
    """The parts of log W(s) that do not involve c: the log widths of the sequence's
    intervals and of the repeat counts' ``log k!``, and the exact cost
    ``sum_j |D_j - n_j|`` as ``(num, k)`` = num / 2^k."""
    m = int(seq.size)
    n = int(pos[-1])
    terms = [float(logw[int(i)]) for i in seq.tolist()]
    run = 1
    for t in range(1, m + 1):
        if t < m and int(seq[t]) == int(seq[t - 1]):
            run += 1
            continue
        if run > 1:
            terms.append(-math.lgamma(run + 1.0))
        run = 1
    # cost = sum |D_j - n_j| exactly: every n_j is a / 2^k; bring them to one denominator
    parts = [_dyadic(float(g)) for g in np.asarray(gaps, dtype=np.float64).tolist()]
    kmax = max(k for _, k in parts)
    cost = 0
    prev = 0
    points = [int(pos[int(i)]) for i in seq.tolist()] + [n]
    for (a, k), p in zip(parts, points, strict=True):
        cost += abs(((p - prev) << kmax) - (a << (kmax - k)))
        prev = p
    return terms, cost, kmax


def log_acceptance(
    seq: IntArray,
    pos: IntArray,
    logw: FloatArray,
    gaps: FloatArray,
    c: float,
    log_c: float,
    prob: ProbabilityProduct,
) -> float:
    """``log W(s) - log_c - log P̂(s)``, exact until one final rounding.

    ``log_c`` is the log of the acceptance constant C (the pass's normaliser plus the
    margin) in the same units as ``W`` (the log widths ``logw`` as given); ``prob`` the
    probability the draws gave ``s``. Every input is a double taken as an exact number;
    ``log(k!)``, ``log`` of the probability's mantissa and ln 2 (to ~2^-106) are the only
    rounded terms, each within a few ulps of its (small) value.
    """
    acc = _ExactSum()
    terms, cost, kcost = log_weight_parts(seq, pos, logw, gaps)
    for x in terms:
        acc.add_float(x)
    cn, ck = _dyadic(float(c))
    acc.add(-cn * cost, ck + kcost)
    acc.add_float(-float(log_c))
    acc.add_float(-math.log(prob.mantissa))
    e = prob.exponent
    hi_n, hi_k = _dyadic(LN2_HI)
    lo_n, lo_k = _dyadic(LN2_LO)
    acc.add(-e * hi_n, hi_k)
    acc.add(-e * lo_n, lo_k)
    return acc.value()


def tilt_constant(mu: float, n: int, gaps: Sequence[float] | FloatArray) -> float:
    """The tilt's constant factor (log): a tilted pass's normaliser is the untilted one
    times ``e^(-mu (n - sum n_j))`` (the tilt telescopes over every sequence)."""
    if not mu:
        return 0.0
    total = math.fsum(np.asarray(gaps, dtype=np.float64).tolist())
    return -mu * (float(n) - total)


__all__ = [
    "DROPPED_MAX",
    "LN2_HI",
    "LN2_LO",
    "LOG_WIDTH_ULPS",
    "MARGIN_MAX",
    "MARGIN_MIN",
    "ProbabilityProduct",
    "acceptance_margin",
    "log_acceptance",
    "log_weight_parts",
    "rounding_slack",
    "run_parameter",
    "tilt_constant",
]

"""Blocks of intervals for a *coarse* error pass of the certificate (speed only: a coarse
pass is an upper bound at any span, and the certificate runs one only where it can spare
its cost; docs/mechanisms.md, "The certificate of a tilted pass")."""

from __future__ import annotations

import math

import numba
import numpy as np

from app.mechanisms.jointexp import smoothed_norm as SN
from app.mechanisms.jointexp.error_bound import ErrorBound
from app.mechanisms.validation import FloatArray, IntArray


@numba.njit(cache=True, nogil=True)
def block_starts(P: np.ndarray, span: int) -> np.ndarray:
    """The first interval of each block: consecutive intervals grouped while their
    positions lie within ``span`` of the block's first (a block's intervals are at most
    ``span + 1``: positions are distinct integers)."""
    n = P.size
    out = np.empty(n, dtype=np.int64)
    k = 0
    first = P[0] if n else 0
    for i in range(n):
        if i == 0 or P[i] - first > span:
            out[k] = i
            k += 1
            first = P[i]
    return out[:k].copy()


@numba.njit(cache=True, nogil=True)
def block_log_sums(vals: np.ndarray, a: int, block_of: np.ndarray) -> tuple[np.ndarray, int]:
    """log of the sums, block by block, of ``e^{vals}`` (interval ``a`` on), and the first
    block."""
    n = vals.size
    if n == 0:
        return np.zeros(0), 0
    b0 = block_of[a]
    nb = block_of[a + n - 1] - b0 + 1
    top = -np.inf
    for v in range(n):
        top = max(top, vals[v])
    acc = np.zeros(nb)
    if top == -np.inf:
        return np.full(nb, -np.inf), b0
    for v in range(n):
        acc[block_of[a + v] - b0] += math.exp(vals[v] - top)
    out = np.empty(nb)
    for k in range(nb):
        out[k] = math.log(acc[k]) + top if acc[k] > 0.0 else -np.inf
    return out, b0


def block_log_factor(k: float) -> float:
    """``log I = log(1 + 2 e^k)`` of :class:`Blocks`, and 2^-40 for the rounding of the
    block sums (relative error below (span + 1) 2^-53 for sums of positive terms)."""
    return k + math.log(2.0 + math.exp(-k)) + 2.0**-40


def draw_log_factor(k: float) -> float:
    """The last draw's kernel over a block, at most ``e^k`` times its value at the block's
    position (:class:`Blocks`; and 2^-40 for the rounding of the block sums)."""
    return k + 2.0**-40


class Blocks:
    """The intervals grouped into blocks of positions within ``span`` of each block's first,
    for a *coarse* error pass, whose entries bound sums over blocks (docs/mechanisms.md,
    "The certificate of a tilted pass"). Summed over a block B, ``E_j = Ā_j E_{j-1} + s_j``
    is at most the same recursion on the *block problem*: positions ``Q_B`` (the block's
    first), widths ``W'_B = I sum_{i in B} w_i`` with ``I = 1 + 2 e^k``, ``k = (c + |mu|)
    span``, and sources summed over the block (at most ``span + 1`` intervals, each at most
    the interval's bound). Between blocks, ``K(P_i - P_i' - n_j) <= e^k K(Q_B - Q_B' -
    n_j)`` (moving either end by up to ``span`` positions changes ``-c |x| - mu x`` by at
    most k). Within one block (``P_i - P_i' = y``, ``1 <= y <= span``) the kernel is at most
    ``e^{(c - mu) y} e^{-(c - mu) n_j} <= e^k e^{-(c - mu) n_j}`` (for ``y <= n_j`` exactly
    that; for ``y > n_j`` it is ``e^{2 c n_j - (c + mu) y} e^{-(c - mu) n_j}``, less), so it
    and the repeat term ``e^{-(c - mu) n_j} / 2`` together are at most ``I`` times the
    repeat term. So the coarse pass is an error pass of the block problem, and what it drops
    is charged by the block problem's max-norm bound (:attr:`errors`); the last draw's
    kernel over a block is at most ``e^k`` times its value at ``Q_B``. It costs about ``log I
    + log(span + 1)`` e-folds per row (the factor and the sums) and holds about one entry per
    ``span + 1`` positions; it runs only where the certificate can spare that
    (:meth:`Certificate.log_bound`)."""

    def __init__(
        self, pos: IntArray, w: FloatArray, span: int, c: float, mu: float, gaps: FloatArray
    ) -> None:
        self.span = span
        self.starts = block_starts(pos, span)
        counts = np.diff(np.append(self.starts, pos.size))
        self.pos = np.ascontiguousarray(pos[self.starts])
        self.block_of = np.repeat(np.arange(self.starts.size, dtype=np.int64), counts)
        self.log_count = math.log(float(counts.max()))
        k = (c + abs(mu)) * span
        #: log of the kernel's factor at the last draw (and 2^-40: the sums' rounding)
        self.draw_inflate = draw_log_factor(k)
        log_i = block_log_factor(k)
        with np.errstate(divide="ignore"):
            logw = np.log(np.add.reduceat(w, self.starts)) + log_i
        #: log of the largest block width; the widths relative to it (the pass's ``w``)
        self.inflate = float(logw.max())
        self.w = np.exp(logw - self.inflate)
        #: the block problem's max-norm bound (for what the coarse pass drops)
        self.errors = ErrorBound(logw, self.pos, gaps, c, mu)
        #: its smoothed bound (formed when first read)
        self.smoothed = SN.SmoothedNorms(self.errors, logw, self.pos)

    def remainder(self, floors: FloatArray, n: float, smooth: bool = False) -> float:
        """The max-norm bound on what errors ``<= e^{floors_j}`` per block carry into the
        last draw (at ``n - n_{m+1}``, over every block), times the draw's factor;
        ``smooth``: with the widths read at the sources
        (:mod:`~app.mechanisms.jointexp.smoothed_norm`: the block problem is a problem of
        the same kind, so its proof holds there too; never larger)."""
        errors = self.errors
        m = errors.m
        t = n - float(errors.gaps[m])
        norms = self.smoothed(floors) if smooth else errors.norms(floors)
        return errors.at_draw(norms[m], m, t, self.pos.size) + self.draw_inflate

"""JointExp's rows and inputs: what a forward row holds, and the exact heavy-atom cut.

:class:`Row` is one row ``alpha(j, ., k)`` of the dynamic program (linear or log, with its
repeat levels); :class:`Inputs` the arrays every pass over the same intervals derives once
(log widths, positions, the median width the range rule charges); :func:`collapse_cap`
the step a heavy atom's positions may be cut to without changing the law (its proof is in
the docstring). Repeat entries below ``PRUNE`` of the single-copy entry at the same interval
are dropped: every completion of such a prefix is also a completion of the single-copy
prefix with at least the same weight, so the error in any later weight is below 2^-60 of
that weight's row (times m).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from app.mechanisms.jointexp import kernels_linear as KL
from app.mechanisms.jointexp import kernels_log as KG
from app.mechanisms.jointexp import kernels_scaled as KS
from app.mechanisms.jointexp.error_bound import width_blocks
from app.mechanisms.jointexp.range_rule import median_log_width
from app.mechanisms.validation import FloatArray, IntArray

PRUNE = 2.0**-60  # repeat entries below this fraction of the single-copy entry are dropped


def repeat_level_ids(nlev: int) -> IntArray:
    """Repeat counts 1..nlev: the ids of a row that stores every level."""
    return np.arange(1, nlev + 1, dtype=np.int64)


class Row(NamedTuple):
    """One forward row: ``levels[s, v]`` is alpha(j, lo + v, ids[s]) (linear) or its log.

    Linear rows keep only the span between their first and last non-zero entry (everything
    outside is exactly 0.0, as the dense computation would also give) and are stored
    unnormalised with ``top`` = max of their sum over k; they store only the levels that
    hold a non-zero entry (``ids``: their repeat counts; level 1 is always stored first).
    Log rows are dense with ``lo = 0`` and store every level (``ids`` None: 1, 2, ...).

    Immutable; a named tuple rather than a frozen dataclass because a pass builds one per
    row (0.7 instead of 1.7 us each, and a compact copy without ``dataclasses.replace``).
    """

    lo: int
    levels: FloatArray
    top: float
    gmax: float = 0.0  # log of the row's maximum on the pass's common scale (row 1: 0)
    peak: float = -math.inf  # max over rows l <= j of (log truncation floor_l - l log kappa)
    #: rows with repeat levels: their sum over k (log rows: its log), as the next row uses it
    total: FloatArray | None = None
    #: compact linear rows (stored for the draws only): ``levels`` holds level 1 alone, of
    #: ``nlev`` levels (0: ``levels`` is complete); the others are replayed at the one
    #: interval a draw picks (:func:`stored_levels_at`) from earlier rows and ``stay``, the
    #: row's repeat factor
    nlev: int = 0
    stay: float = 0.0
    #: the repeat count of each stored level (None: levels 1, 2, ... all stored)
    ids: IntArray | None = None

    @property
    def nbytes(self) -> int:
        return int(self.levels.nbytes) + (0 if self.total is None else int(self.total.nbytes))

    @property
    def level_ids(self) -> IntArray:
        """The repeat count of each stored level."""
        if self.ids is not None:
            return self.ids
        return repeat_level_ids(self.levels.shape[0])

    @property
    def top_level(self) -> int:
        """The highest repeat count stored (every level above it is 0.0 everywhere)."""
        return int(self.ids[-1]) if self.ids is not None else int(self.levels.shape[0])

    def levels_at(self, v: int, nlev: int) -> FloatArray:
        """Levels 1..nlev at column v, dense (levels that are not stored are 0.0)."""
        out = np.zeros(nlev)
        ids = self.level_ids
        sel = ids <= nlev
        out[ids[sel] - 1] = self.levels[sel, v]
        return out

    def compact(self) -> Row:
        """This linear row with level 1 and the sum over levels only (see ``nlev``)."""
        lo, levels, top, gmax, peak, total, _, stay, _ = self
        return Row(lo, levels[:1].copy(), top, gmax, peak, total, self.top_level, stay, None)


def summed_levels(row: Row, log_space: bool) -> FloatArray:
    """The row summed over repeat counts (log rows: its log); stored with rows that have
    repeat levels, the single level itself otherwise."""
    if row.total is not None:
        return row.total
    if row.levels.shape[0] == 1:
        return np.asarray(row.levels[0], dtype=np.float64)
    if log_space:
        return _logsumexp_levels(row.levels)
    return np.asarray(row.levels.sum(axis=0), dtype=np.float64)


def _logsumexp_levels(levels: FloatArray) -> FloatArray:
    out = np.empty(levels.shape[1])
    KG.logsumexp_rows(levels, out)
    return out


def to_scaled(lx: FloatArray) -> tuple[FloatArray, IntArray]:
    """``exp(lx) = m * e**(SCALE_STEP * k)``: the scaled form of a log row (numpy's exp)."""
    xr = np.empty(lx.size)
    xe = np.empty(lx.size, dtype=np.int64)
    KS.split_scaled(lx, xr, xe)
    return np.exp(xr), xe


def row_span(total: NDArray[np.float64] | NDArray[np.bool_]) -> tuple[int, int]:
    nz = np.flatnonzero(total)
    return int(nz[0]), int(nz[-1]) + 1


class Inputs:
    """Arrays every pass over the same (log widths, positions) derives: computed once.

    A sample may run the plain linear pass, a probe, a tilted pass and log passes over the
    same intervals; each used to exponentiate the widths and find the live intervals again.
    They depend on the intervals alone (not on the quantiles or epsilon), so a grid
    histogram keeps them for its later runs (:func:`jointexp_core`). Nothing writes to them.
    """

    def __init__(self, logw: FloatArray, pos: IntArray) -> None:
        self.logw = logw
        self.pos = pos
        self._collapsed: dict[int, Inputs] = {}  # by cap (:meth:`collapsed`)

    @classmethod
    def prepare(cls, logw: ArrayLike, pos: ArrayLike) -> Inputs:
        """From log weights with any constant shift (max-normalised here) and positions."""
        lw = np.asarray(logw, dtype=np.float64)
        return cls(lw - float(np.max(lw)), np.ascontiguousarray(pos, dtype=np.int64))

    @classmethod
    def from_widths(cls, widths: FloatArray, pos: ArrayLike) -> Inputs:
        """From interval widths (non-negative, some positive) and positions.

        The log widths are ``log(width / max)`` where that quotient is a normal double, and
        ``log(width) - log(max)`` where it is not: a positive width is never lost however
        small its ratio to the largest (the quotient underflows to 0.0 below ~10^-308 and
        made a positive-width interval a zero-width one that is never output).
        The normalised widths are the quotients themselves (more accurate than the logs
        exponentiated back, and an exp over every interval less); inputs with a quotient
        that is not a normal double run the log pass (:attr:`narrow`).
        """
        wd = np.asarray(widths, dtype=np.float64)
        top = float(wd.max())
        w = wd / top
        with np.errstate(divide="ignore"):
            logw = np.log(w)
        tiny = (w < _W_NORMAL) & (wd > 0.0)
        if tiny.any():  # the quotient lost them: their logs from the widths' own logs
            logw[tiny] = np.log(wd[tiny]) - math.log(top)
        out = cls(logw, np.ascontiguousarray(pos, dtype=np.int64))
        if not tiny.any():
            out.__dict__["w"] = w
        return out

    @functools.cached_property
    def lw_ref(self) -> float:
        """The median positive log width (:func:`median_log_width`)."""
        return median_log_width(self.logw)

    @functools.cached_property
    def max_jump(self) -> int:
        """The largest step between neighbouring positions: the count of the most frequent
        distinct value (0 for a single interval)."""
        return int(KL.largest_step(self.pos))

    def collapsed(self, cap: int) -> Inputs:
        """These intervals with every position step larger than ``cap`` cut to ``cap``.

        With ``cap`` at least every gap target, the JointExp distribution over interval
        sequences is the same on the cut positions (:func:`collapse_cap`); the arrays that
        depend on the widths alone are shared. Kept per cap (a histogram's later runs with
        the same gap targets reuse it).
        """
        if self.max_jump <= cap:
            return self
        kept = self._collapsed
        out = kept.get(cap)
        if out is None:
            pos = np.empty_like(self.pos)
            KL.capped_positions(self.pos, cap, pos)
            out = Inputs(self.logw, pos)
            for name in _WIDTH_ONLY:
                if name in self.__dict__:
                    out.__dict__[name] = self.__dict__[name]
            if len(kept) >= 4:
                kept.clear()
            kept[cap] = out
        return out

    @functools.cached_property
    def w(self) -> FloatArray:
        """Normalised widths (max 1); zero-width intervals are 0. Widths below ~e^-708 of the
        largest are 0.0 here too: the linear passes cannot represent them, and a sample with
        such widths runs the log pass (:attr:`narrow`)."""
        return np.exp(self.logw)

    @functools.cached_property
    def narrow(self) -> bool:
        """Whether some positive width is too small beside the largest for linear rows (its
        normalised width is not a normal double): such inputs run the log pass, which
        holds the widths as logs."""
        lw = self.logw
        return bool(np.any((lw < _LOG_W_NORMAL) & (lw > -math.inf)))

    @functools.cached_property
    def live_idx(self) -> IntArray:
        """Indices of the intervals of positive width (from the log widths: a positive
        width is live however small)."""
        return np.flatnonzero(self.logw > -math.inf)

    @functools.cached_property
    def live_pos(self) -> IntArray:
        return self.pos[self.live_idx]

    @functools.cached_property
    def suf_logw(self) -> FloatArray:
        """Suffix maxima of the log widths (they bound the log pass's geometric tails)."""
        return np.maximum.accumulate(self.logw[::-1])[::-1].copy()

    @functools.cached_property
    def scaled_w(self) -> tuple[FloatArray, IntArray]:
        return to_scaled(self.logw)

    @functools.cached_property
    def width_blocks(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        """The widths' block maxima and the blocks' first and last positions, what the sound
        error bound reads of the widths (:func:`~app.mechanisms.jointexp.error_bound.
        width_blocks`)."""
        return width_blocks(self.logw, self.pos)


#: The :class:`Inputs` properties that depend on the widths alone (shared when collapsed).
_WIDTH_ONLY = ("lw_ref", "w", "narrow", "live_idx", "suf_logw", "scaled_w")
#: Normalised widths below this are not normal doubles (or flush to 0.0 in the passes,
#: fpmode): inputs with a positive width below it run the log pass (:attr:`Inputs.narrow`).
_W_NORMAL = 2.0**-1000
_LOG_W_NORMAL = math.log(_W_NORMAL)


def collapse_cap(gaps: FloatArray) -> int:
    """The step a heavy atom's positions may be cut to without changing the distribution.

    Every interval sequence crosses each distinct value exactly once: the m + 1 gaps
    partition the data, and the value's B points fall in one gap. If B > cap >= every gap
    target n_j, that gap's count D >= B exceeds its target, so its cost is
    ``|D - n_j| = D - n_j``; with the value's step cut to ``cap`` the gap counts
    ``D - (B - cap) >= cap >= n_j`` and costs exactly ``B - cap`` less. Every sequence
    pays each cut once, so the weights change by one common factor ``r**(sum of cuts)`` and
    the distribution over sequences does not change at all. What changes is the numbers:
    a tied block of B points inside the data made every sequence's weight fall by
    ``2 c (B - n_j)`` e-folds at the row that crosses it, and the rows needed that many
    e-folds of range (n = 10^6 with 5 % at one inner point: ~10^4 e-folds, the log pass,
    ~60 s for m = 99); cut, the crossing costs at most what any gap costs.
    """
    return max(1, math.ceil(float(gaps.max())))

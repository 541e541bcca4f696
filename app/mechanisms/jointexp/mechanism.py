"""JointExp: one exponential mechanism for m quantiles (Gillenwater, Joseph, Kulesza, ICML 2021).

The mechanism (paper Sec. 3) samples a nondecreasing sequence of intervals
``s = (i_1 <= ... <= i_m)`` between sorted clamped data points with probability

    P[s] ∝ exp(eps * u(s) / (2 Δ)) * prod_j w(i_j) / γ(s),
    u(s) = -sum_{j=1}^{m+1} |(i_j - i_{j-1}) - n_j|,   i_0 = 0, i_{m+1} = n,

(``n_j = (q_j - q_{j-1}) n``, ``w`` the interval widths, ``γ(s) = prod count(i)!``), then one
uniform point inside each chosen interval, sorted. It is eps-DP with Δ = 2 (swap) or
Δ = 2 (1 - min gap) with the gaps including q_1 and 1 - q_m (add/remove, paper Lemma 10).

Here the intervals are the d + 1 intervals between *distinct* clamped values (a
:class:`~app.mechanisms.histogram.Support`); interval i has position ``P_i = cum[i]`` (points
``<=`` any output in it), and the paper's ``i_j - i_{j-1}`` becomes ``P_{i_j} - P_{i_{j-1}}``.
The zero-width intervals of tied or clamped points that the paper's sequence space also
contains carry no measure, so the law is the paper's. On a grid support the widths are the
numbers of grid points per block and the law is that of the exponential mechanism over
ordered grid tuples (docs/mechanisms.md).

Sampling is exact, by the paper's forward/backward dynamic program over
``alpha(j, i, k)`` (mass of length-j prefixes ending in exactly k copies of i), computed here
without the O(m^2 n) table:

* The single-copy transition ``alpha(j, i, 1) = w_i sum_{i' < i} alpha(j-1, i') r^|P_i - P_i'
  - n_j|`` is a two-sided geometric kernel in the position difference, evaluated for all i in
  O(d) by a causal recursion and a two-stack window queue
  (:mod:`app.mechanisms.jointexp.kernels_linear`) that only ever add non-negative terms.
* Repeats ``alpha(j, i, k) = w_i r^{n_j} alpha(j-1, i, k-1) / k`` are kept as extra rows only
  where they are not dominated: an entry below 2^-60 of ``alpha(j, i, 1)`` at the same interval
  is dropped. Every completion of such a prefix is also a completion of the single-copy prefix
  at the same interval with at least the same weight, so the error this introduces in any
  later weight is below 2^-60 of that weight's row (times m).
* Rows are max-normalised in linear space (fast path). Each row carries its maximum on a
  common log scale; the range rule (:meth:`Forward.range_ok`) requires every earlier row's
  truncation floor, grown per row, to stay 2^-52 below the current row's maximum (and below
  each backward draw's largest weight). A linear row that breaks it sends the pass to log
  space (no underflow), which keeps ``keep`` e-folds per row, sized by a narrow probe pass
  and widened until every row and draw has enough. Untilted passes are also held, at each
  draw, to a sound bound on the error the rows carry into it, which charges every width
  where it lies (:mod:`app.mechanisms.jointexp.error_bound`); the median-width rule alone is not
  a worst-case bound (docs/mechanisms.md, "Range rule").
  Log rows are stored as logs; their transition sums are formed in scaled linear
  arithmetic (a double mantissa times e^(350 k), ``kernels_scaled.transition_scaled``;
  the row's exp and log are vectorised numpy calls), ~5x faster than a logaddexp per
  operation (still available as ``log_kernel="log"``, and the per-value-exponent
  ``"ext"``).
* The backward pass draws (i, k) for the last block from ``alpha(m, i, k) r^|n - P_i -
  n_{m+1}|``, then block by block from ``alpha(j, i, k) r^|P_next - P_i - n_{j+1}|`` over
  ``i < i_next``: the interval by inverse CDF over its weight summed over k (one uniform),
  then k from that interval's levels (a second uniform).
* Rows are stored while they fit a memory budget; beyond it, those stored stay and of the
  later rows only every ~sqrt(m)-th is kept, the others recomputed block by block during
  the backward pass.

Complexity: O(n log n) to sort and count (raw call; none for a histogram), then O(d) per
quantile and row for the forward pass (O(row support) in the common case; plus O(d) per
surviving repeat level) and O(d) per sampled block; memory the budget plus O(d sqrt(m)).
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from app.mechanisms import select
from app.mechanisms.fpmode import flush_subnormals
from app.mechanisms.histogram import Support, support_from_values
from app.mechanisms.jointexp import kernels_linear as KL
from app.mechanisms.jointexp import kernels_log as KG
from app.mechanisms.jointexp import kernels_scaled as KS
from app.mechanisms.jointexp.error_bound import ErrorBound, width_blocks
from app.mechanisms.jointexp.strategy import (
    TILT_MARGIN,
    TILT_STEPS,
    tilt_candidates,
    wider,
)
from app.mechanisms.registry import Mechanism, PrivacyNotion
from app.mechanisms.rng import make_rng
from app.mechanisms.sampling import pick_weights
from app.mechanisms.validation import FloatArray, IntArray

PRUNE = 2.0**-60  # repeat entries below this fraction of the single-copy entry are dropped
#: A linear draw's largest weight must be at least this (in the scaled units its weights
#: are formed in): the weights it loses, products below the smallest normal double flushed
#: to 0.0, are then each < 2^-1022 and, fewer than 2^30 of them, < 2^-92 of it together. Kernel
#: factors are never dropped while their scaled value is a normal double
#: (:func:`~app.mechanisms.jointexp.kernels_linear.step_weights_linear`); below this the draw's
#: weights are formed in log space instead.
TINY_DRAW = 2.0**-900
LOG_KEEP = 3000.0  # log-space rows keep entries within this many e-folds of their maximum
PROBE_KEEP = 750.0  # range of the probe pass that sizes LOG_KEEP from the rows' falls
#: What a linear row can lose: each entry sums at most ~4 (d + 1) terms, each exact to the
#: smallest normal double (2^-1022 = e^-708.4) of the larger of its own and the previous row's
#: maximum; ``LINEAR_RANGE - log(4 (d + 1))`` e-folds is the row's truncation floor.
LINEAR_RANGE = 708.0
#: Required headroom (e-folds) between the propagated truncation error and a row's maximum:
#: 2^-52 (36.04) plus the number of repeat levels (<= m, added as log) and slack.
HEADROOM = 40.0
#: Longest decay distance tabled for the extended-range kernel (longer ones call exp).
EXT_TABLE_MAX = 2**20
MEMORY_BUDGET_BYTES = 256 * 2**20  # rows kept in full while they fit; checkpoints beyond
#: Linear rows are stored whole (every repeat level) while the stored rows take at most this
#: much, and compact beyond (level 1 and the sum over levels; a draw replays the levels at
#: the interval it picks, :func:`stored_levels_at`). Replaying walks the chain of compact rows
#: down to a whole one in Python, ~1 us per row for each draw (~11 % of a run at n = 10^3,
#: m = 99). Whole rows cost memory that a plain process gives back to the OS after each run
#: and faults in again on the next: 32 MiB kept that case whole (24 MiB instead of 4) and
#: ran 5x slower in a plain process. 1 MiB keeps the small queries whole (n = 10^3, m = 9:
#: 0.4 MiB); at d = 10^6 rows of 8 MiB and more are compacted from the second one on.
COMPACT_FROM_BYTES = 2**20
PROFILE_POINTS = 33  # columns per row a probe records for choosing a tilt


def jointexp_sensitivity(quantiles: FloatArray, neighbors: str) -> float:
    """Δu_Q: 2 under swap (Lemma 3); 2(1 - min gap) under add/remove (Lemma 10).

    The add/remove gaps include q_1 - 0 and 1 - q_m.
    """
    if neighbors == "swap":
        return 2.0
    gaps = np.diff(np.concatenate(([0.0], quantiles, [1.0])))
    return 2.0 * (1.0 - float(gaps.min()))


def quantile_gaps(quantiles: FloatArray, n: int) -> FloatArray:
    """n_j = (q_j - q_{j-1}) n for j = 1..m+1, with q_0 = 0 and q_{m+1} = 1."""
    return np.diff(np.concatenate(([0.0], quantiles, [1.0]))) * float(n)


class LinearGuardTripped(Exception):
    """A linear-space row lost too much range; the log-space pass must be used."""


class SoundGuardTripped(LinearGuardTripped):
    """An untilted linear pass's draw met the median-width rule but not the sound error bound
    (error_bound): the retry is the log pass, not a tilted one (tilted passes are held to
    the median-width rule alone, which this input has just shown to be too weak)."""


class LogGuardTripped(Exception):
    """A log-space row fell further than its kept range allows; keep more and start over."""

    def __init__(self, needed_keep: float = 0.0) -> None:
        super().__init__(needed_keep)
        self.needed_keep = needed_keep


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


def median_log_width(logw: FloatArray) -> float:
    """log of the median positive width (0.0 if none): the width errors are charged at.

    ``logw`` holds no NaN (-inf marks a zero width). np.median's value (the mean of the two
    middle values for an even count) by one radix selection over the whole array (the -inf
    entries sort first, so the k-th positive width is entry ``k + zeros``) and one pass for
    the value below it: O(d) whatever the order and the ties (numpy's introselect took from
    12 to 104 ms on two samples of one distribution; a grid's log widths are heavily tied).
    """
    x = np.ascontiguousarray(logw, dtype=np.float64)
    zeros = x.size - int(np.count_nonzero(x > -math.inf))
    size = x.size - zeros
    if size == 0:
        return 0.0
    half = size // 2
    if x.size <= _SORT_BELOW:  # small: a sort costs less than the selection's tables
        s = np.sort(x)
        if size % 2:
            return float(s[zeros + half])
        return float((s[zeros + half - 1] + s[zeros + half]) / 2.0)
    upper = select.kth_smallest(x, zeros + half)
    if size % 2:
        return upper
    below, largest = select.max_below(x, upper)
    lower = largest if below - zeros == half else upper  # else upper is also the (half-1)-th
    return float((lower + upper) / 2.0)


#: Inputs up to this size take :func:`median_log_width`'s sort instead of the selection.
_SORT_BELOW = 1 << 12


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


class Forward:
    """Forward rows of the dynamic program, linear or log space, with checkpointing."""

    def __init__(
        self,
        logw: FloatArray,
        pos: IntArray,
        gaps: FloatArray,
        c: float,
        *,
        log_space: bool,
        budget: int,
        keep: float = LOG_KEEP,
        log_kernel: str = "scaled",
        tilt: float = 0.0,
        lw_ref: float | None = None,
        inputs: Inputs | None = None,
    ) -> None:
        if tilt and (log_space or not 0.0 < tilt < c):
            raise ValueError("a tilt needs linear rows and 0 < tilt < c")
        if inputs is None or inputs.logw is not logw or inputs.pos is not pos:
            inputs = Inputs(logw, pos)
        self.inputs = inputs
        self.logw = logw
        self.pos = pos
        self.keep = keep
        # Linear rows may be tilted: stored as alpha(j, i, k) e^(-mu (P_i - (n_1 + .. + n_j))),
        # which turns the kernel into r^|D - n_j| e^(-mu (D - n_j)) (near part decaying at
        # c - mu, far part at c + mu) and leaves the repeat levels as they are. A row whose
        # mass lies far below its maximum then fits the linear range (see choose_tilt).
        self.mu = tilt
        # suffix maxima of the log widths bound the log pass's geometric tails (log pass only)
        self.suf_logw = inputs.suf_logw if log_space else logw
        self.gaps = gaps
        self.c = c
        self.log_space = log_space
        # log-space rows: sums formed in scaled linear arithmetic ("scaled", default: one
        # exponent per 350 e-folds, exp/log of the rows vectorised by numpy), in
        # extended-range arithmetic with a per-value exponent ("ext") or by logaddexp
        # ("log"); all are exact to rounding, "scaled" is the fastest
        self.log_kernel = log_kernel
        if log_space and log_kernel in ("ext", "scaled"):
            size = min(int(pos[-1]), math.floor(float(gaps.max())), EXT_TABLE_MAX) + 2
            if log_kernel == "ext":
                self.pm, self.pe = KS.ext_decay_table(c, size)
            else:
                self.qm, self.qe = KS.scaled_decay_table(c, size)
                self.wm, self.we = inputs.scaled_w
        self.m = gaps.size - 1
        self.n1 = logw.size
        self.w = inputs.w  # normalised widths, max 1; zero-width intervals are 0
        self.live_idx = inputs.live_idx  # intervals of positive width
        self.live_pos = inputs.live_pos
        # kappa bounds how much an absolute error grows in one row: the single-copy kernel
        # sums to at most (1 + r) / (1 - r) over distinct integer distances (and has at most
        # d + 1 terms, each <= 1; widths <= 1), the repeat levels add at most 1/2.
        # Tilted rows: the same bound for the tilted kernel (_log_kappa).
        self.log_kappa = _log_kappa(c, tilt, self.n1)
        # Errors grow per row by at most kappa times the width of the entry they land on;
        # they are charged the median positive width (the rows' own mass is charged the same
        # widths, so a uniform width scale is not a fall). This is the one step that is not a
        # worst-case bound: see docs/mechanisms.md, "Range rule".
        if lw_ref is None:
            lw_ref = median_log_width(logw)
        self.lw_ref = lw_ref
        self.log_growth = self.log_kappa + lw_ref
        self.headroom = _headroom(self.m)
        self.linear_floor = _linear_floor(self.n1)
        self.needed_keep = 0.0  # log pass: the largest range a row asked for (0: none)
        # each row's truncation floor (log, common scale) and, from the first draw on, the
        # sound bound on the error they carry into the draws (error_bound)
        self.floors = np.full(self.m + 1, -math.inf)
        self._errors: ErrorBound | None = None
        self._norms: FloatArray | None = None
        # each row's maximum (common log scale) and where it is (a position), for choose_tilt
        self.gmaxes = np.zeros(self.m)
        self.modes = np.zeros(self.m)
        # and a coarse profile of each untilted row: log values (common scale) at
        # PROFILE_POINTS columns spread over its span, for choose_tilt
        # (see prof_val: the values as recorded, their shift, and whether they are linear)
        self.prof_pos = np.zeros((self.m, PROFILE_POINTS))
        self.prof_raw = np.full((self.m, PROFILE_POINTS), -math.inf)
        self.prof_shift = np.zeros(self.m)
        self.prof_linear = np.zeros(self.m, dtype=np.bool_)
        # decay tables: near part (rate c - mu) and far part (rate c + mu; the same untilted)
        pw_len = int(min(int(pos[-1]) + 2, math.ceil(750.0 / (c - tilt)) + 2))
        self.pw = np.exp(-(c - tilt) * np.arange(max(pw_len, 2), dtype=np.float64))
        self.pwf = self.pw
        if tilt:
            pwf_len = int(min(int(pos[-1]) + 2, math.ceil(750.0 / (c + tilt)) + 2))
            self.pwf = np.exp(-(c + tilt) * np.arange(max(pwf_len, 2), dtype=np.float64))
        self.budget = budget
        self.block = max(1, math.isqrt(self.m - 1) + 1)  # ~sqrt(m) rows per checkpoint block
        self.rows: dict[int, Row] = {}
        self.cache: dict[int, Row] = {}
        self.checkpointing = False
        self.switch = 0  # the first row stored past the budget (0: none yet)
        self.stored_bytes = 0
        #: linear pass that broke the range rule and goes on as a probe (:meth:`run`)
        self.probing = False
        #: probing: a log pass over the intervals from some index on (_probe_row_via_logs)
        self._tail: tuple[int, Forward] | None = None

    # -- one row ----------------------------------------------------------------------------

    def _profile(self, j: int, lo: int, values: FloatArray, shift: float, logs: bool) -> None:
        """Record row j's profile: ``values`` (its sum over levels from global column
        ``lo``) at PROFILE_POINTS spread columns (:func:`~app.mechanisms.jointexp.kernels_linear.
        profile_columns`), for :attr:`prof_val`. Untilted rows only."""
        if self.mu or values.size == 0:
            return
        KL.profile_columns(values, self.pos, lo, self.prof_pos[j - 1], self.prof_raw[j - 1])
        self.prof_shift[j - 1] = shift
        self.prof_linear[j - 1] = not logs

    def _profile_rows(self, j: int) -> tuple[FloatArray, FloatArray]:
        """Where row j's profile goes (positions, values), for a kernel to fill."""
        return self.prof_pos[j - 1], self.prof_raw[j - 1]

    def _copy_profile(self, j: int, other: Forward) -> None:
        """Row j's profile as ``other`` recorded it."""
        self.prof_pos[j - 1] = other.prof_pos[j - 1]
        self.prof_raw[j - 1] = other.prof_raw[j - 1]
        self.prof_shift[j - 1] = other.prof_shift[j - 1]
        self.prof_linear[j - 1] = other.prof_linear[j - 1]

    @property
    def prof_val(self) -> FloatArray:
        """Each row's profile as logs on the common scale (-inf where none was recorded).

        Linear rows' values are logged here, once for all rows, rather than per row while
        the pass runs: only :func:`choose_tilt` reads them, after a linear pass tripped.
        The same doubles as logging each row's values as it is formed (numpy's log is
        elementwise, then the row's ``shift`` is added).
        """
        vals = self.prof_raw.copy()
        lin = self.prof_linear
        if lin.any():
            with np.errstate(divide="ignore"):
                vals[lin] = np.log(vals[lin])
        return np.asarray(vals + self.prof_shift[:, None], dtype=np.float64)

    def _first_window(self, n1: float, reach: float) -> tuple[int, int]:
        """Intervals [i0, i1) outside which row 1 is more than ``reach`` e-folds below its max
        (:func:`~app.mechanisms.jointexp.kernels_linear.first_window`; all of them if ``reach`` is
        infinite)."""
        if not math.isfinite(reach):
            return 0, self.n1
        return KL.first_window(
            self.live_pos, self.live_idx, self.logw, self.pos, n1, self.c, self.mu, reach
        )

    def first(self) -> Row:
        n1 = float(self.gaps[0])
        # entries more than 746 e-folds below the maximum are 0.0 in a linear row; a log row
        # keeps ``keep``: only the window that can hold anything else is formed
        i0, i1 = self._first_window(n1, self.keep if self.log_space else 746.0)
        lrow = np.empty(i1 - i0)
        KG.first_row_log(self.logw[i0:i1], self.pos[i0:i1], n1, self.c, lrow)
        if self.mu:
            lrow -= self.mu * (self.pos[i0:i1] - n1)
        self.modes[0] = float(self.pos[i0 + int(np.argmax(lrow))])
        if self.log_space:
            lrow -= lrow.max()
            a, b = row_span(lrow >= -self.keep)
            peak = -self.keep - self.log_growth
            self.floors[1] = -self.keep
            self._profile(1, i0 + a, lrow[a:b], 0.0, True)
            return Row(i0 + a, lrow[a:b].reshape(1, -1).copy(), 1.0, 0.0, peak)
        row = np.empty(i1 - i0)
        KG.exp_normalise(lrow, row)
        a, b = row_span(row)
        peak = -self.linear_floor - self.log_growth
        self.floors[1] = -self.linear_floor
        self._profile(1, i0 + a, row[a:b], 0.0, False)
        return Row(i0 + a, row[a:b].reshape(1, -1).copy(), 1.0, 0.0, peak)

    def range_ok(self, peak: float, gmax: float, j: int) -> bool:
        """Whether every earlier truncation, grown per row, is 2^-52 below ``gmax``.

        With ``g = log_growth`` (kappa times the median width) and
        ``peak = max_l (floor_l - l g)`` this is ``floor_l + (j - l) g <= gmax - headroom``
        for all ``l <= j``: the absolute error any row's dropped entries can have caused in
        row j stays 2^-52 m below its maximum. Unlike a bound on the fall from the previous
        row alone, it also catches several rows in a row falling (each fall spends range
        that the earlier rows' truncation no longer has).
        """
        return peak + j * self.log_growth <= gmax - self.headroom

    def error_at_draw(self, j: int, t: float, i_end: int) -> float:
        """log of a sound bound on the total error of a draw's weights from row j at
        ``t = P_next - n_{j+1}`` over the intervals below ``i_end``, on the pass's common
        scale (:mod:`~app.mechanisms.jointexp.error_bound`; formed from the rows' floors at the
        first draw)."""
        if self._errors is None or self._norms is None:
            self._errors = ErrorBound(
                self.logw, self.pos, self.gaps, self.c, self.mu, self.inputs.width_blocks
            )
            self._norms = self._errors.norms(self.floors)
        return self._errors.at_draw(self._norms[j], j, t, i_end)

    def step(self, prev: Row, j: int) -> Row:
        """Row j (1-based, j >= 2) from row j - 1."""
        return self._step_log(prev, j) if self.log_space else self._step_linear(prev, j)

    def _step_linear(self, prev: Row, j: int) -> Row:
        nj = float(self.gaps[j - 1])
        total = summed_levels(prev, False)
        n_t = total.size
        scale = 1.0 / prev.top
        # Past the window, S decays by r per step; from ln(n_t) + 746 e-folds on it is 0.0.
        rate = self.c + self.mu  # the far part's decay
        tail = n_t + math.floor(nj) + math.ceil((math.log(n_t + 1.0) + 746.0) / rate) + 4
        # r^{n_j}, in units of the previous row's max (tilted rows: times e^{mu n_j}, the
        # tilt's shift from row j - 1 to row j at the same position)
        stay = math.exp(-(self.c - self.mu) * nj) * scale
        # untilted rows record their profile (_profile); its scale is set below
        prof_pos, prof_val = (_NO_PROFILE, _NO_PROFILE) if self.mu else self._profile_rows(j)
        out, tot, ids, top, a, at = KL.linear_row(
            total,
            prev.levels,
            prev.level_ids,
            prev.lo,
            scale,
            stay,
            min(self.n1 - prev.lo, tail),
            self.w,
            self.pos,
            nj,
            self.c,
            self.mu,
            self.pw,
            self.pwf,
            PRUNE,
            prof_pos,
            prof_val,
        )
        if not (top > 0.0 and math.isfinite(top)):
            if self.probing:
                return self._probe_row_via_logs(prev, j)
            raise LinearGuardTripped
        gmax = prev.gmax + math.log(top)  # values are in units of the previous row's max
        trunc = max(prev.gmax, gmax) - self.linear_floor  # this row's truncation floor
        peak = max(prev.peak, trunc - j * self.log_growth)
        self.floors[j] = trunc
        if not self.probing and not self.range_ok(peak, gmax, j):
            raise LinearGuardTripped
        self.gmaxes[j - 1] = gmax
        self.modes[j - 1] = float(self.pos[prev.lo + at])
        if not self.mu:  # the profile linear_row recorded: linear values, in units of top
            self.prof_shift[j - 1] = gmax - math.log(top)
            self.prof_linear[j - 1] = True
        multi = out.shape[0] > 1
        total_out = tot if multi else None
        return Row(prev.lo + a, out, top, gmax, peak, total_out, 0, stay, ids if multi else None)

    def _probe_row_via_logs(self, prev: Row, j: int) -> Row:
        """Probing only: row j formed in log space from a linear row whose successor underflows.

        The previous row's logs keep what it holds (its own linear range); the transition
        runs in scaled arithmetic as in the log pass (``PROBE_KEEP`` e-folds), and the result
        goes back to a max-normalised linear row, so the probe measures a fall of any size.
        Not exact (the rows lack range), which a probe does not need. The log pass runs on
        the intervals from the previous row's first on (positions enter the kernels only as
        differences), so its tables cover that tail, not all d + 1 intervals.
        """
        if self.mu:
            raise ValueError("probing runs untilted")
        tail = self._tail
        if tail is None or tail[0] > prev.lo:
            sub = Forward(
                self.logw[prev.lo :],
                self.pos[prev.lo :],
                self.gaps,
                self.c,
                log_space=True,
                budget=0,
                keep=PROBE_KEEP,
                lw_ref=self.lw_ref,
            )
            tail = self._tail = (prev.lo, sub)
        off, sub = tail
        dense = prev.levels
        if prev.ids is not None and prev.top_level != prev.levels.shape[0]:
            dense = np.zeros((prev.top_level, prev.levels.shape[1]))
            dense[prev.ids - 1] = prev.levels
        with np.errstate(divide="ignore"):
            llev = np.log(dense / prev.top)
            ltot = None
            if prev.levels.shape[0] > 1:
                ltot = np.log(summed_levels(prev, False) / prev.top)
        lrow = sub._step_log(Row(prev.lo - off, llev, 1.0, prev.gmax, prev.peak, ltot), j)
        self.gmaxes[j - 1] = sub.gmaxes[j - 1]
        self.modes[j - 1] = sub.modes[j - 1]
        self._copy_profile(j, sub)
        # back to linear: the log row's maximum over its sum over levels is 0
        levels = np.exp(lrow.levels)
        total = None if lrow.total is None else np.exp(lrow.total)
        return Row(lrow.lo + off, levels, 1.0, lrow.gmax, lrow.peak, total)

    def _step_log(self, prev: Row, j: int) -> Row:
        """Log-space row j: exact, keeping entries within ``keep`` e-folds of the row's max.

        The same range rule as the linear pass (:meth:`range_ok`) with a truncation floor of
        ``keep`` e-folds below each row's maximum. A row that needs more range records how
        much (``needed_keep``) and the pass goes on, so that one restart can size the range
        for every row; :meth:`run` raises at the end.
        """
        nj = float(self.gaps[j - 1])
        lev = prev.levels
        ltotal = summed_levels(prev, True)
        n_t = ltotal.size
        ls = np.empty(self.n1 - prev.lo)
        if self.log_kernel == "scaled":
            tm, te = to_scaled(ltotal)
            sm = np.empty(self.n1 - prev.lo)
            se = np.empty(self.n1 - prev.lo, dtype=np.int64)
            count = KS.transition_scaled(
                tm,
                te,
                prev.lo,
                self.wm,
                self.we,
                self.suf_logw,
                self.pos,
                nj,
                self.c,
                self.keep,
                self.qm,
                self.qe,
                np.empty(n_t),
                np.empty(n_t, dtype=np.int64),
                sm,
                se,
            )
            with np.errstate(divide="ignore"):
                np.log(sm[:count], out=ls[:count])
            ls[:count] += se[:count] * KS.SCALE_STEP
            ls[:count] += self.logw[prev.lo : prev.lo + count]
        elif self.log_kernel == "ext":
            count, top = KS.transition_ext(
                ltotal,
                prev.lo,
                self.logw,
                self.suf_logw,
                self.pos,
                nj,
                self.c,
                self.keep,
                self.pm,
                self.pe,
                np.empty(n_t),
                np.empty(n_t, dtype=np.int64),
                np.empty(n_t),
                np.empty(n_t, dtype=np.int64),
                ls,
            )
        else:
            count, top = KG.transition_log(
                ltotal,
                prev.lo,
                self.logw,
                self.suf_logw,
                self.pos,
                nj,
                self.c,
                self.keep,
                np.empty(n_t),
                ls,
            )
        # repeat levels, the sum over levels, the kept span and the shift by the maximum
        out, tot, a, top = KG.log_levels_step(
            lev,
            self.logw[prev.lo : prev.lo + n_t],
            -self.c * nj,
            ls[:count],
            math.log(PRUNE),
            self.keep,
        )
        if not math.isfinite(top):
            raise FloatingPointError("JointExp: a forward row has no mass")
        gmax = prev.gmax + top
        self.gmaxes[j - 1] = gmax
        self.modes[j - 1] = float(
            self.pos[prev.lo + a + int(np.argmax(tot if tot.size else out[0]))]
        )
        self._profile(j, prev.lo + a, tot if tot.size else out[0], gmax, True)
        peak = max(prev.peak, gmax - self.keep - j * self.log_growth)
        self.floors[j] = gmax - self.keep
        if not self.range_ok(peak, gmax, j):
            # this row needs the earlier rows' floors lower by the shortfall
            short = peak + j * self.log_growth - (gmax - self.headroom)
            self.needed_keep = max(self.needed_keep, self.keep + short)
        total = tot if tot.size else None
        return Row(prev.lo + a, np.ascontiguousarray(out), 1.0, gmax, peak, total)

    # -- storage ----------------------------------------------------------------------------

    def _keep(self, j: int) -> bool:
        """Whether row j is a checkpoint: kept whole, a block is recomputed from it."""
        return j == 1 or j == self.m or (j - 1) % self.block == 0 or j == self.switch

    def _store(self, j: int, row: Row) -> None:
        self.rows[j] = row
        self.stored_bytes += row.nbytes
        if not self.checkpointing and self.stored_bytes > self.budget:
            # The rows stored so far stay: the draws reach them without recomputing. From
            # row j on only checkpoints are kept, row j among them (whole: the block after
            # it is recomputed from it). Dropping every stored row here instead made the
            # draws recompute the whole pass once the rows passed the budget: n = 10^6 with
            # 20 % at one inner point, m = 99, stores ~360 MB of compact rows; ~70 % of
            # them fit 256 MiB and need no recomputing.
            self.checkpointing = True
            self.switch = j

    def run(self, probe_on_trip: bool = False) -> None:
        """All rows. ``probe_on_trip`` (untilted linear passes): a row that breaks the range
        rule does not end the pass; it drops its rows and goes on as a probe (every row's
        maximum and mode, a row that underflows formed through logs), then raises
        :class:`LinearGuardTripped`, so one pass serves as the linear attempt and as the
        measurement for :func:`choose_tilt`."""
        row = self.first()
        self._store(1, row)
        for j in range(2, self.m + 1):
            try:
                nxt = self.step(row, j)
            except LinearGuardTripped:
                if not probe_on_trip or self.log_space or self.mu:
                    raise
                self.probing = True
                self.rows, self.cache, self.stored_bytes = {}, {}, 0
                nxt = self.step(row, j)
            if self.probing:
                row = nxt
                continue
            if self.checkpointing and not self._keep(j - 1) and (j - 1) in self.rows:
                self.stored_bytes -= self.rows.pop(j - 1).nbytes
            elif (
                not self.log_space
                and not self.checkpointing
                and self.stored_bytes > COMPACT_FROM_BYTES
                and row.levels.shape[0] > 1
                and not self._keep(j - 1)
                and (j - 1) in self.rows
            ):
                # Row j - 1 has served row j: the draws need its sum over levels and, at
                # the one interval each picks, its levels, which level 1 of this and the
                # earlier rows determine (stored_levels_at). Checkpoint rows stay whole (a block
                # is recomputed from them), and so do all rows while the stored rows take
                # little memory (COMPACT_FROM_BYTES).
                self.stored_bytes -= row.nbytes
                self.rows[j - 1] = row.compact()
                self.stored_bytes += self.rows[j - 1].nbytes
            self._store(j, nxt)
            row = nxt
        if self.probing:
            raise LinearGuardTripped
        if self.needed_keep > 0.0:
            raise LogGuardTripped(self.needed_keep)

    def dense_total(self, j: int) -> FloatArray:
        """Row j summed over repeat counts, dense over all n + 1 intervals, max 1 (for tests)."""
        row = self.get(j)
        summed = summed_levels(row, self.log_space)
        out = np.zeros(self.n1)
        out[row.lo : row.lo + summed.size] = np.exp(summed) if self.log_space else summed
        if self.mu:  # tilted: back to alpha (in logs: the tilt spans thousands of e-folds)
            with np.errstate(divide="ignore"):
                lout = np.log(out) + self.mu * (self.pos - float(self.gaps[:j].sum()))
            return np.asarray(np.exp(lout - lout.max()), dtype=np.float64)
        return np.asarray(out / out.max(), dtype=np.float64)

    def get(self, j: int) -> Row:
        """Row j, recomputing its checkpoint block when it was not kept."""
        if j in self.rows:
            return self.rows[j]
        if j in self.cache:
            return self.cache[j]
        j0 = max(jj for jj in self.rows if jj < j)
        self.cache = {}
        row = self.rows[j0]
        for jj in range(j0 + 1, j + 1):
            row = self.step(row, jj)
            self.cache[jj] = row
        return row


_NO_LEVELS = np.zeros(0)
_NO_PROFILE = np.zeros(0)  # a row that records no profile (tilted rows)


def stored_levels_at(fwd: Forward, j: int, g: int, nlev: int) -> FloatArray:
    """alpha(j, g, k) for k = 1..nlev of a linear row, as its pass formed them, exactly.

    A compact row keeps level 1 only; level k + 1 at interval g is level k of row j - 1 at g
    times ``w_g * (stay_j / (k + 1))``, kept where not below PRUNE times level 1 (as
    :func:`~app.mechanisms.jointexp.kernels_linear.linear_levels_step` forms it): the same
    floating-point operations on the same values, so the same doubles. The chain of compact
    rows down to a complete one (or to level 1) is walked here; the levels are formed back
    up it in one compiled call (:func:`~app.mechanisms.jointexp.kernels_linear.replay_levels`).
    """
    firsts: list[float] = []
    stays: list[float] = []
    base = _NO_LEVELS
    need = nlev
    while True:
        row = fwd.get(j)
        v = g - row.lo
        inside = 0 <= v < row.levels.shape[1]
        if not row.nlev:  # complete: its levels at g end the chain
            base = row.levels_at(v, need) if inside else np.zeros(need)
            break
        firsts.append(float(row.levels[0, v]) if inside else 0.0)
        stays.append(row.stay)
        if need == 1:
            break
        j -= 1
        need -= 1
    out = np.empty(nlev)
    KL.replay_levels(np.array(firsts), np.array(stays), base, float(fwd.w[g]), PRUNE, out)
    return out


def draw_block(
    fwd: Forward,
    j: int,
    i_end: int,
    pos_ref: int,
    nj: float,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """Draw (i, k) ∝ alpha(j, i, k) r^|pos_ref - P[i] - nj| over i < i_end; k is 1-based.

    The interval i is drawn from its weight summed over k, then k from alpha(j, i, .) (the
    kernel factor is the same for every k): the same law, with one weight per interval.

    The weights are checked against the row's truncation floor before the uniform is drawn
    (the same range rule as the forward rows, the kernel being one more row): if they are
    too small for it, the pass is rebuilt with more range (log space, or a wider log range)
    and the caller retries the same step, so no draw is ever discarded.
    """
    row = fwd.get(j)
    count = min(row.levels.shape[1], i_end - row.lo)
    if count <= 0:
        raise FloatingPointError("JointExp: no mass below the sampled interval")
    nlev = min(row.nlev or row.top_level, j)
    summed = summed_levels(row, fwd.log_space)  # one weight per interval
    buf = np.empty(count)
    pos = fwd.pos
    # Each weight's error is the row entry's error times its kernel factor, so the check
    # below compares the row's floor, scaled by the largest kernel factor, with the largest
    # weight. That factor is taken over every interval below i_end, stored or not: an entry
    # the row dropped (below its floor) may sit where the kernel is largest. The kernel's
    # log, -c |e| - mu e with e = pos_ref - P - nj, is unimodal in P with its peak at
    # P = pos_ref - nj, so its largest value, lk <= 0, is at a neighbour of that point.
    # Zero-width intervals hold exactly 0.0 in every row (no error), so only intervals of
    # positive width count.
    lk = float(KG.kernel_peak_log(fwd.live_pos, fwd.live_idx, i_end, pos_ref, nj, fwd.c, fwd.mu))
    if lk == -math.inf:
        raise FloatingPointError("JointExp: no mass below the sampled interval")
    if fwd.log_space:
        ltop = KG.step_weights_log(summed, row.lo, count, pos_ref, pos, nj, fwd.c, fwd.mu, buf)
        g_draw = row.gmax + ltop
    else:
        # Linear weights with the kernel scaled by up to e^300 towards its largest factor,
        # so a draw whose kernel is small everywhere (a quantile far from every candidate)
        # stays in normal doubles. Every scaled kernel factor that is a normal double is
        # formed (step_weights_linear), so a weight is lost only where its product is below
        # the smallest normal double and flushed to 0.0.
        lscale = min(-lk, 300.0)
        top = KL.step_weights_linear(
            summed,
            row.lo,
            count,
            pos_ref,
            pos,
            nj,
            fwd.c,
            fwd.mu,
            lscale,
            fwd.pw,
            fwd.pwf,
            buf,
        )
        # A flushed weight is below 2^-1022 (the scaled units of ``top``), and at most
        # ``count`` of them are lost: with a largest weight of at least TINY_DRAW (2^-900)
        # and count < 2^30 they are < 2^-92 of it. Both sides are absolute values in the same
        # scaled units; nothing here is a product that could underflow.
        if top >= TINY_DRAW:
            g_draw = row.gmax + (math.log(top) - math.log(row.top)) - lscale
        else:
            # The kernel pushed every candidate towards underflow: form the same weights in
            # log space from the stored row.
            lsummed = np.empty_like(summed)
            KG.log_of(summed, lsummed)
            ltop = KG.step_weights_log(lsummed, row.lo, count, pos_ref, pos, nj, fwd.c, fwd.mu, buf)
            g_draw = row.gmax + ltop - math.log(row.top)
    g_rel = g_draw - lk  # g_draw - log(max kernel factor)
    # The sound bound on the weights' total error (error_bound) must be 2^-52 m below
    # the largest weight, and so must the median-width rule's (range_ok: the rule the
    # forward rows were built to; it only ever asks for more range). Tilted passes are
    # held to the median-width rule alone: the bound's rates are limited by c - mu there
    # and it asks several times more range than they have on clamped data (see
    # docs/mechanisms.md, "Range rule").
    short = row.peak + j * fwd.log_growth - (g_rel - fwd.headroom)
    sound = -math.inf
    if not fwd.mu and (fwd.log_space or short <= 0.0):  # (a linear pass trips anyway)
        sound = fwd.error_at_draw(j, pos_ref - nj, i_end) - (g_draw - fwd.headroom)
    if short > 0.0 or sound > 0.0:
        if not fwd.log_space:
            # the sound bound alone rejected it: the median rule, which tilted passes
            # answer to, is too weak here, so the retry is the log pass
            raise SoundGuardTripped if short <= 0.0 else LinearGuardTripped
        raise LogGuardTripped(fwd.keep + max(short, sound))
    # Two raw 64-bit words per block, always (so passes that keep different numbers of
    # levels stay in step, and the generator advances as two rng.random() calls would): the
    # interval from its weight summed over repeat counts, then the count from that
    # interval's levels. Each pick is exact with respect to the weights formed here
    # (pick_weights): no cut point's rounding or 53-bit uniform enters the law.
    raw = rng.bit_generator.random_raw
    w_interval, w_level = int(raw()), int(raw())
    pick = pick_weights(buf, w_interval, rng)
    if pick < 0:
        raise FloatingPointError("JointExp: backward weights are all zero")
    k = 0
    if nlev > 1:
        if row.nlev:  # compact: the levels at the picked interval, replayed
            at_pick = stored_levels_at(fwd, j, row.lo + pick, nlev).reshape(-1, 1)
            k = pick_repeat_level(at_pick, repeat_level_ids(nlev), nlev, 0, False, w_level, rng)
        else:  # the stored levels at the picked interval
            k = pick_repeat_level(
                row.levels, row.level_ids, nlev, pick, fwd.log_space, w_level, rng
            )
        if k < 0:
            raise FloatingPointError("JointExp: backward weights are all zero")
    return row.lo + pick, k + 1


def pick_repeat_level(
    levels: FloatArray,
    ids: IntArray,
    nlev: int,
    v: int,
    log_space: bool,
    word: int,
    rng: np.random.Generator,
) -> int:
    """The repeat count (0-based) at column v, drawn exactly ∝ its levels 1..nlev
    (:func:`repeat_level_weights`); -1 if they are all zero."""
    weights, counts = repeat_level_weights(levels, ids, nlev, v, log_space)
    s = pick_weights(weights, word, rng)
    return -1 if s < 0 else int(counts[s]) - 1


def repeat_level_weights(
    levels: FloatArray, ids: IntArray, nlev: int, v: int, log_space: bool
) -> tuple[FloatArray, IntArray]:
    """The weights a level pick draws from (relative to the largest) and the repeat count
    (1-based) of each (:func:`~app.mechanisms.jointexp.kernels_log.level_weights`)."""
    weights = np.empty(ids.size)
    ns = int(KG.level_weights(levels, ids, nlev, v, log_space, weights))
    return weights[:ns], ids[:ns]


def run_probe(
    logw: FloatArray,
    pos: IntArray,
    gaps: FloatArray,
    c: float,
    log_kernel: str,
    lw_ref: float | None = None,
    inputs: Inputs | None = None,
) -> Forward:
    """A narrow log pass (``PROBE_KEEP`` e-folds, rows a quarter as wide) that measures rows.

    It runs to the end even when its range is short, recording each row's maximum, where
    it lies, and the largest range any row asked for (``needed_keep``). Its rows lack
    range, so the falls it sees are at least the true ones (missing mass only lowers a
    row's maximum).
    """
    probe = Forward(
        logw,
        pos,
        gaps,
        c,
        log_space=True,
        budget=0,
        keep=PROBE_KEEP,
        log_kernel=log_kernel,
        lw_ref=lw_ref,
        inputs=inputs,
    )
    with contextlib.suppress(LogGuardTripped):
        probe.run()
    return probe


def _keep_after(probe: Forward) -> float:
    """The range the exact log pass starts with: enough for the falls the probe saw."""
    return LOG_KEEP if probe.needed_keep == 0.0 else max(LOG_KEEP, probe.needed_keep + 200.0)


def choose_tilt(probe: Forward) -> float:
    """The tilt under which linear rows should hold the probe's falls (0.0: none found).

    A tilted row j is stored as ``alpha e^(-mu (P - T_j))`` (``T_j = n_1 + .. + n_j``), so
    its maximum is at least the tilted value at the probe's mode,
    ``gmax_j - mu (mode_j - T_j)``, and at each of the row's profiled columns. Rows whose
    mass is pushed below their targets (data clamped at a bound, a quantile inside a tie)
    rise by the tilt as much as they fell.
    Each candidate is judged by the linear pass's own range rule on those estimated
    maxima, with the tilted kernel's growth; the least tilt that passes is chosen (the
    narrowest rows). The pass that runs checks its own range, so this only decides speed.
    """
    c, m = probe.c, probe.m
    targets = np.cumsum(probe.gaps[:m])
    idx = np.arange(1, m + 1, dtype=np.float64)
    lw_ref = probe.lw_ref
    prof_val = probe.prof_val
    for k in TILT_STEPS:
        mu = c * (1.0 - math.pow(2.0, -k))
        g = _log_kappa(c, mu, probe.n1) + lw_ref
        # the tilted maximum is at least the tilted value at the mode and at every
        # profiled column (all lower bounds: the probe's rows lack range)
        gm = np.maximum(
            probe.gmaxes - mu * (probe.modes - targets),
            np.max(prof_val - mu * (probe.prof_pos - targets[:, None]), axis=1),
        )
        floors = np.maximum(gm, np.concatenate(([gm[0]], gm[:-1]))) - probe.linear_floor
        shifted = gm - idx * g
        later_min = np.minimum.accumulate(shifted[::-1])[::-1]
        if np.all(floors - idx * g <= later_min - probe.headroom - TILT_MARGIN):
            return mu
    return 0.0


def _log_kappa(c: float, mu: float, n1: int) -> float:
    """log kappa: one row's error growth bound for the kernel tilted by ``mu`` (0: untilted).

    The near part sums to at most ``e^(-(c-mu) f) / (1 - e^-(c-mu))``, the far part to
    ``e^(-(c+mu)(1-f)) / (1 - e^-(c+mu))``; both are convex in f, so the larger end
    (f = 0 or 1) bounds their sum (untilted: ``(1 + r) / (1 - r)`` at either end). At most
    ``n1`` terms, each <= 1; the repeat levels add at most 1/2.
    """
    qa, qb = -math.expm1(-(c - mu)), -math.expm1(-(c + mu))
    kern = max(1.0 / qa + math.exp(-(c + mu)) / qb, math.exp(-(c - mu)) / qa + 1.0 / qb)
    return math.log(min(kern, float(n1)) + 0.5)


def run_log_space(
    logw: FloatArray,
    pos: IntArray,
    gaps: FloatArray,
    c: float,
    budget: int,
    keep: float | None = None,
    log_kernel: str = "scaled",
    lw_ref: float | None = None,
    inputs: Inputs | None = None,
) -> Forward:
    """Forward pass in log space, widening the kept range until every row has enough.

    A pass that comes up short reports the largest range any row asked for; the next pass
    keeps that much (plus slack). Without a ``keep`` a probe pass (:func:`run_probe`) measures
    the rows' falls first and the exact pass starts with the range they need. Every pass
    checks its own range (:meth:`Forward.range_ok`), so the probe only decides speed,
    never the result.
    """
    if lw_ref is None:
        lw_ref = median_log_width(logw)
    if keep is None:
        keep = _keep_after(run_probe(logw, pos, gaps, c, log_kernel, lw_ref, inputs))
    while True:
        fwd = Forward(
            logw,
            pos,
            gaps,
            c,
            log_space=True,
            budget=budget,
            keep=keep,
            log_kernel=log_kernel,
            lw_ref=lw_ref,
            inputs=inputs,
        )
        try:
            fwd.run()
            return fwd
        except LogGuardTripped as trip:
            keep = wider(keep, trip.needed_keep)


def tilted_pass(
    logw: FloatArray,
    pos: IntArray,
    gaps: FloatArray,
    c: float,
    budget: int,
    mu: float,
    lw_ref: float,
    inputs: Inputs | None,
) -> Forward | None:
    """Tilted linear rows (``mu``), or None where they break the range rule."""
    fwd = Forward(
        logw,
        pos,
        gaps,
        c,
        log_space=False,
        budget=budget,
        tilt=mu,
        lw_ref=lw_ref,
        inputs=inputs,
    )
    try:
        fwd.run()
    except LinearGuardTripped:
        return None
    return fwd


def next_tilted_pass(fwd: Forward, budget: int, inputs: Inputs) -> Forward | None:
    """After a linear pass's draw lacked range: the next larger tilt whose forward rows hold
    (None from a log pass, or when no larger tilt is left: :func:`tilt_candidates`).

    The tilt was chosen for the forward rows (an untilted pass that held needed none); a
    draw's weights may need more (n = 10^6 with 5 % at one inner point: the last draw
    tripped at 0.895 c and held at the next tilt, 0.926 c, ~0.25 s against 1.4 s for the
    log pass; at epsilon = 0.1 the untilted rows held and the last draw tripped: 0.5 c,
    ~0.3 s against ~4 s).
    """
    if fwd.log_space:
        return None
    chosen = fwd.mu if fwd.mu else choose_tilt(fwd)
    for mu_try in tilt_candidates(
        fwd.c, chosen, fwd.pos, fwd.gaps, range_room(fwd.pos.size, fwd.gaps.size - 1), LINEAR_RANGE
    ):
        if mu_try <= fwd.mu:
            continue
        tilted = tilted_pass(fwd.logw, fwd.pos, fwd.gaps, fwd.c, budget, mu_try, fwd.lw_ref, inputs)
        if tilted is not None:
            return tilted  # (if its draws trip too, the next call goes further)
    return None


def _linear_floor(intervals: int) -> float:
    """e-folds below a linear row's maximum where its truncation floor lies: each entry
    sums at most ~4 x ``intervals`` terms, each exact to the smallest normal double
    (see LINEAR_RANGE)."""
    return LINEAR_RANGE - math.log(4.0 * intervals)


def _headroom(m: int) -> float:
    """e-folds required between the propagated truncation error and a row's maximum:
    HEADROOM plus the log of the repeat levels (at most m + 1)."""
    return HEADROOM + math.log(m + 1.0)


def range_room(intervals: int, m: int) -> float:
    """e-folds a linear row over ``intervals`` intervals keeps above its truncation floor
    less the headroom for ``m`` quantiles: the range the range rule leaves to a tilt."""
    return _linear_floor(intervals) - _headroom(m)


def forward_pass(
    logw: FloatArray,
    pos: IntArray,
    gaps: FloatArray,
    c: float,
    budget: int,
    log_kernel: str,
    tilt: bool | float,
    lw_ref: float,
    inputs: Inputs | None = None,
) -> Forward:
    """Linear rows; tilted linear rows where a probe says they hold; else the log pass.

    ``tilt``: True chooses a tilt from the probe (:func:`choose_tilt`), False never
    tilts, a number forces that tilt (tests).
    """
    if tilt is True or tilt is False:
        fwd = Forward(
            logw, pos, gaps, c, log_space=False, budget=budget, lw_ref=lw_ref, inputs=inputs
        )
        try:
            fwd.run(probe_on_trip=bool(tilt))
            return fwd
        except LinearGuardTripped:
            pass
        # the linear pass went on as a probe: its rows' maxima and modes choose the tilt
        mu = choose_tilt(fwd) if tilt else 0.0
    else:
        mu = float(tilt)
    # a chosen tilt that trips is followed by larger ones (:func:`tilt_candidates`); a
    # forced one (tests) is not
    room = range_room(pos.size, gaps.size - 1)
    tries = (
        tilt_candidates(c, mu, pos, gaps, room, LINEAR_RANGE)
        if tilt is True
        else [mu]
        if mu > 0.0
        else []
    )
    for mu_try in tries:
        tilted = tilted_pass(logw, pos, gaps, c, budget, mu_try, lw_ref, inputs)
        if tilted is not None:
            return tilted
    return run_log_space(logw, pos, gaps, c, budget, None, log_kernel, lw_ref, inputs)


def sample_interval_sequence(
    logw: FloatArray,
    pos: IntArray,
    gaps: FloatArray,
    c: float,
    rng: np.random.Generator,
    *,
    force_log_space: bool = False,
    budget: int = MEMORY_BUDGET_BYTES,
    log_kernel: str = "scaled",
    tilt: bool | float = True,
) -> IntArray:
    """Exact draw of the nondecreasing interval sequence (i_1..i_m) of JointExp.

    Args:
        logw: log of the d + 1 interval weights (widths, or numbers of grid points; ``-inf``
            for zero); any constant shift is irrelevant.
        pos: the d + 1 interval positions (strictly increasing; ``pos[0] = 0``,
            ``pos[-1] = n``).
        gaps: n_1..n_{m+1}.
        c: eps / (2 Δ).
        rng: the generator supplying uniforms (one per sampled block).
        force_log_space: run the exact log-space pass directly (used by tests).
        budget: bytes of forward rows kept before checkpointing starts.
        log_kernel: how log-space rows are summed: ``"scaled"`` (linear arithmetic with
            a coarse exponent, the default), ``"ext"`` (extended-range, a per-value
            exponent) or ``"log"`` (logaddexp); the last two are kept for tests.
        tilt: whether a failed linear pass may be retried with tilted linear rows before
            the log pass (True), never (False), or that tilt ``mu`` forced (tests).
    """
    return sample_prepared_sequence(
        Inputs.prepare(logw, pos),
        gaps,
        c,
        rng,
        force_log_space=force_log_space,
        budget=budget,
        log_kernel=log_kernel,
        tilt=tilt,
    )


def sample_prepared_sequence(
    inputs: Inputs,
    gaps: FloatArray,
    c: float,
    rng: np.random.Generator,
    *,
    force_log_space: bool = False,
    budget: int = MEMORY_BUDGET_BYTES,
    log_kernel: str = "scaled",
    tilt: bool | float = True,
) -> IntArray:
    """:func:`sample_interval_sequence` on prepared inputs (:meth:`Inputs.prepare`)."""
    # Heavy atoms cut to the largest gap target: the same distribution, shallower rows.
    inputs = inputs.collapsed(collapse_cap(gaps))
    # Rows and weights are exact only down to the smallest normal double below their
    # maxima (LINEAR_RANGE); subnormals are flushed to 0.0 rather than computed, which on
    # Intel cores costs a microcode assist per operation (fpmode).
    with flush_subnormals():
        logw, pos, lw_ref = inputs.logw, inputs.pos, inputs.lw_ref
        d1 = logw.size
        m = gaps.size - 1
        if force_log_space or inputs.narrow:
            fwd = run_log_space(logw, pos, gaps, c, budget, None, log_kernel, lw_ref, inputs)
        else:
            fwd = forward_pass(logw, pos, gaps, c, budget, log_kernel, tilt, lw_ref, inputs)
        seq = np.empty(m, dtype=np.int64)
        j, i_end, pos_ref = m, d1, int(pos[-1])
        while j > 0:
            try:
                i, k = draw_block(fwd, j, i_end, pos_ref, float(gaps[j]), rng)
            except LinearGuardTripped as trip:
                # a larger tilt while one is worth it (as the forward pass retries; never
                # with tilt=False, nor after the sound bound tripped), then the log pass;
                # either way the same step with exact weights: nothing was drawn
                retry_tilt = tilt is not False and not isinstance(trip, SoundGuardTripped)
                retilted = next_tilted_pass(fwd, budget, inputs) if retry_tilt else None
                fwd = retilted or run_log_space(
                    logw, pos, gaps, c, budget, None, log_kernel, lw_ref, inputs
                )
                continue
            except LogGuardTripped as trip:
                keep = wider(fwd.keep, trip.needed_keep)
                fwd = run_log_space(logw, pos, gaps, c, budget, keep, log_kernel, lw_ref, inputs)
                continue
            seq[j - k : j] = i
            j -= k
            i_end, pos_ref = i, int(pos[i])
        return seq


#: The key of JointExp's prepared inputs in :attr:`Support.memo`.
_MEMO_KEY = "jointexp.inputs"


def support_inputs(sup: Support) -> Inputs:
    """The support's log widths (max 0) and positions with what the passes derive from them:
    from ``sup.memo`` when a run on the same histogram prepared them, else prepared here."""
    inputs = sup.memo.get(_MEMO_KEY)
    if not isinstance(inputs, Inputs):
        inputs = Inputs.from_widths(sup.widths, sup.cum)
        sup.memo[_MEMO_KEY] = inputs
    return inputs


def jointexp_core(sup: Support, rng: np.random.Generator) -> FloatArray | IntArray:
    """JointExp on a prepared support: interval sequence by the exact DP, then the points.

    O(m d) time in the common case (d distinct values), O(d sqrt(m)) memory at worst. The
    arrays that depend on the intervals alone are prepared once per grid histogram
    (:attr:`Support.memo`): the same doubles as preparing them for every run.
    """
    c = sup.epsilon / (2.0 * jointexp_sensitivity(sup.quantiles, sup.neighbors))
    gaps = quantile_gaps(sup.quantiles, sup.n)
    seq = sample_prepared_sequence(support_inputs(sup), gaps, c, rng)
    return sup.points_in(seq, rng)


def jointexp(
    data: ArrayLike,
    quantiles: ArrayLike,
    *,
    epsilon: float,
    lower: float,
    upper: float,
    neighbors: str = "swap",
    rng: np.random.Generator | None = None,
) -> FloatArray:
    """JointExp: all m quantiles from one exponential mechanism, sampled exactly.

    Guarantee: epsilon-DP (paper Theorem 1) under the chosen neighbour relation; the
    sensitivity is 2 (swap) or 2 (1 - min gap) (add/remove, gaps including q_1 and 1 - q_m).

    Complexity: O(n log n) to sort and count, then O(m d) (d distinct values) in the common
    case; O(d sqrt(m)) memory at worst.

    Args:
        data: 1-D finite values (any order); clamped to [lower, upper].
        quantiles: strictly increasing values inside (0, 1).
        epsilon: privacy parameter (> 0).
        lower: public lower bound of the data domain.
        upper: public upper bound (> lower).
        neighbors: "swap" (the paper's default) or "add_remove".
        rng: generator to draw from; None uses a fresh CSPRNG-keyed generator.

    Returns:
        The m estimates, ascending, inside [lower, upper].
    """
    sup = support_from_values(
        data, quantiles, epsilon=epsilon, lower=lower, upper=upper, neighbors=neighbors
    )
    return np.asarray(jointexp_core(sup, make_rng(rng)), dtype=np.float64)


JOINTEXP = Mechanism(
    name="jointexp",
    fn=jointexp,
    core=jointexp_core,
    notion=PrivacyNotion.PURE_DP,
    summary="JointExp: one exponential mechanism for all m quantiles (Gillenwater et al. 2021).",
)

__all__: list[str] = [
    "JOINTEXP",
    "jointexp",
    "jointexp_core",
    "jointexp_sensitivity",
    "quantile_gaps",
    "sample_interval_sequence",
]

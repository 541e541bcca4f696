"""JointExp's forward recursions: the rows ``alpha(j, i, k)`` the backward draws read.

* The single-copy transition ``alpha(j, i, 1) = w_i sum_{i' < i} alpha(j-1, i') r^|P_i - P_i'
  - n_j|`` is a two-sided geometric kernel in the position difference, evaluated for all i in
  O(d) by a causal recursion and a two-stack window queue
  (:mod:`~app.mechanisms.jointexp.kernels_linear`) that only ever add non-negative terms.
* Repeats ``alpha(j, i, k) = w_i r^{n_j} alpha(j-1, i, k-1) / k`` are kept as extra levels
  where they are not dominated (:data:`~app.mechanisms.jointexp.rows.PRUNE`).
* Linear rows are max-normalised (fast path) and may be tilted (stored times
  ``e^(-mu (P - T_j))``); each carries its maximum on a common log scale and is held to the
  range rule (:mod:`~app.mechanisms.jointexp.range_rule`). A linear row that breaks it ends
  the pass (:class:`~app.mechanisms.jointexp.range_rule.LinearGuardTripped`); log rows keep
  ``keep`` e-folds each and report the range they lacked. Log rows' transition sums are
  formed in scaled linear arithmetic (a double mantissa times e^(350 k),
  ``kernels_scaled.transition_scaled``), ~5x faster than a logaddexp per operation (still
  available as ``log_kernel="log"``, and the per-value-exponent ``"ext"``).

Rows are kept by :class:`~app.mechanisms.jointexp.storage.RowStore`; what the tilt choice
reads of them by :class:`~app.mechanisms.jointexp.profile.Profile` (speed only).
"""

from __future__ import annotations

import functools
import math
import threading

import numpy as np

from app.mechanisms.jointexp import kernels_linear as KL
from app.mechanisms.jointexp import kernels_log as KG
from app.mechanisms.jointexp import kernels_scaled as KS
from app.mechanisms.jointexp.certificate import FOLLOW_FROM, Certificate
from app.mechanisms.jointexp.error_bound import ErrorBound
from app.mechanisms.jointexp.profile import Profile
from app.mechanisms.jointexp.range_rule import (
    LinearGuardTripped,
    LogGuardTripped,
    headroom,
    last_headroom,
    linear_floor,
    log_kappa,
    median_log_width,
    prune_floor,
    range_holds,
    tiny_draw,
)
from app.mechanisms.jointexp.rows import Inputs, Row, row_span, summed_levels, to_scaled
from app.mechanisms.jointexp.spans import Spans
from app.mechanisms.jointexp.storage import RowStore
from app.mechanisms.jointexp.strategy import LOG_KEEP, PROBE_KEEP
from app.mechanisms.jointexp.threads import Background, Stream
from app.mechanisms.validation import FloatArray, IntArray

#: Longest decay distance tabled for the extended-range kernel (longer ones call exp).
EXT_TABLE_MAX = 2**20
_NO_PROFILE = np.zeros(0)  # a row that records no profile (tilted rows)


#: A tilted pass over at least this many entries (intervals x rows) runs its certificate's
#: first error pass in a thread beside its rows; a smaller one runs it when the certificate
#: is read (a thread's start and hand-offs cost more than the pass: 10^3 groups of a few
#: intervals each, ~0.5 ms per pass)
STREAM_FROM = 1 << 17


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
        generation: int = 0,
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
        self.log_kappa = log_kappa(c, tilt, self.n1)
        # Errors grow per row by at most kappa times the width of the entry they land on;
        # they are charged the median positive width (the rows' own mass is charged the same
        # widths, so a uniform width scale is not a fall). This is the one step that is not a
        # worst-case bound: see docs/mechanisms.md, "Range rule".
        if lw_ref is None:
            lw_ref = median_log_width(logw)
        self.lw_ref = lw_ref
        self.log_growth = self.log_kappa + lw_ref
        self.headroom = headroom(self.m)
        # the floors that bound the mass a pass drops (the release's δ; range_rule), tighter
        # for a pass rebuilt in the middle of a backward sweep (its ``generation``: the
        # rebuilds before it)
        self.generation = generation
        self.last_headroom = last_headroom(c, self.m, generation)
        self.prune = prune_floor(c, self.m, generation)
        self.tiny_draw = tiny_draw(c, generation)
        self.linear_floor = linear_floor(self.n1)
        self.needed_keep = 0.0  # log pass: the largest range a row asked for (0: none)
        self.g0 = 0.0  # log of row 1's maximum, the origin of the rows' common scale
        # each row's truncation floor (log, common scale) and, from the first draw on, the
        # sound bound on the error they carry into the draws (error_bound)
        self.floors = np.full(self.m + 1, -math.inf)
        self._errors: ErrorBound | None = None
        self._norms: FloatArray | None = None
        # tilted linear passes: the rows' spans, for the certificate of their dropped mass
        self.spans = Spans(self.m) if tilt else None
        self._stream: Stream | None = None
        self._certified: float | None = None
        self._checker: Background | None = None  # the certificate, computing (start_certificate)
        self._stop = threading.Event()  # set when the pass is given up (halt)
        #: the level the certificate must be below (log, common scale): set by the last
        #: draw (:func:`~app.mechanisms.jointexp.draws.draw_block`), checked at the end of
        #: the sweep (:func:`~app.mechanisms.jointexp.draws.certificate_rejects`)
        self.cert_target: float | None = None
        self.complete = False  # every row formed (run() returned)
        # the rows' maxima, modes and profiles, for choosing a tilt (speed only)
        self.profile = Profile(self.m)
        # decay tables: near part (rate c - mu) and far part (rate c + mu; the same untilted)
        pw_len = int(min(int(pos[-1]) + 2, math.ceil(750.0 / (c - tilt)) + 2))
        self.pw = np.exp(-(c - tilt) * np.arange(max(pw_len, 2), dtype=np.float64))
        self.pwf = self.pw
        if tilt:
            pwf_len = int(min(int(pos[-1]) + 2, math.ceil(750.0 / (c + tilt)) + 2))
            self.pwf = np.exp(-(c + tilt) * np.arange(max(pwf_len, 2), dtype=np.float64))
        self.store = RowStore(self.m, budget)
        #: linear pass that broke the range rule and goes on as a probe (:meth:`run`)
        self.probing = False
        #: probing: a log pass over the intervals from some index on (_probe_row_via_logs)
        self._tail: tuple[int, Forward] | None = None

    # -- one row ----------------------------------------------------------------------------

    def _profile(self, j: int, lo: int, values: FloatArray, shift: float, logs: bool) -> None:
        """Record row j's profile (untilted rows only; :meth:`Profile.record`)."""
        if not self.mu:
            self.profile.record(j, lo, values, shift, logs, self.pos)

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
        self.profile.modes[0] = float(self.pos[i0 + int(np.argmax(lrow))])
        # the common scale's origin: row 1 is stored relative to its maximum (the
        # acceptance step converts the pass's normaliser back with it)
        self.g0 = float(lrow.max())
        if self.log_space:
            lrow -= self.g0
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
        """The range rule at row j (:func:`~app.mechanisms.jointexp.range_rule.range_holds`)."""
        return range_holds(peak, j, self.log_growth, gmax, self.headroom)

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

    def _certificate(self, stop: threading.Event | None = None) -> Certificate:
        return Certificate(
            self.logw,
            self.pos,
            self.w,
            self.gaps,
            self.c,
            self.mu,
            self.pw,
            self.pwf,
            self.linear_floor,
            self.inputs.width_blocks,
            self._stop if stop is None else stop,
        )

    def _certify(self, target: float) -> float:
        """The certificate against ``target`` (:meth:`certified_error`), from the first
        error pass that ran beside the rows where it was not given up."""
        if self.spans is None or not self.complete:
            raise ValueError("only a tilted linear pass that has run has a certificate")
        stop = self._stop
        first = None if self._stream is None else self._stream.join()
        if first is None:  # a small pass, or one given up and then drawn from: run it here
            first = self._certificate(stop).first_level(self.spans, self.g0)
            first.run()
        return first.cert.log_bound(self.spans, target, first)

    def start_certificate(self, target: float) -> None:
        """The sweep's first draw (the pass's last block) set the certificate's target: the
        certificate is computed in a thread while the sweep draws its other blocks
        (:func:`~app.mechanisms.jointexp.draws.certificate_rejects` reads it after the
        sweep). Its value is a function of the data alone, wherever it is computed. A small
        pass (below :data:`STREAM_FROM` entries) computes it when it is read."""
        if self.n1 * self.m < STREAM_FROM:
            return
        if self._certified is None and self._checker is None and self.complete:
            self._checker = Background(functools.partial(self._certify, target))

    def certified_error(self, target: float) -> float:
        """Tilted linear passes: log of a certified upper bound on the mass of the sequences
        through an entry the pass dropped, on the pass's common scale
        (:mod:`~app.mechanisms.jointexp.certificate`; its first error pass ran beside the
        forward rows, further ones are added while the bound is above ``target``).
        Computed once per pass (in a thread from the sweep's first draw on:
        :meth:`start_certificate`)."""
        if self._certified is None:
            checker, self._checker = self._checker, None
            if checker is not None and not self._stop.is_set():
                self._certified = checker.join()
            else:
                if self._stop.is_set():  # a pass given up, drawn from after all
                    self._stop = threading.Event()
                self._certified = self._certify(target)
        return self._certified

    def abandon(self) -> None:
        """The pass will not be drawn from again (a forward row or a draw tripped before
        its last draw set the certificate's target): its error pass stops."""
        if self.cert_target is None:
            self.halt()

    def halt(self) -> None:
        """Nothing will read the certificate (the pass was given up, or the release failed):
        its error passes stop at their next row. Should the pass be read after all, its
        certificate is computed then, in full."""
        self._stop.set()
        if self._stream is not None:
            self._stream.cancel()

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
        prof_pos, prof_val = (_NO_PROFILE, _NO_PROFILE) if self.mu else self.profile.slots(j)
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
            self.prune,
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
        self.profile.gmaxes[j - 1] = gmax
        self.profile.modes[j - 1] = float(self.pos[prev.lo + at])
        if not self.mu:  # the profile linear_row recorded: linear values, in units of top
            self.profile.shift[j - 1] = gmax - math.log(top)
            self.profile.linear[j - 1] = True
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
        self.profile.copy_row(j, sub.profile)
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
            math.log(self.prune),
            self.keep,
        )
        if not math.isfinite(top):
            raise FloatingPointError("JointExp: a forward row has no mass")
        gmax = prev.gmax + top
        self.profile.gmaxes[j - 1] = gmax
        self.profile.modes[j - 1] = float(
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

    def run(self, probe_on_trip: bool = False) -> None:
        """All rows. ``probe_on_trip`` (untilted linear passes): a row that breaks the range
        rule does not end the pass; it drops its rows and goes on as a probe (every row's
        maximum and mode, a row that underflows formed through logs), then raises
        :class:`LinearGuardTripped`, so one pass serves as the linear attempt and as the
        measurement for :func:`choose_tilt`."""
        row = self.first()
        self.store.store(1, row)
        spans = self.spans
        if spans is not None:  # a tilted pass: its certificate's first error pass alongside
            spans.record(1, row.lo, row.lo + row.levels.shape[1], row.gmax, self.floors[1])
            if self.n1 * self.m >= STREAM_FROM:
                g0 = self.g0
                self._stream = Stream(
                    lambda: self._certificate().first_level(spans, g0),
                    1 if self.m >= FOLLOW_FROM else 0,
                )
        try:
            for j in range(2, self.m + 1):
                try:
                    nxt = self.step(row, j)
                except LinearGuardTripped:
                    if not probe_on_trip or self.log_space or self.mu:
                        raise
                    self.probing = True
                    self.store.clear()
                    nxt = self.step(row, j)
                if self.probing:
                    row = nxt
                    continue
                self.store.served(j - 1, row, not self.log_space)
                self.store.store(j, nxt)
                if spans is not None:
                    # row j dropped nothing left of row j - 1's first entry
                    spans.record(j, row.lo, nxt.lo + nxt.levels.shape[1], nxt.gmax, self.floors[j])
                    if self._stream is not None:
                        self._stream.push(j)
                row = nxt
        except BaseException:
            self.abandon()  # the pass failed: nothing will read its certificate
            raise
        finally:
            if self._stream is not None:
                self._stream.close()
        if self.probing:
            raise LinearGuardTripped
        if self.needed_keep > 0.0:
            raise LogGuardTripped(self.needed_keep)
        self.complete = True

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
        return self.store.get(j, self.step)

    @property
    def rows(self) -> dict[int, Row]:
        """The rows stored whole or compact (by row number)."""
        return self.store.rows

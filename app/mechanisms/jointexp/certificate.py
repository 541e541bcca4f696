"""A certificate for the mass a tilted linear pass drops: JointExp's δ on tilted passes.

A forward row drops what lies below its truncation floor ``e^{t_j}`` (on the pass's common
scale, in the pass's tilted units): with ``r_j`` what row j dropped from what its stored
predecessor gave it, the sequences through a dropped entry weigh

    D·Z = sum_j beta_j^T r_j,   beta_j = A_{j+1}^T ... A_m^T b,

``A_j`` the exact transition (non-negative), ``b`` the last draw's kernel factors. Every
``A_j`` maps the totals over repeat levels into a majorant ``Ā_j`` (the single-copy kernel,
plus ``w_i e^{-(c - mu) n_j} / 2`` times the total at the same interval: level k + 1 gets
1/(k + 1) <= 1/2 of level k), so with sources ``s_j >= r_j`` (totals over levels)

    E_1 = s_1,  E_j = Ā_j E_{j-1} + s_j,  D·Z <= b^T E_m.

The *error pass* computes ``E`` with the pass's own tilted kernel
(:func:`~app.mechanisms.jointexp.kernels_linear.transition_linear`): one more linear
recursion, over a single level, with no data but the rows' floors and spans. The sources
(docs/mechanisms.md, "The certificate of a tilted pass"), for any pass ``X`` (the rows, or
an error pass whose own drops the next one takes up):

* row 1 is the closed form ``w_i e^{-c |P_i - n_1| - mu (P_i - n_1)}``, so what it dropped
  at i is at most ``min(closed form, e^{t_1})``, over every interval;
* row j >= 2 dropped nothing left of the first index it was formed from (the exact
  transition of what row j - 1 holds is 0.0 there); at most ``e^{t_j}`` per entry (times
  the j repeat levels of the rows) everywhere else; and past ``p* = P_hi + n_j`` (``hi``
  row j - 1's last entry, ``M = e^{g_{j-1}}`` its maximum) at most
  ``M e^{-(c + mu)(P - p*)} / (1 - e^{-(c + mu)})`` from the transition (the far part of
  the tilted kernel; positions are distinct integers), plus, for an error pass, the part of
  its own sources it did not add (they decay at the same rate, so the two are one
  exponential, the row's *envelope*).

Each error pass drops only what is ~708 e-folds below its own rows (a flushed source or
term, within its floor ``e^{t^E_j}``; sources below that are not added at all), and the
next error pass takes those up by the same rules; after the last one, what it dropped is
charged by the position-aware max-norm bound of :mod:`~app.mechanisms.jointexp.error_bound`
(loose by hundreds to thousands of e-folds, but applied ~708 e-folds below each level;
where it does not certify, the same bound with the widths read at the sources, summed
under the kernel, :mod:`~app.mechanisms.jointexp.smoothed_norm`, never larger).
Levels are added while the bound is above its target (at most :data:`LEVELS`); where the
max-norm remainder keeps it there, one more error pass in logs (:class:`LogLevel`,
:mod:`~app.mechanisms.jointexp.exact_tail`), which drops nothing, replaces the remainder.
An interval of zero width gets no source: every row's entry there is exactly 0.0. The
certificate is the sum; it is an upper bound on ``D·Z`` on the pass's common scale,
compared at the last draw with its largest weight.
"""

from __future__ import annotations

import functools
import math
import threading

import numba
import numpy as np

from app.mechanisms.jointexp import exact_tail as ET
from app.mechanisms.jointexp import kernels_linear as KL
from app.mechanisms.jointexp import smoothed_norm as SN
from app.mechanisms.jointexp.blocks import Blocks, block_log_factor, block_log_sums
from app.mechanisms.jointexp.error_bound import ErrorBound
from app.mechanisms.jointexp.spans import Spans, first_sources
from app.mechanisms.jointexp.threads import Cancelled, Stream
from app.mechanisms.validation import FloatArray, IntArray

#: error passes at most (the first on the rows' floors, each next on the previous one's;
#: each lowers what is left to the max-norm bound by ~690 e-folds: m = 99 on clamped data
#: needs one to three, m = 499 four)
LEVELS = 8
#: what one more level is taken to lower the max-norm remainder by before two have been
#: measured (its floors lie ~lf = 708 - log(4 (d + 1)) e-folds below the previous ones)
LEVEL_GAIN = 700.0
#: e-folds a coarse level (:class:`Blocks`) is to leave below the target, beyond what its
#: blocks are expected to cost (speed only: a coarse level that does not certify is
#: replaced by the level on the intervals)
COARSE_MARGIN = 40.0
#: the widest block span tried (and a coarse level only where it halves the entries)
COARSE_SPAN_MAX = 1024
#: error passes sum the transition over every stored entry (no window:
#: :func:`~app.mechanisms.jointexp.kernels_linear.transition_majorant`, ~2x faster) where
#: the terms it adds, each at most ``e^{-(c - mu) n_j}`` of its source, are this many
#: e-folds down at every row (speed only: either is an upper bound)
MAJORANT_FROM = 30.0
#: the most entries (intervals x rows) the last error pass in logs runs on (~0.1 us each:
#: ~3 s at the limit; a log pass over as many entries takes several times as long)
EXACT_TAIL_MAX = 1 << 25
#: rows from which the first error pass is followed by the second one, run beside it on
#: its rows as they come rather than after it (speed only: with as many rows the first
#: level's remainder has not certified on any shape measured, m = 499 and 999)
FOLLOW_FROM = 250
#: the most levels run side by side, each on the previous one's rows as they come, where
#: more than one is expected (speed only)
CHAIN = 4
_U = 2.0**-52


@numba.njit(cache=True, nogil=True)
def error_row(
    e_prev: np.ndarray,
    lo_prev: int,
    g_prev: float,
    t_src: float,
    src_lo: int,
    env: float,
    p_star: float,
    w: np.ndarray,
    P: np.ndarray,
    nj: float,
    c: float,
    mu: float,
    pw: np.ndarray,
    pwf: np.ndarray,
    lf: float,
    inflate: float = 0.0,
    majorant: bool = False,
) -> tuple[np.ndarray, int, int, float, float]:
    """``E_j = Ā_j E_{j-1} + s`` with ``s_i = e^{t_src}`` up to position ``p_star`` and
    ``min(e^{t_src}, e^{env - (c + mu) P_i})`` past it, from index ``src_lo`` on (0 left of
    it; sources below ``e^{U - 750}`` are not added: the pass drops them), from ``E_{j-1}`` stored
    from index ``lo_prev`` with maximum 1 and log scale ``g_prev``. Returns the new row (max
    1, from its first to its last non-zero entry), its first index, the first index it was
    computed from (nothing is dropped left of it), its log scale and its truncation floor
    (each entry exact to ``e^{floor}``: the transition's terms flushed
    below the smallest normal double of ``max(U, g)``, at most ~4 (d + 1) of them, and the
    normalisation's). The widths are ``w e^{inflate}`` (a coarse pass's: :class:`Blocks`).
    ``majorant``: the transition summed over every stored entry, not only the earlier ones
    (:func:`~app.mechanisms.jointexp.kernels_linear.transition_majorant`: an entry-wise
    larger operator, so still an upper bound; :data:`MAJORANT_FROM`)."""
    n1 = w.size
    rate0 = c + mu
    U = max(g_prev + inflate, t_src)  # (the unit: every term <= 1 in it)
    scale = math.exp(g_prev + inflate - U)  # e_prev (max 1) times the widths' factor
    base = min(lo_prev, src_lo)
    # past the window the transition's sums decay by e^-(c + mu) per position (at least one
    # per interval) and are 0.0 from ln(size) + 746 e-folds on (as Forward._step_linear)
    n_t = e_prev.size
    tail = n_t + math.floor(nj) + math.ceil((math.log(n_t + 1.0) + 746.0) / (c + mu)) + 4
    n_out = min(n1 - lo_prev, tail)
    off = lo_prev - base
    # sources reach past the transition's outputs only while above e^{U - 750}
    src_end = n1
    if t_src - U < -750.0:
        src_end = src_lo
    else:
        reach = max(p_star, (env - (U - 751.0)) / rate0)
        if reach < float(P[n1 - 1]):
            src_end = min(src_end, int(np.searchsorted(P, math.floor(reach), side="right")))
    src_end = max(src_end, src_lo)
    out = np.zeros(max(off + n_out, src_end - base, 0))
    kernel = KL.transition_majorant if majorant else KL.transition_linear
    kernel(
        e_prev,
        lo_prev,
        scale,
        w,
        P,
        nj,
        c,
        mu,
        pw,
        pwf,
        np.empty(n_t),
        out[off : off + n_out],
    )
    stay = 0.5 * math.exp(-(c - mu) * nj) * scale
    for v in range(e_prev.size):
        out[off + v] += w[lo_prev + v] * stay * e_prev[v]
    rate = c + mu
    if t_src - U >= -750.0:
        flat = math.exp(t_src - U)  # the source up to p_star (one exp, not one per entry)
        for i in range(src_lo, src_end):
            if w[i] == 0.0:  # a zero width: every row's entry is exactly 0, none dropped
                continue
            if P[i] <= p_star:
                out[i - base] += flat
                continue
            ls = min(t_src, env - rate * P[i])
            if ls - U < -750.0:  # past p_star: 0.0 from here on (decreasing)
                break
            out[i - base] += math.exp(ls - U)
    a = 0
    while a < out.size and not (out[a] > 0.0):
        a += 1
    b = out.size
    while b > a and not (out[b - 1] > 0.0):
        b -= 1
    top = 0.0
    for v in range(a, b):
        top = max(top, out[v])
    res = out[a:b]  # normalised in place (a view: no second row allocated and copied)
    for v in range(res.size):
        res[v] /= top
    g = U + math.log(top)
    return res, base + a, base, g, max(U, g) - lf + math.log(2.0)


class Certificate:
    """The certificate of one tilted linear pass (module docstring): built from the pass's
    rows' spans and floors as it runs; :meth:`log_bound` at the last draw."""

    def __init__(
        self,
        logw: FloatArray,
        pos: IntArray,
        w: FloatArray,
        gaps: FloatArray,
        c: float,
        mu: float,
        pw: FloatArray,
        pwf: FloatArray,
        lf: float,
        blocks: tuple[FloatArray, FloatArray, FloatArray],
        stop: threading.Event | None = None,
    ) -> None:
        """``stop``: set when nothing will read the certificate (its pass was given up):
        its error passes then end at their next row (:class:`Cancelled`)."""
        self.stop = threading.Event() if stop is None else stop
        self.logw, self.pos, self.w, self.gaps = logw, pos, w, gaps
        self.c, self.mu, self.pw, self.pwf, self.lf = c, mu, pw, pwf, lf
        self.m = gaps.size - 1
        self.errors = ErrorBound(logw, pos, gaps, c, mu, blocks)
        self.log_q = math.log(-math.expm1(-(c + mu)))
        #: relative rounding of the error passes' sums of positive terms
        self.slack = (self.m + 1.0) * (4.0 * logw.size + 16.0) * _U + 1e-9
        self.g0 = 0.0  # row 1's maximum before normalising (set by :meth:`stream`)
        inner = gaps[1 : self.m]
        self.majorant = bool(inner.size) and (c - mu) * float(inner.min()) >= MAJORANT_FROM
        #: the smoothed max-norm bound, once the plain one has not certified
        self.smoothed: SN.SmoothedNorms | None = None

    def _max_norm(self, floors: FloatArray, smooth: bool = False) -> float:
        """The max-norm bound on what errors ``<= e^{floors_j}`` per entry carry into the
        last draw (at ``n - n_{m+1}``, over every interval); with the widths smoothed by the
        kernel (:mod:`~app.mechanisms.jointexp.smoothed_norm`, never larger) once ``smooth``
        has been asked for."""
        m = self.m
        if smooth and self.smoothed is None:
            self.smoothed = SN.SmoothedNorms(self.errors, self.logw, self.pos)
        norms = self.errors.norms(floors) if self.smoothed is None else self.smoothed(floors)
        t = float(self.pos[-1]) - float(self.gaps[m])
        return self.errors.at_draw(norms[m], m, t, self.logw.size)

    def level(self, src: Spans, levels: bool) -> Level:
        """An error pass on what the pass ``src`` dropped; ``levels``: ``src`` is the forward
        rows (their entries have up to j repeat levels at row j)."""
        return Level(self, src, levels)

    def log_bound(self, rows: Spans, target: float, first: Level) -> float:
        """log of an upper bound on ``D·Z`` (the mass of the sequences through an entry the
        pass dropped) on the pass's common scale; error passes are added while the bound is
        above ``target`` (at most :data:`LEVELS`). ``first``: the first error pass, run."""
        # levels run ahead beside the one before (joined only if needed; stopped at the end)
        live: list[Stream] = []
        try:
            return self._levels(rows, target, first, live)
        finally:
            for stream in live:
                stream.cancel()  # (no-op if joined: it has finished)

    def _levels(self, rows: Spans, target: float, first: Level, live: list[Stream]) -> float:
        """:meth:`log_bound`'s loop; every stream it starts goes into ``live``."""
        pending = first.follower  # the next level's stream, when it runs beside this one
        if pending is not None:
            live.append(pending)
        m = self.m
        parts: list[float] = []
        level = first
        bound = math.inf
        ahead: Level | None = None  # the level after ``level``, when already run
        counted = first  # the last level whose result is in ``parts``
        gain, prev_rest = LEVEL_GAIN, math.inf
        # the remainder before the level (the max-norm bound on its sources' carry)
        before = self._max_norm(rows.t)
        for k in range(1, LEVELS + 1):
            parts.append(level.result())
            counted = level
            rest = self._max_norm(level.out.t)
            bound = _lse([*parts, rest]) + self.slack
            if bound > target and self.smoothed is None and _lse(parts) + self.slack <= target:
                # the plain remainder compounds the widest width at every row: from here on
                # the one that reads the widths where the kernel meets them (never larger)
                rest = self._max_norm(level.out.t, smooth=True)
                bound = _lse([*parts, rest]) + self.slack
            if bound <= target or _lse(parts) + self.slack > target:
                return bound  # certified, or no further level can certify it
            if math.isfinite(prev_rest):
                gain = prev_rest - rest
            prev_rest = rest
            # how far the max-norm bound was above what this level computed exactly
            loose, before = max(before - parts[-1], 0.0), rest
            if rest - (LEVELS - k) * gain > target:
                # the levels left would not bring the remainder down enough
                return self._exact_tail(counted, parts, bound)
            if pending is not None:
                ahead, pending = pending.join(), None  # None if it was stopped
            if ahead is not None:
                level, ahead = ahead, None
                pending = level.follower  # the rest of a chain started below
                continue
            if rest - gain <= target:
                # one more level is expected to do (10 % clamped at each bound): alone, as
                # a second one beside it would slow it down; on blocks first where the
                # certificate can spare their cost
                coarse = self._coarse(level.out, target, rest - gain, rest - loose)
                if coarse is not None:
                    coarse.run()
                    trial = _lse([*parts, coarse.result(), coarse.remainder()])
                    if trial + self.slack <= target:
                        return trial + self.slack
                level = self.level(level.out, False)
                level.run()
                continue
            level = self.level(level.out, False)
            # else the levels expected side by side, each fed the previous one's rows as
            # they come (up to CHAIN: m = 999 on clamped data needs five in all)
            need = math.ceil((rest - target) / max(gain, 1.0))
            chain = max(2, min(need, CHAIN, LEVELS - k))
            stream = Stream(functools.partial(self.level, level.out, False), chain - 2)
            live.append(stream)
            try:
                for j in range(2, m + 1):
                    level.row(j)
                    stream.push(j)
            finally:
                stream.close()
            ahead = stream.join()
            if ahead is None:  # the pass was given up meanwhile
                raise Cancelled
        return self._exact_tail(counted, parts, bound)

    def _exact_tail(self, counted: Level, parts: list[float], bound: float) -> float:
        """Where the max-norm remainder keeps the bound above its target: the pass on what
        ``counted`` (the last level in ``parts``) dropped, in logs (:class:`LogLevel`), in
        place of that remainder; the smaller of the two bounds. Speed only (both are upper
        bounds): it replaces a log pass of seconds by one error pass in logs, and runs only
        up to :data:`EXACT_TAIL_MAX` entries and where both kernel rates are positive."""
        if self.c - self.mu <= 0.0 or self.c + self.mu <= 0.0:
            return bound
        if self.logw.size * self.m > EXACT_TAIL_MAX:
            return bound
        tail = LogLevel(self, counted.out, False)
        tail.run()
        exact = _lse([*parts, tail.result()]) + self.slack + tail.rounding()
        return min(bound, exact)

    def _coarse(
        self, src: Spans, target: float, rest_after: float, exact_after: float
    ) -> Level | None:
        """A coarse level on what ``src`` dropped (:class:`Blocks`), with the widest span
        whose cost, ``log I + log(span + 1)`` per row (the block widths' factor and sums),
        leaves :data:`COARSE_MARGIN` below the target both for the remainder a level on
        the intervals is expected to leave (``rest_after``) and for the exact part it is
        expected to add (``exact_after``: the remainder less the max-norm bound's looseness
        at the level before); None where no span helps. Speed only: the certificate is an
        upper bound whatever the span."""
        room = target - COARSE_MARGIN - max(rest_after, exact_after)
        rate = self.c + abs(self.mu)
        if not math.isfinite(room) or rate <= 0.0:
            return None
        # per row: the block widths' factor I and their sums (up to span + 1 intervals)
        span = int(min(room / (self.m * rate), COARSE_SPAN_MAX))
        while span >= 1 and self.m * (block_log_factor(rate * span) + math.log(span + 1.0)) > room:
            span -= 1
        if span < 1:
            return None
        blocks = Blocks(self.pos, self.w, span, self.c, self.mu, self.gaps)
        if 2 * blocks.starts.size > self.pos.size:
            return None
        return Level(self, src, False, blocks)

    def first_level(self, rows: Spans, g0: float) -> Level:
        """The first error pass, on the forward rows; ``g0``: row 1's maximum before
        normalising."""
        self.g0 = g0
        return self.level(rows, True)


def envelope(cert: Certificate, src: Spans, j: int) -> tuple[float, float]:
    """What ``src``'s row j dropped past ``p*`` is at most ``e^{env - (c + mu) P}``: its
    transition's far part from row j - 1, plus the sources it left out (as ``(env, p*)``)."""
    hi = int(src.hi[j - 1])
    g_prev = float(src.g[j - 1])
    if hi <= 0 or not math.isfinite(g_prev):
        return float(src.src_env[j]), float(src.src_star[j])
    p_star = float(cert.pos[hi - 1]) + float(cert.gaps[j - 1])
    env = g_prev - cert.log_q + (cert.c + cert.mu) * p_star
    return _lse([env, float(src.src_env[j])]), max(p_star, float(src.src_star[j]))


class Level:
    """One error pass, row by row: :meth:`row` j once ``src`` holds rows j - 1 and j."""

    def __init__(
        self, cert: Certificate, src: Spans, levels: bool, blocks: Blocks | None = None
    ) -> None:
        """``blocks``: a coarse pass on those blocks (``src`` still per interval)."""
        self.cert, self.src, self.levels, self.blocks = cert, src, levels, blocks
        self.out = Spans(cert.m)
        #: the next error pass, run on this one's rows as they came (a first level of a
        #: pass with many rows: :data:`FOLLOW_FROM`), or None
        self.follower: Stream | None = None
        self.w: FloatArray = cert.w if blocks is None else blocks.w
        self.pos: IntArray = cert.pos if blocks is None else blocks.pos
        self.inflate = 0.0 if blocks is None else blocks.inflate
        # sources summed over a block: at most its count of intervals times the bound
        self.src_count = 0.0 if blocks is None else blocks.log_count
        # row 1: what src's row 1 dropped is at most min(closed form, e^{t_1}) everywhere
        lsrc, a = first_sources(
            cert.logw, cert.pos, float(cert.gaps[0]), cert.c, cert.mu, cert.g0, float(src.t[1])
        )
        if blocks is not None:
            lsrc, a = block_log_sums(lsrc, a, blocks.block_of)
        self.g = float(lsrc.max()) if lsrc.size else -math.inf
        self.lo = a
        self.e = np.exp(lsrc - self.g) if math.isfinite(self.g) else np.zeros(0)
        self.out.record(1, a, a + lsrc.size, self.g, self.g - cert.lf + math.log(2.0))

    def row(self, j: int) -> None:
        """Row j (2 <= j <= m) from row j - 1."""
        if self.cert.stop.is_set():
            raise Cancelled
        if not math.isfinite(self.g):
            return
        cert, src, blocks = self.cert, self.src, self.blocks
        lev_j = (math.log(j) if self.levels else 0.0) + self.src_count
        env, p_star = envelope(self.cert, self.src, j)
        nj = float(cert.gaps[j - 1])
        src_lo = int(src.lo[j])
        if blocks is not None:
            src_lo = int(blocks.block_of[min(src_lo, blocks.block_of.size - 1)])
        self.e, self.lo, base, self.g, t = error_row(
            self.e,
            self.lo,
            self.g,
            float(src.t[j]) + lev_j,
            src_lo,
            env + lev_j,
            p_star,
            self.w,
            self.pos,
            nj,
            cert.c,
            cert.mu,
            cert.pw,
            cert.pwf,
            cert.lf,
            self.inflate,
            cert.majorant,
        )
        self.out.record(j, base, self.lo + self.e.size, self.g, t)
        self.out.src_env[j], self.out.src_star[j] = env + lev_j, p_star

    def run(self) -> None:
        """Rows 2..m, once ``src`` holds all its rows."""
        for j in range(2, self.cert.m + 1):
            self.row(j)

    def result(self) -> float:
        """log b^T E_m: the last row through the last draw's kernel."""
        if not math.isfinite(self.g):
            return -math.inf
        cert = self.cert
        x = (
            float(cert.pos[-1])
            - self.pos[self.lo : self.lo + self.e.size]
            - float(cert.gaps[cert.m])
        )
        live = self.e > 0.0
        if not live.any():
            return -math.inf
        # in logs: a row far from the kernel's peak would underflow as a product (a block's
        # intervals lie within span of its position: the kernel is at most e^draw_inflate
        # times its value there)
        v = np.log(self.e[live]) - cert.c * np.abs(x[live]) - cert.mu * x[live]
        top = float(v.max())
        grow = 0.0 if self.blocks is None else self.blocks.draw_inflate
        return self.g + top + math.log(float(np.sum(np.exp(v - top)))) + grow

    def remainder(self) -> float:
        """The max-norm bound on what this pass dropped, carried into the last draw."""
        if self.blocks is None:
            return self.cert._max_norm(self.out.t)
        smooth = self.cert.smoothed is not None  # (as the levels on the intervals)
        return self.blocks.remainder(self.out.t, float(self.cert.pos[-1]), smooth)


class LogLevel:
    """The last error pass, in logs over every interval (:mod:`exact_tail`): the sources of
    :class:`Level` and a transition no smaller, nothing dropped, so its result is the whole
    bound on what ``src`` dropped (``levels``: ``src`` is the forward rows)."""

    def __init__(self, cert: Certificate, src: Spans, levels: bool) -> None:
        self.cert, self.src, self.levels = cert, src, levels
        with np.errstate(divide="ignore"):
            self.lw = np.log(cert.w)
        n_1 = float(cert.gaps[0])
        self.le, self.lo = first_sources(
            cert.logw, cert.pos, n_1, cert.c, cert.mu, cert.g0, float(src.t[1]), math.inf
        )
        finite = self.le[np.isfinite(self.le)]
        far = max(abs(float(cert.pos[0]) - n_1), abs(float(cert.pos[-1]) - n_1))
        self.big = max(
            float(np.abs(finite).max()) if finite.size else 0.0,
            abs(cert.g0),
            (cert.c + abs(cert.mu)) * far,
        )
        self.ops = 2

    def run(self) -> None:
        """Rows 2..m."""
        for j in range(2, self.cert.m + 1):
            self.row(j)

    def row(self, j: int) -> None:
        """Row j (2 <= j <= m) from row j - 1."""
        if self.cert.stop.is_set():
            raise Cancelled
        cert, src = self.cert, self.src
        lev_j = math.log(j) if self.levels else 0.0
        env, p_star = envelope(self.cert, self.src, j)
        le, base, big = ET.log_error_row(
            self.le,
            self.lo,
            float(src.t[j]) + lev_j,
            int(src.lo[j]),
            env + lev_j,
            p_star,
            self.lw,
            cert.pos,
            float(cert.gaps[j - 1]),
            cert.c,
            cert.mu,
        )
        live = np.flatnonzero(le > -math.inf)
        a = int(live[0]) if live.size else le.size
        self.le, self.lo = le[a:], base + a
        self.big = max(self.big, big)
        self.ops += 2 * (le.size + 1) + 8

    def result(self) -> float:
        """log b^T E_m, without rounding (:meth:`rounding`)."""
        cert = self.cert
        t = float(cert.pos[-1]) - float(cert.gaps[cert.m])
        value, big = ET.log_result(self.le, self.lo, cert.pos, t, cert.c, cert.mu)
        self.big = max(self.big, big)
        self.ops += self.le.size + 4
        return value

    def rounding(self) -> float:
        """What the pass's log arithmetic can have lowered its result by (read after
        :meth:`result`)."""
        return ET.rounding(self.big, self.ops)


def _lse(values: list[float]) -> float:
    top = max(values)
    if top == -math.inf:
        return top
    return top + math.log(sum(math.exp(v - top) for v in values))

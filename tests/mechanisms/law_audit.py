"""Law-level audit of JointExp's interval-sequence sampler: exact output laws, not samples.

Two laws are computed for one input and compared in total variation:

* :func:`implementation_law`: the exact probability of every interval sequence the
  implementation (``app.mechanisms.jointexp``) outputs. The sampler's only randomness is
  ``rng.random()``, which returns ``k * 2^-53`` for a uniform integer ``k`` in
  ``[0, 2^53)``; everything else (forward rows, rebuilds after a guard trip) is a
  deterministic function of the inputs and of the blocks drawn so far. The walker replays
  the loop of ``sample_prepared_sequence`` with the real pass builders and the real
  ``draw_block``, but feeds the draws from a scripted uniform source and intercepts the two
  picks each draw makes (``inverse_cdf_pick`` for the interval, ``KG.pick_level`` for the
  repeat count). Both picks are monotone step functions of ``u``, so the set of ``k`` that
  gives one outcome is an integer range, whose ends bisection over ``k`` finds exactly
  (:func:`pick_law`, compiled; it calls the real pick functions). A depth-first search over
  every outcome of positive probability then yields the law exactly: each sequence's
  probability is a product of ratios ``count / 2^53``, formed in doubles (relative error
  < 10^-15).
* :func:`exact_law`: the paper's distribution ``P[s] ∝ exp(c u(s)) prod w(i_j) / γ(s)``,
  enumerated over every nondecreasing sequence of positive-width intervals in 50-digit
  mpmath arithmetic, from the support's original positions (no implementation function is
  used; the heavy-atom cut of the implementation is exact by proof, so the law on the
  original positions is the reference).

:func:`sample_walk` runs the same walker with a real generator and the real picks; it must
draw exactly what ``sample_prepared_sequence`` draws for the same seed, which guards the
walker against drifting from the real loop (:func:`walker_matches_sampler`).

The case generator (:func:`make_case`) and the forced sampling paths (:data:`PATHS`) are
shared by ``tests/mechanisms/test_law_audit.py`` and ``benchmarks/law_audit_sweep.py``.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import multiprocessing
import time
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import mpmath
import numba
import numpy as np

import app.mechanisms.jointexp as _jointexp_package
from app.mechanisms import sampling as _sampling
from app.mechanisms.fpmode import flush_subnormals
from app.mechanisms.histogram import GridHistogram, Support, support_from_grid
from app.mechanisms.jointexp import accept, strategy
from app.mechanisms.jointexp import draws as jd
from app.mechanisms.jointexp import kernels_log as _kernels
from app.mechanisms.jointexp import mechanism as jx
from app.mechanisms.validation import FloatArray, IntArray

#: Number of distinct values ``rng.random()`` returns: ``k * 2^-53`` for k in [0, 2^53).
GRID = 1 << 53
_ULP = 2.0**-53

# The real pick functions, bound at import (the walker patches the module attributes that
# ``draw_block`` looks up at call time; the law is always computed with these).
_REAL_INTERVAL_PICK = _sampling.inverse_cdf_pick
_NEG_INF = -np.inf


@numba.njit(nogil=True)
def old_pick_level(  # pragma: no cover - compiled
    levels: np.ndarray, ids: np.ndarray, nlev: int, v: int, log_space: bool, u: float
) -> int:
    """The repeat count (0-based level) at column v, drawn ∝ its entries with uniform u.

    ``levels[s]`` is level ``ids[s]`` (1-based repeat counts, ascending); levels that are not
    stored are 0.0 (linear) or -inf (log), and only levels 1..nlev count. Linear levels are
    used as they are; log levels are exponentiated relative to the column's largest. The
    stored levels are summed and scanned in order, so the draw is the one over the dense
    levels 1..nlev (a missing level adds exactly 0.0 and can never be picked). Returns the
    last positive level when rounding leaves ``u * total`` at the total, and -1 only when
    every entry is zero.
    """
    ns = 0  # stored levels at or below nlev
    while ns < ids.size and ids[ns] <= nlev:
        ns += 1
    mx = _NEG_INF
    if log_space:
        for s in range(ns):
            if levels[s, v] > mx:
                mx = levels[s, v]
        if mx == _NEG_INF:
            return -1
    total = 0.0
    for s in range(ns):
        total += math.exp(levels[s, v] - mx) if log_space else levels[s, v]
    target = u * total
    acc = 0.0
    last = -1
    for s in range(ns):
        x = math.exp(levels[s, v] - mx) if log_space else levels[s, v]
        if x > 0.0:
            acc += x
            last = int(ids[s]) - 1
            if acc > target:
                return last
    return last


_REAL_LEVEL_PICK = old_pick_level

Law = dict[tuple[int, ...], float]


# -- exact law of one pick ---------------------------------------------------------------------


@numba.njit(nogil=True)
def _pick(
    interval: bool,
    buf: np.ndarray,
    levels: np.ndarray,
    ids: np.ndarray,
    nlev: int,
    v: int,
    log_space: bool,
    k: int,
) -> int:
    u = float(k) * _ULP  # exact: k < 2^53
    if interval:
        return _REAL_INTERVAL_PICK(buf, u)
    return _REAL_LEVEL_PICK(levels, ids, nlev, v, log_space, u)


@numba.njit(nogil=True)
def _pick_law(
    interval: bool,
    buf: np.ndarray,
    levels: np.ndarray,
    ids: np.ndarray,
    nlev: int,
    v: int,
    log_space: bool,
    outcomes: np.ndarray,
    counts: np.ndarray,
) -> int:
    """Outcomes of a monotone pick over k in [0, 2^53) and how many k give each.

    Scans the outcomes in increasing order: from the first k of an outcome ``o``, bisection
    finds the first k whose pick exceeds ``o`` (the pick is nondecreasing in u: ``u * total``
    is monotone in u under rounding and the cumulative sums it is compared with are fixed).
    Returns the number of outcomes written. Raises if a later outcome is not larger, i.e.
    if the pick were not monotone (then the counts would be wrong).
    """
    n_out = 0
    k = 0
    o = _pick(interval, buf, levels, ids, nlev, v, log_space, 0)
    last = GRID - 1
    while True:
        if _pick(interval, buf, levels, ids, nlev, v, log_space, last) <= o:
            b = GRID
        else:
            lo, hi = k, last  # pick(lo) <= o < pick(hi)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if _pick(interval, buf, levels, ids, nlev, v, log_space, mid) <= o:
                    lo = mid
                else:
                    hi = mid
            b = hi
        outcomes[n_out] = o
        counts[n_out] = b - k
        n_out += 1
        if b == GRID:
            return n_out
        k = b
        nxt = _pick(interval, buf, levels, ids, nlev, v, log_space, k)
        if nxt <= o:
            raise ValueError("pick is not monotone in u")
        o = nxt


_NO_FLOATS = np.zeros((1, 1))
_NO_INTS = np.zeros(1, dtype=np.int64)


def pick_law(
    buf: FloatArray | None = None,
    *,
    levels: FloatArray | None = None,
    ids: IntArray | None = None,
    nlev: int = 0,
    v: int = 0,
    log_space: bool = False,
) -> list[tuple[int, int]]:
    """The exact law of one pick as ``[(outcome, number of k in [0, 2^53))]``, ascending.

    With ``buf``: ``inverse_cdf_pick(buf, k 2^-53)``; else ``KG.pick_level(levels, ids, nlev,
    v, log_space, k 2^-53)``. Counts sum to 2^53. Exact by bisection on the monotone pick.
    """
    interval = buf is not None
    size = (buf.size if interval else len(ids)) + 1  # type: ignore[arg-type,union-attr]
    outcomes = np.empty(size, dtype=np.int64)
    counts = np.empty(size, dtype=np.int64)
    n = _pick_law(
        interval,
        np.ascontiguousarray(buf, dtype=np.float64) if interval else _NO_FLOATS[0],
        _NO_FLOATS if levels is None else levels,
        _NO_INTS if ids is None else np.ascontiguousarray(ids, dtype=np.int64),
        nlev,
        v,
        log_space,
        outcomes,
        counts,
    )
    return [(int(outcomes[t]), int(counts[t])) for t in range(n)]


# -- the walker ----------------------------------------------------------------------------------


class _Script:
    """The uniform source of one scripted draw, and what its two picks saw.

    ``random()`` returns a placeholder (the intercepted picks ignore it) and counts calls;
    the interval pick returns ``forced`` (or its smallest outcome) and records its exact
    law; the level pick records its law and returns its smallest outcome.
    """

    def __init__(self, forced: int | None = None) -> None:
        self.forced = forced
        self.uniforms = 0
        self.interval_law: list[tuple[int, float]] | None = None
        self.level_law: list[tuple[int, float]] | None = None
        #: the shares the sampler computes for each outcome (the acceptance step's input)
        self.interval_shares: dict[int, tuple[float, float]] = {}
        self.level_shares: dict[int, tuple[float, float]] = {}
        self.bit_generator = self  # ``rng.bit_generator.random_raw()`` (the exact picks)

    def random(self) -> float:
        self.uniforms += 1
        return 0.5

    def random_raw(self) -> int:
        self.uniforms += 1
        return 0


_ACTIVE: list[_Script] = []  # the script of the draw in progress (exact mode)


def _probabilities(law: list[tuple[int, int]]) -> list[tuple[int, float]]:
    return [(o, cnt * _ULP) for o, cnt in law]


def exact_pick_law(weights: FloatArray) -> list[tuple[int, float]]:
    """The law of ``pick_weights``: index k with probability ``weights[k] / sum``, exactly
    (the sum of the doubles in exact rational arithmetic; subnormals count as 0.0, as the
    flushed passes and the picker treat them); zero weights are never picked."""
    vals = [Fraction(w) if w >= 2.0**-1022 else Fraction(0) for w in weights.tolist()]
    total = sum(vals, Fraction(0))
    return [(k, float(v / total)) for k, v in enumerate(vals) if v > 0]


def _intercept_exact(weights: FloatArray, word: int, rng: Any) -> int:
    """``pick_weights`` (the interval pick) in exact mode: records its law and returns the
    forced (or first) outcome."""
    script = _ACTIVE[-1]
    w = np.asarray(weights, dtype=np.float64)
    law = exact_pick_law(w)
    script.interval_law = law
    script.interval_shares = {k: _computed_share(w, k) for k, _ in law}
    return law[0][0] if script.forced is None else script.forced


_Share = tuple[float, float]  # (weight, compensated sum): a share as the sampler forms it


def _computed_share(weights: FloatArray, k: int) -> tuple[float, float]:
    """The share the sampler computes for outcome k (as ``draw_block`` and
    ``pick_repeat_level`` do): the weight and the compensated sum."""
    w = np.ascontiguousarray(weights, dtype=np.float64)
    return float(w[k]), float(_kernels.compensated_sum(w))


def _intercept_exact_level(
    levels: FloatArray,
    ids: IntArray,
    nlev: int,
    v: int,
    log_space: bool,
    word: int,
    rng: Any,
) -> tuple[int, tuple[float, float]]:
    """``jd.pick_repeat_level`` in exact mode: the same weights and repeat counts
    (``jd.repeat_level_weights``); records the law over repeat counts (0-based) and the
    shares the sampler computes, and returns the first with its share."""
    script = _ACTIVE[-1]
    weights, counts = jd.repeat_level_weights(levels, ids, nlev, v, log_space)
    picks = exact_pick_law(weights)
    law = [(int(counts[s]) - 1, p) for s, p in picks]
    script.level_law = law
    script.level_shares = {int(counts[s]) - 1: _computed_share(weights, s) for s, _ in picks}
    return law[0][0], script.level_shares[law[0][0]]


def _intercept_interval(buf: FloatArray, u: float) -> int:
    script = _ACTIVE[-1]
    w = np.array(buf, dtype=np.float64)
    law = _probabilities(pick_law(w))
    script.interval_law = law
    script.interval_shares = {k: _computed_share(w, k) for k, _ in law}
    return law[0][0] if script.forced is None else script.forced


def _intercept_level(
    levels: FloatArray, ids: IntArray, nlev: int, v: int, log_space: bool, u: float
) -> int:
    script = _ACTIVE[-1]
    law = pick_law(
        levels=np.ascontiguousarray(levels, dtype=np.float64),
        ids=ids,
        nlev=int(nlev),
        v=int(v),
        log_space=bool(log_space),
    )
    script.level_law = _probabilities(law)
    weights, counts = jd.repeat_level_weights(levels, ids, nlev, v, log_space)
    script.level_shares = {
        int(counts[s]) - 1: _computed_share(weights, s) for s in range(counts.size)
    }
    return law[0][0]


@contextlib.contextmanager
def _intercepted_picks() -> Iterator[None]:
    """``draw_block``'s picks routed to the recording wrappers (restored on exit).

    ``draw_block`` looks ``pick_weights`` up in its module at call time (both picks, exact
    with respect to the weights). A re-inserted older draw (the negative control) picks
    with ``inverse_cdf_pick`` and ``KG.pick_level`` over 53-bit uniforms instead: where
    those names are set on the modules they are intercepted too, and their laws counted
    over all 2^53 uniforms.
    """
    patches = [
        (jd, {"pick_weights": _intercept_exact, "pick_repeat_level": _intercept_exact_level})
    ]
    if hasattr(jx, "inverse_cdf_pick"):
        patches.append((jx, {"inverse_cdf_pick": _intercept_interval}))
    if hasattr(_kernels, "pick_level"):
        patches.append((_kernels, {"pick_level": _intercept_level}))
    with contextlib.ExitStack() as stack:
        for module, values in patches:
            stack.enter_context(_patched(module, values))
        yield


@dataclass
class _Walk:
    """One input with the options of ``sample_prepared_sequence``: the passes it builds."""

    inputs: Any  # jx.Inputs, already cut to the collapse cap
    gaps: FloatArray
    c: float
    force_log_space: bool
    budget: int
    log_kernel: str
    tilt: bool | float
    pos: IntArray = field(init=False)

    def __post_init__(self) -> None:
        self.pos = self.inputs.pos

    def _log_pass(self, keep: float | None, generation: int = 0) -> Any:
        i = self.inputs
        return jx.run_log_space(
            i.logw,
            i.pos,
            self.gaps,
            self.c,
            self.budget,
            keep,
            self.log_kernel,
            i.lw_ref,
            i,
            generation,
        )

    def certified(self, first: Any) -> Any:
        """The pass a sweep whose last block ``first`` drew is released from: ``first``, or
        the log pass one generation later where its certificate fails (as ``draw_sequence``,
        which checks it once the sweep's blocks are drawn)."""
        if jx.certificate_rejects(first):
            return self._log_pass(None, first.generation + 1)
        return first

    def first_pass(self) -> Any:
        """The forward pass the sampler starts with (as ``sample_prepared_sequence``)."""
        i = self.inputs
        if self.force_log_space:
            return self._log_pass(None)
        return jx.forward_pass(
            i.logw,
            i.pos,
            self.gaps,
            self.c,
            self.budget,
            self.log_kernel,
            self.tilt,
            i.lw_ref,
            i,
        )

    def draw(self, fwd: Any, j: int, i_end: int, pos_ref: int, source: Any) -> tuple[Any, Any]:
        """One block as the sampler's loop draws it, with its rebuilds on a guard trip.

        Returns the pass in use after the draw (rebuilt if a trip occurred) and the block
        (``jd.Block``: interval, repeat count, shares, log total).
        """
        nj = float(self.gaps[j])
        while True:
            try:
                blk = jx.draw_block(fwd, j, i_end, pos_ref, nj, source)
                return fwd, blk
            except jx.LinearGuardTripped as trip:
                self._no_uniform_drawn(source)
                retry_tilt = self.tilt is not False and not isinstance(trip, jx.SoundGuardTripped)
                retilted = (
                    jx.next_tilted_pass(fwd, self.budget, self.inputs) if retry_tilt else None
                )
                fwd = retilted or self._log_pass(None, fwd.generation + 1)
            except jx.LogGuardTripped as trip:
                self._no_uniform_drawn(source)
                fwd = self._log_pass(strategy.wider(fwd.keep, trip.needed_keep), fwd.generation + 1)

    @staticmethod
    def _no_uniform_drawn(source: Any) -> None:
        if isinstance(source, _Script) and source.uniforms:
            raise AssertionError("a draw tripped after drawing a uniform")


def _make_walk(
    inputs_or_support: Any,
    gaps: FloatArray,
    c: float,
    force_log_space: bool,
    budget: int,
    log_kernel: str,
    tilt: bool | float,
) -> _Walk:
    if isinstance(inputs_or_support, Support):
        inputs = jx.support_inputs(inputs_or_support)
    else:
        inputs = inputs_or_support
    gaps = np.asarray(gaps, dtype=np.float64)
    inputs = inputs.collapsed(jx.collapse_cap(gaps))
    return _Walk(inputs, gaps, float(c), force_log_space, budget, log_kernel, tilt)


def _branches(
    walk: _Walk, fwd: Any, j: int, i_end: int, pos_ref: int
) -> tuple[Any, float, list[tuple[int, int, float, _Share, _Share]]]:
    """Every (interval, repeat count, probability, interval share, level share) one draw
    can give, exactly, and the log of the draw's total normalised as the sampler takes
    it for the acceptance constant (meaningful for the last block).

    The first scripted call records the interval pick's law and, if the draw picks a level,
    the level law of the interval it was forced to; the draw is then repeated with the
    interval forced to each other outcome to record that interval's level law. Rebuilds
    happen only before a uniform is drawn, so the repeats see the same pass.
    """
    script = _Script()
    _ACTIVE.append(script)
    try:
        fwd, blk = walk.draw(fwd, j, i_end, pos_ref, script)
    finally:
        _ACTIVE.pop()
    i0, k0 = blk.i, blk.k
    log_z = blk.log_total + fwd.g0 - accept.tilt_constant(fwd.mu, int(walk.pos[-1]), walk.gaps)
    if script.uniforms != 2 or script.interval_law is None:
        raise AssertionError(f"a draw took {script.uniforms} uniforms (expected 2)")
    law = script.interval_law
    lo = i0 - law[0][0]
    out: list[tuple[int, int, float, _Share, _Share]] = []
    for t, (pick, p_pick) in enumerate(law):
        s_pick = script.interval_shares[pick]
        if script.level_law is None:  # no level pick in this draw (one level)
            if k0 != 1:
                raise AssertionError("repeat count without a level pick")
            out.append((lo + pick, 1, p_pick, s_pick, (1.0, 1.0)))
            continue
        if t == 0:
            levels, shares = script.level_law, script.level_shares
        else:
            again = _Script(forced=pick)
            _ACTIVE.append(again)
            try:
                same, blk1 = walk.draw(fwd, j, i_end, pos_ref, again)
            finally:
                _ACTIVE.pop()
            if same is not fwd or blk1.i != lo + pick or again.level_law is None:
                raise AssertionError("a repeated draw did not replay the first one")
            levels, shares = again.level_law, again.level_shares
        for lev, p_lev in levels:
            out.append((lo + pick, lev + 1, p_pick * p_lev, s_pick, shares[lev]))
    return fwd, log_z, out


@contextlib.contextmanager
def _patched(module: Any, values: Mapping[str, Any]) -> Iterator[None]:
    saved = {name: getattr(module, name) for name in values}
    for name, value in values.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


@contextlib.contextmanager
def patched_names(values: Mapping[str, Any]) -> Iterator[None]:
    """Each name set to its value in every module of the jointexp package that binds it
    (a constant is bound where it is defined and where it is imported), restored on exit."""
    with contextlib.ExitStack() as stack:
        for name, value in values.items():
            owners = [
                mod
                for mod in vars(_jointexp_package).values()
                if isinstance(mod, types.ModuleType)
                and mod.__name__.startswith(_jointexp_package.__name__ + ".")
                and hasattr(mod, name)
            ]
            if not owners:
                raise AttributeError(f"no jointexp module binds {name}")
            for mod in owners:
                stack.enter_context(_patched(mod, {name: value}))
        yield


def implementation_law(
    inputs_or_support: Any,
    gaps: FloatArray,
    c: float,
    *,
    force_log_space: bool = False,
    budget: int = jx.MEMORY_BUDGET_BYTES,
    log_kernel: str = "scaled",
    tilt: bool | float = True,
    stats: dict[str, float] | None = None,
) -> Law:
    """The exact law of ``sample_prepared_sequence``'s output for these inputs and options.

    ``stats``, when given, receives ``log_accept_max``: the largest log acceptance ratio
    over every proposal path (the acceptance constant covers every proposal where < 0).

    ``inputs_or_support``: a ``jx.Inputs`` or a :class:`Support` (its prepared inputs, as
    ``jointexp_core`` uses them). Every sequence of positive probability is a key; the
    values sum to 1 up to double rounding. Exact: the walk follows the sampler's loop with
    its real pass builders and draws, and each pick's law is counted over all 2^53 values
    of the uniform (:func:`pick_law`).
    """
    walk = _make_walk(inputs_or_support, gaps, c, force_log_space, budget, log_kernel, tilt)
    m = walk.gaps.size - 1
    n = int(walk.pos[-1])
    log_c = math.nan
    la_max = -math.inf
    kept: dict[tuple[int, ...], float] = {}

    def explore(
        fwd: Any, j: int, i_end: int, pos_ref: int, seq: list[int], p: float, sh: list[_Share]
    ) -> None:
        # Each proposal path is kept with the probability the sampler's acceptance step
        # gives it (computed from the shares the sampler computes on that path).
        nonlocal log_c, la_max
        if j == 0:
            prob = accept.ProbabilityProduct()
            for x in sh:
                prob.times(*x)
            arr = np.asarray(seq, dtype=np.int64)
            la = accept.log_acceptance(arr, walk.pos, walk.inputs.logw, walk.gaps, c, log_c, prob)
            la_max = max(la_max, la)
            key = tuple(seq)
            kept[key] = kept.get(key, 0.0) + p * min(1.0, math.exp(la))
            return
        fwd, log_z, branches = _branches(walk, fwd, j, i_end, pos_ref)
        if j == m:
            released = walk.certified(fwd)
            if released is not fwd:  # the sweep's draws are discarded: the same law
                fwd, log_z, branches = _branches(walk, released, j, i_end, pos_ref)
            log_c = log_z + accept.acceptance_margin(m, walk.c, n)
        for i, k, q, s_i, s_l in branches:
            nxt = seq.copy()
            nxt[j - k : j] = [i] * k
            explore(fwd, j - k, i, int(walk.pos[i]), nxt, p * q, [*sh, s_i, s_l])

    with flush_subnormals(), _intercepted_picks():
        fwd = walk.first_pass()
        explore(fwd, m, walk.pos.size, n, [0] * m, 1.0, [])
    if stats is not None:
        stats["log_accept_max"] = la_max
    # every attempt proposes from the same law: the output law is the kept mass, normalised
    total = math.fsum(kept.values())
    return {key: v / total for key, v in kept.items()}


def sample_walk(
    inputs_or_support: Any,
    gaps: FloatArray,
    c: float,
    rng: np.random.Generator,
    *,
    force_log_space: bool = False,
    budget: int = jx.MEMORY_BUDGET_BYTES,
    log_kernel: str = "scaled",
    tilt: bool | float = True,
) -> IntArray:
    """The walker in sample mode: one sequence drawn with ``rng`` and the real picks.

    Must equal ``sample_prepared_sequence`` with the same generator state (the walker
    replays the sampler's loop; :func:`walker_matches_sampler`).
    """
    walk = _make_walk(inputs_or_support, gaps, c, force_log_space, budget, log_kernel, tilt)
    m = walk.gaps.size - 1
    n = int(walk.pos[-1])
    log_c = math.nan
    with flush_subnormals():
        first = walk.first_pass()
        while True:  # attempts, each from the first pass, until one is kept
            start = first
            while True:  # sweeps, until the pass that drew the last block is certified
                seq = np.empty(m, dtype=np.int64)
                prob = accept.ProbabilityProduct()
                fwd, last = start, start
                j, i_end, pos_ref = m, walk.pos.size, n
                while j > 0:
                    fwd, blk = walk.draw(fwd, j, i_end, pos_ref, rng)
                    if j == m:
                        last = fwd
                        log_z = blk.log_total + fwd.g0 - accept.tilt_constant(fwd.mu, n, walk.gaps)
                    prob.times(*blk.p_interval)
                    prob.times(*blk.p_level)
                    seq[j - blk.k : j] = blk.i
                    j -= blk.k
                    i_end, pos_ref = blk.i, int(walk.pos[blk.i])
                released = walk.certified(last)
                if released is last:
                    break
                start = first = released
            if math.isnan(log_c):
                log_c = log_z + accept.acceptance_margin(m, walk.c, n)
            la = accept.log_acceptance(seq, walk.pos, walk.inputs.logw, walk.gaps, c, log_c, prob)
            if la >= 0.0 or rng.random() < math.exp(la):
                return seq


# -- the paper's law, independently --------------------------------------------------------------


def exact_law(
    positions: IntArray,
    widths: FloatArray,
    gaps: FloatArray,
    c: float,
    *,
    log_widths: bool = False,
    dps: int = 50,
) -> Law:
    """The paper's JointExp law over interval sequences, enumerated in ``dps``-digit mpmath.

    ``P[s] ∝ exp(c u(s)) prod_j w(i_j) / γ(s)`` over every nondecreasing ``s = (i_1 <= ..
    <= i_m)`` of positive-width intervals, ``u(s) = -sum_{j=1}^{m+1} |(P_{i_j} - P_{i_{j-1}})
    - n_j|`` with ``P_{i_0} = 0`` and ``P_{i_{m+1}} = n = positions[-1]``, ``γ(s)`` the
    product of ``count!`` over the distinct intervals of ``s``. The doubles given (widths or
    their logs, gap targets ``n_j``, ``c``) are taken as exact numbers; ``u(s)`` is then exact
    in 50 digits (integers and doubles below 2^60), and only the exponentials round (to
    ~10^-50). Uses no implementation code.
    """
    with mpmath.workdps(dps):
        pos = [int(p) for p in positions]
        n = pos[-1]
        lw: dict[int, Any] = {}
        for t, w in enumerate(np.asarray(widths, dtype=np.float64).tolist()):
            if log_widths:
                if w != -math.inf:
                    lw[t] = mpmath.mpf(w)
            elif w > 0.0:
                lw[t] = mpmath.log(mpmath.mpf(w))
        targets = [mpmath.mpf(float(g)) for g in np.asarray(gaps, dtype=np.float64)]
        m = len(targets) - 1
        cc = mpmath.mpf(float(c))
        log_fact = [mpmath.log(mpmath.factorial(k)) for k in range(m + 1)]
        logs: dict[tuple[int, ...], Any] = {}
        for s in itertools.combinations_with_replacement(sorted(lw), m):
            prev = 0
            cost = mpmath.mpf(0)
            for j, t in enumerate(s):
                cost += abs((pos[t] - prev) - targets[j])
                prev = pos[t]
            cost += abs((n - prev) - targets[m])
            val = -cc * cost + mpmath.fsum(lw[t] for t in s)
            for run in (len(list(g)) for _, g in itertools.groupby(s)):
                val -= log_fact[run]
            logs[s] = val
        if not logs:
            return {}
        top = max(logs.values())
        weights = {s: mpmath.exp(v - top) for s, v in logs.items()}
        total = mpmath.fsum(weights.values())
        return {s: float(w / total) for s, w in weights.items()}


def total_variation(
    p: Mapping[tuple[int, ...], float], q: Mapping[tuple[int, ...], float]
) -> float:
    """``(1/2) sum |p(s) - q(s)|`` over the union of both supports."""
    keys = set(p) | set(q)
    return 0.5 * math.fsum(abs(p.get(s, 0.0) - q.get(s, 0.0)) for s in keys)


def rounding_scale(
    positions: IntArray, gaps: FloatArray, c: float, law: Mapping[tuple[int, ...], float]
) -> float:
    """Diagnostic: the expected size, under ``law``, of one rounding per kernel exponent.

    ``E_s[2^-53 sum_j c |D_j(s) - n_j|]`` on the positions with every step cut to
    ``ceil(max n_j)`` (the heavy-atom cut, which does not change the law): the relative
    error of a sequence's weight when each row's exponent ``c |D - n_j|`` is rounded once, as
    any double evaluation of the kernel does. A TV far below it is as exact as doubles
    allow; a TV far above it is not explained by rounding of the exponents.
    """
    cap = math.ceil(float(np.max(gaps)))
    steps = np.minimum(np.diff(np.asarray(positions, dtype=np.int64)), cap)
    pos = np.concatenate(([0], np.cumsum(steps)))
    n = int(pos[-1])
    m = len(gaps) - 1
    total = 0.0
    for s, p in law.items():
        prev, cost = 0, 0.0
        for j, t in enumerate(s):
            cost += abs((int(pos[t]) - prev) - float(gaps[j]))
            prev = int(pos[t])
        cost += abs((n - prev) - float(gaps[m]))
        total += p * c * cost
    return total * _ULP


# -- consistency of the walker with the sampler --------------------------------------------------


def walker_matches_sampler(
    sup: Support, seed: int, *, patches: Mapping[str, Any] | None = None, **options: Any
) -> tuple[bool, IntArray, IntArray]:
    """Run :func:`sample_walk` and ``sample_prepared_sequence`` from ``default_rng(seed)``.

    Returns whether both drew the same sequence and left their generators in the same state
    (same number of uniforms consumed), and the two sequences.
    """
    gaps, c = mechanism_parameters(sup)
    with patched_names(patches or {}):
        rng_a, rng_b = np.random.default_rng(seed), np.random.default_rng(seed)
        a = sample_walk(sup, gaps, c, rng_a, **options)
        b = jx.sample_prepared_sequence(jx.support_inputs(sup), gaps, c, rng_b, **options)
    same = bool(np.array_equal(a, b)) and rng_a.random() == rng_b.random()
    return same, a, np.asarray(b)


# -- cases and paths -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Path:
    """One forced sampling path: options of ``sample_prepared_sequence`` and module patches."""

    name: str
    options: Mapping[str, Any]
    patches: Mapping[str, Any] = field(default_factory=dict)
    tilt_fraction: float | None = None  # forced tilt mu = fraction * c (per case)

    def options_for(self, c: float) -> dict[str, Any]:
        opts = dict(self.options)
        if self.tilt_fraction is not None:
            opts["tilt"] = self.tilt_fraction * c
        return opts


PATHS: tuple[Path, ...] = (
    Path("default", {}),
    Path("untilted", {"tilt": False}),
    Path("tilt_0.5c", {}, tilt_fraction=0.5),
    Path("tilt_0.9c", {}, tilt_fraction=0.9),
    Path("log_scaled", {"force_log_space": True, "log_kernel": "scaled"}),
    Path("log_ext", {"force_log_space": True, "log_kernel": "ext"}),
    Path("log_log", {"force_log_space": True, "log_kernel": "log"}),
    # 0 bytes: every row past the first is over budget: checkpoints, recomputed blocks
    Path("budget_0", {"budget": 0}),
    # every row past the first compacted (level 1 and the sum; draws replay the levels)
    Path("compact", {}, patches={"COMPACT_FROM_BYTES": 0}),
)
PATH_NAMES = tuple(p.name for p in PATHS)


def mechanism_parameters(sup: Support) -> tuple[FloatArray, float]:
    """The gap targets n_j and c = eps / (2 Δ) as the mechanism forms them (doubles).

    Both laws are taken at these doubles, so rounding in forming the parameters is not
    counted as a difference between the laws.
    """
    c = sup.epsilon / (2.0 * jx.jointexp_sensitivity(sup.quantiles, sup.neighbors))
    return jx.quantile_gaps(sup.quantiles, sup.n), c


@dataclass(frozen=True)
class Case:
    """One audited input: its support and a readable description."""

    index: int
    support: Support
    description: str


def _quantiles(rng: np.random.Generator, m: int) -> np.ndarray:
    style = rng.random()
    if style < 0.25 and m >= 2:  # two close quantiles
        base = rng.uniform(0.05, 0.9)
        q = [base, base + rng.choice([1e-4, 1e-3, 1e-7])]
        q += list(rng.uniform(0.01, 0.99, m - 2))
    elif style < 0.4:
        q = [(t + 1) / (m + 1) for t in range(m)]
    else:
        q = list(rng.uniform(0.001, 0.999, m))
    qs = np.unique(np.asarray(q, dtype=np.float64))
    while qs.size < m:  # (ties from the random draw: vanishingly rare)
        qs = np.unique(np.concatenate([qs, rng.uniform(0.001, 0.999, 1)]))
    return qs[:m]


def _counts(rng: np.random.Generator, d: int) -> np.ndarray:
    style = rng.random()
    if style < 0.3:  # small counts
        return rng.integers(1, 6, d)
    if style < 0.6:  # log-uniform 1 .. 10^6
        return np.floor(10.0 ** rng.uniform(0.0, 6.0, d)).astype(np.int64)
    counts = rng.integers(1, 30, d)  # heavy atoms among light values
    heavy = rng.choice(d, size=int(rng.integers(1, min(d, 2) + 1)), replace=False)
    counts[heavy] = np.floor(10.0 ** rng.uniform(3.0, 6.0, heavy.size)).astype(np.int64)
    return counts


def make_case(seed: int, index: int, *, max_intervals: int = 7, max_m: int = 3) -> Case:
    """Case ``index`` of the sweep with ``seed`` (its own generator ``default_rng([seed,
    index])``: the same input on any checkout and in any order).

    Grid histograms (integer widths, up to 2^40 grid points, cells at the grid's ends) or
    raw values (real widths, spacings from 10^-12 to 10, mass clamped to either bound), d + 1
    <= ``max_intervals`` intervals, counts from 1 to 10^6 per distinct value (heavy atoms),
    m <= ``max_m`` quantiles (random, evenly spaced, or two within 10^-7..10^-3), epsilon
    log-uniform in [10^-3, 100], swap or add/remove.
    """
    rng = np.random.default_rng([seed, index])
    d = int(rng.integers(1, max_intervals))  # d + 1 <= max_intervals intervals
    m = int(rng.integers(1, max_m + 1))
    q = _quantiles(rng, m)
    eps = float(10.0 ** rng.uniform(-3.0, 2.0))
    nb = "swap" if rng.random() < 0.5 else "add_remove"
    counts = _counts(rng, d)
    if rng.random() < 0.5:
        k1 = int(2 ** rng.uniform(math.log2(d + 1), 40.0))
        k1 = max(k1, d + 1)
        cells = np.sort(rng.choice(k1, size=d, replace=False)) if k1 < 10**6 else None
        if cells is None:  # choice over a huge range: distinct by rejection
            cells = np.unique(rng.integers(0, k1, d))
            while cells.size < d:
                cells = np.unique(np.concatenate([cells, rng.integers(0, k1, 1)]))
        if rng.random() < 0.2:
            cells[0] = 0  # zero-width first interval
        if rng.random() < 0.2:
            cells[-1] = k1 - 1
        cells = np.unique(cells)
        counts = counts[: cells.size]
        hist = GridHistogram(cells.astype(np.int64), counts.astype(np.int64), k1)
        sup = support_from_grid(hist, q, epsilon=eps, neighbors=nb)
        desc = (
            f"grid cells={cells.tolist()} counts={counts.tolist()} grid_points={k1} "
            f"q={q.tolist()} eps={eps!r} neighbors={nb}"
        )
        return Case(index, sup, desc)
    sup, desc = _values_support(rng, d, counts, q, eps, nb)
    return Case(index, sup, desc)


def _values_support(
    rng: np.random.Generator,
    d: int,
    counts: np.ndarray,
    q: np.ndarray,
    eps: float,
    nb: str,
) -> tuple[Support, str]:
    """Raw-value support: distinct values with real spacings (down to 10^-12), bounds and
    clamped mass. Built with ``support_from_values`` when n is small (the real validation
    and clamping), else directly from (edges, cum), which is what it would build."""
    from app.mechanisms.histogram import support_from_values
    from app.mechanisms.validation import check_epsilon, check_neighbors, check_quantiles

    spacing = 10.0 ** rng.uniform(-12.0, 1.0, d + 1)
    if rng.random() < 0.3:
        spacing = np.full(d + 1, 10.0 ** rng.uniform(-12.0, 1.0))  # even spacing
    base = float(rng.uniform(-5.0, 5.0))
    edges = base + np.cumsum(np.concatenate(([0.0], spacing)))  # a, values..., b
    values = edges[1 : d + 1].copy()
    lo, hi = float(edges[0]), float(edges[-1])
    clamp_lo = rng.random() < 0.2
    clamp_hi = rng.random() < 0.2 and not (clamp_lo and d == 1)  # (lower < upper)
    if clamp_lo:
        lo = float(values[0])  # the first value's points lie on/beyond the bound
    if clamp_hi:
        hi = float(values[-1])
    n = int(counts.sum())
    desc = (
        f"values={values.tolist()} counts={counts.tolist()} lower={lo!r} upper={hi!r} "
        f"q={q.tolist()} eps={eps!r} neighbors={nb}"
    )
    if n <= 20_000:
        data = np.repeat(values, counts)
        if clamp_lo:  # half of the first value's points beyond the bound, clamped onto it
            first = np.flatnonzero(data == values[0])
            data[first[: first.size // 2]] = lo - 1.0
        if clamp_hi:
            last = np.flatnonzero(data == values[-1])
            data[last[: last.size // 2]] = hi + 2.0
        rng.shuffle(data)
        sup = support_from_values(data, q, epsilon=eps, lower=lo, upper=hi, neighbors=nb)
        return sup, desc
    e = np.concatenate(([lo], values, [hi]))
    cum = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    sup = Support(
        edges=e,
        cum=cum,
        quantiles=check_quantiles(q),
        epsilon=check_epsilon(eps),
        neighbors=check_neighbors(nb),
        grid=False,
    )
    return sup, desc


def reproducer_case(counts: tuple[int, int, int], index: int = -1) -> Case:
    """The grid family of issue 27: cells [0, 1, 2] with these counts, 3 grid points,
    quantile 0.5, epsilon 1, swap. For counts (a, b, a - 1), b odd, P(grid point 1) =
    0.3775 (0.2689 for the neighbour (a, b + 1, a - 2)) once a is ~100 or more."""
    hist = GridHistogram(np.array([0, 1, 2]), np.array(counts, dtype=np.int64), 3)
    sup = support_from_grid(hist, [0.5], epsilon=1.0, neighbors="swap")
    return Case(index, sup, f"reproducer grid counts={list(counts)} grid_points=3")


#: (a, b) of the family (counts (a, b, a - 1)), 10 .. 10^6; the old draw (before the fix of
#: issue 27) fails on (853, 7273) and (1673, 21051) and on their neighbours
REPRODUCER_PAIRS: tuple[tuple[int, int], ...] = (
    (11, 7),
    (25, 301),
    (853, 7273),
    (1673, 21051),
    (4000, 999),
    (12345, 54321),
    (99999, 777777),
    (1000000, 999999),
)


# -- auditing ------------------------------------------------------------------------------------


@dataclass
class PathResult:
    """One case on one path: its TV and both laws (for the report)."""

    path: str
    tv: float
    implementation: Law
    reference: Law
    #: the largest log acceptance ratio over every proposal path (< 0: the acceptance
    #: constant covered every proposal, so the kept law is the exact one)
    log_accept_max: float = -math.inf


def reference_law(sup: Support) -> Law:
    """:func:`exact_law` of the support's original (uncut) positions and widths."""
    gaps, c = mechanism_parameters(sup)
    return exact_law(sup.cum, sup.widths, gaps, c)


def audit(
    case: Case,
    paths: tuple[Path, ...] = PATHS,
    reference: Law | None = None,
) -> list[PathResult]:
    """Both laws of ``case`` on each path, and their total variation."""
    sup = case.support
    gaps, c = mechanism_parameters(sup)
    ref = reference_law(sup) if reference is None else reference
    out = []
    for path in paths:
        stats: dict[str, float] = {}
        with patched_names(path.patches):
            impl = implementation_law(sup, gaps, c, stats=stats, **path.options_for(c))
        tv = total_variation(impl, ref)
        out.append(PathResult(path.name, tv, impl, ref, stats["log_accept_max"]))
    return out


@dataclass(frozen=True)
class CaseRow:
    """One case on one path in a sweep: TV, seconds, the rounding scale (computed only
    for a TV over ``tv_max``; 0.0 otherwise) and the largest log acceptance ratio."""

    index: int
    path: str
    tv: float
    seconds: float
    scale: float
    log_accept_max: float = -math.inf


def run_case(
    seed: int, index: int, max_intervals: int = 7, max_m: int = 3, tv_max: float = 1e-12
) -> list[CaseRow]:
    """Case ``index`` of the sweep ``seed`` on every path (one reference law for all)."""
    case = make_case(seed, index, max_intervals=max_intervals, max_m=max_m)
    sup = case.support
    gaps, c = mechanism_parameters(sup)
    ref = reference_law(sup)
    rows = []
    for path in PATHS:
        t0 = time.perf_counter()
        (res,) = audit(case, paths=(path,), reference=ref)
        dt = time.perf_counter() - t0
        scale = rounding_scale(sup.cum, gaps, c, ref) if res.tv > tv_max else 0.0
        rows.append(CaseRow(index, path.name, res.tv, dt, scale, res.log_accept_max))
    return rows


def _run_job(job: tuple[int, int, int, int, float]) -> list[CaseRow]:
    return run_case(*job)


def sweep(
    seed: int,
    indices: list[int],
    *,
    max_intervals: int = 7,
    max_m: int = 3,
    tv_max: float = 1e-12,
    workers: int = 1,
) -> list[CaseRow]:
    """:func:`run_case` over ``indices``, in ``workers`` forked processes (1: in this one).

    The cases are independent and each is a pure function of (seed, index), so the rows are
    the same for any number of workers.
    """
    jobs = [(seed, i, max_intervals, max_m, tv_max) for i in indices]
    if workers <= 1:
        return [r for job in jobs for r in _run_job(job)]
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        return [r for rows in pool.map(_run_job, jobs, chunksize=16) for r in rows]


def paths_for(index: int, per_case: int) -> tuple[Path, ...]:
    """The paths case ``index`` runs when each case takes ``per_case`` of them in rotation
    (all of them when ``per_case >= len(PATHS)``)."""
    if per_case >= len(PATHS):
        return PATHS
    start = (index * per_case) % len(PATHS)
    return tuple(PATHS[(start + t) % len(PATHS)] for t in range(per_case))


def describe_failure(case: Case, result: PathResult) -> str:
    """The case's inputs and both laws, for a failure message."""
    keys = sorted(set(result.implementation) | set(result.reference))
    rows = [
        f"  {s}: implementation={result.implementation.get(s, 0.0)!r} "
        f"exact={result.reference.get(s, 0.0)!r}"
        for s in keys
    ]
    return "\n".join(
        [f"case {case.index} path {result.path} TV={result.tv!r}", f"  {case.description}", *rows]
    )


__all__ = [
    "GRID",
    "PATHS",
    "PATH_NAMES",
    "REPRODUCER_PAIRS",
    "Case",
    "CaseRow",
    "Law",
    "Path",
    "PathResult",
    "audit",
    "describe_failure",
    "exact_law",
    "implementation_law",
    "make_case",
    "mechanism_parameters",
    "paths_for",
    "pick_law",
    "reference_law",
    "reproducer_case",
    "rounding_scale",
    "run_case",
    "sample_walk",
    "sweep",
    "total_variation",
    "walker_matches_sampler",
]

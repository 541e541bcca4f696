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
``alpha(j, i, k)`` (mass of length-j prefixes ending in exactly k copies of i), computed
without the O(m^2 n) table. This module runs the passes in order, from the fastest that
can hold the law's range to the one that always can: linear rows; tilted linear rows
where a probe says they hold (:mod:`~app.mechanisms.jointexp.strategy`, speed only); the
log pass, widened until every row and draw has range. The recursions are in
:mod:`~app.mechanisms.jointexp.forward`, the range rule in
:mod:`~app.mechanisms.jointexp.range_rule`, the draws in
:mod:`~app.mechanisms.jointexp.draws`, the rows and the heavy-atom cut in
:mod:`~app.mechanisms.jointexp.rows`, their storage in
:mod:`~app.mechanisms.jointexp.storage`.

Complexity: O(n log n) to sort and count (raw call; none for a histogram), then O(d) per
quantile and row for the forward pass (O(row support) in the common case; plus O(d) per
surviving repeat level) and O(d) per sampled block; memory the budget plus O(d sqrt(m)).
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
from numpy.typing import ArrayLike

from app.mechanisms.errors import MechanismInputError
from app.mechanisms.fpmode import flush_subnormals
from app.mechanisms.histogram import Support, support_from_values
from app.mechanisms.jointexp.accept import (
    ProbabilityProduct,
    acceptance_margin,
    log_acceptance,
    run_parameter,
    tilt_constant,
)
from app.mechanisms.jointexp.draws import certificate_rejects, draw_block
from app.mechanisms.jointexp.forward import Forward
from app.mechanisms.jointexp.range_rule import (
    LINEAR_RANGE,
    LinearGuardTripped,
    LogGuardTripped,
    SoundGuardTripped,
    log_kappa,
    median_log_width,
    range_room,
)
from app.mechanisms.jointexp.rows import Inputs, collapse_cap
from app.mechanisms.jointexp.storage import MEMORY_BUDGET_BYTES
from app.mechanisms.jointexp.strategy import (
    PROBE_KEEP,
    choose_tilt,
    keep_after,
    tilt_candidates,
    wider,
)
from app.mechanisms.registry import Mechanism, PrivacyNotion, bounded_range_rho
from app.mechanisms.rng import make_rng
from app.mechanisms.validation import FloatArray, IntArray


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


def probe_tilt(probe: Forward) -> float:
    """The tilt a probe's rows ask for (:func:`~app.mechanisms.jointexp.strategy.choose_tilt`,
    speed only: the tilted pass checks its own range), 0.0 when none holds."""
    prof = probe.profile
    c, n1, lw_ref = probe.c, probe.n1, probe.lw_ref
    return choose_tilt(
        c,
        probe.gaps,
        prof.gmaxes,
        prof.modes,
        prof.pos,
        prof.values,
        probe.linear_floor,
        probe.headroom,
        lambda mu: log_kappa(c, mu, n1) + lw_ref,
    )


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
    generation: int = 0,
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
        keep = keep_after(run_probe(logw, pos, gaps, c, log_kernel, lw_ref, inputs).needed_keep)
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
            generation=generation,
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
    generation: int = 0,
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
        generation=generation,
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
    chosen = fwd.mu if fwd.mu else probe_tilt(fwd)
    for mu_try in tilt_candidates(
        fwd.c, chosen, fwd.pos, fwd.gaps, range_room(fwd.pos.size, fwd.gaps.size - 1), LINEAR_RANGE
    ):
        if mu_try <= fwd.mu:
            continue
        tilted = tilted_pass(
            fwd.logw,
            fwd.pos,
            fwd.gaps,
            fwd.c,
            budget,
            mu_try,
            fwd.lw_ref,
            inputs,
            fwd.generation + 1,
        )
        if tilted is not None:
            return tilted  # (if its draws trip too, the next call goes further)
    return None


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

    ``tilt``: True chooses a tilt from the probe (:func:`probe_tilt`), False never
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
        mu = probe_tilt(fwd) if tilt else 0.0
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
        m = gaps.size - 1
        if force_log_space or inputs.narrow:
            fwd = run_log_space(logw, pos, gaps, c, budget, None, log_kernel, lw_ref, inputs)
        else:
            fwd = forward_pass(logw, pos, gaps, c, budget, log_kernel, tilt, lw_ref, inputs)
        # The backward draws propose a sequence; the acceptance step keeps it with
        # probability W(s) / (C P̂(s)), which makes the law the exact one wherever the
        # draws' probability is within the margin of it (:mod:`.accept`).
        n = int(pos[-1])
        margin = acceptance_margin(m, c, n)
        # Every attempt starts from the same first pass (a rebuild is a function of the
        # draws before it), so every attempt proposes from the same law.
        log_c: float | None = None
        while True:
            seq, prob, _, log_z = draw_sequence(fwd, inputs, gaps, c, rng, budget, log_kernel, tilt)
            if log_c is None:
                log_c = log_z + margin
            la = log_acceptance(seq, pos, logw, gaps, c, log_c, prob)
            if la >= 0.0 or rng.random() < math.exp(la):
                return seq


def draw_sequence(
    fwd: Forward,
    inputs: Inputs,
    gaps: FloatArray,
    c: float,
    rng: np.random.Generator,
    budget: int,
    log_kernel: str,
    tilt: bool | float,
) -> tuple[IntArray, ProbabilityProduct, Forward, float]:
    """One backward sweep: the sequence, the probability the draws gave it, the pass in
    use at the end (rebuilt where a draw lacked range), and the log of the normaliser
    computed by the pass that drew the last block (untilted, in the units of ``logw``).

    A tilted pass that drew the last block is released from only if its certificate holds
    (:func:`~app.mechanisms.jointexp.draws.certificate_rejects`, a function of the data
    alone, checked once its blocks are drawn so that its error passes finish meanwhile);
    else the sweep is redone from the log pass, one generation later."""
    while True:
        # (a pass whose certificate an earlier attempt found failing is not drawn from)
        if not certificate_rejects(fwd):
            seq, prob, end, log_z, first = _sweep(
                fwd, inputs, gaps, c, rng, budget, log_kernel, tilt
            )
            if end is not first:
                end.abandon()  # rebuilt mid-sweep: nothing reads its certificate
            if not certificate_rejects(first):
                return seq, prob, end, log_z
            fwd = first
        fwd = run_log_space(
            inputs.logw,
            inputs.pos,
            gaps,
            c,
            budget,
            None,
            log_kernel,
            inputs.lw_ref,
            inputs,
            fwd.generation + 1,
        )


def _sweep(
    fwd: Forward,
    inputs: Inputs,
    gaps: FloatArray,
    c: float,
    rng: np.random.Generator,
    budget: int,
    log_kernel: str,
    tilt: bool | float,
) -> tuple[IntArray, ProbabilityProduct, Forward, float, Forward]:
    """:func:`draw_sequence`'s sweep, and the pass that drew its last block."""
    logw, pos, lw_ref = inputs.logw, inputs.pos, inputs.lw_ref
    m = gaps.size - 1
    first = fwd
    seq = np.empty(m, dtype=np.int64)
    prob = ProbabilityProduct()
    log_z = math.nan
    j, i_end, pos_ref = m, logw.size, int(pos[-1])
    try:
        while j > 0:
            try:
                blk = draw_block(fwd, j, i_end, pos_ref, float(gaps[j]), rng)
            except LinearGuardTripped as trip:
                # a larger tilt while one is worth it (as the forward pass retries; never
                # with tilt=False, nor after the sound bound tripped), then the log pass;
                # either way the same step with exact weights: nothing was drawn
                fwd.abandon()
                retry_tilt = tilt is not False and not isinstance(trip, SoundGuardTripped)
                retilted = next_tilted_pass(fwd, budget, inputs) if retry_tilt else None
                fwd = retilted or run_log_space(
                    logw, pos, gaps, c, budget, None, log_kernel, lw_ref, inputs, fwd.generation + 1
                )
                continue
            except LogGuardTripped as trip:
                fwd.abandon()
                keep = wider(fwd.keep, trip.needed_keep)
                fwd = run_log_space(
                    logw, pos, gaps, c, budget, keep, log_kernel, lw_ref, inputs, fwd.generation + 1
                )
                continue
            if j == m:
                # the last block's total is the pass's normaliser on its common scale: back to
                # the units of logw (row 1's maximum) and untilted
                log_z = blk.log_total + fwd.g0 - tilt_constant(fwd.mu, int(pos[-1]), gaps)
                first = fwd
            prob.times(*blk.p_interval)
            prob.times(*blk.p_level)
            i, k = blk.i, blk.k
            seq[j - k : j] = i
            j -= k
            i_end, pos_ref = i, int(pos[i])
    except BaseException:
        # the release failed: nothing will read a certificate (their threads stop)
        first.halt()
        fwd.halt()
        raise
    return seq, prob, fwd, log_z, first


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
    delta_u = jointexp_sensitivity(sup.quantiles, sup.neighbors)
    m = int(np.asarray(sup.quantiles).size)
    try:  # lowered by the floating-point slack (docs/mechanisms.md, "The acceptance step")
        c = run_parameter(
            sup.epsilon / (2.0 * delta_u), m, sup.n, delta_u, sup.neighbors == "add_remove"
        )
    except ValueError as exc:
        raise MechanismInputError("epsilon", str(exc)) from exc
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
    zcdp_fn=lambda epsilon, _delta, _m: bounded_range_rho(epsilon),
    zcdp_basis="one exponential mechanism, density exp(epsilon u / (2 Delta_u)) on a "
    "data-independent base measure: epsilon-bounded-range, rho = epsilon^2/8",
)

__all__: list[str] = [
    "JOINTEXP",
    "jointexp",
    "jointexp_core",
    "jointexp_sensitivity",
    "quantile_gaps",
    "sample_interval_sequence",
]

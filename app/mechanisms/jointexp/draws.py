"""JointExp's backward draws: (interval, repeat count) block by block from the forward rows.

The last block is drawn from ``alpha(m, i, k) r^|n - P_i - n_{m+1}|``, then block by block
from ``alpha(j, i, k) r^|P_next - P_i - n_{j+1}|`` over ``i < i_next``: the interval exactly
in proportion to its weight summed over k, then k from that interval's levels (two raw
64-bit words per block, :func:`~app.mechanisms.sampling.pick_weights`). Before any word is
drawn the weights are checked against the rows' truncation floors (the range rule, and for
untilted passes the sound error bound); a draw that lacks range raises, the caller
rebuilds the pass with more range and retries the same step, so no draw is discarded.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from app.mechanisms.jointexp import kernels_linear as KL
from app.mechanisms.jointexp import kernels_log as KG
from app.mechanisms.jointexp.forward import Forward
from app.mechanisms.jointexp.range_rule import (
    LinearGuardTripped,
    LogGuardTripped,
    SoundGuardTripped,
)
from app.mechanisms.jointexp.rows import repeat_level_ids, summed_levels
from app.mechanisms.jointexp.storage import stored_levels_at
from app.mechanisms.sampling import pick_weights
from app.mechanisms.validation import FloatArray, IntArray

#: The smallest largest-weight a linear draw accepts (in the scaled units its weights are
#: formed in) at moderate ε: the weights it loses, products below the smallest normal double
#: flushed to 0.0, are then each < 2^-1022 and, fewer than 2^30 of them, < 2^-92 of it
#: together. A pass's own floor (``Forward.tiny_draw``, :func:`~.range_rule.tiny_draw`)
#: rises with ε so that the loss stays within the release's δ. Kernel factors are never
#: dropped while their scaled value is a normal double
#: (:func:`~app.mechanisms.jointexp.kernels_linear.step_weights_linear`); below the floor the
#: draw's weights are formed in log space instead.
TINY_DRAW = 2.0**-900


class Block(NamedTuple):
    """One drawn block: the interval, its repeat count (1-based), the shares the two picks
    gave them as (weight picked, compensated sum of the weights: within a few ulps of the
    exact share of the weights formed), and the log of the weights' total on the pass's
    common scale (the pass's normaliser when the block is the last one)."""

    i: int
    k: int
    p_interval: tuple[float, float]
    p_level: tuple[float, float]
    log_total: float


def draw_block(
    fwd: Forward,
    j: int,
    i_end: int,
    pos_ref: int,
    nj: float,
    rng: np.random.Generator,
) -> Block:
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
    buf_top = 1.0  # the largest weight in buf (the log paths normalise it to 1)
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
        # ``count`` of them are lost: with a largest weight of at least the pass's floor
        # (2^-900 or more) and count < 2^30 they are < 2^-92 of it. Both sides are absolute
        # values in the same scaled units; nothing here is a product that could underflow.
        if top >= fwd.tiny_draw:
            g_draw = row.gmax + (math.log(top) - math.log(row.top)) - lscale
            buf_top = top
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
    # held to the median-width rule at every draw and to the certificate of the mass they
    # dropped at the last one (certificate): the bound's rates are limited by c - mu there
    # and it asks several times more range than they have on clamped data (see
    # docs/mechanisms.md, "The certificate of a tilted pass").
    short = row.peak + j * fwd.log_growth - (g_rel - fwd.headroom)
    sound = -math.inf
    if not fwd.mu and (fwd.log_space or short <= 0.0):  # (a linear pass trips anyway)
        # the last draw's total is the pass's normaliser: its headroom bounds the mass the
        # pass dropped, the release's δ (range_rule.last_headroom)
        room = fwd.last_headroom if j == fwd.m else fwd.headroom
        sound = fwd.error_at_draw(j, pos_ref - nj, i_end) - (g_draw - room)
    elif fwd.mu and j == fwd.m and short <= 0.0:
        # a tilted pass: the certificate of the mass it dropped (certificate) must be the
        # same headroom below the last draw's largest weight. It is a function of the data
        # alone (not of any draw), so it is computed in a thread from here on while the
        # sweep draws its other blocks, and checked once the sweep has drawn every block
        # (certificate_rejects); where it fails, the sweep's draws are discarded and the
        # log pass draws from the last block on: the same law as checking it here.
        fwd.cert_target = g_draw - fwd.last_headroom
        fwd.start_certificate(fwd.cert_target)
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
    # the shares the picks gave (for the acceptance step), from compensated sums
    total = float(KG.compensated_sum(buf))
    p_interval = (float(buf[pick]), total)
    log_total = g_draw + (math.log(total) - math.log(buf_top))
    k, p_level = 0, (1.0, 1.0)
    if nlev > 1:
        if row.nlev:  # compact: the levels at the picked interval, replayed
            at_pick = stored_levels_at(fwd, j, row.lo + pick, nlev).reshape(-1, 1)
            k, p_level = pick_repeat_level(
                at_pick, repeat_level_ids(nlev), nlev, 0, False, w_level, rng
            )
        else:  # the stored levels at the picked interval
            k, p_level = pick_repeat_level(
                row.levels, row.level_ids, nlev, pick, fwd.log_space, w_level, rng
            )
        if k < 0:
            raise FloatingPointError("JointExp: backward weights are all zero")
    return Block(row.lo + pick, k + 1, p_interval, p_level, log_total)


def certificate_rejects(fwd: Forward) -> bool:
    """Whether the certificate of the mass the tilted linear pass ``fwd`` dropped is above
    the target its last draw set (:func:`draw_block`): then the pass may not be released
    from, and the sweep that drew its last block is redone from the log pass. False for
    every other pass (and for a tilted pass before its last draw)."""
    target = fwd.cert_target
    if not fwd.mu or fwd.log_space or target is None:
        return False
    return fwd.certified_error(target) > target


def pick_repeat_level(
    levels: FloatArray,
    ids: IntArray,
    nlev: int,
    v: int,
    log_space: bool,
    word: int,
    rng: np.random.Generator,
) -> tuple[int, tuple[float, float]]:
    """The repeat count (0-based) at column v, drawn exactly ∝ its levels 1..nlev
    (:func:`repeat_level_weights`), and the share the pick gave it (weight, compensated
    sum); (-1, (0.0, 1.0)) if they are all zero."""
    weights, counts = repeat_level_weights(levels, ids, nlev, v, log_space)
    s = pick_weights(weights, word, rng)
    if s < 0:
        return -1, (0.0, 1.0)
    return int(counts[s]) - 1, (float(weights[s]), float(KG.compensated_sum(weights)))


def repeat_level_weights(
    levels: FloatArray, ids: IntArray, nlev: int, v: int, log_space: bool
) -> tuple[FloatArray, IntArray]:
    """The weights a level pick draws from (relative to the largest) and the repeat count
    (1-based) of each (:func:`~app.mechanisms.jointexp.kernels_log.level_weights`)."""
    weights = np.empty(ids.size)
    ns = int(KG.level_weights(levels, ids, nlev, v, log_space, weights))
    return weights[:ns], ids[:ns]

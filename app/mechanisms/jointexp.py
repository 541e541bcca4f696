"""JointExp: one exponential mechanism for m quantiles (Gillenwater, Joseph, Kulesza, ICML 2021).

The mechanism (paper Sec. 3) samples a nondecreasing sequence of intervals
``s = (i_1 <= ... <= i_m)`` between sorted clamped data points with probability

    P[s] ∝ exp(eps * u(s) / (2 Δ)) * prod_j w(i_j) / γ(s),
    u(s) = -sum_{j=1}^{m+1} |(i_j - i_{j-1}) - n_j|,   i_0 = 0, i_{m+1} = n,

(``n_j = (q_j - q_{j-1}) n``, ``w`` the interval widths, ``γ(s) = prod count(i)!``), then one
uniform point inside each chosen interval, sorted. It is eps-DP with Δ = 2 (swap) or
Δ = 2 (1 - min gap) with the gaps including q_1 and 1 - q_m (add/remove, paper Lemma 10).

Sampling is exact, by the paper's forward/backward dynamic program over
``alpha(j, i, k)`` (mass of length-j prefixes ending in exactly k copies of i), computed here
without the O(m^2 n) table:

* The single-copy transition ``alpha(j, i, 1) = w_i sum_{i' < i} alpha(j-1, i') r^|i - i' - n_j|``
  is a two-sided geometric kernel, evaluated for all i in O(n) by recursive filters
  (:mod:`app.mechanisms._jointexp_kernels`) that only ever add non-negative terms.
* Repeats ``alpha(j, i, k) = w_i r^{n_j} alpha(j-1, i, k-1) / k`` are kept as extra rows only
  where they are not dominated: an entry below 2^-60 of ``alpha(j, i, 1)`` at the same interval
  is dropped. Every completion of such a prefix is also a completion of the single-copy prefix
  at the same interval with at least the same weight, so the error this introduces in any
  later weight is below 2^-60 of that weight's row (times m).
* Rows are max-normalised in linear space (fast path). If a row's maximum drops below 2^-100
  of the previous row's, contributions may have underflowed; the whole forward pass is then
  redone in log space (exact for any dynamic range: long runs of tied or clamped points).
* The backward pass draws (i, k) for the last block from ``alpha(m, i, k) r^|n - i - n_{m+1}|``,
  then block by block from ``alpha(j, i, k) r^|i_next - i - n_{j+1}|`` over ``i < i_next``, each
  by inverse CDF with a single uniform.
* Rows are stored while they fit a memory budget; beyond it, only every ~sqrt(m)-th row is kept
  and the others are recomputed block by block during the backward pass.

Complexity: O(n log n) to sort, then O(n) per quantile and row for the forward pass (plus
O(n) per surviving repeat level) and O(n) per sampled block; memory O(n sqrt(m)) at worst.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from app.mechanisms import _jointexp_kernels as K
from app.mechanisms.histogram import Support, support_from_values
from app.mechanisms.registry import Mechanism, PrivacyNotion
from app.mechanisms.rng import make_rng
from app.mechanisms.sampling import inverse_cdf_pick
from app.mechanisms.validation import FloatArray, IntArray

PRUNE = 2.0**-60  # repeat entries below this fraction of the single-copy entry are dropped
GUARD = 2.0**-100  # linear-space rows whose max falls below this trigger the log-space pass
LOG_KEEP = 3000.0  # log-space rows keep entries within this many e-folds of their maximum
GUARD_MARGIN = 640.0  # a row may fall at most keep - margin e-folds below the previous one
MEMORY_BUDGET_BYTES = 256 * 2**20  # rows kept in full while they fit; checkpoints beyond


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


class _LinearGuardTripped(Exception):
    """A linear-space row lost too much range; the log-space pass must be used."""


class _LogGuardTripped(Exception):
    """A log-space row fell further than its kept range allows; keep more and start over."""


@dataclass(frozen=True)
class _Row:
    """One forward row: ``levels[k - 1, v]`` is alpha(j, lo + v, k) (linear) or its log.

    Linear rows keep only the span between their first and last non-zero entry (everything
    outside is exactly 0.0, as the dense computation would also give) and are stored
    unnormalised with ``top`` = max of their sum over k. Log rows are dense with ``lo = 0``.
    """

    lo: int
    levels: FloatArray
    top: float

    @property
    def nbytes(self) -> int:
        return int(self.levels.nbytes)


def _span(total: NDArray[np.float64] | NDArray[np.bool_]) -> tuple[int, int]:
    nz = np.flatnonzero(total)
    return int(nz[0]), int(nz[-1]) + 1


class _Forward:
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
    ) -> None:
        self.logw = logw
        self.pos = pos
        self.keep = keep
        # suffix maxima of the log widths bound the log pass's geometric tails (log pass only)
        self.suf_logw = np.maximum.accumulate(logw[::-1])[::-1].copy() if log_space else logw
        self.gaps = gaps
        self.c = c
        self.log_space = log_space
        self.m = gaps.size - 1
        self.n1 = logw.size
        self.w = np.exp(logw)  # normalised widths, max 1; zero-width intervals are 0
        pw_len = int(min(int(pos[-1]) + 2, math.ceil(750.0 / c) + 2))
        self.pw = np.exp(-c * np.arange(max(pw_len, 2), dtype=np.float64))
        self.budget = budget
        self.block = max(1, math.isqrt(self.m - 1) + 1)  # ~sqrt(m) rows per checkpoint block
        self.rows: dict[int, _Row] = {}
        self.cache: dict[int, _Row] = {}
        self.checkpointing = False
        self.stored_bytes = 0

    # -- one row ----------------------------------------------------------------------------

    def first(self) -> _Row:
        lrow = np.empty(self.n1)
        K.first_row_log(self.logw, self.pos, float(self.gaps[0]), self.c, lrow)
        if self.log_space:
            lrow -= lrow.max()
            a, b = _span(lrow >= -self.keep)
            return _Row(a, lrow[a:b].reshape(1, -1).copy(), 1.0)
        row = np.empty(self.n1)
        K.exp_normalise(lrow, row)
        a, b = _span(row)
        return _Row(a, row[a:b].reshape(1, -1).copy(), 1.0)

    def step(self, prev: _Row, j: int) -> _Row:
        """Row j (1-based, j >= 2) from row j - 1."""
        return self._step_log(prev, j) if self.log_space else self._step_linear(prev, j)

    def _step_linear(self, prev: _Row, j: int) -> _Row:
        nj = float(self.gaps[j - 1])
        lev = prev.levels
        total = lev[0] if lev.shape[0] == 1 else lev.sum(axis=0)
        n_t = total.size
        scale = 1.0 / prev.top
        # Past the window, S decays by r per step; from ln(n_t) + 746 e-folds on it is 0.0.
        tail = n_t + math.floor(nj) + math.ceil((math.log(n_t + 1.0) + 746.0) / self.c) + 4
        s = np.empty(min(self.n1 - prev.lo, tail))
        count, top = K.transition_linear(
            total, prev.lo, scale, self.w, self.pos, nj, self.c, self.pw, np.empty(n_t), s
        )
        lev1 = s[:count]
        stay = math.exp(-self.c * nj) * scale  # r^{n_j}, in units of the previous row's max
        repeats: list[FloatArray] = []
        if stay > 0.0:
            w_here = self.w[prev.lo : prev.lo + n_t]
            floor = PRUNE * lev1[:n_t]
            for k in range(lev.shape[0]):
                cand = lev[k] * w_here * (stay / (k + 2))
                cand[cand < floor] = 0.0
                repeats.append(cand)
            while repeats and not repeats[-1].any():
                repeats.pop()  # only trailing empty levels go: level index is the count
        if repeats:
            out = np.zeros((1 + len(repeats), count))
            out[0] = lev1
            for k, cand in enumerate(repeats):
                out[k + 1, :n_t] = cand
            tot = out.sum(axis=0)
            top = float(tot.max())
        else:
            out = lev1.reshape(1, -1)
            tot = lev1
        if not (top >= GUARD and math.isfinite(top)):
            raise _LinearGuardTripped
        a, b = _span(tot)
        return _Row(prev.lo + a, np.ascontiguousarray(out[:, a:b]), top)

    def _step_log(self, prev: _Row, j: int) -> _Row:
        """Log-space row j: exact, keeping entries within ``keep`` e-folds of the row's max.

        The same rule as the linear pass (which drops what underflows, ~708 e-folds down,
        and insists that no row falls more than 69 e-folds below the previous one), with a
        range of ``keep`` e-folds and the same 640 e-fold margin.
        """
        nj = float(self.gaps[j - 1])
        lev = prev.levels
        ltotal = lev[0] if lev.shape[0] == 1 else np.logaddexp.reduce(lev, axis=0)
        n_t = ltotal.size
        ls = np.empty(self.n1 - prev.lo)
        count, top = K.transition_log(
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
        l1 = ls[:count]
        lw_here = self.logw[prev.lo : prev.lo + n_t]
        lstay = -self.c * nj
        lfloor = l1[:n_t] + math.log(PRUNE)
        repeats: list[FloatArray] = []
        for k in range(lev.shape[0]):
            cand = lev[k] + lw_here + (lstay - math.log(k + 2))
            cand[cand < lfloor] = -np.inf
            repeats.append(cand)
        while repeats and not np.any(repeats[-1] > -np.inf):
            repeats.pop()
        if repeats:
            out = np.full((1 + len(repeats), count), -np.inf)
            out[0] = l1
            for k, cand in enumerate(repeats):
                out[k + 1, :n_t] = cand
            tot = np.logaddexp.reduce(out, axis=0)
            top = float(tot.max())
        else:
            out = l1.reshape(1, -1)
            tot = l1
        if not math.isfinite(top):
            raise FloatingPointError("JointExp: a forward row has no mass")
        if top < -(self.keep - GUARD_MARGIN):
            raise _LogGuardTripped
        a, b = _span(tot >= top - self.keep)
        out = out[:, a:b] - top
        if out.shape[0] > 1:
            # Entries more than `keep` e-folds down are dropped wherever they are (the linear
            # pass loses them to underflow the same way); repeat levels left empty go too.
            out[out < -self.keep] = -np.inf
            nonempty = np.flatnonzero(np.any(out > -np.inf, axis=1))
            out = out[: int(nonempty[-1]) + 1]
        return _Row(prev.lo + a, np.ascontiguousarray(out), 1.0)

    # -- storage ----------------------------------------------------------------------------

    def _keep(self, j: int) -> bool:
        return j == 1 or j == self.m or (j - 1) % self.block == 0

    def _store(self, j: int, row: _Row) -> None:
        self.rows[j] = row
        self.stored_bytes += row.nbytes
        if not self.checkpointing and self.stored_bytes > self.budget:
            self.checkpointing = True
            for jj in [jj for jj in self.rows if not self._keep(jj) and jj != j]:
                self.stored_bytes -= self.rows.pop(jj).nbytes

    def run(self) -> None:
        row = self.first()
        self._store(1, row)
        for j in range(2, self.m + 1):
            nxt = self.step(row, j)
            if self.checkpointing and not self._keep(j - 1) and (j - 1) in self.rows:
                self.stored_bytes -= self.rows.pop(j - 1).nbytes
            self._store(j, nxt)
            row = nxt

    def dense_total(self, j: int) -> FloatArray:
        """Row j summed over repeat counts, dense over all n + 1 intervals, max 1 (for tests)."""
        row = self.get(j)
        vals = np.exp(row.levels) if self.log_space else row.levels
        out = np.zeros(self.n1)
        out[row.lo : row.lo + vals.shape[1]] = vals.sum(axis=0)
        return np.asarray(out / out.max(), dtype=np.float64)

    def get(self, j: int) -> _Row:
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


def _draw_block(
    fwd: _Forward,
    j: int,
    i_end: int,
    pos_ref: int,
    nj: float,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """Draw (i, k) ∝ alpha(j, i, k) r^|pos_ref - P[i] - nj| over i < i_end; k is 1-based."""
    row = fwd.get(j)
    count = min(row.levels.shape[1], i_end - row.lo)
    if count <= 0:
        raise FloatingPointError("JointExp: no mass below the sampled interval")
    nlev = min(row.levels.shape[0], j)
    buf = np.empty(nlev * count)
    pos = fwd.pos
    if fwd.log_space:
        K.step_weights_log(row.levels, row.lo, nlev, count, pos_ref, pos, nj, fwd.c, buf)
    else:
        top = K.step_weights_linear(
            row.levels, row.lo, nlev, count, pos_ref, pos, nj, fwd.c, fwd.pw, buf
        )
        if not top >= GUARD * row.top:
            # The kernel pushed every candidate towards underflow: form the same weights in
            # log space from the stored row (its entries are exact to 2^-1022 of its max).
            lrow = np.empty_like(row.levels)
            K.log_of(row.levels.reshape(-1), lrow.reshape(-1))
            K.step_weights_log(lrow, row.lo, nlev, count, pos_ref, pos, nj, fwd.c, buf)
    pick = int(inverse_cdf_pick(buf, rng.random()))
    if pick < 0:
        raise FloatingPointError("JointExp: backward weights are all zero")
    return row.lo + pick % count, pick // count + 1


def _run_log_space(
    logw: FloatArray, pos: IntArray, gaps: FloatArray, c: float, budget: int
) -> _Forward:
    """Forward pass in log space, widening the kept range until no row outruns it."""
    keep = LOG_KEEP
    while True:
        fwd = _Forward(logw, pos, gaps, c, log_space=True, budget=budget, keep=keep)
        try:
            fwd.run()
            return fwd
        except _LogGuardTripped:
            keep = keep * 4.0 if keep < 1e6 else math.inf  # inf: dense, nothing dropped


def sample_interval_sequence(
    logw: FloatArray,
    pos: IntArray,
    gaps: FloatArray,
    c: float,
    rng: np.random.Generator,
    *,
    force_log_space: bool = False,
    budget: int = MEMORY_BUDGET_BYTES,
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
    """
    logw = logw - float(np.max(logw))
    pos = np.ascontiguousarray(pos, dtype=np.int64)
    d1 = logw.size
    m = gaps.size - 1
    if force_log_space:
        fwd = _run_log_space(logw, pos, gaps, c, budget)
    else:
        fwd = _Forward(logw, pos, gaps, c, log_space=False, budget=budget)
        try:
            fwd.run()
        except _LinearGuardTripped:
            fwd = _run_log_space(logw, pos, gaps, c, budget)
    seq = np.empty(m, dtype=np.int64)
    j, i_end, pos_ref = m, d1, int(pos[-1])
    while j > 0:
        i, k = _draw_block(fwd, j, i_end, pos_ref, float(gaps[j]), rng)
        seq[j - k : j] = i
        j -= k
        i_end, pos_ref = i, int(pos[i])
    return seq


def jointexp_core(sup: Support, rng: np.random.Generator) -> FloatArray | IntArray:
    """JointExp on a prepared support: interval sequence by the exact DP, then the points.

    O(m d) time in the common case (d distinct values), O(d sqrt(m)) memory at worst.
    """
    c = sup.epsilon / (2.0 * jointexp_sensitivity(sup.quantiles, sup.neighbors))
    widths = sup.widths
    with np.errstate(divide="ignore"):
        logw = np.log(widths / widths.max())
    seq = sample_interval_sequence(logw, sup.cum, quantile_gaps(sup.quantiles, sup.n), c, rng)
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

"""The sound bound on the error truncated forward rows carry into JointExp's draws.

:mod:`app.mechanisms.jointexp.error_bound` bounds, for every row j and draw position t, the total
error ``sum_i |row_j(i) - exact_j(i)| k(t - P_i)`` that the rows' dropped entries cause in a
draw's weights, without assuming anything about the widths. These tests measure that error:
log passes with a deliberately short range (``keep`` of 8 to 40 e-folds, so that the dropped
mass is large enough to see) against the dense log pass that drops nothing, on inputs
chosen to break a width-blind rule (widths 10^16 apart, wide intervals at and away from the
targets, heavy atoms, close quantiles), and require the bound to hold at every row and at
positions across the whole range. A bound that forgot the widths, the repeats or the
distance discount fails them (the negative controls below).
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
from scipy.special import logsumexp

from app.mechanisms.jointexp import error_bound as E
from app.mechanisms.jointexp.forward import Forward
from app.mechanisms.jointexp.mechanism import quantile_gaps, sample_prepared_sequence
from app.mechanisms.jointexp.range_rule import LogGuardTripped
from app.mechanisms.jointexp.rows import Inputs, summed_levels


def _dense_logs(fwd: Forward, j: int) -> np.ndarray:
    """Row j summed over repeat counts, as logs on the pass's common scale, dense (-inf
    where the row holds nothing)."""
    row = fwd.get(j)
    out = np.full(fwd.n1, -math.inf)
    out[row.lo : row.lo + row.levels.shape[1]] = summed_levels(row, True) + row.gmax
    return out


def _case(seed: int):
    """Positions, log widths and gaps of a random support built to stress the bound."""
    rng = np.random.default_rng(seed)
    d1 = int(rng.integers(8, 120))
    steps = rng.integers(1, 4, size=d1 - 1)
    if rng.random() < 0.5:  # a heavy atom or two
        for _ in range(int(rng.integers(1, 3))):
            steps[int(rng.integers(0, d1 - 1))] += int(rng.integers(20, 200))
    pos = np.concatenate([[0], np.cumsum(steps)]).astype(np.int64)
    logw = rng.normal(0.0, 1.0, size=d1)
    kind = rng.integers(0, 4)
    if kind == 0:  # both edges 10^16 wider than the rest (data inside loose bounds)
        logw[0] += 37.0
        logw[-1] += 37.0
    elif kind == 1:  # wide intervals scattered inside
        wide = rng.choice(d1, size=max(1, d1 // 10), replace=False)
        logw[wide] += rng.uniform(10.0, 40.0, size=wide.size)
    elif kind == 2:  # narrow data, one wide gap in the middle
        logw[d1 // 2] += 37.0
    zero = rng.random(d1) < 0.1
    # an end interval of zero width (data at a bound) one time in five: it holds exactly 0
    # in every row, and the bound charges it nothing
    zero[0], zero[-1] = np.random.default_rng([seed, 99]).random(2) < 0.2
    logw[zero] = -math.inf
    logw -= logw[np.isfinite(logw)].max()
    n = int(pos[-1])
    m = int(rng.integers(2, 25))
    if rng.random() < 0.5:  # close quantiles
        q0 = rng.uniform(0.05, 0.6)
        q = q0 + np.arange(m) * rng.uniform(1e-3, 0.3 / m)
    else:
        q = np.sort(rng.uniform(0.01, 0.99, size=m))
    q = np.unique(q)
    gaps = quantile_gaps(q, n)
    c = float(np.exp(rng.uniform(np.log(0.05), np.log(3.0))))
    keep = float(rng.uniform(8.0, 40.0))
    return pos, logw, gaps, c, keep


def _measured(fwd: Forward, exact: Forward, j: int, t: float) -> float:
    """log of sum_i |row_j(i) - exact_j(i)| e^{-c |t - P_i|} (-inf if no error)."""
    a, b = _dense_logs(fwd, j), _dense_logs(exact, j)
    top = max(a.max(), b.max())
    diff = np.abs(np.exp(a - top) - np.exp(b - top))
    kern = -fwd.c * np.abs(t - fwd.pos.astype(float))
    with np.errstate(divide="ignore"):
        return float(logsumexp(np.log(diff) + kern) + top)


def _check(seed: int, bound_of=None) -> tuple[int, float]:
    """(rows checked, worst measured - bound) over every row and 9 positions per row."""
    pos, logw, gaps, c, keep = _case(seed)
    fwd = Forward(logw, pos, gaps, c, log_space=True, budget=1 << 30, keep=keep)
    exact = Forward(logw, pos, gaps, c, log_space=True, budget=1 << 30, keep=math.inf)
    for f in (fwd, exact):
        with contextlib.suppress(LogGuardTripped):  # the rows are all there
            f.run()
    m = gaps.size - 1
    worst = -math.inf
    checked = 0
    if bound_of is None:
        bound = lambda j, t: fwd.error_at_draw(j, t, fwd.n1)  # noqa: E731
    else:
        bound = lambda j, t: bound_of(fwd, j, t)  # noqa: E731
    for j in range(1, m + 1):
        targets = float(np.cumsum(gaps)[j - 1])
        for t in [*np.linspace(-0.2 * pos[-1], 1.2 * pos[-1], 7).tolist(), targets, targets - 3]:
            got = _measured(fwd, exact, j, t)
            if got == -math.inf:
                continue
            checked += 1
            worst = max(worst, got - bound(j, t))
    return checked, worst


@pytest.mark.parametrize("block", range(6))
def test_the_bound_holds_where_rows_drop_much(block: int) -> None:
    """300 stress supports: at every row and position the measured error is below the bound
    (up to rounding, 1e-9 e-folds), and the cases really drop mass."""
    total = 0
    for seed in range(block * 50, block * 50 + 50):
        checked, worst = _check(seed)
        total += checked
        assert worst <= 1e-9, f"seed {seed}: error above the bound by {worst} e-folds"
    assert total > 500  # errors were measured, not absent


def _widthless(fwd: Forward, j: int, t: float) -> float:
    """A negative control: the same bound with every width charged at the median (the
    width-blind rule)."""
    eb = E.ErrorBound(fwd.logw, fwd.pos, fwd.gaps, fwd.c, fwd.mu)
    med = float(np.median(fwd.logw[np.isfinite(fwd.logw)]))
    eb.hop[:, 1:] = med
    eb.lw0 = eb.lwd = eb.inner_top = med
    return eb.at_draw(eb.norms(fwd.floors)[j], j, t, fwd.n1)


def _no_discount(fwd: Forward, j: int, t: float) -> float:
    """A negative control: the bound without the kernel's geometric sum."""
    eb = E.ErrorBound(fwd.logw, fwd.pos, fwd.gaps, fwd.c, fwd.mu)
    eb.draw_k[:] = 0.0
    eb.hop[:, 1:] -= 10.0
    return eb.at_draw(eb.norms(fwd.floors)[j], j, t, fwd.n1)


@pytest.mark.parametrize("weaker", [_widthless, _no_discount], ids=["median-width", "no-kernel"])
def test_weaker_bounds_are_caught(weaker) -> None:
    """The measurement is sharp enough to fail a width-blind or a kernel-blind bound."""
    broken = [s for s in range(120) if _check(s, weaker)[1] > 1e-6]
    assert len(broken) >= 5


def test_wide_intervals_ask_for_more_range_than_the_median_rule_and_stay_exact() -> None:
    """Both edges 10^16 wider than the data, 30 close quantiles at c = 2.5: the sound bound
    asks for more range than the median-width rule gives, the sampler widens it (the same
    law: a rebuilt pass draws nothing twice), and the draws follow the exact law."""
    from app.mechanisms.jointexp.mechanism import draw_block, run_log_space

    pos = np.arange(7, dtype=np.int64)
    logw = np.array([0.0, -37.0, -37.0, -37.5, -37.0, -37.0, -0.2])
    q = 0.5 + np.arange(30) / 1000.0
    gaps = quantile_gaps(q, int(pos[-1]))
    c = 2.5
    fwd = run_log_space(logw, pos, gaps, c, 1 << 30, 60.0)
    m = q.size
    rng = np.random.default_rng(0)
    with pytest.raises(LogGuardTripped):
        draw_block(fwd, m, pos.size, int(pos[-1]), float(gaps[m]), rng)
    # the whole sampler: the law of the number of quantiles above the data
    inputs = Inputs.prepare(logw, pos)
    draws = np.array(
        [
            (sample_prepared_sequence(inputs, gaps, c, rng) == pos.size - 1).sum()
            for _ in range(2000)
        ]
    )
    exact = _law_of_top_count(pos, logw, gaps, c)
    expect = sum(k * p for k, p in exact.items())
    sd = math.sqrt(sum((k - expect) ** 2 * p for k, p in exact.items()) / draws.size)
    assert abs(draws.mean() - expect) < 5 * sd + 1e-9


def _law_of_top_count(pos, logw, gaps, c) -> dict[int, float]:
    """The exact law of how many quantiles fall in the last interval, by a forward pass in
    50-digit arithmetic over (interval, copies, copies in the last interval)."""
    import mpmath

    with mpmath.workdps(50):
        d1 = pos.size
        m = gaps.size - 1
        n = int(pos[-1])
        live = [i for i in range(d1) if logw[i] > -math.inf]
        w = {i: mpmath.e ** mpmath.mpf(float(logw[i])) for i in live}
        g = [mpmath.mpf(float(x)) for x in gaps]
        cc = mpmath.mpf(c)
        f = {(i, 1): w[i] * mpmath.e ** (-cc * abs(int(pos[i]) - g[0])) for i in live}
        for j in range(1, m):
            tot: dict[int, object] = {}
            for (i, _k), v in f.items():
                tot[i] = tot.get(i, 0) + v
            nxt = {}
            for i in live:
                s = mpmath.fsum(
                    tot[ip] * mpmath.e ** (-cc * abs(int(pos[i]) - int(pos[ip]) - g[j]))
                    for ip in live
                    if ip < i and ip in tot
                )
                if s:
                    nxt[(i, 1)] = w[i] * s
            for (i, k), v in f.items():
                nxt[(i, k + 1)] = v * w[i] * mpmath.e ** (-cc * g[j]) / (k + 1)
            f = nxt
        top = live[-1]
        law: dict[int, object] = {}
        for (i, k), v in f.items():
            weight = v * mpmath.e ** (-cc * abs(n - int(pos[i]) - g[m]))
            key = k if i == top else 0
            law[key] = law.get(key, 0) + weight
        total = mpmath.fsum(law.values())
        return {k: float(v / total) for k, v in law.items()}


def test_a_draw_the_sound_bound_rejects_goes_to_the_log_pass_not_a_tilt(monkeypatch) -> None:
    """Untilted linear rows that the median-width rule accepts but the sound bound does not:
    the retry is the log pass (tilted passes answer to the median rule alone), and the
    sampler completes every block from it."""
    from app.mechanisms.jointexp import mechanism as J

    rejected = 0
    for seed in range(400):
        pos, logw, gaps, c, _ = _case(seed)
        fwd = J.Forward(logw, pos, gaps, c, log_space=False, budget=1 << 30)
        try:
            fwd.run()
        except J.LinearGuardTripped:
            continue
        m = gaps.size - 1
        try:
            J.draw_block(fwd, m, pos.size, int(pos[-1]), float(gaps[m]), np.random.default_rng(0))
        except J.SoundGuardTripped:
            rejected += 1
            with monkeypatch.context() as patch:
                patch.setattr(J, "next_tilted_pass", _no_tilt)
                seq = J.sample_prepared_sequence(
                    Inputs.prepare(logw, pos), gaps, c, np.random.default_rng(seed)
                )
            assert seq.size == m and np.all(np.diff(seq) >= 0)
    assert rejected >= 3


def _no_tilt(*_args, **_kwargs):
    raise AssertionError("a draw the sound bound rejected was retried on tilted rows")


def _reference_norms(eb: E.ErrorBound, floors: np.ndarray) -> np.ndarray:
    """:meth:`ErrorBound.norms` as plain Python (the recursions of the module docstring, in
    the order the compiled kernel must follow)."""
    count = len(E.CONFIGS)
    m, c, mu = eb.m, eb.c, eb.mu
    rows = [[-math.inf] * (2 * count + 1) for _ in range(m + 1)]
    rows[1] = [float(floors[1])] * (2 * count + 1)
    # a zero-width end interval holds exactly 0 in every row: no floor there
    fl0 = (lambda fl: fl) if eb.lw0 > -math.inf else (lambda fl: -math.inf)
    fld = (lambda fl: fl) if eb.lwd > -math.inf else (lambda fl: -math.inf)
    rows[1][count] = fl0(rows[1][count])
    rows[1][count + 1 :] = [fld(v) for v in rows[1][count + 1 :]]
    half = math.log(0.5)
    for j in range(2, m + 1):
        nj = float(eb.gaps[j - 1])
        fl = float(floors[j])
        prev, cur = rows[j - 1], rows[j]
        stay = half - (c - mu) * nj
        e0_prev = prev[count]
        cur[count] = E._lae(e0_prev + eb.lw0 + stay, fl0(fl))
        for s in range(count):
            n_prev, ed_prev = prev[s], prev[count + 1 + s]
            dr = float(eb.d_right[s])
            k_prev = float(eb.draw_k[s, j - 1])
            rep = half - (c - mu - (j - 1) * dr) * nj
            inner = n_prev + E._lae(k_prev, rep) + float(eb.hop[s, j])
            inner = E._lae(inner, e0_prev + eb.inner_top)
            cur[s] = E._lae(inner, fl) + float(eb.margin[s])
            into = n_prev + eb._psi(s, j - 1, eb.pd - nj) + k_prev
            into = E._lae(into, e0_prev + eb._log_k(eb.pd - eb.p0 - nj))
            into = E._lae(into, ed_prev + stay)
            cur[count + 1 + s] = E._lae(eb.lwd + into, fld(fl))
    return np.array(rows, dtype=np.float64)


@pytest.mark.parametrize("tilted", [False, True])
def test_the_compiled_norms_are_the_reference_recursion_bit_for_bit(tilted: bool) -> None:
    """The norms of the bound, compiled, equal the plain-Python recursion exactly (every
    double) on random supports, tilts and floors (some rows' floors -inf)."""
    checked = 0
    for seed in range(200):
        pos, logw, gaps, c, _ = _case(seed)
        rng = np.random.default_rng([seed, 7])
        mu = float(rng.uniform(0.1, 0.95)) * c if tilted else 0.0
        eb = E.ErrorBound(logw, pos, gaps, c, mu)
        m = gaps.size - 1
        floors = rng.uniform(-3000.0, 0.0, m + 1)
        floors[rng.random(m + 1) < 0.1] = -math.inf
        floors[0] = -math.inf
        got, want = eb.norms(floors), _reference_norms(eb, floors)
        assert got.shape == want.shape
        assert np.array_equal(got, want), (seed, np.max(np.abs(got - want)))
        checked += int(np.isfinite(want).sum())
    assert checked > 10_000

"""JointExp samples exactly the paper's distribution M_Q' (Sec. 3.2), in both numeric paths."""

from __future__ import annotations

import collections
import math
from typing import Any

import mpmath
import numpy as np
import pytest

from app.mechanisms import MECHANISMS, select
from app.mechanisms.histogram import support_from_values
from app.mechanisms.jointexp import kernels_linear as KL
from app.mechanisms.jointexp import kernels_log as KG
from app.mechanisms.jointexp import kernels_scaled as KS
from app.mechanisms.jointexp import strategy
from app.mechanisms.jointexp.forward import Forward
from app.mechanisms.jointexp.mechanism import (
    jointexp,
    jointexp_sensitivity,
    quantile_gaps,
    sample_interval_sequence,
)
from app.mechanisms.jointexp.range_rule import (
    HEADROOM,
    LINEAR_RANGE,
    LinearGuardTripped,
    range_room,
)
from app.mechanisms.jointexp.rows import Inputs, to_scaled
from app.mechanisms.validation import FloatArray, IntArray
from tests.mechanisms import law_audit as LA
from tests.mechanisms.exact import (
    chi_square_p,
    edges_for,
    jointexp_sequence_probs,
    support_for,
    to_intervals,
)

DRAWS = 20_000

CASES = [
    # (data, quantiles, epsilon, lower, upper, neighbors)
    ([0.3, 1.7, 2.2, 4.0, 4.1], [0.5], 2.0, 0.0, 5.0, "swap"),
    ([0.3, 1.7, 2.2, 4.0, 4.1, 2.5], [0.25, 0.75], 3.0, 0.0, 5.0, "swap"),
    # ties and points outside the bounds (clamped to zero-width intervals)
    ([1.0, 1.0, 2.0, -3.0, 9.0, 2.5], [0.2, 0.5, 0.8], 2.0, 0.0, 5.0, "swap"),
    ([1.0, 1.0, 2.0, 3.0], [0.3, 0.6, 0.9], 4.0, 0.0, 4.0, "add_remove"),
    ([0.5, 0.6, 3.0, 3.0, 3.0, 4.5], [0.1, 0.5], 1.0, 0.0, 5.0, "add_remove"),
    # repeats dominate: a tiny range of data with wide outer intervals
    ([2.0, 2.01, 2.02], [0.3, 0.5, 0.7], 0.5, 0.0, 10.0, "swap"),
    # heavy atoms, larger than every gap target, so their steps are cut (collapse_cap):
    # inside the data (6 of 10 points; targets 2.5, cap 3)
    ([0.1, 0.2, *[1.0] * 6, 2.5, 2.6], [0.25, 0.5, 0.75], 1.0, 0.0, 3.0, "swap"),
    # clamped above the upper bound (5 of 8; targets 2.4, 2.4, 3.2, cap 4)
    ([0.5, 1.0, 1.5, *[9.0] * 5], [0.3, 0.6], 2.0, 0.0, 5.0, "swap"),
    # clamped at both bounds, add/remove (5 and 5 of 13; targets up to 3.9, cap 4)
    ([*[-7.0] * 5, 0.2, 0.4, 0.6, *[7.0] * 5], [0.2, 0.5, 0.8], 1.5, -1.0, 1.0, "add_remove"),
]


def deficit_tilts(c: float, pos: IntArray, gaps: FloatArray) -> list[float]:
    """The deficit's tilts with the range the law's rule leaves to them."""
    room = range_room(pos.size, gaps.size - 1)
    return strategy.deficit_tilts(c, pos, gaps, room, LINEAR_RANGE)


def tilt_candidates(c: float, chosen: float, pos: IntArray, gaps: FloatArray) -> list[float]:
    """The tilts a pass tries, with the range the law's rule leaves to them."""
    room = range_room(pos.size, gaps.size - 1)
    return strategy.tilt_candidates(c, chosen, pos, gaps, room, LINEAR_RANGE)


# linear rows; tilted linear rows; log rows: logaddexp / ext / scaled
PATHS = ["linear", "tilted", "log", "ext", "scaled"]


def _observed(case, *, seed: int) -> tuple[collections.Counter, int]:
    """DRAWS end-to-end releases (raw values in, estimates out), counted by the dense
    intervals the estimates fall in."""
    data, q, eps, lo, hi, nb = case
    rng = np.random.default_rng(seed)
    edges = edges_for(data, lo, hi)
    counts: collections.Counter = collections.Counter()
    for _ in range(DRAWS):
        out = jointexp(data, q, epsilon=eps, lower=lo, upper=hi, neighbors=nb, rng=rng)
        counts[tuple(int(i) for i in to_intervals(edges, out))] += 1
    return counts, DRAWS


#: Cases whose law at 1.5 eps is far enough from the law at eps for 20,000 draws to tell.
NEGATIVE_CONTROLS = 4


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_exact_distribution_chi_square(case) -> None:
    """End to end (raw values in, estimates out): the intervals the estimates fall in follow
    the paper's law; on the first NEGATIVE_CONTROLS cases the same sample is rejected
    against the law at 1.5 eps (the test sees a wrong epsilon)."""
    data, q, eps, lo, hi, nb = case
    probs = jointexp_sequence_probs(data, q, epsilon=eps, lower=lo, upper=hi, neighbors=nb)
    observed, draws = _observed(case, seed=1234 + len(data))
    p = chi_square_p(observed, probs, draws)
    assert p > 1e-4, f"chi-square p={p:.3g}"
    if CASES.index(case) < NEGATIVE_CONTROLS:
        # the same sample is rejected against the law at 1.5 eps
        wrong = jointexp_sequence_probs(
            data, q, epsilon=1.5 * eps, lower=lo, upper=hi, neighbors=nb
        )
        assert chi_square_p(observed, wrong, draws) < 1e-4


FORCED = {
    "tilted": {"tilt": 0.75},  # times c: these cases all hold in rows tilted by 3c/4
    "log": {"force_log_space": True, "log_kernel": "log"},
    "ext": {"force_log_space": True, "log_kernel": "ext"},
    "scaled": {"force_log_space": True, "log_kernel": "scaled"},
}


def _forced_law(case, path: str, eps: float) -> tuple[dict, Any, dict]:
    """The whole law of forced pass ``path`` on ``case`` run at ``eps`` (walked by the law
    audit), keyed by dense intervals (support interval t is the dense interval cum[t]); the
    support and the sampler options it used."""
    data, q, _, lo, hi, nb = case
    sup = support_from_values(data, q, epsilon=eps, lower=lo, upper=hi, neighbors=nb)
    gaps, c = LA.mechanism_parameters(sup)
    assert c == eps / (2 * jointexp_sensitivity(sup.quantiles, nb))
    options = dict(FORCED[path])
    if "tilt" in options:
        options["tilt"] = float(options["tilt"]) * c
    law = LA.implementation_law(sup, gaps, c, **options)
    return {tuple(int(sup.cum[i]) for i in s): p for s, p in law.items()}, sup, options


@pytest.mark.parametrize("path", sorted(FORCED))
@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_every_forced_path_draws_the_exact_law(case, path: str) -> None:
    """Each forced pass's whole output law, walked branch by branch with the weights it
    uses (tests/mechanisms/law_audit.py), equals the paper's law enumerated from the raw
    values to 10^-12 in total variation, and the sampler draws what the walk walks (same
    sequences, same generator state). Stronger than a chi-square run of the same pass, which
    sees only departures of ~10^-2, and a fraction of its time."""
    data, q, eps, lo, hi, nb = case
    got, sup, options = _forced_law(case, path, eps)
    want = jointexp_sequence_probs(data, q, epsilon=eps, lower=lo, upper=hi, neighbors=nb)
    assert LA.total_variation(got, want) <= 1e-12
    for seed in range(3):
        same, a, b = LA.walker_matches_sampler(sup, seed, **options)
        assert same, (a, b)


@pytest.mark.parametrize("path", sorted(FORCED))
def test_the_forced_path_check_sees_a_wrong_epsilon(path: str) -> None:
    """Negative control: each forced pass run at 1.01 eps is far from the law at eps."""
    data, q, eps, lo, hi, nb = CASES[1]
    got, _, _ = _forced_law(CASES[1], path, 1.01 * eps)
    want = jointexp_sequence_probs(data, q, epsilon=eps, lower=lo, upper=hi, neighbors=nb)
    assert LA.total_variation(got, want) > 1e-4


def test_never_outputs_zero_width_intervals() -> None:
    data = [1.0, 1.0, 1.0, -5.0, -5.0, 7.0, 7.0]
    edges = edges_for(data, 0.0, 5.0)
    rng = np.random.default_rng(7)
    widths = np.diff(edges)
    for _ in range(2000):
        out = jointexp(data, [0.2, 0.5, 0.9], epsilon=1.0, lower=0.0, upper=5.0, rng=rng)
        idx = to_intervals(edges, out)
        assert np.all(widths[idx] > 0)
        assert np.all((out >= 0.0) & (out <= 5.0))


def _exact_rows(
    logw: np.ndarray, pos: np.ndarray, gaps: np.ndarray, c: float
) -> list[list[mpmath.mpf]]:
    """alpha(j, i) summed over k, by the paper's recursion in 50-digit arithmetic."""
    mpmath.mp.dps = 50
    n1 = logw.size
    w = [mpmath.e ** mpmath.mpf(float(v)) if np.isfinite(v) else mpmath.mpf(0) for v in logw]
    r = mpmath.e ** (-mpmath.mpf(c))
    m = gaps.size - 1
    alpha = [[mpmath.mpf(0)] * (m + 1) for _ in range(n1)]  # alpha[i][k]
    for i in range(n1):
        alpha[i][1] = w[i] * r ** abs(int(pos[i]) - mpmath.mpf(float(gaps[0])))
    rows = [[sum(alpha[i]) for i in range(n1)]]
    for j in range(2, m + 1):
        nj = mpmath.mpf(float(gaps[j - 1]))
        tot = [sum(alpha[i]) for i in range(n1)]
        new = [[mpmath.mpf(0)] * (m + 1) for _ in range(n1)]
        for i in range(n1):
            new[i][1] = w[i] * sum(
                tot[ip] * r ** abs(int(pos[i]) - int(pos[ip]) - nj) for ip in range(i)
            )
            for k in range(2, j + 1):
                new[i][k] = w[i] * r**nj * alpha[i][k - 1] / k
        alpha = new
        rows.append([sum(alpha[i]) for i in range(n1)])
    return rows


def _forward(logw, pos, gaps, c, path: str, **kw) -> Forward:
    kernel = "log" if path == "linear" else path
    return Forward(
        logw, pos, gaps, c, log_space=path != "linear", budget=1 << 30, log_kernel=kernel, **kw
    )


def _worst_vs_reference(fwd: Forward, exact, m: int) -> float:
    worst = 0.0
    for j in range(1, m + 1):
        got = fwd.dense_total(j)
        ref = np.array([float(v / max(exact[j - 1])) for v in exact[j - 1]])
        got = got / got.max()
        worst = max(worst, float(np.max(np.abs(got - ref))))
    return worst


@pytest.mark.parametrize("eps", [0.001, 0.05, 1.0, 8.0, 100.0])
@pytest.mark.parametrize("path", PATHS)
def test_forward_rows_match_high_precision_reference(eps: float, path: str) -> None:
    """Every forward weight is within 2^-49 of its row's maximum of the 50-digit value."""
    rng = np.random.default_rng(3)
    x = np.concatenate([np.round(rng.normal(size=60), 1), rng.normal(size=60)])  # with ties
    q = np.array([0.2, 0.45, 0.5, 0.9])
    sup = support_for(x, -3.0, 3.0)  # distinct values with counts
    pos = sup.cum
    with np.errstate(divide="ignore"):
        logw = np.log(sup.widths / sup.widths.max())
    gaps = quantile_gaps(q, x.size)
    c = eps / 4.0
    fwd = _forward(logw, pos, gaps, c, path)
    fwd.run()
    worst = _worst_vs_reference(fwd, _exact_rows(logw, pos, gaps, c), q.size)
    assert worst <= 2.0**-49, worst


@pytest.mark.parametrize("path", ["log", "ext", "scaled"])
def test_forward_rows_in_a_clamped_run_match_high_precision_reference(path: str) -> None:
    """Quantiles inside a clamped run: rows fall ~10^3 e-folds each, beyond a double.

    35 % of the points sit above the bound, so the last three quantiles' rows each fall
    ~c * 12 = 300 e-folds (900 in all; the linear pass refuses them). The rows the log-space
    pass keeps (range sized by the probe, dense here as the rows are short) match the paper's
    recursion in 50-digit arithmetic to 2^-49 of each row's maximum.
    """
    rng = np.random.default_rng(4)
    x = np.concatenate([rng.uniform(0.0, 10.0, size=78), np.full(42, 50.0)])
    q = np.array([0.3, 0.6, 0.7, 0.8, 0.9])
    sup = support_for(x, 0.0, 10.0)
    with np.errstate(divide="ignore"):
        logw = np.log(sup.widths / sup.widths.max())
    gaps = quantile_gaps(q, x.size)
    c = 100.0 / 4.0
    with pytest.raises(LinearGuardTripped):
        _forward(logw, sup.cum, gaps, c, "linear").run()
    fwd = _forward(logw, sup.cum, gaps, c, path, keep=math.inf)
    fwd.run()
    assert fwd.get(1).gmax - fwd.get(q.size).gmax > 700.0  # more than a double's range
    worst = _worst_vs_reference(fwd, _exact_rows(logw, sup.cum, gaps, c), q.size)
    assert worst <= 2.0**-49, worst


def _scaled_and_ext_transition(lT, logw, pos, nj: float, c: float, keep: float):
    """Row sums from the scaled kernel (converted to logs) and from the ext kernel."""
    n1 = logw.size
    n_t = lT.size
    suf = np.maximum.accumulate(logw[::-1])[::-1].copy()
    size = min(int(pos[-1]), math.floor(nj), 500) + 2  # short tables: longer decays call exp
    qm, qe = KS.scaled_decay_table(c, size)
    wm, we = to_scaled(logw)
    tm, te = to_scaled(lT)
    sm, se = np.empty(n1), np.empty(n1, dtype=np.int64)
    scratch = (np.empty(n_t), np.empty(n_t, dtype=np.int64))
    count = KS.transition_scaled(tm, te, 0, wm, we, suf, pos, nj, c, keep, qm, qe, *scratch, sm, se)
    with np.errstate(divide="ignore"):
        got = np.log(sm[:count]) + se[:count] * KS.SCALE_STEP + logw[:count]
    pm, pe = KS.ext_decay_table(c, size)
    ref = np.empty(n1)
    scratch2 = (np.empty(n_t), np.empty(n_t, dtype=np.int64))
    count_ref, _ = KS.transition_ext(
        lT, 0, logw, suf, pos, nj, c, keep, pm, pe, *scratch, *scratch2, ref
    )
    return got, ref[:count_ref]


@pytest.mark.parametrize("seed", range(4))
def test_scaled_transition_matches_ext_and_high_precision_over_deep_uneven_rows(
    seed: int,
) -> None:
    """The scaled kernel on rows spanning ~10^4 e-folds, against ext and 40-digit sums.

    Tied and clamped data make uneven positions (long runs: decays past the table and past
    e^-350 in one step), zero-width intervals, empty entries and rows that fall by thousands
    of e-folds (mantissa exponents move many times). Every output agrees with the ext kernel
    to 2^-49 of the row maximum and, within 700 e-folds of it, to 10^-12 relative; both stop
    where nothing within ``keep`` of the maximum is left; sampled outputs (the largest and
    random ones) match the sum in 40-digit arithmetic to 10^-14 relative (or 4 ulp of the
    log). (The logaddexp kernel is off by ~10^-14 of the maximum on these rows: its error
    grows with the depth.)
    """
    rng = np.random.default_rng(100 + seed)
    x = np.concatenate(
        [np.round(rng.normal(0, 3, 4000), 1), rng.normal(0, 3, 2000), np.full(700, 50.0)]
    )
    sup = support_for(x, -10.0, 10.0)
    pos = np.ascontiguousarray(sup.cum, dtype=np.int64)
    with np.errstate(divide="ignore"):
        logw = np.log(sup.widths / sup.widths.max())
    n1 = logw.size
    # a deep previous row: peaked, falling 2.5 e-folds per position, with empty entries
    peak = rng.integers(0, n1 // 2)
    lT = -2.5 * np.abs(pos - pos[peak]).astype(np.float64) + rng.normal(0, 5, n1)
    lT[rng.random(n1) < 0.1] = -np.inf
    lT = lT[: rng.integers(n1 // 2, n1)]
    lT -= lT.max()
    nj = float(rng.uniform(200.0, 3000.0))
    c = 2.5
    # shift the input so that the output's maximum is ~0 (as in a pass, where rows are
    # max-normalised): a log near -43 alone has an ulp of 7e-15 of its value
    lT -= _scaled_and_ext_transition(lT, logw, pos, nj, c, 1e4)[1].max()
    got, ref = _scaled_and_ext_transition(lT, logw, pos, nj, c, 1e4)
    n = min(got.size, ref.size)
    top = ref.max()
    assert abs(top) < 1e-12
    assert got[:n].max() == pytest.approx(top, abs=1e-15)
    assert np.all(ref[n:] < top - 1e4) and np.all(got[n:] < top - 1e4)
    assert np.array_equal(np.isfinite(got[:n]), np.isfinite(ref[:n]))
    assert np.max(np.abs(np.exp(got[:n] - top) - np.exp(ref[:n] - top))) <= 2.0**-49
    near = np.isfinite(ref[:n]) & (ref[:n] > top - 700.0)
    assert np.max(np.abs(np.expm1(got[:n][near] - ref[:n][near]))) < 1e-12
    finite = np.flatnonzero(np.isfinite(got[:n]))
    sample = np.concatenate(
        [finite[np.argsort(got[finite])[-20:]], rng.choice(finite, 20, replace=False)]
    )
    mpmath.mp.dps = 40
    for i in sample:
        acc = mpmath.mpf(0)
        for u in range(min(int(i), lT.size)):
            if lT[u] > -np.inf:
                dist = abs(int(pos[i]) - int(pos[u]) - mpmath.mpf(nj))
                acc += mpmath.exp(mpmath.mpf(float(lT[u])) - mpmath.mpf(c) * dist)
        exact = float(mpmath.log(acc)) + float(logw[i])
        # to 10^-14 relative, or a few units in the last place of the stored log
        assert abs(got[i] - exact) <= 1e-14 + 4 * np.spacing(abs(exact)), (i, got[i], exact)


def test_scaled_rows_match_logaddexp_rows_on_the_clamped_quantiles() -> None:
    """Whole log passes, scaled vs logaddexp sums, on tied data whose rows fall > 700 e-folds."""
    rng = np.random.default_rng(8)
    x = np.concatenate([np.round(rng.normal(0, 2, 3000), 1), np.full(600, 9.0)])
    q = np.linspace(0.1, 0.95, 12)
    sup = support_for(x, -6.0, 6.0)
    with np.errstate(divide="ignore"):
        logw = np.log(sup.widths / sup.widths.max())
    gaps = quantile_gaps(q, x.size)
    c = 2.0
    fwds = [_forward(logw, sup.cum, gaps, c, k, keep=math.inf) for k in ("scaled", "log")]
    for f in fwds:
        f.run()
    assert fwds[0].get(1).gmax - fwds[0].get(q.size).gmax > 700.0  # beyond a double
    for j in range(1, q.size + 1):
        a, b = (f.dense_total(j) for f in fwds)
        assert np.max(np.abs(a - b)) <= 2.0**-49


def test_linear_and_log_paths_agree_on_tie_heavy_data() -> None:
    rng = np.random.default_rng(5)
    x = np.round(rng.normal(size=3000), 1)  # ~60 distinct values: long tie runs
    q = np.linspace(0.05, 0.95, 9)
    sup = support_for(x, -4.0, 4.0)  # distinct values with counts
    pos = sup.cum
    with np.errstate(divide="ignore"):
        logw = np.log(sup.widths / sup.widths.max())
    gaps = quantile_gaps(q, x.size)
    lin = Forward(logw, pos, gaps, 0.05, log_space=False, budget=1 << 30)
    log = Forward(logw, pos, gaps, 0.05, log_space=True, budget=1 << 30)
    lin.run()
    log.run()
    for j in range(1, q.size + 1):
        a = lin.dense_total(j)
        b = log.dense_total(j)
        assert np.max(np.abs(a - b)) < 1e-12


def test_long_clamped_run_falls_back_to_log_space_and_stays_finite() -> None:
    # 40% of the points sit above the upper bound: the top quantiles must land in the last
    # positive-width intervals, thousands of ranks below their targets, so linear-space rows
    # underflow. The guard must switch to the log-space pass, and the draw stays valid.
    rng = np.random.default_rng(11)
    x = np.concatenate([rng.uniform(0, 10, size=6000), np.full(4000, 50.0)])
    q = np.array([0.5, 0.7, 0.9, 0.99])
    sup = support_for(x, 0.0, 10.0)  # distinct values with counts
    pos = sup.cum
    with np.errstate(divide="ignore"):
        logw = np.log(sup.widths / sup.widths.max())
    gaps = quantile_gaps(q, x.size)
    linear = Forward(logw, pos, gaps, 0.25, log_space=False, budget=1 << 30)
    with pytest.raises(LinearGuardTripped):
        linear.run()
    out = MECHANISMS["jointexp"](x, q, epsilon=1.0, lower=0.0, upper=10.0, rng=rng)
    assert np.all(np.isfinite(out))
    assert np.all((out >= 0.0) & (out <= 10.0))
    # u_Q is maximal for any split with every gap below its target and i_4 at the top of
    # the unclamped region: the last estimate must sit in the last few intervals below 10.
    assert out[-1] > 9.95


def test_checkpointing_gives_the_same_draws_as_full_storage() -> None:
    rng_data = np.random.default_rng(8)
    x = rng_data.normal(size=5000)
    q = np.linspace(0.01, 0.99, 40)
    sup = support_for(x, -10, 10)  # distinct values with counts
    pos = sup.cum
    with np.errstate(divide="ignore"):
        logw = np.log(sup.widths / sup.widths.max())
    gaps = quantile_gaps(q, x.size)
    a = sample_interval_sequence(logw, pos, gaps, 0.25, np.random.default_rng(1), budget=1 << 30)
    b = sample_interval_sequence(logw, pos, gaps, 0.25, np.random.default_rng(1), budget=1)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("path", ["tilted", "log"])
def test_rows_that_fit_the_budget_stay_and_the_draws_are_those_of_full_storage(path) -> None:
    """Past the budget the rows already stored stay (no recomputing them) and only later
    rows are checkpointed; the draws are bit for bit those of full storage and of a budget
    of one byte (every row checkpointed). 10 % clamped at each bound: rows with repeat
    levels, compact rows (level 1 and the sum over levels) below the switch."""
    rng_data = np.random.default_rng(31)
    x = rng_data.normal(0.0, 5.0, size=60_000)
    u = rng_data.random(x.size)
    x[u < 0.1] = 150.0
    x[u > 0.9] = -150.0
    q = np.arange(1, 40) / 40.0
    logw, pos, gaps = _prepared(x, q)
    c = 0.25
    kw = {"tilt": 0.96 * c} if path == "tilted" else {"log_space": True, "keep": math.inf}
    full = Forward(logw, pos, gaps, c, log_space=kw.pop("log_space", False), budget=1 << 40, **kw)
    full.run()
    assert not full.store.checkpointing and len(full.rows) == q.size
    half = full.store.stored_bytes // 2
    part = Forward(logw, pos, gaps, c, log_space=full.log_space, budget=half, **kw)
    part.run()
    assert part.store.checkpointing and 1 < part.store.switch < q.size
    assert all(j in part.rows for j in range(1, part.store.switch + 1))  # nothing dropped below
    dropped = [j for j in range(part.store.switch, q.size + 1) if j not in part.rows]
    assert dropped and all(not part.store.is_checkpoint(j) for j in dropped)
    if path == "tilted":
        assert any(part.rows[j].nlev for j in range(1, part.store.switch))  # compact rows stayed
    for j in (q.size, part.store.switch + 1, part.store.switch - 1, 2):  # recomputed or stored
        np.testing.assert_array_equal(part.dense_total(j), full.dense_total(j))
    force = {"tilt": kw["tilt"]} if path == "tilted" else {"force_log_space": True}
    for seed in range(4):
        draws = [
            sample_interval_sequence(
                logw, pos, gaps, c, np.random.default_rng(seed), budget=b, **force
            )
            for b in (1 << 40, half, 1)
        ]
        np.testing.assert_array_equal(draws[0], draws[1])
        np.testing.assert_array_equal(draws[0], draws[2])


def test_privacy_ratio_of_exact_densities_is_bounded_by_e_eps() -> None:
    """For neighbouring datasets the output densities differ by at most e^eps (swap)."""
    rng = np.random.default_rng(21)
    eps, lo, hi = 1.3, 0.0, 10.0
    q = [0.25, 0.5, 0.75]
    for _ in range(25):
        x = list(np.round(rng.uniform(lo, hi, size=5), 2))
        y = list(x)
        y[int(rng.integers(5))] = float(np.round(rng.uniform(lo - 2, hi + 2), 2))  # swap one
        for _ in range(20):
            o = np.sort(rng.uniform(lo, hi, size=3))
            fx = _density(x, q, o, eps, lo, hi)
            fy = _density(y, q, o, eps, lo, hi)
            assert fx <= math.exp(eps) * fy * (1 + 1e-9)
            assert fy <= math.exp(eps) * fx * (1 + 1e-9)


def _density(data, q, o, eps, lo, hi) -> float:
    """f_Q(o) = exp(eps u_Q(X, o) / (2Δ)) / Z, Z from the sequence enumeration (Lemma 5)."""
    probs_edges = edges_for(data, lo, hi)
    n = probs_edges.size - 2
    w = np.diff(probs_edges)
    gaps = np.diff(np.concatenate(([0.0], q, [1.0]))) * n
    seqs = jointexp_sequence_probs(data, q, epsilon=eps, lower=lo, upper=hi, neighbors="swap")
    # unnormalised mass of each sequence, to recover Z on the same scale as the density
    import itertools

    def mass(s):
        full = (0, *s, n)
        u = -sum(abs((full[j + 1] - full[j]) - gaps[j]) for j in range(len(q) + 1))
        gamma = math.prod(math.factorial(s.count(i)) for i in set(s))
        return math.exp(eps * u / 4) * math.prod(w[i] for i in s) / gamma

    z = sum(
        mass(s) for s in itertools.combinations_with_replacement(range(n + 1), len(q)) if s in seqs
    )
    x_sorted = probs_edges[1:-1]
    counts = [int(np.sum(x_sorted < v)) for v in o]
    full = (0, *counts, n)
    u = -sum(abs((full[j + 1] - full[j]) - gaps[j]) for j in range(len(q) + 1))
    return math.exp(eps * u / 4) / z


def test_accuracy_beats_indexp_on_gaussian_data() -> None:
    rng = np.random.default_rng(2024)
    q = np.arange(1, 10) / 10
    je, ie = [], []
    for _ in range(20):
        x = np.sort(rng.normal(0, 5, size=1000))
        true = x[np.ceil(q * x.size).astype(int) - 1]
        for name, acc in (("jointexp", je), ("indexp", ie)):
            est = MECHANISMS[name](x, q, epsilon=1.0, lower=-100, upper=100, rng=rng)
            lo_ = np.minimum(true, est)
            hi_ = np.maximum(true, est)
            missed = np.searchsorted(x, hi_, "left") - np.searchsorted(x, lo_, "right")
            acc.append(np.maximum(missed, 0).mean())
    assert np.mean(je) < 10
    assert np.mean(je) < np.mean(ie)


def test_sensitivity_add_remove_includes_outer_gaps() -> None:
    assert jointexp_sensitivity(np.array([0.5]), "swap") == 2.0
    assert jointexp_sensitivity(np.array([0.5]), "add_remove") == pytest.approx(1.0)
    # gaps 0.1, 0.8, 0.1: the outer gaps set the minimum
    assert jointexp_sensitivity(np.array([0.1, 0.9]), "add_remove") == pytest.approx(1.8)


@pytest.mark.parametrize("eps", [1e-3, 1e-1, 1.0, 10.0, 100.0])
@pytest.mark.parametrize("neighbors", ["swap", "add_remove"])
def test_stable_across_the_epsilon_range(eps: float, neighbors: str) -> None:
    rng = np.random.default_rng(int(eps * 1000) + 1)
    x = np.concatenate([rng.normal(0, 2, size=20_000), np.round(rng.normal(0, 2, 5_000), 1)])
    x[:300] = 1e6  # clamped far above the bound
    q = np.linspace(0.02, 0.98, 29)
    out = MECHANISMS["jointexp"](
        x, q, epsilon=eps, lower=-50.0, upper=50.0, neighbors=neighbors, rng=rng
    )
    assert np.all(np.isfinite(out))
    assert np.all(np.diff(out) >= 0)
    assert np.all((out >= -50.0) & (out <= 50.0))
    if eps >= 10.0:  # with a large budget the estimates sit on the true quantiles
        true = np.quantile(np.clip(x, -50, 50), q)
        assert np.max(np.abs(out - true)) < 0.1


def test_trimmed_log_rows_equal_dense_log_rows_where_it_matters() -> None:
    """Keeping only `keep` e-folds per row changes no kept weight beyond rounding."""
    from app.mechanisms.jointexp.mechanism import run_log_space

    rng = np.random.default_rng(17)
    x = np.concatenate([rng.normal(size=4000), np.full(400, 1e9)])  # clamped top run
    q = np.array([0.3, 0.6, 0.92, 0.95, 0.97, 0.99])
    sup = support_for(x, -5.0, 5.0)  # distinct values with counts
    pos = sup.cum
    with np.errstate(divide="ignore"):
        logw = np.log(sup.widths / sup.widths.max())
    gaps = quantile_gaps(q, x.size)
    trimmed = run_log_space(logw, pos, gaps, 0.25, 1 << 30)
    dense = Forward(logw, pos, gaps, 0.25, log_space=True, budget=1 << 30, keep=math.inf)
    dense.run()
    assert trimmed.keep < math.inf
    for j in range(1, q.size + 1):
        assert trimmed.get(j).levels.shape[1] < x.size  # rows really are trimmed
        np.testing.assert_allclose(trimmed.dense_total(j), dense.dense_total(j), atol=1e-13)


def test_several_falling_rows_in_a_row_need_range_for_their_sum() -> None:
    """Nine quantiles inside a clamped run: each row falls, and the falls add up.

    A rule that only bounds each row's fall below the previous one passes a pass whose
    truncated rows then push the last rows' weights off by up to 2% of their maximum (seen
    with a 200 e-fold range). The cumulative rule refuses such a range and the pass that it
    settles on matches the dense (nothing dropped) pass to rounding.
    """
    from app.mechanisms.jointexp.mechanism import LogGuardTripped, run_log_space

    rng = np.random.default_rng(1)
    n = 20_000
    x = np.concatenate([rng.uniform(0, 10, size=int(n * 0.9)), np.full(n // 10, 50.0)])
    q = np.array([0.5, 0.9, 0.91, 0.92, 0.93, 0.94, 0.95, 0.96, 0.97, 0.98, 0.99])
    sup = support_for(x, 0.0, 10.0, q)
    with np.errstate(divide="ignore"):
        logw = np.log(sup.widths / sup.widths.max())
    gaps = quantile_gaps(q, n)
    narrow = Forward(logw, sup.cum, gaps, 0.25, log_space=True, budget=1 << 30, keep=400.0)
    with pytest.raises(LogGuardTripped) as info:
        narrow.run()
    assert info.value.needed_keep > 400.0
    chosen = run_log_space(logw, sup.cum, gaps, 0.25, 1 << 30)
    dense = Forward(logw, sup.cum, gaps, 0.25, log_space=True, budget=1 << 30, keep=math.inf)
    dense.run()
    assert chosen.keep < math.inf
    for j in range(1, q.size + 1):
        np.testing.assert_allclose(chosen.dense_total(j), dense.dense_total(j), atol=1e-13)
    # The linear pass (range ~700 e-folds) has enough for these falls (~50 each) and agrees.
    linear = Forward(logw, sup.cum, gaps, 0.25, log_space=False, budget=1 << 30)
    linear.run()
    for j in range(1, q.size + 1):
        np.testing.assert_allclose(linear.dense_total(j), dense.dense_total(j), atol=1e-13)
    # Twice the falls (5% per quantile step at n = 40000) are too much for it.
    x2 = np.concatenate([rng.uniform(0, 10, size=36_000), np.full(4_000, 50.0)])
    sup2 = support_for(x2, 0.0, 10.0, q)
    with np.errstate(divide="ignore"):
        logw2 = np.log(sup2.widths / sup2.widths.max())
    linear2 = Forward(
        logw2, sup2.cum, quantile_gaps(q, x2.size), 0.25, log_space=False, budget=1 << 30
    )
    with pytest.raises(LinearGuardTripped):
        linear2.run()


def test_linear_rows_on_narrow_data_in_loose_bounds_match_the_dense_log_pass() -> None:
    """The range rule charges error growth at the median width (its one assumption).

    N(0, 5^2) data in [-100, 100]: the data intervals are ~1e-4 of the outer ones, so every
    row's maximum is ~11 e-folds below the previous one on the widest-interval scale, 500+
    e-folds over the pass, more than a linear row holds. The rule accepts the linear pass
    (the fall is a uniform width factor); its rows agree with the log pass that keeps
    everything (keep = inf) to 1e-13 of each row's maximum.
    """
    rng = np.random.default_rng(12)
    x = rng.normal(0.0, 5.0, size=20_000)
    q = np.arange(1, 50) / 50.0
    sup = support_for(x, -100.0, 100.0, q)
    with np.errstate(divide="ignore"):
        logw = np.log(sup.widths / sup.widths.max())
    gaps = quantile_gaps(q, x.size)
    linear = Forward(logw, sup.cum, gaps, 0.25, log_space=False, budget=1 << 30)
    linear.run()  # accepted by the range rule
    rows = [linear.get(j) for j in range(1, q.size + 1)]
    assert rows[0].gmax - rows[-1].gmax > 300.0  # the width fall really is that large
    dense = Forward(logw, sup.cum, gaps, 0.25, log_space=True, budget=1 << 30, keep=math.inf)
    dense.run()
    for j in range(1, q.size + 1):
        np.testing.assert_allclose(linear.dense_total(j), dense.dense_total(j), atol=1e-13)


# --------------------------------------------------------------------------- tilted rows


def _prepared(x, q, lo: float = -100.0, hi: float = 100.0):
    sup = support_for(x, lo, hi, q)
    with np.errstate(divide="ignore"):
        logw = np.log(sup.widths / sup.widths.max())
    pos = np.ascontiguousarray(sup.cum, dtype=np.int64)
    return logw, pos, quantile_gaps(np.asarray(q, dtype=np.float64), len(x))


def _clamped(kind: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 5.0, size=n)
    u = rng.random(n)
    if kind in ("upper", "both"):
        x[u < 0.05] = 150.0
    if kind in ("lower", "both"):
        x[u > 0.95] = -150.0
    if kind == "tie":
        x[u < 0.3] = 1.0
    return x


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_the_chi_square_cases_hold_in_tilted_rows(case) -> None:
    """The "tilted" chi-square path really samples from tilted linear rows."""
    from app.mechanisms.jointexp.mechanism import forward_pass, median_log_width

    data, q, eps, lo, hi, nb = case
    sup = support_for(data, lo, hi, q)
    c = eps / (2 * jointexp_sensitivity(sup.quantiles, nb))
    with np.errstate(divide="ignore"):
        logw = np.log(sup.widths / sup.widths.max())
    gaps = quantile_gaps(sup.quantiles, sup.n)
    pos = np.ascontiguousarray(sup.cum, dtype=np.int64)
    fwd = forward_pass(logw, pos, gaps, c, 1 << 30, "scaled", 0.75 * c, median_log_width(logw))
    assert not fwd.log_space
    assert fwd.mu == 0.75 * c


@pytest.mark.parametrize("kind", ["upper", "lower", "both"])
def test_clamped_data_is_sampled_from_tilted_linear_rows(kind: str) -> None:
    """5 % of the data beyond a bound: the linear pass lacks range, the tilted one holds.

    The rows' maxima fall by thousands of e-folds where quantiles are pushed against the
    clamped mass; tilted by e^(-mu P) they do not, and the pass stays linear (not the log
    pass, several times slower).
    """
    from app.mechanisms.jointexp.mechanism import forward_pass, median_log_width

    q = np.arange(1, 100) / 100.0
    logw, pos, gaps = _prepared(_clamped(kind, 200_000, 5), q)
    lw = median_log_width(logw)
    plain = Forward(logw, pos, gaps, 0.25, log_space=False, budget=1 << 30, lw_ref=lw)
    with pytest.raises(LinearGuardTripped):
        plain.run()
    fwd = forward_pass(logw, pos, gaps, 0.25, 1 << 30, "scaled", True, lw)
    assert not fwd.log_space
    assert 0.0 < fwd.mu < 0.25


def _zero_inflated(seed: int):
    """3·10^5 N(0, 5^2) values with 5 % at 0.0, m = 99: the gap targets and the prepared
    inputs (log widths and positions)."""
    from app.mechanisms.jointexp.mechanism import Inputs

    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 5.0, size=300_000)
    x[rng.random(x.size) < 0.05] = 0.0
    logw, pos, gaps = _prepared(x, np.arange(1, 100) / 100.0)
    return gaps, Inputs.prepare(logw, pos)


def _forbid_log_pass(monkeypatch) -> None:
    from app.mechanisms.jointexp import mechanism as J

    def no_log_pass(*args: object, **kwargs: object) -> None:
        raise AssertionError("the log pass ran")

    monkeypatch.setattr(J, "run_log_space", no_log_pass)


def test_a_heavy_atom_inside_the_data_is_cut_and_sampled_from_linear_rows(monkeypatch) -> None:
    """5 % of the values at one inner point (zero-inflated data): the atom's step is cut to
    the largest gap target (collapse_cap) and the whole draw stays in linear rows; before
    the cut every draw ran the log pass with ~10^4 e-folds (n = 10^6: ~60 s)."""
    from app.mechanisms.jointexp import mechanism as J

    gaps, inputs = _zero_inflated(8)
    pos = inputs.pos
    cap = J.collapse_cap(gaps)
    cut = inputs.collapsed(cap)
    assert inputs.max_jump > cap and cut.max_jump == cap
    assert cut.pos[-1] == pos[-1] - (inputs.max_jump - cap)  # only the atom's step changed
    _forbid_log_pass(monkeypatch)
    for seed in range(3):
        seq = J.sample_prepared_sequence(inputs, gaps, 0.25, np.random.default_rng(seed))
        assert np.all(np.diff(seq) >= 0)


def test_prepared_inputs_are_those_of_the_numpy_formulas() -> None:
    """The compiled input kernels against the numpy formulas they replace, on tied, clamped
    and zero-width supports: the cut positions and largest step exactly, the log widths
    the same doubles as ``log(widths / max)`` and the normalised widths within the
    rounding of their logs exponentiated back, zero exactly where the width is zero."""
    from app.mechanisms.jointexp import mechanism as J

    rng = np.random.default_rng(31)
    for trial in range(40):
        n = int(rng.integers(1, 3000))
        x = np.round(rng.normal(0.0, 5.0, n), int(rng.integers(0, 3)))
        x[rng.random(n) < rng.random() * 0.3] = 150.0  # clamped: a heavy last step
        sup = support_for(x, -100.0, 100.0 if trial % 3 else 150.0, np.array([0.25, 0.5]))
        inputs = J.Inputs.from_widths(sup.widths, sup.cum)
        widths = sup.widths
        with np.errstate(divide="ignore"):
            ref_log = np.log(widths / widths.max())
        np.testing.assert_array_equal(inputs.logw, ref_log)
        np.testing.assert_array_equal(inputs.w == 0.0, widths == 0.0)
        # exp(log(w)) carries the log's rounding, |log w| ulps of it: the quotient is the
        # more accurate of the two
        live = widths > 0.0
        back = np.exp(ref_log[live])
        tol = (np.abs(ref_log[live]) + 2.0) * 2.0**-52 * back
        assert np.all(np.abs(inputs.w[live] - back) <= tol)
        np.testing.assert_array_equal(inputs.live_idx, np.flatnonzero(widths > 0.0))
        steps = np.diff(sup.cum)
        assert inputs.max_jump == (int(steps.max()) if steps.size else 0)
        cap = int(rng.integers(1, max(2, inputs.max_jump + 2)))
        ref_pos = np.concatenate(([sup.cum[0]], sup.cum[0] + np.cumsum(np.minimum(steps, cap))))
        np.testing.assert_array_equal(inputs.collapsed(cap).pos, ref_pos)
    assert KL.largest_step(np.array([7], dtype=np.int64)) == 0


def _heavy_atom_case():
    """The chi-square case with a heavy atom inside the data: its sequence probabilities
    (brute force), support, log widths, gap targets and c."""
    data, q, eps, lo, hi, nb = CASES[-3]
    probs = jointexp_sequence_probs(data, q, epsilon=eps, lower=lo, upper=hi, neighbors=nb)
    sup = support_for(data, lo, hi, q)
    c = eps / (2 * jointexp_sensitivity(sup.quantiles, nb))
    with np.errstate(divide="ignore"):
        logw = np.log(sup.widths)
    return probs, sup, logw, quantile_gaps(sup.quantiles, sup.n), c


def _position_law(logw, cum, gaps, c, tilt) -> dict[tuple[int, ...], float]:
    """The whole law of ``sample_interval_sequence(logw, cum, gaps, c, tilt=tilt)``, walked
    branch by branch with the weights it uses (tests/mechanisms/law_audit.py, through the
    module attributes a test may patch), keyed by the intervals' positions as the brute
    force lists them."""
    law = LA.implementation_law(Inputs.prepare(logw, cum), gaps, c, tilt=tilt)
    return {tuple(int(cum[i]) for i in s): p for s, p in law.items()}


def test_a_draw_that_lacks_range_in_tilted_rows_retries_a_larger_tilt(monkeypatch) -> None:
    """A tilted pass whose draw trips is replaced by a more tilted one (then the log pass),
    and the sequences keep the exact distribution (brute force, whole law)."""
    from app.mechanisms.jointexp import mechanism as J

    probs, sup, logw, gaps, c = _heavy_atom_case()
    original = J.draw_block
    tilts: list[float] = []

    def tripping(fwd, *args):  # tilts below 0.9 c lack range for this test
        tilts.append(fwd.mu / fwd.c)
        if 0.0 < fwd.mu < 0.9 * fwd.c:
            raise J.LinearGuardTripped
        return original(fwd, *args)

    monkeypatch.setattr(J, "draw_block", tripping)
    law = _position_law(logw, sup.cum, gaps, c, 0.75 * c)
    assert min(tilts) == 0.75 and max(tilts) >= 0.9  # tripped, then retilted
    assert LA.total_variation(law, probs) <= 1e-12


@pytest.mark.parametrize("c", [0.025, 2.5])
def test_a_heavy_atom_stays_in_linear_rows_at_small_and_large_epsilon(monkeypatch, c) -> None:
    """5 % at one inner point at epsilon = 0.1 and 10 (c = eps / 4): no log pass.

    At c = 2.5 the probe's rows (750 e-folds) cannot see the undershoot the cut pushes
    below the rows' maxima and :func:`probe_tilt` finds no tilt; at c = 0.025 the
    untilted rows hold and the last draw lacks range. Both ran the log pass (n = 10^6:
    ~2 s and ~4 s); the deficit's tilts (:func:`deficit_tilts`) hold in linear rows.
    """
    from app.mechanisms.jointexp import mechanism as J

    gaps, inputs = _zero_inflated(9)
    _forbid_log_pass(monkeypatch)
    for seed in range(2):
        seq = J.sample_prepared_sequence(inputs, gaps, c, np.random.default_rng(seed))
        assert np.all(np.diff(seq) >= 0)


def test_the_undershoot_depth_is_the_fall_from_the_rows_maximum_to_the_mode() -> None:
    """The model's depth, numerically: the tilted last row ``e^(-a t) t^(m - 1)`` (``t`` in
    gaps' worth of undershoot, ``a`` e-folds per gap) falls from its maximum to the
    posterior's mode, the whole deficit ``t = m + 1``, by ``undershoot_depth(a, m)``."""

    t = np.linspace(1e-9, 4000.0, 4_000_001)
    for a, m in ((8.8, 99), (0.5, 29), (25.0, 29), (3.0, 999), (2.0, 1), (40.0, 2)):
        row = -a * t + (m - 1) * np.log(t)
        at_mode = -a * (m + 1.0) + (m - 1) * math.log(m + 1.0)
        assert strategy.undershoot_depth(a, m) == pytest.approx(row.max() - at_mode, abs=1e-6)
    assert strategy.undershoot_depth((99 - 1) / 100.0, 99) == pytest.approx(0.0, abs=1e-9)


def test_deficit_tilts_put_the_undershoot_within_the_linear_range() -> None:
    """No cut, or one the untilted rows reach: no tilts. A cut of D positions: the first
    tilt is the least quarter step of k whose last row holds the undershoot's mode within
    the range (the step before does not), then DEFICIT_STEPS further, inside (0, c)."""
    from app.mechanisms.jointexp import mechanism as J

    gaps = np.full(100, 10_000.0)
    assert deficit_tilts(0.25, np.arange(1_000_001), gaps) == []
    assert deficit_tilts(0.25, np.arange(1_000_001 - 1_000), gaps) == []  # 2.5 e-folds
    for c, deficit in ((0.25, 40_000), (2.5, 40_000), (0.025, 40_000), (0.25, 400_000)):
        pos = np.arange(1_000_001 - deficit)
        tilts = deficit_tilts(c, pos, gaps)
        assert tilts and tilts == sorted(tilts) and all(0.0 < t < c for t in tilts)
        room = (
            J.LINEAR_RANGE
            - math.log(4.0 * pos.size)
            - (HEADROOM + math.log(100.0))
            - strategy.DEFICIT_MARGIN
        )
        ks = [-math.log2(1.0 - t / c) for t in tilts]
        k = ks[0]

        def depth(k: float, c: float = c, deficit: int = deficit) -> float:
            return strategy.undershoot_depth(c * 2.0**-k * deficit / 100.0, 99)

        assert depth(k) <= room and (k == 0.25 or depth(k - 0.25) > room)
        assert ks == pytest.approx([k + s for s in strategy.DEFICIT_STEPS][: len(ks)])
        assert all((c - t) * 2.0 * pos[-1] >= J.LINEAR_RANGE for t in tilts)


def test_deficit_tilts_end_for_any_number_of_quantiles() -> None:
    """With hundreds of thousands of quantiles a quarter step of k changes the model's depth
    by more than the room, and the search could step over the dip where it is least: it
    went on until ``2^-k`` underflowed to 0.0 and the log raised ValueError (m = 769,414,
    c = 0.0139; 1,905 of 20,000 random (m, c, deficit) with m from 10^3 to 10^7). It now
    stops at the first step past the dip, and the tilts stay inside (0, c)."""

    pos = np.arange(1_000_000)
    for m, c, deficit in ((769_414, 0.013925509899311435, 469_487_650.0), (50_000, 2.5, 4e5)):
        span = float(pos[-1] - pos[0])
        gaps = np.full(m + 1, (span + deficit) / (m + 1))
        tilts = deficit_tilts(c, pos, gaps)
        assert tilts and all(0.0 < t < c for t in tilts) and tilts == sorted(tilts)


@pytest.mark.parametrize("shape", ["above", "below", "inside"])
def test_clamped_data_takes_one_tilted_pass_at_the_deficits_tilt(monkeypatch, shape) -> None:
    """5 % of the values beyond a bound or at one inner point, n = 10^6, m = 99,
    epsilon = 1: the sample runs the untilted probe and then exactly one tilted pass, at
    the deficit's first tilt, whose rows and draws all hold (no retilt, no log pass).
    Before the deficit's model the probe's choice came first: at n = 10^6 a quarter to
    half a step larger (wider rows) above the data, a quarter step smaller at the inner
    point, whose draws tripped and took a second pass."""
    from app.mechanisms.jointexp import mechanism as J

    n, q = 1_000_000, np.arange(1, 100) / 100.0
    rng = np.random.default_rng({"above": 41, "below": 42, "inside": 43}[shape])
    x = rng.normal(0.0, 5.0, n)
    x[rng.random(n) < 0.05] = {"above": 150.0, "below": -150.0, "inside": 0.0}[shape]
    sup = support_for(x, -100.0, 100.0, q)
    inputs = J.support_inputs(sup)
    gaps = quantile_gaps(q, n)
    c = 1.0 / 4.0
    cut = inputs.collapsed(J.collapse_cap(gaps))
    first = deficit_tilts(c, cut.pos, gaps)[0]
    tried: list[float] = []
    original_pass = J.tilted_pass

    def tilted_pass(*args):
        tried.append(args[5])
        return original_pass(*args)

    monkeypatch.setattr(J, "tilted_pass", tilted_pass)
    _forbid_log_pass(monkeypatch)
    for seed in range(2):
        tried.clear()
        seq = J.sample_prepared_sequence(inputs, gaps, c, np.random.default_rng(seed))
        assert np.all(np.diff(seq) >= 0)
        assert tried == [first]


def test_a_draw_that_lacks_range_in_untilted_rows_tries_tilts(monkeypatch) -> None:
    """An untilted linear pass whose draw trips is followed by tilted rows before the log
    pass, and the sequences keep the exact distribution (brute force, whole law)."""
    from app.mechanisms.jointexp import mechanism as J

    probs, sup, logw, gaps, c = _heavy_atom_case()
    original = J.draw_block
    kinds: list[str] = []

    def tripping(fwd, *args):  # untilted linear rows lack range for this test
        kinds.append("log" if fwd.log_space else "tilted" if fwd.mu else "untilted")
        if not fwd.log_space and not fwd.mu:
            raise J.LinearGuardTripped
        return original(fwd, *args)

    monkeypatch.setattr(J, "draw_block", tripping)
    law = _position_law(logw, sup.cum, gaps, c, True)
    assert "untilted" in kinds and "tilted" in kinds and "log" not in kinds
    assert LA.total_variation(law, probs) <= 1e-12
    kinds.clear()  # tilt=False never tilts: a trip goes to the log pass
    law = _position_law(logw, sup.cum, gaps, c, False)
    assert "untilted" in kinds and "log" in kinds and "tilted" not in kinds
    assert LA.total_variation(law, probs) <= 1e-12
    kinds.clear()  # and the sampler itself takes the same way
    sample_interval_sequence(logw, sup.cum, gaps, c, np.random.default_rng(22), tilt=True)
    assert "untilted" in kinds and "tilted" in kinds and "log" not in kinds


@pytest.mark.parametrize("kind", ["upper", "lower", "both", "tie"])
@pytest.mark.parametrize("frac", [0.5, 0.9, 0.99, None])
def test_tilted_rows_draw_the_sequences_the_log_pass_draws(kind: str, frac) -> None:
    """Same uniforms, same sequences: tilted rows (forced or chosen) against log rows.

    Both draw each block with the same two uniforms (the interval by inverse CDF over its
    weight summed over repeat counts, then the count), so exact weights give the same
    sequence except where a uniform falls within rounding of a CDF step.
    """
    q = np.arange(1, 20) / 20.0
    logw, pos, gaps = _prepared(_clamped(kind, 20_000, 11), q)
    for c in (0.05, 0.25, 1.0):
        tilt = True if frac is None else frac * c
        for seed in range(15):
            ref = sample_interval_sequence(
                logw, pos, gaps, c, np.random.default_rng(seed), force_log_space=True
            )
            got = sample_interval_sequence(
                logw, pos, gaps, c, np.random.default_rng(seed), tilt=tilt
            )
            np.testing.assert_array_equal(got, ref)


def test_a_draw_counts_dropped_entries_where_its_kernel_peaks() -> None:
    """A row's dropped entries may lie under the kernel's peak; the draw check must see them.

    30 % of the data tied at one value, c = 1, rows tilted by 0.9 c: the tilted rows never
    reach past the tie (their entries there are far below the tilted maximum and dropped),
    yet the last blocks' kernels peak there. A check that only took the kernel's largest
    factor over the stored entries accepted those rows and drew every sequence wrongly
    (40 of 40 seeds); the check over every interval of positive width sends the draw to the
    log pass, and the sequences are the log pass's.
    """
    rng = np.random.default_rng(7)
    x = rng.normal(0.0, 5.0, size=3000)
    x[rng.random(3000) < 0.3] = 1.0
    q = np.arange(1, 10) / 10.0
    logw, pos, gaps = _prepared(x, q)
    tilted = Forward(logw, pos, gaps, 1.0, log_space=False, budget=1 << 30, tilt=0.9)
    tilted.run()  # the forward rows alone pass the range rule
    assert int(pos[tilted.get(q.size).lo + tilted.get(q.size).levels.shape[1] - 1]) < 2000
    for seed in range(10):
        ref = sample_interval_sequence(
            logw, pos, gaps, 1.0, np.random.default_rng(seed), force_log_space=True
        )
        got = sample_interval_sequence(logw, pos, gaps, 1.0, np.random.default_rng(seed), tilt=0.9)
        np.testing.assert_array_equal(got, ref)
        assert int(pos[ref[-1]]) > 2000  # the draws do go past the tie


def test_tilted_rows_match_the_dense_log_rows_on_clamped_data() -> None:
    """Untilted again, the rows of a tilted pass equal the dense log pass's to rounding."""
    from app.mechanisms.jointexp.mechanism import median_log_width, probe_tilt, run_probe

    q = np.arange(1, 50) / 50.0
    for kind in ("upper", "lower", "both"):
        logw, pos, gaps = _prepared(_clamped(kind, 40_000, 3), q)
        lw = median_log_width(logw)
        mu = probe_tilt(run_probe(logw, pos, gaps, 0.25, "scaled", lw))
        assert mu > 0.0
        tilted = Forward(logw, pos, gaps, 0.25, log_space=False, budget=1 << 30, tilt=mu)
        tilted.run()
        dense = Forward(logw, pos, gaps, 0.25, log_space=True, budget=1 << 30, keep=math.inf)
        dense.run()
        for j in range(1, q.size + 1):
            np.testing.assert_allclose(tilted.dense_total(j), dense.dense_total(j), atol=1e-13)


@pytest.mark.parametrize("kind", ["upper", "lower", "both"])
def test_a_tripped_linear_pass_goes_on_as_the_probe(kind: str) -> None:
    """The plain linear pass that breaks the range rule measures every row for the tilt.

    It drops the rows it stored, records each row's maximum and mode to the last row (rows
    whose successor underflows are formed through logs), raises at the end, and the tilt
    chosen from it holds: the tilted pass runs without tripping. Against the narrow log
    probe it ran before: the same modes, maxima never above the log probe's (less range
    only loses mass; a few falling rows are ~50 e-folds lower).
    """
    from app.mechanisms.jointexp.mechanism import median_log_width, probe_tilt, run_probe

    q = np.arange(1, 100) / 100.0
    logw, pos, gaps = _prepared(_clamped(kind, 200_000, 5), q)
    lw = median_log_width(logw)
    lin = Forward(logw, pos, gaps, 0.25, log_space=False, budget=1 << 30, lw_ref=lw)
    with pytest.raises(LinearGuardTripped):
        lin.run(probe_on_trip=True)
    assert lin.probing and not lin.rows
    log = run_probe(logw, pos, gaps, 0.25, "scaled", lw)
    assert np.all(np.isfinite(lin.profile.gmaxes))
    assert np.all(lin.profile.gmaxes <= log.profile.gmaxes + 1e-9)
    np.testing.assert_array_equal(lin.profile.modes, log.profile.modes)
    mu = probe_tilt(lin)
    assert 0.0 < mu < 0.25
    tilted = Forward(logw, pos, gaps, 0.25, log_space=False, budget=1 << 30, tilt=mu, lw_ref=lw)
    tilted.run()
    assert len(tilted.rows) == q.size


def test_a_linear_pass_that_holds_is_not_turned_into_a_probe() -> None:
    """Continuous data: the linear rows hold, every row is stored, nothing probes."""
    q = np.arange(1, 100) / 100.0
    logw, pos, gaps = _prepared(np.random.default_rng(2).normal(0.0, 5.0, 50_000), q)
    lin = Forward(logw, pos, gaps, 0.25, log_space=False, budget=1 << 30)
    lin.run(probe_on_trip=True)
    assert not lin.probing and len(lin.rows) == q.size


def test_row_one_is_formed_on_its_window_exactly_as_densely() -> None:
    """Row 1 is computed only where it can be within range of its maximum: the same row.

    Random positions, widths (30 % zero), quantile gaps, c, tilts and kept ranges; the
    windowed row equals the one formed over every interval, bit for bit.
    """
    from app.mechanisms.jointexp.rows import row_span

    rng = np.random.default_rng(5)
    for _ in range(300):
        n1 = int(rng.integers(2, 3000))
        pos = np.concatenate(([0], np.cumsum(rng.integers(1, 5, size=n1 - 1)))).astype(np.int64)
        logw = rng.normal(-3.0, 3.0, size=n1)
        logw[rng.random(n1) < 0.3] = -np.inf
        logw[int(rng.integers(n1))] = 0.0
        logw -= logw[np.isfinite(logw)].max()
        gaps = np.full(4, pos[-1] / 4.0) * rng.uniform(0.2, 1.8)
        c = float(rng.choice([0.01, 0.1, 1.0, 3.0]))
        log_space = bool(rng.random() < 0.5)
        tilt = c * float(rng.uniform(0.1, 0.99)) if not log_space and rng.random() < 0.5 else 0.0
        keep = float(rng.choice([50.0, 750.0, math.inf]))
        row = Forward(
            logw, pos, gaps, c, log_space=log_space, budget=1 << 30, keep=keep, tilt=tilt
        ).first()
        dense = np.empty(n1)
        KG.first_row_log(logw, pos, float(gaps[0]), c, dense)
        if tilt:
            dense -= tilt * (pos - float(gaps[0]))
        if log_space:
            dense -= dense.max()
            a, b = row_span(dense >= -keep)
            ref = dense[a:b]
        else:
            lin = np.empty(n1)
            KG.exp_normalise(dense, lin)
            a, b = row_span(lin)
            ref = lin[a:b]
        assert row.lo == a
        np.testing.assert_array_equal(row.levels[0], ref)


def test_median_log_width_is_numpys_median() -> None:
    from app.mechanisms.jointexp import median_log_width

    rng = np.random.default_rng(1)
    for n in range(0, 80):
        x = rng.normal(size=n)
        x[rng.random(n) < 0.3] = -np.inf
        positive = x[x > -np.inf]
        ref = float(np.median(positive)) if positive.size else 0.0
        assert median_log_width(x) == ref


def test_median_log_width_matches_numpy_on_tied_and_extreme_values() -> None:
    """Grid log widths are heavily tied (most gaps are one grid step); the radix selection
    gives numpy's median on ties, signed zeros, subnormals, huge values and -inf."""
    from app.mechanisms.jointexp import median_log_width

    rng = np.random.default_rng(2)
    pools = [
        np.log(np.array([1.0, 1.0, 1.0, 2.0, 3.0, 1000.0])),
        np.array([-0.0, 0.0, 5e-324, -5e-324, 2.0, -2.0, 1e308, -1e308, -np.inf]),
        np.array([-3.5, -3.5, -1e-300, 7.0, -np.inf, -np.inf]),
    ]
    for trial in range(3000):
        pool = pools[trial % len(pools)]
        # small inputs take the sort, large ones (every 10th) the radix selection
        x = rng.choice(
            pool, size=int(rng.integers(1, 70) if trial % 10 else rng.integers(4097, 9000))
        )
        positive = x[x > -np.inf]
        with np.errstate(over="ignore"):  # the mean of +-1e308 overflows in both
            ref = float(np.median(positive)) if positive.size else 0.0
            got = median_log_width(x)
        assert got == ref
    # a large, heavily tied input in an order numpy's introselect handled slowly
    gaps = np.ones(200_001)
    gaps[::7] = 2.0
    gaps[::1000] = 1e5
    assert median_log_width(np.log(gaps)) == float(np.median(np.log(gaps)))


def test_kth_smallest_is_the_sorted_value() -> None:
    rng = np.random.default_rng(3)
    pool = np.array([-0.0, 0.0, 5e-324, -5e-324, 1.0, -1.0, 1e308, -1e308, np.inf, -np.inf])
    for trial in range(3000):
        n = int(rng.integers(1, 60))
        x = rng.choice(pool, size=n) if trial % 2 else rng.normal(size=n).round(trial % 3)
        k = int(rng.integers(0, n))
        got = select.kth_smallest(x, k)
        want = np.sort(x)[k]
        assert got == want
        if want == 0.0:  # a tie of signed zeros: either sign is the k-th smallest value
            continue
        assert np.signbit(got) == np.signbit(want)


@pytest.mark.parametrize("kind", ["upper", "tie"])
def test_compact_rows_replay_their_levels_exactly(kind: str, monkeypatch) -> None:
    """Stored rows keep level 1 and the sum over levels; the others replay bit for bit.

    Tilted rows (0.9 c) with many repeat levels, stored whole (compaction off) and compact:
    every level at sampled intervals of every row replays to the same double, the compact
    rows take under half the bytes, and the same seeds draw the same sequences.
    """
    from app.mechanisms.jointexp.rows import Row
    from app.mechanisms.jointexp.storage import stored_levels_at

    q = np.arange(1, 50) / 50.0
    logw, pos, gaps = _prepared(_clamped(kind, 40_000, 3), q)
    compact = Forward(logw, pos, gaps, 0.25, log_space=False, budget=1 << 40, tilt=0.225)
    compact.run()
    with monkeypatch.context() as mp:
        mp.setattr(Row, "compact", lambda self: self)
        whole = Forward(logw, pos, gaps, 0.25, log_space=False, budget=1 << 40, tilt=0.225)
        whole.run()
        ref = [
            sample_interval_sequence(logw, pos, gaps, 0.25, np.random.default_rng(s), tilt=0.225)
            for s in range(5)
        ]
    assert sum(1 for r in compact.rows.values() if r.nlev) > q.size // 2
    assert compact.store.stored_bytes < 0.5 * whole.store.stored_bytes
    rng = np.random.default_rng(0)
    for j in range(2, q.size + 1):
        row = whole.rows[j]
        for v in rng.integers(row.levels.shape[1], size=40):
            want = [float(x) for x in row.levels_at(int(v), row.top_level)]
            assert stored_levels_at(compact, j, row.lo + int(v), len(want)).tolist() == want
    for s in range(5):
        got = sample_interval_sequence(logw, pos, gaps, 0.25, np.random.default_rng(s), tilt=0.225)
        np.testing.assert_array_equal(got, ref[s])


@pytest.mark.parametrize("eps", [0.001, 1.0])
def test_rows_kept_whole_draw_what_compact_rows_draw(eps: float, monkeypatch) -> None:
    """Small passes keep every row whole (COMPACT_FROM_BYTES) and pick repeat counts from the
    stored levels; compacting every row instead (threshold 0) replays the same levels, so
    the same seeds draw the same sequences (wide empty end blocks: many repeat levels)."""
    from app.mechanisms.jointexp import storage

    rng = np.random.default_rng(2)
    for n, m in ((1000, 9), (200, 29)):
        q = np.arange(1, m + 1) / (m + 1)
        logw, pos, gaps = _prepared(np.round(rng.normal(0.0, 5.0, n), 2), q)
        whole = Forward(logw, pos, gaps, eps / 4, log_space=False, budget=1 << 40)
        whole.run()
        assert not any(r.nlev for r in whole.rows.values())
        assert any(r.ids is not None and r.levels.shape[0] > 1 for r in whole.rows.values())
        got = [
            sample_interval_sequence(logw, pos, gaps, eps / 4, np.random.default_rng(s))
            for s in range(8)
        ]
        with monkeypatch.context() as mp:
            mp.setattr(storage, "COMPACT_FROM_BYTES", 0)
            compact = Forward(logw, pos, gaps, eps / 4, log_space=False, budget=1 << 40)
            compact.run()
            assert sum(1 for r in compact.rows.values() if r.nlev) > m // 2
            want = [
                sample_interval_sequence(logw, pos, gaps, eps / 4, np.random.default_rng(s))
                for s in range(8)
            ]
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)


def test_a_chosen_tilt_that_trips_is_followed_by_larger_ones(monkeypatch) -> None:
    """A chosen tilt one step too small trips; the pass retries larger tilts, not log space.

    The tilt the probe chooses on 5 %-clamped data holds; one step of k (mu = c (1 - 2^-k))
    below it does not. Made to choose that one, the forward pass still ends on tilted linear
    rows, at a larger tilt. A forced tilt (tests) is not retried: it goes to the log pass.
    """
    from app.mechanisms.jointexp import mechanism as J

    q = np.arange(1, 100) / 100.0
    logw, pos, gaps = _prepared(_clamped("upper", 200_000, 5), q)
    lw = J.median_log_width(logw)
    lin = Forward(logw, pos, gaps, 0.25, log_space=False, budget=1 << 30, lw_ref=lw)
    with pytest.raises(LinearGuardTripped):
        lin.run(probe_on_trip=True)
    chosen = J.probe_tilt(lin)
    small = 0.25 - (0.25 - chosen) * 2.0  # one step of k below
    assert J.tilted_pass(logw, pos, gaps, 0.25, 1 << 30, small, lw, None) is None
    monkeypatch.setattr(J, "probe_tilt", lambda probe: small)
    fwd = J.forward_pass(logw, pos, gaps, 0.25, 1 << 30, "scaled", True, lw)
    assert not fwd.log_space and fwd.mu > small
    forced = J.forward_pass(logw, pos, gaps, 0.25, 1 << 30, "scaled", small, lw)
    assert forced.log_space


def _dense_levels_reference(lev, w, stay, lev1, prune):
    """The repeat-level recurrence written out densely (every level stored), in numpy."""
    nprev, n_t = lev.shape
    rows = [lev1.copy()]
    for k in range(nprev if stay > 0.0 else 0):
        y = np.zeros(lev1.size)
        y[:n_t] = lev[k] * w * (stay / (k + 2.0))
        y[y < prune * lev1] = 0.0
        rows.append(y)
    return np.array(rows)


def test_levels_that_are_zero_everywhere_are_not_stored() -> None:
    """The levels step keeps only levels with a non-zero entry, bit for bit the dense ones.

    Random rows with empty levels between full ones (at small n the rows hold level j at
    one column and ~5 low levels): the stored levels and their repeat counts, expanded,
    equal the dense recurrence's levels (cut to the non-zero columns), and the sum over
    levels is the same double. Chained over several steps, as the forward pass runs it.
    """
    rng = np.random.default_rng(12)
    prune = 2.0**-60
    gaps_seen = 0
    for _trial in range(300):
        n_t = int(rng.integers(1, 40))
        dense = rng.random((int(rng.integers(1, 6)), n_t)) ** rng.integers(1, 300)
        dense[1:][rng.random(dense.shape[0] - 1) < 0.5] = 0.0  # whole empty levels
        dense[:, rng.random(n_t) < 0.3] = 0.0
        keep = [0] + [k for k in range(1, dense.shape[0]) if np.any(dense[k])]
        lev = np.ascontiguousarray(dense[keep])
        ids = np.arange(1, dense.shape[0] + 1, dtype=np.int64)[keep]
        for _step in range(4):
            count = lev.shape[1] + int(rng.integers(0, 5))
            w = rng.random(lev.shape[1]) ** rng.integers(1, 30)
            lev1 = rng.random(count) ** rng.integers(1, 300)
            lev1[rng.random(count) < 0.4] = 0.0
            stay = float(rng.random() ** rng.integers(1, 60))
            expanded = np.zeros((int(ids[-1]), lev.shape[1]))
            expanded[ids - 1] = lev
            ref = _dense_levels_reference(expanded, w, stay, lev1, prune)
            acc = ref[0].copy()  # summed over levels in order, as the kernel sums
            for k in range(1, ref.shape[0]):
                acc += ref[k]
            out, tot, new_ids, top, a, at = KL.linear_levels_step(lev, ids, w, stay, lev1, prune)
            nz = np.flatnonzero(acc > 0.0)
            if nz.size == 0:
                assert top == 0.0 and out.shape[1] == 0
                break
            a_ref, b_ref = int(nz[0]), int(nz[-1]) + 1
            assert (a, top, at) == (a_ref, float(acc.max()), int(np.argmax(acc)))
            np.testing.assert_array_equal(tot, acc[a_ref:b_ref])
            full = np.zeros((ref.shape[0], b_ref - a_ref))
            full[new_ids - 1] = out
            np.testing.assert_array_equal(full, ref[:, a_ref:b_ref])
            assert new_ids[0] == 1 and np.all(np.diff(new_ids) > 0)
            assert np.all(np.any(out[1:] > 0.0, axis=1))  # no stored level is empty
            gaps_seen += int(new_ids[-1] > new_ids.size)
            lev, ids = np.ascontiguousarray(out), new_ids
    assert gaps_seen > 50  # many rows really skipped empty levels


def test_a_draw_whose_weights_all_vanish_after_a_deep_fall_goes_to_log_space() -> None:
    """A fall of hundreds of e-folds into the last block: the linear weights may all be 0.0.

    20 % of the data above the upper bound, the last quantile at 0.92, epsilon = 10: the
    last row sits far below the one before it, so ``GUARD * row.top`` is below the smallest
    normal double (0.0 once subnormals are flushed) and the largest linear weight can be 0.0
    as well. Such a draw must go to the log pass (it took the log of 0.0 in 153 of 600
    draws before the absolute floor on the largest weight), and every draw is the log
    pass's.
    """
    q = np.array([0.4, 0.8, 0.92])
    for s in (11, 12, 13):
        rng = np.random.default_rng(s)
        x = rng.normal(0.0, 5.0, 2000)
        x[rng.random(2000) < 0.2] = 150.0
        logw, pos, gaps = _prepared(x, q)
        c = 10.0 / (2.0 * jointexp_sensitivity(q, "add_remove"))
        for seed in range(3):
            ref = sample_interval_sequence(
                logw, pos, gaps, c, np.random.default_rng(seed), force_log_space=True
            )
            got = sample_interval_sequence(logw, pos, gaps, c, np.random.default_rng(seed))
            np.testing.assert_array_equal(got, ref)


def test_decay_tables_are_bounded_by_public_figures_not_by_n(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 28: a pass's decay table reaches 750 / (c - mu) ranks, capped by the data's last
    rank. With one atom of 5·10^7 records at epsilon = 0.001 the tilted passes built tables of
    5·10^7 doubles (400 MB, 0.4 s; 10 records: 2 ms), so time and memory told n, which is
    private under add/remove. Tilts whose reach exceeds DECAY_TABLE_MAX are no longer tried:
    every table of every pass is at most max(DECAY_TABLE_MAX, 750 / c) + 2 entries (c is
    public), whatever n, and the draws stay exact (a tilt is speed-only)."""
    from app.mechanisms import GridHistogram
    from app.mechanisms.jointexp import mechanism as je

    sizes: list[int] = []
    real_init = je.Forward.__init__

    def spy(self: je.Forward, *args: object, **kwargs: object) -> None:
        real_init(self, *args, **kwargs)  # type: ignore[arg-type]
        sizes.extend([self.pw.size, self.pwf.size])

    monkeypatch.setattr(je.Forward, "__init__", spy)
    q = np.arange(1, 10) / 10.0
    eps = 0.001
    c = eps / (2.0 * jointexp_sensitivity(q, "add_remove"))
    cap = max(strategy.DECAY_TABLE_MAX, 750.0 / c) + 3
    for n in (10, 10**6, 5 * 10**7):
        sizes.clear()
        hist = GridHistogram.from_arrays(np.array([50]), np.array([n]), 101)
        out = MECHANISMS["jointexp"].run_grid(
            hist, q, epsilon=eps, delta=None, neighbors="add_remove", rng=np.random.default_rng(n)
        )
        assert len(out) == q.size
        assert sizes and max(sizes) <= cap, (n, max(sizes))
    # the candidates never include a tilt past the cap
    pos = np.array([0, 5 * 10**7], dtype=np.int64)
    gaps = np.diff(np.concatenate(([0.0], q, [1.0]))) * 5e7
    for chosen in (0.0, c * 0.5, c * (1 - 2.0**-8)):
        for t in tilt_candidates(c, chosen, pos, gaps):
            assert strategy.decay_reach(c, t) <= strategy.DECAY_TABLE_MAX

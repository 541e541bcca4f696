"""The single-quantile picks' floating-point guarantee (IndExp, AppIndExp, AQ).

What the proof in ``app/mechanisms/exponential.py`` rests on, checked against a 60-digit
reference: every weight a node forms is within ``exp(±rounding_bound(c))`` of its exact
value (up to one common factor), on both paths and on supports built to stress them (heavy
atoms millions of e-folds from the target, widths from 1 to 2^52 and from 1e-300 to 1e300,
c from 1e-10 to 100); the weights not formed hold at most the share the proof charges; the
platform's ``exp`` and ``log`` are within one ulp; the target is exact; and at the service's
limits the parameter a pick runs at leaves its implemented loss within what the ledger
debits, with a total delta below 1e-12.
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numba
import numpy as np
import pytest

from app.mechanisms import exponential as ex
from app.mechanisms.aq import recursion_depth
from app.mechanisms.validation import EPSILON_MAX, EPSILON_MIN

U = 2.0**-53
DPS = 60


def _grid_node(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A grid support: integer cells (gaps from 1 to ~2^46), counts with heavy atoms."""
    d = int(rng.integers(1, 120))
    gaps = np.exp(rng.uniform(0.0, math.log(2.0**46), size=d)).astype(np.int64) + 1
    cells = np.cumsum(gaps) - gaps[0]
    edges = np.concatenate(([0.0], cells.astype(np.float64), [float(cells[-1] + 1 + gaps[0])]))
    counts = rng.integers(1, 4, size=d)
    heavy = rng.random(d) < 0.3
    counts[heavy] = np.exp(rng.uniform(math.log(10.0), math.log(1e12), size=int(heavy.sum())))
    cum = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    return edges, cum


def _raw_node(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Raw values whose gaps span 1e-300 .. 1e300 (widths far from each other)."""
    d = int(rng.integers(1, 60))
    gaps = 10.0 ** rng.uniform(-300.0, 300.0, size=d + 1)
    edges = np.concatenate(([0.0], np.cumsum(gaps)))
    edges = np.unique(edges)  # tiny gaps vanish beside huge ones: keep distinct values
    counts = rng.integers(1, 5, size=edges.size - 2)
    heavy = rng.random(counts.size) < 0.3
    counts[heavy] = np.exp(rng.uniform(math.log(10.0), math.log(1e9), size=int(heavy.sum())))
    cum = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    return edges, cum


def _exact_log_weights(
    edges: np.ndarray, cum: np.ndarray, lo: int, hi: int, ti: int, fl: float, c: float
) -> list[mpmath.mpf]:
    """log of ``width_j / (right - left) * exp(-c |pos_j - (ti + fl)|)`` in 60 digits."""
    with mpmath.workdps(DPS):
        return _exact_log_weights_at(edges, cum, lo, hi, ti, fl, c)


def _exact_log_weights_at(
    edges: np.ndarray, cum: np.ndarray, lo: int, hi: int, ti: int, fl: float, c: float
) -> list[mpmath.mpf]:
    k = hi - lo
    left, right = float(edges[lo - 1]), float(edges[hi])
    base = int(cum[lo - 1])
    t = mpmath.mpf(ti) + mpmath.mpf(fl)
    span = mpmath.mpf(right) - mpmath.mpf(left)
    out = []
    for j in range(k + 1):
        a = mpmath.mpf(left if j == 0 else float(edges[lo + j - 1]))
        b = mpmath.mpf(right if j == k else float(edges[lo + j]))
        w = b - a
        p = int(cum[lo - 1 + j]) - base
        out.append(
            mpmath.log(w / span) - mpmath.mpf(c) * abs(p - t) if w > 0 else mpmath.mpf("-inf")
        )
    return out


def _check_formed(
    got: np.ndarray, j0: int, want: list[mpmath.mpf], rho: float, common: bool
) -> tuple[float, mpmath.mpf]:
    """Spread of log(formed / exact) over the formed weights (<= 2 rho), and the exact share
    of the weights not formed relative to the largest exact weight."""
    etas = []
    formed = np.zeros(len(want), dtype=bool)
    for i, w in enumerate(got):
        if w > 0.0:
            j = j0 + i
            formed[j] = True
            etas.append(mpmath.log(mpmath.mpf(float(w))) - want[j])
    top = max(want)
    dropped = mpmath.fsum(mpmath.exp(w - top) for j, w in enumerate(want) if not formed[j])
    if not etas:
        return 0.0, dropped
    # Log weights share one factor the pick cannot see; linear weights share none.
    spread = float(max(etas) - min(etas)) if common else 2.0 * float(max(abs(e) for e in etas))
    assert spread <= 2.0 * rho, (spread, rho)
    return spread, dropped


def _cases(seed: int, count: int):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    for i in range(count):
        edges, cum = _grid_node(rng) if i % 3 else _raw_node(rng)
        d = edges.size - 2
        lo = int(rng.integers(1, d + 1)) if d >= 1 and rng.random() < 0.3 else 1
        hi = int(rng.integers(lo, d + 2)) if rng.random() < 0.3 else d + 1
        count_ = int(cum[hi - 1] - cum[lo - 1])
        if rng.random() < 0.5 and hi > lo:  # the target inside a heavy atom of the node
            j = int(rng.integers(lo, hi))
            inside = (cum[j - 1] - cum[lo - 1]) + rng.random() * (cum[j] - cum[j - 1])
            frac = float(inside / max(count_, 1))
        else:
            frac = float(rng.random())
        c = float(10 ** rng.uniform(-10.0, 2.0))
        yield edges, cum, lo, hi, frac, c


@pytest.mark.parametrize("seed", range(1, 13))
def test_every_formed_weight_is_within_the_rounding_bound(seed: int) -> None:
    deep = checked_lin = checked_log = 0
    for edges, cum, lo, hi, frac, c in _cases(seed, 200):
        ti, fl = ex.split_target(frac, int(cum[hi - 1] - cum[lo - 1]))
        left, right = float(edges[lo - 1]), float(edges[hi])
        if not right > left:
            continue
        want = _exact_log_weights(edges, cum, lo, hi, ti, fl, c)
        rho = ex.rounding_bound(c)
        k = hi - lo
        buf = np.empty(k + 1)
        with mpmath.workdps(DPS):
            j0, cnt, top = ex.fill_weights(edges, cum, lo, hi, left, right, ti, fl, c, buf)
            if top >= ex.min_top(c):  # the linear path as node_weights takes it
                _, dropped = _check_formed(buf[:cnt].copy(), j0, want, rho, common=False)
                assert dropped <= 2.0**-67 * math.exp(-(4.0 * c + 1.0)), dropped
                checked_lin += 1
            j0, cnt, _ = ex.fill_weights_log(edges, cum, lo, hi, left, right, ti, fl, c, buf)
            _, dropped = _check_formed(buf[:cnt].copy(), j0, want, rho, common=True)
            assert dropped <= (k + 1) * 2.0**-1022 * 2.0, dropped
            checked_log += 1
            # How deep the exponents were: the largest distance to the target times c.
            if float(max(want) - min(w for w in want if w > -mpmath.inf)) > 1e4:
                deep += 1
            j0, cnt = ex.node_weights(edges, cum, lo, hi, left, right, ti, fl, c, buf)
            _, dropped = _check_formed(buf[:cnt].copy(), j0, want, rho, common=True)
            assert dropped <= 2.0**-67 * math.exp(-(4.0 * c + 1.0)), dropped
    assert checked_lin >= 25 and checked_log >= 100 and deep >= 20


def _old_log_weights(
    edges: np.ndarray, cum: np.ndarray, lo: int, hi: int, target: float, c: float
) -> np.ndarray:
    """The log path as it was: each exponent formed whole (``log w - c |p - t|``) and then
    shifted by the largest, so a deep exponent's rounding reaches the weight."""
    left, right = float(edges[lo - 1]), float(edges[hi])
    ends = np.concatenate(([left], edges[lo:hi], [right]))
    pos = (cum[lo - 1 : hi] - cum[lo - 1]).astype(np.float64)
    with np.errstate(divide="ignore"):
        s = np.log(np.diff(ends)) - c * np.abs(pos - target)
    return np.asarray(np.exp(s - s.max()))


def test_the_check_catches_deep_exponents_formed_whole() -> None:
    """Negative control: the earlier log path (whole exponents, then shifted) breaks the
    bound on heavy atoms far from the target; the test above would fail on it."""
    edges = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    cum = np.array([0, 1, 3_000_001, 6_000_002], dtype=np.int64)  # two heavy atoms
    c = 7.3
    frac = 0.25 + 0.3 / 6_000_002  # inside the second atom, ~1.5e6 ranks from its ends
    ti, fl = ex.split_target(frac, 6_000_002)
    want = _exact_log_weights(edges, cum, 1, 4, ti, fl, c)
    rho = ex.rounding_bound(c)
    with mpmath.workdps(DPS):
        old = _old_log_weights(edges, cum, 1, 4, frac * 6_000_002, c)
        with pytest.raises(AssertionError):
            _check_formed(old, 0, want, rho, common=True)
        buf = np.empty(4)
        j0, cnt, _ = ex.fill_weights_log(edges, cum, 1, 4, 0.0, 4.0, ti, fl, c, buf)
        spread, _ = _check_formed(buf[:cnt].copy(), j0, want, rho, common=True)
    assert spread <= 2 * rho


def test_the_target_is_exact_where_a_double_product_is_not() -> None:
    rng = np.random.default_rng(7)
    worst_double = 0.0
    for _ in range(2000):
        q = float(rng.random())
        n = int(rng.integers(1, 2**53))
        ti, fl = ex.split_target(q, n)
        exact = Fraction(q) * n
        rounded_up = fl == 0.0 and ti == math.ceil(exact)
        assert (0.0 <= fl < 1.0 and ti == math.floor(exact)) or rounded_up
        assert abs(Fraction(ti) + Fraction(fl) - exact) <= Fraction(1, 2**54)
        worst_double = max(worst_double, float(abs(Fraction(q * n) - exact)))
    assert worst_double > 2.0**-20  # what the double product would have moved it by


@numba.njit(cache=True)
def _exp_all(x: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = math.exp(x[i])
    return out


@numba.njit(cache=True)
def _log_all(x: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = math.log(x[i])
    return out


def _ulps(got: float, exact: mpmath.mpf) -> float:
    return float(abs(mpmath.mpf(got) - exact)) / math.ulp(float(exact))


def test_the_compiled_exp_and_log_err_by_at_most_one_ulp() -> None:
    """The bound's one assumption about the platform: numba's ``math.exp`` and ``math.log``
    (the C library's, as the samplers compile them) are within one ulp, checked at random
    arguments over the ranges the weights use."""
    rng = np.random.default_rng(11)
    xs = np.concatenate(
        (
            -rng.uniform(0.0, 708.0, size=4000),
            -(10.0 ** rng.uniform(-12.0, 2.0, size=2000)),
        )
    )
    ys = np.ldexp(rng.uniform(1.0, 2.0, size=4000), rng.integers(-1022, 1023, size=4000))
    ex_got, log_got = _exp_all(xs), _log_all(ys)
    with mpmath.workdps(40):
        worst_exp = max(
            _ulps(float(g), mpmath.exp(mpmath.mpf(float(x))))
            for g, x in zip(ex_got, xs, strict=True)
        )
        worst_log = max(
            _ulps(float(g), mpmath.log(mpmath.mpf(float(y))))
            for g, y in zip(log_got, ys, strict=True)
            if abs(float(y) - 1.0) > 1e-3
        )
    assert worst_exp <= 1.0 and worst_log <= 1.0, (worst_exp, worst_log)


@pytest.mark.parametrize("m", [1, 7, 100, 1000])
@pytest.mark.parametrize(
    "epsilon", [EPSILON_MIN, 1e-3, 0.1, 1.0, 9.99, 37.0, EPSILON_MAX], ids=lambda e: f"eps{e:g}"
)
def test_the_implemented_loss_is_within_what_is_debited_at_the_limits(
    m: int, epsilon: float
) -> None:
    """Every pick IndExp, AppIndExp's split or AQ makes at these (m, epsilon) runs at a
    parameter whose implemented loss — the ideal mechanism's at it, plus 4ρ, the target's
    rounding and the dropped share, in exact rationals — is within the calibration's
    epsilon for that pick; the picks' delta totals below 1e-12."""
    u = Fraction(U)
    depth = recursion_depth(m)
    for sens in (0.5, 0.999, 1.0):  # add/remove at q = 1/2, near 0 or 1; swap
        eps_l = epsilon / depth
        # (the pick's exact share of the debited epsilon, c as the code computes it)
        calibrations = [
            (Fraction(epsilon) / m, (epsilon / m) / (2.0 * sens)),  # IndExp, epsilon / m each
            (Fraction(epsilon) / depth, eps_l / (2.0 * sens)),  # AQ, add/remove or one node
            (Fraction(epsilon) / depth / 2, eps_l / (4.0 * sens)),  # AQ, swap over nodes
        ]
        two_delta = 2 * Fraction(sens)
        for share, c in calibrations:
            c_run = ex.run_parameter(c)
            assert 0.0 < c_run < c
            rho = Fraction(ex.rounding_bound(c))
            slack = 4 * rho + 2 * Fraction(c_run) * u + Fraction(2.0**-66)
            # The implemented pick's loss: the ideal mechanism's at c_run (the sensitivity,
            # exact or rounded up by at most u, plus the target's rounding) and the slack.
            loss = two_delta * (1 + u) * Fraction(c_run) + slack
            assert loss <= share, (share, c, c_run)
            # Not vacuous: at the calibration's own c the same account would not close.
            assert two_delta * Fraction(c) + slack > share
    assert m * 2.0**-67 <= 1e-12  # the picks' delta: at most m picks of 2^-67 each


def test_a_wide_node_forms_its_weights_from_normal_factors() -> None:
    """A node ~1e300 wide whose fractional factor is e^-47: ``1 / width`` times that factor
    is subnormal (a few significant bits), so a weight formed through it would be off by far
    more than the bound; the width fraction taken first keeps every partial product normal."""
    edges = np.array([0.0, 1.0, 2.0, 3.0, 1e300])
    cum = np.array([0, 2, 3, 7], dtype=np.int64)
    c = 65.5
    ti, fl = ex.split_target(3.29 / 7.0, 7)
    assert (1.0 / 1e300) * math.exp(-c * (1.0 - fl)) < 2.0**-1022  # the trap is set
    want = _exact_log_weights(edges, cum, 1, 4, ti, fl, c)
    buf = np.empty(4)
    with mpmath.workdps(DPS):
        j0, cnt, top = ex.fill_weights(edges, cum, 1, 4, 0.0, 1e300, ti, fl, c, buf)
        assert top >= ex.min_top(c) and cnt == 4
        spread, _ = _check_formed(buf[:cnt].copy(), j0, want, ex.rounding_bound(c), common=False)
    assert spread <= 2.0 * ex.rounding_bound(c)

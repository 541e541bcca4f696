"""The certificate's last error pass in logs (:mod:`app.mechanisms.jointexp.exact_tail`).

Where the max-norm remainder keeps a tilted pass's certificate above its target (large ε
on heavy atoms), the certificate runs one error pass in logs that drops nothing. Checked
here: its row is the dense majorant sum to rounding; on the 600 grids of
``test_jointexp_certificate`` it bounds the exact ``D·Z`` alone (on the rows) and as the
certificate composes it (after a linear pass); lowered sources are caught; and a heavy-atom
input at large ε that used to go to the log pass is now certified on its tilted pass.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import logsumexp

from app.mechanisms.fpmode import flush_subnormals
from app.mechanisms.histogram import support_from_values
from app.mechanisms.jointexp import certificate as CE
from app.mechanisms.jointexp import exact_tail as ET
from app.mechanisms.jointexp.mechanism import support_inputs
from app.mechanisms.jointexp.rows import collapse_cap
from tests.mechanisms import law_audit as LA
from tests.mechanisms.test_jointexp_certificate import CASES, _exact, _sample, lowered


def _dense_row(le, lo, t_src, src_lo, env, p_star, lw, P, nj, c, mu) -> np.ndarray:
    """log of ``w_v (sum_u K(P_v - P_u - n_j) E(u) + e^{-(c - mu) n_j} E(v) / 2)`` over every
    stored u, plus the sources, densely (intervals ``min(lo, src_lo)`` on)."""
    n1 = lw.size
    base = min(lo, src_lo)
    out = np.full(n1 - base, -np.inf)
    Pf = P.astype(float)
    for v in range(lo, n1):
        if lw[v] == -np.inf or le.size == 0:
            continue
        x = Pf[v] - Pf[lo : lo + le.size] - nj
        terms = list(le - c * np.abs(x) - mu * x)
        if v < lo + le.size:
            terms.append(math.log(0.5) - (c - mu) * nj + le[v - lo])
        out[v - base] = lw[v] + logsumexp(terms)
    for i in range(src_lo, n1):
        if lw[i] == -np.inf:
            continue
        ls = t_src if Pf[i] <= p_star else min(t_src, env - (c + mu) * Pf[i])
        out[i - base] = np.logaddexp(out[i - base], ls)
    return out


def test_a_row_in_logs_is_the_dense_majorant_sum() -> None:
    """Random rows whose entries span 10^4 e-folds (beyond any linear row), zero widths,
    -inf entries, fractional gaps: equal to the dense sum to rounding."""
    rng = np.random.default_rng(20261208)
    for _ in range(300):
        n = int(rng.integers(2, 50))
        P = np.cumsum(rng.integers(1, 30, n)).astype(np.int64)
        lw = np.log(rng.uniform(0.01, 1.0, n))
        lw[rng.random(n) < 0.15] = -np.inf
        c = float(10.0 ** rng.uniform(-2, 1.5))
        mu = c * float(rng.uniform(-0.9, 0.97))
        nj = float(rng.uniform(0.0, 0.75 * P[-1]))
        lo = int(rng.integers(0, n))
        le = rng.uniform(-1e4, 0.0, int(rng.integers(0, n - lo + 1)))
        le[rng.random(le.size) < 0.1] = -np.inf
        src_lo = int(rng.integers(0, n))
        t_src = float(rng.uniform(-2e4, -10.0))
        p_star = float(rng.uniform(0.0, P[-1]))
        env = t_src + (c + mu) * p_star + float(rng.uniform(0.0, 50.0))
        got, base, big = ET.log_error_row(le, lo, t_src, src_lo, env, p_star, lw, P, nj, c, mu)
        want = _dense_row(le, lo, t_src, src_lo, env, p_star, lw, P, nj, c, mu)
        assert base == min(lo, src_lo)
        assert np.array_equal(np.isfinite(got), np.isfinite(want))
        fin = np.isfinite(want)
        tol = ET.rounding(big, 3 * n + 8) + 1e-12 * (1.0 + np.abs(want[fin]))
        assert np.all(np.abs(got[fin] - want[fin]) <= tol), np.max(np.abs(got[fin] - want[fin]))


def _tail_bounds(index: int) -> tuple[float, float, float] | None:
    """(log D·Z exact, the tail in logs on the rows alone, the certificate's composition:
    a linear error pass and the tail on what it dropped), in the units of the log widths."""
    got = _exact(index)
    if got is None:
        return None
    exact, fwd, shift = got
    with flush_subnormals():
        cert = fwd._certificate()  # type: ignore[attr-defined]
        first = cert.first_level(fwd.spans, fwd.g0)  # type: ignore[attr-defined]
        first.run()
        alone = CE.LogLevel(cert, fwd.spans, True)  # type: ignore[attr-defined]
        alone.run()
        alone_bound = alone.result() + alone.rounding() + cert.slack
        tail = CE.LogLevel(cert, first.out, False)
        tail.run()
        composed = CE._lse([first.result(), tail.result()]) + tail.rounding() + cert.slack
    return exact, alone_bound + shift, composed + shift


def test_the_tail_in_logs_bounds_the_mass_a_tilted_pass_dropped() -> None:
    checked = 0
    for index in range(CASES):
        got = _tail_bounds(index)
        if got is None:
            continue
        exact, alone, composed = got
        checked += 1
        assert exact <= alone + 1e-9, f"case {index}: log D·Z {exact} > tail alone {alone}"
        assert exact <= composed + 1e-9, f"case {index}: log D·Z {exact} > {composed}"
    assert checked >= 40, checked


def test_a_tail_with_lowered_sources_is_caught() -> None:
    """The negative control: the tail alone on the rows, its sources 800 e-folds low."""
    caught = 0
    with lowered("log_error_row", 800.0, 2, 4):
        for index in range(CASES):
            got = _tail_bounds(index)
            if got is not None and got[0] > got[1] + 1e-9:
                caught += 1
    assert caught >= 5, caught


def _heavy_atom_inputs() -> tuple[object, np.ndarray, float]:
    """Large ε on heavy atoms: ``fuzz_jointexp`` seed 3, case 598 (68,369 values, tied
    masses at the upper bound, m = 105, ε = 12.6, swap), which went to the log pass (6 s)."""
    from benchmarks.fuzz_jointexp import case_input

    x, q, eps, neighbors = case_input(3, 598)
    sup = support_from_values(x, q, lower=-100.0, upper=100.0, epsilon=eps, neighbors=neighbors)
    gaps, c = LA.mechanism_parameters(sup)
    return support_inputs(sup).collapsed(collapse_cap(gaps)), gaps, c


def test_a_heavy_atom_pass_at_large_epsilon_is_certified_without_the_log_pass() -> None:
    """The tilted pass is certified (the tail in logs), and without the tail the same pass
    goes to the log pass (the test exercises it)."""
    inputs, gaps, c = _heavy_atom_inputs()
    ran = _sample(inputs, gaps, c, 1)
    assert ran == ["tilted"], ran
    saved = CE.EXACT_TAIL_MAX
    CE.EXACT_TAIL_MAX = 0  # type: ignore[misc]
    try:
        ran = _sample(inputs, gaps, c, 1)
    finally:
        CE.EXACT_TAIL_MAX = saved  # type: ignore[misc]
    assert ran[0] == "tilted" and "log" in ran, ran

"""The max-norm bound with the widths smoothed by the kernel (the certificate's remainder).

:mod:`app.mechanisms.jointexp.smoothed_norm` reads the widths at the sources, summed under
the kernel, instead of the widest one near the target at every row. Checked four ways:
its smoothed widths against a dense sum at every target of small supports; its norms never
above the plain ones; the error it bounds, *measured* at every row and position of log
passes that drop much (the harness of ``test_jointexp_errors``); and on the 600 tilted
grids of ``test_jointexp_certificate``, applied alone to the rows' floors (no error pass),
against the exact ``D·Z`` in 50 digits. Lowered smoothed widths are caught (the test can
fail).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from app.mechanisms.fpmode import flush_subnormals
from app.mechanisms.jointexp import error_bound as E
from app.mechanisms.jointexp import smoothed_norm as SN
from tests.mechanisms import test_jointexp_certificate as TC
from tests.mechanisms import test_jointexp_errors as TE


def _dense_hops(eb: E.ErrorBound, logw: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """``max_i e^{-phi_j(P_i)} T_j(P_i - n_j)`` over the inner targets, at row j's own rates
    (not its group's), summed densely in logs: what :func:`SN.smoothed_hops` bounds."""
    m, c, mu = eb.m, eb.c, eb.mu
    inner = np.arange(1, logw.size - 1)
    P = pos[inner].astype(float)
    lw = logw[inner]
    out = np.full((len(E.CONFIGS), m + 1), -math.inf)
    for s in range(len(E.CONFIGS)):
        dl, dr = float(eb.d_left[s]), float(eb.d_right[s])
        for j in range(2, m + 1):
            rl, rr = c + mu - (j - 1) * dl, c - mu - (j - 1) * dr
            p = P - float(eb.gaps[j - 1])  # the targets' shifted positions
            x = p[:, None] - P[None, :]  # target minus source
            kern = np.where(x >= 0.0, -rl * x, rr * x)
            with np.errstate(invalid="ignore"):
                t = np.logaddexp.reduce(kern + lw[None, :], axis=1)
            left, right = float(eb.lefts[s, j - 1]), float(eb.rights[s, j - 1])
            phi = dl * np.maximum(left - P, 0.0) + dr * np.maximum(P - right, 0.0)
            out[s, j] = float(np.max(t - phi))
    return out


def test_the_smoothed_widths_bound_the_dense_kernel_sums() -> None:
    """On 300 stress supports (tilted and not), every row's smoothed hop is at least the
    dense maximum over the targets of the kernel-weighted width sums, discounted, and
    within a few e-folds of it where the rates are the group's."""
    checked = 0
    for seed in range(300):
        pos, logw, gaps, c, _ = TE._case(seed)
        mu = float(np.random.default_rng([seed, 5]).uniform(-0.9, 0.95)) * c
        eb = E.ErrorBound(logw, pos, gaps, c, mu)
        got = SN.smoothed_hops(eb, logw, pos)
        dense = _dense_hops(eb, logw, pos)
        m = gaps.size - 1
        for s in range(len(E.CONFIGS)):
            for j in range(2, m + 1):
                if dense[s, j] == -math.inf:
                    continue
                checked += 1
                assert got[s, j] >= dense[s, j] - 1e-9, (seed, s, j, got[s, j], dense[s, j])
    assert checked > 3000, checked


def _smoothed_at(fwd: object, j: int, t: float, cache: dict[int, object]) -> float:
    """The smoothed bound at a draw from row j at t (the norms formed once per pass)."""
    key = id(fwd)
    if key not in cache:
        eb = E.ErrorBound(fwd.logw, fwd.pos, fwd.gaps, fwd.c, fwd.mu)  # type: ignore[attr-defined]
        rows = SN.SmoothedNorms(eb, fwd.logw, fwd.pos)(fwd.floors)  # type: ignore[attr-defined]
        plain = eb.norms(fwd.floors)  # type: ignore[attr-defined]
        assert np.all(rows <= plain + 1e-12), "the smoothed norms are never above the plain"
        cache.clear()
        cache[key] = (eb, rows, fwd)
    eb, rows, _ = cache[key]  # type: ignore[misc]
    return eb.at_draw(rows[j], j, t, fwd.n1)  # type: ignore[attr-defined]


@pytest.mark.parametrize("block", range(3))
def test_the_smoothed_bound_holds_where_rows_drop_much(block: int) -> None:
    """The harness of the plain bound (log passes with 8 to 40 e-folds of range against the
    dense pass, every row, 9 positions a row) with the smoothed norms: the measured error
    is below them on 150 supports."""
    cache: dict[int, object] = {}
    total = 0
    for seed in range(block * 50, block * 50 + 50):
        checked, worst = TE._check(seed, lambda f, j, t: _smoothed_at(f, j, t, cache))
        total += checked
        assert worst <= 1e-9, f"seed {seed}: error above the smoothed bound by {worst}"
    assert total > 250


def _row_bounds(index: int) -> tuple[float, float, float] | None:
    """(log D·Z exact, the plain max-norm bound on the rows' own floors, the smoothed one),
    in the units of the log widths; None where the case drops nothing."""
    got = TC._exact(index)
    if got is None:
        return None
    exact, fwd, shift = got
    with flush_subnormals():
        cert = fwd._certificate()  # type: ignore[attr-defined]
        cert.g0 = fwd.g0  # type: ignore[attr-defined]
        floors = fwd.spans.t  # type: ignore[attr-defined]
        plain = cert._max_norm(floors) + cert.slack
        smooth = cert._max_norm(floors, smooth=True) + cert.slack
    return exact, plain + shift, smooth + shift


def test_the_smoothed_bound_alone_bounds_the_mass_a_tilted_pass_dropped() -> None:
    """On the 600 tilted grids, with no error pass at all: the smoothed max-norm bound on the
    rows' floors is at least the exact D·Z, never above the plain one, and below it by an
    e-fold or more on some."""
    checked = lower = 0
    for index in range(TC.CASES):
        got = _row_bounds(index)
        if got is None:
            continue
        exact, plain, smooth = got
        checked += 1
        assert exact <= smooth + 1e-9, f"case {index}: log D·Z {exact} > smoothed {smooth}"
        assert smooth <= plain + 1e-9
        lower += smooth < plain - 1.0
    assert checked >= 40, checked
    assert lower >= 5, lower


@contextmanager
def _lowered_hops(by: float) -> Iterator[None]:
    saved = SN.smoothed_hops

    def low(*args: object) -> np.ndarray:
        return saved(*args) - by  # type: ignore[arg-type]

    SN.smoothed_hops = low  # type: ignore[assignment]
    try:
        yield
    finally:
        SN.smoothed_hops = saved  # type: ignore[assignment]


def test_lowered_smoothed_widths_are_caught() -> None:
    """The negative control: the smoothed widths 20 e-folds too low miss the measured error
    (on the few supports of the harness where they, not the plain route, set the bound)."""
    cache: dict[int, object] = {}
    with _lowered_hops(20.0):
        broken = [
            s
            for s in range(300)
            if TE._check(s, lambda f, j, t: _smoothed_at(f, j, t, cache))[1] > 1e-6
        ]
    assert len(broken) >= 5, broken

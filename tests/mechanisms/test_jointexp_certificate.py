"""The certificate of a tilted pass's dropped mass, against an exact count of what it dropped.

A tilted linear pass keeps only the entries above its rows' truncation floors; the
sequences through an entry it dropped are never proposed, and their share ``D`` of the
exact normaliser enters the release's δ. The certificate
(:mod:`app.mechanisms.jointexp.certificate`) bounds ``D·Z``. Here ``D·Z = Z − Z_K`` is
computed exactly: ``Z`` by the paper's recursion in 50-digit arithmetic, ``Z_K`` by the same
recursion with every entry the pass did not store (or stored as 0.0) set to zero, the
entries read from the pass's own rows. On inputs where tilted rows drop mass (heavy atoms,
ε from 2 to 100, tilts 0.5c and 0.9c forced), the certificate must be at least ``D·Z``,
and a certificate whose sources are lowered by 800 e-folds must fail on some of them (the
test can fail).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from contextlib import contextmanager

import mpmath
import numpy as np

from app.mechanisms import GridHistogram
from app.mechanisms.fpmode import flush_subnormals
from app.mechanisms.histogram import support_from_grid
from app.mechanisms.jointexp import blocks as BK
from app.mechanisms.jointexp import certificate as CE
from app.mechanisms.jointexp import exact_tail as ET
from app.mechanisms.jointexp import forward as FW
from app.mechanisms.jointexp import threads
from app.mechanisms.jointexp.accept import tilt_constant
from app.mechanisms.jointexp.mechanism import MEMORY_BUDGET_BYTES, support_inputs, tilted_pass
from app.mechanisms.jointexp.rows import collapse_cap
from tests.mechanisms import law_audit as LA

CASES = 600


def _case(index: int) -> tuple[object, ...] | None:
    """A random small grid with heavy atoms and a forced tilt; None where the tilted rows
    break the range rule."""
    rng = np.random.default_rng([20261206, index])
    d = int(rng.integers(6, 28))
    k1 = int(rng.integers(d + 2, 4000))
    cells = np.sort(rng.choice(k1, size=d, replace=False)).astype(np.int64)
    counts = rng.integers(1, 12, d)
    heavy = rng.choice(d, size=int(rng.integers(1, 3)), replace=False)
    counts[heavy] = rng.integers(50, 3000, heavy.size)
    m = int(rng.integers(1, 5))
    q = np.sort(rng.uniform(0.02, 0.98, m))
    eps = float(10.0 ** rng.uniform(math.log10(2.0), 2.0))
    nb = "swap" if rng.random() < 0.5 else "add_remove"
    hist = GridHistogram(cells, counts.astype(np.int64), k1)
    sup = support_from_grid(hist, q, epsilon=eps, neighbors=nb)
    gaps, c = LA.mechanism_parameters(sup)
    inputs = support_inputs(sup).collapsed(collapse_cap(gaps))
    mu = c * (0.5 if rng.random() < 0.5 else 0.9)
    # repeat levels are pruned below a share of level 1 and accounted on their own (the
    # certificate is for the truncation floors): not pruned here, so that Z - Z_K is what
    # the rows' floors dropped
    with _no_pruning(), flush_subnormals():
        fwd = tilted_pass(
            inputs.logw, inputs.pos, gaps, c, MEMORY_BUDGET_BYTES, mu, inputs.lw_ref, inputs
        )
    if fwd is None:
        return None
    return fwd, inputs, gaps, c


@contextmanager
def _no_pruning() -> Iterator[None]:
    saved = FW.prune_floor
    FW.prune_floor = lambda c, m, generation=0: 0.0  # type: ignore[assignment]
    try:
        yield
    finally:
        FW.prune_floor = saved  # type: ignore[assignment]


def _stored_masks(fwd: object) -> list[dict[tuple[int, int], bool]]:
    """Row j's stored, non-zero entries as {(interval, repeat count): True}."""
    masks: list[dict[tuple[int, int], bool]] = [{}]
    for j in range(1, fwd.m + 1):  # type: ignore[attr-defined]
        row = fwd.get(j)  # type: ignore[attr-defined]
        assert row.nlev == 0, "small rows are stored whole"
        mask: dict[tuple[int, int], bool] = {}
        for s, k in enumerate(row.level_ids):
            for v in np.flatnonzero(row.levels[s] > 0.0):
                mask[(row.lo + int(v), int(k))] = True
        masks.append(mask)
    return masks


def _normalisers(
    logw: np.ndarray, pos: np.ndarray, gaps: np.ndarray, c: float, masks: list | None
) -> mpmath.mpf:
    """The paper's normaliser in 50 digits (log widths as given: max 0), over every
    sequence, or (``masks``) over the sequences through stored entries only."""
    d1 = logw.size
    with mpmath.workdps(50):
        w = [mpmath.exp(mpmath.mpf(float(v))) if v > -math.inf else mpmath.mpf(0) for v in logw]
        g = [mpmath.mpf(float(v)) for v in gaps]
        cc = mpmath.mpf(float(c))
        P = [int(p) for p in pos]
        n, m = P[-1], len(g) - 1

        def keep(j: int, key: tuple[int, int]) -> bool:
            return masks is None or key in masks[j]

        f = {}
        for i in range(d1):
            if w[i] and keep(1, (i, 1)):
                f[(i, 1)] = w[i] * mpmath.exp(-cc * abs(P[i] - g[0]))
        for j in range(1, m):
            tot: dict[int, mpmath.mpf] = {}
            for (i, _), v in f.items():
                tot[i] = tot.get(i, 0) + v
            nxt = {}
            src = sorted(tot)
            for i in range(d1):
                if not w[i] or not keep(j + 1, (i, 1)):
                    continue
                s = mpmath.fsum(
                    tot[k] * mpmath.exp(-cc * abs(P[i] - P[k] - g[j])) for k in src if k < i
                )
                if s:
                    nxt[(i, 1)] = w[i] * s
            for (i, r), v in f.items():
                if keep(j + 1, (i, r + 1)):
                    nxt[(i, r + 1)] = v * w[i] * mpmath.exp(-cc * g[j]) / (r + 1)
            f = nxt
        return mpmath.fsum(v * mpmath.exp(-cc * abs(n - P[i] - g[m])) for (i, _), v in f.items())


def _check(index: int) -> tuple[float, float] | None:
    """(log D·Z exact, log certificate), both in the units of the log widths; None where
    the case has no tilted pass or drops nothing."""
    got = _exact(index)
    if got is None:
        return None
    exact, fwd, shift = got
    with flush_subnormals():
        bound = fwd.certified_error(-math.inf)  # type: ignore[attr-defined]
    return exact, bound + shift


def _exact(index: int) -> tuple[float, object, float] | None:
    """(log D·Z exact in the units of the log widths, the tilted pass, the shift from its
    common scale to those units); None where the case has no tilted pass or drops
    nothing."""
    case = _case(index)
    if case is None:
        return None
    fwd, inputs, gaps, c = case
    logw, pos = inputs.logw, inputs.pos  # type: ignore[attr-defined]
    masks = _stored_masks(fwd)
    with mpmath.workdps(50):
        z = _normalisers(logw, pos, gaps, c, None)  # type: ignore[arg-type]
        zk = _normalisers(logw, pos, gaps, c, masks)  # type: ignore[arg-type]
        dropped = z - zk
        assert dropped >= 0
        if dropped == 0:
            return None
        exact = float(mpmath.log(dropped))
    shift = fwd.g0 - tilt_constant(fwd.mu, int(pos[-1]), gaps)  # type: ignore[attr-defined]
    return exact, fwd, shift


def _coarse_bound(fwd: object, span: int, smooth: bool = False) -> float:
    """The certificate with its first error pass on blocks of ``span`` (on the pass's
    common scale): the error pass's result and the max-norm bound on what it dropped
    (``smooth``: the block problem's smoothed max-norm bound)."""
    with flush_subnormals():
        cert = fwd._certificate()  # type: ignore[attr-defined]
        cert.g0 = fwd.g0  # type: ignore[attr-defined]
        blocks = BK.Blocks(cert.pos, cert.w, span, cert.c, cert.mu, cert.gaps)
        level = CE.Level(cert, fwd.spans, True, blocks)  # type: ignore[attr-defined]
        level.run()
        rest = blocks.remainder(level.out.t, float(cert.pos[-1]), smooth)
        return CE._lse([level.result(), rest]) + cert.slack


#: block spans a coarse error pass is checked with (positions are counts: heavy atoms
#: leave most blocks single)
SPANS = (1, 4, 60)


def _coarse_misses(index: int) -> tuple[int, int]:
    """(spans checked, spans whose coarse certificate is below the exact D·Z) on case
    ``index``."""
    got = _exact(index)
    if got is None:
        return 0, 0
    exact, fwd, shift = got
    misses = sum(
        exact > _coarse_bound(fwd, span, smooth) + shift + 1e-9
        for span in SPANS
        for smooth in (False, True)
    )
    return 2 * len(SPANS), misses


def test_a_coarse_error_pass_bounds_the_mass_a_tilted_pass_dropped() -> None:
    """An error pass on blocks of intervals (the cheaper level the certificate runs where
    it can spare the cost) is still an upper bound on D·Z, at every span, with the block
    problem's plain and its smoothed max-norm remainder."""
    checked = 0
    for index in range(CASES):
        n, misses = _coarse_misses(index)
        assert misses == 0, f"case {index}: a coarse certificate below the exact D·Z"
        checked += n
    assert checked >= 80 * len(SPANS), checked


def test_a_coarse_pass_without_its_kernel_factor_is_caught() -> None:
    """The negative control: without the kernel's growth over a block's span (the factor
    ``I`` on the block widths, ``e^k`` at the last draw) blocks miss the dropped mass."""
    saved = BK.block_log_factor, BK.draw_log_factor
    BK.block_log_factor = BK.draw_log_factor = lambda k: 0.0  # type: ignore[assignment]
    try:
        caught = sum(_coarse_misses(index)[1] > 0 for index in range(CASES))
    finally:
        BK.block_log_factor, BK.draw_log_factor = saved  # type: ignore[assignment]
    assert caught >= 3, caught


@contextmanager
def lowered(row: str, by: float, t_at: int, env_at: int) -> Iterator[None]:
    """The error-pass row kernel ``row`` of :mod:`exact_tail` or :mod:`certificate` (its
    source level at argument ``t_at``, its envelope at ``env_at``) and the row-1 sources
    (:func:`~app.mechanisms.jointexp.spans.first_sources`) lowered by ``by`` e-folds:
    a wrong certificate, for the negative controls."""
    module = ET if hasattr(ET, row) else CE
    first = "first_sources"
    saved_row, saved_first = getattr(module, row), getattr(CE, first)

    def low_row(*args: object) -> object:
        a = list(args)
        a[t_at] = float(a[t_at]) - by  # type: ignore[arg-type]
        a[env_at] = float(a[env_at]) - by  # type: ignore[arg-type]
        return saved_row(*a)

    def low_first(*args: object) -> tuple[np.ndarray, object]:
        vals, rest = saved_first(*args)
        return vals - by, rest

    setattr(module, row, low_row)
    setattr(CE, first, low_first)
    try:
        yield
    finally:
        setattr(module, row, saved_row)
        setattr(CE, first, saved_first)


def _lowered_sources(by: float) -> contextlib.AbstractContextManager[None]:
    """Every linear error pass's sources lowered by ``by`` e-folds."""
    return lowered("error_row", by, 3, 5)


def test_the_certificate_bounds_the_mass_a_tilted_pass_dropped() -> None:
    checked = 0
    for index in range(CASES):
        got = _check(index)
        if got is None:
            continue
        exact, bound = got
        checked += 1
        assert exact <= bound + 1e-9, f"case {index}: log D·Z {exact} > certificate {bound}"
    # the cases exercise it: tilted rows that drop mass (about one case in twelve)
    assert checked >= 40, checked


def test_a_certificate_with_lowered_sources_is_caught() -> None:
    """The negative control: sources 800 e-folds too low miss the dropped mass."""
    caught = 0
    with _lowered_sources(800.0):
        for index in range(CASES):
            got = _check(index)
            if got is not None and got[0] > got[1] + 1e-9:
                caught += 1
    assert caught >= 5, caught


def _clamped_inputs(n: int, m: int, eps: float) -> tuple[object, np.ndarray, float]:
    """5 % of N(0, 5^2) data clamped at the upper bound 100 (as ``bench_mechanisms``'
    clamped5pct, smaller): the inputs, gap targets and parameter JointExp runs with."""
    rng = np.random.default_rng(7)
    x = rng.normal(0.0, 5.0, n)
    x[rng.random(n) < 0.05] = 100.0
    cells = np.round((x + 100.0) * 1e5).astype(np.int64)  # a fine grid: continuous values
    uniq, counts = np.unique(cells, return_counts=True)
    hist = GridHistogram(uniq, counts.astype(np.int64), 20_000_001)
    q = np.arange(1, m + 1) / (m + 1)
    sup = support_from_grid(hist, q, epsilon=eps, neighbors="swap")
    gaps, c = LA.mechanism_parameters(sup)
    return support_inputs(sup), gaps, c


#: the generation of each pass the last :func:`_sample` built (tilted or log)
_GENERATIONS: list[int] = []


def _sample(inputs: object, gaps: np.ndarray, c: float, seed: int) -> list[str]:
    """One JointExp sequence; which passes ran ("tilted", "log")."""
    from app.mechanisms.jointexp import mechanism as MX

    ran: list[str] = []
    log_pass, tilted = MX.run_log_space, MX.tilted_pass
    generations = _GENERATIONS
    generations.clear()

    def spy_log(*a: object, **k: object) -> object:
        fwd = log_pass(*a, **k)  # type: ignore[arg-type]
        ran.append("log")
        generations.append(fwd.generation)
        return fwd

    def spy_tilted(*a: object, **k: object) -> object:
        fwd = tilted(*a, **k)  # type: ignore[arg-type]
        if fwd is not None:
            ran.append("tilted")
            generations.append(fwd.generation)
        return fwd

    MX.run_log_space, MX.tilted_pass = spy_log, spy_tilted  # type: ignore[assignment]
    try:
        seq = MX.sample_prepared_sequence(inputs, gaps, c, np.random.default_rng(seed))  # type: ignore[arg-type]
    finally:
        MX.run_log_space, MX.tilted_pass = log_pass, tilted  # type: ignore[assignment]
    assert np.all(np.diff(seq) >= 0)
    return ran


def test_a_clamped_run_is_certified_on_its_tilted_pass() -> None:
    inputs, gaps, c = _clamped_inputs(100_000, 99, 1.0)
    ran = _sample(inputs, gaps, c, 1)
    assert "tilted" in ran and "log" not in ran, ran


def test_a_tilted_pass_the_certificate_rejects_is_replaced_by_the_log_pass() -> None:
    inputs, gaps, c = _clamped_inputs(100_000, 99, 1.0)
    saved = CE.Certificate.log_bound
    CE.Certificate.log_bound = lambda self, rows, target, first: math.inf  # type: ignore[method-assign]
    try:
        ran = _sample(inputs, gaps, c, 1)
    finally:
        CE.Certificate.log_bound = saved  # type: ignore[method-assign]
    assert "tilted" in ran and ran[-1] == "log", ran
    # rebuilt in the sweep after the tilted pass the certificate rejected: one generation
    # later (a smaller share of δ)
    assert _GENERATIONS[-1] == _GENERATIONS[-2] + 1, (_GENERATIONS, ran)


def test_a_sweep_whose_certificate_fails_is_redrawn_from_the_log_pass() -> None:
    """The certificate is a function of the data alone, so the sampler checks it once the
    sweep's blocks are drawn (its error passes finish meanwhile); where it fails, the
    sweep's draws are discarded and the log pass, one generation later, draws from the last
    block on. Forced to fail on every tilted pass (tilt 0.9c forced), on small supports:
    the walker, which mirrors the discard, and the sampler draw the same sequence with the
    same number of uniforms from the same seed; the implementation's law is the exact one;
    and the rejections did happen."""
    rejected = 0

    def always_rejects(fwd: object) -> bool:
        nonlocal rejected
        tilted = bool(fwd.mu) and not fwd.log_space and fwd.cert_target is not None  # type: ignore[attr-defined]
        rejected += tilted
        return tilted

    patches = {"certificate_rejects": always_rejects}
    for index in range(40):
        case = LA.make_case(20261207, index)
        gaps, c = LA.mechanism_parameters(case.support)
        opts = {"tilt": 0.9 * c}
        same, got, want = LA.walker_matches_sampler(case.support, index, patches=patches, **opts)
        assert same, f"case {index}: walker {got} sampler {want}\n{case.description}"
        with LA.patched_names(patches):
            law = LA.implementation_law(case.support, gaps, c, **opts)
        tv = LA.total_variation(law, LA.reference_law(case.support))
        assert tv <= 1e-12, f"case {index}: TV {tv:.3g}\n{case.description}"
    assert rejected >= 20, rejected


def _tilted_clamped(m: int = 99) -> tuple[object, object, np.ndarray, float]:
    """The tilted pass the sampler runs on :func:`_clamped_inputs` (n = 10^5)."""
    from app.mechanisms.jointexp import mechanism as MX

    inputs, gaps, c = _clamped_inputs(100_000, m, 1.0)
    inputs = inputs.collapsed(collapse_cap(gaps))  # type: ignore[attr-defined]
    with flush_subnormals():
        fwd = MX.forward_pass(
            inputs.logw,
            inputs.pos,
            gaps,
            c,
            MEMORY_BUDGET_BYTES,
            "scaled",
            True,
            inputs.lw_ref,
            inputs,
        )
        if not fwd.mu:  # the untilted rows held; the sampler's last draw then retilts
            fwd = MX.next_tilted_pass(fwd, MEMORY_BUDGET_BYTES, inputs)
    assert fwd is not None and fwd.mu > 0.0 and not fwd.log_space
    return fwd, inputs, gaps, c


def test_a_pass_given_up_stops_its_error_pass_and_one_drawn_from_after_all_is_certified() -> None:
    """A pass given up before its last draw (a draw tripped) stops its error pass's thread;
    should it be drawn from after all, its certificate is computed then, in full, and is
    the one the uninterrupted pass gives."""
    from app.mechanisms.jointexp.draws import certificate_rejects, draw_block

    fwd_a, inputs, gaps, _ = _tilted_clamped()
    fwd_b, _, _, _ = _tilted_clamped()
    m = gaps.size - 1
    stream = fwd_b._stream  # type: ignore[attr-defined]
    fwd_b.abandon()  # type: ignore[attr-defined]
    assert stream.join() is None  # cancelled: the thread ended without a result
    with flush_subnormals():
        for fwd in (fwd_a, fwd_b):
            draw_block(
                fwd,
                m,
                inputs.logw.size,
                int(inputs.pos[-1]),
                float(gaps[m]),
                np.random.default_rng(0),
            )  # type: ignore[attr-defined, arg-type]
            assert not certificate_rejects(fwd)  # type: ignore[arg-type]
    assert fwd_a._certified == fwd_b._certified  # type: ignore[attr-defined]
    assert math.isfinite(fwd_a._certified)  # type: ignore[attr-defined]
    # once the last draw set its target, giving the pass up leaves its certificate alone
    fwd_a.abandon()  # type: ignore[attr-defined]
    assert fwd_a._stream.join() is not None  # type: ignore[attr-defined]


def test_the_certificate_computed_beside_the_sweep_is_the_one_computed_in_place() -> None:
    """The sweep's first draw starts the certificate in a thread (its target is set there);
    the value read after the sweep is bit for bit the one computed in place, and a pass
    given up while it runs (:meth:`halt`) stops the thread and, read after all, computes it
    in full."""
    from app.mechanisms.jointexp.draws import certificate_rejects, draw_block

    fwd_a, inputs, gaps, _ = _tilted_clamped()
    fwd_b, _, _, _ = _tilted_clamped()
    fwd_c, _, _, _ = _tilted_clamped()
    m = gaps.size - 1
    args = (m, inputs.logw.size, int(inputs.pos[-1]), float(gaps[m]))  # type: ignore[attr-defined]
    with flush_subnormals():
        draw_block(fwd_a, *args, np.random.default_rng(0))  # type: ignore[arg-type]
        checker = fwd_a._checker  # type: ignore[attr-defined]
        assert checker is not None  # started at the sweep's first draw
        target = fwd_a.cert_target  # type: ignore[attr-defined]
        assert target is not None
        assert not certificate_rejects(fwd_a)  # type: ignore[arg-type]
        in_place = fwd_b.certified_error(target)  # type: ignore[attr-defined]
        assert fwd_a._certified == in_place  # type: ignore[attr-defined]
        assert math.isfinite(in_place)
        draw_block(fwd_c, *args, np.random.default_rng(0))  # type: ignore[arg-type]
        halted = fwd_c._checker  # type: ignore[attr-defined]
        assert halted is not None
        fwd_c.halt()  # type: ignore[attr-defined]
        halted._thread.join(timeout=60)
        assert not halted._thread.is_alive()
        assert fwd_c.certified_error(target) == in_place  # type: ignore[attr-defined]


def test_a_sweep_that_fails_stops_the_certificate_it_started() -> None:
    """An error out of the sweep (after its first draw started the certificate) halts the
    pass: nothing will read its certificate, so its thread stops."""
    import pytest

    from app.mechanisms.jointexp import mechanism as MX

    fwd, inputs, gaps, c = _tilted_clamped()
    real = MX.draw_block
    calls = []

    def failing(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 2:
            raise MemoryError("injected")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    MX.draw_block = failing  # type: ignore[assignment]
    try:
        with flush_subnormals(), pytest.raises(MemoryError):
            MX._sweep(
                fwd,  # type: ignore[arg-type]
                inputs,  # type: ignore[arg-type]
                gaps,
                c,
                np.random.default_rng(0),
                MEMORY_BUDGET_BYTES,
                "scaled",
                True,
            )
    finally:
        MX.draw_block = real
    checker = fwd._checker  # type: ignore[attr-defined]
    assert checker is not None and fwd._stop.is_set()  # type: ignore[attr-defined]
    checker._thread.join(timeout=60)
    assert not checker._thread.is_alive()


def _full_kernel_reference(
    T: np.ndarray,
    lo: int,
    scale: float,
    w: np.ndarray,
    P: np.ndarray,
    nj: float,
    c: float,
    mu: float,
) -> np.ndarray:
    """``w[lo+v] scale sum_u T[u] K(P[lo+v] - P[lo+u] - nj)`` over every u, densely."""
    n_out = w.size - lo
    x = P[lo : lo + n_out, None].astype(float) - P[lo : lo + T.size][None, :] - nj
    k = np.exp(-c * np.abs(x) - mu * x)
    return np.asarray(w[lo:] * scale * (k @ T), dtype=np.float64)


def test_the_majorant_transition_is_the_full_kernel_sum_and_above_the_causal_one() -> None:
    """The error passes' window-free transition sums the tilted kernel over every stored
    entry: equal to a dense sum to rounding, and at least the causal transition the rows
    use (an entry-wise larger operator, so the certificate stays an upper bound)."""
    from app.mechanisms.jointexp import kernels_linear as KL

    rng = np.random.default_rng(20261207)
    for _ in range(300):
        n = int(rng.integers(2, 60))
        P = np.cumsum(rng.integers(1, 6, n)).astype(np.int64)
        w = rng.uniform(0.01, 1.0, n)
        c = float(rng.uniform(0.05, 3.0))
        mu = c * float(rng.uniform(0.0, 0.95))
        nj = float(rng.uniform(0.0, 3.0 * P[-1] / 4))
        lo = int(rng.integers(0, n - 1))
        T = rng.uniform(0.0, 1.0, int(rng.integers(1, n - lo + 1)))
        pw = np.exp(-(c - mu) * np.arange(int(P[-1]) + 2))
        pwf = np.exp(-(c + mu) * np.arange(int(P[-1]) + 2))
        full = np.zeros(n - lo)
        causal = np.zeros(n - lo)
        KL.transition_majorant(T, lo, 0.7, w, P, nj, c, mu, pw, pwf, np.empty(T.size), full)
        KL.transition_linear(T, lo, 0.7, w, P, nj, c, mu, pw, pwf, np.empty(T.size), causal)
        ref = _full_kernel_reference(T, lo, 0.7, w, P, nj, c, mu)
        assert np.allclose(full, ref, rtol=1e-12, atol=1e-300), (full, ref)
        assert np.all(full >= causal * (1.0 - 1e-13))
        # and it holds more than the causal sum where an entry at or right of v is stored
        assert np.any(full > causal * (1.0 + 1e-12))


def test_the_certificate_with_the_majorant_everywhere_bounds_the_dropped_mass() -> None:
    """The 600 grids again with every error pass on the window-free transition (normally
    only where its extra terms are 30 e-folds down): still at least the exact D·Z."""
    saved = CE.MAJORANT_FROM
    CE.MAJORANT_FROM = -math.inf  # type: ignore[misc]
    try:
        checked = 0
        for index in range(CASES):
            got = _check(index)
            if got is None:
                continue
            checked += 1
            assert got[0] <= got[1] + 1e-9, f"case {index}: log D·Z {got[0]} > {got[1]}"
    finally:
        CE.MAJORANT_FROM = saved  # type: ignore[misc]
    assert checked >= 40, checked


def test_a_second_level_run_beside_the_first_is_the_one_run_after_it() -> None:
    """Passes with many rows run the second error pass beside the first, on its rows as they
    come (``FOLLOW_FROM``): where the certificate needs it (m = 299 at n = 10^5: the first
    level's remainder is above its exact part), the value is bit for bit the one computed
    with the second level run after the first; a pass given up stops both threads."""
    saved = FW.FOLLOW_FROM
    counts: list[str] = []
    saved_result = CE.Level.result

    def counted(self: CE.Level) -> float:
        counts.append("follower" if self is followed else "level")
        return saved_result(self)

    try:
        FW.FOLLOW_FROM = 1  # type: ignore[misc]
        fwd_a, _, _, _ = _tilted_clamped(299)
        fwd_c, _, _, _ = _tilted_clamped(299)
        FW.FOLLOW_FROM = 10**9  # type: ignore[misc]
        fwd_b, _, _, _ = _tilted_clamped(299)
    finally:
        FW.FOLLOW_FROM = saved  # type: ignore[misc]
    first_a = fwd_a._stream.join()  # type: ignore[attr-defined]
    assert first_a is not None and first_a.follower is not None
    assert fwd_b._stream.join().follower is None  # type: ignore[attr-defined]
    followed = first_a.follower.level
    # a target above the first level's exact part and below its remainder: a second level
    target = first_a.result() + 1.0
    CE.Level.result = counted  # type: ignore[method-assign]
    try:
        with flush_subnormals():
            got = fwd_a.certified_error(target)  # type: ignore[attr-defined]
            want = fwd_b.certified_error(target)  # type: ignore[attr-defined]
    finally:
        CE.Level.result = saved_result  # type: ignore[method-assign]
    assert "follower" in counts  # the second level read was the one run beside the first
    assert got == want and math.isfinite(got)
    # given up: the first error pass and its follower stop
    first_c = fwd_c._stream.level  # type: ignore[attr-defined]
    fwd_c.abandon()  # type: ignore[attr-defined]
    assert fwd_c._stream.join() is None  # type: ignore[attr-defined]
    follower = first_c.follower
    assert follower is not None
    follower._thread.join(timeout=60)
    assert not follower._thread.is_alive()


def test_a_chain_of_levels_side_by_side_is_the_levels_run_one_after_another() -> None:
    """Where several more levels are expected, up to ``CHAIN`` run side by side, each on the
    previous one's rows as they come (m = 699 at n = 10^5, a target that needs a chain of
    three): the certificate is bit for bit the one with the levels two at a time, with and
    without the second level beside the first."""
    follows: list[int] = []
    saved_init = threads.Stream.__init__

    def recording(self: threads.Stream, make: object, follow: int = 0) -> None:
        follows.append(follow)
        saved_init(self, make, follow)  # type: ignore[arg-type]

    values = []
    saved_chain, saved_follow = CE.CHAIN, FW.FOLLOW_FROM
    try:
        for chain, follow_from in ((4, saved_follow), (2, saved_follow), (2, 10**9)):
            CE.CHAIN, FW.FOLLOW_FROM = chain, follow_from  # type: ignore[misc]
            fwd, _, _, _ = _tilted_clamped(699)
            first = fwd._stream.join()  # type: ignore[attr-defined]
            target = first.result() + 1.0
            follows.clear()
            threads.Stream.__init__ = recording  # type: ignore[method-assign]
            try:
                with flush_subnormals():
                    values.append(fwd.certified_error(target))  # type: ignore[attr-defined]
            finally:
                threads.Stream.__init__ = saved_init  # type: ignore[method-assign]
            if chain == 4:
                assert max(follows) >= 1, follows  # a chain of three levels was started
    finally:
        CE.CHAIN, FW.FOLLOW_FROM = saved_chain, saved_follow  # type: ignore[misc]
    assert values[0] == values[1] == values[2] and math.isfinite(values[0]), values

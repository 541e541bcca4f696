"""Grid histograms and run_grid: exact discrete laws, integer-only final draws, the contract."""

from __future__ import annotations

import collections
import itertools
import math

import numpy as np
import pytest
from scipy import stats

from app.mechanisms import GRID_POINTS_MAX, MECHANISMS, GridHistogram, MechanismInputError
from app.mechanisms.rng import uniform_integer
from tests.mechanisms.exact import chi_square_p

NAMES = sorted(MECHANISMS)


def hist_of(records: list[int], grid_points: int) -> GridHistogram:
    cells, counts = np.unique(np.asarray(records, dtype=np.int64), return_counts=True)
    return GridHistogram.from_arrays(cells, counts.astype(np.int64), grid_points)


# --------------------------------------------------------------------- brute-force references


def grid_tuple_probs(
    records: list[int],
    quantiles: list[float],
    *,
    epsilon: float,
    grid_points: int,
    neighbors: str,
    sensitivity: float,
    single: bool = False,
) -> dict[tuple[int, ...], float]:
    """The exponential mechanism over ordered m-tuples of grid points, read off sorted.

    Straight from the definition, with no code shared with the sampler: the utility of a
    sorted tuple y is ``-sum_j |#{x <= y_j} - #{x <= y_{j-1}} - n_j|`` (positions 0 and n at
    the ends); an ordered tuple has the utility of its sorted version, so the sorted tuple
    y has probability ∝ ``exp(eps u / (2 Δ)) * m! / prod(multiplicities!)``. ``single``: the
    single-quantile utility ``-|#{x <= y} - q n|`` (m = 1) instead.
    """
    x = sorted(records)
    n = len(x)
    q = np.asarray(quantiles, dtype=float)
    nj = np.diff(np.concatenate(([0.0], q, [1.0]))) * n
    m = q.size
    logp: dict[tuple[int, ...], float] = {}
    for y in itertools.combinations_with_replacement(range(grid_points), m):
        pos = [0] + [sum(1 for v in x if v <= yj) for yj in y] + [n]
        if single:
            u = -abs(pos[1] - q[0] * n)
        else:
            u = -sum(abs(pos[j + 1] - pos[j] - nj[j]) for j in range(m + 1))
        orderings = math.factorial(m) / math.prod(math.factorial(y.count(v)) for v in set(y))
        logp[y] = epsilon * u / (2.0 * sensitivity) + math.log(orderings)
    top = max(logp.values())
    z = sum(math.exp(v - top) for v in logp.values())
    return {y: math.exp(v - top) / z for y, v in logp.items()}


def jointexp_sens(q: list[float], neighbors: str) -> float:
    gaps = np.diff(np.concatenate(([0.0], q, [1.0])))
    return 2.0 if neighbors == "swap" else 2.0 * (1.0 - float(gaps.min()))


GRID_CASES = [
    # (records as grid cells, quantiles, epsilon, grid_points, neighbors)
    ([1, 1, 3, 3, 3, 4, 6], [0.3, 0.7], 2.0, 8, "swap"),  # ties, interior
    ([0, 0, 0, 2, 5, 7, 7], [0.25, 0.5, 0.75], 3.0, 8, "add_remove"),  # clamped to both ends
    ([2, 2, 2, 2, 2, 3], [0.2, 0.5, 0.9], 1.5, 7, "swap"),  # one long tie run
]


def _draw_jointexp(case, draws: int, seed: int) -> collections.Counter[tuple[int, ...]]:
    records, q, eps, k1, nb = case
    hist = hist_of(records, k1)
    rng = np.random.default_rng(seed)
    mech = MECHANISMS["jointexp"]
    counts: collections.Counter[tuple[int, ...]] = collections.Counter()
    for _ in range(draws):
        out = mech.run_grid(hist, q, epsilon=eps, delta=None, neighbors=nb, rng=rng)
        counts[tuple(int(v) for v in out)] += 1
    return counts


@pytest.mark.parametrize("case", GRID_CASES, ids=["ties", "clamped", "tie-run"])
def test_jointexp_grid_law_is_exact_and_1_5_eps_is_rejected(case) -> None:
    records, q, eps, k1, nb = case
    draws = 20_000
    observed = _draw_jointexp(case, draws, seed=31 + len(records))
    sens = jointexp_sens(q, nb)
    exact = grid_tuple_probs(
        records, q, epsilon=eps, grid_points=k1, neighbors=nb, sensitivity=sens
    )
    assert chi_square_p(observed, exact, draws) > 1e-4  # type: ignore[arg-type]
    wrong = grid_tuple_probs(
        records, q, epsilon=1.5 * eps, grid_points=k1, neighbors=nb, sensitivity=sens
    )
    assert chi_square_p(observed, wrong, draws) < 1e-4  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["indexp", "aq"])
@pytest.mark.parametrize(
    ("records", "q", "eps", "k1", "nb"),
    [
        ([1, 1, 3, 3, 3, 4, 6, 6], 0.5, 2.0, 9, "swap"),
        ([0, 0, 0, 2, 5, 8, 8], 0.3, 2.5, 9, "add_remove"),  # clamped to both ends
    ],
    ids=["ties", "clamped"],
)
def test_single_quantile_em_grid_law_is_exact(name, records, q, eps, k1, nb) -> None:
    """m = 1: IndExp and AQ are the exponential mechanism over the grid points."""
    sens = 1.0 if nb == "swap" else max(q, 1.0 - q)
    hist = hist_of(records, k1)
    rng = np.random.default_rng(5)
    draws = 20_000
    counts: collections.Counter[tuple[int, ...]] = collections.Counter()
    for _ in range(draws):
        out = MECHANISMS[name].run_grid(hist, [q], epsilon=eps, delta=None, neighbors=nb, rng=rng)
        counts[(int(out[0]),)] += 1
    exact = grid_tuple_probs(
        records, [q], epsilon=eps, grid_points=k1, neighbors=nb, sensitivity=sens, single=True
    )
    assert chi_square_p(counts, exact, draws) > 1e-4  # type: ignore[arg-type]
    wrong = grid_tuple_probs(
        records,
        [q],
        epsilon=1.5 * eps,
        grid_points=k1,
        neighbors=nb,
        sensitivity=sens,
        single=True,
    )
    assert chi_square_p(counts, wrong, draws) < 1e-4  # type: ignore[arg-type]


# --------------------------------------------------------------------- integer-only final draw


class _Words:
    """A stand-in generator: only ``bit_generator.random_raw`` exists (no float methods)."""

    def __init__(self, words: list[int]) -> None:
        self.words = list(words)
        self.calls = 0
        self.bit_generator = self

    def random_raw(self) -> int:
        self.calls += 1
        return self.words.pop(0)


def test_uniform_integer_is_lemire_on_raw_words_without_floats() -> None:
    two64 = 1 << 64
    s = 3
    threshold = (two64 - s) % s  # = 1: the word whose low product half is 0 is rejected
    # x = 0 -> low half 0 < threshold: rejected; next word 2^63 -> (2^63 * 3) >> 64 = 1
    gen = _Words([0, 1 << 63])
    assert uniform_integer(10, 13, gen) == 11
    assert gen.calls == 2 and threshold == 1
    # A range above 2^53 (floats cannot even hold its points): exact Python-integer result.
    s = (1 << 62) * 3 + 12345
    x = 0xDEADBEEFCAFEBABE12345678 & ((1 << 64) - 1)
    gen = _Words([x])
    assert uniform_integer(7, 7 + s, gen) == 7 + ((x * s) >> 64)
    assert gen.calls == 1
    with pytest.raises(ValueError):
        uniform_integer(5, 5, _Words([]))


def _low_bits_p(values: list[int], bits: int = 6) -> float:
    low = collections.Counter(v & ((1 << bits) - 1) for v in values)
    obs = [low.get(k, 0) for k in range(1 << bits)]
    return float(stats.chisquare(obs).pvalue)


def test_uniform_integer_is_exactly_uniform_where_floats_lose_bits() -> None:
    """Range 3·2^61: a double uniform (53 bits) cannot reach most integers; ours can."""
    s = 3 << 61
    rng = np.random.default_rng(2024)
    ours = [uniform_integer(0, s, rng) for _ in range(20_000)]
    assert _low_bits_p(ours) > 1e-4
    assert max(ours) < s
    # Control: the float formula floor(u * s) has all-zero low bits and fails the same test.
    floats = [int(rng.random() * s) for _ in range(20_000)]
    assert _low_bits_p(floats) < 1e-4


def test_run_grid_final_points_go_through_the_integer_draw(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a 2^53-point grid every final point comes from uniform_integer with integer bounds."""
    import app.mechanisms.histogram as histmod

    seen: list[tuple[int, int]] = []
    real = histmod.uniform_integer

    def spy(low: int, high: int, rng: object) -> int:
        assert isinstance(low, int) and isinstance(high, int)
        seen.append((low, high))
        return real(low, high, rng)

    monkeypatch.setattr(histmod, "uniform_integer", spy)
    k1 = GRID_POINTS_MAX
    hist = GridHistogram.from_arrays([1, 5, k1 - 2], [3, 4, 3], k1)
    rng = np.random.default_rng(8)
    outs = []
    for _ in range(3000):
        out = MECHANISMS["jointexp"].run_grid(hist, [0.5], epsilon=1.0, delta=None, rng=rng)
        outs.append(int(out[0]))
    assert len(seen) == 3000
    assert all(0 <= v <= k1 - 1 for v in outs)
    # The median lands in the huge block [5, k1 - 2) almost always; its low bits are uniform.
    inside = [v for v, (lo, hi) in zip(outs, seen, strict=True) if hi - lo > 2**50]
    assert len(inside) > 2500
    assert _low_bits_p(inside, bits=4) > 1e-4


# --------------------------------------------------------------------- GridHistogram


@pytest.mark.parametrize(
    ("cells", "counts", "k1", "param"),
    [
        ([], [], 10, "cells"),
        ([1, 1], [1, 1], 10, "cells"),
        ([3, 2], [1, 1], 10, "cells"),
        ([-1, 2], [1, 1], 10, "cells"),
        ([2, 10], [1, 1], 10, "cells"),
        ([1, 2], [1, 0], 10, "counts"),
        ([1, 2], [1], 10, "counts"),
        ([1, 2], [1, 1], 1, "grid_points"),
        ([1, 2], [1, 1], GRID_POINTS_MAX + 1, "grid_points"),
        ([0.5, 2.0], [1, 1], 10, "cells"),
    ],
)
def test_histogram_validation_names_the_field(cells, counts, k1, param) -> None:
    with pytest.raises(MechanismInputError) as info:
        GridHistogram.from_arrays(np.asarray(cells), np.asarray(counts, dtype=np.int64), k1)
    assert info.value.parameter == param


@pytest.mark.parametrize(
    ("size", "count"),
    [
        (4096, 2**52),  # exactly 2^64: a uint64 sum wraps to 0
        (4097, 2**52),  # 2^64 + 2^52: wraps to 2^52, which is below the cap
        (3, 2**53 - 1),  # a total just above 2^54, no wrap
        (2, 2**52 + 1),  # 2^53 + 2: just above the cap
    ],
)
def test_a_total_above_2_pow_53_is_refused_however_it_sums(size: int, count: int) -> None:
    """Issue 28: the total was summed in uint64, which wraps: 4,096 counts of 2^52 summed to
    0 and the histogram was accepted with n = 0."""
    cells = np.arange(size, dtype=np.int64)
    counts = np.full(size, count, dtype=np.int64)
    with pytest.raises(MechanismInputError) as info:
        GridHistogram.from_arrays(cells, counts, size + 1)
    assert info.value.parameter == "counts"
    ok = GridHistogram.from_arrays(np.arange(2), np.asarray([2**52, 2**52]), 3)
    assert ok.n == 2**53  # the cap itself is allowed


def test_histogram_from_values_clamps_and_counts() -> None:
    h = GridHistogram.from_values([-5.0, 0.04, 0.06, 0.06, 0.3, 9.0], 0.0, 0.3, 0.1)
    assert h.grid_points == 4
    np.testing.assert_array_equal(h.cells, [0, 1, 3])
    np.testing.assert_array_equal(h.counts, [2, 2, 2])
    assert h.n == 6


# --------------------------------------------------------------------- contract for run_grid


def _run_grid(name: str, hist: GridHistogram, q, **kw):
    mech = MECHANISMS[name]
    delta = kw.pop("delta", 1e-6 if mech.uses_delta else None)
    return mech.run_grid(hist, q, epsilon=kw.pop("epsilon", 1.0), delta=delta, **kw)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("m", [1, 5, 17])
def test_run_grid_contract(name: str, m: int) -> None:
    rng = np.random.default_rng(3)
    k1 = 2001
    records = np.clip(np.rint(rng.normal(1000, 150, size=3000)), 0, k1 - 1).astype(np.int64)
    records[:50] = 0  # clamped to the lower end
    records[50:120] = k1 - 1  # and to the upper end
    hist = hist_of(list(records), k1)
    q = np.arange(1, m + 1) / (m + 1)
    for neighbors in ("swap", "add_remove"):
        try:
            out = _run_grid(name, hist, q, neighbors=neighbors, rng=np.random.default_rng(1))
        except MechanismInputError as e:
            assert e.parameter == "neighbors"
            continue
        assert out.shape == (m,)
        assert out.dtype == np.int64
        assert np.all(np.diff(out) >= 0)
        assert np.all((out >= 0) & (out <= k1 - 1))
        again = _run_grid(name, hist, q, neighbors=neighbors, rng=np.random.default_rng(1))
        np.testing.assert_array_equal(out, again)


@pytest.mark.parametrize("name", NAMES)
def test_run_grid_default_rng_and_delta_rules(name: str) -> None:
    mech = MECHANISMS[name]
    hist = GridHistogram.from_arrays(np.arange(0, 10**6, 7), np.full(142858, 3), 10**6 + 1)
    outs = {tuple(_run_grid(name, hist, [0.1, 0.5, 0.9], rng=None)) for _ in range(3)}
    assert len(outs) > 1  # a fresh CSPRNG stream each call
    if mech.uses_delta:
        with pytest.raises(MechanismInputError) as info:
            mech.run_grid(hist, [0.5], epsilon=1.0, delta=None)
        assert info.value.parameter == "delta"
    else:
        with pytest.raises(MechanismInputError) as info:
            mech.run_grid(hist, [0.5], epsilon=1.0, delta=1e-6)
        assert info.value.parameter == "delta"
    with pytest.raises(MechanismInputError) as info:
        _run_grid(name, [1, 2, 3], [0.5])  # type: ignore[arg-type]
    assert info.value.parameter == "hist"
    with pytest.raises(MechanismInputError) as info:
        _run_grid(name, hist, [0.5], epsilon=0.0)
    assert info.value.parameter == "epsilon"


@pytest.mark.parametrize("name", ["jointexp", "indexp", "appindexp", "aq"])
def test_run_grid_never_outputs_an_empty_block(name: str) -> None:
    """All records in cells 0 and K: outputs only from blocks that hold grid points."""
    k1 = 6
    hist = GridHistogram.from_arrays([0, 3, 5], [4, 1, 4], k1)
    rng = np.random.default_rng(9)
    seen: set[int] = set()
    for _ in range(400):
        seen.update(int(v) for v in _run_grid(name, hist, [0.2, 0.5, 0.8], rng=rng))
    assert seen <= set(range(k1))
    assert len(seen) >= 3


def test_run_grid_agrees_with_the_value_call_on_a_unit_grid() -> None:
    """Integers on the grid 0..K: the grid medians sit where the value call's do."""
    rng = np.random.default_rng(4)
    x = np.rint(rng.normal(500, 40, size=20_000))
    hist = GridHistogram.from_values(x, 0.0, 1000.0, 1.0)
    grid = MECHANISMS["jointexp"].run_grid(hist, [0.25, 0.5, 0.75], epsilon=1.0, delta=None)
    true = np.quantile(x, [0.25, 0.5, 0.75])
    assert np.max(np.abs(grid - true)) <= 2


@pytest.mark.parametrize("name", NAMES)
def test_a_kept_histogram_draws_what_fresh_ones_draw(name: str) -> None:
    """Runs on one histogram reuse what its first run derived (``memo``): bit for bit the
    draws of histograms built afresh from the same arrays, whatever the quantiles, epsilon
    and neighbours of the runs before."""
    rng = np.random.default_rng(11)
    k1 = 3_000_001
    records = np.clip(np.rint(rng.normal(1.5e6, 2e5, size=1000)), 0, k1 - 1).astype(np.int64)
    cells, counts = np.unique(records, return_counts=True)
    kept = GridHistogram.from_arrays(cells, counts.astype(np.int64), k1)
    queries = [
        (np.arange(1, 10) / 10, 0.001, "swap"),
        (np.arange(1, 100) / 100, 1.0, "swap"),
        ([0.5], 0.1, "add_remove"),
        (np.arange(1, 10) / 10, 1.0, "add_remove"),
    ]
    for seed, (q, eps, nb) in enumerate(queries * 2):
        if nb not in MECHANISMS[name].neighbors:
            continue
        fresh = GridHistogram.from_arrays(cells, counts.astype(np.int64), k1)
        want = _run_grid(name, fresh, q, epsilon=eps, neighbors=nb, rng=np.random.default_rng(seed))
        got = _run_grid(name, kept, q, epsilon=eps, neighbors=nb, rng=np.random.default_rng(seed))
        np.testing.assert_array_equal(got, want)
    if name == "jointexp":
        assert kept.memo  # the prepared inputs were kept


def test_a_histogram_is_read_only() -> None:
    cells = np.array([1, 4, 9], dtype=np.int64)
    hist = GridHistogram.from_arrays(cells, [2, 1, 3], 10)
    for arr in (hist.cells, hist.counts):
        with pytest.raises(ValueError):
            arr[0] = 0
    assert cells.flags.writeable  # the caller's array is left as it was

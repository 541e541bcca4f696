"""Smoothed JointExp: the jitter's law, JointExp on the jittered histogram, exact law, privacy."""

from __future__ import annotations

import collections
import itertools
import math

import numpy as np
import pytest
from scipy import stats

from app.experiments.metric import missed_points
from app.mechanisms import MECHANISMS, GridHistogram, MechanismInputError
from app.mechanisms import jointexp_smooth as js
from app.mechanisms.histogram import support_from_grid
from app.mechanisms.rng import uniform_bits
from tests.mechanisms.exact import chi_square_p
from tests.mechanisms.test_grid import grid_tuple_probs, hist_of, jointexp_sens

SMOOTH = MECHANISMS["jointexp_smooth"]


# ----------------------------------------------------------------------------- the jitter


class _Words:
    """A stand-in bit generator handing out the given raw words."""

    def __init__(self, words: list[int]) -> None:
        self.words = list(words)
        self.bit_generator = self

    def random_raw(self, size: int) -> np.ndarray:
        out, self.words = self.words[:size], self.words[size:]
        return np.asarray(out, dtype=np.uint64)


def test_uniform_bits_are_the_top_bits_of_raw_words() -> None:
    words = [0, 1 << 63, (1 << 64) - 1, 0x0123_4567_89AB_CDEF]
    assert uniform_bits(1, 4, _Words(words)).tolist() == [0, 1, 1, 0]
    assert uniform_bits(10, 4, _Words(words)).tolist() == [w >> 54 for w in words]
    assert uniform_bits(64, 4, _Words(words)).tolist() == words
    assert uniform_bits(0, 3, _Words([])).tolist() == [0, 0, 0]
    with pytest.raises(ValueError):
        uniform_bits(65, 1, _Words([0]))


def test_substep_bits_use_public_quantities_and_bound_the_work() -> None:
    assert js.substep_bits(201) == js.SUBSTEP_BITS  # integers on [-100, 100], step 1
    assert js.substep_bits(2_000_001) == 1  # the service's default grid, n unknown
    assert js.substep_bits(2_000_001, n=100_000) == js.SUBSTEP_BITS  # swap: n public
    assert js.substep_bits(2_000_001, n=js.REFINED_MAX + 1) == 1
    for k1 in (2, 1000, 2**21, 2**22, 2**43 + 1, 2**50, 2**53):
        for n in (None, 10, js.REFINED_MAX, js.REFINED_MAX + 1):
            b = js.substep_bits(k1, n)
            assert 0 <= b <= js.SUBSTEP_BITS
            assert k1 << b <= 2**53
            assert min(n or 2**60, k1 << b) <= max(js.REFINED_MAX, k1)
    assert js.substep_bits(2**53, n=10) == 0


def _multinomial_law(c: int, r: int) -> dict[tuple[int, ...], float]:
    law = {}
    for split in itertools.product(range(c + 1), repeat=r):
        if sum(split) == c:
            law[split] = float(stats.multinomial.pmf(split, c, [1.0 / r] * r))
    return law


@pytest.mark.parametrize(
    "light_factor", [1 << 40, 0, 1], ids=["light path", "heavy path", "light and heavy"]
)
def test_jitter_is_an_independent_uniform_offset_per_record(
    light_factor: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each cell's count is split multinomially (uniform, independent per record) over its
    own sub-cells; nothing leaves its cell; cells are jittered independently. Every cell on
    the exact per-record path, every cell on the binomial path, and (LIGHT_FACTOR = 1, R = 4)
    the 6-record cell on the binomial path with the two small ones on the per-record path."""
    monkeypatch.setattr(js, "LIGHT_FACTOR", light_factor)
    cells = np.asarray([0, 3, 7], dtype=np.int64)
    counts = np.asarray([6, 1, 2], dtype=np.int64)
    bits, r = 2, 4
    rng = np.random.default_rng(11)
    draws = 20_000
    seen: collections.Counter[tuple[int, ...]] = collections.Counter()
    pair: collections.Counter[tuple[int, int]] = collections.Counter()
    for _ in range(draws):
        fine, fc = js.jitter_cells(cells, counts, bits, rng)
        assert np.all(np.diff(fine) > 0)
        owner = fine >> bits
        assert np.array_equal(np.bincount(owner, weights=fc, minlength=8)[cells], counts)
        split = np.zeros(r, dtype=np.int64)
        sel = owner == 0
        split[fine[sel] - 0] = fc[sel]
        seen[tuple(int(v) for v in split)] += 1
        pair[(int(fine[owner == 3][0] - 12), int(fine[owner == 7][0] - 28))] += 1
    assert chi_square_p(seen, _multinomial_law(6, r), draws) > 1e-4  # type: ignore[arg-type]
    # the single record of cell 3 and the lowest sub-cell of cell 7: independent draws
    law7 = collections.Counter()
    for a, b in itertools.product(range(r), repeat=2):
        law7[min(a, b)] += 1.0 / 16
    joint = {(o, lo): (1.0 / r) * law7[lo] for o in range(r) for lo in range(r)}
    assert chi_square_p(pair, joint, draws) > 1e-4  # type: ignore[arg-type]
    wrong = dict(seen)  # negative control: a split that is not uniform is detected
    skew = {k: v * (1.5 if k[0] > k[1] else 1.0) for k, v in _multinomial_law(6, r).items()}
    z = sum(skew.values())
    assert chi_square_p(wrong, {k: v / z for k, v in skew.items()}, draws) < 1e-4  # type: ignore[arg-type]


class _Spy:
    """Wraps a generator; counts the raw words and binomial draws that jitter_cells takes.

    Only ``bit_generator.random_raw`` and ``binomial`` exist: any other source of randomness
    would fail with AttributeError."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.words = 0
        self.draws = 0
        self.bit_generator = self

    def random_raw(self, size: int) -> np.ndarray:
        self.words += int(size)
        return self.rng.bit_generator.random_raw(size)

    def binomial(self, n: np.ndarray, p: float) -> np.ndarray:
        self.draws += int(np.size(n))
        return self.rng.binomial(n, p)


def test_light_path_offsets_are_the_top_bits_of_raw_words_in_cell_order() -> None:
    """Light cells: one raw word per record, its top bits the offset (stand-in generator, which
    has no binomial: the light path draws nothing else)."""
    words = [0, 3 << 62, 1 << 62, 2 << 62, (1 << 64) - 1]  # top 2 bits: 0, 3, 1, 2, 3
    fine, fc = js.jitter_cells(
        np.asarray([1, 5], dtype=np.int64), np.asarray([2, 3], dtype=np.int64), 2, _Words(words)
    )
    # cell 1: offsets {0, 3}; cell 5: offsets {1, 2, 3}
    assert fine.tolist() == [4, 7, 21, 22, 23] and fc.tolist() == [1, 1, 1, 1, 1]
    assert fine.dtype == np.int64 and fc.dtype == np.int64


@pytest.mark.parametrize(("c", "bits"), [(5, 2), (3, 3)])
def test_heavy_path_has_the_multinomial_law(
    c: int, bits: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The binomial split of one cell, forced for every count (LIGHT_FACTOR = 0): the law of
    the sub-cell count vector over 20,000 draws against the exact multinomial pmf."""
    monkeypatch.setattr(js, "LIGHT_FACTOR", 0)
    r = 1 << bits
    cells, counts = np.asarray([9], dtype=np.int64), np.asarray([c], dtype=np.int64)
    rng = np.random.default_rng(100 + c)
    draws = 20_000
    seen: collections.Counter[tuple[int, ...]] = collections.Counter()
    for _ in range(draws):
        spy = _Spy(rng)
        fine, fc = js.jitter_cells(cells, counts, bits, spy)  # type: ignore[arg-type]
        assert spy.words == 0 and 0 < spy.draws <= r - 1  # the heavy path, and only it
        split = np.zeros(r, dtype=np.int64)
        split[fine - 9 * r] = fc
        seen[tuple(int(v) for v in split)] += 1
    law = _multinomial_law(c, r)
    assert chi_square_p(seen, law, draws) >= 1e-3  # type: ignore[arg-type]
    # negative control: the law of a split biased towards the lower half is rejected
    skew = {k: v * (1.0 + 0.3 * (sum(k[: r // 2]) > sum(k[r // 2 :]))) for k, v in law.items()}
    z = sum(skew.values())
    assert chi_square_p(seen, {k: v / z for k, v in skew.items()}, draws) < 1e-3  # type: ignore[arg-type]


def test_heavy_path_large_counts_are_binomial() -> None:
    """Counts far above the light threshold (numpy's BTPE regime, n p > 30): one cell of 4,000
    records on R = 2 sub-cells; the lower sub-cell's count against Binomial(4000, 1/2)."""
    rng = np.random.default_rng(12)
    c, draws = 4000, 20_000
    seen: collections.Counter[int] = collections.Counter()
    for _ in range(draws):
        spy = _Spy(rng)
        fine, fc = js.jitter_cells(
            np.asarray([0], dtype=np.int64),
            np.asarray([c], dtype=np.int64),
            1,
            spy,  # type: ignore[arg-type]
        )
        assert spy.words == 0 and spy.draws == 1
        seen[int(fc[0]) if fine[0] == 0 else 0] += 1
    law = {k: float(stats.binom.pmf(k, c, 0.5)) for k in range(c + 1)}
    assert chi_square_p(seen, law, draws) >= 1e-3  # type: ignore[arg-type]
    shifted = {k: float(stats.binom.pmf(k, c, 0.51)) for k in range(c + 1)}
    assert chi_square_p(seen, shifted, draws) < 1e-3  # type: ignore[arg-type]


@pytest.mark.parametrize("chunk", [js.CHUNK, 64], ids=["one chunk", "many chunks"])
def test_jitter_conserves_counts_and_stays_in_each_cell(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random histograms mixing light and heavy cells (counts 1 .. 10^12), R = 2 .. 2^10:
    the refined cells are strictly increasing int64 inside [k R, (k + 1) R) of their own cell,
    every count >= 1, per-cell totals exact, at most min(n, d R) refined cells."""
    monkeypatch.setattr(js, "CHUNK", chunk)
    g = np.random.default_rng(2024)
    for _ in range(60):
        d = int(g.integers(1, 40))
        bits = int(g.integers(1, 11))
        r = 1 << bits
        cells = np.sort(g.choice(10**6, size=d, replace=False)).astype(np.int64)
        light = g.integers(1, 2 * r + 1, size=d)
        heavy = 2 * r + g.integers(1, 10**12, size=d) // g.integers(1, 10**9, size=d)
        counts = np.where(g.random(d) < 0.5, light, heavy).astype(np.int64)
        fine, fc = js.jitter_cells(cells, counts, bits, g)
        assert fine.dtype == np.int64 and fc.dtype == np.int64
        assert np.all(np.diff(fine) > 0) and np.all(fc >= 1)
        owner = np.searchsorted(cells, fine >> bits)
        assert np.array_equal(cells[owner], fine >> bits)  # inside [k R, (k + 1) R) of a cell
        totals = np.zeros(d, dtype=np.int64)
        np.add.at(totals, owner, fc)
        assert np.array_equal(totals, counts)
        assert fine.size <= min(int(counts.sum()), d * r)


def test_work_is_bounded_by_the_refinement_not_the_count() -> None:
    """No timing: the raw words and binomial draws taken. A cell of 10 records takes 10 words;
    one of 5*10^7, 10^9 or 10^15 records takes no word and at most R - 1 draws (all R - 1
    here: every sub-cell is hit); d mixed cells take at most (LIGHT_FACTOR + 1) d R of both."""
    bits = js.SUBSTEP_BITS
    r = 1 << bits
    one = np.asarray([7], dtype=np.int64)
    spy = _Spy(np.random.default_rng(1))
    js.jitter_cells(one, np.asarray([10], dtype=np.int64), bits, spy)  # type: ignore[arg-type]
    assert (spy.words, spy.draws) == (10, 0)
    for n in (5 * 10**7, 10**9, 10**15):
        spy = _Spy(np.random.default_rng(n))
        fine, fc = js.jitter_cells(one, np.asarray([n], dtype=np.int64), bits, spy)  # type: ignore[arg-type]
        assert (spy.words, spy.draws) == (0, r - 1)
        assert int(fc.sum()) == n and fine.size == r
    g = np.random.default_rng(3)
    d = 1000
    counts = np.minimum(np.ceil(g.lognormal(np.log(30), 3.0, d)), 10**12).astype(np.int64)
    counts[::100] = 10**12  # ten very heavy cells
    spy = _Spy(g)
    js.jitter_cells(np.arange(d, dtype=np.int64), counts, bits, spy)  # type: ignore[arg-type]
    light = counts <= js.LIGHT_FACTOR * r
    assert spy.words == int(counts[light].sum())
    assert spy.draws <= (r - 1) * int((~light).sum())
    assert spy.words + spy.draws <= (js.LIGHT_FACTOR + 1) * d * r
    assert int(counts.sum()) > 100 * (js.LIGHT_FACTOR + 1) * d * r  # n itself is far larger


def test_run_grid_is_jointexp_on_the_jittered_histogram() -> None:
    """Same generator stream: jitter the histogram, run JointExp on the refined grid, floor."""
    x = np.round(np.random.default_rng(3).normal(0, 5, 3000))
    hist = GridHistogram.from_values(x, -100.0, 100.0, 1.0)
    q = np.arange(1, 20) / 20
    for nb in ("swap", "add_remove"):
        out = SMOOTH.run_grid(
            hist, q, epsilon=1.0, delta=None, neighbors=nb, rng=np.random.default_rng(5)
        )
        rng = np.random.default_rng(5)
        k1 = hist.grid_points
        b = js.substep_bits(k1, hist.n if nb == "swap" else None)
        s = js.stretch_bits(k1, b)
        assert s == 1  # 201 points: each end cell weighs two
        fine_cells, fine_counts = js.jitter_cells(hist.cells, hist.counts, b, rng)
        fine = GridHistogram(
            js.warp(fine_cells, k1, b, s), fine_counts, js.stretched_points(k1, b, s)
        )
        ref = MECHANISMS["jointexp"].run_grid(
            fine, q, epsilon=1.0, delta=None, neighbors=nb, rng=rng
        )
        assert np.array_equal(out, js.unwarp_cells(ref, k1, b, s))


def test_the_end_cells_are_stretched_by_a_public_share_of_the_grid() -> None:
    assert js.stretch_bits(2_000_001, 10) == 14  # 2^14 >= 2^-7 * 2,000,001 > 2^13
    assert js.stretch_bits(201, 10) == 1 and js.stretch_bits(129, 10) == 1
    assert js.stretch_bits(128, 10) == 0 and js.stretch_bits(5, 3) == 0
    assert js.stretch_bits(2, 10) == 0 and js.stretch_bits(1, 0) == 0
    # lowered where the stretched grid would pass 2^53 points
    k1 = 1 << 44  # refined by 2^9 to exactly 2^53 points: no room left to stretch
    assert js.substep_bits(k1, 1) == 9 and js.stretch_bits(k1, 9) == 0
    k1 = (1 << 44) - (1 << 30)  # some room
    s = js.stretch_bits(k1, 9)
    assert 0 < s < 37  # 2^37 would be 2^-7 of the grid
    assert js.stretched_points(k1, 9, s) <= 2**53 < js.stretched_points(k1, 9, s + 1)
    for k1, b, s in ((5, 2, 1), (7, 1, 3), (40, 3, 5), (3, 0, 2)):
        r, big = 1 << b, 1 << s
        fine = np.arange(k1 * r, dtype=np.int64)
        pos = js.warp(fine, k1, b, s)
        assert np.all(np.diff(pos) > 0)  # increasing: sorted histograms stay sorted
        assert pos[0] == 0 and pos[-1] < js.stretched_points(k1, b, s)
        assert js.stretched_points(k1, b, s) == 2 * r * big + (k1 - 2) * r
        # the end cells' sub-cells 2^s apart, the others one apart
        assert set(np.diff(pos[:r]).tolist()) <= {big}
        assert set(np.diff(pos[r : (k1 - 1) * r]).tolist()) <= {1}
        assert set(np.diff(pos[(k1 - 1) * r :]).tolist()) <= {big}
        # every position maps back to the cell whose span holds it
        every = np.arange(js.stretched_points(k1, b, s), dtype=np.int64)
        cells = js.unwarp_cells(every, k1, b, s)
        assert np.all(np.diff(cells) >= 0) and cells[0] == 0 and cells[-1] == k1 - 1
        assert np.array_equal(js.unwarp_cells(pos, k1, b, s), fine >> b)
        counts = np.bincount(cells, minlength=k1)
        assert counts[0] == counts[-1] == r * big and set(counts[1:-1].tolist()) <= {r}
    # the service's default grid: the ends of the refined grid and a few cells in between
    k1, b, s = 2_000_001, 10, 14
    fine = np.array([0, 1023, 1024, 5 << 10, (k1 - 1) << 10, (k1 << 10) - 1], dtype=np.int64)
    pos = js.warp(fine, k1, b, s)
    top = (1 << 24) + ((k1 - 2) << 10)  # where the top cell's span starts
    assert pos.tolist() == [0, 1023 << 14, 1 << 24, (1 << 24) + (4 << 10), top,
                            top + (1023 << 14)]  # fmt: skip
    assert js.unwarp_cells(pos, k1, b, s).tolist() == [0, 0, 1, 5, k1 - 1, k1 - 1]


# ----------------------------------------------------------------------- exact law, privacy


def smooth_law(
    records: list[int],
    q: list[float],
    *,
    epsilon: float,
    k1: int,
    nb: str,
    bits: int,
    stretch: int = 0,
) -> dict[tuple[int, ...], float]:
    """The mechanism's law from its definition: average over every offset vector (2^bits per
    record, uniform) of the exponential mechanism over ordered tuples on the refined grid,
    each output tuple mapped back to the cell whose positions hold it. With ``stretch``,
    the end cells' sub-cells lie 2^stretch positions apart (written out here, not through
    the module's own map)."""
    r, big = 1 << bits, 1 << stretch
    sens = jointexp_sens(q, nb)

    def position(x: int, o: int) -> int:
        if x == 0:
            return o * big
        if x == k1 - 1:
            return r * big + (k1 - 2) * r + o * big
        return r * big + (x - 1) * r + o

    def cell(y: int) -> int:
        if y < r * big:
            return 0
        if y >= r * big + (k1 - 2) * r:
            return k1 - 1
        return 1 + (y - r * big) // r

    points = 2 * r * big + (k1 - 2) * r
    law: collections.defaultdict[tuple[int, ...], float] = collections.defaultdict(float)
    for offs in itertools.product(range(r), repeat=len(records)):
        fine = [position(x, o) for x, o in zip(records, offs, strict=True)]
        inner = grid_tuple_probs(
            fine, q, epsilon=epsilon, grid_points=points, neighbors=nb, sensitivity=sens
        )
        for y, p in inner.items():
            law[tuple(cell(v) for v in y)] += p / r ** len(records)
    return dict(law)


LAW_CASES = [
    # (records as grid cells, quantiles, epsilon, grid_points, neighbors, stretch)
    ([1, 1, 1, 3], [0.3, 0.7], 2.0, 5, "swap", 0),  # an atom holding both quantiles
    ([0, 0, 2, 4, 4], [0.25, 0.75], 3.0, 5, "add_remove", 0),  # atoms at both ends
    ([2, 2, 2, 2, 3], [0.3, 0.5, 0.8], 1.5, 5, "swap", 0),  # one long tie run, m = 3
    ([0, 0, 2, 4, 4], [0.25, 0.75], 3.0, 5, "add_remove", 2),  # the ends stretched 4x
    ([1, 2, 4, 4, 4], [0.5, 0.8], 2.0, 5, "swap", 1),  # a clamped pile at the top, 2x
]


@pytest.mark.parametrize(
    "case", LAW_CASES, ids=["atom", "ends", "tie-run", "ends-stretched", "top-pile-stretched"]
)
def test_grid_law_is_exact_and_1_5_eps_is_rejected(case) -> None:
    records, q, eps, k1, nb, stretch = case
    hist = hist_of(records, k1)
    sup = support_from_grid(hist, q, epsilon=eps, neighbors=nb)
    rng = np.random.default_rng(41 + len(records))
    draws = 20_000
    observed: collections.Counter[tuple[int, ...]] = collections.Counter()
    for _ in range(draws):
        out = js.jointexp_smooth_core(sup, rng, bits=1, stretch=stretch)
        observed[tuple(int(v) for v in out)] += 1
    exact = smooth_law(records, q, epsilon=eps, k1=k1, nb=nb, bits=1, stretch=stretch)
    assert abs(sum(exact.values()) - 1.0) < 1e-12
    assert chi_square_p(observed, exact, draws) > 1e-4  # type: ignore[arg-type]
    wrong = smooth_law(records, q, epsilon=1.5 * eps, k1=k1, nb=nb, bits=1, stretch=stretch)
    assert chi_square_p(observed, wrong, draws) < 1e-4  # type: ignore[arg-type]
    if stretch:  # the stretch changes the law: the check tells the two apart
        flat = smooth_law(records, q, epsilon=eps, k1=k1, nb=nb, bits=1)
        assert chi_square_p(observed, flat, draws) < 1e-4  # type: ignore[arg-type]


@pytest.mark.parametrize(("bits", "stretch"), [(1, 0), (2, 0), (1, 2)])
@pytest.mark.parametrize(
    ("records", "neighbour", "nb"),
    [
        ([1, 1, 1, 3], [1, 1, 3, 3], "swap"),
        ([1, 1, 1, 3], [0, 1, 1, 3], "swap"),
        ([0, 2, 2, 4], [0, 2, 2, 2], "swap"),
        ([1, 1, 1, 3], [1, 1, 1, 1, 3], "add_remove"),
        ([0, 2, 2, 4], [0, 2, 4], "add_remove"),
    ],
)
def test_privacy_ratio_of_exact_laws_is_bounded_by_e_eps(
    bits, stretch, records, neighbour, nb
) -> None:
    """Every output's probability under X and a neighbour X' (exact, from the definition)
    differ by at most e^eps, as the coupling argument in the module docstring says."""
    q, eps, k1 = [0.3, 0.7], 1.0, 5
    p = smooth_law(records, q, epsilon=eps, k1=k1, nb=nb, bits=bits, stretch=stretch)
    p2 = smooth_law(neighbour, q, epsilon=eps, k1=k1, nb=nb, bits=bits, stretch=stretch)
    assert set(p) == set(p2)
    worst = max(max(p[y] / p2[y], p2[y] / p[y]) for y in p)
    assert worst <= math.exp(eps) * (1 + 1e-9)
    assert worst > 1.05  # the neighbours are distinguishable at all: the check has teeth


# ------------------------------------------------------------------------ raw-value path


def test_raw_path_parameters_and_bounds() -> None:
    x = np.concatenate([np.full(60, 10.0), np.linspace(-5, 5, 40)])
    q = [0.1, 0.5, 0.9]
    est = SMOOTH(x, q, epsilon=5.0, lower=-10.0, upper=10.0, rng=np.random.default_rng(1))
    assert est.shape == (3,) and np.all(np.diff(est) >= 0)
    assert np.all((est >= -10.0) & (est <= 10.0))
    # the atom at the upper bound is answered by the bound itself
    assert est[-1] == 10.0
    # an atom at the lower bound too (its records are jittered below it, then clipped)
    low = SMOOTH(-x, q, epsilon=5.0, lower=-10.0, upper=10.0, rng=np.random.default_rng(1))
    assert low[0] == -10.0 and np.all((low >= -10.0) & (low <= 10.0))
    for bad in (0.0, -1.0, math.inf, math.nan, "1", True):
        with pytest.raises(MechanismInputError) as err:
            SMOOTH(x, q, epsilon=1.0, lower=-10.0, upper=10.0, smoothing=bad)
        assert err.value.parameter == "smoothing"
    with pytest.raises(MechanismInputError) as err:
        SMOOTH(x, q, epsilon=1.0, lower=-10.0, upper=1e308, smoothing=1e308)
    assert err.value.parameter == "smoothing"


def test_core_refuses_a_value_support() -> None:
    from app.mechanisms.histogram import support_from_values

    sup = support_from_values([1.0, 2.0], [0.5], epsilon=1.0, lower=0, upper=3, neighbors="swap")
    with pytest.raises(MechanismInputError):
        js.jointexp_smooth_core(sup, np.random.default_rng(0))


def test_smoothing_fixes_jointexp_on_integer_data() -> None:
    """The issue: at n = 10^4, m = 49 JointExp misses > 1000 points per quantile on integers."""
    x = np.sort(np.round(np.random.default_rng(8).normal(0, 5, 10_000)))
    q = np.arange(1, 50) / 50
    plain, smooth = [], []
    for t in range(3):
        kw = {"epsilon": 1.0, "lower": -100.0, "upper": 100.0}
        plain.append(
            missed_points(x, q, MECHANISMS["jointexp"](x, q, rng=np.random.default_rng(t), **kw))
        )
        smooth.append(missed_points(x, q, SMOOTH(x, q, rng=np.random.default_rng(t), **kw)))
        hist = GridHistogram.from_values(x, -100.0, 100.0, 1.0)
        idx = SMOOTH.run_grid(hist, q, epsilon=1.0, delta=None, rng=np.random.default_rng(t))
        smooth.append(missed_points(x, q, -100.0 + idx.astype(np.float64)))
    assert np.mean(plain) > 500
    assert np.mean(smooth) < 100


def test_a_pile_at_a_bound_no_longer_pulls_the_estimates_below_it() -> None:
    """16 % of the records clamped to the upper bound, the service's fine default grid: with
    the end cells weighing as much as a share of the grid, the estimates below the pile are
    as accurate as on the same data without it (unstretched: several times worse)."""
    rng = np.random.default_rng(12)
    x = np.clip(rng.normal(80.0, 20.0, 2845), -100.0, 100.0)
    q = np.arange(1, 58) / 58
    hist = GridHistogram.from_values(x, -100.0, 100.0, 1e-4)
    sup = support_from_grid(hist, q, epsilon=0.74, neighbors="swap")
    grid = hist.cells.repeat(hist.counts).astype(np.float64)
    stretched, flat = [], []
    for t in range(6):
        for out, s in ((stretched, None), (flat, 0)):
            idx = js.jointexp_smooth_core(sup, np.random.default_rng(t), stretch=s)
            out.append(missed_points(grid, q, idx.astype(np.float64)).mean())
    assert np.mean(flat) > 2.5 * np.mean(stretched)
    assert np.mean(stretched) < 45

"""AQ at the public bounds: the end cells stretched, their records spread over them.

The reference laws here are enumerated from the definition with every position written out:
cell 0 holds positions ``0 .. S - 1``, cell ``c`` (``1 <= c <= K1 - 2``) position
``c + S - 1``, the last cell positions ``S + K1 - 2 .. 2 S + K1 - 3``; a record of an end cell
sits at one of its cell's positions, uniformly and independently; a node's output ``y`` has
weight ``exp(-c |#{node records at positions <= y} - q' k|)``; the release is each output's
cell. Nothing here goes through the module's position map.
"""

from __future__ import annotations

import collections
import itertools
import math

import numpy as np
import pytest

import app.mechanisms.aq as aqmod
import app.mechanisms.jointexp_smooth as jsmod
from app.mechanisms import GridHistogram
from app.mechanisms.histogram import support_from_grid, support_from_values
from tests.mechanisms.exact import chi_square_p
from tests.mechanisms.test_aq import node_c

Law = dict[tuple[int, ...], float]


def levels(m: int) -> list[int]:
    """Nodes per level of the splitting rule (middle quantile ``ceil(r/2)``)."""
    sizes, out = [m], []
    while sizes:
        out.append(len(sizes))
        sizes = [s for r in sizes for s in ((r - 1) // 2, r - 1 - (r - 1) // 2) if s > 0]
    return out


def aq_grid_law(records: list[int], qs: list[float], eps: float, k1: int, big: int, nb: str) -> Law:
    """The exact law of AQ's cells on a grid of ``k1`` points with end cells of ``big``
    positions (``big = 1``: no stretch), records at the ends spread (module docstring)."""
    cell_of = [0] * big + list(range(1, k1 - 1)) + [k1 - 1] * big
    first_top = big + k1 - 2
    per_level = levels(len(qs))
    eps_l = eps / len(per_level)
    ends = [r for r in records if r in (0, k1 - 1)]
    inner = [r + big - 1 for r in records if r not in (0, k1 - 1)]
    law: collections.Counter[tuple[int, ...]] = collections.Counter()

    def node_probs(pts: list[int], left: int, right: int, rel: float, c: float) -> np.ndarray:
        k = len(pts)
        below = np.array([sum(1 for p in pts if p <= y) for y in range(left, right)])
        w = np.exp(-c * np.abs(below - rel * k))
        return w / w.sum()

    def expand(pending: list[tuple], out: dict[int, int], prob: float) -> None:
        if not pending:
            law[tuple(sorted(cell_of[out[i]] for i in range(len(qs))))] += prob
            return
        (pts, left, right, qa, qb, q_lo, q_hi, depth), rest = pending[0], pending[1:]
        mid = qa + (qb - qa - 1) // 2
        rel = min(max((qs[mid] - q_lo) / (q_hi - q_lo), 0.0), 1.0)
        c = node_c(eps_l, rel, nb, per_level[depth])
        for y, p in zip(range(left, right), node_probs(pts, left, right, rel, c), strict=True):
            kids = []
            if qa < mid:
                kids.append(([q for q in pts if q <= y], left, y + 1, qa, mid, q_lo, qs[mid]))
            if mid + 1 < qb:
                kids.append(([q for q in pts if q > y], y, right, mid + 1, qb, qs[mid], q_hi))
            expand(rest + [(*kid, depth + 1) for kid in kids], {**out, mid: y}, prob * p)

    for offsets in itertools.product(range(big), repeat=len(ends)):
        placed = [o if r == 0 else first_top + o for r, o in zip(ends, offsets, strict=True)]
        pts = sorted(inner + placed)
        root = (pts, 0, len(cell_of), 0, len(qs), 0.0, 1.0, 0)
        expand([root], {}, big ** -len(ends))
    return dict(law)


def draw(
    records: list[int], qs: list[float], eps: float, k1: int, s: int, nb: str
) -> collections.Counter:
    cells, counts = np.unique(np.asarray(records, dtype=np.int64), return_counts=True)
    hist = GridHistogram.from_arrays(cells, counts.astype(np.int64), k1)
    rng = np.random.default_rng(2026 + len(records))
    seen: collections.Counter[tuple[int, ...]] = collections.Counter()
    for _ in range(20_000):
        sup = support_from_grid(hist, qs, epsilon=eps, neighbors=nb)
        seen[tuple(int(v) for v in aqmod.aq_core(sup, rng, stretch=s))] += 1
    return seen


CASES = [
    # piles at both ends, three quantiles (two levels), swap, S = 4
    ([0, 2, 3, 5, 5], [0.2, 0.5, 0.9], 2.0, 6, 2, "swap"),
    # a heavier top pile, two quantiles, add/remove, S = 2
    ([0, 0, 2, 4, 4, 4], [0.3, 0.8], 2.5, 5, 1, "add_remove"),
    # a pile at the top only, S = 4
    ([1, 2, 4, 4, 4], [0.5, 0.9], 2.0, 5, 2, "swap"),
    # no record at either end: only the base measure is stretched, S = 4
    ([1, 2, 2, 3], [0.25, 0.75], 2.0, 5, 2, "swap"),
]
IDS = ["swap", "add_remove", "top-only", "no-end-record"]


@pytest.mark.parametrize("binomial", [False, True], ids=["one-word-spread", "binomial-spread"])
@pytest.mark.parametrize(("records", "qs", "eps", "k1", "s", "nb"), CASES, ids=IDS)
def test_grid_law_is_exact_and_the_others_are_rejected(
    monkeypatch: pytest.MonkeyPatch, binomial: bool, records, qs, eps, k1, s, nb
) -> None:
    """20,000 draws against the enumerated law; the law at 1.5 epsilon and the law without
    the stretch (the mechanism before it) are both rejected. Every branch: records in both
    end cells, the top one only, neither; each end cell spread one word a record, or (forced)
    through jitter_cells' binomial split."""
    heavy: list[int] = []
    if binomial:
        monkeypatch.setattr(aqmod, "SPREAD_LIGHT_MAX", 0)
        monkeypatch.setattr(jsmod, "LIGHT_FACTOR", 0)
        real = jsmod._split_heavy
        monkeypatch.setattr(jsmod, "_split_heavy", lambda *a: heavy.append(1) or real(*a))
    seen = draw(records, qs, eps, k1, s, nb)
    assert bool(heavy) == (binomial and any(r in (0, k1 - 1) for r in records))
    assert chi_square_p(seen, aq_grid_law(records, qs, eps, k1, 1 << s, nb), 20_000) > 1e-4
    assert chi_square_p(seen, aq_grid_law(records, qs, 1.5 * eps, k1, 1 << s, nb), 20_000) < 1e-4
    assert chi_square_p(seen, aq_grid_law(records, qs, eps, k1, 1, nb), 20_000) < 1e-4


def max_log_ratio(a: Law, b: Law) -> float:
    assert set(a) == set(b)
    return max(abs(math.log(a[t]) - math.log(b[t])) for t in a)


@pytest.mark.parametrize("nb", ["swap", "add_remove"])
def test_privacy_ratio_of_exact_laws_is_bounded_by_e_eps(nb: str) -> None:
    """Every output tuple's probability moves by at most e^eps between neighbours (the
    spread records' offsets are part of the mechanism's randomness, so the laws compared are
    the mixtures); a calibration spending 3 epsilon is caught by the same check."""
    k1, big, eps, qs = 5, 4, 1.0, [0.25, 0.5, 0.75]
    base = [0, 1, 4, 4]
    if nb == "swap":
        pairs = [(base, [*base[:i], v, *base[i + 1 :]]) for i in range(4) for v in range(k1)]
    else:
        pairs = [(base, base[:i] + base[i + 1 :]) for i in range(4)]
        pairs += [(base, sorted([*base, v])) for v in range(k1)]
    worst = {1.0: 0.0, 3.0: 0.0}
    for x, y in pairs:
        for spend in worst:
            lx = aq_grid_law(sorted(x), qs, spend * eps, k1, big, nb)
            ly = aq_grid_law(sorted(y), qs, spend * eps, k1, big, nb)
            worst[spend] = max(worst[spend], max_log_ratio(lx, ly))
    assert worst[1.0] <= eps + 1e-9
    assert worst[3.0] > eps


def test_grids_below_129_points_are_not_stretched() -> None:
    """The stretch is 2^-7 of the grid rounded up to a power of two: none below 129 points,
    where AQ draws exactly what it drew before (the same generator, the same draws)."""
    rng_a, rng_b = np.random.default_rng(3), np.random.default_rng(3)
    hist = GridHistogram.from_arrays(np.array([0, 5, 127]), np.array([40, 3, 50]), 128)
    qs = [0.1, 0.5, 0.9, 0.95]
    for _ in range(50):
        sup = support_from_grid(hist, qs, epsilon=1.0, neighbors="swap")
        assert np.array_equal(aqmod.aq_core(sup, rng_a), aqmod._aq_tree(sup, rng_b))


def test_the_spread_keeps_every_record_and_moves_only_those_at_a_bound() -> None:
    rng = np.random.default_rng(8)
    x = np.concatenate((np.full(300, -7.0), rng.uniform(-1, 1, 500), np.full(200, 9.0)))
    sup = support_from_values(x, [0.5], epsilon=1.0, lower=-2.0, upper=3.0, neighbors="swap")
    wide = aqmod._spread_values(sup, 5.0 / 128.0, rng)
    assert wide.n == sup.n == 1000
    assert wide.edges[0] == -2.0 - 5.0 / 128.0 and wide.edges[-1] == 3.0 + 5.0 / 128.0
    inner = (wide.edges[1:-1] > -2.0) & (wide.edges[1:-1] < 3.0)
    assert np.array_equal(wide.edges[1:-1][inner], np.sort(x[(x > -2) & (x < 3)]))
    assert np.all(np.diff(wide.edges) >= 0)
    below = np.diff(wide.cum)[wide.edges[1:-1] <= -2.0].sum()
    above = np.diff(wide.cum)[wide.edges[1:-1] >= 3.0].sum()
    assert below == 300 and above == 200
    assert len(np.unique(wide.edges[1:-1][wide.edges[1:-1] >= 3.0])) > 150  # spread, not piled


def test_a_pile_at_a_bound_no_longer_pulls_the_estimates_below_it() -> None:
    """N(80, 20^2) clamped at 100 (16 % piled) on the default grid, m = 99, epsilon = 1:
    the quantiles inside the pile come out at the pile (measured: 21-23 missed points per
    quantile, as on the continuous shapes; 275-285 before)."""
    rng = np.random.default_rng(12)
    qs = np.arange(1, 100) / 100
    new, old = [], []
    for _ in range(5):
        x = np.clip(rng.normal(80, 20, 20_000), -100, 100)
        hist = GridHistogram.from_values(x, -100.0, 100.0, 1e-4)
        xs = np.sort(-100.0 + hist.cells.repeat(hist.counts) * 1e-4)
        t = np.floor(qs * xs.size)
        for f, acc in ((aqmod.aq_core, new), (aqmod._aq_tree, old)):
            sup = support_from_grid(hist, qs, epsilon=1.0, neighbors="swap")
            est = -100.0 + np.asarray(f(sup, rng), dtype=np.float64) * 1e-4
            lo, hi = np.searchsorted(xs, est, "left"), np.searchsorted(xs, est, "right")
            acc.append(np.mean(np.where(t < lo, lo - t, np.where(t > hi, t - hi, 0))))
    assert np.mean(new) < 40
    assert np.mean(old) > 4 * np.mean(new)

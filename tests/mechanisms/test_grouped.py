"""Grouped releases: exact laws for unit-level neighbours whose rows span several groups.

A grouped release is the product of independent per-group laws. For a table of (group,
value) rows where one unit owns up to k rows in any groups, the unit-level neighbour
(add/remove: the unit and its rows go; swap: its rows change value *and group*) changes
several groups at once. Each group's law is computed from the method's definition at the
parameters its core actually receives from :func:`app.mechanisms.grouped.run_groups`
(captured by wrapping the core), including groups left with no rows. The log density ratio
of a product law is the sum of the groups' ratios, so its worst case is exact without
enumerating the product; the (ε, δ) method's hockey-stick divergence is computed on the
enumerated product. A variant calibrated for k row changes under swap (forgetting that a
moved row leaves one group and joins another) is caught.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import numpy as np
import pytest

from app.mechanisms import MECHANISMS, GridHistogram, MechanismInputError
from app.mechanisms.grouped import GROUPED_METHODS, chain_length, run_groups
from app.mechanisms.registry import Mechanism
from app.mechanisms.units import MAX_ROWS_PER_UNIT
from tests.mechanisms.exact import chi_square_p
from tests.mechanisms.test_grid import hist_of
from tests.mechanisms.test_units import K1, em_law

GROUPS = ("a", "b", "c")
QUANTILES = {"jointexp": [0.3, 0.7], "indexp": [0.4], "aq": [0.5], "appindexp": [0.6]}
DELTA = 1e-3

Table = list[tuple[str, int]]  # (group, grid value) rows


def received(
    name: str, table: Table, eps: float, delta: float | None, k: int, nb: str, keys: tuple[str, ...]
) -> list[dict[str, Any]]:
    """What each group's core receives from run_groups (one dict per key)."""
    seen: list[dict[str, Any]] = []
    real = MECHANISMS[name].core
    assert real is not None

    def core(sup: Any, rng: Any, **kw: Any) -> Any:
        seen.append({"epsilon": sup.epsilon, "neighbors": sup.neighbors, "n": sup.n, **kw})
        return real(sup, rng, **kw)

    mech = dataclasses.replace(MECHANISMS[name], core=core)
    run_groups(
        mech, histograms(table, keys), QUANTILES[name], grid_points=K1, epsilon=eps,
        delta=delta, neighbors=nb, rows_per_unit=k, rng=np.random.default_rng(0),
    )  # fmt: skip
    return seen


def histograms(table: Table, keys: tuple[str, ...]) -> list[GridHistogram | None]:
    out: list[GridHistogram | None] = []
    for key in keys:
        values = [v for g, v in table if g == key]
        out.append(hist_of(values, K1) if values else None)
    return out


def group_laws(
    name: str, table: Table, got: list[dict[str, Any]], q: list[float] | None = None
) -> list[dict]:
    q = QUANTILES[name] if q is None else q
    laws = []
    for key, params in zip(GROUPS, got, strict=True):
        assert params["neighbors"] == "add_remove"
        records = [v for g, v in table if g == key]
        laws.append(em_law(name, records, q, params, "add_remove"))
    return laws


def product_loss(p: list[dict], r: list[dict]) -> float:
    """max over outputs of |log P(y)/R(y)| for product laws: the larger of the two sums of
    per-group maxima (one direction each)."""
    up = down = 0.0
    for pg, rg in zip(p, r, strict=True):
        assert set(pg) == set(rg)
        ratios = [math.log(pg[y] / rg[y]) for y in pg]
        up += max(ratios)
        down += max(-x for x in ratios)
    return max(up, down)


def product_hockey_stick(p: list[dict], r: list[dict], eps: float) -> float:
    outs = [sorted(g) for g in p]
    worst = 0.0
    for a, b in ((p, r), (r, p)):
        total = 0.0
        for ys in itertools.product(*outs):
            pa = math.prod(g[y] for g, y in zip(a, ys, strict=True))
            pb = math.prod(g[y] for g, y in zip(b, ys, strict=True))
            total += max(0.0, pa - math.exp(eps) * pb)
        worst = max(worst, total)
    return worst


def neighbours(rng: np.random.Generator, k: int, nb: str, pairs: int) -> list[tuple[Table, Table]]:
    """Tables that differ in one unit of up to k rows spread over the groups: extreme pairs
    (the unit's rows at one end of group a vs the other end of group b; the whole unit in
    one group, present vs absent; a group emptied) and random ones."""
    out: list[tuple[Table, Table]] = []
    for p in range(pairs):
        size = int(rng.integers(1, 4))
        base: Table = [(str(rng.choice(GROUPS)), int(rng.integers(0, K1))) for _ in range(size)]
        if p == 0:
            unit: Table = [("a", 0)] * k
            other: Table = [("b", K1 - 1)] * k
        elif p == 1:
            base = [("a", 2), ("a", 3)]
            unit = [("b", K1 - 1)] * k  # group b holds only the unit's rows
            other = [("c", 0)] * k
        else:
            unit = [(str(rng.choice(GROUPS)), int(rng.integers(0, K1))) for _ in range(k)]
            other = [(str(rng.choice(GROUPS)), int(rng.integers(0, K1))) for _ in range(k)]
        out.append((base + unit, base + other if nb == "swap" else base))
    return out


EXACT = [name for name in GROUPED_METHODS if name != "jointexp_smooth"]  # its law: below
CASES = [(name, k, nb) for name in EXACT for k in (1, 2) for nb in ("swap", "add_remove")]


@pytest.mark.parametrize(("name", "k", "nb"), CASES)
def test_a_unit_across_groups_has_the_guarantee(name: str, k: int, nb: str) -> None:
    mech = MECHANISMS[name]
    eps = 1.0
    delta = DELTA if mech.uses_delta else None
    rng = np.random.default_rng(100 * k + len(name) + len(nb))
    worst = hs_worst = 0.0
    for x, x2 in neighbours(rng, k, nb, 8):
        got, got2 = (received(name, t, eps, delta, k, nb, GROUPS) for t in (x, x2))
        # the calibration is public: the same per-row parameters on both sides
        assert [g["epsilon"] for g in got] == [g["epsilon"] for g in got2]
        p, r = group_laws(name, x, got), group_laws(name, x2, got2)
        if mech.uses_delta:
            hs_worst = max(hs_worst, product_hockey_stick(p, r, eps))
        else:
            worst = max(worst, product_loss(p, r))
    if mech.uses_delta:
        assert hs_worst <= DELTA * (1 + 1e-9)
    else:
        assert worst <= eps + 1e-9


def moved_rows() -> list[tuple[Table, Table]]:
    """Every table of up to three rows in group a and one in b (values at the ends and the
    middle) with one row of a moved to b, at any value."""
    vals = [0, 2, K1 - 1]
    out = []
    for a in itertools.combinations_with_replacement(vals, 2):
        for b, moved, to in itertools.product(vals, vals, vals):
            rest = [("a", v) for v in a] + [("b", b)]
            out.append(([*rest, ("a", moved)], [*rest, ("b", to)]))
    return out


@pytest.mark.parametrize("name", ["jointexp", "indexp", "aq"])
def test_a_calibration_that_forgets_the_moved_row_is_caught(name: str) -> None:
    """Calibrated for k row changes under swap (instead of 2k), a unit whose row moves
    from one group to another costs more than the ε asked on some table; the calibration
    run_groups uses never does."""
    eps, k, q = 1.0, 1, [0.5]
    naive = [{"epsilon": eps / k}] * len(GROUPS)
    right = [{"epsilon": eps / chain_length("swap", k)}] * len(GROUPS)
    worst_naive = worst_right = 0.0
    for x, x2 in moved_rows():
        laws = (group_laws_at(name, t, naive, q) for t in (x, x2))
        worst_naive = max(worst_naive, product_loss(*laws))
        laws = (group_laws_at(name, t, right, q) for t in (x, x2))
        worst_right = max(worst_right, product_loss(*laws))
    assert worst_naive > eps
    assert worst_right <= eps + 1e-9


def group_laws_at(
    name: str, table: Table, params: list[dict[str, Any]], q: list[float] | None = None
) -> list[dict]:
    return group_laws(name, table, [{**p, "neighbors": "add_remove"} for p in params], q)


@pytest.mark.parametrize("name", ["jointexp", "aq"])
def test_run_groups_draws_the_product_law_including_an_empty_group(name: str) -> None:
    table: Table = [("a", 1), ("a", 2), ("a", 2), ("a", 4), ("b", 5)]  # group c: no rows
    q = QUANTILES[name]
    hists = histograms(table, GROUPS)
    rng = np.random.default_rng(23)
    draws = 8_000
    counts: list[dict[tuple[int, ...], int]] = [{}, {}, {}]
    for _ in range(draws):
        out = run_groups(MECHANISMS[name], hists, q, grid_points=K1, epsilon=2.0, delta=None,
                         neighbors="add_remove", rows_per_unit=1, rng=rng)  # fmt: skip
        for i, est in enumerate(out):
            key = tuple(int(v) for v in est)
            counts[i][key] = counts[i].get(key, 0) + 1
    laws = group_laws_at(name, table, [{"epsilon": 2.0}] * 3)
    for i in range(3):
        assert chi_square_p(counts[i], laws[i], draws) > 1e-4  # type: ignore[arg-type]
    # the empty group's law is the method's law on no data, not a fixed answer
    assert len(counts[2]) > 3


def test_chain_length_and_its_limit() -> None:
    assert chain_length("add_remove", 3) == 3
    assert chain_length("swap", 3) == 6
    assert chain_length("swap", MAX_ROWS_PER_UNIT // 2) == MAX_ROWS_PER_UNIT
    with pytest.raises(MechanismInputError) as err:
        chain_length("swap", MAX_ROWS_PER_UNIT // 2 + 1)
    assert err.value.parameter == "max_rows_per_unit"


@pytest.mark.parametrize("name", sorted(set(MECHANISMS) - set(GROUPED_METHODS)))
def test_methods_outside_the_grouped_set_are_refused_by_name(name: str) -> None:
    with pytest.raises(MechanismInputError) as err:
        run_groups(MECHANISMS[name], [None], [0.5], grid_points=K1, epsilon=1.0, delta=1e-6,
                   neighbors="add_remove")  # fmt: skip
    assert err.value.parameter == "method"


def test_received_parameters_are_the_chain_shares() -> None:
    table: Table = [("a", 1), ("b", 2)]
    for nb, k in (("add_remove", 2), ("swap", 2), ("swap", 1)):
        got = received("jointexp", table, 1.0, None, k, nb, GROUPS)
        steps = chain_length(nb, k)
        assert all(g["epsilon"] * steps <= 1.0 for g in got)
        assert all(g["neighbors"] == "add_remove" for g in got)
        assert [g["n"] for g in got] == [1, 1, 0]


def test_mechanism_type_is_kept() -> None:
    assert isinstance(MECHANISMS["jointexp"], Mechanism)


def test_jointexp_smooth_answers_an_empty_group_with_its_law_on_no_data() -> None:
    """No record jitters to no record: JointExp on the empty refined grid, floored back, is
    uniform over the grid points for m = 1 (each point owns 2^b refined points)."""
    rng = np.random.default_rng(31)
    draws = 6_000
    seen: dict[tuple[int, ...], int] = {}
    for _ in range(draws):
        (out,) = run_groups(MECHANISMS["jointexp_smooth"], [None], [0.5], grid_points=K1,
                            epsilon=1.0, delta=None, neighbors="add_remove", rng=rng)  # fmt: skip
        key = tuple(int(v) for v in out)
        seen[key] = seen.get(key, 0) + 1
    uniform = {(g,): 1.0 / K1 for g in range(K1)}
    assert chi_square_p(seen, uniform, draws) > 1e-4  # type: ignore[arg-type]
    # and a group with rows still draws near its data
    (busy,) = run_groups(MECHANISMS["jointexp_smooth"], [hist_of([3] * 50, K1)], [0.5],
                         grid_points=K1, epsilon=5.0, delta=None, neighbors="add_remove",
                         rng=rng)  # fmt: skip
    assert int(busy[0]) == 3

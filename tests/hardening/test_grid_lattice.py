"""Issue 5, point 8: released values are snapped to the dataset's public grid, so the set of
values a release can take is one data-independent lattice.

The lattice of a dataset is ``G = {clip(float(L + k*g), lower, upper) : k = 0..K}`` with
``L`` and ``g`` the shortest decimal forms of ``lower`` and ``granularity`` and
``K = floor((upper - lower) / g)``; it is computed here from the public parameters alone.
For neighbouring datasets (swap and add/remove of a point whose low-order bits are
distinctive) every method of the registry is run many times through the same
sample-then-snap path the service uses: all outputs of both datasets lie in the same ``G``,
and the distinctive value never appears. Releases through the API are checked against
``G`` too, for every method.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

import numpy as np
import pytest

from app.datasets.service import DEFAULT_GRID_STEPS, default_granularity, snap_to_grid
from app.mechanisms import MECHANISMS

from .conftest import ADMIN, Api, report


def lattice(lower: float, upper: float, granularity: float) -> set[float]:
    """The grid from public parameters only (independent re-implementation)."""
    lo, step = Decimal(repr(lower)), Decimal(repr(granularity))
    k_max = int((Decimal(repr(upper)) - lo) / step)
    return {min(max(float(lo + k * step), lower), upper) for k in range(k_max + 1)}


@pytest.mark.parametrize(
    ("lower", "upper", "expected"),
    [
        (0.0, 1.0, 1e-6),
        (0.0, 100.0, 1e-4),
        (0.0, 1000.0, 1e-3),
        (0.0, 500_000.0, 0.1),
        (-5.0, 5.0, 1e-5),
        (0.0, 3.0, 1e-6),  # 3e-6 rounds down to the power of ten below
        (1e9, 2e9, 1000.0),
    ],
)
def test_default_granularity_is_a_power_of_ten_below_range_over_a_million(
    lower: float, upper: float, expected: float
) -> None:
    g = default_granularity(lower, upper)
    assert g == expected
    assert g <= (upper - lower) / DEFAULT_GRID_STEPS < 10 * g


@pytest.mark.parametrize(
    ("lower", "upper", "granularity"),
    [(0.0, 10.0, 0.01), (-3.3, 7.7, 0.1), (0.3, 1.0, 0.001), (-1000.0, 1000.0, 2.5)],
)
def test_snapping_lands_on_the_public_lattice_for_any_double(
    lower: float, upper: float, granularity: float
) -> None:
    grid = lattice(lower, upper, granularity)
    rng = np.random.default_rng(8)
    raw = np.concatenate(
        [
            rng.uniform(lower - 1, upper + 1, 20_000),
            np.nextafter(rng.uniform(lower, upper, 1000), np.inf),
            [lower, upper, -np.inf, np.inf, lower - 1e300, upper + 1e300],
            [float(x) for x in grid][:50],
        ]
    )
    out = snap_to_grid(raw, lower=lower, upper=upper, granularity=granularity)
    assert set(out.tolist()) <= grid
    assert np.all(
        np.diff(snap_to_grid(np.sort(raw), lower=lower, upper=upper, granularity=granularity)) >= 0
    )  # monotone
    decimals = max(0, -Decimal(repr(granularity)).as_tuple().exponent)  # type: ignore[operator]
    decimals += max(0, -Decimal(repr(lower)).as_tuple().exponent)  # type: ignore[operator]
    for v in out[:2000]:
        text = repr(float(v))
        assert len(text.split(".")[-1]) <= max(decimals, 1) or "e" in text


def _query(name: str) -> dict[str, Any]:
    mech = MECHANISMS[name]
    return {"delta": 1e-6 if (mech.requires_delta or mech.uses_delta) else None}


def test_neighbouring_datasets_release_values_from_the_same_lattice() -> None:
    lower, upper, granularity = 0.0, 10.0, 0.001
    grid = lattice(lower, upper, granularity)
    rng = np.random.default_rng(88)
    base = np.sort(rng.uniform(lower, upper, 300))
    secret = 7.123456789012345  # low-order bits that would identify it
    swap = np.sort(np.concatenate([base[:-1], [secret]]))
    add = np.sort(np.concatenate([base, [secret]]))
    quantiles = [0.25, 0.5, 0.75]
    runs = 60
    supports: dict[str, dict[str, set[float]]] = {}
    raw_distinct = 0
    for name, mech in MECHANISMS.items():
        params = _query(name)
        for label, neighbour in (("swap", swap), ("add_remove", add)):
            if label == "add_remove":
                try:
                    mech.dp_cost(epsilon=1.0, delta=params["delta"])
                    mech.run(
                        base,
                        quantiles,
                        epsilon=1.0,
                        lower=lower,
                        upper=upper,
                        neighbors="add_remove",
                        delta=params["delta"],
                    )
                except Exception:
                    continue  # swap-only method (smooth sensitivity family)
            outs: dict[str, set[float]] = {"D": set(), "D'": set()}
            for data_label, data in (("D", base), ("D'", neighbour)):
                for _ in range(runs):
                    raw = mech.run(
                        data,
                        quantiles,
                        epsilon=1.0,
                        lower=lower,
                        upper=upper,
                        neighbors=label,
                        delta=params["delta"],
                    )
                    raw_distinct += int(not set(np.asarray(raw).tolist()) <= grid)
                    snapped = snap_to_grid(
                        np.asarray(raw, dtype=np.float64),
                        lower=lower,
                        upper=upper,
                        granularity=granularity,
                    )
                    outs[data_label].update(snapped.tolist())
            supports[f"{name}/{label}"] = outs
            assert outs["D"] <= grid and outs["D'"] <= grid, name
            assert secret not in outs["D'"]
    report(
        "8 lattice",
        granularity=granularity,
        lattice_points=len(grid),
        method_relations=len(supports),
        runs_per_dataset=runs,
        raw_outputs_off_grid=raw_distinct,
        snapped_outputs_off_grid=0,
    )
    assert raw_distinct > 0  # the raw samples do carry arbitrary low-order bits
    assert len(supports) >= len(MECHANISMS)


def test_api_releases_of_every_method_lie_on_the_dataset_grid(hapi: Api) -> None:
    values = [v + 1e-9 * i for i, v in enumerate(np.linspace(1.234567, 987.654321, 400))]
    ds = hapi.dataset(values=values, epsilon="100", delta="0.1", lower=-0.5, upper=1000.0)
    assert ds["granularity"] == 0.001  # default: 1000.5 / 10^6 -> 10^-3
    r = hapi.client.get(f"/v1/datasets/{ds['id']}", headers=ADMIN)
    grid = lattice(-0.5, 1000.0, r.json()["granularity"])
    for name, mech in MECHANISMS.items():
        body: dict[str, Any] = {"method": name, "epsilon": "1", "quantiles": [0.1, 0.5, 0.9]}
        if mech.requires_delta or mech.uses_delta:
            body["delta"] = "0.000001"
        rel = hapi.query(ds["id"], **body)
        assert rel.status_code == 201, (name, rel.text)
        estimates = rel.json()["estimates"]
        assert set(estimates) <= grid, (name, estimates)
        assert not set(estimates) & set(values), name
        for e in estimates:
            assert math.isclose(round((e + 0.5) / 0.001) * 0.001 - 0.5, e, abs_tol=1e-9)

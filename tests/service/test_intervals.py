"""Error bars in the data's units on releases: computed with the estimates from public
figures only, stored with them, identical on every read, absent where they cannot be formed."""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi.testclient import TestClient

from app.codec.grid import cell_of, grid_size, grid_values
from app.planner.intervals import interval_cells

from .conftest import ADMIN, Api
from .test_grouped import rows_csv, table, upload

QUANTILES = [0.1, 0.25, 0.5, 0.75, 0.9]


def values(n: int, seed: int = 5) -> list[float]:
    return [float(v) for v in np.clip(np.random.default_rng(seed).normal(50, 12, n), 0, 100)]


def recomputed(
    body: dict[str, Any], lower: float, upper: float, step: float, bound: str = "bound90_each"
) -> list[Any]:
    """The intervals from the release's public fields alone: the planner's grid indices,
    turned into values by the codec that made the estimates."""
    (first, *_) = body["expected_error"]
    bars = interval_cells(
        body["quantiles"], cell_of(body["estimates"], lower, upper, step).tolist(),
        steps=grid_size(lower, upper, step) - 1,
        bound90=max(e[bound] for e in body["expected_error"]), size=first["size"],
    )  # fmt: skip
    assert bars is not None
    lows = grid_values([lo for lo, _ in bars], lower, step).tolist()
    highs = grid_values([hi for _, hi in bars], lower, step).tolist()
    rows = zip(body["quantiles"], lows, highs, strict=True)
    return [{"quantile": q, "low": lo, "high": hi} for q, lo, hi in rows]


def test_a_release_has_error_bars_from_its_own_estimates_and_public_figures(
    api: Api, client: TestClient
) -> None:
    ds = api.dataset(values=values(3000), epsilon="10", granularity=0.01)
    created = api.query(ds["id"], quantiles=QUANTILES, epsilon="1", method="jointexp")
    assert created.status_code == 201, created.text
    body = created.json()
    assert [e["size"] for e in body["expected_error"]] == [3000] * 5  # n: public under swap
    # the bars span one estimate's bound, wider than the bound on the mean of five
    assert all(e["bound90_each"] > e["bound90"] for e in body["expected_error"])
    bars = body["intervals"]
    assert [b["quantile"] for b in bars] == QUANTILES
    for bar, estimate in zip(bars, body["estimates"], strict=True):
        assert bar["low"] <= estimate <= bar["high"]
        assert bar["high"] - bar["low"] < 20  # 3000 points, ε = 1: a few points' worth
    assert bars == recomputed(body, 0.0, 100.0, 0.01)
    # no extra budget: the debit is the query's epsilon
    assert api.budget(ds["id"])["spent"]["epsilon"] == "1"
    # the synchronous answer, a later read and an analyst's read agree byte for byte
    again = client.get(f"/v1/releases/{body['id']}", headers=ADMIN)
    assert again.content == created.content
    analyst = client.get(f"/v1/releases/{body['id']}", headers=api.key("analyst"))
    assert analyst.json()["intervals"] == bars


def test_a_release_with_an_estimate_at_a_bound_spans_the_atom_bound(api: Api) -> None:
    # 40 % of the values clamped to the upper bound: the release puts its top estimates
    # there, which shows the atom, and its bars span the clamped model's wider bound
    rng = np.random.default_rng(8)
    data = np.clip(rng.normal(80, 20, 4000), 0, 100)
    data[:1600] = 100.0
    ds = api.dataset(values=[float(v) for v in data], epsilon="10", granularity=0.001)
    quantiles = [0.1, 0.3, 0.5, 0.9, 0.95]
    created = api.query(ds["id"], quantiles=quantiles, epsilon="0.3", method="jointexp_smooth")
    assert created.status_code == 201, created.text
    body = created.json()
    assert 100.0 in body["estimates"]
    rows = body["expected_error"]
    assert all(r["bound90_each_atom"] > r["bound90_each"] for r in rows)
    atom = recomputed(body, 0.0, 100.0, 0.001, "bound90_each_atom")
    assert atom != recomputed(body, 0.0, 100.0, 0.001)  # the two bounds' bars differ here
    assert body["intervals"] == atom


def test_add_remove_error_bars_use_the_size_hint_and_are_absent_without_one(
    api: Api, client: TestClient
) -> None:
    ds = api.dataset(values=values(2000), epsilon="10", neighbors="add_remove")
    bare = api.query(ds["id"], quantiles=QUANTILES, epsilon="1", method="jointexp").json()
    assert bare["expected_error"] is None and bare["intervals"] is None
    r = client.patch(f"/v1/datasets/{ds['id']}", json={"size_hint": 500}, headers=ADMIN)
    assert r.status_code == 200, r.text
    hinted = api.query(ds["id"], quantiles=QUANTILES, epsilon="1", method="jointexp").json()
    assert {e["size"] for e in hinted["expected_error"]} == {500}  # the hint, never n
    assert hinted["intervals"] == recomputed(hinted, 0.0, 100.0, ds["granularity"])
    # the size hint changing afterwards leaves a stored release as it was
    client.patch(f"/v1/datasets/{ds['id']}", json={"size_hint": 50_000}, headers=ADMIN)
    assert client.get(f"/v1/releases/{hinted['id']}", headers=ADMIN).json() == hinted


def test_a_grouped_release_has_error_bars_only_for_the_keys_given_a_size_hint(
    api: Api, client: TestClient
) -> None:
    ds = table(api, neighbors="add_remove")
    upload(client, api, ds["id"], rows_csv(2000))
    body = {"quantiles": QUANTILES, "epsilon": "1", "method": "jointexp", "group_by": "region",
            "size_hints": {"west": 500, "north": 40}}  # fmt: skip
    quote = client.post(f"/v1/datasets/{ds['id']}/quote", json=body, headers=ADMIN)
    assert quote.status_code == 200, quote.text
    created = client.post(f"/v1/datasets/{ds['id']}/quantiles", json=body, headers=ADMIN)
    assert created.status_code == 201, created.text
    rel = created.json()
    assert rel["intervals"] is None  # a grouped release's bars are its groups'
    by_key = rel["group_error"]["by_key"]
    assert by_key == quote.json()["group_error"]["by_key"]
    assert [(row["key"], row["size"]) for row in by_key] == [("west", 500), ("north", 40)]
    # the hint's figures are the ladder's model read at the hint (public figures only)
    from app import planner

    for row in by_key:
        err = planner.expected_error("jointexp", row["size"], QUANTILES, 1.0, None,
                                     "add_remove", grid_points=1001)  # fmt: skip
        assert err is not None and row["mean"] == float(f"{err[0]:.4g}"), row
    assert by_key[1]["mean"] / 40 > by_key[0]["mean"] / 500  # fewer rows: a larger share
    groups = {g["key"]: g for g in rel["groups"]}
    for key in ("south", "east"):  # no hint: no figure, no bars
        assert groups[key]["expected_error"] is None and groups[key]["intervals"] is None
        assert groups[key]["estimates"] is not None
    for row in by_key:
        group = groups[row["key"]]
        figures = ("size", "mean", "bound90", "bound90_each", "bound90_each_atom")
        assert group["expected_error"] == {k: row[k] for k in figures}
        assert row["bound90_each"] > row["bound90"]  # one estimate varies more than a mean
        alone = {"quantiles": QUANTILES, "estimates": group["estimates"],
                 "expected_error": [{"size": row["size"], "bound90_each": row["bound90_each"],
                                     "bound90": row["bound90"]}]}  # fmt: skip
        assert group["intervals"] == recomputed(alone, 0.0, 1000.0, 1.0)
        for bar, estimate in zip(group["intervals"], group["estimates"], strict=True):
            assert bar["low"] <= estimate <= bar["high"]
    # the smaller hint, the wider bars (the same quantile function read at a wider level)
    width = {k: sum(b["high"] - b["low"] for b in groups[k]["intervals"]) for k in groups
             if groups[k]["intervals"]}  # fmt: skip
    assert width["north"] > width["west"]
    # no extra budget; every read is the same bytes
    assert api.budget(ds["id"])["spent"]["epsilon"] == "1"
    again = client.get(f"/v1/releases/{rel['id']}", headers=ADMIN)
    assert again.content == created.content
    analyst = client.get(f"/v1/releases/{rel['id']}", headers=api.key("analyst")).json()
    assert analyst["groups"] == rel["groups"]


def test_a_grouped_release_without_hints_has_no_error_bars(api: Api, client: TestClient) -> None:
    ds = table(api)
    upload(client, api, ds["id"], rows_csv(2000))
    rel = api.query(ds["id"], quantiles=[0.5], epsilon="1", method="jointexp", group_by="region")
    assert rel.status_code == 201, rel.text
    out = rel.json()
    assert out["intervals"] is None and out["groups"] and out["group_error"]["by_key"] is None
    assert all(g["intervals"] is None and g["expected_error"] is None for g in out["groups"])


def test_discovered_keys_get_bars_at_their_hints_and_unselected_hints_name_nothing(
    api: Api, client: TestClient
) -> None:
    columns = [{"name": "income", "type": "numeric", "lower": 0, "upper": 1000,
                "granularity": 1}, {"name": "region", "type": "categorical"}]  # fmt: skip
    ds = table(api, columns=columns, delta="0.001")
    upload(client, api, ds["id"], rows_csv(1000, regions=["north", "south"]) + b"999.0,hermit\n")
    body = {"quantiles": [0.5], "epsilon": "1", "method": "jointexp", "group_by": "region",
            "keys": "discover", "selection": {"epsilon": "0.5", "delta": "1e-6"},
            "size_hints": {"north": 500, "nowhere": 10}}  # fmt: skip
    rel = client.post(f"/v1/datasets/{ds['id']}/quantiles", json=body, headers=ADMIN)
    assert rel.status_code == 201, rel.text
    out = rel.json()
    groups = {g["key"]: g for g in out["groups"]}
    assert set(groups) == {"north", "south"}  # the hint for "nowhere" names no group
    assert groups["north"]["intervals"] and groups["north"]["expected_error"]["size"] == 500
    assert groups["south"]["intervals"] is None
    again = client.get(f"/v1/releases/{out['id']}", headers=ADMIN)
    assert again.content == rel.content

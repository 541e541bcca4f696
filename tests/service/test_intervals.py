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


def recomputed(body: dict[str, Any], lower: float, upper: float, step: float) -> list[Any]:
    """The intervals from the release's public fields alone: the planner's grid indices,
    turned into values by the codec that made the estimates."""
    (first, *_) = body["expected_error"]
    bars = interval_cells(
        body["quantiles"], cell_of(body["estimates"], lower, upper, step).tolist(),
        steps=grid_size(lower, upper, step) - 1,
        bound90=max(e["bound90"] for e in body["expected_error"]), size=first["size"],
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


def test_a_grouped_release_has_no_error_bars(api: Api, client: TestClient) -> None:
    ds = table(api)
    upload(client, api, ds["id"], rows_csv(2000))
    rel = api.query(ds["id"], quantiles=[0.5], epsilon="1", method="jointexp", group_by="region")
    assert rel.status_code == 201, rel.text
    assert rel.json()["intervals"] is None and rel.json()["groups"]

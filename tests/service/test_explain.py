"""``GET /v1/releases/{id}/explanation``: a release explained from public figures only."""

from __future__ import annotations

from fastapi.testclient import TestClient

from app.mechanisms import MECHANISMS

from .conftest import SAMPLE, Api


def test_a_release_explains_its_method_its_data_and_the_planner_today(
    api: Api, client: TestClient
) -> None:
    ds = api.dataset(values=SAMPLE, lower=0, upper=200, epsilon="2")
    rel = api.query(ds["id"], quantiles=[0.25, 0.5, 0.75], epsilon="0.5", method="aq").json()
    for role in ("analyst", "viewer"):
        key = api.key(role, ds["id"])
        r = client.get(f"/v1/releases/{rel['id']}/explanation", headers=key)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["release"] == client.get(f"/v1/releases/{rel['id']}", headers=key).json()
        assert body["method"]["name"] == "aq" and body["method"]["guarantee"] == "pure_dp"
        assert "epsilon^2/(8D)" in body["method"]["zcdp"]
        data = body["data"]
        assert (data["lower"], data["upper"], data["column"]) == (0.0, 200.0, "value")
        assert data["granularity"] == ds["granularity"] and data["accounting"] == "pure"
        assert body["auto_today"] in MECHANISMS
        methods = {a["method"]: a for a in body["alternatives"]}
        assert {"jointexp", "indexp", "aq"} <= set(methods)
        assert methods["jointexp"]["expected_error"][0]["quantile"] == 0.25
        assert any("missed points" in line for line in body["reading"])
        text = r.text
        assert "n_outside" not in text and '"n"' not in text  # nothing from the data
    other = api.dataset(values=SAMPLE)
    outsider = api.key("analyst", other["id"])
    assert client.get(f"/v1/releases/{rel['id']}/explanation", headers=outsider).status_code == 404


def test_grouped_releases_are_explained_with_public_keys_and_with_discovered_ones(
    api: Api, client: TestClient
) -> None:
    from .test_grouped import rows_csv, table, upload

    ds = table(api, delta="0.001")
    upload(client, api, ds["id"], rows_csv(400))
    public = api.query(ds["id"], quantiles=[0.5], epsilon="1", method="jointexp",
                       group_by="region", keys=["north", "atlantis"])  # fmt: skip
    found = api.query(ds["id"], quantiles=[0.5], epsilon="1", method="jointexp",
                      group_by="region", keys="discover",
                      selection={"epsilon": "1", "delta": "0.0001"})  # fmt: skip
    for rel in (public, found):
        assert rel.status_code == 201, rel.text
        r = client.get(f"/v1/releases/{rel.json()['id']}/explanation", headers=api.admin)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["release"]["group_by"] == "region"
        assert body["auto_today"] in MECHANISMS
    assert r.json()["release"]["selection"]["max_keys"] == 1000

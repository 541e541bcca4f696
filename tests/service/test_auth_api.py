"""API keys and roles: creation, listing, revocation, scope, and the role matrix."""

from __future__ import annotations

import hashlib
import uuid

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from .conftest import ADMIN, SAMPLE, Api, auth


def test_missing_and_unknown_keys_are_401(client: TestClient) -> None:
    r = client.get("/v1/datasets")
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    assert r.json()["type"] == "unauthorized"
    assert client.get("/v1/datasets", headers=auth("dpq_nope")).status_code == 401
    assert client.get("/v1/datasets", headers={"Authorization": "Basic abc"}).status_code == 401


def test_created_key_is_shown_once_and_stored_only_hashed(
    client: TestClient, db_engine: Engine
) -> None:
    r = client.post("/v1/keys", json={"role": "analyst", "name": "alice"}, headers=ADMIN)
    assert r.status_code == 201
    created = r.json()
    raw = created["key"]
    assert raw.startswith("dpq_") and len(raw) >= 4 + 43  # 256 random bits
    assert created["prefix"] == raw[:12]
    listed = client.get("/v1/keys", headers=ADMIN).json()["items"]
    mine = next(k for k in listed if k["id"] == created["id"])
    assert "key" not in mine and mine["role"] == "analyst"
    with db_engine.connect() as conn:
        row = conn.execute(
            text("SELECT key_hash FROM api_key WHERE id = :i"), {"i": created["id"]}
        ).one()
        dump = " ".join(str(v) for r in conn.execute(text("SELECT * FROM api_key")) for v in r)
    assert row.key_hash == hashlib.sha256(raw.encode()).hexdigest()
    assert raw not in dump


def test_revoked_key_stops_working_at_once(api: Api, client: TestClient) -> None:
    r = client.post("/v1/keys", json={"role": "viewer"}, headers=ADMIN)
    key, key_id = r.json()["key"], r.json()["id"]
    assert client.get("/v1/datasets", headers=auth(key)).status_code == 200
    assert client.delete(f"/v1/keys/{key_id}", headers=ADMIN).status_code == 204
    assert client.get("/v1/datasets", headers=auth(key)).status_code == 401
    listed = client.get("/v1/keys", headers=ADMIN).json()["items"]
    assert next(k for k in listed if k["id"] == key_id)["revoked_at"] is not None
    assert client.delete(f"/v1/keys/{uuid.uuid4()}", headers=ADMIN).status_code == 404


def test_key_validation(api: Api, client: TestClient) -> None:
    ds = api.dataset()
    bad_role = client.post("/v1/keys", json={"role": "root"}, headers=ADMIN)
    assert bad_role.status_code == 422 and bad_role.json()["detail"].startswith("body.role")
    scoped_admin = client.post(
        "/v1/keys", json={"role": "admin", "dataset_id": ds["id"]}, headers=ADMIN
    )
    assert scoped_admin.status_code == 422
    unknown = client.post(
        "/v1/keys", json={"role": "viewer", "dataset_id": str(uuid.uuid4())}, headers=ADMIN
    )
    assert unknown.status_code == 422 and unknown.json()["detail"].startswith("body.dataset_id")


# Route x role -> expected status, for a dataset inside the key's scope.
ROLE_MATRIX = [
    ("POST", "/v1/datasets", {"admin": 201, "analyst": 403, "viewer": 403}),
    ("GET", "/v1/datasets", {"admin": 200, "analyst": 200, "viewer": 200}),
    ("GET", "/v1/datasets/{ds}", {"admin": 200, "analyst": 200, "viewer": 200}),
    ("PUT", "/v1/datasets/{ds}/values", {"admin": 200, "analyst": 403, "viewer": 403}),
    ("POST", "/v1/datasets/{ds}/grants", {"admin": 201, "analyst": 403, "viewer": 403}),
    ("GET", "/v1/datasets/{ds}/ledger", {"admin": 200, "analyst": 403, "viewer": 403}),
    ("GET", "/v1/datasets/{ds}/budget", {"admin": 200, "analyst": 200, "viewer": 200}),
    ("POST", "/v1/datasets/{ds2}/quantiles", {"admin": 201, "analyst": 201, "viewer": 403}),
    ("GET", "/v1/datasets/{ds}/releases", {"admin": 200, "analyst": 200, "viewer": 200}),
    ("GET", "/v1/releases/{rel}", {"admin": 200, "analyst": 200, "viewer": 200}),
    ("POST", "/v1/keys", {"admin": 201, "analyst": 403, "viewer": 403}),
    ("GET", "/v1/keys", {"admin": 200, "analyst": 403, "viewer": 403}),
    ("DELETE", "/v1/keys/{key}", {"admin": 204, "analyst": 403, "viewer": 403}),
]


def _body(method: str, path: str) -> dict[str, object] | list[float] | None:
    if path == "/v1/datasets" and method == "POST":
        return {"name": "m-" + uuid.uuid4().hex[:10], "lower": 0, "upper": 1}
    if path.endswith("/values"):
        return [1.0, 2.0]
    if path.endswith("/grants"):
        return {"epsilon": "0.1", "reason": "matrix"}
    if path.endswith("/quantiles"):
        return {"quantiles": [0.5], "epsilon": "0.01", "method": "indexp"}
    if path == "/v1/keys":
        return {"role": "viewer"}
    return None


@pytest.mark.parametrize("role", ["admin", "analyst", "viewer"])
def test_role_matrix(api: Api, client: TestClient, role: str) -> None:
    ds = api.dataset()  # never released: values stay replaceable
    ds2 = api.dataset(values=SAMPLE, epsilon="10")
    rel = api.query(ds2["id"]).json()["id"]
    for method, template, expected in ROLE_MATRIX:
        scope = ds2["id"] if "{ds2}" in template else ds["id"]
        headers = ADMIN if role == "admin" else api.key(role, scope)
        if "{rel}" in template:
            headers = ADMIN if role == "admin" else api.key(role, ds2["id"])
        victim = client.post("/v1/keys", json={"role": "viewer"}, headers=ADMIN).json()["id"]
        path = template.format(ds=ds["id"], ds2=ds2["id"], rel=rel, key=victim)
        body = _body(method, template)
        r = client.request(method, path, json=body, headers=headers)
        assert r.status_code == expected[role], (role, method, template, r.text)


def test_objects_outside_the_scope_are_404(api: Api, client: TestClient) -> None:
    mine = api.dataset(values=SAMPLE)
    other = api.dataset(values=SAMPLE)
    rel = api.query(other["id"]).json()["id"]
    for role in ("analyst", "viewer"):
        headers = api.key(role, mine["id"])
        for path in (
            f"/v1/datasets/{other['id']}",
            f"/v1/datasets/{other['id']}/budget",
            f"/v1/datasets/{other['id']}/releases",
            f"/v1/releases/{rel}",
        ):
            r = client.get(path, headers=headers)
            assert r.status_code == 404, (role, path)
            assert r.json()["type"] == "not_found"
    analyst = api.key("analyst", mine["id"])
    assert api.query(other["id"], headers=analyst).status_code == 404

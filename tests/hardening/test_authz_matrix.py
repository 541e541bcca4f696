"""Issue 5, point 7: every route x every kind of caller -> the expected status, from ONE table.

Callers: no key, a bad key, a revoked key, admin, analyst and viewer (both scoped to the
target dataset A), and an analyst scoped to another dataset B. ``MATRIX`` below is the only
source of expectations; a test also checks that it covers every route the app serves, so a
new route cannot ship without its row.

Keys: 256 random bits (>= 128 required), stored only as a SHA-256 hash (checked in raw SQL
over every column of every table), compared with ``hmac.compare_digest``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from app.auth import service as auth_service

from .conftest import ADMIN, Api, report

CALLERS = ("none", "bad", "revoked", "admin", "analyst", "viewer", "other_scope")

# route -> expected status for each caller, in the order of CALLERS.
# 401: no usable key. 403: role may not. 404: outside the key's scope (never 403, which
# would confirm the object exists). Admin's 409 on the values replace: dataset A is frozen
# by its first release (authorisation passed); appends stay open after releases.
MATRIX: dict[tuple[str, str], tuple[int, ...]] = {
    ("GET", "/healthz"): (200, 200, 200, 200, 200, 200, 200),
    ("GET", "/readyz"): (200, 200, 200, 200, 200, 200, 200),
    ("POST", "/v1/datasets"): (401, 401, 401, 201, 403, 403, 403),
    ("GET", "/v1/datasets"): (401, 401, 401, 200, 200, 200, 200),
    ("GET", "/v1/datasets/{dataset_id}"): (401, 401, 401, 200, 200, 200, 404),
    ("PATCH", "/v1/datasets/{dataset_id}"): (401, 401, 401, 200, 403, 403, 403),
    ("DELETE", "/v1/datasets/{dataset_id}"): (401, 401, 401, 204, 403, 403, 403),
    ("PUT", "/v1/datasets/{dataset_id}/values"): (401, 401, 401, 409, 403, 403, 403),
    ("POST", "/v1/datasets/{dataset_id}/values"): (401, 401, 401, 200, 403, 403, 403),
    ("PUT", "/v1/datasets/{dataset_id}/histogram"): (401, 401, 401, 409, 403, 403, 403),
    ("PUT", "/v1/datasets/{dataset_id}/group-histograms"): (401, 401, 401, 409, 403, 403, 403),
    ("POST", "/v1/datasets/{dataset_id}/grants"): (401, 401, 401, 201, 403, 403, 403),
    ("GET", "/v1/datasets/{dataset_id}/ledger"): (401, 401, 401, 200, 403, 403, 403),
    ("GET", "/v1/datasets/{dataset_id}/budget"): (401, 401, 401, 200, 200, 200, 404),
    ("POST", "/v1/datasets/{dataset_id}/quantiles"): (401, 401, 401, 201, 201, 403, 404),
    ("POST", "/v1/datasets/{dataset_id}/quote"): (401, 401, 401, 200, 200, 403, 404),
    ("GET", "/v1/methods"): (200, 200, 200, 200, 200, 200, 200),
    ("GET", "/v1/datasets/{dataset_id}/releases"): (401, 401, 401, 200, 200, 200, 404),
    ("GET", "/v1/releases/{release_id}"): (401, 401, 401, 200, 200, 200, 404),
    ("GET", "/v1/releases/{release_id}/explanation"): (401, 401, 401, 200, 200, 200, 404),
    ("POST", "/v1/keys"): (401, 401, 401, 201, 403, 403, 403),
    ("GET", "/v1/keys"): (401, 401, 401, 200, 403, 403, 403),
    ("GET", "/v1/keys/me"): (401, 401, 401, 200, 200, 200, 200),
    ("DELETE", "/v1/keys/{key_id}"): (401, 401, 401, 204, 403, 403, 403),
    ("POST", "/v1/keys/{key_id}/rotate"): (401, 401, 401, 200, 403, 403, 403),
    ("PATCH", "/v1/keys/{key_id}"): (401, 401, 401, 200, 403, 403, 403),
    # admin: 409 not_on_hold (dataset A was never restored; authorisation passed)
    ("POST", "/v1/datasets/{dataset_id}/restore-confirmation"): (401, 401, 401, 409, 403, 403, 403),
    ("GET", "/v1/audit"): (401, 401, 401, 200, 403, 403, 403),
    ("GET", "/metrics"): (401, 401, 401, 200, 403, 403, 403),
}


@dataclass
class World:
    api: Api
    dataset_a: str
    dataset_b: str
    release_a: str
    headers: dict[str, dict[str, str]]
    raw_keys: list[str]


@pytest.fixture
def world(hapi: Api, hclient: TestClient) -> World:
    a = hapi.dataset(values=[float(v) for v in range(50)], epsilon="100")
    b = hapi.dataset(values=[1.0, 2.0], epsilon="1")
    rel = hapi.query(a["id"], epsilon="0.01")
    assert rel.status_code == 201, rel.text
    raw: list[str] = []

    def key(role: str, scope: str | None) -> dict[str, str]:
        body: dict[str, Any] = {"role": role}
        if scope:
            body["dataset_id"] = scope
        r = hclient.post("/v1/keys", json=body, headers=ADMIN)
        assert r.status_code == 201
        raw.append(r.json()["key"])
        return {"Authorization": f"Bearer {r.json()['key']}", "x-key-id": r.json()["id"]}

    revoked = key("admin", None)
    assert hclient.delete(f"/v1/keys/{revoked['x-key-id']}", headers=ADMIN).status_code == 204
    headers = {
        "none": {},
        "bad": {"Authorization": "Bearer dpq_" + "A" * 43},
        "revoked": revoked,
        "admin": key("admin", None),
        "analyst": key("analyst", a["id"]),
        "viewer": key("viewer", a["id"]),
        "other_scope": key("analyst", b["id"]),
    }
    for h in headers.values():
        h.pop("x-key-id", None)
    return World(hapi, a["id"], b["id"], rel.json()["id"], headers, raw)


def _request(world: World, method: str, path: str) -> tuple[str, dict[str, Any]]:
    """Concrete path and request options for one route (fresh objects where needed)."""
    c = world.api.client
    victim = c.post("/v1/keys", json={"role": "viewer"}, headers=ADMIN).json()["id"]
    dataset = world.dataset_a
    if (method, path) == ("DELETE", "/v1/datasets/{dataset_id}"):
        dataset = world.api.dataset()["id"]  # archiving A would change every later row
    concrete = path.format(dataset_id=dataset, release_id=world.release_a, key_id=victim)
    kw: dict[str, Any] = {}
    if (method, path) == ("POST", "/v1/datasets"):
        kw["json"] = {"name": "m-" + uuid.uuid4().hex[:10], "lower": 0, "upper": 1}
    elif path.endswith("/values"):
        kw["json"] = [1.0, 2.0, 3.0]
    elif path.endswith("/group-histograms"):
        kw["params"] = {"group_by": "g", "column": "value"}
        kw["content"] = b""
        kw["headers"] = {"content-type": "application/octet-stream"}
    elif path.endswith("/histogram"):
        kw["json"] = {"cells": [0, 5], "counts": [2, 1]}
    elif path.endswith("/grants"):
        kw["json"] = {"epsilon": "0.1", "reason": "matrix"}
    elif path.endswith(("/quantiles", "/quote")):
        kw["json"] = {"quantiles": [0.5], "epsilon": "0.01", "method": "indexp"}
    elif (method, path) == ("PATCH", "/v1/datasets/{dataset_id}"):
        kw["json"] = {"description": "matrix"}
    elif (method, path) == ("POST", "/v1/keys"):
        kw["json"] = {"role": "viewer", "dataset_id": world.dataset_a}
    elif (method, path) == ("PATCH", "/v1/keys/{key_id}"):
        kw["json"] = {"max_epsilon": "1"}
    elif path.endswith("/restore-confirmation"):
        kw["json"] = {"reason": "matrix"}
    return concrete, kw


def test_matrix_covers_every_route(happ: Any) -> None:
    served = {
        (method.upper(), path)
        for path, operations in happ.openapi()["paths"].items()
        for method in operations
    }
    assert served == set(MATRIX), served ^ set(MATRIX)
    assert all(len(row) == len(CALLERS) for row in MATRIX.values())


def test_authorization_matrix(world: World, hclient: TestClient) -> None:
    failures: list[str] = []
    counts: Counter[int] = Counter()
    for (method, path), row in MATRIX.items():
        for caller, expected in zip(CALLERS, row, strict=True):
            concrete, kw = _request(world, method, path)
            headers = {**kw.pop("headers", {}), **world.headers[caller]}
            r = hclient.request(method, concrete, headers=headers, **kw)
            counts[r.status_code] += 1
            if r.status_code != expected:
                failures.append(f"{method} {path} as {caller}: {r.status_code} != {expected}")
            if r.status_code >= 400:
                assert set(r.json()) >= {"type", "detail"}
            if r.status_code == 401:
                assert r.headers.get("www-authenticate") == "Bearer"
    report(
        "7 authorization matrix",
        routes=len(MATRIX),
        callers=len(CALLERS),
        cells=len(MATRIX) * len(CALLERS),
        statuses=dict(sorted(counts.items())),
        mismatches=len(failures),
    )
    assert not failures, "\n".join(failures)


def test_other_scope_lists_only_its_own_dataset(world: World, hclient: TestClient) -> None:
    r = hclient.get("/v1/datasets", headers=world.headers["other_scope"])
    assert [d["id"] for d in r.json()["items"]] == [world.dataset_b]
    r = hclient.get("/v1/datasets", headers=world.headers["viewer"])
    assert [d["id"] for d in r.json()["items"]] == [world.dataset_a]
    view = r.json()["items"][0]
    # under swap (this dataset's relation) n is public; the upload state is for admins only
    assert view["neighbors"] == "swap" and view["n"] == 50
    assert "n_outside_bounds" not in view and "frozen_at" not in view


def test_keys_carry_at_least_128_bits_and_are_stored_only_as_hashes(
    world: World, hdb: Engine
) -> None:
    raw_keys = world.raw_keys
    assert len(set(raw_keys)) == len(raw_keys)
    min_bits = math.inf
    for raw in raw_keys:
        assert raw.startswith(auth_service.KEY_PREFIX)
        secret = raw[len(auth_service.KEY_PREFIX) :]
        decoded = base64.urlsafe_b64decode(secret + "=" * (-len(secret) % 4))
        # the part not shown in listings (prefix) must still carry >= 128 random bits
        hidden = raw[auth_service.PUBLIC_PREFIX_LENGTH :]
        min_bits = min(min_bits, len(decoded) * 8, len(hidden) * 6)
    # 200 fresh keys: no collisions, and every base64 position takes many values
    fresh = [auth_service.generate_key() for _ in range(200)]
    assert len(set(fresh)) == 200
    positions = [len({k[i] for k in fresh}) for i in range(len(auth_service.KEY_PREFIX), 40)]
    assert min(positions) >= 30  # of 64 symbols: uniform-looking, not a counter or a clock
    report("7 key entropy", random_bytes=len(decoded), min_hidden_bits=min_bits)
    assert min_bits >= 128

    # Hash-only storage: scan every column of every table as text.
    with hdb.connect() as conn:
        tables = [
            str(t)
            for t in conn.execute(
                text(
                    "SELECT table_name FROM information_schema.tables "
                    "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
                )
            ).scalars()
        ]
        dump = "\n".join(
            str(row[0])
            for table in tables
            for row in conn.execute(text(f'SELECT row_to_json(t)::text FROM "{table}" t'))
        )
        stored = {str(h) for h in conn.execute(text("SELECT key_hash FROM api_key")).scalars()}
    for raw in raw_keys:
        assert raw not in dump
        assert raw[auth_service.PUBLIC_PREFIX_LENGTH :] not in dump
        assert hashlib.sha256(raw.encode()).hexdigest() in stored


def test_keys_are_compared_in_constant_time(
    world: World, hclient: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[Any, Any]] = []
    real: Callable[[Any, Any], bool] = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth_service.hmac, "compare_digest", spy)
    r = hclient.get("/v1/datasets", headers=world.headers["viewer"])
    assert r.status_code == 200
    assert calls, "authentication must compare digests with hmac.compare_digest"
    # what is compared are fixed-length digests, never the raw key
    assert all(len(a) == len(b) == 64 for a, b in calls)
    raw = world.headers["viewer"]["Authorization"].split(" ", 1)[1]
    assert all(raw not in (a, b) for a, b in calls)

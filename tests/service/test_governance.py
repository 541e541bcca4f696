"""Issue 12: budget governance — per-key caps, expiry, rotation, last use, the audit log,
renaming and archiving datasets. Real PostgreSQL, real release workers."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import DBAPIError

from app.api.factory import create_app
from app.core.db import upgrade_database
from app.core.pg import Link
from app.runtime.worker import process_one
from tests.support import ApiBase, app_settings, auth

from .conftest import ADMIN, ADMIN_KEY, SAMPLE, Api


def _key(client: TestClient, **body: Any) -> dict[str, Any]:
    r = client.post("/v1/keys", json={"role": "analyst", **body}, headers=ADMIN)
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


def _spent(db: Engine, key_id: str) -> tuple[Decimal, Decimal, Decimal]:
    """(api_key.spent_epsilon, its spent_delta, the sum of the key's ledger debits)."""
    with db.connect() as conn:
        row = conn.execute(
            text(
                "SELECT k.spent_epsilon, k.spent_delta,"
                " (SELECT coalesce(sum(epsilon), 0) FROM ledger_entry"
                "  WHERE kind = 'debit' AND api_key_id = k.id)"
                " FROM api_key k WHERE k.id = :k"
            ),
            {"k": key_id},
        ).one()
    return Decimal(row[0]), Decimal(row[1]), Decimal(row[2])


# --------------------------------------------------------------------------- per-key caps


def test_a_capped_key_is_refused_past_its_cap_with_its_figures_only(
    api: Api, client: TestClient, db_engine: Engine
) -> None:
    ds = api.dataset(values=SAMPLE, epsilon="10")["id"]
    key = _key(client, dataset_id=ds, max_epsilon="0.3")
    assert key["max_epsilon"] == "0.3" and key["max_delta"] is None
    assert key["spent_epsilon"] == "0" and key["spent_delta"] == "0"
    for _ in range(3):
        r = api.query(ds, auth(key["key"]), epsilon="0.1")
        assert r.status_code == 201, r.text
    refused = api.query(ds, auth(key["key"]), epsilon="0.1")
    assert refused.status_code == 409
    assert refused.json() == {
        "type": "key_budget_exhausted",
        "detail": "the query costs more than this API key may still spend",
        "cap": {"epsilon": "0.3", "delta": None},
        "spent": {"epsilon": "0.3", "delta": "0"},
        "requested": {"epsilon": "0.1", "delta": "0"},
    }
    # Ten debits of 0.1 would exhaust 1.0 exactly; three exhaust 0.3 exactly.
    assert _spent(db_engine, key["id"]) == (Decimal("0.3"), Decimal(0), Decimal("0.3"))
    assert api.budget(ds)["spent"]["epsilon"] == "0.3"  # nothing debited by the refusal
    # Other keys on the same dataset are not affected by this key's cap.
    assert api.query(ds, api.key("analyst", ds), epsilon="1").status_code == 201
    listed = {k["id"]: k for k in client.get("/v1/keys", headers=ADMIN).json()["items"]}
    assert listed[key["id"]]["spent_epsilon"] == "0.3"
    assert "key" not in listed[key["id"]]


def test_the_dataset_budget_is_checked_before_the_keys_cap(api: Api, client: TestClient) -> None:
    """A query over both the dataset's remaining budget and the key's cap is refused for the
    dataset's budget (the documented order), with the dataset's figures only."""
    ds = api.dataset(values=SAMPLE, epsilon="0.2")["id"]
    key = _key(client, dataset_id=ds, max_epsilon="0.1")
    refused = api.query(ds, auth(key["key"]), epsilon="0.5")
    assert refused.status_code == 409 and refused.json()["type"] == "budget_exhausted"
    assert refused.json()["remaining"] == {"epsilon": "0.2", "delta": "0"}
    over_cap = api.query(ds, auth(key["key"]), epsilon="0.15")
    assert over_cap.status_code == 409 and over_cap.json()["type"] == "key_budget_exhausted"


def test_a_delta_cap_is_enforced_too(api: Api, client: TestClient) -> None:
    ds = api.dataset(values=SAMPLE, epsilon="10", delta="0.001")["id"]
    key = _key(client, dataset_id=ds, max_delta="0.0000015")
    body = {"method": "appindexp", "epsilon": "0.1", "delta": "0.000001"}
    assert api.query(ds, auth(key["key"]), **body).status_code == 201
    refused = api.query(ds, auth(key["key"]), **body)
    assert refused.status_code == 409
    assert refused.json()["type"] == "key_budget_exhausted"
    assert refused.json()["cap"] == {"epsilon": None, "delta": "0.0000015"}
    assert refused.json()["spent"] == {"epsilon": "0.1", "delta": "0.000001"}


def test_concurrent_queries_on_one_capped_key_never_exceed_its_cap(
    api: Api, client: TestClient, db_engine: Engine
) -> None:
    # An unscoped analyst key on two datasets: the dataset locks alone would not serialise
    # its releases; the key's row lock (and, behind it, the CHECK) does.
    a = api.dataset(values=SAMPLE, epsilon="10")["id"]
    b = api.dataset(values=SAMPLE, epsilon="10")["id"]
    key = _key(client, max_epsilon="0.5")
    headers = auth(key["key"]) | {"Prefer": "respond-async"}
    payload = {"quantiles": [0.5], "epsilon": "0.1", "method": "indexp"}

    def one(i: int) -> tuple[int, str | None]:
        r = client.post(
            f"/v1/datasets/{(a, b)[i % 2]}/quantiles",
            json=payload,
            headers=headers | {"Idempotency-Key": f"cap-{i}"},
        )
        return r.status_code, r.json().get("type")

    with ThreadPoolExecutor(max_workers=16) as pool:
        outcomes = Counter(pool.map(one, range(24)))
    assert outcomes == {(202, None): 5, (409, "key_budget_exhausted"): 19}, outcomes
    assert _spent(db_engine, key["id"]) == (Decimal("0.5"), Decimal(0), Decimal("0.5"))
    spent = Decimal(api.budget(a)["spent"]["epsilon"]) + Decimal(api.budget(b)["spent"]["epsilon"])
    assert spent == Decimal("0.5")


def test_idempotent_replays_do_not_count_twice_against_the_cap(
    api: Api, client: TestClient, db_engine: Engine
) -> None:
    ds = api.dataset(values=SAMPLE, epsilon="10")["id"]
    key = _key(client, dataset_id=ds, max_epsilon="0.2")
    headers = auth(key["key"]) | {"Idempotency-Key": "once"}
    first = api.query(ds, headers, epsilon="0.1")
    assert first.status_code == 201
    for _ in range(3):
        replay = api.query(ds, headers, epsilon="0.1")
        assert replay.status_code == 201 and replay.headers["idempotent-replayed"] == "true"
    assert _spent(db_engine, key["id"])[0] == Decimal("0.1")
    assert api.query(ds, auth(key["key"]), epsilon="0.1").status_code == 201
    # The cap is reached: a replay of the first release is still free and still answered.
    assert api.query(ds, headers, epsilon="0.1").status_code == 201
    assert api.query(ds, auth(key["key"]), epsilon="0.1").status_code == 409


def test_the_database_refuses_a_debit_over_a_key_cap_and_direct_writes_of_spent(
    api: Api, client: TestClient, db_engine: Engine
) -> None:
    ds = api.dataset(values=SAMPLE, epsilon="10")["id"]
    key = _key(client, dataset_id=ds, max_epsilon="0.25")
    rid = api.query(ds, auth(key["key"]), epsilon="0.2").json()["id"]
    with db_engine.begin() as conn:  # a code path that "forgot" the cap check
        rogue = uuid.uuid4()
        conn.execute(
            text(
                "INSERT INTO release (id, dataset_id, api_key_id, method, quantiles, epsilon,"
                " cost_epsilon, cost_delta, remaining_epsilon, remaining_delta, created_at,"
                " status, failure, attempts) VALUES (:i, :d, :k, 'indexp', '{0.5}', 0.1, 0.1,"
                " 0, 0, 0, now(), 'failed', 'mechanism_error', 0)"
            ),
            {"i": rogue, "d": ds, "k": key["id"]},
        )
    with pytest.raises(DBAPIError) as caught, db_engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO ledger_entry (dataset_id, kind, epsilon, delta, release_id,"
                " api_key_id, created_at) VALUES (:d, 'debit', 0.1, 0, :r, :k, now())"
            ),
            {"d": ds, "r": rogue, "k": key["id"]},
        )
    assert "ck_api_key_key_cap" in str(caught.value.orig)
    for statement in (
        "UPDATE api_key SET spent_epsilon = 0 WHERE id = :k",
        "UPDATE api_key SET spent_delta = 1 WHERE id = :k",
    ):
        with pytest.raises(DBAPIError) as caught, db_engine.begin() as conn:
            conn.execute(text(statement), {"k": key["id"]})
        assert "written only by ledger_entry debits" in str(caught.value.orig)
    assert _spent(db_engine, key["id"]) == (Decimal("0.2"), Decimal(0), Decimal("0.2"))
    assert rid


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"max_epsilon": "-0.1"}, "body.max_epsilon"),
        ({"max_delta": "abc"}, "body.max_delta"),
        ({"expires_at": "2020-01-01T00:00:00Z"}, "body.expires_at"),
        ({"expires_at": "2999-01-01T00:00:00"}, "body.expires_at"),  # no time zone
        ({"expires_at": "tomorrow"}, "body.expires_at"),
    ],
)
def test_bad_caps_and_expiry_are_422_naming_the_field(
    client: TestClient, db_engine: Engine, body: dict[str, Any], field: str
) -> None:
    with db_engine.connect() as conn:
        before = conn.execute(text("SELECT count(*) FROM api_key")).scalar_one()
    r = client.post("/v1/keys", json={"role": "viewer", **body}, headers=ADMIN)
    assert r.status_code == 422 and r.json()["type"] == "validation_error"
    assert field in r.json()["detail"]
    with db_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM api_key")).scalar_one() == before


# --------------------------------------------------------------------------- expiry, last use


def test_a_key_stops_working_when_it_expires(client: TestClient) -> None:
    expires = datetime.now(UTC) + timedelta(seconds=2)
    key = _key(client, expires_at=expires.isoformat())
    assert datetime.fromisoformat(key["expires_at"]) == expires
    assert client.get("/v1/keys/me", headers=auth(key["key"])).status_code == 200
    time.sleep(max(0.0, (expires - datetime.now(UTC)).total_seconds()) + 0.2)
    r = client.get("/v1/keys/me", headers=auth(key["key"]))
    assert r.status_code == 401 and r.json()["type"] == "unauthorized"


def test_last_used_at_is_written_at_most_once_a_minute(
    client: TestClient, db_engine: Engine
) -> None:
    key = _key(client)
    assert key["last_used_at"] is None

    def row() -> tuple[Any, Any]:
        with db_engine.connect() as conn:
            r = conn.execute(
                text("SELECT last_used_at, xmin::text FROM api_key WHERE id = :k"),
                {"k": key["id"]},
            ).one()
        return r[0], r[1]

    assert client.get("/v1/keys/me", headers=auth(key["key"])).status_code == 200
    first = row()
    assert first[0] is not None
    for _ in range(20):
        assert client.get("/v1/keys/me", headers=auth(key["key"])).status_code == 200
    assert row() == first  # same value, same row version: no write per request
    with db_engine.begin() as conn:
        conn.execute(
            text("UPDATE api_key SET last_used_at = now() - interval '2 minutes' WHERE id = :k"),
            {"k": key["id"]},
        )
    assert client.get("/v1/keys/me", headers=auth(key["key"])).status_code == 200
    assert row()[0] > first[0] - timedelta(seconds=1)
    listed = {k["id"]: k for k in client.get("/v1/keys", headers=ADMIN).json()["items"]}
    assert listed[key["id"]]["last_used_at"] is not None


# --------------------------------------------------------------------------- rotation


def test_rotation_gives_a_new_secret_and_the_old_one_stops_at_once(
    api: Api, client: TestClient, db_engine: Engine
) -> None:
    ds = api.dataset(values=SAMPLE, epsilon="10")["id"]
    expires = (datetime.now(UTC) + timedelta(days=30)).isoformat()
    old = _key(client, dataset_id=ds, max_epsilon="0.5", expires_at=expires, name="rotating")
    assert api.query(ds, auth(old["key"]), epsilon="0.2").status_code == 201
    r = client.post(f"/v1/keys/{old['id']}/rotate", headers=ADMIN)
    assert r.status_code == 200, r.text
    new = r.json()
    assert new["key"] != old["key"] and new["key"].startswith("dpq_")
    assert new["prefix"] == new["key"][:12] != old["prefix"]
    same = ("id", "role", "dataset_id", "name", "max_epsilon", "max_delta", "expires_at")
    assert {f: new[f] for f in same} == {f: old[f] for f in same}
    assert new["spent_epsilon"] == "0.2" and new["rotated_at"] is not None
    assert client.get("/v1/keys/me", headers=auth(old["key"])).status_code == 401
    me = client.get("/v1/keys/me", headers=auth(new["key"]))
    assert me.status_code == 200 and me.json()["id"] == old["id"]
    # The cap carries over: 0.3 left of 0.5.
    assert api.query(ds, auth(new["key"]), epsilon="0.4").json()["type"] == "key_budget_exhausted"
    assert api.query(ds, auth(new["key"]), epsilon="0.3").status_code == 201
    assert _spent(db_engine, old["id"])[0] == Decimal("0.5")


def test_rotation_refusals(client: TestClient) -> None:
    key = _key(client)
    assert client.post(f"/v1/keys/{key['id']}/rotate", headers=auth(key["key"])).status_code == 403
    assert client.post(f"/v1/keys/{uuid.uuid4()}/rotate", headers=ADMIN).status_code == 404
    assert client.post("/v1/keys/not-a-uuid/rotate", headers=ADMIN).status_code == 422
    assert client.delete(f"/v1/keys/{key['id']}", headers=ADMIN).status_code == 204
    r = client.post(f"/v1/keys/{key['id']}/rotate", headers=ADMIN)
    assert r.status_code == 409 and r.json()["type"] == "key_not_rotatable"
    me = client.get("/v1/keys/me", headers=ADMIN).json()["id"]  # the bootstrap key
    r = client.post(f"/v1/keys/{me}/rotate", headers=ADMIN)
    assert r.status_code == 409 and r.json()["type"] == "key_not_rotatable"


# --------------------------------------------------------------------------- audit log


def _audit(client: TestClient, **params: Any) -> list[dict[str, Any]]:
    r = client.get("/v1/audit", params=params, headers=ADMIN)
    assert r.status_code == 200, r.text
    items: list[dict[str, Any]] = r.json()["items"]
    return items


def test_the_audit_log_records_who_did_what_without_any_value(api: Api, client: TestClient) -> None:
    me = client.get("/v1/keys/me", headers=ADMIN).json()["id"]
    start = _audit(client, limit=1)[0]["id"]
    name = "audited-" + uuid.uuid4().hex[:8]
    created = client.post(
        "/v1/datasets",
        json={"name": name, "lower": 0, "upper": 100000, "epsilon": "1", "neighbors": "add_remove"},
        headers=ADMIN,
    ).json()
    ds = created["id"]
    secret_values = [31415.9265, 27182.8182, 16180.3398, 14142.1356]
    body = json.dumps(secret_values).encode()
    up = client.put(
        f"/v1/datasets/{ds}/values",
        content=body,
        headers=ADMIN | {"Content-Type": "application/json"},
    )
    assert up.status_code == 200
    grant = {"epsilon": "0.5", "delta": "0.000001", "reason": "quarterly report"}
    assert client.post(f"/v1/datasets/{ds}/grants", json=grant, headers=ADMIN).status_code == 201
    key = _key(client, dataset_id=ds, max_epsilon="0.7", name="carol")
    assert client.post(f"/v1/keys/{key['id']}/rotate", headers=ADMIN).status_code == 200
    assert client.delete(f"/v1/keys/{key['id']}", headers=ADMIN).status_code == 204
    assert client.delete(f"/v1/keys/{key['id']}", headers=ADMIN).status_code == 204  # no-op
    patch = {"name": name + "-renamed"}
    assert client.patch(f"/v1/datasets/{ds}", json=patch, headers=ADMIN).status_code == 200
    assert client.delete(f"/v1/datasets/{ds}", headers=ADMIN).status_code == 204
    assert client.delete(f"/v1/datasets/{ds}", headers=ADMIN).status_code == 204  # no-op

    events = [e for e in _audit(client, limit=500) if e["id"] > start]
    assert [e["id"] for e in events] == sorted((e["id"] for e in events), reverse=True)
    mine = [e for e in events if e["target_id"] in (ds, key["id"])]
    assert [e["action"] for e in reversed(mine)] == [
        "dataset.create",
        "budget.grant",  # the initial budget
        "dataset.upload",
        "budget.grant",
        "key.create",
        "key.rotate",
        "key.revoke",
        "dataset.update",
        "dataset.archive",
    ]
    assert all(e["actor_key_id"] == me and e["actor_prefix"] for e in mine)
    by_action = {e["action"]: e for e in mine}
    assert by_action["dataset.upload"]["details"] == {
        "kind": "values",
        "mode": "replace",
        "media_type": "application/json",
        "bytes": len(body),
    }
    grants = [e["details"] for e in mine if e["action"] == "budget.grant"]
    assert {"epsilon": "0.5", "delta": "0.000001", "reason": "quarterly report"} in grants
    assert by_action["key.create"]["details"]["max_epsilon"] == "0.7"
    assert by_action["key.create"]["details"]["role"] == "analyst"
    assert by_action["dataset.update"]["details"] == {
        "name": {"from": name, "to": name + "-renamed"}
    }
    dump = json.dumps(events)
    # Timestamps, ids and key prefixes are random digits that can contain a value's
    # digits by chance; the values could only leak through the other fields.
    random_fields = {"id", "created_at", "actor_key_id", "actor_prefix", "target_id"}
    scrubbed = [{k: v for k, v in e.items() if k not in random_fields} for e in events]
    scrubbed_dump = json.dumps(scrubbed).replace(key["key"][:12], "")
    for e in events:
        for field in ("prefix", "old_prefix"):
            if isinstance(e["details"], dict) and field in e["details"]:
                scrubbed_dump = scrubbed_dump.replace(e["details"][field], "")
    for v in secret_values:
        for text_form in (repr(v), f"{v:.1f}", str(int(v))):
            assert text_form not in scrubbed_dump
    assert '"n"' not in dump and '"n_cells"' not in dump and '"n_outside' not in dump
    assert key["key"] not in dump and key["key"][12:] not in dump


def test_audit_pages_newest_first_and_is_for_admins_only(api: Api, client: TestClient) -> None:
    api.dataset()
    api.dataset()
    page = client.get("/v1/audit?limit=2", headers=ADMIN).json()
    assert len(page["items"]) == 2 and page["next_cursor"]
    older = client.get(f"/v1/audit?limit=2&cursor={page['next_cursor']}", headers=ADMIN).json()
    assert older["items"][0]["id"] < page["items"][1]["id"]
    for bad in ("nonsense", "djE6LTE", "djI6NQ"):
        r = client.get(f"/v1/audit?cursor={bad}", headers=ADMIN)
        assert r.status_code == 422 and "query.cursor" in r.json()["detail"]
    assert client.get("/v1/audit?limit=0", headers=ADMIN).status_code == 422
    for role in ("analyst", "viewer"):
        assert client.get("/v1/audit", headers=api.key(role)).status_code == 403
    assert client.get("/v1/audit").status_code == 401


def test_the_audit_log_is_append_only_in_the_database(api: Api, db_engine: Engine) -> None:
    api.dataset()

    def events() -> list[Any]:
        with db_engine.connect() as conn:
            return list(conn.execute(text("SELECT * FROM audit_event ORDER BY id")))

    before = events()
    assert before
    for statement in (
        "UPDATE audit_event SET action = 'x'",
        "DELETE FROM audit_event",
        "TRUNCATE audit_event",
        "TRUNCATE api_key CASCADE",
    ):
        with pytest.raises(DBAPIError) as caught, db_engine.begin() as conn:
            conn.execute(text(statement))
        assert getattr(caught.value.orig, "sqlstate", None) == "55000"  # refused by a trigger
        if "audit_event" in statement:
            assert "audit_event is append-only" in str(caught.value.orig)
    assert events() == before


# --------------------------------------------------------------------------- rename, archive


def test_rename_and_redescribe(api: Api, client: TestClient) -> None:
    a, b = api.dataset(), api.dataset()
    r = client.patch(f"/v1/datasets/{a['id']}", json={"description": "new words"}, headers=ADMIN)
    assert r.status_code == 200 and r.json()["description"] == "new words"
    assert r.json()["name"] == a["name"]
    r = client.patch(f"/v1/datasets/{a['id']}", json={"name": b["name"]}, headers=ADMIN)
    assert r.status_code == 409 and r.json()["type"] == "name_taken"
    for body, field in (({}, "body"), ({"name": ""}, "body.name"), ({"n": 3}, "body.n")):
        r = client.patch(f"/v1/datasets/{a['id']}", json=body, headers=ADMIN)
        assert r.status_code == 422 and field in r.json()["detail"], r.text
    assert (
        client.patch(
            f"/v1/datasets/{a['id']}", json={"name": "x"}, headers=api.key("analyst", a["id"])
        ).status_code
        == 403
    )
    assert (
        client.patch(f"/v1/datasets/{uuid.uuid4()}", json={"name": "x"}, headers=ADMIN).status_code
        == 404
    )
    fresh = "renamed-" + uuid.uuid4().hex[:8]
    r = client.patch(f"/v1/datasets/{a['id']}", json={"name": fresh}, headers=ADMIN)
    assert r.status_code == 200 and r.json()["name"] == fresh


def test_archive_keeps_ledger_and_releases_frees_the_name_and_refuses_the_rest(
    api: Api, client: TestClient, db_engine: Engine
) -> None:
    ds = api.dataset(values=SAMPLE, epsilon="1")
    analyst = api.key("analyst", ds["id"])
    release = api.query(ds["id"], analyst, epsilon="0.25")
    assert release.status_code == 201 and release.json()["status"] == "done"
    ledger_before = client.get(f"/v1/datasets/{ds['id']}/ledger", headers=ADMIN).json()

    assert client.delete(f"/v1/datasets/{ds['id']}", headers=analyst).status_code == 403
    assert client.delete(f"/v1/datasets/{ds['id']}", headers=ADMIN).status_code == 204
    view = client.get(f"/v1/datasets/{ds['id']}", headers=analyst).json()
    assert view["archived_at"] is not None
    listed = {
        d["id"]: d for d in client.get("/v1/datasets?limit=500", headers=ADMIN).json()["items"]
    }
    assert listed[ds["id"]]["archived_at"] == view["archived_at"]
    # Ledger, budget and releases are still readable, unchanged.
    assert client.get(f"/v1/datasets/{ds['id']}/ledger", headers=ADMIN).json() == ledger_before
    assert api.budget(ds["id"])["spent"]["epsilon"] == "0.25"
    again = client.get(f"/v1/releases/{release.json()['id']}", headers=analyst)
    assert again.status_code == 200 and again.content == release.content
    releases = client.get(f"/v1/datasets/{ds['id']}/releases", headers=analyst).json()
    assert [r["id"] for r in releases["items"]] == [release.json()["id"]]
    # The values are gone from the database.
    with db_engine.connect() as conn:
        left = conn.execute(
            text("SELECT count(*) FROM dataset_data WHERE dataset_id = :d"), {"d": ds["id"]}
        ).scalar_one()
    assert left == 0
    # Nothing else is allowed: queries (with or without a key), uploads, grants, renames.
    for headers in (analyst, analyst | {"Idempotency-Key": "after-archive"}):
        r = api.query(ds["id"], headers, epsilon="0.1")
        assert r.status_code == 409 and r.json()["type"] == "dataset_archived", r.text
    refusals = [
        client.put(f"/v1/datasets/{ds['id']}/values", json=[1.0], headers=ADMIN),
        client.post(f"/v1/datasets/{ds['id']}/values", json=[1.0], headers=ADMIN),
        client.put(
            f"/v1/datasets/{ds['id']}/histogram",
            json={"cells": [1], "counts": [1]},
            headers=ADMIN,
        ),
        client.post(
            f"/v1/datasets/{ds['id']}/grants", json={"epsilon": "1", "reason": "x"}, headers=ADMIN
        ),
        client.patch(f"/v1/datasets/{ds['id']}", json={"name": "zombie"}, headers=ADMIN),
    ]
    for r in refusals:
        assert r.status_code == 409 and r.json()["type"] == "dataset_archived", r.text
    assert api.budget(ds["id"])["spent"]["epsilon"] == "0.25"  # nothing was debited
    # The name is free again, once: a second live dataset with it is still refused.
    reuse = {"name": ds["name"], "lower": 0, "upper": 1}
    r = client.post("/v1/datasets", json=reuse, headers=ADMIN)
    assert r.status_code == 201 and r.json()["id"] != ds["id"]
    r = client.post("/v1/datasets", json=reuse, headers=ADMIN)
    assert r.status_code == 409 and r.json()["type"] == "name_taken"
    assert client.delete(f"/v1/datasets/{uuid.uuid4()}", headers=ADMIN).status_code == 404


# --------------------------------------------------------------------------- quiet schema


@pytest.fixture(scope="module")
def quiet(make_schema: Callable[[], str]) -> Iterator[tuple[ApiBase, Callable[[], bool]]]:
    """A schema without workers: releases stay pending until ``run_one()``."""
    url = make_schema()
    upgrade_database(url)
    settings = app_settings(url, admin_key=ADMIN_KEY, sync_wait_s=0.5)
    link = Link(url, settings)
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        yield ApiBase(client, ADMIN, "quiet"), lambda: process_one(link, settings)
    link.close()


def test_a_release_not_yet_run_when_its_dataset_is_archived_fails_and_keeps_its_debit(
    quiet: tuple[ApiBase, Callable[[], bool]],
) -> None:
    api, run_one = quiet
    ds = api.dataset(values=SAMPLE, epsilon="1")["id"]
    headers = ADMIN | {"Prefer": "respond-async", "Idempotency-Key": "k-" + uuid.uuid4().hex}
    pending = api.query(ds, headers)
    assert pending.status_code == 202
    assert api.client.delete(f"/v1/datasets/{ds}", headers=ADMIN).status_code == 204
    assert run_one()
    failed = api.client.get(f"/v1/releases/{pending.json()['id']}", headers=ADMIN).json()
    assert failed["status"] == "failed" and failed["failure"] == "dataset_archived"
    assert failed["estimates"] is None
    assert api.budget(ds)["spent"]["epsilon"] == "0.1"
    # A retry with the same key replays it (not resumed: the values are gone), free.
    replay = api.query(ds, headers)
    assert replay.status_code == 201 and replay.json()["status"] == "failed"
    assert not run_one()
    assert api.budget(ds)["spent"]["epsilon"] == "0.1"


def test_migration_0005_downgrades_with_archived_namesakes_and_upgrades_again(
    make_schema: Callable[[], str],
) -> None:
    from app.core.db import downgrade_database

    url = make_schema()
    upgrade_database(url)
    engine = create_engine(url)
    insert = text(
        "INSERT INTO dataset (id, name, description, lower, upper, neighbors, granularity,"
        " data_version, created_at, archived_at) VALUES (:i, 'same', '', 0, 1, 'swap', 0.001,"
        " 0, now(), :a)"
    )
    try:
        with engine.begin() as conn:
            conn.execute(insert, {"i": uuid.uuid4(), "a": datetime.now(UTC)})
            conn.execute(insert, {"i": uuid.uuid4(), "a": datetime.now(UTC)})
            conn.execute(insert, {"i": uuid.uuid4(), "a": None})
            # two live namesakes: refused by the partial unique index
            with pytest.raises(DBAPIError), conn.begin_nested():
                conn.execute(insert, {"i": uuid.uuid4(), "a": None})
        downgrade_database(url, "0004")
        with engine.connect() as conn:
            names = sorted(conn.execute(text("SELECT name FROM dataset")).scalars())
        assert len(set(names)) == 3 and "same" in names
        assert all(n == "same" or n.startswith("same #") for n in names)
        upgrade_database(url)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM audit_event")).scalar_one() == 0
    finally:
        engine.dispose()


def test_bootstrap_key_registration_is_audited_without_an_actor(
    client: TestClient, db_engine: Engine
) -> None:
    me = client.get("/v1/keys/me", headers=ADMIN).json()["id"]
    with db_engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT actor_key_id, details FROM audit_event"
                " WHERE action = 'key.create' AND target_id = :k"
            ),
            {"k": me},
        ).all()
    assert len(rows) == 1
    assert rows[0][0] is None and rows[0][1]["bootstrap"] is True

"""The five ledger invariants of DESIGN.md section 3, each against real PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid
from decimal import Decimal
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from app.api.factory import create_app
from app.mechanisms import MECHANISMS

from .conftest import ADMIN, SAMPLE, Api, make_settings


def ledger_rows(engine: Engine, dataset_id: str) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT kind, epsilon, delta, release_id FROM ledger_entry "
                    "WHERE dataset_id = :d ORDER BY id"
                ),
                {"d": dataset_id},
            )
        )


def releases_of(engine: Engine, dataset_id: str) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                text("SELECT id, cost_epsilon, cost_delta FROM release WHERE dataset_id = :d"),
                {"d": dataset_id},
            )
        )


def assert_each_release_has_its_debit(engine: Engine, dataset_id: str) -> None:
    debits = {r.release_id: r for r in ledger_rows(engine, dataset_id) if r.kind == "debit"}
    releases = releases_of(engine, dataset_id)
    assert len(debits) == len(releases)
    for rel in releases:
        assert rel.id in debits
        assert debits[rel.id].epsilon == rel.cost_epsilon
        assert debits[rel.id].delta == rel.cost_delta


# ------------------------------------------------------------------ invariant 1


def test_inv1_every_release_has_a_debit_of_its_full_cost(api: Api, db_engine: Engine) -> None:
    ds = api.dataset(values=SAMPLE, epsilon="5", delta="0.001")
    for method, mech in MECHANISMS.items():
        body: dict[str, Any] = {"method": method, "epsilon": "0.3"}
        if mech.uses_delta:
            body["delta"] = "0.0001"
        r = api.query(ds["id"], **body)
        assert r.status_code == 201, (method, r.text)
    assert_each_release_has_its_debit(db_engine, ds["id"])


def test_inv1_failed_debit_insert_leaves_no_release(api: Api, db_engine: Engine) -> None:
    """The release and its debit are written by one statement (``release_reserve()``): a
    debit that fails after the release row was inserted leaves neither behind."""
    ds = api.dataset(values=SAMPLE)
    name = "fail_debit_" + uuid.uuid4().hex[:8]
    with db_engine.begin() as conn:
        conn.execute(
            text(
                f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                f" IF NEW.dataset_id = '{ds['id']}' THEN"
                " RAISE EXCEPTION 'simulated crash before the reservation commits'; END IF;"
                " RETURN NEW; END $$"
            )
        )
        conn.execute(
            text(
                f"CREATE TRIGGER {name} BEFORE INSERT ON ledger_entry"
                f" FOR EACH ROW WHEN (NEW.kind = 'debit') EXECUTE FUNCTION {name}()"
            )
        )
    try:
        r = api.query(ds["id"])
    finally:
        with db_engine.begin() as conn:
            conn.execute(text(f"DROP TRIGGER {name} ON ledger_entry"))
            conn.execute(text(f"DROP FUNCTION {name}()"))
    assert r.status_code == 503
    assert r.json()["type"] == "internal_error"
    assert releases_of(db_engine, ds["id"]) == []
    assert [row.kind for row in ledger_rows(db_engine, ds["id"])] == ["grant"]


# ------------------------------------------------------------------ invariant 2


def test_inv2_fifty_concurrent_queries_never_overspend(
    app: FastAPI, api: Api, db_engine: Engine
) -> None:
    ds = api.dataset(values=SAMPLE, epsilon="1.0")
    analyst = api.key("analyst", ds["id"])

    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            body = {"quantiles": [0.1, 0.5, 0.9], "epsilon": "0.1", "method": "indexp"}
            url = f"/v1/datasets/{ds['id']}/quantiles"
            return await asyncio.gather(
                *(client.post(url, json=body, headers=analyst) for _ in range(50))
            )

    responses = app.state.test_portal.call(run)  # on the app's own loop, as under uvicorn
    statuses = sorted(r.status_code for r in responses)
    assert statuses.count(201) == 10
    assert statuses.count(409) == 40
    for r in responses:
        if r.status_code == 409:
            assert r.json()["type"] == "budget_exhausted"
    budget = api.budget(ds["id"])
    assert Decimal(budget["spent"]["epsilon"]) == Decimal("1.0")
    assert Decimal(budget["remaining"]["epsilon"]) == 0
    assert_each_release_has_its_debit(db_engine, ds["id"])


# ------------------------------------------------------------------ invariant 3


def test_inv3_spent_is_the_sum_of_ledger_rows_and_survives_a_restart(
    api: Api, database_url: str, db_engine: Engine
) -> None:
    ds = api.dataset(values=SAMPLE, epsilon="2")
    for eps in ("0.1", "0.25", "0.05"):
        assert api.query(ds["id"], epsilon=eps).status_code == 201
    r = api.client.post(
        f"/v1/datasets/{ds['id']}/grants",
        json={"epsilon": "0.5", "reason": "top-up"},
        headers=ADMIN,
    )
    assert r.status_code == 201, r.text
    rows = ledger_rows(db_engine, ds["id"])
    spent = sum((row.epsilon for row in rows if row.kind == "debit"), Decimal(0))
    granted = sum((row.epsilon for row in rows if row.kind == "grant"), Decimal(0))
    before = api.budget(ds["id"])
    assert Decimal(before["spent"]["epsilon"]) == spent == Decimal("0.40")
    assert Decimal(before["granted"]["epsilon"]) == granted == Decimal("2.5")
    releases_before = api.client.get(f"/v1/datasets/{ds['id']}/releases", headers=ADMIN)

    # A brand-new application instance (as after a restart) sees exactly the same state.
    restarted = create_app(make_settings(database_url))
    with TestClient(restarted) as fresh:
        after = fresh.get(f"/v1/datasets/{ds['id']}/budget", headers=ADMIN)
        releases_after = fresh.get(f"/v1/datasets/{ds['id']}/releases", headers=ADMIN)
    assert after.json() == before
    assert releases_after.content == releases_before.content
    assert ledger_rows(db_engine, ds["id"]) == rows


# ------------------------------------------------------------------ invariant 4


def test_inv4_same_idempotency_key_and_body_replays_without_a_new_debit(
    api: Api, db_engine: Engine
) -> None:
    ds = api.dataset(values=SAMPLE)
    analyst = api.key("analyst", ds["id"])
    headers = analyst | {"Idempotency-Key": "retry-1"}
    first = api.query(ds["id"], headers=headers)
    second = api.query(ds["id"], headers=headers)
    assert first.status_code == second.status_code == 201
    assert first.content == second.content
    assert second.headers.get("Idempotent-Replayed") == "true"
    assert len(releases_of(db_engine, ds["id"])) == 1
    assert Decimal(api.budget(ds["id"])["spent"]["epsilon"]) == Decimal("0.1")


def test_inv4_same_idempotency_key_different_body_is_refused(api: Api, db_engine: Engine) -> None:
    ds = api.dataset(values=SAMPLE)
    headers = ADMIN | {"Idempotency-Key": "k-2"}
    assert api.query(ds["id"], headers=headers).status_code == 201
    r = api.query(ds["id"], headers=headers, epsilon="0.2")
    assert r.status_code == 409
    assert r.json()["type"] == "idempotency_conflict"
    assert len(releases_of(db_engine, ds["id"])) == 1


def test_inv4_concurrent_retries_with_one_key_buy_one_release(
    app: FastAPI, api: Api, db_engine: Engine
) -> None:
    ds = api.dataset(values=SAMPLE)
    headers = ADMIN | {"Idempotency-Key": "burst"}

    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            body = {"quantiles": [0.5], "epsilon": "0.1", "method": "indexp"}
            url = f"/v1/datasets/{ds['id']}/quantiles"
            return await asyncio.gather(
                *(client.post(url, json=body, headers=headers) for _ in range(8))
            )

    responses = app.state.test_portal.call(run)  # on the app's own loop, as under uvicorn
    assert {r.status_code for r in responses} == {201}
    assert len({r.content for r in responses}) == 1
    assert len(releases_of(db_engine, ds["id"])) == 1
    assert Decimal(api.budget(ds["id"])["spent"]["epsilon"]) == Decimal("0.1")


# ------------------------------------------------------------------ invariant 5


def test_inv5_ten_releases_of_a_tenth_exhaust_one_exactly(api: Api) -> None:
    ds = api.dataset(values=SAMPLE, epsilon=1.0)
    for _ in range(10):
        r = api.query(ds["id"], epsilon=0.1)
        assert r.status_code == 201, r.text
    last = r.json()
    assert last["remaining"] == {"epsilon": "0", "delta": "0"}
    budget = api.budget(ds["id"])
    assert Decimal(budget["spent"]["epsilon"]) == Decimal("1.0")
    eleventh = api.query(ds["id"], epsilon=0.1)
    assert eleventh.status_code == 409
    body = eleventh.json()
    assert body["type"] == "budget_exhausted"
    assert set(body) == {"type", "detail", "requested", "remaining"}
    assert body["requested"] == {"epsilon": "0.1", "delta": "0"}
    assert Decimal(body["remaining"]["epsilon"]) == 0

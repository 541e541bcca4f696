"""Quantile queries and releases: every registered method, validation, ETags, pagination."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.api.http import encode_cursor, encode_item_cursor
from app.mechanisms import MECHANISMS
from tests.support import count_statements

from .conftest import ADMIN, SAMPLE, Api


def on_grid(values: list[float], lower: float, granularity: float) -> bool:
    k = (np.asarray(values) - lower) / granularity
    return bool(np.allclose(k, np.rint(k), atol=1e-6))


@pytest.mark.parametrize("method", sorted(MECHANISMS))
def test_every_registered_method_releases_snapped_sorted_estimates(api: Api, method: str) -> None:
    mech = MECHANISMS[method]
    values = list(np.random.default_rng(7).normal(50, 15, 2000))
    ds = api.dataset(values=values, epsilon="10", delta="0.01", granularity=0.01)
    body: dict[str, Any] = {"method": method, "epsilon": "1", "quantiles": [0.1, 0.5, 0.9]}
    if mech.uses_delta:
        body["delta"] = "0.000001"
    r = api.query(ds["id"], **body)
    assert r.status_code == 201, r.text
    rel = r.json()
    est = rel["estimates"]
    assert len(est) == 3 and est == sorted(est)
    assert all(0.0 <= e <= 100.0 for e in est)
    assert on_grid(est, 0.0, 0.01)
    assert rel["method"] == method
    assert Decimal(rel["cost"]["epsilon"]) >= Decimal("1")
    if mech.uses_delta:
        assert Decimal(rel["cost"]["delta"]) > 0
    budget = api.budget(ds["id"])
    assert budget["spent"] == rel["cost"]
    assert budget["remaining"] == rel["remaining"]


def test_default_method_is_jointexp(api: Api) -> None:
    assert "jointexp" in MECHANISMS
    ds = api.dataset(values=SAMPLE)
    r = api.client.post(
        f"/v1/datasets/{ds['id']}/quantiles",
        json={"quantiles": [0.5], "epsilon": 0.5},
        headers=ADMIN,
    )
    assert r.status_code == 201, r.text
    assert r.json()["method"] == "jointexp"


def test_release_response_shape(api: Api) -> None:
    ds = api.dataset(values=SAMPLE)
    rel = api.query(ds["id"]).json()
    assert set(rel) == {
        "id", "dataset_id", "status", "method", "quantiles", "estimates", "failure", "epsilon",
        "delta", "cost", "remaining", "created_at", "finished_at", "expected_error", "warnings",
        "column", "data_version", "rho", "group_by", "groups", "group_error",
        "selection", "intervals",
    }  # fmt: skip
    assert len(rel["intervals"]) == 3  # error bars: one per estimate
    assert rel["group_by"] is None and rel["groups"] is None and rel["group_error"] is None
    assert rel["column"] == "value" and rel["data_version"] == 1
    assert rel["rho"] is None  # a pure table
    assert rel["status"] == "done" and rel["failure"] is None and rel["finished_at"]
    assert rel["cost"] == {"epsilon": "0.1", "delta": "0"}
    assert rel["remaining"] == {"epsilon": "0.9", "delta": "0"}
    assert rel["quantiles"] == [0.25, 0.5, 0.75]


def test_epsilon_below_the_services_minimum_is_refused_and_free(
    api: Api, client: TestClient
) -> None:
    """Issue 28: releases at epsilon = 1e-30 cost nothing, so one key could queue runs
    without end. Below DPQUANT_MIN_EPSILON (0.001 by default) the quantile endpoint and the
    quote answer 422 on body.epsilon, reserve nothing and debit nothing; at the minimum the
    release runs."""
    ds = api.dataset(values=SAMPLE)
    for eps in ("1e-30", "0.000999"):
        for path in ("quantiles", "quote"):
            r = client.post(
                f"/v1/datasets/{ds['id']}/{path}",
                json={"quantiles": [0.5], "epsilon": eps},
                headers=ADMIN,
            )
            assert r.status_code == 422, r.text
            assert r.json()["detail"].startswith("body.epsilon") and "0.001" in r.json()["detail"]
    listed = client.get(f"/v1/datasets/{ds['id']}/releases", headers=ADMIN).json()["items"]
    assert listed == [] and api.budget(ds["id"])["spent"]["epsilon"] == "0"
    assert api.query(ds["id"], epsilon="0.001").status_code == 201


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"quantiles": []}, "body.quantiles"),
        ({"quantiles": [0.5, 0.2]}, "body.quantiles"),
        ({"quantiles": [0.2, 0.2]}, "body.quantiles"),
        ({"quantiles": [0.0, 0.5]}, "body.quantiles"),
        ({"quantiles": [0.5, 1.0]}, "body.quantiles"),
        ({"quantiles": ["a"]}, "body.quantiles"),
        ({"epsilon": 0}, "body.epsilon"),
        ({"epsilon": -0.5}, "body.epsilon"),
        ({"epsilon": "1e-320"}, "body.epsilon"),
        ({"epsilon": "NaN"}, "body.epsilon"),
        ({"method": "nope"}, "body.method"),
        ({"delta": "0.001"}, "body.delta"),  # indexp takes no delta
        ({"bogus": 1}, "body.bogus"),
    ],
)
def test_query_validation_names_the_field_and_charges_nothing(
    api: Api, change: dict[str, Any], field: str
) -> None:
    ds = api.dataset(values=SAMPLE)
    r = api.query(ds["id"], **change)
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith(field)
    assert api.budget(ds["id"])["spent"]["epsilon"] == "0"


def test_delta_is_required_by_methods_that_use_it(api: Api) -> None:
    method = next(name for name, m in MECHANISMS.items() if m.uses_delta)
    ds = api.dataset(values=SAMPLE, delta="0.1")
    r = api.query(ds["id"], method=method)
    assert r.status_code == 422
    assert r.json()["detail"].startswith("body.delta")


def test_delta_budget_is_enforced(api: Api) -> None:
    method = next(name for name, m in MECHANISMS.items() if m.uses_delta)
    ds = api.dataset(values=SAMPLE, epsilon="100", delta="0")
    r = api.query(ds["id"], method=method, delta="0.0001")
    assert r.status_code == 409
    assert r.json()["type"] == "budget_exhausted"


def test_too_many_quantiles_is_422(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api.client.app.state.settings, "max_quantiles", 3)  # type: ignore[attr-defined]
    ds = api.dataset(values=SAMPLE)
    r = api.query(ds["id"], quantiles=[0.1, 0.2, 0.3, 0.4])
    assert r.status_code == 422
    assert r.json()["detail"].startswith("body.quantiles")


def test_query_without_values_is_409(api: Api) -> None:
    ds = api.dataset()
    r = api.query(ds["id"])
    assert r.status_code == 409
    assert r.json()["type"] == "no_values"
    assert api.budget(ds["id"])["spent"]["epsilon"] == "0"


def test_query_unknown_dataset_is_404(api: Api) -> None:
    assert api.query(str(uuid.uuid4())).status_code == 404


def test_reading_a_release_again_is_free_and_byte_identical(api: Api, client: TestClient) -> None:
    ds = api.dataset(values=SAMPLE)
    created = api.query(ds["id"])
    rel_id = created.json()["id"]
    again = client.get(f"/v1/releases/{rel_id}", headers=ADMIN)
    assert again.status_code == 200
    assert again.content == created.content
    assert api.budget(ds["id"])["spent"]["epsilon"] == "0.1"
    assert client.get(f"/v1/releases/{uuid.uuid4()}", headers=ADMIN).status_code == 404


@pytest.mark.parametrize(
    ("m", "epsilon", "reads"),
    [
        (3, "1e-1", 0),  # the finished announcement carries the outcome: no re-read
        (9, "0.25000", 0),
        (1000, "0.1", 1),  # too large for a notification: the id only, then one read
    ],
)
def test_a_synchronous_answer_is_byte_identical_to_a_later_read(
    api: Api, client: TestClient, m: int, epsilon: str, reads: int, monkeypatch: Any
) -> None:
    """A synchronous 201 is completed in memory from the worker's announcement (or read back
    when the outcome does not fit in one), and either way equals a later GET byte for byte:
    figures as the ledger writes them, estimates to the last bit, the finish time to the
    microsecond in UTC."""
    values = list(np.random.default_rng(m).normal(50, 15, 3000))
    ds = api.dataset(values=values, epsilon="100", granularity=1e-7)  # long decimals
    quantiles = [round((k + 1) / (m + 1), 6) for k in range(m)]
    method = "jointexp" if m < 100 else "indexp"
    assert api.query(ds["id"], method=method).status_code == 201  # warm-up (key, freeze)
    with monkeypatch.context() as patch:
        statements = count_statements(patch)["async"]
        created = api.query(ds["id"], method=method, quantiles=quantiles, epsilon=epsilon)
    assert created.status_code == 201, created.text
    assert created.json()["status"] == "done" and len(created.json()["estimates"]) == m
    rereads = [s for s in statements if "FROM release WHERE id" in s]
    assert (len(rereads) >= 1) if reads else not rereads, statements  # rereads: one per wake
    again = client.get(f"/v1/releases/{created.json()['id']}", headers=ADMIN)
    assert again.status_code == 200
    assert again.content == created.content
    assert created.headers["etag"] == again.headers["etag"]


@pytest.mark.parametrize("kind", ["release", "releases", "budget"])
def test_etag_and_if_none_match(api: Api, client: TestClient, kind: str) -> None:
    ds = api.dataset(values=SAMPLE)
    rel = api.query(ds["id"]).json()
    url = {
        "release": f"/v1/releases/{rel['id']}",
        "releases": f"/v1/datasets/{ds['id']}/releases",
        "budget": f"/v1/datasets/{ds['id']}/budget",
    }[kind]
    viewer = api.key("viewer", ds["id"])
    first = client.get(url, headers=viewer)
    tag = first.headers["etag"]
    second = client.get(url, headers=viewer | {"If-None-Match": tag})
    assert second.status_code == 304
    assert second.content == b""
    assert second.headers["etag"] == tag
    if kind != "release":
        assert api.query(ds["id"]).status_code == 201  # state changes -> new tag
        third = client.get(url, headers=viewer | {"If-None-Match": tag})
        assert third.status_code == 200
        assert third.headers["etag"] != tag


def test_releases_are_listed_newest_first_with_cursor(api: Api, client: TestClient) -> None:
    ds = api.dataset(values=SAMPLE)
    ids = [api.query(ds["id"], epsilon="0.01").json()["id"] for _ in range(5)]
    seen: list[str] = []
    cursor = None
    while True:
        url = f"/v1/datasets/{ds['id']}/releases?limit=2" + (f"&cursor={cursor}" if cursor else "")
        page = client.get(url, headers=ADMIN).json()
        seen += [r["id"] for r in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == ids[::-1]


def test_release_cursors_reveal_nothing_outside_the_dataset(api: Api, client: TestClient) -> None:
    """Issue 28: the cursor was the global release sequence, so two cursors of one dataset
    told a scoped reader how many releases other datasets made in between. A cursor now
    names the page's last release (which the page shows), is the same whatever other
    datasets do, and is refused on another dataset like any invalid cursor."""

    def cursors(ds_id: str) -> list[str]:
        out: list[str] = []
        cursor = None
        while True:
            url = f"/v1/datasets/{ds_id}/releases?limit=1" + (f"&cursor={cursor}" if cursor else "")
            page = client.get(url, headers=ADMIN).json()
            cursor = page["next_cursor"]
            if not cursor:
                return out
            # the cursor is a function of the item the page shows, and of nothing else
            assert cursor == encode_item_cursor(uuid.UUID(page["items"][-1]["id"]))
            out.append(cursor)

    a, b = api.dataset(values=SAMPLE), api.dataset(values=SAMPLE)
    api.query(a["id"], epsilon="0.01")
    for _ in range(4):  # other datasets' releases between two of a's
        api.query(b["id"], epsilon="0.01")
    api.query(a["id"], epsilon="0.01")
    api.query(a["id"], epsilon="0.01")
    seen = cursors(a["id"])
    assert len(seen) == 2
    for cursor in seen:
        r = client.get(f"/v1/datasets/{b['id']}/releases?cursor={cursor}", headers=ADMIN)
        assert r.status_code == 422 and r.json()["detail"].startswith("query.cursor")
    for bad in ("%%%", encode_cursor(5), encode_item_cursor(uuid.uuid4())):
        r = client.get(f"/v1/datasets/{a['id']}/releases?cursor={bad}", headers=ADMIN)
        assert r.status_code == 422 and r.json()["detail"].startswith("query.cursor")


def test_ledger_lists_grants_and_debits_newest_first(api: Api, client: TestClient) -> None:
    ds = api.dataset(values=SAMPLE)
    rel = api.query(ds["id"]).json()
    r = client.post(
        f"/v1/datasets/{ds['id']}/grants",
        json={"epsilon": "0.5", "delta": "0.001", "reason": "quarterly"},
        headers=ADMIN,
    )
    assert r.status_code == 201 and r.json()["kind"] == "grant"
    page = client.get(f"/v1/datasets/{ds['id']}/ledger?limit=2", headers=ADMIN).json()
    assert [e["kind"] for e in page["items"]] == ["grant", "debit"]
    assert page["items"][1]["release_id"] == rel["id"]
    rest = client.get(
        f"/v1/datasets/{ds['id']}/ledger?cursor={page['next_cursor']}", headers=ADMIN
    ).json()
    assert [e["reason"] for e in rest["items"]] == ["initial budget"]
    assert rest["next_cursor"] is None
    budget = api.budget(ds["id"])
    assert budget["granted"] == {"epsilon": "1.5", "delta": "0.001"}


@pytest.mark.parametrize(
    "body",
    [
        {"epsilon": "0", "delta": "0", "reason": "nothing"},
        {"epsilon": "-1", "reason": "negative"},
        {"epsilon": "1"},
        {"epsilon": "1", "reason": ""},
    ],
)
def test_grant_validation(api: Api, client: TestClient, body: dict[str, Any]) -> None:
    ds = api.dataset()
    r = client.post(f"/v1/datasets/{ds['id']}/grants", json=body, headers=ADMIN)
    assert r.status_code == 422
    assert r.json()["detail"].startswith("body")


def test_grant_unblocks_an_exhausted_budget(api: Api, client: TestClient) -> None:
    ds = api.dataset(values=SAMPLE, epsilon="0.1")
    assert api.query(ds["id"]).status_code == 201
    assert api.query(ds["id"]).status_code == 409
    client.post(
        f"/v1/datasets/{ds['id']}/grants", json={"epsilon": "0.1", "reason": "more"}, headers=ADMIN
    )
    assert api.query(ds["id"]).status_code == 201

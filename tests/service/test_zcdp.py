"""zCDP tables: releases debit rho, PostgreSQL defends the rho balance, the guarantee is
dp-accounting's conversion of the rho spent.

The counting tests reserve releases on an app without release workers (``Prefer:
respond-async``: each 202 is a paid reservation; nothing needs to run to count the budget).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from dp_accounting import dp_event, rdp
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

from app.api.factory import create_app
from app.core.db import upgrade_database
from app.ledger.zcdp import epsilon_of
from app.mechanisms import MECHANISMS
from app.releases.planning import _ceil
from tests.support import ApiBase, app_settings

from .conftest import ADMIN, ADMIN_KEY

ASYNC = {**ADMIN, "Prefer": "respond-async"}


@pytest.fixture(scope="module")
def idle(make_schema: Callable[[], str]) -> Iterator[tuple[ApiBase, Any]]:
    """An app on its own schema with no release workers and no queue caps."""
    url = make_schema()
    upgrade_database(url)
    settings = app_settings(
        url, admin_key=ADMIN_KEY, max_pending_per_key=0, max_pending_per_dataset=0
    )
    engine = create_engine(url)
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        yield ApiBase(client, ADMIN, "zcdp"), engine
    engine.dispose()


def table(api: ApiBase, **body: Any) -> str:
    r = api.client.post(
        "/v1/datasets",
        json={"name": f"z-{uuid.uuid4().hex[:10]}", "lower": 0, "upper": 100, **body},
        headers=ADMIN,
    )
    assert r.status_code == 201, r.text
    ds: str = r.json()["id"]
    up = api.client.put(f"/v1/datasets/{ds}/values", json=[float(v) for v in range(50)],
                        headers=ADMIN)  # fmt: skip
    assert up.status_code == 200, up.text
    return ds


def release(api: ApiBase, ds: str, **body: Any) -> Any:
    payload = {"quantiles": [0.5], "epsilon": "0.1", "method": "jointexp"} | body
    return api.client.post(f"/v1/datasets/{ds}/quantiles", json=payload, headers=ASYNC)


def accountant_epsilon(rho: float, delta: float) -> float:
    accountant = rdp.RdpAccountant()
    accountant.compose(dp_event.ZCDpEvent(rho))
    return float(accountant.get_epsilon(delta))


def accountant_max_releases(epsilon: float, delta: float, rho_each: float) -> int:
    """The largest k with dp-accounting's epsilon for k ZCDpEvents <= epsilon."""
    lo, hi = 0, 1
    while accountant_epsilon(hi * rho_each, delta) <= epsilon:
        hi *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if accountant_epsilon(mid * rho_each, delta) <= epsilon else (lo, mid)
    return lo


def spend_all(api: ApiBase, ds: str, *, check_at: dict[int, Any] | None = None) -> int:
    count = 0
    while True:
        r = release(api, ds)
        if r.status_code == 409:
            assert r.json()["type"] == "budget_exhausted", r.text
            return count
        assert r.status_code == 202, r.text
        count += 1
        if check_at is not None and count in check_at:
            check_at[count] = api.budget(ds)
        assert count < 5000


@pytest.mark.parametrize(("epsilon", "at_least"), [("10", 1200), ("1", 18)])
def test_a_zcdp_table_pays_for_the_releases_the_accountant_allows(
    idle: tuple[ApiBase, Any], epsilon: str, at_least: int
) -> None:
    api, _ = idle
    ds = table(api, accounting="zcdp", epsilon=epsilon, delta="0.000001")
    view = api.client.get(f"/v1/datasets/{ds}", headers=ADMIN).json()
    assert (view["accounting"], view["accounting_delta"]) == ("zcdp", "0.000001")
    seen: dict[int, Any] = dict.fromkeys((1, 10, 100, 1000))
    count = spend_all(api, ds, check_at=seen)
    exact = accountant_max_releases(float(epsilon), 1e-6, 0.01 / 8)
    print(f"zcdp ({epsilon}, 1e-6): {count} releases, accountant's maximum {exact}")
    assert at_least <= count <= exact
    assert count >= exact - 1  # rounding the grant down costs at most one release
    budget = api.budget(ds)
    assert budget["accounting"] == "zcdp"
    assert Decimal(budget["rho"]["spent"]) == count * Decimal("0.00125")
    assert budget["releases_left"]["count"] == 0
    assert Decimal(budget["guarantee"]["epsilon"]) <= Decimal(epsilon)
    for k, figures in seen.items():
        if figures is None:
            continue
        want = accountant_epsilon(k * 0.01 / 8, 1e-6)
        got = float(figures["guarantee"]["epsilon"])
        assert abs(got - want) <= 1e-9 * want, (k, got, want)
        assert figures["guarantee"]["delta"] == "0.000001"


def test_a_pure_table_still_allows_exactly_ten(idle: tuple[ApiBase, Any]) -> None:
    api, _ = idle
    ds = table(api, epsilon="1")
    assert spend_all(api, ds) == 10
    budget = api.budget(ds)
    assert budget["accounting"] == "pure" and budget["rho"] is None
    assert budget["guarantee"] == {"epsilon": "1", "delta": "0"}
    assert budget["releases_left"] == {"epsilon": "0.1", "method": "jointexp", "count": 0}


def test_each_release_shows_its_rho_and_the_ledger_both_figures(
    idle: tuple[ApiBase, Any],
) -> None:
    api, _ = idle
    ds = table(api, accounting="zcdp", epsilon="1", delta="0.000001")
    before = api.budget(ds)
    quote = api.client.post(
        f"/v1/datasets/{ds}/quote",
        json={"quantiles": [0.2, 0.5, 0.8], "epsilon": "0.3", "method": "indexp"},
        headers=ADMIN,
    ).json()
    rho = Decimal("0.09") / 24  # epsilon^2 / (8 m), m = 3
    assert Decimal(quote["rho"]) == _ceil(Fraction(9, 100) / 24) >= rho
    assert quote["releases_left"] == int(
        Decimal(before["rho"]["remaining"]) // Decimal(quote["rho"])
    )
    r = release(api, ds, quantiles=[0.2, 0.5, 0.8], epsilon="0.3", method="indexp")
    body = r.json()
    assert body["cost"] == {"epsilon": "0.3", "delta": "0"} and body["remaining"] is None
    assert Decimal(body["rho"]["cost"]) == Decimal(quote["rho"])
    assert Decimal(body["rho"]["remaining"]) == Decimal(before["rho"]["remaining"]) - Decimal(
        quote["rho"]
    )
    ledger = api.client.get(f"/v1/datasets/{ds}/ledger", headers=ADMIN).json()["items"]
    debit = next(e for e in ledger if e["kind"] == "debit")
    assert (debit["epsilon"], Decimal(debit["rho"])) == ("0.3", Decimal(quote["rho"]))
    grant = next(e for e in ledger if e["kind"] == "grant")
    assert (grant["epsilon"], grant["delta"]) == ("1", "0.000001")
    assert Decimal(grant["rho"]) == Decimal(before["rho"]["granted"]) > 0


@pytest.mark.parametrize("method", ["appindexp", "smooth"])
def test_methods_without_a_zcdp_bound_are_refused_naming_the_accounting(
    idle: tuple[ApiBase, Any], method: str
) -> None:
    api, _ = idle
    ds = table(api, accounting="zcdp", epsilon="1", delta="0.000001")
    before = api.budget(ds)
    for path in ("quantiles", "quote"):
        r = api.client.post(
            f"/v1/datasets/{ds}/{path}",
            json={"quantiles": [0.5], "epsilon": "0.5", "delta": "0.0001", "method": method},
            headers=ADMIN,
        )
        assert r.status_code == 422 and "body.method" in r.text and "zcdp" in r.text, r.text
    assert api.budget(ds) == before
    auto = release(api, ds, method="auto", delta="0.0001")
    assert auto.status_code == 202 and MECHANISMS[auto.json()["method"]].zcdp_fn is not None


def test_grants_convert_to_rho_and_refuse_what_does_not_fit(idle: tuple[ApiBase, Any]) -> None:
    api, _ = idle
    ds = table(api, accounting="zcdp", rho="0.01", delta="0.000001")
    assert Decimal(api.budget(ds)["rho"]["granted"]) == Decimal("0.01")
    grant = api.client.post(f"/v1/datasets/{ds}/grants", json={"epsilon": "1", "reason": "more"},
                            headers=ADMIN)  # fmt: skip
    assert grant.status_code == 201, grant.text
    added = Decimal(grant.json()["rho"])
    assert epsilon_of(added, Decimal("0.000001")) <= 1
    assert epsilon_of(added + Decimal("1e-12"), Decimal("0.000001")) > 1 - Decimal("1e-9")
    direct = api.client.post(f"/v1/datasets/{ds}/grants", json={"rho": "0.5", "reason": "r"},
                             headers=ADMIN)  # fmt: skip
    assert direct.status_code == 201 and direct.json()["rho"] == "0.5"
    refused = api.client.post(f"/v1/datasets/{ds}/grants",
                              json={"delta": "0.001", "reason": "r"}, headers=ADMIN)  # fmt: skip
    assert refused.status_code == 422 and "body.delta" in refused.text
    pure = table(api, epsilon="1")
    refused = api.client.post(f"/v1/datasets/{pure}/grants", json={"rho": "1", "reason": "r"},
                              headers=ADMIN)  # fmt: skip
    assert refused.status_code == 422 and "body.rho" in refused.text
    for body, problem in (
        ({"accounting": "zcdp", "epsilon": "1"}, "delta > 0"),
        ({"accounting": "zcdp", "epsilon": "1", "delta": "1"}, "delta > 0"),
        ({"accounting": "zcdp", "epsilon": "1", "rho": "1", "delta": "0.1"}, "not both"),
        ({"rho": "1"}, "set accounting to zcdp"),
    ):
        r = api.client.post(
            "/v1/datasets", json={"name": uuid.uuid4().hex, "lower": 0, "upper": 1, **body},
            headers=ADMIN,
        )  # fmt: skip
        assert r.status_code == 422 and problem in r.text, r.text


def test_the_database_refuses_a_hand_written_rho_overdraft(idle: tuple[ApiBase, Any]) -> None:
    api, engine = idle
    ds = table(api, accounting="zcdp", rho="0.01", delta="0.000001")
    rid = release(api, ds, epsilon="0.2").json()["id"]  # rho 0.005
    with engine.connect() as conn:
        key = conn.execute(text("SELECT api_key_id FROM release WHERE id = :r"),
                           {"r": rid}).scalar_one()  # fmt: skip
    rogue = uuid.uuid4()
    with engine.begin() as conn:  # a code path that "forgot the lock"
        conn.execute(
            text(
                "INSERT INTO release (id, dataset_id, api_key_id, method, quantiles, epsilon,"
                " cost_epsilon, cost_delta, created_at, status, failure, attempts) VALUES"
                " (:i, :d, :k, 'jointexp', '{0.5}', 1, 1, 0, now(), 'failed',"
                " 'mechanism_error', 0)"
            ),
            {"i": rogue, "d": ds, "k": key},
        )
    for rho in ("0.006", "0.005000000000000000000001"):
        with pytest.raises(DBAPIError) as caught, engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO ledger_entry (dataset_id, kind, epsilon, delta, rho,"
                    " release_id, created_at) VALUES (:d, 'debit', 0, 0, :rho, :r, now())"
                ),
                {"d": ds, "rho": Decimal(rho), "r": rogue},
            )
        assert "no_overdraft" in str(caught.value.orig)
    # epsilon is not the balance of a zCDP table: a debit of epsilon 5 with the rho left fits
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO ledger_entry (dataset_id, kind, epsilon, delta, rho, release_id,"
                " created_at) VALUES (:d, 'debit', 5, 0, 0.005, :r, now())"
            ),
            {"d": ds, "r": rogue},
        )
    budget = api.budget(ds)
    assert budget["rho"] == {"granted": "0.01", "spent": "0.01", "remaining": "0"}
    refused = release(api, ds, epsilon="0.001")
    assert refused.status_code == 409 and refused.json()["remaining_rho"] == "0"


# ------------------------------------------------------------ conversions at the edges


@pytest.mark.parametrize("delta", ["1e-12", "0.000001", "0.01", "0.5"])
@pytest.mark.parametrize(
    "rho", ["1e-12", "1e-8", "0.00125", "0.1", "1.538962324014227", "50", "1000"]
)
def test_the_reported_epsilon_rounds_up_and_is_never_looser_than_bun_steinke(
    rho: str, delta: str
) -> None:
    r, d = Decimal(rho), Decimal(delta)
    got = epsilon_of(r, d)
    accounted = accountant_epsilon(float(r), float(d))
    bun_steinke = float(r) + 2 * (float(r) * math.log(1 / float(d))) ** 0.5
    best = min(accounted, bun_steinke)
    assert Decimal(best) <= got  # rounded up, never down
    assert got <= Decimal(best) * (1 + Decimal("1e-11")) + Decimal("1e-12")
    assert got <= Decimal(bun_steinke) * (1 + Decimal("1e-11")) + Decimal("1e-12")


def test_rho_for_is_the_largest_rho_that_fits() -> None:
    from app.ledger.zcdp import RHO_QUANTUM, rho_for

    for eps, delta in (("0.01", "1e-9"), ("1", "0.000001"), ("10", "0.000001"), ("100", "0.1")):
        e, d = Decimal(eps), Decimal(delta)
        rho = rho_for(e, d)
        assert rho >= 0 and epsilon_of(rho, d) <= e
        assert epsilon_of(rho + 2 * RHO_QUANTUM, d) > e - Decimal("1e-11")
    assert rho_for(Decimal(0), Decimal("0.1")) == 0
    assert epsilon_of(Decimal(0), Decimal("0.000001")) == 0


def test_a_refusal_names_what_is_short(idle: tuple[ApiBase, Any]) -> None:
    api, _ = idle
    ds = table(api, epsilon="1", delta="0.000001")
    r = release(api, ds, method="appindexp", epsilon="0.1", delta="0.00001")
    assert r.status_code == 409
    assert "its delta 0.00001 exceeds the 0.000001 left" in r.json()["detail"]
    assert "epsilon" not in r.json()["detail"].split(":", 1)[1]
    r = release(api, ds, epsilon="2")
    assert "its epsilon 2 exceeds the 1 left" in r.json()["detail"]
    z = table(api, accounting="zcdp", rho="0.001", delta="0.000001")
    r = release(api, z, epsilon="0.1")  # rho 0.00125
    assert "its rho 0.00125 exceeds the 0.001 left" in r.json()["detail"]

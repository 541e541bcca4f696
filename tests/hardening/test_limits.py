"""Issue 5, point 10: configurable limits — upload size, values per dataset, quantiles per
query, request body size and request rate per key (429 with ``Retry-After``).

(Upload and body size limits on the wire, streamed and declared, are also exercised in
``test_hostile_inputs.py::test_oversized_bodies_are_refused_before_parsing``.)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine

from app.api.middleware.ratelimit import MAX_BUCKETS, TokenBuckets
from app.core.config import Settings

from .conftest import ADMIN, Api, ledger_state, report


def test_limits_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "DPQUANT_MAX_UPLOAD_BYTES": "1234",
        "DPQUANT_MAX_VALUES": "99",
        "DPQUANT_MAX_QUANTILES": "7",
        "DPQUANT_MAX_BODY_BYTES": "4321",
        "DPQUANT_RATE_LIMIT_PER_MINUTE": "120",
        "DPQUANT_RATE_LIMIT_BURST": "10",
        "DPQUANT_MIN_RELEASE_MS": "50",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    s = Settings()
    assert (s.max_upload_bytes, s.max_values, s.max_quantiles, s.max_body_bytes) == (
        1234,
        99,
        7,
        4321,
    )
    assert (s.rate_limit_per_minute, s.rate_limit_burst, s.min_release_ms) == (120, 10, 50)
    monkeypatch.setenv("DPQUANT_MAX_VALUES", "0")
    with pytest.raises(ValueError):
        Settings()


def test_values_per_dataset_and_upload_size(make_app: Callable[..., Any], hdb: Engine) -> None:
    with make_app(max_values=10, max_upload_bytes=200) as client:
        api = Api(client)
        ds = api.dataset(epsilon="1")
        path = f"/v1/datasets/{ds['id']}/values"
        r = client.put(path, json=[float(i) for i in range(11)], headers=ADMIN)
        assert r.status_code == 413 and "10 values" in r.json()["detail"], r.text
        assert ledger_state(hdb, ds["id"])["n"] is None
        r = client.put(path, json=[float(i) for i in range(10)], headers=ADMIN)
        assert r.status_code == 200 and r.json()["n"] == 10
        r = client.put(path, content=b"[" + b"1.0," * 60 + b"1.0]", headers=ADMIN)
        assert r.status_code == 413 and "200 bytes" in r.json()["detail"]
        assert ledger_state(hdb, ds["id"])["n"] == 10


def test_quantiles_per_query(make_app: Callable[..., Any], hdb: Engine) -> None:
    with make_app(max_quantiles=3) as client:
        api = Api(client)
        ds = api.dataset(values=[float(i) for i in range(100)], epsilon="1")
        before = ledger_state(hdb, ds["id"])
        r = api.query(ds["id"], quantiles=[0.1, 0.2, 0.3, 0.4])
        assert r.status_code == 422 and "body.quantiles" in r.json()["detail"]
        assert "at most 3" in r.json()["detail"]
        assert ledger_state(hdb, ds["id"]) == before
        assert api.query(ds["id"], quantiles=[0.1, 0.2, 0.3]).status_code == 201


def test_rate_limit_per_key_answers_429_with_retry_after(
    make_app: Callable[..., Any], hdb: Engine
) -> None:
    with make_app(rate_limit_per_minute=30, rate_limit_burst=5) as client:
        api = Api(client)
        # the admin key's own bucket: dataset + upload + 2 keys = 4 requests of 5
        ds = api.dataset(values=[float(i) for i in range(20)], epsilon="10")
        _, analyst = api.key("analyst", ds["id"])
        _, viewer = api.key("viewer", ds["id"])
        statuses = [
            api.query(ds["id"], headers=analyst, epsilon="0.01").status_code for _ in range(7)
        ]
        assert statuses == [201] * 5 + [429] * 2, statuses
        r = api.query(ds["id"], headers=analyst, epsilon="0.01")
        assert r.status_code == 429
        assert r.headers["retry-after"].isdigit() and 1 <= int(r.headers["retry-after"]) <= 2
        assert r.json() == {
            "type": "rate_limited",
            "detail": "too many requests for this API key; retry after "
            f"{r.headers['retry-after']} s",
        }
        state = ledger_state(hdb, ds["id"])
        assert state["debit_rows"] == state["releases"] == 5  # refused requests cost nothing
        # another key is not affected; a request without a key is not rate-limited (401)
        budget = client.get(f"/v1/datasets/{ds['id']}/budget", headers=viewer)
        assert budget.status_code == 200
        assert client.get("/v1/datasets").status_code == 401
        assert json.loads(budget.text)["spent"]["epsilon"] == "0.05"
    report(
        "10 rate limit",
        per_minute=30,
        burst=5,
        statuses="5x201+2x429",
        retry_after_s=r.headers["retry-after"],
    )


def test_token_buckets_refill_and_stay_bounded() -> None:
    now = [0.0]
    buckets = TokenBuckets(per_minute=60, burst=2, clock=lambda: now[0])
    assert buckets.take("a") == 0 and buckets.take("a") == 0
    wait = buckets.take("a")
    assert wait == pytest.approx(1.0)  # one token per second
    now[0] += 0.5
    assert buckets.take("a") == pytest.approx(0.5)
    now[0] += 0.5
    assert buckets.take("a") == 0
    assert buckets.take("b") == 0  # independent bucket
    now[0] += 3600
    assert buckets.take("a") == 0 and buckets.take("a") == 0 and buckets.take("a") > 0
    for i in range(MAX_BUCKETS + 10):
        buckets.take(f"k{i}")
    assert len(buckets._buckets) == MAX_BUCKETS


def test_a_flood_of_random_tokens_costs_one_lookup_per_allowed_failure(
    make_app: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 28: every random token was a fresh rate-limit bucket and a database lookup.
    With 10 failures a minute allowed per address, 200 random tokens cost 10 lookups; the
    rest are 429 (Retry-After) without one. A key that authenticated before, and a key
    created during the flood, keep working from the same address; a revoked key still gets
    401 (the guard only decides whether a lookup runs)."""
    import secrets

    from tests.support import count_statements

    with make_app(auth_failures_per_minute=10) as client:
        api = Api(client)
        _, analyst = api.key("analyst")
        assert client.get("/v1/keys/me", headers=analyst).status_code == 200
        log = count_statements(monkeypatch)
        statuses = [
            client.get(
                "/v1/datasets", headers={"Authorization": "Bearer " + secrets.token_urlsafe(32)}
            ).status_code
            for _ in range(200)
        ]
        lookups = sum(1 for q in log["async"] if "FROM api_key WHERE key_hash" in q)
        assert statuses[:10] == [401] * 10 and statuses[10:] == [429] * 190, statuses
        assert lookups == 10
        r = client.get("/v1/datasets", headers={"Authorization": "Bearer nope" * 5})
        assert r.status_code == 429 and r.headers["retry-after"].isdigit()
        assert r.json()["type"] == "rate_limited"
        assert client.get("/v1/keys/me", headers=analyst).status_code == 200
        key_id, fresh = api.key("viewer")
        assert client.get("/v1/keys/me", headers=fresh).status_code == 200
        assert client.delete(f"/v1/keys/{key_id}", headers=ADMIN).status_code == 204
        assert client.get("/v1/keys/me", headers=fresh).status_code == 401
        # an overlong token is refused before it is hashed or looked up
        long = client.get("/v1/keys/me", headers={"Authorization": "Bearer " + "x" * 600})
        assert long.status_code == 401
    report("28 token flood", tokens=200, lookups=lookups, refused_429=190)


def test_the_failure_guard_refills_and_remembers_good_keys() -> None:
    from app.api.middleware.ratelimit import AuthFailureGuard

    now = [0.0]
    guard = AuthFailureGuard(per_minute=60, burst=3, clock=lambda: now[0])
    for _ in range(3):
        assert guard.admit("a", "bad") == 0.0
        guard.failed("a")
    guard.failed("a")  # the fourth failure spends what is not there
    assert guard.admit("a", "bad") > 0.0
    assert guard.admit("b", "bad") == 0.0  # another address is not affected
    guard.succeeded("good")
    assert guard.admit("a", "good") == 0.0
    now[0] += 2.0  # one failure refilled per second
    assert guard.admit("a", "bad") == 0.0

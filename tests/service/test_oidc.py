"""OpenID Connect bearer tokens beside API keys, against a real local issuer (discovery and
JWKS over HTTP on 127.0.0.1, tokens signed with its own RSA and EC keys)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.api.factory import create_app
from app.core.db import upgrade_database
from tests.oidc_issuer import AUDIENCE, LocalIssuer
from tests.support import app_settings

from .conftest import ADMIN, ADMIN_KEY


@pytest.fixture(scope="module")
def issuer() -> Iterator[LocalIssuer]:
    local = LocalIssuer()
    yield local
    local.close()


@pytest.fixture(scope="module")
def client(make_schema: Callable[[], str], issuer: LocalIssuer) -> Iterator[TestClient]:
    url = make_schema()
    upgrade_database(url)
    settings = app_settings(
        url, admin_key=ADMIN_KEY, oidc_issuer=issuer.issuer, oidc_audience=AUDIENCE,
        oidc_jwks_refresh_s=0, max_pending_per_key=0, max_pending_per_dataset=0,
    )  # fmt: skip
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        yield c


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def dataset(c: TestClient) -> str:
    r = c.post("/v1/datasets", json={"name": f"o-{uuid.uuid4().hex[:8]}", "lower": 0,
                                     "upper": 100, "epsilon": "1"}, headers=ADMIN)  # fmt: skip
    ds: str = r.json()["id"]
    c.put(f"/v1/datasets/{ds}/values", json=[float(v) for v in range(50)], headers=ADMIN)
    return ds


def release(c: TestClient, ds: str, token: str, eps: str = "0.1") -> Any:
    return c.post(
        f"/v1/datasets/{ds}/quantiles",
        json={"quantiles": [0.5], "epsilon": eps, "method": "jointexp"},
        headers=bearer(token) | {"Prefer": "respond-async"},
    )


def test_an_analyst_token_releases_and_its_subject_is_debited(
    client: TestClient, issuer: LocalIssuer
) -> None:
    ds = dataset(client)
    token = issuer.token(sub="alice@example.org", dpquant_role="analyst", dpquant_datasets=[ds])
    me = client.get("/v1/keys/me", headers=bearer(token)).json()
    assert (me["role"], me["subject"], me["datasets"]) == ("analyst", "alice@example.org", [ds])
    r = release(client, ds, token)
    assert r.status_code == 202, r.text
    ledger = client.get(f"/v1/datasets/{ds}/ledger", headers=ADMIN).json()["items"]
    assert ledger[0]["kind"] == "debit" and ledger[0]["api_key_id"] == me["id"]
    keys = {k["id"]: k for k in client.get("/v1/keys", headers=ADMIN).json()["items"]}
    assert keys[me["id"]]["kind"] == "oidc" and keys[me["id"]]["name"] == "alice@example.org"
    assert keys[me["id"]]["spent_epsilon"] == "0.1"
    # an EC-signed token of the same subject is the same principal
    ec = issuer.token(key=issuer.ec, sub="alice@example.org", dpquant_role="analyst",
                      dpquant_datasets=[ds])  # fmt: skip
    assert client.get("/v1/keys/me", headers=bearer(ec)).json()["id"] == me["id"]
    # roles and scope come from the token
    viewer = issuer.token(sub="v", dpquant_role="viewer", dpquant_datasets=[ds])
    assert release(client, ds, viewer).status_code == 403
    assert client.get(f"/v1/datasets/{ds}/budget", headers=bearer(viewer)).status_code == 200
    other = dataset(client)
    assert release(client, other, token).status_code == 404  # scoped to ds, used on other
    assert client.get(f"/v1/datasets/{other}", headers=bearer(token)).status_code == 404
    listed = client.get("/v1/datasets", headers=bearer(token)).json()["items"]
    assert [d["id"] for d in listed] == [ds]


@pytest.mark.parametrize(
    "make",
    [
        lambda i: i.token(sub="x", dpquant_role="admin", exp=int(time.time()) - 120),
        lambda i: i.token(sub="x", dpquant_role="admin", aud="another-service"),
        lambda i: i.token(sub="x", dpquant_role="admin", iss="https://evil.example"),
        lambda i: i.token(sub="x", dpquant_role="admin", nbf=int(time.time()) + 600),
        lambda i: i.unsigned(sub="x", dpquant_role="admin"),
        lambda i: i.hs256_with_public_key(sub="x", dpquant_role="admin"),
        lambda i: i.token(sub="x", dpquant_role="admin")[:-6] + "AAAAAA",  # bad signature
        lambda i: i.token(sub=None, dpquant_role="admin"),  # no subject
        lambda i: "eyJ.broken.token",
    ],
    ids=["expired", "audience", "issuer", "not-yet-valid", "alg-none", "hs256-public-key",
         "signature", "no-sub", "garbage"],
)  # fmt: skip
def test_tokens_that_do_not_verify_get_401(
    client: TestClient, issuer: LocalIssuer, make: Callable[[LocalIssuer], str]
) -> None:
    r = client.get("/v1/datasets", headers=bearer(make(issuer)))
    assert r.status_code == 401, r.text
    assert r.json()["type"] == "unauthorized"


def test_claims_that_grant_nothing_get_403(client: TestClient, issuer: LocalIssuer) -> None:
    for token in (
        issuer.token(sub="x"),  # no role claim
        issuer.token(sub="x", dpquant_role="root"),
        issuer.token(sub="x", dpquant_role="analyst"),  # unscoped non-admin
        issuer.token(sub="x", dpquant_role="analyst", dpquant_datasets="all"),
    ):
        r = client.get("/v1/datasets", headers=bearer(token))
        assert r.status_code == 403, r.text


def test_an_unknown_kid_refetches_the_keys_once_and_a_rotated_key_works(
    client: TestClient, issuer: LocalIssuer
) -> None:
    from joserfc.jwk import RSAKey

    stranger = RSAKey.generate_key(2048, parameters={"kid": "not-published"})
    before = issuer.jwks_fetches
    r = client.get("/v1/datasets", headers=bearer(issuer.token(key=stranger, sub="s",
                                                                dpquant_role="admin")))  # fmt: skip
    assert r.status_code == 401 and issuer.jwks_fetches == before + 1
    rotated = issuer.rotate()
    ok = issuer.token(key=rotated, sub="rot", dpquant_role="admin")
    assert client.get("/v1/datasets", headers=bearer(ok)).status_code == 200
    assert issuer.jwks_fetches == before + 2
    assert client.get("/v1/datasets", headers=bearer(ok)).status_code == 200
    assert issuer.jwks_fetches == before + 2  # cached


def test_subjects_have_caps_revocation_and_an_audit_trail(
    client: TestClient, issuer: LocalIssuer
) -> None:
    ds = dataset(client)
    admin = issuer.token(sub="boss@example.org", dpquant_role="admin")
    body = {"name": f"by-token-{uuid.uuid4().hex[:6]}", "lower": 0, "upper": 1}
    made = client.post("/v1/datasets", json=body, headers=bearer(admin))
    assert made.status_code == 201
    audit = client.get("/v1/audit?limit=20", headers=ADMIN).json()["items"]
    created = next(e for e in audit if e["action"] == "dataset.create"
                   and e["target_id"] == made.json()["id"])  # fmt: skip
    assert created["actor_subject"] == "boss@example.org"
    analyst = issuer.token(sub="carol", dpquant_role="analyst", dpquant_datasets=[ds])
    me = client.get("/v1/keys/me", headers=bearer(analyst)).json()
    capped = client.patch(f"/v1/keys/{me['id']}", json={"max_epsilon": "0.15"}, headers=ADMIN)
    assert capped.status_code == 200 and capped.json()["max_epsilon"] == "0.15"
    assert release(client, ds, analyst).status_code == 202
    refused = release(client, ds, analyst)
    assert refused.status_code == 409 and refused.json()["type"] == "key_budget_exhausted"
    below = client.patch(f"/v1/keys/{me['id']}", json={"max_epsilon": "0.05"}, headers=ADMIN)
    assert below.status_code == 409
    assert client.post(f"/v1/keys/{me['id']}/rotate", headers=ADMIN).status_code == 409
    assert client.delete(f"/v1/keys/{me['id']}", headers=ADMIN).status_code == 204
    assert client.get("/v1/keys/me", headers=bearer(analyst)).status_code == 401
    # API keys keep working beside tokens
    assert client.get("/v1/datasets", headers=ADMIN).status_code == 200


def test_an_unreachable_issuer_is_a_503_and_keys_still_work(
    make_schema: Callable[[], str], issuer: LocalIssuer
) -> None:
    url = make_schema()
    upgrade_database(url)
    settings = app_settings(url, admin_key=ADMIN_KEY, oidc_issuer="http://127.0.0.1:9",
                            oidc_audience=AUDIENCE)  # fmt: skip
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        token = issuer.token(sub="x", dpquant_role="admin")
        r = c.get("/v1/datasets", headers=bearer(token))
        assert r.status_code == 503 and r.json()["type"] == "identity_provider_unavailable"
        assert r.headers.get("retry-after")
        assert c.get("/v1/datasets", headers=ADMIN).status_code == 200

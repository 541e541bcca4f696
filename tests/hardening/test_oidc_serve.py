"""A real ``dpquant serve`` (two web processes and their release workers) started with
``DPQUANT_OIDC_ISSUER`` pointing at a local issuer: tokens are checked by every process."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.oidc_issuer import AUDIENCE, LocalIssuer

from .procs import DpquantServer, ThrowawayPostgres, migrate

pytestmark = [pytest.mark.processes, pytest.mark.own_cluster]

ADMIN_KEY = "dpq_oidc-admin-" + secrets.token_urlsafe(32)


@pytest.fixture(scope="module")
def cluster() -> Iterator[ThrowawayPostgres]:
    pg = ThrowawayPostgres()
    try:
        yield pg
    finally:
        pg.destroy()


def test_tokens_through_dpquant_serve(cluster: ThrowawayPostgres) -> None:
    issuer = LocalIssuer()
    migrate(cluster.url)
    server = DpquantServer(
        cluster.url, ADMIN_KEY, workers=2,
        DPQUANT_OIDC_ISSUER=issuer.issuer, DPQUANT_OIDC_AUDIENCE=AUDIENCE,
    )  # fmt: skip
    server.start()
    try:
        admin = server.headers()
        with httpx.Client(base_url=server.base_url, timeout=60.0) as c:
            body = {"name": "oidc", "lower": 0, "upper": 100, "epsilon": "1"}
            ds = c.post("/v1/datasets", json=body, headers=admin).json()["id"]
            c.put(f"/v1/datasets/{ds}/values", json=[float(v) for v in range(80)], headers=admin)

            def call(token: str) -> httpx.Response:
                return c.post(
                    f"/v1/datasets/{ds}/quantiles",
                    json={"quantiles": [0.5], "epsilon": "0.25", "method": "jointexp"},
                    headers={"Authorization": f"Bearer {token}"},
                )

            analyst = issuer.token(sub="erin@example.org", dpquant_role="analyst",
                                   dpquant_datasets=[ds])  # fmt: skip
            for _ in range(3):  # both web processes, whichever answers
                r = call(analyst)
                assert r.status_code == 201, r.text
                assert r.json()["estimates"] is not None
            budget = c.get(f"/v1/datasets/{ds}/budget", headers=admin).json()
            assert budget["spent"]["epsilon"] == "0.75"
            viewer = issuer.token(sub="vic", dpquant_role="viewer", dpquant_datasets=[ds])
            assert call(viewer).status_code == 403
            for bad in (
                issuer.token(sub="erin@example.org", dpquant_role="analyst",
                             dpquant_datasets=[ds], exp=int(time.time()) - 120),
                issuer.token(sub="erin@example.org", dpquant_role="analyst",
                             dpquant_datasets=[ds], aud="someone-else"),
                issuer.unsigned(sub="erin@example.org", dpquant_role="analyst",
                                dpquant_datasets=[ds]),
            ):  # fmt: skip
                assert call(bad).status_code == 401
            assert (
                c.get(f"/v1/datasets/{ds}/budget", headers=admin).json()["spent"]["epsilon"]
                == "0.75"
            )  # nothing more was debited
            boss = issuer.token(sub="boss@example.org", dpquant_role="admin")
            grant = c.post(f"/v1/datasets/{ds}/grants", json={"epsilon": "1", "reason": "q4"},
                           headers={"Authorization": f"Bearer {boss}"})  # fmt: skip
            assert grant.status_code == 201
            audit = c.get("/v1/audit?limit=20", headers=admin).json()["items"]
            assert any(e["action"] == "budget.grant" and e["actor_subject"] == "boss@example.org"
                       for e in audit)  # fmt: skip
    finally:
        server.close()
        issuer.close()

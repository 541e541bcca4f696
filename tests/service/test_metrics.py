"""Issue 12: ``GET /metrics`` in one process — who may read it, what it says, what it never
says. The multi-process acceptance test is tests/hardening/test_metrics_processes.py."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from decimal import Decimal

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.api.factory import create_app
from tests.support import auth

from .conftest import ADMIN, Api, make_settings

TOKEN = "metrics-" + secrets.token_urlsafe(32)


@pytest.fixture(scope="module")
def tclient(database_url: str, workers: None) -> Iterator[TestClient]:
    """An app on the session schema with a scrape token configured."""
    app = create_app(make_settings(database_url, metrics_token=TOKEN))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def samples(body: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_need_an_admin_key_or_the_scrape_token(tclient: TestClient, api: Api) -> None:
    assert tclient.get("/metrics").status_code == 401
    assert tclient.get("/metrics", headers=auth("wrong-" + TOKEN)).status_code == 401
    for role in ("analyst", "viewer"):
        r = tclient.get("/metrics", headers=api.key(role))
        assert r.status_code == 403 and r.json()["type"] == "forbidden"
    for headers in (ADMIN, auth(TOKEN)):
        r = tclient.get("/metrics", headers=headers)
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/plain; version=0.0.4")


def test_a_short_or_placeholder_token_is_refused_at_startup() -> None:
    from pydantic import ValidationError

    from app.core.config import Settings

    for bad in ("short", "changeme"):
        with pytest.raises(ValidationError):
            Settings(metrics_token=bad)


def test_spent_figures_are_the_exact_ledger_sums_and_no_data_figure_appears(
    tclient: TestClient, api: Api
) -> None:
    values = [1234.5678 + i for i in range(37)]  # n = 37
    ds = api.dataset(values=values, lower=0, upper=2000, epsilon="1", delta="0.001")["id"]
    estimates: list[float] = []
    for eps in ("0.1", "0.2", "0.1"):
        r = api.query(ds, epsilon=eps)
        assert r.status_code == 201 and r.json()["status"] == "done"
        estimates += r.json()["estimates"]
    r = api.query(ds, method="appindexp", epsilon="0.1", delta="0.0001")
    assert r.status_code == 201
    estimates += r.json()["estimates"]
    assert api.query(ds, epsilon="0.6").json()["type"] == "budget_exhausted"
    body = tclient.get("/metrics", headers=auth(TOKEN)).text
    got = samples(body)
    label = (("dataset", ds),)
    assert got[("dpquant_epsilon_spent_total", label)] == float(Decimal("0.5"))
    assert got[("dpquant_delta_spent_total", label)] == float(Decimal("0.0001"))
    assert got[("dpquant_epsilon_granted", label)] == 1.0
    assert got[("dpquant_ledger_up", ())] == 1.0
    assert got[("dpquant_refusals_total", (("type", "budget_exhausted"),))] >= 1
    assert any(name == "dpquant_http_request_duration_seconds_bucket" for name, _ in got)
    assert any(name == "dpquant_db_pool_connections_in_use" for name, _ in got)
    for v in values:
        assert repr(v) not in body
    # No series about this dataset carries its size (37). Only the dataset label counts:
    # other series (e.g. request counts per route) may equal 37 by coincidence.
    about_dataset = [v for (_, labels), v in got.items() if dict(labels).get("dataset") == ds]
    assert about_dataset and 37.0 not in about_dataset
    # No estimate appears in any label (the figures about the dataset are the exact ledger
    # sums asserted above). Not a substring search of the whole body: estimates are grid
    # points, and a round one such as 0.5 is also a public histogram bucket bound
    # (le="0.5") or a request count; CI once drew an estimate of exactly 0.5.
    labels_seen = {value for (_, labels) in got for key, value in labels if key != "le"}
    assert labels_seen
    for e in estimates:
        assert not any(repr(e) in value for value in labels_seen)

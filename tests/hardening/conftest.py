"""Fixtures for the hardening tests (issue 5).

Self-contained on purpose (the service suite's fixtures may change under us): PostgreSQL
comes from ``DPQUANT_TEST_DATABASE_URL`` when set, otherwise from an embedded ``pgserver``
in a temporary directory; every session works in a fresh schema built by the Alembic
migrations. ``make_app`` builds extra applications with tightened settings (limits, rate
limits, timing padding) on the same schema.

The tests that start real server processes and their own throwaway PostgreSQL cluster
(load, crash, outage) are marked ``processes``; they run by default like everything else.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, create_engine, text

from app.api.factory import create_app
from app.core.config import Settings
from app.core.db import upgrade_database
from tests.support import ApiBase, app_settings, auth, client_of, release_workers, serving

ADMIN_KEY = "dpq_hardening-admin-" + secrets.token_urlsafe(32)


#: Measured figures of the hardening tests, printed in the terminal summary (so they show in
#: CI output without ``-s``).
FIGURES: list[str] = []


def report(title: str, **figures: Any) -> None:
    """Record (and print) one line of measured figures."""
    line = f"[hardening] {title}: " + " ".join(f"{k}={v}" for k, v in figures.items())
    FIGURES.append(line)
    print("\n" + line, flush=True)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if FIGURES:
        terminalreporter.section("hardening figures (issue 5)")
        for line in FIGURES:
            terminalreporter.write_line(line)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "processes: starts real server processes (and some a throwaway PostgreSQL)",
    )
    config.addinivalue_line(
        "markers",
        "own_cluster: runs on a throwaway PostgreSQL cluster of its own, whatever "
        "DPQUANT_TEST_DATABASE_URL says (so a pass against another server adds nothing)",
    )


@pytest.fixture(scope="session")
def new_schema(schema_factory: Callable[[], str]) -> Callable[[], str]:
    """Fresh, empty schemas on the session's PostgreSQL (see tests/conftest.py)."""
    return schema_factory


@pytest.fixture(scope="session")
def hdb_url(new_schema: Callable[[], str]) -> str:
    """The session's migrated schema."""
    url = new_schema()
    upgrade_database(url)
    return url


@pytest.fixture(scope="session")
def hdb(hdb_url: str) -> Iterator[Engine]:
    """A direct engine on the session schema, for assertions in raw SQL."""
    engine = create_engine(hdb_url)
    yield engine
    engine.dispose()


def settings_for(database_url: str, **overrides: Any) -> Settings:
    """Explicit settings for a hardening app: a smaller pool than the service suite's."""
    return app_settings(
        database_url, admin_key=ADMIN_KEY, **({"pool_size": 5, "max_overflow": 20} | overrides)
    )


@pytest.fixture(scope="session")
def hworkers(hdb_url: str) -> Iterator[None]:
    """Real release workers on the session schema for the whole session."""
    with release_workers(hdb_url, concurrency=2):
        yield


@pytest.fixture(scope="session")
def happ(hdb_url: str, hworkers: None) -> Iterator[FastAPI]:
    """One application with the default limits for the whole session, lifespan started."""
    application = create_app(settings_for(hdb_url))
    with serving(application):
        yield application


@pytest.fixture
def hclient(happ: FastAPI) -> TestClient:
    """A client that turns server exceptions into responses, like a real server would."""
    return client_of(happ)


@pytest.fixture
def make_app(hdb_url: str, hworkers: None) -> Callable[..., Any]:
    """``with make_app(max_quantiles=3) as client:`` — an app with overridden settings."""

    @contextmanager
    def factory(**overrides: Any) -> Iterator[TestClient]:
        application = create_app(settings_for(hdb_url, **overrides))
        with TestClient(application, raise_server_exceptions=False) as client:
            yield client

    return factory


ADMIN = auth(ADMIN_KEY)


class Api(ApiBase):
    """Scenario helpers with this suite's admin key."""

    def __init__(self, client: TestClient) -> None:
        super().__init__(client, ADMIN, "hds")

    def key(self, role: str, dataset_id: str | None = None) -> tuple[str, dict[str, str]]:
        """A new key: its id and its Authorization header."""
        return self.new_key(role, dataset_id)


@pytest.fixture
def hapi(hclient: TestClient) -> Api:
    """Scenario helpers bound to the session app."""
    return Api(hclient)


def ledger_state(engine: Engine, dataset_id: str) -> dict[str, Any]:
    """Raw-SQL view of one dataset's ledger and releases, for 'nothing stored' checks."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT kind, count(*), coalesce(sum(epsilon), 0), coalesce(sum(delta), 0) "
                "FROM ledger_entry WHERE dataset_id = :d GROUP BY kind"
            ),
            {"d": dataset_id},
        ).all()
        releases = conn.execute(
            text("SELECT count(*) FROM release WHERE dataset_id = :d"), {"d": dataset_id}
        ).scalar_one()
        data = conn.execute(
            text(
                "SELECT d.n, d.data_version, length(v.data) FROM dataset d "
                "LEFT JOIN dataset_data v ON v.dataset_id = d.id WHERE d.id = :d"
            ),
            {"d": dataset_id},
        ).one()
    out: dict[str, Any] = {"releases": int(releases), "n": data[0], "version": data[1]}
    out["bytes"] = data[2]
    for kind, count, eps, delta in rows:
        out[f"{kind}_rows"] = int(count)
        out[f"{kind}_eps"] = Decimal(eps)
        out[f"{kind}_delta"] = Decimal(delta)
    return out

"""Fixtures for the service tests: a real PostgreSQL, migrations, one app, helpers.

PostgreSQL comes from ``DPQUANT_TEST_DATABASE_URL`` when set, otherwise from an embedded
``pgserver`` started once per session in a temporary directory. Each session works in its own
fresh schema (``search_path``), so runs never collide on a shared server; the schema is built
by the Alembic migrations, never by ``create_all``. Tests isolate themselves by creating their
own datasets and keys (names carry a random suffix) instead of truncating tables.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, create_engine

from app.api.factory import create_app
from app.core.config import Settings
from app.core.db import upgrade_database
from tests.support import ApiBase, app_settings, auth, client_of, release_workers, serving

ADMIN_KEY = "dpq_test-admin-" + secrets.token_urlsafe(32)


@pytest.fixture(scope="session")
def make_schema(schema_factory: Callable[[], str]) -> Callable[[], str]:
    """Fresh, empty schemas on the session's PostgreSQL (see tests/conftest.py)."""
    return schema_factory


@pytest.fixture(scope="session")
def database_url(make_schema: Callable[[], str]) -> str:
    """The session's migrated schema."""
    url = make_schema()
    upgrade_database(url)
    return url


@pytest.fixture(scope="session")
def db_engine(database_url: str) -> Iterator[Engine]:
    """A direct engine on the session schema, for assertions in raw SQL."""
    engine = create_engine(database_url)
    yield engine
    engine.dispose()


def make_settings(database_url: str, **overrides: Any) -> Settings:
    """Settings for a test app (explicit values; the caller's environment cannot leak in)."""
    return app_settings(database_url, admin_key=ADMIN_KEY, **overrides)


@pytest.fixture(scope="session")
def workers(database_url: str) -> Iterator[None]:
    """Real release workers on the session schema for the whole session."""
    with release_workers(database_url, concurrency=2):
        yield


@pytest.fixture(scope="session")
def app(database_url: str, workers: None) -> Iterator[FastAPI]:
    """One application for the whole session, lifespan started."""
    application = create_app(make_settings(database_url))
    with serving(application):
        yield application


@pytest.fixture
def client(app: FastAPI) -> TestClient:
    """A client that turns server exceptions into responses, like a real server would."""
    return client_of(app)


ADMIN = auth(ADMIN_KEY)


class Api(ApiBase):
    """Scenario helpers with this suite's admin key."""

    def __init__(self, client: TestClient) -> None:
        super().__init__(client, ADMIN, "ds")

    def key(self, role: str, dataset_id: str | None = None) -> dict[str, str]:
        """A new key's Authorization header."""
        return self.new_key(role, dataset_id)[1]


@pytest.fixture
def api(client: TestClient) -> Api:
    """Scenario helpers bound to the session app."""
    return Api(client)


def D(x: str) -> Decimal:
    """Shorthand for exact decimals in assertions."""
    return Decimal(x)


SAMPLE = [float(v) for v in range(1, 101)]

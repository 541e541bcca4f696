"""Fixtures for the service tests: a real PostgreSQL, migrations, one app, helpers.

PostgreSQL comes from ``DPQUANT_TEST_DATABASE_URL`` when set, otherwise from an embedded
``pgserver`` started once per session in a temporary directory. Each session works in its own
fresh schema (``search_path``), so runs never collide on a shared server; the schema is built
by the Alembic migrations, never by ``create_all``. Tests isolate themselves by creating their
own datasets and keys (names carry a random suffix) instead of truncating tables.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, create_engine

from app.config import Settings
from app.db import upgrade_database
from app.main import create_app
from tests.support import app_settings

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
def app(database_url: str) -> Iterator[FastAPI]:
    """One application for the whole session, lifespan started."""
    application = create_app(make_settings(database_url))
    with TestClient(application):
        yield application


@pytest.fixture
def client(app: FastAPI) -> TestClient:
    """A client that turns server exceptions into responses, like a real server would."""
    return TestClient(app, raise_server_exceptions=False)


def auth(key: str) -> dict[str, str]:
    """The Authorization header for ``key``."""
    return {"Authorization": f"Bearer {key}"}


ADMIN = auth(ADMIN_KEY)


@dataclass
class Api:
    """Small helpers over the HTTP API, so tests read as scenarios."""

    client: TestClient

    def dataset(
        self,
        *,
        values: list[float] | None = None,
        epsilon: str | float = "1.0",
        delta: str | float = "0",
        lower: float = 0.0,
        upper: float = 100.0,
        neighbors: str = "swap",
        **extra: Any,
    ) -> dict[str, Any]:
        body = {
            "name": "ds-" + uuid.uuid4().hex[:10],
            "lower": lower,
            "upper": upper,
            "neighbors": neighbors,
            "epsilon": epsilon,
            "delta": delta,
            **extra,
        }
        r = self.client.post("/v1/datasets", json=body, headers=ADMIN)
        assert r.status_code == 201, r.text
        ds: dict[str, Any] = r.json()
        if values is not None:
            self.upload(ds["id"], values)
        return ds

    def upload(self, dataset_id: str, values: list[float]) -> dict[str, Any]:
        r = self.client.put(f"/v1/datasets/{dataset_id}/values", json=values, headers=ADMIN)
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out

    def key(self, role: str, dataset_id: str | None = None) -> dict[str, str]:
        body: dict[str, Any] = {"role": role, "name": f"test {role}"}
        if dataset_id is not None:
            body["dataset_id"] = dataset_id
        r = self.client.post("/v1/keys", json=body, headers=ADMIN)
        assert r.status_code == 201, r.text
        return auth(r.json()["key"])

    def query(
        self,
        dataset_id: str,
        headers: dict[str, str] | None = None,
        **body: Any,
    ) -> Any:
        payload = {"quantiles": [0.25, 0.5, 0.75], "epsilon": "0.1", "method": "indexp"}
        payload.update(body)
        return self.client.post(
            f"/v1/datasets/{dataset_id}/quantiles", json=payload, headers=headers or ADMIN
        )

    def budget(self, dataset_id: str) -> dict[str, Any]:
        r = self.client.get(f"/v1/datasets/{dataset_id}/budget", headers=ADMIN)
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out


@pytest.fixture
def api(client: TestClient) -> Api:
    """Scenario helpers bound to the session app."""
    return Api(client)


def D(x: str) -> Decimal:
    """Shorthand for exact decimals in assertions."""
    return Decimal(x)


SAMPLE = [float(v) for v in range(1, 101)]

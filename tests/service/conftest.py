"""Fixtures for the service tests: a real PostgreSQL, migrations, one app, helpers.

PostgreSQL comes from ``DPQUANT_TEST_DATABASE_URL`` when set, otherwise from an embedded
``pgserver`` started once per session in a temporary directory. Each session works in its own
fresh schema (``search_path``), so runs never collide on a shared server; the schema is built
by the Alembic migrations, never by ``create_all``. Tests isolate themselves by creating their
own datasets and keys (names carry a random suffix) instead of truncating tables.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from app.config import Settings
from app.db import normalize_url, upgrade_database
from app.main import create_app

ADMIN_KEY = "dpq_test-admin-" + secrets.token_urlsafe(32)


def with_schema(url: str, schema: str) -> str:
    """``url`` with ``search_path`` set to ``schema`` through libpq's ``options``."""
    parsed = make_url(normalize_url(url))
    return parsed.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(
        hide_password=False
    )


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """A PostgreSQL server URL (external or embedded), without a schema."""
    external = os.environ.get("DPQUANT_TEST_DATABASE_URL")
    if external:
        yield normalize_url(external)
        return
    import pgserver

    tmp = tempfile.mkdtemp(prefix="dpquant-test-pg-")
    server = pgserver.get_server(Path(tmp) / "pgdata", cleanup_mode="stop")
    try:
        yield normalize_url(server.get_uri())
    finally:
        server.cleanup()  # stop PostgreSQL before its directory disappears
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def make_schema(server_url: str) -> Iterator[Callable[[], str]]:
    """Factory of fresh, empty schemas (dropped at the end of the session); returns URLs."""
    created: list[str] = []
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")

    def factory() -> str:
        name = "dpq_test_" + uuid.uuid4().hex[:12]
        with admin.connect() as conn:
            conn.execute(text(f'CREATE SCHEMA "{name}"'))
        created.append(name)
        return with_schema(server_url, name)

    yield factory
    with admin.connect() as conn:
        for name in created:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))
    admin.dispose()


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
    values: dict[str, Any] = {
        "database_url": database_url,
        "bootstrap_admin_key": ADMIN_KEY,
        "max_upload_bytes": 64 * 1024 * 1024,
        "max_values": 10_000_000,
        "max_quantiles": 1000,
        "max_page_size": 500,
        "min_release_ms": 0,
        "pool_size": 10,
        "max_overflow": 50,
        "log_level": "WARNING",
    }
    values.update(overrides)
    return Settings(**values)


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

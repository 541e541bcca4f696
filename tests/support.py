"""Plain helpers shared by the test suites (fixtures live in the conftest files)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi.testclient import TestClient

from app.core.config import Settings


def app_settings(database_url: str, *, admin_key: str, **overrides: Any) -> Settings:
    """Explicit settings for a test app (the caller's environment cannot leak in)."""
    values: dict[str, Any] = {
        "database_url": database_url,
        "bootstrap_admin_key": admin_key,
        "max_upload_bytes": 64 * 1024 * 1024,
        "max_values": 10_000_000,
        "max_quantiles": 1000,
        "max_page_size": 500,
        "min_release_ms": 0,
        "pool_size": 10,
        "max_overflow": 50,
        "log_level": "WARNING",
        # Publication times (issue 28) hold every release for its public bound; the tests of
        # other properties do not wait for them (tests/service/test_publication.py, the
        # timing benchmark and the real `dpquant serve` of tests/hardening turn them on).
        "publish_scale": 0.0,
    }
    values.update(overrides)
    return Settings(**values)


@contextmanager
def release_workers(
    database_url: str, *, concurrency: int = 1, **env: Any
) -> Iterator[subprocess.Popen[bytes]]:
    """Real release workers (``dpquant worker``) on ``database_url`` while the block runs.

    ``env`` sets ``DPQUANT_*`` variables of the workers, e.g. ``run_timeout_s=2``.
    """
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DPQUANT_")}
    environ["DPQUANT_DATABASE_URL"] = database_url
    environ["DPQUANT_LOG_LEVEL"] = "WARNING"
    environ["DPQUANT_WORKER_POLL_S"] = "0.2"
    environ["DPQUANT_PUBLISH_SCALE"] = "0"  # as app_settings: on where a test asks for it
    for name, value in env.items():
        environ[f"DPQUANT_{name.upper()}"] = str(value)
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.runtime.cli", "worker", "--concurrency", str(concurrency)],
        env=environ,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_for(predicate: Any, *, timeout: float = 30.0, interval: float = 0.05) -> Any:
    """Poll ``predicate()`` until it returns something truthy; fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


def count_statements(monkeypatch: Any) -> dict[str, list[str]]:
    """Record the statements psycopg sends in this process from now on (whitespace folded):
    ``"async"`` (the web process's hot paths, app/core/pg.py) and ``"sync"`` (release workers'
    connections, and SQLAlchemy's)."""
    import psycopg

    log: dict[str, list[str]] = {"async": [], "sync": []}
    sync_execute, async_execute = psycopg.Cursor.execute, psycopg.AsyncCursor.execute

    def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        log["sync"].append(" ".join(str(query).split()))
        return sync_execute(self, query, *args, **kwargs)

    async def counted_async(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        log["async"].append(" ".join(str(query).split()))
        return await async_execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", counted)
    monkeypatch.setattr(psycopg.AsyncCursor, "execute", counted_async)
    return log


@contextmanager
def serving(app: Any, **kwargs: Any) -> Iterator[TestClient]:
    """``with serving(app) as client``: the app's lifespan started; its requests, and those
    of :func:`client_of`, run on the app's own event loop, as under uvicorn (one loop per
    process). A plain ``TestClient(app)`` outside a ``with`` runs each request on a new loop,
    where the hot paths' pool is not shared (app/core/pg.py) and every request connects anew."""
    with TestClient(app, **kwargs) as client:
        app.state.test_portal = client.portal
        try:
            yield client
        finally:
            del app.state.test_portal


def client_of(app: Any) -> TestClient:
    """A client (server errors become responses) on the loop of a :func:`serving` app."""
    client = TestClient(app, raise_server_exceptions=False)
    client.portal = app.state.test_portal
    return client


def auth(key: str) -> dict[str, str]:
    """The Authorization header for ``key``."""
    return {"Authorization": f"Bearer {key}"}


@dataclass
class ApiBase:
    """Small helpers over the HTTP API, so tests read as scenarios (``admin``: its headers)."""

    client: TestClient
    admin: dict[str, str]
    label: str = field(default="test")

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
            "name": f"{self.label}-" + uuid.uuid4().hex[:10],
            "lower": lower,
            "upper": upper,
            "neighbors": neighbors,
            "epsilon": epsilon,
            "delta": delta,
            **extra,
        }
        r = self.client.post("/v1/datasets", json=body, headers=self.admin)
        assert r.status_code == 201, r.text
        ds: dict[str, Any] = r.json()
        if values is not None:
            self.upload(ds["id"], values)
        return ds

    def upload(self, dataset_id: str, values: list[float]) -> dict[str, Any]:
        r = self.client.put(f"/v1/datasets/{dataset_id}/values", json=values, headers=self.admin)
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out

    def new_key(self, role: str, dataset_id: str | None = None) -> tuple[str, dict[str, str]]:
        """A new key: its id and its Authorization header."""
        body: dict[str, Any] = {"role": role, "name": f"{self.label} {role}"}
        if dataset_id is not None:
            body["dataset_id"] = dataset_id
        r = self.client.post("/v1/keys", json=body, headers=self.admin)
        assert r.status_code == 201, r.text
        return r.json()["id"], auth(r.json()["key"])

    def query(self, dataset_id: str, headers: dict[str, str] | None = None, **body: Any) -> Any:
        payload: dict[str, Any] = {
            "quantiles": [0.25, 0.5, 0.75],
            "epsilon": "0.1",
            "method": "indexp",
        }
        payload.update(body)
        return self.client.post(
            f"/v1/datasets/{dataset_id}/quantiles", json=payload, headers=headers or self.admin
        )

    def budget(self, dataset_id: str) -> dict[str, Any]:
        r = self.client.get(f"/v1/datasets/{dataset_id}/budget", headers=self.admin)
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out

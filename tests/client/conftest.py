"""Client tests: the dpquant_client package against a live server over real HTTP."""

from __future__ import annotations

import secrets
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.core.db import upgrade_database
from tests.live import LiveServer

try:
    import dpquant_client  # noqa: F401  (installed: pip install -e clients/python)
except ImportError:  # a checkout without the install: use the source tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "clients" / "python"))

from dpquant_client import Client


@pytest.fixture(scope="session")
def server(schema_factory: Callable[[], str]) -> Iterator[LiveServer]:
    url = schema_factory()
    upgrade_database(url)
    live = LiveServer(url, "dpq_client-admin-" + secrets.token_urlsafe(32)).start()
    yield live
    live.stop()


@pytest.fixture
def admin(server: LiveServer) -> Iterator[Client]:
    with Client(server.base_url, server.admin_key, backoff=0.01) as client:
        yield client


def name() -> str:
    return "client-" + uuid.uuid4().hex[:10]


VALUES = [float(v) for v in range(1, 201)]

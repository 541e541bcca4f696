"""A real HTTP server for browser and client tests: uvicorn in a thread, on a free port.

The app is the ordinary ``create_app()`` with explicit settings against a fresh, migrated
schema of the session's PostgreSQL, so the browser and the client talk HTTP to the same
code the ``dpquant serve`` command runs.
"""

from __future__ import annotations

import contextlib
from typing import Any

from app.api.factory import create_app
from tests.servers import ThreadedServer, wait_until_ready
from tests.support import app_settings, release_workers


class LiveServer:
    """``create_app(settings)`` served by uvicorn in a daemon thread."""

    def __init__(self, database_url: str, admin_key: str, **overrides: Any) -> None:
        self.admin_key = admin_key
        self.database_url = database_url
        self._workers = contextlib.ExitStack()
        settings = app_settings(database_url, admin_key=admin_key, **overrides)
        # keep-alive as `dpquant serve` runs it
        self._server = ThreadedServer(create_app(settings), timeout_keep_alive=settings.keepalive_s)
        self.port = self._server.port

    @property
    def base_url(self) -> str:
        return self._server.base_url

    def start(self, timeout: float = 60.0) -> LiveServer:
        # Mechanisms run in release worker processes: start real ones.
        self._workers.enter_context(release_workers(self.database_url, concurrency=1))
        self._server.start(timeout)
        wait_until_ready(self.base_url, alive=self._server.thread.is_alive, timeout=timeout)
        return self

    def stop(self) -> None:
        self._server.stop()
        self._workers.close()

"""A real HTTP server for browser and client tests: uvicorn in a thread, on a free port.

The app is the ordinary ``create_app()`` with explicit settings against a fresh, migrated
schema of the session's PostgreSQL, so the browser and the client talk HTTP to the same
code the ``dpquant serve`` command runs.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any

import httpx
import uvicorn

from app.api.factory import create_app
from tests.support import app_settings, release_workers


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class LiveServer:
    """``create_app(settings)`` served by uvicorn in a daemon thread."""

    def __init__(self, database_url: str, admin_key: str, **overrides: Any) -> None:
        self.admin_key = admin_key
        self.database_url = database_url
        self._workers = contextlib.ExitStack()
        self.port = free_port()
        settings = app_settings(database_url, admin_key=admin_key, **overrides)
        config = uvicorn.Config(
            create_app(settings),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="on",
            timeout_keep_alive=settings.keepalive_s,  # as `dpquant serve` runs it
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> LiveServer:
        # Mechanisms run in release worker processes (issue 8): start real ones.
        self._workers.enter_context(release_workers(self.database_url, concurrency=1))
        self.thread.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.thread.is_alive():
                raise RuntimeError("the test server exited during startup")
            try:
                if httpx.get(self.base_url + "/readyz", timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError("the test server did not become ready")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self._workers.close()

"""Admission control: at most N requests per process inside the (sync) application at once.

Why: endpoints and their dependencies are synchronous, so each request needs a worker
thread (anyio's default limiter: 40 per process) *and*, from authentication on, a database
connection (``pool_size + max_overflow``). Acquired one after the other, the two pools can
starve each other: under a burst, every thread waits for a connection while every
connection belongs to a request that waits for a thread. Nothing moves until the pool
timeout fires and a wave of requests fails with 503 (the 200-client load test shows
it). Admitting at most ``min(threads, connections)`` requests at once makes both
resources always sufficient for everyone admitted; the others wait here, asynchronously,
holding neither. A request that cannot be admitted within ``queue_timeout_s`` gets 503.

``/healthz`` bypasses the gate (it touches no database and must answer under load).

A request that goes on to wait without holding a thread or a connection (a release waiting
for its worker) gives its slot back early through ``scope[ADMISSION_RELEASE]()``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from weakref import WeakKeyDictionary

import anyio
from starlette.types import ASGIApp, Receive, Scope, Send

logger = logging.getLogger(__name__)

BYPASS_PATHS = frozenset({"/healthz"})

#: Scope key of the callable that gives the request's admission slot back early (idempotent).
ADMISSION_RELEASE = "dpquant.admission.release"


def admission_limit(connections: int) -> int:
    """``min(worker threads, pool connections)`` of this process (call inside the loop)."""
    threads = int(anyio.to_thread.current_default_thread_limiter().total_tokens)
    return max(1, min(threads, connections))


class AdmissionMiddleware:
    """Pure ASGI middleware gating HTTP requests with a per-process semaphore."""

    def __init__(self, app: ASGIApp, *, connections: int, queue_timeout_s: float) -> None:
        self.app = app
        self.connections = connections
        self.queue_timeout_s = queue_timeout_s
        # One semaphore per event loop, like anyio's thread limiter it complements (a server
        # process has one loop; test clients may run several).
        self._semaphores: WeakKeyDictionary[asyncio.AbstractEventLoop, anyio.Semaphore] = (
            WeakKeyDictionary()
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in BYPASS_PATHS:
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        semaphore = self._semaphores.get(loop)
        if semaphore is None:
            semaphore = self._semaphores[loop] = anyio.Semaphore(admission_limit(self.connections))
        with anyio.move_on_after(self.queue_timeout_s) as waited:
            await semaphore.acquire()
        if waited.cancelled_caught:
            logger.warning("request not admitted within %.1f s", self.queue_timeout_s)
            await _overloaded(send)
            return
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                semaphore.release()

        scope[ADMISSION_RELEASE] = release
        try:
            await self.app(scope, receive, send)
        finally:
            release()


async def _overloaded(send: Send) -> None:
    body = json.dumps(
        {"type": "overloaded", "detail": "the service is busy; nothing was charged, retry later"}
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", b"1"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})

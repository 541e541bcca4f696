"""Last line of defence: no exception ever reaches the server, its logs or the connection.

Starlette answers an unhandled exception through its outermost ``ServerErrorMiddleware``
(the ``Exception`` handler in :mod:`app.api.errors` builds the 503 body) but then *re-raises*
it; uvicorn logs the full traceback with the exception message — which may quote SQL
parameters or, in principle, a data value — and closes the keep-alive connection, so the
client's next request on it fails with a read error (the database-outage test counts
such dropped connections).

``GuardMiddleware`` sits just inside it and catches everything the routers let through:
it sends the same JSON error body (503, ``Retry-After: 1``), keeps the connection usable,
and logs the exception class and the code locations of the traceback only — never a
message, an argument or a local variable.
"""

from __future__ import annotations

import json
import logging
import traceback

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.guard import database_unavailable

logger = logging.getLogger(__name__)


def unexpected_body(exc: BaseException) -> dict[str, str]:
    """The body for an unexpected exception (same texts as :mod:`app.api.errors`)."""
    if database_unavailable(exc):
        return {
            "type": "database_unavailable",
            "detail": "the database is unavailable; nothing was charged",
        }
    return {"type": "internal_error", "detail": "internal error; nothing was charged, retry later"}


def locations(exc: BaseException) -> str:
    """``file:line in function`` of each traceback frame; no message, no values."""
    frames = traceback.extract_tb(exc.__traceback__)
    return " <- ".join(f"{f.filename}:{f.lineno} in {f.name}" for f in reversed(frames[-8:]))


class GuardMiddleware:
    """Pure ASGI middleware turning any escaped exception into a JSON 503."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            body = unexpected_body(exc)
            if body["type"] == "database_unavailable":
                logger.error("database unavailable: %s", type(exc).__name__)
            else:
                logger.error(
                    "unexpected %s on %s %s at %s",
                    type(exc).__name__,
                    scope.get("method"),
                    scope.get("path"),
                    locations(exc),
                )
            if started:
                return  # too late for a status; the server ends the incomplete response
            payload = json.dumps(body).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 503,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(payload)).encode()),
                        (b"retry-after", b"1"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": payload})

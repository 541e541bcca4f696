"""Uniform response time for quantile queries (``DPQUANT_MIN_RELEASE_MS``).

How long a release takes grows with the dataset and may depend on its values; whether a
query failed early (validation, budget) or late (after sampling) is visible in its timing
too. With ``min_release_ms > 0`` every answer of ``POST /v1/datasets/{id}/quantiles`` —
success or error — is held back until that many milliseconds after the request arrived.
The wait is asynchronous and happens after the commit, outside admission control: it holds
no lock, no database connection, no thread and no admission slot (an endpoint that slept
inside its transaction would make a grant during a padded release wait for the pad, and
a flood of padded refusals would stall every endpoint).
"""

from __future__ import annotations

import re
import time

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

QUANTILES_PATH = re.compile(r"^/v1/datasets/[^/]+/quantiles/?$")


class ReleaseTimingMiddleware:
    """Pure ASGI middleware delaying the response start of quantile queries."""

    def __init__(self, app: ASGIApp, *, min_release_ms: int) -> None:
        self.app = app
        self.min_s = min_release_ms / 1000.0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self.min_s <= 0
            or scope["type"] != "http"
            or scope.get("method") != "POST"
            or not QUANTILES_PATH.match(scope.get("path", ""))
        ):
            await self.app(scope, receive, send)
            return
        deadline = time.monotonic() + self.min_s

        async def padded_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                wait = deadline - time.monotonic()
                if wait > 0:
                    await anyio.sleep(wait)
            await send(message)

        await self.app(scope, receive, padded_send)

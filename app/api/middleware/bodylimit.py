"""Request body size limit for every route except the values upload.

FastAPI reads a JSON body completely before validating it, so without a limit a single
request could make a worker buffer gigabytes. This middleware refuses (413) any body larger
than ``DPQUANT_MAX_BODY_BYTES`` — at once when ``Content-Length`` says so, otherwise while
streaming — before the application sees it. The uploads (``PUT`` and ``POST
/v1/datasets/{id}/values``, ``PUT /v1/datasets/{id}/histogram``) stream their bodies in
constant memory under their own, larger limit (``DPQUANT_MAX_UPLOAD_BYTES``, enforced by the
endpoints) and are passed through untouched.
"""

from __future__ import annotations

import json
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

UPLOAD_PATH = re.compile(r"^/v1/datasets/[^/]+/values/?$")
HISTOGRAM_PATH = re.compile(r"^/v1/datasets/[^/]+/histogram/?$")


def is_upload(scope: Scope) -> bool:
    """Whether the request is one of the streamed uploads."""
    method, path = scope.get("method"), scope.get("path", "")
    if method in ("PUT", "POST") and UPLOAD_PATH.match(path):
        return True
    return method == "PUT" and HISTOGRAM_PATH.match(path) is not None


class BodyLimitMiddleware:
    """Pure ASGI middleware: buffer up to ``limit`` bytes, 413 beyond."""

    def __init__(self, app: ASGIApp, *, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_upload(scope):
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                await self._too_large(send)
                return
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.limit:
                await self._too_large(send)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            if messages:
                return messages.pop(0)
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send: Send) -> None:
        body = json.dumps(
            {
                "type": "payload_too_large",
                "detail": f"request bodies are limited to {self.limit} bytes",
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

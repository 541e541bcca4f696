"""The OpenAPI document, made friendly to client generators in one place.

Some responses come from middleware, not from a route, so no route can declare them; they
are added here to every operation they can answer:

* ``429 rate_limited`` (with ``Retry-After``) on every ``/v1`` operation (the per-key limit);
* ``413 payload_too_large`` on every operation with a request body (the body limit);
* conditional reads: an operation that declares ``304`` gets the ``If-None-Match`` request
  header and the ``ETag`` response header on its 200 and 304 answers.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

ERROR_REF = {"$ref": "#/components/schemas/ErrorBody"}
JSON_ERROR = {"application/json": {"schema": ERROR_REF}}

ETAG_HEADER = {
    "description": "Strong validator of the body; send it back in If-None-Match.",
    "schema": {"type": "string"},
}
RETRY_AFTER_HEADER = {
    "description": "Seconds to wait before retrying.",
    "schema": {"type": "integer"},
}
IF_NONE_MATCH = {
    "name": "If-None-Match",
    "in": "header",
    "required": False,
    "description": "An ETag from an earlier answer: 304 Not Modified while it still matches.",
    "schema": {"type": "string"},
}


def make_friendly(document: dict[str, Any]) -> dict[str, Any]:
    """Add the middleware-produced responses and the conditional-read headers (in place)."""
    for path, item in document.get("paths", {}).items():
        for op in item.values():
            responses: dict[str, Any] = op.setdefault("responses", {})
            if path.startswith("/v1"):
                responses.setdefault(
                    "429",
                    {
                        "description": "Rate limited (per API key); retry after Retry-After",
                        "headers": {"Retry-After": RETRY_AFTER_HEADER},
                        "content": JSON_ERROR,
                    },
                )
            if "requestBody" in op:
                responses.setdefault(
                    "413", {"description": "Request body too large", "content": JSON_ERROR}
                )
            if "304" in responses:
                params: list[dict[str, Any]] = op.setdefault("parameters", [])
                if not any(p.get("name", "").lower() == "if-none-match" for p in params):
                    params.append(dict(IF_NONE_MATCH))
                for status in ("200", "304"):
                    if status in responses:
                        responses[status].setdefault("headers", {})["ETag"] = ETAG_HEADER
                responses["304"].pop("content", None)
    return document


def install_openapi(app: FastAPI) -> None:
    """Replace ``app.openapi`` with a cached, generator-friendly version."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = make_friendly(original())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

"""The handlers that turn every failure into ``{"type", "detail"}`` (:class:`ErrorBody`).

Bodies never carry a stack trace or an input value: validation messages name the field and
the rule only, because a rejected input may be a data value.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.core.db import CommitOutcomeUnknown
from app.core.errors import DpquantError, error_body, outcome_unknown
from app.core.guard import database_unavailable

logger = logging.getLogger(__name__)


def format_validation_errors(errors: Any) -> str:
    """``"body.epsilon: Input should be greater than 0; ..."`` without ever echoing input."""
    parts: list[str] = []
    for err in list(errors)[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()))
        msg = str(err.get("msg", "invalid"))
        if err.get("type") == "json_invalid":
            msg = "malformed JSON"
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts) or "invalid request"


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers; after this no failure produces a body other than ErrorBody."""

    @app.exception_handler(DpquantError)
    async def _dpquant(request: Request, exc: DpquantError) -> JSONResponse:
        return JSONResponse(
            error_body(exc.type, exc.detail, exc.extra),
            status_code=exc.status_code,
            headers=exc.headers,
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(
            error_body("validation_error", format_validation_errors(exc.errors())), status_code=422
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kinds = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}
        return JSONResponse(
            error_body(kinds.get(exc.status_code, "http_error"), str(exc.detail)),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(CommitOutcomeUnknown)
    async def _outcome_unknown(request: Request, exc: CommitOutcomeUnknown) -> JSONResponse:
        err = outcome_unknown(has_idempotency_key="idempotency-key" in request.headers)
        return JSONResponse(error_body(err.type, err.detail), status_code=503, headers=err.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Every unexpected failure happens before or instead of a commit, so nothing was
        # charged: answer 503 (retry-safe with the same Idempotency-Key), never a bare 500.
        if database_unavailable(exc):
            logger.error("database unavailable: %s", type(exc).__name__)
            return JSONResponse(
                error_body(
                    "database_unavailable", "the database is unavailable; nothing was charged"
                ),
                status_code=503,
                headers={"Retry-After": "1"},
            )
        logger.error("unexpected %s on %s %s", type(exc).__name__, request.method, request.url.path)
        return JSONResponse(
            error_body("internal_error", "internal error; nothing was charged, retry later"),
            status_code=503,
            headers={"Retry-After": "1"},
        )

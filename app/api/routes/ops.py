"""Health and readiness probes (no authentication, no data) and Prometheus metrics."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel
from sqlalchemy import Engine
from starlette.concurrency import run_in_threadpool

from app.api.deps import bearer, get_principal
from app.core import metrics
from app.core.db import current_revisions
from app.core.errors import ErrorBody, error_responses, forbidden, unauthorized

router = APIRouter(tags=["ops"])


class Health(BaseModel):
    """Liveness: the process answers."""

    status: str


class Readiness(BaseModel):
    """Readiness: the database answers and its schema is at the code's migration head."""

    status: str
    database: str
    migrations: str


@router.get("/healthz", response_model=Health, summary="Liveness probe")
def healthz() -> Health:
    """The process is up (no database access)."""
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"model": ErrorBody, "description": "Database unreachable or not migrated"}},
    summary="Readiness probe",
)
def readyz(request: Request) -> Readiness | JSONResponse:
    """Ready when PostgreSQL answers and the schema is at the migration head."""
    engine: Engine = request.app.state.engine
    try:
        current = current_revisions(engine)
    except Exception:
        return JSONResponse(
            {"type": "not_ready", "detail": "database unreachable"}, status_code=503
        )
    if current != request.app.state.migration_heads:
        return JSONResponse(
            {"type": "not_ready", "detail": "database schema is not at the migration head"},
            status_code=503,
        )
    return Readiness(status="ready", database="ok", migrations="current")


#: The Prometheus text exposition format (version 0.0.4).
METRICS_MEDIA_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "description": "Prometheus text exposition (all processes; no data-derived figure)",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
        **error_responses(401, 403, 503),
    },
    summary="Prometheus metrics (admin key or DPQUANT_METRICS_TOKEN)",
)
async def read_metrics(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Response:
    """Release counts by method and outcome, exact ε and δ spent per dataset (from the
    ledger's balance rows), latency and mechanism run-time histograms, refusals by type and
    database pool use, summed over every web and release-worker process."""
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise unauthorized()
    token = request.app.state.settings.metrics_token
    if token is None or not metrics.token_matches(
        token.get_secret_value(), credentials.credentials
    ):
        principal = await get_principal(request, credentials)
        if principal.role != "admin":
            raise forbidden("requires role admin or the metrics token")
    body = await run_in_threadpool(metrics.render, request.app.state.session_factory)
    return Response(body, media_type=METRICS_MEDIA_TYPE)

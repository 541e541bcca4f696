"""Health and readiness probes (no authentication, no data)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy import Engine

from app.db import current_revisions
from app.errors import ErrorBody

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

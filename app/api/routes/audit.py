"""``GET /v1/audit``: the audit log of admin actions (admins only)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from app.api.deps import AdminDep, SessionDep
from app.api.http import DecimalJSONRoute, decode_cursor, encode_cursor
from app.audit import service
from app.audit.schemas import AuditEventPublic, AuditPage
from app.core.errors import error_responses

router = APIRouter(prefix="/v1/audit", tags=["audit"], route_class=DecimalJSONRoute)


@router.get(
    "",
    response_model=AuditPage,
    responses=error_responses(401, 403, 422, 503),
    summary="Page through the audit log of admin actions, newest first",
)
def list_audit(
    request: Request,
    session: SessionDep,
    principal: AdminDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> AuditPage:
    """Who created, revoked or rotated keys, created, renamed or archived datasets, uploaded
    values (mode and byte size only) and granted budget; ``next_cursor`` pages back."""
    limit = min(limit, request.app.state.settings.max_page_size)
    rows = service.list_events(session, before=decode_cursor(cursor), limit=limit + 1)
    items = [AuditEventPublic.model_validate(r) for r in rows[:limit]]
    next_cursor = encode_cursor(rows[limit - 1].id) if len(rows) > limit else None
    return AuditPage(items=items, next_cursor=next_cursor)

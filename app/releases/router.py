"""Analyst and dashboard endpoints: ask for quantiles, read releases."""

from __future__ import annotations

import time
import uuid
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response

from app.auth.deps import AnalystDep, ReaderDep
from app.db import SessionDep
from app.errors import ErrorBody, error_responses
from app.ledger.schemas import AmountPublic
from app.ops.http import (
    DecimalJSONRoute,
    conditional_json,
    decode_cursor,
    encode_cursor,
    json_bytes,
)
from app.releases import service
from app.releases.models import Release
from app.releases.schemas import BudgetExhausted, QuantileQuery, ReleasePage, ReleasePublic

router = APIRouter(prefix="/v1", tags=["releases"], route_class=DecimalJSONRoute)


def present(release: Release) -> ReleasePublic:
    """The public form of a stored release (deterministic: same row, same bytes)."""
    return ReleasePublic(
        id=release.id,
        dataset_id=release.dataset_id,
        method=release.method,
        quantiles=list(release.quantiles),
        estimates=list(release.estimates),
        epsilon=release.epsilon,
        delta=release.delta,
        cost=AmountPublic(epsilon=release.cost_epsilon, delta=release.cost_delta),
        remaining=AmountPublic(epsilon=release.remaining_epsilon, delta=release.remaining_delta),
        created_at=release.created_at,
    )


QUERY_ERRORS = error_responses(401, 403, 404, 422, 503) | {
    409: {
        "model": BudgetExhausted | ErrorBody,
        "description": "budget_exhausted (with the requested and remaining figures), "
        "idempotency_conflict, or no_values",
    }
}


@router.post(
    "/datasets/{dataset_id}/quantiles",
    status_code=201,
    response_model=ReleasePublic,
    responses=QUERY_ERRORS,
    summary="Release differentially private quantiles (debits the budget)",
)
def create_release(
    dataset_id: uuid.UUID,
    body: QuantileQuery,
    request: Request,
    session: SessionDep,
    principal: AnalystDep,
    idempotency_key: Annotated[
        str | None,
        Header(
            min_length=1,
            max_length=255,
            description="Retry-safe key: the same key and body return the original release.",
        ),
    ] = None,
) -> Response:
    """Price the query, debit the budget and store the release, all in one transaction."""
    started = time.monotonic()
    settings = request.app.state.settings
    outcome = service.create_release(
        session,
        principal=principal,
        dataset_id=dataset_id,
        query=body,
        idempotency_key=idempotency_key,
        max_quantiles=settings.max_quantiles,
    )
    content = json_bytes(present(outcome.release))
    pad = settings.min_release_ms / 1000.0 - (time.monotonic() - started)
    if pad > 0:
        time.sleep(pad)
    headers = {"Idempotent-Replayed": "true"} if outcome.replayed else {}
    return Response(content, status_code=201, media_type="application/json", headers=headers)


@router.get(
    "/releases/{release_id}",
    response_model=ReleasePublic,
    responses=error_responses(304, 401, 403, 404, 422, 503),
    summary="Read a release (free; supports If-None-Match)",
)
def get_release(
    release_id: uuid.UUID, request: Request, session: SessionDep, principal: ReaderDep
) -> Response:
    """A stored release, byte-identical to the response that created it."""
    release = service.get_release(session, principal=principal, release_id=release_id)
    return conditional_json(request, present(release))


@router.get(
    "/datasets/{dataset_id}/releases",
    response_model=ReleasePage,
    responses=error_responses(304, 401, 403, 404, 422, 503),
    summary="List a dataset's releases, newest first (free; supports If-None-Match)",
)
def list_releases(
    dataset_id: uuid.UUID,
    request: Request,
    session: SessionDep,
    principal: ReaderDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> Response:
    """Releases newest first; ``next_cursor`` fetches the next (older) page."""
    limit = min(limit, request.app.state.settings.max_page_size)
    rows = service.list_releases(
        session,
        principal=principal,
        dataset_id=dataset_id,
        before=decode_cursor(cursor),
        limit=limit + 1,
    )
    next_cursor = encode_cursor(rows[limit - 1].seq) if len(rows) > limit else None
    page = ReleasePage(items=[present(r) for r in rows[:limit]], next_cursor=next_cursor)
    return conditional_json(request, page)

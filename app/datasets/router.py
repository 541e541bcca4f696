"""Dataset endpoints: create, list, read, upload values."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from app.auth.deps import AdminDep, ReaderDep
from app.auth.principal import Principal
from app.datasets import service
from app.datasets.models import Dataset
from app.datasets.schemas import DatasetAdmin, DatasetCreate, DatasetPage, DatasetPublic
from app.db import SessionDep
from app.errors import DpquantError, error_responses
from app.ledger.schemas import AmountPublic
from app.ledger.service import Budget, add_grant, budget, budgets
from app.ops.http import DecimalJSONRoute, decode_cursor, encode_cursor

router = APIRouter(prefix="/v1/datasets", tags=["datasets"], route_class=DecimalJSONRoute)


def present(
    session: SessionDep, dataset: Dataset, principal: Principal, figures: Budget | None = None
) -> DatasetPublic:
    """The view of ``dataset`` this key may see (admins get sizes, others do not)."""
    if figures is None:
        figures = budget(session, dataset_id=dataset.id)
    remaining = AmountPublic.of(figures.remaining)
    public = DatasetPublic(
        id=dataset.id,
        name=dataset.name,
        description=dataset.description,
        lower=dataset.lower,
        upper=dataset.upper,
        neighbors=dataset.neighbors,
        granularity=dataset.granularity,
        budget_remaining=remaining,
        created_at=dataset.created_at,
    )
    if principal.role != "admin":
        return public
    return DatasetAdmin(
        **public.model_dump(),
        n=dataset.n,
        n_outside_bounds=dataset.n_outside,
        values_uploaded_at=dataset.values_uploaded_at,
        frozen_at=dataset.frozen_at,
    )


@router.post(
    "",
    status_code=201,
    response_model=DatasetAdmin,
    responses=error_responses(401, 403, 409, 422, 503),
    summary="Create a dataset",
)
def create_dataset(body: DatasetCreate, session: SessionDep, principal: AdminDep) -> DatasetPublic:
    """Create a dataset with public bounds, neighbour relation, grid and initial budget."""
    dataset = service.create_dataset(session, body=body)
    if body.epsilon > 0 or body.delta > 0:
        add_grant(
            session,
            dataset_id=dataset.id,
            epsilon=body.epsilon,
            delta=body.delta,
            reason="initial budget",
            api_key_id=principal.key_id,
        )
    return present(session, dataset, principal)


@router.get(
    "",
    response_model=DatasetPage,
    responses=error_responses(401, 403, 422, 503),
    summary="List datasets",
)
def list_datasets(
    request: Request,
    session: SessionDep,
    principal: ReaderDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> DatasetPage:
    """Datasets inside the key's scope, newest first (admins see sizes)."""
    offset = decode_cursor(cursor) or 0
    limit = min(limit, request.app.state.settings.max_page_size)
    rows = service.list_visible(session, principal=principal, offset=offset, limit=limit + 1)
    figures = budgets(session, dataset_ids=[d.id for d in rows[:limit]])
    items = [present(session, d, principal, figures[d.id]) for d in rows[:limit]]
    next_cursor = encode_cursor(offset + limit) if len(rows) > limit else None
    return DatasetPage(items=items, next_cursor=next_cursor)


@router.get(
    "/{dataset_id}",
    response_model=DatasetAdmin | DatasetPublic,
    responses=error_responses(401, 403, 404, 422, 503),
    summary="Read a dataset",
)
def get_dataset(dataset_id: uuid.UUID, session: SessionDep, principal: ReaderDep) -> DatasetPublic:
    """One dataset; admins see n and the count outside the bounds, other roles do not."""
    dataset = service.get_visible(session, principal=principal, dataset_id=dataset_id)
    return present(session, dataset, principal)


async def upload_body(request: Request) -> bytes:
    """Read the request body, refusing (413) more than ``max_upload_bytes``."""
    limit: int = request.app.state.settings.max_upload_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise DpquantError(413, "payload_too_large", f"uploads are limited to {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise DpquantError(413, "payload_too_large", f"uploads are limited to {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


# One content type per operation in the document: client generators cannot dispatch one
# operation over several bodies (openapi-python-client emits ``isinstance(body, list[float])``).
# CSV and float64 bytes are accepted all the same; the description and x-also-accepts say so.
UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "description": "The values as a JSON array of numbers. The same operation also accepts "
        "`text/csv` (pick the column with `?column=`) and `application/octet-stream` "
        "(little-endian float64 bytes), listed in `x-also-accepts`.",
        "content": {
            "application/json": {"schema": {"type": "array", "items": {"type": "number"}}},
        },
        "x-also-accepts": ["text/csv", "application/octet-stream"],
    }
}


@router.put(
    "/{dataset_id}/values",
    response_model=DatasetAdmin,
    responses=error_responses(401, 403, 404, 409, 413, 415, 422, 503),
    openapi_extra=UPLOAD_BODY,
    summary="Upload (replace) a dataset's values",
)
def upload_values(
    dataset_id: uuid.UUID,
    request: Request,
    session: SessionDep,
    principal: AdminDep,  # before the body: unauthenticated uploads are never read
    body: Annotated[bytes, Depends(upload_body)],
    column: Annotated[str | None, Query(max_length=200, description="CSV column name")] = None,
) -> DatasetPublic:
    """Replace the values atomically; any bad row rejects the whole upload (422)."""
    service.get_visible(session, principal=principal, dataset_id=dataset_id)
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    values = service.parse_values(body, media_type=media_type, column=column)
    dataset = service.store_values(
        session,
        principal=principal,
        dataset_id=dataset_id,
        values=values,
        max_values=request.app.state.settings.max_values,
    )
    return present(session, dataset, principal)

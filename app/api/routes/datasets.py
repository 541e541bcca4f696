"""Dataset endpoints: create, list, read, rename, archive, upload values."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from app.api.deps import AdminDep, ReaderDep, SessionDep
from app.api.http import DecimalJSONRoute, decode_cursor, encode_cursor
from app.core.amounts import AmountPublic, Budget
from app.core.errors import error_responses
from app.core.principal import Principal
from app.datasets import service
from app.datasets.models import Dataset
from app.datasets.schemas import (
    ColumnPublic,
    DatasetAdmin,
    DatasetCreate,
    DatasetPage,
    DatasetPublic,
    DatasetUpdate,
)
from app.ledger import zcdp
from app.ledger.service import add_grant, budget, budgets, grant_amount

router = APIRouter(prefix="/v1/datasets", tags=["datasets"], route_class=DecimalJSONRoute)


def present(
    session: SessionDep, dataset: Dataset, principal: Principal, figures: Budget | None = None
) -> DatasetPublic:
    """The view of ``dataset`` this key may see: admins get the sizes and upload state; other
    roles get n only under ``swap``, where it is public."""
    if figures is None:
        figures = budget(session, dataset_id=dataset.id)
    remaining = AmountPublic.of(zcdp.remaining(figures))
    public = DatasetPublic(
        id=dataset.id,
        name=dataset.name,
        description=dataset.description,
        lower=dataset.lower,
        upper=dataset.upper,
        neighbors=dataset.neighbors,
        granularity=dataset.granularity,
        size_hint=dataset.size_hint,
        n=dataset.n if dataset.neighbors == "swap" else None,
        columns=[
            ColumnPublic(
                name=c.name,
                type=c.type,
                lower=c.lower,
                upper=c.upper,
                granularity=c.granularity,
                keys=c.keys,
            )
            for c in dataset.columns
        ],
        privacy_unit=dataset.privacy_unit,
        accounting="zcdp" if dataset.accounting == "zcdp" else "pure",
        accounting_delta=dataset.accounting_delta,
        max_rows_per_unit=dataset.max_rows_per_unit,
        max_groups_per_unit=dataset.max_groups_per_unit,
        budget_remaining=remaining,
        restore_hold_since=dataset.restore_hold_since,
        created_at=dataset.created_at,
        archived_at=dataset.archived_at,
    )
    if principal.role != "admin":
        return public
    return DatasetAdmin(
        **(public.model_dump() | {"n": dataset.n}),
        n_outside_bounds=dataset.n_outside,
        n_cells=dataset.n_cells,
        values_skipped=dataset.values_skipped,
        rows_dropped=dataset.rows_dropped,
        units=dataset.units,
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
    dataset = service.create_dataset(session, body=body, actor=principal)
    added = grant_amount(
        dataset, epsilon=body.epsilon, delta=body.delta, rho=body.rho or Decimal(0), initial=True
    )
    if added.epsilon > 0 or added.delta > 0 or added.rho > 0:
        add_grant(
            session,
            dataset_id=dataset.id,
            epsilon=added.epsilon,
            delta=added.delta,
            rho=added.rho,
            reason="initial budget",
            api_key_id=principal.key_id,
            actor=principal,
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


@router.patch(
    "/{dataset_id}",
    response_model=DatasetAdmin,
    responses=error_responses(401, 403, 404, 409, 422, 503),
    summary="Rename, re-describe or set the size hint of a dataset",
)
def update_dataset(
    dataset_id: uuid.UUID, body: DatasetUpdate, session: SessionDep, principal: AdminDep
) -> DatasetPublic:
    """Change the name, description and/or public size hint (409 `name_taken`, 409
    `dataset_archived`)."""
    dataset = service.update_dataset(
        session,
        principal=principal,
        dataset_id=dataset_id,
        name=body.name,
        description=body.description,
        size_hint=body.size_hint,
        set_size_hint="size_hint" in body.model_fields_set,
    )
    return present(session, dataset, principal)


@router.delete(
    "/{dataset_id}",
    status_code=204,
    response_class=Response,
    responses=error_responses(401, 403, 404, 422, 503),
    summary="Archive a dataset (values deleted; ledger and releases kept; name freed)",
)
def archive_dataset(dataset_id: uuid.UUID, session: SessionDep, principal: AdminDep) -> Response:
    """Delete the values and archive the dataset: its ledger, budget and releases stay
    readable, uploads and queries answer 409 `dataset_archived`, its name may be reused."""
    service.archive_dataset(session, principal=principal, dataset_id=dataset_id)
    return Response(status_code=204)

"""Budget endpoints: read the budget (free, ETag), add grants, page through the ledger."""

from __future__ import annotations

import functools
import uuid
from decimal import Decimal
from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, Query, Request, Response

from app.api.deps import AdminDep, ReaderDep, SessionDep
from app.api.http import DecimalJSONRoute, conditional_json, decode_cursor, encode_cursor
from app.core.amounts import Amount
from app.core.errors import error_responses, not_found
from app.core.pg import run_async
from app.datasets.service import ensure_live, get_visible
from app.ledger import service
from app.ledger.schemas import (
    TYPICAL_EPSILON,
    BudgetPublic,
    GrantCreate,
    LedgerEntryPublic,
    LedgerPage,
    RestoreConfirmation,
)

router = APIRouter(prefix="/v1/datasets", tags=["budget"], route_class=DecimalJSONRoute)


@router.get(
    "/{dataset_id}/budget",
    response_model=BudgetPublic,
    responses=error_responses(304, 401, 403, 404, 422, 503),
    summary="Read a dataset's budget (free; supports If-None-Match)",
)
async def get_budget(
    dataset_id: uuid.UUID,
    request: Request,
    principal: ReaderDep,
    epsilon: Annotated[
        Decimal,
        Query(
            gt=0,
            le=1000,
            max_digits=40,
            decimal_places=30,
            description="The epsilon of the typical query `releases_left` counts (JointExp).",
        ),
    ] = TYPICAL_EPSILON,
) -> Response:
    """The budget by the table's accounting: granted, spent and remaining (epsilon, delta)
    (``spent`` is the sum of the debits), the guarantee so far, rho in a zCDP table, and how
    many releases of a typical query are left."""
    figures = await run_async(
        request.app.state.pg_pool,
        functools.partial(service.read_budget, dataset_id=dataset_id),
        idempotent=True,
    )
    if figures is None or not principal.can_see(dataset_id):
        raise not_found("dataset")
    view = functools.partial(BudgetPublic.of, dataset_id, figures, typical=epsilon)
    # a zCDP guarantee is a numerical conversion (cached): off the event loop
    body = await anyio.to_thread.run_sync(view) if figures.accounting == "zcdp" else view()
    return conditional_json(request, body)


@router.post(
    "/{dataset_id}/grants",
    status_code=201,
    response_model=LedgerEntryPublic,
    responses=error_responses(401, 403, 404, 409, 422, 503),
    summary="Add epsilon and/or delta to a dataset's budget",
)
def create_grant(
    dataset_id: uuid.UUID, body: GrantCreate, session: SessionDep, principal: AdminDep
) -> LedgerEntryPublic:
    """Append a grant row to the ledger (budgets only ever grow by grants)."""
    # Lock the dataset row so a grant serialises with concurrent releases.
    dataset = get_visible(session, principal=principal, dataset_id=dataset_id, for_update=True)
    ensure_live(dataset)
    added = service.grant_amount(dataset, epsilon=body.epsilon, delta=body.delta, rho=body.rho)
    entry = service.add_grant(
        session,
        dataset_id=dataset_id,
        epsilon=added.epsilon,
        delta=added.delta,
        rho=added.rho,
        reason=body.reason,
        api_key_id=principal.key_id,
        actor=principal,
    )
    return LedgerEntryPublic.model_validate(entry)


@router.post(
    "/{dataset_id}/restore-confirmation",
    response_model=BudgetPublic,
    responses=error_responses(401, 403, 404, 409, 422, 503),
    summary="Confirm a restored dataset's spending since the backup and lift its hold",
)
def confirm_restore(
    dataset_id: uuid.UUID, body: RestoreConfirmation, session: SessionDep, principal: AdminDep
) -> BudgetPublic:
    """After `dpquant restore`, every dataset's releases are refused (409 `budget_on_hold`):
    releases made after the backup are not in the restored ledger. Give what they spent (an
    `adjustment` ledger row; zero when there were none) to lift the hold."""
    dataset = get_visible(session, principal=principal, dataset_id=dataset_id, for_update=True)
    ensure_live(dataset)
    spent = Amount(body.epsilon, body.delta, body.rho)
    service.confirm_restore(
        session, dataset=dataset, spent=spent, reason=body.reason, principal=principal
    )
    return BudgetPublic.of(dataset_id, service.budget(session, dataset_id=dataset_id))


@router.get(
    "/{dataset_id}/ledger",
    response_model=LedgerPage,
    responses=error_responses(401, 403, 404, 422, 503),
    summary="Page through a dataset's ledger, newest first",
)
def list_ledger(
    dataset_id: uuid.UUID,
    request: Request,
    session: SessionDep,
    principal: AdminDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> LedgerPage:
    """Grants and debits, newest first; ``next_cursor`` fetches the next (older) page."""
    get_visible(session, principal=principal, dataset_id=dataset_id)
    limit = min(limit, request.app.state.settings.max_page_size)
    rows = service.list_entries(
        session, dataset_id=dataset_id, before=decode_cursor(cursor), limit=limit + 1
    )
    items = [LedgerEntryPublic.model_validate(r) for r in rows[:limit]]
    next_cursor = encode_cursor(rows[limit - 1].id) if len(rows) > limit else None
    return LedgerPage(items=items, next_cursor=next_cursor)

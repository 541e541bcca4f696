"""Analyst and dashboard endpoints: ask for quantiles, read releases."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from datetime import UTC, datetime
from typing import Annotated

import psycopg
from fastapi import APIRouter, Header, Query, Request, Response
from psycopg_pool import PoolTimeout

from app.api.deps import AnalystDep, ReaderDep, SessionDep
from app.api.http import (
    DecimalJSONRoute,
    conditional_json,
    decode_item_cursor,
    encode_item_cursor,
    etag_of,
    json_bytes,
)
from app.api.middleware.concurrency import ADMISSION_RELEASE
from app.core.amounts import AmountPublic
from app.core.db import CommitOutcomeUnknown
from app.core.errors import ErrorBody, error_responses, outcome_unknown
from app.core.principal import Principal
from app.mechanisms import MECHANISMS
from app.releases import planning, service
from app.releases.schemas import (
    BudgetExhausted,
    ExpectedError,
    GroupError,
    KeyBudgetExhausted,
    MethodPublic,
    QuantileQuery,
    QuoteFigures,
    QuotePublic,
    ReleasePage,
    ReleasePublic,
)
from app.releases.waiter import Watch, wait_until

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/v1", tags=["releases"], route_class=DecimalJSONRoute)


def present(
    release: service.ReleaseRecord, principal: Principal, now: datetime | None = None
) -> ReleasePublic:
    """The form of a stored release ``principal`` may see at ``now`` (default: the current
    time): a non-admin sees it finished only from its publication time on
    (:func:`service.published_view`). Deterministic: same row, same reader, same side of the
    publication time, same bytes. Validated from plain values in one pass (releases are
    answered and polled on the hot path)."""
    release = service.published_view(
        release, admin=principal.role == "admin", now=now or datetime.now(UTC)
    )
    groups = None
    estimates = release.estimates
    if release.group_keys is not None:
        m = len(release.quantiles)
        keys: list[str] | None = None
        if isinstance(release.group_keys, dict):  # discovered: the selection's keys, once run
            keys = release.selected_keys if estimates is not None else None
        else:
            keys = release.group_keys
        hinted = {
            row["key"]: {
                "size": row["size"],
                "mean": row["mean"],
                "bound90": row["bound90"],
                "bound90_each": row.get("bound90_each"),
                "bound90_each_atom": row.get("bound90_each_atom"),
            }
            for row in (release.group_error or {}).get("by_key") or []
        }
        bars = release.intervals if estimates is not None else None
        groups = (
            None
            if keys is None
            else [
                {"key": key,
                 "estimates": None if estimates is None else estimates[i * m : i * m + m],
                 "expected_error": hinted.get(key),
                 "intervals": None if bars is None or i >= len(bars) else bars[i]}
                for i, key in enumerate(keys)
            ]
        )  # fmt: skip
        estimates = None
    return ReleasePublic.model_validate(
        {
            "id": release.id,
            "dataset_id": release.dataset_id,
            "status": release.status,
            "method": release.method,
            "column": release.column_name,
            "quantiles": release.quantiles,
            "estimates": estimates,
            "failure": release.failure,
            "epsilon": release.epsilon,
            "delta": release.delta,
            "cost": {"epsilon": release.cost_epsilon, "delta": release.cost_delta},
            "remaining": None
            if release.remaining_epsilon is None or release.remaining_delta is None
            else {"epsilon": release.remaining_epsilon, "delta": release.remaining_delta},
            "rho": None
            if release.remaining_rho is None
            else {"cost": release.cost_rho, "remaining": release.remaining_rho},
            "created_at": release.created_at,
            "finished_at": release.finished_at,
            "expected_error": release.expected_error,
            "intervals": release.intervals
            if release.estimates is not None and release.group_keys is None
            else None,
            "warnings": release.warnings or [],
            "data_version": release.data_version,
            "group_by": release.group_by,
            "groups": groups,
            "group_error": release.group_error,
            "selection": release.group_keys.get("discover")
            if isinstance(release.group_keys, dict)
            else None,
        }
    )


def _expected(rows: list[dict[str, float]] | None) -> list[ExpectedError] | None:
    return None if rows is None else [ExpectedError(**row) for row in rows]


def _figures(line: planning.QuoteLine) -> QuoteFigures:
    return QuoteFigures(
        method=line.method,
        cost=AmountPublic.of(line.cost),
        remaining_after=None
        if line.remaining_after is None
        else AmountPublic.of(line.remaining_after),
        affordable=line.affordable,
        expected_error=_expected(line.expected),
        rho=line.cost.rho if line.zcdp else None,
        releases_left=line.releases_left,
        group_error=None
        if line.group_error is None
        else GroupError.model_validate(line.group_error),
    )


QUERY_ERRORS = error_responses(401, 403, 404, 422, 503) | {
    202: {
        "model": ReleasePublic,
        "description": "Accepted: the release is reserved and paid, its mechanism has not "
        "answered yet (`Prefer: respond-async`, or a synchronous wait that ran out). Poll "
        "`Location` until `status` is `done` or `failed`.",
        "headers": {"Location": {"description": "/v1/releases/{id}", "schema": {"type": "string"}}},
    },
    409: {
        "model": BudgetExhausted | KeyBudgetExhausted | ErrorBody,
        "description": "budget_exhausted (with the requested and remaining figures), "
        "key_budget_exhausted (the key's cap, spent and requested figures), "
        "idempotency_conflict, no_values, budget_on_hold (restored from a backup: an admin "
        "must confirm the spending since), or dataset_archived",
    },
    429: {
        "model": ErrorBody,
        "description": "too_many_pending: the key or the dataset already has the most "
        "releases waiting to run that the service allows (nothing reserved or debited; "
        "Retry-After), or rate_limited",
        "headers": {"Retry-After": {"description": "seconds", "schema": {"type": "string"}}},
    },
}


def parse_prefer(header: str | None) -> tuple[bool, float | None]:
    """``respond-async`` and ``wait=N`` from a ``Prefer`` header (RFC 7240)."""
    if not header:
        return False, None
    respond_async, wait = False, None
    for item in header.split(","):
        token = item.split(";")[0].strip()
        name, _, value = token.partition("=")
        name = name.strip().lower()
        if name == "respond-async":
            respond_async = True
        elif name == "wait":
            try:
                wait = max(0.0, float(value.strip().strip('"')))
            except ValueError:
                continue
    return respond_async, wait


def _release_admission(request: Request) -> None:
    hook = request.scope.get(ADMISSION_RELEASE)
    if callable(hook):
        hook()


@router.post(
    "/datasets/{dataset_id}/quantiles",
    status_code=201,
    response_model=ReleasePublic,
    responses=QUERY_ERRORS,
    summary="Release differentially private quantiles (debits the budget)",
)
async def create_release(
    dataset_id: uuid.UUID,
    body: QuantileQuery,
    request: Request,
    principal: AnalystDep,
    idempotency_key: Annotated[
        str | None,
        Header(
            min_length=1,
            max_length=255,
            description="Retry-safe key: the same key and body return (or wait for) the "
            "original release without a new debit; a failed release is final.",
        ),
    ] = None,
    prefer: Annotated[
        str | None,
        Header(
            max_length=200,
            description="`respond-async` answers 202 at once; `wait=N` bounds a synchronous "
            "wait to N seconds (then 202).",
        ),
    ] = None,
) -> Response:
    """Reserve and pay for the release, then wait for its mechanism run (or answer 202).

    201: the release finished (`done` with estimates, or `failed`, still charged). 202: it is
    reserved and paid and still running; poll `Location`. Refusals (409) never run a
    mechanism and read no data value.
    """
    settings = request.app.state.settings
    planning.check_min_epsilon(body, settings.min_epsilon)
    hub = request.app.state.completion_hub
    new_id = uuid.uuid4()  # a new release's id, watched before its reservation commits
    with hub.watch(new_id) as watching:
        try:
            outcome = await service.reserve_release(
                request.app.state.pg_pool,
                principal=principal,
                dataset_id=dataset_id,
                query=body,
                idempotency_key=idempotency_key,
                max_quantiles=settings.max_quantiles,
                max_runs=settings.max_runs,
                release_id=new_id,
                figures=request.app.state.plan_figures,
                caps=service.PendingCaps(
                    settings.max_pending_per_key, settings.max_pending_per_dataset
                ),
                limits=planning.RunLimits.of(settings),
            )
        except CommitOutcomeUnknown:
            raise outcome_unknown(idempotency_key is not None) from None
        return await _answer(request, outcome, prefer, principal, watching, new_id)


async def _answer(
    request: Request,
    outcome: service.Outcome,
    prefer: str | None,
    principal: Principal,
    watching: Watch,
    new_id: uuid.UUID,
) -> Response:
    """The response to a reservation: wait for the run (or not), then present the release."""
    settings = request.app.state.settings
    release = outcome.release
    respond_async, wait_s = parse_prefer(prefer)
    timeout = settings.sync_wait_s if wait_s is None else min(wait_s, settings.sync_wait_s)
    wait_end = time.monotonic() + timeout
    if not service.is_finished(release) and not respond_async:
        # Paid and queued: wait for the worker holding nothing (no thread, connection, lock
        # or admission slot).
        _release_admission(request)
        pool = request.app.state.pg_pool

        async def read() -> service.ReleaseRecord:
            return await service.get_release(pool, principal=principal, release_id=reserved.id)

        reserved = release
        new = release.id == new_id  # watched since before it existed (a replay was not)
        try:
            release = await wait_until(
                request.app.state.completion_hub,
                release.id,
                read=read,
                finished=service.is_finished,
                timeout_s=timeout,
                watching=watching if new else None,
                # the announced outcome completes the reserved release without a re-read
                complete=(lambda outcome: service.with_outcome(reserved, outcome)) if new else None,
            )
        except (psycopg.Error, PoolTimeout):
            # The release is reserved and paid whatever happens now: say so (202 + Location)
            # rather than a 503 that would invite a retry without the key.
            logger.warning("lost the database while waiting for release %s", release.id)
    if not respond_async:
        await _hold_until_published(release, principal, wait_end)
    content = json_bytes(present(release, principal))
    headers = {"Location": f"/v1/releases/{release.id}", "ETag": etag_of(content)}
    if outcome.replayed:
        headers["Idempotent-Replayed"] = "true"
    if respond_async:
        headers["Preference-Applied"] = "respond-async"
    status_code = (
        201
        if service.is_finished(
            service.published_view(release, admin=principal.role == "admin", now=datetime.now(UTC))
        )
        else 202
    )
    return Response(
        content, status_code=status_code, media_type="application/json", headers=headers
    )


async def _hold_until_published(
    release: service.ReleaseRecord, principal: Principal, wait_end: float
) -> None:
    """Hold a finished release's answer until its publication time, if that comes before the
    synchronous wait ends: a non-admin's status (201 or 202) and response time
    then follow the public bound, not the run. Admins see releases as stored: no hold."""
    if principal.role == "admin":
        return
    published = service.visible_at(release)
    if published is None:
        return
    # asyncio may wake a timer up to its clock's resolution early: sleep until the
    # publication time has passed by the reader's own clock (the one present() uses)
    while (left := (published - datetime.now(UTC)).total_seconds()) >= 0.0:
        rest = wait_end - time.monotonic()
        if left > rest:
            # the wait ends first: answer 202 (pending) when it ends, as for a run that is
            # still going — answering at once would tell that the run has finished
            if rest > 0.0:
                await asyncio.sleep(rest)
            return
        await asyncio.sleep(left + 0.001)


@router.get(
    "/releases/{release_id}",
    response_model=ReleasePublic,
    responses=error_responses(304, 401, 403, 404, 422, 503),
    summary="Read a release (free; supports If-None-Match)",
)
async def get_release(release_id: uuid.UUID, request: Request, principal: ReaderDep) -> Response:
    """A stored release, byte-identical to the response that created it."""
    release = await service.get_release(
        request.app.state.pg_pool, principal=principal, release_id=release_id
    )
    return conditional_json(request, present(release, principal))


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
        after=decode_item_cursor(cursor),
        limit=limit + 1,
    )
    next_cursor = encode_item_cursor(rows[limit - 1].id) if len(rows) > limit else None
    now = datetime.now(UTC)
    page = ReleasePage(
        items=[present(r, principal, now) for r in rows[:limit]], next_cursor=next_cursor
    )
    return conditional_json(request, page)


@router.post(
    "/datasets/{dataset_id}/quote",
    response_model=QuotePublic,
    responses=error_responses(401, 403, 404, 409, 422, 503),
    summary="Quote a quantile query: exact cost, affordability, expected error (free)",
)
def quote(
    dataset_id: uuid.UUID,
    body: QuantileQuery,
    request: Request,
    session: SessionDep,
    principal: AnalystDep,
) -> Response:
    """The body of `POST /quantiles`; answers what that release would debit (the same
    pricing code), whether it fits the remaining budget (and the key's cap), the expected
    error per quantile in missed points, and the same figures for every eligible method.
    Free: moves no budget, reads no data value, depends on public figures only."""
    planning.check_min_epsilon(body, request.app.state.settings.min_epsilon)
    result = planning.quote_query(
        session,
        principal=principal,
        dataset_id=dataset_id,
        query=body,
        max_quantiles=request.app.state.settings.max_quantiles,
        limits=planning.RunLimits.of(request.app.state.settings),
    )
    chosen = _figures(result.chosen)
    public = QuotePublic(
        **chosen.model_dump(),
        warnings=result.warnings,
        alternatives=[_figures(a) for a in result.alternatives],
    )
    return Response(json_bytes(public), media_type="application/json")


@router.get(
    "/methods",
    response_model=list[MethodPublic],
    responses=error_responses(503),
    summary="List the registered methods and their guarantees (no key needed)",
)
def list_methods() -> list[MethodPublic]:
    """Every registered method: guarantee, neighbour relations, whether it needs delta, and
    a one-line description (from the mechanism registry). `auto` is not a method but a
    choice among these (see `POST /v1/datasets/{id}/quote`). Public like the OpenAPI
    document, which lists the same names: the dashboard reads it before signing in."""
    return [
        MethodPublic(
            name=m.name,
            guarantee=m.notion.value,
            neighbors=list(m.neighbors),
            needs_delta=m.uses_delta,
            description=m.summary,
            zcdp=m.zcdp_basis if m.zcdp_fn is not None else None,
        )
        for m in MECHANISMS.values()
    ]

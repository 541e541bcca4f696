"""Releases: reserve, then sample (DESIGN.md section 3).

A release is a small state machine stored in PostgreSQL: ``pending -> done | failed``.

1. **Reservation** (:func:`reserve_release`): one call of the ``release_reserve()``
   function (migration 0008), which locks the dataset row, looks the ``Idempotency-Key`` up,
   checks the key's cap and the budget from the balance row, inserts the release as
   ``pending`` together with the debit of its full cost and freezes the dataset, as one
   statement and one transaction. Nothing here reads a data value, so every refusal (404,
   409, 422) depends on public figures only and takes the same time whatever the size of
   the dataset.
2. **Run** (:mod:`app.releases.runner`, in a worker process): the mechanism runs outside any
   transaction on the frozen values; its snapped estimates are stored with ``done`` in a
   second transaction, or the release is marked ``failed``.

Every mechanism run is therefore paid before it starts, refusals never start one, and a
failure keeps its debit: whether a run fails, and when, may depend on the data, so a failure
is itself an observable outcome of the mechanism and is charged like one. A failed release
is final: a retry with the same key returns it (migration 0011; resuming it until a run
finished in time would release an output conditioned on its own run time). A ``pending``
release whose worker died runs again, up to ``max_runs`` runs in all. Non-admin readers see
a release finished from its publication time on (:mod:`app.releases.schedule`).

The ledger cannot be overspent even by code that forgets the lock: the balance row's CHECK
constraint refuses an overdraft inside PostgreSQL (migration 0003). Per-key caps are checked
under the dataset lock and the key's row lock, and defended the same way: the ledger trigger
adds each debit to its key's spent columns and ``ck_api_key_key_cap`` refuses a debit over
the cap (migration 0005).
"""

from __future__ import annotations

import dataclasses
import functools
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core import tracing
from app.core.amounts import Amount, AmountPublic, plain_decimal
from app.core.errors import DpquantError, invalid, not_found
from app.core.metrics import RELEASES, RESERVATIONS
from app.core.pg import HotPool, run_async
from app.core.principal import Principal
from app.datasets.service import get_visible
from app.releases.models import DONE, FAILED, PENDING, Release
from app.releases.planning import (
    FiguresCache,
    Plan,
    PublicFigures,
    RunLimits,
    plan_query,
    price_query,
)
from app.releases.schemas import AUTO, KeyCap, QuantileQuery

#: Channel on which PostgreSQL announces a runnable release (trigger ``release_notify``,
#: migration 0003; payload: the release id).
PENDING_CHANNEL = "dpquant_release_pending"
#: Channel on which PostgreSQL announces a finished release (same trigger).
FINISHED_CHANNEL = "dpquant_release_finished"


@dataclass(frozen=True, slots=True)
class ReleaseRecord:
    """A stored release as readers see it (the row's public columns), detached from any
    session; equal rows give equal records and the same response bytes."""

    id: uuid.UUID
    seq: int
    dataset_id: uuid.UUID
    method: str
    quantiles: list[float]
    estimates: list[float] | None
    epsilon: Decimal
    delta: Decimal | None
    cost_epsilon: Decimal
    cost_delta: Decimal
    remaining_epsilon: Decimal | None
    remaining_delta: Decimal | None
    created_at: datetime
    status: str
    failure: str | None
    finished_at: datetime | None
    expected_error: list[dict[str, float]] | None
    warnings: list[str]
    #: When non-admin readers may see the outcome (None while pending; see
    #: :mod:`app.releases.schedule`).
    published_at: datetime | None = None
    #: The data version the run loaded (None until done, and for failed releases).
    data_version: int | None = None
    #: The column the release reads.
    column_name: str = "value"
    #: The rho debited (0 in a pure table) and, in a zCDP table, the rho left after it.
    cost_rho: Decimal = Decimal(0)
    remaining_rho: Decimal | None = None
    #: A grouped release: its categorical column, keys (``estimates`` holds m per key, in
    #: this order) and expected error by group size.
    group_by: str | None = None
    group_keys: list[str] | dict[str, Any] | None = None
    group_error: dict[str, Any] | None = None
    #: ``"keys": "discover"``: the keys the selection kept (None until done)
    selected_keys: list[str] | None = None
    #: Error bars (None until done or unformed); grouped: one entry per group (None: no hint)
    intervals: list[Any] | None = None

    @classmethod
    def of(cls, row: Mapping[str, Any] | Release) -> ReleaseRecord:
        """The record of a row mapping (or of an ORM ``Release``)."""
        if isinstance(row, Release):
            return cls(**{name: getattr(row, name) for name in RECORD_COLUMNS})
        return cls(**{name: row[name] for name in RECORD_COLUMNS})


#: The columns a :class:`ReleaseRecord` holds, in order.
RECORD_COLUMNS = tuple(field.name for field in dataclasses.fields(ReleaseRecord))
_SELECT_RECORD = f"SELECT {', '.join(RECORD_COLUMNS)} FROM release"


@dataclass(frozen=True)
class Outcome:
    """A release and whether it was replayed from an earlier request with the same key."""

    release: ReleaseRecord
    replayed: bool


def budget_refusal(remaining: Amount, cost: Amount, *, zcdp: bool = False) -> DpquantError:
    """409 ``budget_exhausted`` with the budget figures and nothing else (in a zCDP table,
    the rho asked and left too)."""
    extra: dict[str, object] = {
        "requested": AmountPublic.of(cost).model_dump(mode="json"),
        "remaining": AmountPublic.of(remaining).model_dump(mode="json"),
    }
    if zcdp:
        extra["requested_rho"] = plain_decimal(cost.rho)
        extra["remaining_rho"] = plain_decimal(remaining.rho)
        short = [("rho", cost.rho, remaining.rho)]
    else:
        short = [
            (name, asked, left)
            for name, asked, left in (
                ("epsilon", cost.epsilon, remaining.epsilon),
                ("delta", cost.delta, remaining.delta),
            )
            if asked > left
        ]
    why = "; ".join(
        f"its {name} {plain_decimal(asked)} exceeds the {plain_decimal(max(left, Decimal(0)))} left"
        for name, asked, left in short
    )
    detail = "the query costs more than the remaining budget" + (f": {why}" if why else "")
    return DpquantError(409, "budget_exhausted", detail, extra=extra)


def key_cap_refusal(cap: KeyCap, spent: Amount, cost: Amount) -> DpquantError:
    """409 ``key_budget_exhausted`` with the calling key's figures only."""
    return DpquantError(
        409,
        "key_budget_exhausted",
        "the query costs more than this API key may still spend",
        extra={
            "cap": cap.model_dump(mode="json"),
            "spent": AmountPublic.of(spent).model_dump(mode="json"),
            "requested": AmountPublic.of(cost).model_dump(mode="json"),
        },
    )


_RESERVE = (
    "SELECT outcome, release_id, seq, created_at, left_epsilon, left_delta, cap_epsilon,"
    " cap_delta, spent_epsilon, spent_delta, neighbors, public_size, left_rho, accounting"
    " FROM release_reserve(%s::uuid, %s::uuid, %s::uuid, %s::varchar,"
    " %s::double precision[], %s::numeric, %s::numeric, %s::numeric, %s::numeric,"
    " %s::varchar, %s::varchar, %s::jsonb, %s::jsonb, %s::varchar, %s::bigint, %s::integer,"
    " %s::integer, %s::integer, %s::varchar, %s::numeric, %s::varchar, %s::varchar,"
    " %s::varchar, %s::jsonb, %s::jsonb)"
)

#: ``release_reserve()`` outcomes that refuse the query, as (status, type, detail).
_REFUSALS = {
    "not_found": None,
    "idempotency_conflict": (
        "idempotency_conflict",
        "this Idempotency-Key was already used with a different request body",
    ),
    "dataset_archived": (
        "dataset_archived",
        "this dataset is archived: its ledger and releases can be read, nothing else",
    ),
    "no_values": ("no_values", "this dataset has no values yet"),
    "no_group_values": (
        "no_group_values",
        "this table's per-key values for group_by were not built: its values came as a "
        "histogram (PUT /histogram or dpquant ingest), which carries no keys; upload rows",
    ),
    "budget_on_hold": (
        "budget_on_hold",
        "this service's database was restored from a backup: releases made after the backup "
        "are not in its ledger, so this dataset's budget is held until an admin confirms what "
        "was spent since (POST /v1/datasets/{id}/restore-confirmation)",
    ),
}


@dataclass(frozen=True, slots=True)
class PendingCaps:
    """How many releases a key, and a dataset, may have waiting to run (0: no cap)."""

    key: int = 0
    dataset: int = 0


#: The queue caps' refusals: 429, retry once some of the pending releases have run.
_QUEUE_FULL = {
    "too_many_pending_key": "this key already has the most releases waiting to run that "
    "this service allows (DPQUANT_MAX_PENDING_PER_KEY); retry when some have finished",
    "too_many_pending_dataset": "this dataset already has the most releases waiting to run "
    "that this service allows (DPQUANT_MAX_PENDING_PER_DATASET); retry when some have "
    "finished",
}

#: Planning rounds before giving up (each ``replan`` means the figures changed meanwhile).
_PLAN_ROUNDS = 4

Pool = HotPool


async def reserve_release(
    pool: Pool,
    *,
    principal: Principal,
    dataset_id: uuid.UUID,
    query: QuantileQuery,
    idempotency_key: str | None,
    max_quantiles: int,
    max_runs: int,
    release_id: uuid.UUID | None = None,
    figures: FiguresCache | None = None,
    caps: PendingCaps = PendingCaps(),
    limits: RunLimits | None = None,
) -> Outcome:
    """Reserve and pay for a release in one ``release_reserve()`` call (migration 0008).

    Returns the new ``pending`` release, or the earlier release with the same key and body
    (as it stands: a failed release is final). ``release_id`` is the id a *new* release gets
    (a fresh random one when None): a caller that wants to hear of its completion can listen
    for it before the reservation commits. Reads no data value.

    The query is planned on the dataset's public figures (from ``figures``, the process's
    guess, or from the database); the function checks them under the dataset lock and asks
    for another plan when they changed, so the debit is always priced on the figures the
    lock saw. Refusals (409) are counted by method.
    """
    if not principal.can_see(dataset_id):
        raise not_found("dataset")
    if query.method != AUTO:
        price_query(query, max_quantiles=max_quantiles)  # 422 before the dataset lookup
    elif len(query.quantiles) > max_quantiles:
        raise invalid("body.quantiles", f"at most {max_quantiles} quantiles per query")
    new_id = uuid.uuid4() if release_id is None else release_id
    known = figures.get(dataset_id) if figures is not None else None
    with tracing.tracer().start_as_current_span(
        "release.reserve",
        attributes={"dpquant.release_id": str(new_id), "dpquant.dataset_id": str(dataset_id),
                    "dpquant.quantiles": len(query.quantiles)},
    ):  # fmt: skip
        for _ in range(_PLAN_ROUNDS):
            plan = (
                None
                if known is None
                else plan_query(query, figures=known, max_quantiles=max_quantiles, limits=limits)
            )
            params = _reserve_params(
                plan, known, new_id, dataset_id, principal, idempotency_key, max_runs, caps
            )

            row = await run_async(pool, functools.partial(_call_reserve, params=params))
            outcome = row["outcome"]
            if outcome == "replan":
                k, numeric, categorical, grids = await run_async(
                    pool, functools.partial(_table_figures, dataset_id=dataset_id)
                )
                known = PublicFigures(
                    row["neighbors"], row["public_size"], k, numeric, row["accounting"],
                    categorical, grids,
                )  # fmt: skip
                if figures is not None:
                    figures.put(dataset_id, known)
                continue
            if outcome == "not_found":
                raise not_found("dataset")
            if plan is None:  # pragma: no cover - without figures the function asks for a plan
                raise RuntimeError("reserved without a plan")
            return _outcome(row, plan, new_id, dataset_id, principal, idempotency_key)
    raise DpquantError(
        503,
        "database_unavailable",
        "the dataset's public figures kept changing; nothing was charged, retry",
        headers={"Retry-After": "1"},
    )


async def _table_figures(
    conn: psycopg.AsyncConnection[Any], *, dataset_id: uuid.UUID
) -> tuple[
    int,
    tuple[str, ...],
    tuple[tuple[str, tuple[str, ...] | None], ...],
    tuple[tuple[float, float, float], ...],
]:
    """The dataset's k, its numeric columns' names, its categorical columns (name, declared
    keys) and its numeric columns' grids: fixed at creation, so a process may keep them with
    its figures."""
    cursor = await conn.execute(
        "SELECT d.max_rows_per_unit, c.name, c.type, c.keys, c.lower, c.upper, c.granularity "
        "FROM dataset d "
        "LEFT JOIN dataset_column c ON c.dataset_id = d.id WHERE d.id = %s "
        "ORDER BY c.position",
        (dataset_id,),
    )
    rows = await cursor.fetchall()
    if not rows:
        return 1, (), (), ()
    numeric_rows = [r for r in rows if r[1] is not None and r[2] != "categorical"]
    numeric = tuple(r[1] for r in numeric_rows)
    grids = tuple(
        (float(r[4]), float(r[5]), float(r[6]))
        for r in numeric_rows
        if r[4] is not None and r[5] is not None and r[6]
    )
    categorical = tuple(
        (r[1], None if r[3] is None else tuple(r[3])) for r in rows if r[2] == "categorical"
    )
    return int(rows[0][0]), numeric, categorical, grids


async def _call_reserve(
    conn: psycopg.AsyncConnection[Any], *, params: tuple[Any, ...]
) -> dict[str, Any]:
    """One ``release_reserve()`` call (and, for a replay, the earlier release's row)."""
    cursor = conn.cursor(row_factory=dict_row)
    await cursor.execute(_RESERVE, params)
    row = await cursor.fetchone()
    if row is None:  # pragma: no cover - the function always returns one row
        raise RuntimeError("release_reserve() returned no row")
    if row["outcome"] == "replayed":
        await cursor.execute(_SELECT_RECORD + " WHERE id = %s", (row["release_id"],))
        row["release"] = await cursor.fetchone()
    return row


def _reserve_params(
    plan: Plan | None,
    known: PublicFigures | None,
    new_id: uuid.UUID,
    dataset_id: uuid.UUID,
    principal: Principal,
    idempotency_key: str | None,
    max_runs: int,
    caps: PendingCaps,
) -> tuple[Any, ...]:
    """``release_reserve()``'s arguments; without a plan, figures the function never matches
    (an unknown neighbour relation), so it answers ``replan`` with the dataset's own."""
    if plan is None or known is None:
        return (new_id, dataset_id, principal.key_id, "", [], 0, None, 0, 0, idempotency_key,
                "", None, None, "", None, max_runs, caps.key, caps.dataset, "", 0, "",
                None, None, None, None)  # fmt: skip
    cost = plan.priced.cost
    return (
        new_id,
        dataset_id,
        principal.key_id,
        plan.priced.mechanism.name,
        [float(q) for q in plan.query.quantiles],
        plan.query.epsilon,
        plan.query.delta,
        cost.epsilon,
        cost.delta,
        idempotency_key,
        plan.fingerprint,
        None if plan.expected is None else Jsonb(plan.expected),
        Jsonb(plan.warnings),
        known.neighbors,
        known.size,
        max_runs,
        caps.key,
        caps.dataset,
        plan.column,
        cost.rho,
        known.accounting,
        tracing.current_traceparent(),
        None if plan.grouping is None else plan.grouping.group_by,
        None if plan.grouping is None else Jsonb(plan.grouping.stored_keys()),
        None if plan.group_error is None else Jsonb(plan.group_error),
    )


def _outcome(
    row: Mapping[str, Any],
    plan: Plan,
    new_id: uuid.UUID,
    dataset_id: uuid.UUID,
    principal: Principal,
    idempotency_key: str | None,
) -> Outcome:
    """The reservation's result, or the refusal it stands for (raised)."""
    outcome = row["outcome"]
    method = plan.priced.mechanism.name
    cost = plan.priced.cost
    if outcome == "reserved":
        RESERVATIONS.labels(method).inc()
        left = Amount(row["left_epsilon"], row["left_delta"], row["left_rho"]).minus(cost)
        zcdp = row["accounting"] == "zcdp"
        return Outcome(
            ReleaseRecord(
                id=new_id,
                seq=int(row["seq"]),
                dataset_id=dataset_id,
                method=method,
                quantiles=[float(q) for q in plan.query.quantiles],
                estimates=None,
                epsilon=plan.query.epsilon,
                delta=plan.query.delta,
                cost_epsilon=cost.epsilon,
                cost_delta=cost.delta,
                remaining_epsilon=None if zcdp else left.epsilon,
                remaining_delta=None if zcdp else left.delta,
                created_at=row["created_at"],
                status="pending",
                failure=None,
                finished_at=None,
                expected_error=plan.expected,
                warnings=plan.warnings,
                published_at=None,
                column_name=plan.column,
                cost_rho=cost.rho,
                remaining_rho=left.rho if zcdp else None,
                group_by=None if plan.grouping is None else plan.grouping.group_by,
                group_keys=None if plan.grouping is None else plan.grouping.stored_keys(),
                group_error=plan.group_error,
            ),
            replayed=False,
        )
    if outcome == "replayed":
        return Outcome(ReleaseRecord.of(row["release"]), replayed=True)
    if outcome == "idempotency_conflict":
        raise DpquantError(409, *_REFUSALS[outcome])  # type: ignore[misc]
    RELEASES.labels(method, "refused").inc()
    if outcome == "budget_exhausted":
        left = Amount(row["left_epsilon"], row["left_delta"], row["left_rho"])
        raise budget_refusal(left, cost, zcdp=row["accounting"] == "zcdp")
    if outcome == "key_budget_exhausted":
        cap = KeyCap(epsilon=row["cap_epsilon"], delta=row["cap_delta"])
        raise key_cap_refusal(cap, Amount(row["spent_epsilon"], row["spent_delta"]), cost)
    if outcome in _QUEUE_FULL:
        raise DpquantError(
            429, "too_many_pending", _QUEUE_FULL[outcome], headers={"Retry-After": "1"}
        )
    refusal = _REFUSALS.get(outcome)
    if refusal is None:  # pragma: no cover - the function has no other outcome
        raise RuntimeError("unknown reservation outcome")
    raise DpquantError(409, *refusal)


async def get_release(pool: Pool, *, principal: Principal, release_id: uuid.UUID) -> ReleaseRecord:
    """A release inside the key's scope; 404 otherwise (one SELECT: releases are polled)."""

    async def read(conn: psycopg.AsyncConnection[Any]) -> dict[str, Any] | None:
        cursor = conn.cursor(row_factory=dict_row)
        await cursor.execute(_SELECT_RECORD + " WHERE id = %s", (release_id,))
        return await cursor.fetchone()

    row = await run_async(pool, read, idempotent=True)
    if row is None or not principal.can_see(row["dataset_id"]):
        raise not_found("release")
    return ReleaseRecord.of(row)


def list_releases(
    session: Session,
    *,
    principal: Principal,
    dataset_id: uuid.UUID,
    after: uuid.UUID | None,
    limit: int,
) -> list[ReleaseRecord]:
    """Releases of a dataset, newest first; with a cursor, those older than release
    ``after`` (the last one of the previous page), which must be one of this dataset's
    (422 ``query.cursor`` otherwise, whether or not it exists elsewhere)."""
    get_visible(session, principal=principal, dataset_id=dataset_id)
    stmt = select(Release).where(Release.dataset_id == dataset_id)
    if after is not None:
        seq = session.scalar(
            select(Release.seq).where(Release.id == after, Release.dataset_id == dataset_id)
        )
        if seq is None:
            raise invalid("query.cursor", "is not a cursor returned by this API")
        stmt = stmt.where(Release.seq < seq)
    rows = session.scalars(stmt.order_by(Release.seq.desc()).limit(limit))
    return [ReleaseRecord.of(r) for r in rows]


def with_outcome(release: ReleaseRecord, outcome: Mapping[str, Any]) -> ReleaseRecord | None:
    """``release`` (as reserved, in memory) finished as announced in ``outcome`` (see
    :mod:`app.releases.waiter`): the same values a re-read of the row gives, so the answer
    is byte-identical to a later GET. None when the announcement is not a finished outcome
    of this release (the caller then reads the row). A release whose keys were discovered
    is always read again (the announcement does not carry the keys the selection kept)."""
    if isinstance(release.group_keys, dict):
        return None
    try:
        if uuid.UUID(str(outcome["id"])) != release.id or outcome["status"] not in (DONE, FAILED):
            return None
        finished_at = datetime.fromisoformat(outcome["finished_at"]).replace(tzinfo=UTC)
        published_at = datetime.fromisoformat(outcome["published_at"]).replace(tzinfo=UTC)
        raw: Sequence[Any] | None = outcome["estimates"]
        estimates = None if raw is None else [float(x) for x in raw]
        failure = outcome["failure"]
        version = outcome.get("data_version")
        data_version = None if version is None else int(version)
        bars = outcome.get("intervals")
        intervals = None if bars is None else [_bars(bar, release.group_by) for bar in bars]
    except (KeyError, TypeError, ValueError):
        return None
    return dataclasses.replace(
        release,
        status=outcome["status"],
        failure=None if failure is None else str(failure),
        finished_at=finished_at,
        estimates=estimates,
        published_at=published_at,
        data_version=data_version,
        intervals=intervals,
    )


def _bars(entry: Any, group_by: str | None) -> Any:
    """One announced ``intervals`` entry: a bar, or a group's bars (None: no size hint)."""
    if group_by is None:
        return dict(entry)
    return None if entry is None else [dict(bar) for bar in entry]


def is_finished(release: ReleaseRecord) -> bool:
    """True once the release is ``done`` or ``failed`` (both final since migration 0011)."""
    return release.status in (DONE, FAILED)


def published_view(release: ReleaseRecord, *, admin: bool, now: datetime) -> ReleaseRecord:
    """The release as a reader sees it at ``now`` (:mod:`app.releases.schedule`).

    Admins see it as stored. Everyone else sees a finished release only from its publication
    time on, with that time as ``finished_at`` (never the run's finish time); before it, as
    pending (no estimates, no failure). A finished release without a publication time (none
    is stored only by hand) is published at its finish time."""
    if admin or release.status not in (DONE, FAILED):
        return release
    published = release.published_at or release.finished_at
    if published is None or now < published:
        return dataclasses.replace(
            release,
            status=PENDING,
            estimates=None,
            failure=None,
            finished_at=None,
            data_version=None,
            intervals=None,
        )
    return dataclasses.replace(release, finished_at=published)


def visible_at(release: ReleaseRecord) -> datetime | None:
    """When a non-admin reader first sees ``release`` finished (None while pending)."""
    if release.status not in (DONE, FAILED):
        return None
    return release.published_at or release.finished_at


__all__ = [
    "FINISHED_CHANNEL",
    "PENDING_CHANNEL",
    "Outcome",
    "ReleaseRecord",
    "get_release",
    "is_finished",
    "list_releases",
    "published_view",
    "reserve_release",
    "visible_at",
]

"""Releases: reserve, then sample (issue 8; DESIGN.md section 3).

A release is a small state machine stored in PostgreSQL: ``pending -> done | failed``.

1. **Reservation** (:func:`reserve_release`, one short transaction): lock the dataset row,
   look the ``Idempotency-Key`` up, check the budget from the balance row, insert the release
   as ``pending`` together with the debit of its full cost, freeze the dataset, commit. Nothing
   here reads a data value, so every refusal (404, 409, 422) depends on public figures only
   and takes the same time whatever the size of the dataset.
2. **Run** (:mod:`app.releases.runner`, in a worker process): the mechanism runs outside any
   transaction on the frozen values; its snapped estimates are stored with ``done`` in a
   second transaction, or the release is marked ``failed``.

Every mechanism run is therefore paid before it starts, refusals never start one, and a
failure keeps its debit: whether a run fails, and when, may depend on the data, so a failure
is itself an observable outcome of the mechanism and is charged like one. A retry with the
same key resumes a ``pending`` or ``failed`` release without a new debit (no output of it was
ever released), up to ``max_runs`` runs in all.

The ledger cannot be overspent even by code that forgets the lock: the balance row's CHECK
constraint refuses an overdraft inside PostgreSQL (migration 0003). Per-key caps are checked
in the same reservation transaction, under the dataset lock and the key's row lock, and
defended the same way: the ledger trigger adds each debit to its key's spent columns and
``ck_api_key_key_cap`` refuses a debit over the cap (migration 0005).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, localcontext
from typing import Any, cast

from sqlalchemy import Table, bindparam, select, text, update
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app import planner
from app.auth.models import ApiKey
from app.auth.principal import Principal
from app.datasets.models import Dataset
from app.datasets.service import ensure_live, get_visible
from app.errors import DpquantError, invalid, not_found
from app.ledger.schemas import AmountPublic
from app.ledger.service import (
    Amount,
    dataset_with_budget,
    mechanism_float,
    price,
)
from app.mechanisms import MECHANISMS, Mechanism, MechanismInputError, get_mechanism
from app.metrics import RELEASES, RESERVATIONS, count_on_commit
from app.releases.models import DONE, FAILED, PENDING, Release
from app.releases.schemas import AUTO, KeyCap, QuantileQuery

#: Channel on which PostgreSQL announces a runnable release (trigger ``release_notify``,
#: migration 0003; payload: the release id).
PENDING_CHANNEL = "dpquant_release_pending"
#: Channel on which PostgreSQL announces a finished release (same trigger).
FINISHED_CHANNEL = "dpquant_release_finished"


@dataclass(frozen=True)
class Outcome:
    """A release and whether it was replayed from an earlier request with the same key."""

    release: Release
    replayed: bool


@dataclass(frozen=True)
class Priced:
    """A validated query: its mechanism, exact cost and fingerprint."""

    mechanism: Mechanism
    cost: Amount
    fingerprint: str


def _parameter_error(exc: MechanismInputError) -> DpquantError:
    return invalid(f"body.{exc.parameter}", exc.problem)


def quote(mech: Mechanism, query: QuantileQuery) -> Amount:
    """Validate the privacy parameters with the mechanism and price the release exactly.

    The mechanism will run with :func:`~app.ledger.service.mechanism_float` of the requested
    figures (never above them); its declared cost at those floats is what is priced.
    """
    try:
        eps_cost, delta_cost = mech.dp_cost(
            epsilon=mechanism_float(query.epsilon),
            delta=None if query.delta is None else mechanism_float(query.delta),
        )
        return Amount(price(query.epsilon, eps_cost), price(query.delta, delta_cost))
    except MechanismInputError as exc:
        raise _parameter_error(exc) from None
    except ValueError:
        raise invalid("body.epsilon", "these privacy parameters have no finite cost") from None


def request_fingerprint(query: QuantileQuery) -> str:
    """SHA-256 of the canonical query; equal bodies (after parsing) give equal fingerprints."""
    canonical = {
        "method": query.method,
        "quantiles": [float(q).hex() for q in query.quantiles],
        "epsilon": str(query.epsilon.normalize()),
        "delta": None if query.delta is None else str(query.delta.normalize()),
    }
    return hashlib.sha256(json.dumps(canonical, sort_keys=True).encode()).hexdigest()


def price_query(query: QuantileQuery, *, max_quantiles: int) -> Priced:
    """Everything about a query that needs no database: limits, method, cost, fingerprint.

    ``auto`` must be resolved first (:func:`plan_query`), since it depends on the dataset.
    """
    if len(query.quantiles) > max_quantiles:
        raise invalid("body.quantiles", f"at most {max_quantiles} quantiles per query")
    try:
        mech = get_mechanism(query.method)
    except MechanismInputError as exc:
        raise invalid("body.method", exc.problem) from None
    return Priced(mech, quote(mech, query), request_fingerprint(query))


#: A release warns when its expected error is at least this share of the ranks.
WARN_SHARE = 0.05


@dataclass(frozen=True)
class Plan:
    """A query resolved against a dataset's public figures: method, price, expected error.

    ``query`` is the query as it will run (``auto`` resolved; δ dropped when the method chosen
    is pure ε-DP); ``priced.fingerprint`` is that of the query as sent, so an idempotent
    replay matches whatever the planner would choose today.
    """

    query: QuantileQuery
    priced: Priced
    expected: list[dict[str, float]] | None
    warnings: list[str]


def public_size(dataset: Dataset) -> int | None:
    """The size the planner may use: n under swap (public there), else the declared hint.

    Under add_remove n is private and never used: only ``size_hint`` (or nothing).
    """
    if dataset.neighbors == "swap" and dataset.n is not None:
        return dataset.n
    return dataset.size_hint


def resolve(query: QuantileQuery, *, dataset: Dataset, method: str | None = None) -> QuantileQuery:
    """The query with ``method`` (default: the query's, ``auto`` through the planner).

    A pure ε-DP method is always allowed: given one, a δ in the query is dropped (it buys
    nothing and is not charged) rather than refused.
    """
    name = method or query.method
    if name == AUTO:
        name = planner.recommend(
            public_size(dataset),
            query.quantiles,
            float(query.epsilon),
            None if query.delta is None else float(query.delta),
            dataset.neighbors,
        )
    elif method is None:
        return query
    mech = MECHANISMS.get(name)
    delta = query.delta if mech is not None and mech.uses_delta else None
    return query.model_copy(update={"method": name, "delta": delta})


def _figures(value: float) -> float:
    return float(f"{value:.4g}")


def expectation(
    query: QuantileQuery, *, dataset: Dataset
) -> tuple[list[dict[str, float]] | None, list[str]]:
    """A-priori expected error per quantile (missed points) and warnings; public figures only."""
    size = public_size(dataset)
    if size is None:
        if dataset.neighbors == "add_remove":
            why = "the dataset declares no size_hint (n is private under add_remove neighbours)"
        else:
            why = "the dataset has no values yet"
        return None, [f"expected error unknown: {why}"]
    err = planner.expected_error(
        query.method,
        size,
        query.quantiles,
        float(query.epsilon),
        None if query.delta is None else float(query.delta),
        dataset.neighbors,
    )
    if err is None:
        return None, [f"expected error unknown: no error model for method {query.method!r}"]
    mean, bound = _figures(err[0]), _figures(err[1])
    expected = [{"quantile": q, "mean": mean, "bound90": bound} for q in query.quantiles]
    warnings: list[str] = []
    share = mean / size
    m = len(query.quantiles)
    if share >= WARN_SHARE:
        warnings.append(
            f"this ε is too small for {m} quantile{'s' if m > 1 else ''} with method "
            f"{query.method!r}: expected error is {100 * share:.0f} % of the ranks"
        )
    return expected, warnings


def plan_query(query: QuantileQuery, *, dataset: Dataset, max_quantiles: int) -> Plan:
    """Resolve, validate and price ``query`` for ``dataset``; the one path of quotes and
    reservations (so a quote's cost is the debit of the release that follows). Reads no
    data value: only the dataset's public description (and n under swap)."""
    resolved = resolve(query, dataset=dataset)
    priced = price_query(resolved, max_quantiles=max_quantiles)
    check_runs_on(priced.mechanism, dataset=dataset)
    expected, warnings = expectation(resolved, dataset=dataset)
    return Plan(
        resolved,
        Priced(priced.mechanism, priced.cost, request_fingerprint(query)),
        expected,
        warnings,
    )


def check_runs_on(mech: Mechanism, *, dataset: Dataset) -> None:
    """Refuse (422, before anything is paid) a method whose analysis does not cover the
    dataset's neighbour relation (e.g. smooth sensitivity is for fixed-size datasets)."""
    if dataset.neighbors not in mech.neighbors:
        raise invalid(
            "body.method",
            f"method {mech.name!r} supports only {' and '.join(mech.neighbors)} neighbours; "
            f"this dataset uses {dataset.neighbors!r}",
        )


def _find_idempotent(
    session: Session, *, principal: Principal, dataset_id: uuid.UUID, key: str, fingerprint: str
) -> Release | None:
    existing = session.scalars(
        select(Release)
        .where(
            Release.api_key_id == principal.key_id,
            Release.dataset_id == dataset_id,
            Release.idempotency_key == key,
        )
        .execution_options(populate_existing=True)
    ).first()
    if existing is None:
        return None
    if existing.request_hash != fingerprint:
        raise DpquantError(
            409,
            "idempotency_conflict",
            "this Idempotency-Key was already used with a different request body",
        )
    return existing


def budget_refusal(remaining: Amount, cost: Amount) -> DpquantError:
    """409 ``budget_exhausted`` with the budget figures and nothing else."""
    return DpquantError(
        409,
        "budget_exhausted",
        "the query costs more than the remaining budget",
        extra={
            "requested": AmountPublic.of(cost).model_dump(mode="json"),
            "remaining": AmountPublic.of(remaining).model_dump(mode="json"),
        },
    )


def _refuse_if_unaffordable(remaining: Amount, cost: Amount) -> None:
    if not remaining.covers(cost):
        raise budget_refusal(remaining, cost)


def _calling_key(session: Session, principal: Principal, *, for_update: bool) -> ApiKey | None:
    stmt = select(ApiKey).where(ApiKey.id == principal.key_id)
    if for_update:
        # The ledger trigger writes this row with the debit anyway; locking it first makes
        # concurrent releases of one key (on any dataset) read each other's spending.
        stmt = stmt.with_for_update()
    return session.scalars(stmt.execution_options(populate_existing=True)).first()


def _within_cap(key: ApiKey | None, cost: Amount) -> bool:
    """True when ``cost`` keeps the key within its cap (or it has none)."""
    if key is None or (key.max_epsilon is None and key.max_delta is None):
        return True
    spent = Amount(key.spent_epsilon, key.spent_delta)
    with localcontext() as ctx:
        ctx.prec = 200  # exact: budget figures have at most 40 digits
        after = Amount(spent.epsilon + cost.epsilon, spent.delta + cost.delta)
    return (key.max_epsilon is None or after.epsilon <= key.max_epsilon) and (
        key.max_delta is None or after.delta <= key.max_delta
    )


def _refuse_if_over_cap(key: ApiKey | None, cost: Amount) -> None:
    """409 ``key_budget_exhausted`` when ``cost`` would take the key over its cap."""
    if key is None or _within_cap(key, cost):
        return
    spent = Amount(key.spent_epsilon, key.spent_delta)
    raise DpquantError(
        409,
        "key_budget_exhausted",
        "the query costs more than this API key may still spend",
        extra={
            "cap": KeyCap(epsilon=key.max_epsilon, delta=key.max_delta).model_dump(mode="json"),
            "spent": AmountPublic.of(spent).model_dump(mode="json"),
            "requested": AmountPublic.of(cost).model_dump(mode="json"),
        },
    )


def reserve_release(
    session: Session,
    *,
    principal: Principal,
    dataset_id: uuid.UUID,
    query: QuantileQuery,
    idempotency_key: str | None,
    max_quantiles: int,
    max_runs: int,
    release_id: uuid.UUID | None = None,
) -> Outcome:
    """The reservation transaction (see :func:`_reserve`); counts 409 refusals by method.

    ``release_id`` is the id a *new* release gets (a fresh random one when None): a caller
    that wants to hear of its completion can listen for it before the reservation commits.
    """
    try:
        return _reserve(
            session,
            principal=principal,
            dataset_id=dataset_id,
            query=query,
            idempotency_key=idempotency_key,
            max_quantiles=max_quantiles,
            max_runs=max_runs,
            release_id=release_id,
        )
    except DpquantError as exc:
        if exc.status_code == 409 and exc.type != "idempotency_conflict":
            # A refusal of a priced query (the method is a registered one by now).
            RELEASES.labels(query.method, "refused").inc()
        raise


def _reserve(
    session: Session,
    *,
    principal: Principal,
    dataset_id: uuid.UUID,
    query: QuantileQuery,
    idempotency_key: str | None,
    max_quantiles: int,
    max_runs: int,
    release_id: uuid.UUID | None = None,
) -> Outcome:
    """The reservation transaction (see the module docstring); the caller commits.

    Returns the new ``pending`` release, or the earlier release with the same key and body
    (resumed when it failed and may still run). Reads no data value.
    """
    if not principal.can_see(dataset_id):
        raise not_found("dataset")
    if query.method != AUTO:
        price_query(query, max_quantiles=max_quantiles)  # 422 before the dataset lookup
    elif len(query.quantiles) > max_quantiles:
        raise invalid("body.quantiles", f"at most {max_quantiles} quantiles per query")
    found = dataset_with_budget(session, dataset_id=dataset_id)
    if found is None:
        raise not_found("dataset")
    priced = plan_query(query, dataset=found[0], max_quantiles=max_quantiles).priced
    if idempotency_key is None:
        # Pre-check without the lock: budgets only shrink by debits, so a query that does not
        # fit now is refused now (figures alone, nothing queued behind the dataset lock).
        ensure_live(found[0])
        _refuse_if_unaffordable(found[1].remaining, priced.cost)
        if principal.capped:
            _refuse_if_over_cap(_calling_key(session, principal, for_update=False), priced.cost)
    # The lock, then the budget in a statement of its own (see dataset_with_budget): here,
    # the statement that also inserts the release and its debit (insert_reservation).
    dataset = get_visible(session, principal=principal, dataset_id=dataset_id, for_update=True)
    # Planned again under the lock: the public figures it reads (size hint) are now fixed.
    plan = plan_query(query, dataset=dataset, max_quantiles=max_quantiles)
    priced = plan.priced
    if idempotency_key is not None:
        earlier = _find_idempotent(
            session,
            principal=principal,
            dataset_id=dataset_id,
            key=idempotency_key,
            fingerprint=priced.fingerprint,
        )
        if earlier is not None:
            # Replays are free and never debit again; an archived dataset's values are gone,
            # so a failed release there is not resumed.
            resumable = earlier.status == FAILED and earlier.attempts < max_runs
            if resumable and dataset.archived_at is None:
                _resume(session, earlier)
            return Outcome(earlier, replayed=True)
    ensure_live(dataset)
    if dataset.values_uploaded_at is None:
        raise DpquantError(409, "no_values", "this dataset has no values yet")
    # Invariant 6: the key's cap, in the same transaction, under its row lock (skipped for
    # keys without a cap; the debit's trigger checks every key in PostgreSQL regardless).
    if principal.capped:
        _refuse_if_over_cap(_calling_key(session, principal, for_update=True), priced.cost)

    now = datetime.now(UTC)
    columns: dict[str, Any] = {
        "id": uuid.uuid4() if release_id is None else release_id,
        "dataset_id": dataset_id,
        "api_key_id": principal.key_id,
        "method": priced.mechanism.name,
        "quantiles": [float(q) for q in query.quantiles],
        "estimates": None,
        "epsilon": plan.query.epsilon,
        "delta": plan.query.delta,
        "cost_epsilon": priced.cost.epsilon,
        "cost_delta": priced.cost.delta,
        "idempotency_key": idempotency_key,
        "request_hash": priced.fingerprint,
        "created_at": now,
        "status": PENDING,
        "failure": None,
        "attempts": 0,
        "lease_token": None,
        "lease_until": None,
        "finished_at": None,
        "expected_error": plan.expected,
        "warnings": plan.warnings,
    }
    try:
        reserved = insert_reservation(session, columns)
    except IntegrityError as exc:  # the transaction is rolled back by the caller
        # The balance row's CHECK refused an overdraft: unreachable while every writer takes
        # the lock above (the statement checks first), and a refusal if some path ever does.
        if "no_overdraft" not in str(exc.orig):
            raise
        raise budget_refusal(found[1].remaining, priced.cost) from None
    if reserved.seq is None or reserved.after is None:
        raise budget_refusal(reserved.left, priced.cost)
    release = Release(
        **columns,
        remaining_epsilon=reserved.after.epsilon,
        remaining_delta=reserved.after.delta,
    )
    release.seq = reserved.seq
    if dataset.frozen_at is None:
        dataset.frozen_at = now  # values never change once a run has been paid for
    # The insert wakes the workers (trigger release_notify, at commit); a worker that misses
    # the notification still finds the row by polling.
    session.flush()
    count_on_commit(session, RESERVATIONS, release.method)
    return Outcome(release, replayed=False)


_RESERVE = text(
    """
    WITH b AS (
        SELECT granted_epsilon - spent_epsilon AS le, granted_delta - spent_delta AS ld
        FROM budget_balance WHERE dataset_id = CAST(:dataset_id AS uuid)
    ), r AS (
        INSERT INTO release (id, dataset_id, api_key_id, method, quantiles, estimates,
                             epsilon, delta, cost_epsilon, cost_delta, remaining_epsilon,
                             remaining_delta, idempotency_key, request_hash, created_at,
                             status, failure, attempts, lease_token, lease_until,
                             finished_at, expected_error, warnings)
        SELECT CAST(:id AS uuid), CAST(:dataset_id AS uuid), CAST(:api_key_id AS uuid),
               CAST(:method AS varchar), CAST(:quantiles AS double precision[]), NULL,
               CAST(:epsilon AS numeric), CAST(:delta AS numeric),
               CAST(:cost_epsilon AS numeric), CAST(:cost_delta AS numeric),
               b.le - CAST(:cost_epsilon AS numeric), b.ld - CAST(:cost_delta AS numeric),
               CAST(:idempotency_key AS varchar), CAST(:request_hash AS varchar),
               CAST(:created_at AS timestamptz), 'pending', NULL, 0, NULL, NULL, NULL,
               :expected_error, :warnings
        FROM b
        WHERE b.le >= CAST(:cost_epsilon AS numeric) AND b.ld >= CAST(:cost_delta AS numeric)
        RETURNING seq, remaining_epsilon, remaining_delta
    ), d AS (
        INSERT INTO ledger_entry (dataset_id, kind, epsilon, delta, reason, release_id,
                                  api_key_id, created_at)
        SELECT CAST(:dataset_id AS uuid), 'debit', CAST(:cost_epsilon AS numeric),
               CAST(:cost_delta AS numeric), NULL, CAST(:id AS uuid),
               CAST(:api_key_id AS uuid), CAST(:created_at AS timestamptz)
        FROM r
    )
    SELECT b.le, b.ld, r.seq, r.remaining_epsilon, r.remaining_delta,
           set_config('synchronous_commit', 'off', true)
    FROM b LEFT JOIN r ON true
    """
).bindparams(bindparam("expected_error", type_=JSONB), bindparam("warnings", type_=JSONB))


@dataclass(frozen=True)
class Reserved:
    """What :func:`insert_reservation` found under the lock, and wrote if it fitted."""

    #: The budget left before this release (granted minus spent, read under the lock).
    left: Amount
    #: The new release's ``seq`` and the budget left after it; None when it did not fit.
    seq: int | None
    after: Amount | None


def insert_reservation(session: Session, columns: dict[str, Any]) -> Reserved:
    """Read the balance and, if the cost fits, insert the pending release and its debit, in
    ONE statement (the round trips made while the dataset lock is held are what bounds the
    release rate on one dataset).

    The budget is read under the caller's dataset lock by this very statement, and the
    refusal figures come from that same read. The balance row's CHECK refuses an overdraft
    inside PostgreSQL as well (``no_overdraft``, an ``IntegrityError``) should a caller ever
    skip the lock. A dataset without a balance row (nothing ever granted) has nothing left.
    The commit may skip the WAL flush (``synchronous_commit = off`` for this transaction):
    a reservation lost in a crash lost no output, and the commit that stores the estimates
    follows it in the WAL and is made durable before any answer leaves
    (:func:`app.releases.runner.complete`).
    """
    params = {k: columns[k] for k in _RESERVE_PARAMS}
    row = session.execute(_RESERVE, params).first()
    if row is None:
        zero = Decimal(0)
        return Reserved(left=Amount(zero, zero), seq=None, after=None)
    left = Amount(Decimal(row[0]), Decimal(row[1]))
    if row[2] is None:
        return Reserved(left=left, seq=None, after=None)
    return Reserved(left=left, seq=int(row[2]), after=Amount(Decimal(row[3]), Decimal(row[4])))


_RESERVE_PARAMS = (
    "id",
    "dataset_id",
    "api_key_id",
    "method",
    "quantiles",
    "epsilon",
    "delta",
    "cost_epsilon",
    "cost_delta",
    "idempotency_key",
    "request_hash",
    "created_at",
    "expected_error",
    "warnings",
)

_RELEASE_TABLE = cast(Table, Release.__table__)
_RELEASE_BY_ID = select(_RELEASE_TABLE).where(_RELEASE_TABLE.c.id == bindparam("id"))


@dataclass(frozen=True)
class QuoteLine:
    """One method's figures in a quote."""

    method: str
    cost: Amount
    remaining_after: Amount | None
    affordable: bool
    expected: list[dict[str, float]] | None


@dataclass(frozen=True)
class Quote:
    """The quote of a query: the resolved method's figures, warnings, every alternative."""

    chosen: QuoteLine
    warnings: list[str]
    alternatives: list[QuoteLine]


def quote_query(
    session: Session,
    *,
    principal: Principal,
    dataset_id: uuid.UUID,
    query: QuantileQuery,
    max_quantiles: int,
) -> Quote:
    """What :func:`reserve_release` would debit for ``query`` (same :func:`plan_query`
    path), whether it is affordable, and the expected error of every eligible method.

    Free: writes nothing, takes no lock, reads no data value; the answer depends only on the
    query, the dataset's public description, its budget and the calling key's cap.
    """
    if not principal.can_see(dataset_id):
        raise not_found("dataset")
    if len(query.quantiles) > max_quantiles:
        raise invalid("body.quantiles", f"at most {max_quantiles} quantiles per query")
    found = dataset_with_budget(session, dataset_id=dataset_id)
    if found is None:
        raise not_found("dataset")
    dataset, figures = found
    ensure_live(dataset)
    remaining = figures.remaining
    key = _calling_key(session, principal, for_update=False) if principal.capped else None

    def line(plan: Plan) -> QuoteLine:
        cost = plan.priced.cost
        ok = remaining.covers(cost) and _within_cap(key, cost)
        return QuoteLine(
            plan.query.method, cost, remaining.minus(cost) if ok else None, ok, plan.expected
        )

    plan = plan_query(query, dataset=dataset, max_quantiles=max_quantiles)
    alternatives: list[QuoteLine] = []
    for name in planner.eligible_methods(
        delta_given=query.delta is not None, neighbors=dataset.neighbors
    ):
        try:
            alt = plan_query(
                resolve(query, dataset=dataset, method=name),
                dataset=dataset,
                max_quantiles=max_quantiles,
            )
        except DpquantError:  # e.g. parameters outside what this method accepts
            continue
        alternatives.append(line(alt))
    return Quote(line(plan), plan.warnings, alternatives)


def _resume(session: Session, release: Release) -> None:
    """Put a failed release back in the queue (no new debit: it never released an output)."""
    session.execute(
        update(Release)
        .where(Release.id == release.id, Release.status == FAILED)
        .values(status=PENDING, failure=None, lease_token=None, lease_until=None, finished_at=None)
    )
    session.refresh(release)  # the update wakes the workers (trigger release_notify)


def get_release(session: Session, *, principal: Principal, release_id: uuid.UUID) -> Release:
    """A release inside the key's scope; 404 otherwise.

    One plain SELECT (releases are polled): the result is a detached ``Release`` built from
    the row, never attached to ``session``.
    """
    row = session.execute(_RELEASE_BY_ID, {"id": release_id}).mappings().first()
    if row is None or not principal.can_see(row["dataset_id"]):
        raise not_found("release")
    return Release(**row)


def list_releases(
    session: Session, *, principal: Principal, dataset_id: uuid.UUID, before: int | None, limit: int
) -> list[Release]:
    """Releases of a dataset, newest first, with ``seq < before`` when a cursor is given."""
    get_visible(session, principal=principal, dataset_id=dataset_id)
    stmt = select(Release).where(Release.dataset_id == dataset_id)
    if before is not None:
        stmt = stmt.where(Release.seq < before)
    return list(session.scalars(stmt.order_by(Release.seq.desc()).limit(limit)))


def with_outcome(release: Release, outcome: Mapping[str, Any]) -> Release | None:
    """``release`` (as reserved, in memory) finished as announced in ``outcome`` (see
    :mod:`app.releases.waiter`): the same values a re-read of the row gives, so the answer
    is byte-identical to a later GET. None when the announcement is not a finished outcome
    of this release (the caller then reads the row)."""
    try:
        if uuid.UUID(str(outcome["id"])) != release.id or outcome["status"] not in (DONE, FAILED):
            return None
        finished_at = datetime.fromisoformat(outcome["finished_at"]).replace(tzinfo=UTC)
        raw = outcome["estimates"]
        estimates = None if raw is None else [float(x) for x in raw]
        failure = outcome["failure"]
    except (KeyError, TypeError, ValueError):
        return None
    columns = {column.key: getattr(release, column.key) for column in Release.__table__.columns}
    columns.update(
        status=outcome["status"],
        failure=None if failure is None else str(failure),
        finished_at=finished_at,
        estimates=estimates,
        lease_token=None,
        lease_until=None,
    )
    return Release(**columns)


def is_finished(release: Release) -> bool:
    """True once the release is ``done`` or ``failed`` (for now: it may be resumed)."""
    return release.status in (DONE, FAILED)


__all__ = [
    "FINISHED_CHANNEL",
    "PENDING_CHANNEL",
    "Outcome",
    "Plan",
    "Priced",
    "Quote",
    "get_release",
    "is_finished",
    "list_releases",
    "plan_query",
    "price_query",
    "public_size",
    "quote",
    "quote_query",
    "request_fingerprint",
    "reserve_release",
]

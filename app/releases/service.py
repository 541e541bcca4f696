"""The release transaction (DESIGN.md section 3).

``create_release`` keeps the ledger invariants by construction:

1. Outside the lock: validate and price the query, load the values (binary fetch), refuse
   early when the budget is already too small, run the mechanism and snap its output to the
   public grid. Nothing computed here is visible to anyone yet.
2. In the request's single transaction: ``SELECT ... FOR UPDATE`` on the dataset row, the
   idempotency check, ``remaining = sum(grants) - sum(debits)``, refusal (409) when the cost
   does not fit, then the release row, its debit and the freeze mark.
3. The caller commits once (before the response is sent); any exception before that rolls
   everything back, so a release never exists without its debit and a failed mechanism
   costs nothing.

Sampling before the lock (rather than inside it, as DESIGN.md sketches) is equivalent for
privacy: an estimate leaves the service only through the transaction that debits it, and
the decision to release depends on budget figures alone. It keeps the lock, which every
writer of the dataset's ledger must take, held only for a few statements and the commit, so
large datasets do not serialise their mechanism runs.

Because every writer of a dataset's ledger holds the row lock, the sum of debits can never
exceed the sum of grants, whatever the number of processes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.auth.deps import Principal
from app.datasets.models import Dataset
from app.datasets.service import FloatArray, get_visible, load_values, snap_to_grid
from app.errors import DpquantError, invalid, not_found
from app.ledger.schemas import AmountPublic
from app.ledger.service import Amount, add_debit, budget, price
from app.mechanisms import Mechanism, MechanismInputError, get_mechanism
from app.releases.models import Release
from app.releases.schemas import QuantileQuery

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    """A release and whether it was replayed from an earlier request with the same key."""

    release: Release
    replayed: bool


def _mechanism_error(exc: MechanismInputError) -> DpquantError:
    if exc.parameter == "data":
        # Never relay a data-dependent message; the data were validated at upload.
        return DpquantError(503, "mechanism_unavailable", "the mechanism could not run")
    return invalid(f"body.{exc.parameter}", exc.problem)


def quote(mech: Mechanism, query: QuantileQuery) -> Amount:
    """Validate the privacy parameters with the mechanism and price the release exactly."""
    try:
        eps_cost, delta_cost = mech.dp_cost(
            epsilon=float(query.epsilon),
            delta=None if query.delta is None else float(query.delta),
        )
        return Amount(price(query.epsilon, eps_cost), price(query.delta, delta_cost))
    except MechanismInputError as exc:
        raise _mechanism_error(exc) from None
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


def _find_idempotent(
    session: Session, *, principal: Principal, dataset_id: uuid.UUID, key: str, fingerprint: str
) -> Release | None:
    existing = session.scalars(
        select(Release).where(
            Release.api_key_id == principal.key_id,
            Release.dataset_id == dataset_id,
            Release.idempotency_key == key,
        )
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


def _sample(
    mech: Mechanism, query: QuantileQuery, dataset: Dataset, values: FloatArray
) -> FloatArray:
    """Run the mechanism and snap its output to the dataset's public grid.

    The result is not released by this function: it only leaves the service if the locked
    transaction that debits its cost commits.
    """
    try:
        raw = mech.run(
            values,
            query.quantiles,
            epsilon=float(query.epsilon),
            delta=None if query.delta is None else float(query.delta),
            lower=dataset.lower,
            upper=dataset.upper,
            neighbors=dataset.neighbors,
        )
    except MechanismInputError as exc:
        raise _mechanism_error(exc) from None
    except Exception as exc:
        # Log the failure class only: a message could in principle carry a data value.
        logger.error("mechanism %s failed with %s", mech.name, type(exc).__name__)
        raise DpquantError(
            503, "mechanism_unavailable", "the mechanism failed; nothing was charged"
        ) from None
    estimates = snap_to_grid(
        raw, lower=dataset.lower, upper=dataset.upper, granularity=dataset.granularity
    )
    if estimates.shape != (len(query.quantiles),):
        logger.error("mechanism %s returned a wrongly shaped result", mech.name)
        raise DpquantError(
            503, "mechanism_unavailable", "the mechanism failed; nothing was charged"
        )
    return estimates


def _refuse_if_unaffordable(remaining: Amount, cost: Amount) -> None:
    if not remaining.covers(cost):
        raise DpquantError(
            409,
            "budget_exhausted",
            "the query costs more than the remaining budget",
            extra={
                "requested": AmountPublic.of(cost).model_dump(mode="json"),
                "remaining": AmountPublic.of(remaining).model_dump(mode="json"),
            },
        )


def create_release(
    session: Session,
    *,
    principal: Principal,
    dataset_id: uuid.UUID,
    query: QuantileQuery,
    idempotency_key: str | None,
    max_quantiles: int,
) -> Outcome:
    """Run one priced, debited, stored quantile release (see the module docstring)."""
    dataset = get_visible(session, principal=principal, dataset_id=dataset_id)
    if len(query.quantiles) > max_quantiles:
        raise invalid("body.quantiles", f"at most {max_quantiles} quantiles per query")
    try:
        mech = get_mechanism(query.method)
    except MechanismInputError as exc:
        raise invalid("body.method", exc.problem) from None
    cost = quote(mech, query)
    fingerprint = request_fingerprint(query)

    def replay() -> Release | None:
        if idempotency_key is None:
            return None
        return _find_idempotent(
            session,
            principal=principal,
            dataset_id=dataset_id,
            key=idempotency_key,
            fingerprint=fingerprint,
        )

    earlier = replay()
    if earlier is not None:
        return Outcome(earlier, replayed=True)

    # ---- outside the lock: load the values, pre-check the budget, sample.
    loaded = load_values(session, dataset_id=dataset_id)
    if loaded is None:
        raise DpquantError(409, "no_values", "this dataset has no values yet")
    _refuse_if_unaffordable(budget(session, dataset_id=dataset_id).remaining, cost)
    estimates = _sample(mech, query, dataset, loaded[1])

    # ---- critical section: the dataset row stays locked until the caller commits.
    dataset = get_visible(session, principal=principal, dataset_id=dataset_id, for_update=True)
    earlier = replay()
    if earlier is not None:
        return Outcome(earlier, replayed=True)
    if loaded[0] != dataset.data_version:
        # Values were replaced between the read and the lock (only possible before the
        # first release): sample again from the current values.
        loaded = load_values(session, dataset_id=dataset_id)
        if loaded is None:
            raise DpquantError(409, "no_values", "this dataset has no values yet")
        estimates = _sample(mech, query, dataset, loaded[1])
    remaining = budget(session, dataset_id=dataset_id).remaining
    _refuse_if_unaffordable(remaining, cost)

    now = datetime.now(UTC)
    after = remaining.minus(cost)
    release = Release(
        id=uuid.uuid4(),
        dataset_id=dataset_id,
        api_key_id=principal.key_id,
        method=mech.name,
        quantiles=[float(q) for q in query.quantiles],
        estimates=[float(e) for e in estimates],
        epsilon=query.epsilon,
        delta=query.delta,
        cost_epsilon=cost.epsilon,
        cost_delta=cost.delta,
        remaining_epsilon=after.epsilon,
        remaining_delta=after.delta,
        idempotency_key=idempotency_key,
        request_hash=fingerprint,
        created_at=now,
    )
    session.add(release)
    session.flush()
    add_debit(
        session,
        dataset_id=dataset_id,
        cost=cost,
        release_id=release.id,
        api_key_id=principal.key_id,
        created_at=now,
    )
    if dataset.frozen_at is None:
        dataset.frozen_at = now
    session.flush()
    return Outcome(release, replayed=False)


def get_release(session: Session, *, principal: Principal, release_id: uuid.UUID) -> Release:
    """A release inside the key's scope; 404 otherwise."""
    release = session.get(Release, release_id)
    if release is None or not principal.can_see(release.dataset_id):
        raise not_found("release")
    return release


def list_releases(
    session: Session, *, principal: Principal, dataset_id: uuid.UUID, before: int | None, limit: int
) -> list[Release]:
    """Releases of a dataset, newest first, with ``seq < before`` when a cursor is given."""
    get_visible(session, principal=principal, dataset_id=dataset_id)
    stmt = select(Release).where(Release.dataset_id == dataset_id)
    if before is not None:
        stmt = stmt.where(Release.seq < before)
    return list(session.scalars(stmt.order_by(Release.seq.desc()).limit(limit)))

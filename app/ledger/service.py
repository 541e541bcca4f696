"""Budget accounting: every figure is a sum over the append-only ledger, computed by PostgreSQL.

Basic composition: the cost of a sequence of releases is the sum of their (epsilon, delta)
costs. ``remaining = sum(grants) - sum(debits)``, both exact ``NUMERIC`` sums.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_CEILING, Decimal, localcontext

from sqlalchemy import func, select
from sqlalchemy.orm import InstrumentedAttribute, Session
from sqlalchemy.sql import ColumnElement

from app.datasets.models import Dataset
from app.ledger.models import LedgerEntry

#: Costs computed in floating point (e.g. a zCDP conversion) are rounded UP to this quantum.
COST_QUANTUM = Decimal("1e-12")
ZERO = Decimal(0)


@dataclass(frozen=True)
class Amount:
    """An (epsilon, delta) pair of exact decimals."""

    epsilon: Decimal
    delta: Decimal

    def covers(self, other: Amount) -> bool:
        """True when both components of ``other`` fit inside this amount."""
        return other.epsilon <= self.epsilon and other.delta <= self.delta

    def minus(self, other: Amount) -> Amount:
        """Exact difference (no rounding, whatever the number of digits)."""
        with localcontext() as ctx:
            ctx.prec = 200
            return Amount(self.epsilon - other.epsilon, self.delta - other.delta)


@dataclass(frozen=True)
class Budget:
    """Granted, spent and remaining budget of one dataset."""

    granted: Amount
    spent: Amount

    @property
    def remaining(self) -> Amount:
        """``granted - spent`` for epsilon and delta."""
        return self.granted.minus(self.spent)


def find_budget(session: Session, *, dataset_id: uuid.UUID) -> Budget | None:
    """Sum the dataset's ledger rows in one statement; None when the dataset does not exist.

    Call with the dataset row locked to get an answer that cannot change before commit.
    """
    return budgets(session, dataset_ids=[dataset_id]).get(dataset_id)


def budgets(session: Session, *, dataset_ids: list[uuid.UUID]) -> dict[uuid.UUID, Budget]:
    """Granted and spent budget of each existing dataset in ``dataset_ids``, one statement.

    ``spent`` is the sum of the debit rows, ``granted`` the sum of the grant rows (exact
    ``NUMERIC`` sums computed by PostgreSQL); unknown ids are absent from the result.
    """
    if not dataset_ids:
        return {}

    def total(column: InstrumentedAttribute[Decimal], kind: str) -> ColumnElement[Decimal]:
        return func.coalesce(func.sum(column).filter(LedgerEntry.kind == kind), 0)

    rows = session.execute(
        select(
            Dataset.id,
            total(LedgerEntry.epsilon, "grant"),
            total(LedgerEntry.delta, "grant"),
            total(LedgerEntry.epsilon, "debit"),
            total(LedgerEntry.delta, "debit"),
        )
        .outerjoin(LedgerEntry, LedgerEntry.dataset_id == Dataset.id)
        .where(Dataset.id.in_(dataset_ids))
        .group_by(Dataset.id)
    )
    return {
        ds: Budget(granted=Amount(Decimal(ge), Decimal(gd)), spent=Amount(Decimal(se), Decimal(sd)))
        for ds, ge, gd, se, sd in rows
    }


def budget(session: Session, *, dataset_id: uuid.UUID) -> Budget:
    """Like :func:`find_budget` for a dataset known to exist."""
    found = find_budget(session, dataset_id=dataset_id)
    if found is None:
        raise LookupError("dataset does not exist")
    return found


def price(requested: Decimal | None, computed: float) -> Decimal:
    """The decimal to debit for a cost the mechanism computed as ``computed``.

    When the mechanism charges exactly the requested figure (pure and approximate DP), the
    requested decimal is debited as is. Anything else (a converted guarantee) is rounded up
    to :data:`COST_QUANTUM`, so the ledger never undercounts.
    """
    if not math.isfinite(computed) or computed < 0:
        raise ValueError("mechanism returned an invalid cost")
    if computed == 0.0:
        return ZERO
    if requested is not None and float(requested) == computed:
        return requested
    return Decimal(computed).quantize(COST_QUANTUM, rounding=ROUND_CEILING)


def add_grant(
    session: Session,
    *,
    dataset_id: uuid.UUID,
    epsilon: Decimal,
    delta: Decimal,
    reason: str,
    api_key_id: uuid.UUID | None,
) -> LedgerEntry:
    """Append a grant row."""
    entry = LedgerEntry(
        dataset_id=dataset_id,
        kind="grant",
        epsilon=epsilon,
        delta=delta,
        reason=reason,
        release_id=None,
        api_key_id=api_key_id,
        created_at=datetime.now(UTC),
    )
    session.add(entry)
    session.flush()
    return entry


def add_debit(
    session: Session,
    *,
    dataset_id: uuid.UUID,
    cost: Amount,
    release_id: uuid.UUID,
    api_key_id: uuid.UUID | None,
    created_at: datetime,
) -> LedgerEntry:
    """Append the debit of one release (same transaction as the release row)."""
    entry = LedgerEntry(
        dataset_id=dataset_id,
        kind="debit",
        epsilon=cost.epsilon,
        delta=cost.delta,
        reason=None,
        release_id=release_id,
        api_key_id=api_key_id,
        created_at=created_at,
    )
    session.add(entry)
    session.flush()
    return entry


def list_entries(
    session: Session, *, dataset_id: uuid.UUID, before: int | None, limit: int
) -> list[LedgerEntry]:
    """Up to ``limit`` rows, newest first, with ``id < before`` when a cursor is given."""
    stmt = select(LedgerEntry).where(LedgerEntry.dataset_id == dataset_id)
    if before is not None:
        stmt = stmt.where(LedgerEntry.id < before)
    return list(session.scalars(stmt.order_by(LedgerEntry.id.desc()).limit(limit)))

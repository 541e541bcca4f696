"""Budget accounting over the append-only ledger.

Basic composition: the cost of a sequence of releases is the sum of their (epsilon, delta)
costs. ``remaining = granted - spent``, read in O(1) from the dataset's ``budget_balance``
row, which PostgreSQL keeps equal to the sums of the ledger rows (a trigger updates it in the
same transaction as each ledger insert) and which refuses an overdraft by a CHECK constraint
(migration 0003) — so even a code path that forgot the dataset lock cannot overspend.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import ROUND_CEILING, Decimal
from typing import Any

import psycopg
from sqlalchemy import bindparam, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.audit.service import record
from app.core.amounts import Amount, Budget
from app.core.errors import DpquantError, invalid
from app.core.principal import Principal
from app.datasets.models import Dataset
from app.ledger import zcdp
from app.ledger.models import BudgetBalance, LedgerEntry

#: Costs computed in floating point (e.g. a zCDP conversion) are rounded UP to this quantum.
COST_QUANTUM = Decimal("1e-12")
ZERO = Decimal(0)


#: One dataset's balance; psycopg's parameter style, run by both readers below.
_ONE_BUDGET = (
    "SELECT b.granted_epsilon, b.granted_delta, b.spent_epsilon, b.spent_delta,"
    " b.granted_rho, b.spent_rho, d.accounting, d.accounting_delta"
    " FROM dataset d LEFT JOIN budget_balance b ON b.dataset_id = d.id WHERE d.id = %s"
)


#: The balance row's figures, in the order :func:`_budget_from` reads them (then the
#: dataset's ``accounting`` and ``accounting_delta``).
_BALANCE = (
    BudgetBalance.granted_epsilon,
    BudgetBalance.granted_delta,
    BudgetBalance.spent_epsilon,
    BudgetBalance.spent_delta,
    BudgetBalance.granted_rho,
    BudgetBalance.spent_rho,
)


def _budget_of(row: Sequence[Any] | None) -> Budget | None:
    return None if row is None else _budget_from(row)


def _budget_from(row: Sequence[Any]) -> Budget:
    """A budget from the six balance figures (None: nothing granted yet), the accounting and
    its delta."""
    ge, gd, se, sd, gr, sr = (Decimal(0) if v is None else Decimal(v) for v in row[:6])
    return Budget(
        granted=Amount(ge, gd, gr),
        spent=Amount(se, sd, sr),
        accounting=row[6],
        guarantee_delta=None if row[7] is None else Decimal(row[7]),
    )


def find_budget(session: Session, *, dataset_id: uuid.UUID) -> Budget | None:
    """The dataset's budget (O(1): its balance row); None when the dataset does not exist.

    Call with the dataset row locked to get an answer that cannot change before commit.
    """
    row = session.connection().exec_driver_sql(_ONE_BUDGET, (dataset_id,)).first()
    return _budget_of(row)


async def read_budget(
    conn: psycopg.AsyncConnection[Any], *, dataset_id: uuid.UUID
) -> Budget | None:
    """:func:`find_budget` on a connection of the hot path (budgets are polled)."""
    cursor = await conn.execute(_ONE_BUDGET, (dataset_id,))
    return _budget_of(await cursor.fetchone())


def budgets(session: Session, *, dataset_ids: list[uuid.UUID]) -> dict[uuid.UUID, Budget]:
    """Granted and spent budget of each existing dataset in ``dataset_ids``, one statement.

    Read from the balance rows (a dataset that was never granted anything has none: zero);
    unknown ids are absent from the result.
    """
    if not dataset_ids:
        return {}
    rows = session.execute(
        select(Dataset.id, *_BALANCE, Dataset.accounting, Dataset.accounting_delta)
        .outerjoin(BudgetBalance, BudgetBalance.dataset_id == Dataset.id)
        .where(Dataset.id.in_(dataset_ids))
    )
    return {ds: _budget_from(figures) for ds, *figures in rows}


def dataset_with_budget(
    session: Session, *, dataset_id: uuid.UUID
) -> tuple[Dataset, Budget] | None:
    """The dataset row and its budget in one statement, without a lock (pre-checks only).

    Never combine the dataset lock with this join: after waiting for ``FOR UPDATE OF
    dataset`` PostgreSQL re-reads only the locked row, not the joined balance row, which then
    predates the commit that released the lock. Lock first, then read the budget in a new
    statement (:func:`budget`, or the reservation's own statement,
    :func:`app.releases.service.insert_reservation`).
    """
    row = session.execute(_DATASET_WITH_BUDGET, {"id": dataset_id}).first()
    if row is None:
        return None
    dataset, *figures = row
    return dataset, _budget_from([*figures, dataset.accounting, dataset.accounting_delta])


_DATASET_WITH_BUDGET = (
    select(Dataset, *_BALANCE)
    .outerjoin(BudgetBalance, BudgetBalance.dataset_id == Dataset.id)
    .where(Dataset.id == bindparam("id"))
)


def budget(session: Session, *, dataset_id: uuid.UUID) -> Budget:
    """Like :func:`find_budget` for a dataset known to exist."""
    found = find_budget(session, dataset_id=dataset_id)
    if found is None:
        raise LookupError("dataset does not exist")
    return found


def mechanism_float(value: Decimal) -> float:
    """The largest double that is <= ``value``: what the mechanism runs with.

    The ledger debits the exact decimal the analyst asked for; running the mechanism with a
    float at most that large means its guarantee (monotone in epsilon and delta) is never
    weaker than the one that was paid for. ``float(Decimal)`` rounds to nearest and can be
    half an ulp larger.
    """
    out = float(value)
    if Decimal(out) > value:
        out = math.nextafter(out, -math.inf)
    return out


def price(requested: Decimal | None, computed: float) -> Decimal:
    """The decimal to debit for a cost the mechanism computed as ``computed``.

    The mechanism is priced at the float it runs with (:func:`mechanism_float` of the
    request). When it charges exactly that float (pure and approximate DP), the requested
    decimal is debited as is: it is at least as large. Anything else (a converted guarantee)
    is rounded up to :data:`COST_QUANTUM`, so the ledger never undercounts.
    """
    if not math.isfinite(computed) or computed < 0:
        raise ValueError("mechanism returned an invalid cost")
    if computed == 0.0:
        return ZERO
    if requested is not None and mechanism_float(requested) == computed:
        return requested
    return Decimal(computed).quantize(COST_QUANTUM, rounding=ROUND_CEILING)


def grant_amount(
    dataset: Dataset, *, epsilon: Decimal, delta: Decimal, rho: Decimal, initial: bool = False
) -> Amount:
    """What a grant adds, by the table's accounting. Pure: (epsilon, delta); rho is refused.
    zCDP: rho given directly, or epsilon converted to rho at the table's delta (each grant
    on its own: conservative, :func:`app.ledger.zcdp.rho_for`); the grant row keeps the
    epsilon target (and, for the initial grant, the table's delta) for the record. A later
    zCDP grant cannot add delta: the guarantee's delta is fixed at creation."""
    if dataset.accounting != "zcdp":
        if rho > 0:
            raise invalid("body.rho", "only a table with accounting zcdp is budgeted in rho")
        return Amount(epsilon, delta)
    assert dataset.accounting_delta is not None
    if not initial and delta > 0:
        raise invalid(
            "body.delta",
            "a zcdp table states its guarantee at the delta fixed at its creation: grant "
            "epsilon (converted to rho) or rho",
        )
    added = rho + zcdp.rho_for(epsilon, dataset.accounting_delta)
    return Amount(epsilon, delta if initial else ZERO, added)


def add_grant(
    session: Session,
    *,
    dataset_id: uuid.UUID,
    epsilon: Decimal,
    delta: Decimal,
    reason: str,
    api_key_id: uuid.UUID | None,
    actor: Principal | None = None,
    rho: Decimal = ZERO,
) -> LedgerEntry:
    """Append a grant row (recorded in the audit log with its amounts and reason)."""
    entry = LedgerEntry(
        dataset_id=dataset_id,
        kind="grant",
        epsilon=epsilon,
        delta=delta,
        rho=rho,
        reason=reason,
        release_id=None,
        api_key_id=api_key_id,
        created_at=datetime.now(UTC),
    )
    session.add(entry)
    session.flush()
    record(
        session,
        actor=actor,
        action="budget.grant",
        target_type="dataset",
        target_id=dataset_id,
        details={"epsilon": str(epsilon), "delta": str(delta), "reason": reason}
        | ({"rho": str(rho)} if rho > 0 else {}),
    )
    return entry


def list_entries(
    session: Session, *, dataset_id: uuid.UUID, before: int | None, limit: int
) -> list[LedgerEntry]:
    """Up to ``limit`` rows, newest first, with ``id < before`` when a cursor is given."""
    stmt = select(LedgerEntry).where(LedgerEntry.dataset_id == dataset_id)
    if before is not None:
        stmt = stmt.where(LedgerEntry.id < before)
    return list(session.scalars(stmt.order_by(LedgerEntry.id.desc()).limit(limit)))


def confirm_restore(
    session: Session,
    *,
    dataset: Dataset,
    spent: Amount,
    reason: str,
    principal: Principal,
) -> None:
    """Record what was spent on ``dataset`` after the backup it was restored from (an
    ``adjustment`` row, when anything was) and lift its hold. The caller holds the dataset
    row lock. 409 when the dataset is not on hold; 409 ``budget_exhausted`` when the spending
    reported overdraws the budget (PostgreSQL's ``no_overdraft``: grant first what was granted
    after the backup); 422 for rho in a pure table."""
    if dataset.restore_hold_since is None:
        raise DpquantError(409, "not_on_hold", "this dataset's budget is not on hold")
    if dataset.accounting != "zcdp" and spent.rho > 0:
        raise invalid("body.rho", "only a table with accounting zcdp is budgeted in rho")
    if spent.epsilon > 0 or spent.delta > 0 or spent.rho > 0:
        entry = LedgerEntry(
            dataset_id=dataset.id,
            kind="adjustment",
            epsilon=spent.epsilon,
            delta=spent.delta,
            rho=spent.rho,
            reason=reason,
            release_id=None,
            api_key_id=principal.key_id,
            created_at=datetime.now(UTC),
        )
        try:
            with session.begin_nested():
                session.add(entry)
                session.flush()
        except IntegrityError:
            raise DpquantError(
                409,
                "budget_exhausted",
                "the spending reported exceeds this dataset's budget: grant first what was "
                "granted after the backup, then confirm",
            ) from None
    since = dataset.restore_hold_since
    dataset.restore_hold_since = None
    session.flush()
    record(
        session,
        actor=principal,
        action="budget.restore_confirmation",
        target_type="dataset",
        target_id=dataset.id,
        details={
            "epsilon": str(spent.epsilon),
            "delta": str(spent.delta),
            "rho": str(spent.rho),
            "held_since": since.isoformat(),
            "reason": reason,
        },
    )

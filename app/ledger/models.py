"""The ``ledger_entry`` table: append-only grants and debits."""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Identity,
    Numeric,
    String,
    Text,
)
from sqlalchemy.orm import Mapped, mapped_column

from app.core.db import Base


class LedgerEntry(Base):
    """One grant (budget added), debit (cost of one release) or adjustment (budget spent
    outside any stored release: spending a restore lost, reported by an admin).

    Invariants: rows are only ever inserted; a debit references exactly one release and a
    release has exactly one debit (``release_id`` is unique); amounts are exact ``NUMERIC``.
    """

    __tablename__ = "ledger_entry"
    __table_args__ = (
        CheckConstraint("kind IN ('grant', 'debit', 'adjustment')", name="kind"),
        CheckConstraint("epsilon >= 0 AND delta >= 0", name="amounts"),
        CheckConstraint("(kind = 'debit') = (release_id IS NOT NULL)", name="debit_release"),
        CheckConstraint("rho >= 0", name="rho"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    dataset_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("dataset.id"), index=True)
    kind: Mapped[str] = mapped_column(Text)
    epsilon: Mapped[Decimal] = mapped_column(Numeric)
    delta: Mapped[Decimal] = mapped_column(Numeric)
    #: The rho a grant adds or a debit spends (zCDP tables; 0 in pure ones). A zCDP table's
    #: debit keeps the query's (epsilon, delta) in the two columns above, as asked.
    rho: Mapped[Decimal] = mapped_column(Numeric, default=Decimal(0), server_default="0")
    reason: Mapped[str | None] = mapped_column(Text)
    release_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("release.id"), unique=True)
    api_key_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("api_key.id"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class BudgetBalance(Base):
    """Granted and spent (epsilon, delta) of one dataset: the ledger's running totals.

    Written only by the ``ledger_entry_apply`` trigger, in the transaction that inserts the
    ledger row, so it always equals the sums of the dataset's ledger rows (direct writes are
    refused by ``budget_balance_guard``). ``no_overdraft`` makes PostgreSQL itself refuse any
    debit that would spend more than was granted, whoever inserts it and under any isolation
    level (migration 0003): (epsilon, delta) in a pure table, rho in a zCDP one (0016).
    """

    __tablename__ = "budget_balance"
    __table_args__ = (
        CheckConstraint(
            "(accounting = 'zcdp' OR (spent_epsilon <= granted_epsilon AND spent_delta <= "
            "granted_delta)) AND spent_rho <= granted_rho",
            name="no_overdraft",
        ),
        CheckConstraint("spent_epsilon >= 0 AND spent_delta >= 0", name="nonnegative"),
        CheckConstraint("spent_rho >= 0", name="nonnegative_rho"),
    )

    dataset_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("dataset.id"), primary_key=True)
    granted_epsilon: Mapped[Decimal] = mapped_column(Numeric)
    granted_delta: Mapped[Decimal] = mapped_column(Numeric)
    spent_epsilon: Mapped[Decimal] = mapped_column(Numeric)
    spent_delta: Mapped[Decimal] = mapped_column(Numeric)
    granted_rho: Mapped[Decimal] = mapped_column(Numeric, server_default="0")
    spent_rho: Mapped[Decimal] = mapped_column(Numeric, server_default="0")
    #: The table's accounting (``pure``: the (epsilon, delta) sums are the balance;
    #: ``zcdp``: rho is), copied from the dataset when the row is created.
    accounting: Mapped[str] = mapped_column(String(8), server_default="pure")


class BackupEvent(Base):
    """A backup taken by ``dpquant backup``: written just before the dump, so the dump holds
    the time it was taken (``dpquant restore`` holds every budget from then on)."""

    __tablename__ = "backup_event"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    taken_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    note: Mapped[str | None] = mapped_column(Text)

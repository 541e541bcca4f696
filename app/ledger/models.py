"""The ``ledger_entry`` table: append-only grants and debits."""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal

from sqlalchemy import BigInteger, CheckConstraint, DateTime, ForeignKey, Identity, Numeric, Text
from sqlalchemy.orm import Mapped, mapped_column

from app.db import Base


class LedgerEntry(Base):
    """One grant (budget added) or debit (cost of one release).

    Invariants: rows are only ever inserted; a debit references exactly one release and a
    release has exactly one debit (``release_id`` is unique); amounts are exact ``NUMERIC``.
    """

    __tablename__ = "ledger_entry"
    __table_args__ = (
        CheckConstraint("kind IN ('grant', 'debit')", name="kind"),
        CheckConstraint("epsilon >= 0 AND delta >= 0", name="amounts"),
        CheckConstraint("(kind = 'debit') = (release_id IS NOT NULL)", name="debit_release"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    dataset_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("dataset.id"), index=True)
    kind: Mapped[str] = mapped_column(Text)
    epsilon: Mapped[Decimal] = mapped_column(Numeric)
    delta: Mapped[Decimal] = mapped_column(Numeric)
    reason: Mapped[str | None] = mapped_column(Text)
    release_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("release.id"), unique=True)
    api_key_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("api_key.id"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))

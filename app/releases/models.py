"""The ``release`` table: every differentially private answer ever returned."""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal

from sqlalchemy import (
    BigInteger,
    DateTime,
    Double,
    ForeignKey,
    Identity,
    Numeric,
    String,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from app.db import Base


class Release(Base):
    """A stored release: parameters, snapped estimates, cost and the budget left after it.

    ``seq`` orders releases (newest first in listings). ``(api_key_id, dataset_id,
    idempotency_key)`` is unique, so one key can never buy two releases.
    """

    __tablename__ = "release"
    __table_args__ = (
        UniqueConstraint("api_key_id", "dataset_id", "idempotency_key", name="uq_release_idem"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, Identity(), unique=True)
    dataset_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("dataset.id"), index=True)
    api_key_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("api_key.id"))
    method: Mapped[str] = mapped_column(String(64))
    quantiles: Mapped[list[float]] = mapped_column(ARRAY(Double))
    estimates: Mapped[list[float]] = mapped_column(ARRAY(Double))
    epsilon: Mapped[Decimal] = mapped_column(Numeric)
    delta: Mapped[Decimal | None] = mapped_column(Numeric)
    cost_epsilon: Mapped[Decimal] = mapped_column(Numeric)
    cost_delta: Mapped[Decimal] = mapped_column(Numeric)
    remaining_epsilon: Mapped[Decimal] = mapped_column(Numeric)
    remaining_delta: Mapped[Decimal] = mapped_column(Numeric)
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    request_hash: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))

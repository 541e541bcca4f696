"""The ``release`` table: every differentially private answer ever returned."""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Double,
    ForeignKey,
    Identity,
    Index,
    Integer,
    Numeric,
    String,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.core.db import Base

#: The states of a release (migration 0003): reserved and paid, answered, or failed (paid).
PENDING, DONE, FAILED = "pending", "done", "failed"


class Release(Base):
    """A stored release: parameters, cost, the budget left after it, state and estimates.

    ``seq`` orders releases (newest first in listings). ``(api_key_id, dataset_id,
    idempotency_key)`` is unique, so one key can never buy two releases.

    A release is inserted ``pending`` together with its debit (the reservation); a worker
    holding the lease (``lease_token`` until ``lease_until``) runs the mechanism and sets
    ``done`` with the estimates, or ``failed`` with a reason. ``attempts`` counts mechanism
    runs started. PostgreSQL keeps a done release immutable and the priced parameters fixed
    (trigger ``release_guard``).
    """

    __tablename__ = "release"
    __table_args__ = (
        UniqueConstraint("api_key_id", "dataset_id", "idempotency_key", name="uq_release_idem"),
        CheckConstraint("status IN ('pending', 'done', 'failed')", name="status"),
        CheckConstraint("(status = 'done') = (estimates IS NOT NULL)", name="estimates_iff_done"),
        CheckConstraint("(status = 'failed') = (failure IS NOT NULL)", name="failure_iff_failed"),
        CheckConstraint(
            "(group_by IS NULL) = (group_keys IS NULL)", name="group_keys_iff_group_by"
        ),
        Index("ix_release_pending", "seq", postgresql_where=text("status = 'pending'")),
        # the queue caps' counts (migration 0010)
        Index("ix_release_pending_key", "api_key_id", postgresql_where=text("status = 'pending'")),
        Index(
            "ix_release_pending_dataset", "dataset_id", postgresql_where=text("status = 'pending'")
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, Identity(), unique=True)
    dataset_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("dataset.id"), index=True)
    api_key_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("api_key.id"))
    method: Mapped[str] = mapped_column(String(64))
    quantiles: Mapped[list[float]] = mapped_column(ARRAY(Double))
    estimates: Mapped[list[float] | None] = mapped_column(ARRAY(Double))
    epsilon: Mapped[Decimal] = mapped_column(Numeric)
    delta: Mapped[Decimal | None] = mapped_column(Numeric)
    cost_epsilon: Mapped[Decimal] = mapped_column(Numeric)
    cost_delta: Mapped[Decimal] = mapped_column(Numeric)
    #: (epsilon, delta) left after this release in a pure table; NULL in a zCDP table.
    remaining_epsilon: Mapped[Decimal | None] = mapped_column(Numeric)
    remaining_delta: Mapped[Decimal | None] = mapped_column(Numeric)
    #: The rho this release debited (0 in a pure table) and, in a zCDP table, the rho left.
    cost_rho: Mapped[Decimal] = mapped_column(Numeric, server_default="0")
    remaining_rho: Mapped[Decimal | None] = mapped_column(Numeric)
    #: The reservation's W3C traceparent (tracing on), so the worker's spans join its trace.
    trace_parent: Mapped[str | None] = mapped_column(String(64))
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    request_hash: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    status: Mapped[str] = mapped_column(String(16))
    failure: Mapped[str | None] = mapped_column(String(32))
    attempts: Mapped[int] = mapped_column(Integer)
    lease_token: Mapped[uuid.UUID | None] = mapped_column()
    lease_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: When the current (last) run started (migration 0011).
    run_started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: When the finished release becomes visible to non-admin readers: the later of its
    #: finish and its run's start plus the public run-time bound (migration 0011).
    published_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: The dataset's data version the run loaded (migration 0013).
    data_version: Mapped[int | None] = mapped_column(Integer)
    #: The column the release reads (migration 0014).
    column_name: Mapped[str] = mapped_column(String(200), server_default=text("'value'"))
    #: A-priori expected missed points of the method (migration 0006): one
    #: ``{quantile, mean, bound90}`` per quantile, or NULL when unknown. Public figures only.
    expected_error: Mapped[list[dict[str, float]] | None] = mapped_column(JSONB)
    #: Warnings computed with the expected error (e.g. noise is a large share of the ranks).
    warnings: Mapped[list[str]] = mapped_column(JSONB, server_default=text("'[]'::jsonb"))
    #: A grouped release (migration 0020): the categorical column it groups by and the keys
    #: it answers, in order; ``estimates`` then holds m values per key, key after key.
    group_by: Mapped[str | None] = mapped_column(String(200))
    group_keys: Mapped[list[str] | dict[str, object] | None] = mapped_column(JSONB)
    #: Keys discovered by partition selection: those it kept (set with the estimates).
    selected_keys: Mapped[list[str] | None] = mapped_column(JSONB)
    #: The expected error as a function of group size (public figures only), or NULL.
    group_error: Mapped[dict[str, object] | None] = mapped_column(JSONB)
    #: Error bars in the data's units (migration 0021): one ``{quantile, low, high}`` per
    #: estimate, set with the estimates (post-processing of public figures), or NULL; a
    #: grouped release's: one list of them per group answered (NULL for a key without a
    #: size hint).
    intervals: Mapped[list[object] | None] = mapped_column(JSONB)

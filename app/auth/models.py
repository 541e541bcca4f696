"""The ``api_key`` table."""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal

from sqlalchemy import Boolean, CheckConstraint, DateTime, ForeignKey, Numeric, String, text
from sqlalchemy.orm import Mapped, mapped_column

from app.core.db import Base

ROLES = ("admin", "analyst", "viewer")


class ApiKey(Base):
    """An API key: only its SHA-256 hash and a short public prefix are stored.

    ``max_epsilon`` / ``max_delta`` cap what the key may spend in total (NULL: no cap);
    ``spent_epsilon`` / ``spent_delta`` are its running totals, written only by the ledger
    trigger in the transaction of each debit naming the key, so ``key_cap`` makes PostgreSQL
    itself refuse a debit over the cap (migration 0005; direct writes are refused by
    ``api_key_guard``). ``last_used_at`` is refreshed at most once a minute.
    """

    __tablename__ = "api_key"
    __table_args__ = (
        CheckConstraint("role IN ('admin', 'analyst', 'viewer')", name="role"),
        CheckConstraint("role <> 'admin' OR dataset_id IS NULL", name="admin_unscoped"),
        CheckConstraint(
            "(max_epsilon IS NULL OR spent_epsilon <= max_epsilon) "
            "AND (max_delta IS NULL OR spent_delta <= max_delta)",
            name="key_cap",
        ),
        CheckConstraint("spent_epsilon >= 0 AND spent_delta >= 0", name="key_spent_nonnegative"),
        CheckConstraint(
            "retired_at IS NULL OR (bootstrap AND revoked_at IS NOT NULL)",
            name="retired_is_revoked_bootstrap",
        ),
        CheckConstraint("kind IN ('key', 'oidc')", name="kind"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(16))
    dataset_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("dataset.id"), index=True)
    name: Mapped[str] = mapped_column(String(300))
    #: ``key`` (an API key) or ``oidc`` (an OpenID Connect subject: ``name`` is the subject)
    kind: Mapped[str] = mapped_column(String(8), server_default="key", default="key")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: Registered from ``DPQUANT_BOOTSTRAP_ADMIN_KEY``; revoked when the variable changes.
    bootstrap: Mapped[bool] = mapped_column(Boolean, server_default=text("false"), default=False)
    #: A bootstrap key revoked because a server started with the variable unset (set with
    #: ``revoked_at``): a start with the same value again restores it. A key an admin
    #: revoked has no ``retired_at`` and stays revoked.
    retired_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    max_epsilon: Mapped[Decimal | None] = mapped_column(Numeric)
    max_delta: Mapped[Decimal | None] = mapped_column(Numeric)
    spent_epsilon: Mapped[Decimal] = mapped_column(
        Numeric, server_default=text("0"), default=Decimal(0)
    )
    spent_delta: Mapped[Decimal] = mapped_column(
        Numeric, server_default=text("0"), default=Decimal(0)
    )
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    rotated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

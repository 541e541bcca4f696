"""The ``audit_event`` table: append-only, like the ledger (migration 0005)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, ForeignKey, Identity, String, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.core.db import Base


class AuditEvent(Base):
    """One admin action: who (key id and public prefix), what, on which object, when.

    ``details`` holds public figures only (names, bounds, roles, budget amounts, an upload's
    mode and byte size), never a data value and never ``n``. PostgreSQL refuses UPDATE,
    DELETE and TRUNCATE on this table (triggers ``audit_event_no_*``).
    """

    __tablename__ = "audit_event"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    actor_key_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("api_key.id"))
    actor_prefix: Mapped[str | None] = mapped_column(String(16))
    #: The acting OpenID Connect token's subject (None for keys and the command line).
    actor_subject: Mapped[str | None] = mapped_column(String(300))
    action: Mapped[str] = mapped_column(String(64))
    target_type: Mapped[str] = mapped_column(String(32))
    target_id: Mapped[str | None] = mapped_column(String(64))
    details: Mapped[dict[str, Any]] = mapped_column(
        JSONB, server_default=text("'{}'::jsonb"), default=dict
    )

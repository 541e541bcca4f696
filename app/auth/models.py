"""The ``api_key`` table."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import Boolean, CheckConstraint, DateTime, ForeignKey, String, text
from sqlalchemy.orm import Mapped, mapped_column

from app.db import Base

ROLES = ("admin", "analyst", "viewer")


class ApiKey(Base):
    """An API key: only its SHA-256 hash and a short public prefix are stored."""

    __tablename__ = "api_key"
    __table_args__ = (
        CheckConstraint("role IN ('admin', 'analyst', 'viewer')", name="role"),
        CheckConstraint("role <> 'admin' OR dataset_id IS NULL", name="admin_unscoped"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(16))
    dataset_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("dataset.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: Registered from ``DPQUANT_BOOTSTRAP_ADMIN_KEY``; revoked when the variable changes.
    bootstrap: Mapped[bool] = mapped_column(Boolean, server_default=text("false"), default=False)

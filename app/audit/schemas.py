"""Bodies of the audit endpoint."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class AuditEventPublic(BaseModel):
    """One admin action."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    created_at: datetime
    actor_key_id: uuid.UUID | None = Field(description="The acting key (null: command line).")
    actor_prefix: str | None = Field(description="The acting key's public prefix.")
    actor_subject: str | None = Field(
        default=None, description="The acting OpenID Connect token's subject (null for keys)."
    )
    action: str = Field(description="e.g. key.create, key.rotate, dataset.archive, budget.grant")
    target_type: str
    target_id: str | None
    details: dict[str, Any] = Field(description="Public figures only; never a data value.")


class AuditPage(BaseModel):
    """A page of audit events, newest first; pass ``next_cursor`` to get older ones."""

    items: list[AuditEventPublic]
    next_cursor: str | None

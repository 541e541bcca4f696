"""Recording and reading admin actions.

Every admin action is recorded by the service that performs it, in the same transaction, so
an action and its audit event commit (or roll back) together.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.audit.models import AuditEvent
from app.core.principal import Principal


def record(
    session: Session,
    *,
    actor: Principal | None,
    action: str,
    target_type: str,
    target_id: uuid.UUID | str | None,
    details: dict[str, Any] | None = None,
) -> AuditEvent:
    """Append one event (``actor`` None: the command line, e.g. ``dpquant create-key``).

    ``details`` must hold public figures only: never a data value, never ``n``.
    """
    event = AuditEvent(
        created_at=datetime.now(UTC),
        actor_key_id=None if actor is None else actor.key_id,
        actor_prefix=None if actor is None else actor.prefix,
        actor_subject=None if actor is None else actor.subject,
        action=action,
        target_type=target_type,
        target_id=None if target_id is None else str(target_id),
        details=details or {},
    )
    session.add(event)
    session.flush()
    return event


def list_events(session: Session, *, before: int | None, limit: int) -> list[AuditEvent]:
    """Up to ``limit`` events, newest first, with ``id < before`` when a cursor is given."""
    stmt = select(AuditEvent)
    if before is not None:
        stmt = stmt.where(AuditEvent.id < before)
    return list(session.scalars(stmt.order_by(AuditEvent.id.desc()).limit(limit)))

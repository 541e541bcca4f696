"""API keys: generation, hashing, lookup, expiry, usage, rotation, revocation, caps.

Admin actions on keys (create, revoke, rotate) are recorded in the audit log in the same
transaction.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, NamedTuple

import psycopg
from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from app.audit.service import record
from app.auth.models import ApiKey
from app.core.errors import DpquantError, invalid, not_found
from app.core.principal import Principal
from app.datasets.models import Dataset

KEY_PREFIX = "dpq_"
#: Characters of a key shown in listings (``dpq_`` plus 8 of the random part).
PUBLIC_PREFIX_LENGTH = 12
#: Name of the key registered from ``DPQUANT_BOOTSTRAP_ADMIN_KEY``.
BOOTSTRAP_NAME = "bootstrap admin (DPQUANT_BOOTSTRAP_ADMIN_KEY)"
#: ``last_used_at`` is written at most this often per key (not once per request).
LAST_USED_RESOLUTION = timedelta(minutes=1)


def generate_key() -> str:
    """A new key: ``dpq_`` followed by 256 random bits, url-safe base64."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(raw: str) -> str:
    """The SHA-256 hex digest under which a key is stored (keys are high-entropy, no salt)."""
    return hashlib.sha256(raw.encode()).hexdigest()


_KEY_BY_HASH = (
    "SELECT id, key_hash, role, dataset_id, prefix, revoked_at, expires_at, last_used_at,"
    " max_epsilon IS NOT NULL OR max_delta IS NOT NULL AS capped"
    " FROM api_key WHERE key_hash = %s"
)
_TOUCH = (
    "UPDATE api_key SET last_used_at = %(now)s WHERE id IN ("
    " SELECT id FROM api_key WHERE id = %(id)s"
    " AND (last_used_at IS NULL OR last_used_at < %(stale)s)"
    " FOR UPDATE SKIP LOCKED)"
)


async def authenticate(
    conn: psycopg.AsyncConnection[Any], *, raw: str, now: datetime | None = None
) -> Principal | None:
    """The caller of the live key matching ``raw``, or None; the hash comparison runs in
    constant time.

    One indexed lookup on a pooled connection of the hot path (:mod:`app.core.pg`): every
    authenticated request pays it. Revoked and expired keys are None. ``last_used_at`` is
    refreshed when it is older than :data:`LAST_USED_RESOLUTION`: at most one write per key
    and minute, whatever the request rate and the number of processes (the UPDATE re-checks
    the age and skips a row another transaction is writing instead of waiting for it).
    """
    digest = hash_key(raw)
    cursor = await conn.execute(_KEY_BY_HASH, (digest,))
    key = await cursor.fetchone()
    if key is None:
        return None
    key_id, key_hash, role, scope, prefix, revoked_at, expires_at, last_used_at, capped = key
    if not hmac.compare_digest(key_hash, digest) or revoked_at is not None:
        return None
    now = now or datetime.now(UTC)
    if expires_at is not None and expires_at <= now:
        return None
    stale = now - LAST_USED_RESOLUTION
    if last_used_at is None or last_used_at < stale:
        await conn.execute(_TOUCH, {"now": now, "id": key_id, "stale": stale})
    return Principal(key_id=key_id, role=role, scope=scope, prefix=prefix, capped=bool(capped))


def _caps(key: ApiKey) -> dict[str, Any]:
    return {
        "max_epsilon": None if key.max_epsilon is None else str(key.max_epsilon),
        "max_delta": None if key.max_delta is None else str(key.max_delta),
    }


def create_key(
    session: Session,
    *,
    role: str,
    dataset_id: uuid.UUID | None,
    name: str,
    actor: Principal | None = None,
    max_epsilon: Decimal | None = None,
    max_delta: Decimal | None = None,
    expires_at: datetime | None = None,
) -> tuple[ApiKey, str]:
    """Store a new key's hash; returns the row and the raw key (shown once, never stored).

    ``max_epsilon`` / ``max_delta`` cap what the key may ever spend (None: no cap);
    ``expires_at`` (in the future) ends its validity. Recorded in the audit log.
    """
    if role == "admin" and dataset_id is not None:
        raise invalid("body.dataset_id", "admin keys cannot be scoped to a dataset")
    if dataset_id is not None and session.get(Dataset, dataset_id) is None:
        raise invalid("body.dataset_id", "unknown dataset")
    now = datetime.now(UTC)
    if expires_at is not None and expires_at <= now:
        raise invalid("body.expires_at", "must lie in the future")
    raw = generate_key()
    key = ApiKey(
        id=uuid.uuid4(),
        prefix=raw[:PUBLIC_PREFIX_LENGTH],
        key_hash=hash_key(raw),
        role=role,
        dataset_id=dataset_id,
        name=name,
        created_at=now,
        revoked_at=None,
        bootstrap=False,
        max_epsilon=max_epsilon,
        max_delta=max_delta,
        spent_epsilon=Decimal(0),
        spent_delta=Decimal(0),
        expires_at=expires_at,
        last_used_at=None,
        rotated_at=None,
    )
    session.add(key)
    session.flush()
    record(
        session,
        actor=actor,
        action="key.create",
        target_type="api_key",
        target_id=key.id,
        details={
            "prefix": key.prefix,
            "role": role,
            "dataset_id": None if dataset_id is None else str(dataset_id),
            "name": name,
            "expires_at": None if expires_at is None else expires_at.isoformat(),
            **_caps(key),
        },
    )
    return key, raw


def rotate_key(session: Session, *, key_id: uuid.UUID, actor: Principal) -> tuple[ApiKey, str]:
    """A new secret for the key (same id, role, scope, caps, expiry and spent totals).

    The old secret stops working with the commit: it is the stored hash that changes.
    Revoked, expired and bootstrap keys cannot be rotated (409 ``key_not_rotatable``; the
    bootstrap key follows ``DPQUANT_BOOTSTRAP_ADMIN_KEY``: change the variable instead).
    """
    key = session.scalars(
        select(ApiKey)
        .where(ApiKey.id == key_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).first()
    if key is None:
        raise not_found("key")
    now = datetime.now(UTC)
    if (
        key.revoked_at is not None
        or key.bootstrap
        or key.kind == "oidc"
        or (key.expires_at is not None and key.expires_at <= now)
    ):
        raise DpquantError(
            409,
            "key_not_rotatable",
            "revoked, expired and bootstrap keys and OpenID Connect subjects cannot be rotated",
        )
    old_prefix = key.prefix
    raw = generate_key()
    key.key_hash = hash_key(raw)
    key.prefix = raw[:PUBLIC_PREFIX_LENGTH]
    key.rotated_at = now
    session.flush()
    record(
        session,
        actor=actor,
        action="key.rotate",
        target_type="api_key",
        target_id=key.id,
        details={"old_prefix": old_prefix, "prefix": key.prefix},
    )
    return key, raw


class BootstrapOutcome(NamedTuple):
    """What :func:`ensure_bootstrap_key` did, for the server's log line."""

    #: the key is live now (registered, restored or live already)
    live: bool
    #: a new row was registered for this value
    registered: bool
    #: a key the server had retired was restored (the same value again)
    restored: bool
    #: other bootstrap keys retired (an earlier value of the variable)
    retired: int


def ensure_bootstrap_key(session: Session, *, raw: str) -> BootstrapOutcome:
    """Make ``raw`` the bootstrap admin key.

    Idempotent. The bootstrap key is tied to ``DPQUANT_BOOTSTRAP_ADMIN_KEY``: a key registered
    from an earlier value of the variable is retired here (revoked, with ``retired_at``).
    A retired key is restored when a server starts with its value again; a bootstrap key an
    admin revoked stays revoked (``live`` is False: the operator must choose a new value).
    Registrations, restorations and retirements are audited (no acting key).
    """
    digest = hash_key(raw)
    stmt = (
        insert(ApiKey)
        .values(
            id=uuid.uuid4(),
            prefix=raw[:PUBLIC_PREFIX_LENGTH] if raw.startswith(KEY_PREFIX) else "bootstrap",
            key_hash=digest,
            role="admin",
            dataset_id=None,
            name=BOOTSTRAP_NAME,
            created_at=datetime.now(UTC),
            bootstrap=True,
        )
        .on_conflict_do_nothing(index_elements=["key_hash"])
        .returning(ApiKey.id, ApiKey.prefix)
    )
    created = session.execute(stmt).all()
    for key_id, prefix in created:
        record(
            session,
            actor=None,
            action="key.create",
            target_type="api_key",
            target_id=key_id,
            details={"prefix": prefix, "role": "admin", "bootstrap": True},
        )
    restored = False
    live = bool(created)
    if not created:
        key = session.scalars(
            select(ApiKey).where(ApiKey.key_hash == digest).with_for_update()
        ).one()
        if key.retired_at is not None:
            key.revoked_at = None
            key.retired_at = None
            session.flush()
            record(
                session,
                actor=None,
                action="key.restore",
                target_type="api_key",
                target_id=key.id,
                details={"prefix": key.prefix, "bootstrap": True},
            )
            restored = True
        live = key.revoked_at is None
    retired = _retire_bootstrap(session, keep=digest)
    return BootstrapOutcome(live, bool(created), restored, retired)


def retire_bootstrap_keys(session: Session) -> int:
    """Retire every live bootstrap key (the variable is unset); returns how many."""
    return _retire_bootstrap(session, keep=None)


def _retire_bootstrap(session: Session, *, keep: str | None) -> int:
    now = datetime.now(UTC)
    stmt = (
        update(ApiKey)
        .where(ApiKey.bootstrap.is_(True), ApiKey.revoked_at.is_(None))
        .values(revoked_at=now, retired_at=now)
        .returning(ApiKey.id, ApiKey.prefix)
    )
    if keep is not None:
        stmt = stmt.where(ApiKey.key_hash != keep)
    retired = session.execute(stmt.execution_options(synchronize_session=False)).all()
    for key_id, prefix in retired:
        record(
            session,
            actor=None,
            action="key.retire",
            target_type="api_key",
            target_id=key_id,
            details={"prefix": prefix, "bootstrap": True},
        )
    return len(retired)


def list_keys(session: Session) -> list[ApiKey]:
    """All keys, newest first."""
    return list(session.scalars(select(ApiKey).order_by(ApiKey.created_at.desc(), ApiKey.id)))


def revoke_key(session: Session, *, key_id: uuid.UUID, actor: Principal | None = None) -> ApiKey:
    """Revoke a key at once (idempotent; recorded once in the audit log); 404 when unknown.

    A bootstrap key the server retired is revoked for good here (it is not restored when a
    server starts with its value again)."""
    key = session.get(ApiKey, key_id, with_for_update=True, populate_existing=True)
    if key is None:
        raise not_found("key")
    if key.revoked_at is None or key.retired_at is not None:
        # an admin's revocation is final: a retired bootstrap key loses its way back
        key.revoked_at = key.revoked_at or datetime.now(UTC)
        key.retired_at = None
        session.flush()
        record(
            session,
            actor=actor,
            action="key.revoke",
            target_type="api_key",
            target_id=key.id,
            details={"prefix": key.prefix},
        )
    return key


def set_caps(
    session: Session,
    *,
    key_id: uuid.UUID,
    caps: dict[str, Decimal | None],
    actor: Principal | None = None,
) -> ApiKey:
    """Set (or, with None, remove) a key's or an OpenID Connect subject's spending caps;
    ``caps`` holds only the fields to change. 409 when a cap would lie below what was
    already spent (PostgreSQL's ``key_cap`` would refuse the next debit anyway)."""
    key = session.get(ApiKey, key_id, with_for_update=True, populate_existing=True)
    if key is None:
        raise not_found("key")
    for name, value in caps.items():
        spent = key.spent_epsilon if name == "max_epsilon" else key.spent_delta
        if value is not None and value < spent:
            raise DpquantError(
                409,
                "key_budget_exhausted",
                f"{name} {value} lies below what this key already spent ({spent})",
            )
        setattr(key, name, value)
    session.flush()
    record(
        session,
        actor=actor,
        action="key.caps",
        target_type="api_key",
        target_id=key.id,
        details={"prefix": key.prefix, **_caps(key)},
    )
    return key

"""API keys: generation, hashing, lookup, revocation."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from datetime import UTC, datetime

from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from app.auth.models import ApiKey
from app.datasets.models import Dataset
from app.errors import invalid, not_found

KEY_PREFIX = "dpq_"
#: Characters of a key shown in listings (``dpq_`` plus 8 of the random part).
PUBLIC_PREFIX_LENGTH = 12
#: Name of the key registered from ``DPQUANT_BOOTSTRAP_ADMIN_KEY``.
BOOTSTRAP_NAME = "bootstrap admin (DPQUANT_BOOTSTRAP_ADMIN_KEY)"


def generate_key() -> str:
    """A new key: ``dpq_`` followed by 256 random bits, url-safe base64."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(raw: str) -> str:
    """The SHA-256 hex digest under which a key is stored (keys are high-entropy, no salt)."""
    return hashlib.sha256(raw.encode()).hexdigest()


def authenticate(session: Session, *, raw: str) -> ApiKey | None:
    """The live key matching ``raw``, or None; the hash comparison runs in constant time."""
    digest = hash_key(raw)
    key = session.scalars(select(ApiKey).where(ApiKey.key_hash == digest)).first()
    if key is None or not hmac.compare_digest(key.key_hash, digest):
        return None
    if key.revoked_at is not None:
        return None
    return key


def create_key(
    session: Session, *, role: str, dataset_id: uuid.UUID | None, name: str
) -> tuple[ApiKey, str]:
    """Store a new key's hash; returns the row and the raw key (shown once, never stored)."""
    if role == "admin" and dataset_id is not None:
        raise invalid("body.dataset_id", "admin keys cannot be scoped to a dataset")
    if dataset_id is not None and session.get(Dataset, dataset_id) is None:
        raise invalid("body.dataset_id", "unknown dataset")
    raw = generate_key()
    key = ApiKey(
        id=uuid.uuid4(),
        prefix=raw[:PUBLIC_PREFIX_LENGTH],
        key_hash=hash_key(raw),
        role=role,
        dataset_id=dataset_id,
        name=name,
        created_at=datetime.now(UTC),
        revoked_at=None,
        bootstrap=False,
    )
    session.add(key)
    session.flush()
    return key, raw


def ensure_bootstrap_key(session: Session, *, raw: str) -> int:
    """Make ``raw`` the bootstrap admin key; returns how many earlier bootstrap keys it revoked.

    Idempotent. The bootstrap key is tied to ``DPQUANT_BOOTSTRAP_ADMIN_KEY``: a key registered
    from an earlier value of the variable is revoked here, and a bootstrap key an admin
    revoked stays revoked.
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
    )
    session.execute(stmt)
    return _revoke_bootstrap(session, keep=digest)


def retire_bootstrap_keys(session: Session) -> int:
    """Revoke every bootstrap key (the variable is unset); returns how many were live."""
    return _revoke_bootstrap(session, keep=None)


def _revoke_bootstrap(session: Session, *, keep: str | None) -> int:
    stmt = (
        update(ApiKey)
        .where(ApiKey.bootstrap.is_(True), ApiKey.revoked_at.is_(None))
        .values(revoked_at=datetime.now(UTC))
    )
    if keep is not None:
        stmt = stmt.where(ApiKey.key_hash != keep)
    result = session.execute(stmt)
    return int(getattr(result, "rowcount", 0) or 0)


def list_keys(session: Session) -> list[ApiKey]:
    """All keys, newest first."""
    return list(session.scalars(select(ApiKey).order_by(ApiKey.created_at.desc(), ApiKey.id)))


def revoke_key(session: Session, *, key_id: uuid.UUID) -> ApiKey:
    """Revoke a key at once (idempotent); 404 when unknown."""
    key = session.get(ApiKey, key_id)
    if key is None:
        raise not_found("key")
    if key.revoked_at is None:
        key.revoked_at = datetime.now(UTC)
        session.flush()
    return key

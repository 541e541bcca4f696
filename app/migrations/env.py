"""Alembic environment: URL from ``Config.attributes`` (set by app.core.db) or from Settings."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from app.core.config import Settings
from app.core.db import normalize_url, resolve_database_url
from app.models import load_models

config = context.config
target_metadata = load_models()


def _url() -> str:
    url = config.attributes.get("database_url")
    if url:
        return str(url)
    url, _ = resolve_database_url(Settings())
    return normalize_url(url)


def run_migrations_offline() -> None:
    """Emit SQL without a connection (``alembic upgrade head --sql``)."""
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run against a live connection (or one handed over in ``attributes['connection']``)."""
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()

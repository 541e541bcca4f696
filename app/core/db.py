"""Database plumbing: declarative base, engine, sessions, embedded PostgreSQL, Alembic.

Transactions: one session per request (:data:`app.api.deps.SessionDep`, which commits when
the endpoint returns and rolls back when it raises, before the response is sent; a commit
whose outcome never arrived is :class:`CommitOutcomeUnknown`). The release path
(authentication, reservation, the workers' queue) does not use sessions: see
:mod:`app.core.pg`.

Isolation: every connection the service opens runs its transactions at READ COMMITTED,
whatever ``default_transaction_isolation`` the database or role sets. The ledger's
locking protocol (lock the dataset row, then read the balance) relies on each statement
seeing what was committed before it; under REPEATABLE READ a read after the lock would see
the transaction's older snapshot. The balance row's CHECK constraint holds at any level.
"""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, MetaData, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import DeclarativeBase

from app.core.config import Settings
from app.core.guard import hide_result_rows

logger = logging.getLogger(__name__)

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base of every table; constraint names follow :data:`NAMING_CONVENTION`."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


# --------------------------------------------------------------------------- URLs and engines

#: Pinned on every connection (see the module docstring).
ISOLATION_LEVEL = "READ COMMITTED"


def normalize_url(url: str) -> str:
    """Make a libpq/pgserver URL usable by SQLAlchemy with psycopg 3."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def start_embedded_postgres(data_dir: Path) -> str:
    """Start (or reuse) the embedded PostgreSQL under ``data_dir``; returns its SQLAlchemy URL.

    The server keeps running while any process holding a handle lives (pgserver tracks them).
    """
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); harmless here.
        warnings.simplefilter("ignore")
        import pgserver

    data_dir = Path(data_dir).expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(  # type: ignore[attr-defined]
        data_dir / "pgdata", cleanup_mode="stop"
    )
    uri: str = server.get_uri()
    logger.info("embedded PostgreSQL running with data under %s", data_dir / "pgdata")
    return normalize_url(uri)


def resolve_database_url(settings: Settings) -> tuple[str, bool]:
    """The URL to use and whether it is the embedded server (started here if needed)."""
    if settings.database_url:
        return normalize_url(settings.database_url), False
    return start_embedded_postgres(settings.data_dir), True


def make_engine(
    url: str, settings: Settings, *, process: str = "api", pre_ping: bool = True
) -> Engine:
    """An engine with a bounded pool, a liveness ping for idle connections (survives
    PostgreSQL restarts) and hidden statement parameters (never a data value in a log line
    or an exception message).

    ``pre_ping`` pings a pooled connection at checkout only when it has sat idle in the pool
    for more than :data:`IDLE_PING_S` (see :func:`ping_idle_connections`); a busy pool pays
    no round trip for it. ``pre_ping=False`` never pings, for callers that retry on a lost
    connection themselves (the release workers: a stale pooled connection fails one attempt,
    SQLAlchemy then discards the pool, and the worker's loop tries again). ``process``
    labels the pool in the ``dpquant_db_pool_*`` metrics."""
    connect_args: dict[str, Any] = {"connect_timeout": settings.connect_timeout_s}
    hide_result_rows()  # no data value in logs, even with SQL logging at DEBUG
    engine = create_engine(
        normalize_url(url),
        isolation_level=ISOLATION_LEVEL,
        hide_parameters=True,
        pool_size=settings.pool_size,
        max_overflow=settings.max_overflow,
        pool_timeout=settings.pool_timeout_s,
        connect_args=connect_args,
    )
    if pre_ping:
        ping_idle_connections(engine)
    pin_sessions(engine, statement_timeout_ms=settings.statement_timeout_ms)
    from app.core.metrics import (
        instrument_pool,  # imported late: see app.runtime.cli.ensure_metrics_dir
    )

    instrument_pool(engine, process=process, capacity=settings.pool_size + settings.max_overflow)
    return engine


def session_statements(statement_timeout_ms: int) -> list[str]:
    """The settings every connection of the service runs with, SQLAlchemy's and psycopg's
    own (:mod:`app.core.pg`), set once per connection when it is opened:

    * READ COMMITTED as the session default, whatever ``default_transaction_isolation`` the
      database or role sets (see the module docstring; SQLAlchemy's engines also pin it per
      transaction);
    * timestamps in UTC, whatever the server's ``TimeZone``: a response built in memory
      (an announced finish time) and a later read of the same row serialise to the same
      bytes;
    * bounded statements and lock waits (no statement or lock wait may hang a
      request; past the bound the statement fails and the service answers 503).
    """
    statements = [
        "SET default_transaction_isolation = 'read committed'",
        "SET TimeZone = 'UTC'",
    ]
    if statement_timeout_ms > 0:
        statements += [
            f"SET statement_timeout = {int(statement_timeout_ms)}",
            f"SET lock_timeout = {int(statement_timeout_ms)}",
        ]
    return statements


def pin_sessions(engine: Engine, *, statement_timeout_ms: int) -> None:
    """Run :func:`session_statements` on each new connection of ``engine`` (``SET`` keeps
    any ``options``/``search_path`` of the URL intact)."""
    statements = session_statements(statement_timeout_ms)

    @event.listens_for(engine, "connect")
    def _pin(dbapi_connection: Any, record: Any) -> None:
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        with dbapi_connection.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement)
        dbapi_connection.autocommit = autocommit


#: A pooled connection idle for longer than this is pinged before use. A connection reused
#: sooner was working that recently; should the server have restarted in between, the
#: first statement fails with the connection invalidated (that request answers 503) and
#: SQLAlchemy discards the pool.
IDLE_PING_S = 1.0

_CHECKED_IN = "dpquant_checked_in"


def ping_idle_connections(engine: Engine, idle_s: float = IDLE_PING_S) -> None:
    """Ping a pooled connection at checkout if it was idle for more than ``idle_s``.

    SQLAlchemy's ``pool_pre_ping`` pings at *every* checkout: a round trip per transaction
    (three per release in the web process). Under load connections come back to the pool
    and leave again within milliseconds, so this pings only the ones that waited, which is
    where a server restart or an idle-connection timeout leaves dead sockets. A failed
    ping raises ``DisconnectionError``: the pool then discards the connection and checks
    out another (SQLAlchemy's documented pessimistic-disconnect recipe).
    """

    @event.listens_for(engine, "checkin")
    def _checked_in(dbapi_connection: Any, record: Any) -> None:
        record.info[_CHECKED_IN] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        since = record.info.get(_CHECKED_IN)
        if since is None or time.monotonic() - since <= idle_s:
            return  # a new connection, or one that worked a moment ago
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            raise DisconnectionError("idle connection failed its ping") from exc


def redact_url(url: str) -> str:
    """The URL with any password hidden, for logs."""
    return make_url(url).render_as_string(hide_password=True)


# --------------------------------------------------------------------------- sessions


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a database error, if there is one."""
    orig = getattr(exc, "orig", None)
    state = getattr(orig, "sqlstate", None)
    return str(state) if state else None


class CommitOutcomeUnknown(Exception):
    """The COMMIT was sent but its result never arrived: it may or may not have happened."""


# --------------------------------------------------------------------------- migrations


def migrations_dir() -> Path:
    """The Alembic script directory, shipped inside the package (``app/migrations``), so an
    installed wheel migrates without a checkout."""
    found = Path(__file__).resolve().parents[1] / "migrations"
    if not (found / "env.py").is_file():
        raise FileNotFoundError(f"the package's migrations are missing ({found})")
    return found


def alembic_config(url: str) -> Any:
    """An Alembic ``Config`` bound to ``url`` and the project's script directory."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.attributes["database_url"] = normalize_url(url)
    return cfg


def upgrade_database(url: str, revision: str = "head") -> None:
    """Apply migrations up to ``revision`` (idempotent)."""
    from alembic import command

    command.upgrade(alembic_config(url), revision)


def downgrade_database(url: str, revision: str = "base") -> None:
    """Revert migrations down to ``revision``."""
    from alembic import command

    command.downgrade(alembic_config(url), revision)


def head_revisions() -> set[str]:
    """The revision ids of the migration heads shipped with this code."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory(str(migrations_dir()))
    return set(script.get_heads())


def current_revisions(engine: Engine) -> set[str]:
    """The revision ids recorded in the database (empty when never migrated)."""
    with engine.connect() as conn:
        exists = conn.execute(text("SELECT to_regclass('alembic_version') IS NOT NULL")).scalar()
        if not exists:
            return set()
        rows = conn.execute(text("SELECT version_num FROM alembic_version")).scalars()
        return {str(r) for r in rows}

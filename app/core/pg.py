"""Direct psycopg 3 access for the hot paths: authentication, reservations, the release queue.

SQLAlchemy serves everything else (admin endpoints, uploads, migrations). The paths every
release takes go to psycopg directly, because there the ORM's per-statement cost was most
of the service's CPU: measured on a 2-core machine, a session round trip cost ~0.4-0.7 ms
of client CPU against ~0.1 ms for the same statement on a psycopg connection, and a release
made six of them in the web process and two in the worker.

* The web processes use an :class:`~psycopg_pool.AsyncConnectionPool` on their event loop
  (:class:`HotPool`): authentication and the reservation run without a thread hop.
* Release workers use one synchronous connection each (:class:`Link`).

Every connection opened here gets the same session settings as the SQLAlchemy engine's
(:func:`app.core.db.session_statements`): READ COMMITTED pinned whatever
``default_transaction_isolation`` the database or role sets (the ledger's locking protocol
relies on each statement seeing what was committed before it), timestamps in UTC,
and bounded statements and lock waits. Connections run in autocommit: each hot-path
operation is one statement, so there is no BEGIN or COMMIT round trip, and PostgreSQL runs
the statement as its own transaction.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar
from weakref import WeakKeyDictionary

import psycopg
from psycopg_pool import AsyncConnectionPool
from sqlalchemy.engine import make_url

from app.core.config import Settings
from app.core.db import IDLE_PING_S, CommitOutcomeUnknown, session_statements

logger = logging.getLogger(__name__)

T = TypeVar("T")
AsyncConnection = psycopg.AsyncConnection[Any]

#: Backoff jitter between retried statements (the OS source; nothing here is private).
_JITTER = secrets.SystemRandom()

#: SQLSTATEs after which a statement can simply be run again.
RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})  # serialization_failure, deadlock_detected


def conninfo(url: str) -> str:
    """A libpq URI for a SQLAlchemy ``url`` (the driver suffix removed, options kept)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a psycopg error, if there is one."""
    state = getattr(exc, "sqlstate", None)
    return str(state) if state else None


def _pool_gauges(process: str, capacity: int) -> Any:
    """Count ``capacity`` in ``dpquant_db_pool_capacity`` for ``process``; the in-use gauge.

    Imported here, not at the top: prometheus_client reads its multiprocess directory at
    import (see :func:`app.runtime.cli.ensure_metrics_dir`).
    """
    from app.core.metrics import POOL_CAPACITY, POOL_IN_USE

    POOL_CAPACITY.labels(process).inc(capacity)
    return POOL_IN_USE.labels(process)


# --------------------------------------------------------------------------- web processes


class HotPool:
    """The web process's connections for the hot paths: a pool of autocommit connections on
    the event loop that opened it (uvicorn runs one loop per process).

    ``connection()`` on another event loop gets a connection of its own, opened and closed
    around the use: an asyncio pool must not be shared between loops (its locks and
    connections belong to one), and test clients run each request in a loop of their own.

    A pooled connection that sat idle for more than :data:`IDLE_PING_S` is pinged when it is
    taken out (an empty query; a dead one is replaced), which is where a server restart or an
    idle timeout leaves dead sockets. Busy connections come back within milliseconds and are
    not pinged.

    Outages fail fast: while the pool's last attempt to connect failed and it has no
    connection to give, an operation connects on its own instead of queueing for the pool's
    timeout, so a database that refuses connections is a 503 at once (the pool would keep
    every request waiting ``pool_timeout_s`` while it retries with backoff), and requests
    are served again as soon as the database answers, before the pool has refilled.
    """

    def __init__(self, url: str, settings: Settings, *, process: str = "api") -> None:
        self._conninfo = conninfo(url)
        self._statements = session_statements(settings.statement_timeout_ms)
        self._connect_timeout = settings.connect_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._in_use = _pool_gauges(process, max(1, settings.pool_size))
        self._connect_failed = False  # the pool's last connection attempt failed
        self._returned: WeakKeyDictionary[AsyncConnection, float] = WeakKeyDictionary()
        returned = self._returned
        health = self

        class Tracked(psycopg.AsyncConnection[Any]):
            """The pool's connections, recording whether the pool can connect."""

            @classmethod
            async def connect(cls, *args: Any, **kwargs: Any) -> Any:
                try:
                    conn = await super().connect(*args, **kwargs)
                except BaseException:
                    health._connect_failed = True
                    raise
                health._connect_failed = False
                return conn

        async def check(conn: AsyncConnection) -> None:
            since = returned.get(conn)
            if since is not None and time.monotonic() - since > IDLE_PING_S:
                await conn.execute("")

        self.pool: AsyncConnectionPool[AsyncConnection] = AsyncConnectionPool(
            self._conninfo,
            connection_class=Tracked,
            kwargs={"autocommit": True, "connect_timeout": self._connect_timeout},
            min_size=1,
            max_size=max(1, settings.pool_size),
            timeout=settings.pool_timeout_s,
            configure=self._configure,
            check=check,
            open=False,
            name="dpquant-web",
        )

    async def _configure(self, conn: AsyncConnection) -> None:
        for statement in self._statements:
            await conn.execute(statement)

    async def open(self) -> None:
        """Open the pool on the running loop (the process's serving loop)."""
        self._loop = asyncio.get_running_loop()
        await self.pool.open()

    async def close(self) -> None:
        """Close the pool and its connections."""
        await self.pool.close()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection]:
        """A connection for one operation (see the class docstring)."""
        pooled = asyncio.get_running_loop() is self._loop and not (
            self._connect_failed and self.pool.get_stats().get("pool_available", 0) == 0
        )
        if pooled:
            async with self.pool.connection() as conn:
                self._in_use.inc()
                try:
                    yield conn
                finally:
                    self._in_use.dec()
                    # when it goes back (a reset callback would return it through a task)
                    self._returned[conn] = time.monotonic()
            return
        conn = await psycopg.AsyncConnection.connect(
            self._conninfo, autocommit=True, connect_timeout=self._connect_timeout
        )
        try:
            await self._configure(conn)
            yield conn
        finally:
            await conn.close()


async def run_async(
    pool: HotPool,
    work: Callable[[AsyncConnection], Awaitable[T]],
    *,
    attempts: int = 8,
    idempotent: bool = False,
) -> T:
    """Run ``work`` on a connection of ``pool``; retry serialization failures and deadlocks.

    ``work`` runs again from the start after a serialization failure or a deadlock (at most
    ``attempts`` times, with a short backoff); those leave nothing behind. A connection lost
    while ``work`` ran raises :class:`~app.core.db.CommitOutcomeUnknown` unless ``idempotent``
    (reads, and writes that are safe to repeat): those run again once on a fresh connection.
    """
    reconnected = False
    for attempt in range(1, attempts + 1):
        async with pool.connection() as conn:
            try:
                return await work(conn)
            except psycopg.OperationalError as exc:
                if sqlstate(exc) in RETRYABLE_SQLSTATES and attempt < attempts:
                    logger.info("statement retried after SQLSTATE %s", sqlstate(exc))
                    await asyncio.sleep(_JITTER.uniform(0, 0.002 * 2**attempt))
                    continue
                if conn.closed or conn.broken:
                    if idempotent and not reconnected:
                        reconnected = True
                        logger.info("statement retried on a fresh connection")
                        continue
                    if not idempotent:
                        raise CommitOutcomeUnknown() from None
                raise
    raise AssertionError("unreachable")  # pragma: no cover


# --------------------------------------------------------------------------- workers


#: The release queue's session setting (release workers and their supervisor): no bitmap
#: scans. A claim walks the pending releases' partial index from the oldest; the entries of
#: releases that finished since the last VACUUM are still in it. An index scan marks each
#: such entry dead the first time it meets one (btree "kill_prior_tuple"), so every later
#: claim skips it; a bitmap scan, which the planner prefers for the few rows it expects,
#: never marks them and reads every one on every claim: measured on a test database, 1,350
#: index entries per claim after 1,600 releases (660 buffers, 0.8 ms), growing with the
#: releases since the last VACUUM, against 6 buffers (0.03 ms) once an index scan had run.
QUEUE_SESSION = ("SET enable_bitmapscan = off",)


class Link:
    """One synchronous autocommit connection, opened on first use and again after a loss.

    For single-threaded processes (release workers and their supervisor), with the service's
    session settings and :data:`QUEUE_SESSION`.
    """

    def __init__(self, url: str, settings: Settings, *, process: str = "release_worker") -> None:
        self._conninfo = conninfo(url)
        self._statements = [*session_statements(settings.statement_timeout_ms), *QUEUE_SESSION]
        self._connect_timeout = settings.connect_timeout_s
        self._conn: psycopg.Connection[Any] | None = None
        self._in_use = _pool_gauges(process, 1)

    def connection(self) -> psycopg.Connection[Any]:
        """The open connection (connecting if needed)."""
        if self._conn is None or self._conn.closed or self._conn.broken:
            self.close()
            conn = psycopg.connect(
                self._conninfo, autocommit=True, connect_timeout=self._connect_timeout
            )
            for statement in self._statements:
                conn.execute(statement)
            self._conn = conn
        return self._conn

    def run(self, work: Callable[[psycopg.Connection[Any]], T], *, attempts: int = 8) -> T:
        """Run ``work``; retry serialization failures and deadlocks (see :func:`run_async`).

        A connection lost while ``work`` ran raises :class:`~app.core.db.CommitOutcomeUnknown`
        (the callers' writes are guarded by lease tokens and states: they may simply retry).
        """
        for attempt in range(1, attempts + 1):
            conn = self.connection()
            self._in_use.inc()
            try:
                return work(conn)
            except psycopg.OperationalError as exc:
                if sqlstate(exc) in RETRYABLE_SQLSTATES and attempt < attempts:
                    time.sleep(0.002 * 2**attempt)
                    continue
                if conn.closed or conn.broken:
                    self.close()
                    raise CommitOutcomeUnknown() from None
                raise
            finally:
                self._in_use.dec()
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        """Close the connection (the next use opens a new one)."""
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

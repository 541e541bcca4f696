"""``dpquant backup`` and ``dpquant restore``: PostgreSQL's own dump and restore, and a
restore that never lets a budget be spent twice.

A backup is ``pg_dump --format=custom`` of the whole database, preceded by one
``backup_event`` row (committed first, so the dump holds the time it was taken). A restore is
``pg_restore --single-transaction`` into an empty database, the migrations up to head (the
backup may be older than the code), and then, in one transaction:

* every live dataset is put **on hold** from the backup's time: the restored ledger lacks
  whatever was spent after the backup, so ``release_reserve()`` refuses every release on it
  (409 ``budget_on_hold``) until an admin states that spending
  (``POST /v1/datasets/{id}/restore-confirmation``, an ``adjustment`` ledger row);
* every release still ``pending`` in the backup is marked ``failed`` (``restored``): it was
  paid, and it may have been answered after the backup; running it again would give a second
  draw for one payment. Its debit stays.

Idempotency keys used after the backup are unknown to the restored database: a client that
retries such a request gets a new release, paid again (never a free second draw).

The tools: the newest ``pg_dump`` / ``pg_restore`` whose major version is at least the
server's, among the embedded PostgreSQL's (``pgserver``) and the ones on ``PATH``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psycopg


class BackupError(Exception):
    """A problem to report to the operator (exit status 2)."""


def libpq_url(url: str) -> str:
    """A SQLAlchemy URL (``postgresql+psycopg://``) as libpq takes it."""
    return re.sub(r"^postgresql\+\w+://", "postgresql://", url)


def _candidates(name: str) -> list[str]:
    found: list[str] = []
    try:
        import pgserver

        bundled = Path(pgserver.__file__).parent / "pginstall" / "bin" / name
        if bundled.exists():
            found.append(str(bundled))
    except ImportError:  # pragma: no cover - pgserver is a dependency
        pass
    on_path = shutil.which(name)
    if on_path is not None:
        found.append(on_path)
    return found


def _major(tool: str) -> int:
    out = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=30)
    match = re.search(r"(\d+)(?:\.\d+)?", out.stdout)
    return int(match.group(1)) if match else 0


def pg_tool(name: str, server_major: int) -> str:
    """The newest ``name`` whose major version is at least ``server_major``."""
    usable = [
        (major, tool) for tool in _candidates(name) if (major := _major(tool)) >= server_major
    ]
    if not usable:
        raise BackupError(
            f"no {name} of PostgreSQL {server_major} or newer found (install the PostgreSQL "
            "client tools of the server's version)"
        )
    return max(usable)[1]


def _server_major(conn: psycopg.Connection[tuple[int]]) -> int:
    row = conn.execute("SELECT current_setting('server_version_num')::int").fetchone()
    assert row is not None
    return row[0] // 10000


@dataclass(frozen=True)
class Backup:
    path: Path
    taken_at: datetime
    size_bytes: int


def backup(url: str, path: Path, *, note: str | None = None) -> Backup:
    """Dump the database at ``url`` to ``path`` (custom format; refuses to overwrite)."""
    path = Path(path)
    if path.exists():
        raise BackupError(f"{path} exists: choose a new file")
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        major = _server_major(conn)
        if conn.execute("SELECT to_regclass('backup_event')").fetchone() == (None,):
            raise BackupError("the database is not a migrated dpquant database")
        row = conn.execute(
            "INSERT INTO backup_event (taken_at, note) VALUES (clock_timestamp(), %s) "
            "RETURNING taken_at",
            (note,),
        ).fetchone()
        assert row is not None
        taken_at: datetime = row[0]
    tool = pg_tool("pg_dump", major)
    done = subprocess.run(
        [tool, "--format=custom", "--no-owner", "--no-privileges", "--file", str(path),
         "--dbname", libpq_url(url)],
        capture_output=True, text=True, timeout=None,
    )  # fmt: skip
    if done.returncode != 0:
        path.unlink(missing_ok=True)
        raise BackupError(f"pg_dump failed: {done.stderr.strip()[-500:]}")
    return Backup(path, taken_at, path.stat().st_size)


@dataclass(frozen=True)
class Restored:
    held_since: datetime
    datasets_held: int
    releases_failed: int


def restore(url: str, path: Path) -> Restored:
    """Restore ``path`` into the empty database at ``url``, migrate it, hold every budget
    from the backup's time and fail the releases that were pending (see the module)."""
    from app.core.db import upgrade_database

    path = Path(path)
    if not path.is_file():
        raise BackupError(f"no such file: {path}")
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        major = _server_major(conn)
        if conn.execute("SELECT to_regclass('dataset')").fetchone() != (None,):
            raise BackupError(
                "the database already holds dpquant tables: restore into a new, empty "
                "database (restoring over a live one could forget spending)"
            )
    tool = pg_tool("pg_restore", major)
    done = subprocess.run(
        [tool, "--no-owner", "--no-privileges", "--single-transaction", "--exit-on-error",
         "--dbname", libpq_url(url), str(path)],
        capture_output=True, text=True, timeout=None,
    )  # fmt: skip
    if done.returncode != 0:
        raise BackupError(f"pg_restore failed: {done.stderr.strip()[-500:]}")
    upgrade_database(url)
    return hold(url, None)


def hold(url: str, since: datetime | None) -> Restored:
    """Hold every live dataset's budget from ``since`` (default: the newest backup's time in
    the database, else now) and fail the pending releases: what :func:`restore` does after
    loading the dump, and what a database recovered another way (point-in-time recovery)
    needs before it serves. One transaction, recorded in the audit log."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.orm import Session

    from app.audit.service import record
    from app.core.db import normalize_url

    engine = create_engine(normalize_url(url))
    try:
        with Session(engine) as session, session.begin():
            if session.execute(text("SELECT to_regclass('dataset')")).scalar() is None:
                raise BackupError("the database is not a dpquant database")
            if since is None:
                newest = session.execute(text("SELECT max(taken_at) FROM backup_event")).scalar()
                since = newest if newest is not None else datetime.now(UTC)
            held = len(
                session.execute(
                    text(
                        "UPDATE dataset SET restore_hold_since = :since"
                        " WHERE archived_at IS NULL RETURNING id"
                    ),
                    {"since": since},
                ).all()
            )
            failed = len(
                session.execute(
                    text(
                        "UPDATE release SET status = 'failed', failure = 'restored',"
                        " finished_at = clock_timestamp(), lease_until = NULL,"
                        " lease_token = NULL, published_at = clock_timestamp()"
                        " WHERE status = 'pending' RETURNING id"
                    )
                ).all()
            )
            details = {"held_since": since.isoformat(), "datasets_held": held,
                       "releases_failed": failed}  # fmt: skip
            record(
                session,
                actor=None,
                action="database.restore",
                target_type="database",
                target_id=None,
                details=details,
            )
    finally:
        engine.dispose()
    return Restored(since, held, failed)

"""publication times: a release becomes visible when a bound from public figures says

A release's finish time was visible to every reader and depended on the data (n,
its shape, the mechanism's path). Now each run records when it started
(``run_started_at``) and each finished release when it is published (``published_at``): the
later of its finish and its start plus a run-time bound computed from public figures only
(:mod:`app.releases.schedule`). Non-admin readers see a release as pending until then, and
its publication time in place of its finish time.

The completion payload (``release_notify()``, migration 0007) carries ``published_at`` so
that the waiting request can hold its answer until then without a re-read.

``release_reserve()`` no longer puts a failed release back in the queue on an idempotent
replay: resuming until a run finishes in time would release the output of a run
conditioned on its own run time (which may depend on the draws), and a failed release is
now final (it keeps its debit; a new release is a new, paid run). Finished releases from
before this migration are published at their finish time.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03 15:10:00
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _load(name: str, filename: str) -> ModuleType:
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_RESUME = """            -- A replay is free; a failed release that may run again goes back in the queue
            -- (an archived dataset's values are gone: nothing to run it on).
            IF earlier.status = 'failed' AND earlier.attempts < p_max_runs
               AND d.archived_at IS NULL THEN
                UPDATE release
                SET status = 'pending', failure = NULL, lease_token = NULL,
                    lease_until = NULL, finished_at = NULL
                WHERE id = earlier.id AND status = 'failed';
            END IF;
"""
_NO_RESUME = """            -- A replay is free and returns the release as it stands: a failed release is
            -- final (migration 0011).
"""

_FINISHED_AT = """            'finished_at',
            to_char(NEW.finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US'),
"""
_PUBLISHED_AT = """            'published_at',
            to_char(NEW.published_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US'),
"""


def _notify() -> tuple[str, str]:
    """(migration 0007's ``release_notify()``, this one's: the payload adds published_at)."""
    old = _load("dpquant_migration_0007", "20261130_0007_finished_payload.py")._WITH_OUTCOME
    assert old.count(_FINISHED_AT) == 1
    return old, old.replace(_FINISHED_AT, _FINISHED_AT + _PUBLISHED_AT)


def _functions() -> tuple[str, str, str]:
    """(0010's reserve function, this one's, their common signature)."""
    m8 = _load("dpquant_migration_0008", "20261201_0008_reserve_function.py")
    m10 = _load("dpquant_migration_0010", "20261203_0010_pending_caps.py")
    old = m10.new_function(m8.RESERVE)
    assert old.count(_RESUME) == 1
    return old, old.replace(_RESUME, _NO_RESUME), m10.NEW_SIGNATURE


def upgrade() -> None:
    op.add_column("release", sa.Column("run_started_at", sa.DateTime(timezone=True)))
    op.add_column("release", sa.Column("published_at", sa.DateTime(timezone=True)))
    op.execute("UPDATE release SET published_at = finished_at WHERE finished_at IS NOT NULL")
    op.execute(_notify()[1])
    _, new, signature = _functions()
    op.execute(f"DROP FUNCTION {signature}")
    op.execute(new)


def downgrade() -> None:
    old, _, signature = _functions()
    op.execute(f"DROP FUNCTION {signature}")
    op.execute(old)
    op.execute(_notify()[0])
    op.drop_column("release", "published_at")
    op.drop_column("release", "run_started_at")

"""finished notifications carry the outcome: a waiting request answers without re-reading

Throughput. ``release_notify()`` announced a finished release by its id only, and
every synchronous request that heard it read the row again. The announcement on
``dpquant_release_finished`` now carries what changed when the release finished — status,
failure, finish time (UTC, microseconds) and estimates — as JSON, so the waiting request
completes the release it reserved in memory. A payload that would pass PostgreSQL's
8000-byte NOTIFY limit (very many quantiles) is sent as the bare id, as before, and the
waiter reads the row. Pending announcements are unchanged.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30 16:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A NOTIFY payload must be shorter than 8000 bytes.
_WITH_OUTCOME = """
CREATE OR REPLACE FUNCTION release_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    payload text;
BEGIN
    IF NEW.status = 'pending' AND (TG_OP = 'INSERT' OR OLD.status <> 'pending') THEN
        PERFORM pg_notify('dpquant_release_pending', NEW.id::text);
    ELSIF NEW.status <> 'pending' AND TG_OP = 'UPDATE' AND OLD.status = 'pending' THEN
        payload := json_build_object(
            'id', NEW.id,
            'status', NEW.status,
            'failure', NEW.failure,
            'finished_at',
            to_char(NEW.finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US'),
            'estimates', NEW.estimates
        )::text;
        IF octet_length(payload) >= 8000 THEN
            payload := NEW.id::text;
        END IF;
        PERFORM pg_notify('dpquant_release_finished', payload);
    END IF;
    RETURN NULL;
END;
$$
"""

_ID_ONLY = """
CREATE OR REPLACE FUNCTION release_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'pending' AND (TG_OP = 'INSERT' OR OLD.status <> 'pending') THEN
        PERFORM pg_notify('dpquant_release_pending', NEW.id::text);
    ELSIF NEW.status <> 'pending' AND TG_OP = 'UPDATE' AND OLD.status = 'pending' THEN
        PERFORM pg_notify('dpquant_release_finished', NEW.id::text);
    END IF;
    RETURN NULL;
END;
$$
"""


def upgrade() -> None:
    op.execute(_WITH_OUTCOME)


def downgrade() -> None:
    op.execute(_ID_ONLY)

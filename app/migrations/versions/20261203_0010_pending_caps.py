"""pending caps: a key and a dataset may hold only so many releases in the queue

One analyst key queued releases without end (each cost next to nothing) and held
every other tenant's release behind them. ``release_reserve()`` now also refuses a
reservation when the calling key, or the dataset, already has ``p_max_pending_key`` /
``p_max_pending_dataset`` releases pending (0: no cap): outcomes ``too_many_pending_key``
and ``too_many_pending_dataset``, decided under the dataset row's and the key row's locks
(the function takes both before it counts), so concurrent reservations cannot pass a cap
together. Two partial indexes make the counts index-only scans of the pending releases.

The function's text is migration 0008's with the two checks added after the key's cap
(the same statement order: nothing is written before every check has passed).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03 13:00:00
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _migration_0008() -> ModuleType:
    path = Path(__file__).with_name("20261201_0008_reserve_function.py")
    spec = importlib.util.spec_from_file_location("dpquant_migration_0008", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_PARAMS_BEFORE = """    p_max_runs integer,
    OUT outcome text,"""
_PARAMS_AFTER = """    p_max_runs integer,
    p_max_pending_key integer,
    p_max_pending_dataset integer,
    OUT outcome text,"""
_CHECKS_AT = """    v_now := clock_timestamp();
    INSERT INTO release"""
_CHECKS = """    -- The queue caps, under the dataset's and the key's row locks taken above.
    IF p_max_pending_key > 0 AND (
        SELECT count(*) FROM release r
        WHERE r.api_key_id = p_api_key_id AND r.status = 'pending'
    ) >= p_max_pending_key THEN
        outcome := 'too_many_pending_key';
        RETURN;
    END IF;
    IF p_max_pending_dataset > 0 AND (
        SELECT count(*) FROM release r
        WHERE r.dataset_id = p_dataset_id AND r.status = 'pending'
    ) >= p_max_pending_dataset THEN
        outcome := 'too_many_pending_dataset';
        RETURN;
    END IF;

"""
NEW_SIGNATURE = (
    "release_reserve(uuid, uuid, uuid, varchar, double precision[], numeric, numeric, "
    "numeric, numeric, varchar, varchar, jsonb, jsonb, varchar, bigint, integer, integer, "
    "integer)"
)


def new_function(old: str) -> str:
    """Migration 0008's ``release_reserve()`` with the caps' parameters and checks."""
    assert old.count(_PARAMS_BEFORE) == 1 and old.count(_CHECKS_AT) == 1
    return old.replace(_PARAMS_BEFORE, _PARAMS_AFTER).replace(_CHECKS_AT, _CHECKS + _CHECKS_AT)


def upgrade() -> None:
    old = _migration_0008()
    op.execute(f"DROP FUNCTION {old.SIGNATURE}")
    op.execute(new_function(old.RESERVE))
    op.create_index(
        "ix_release_pending_key",
        "release",
        ["api_key_id"],
        postgresql_where="status = 'pending'",
    )
    op.create_index(
        "ix_release_pending_dataset",
        "release",
        ["dataset_id"],
        postgresql_where="status = 'pending'",
    )


def downgrade() -> None:
    op.drop_index("ix_release_pending_dataset", table_name="release")
    op.drop_index("ix_release_pending_key", table_name="release")
    op.execute(f"DROP FUNCTION {NEW_SIGNATURE}")
    op.execute(_migration_0008().RESERVE)

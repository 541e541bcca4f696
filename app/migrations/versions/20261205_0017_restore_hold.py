"""backups that restore without spending a budget twice

* ``backup_event``: one row written by ``dpquant backup`` just before it dumps (so the dump
  holds the time it was taken).
* ``dataset.restore_hold_since``: set by ``dpquant restore`` on every live dataset to the
  backup's time. Releases reserved after the backup are not in the restored ledger, so their
  budget would be spent twice; ``release_reserve()`` refuses every release on a held dataset
  (outcome ``budget_on_hold``) until an admin confirms what was spent since (an
  ``adjustment`` ledger row) and lifts the hold.
* ``ledger_entry.kind`` ``adjustment``: budget spent outside any stored release (spending
  lost with a restore, reported by an admin); it adds to the spent figures like a debit and
  is checked by the same ``no_overdraft``.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05 01:40:00
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _load(name: str, filename: str) -> ModuleType:
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_EDITS = (
    (
        """           ds.frozen_at, ds.accounting
    INTO d FROM dataset ds WHERE ds.id = p_dataset_id FOR UPDATE;""",
        """           ds.frozen_at, ds.accounting, ds.restore_hold_since
    INTO d FROM dataset ds WHERE ds.id = p_dataset_id FOR UPDATE;""",
    ),
    (
        """    IF d.values_uploaded_at IS NULL THEN
        outcome := 'no_values';
        RETURN;
    END IF;""",
        """    IF d.values_uploaded_at IS NULL THEN
        outcome := 'no_values';
        RETURN;
    END IF;
    IF d.restore_hold_since IS NOT NULL THEN
        -- restored from a backup: what was spent after it is not in this ledger
        outcome := 'budget_on_hold';
        RETURN;
    END IF;""",
    ),
)

SIGNATURE = (
    "release_reserve(uuid, uuid, uuid, varchar, double precision[], numeric, numeric, "
    "numeric, numeric, varchar, varchar, jsonb, jsonb, varchar, bigint, integer, integer, "
    "integer, varchar, numeric, varchar)"
)


def _functions() -> tuple[str, str, str]:
    """(0016's reserve function, this one's, the signature, unchanged)."""
    m16 = _load("dpquant_migration_0016", "20261205_0016_zcdp_accounting.py")
    _, old, _ = m16._functions()
    new = old
    for before, after in _EDITS:
        assert new.count(before) == 1, before
        new = new.replace(before, after)
    return old, new, SIGNATURE


def upgrade() -> None:
    op.create_table(
        "backup_event",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column("taken_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
    )
    op.add_column(
        "dataset", sa.Column("restore_hold_since", sa.DateTime(timezone=True), nullable=True)
    )
    op.drop_constraint("kind", "ledger_entry", type_="check")
    op.create_check_constraint("kind", "ledger_entry", "kind IN ('grant', 'debit', 'adjustment')")
    _, new, _ = _functions()
    op.execute(f"DROP FUNCTION {SIGNATURE}")
    op.execute(new)


def downgrade() -> None:
    old, _, _ = _functions()
    op.execute(f"DROP FUNCTION {SIGNATURE}")
    op.execute(old)
    # adjustments have no place in the old schema: keep what they spent, as failed-release
    # debits cannot be invented; refuse instead of losing spending
    op.execute(
        "DO $$ BEGIN IF EXISTS (SELECT 1 FROM ledger_entry WHERE kind = 'adjustment') THEN "
        "RAISE EXCEPTION 'ledger adjustments exist: downgrading would forget spending'; "
        "END IF; END $$"
    )
    op.drop_constraint("kind", "ledger_entry", type_="check")
    op.create_check_constraint("kind", "ledger_entry", "kind IN ('grant', 'debit')")
    op.drop_column("dataset", "restore_hold_since")
    op.drop_table("backup_event")

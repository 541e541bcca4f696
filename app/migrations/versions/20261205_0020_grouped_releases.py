"""grouped releases: per-key histograms and a release's groups

* ``dataset_group_data``: the values of one numeric column within one key of one
  categorical column, as a grid histogram (the same codec as ``dataset_data``), built at
  upload after the bounding; what a grouped release reads, so its cost does not grow with n.
* ``dataset_column.keys_stored``: a categorical column's distinct keys in those histograms
  (admins only); NULL where none were built (values uploaded as a histogram).
* ``release.group_by`` / ``group_keys`` / ``group_error``: the categorical column a release
  groups by, the keys it answers (in the order of its estimates, which hold m per key), and
  the expected error as a function of group size (public figures only). ``group_by`` and
  ``group_keys`` are priced parameters: ``release_guard`` keeps them fixed. With keys
  discovered by partition selection, ``group_keys`` holds the selection's parameters
  (``{"discover": {...}}``) and ``selected_keys`` the keys it kept, set with the estimates.
* ``release_reserve()`` takes them (``p_group_by``, ``p_group_keys``, ``p_group_error``).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-05 05:30:00
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0020"
down_revision: str | None = "0019"
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
        """    p_trace_parent varchar DEFAULT NULL,
    OUT outcome text,""",
        """    p_trace_parent varchar DEFAULT NULL,
    p_group_by varchar DEFAULT NULL,
    p_group_keys jsonb DEFAULT NULL,
    p_group_error jsonb DEFAULT NULL,
    OUT outcome text,""",
    ),
    (
        """    IF d.restore_hold_since IS NOT NULL THEN""",
        """    IF p_group_by IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM dataset_column c
        WHERE c.dataset_id = p_dataset_id AND c.name = p_group_by AND c.keys_stored IS NOT NULL
    ) THEN
        outcome := 'no_group_values';  -- values uploaded as a histogram: no per-key counts
        RETURN;
    END IF;
    IF d.restore_hold_since IS NOT NULL THEN""",
    ),
    (
        """                         column_name, cost_rho, remaining_rho, trace_parent)""",
        """                         column_name, cost_rho, remaining_rho, trace_parent,
                         group_by, group_keys, group_error)""",
    ),
    (
        """            CASE WHEN accounting = 'zcdp' THEN left_rho - p_cost_rho END, p_trace_parent)""",  # noqa: E501
        """            CASE WHEN accounting = 'zcdp' THEN left_rho - p_cost_rho END, p_trace_parent,
            p_group_by, p_group_keys, p_group_error)""",
    ),
)

OLD_SIGNATURE = (
    "release_reserve(uuid, uuid, uuid, varchar, double precision[], numeric, numeric, "
    "numeric, numeric, varchar, varchar, jsonb, jsonb, varchar, bigint, integer, integer, "
    "integer, varchar, numeric, varchar, varchar)"
)
NEW_SIGNATURE = OLD_SIGNATURE[:-1] + ", varchar, jsonb, jsonb)"

_GUARD = """
CREATE OR REPLACE FUNCTION release_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('DELETE', 'TRUNCATE') THEN
        RAISE EXCEPTION 'release rows are never deleted: % refused', TG_OP
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF OLD.status = 'done' THEN
        RAISE EXCEPTION 'a done release is immutable'
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF (NEW.id, NEW.seq, NEW.dataset_id, NEW.api_key_id, NEW.method, NEW.quantiles,
        NEW.epsilon, NEW.delta, NEW.cost_epsilon, NEW.cost_delta,
        NEW.remaining_epsilon, NEW.remaining_delta, NEW.idempotency_key,
        NEW.request_hash, NEW.created_at{new})
       IS DISTINCT FROM
       (OLD.id, OLD.seq, OLD.dataset_id, OLD.api_key_id, OLD.method, OLD.quantiles,
        OLD.epsilon, OLD.delta, OLD.cost_epsilon, OLD.cost_delta,
        OLD.remaining_epsilon, OLD.remaining_delta, OLD.idempotency_key,
        OLD.request_hash, OLD.created_at{old}) THEN
        RAISE EXCEPTION 'a release''s priced parameters never change'
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    RETURN NEW;
END;
$$
"""


def _functions() -> tuple[str, str, str]:
    """(0018's reserve function, this one's, the old signature)."""
    m18 = _load("dpquant_migration_0018", "20261205_0018_release_trace.py")
    _, old, _ = m18._functions()
    new = old
    for before, after in _EDITS:
        assert new.count(before) == 1, before
        new = new.replace(before, after)
    return old, new, OLD_SIGNATURE


def upgrade() -> None:
    op.create_table(
        "dataset_group_data",
        sa.Column(
            "dataset_id",
            sa.Uuid(),
            sa.ForeignKey("dataset.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("group_column", sa.String(200), primary_key=True),
        sa.Column("column_name", sa.String(200), primary_key=True),
        sa.Column("group_key", sa.String(200), primary_key=True),
        sa.Column("data", sa.LargeBinary(), nullable=False),
    )
    op.execute("ALTER TABLE dataset_group_data ALTER COLUMN data SET STORAGE EXTERNAL")
    op.add_column("dataset_column", sa.Column("keys_stored", sa.BigInteger(), nullable=True))
    op.add_column("release", sa.Column("group_by", sa.String(200), nullable=True))
    op.add_column("release", sa.Column("group_keys", postgresql.JSONB(), nullable=True))
    op.add_column("release", sa.Column("group_error", postgresql.JSONB(), nullable=True))
    op.add_column("release", sa.Column("selected_keys", postgresql.JSONB(), nullable=True))
    op.create_check_constraint(
        "group_keys_iff_group_by", "release", "(group_by IS NULL) = (group_keys IS NULL)"
    )
    fixed = ", {0}.group_by, {0}.group_keys"
    op.execute(_GUARD.format(new=fixed.format("NEW"), old=fixed.format("OLD")))
    _, new, _ = _functions()
    op.execute(f"DROP FUNCTION {OLD_SIGNATURE}")
    op.execute(new)


def downgrade() -> None:
    old, _, _ = _functions()
    op.execute(f"DROP FUNCTION {NEW_SIGNATURE}")
    op.execute(old)
    op.execute(_GUARD.format(new="", old=""))
    op.drop_constraint("group_keys_iff_group_by", "release", type_="check")
    op.drop_column("release", "selected_keys")
    op.drop_column("release", "group_error")
    op.drop_column("release", "group_keys")
    op.drop_column("release", "group_by")
    op.drop_column("dataset_column", "keys_stored")
    op.drop_table("dataset_group_data")

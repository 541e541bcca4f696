"""a dataset is a table: declared columns, one histogram per numeric column, releases name
the column they read

``dataset_column`` holds the public schema: per column its position, name, type
(``numeric``, ``integer`` or ``categorical``), public bounds and grid (numeric types) or
public key list (categorical, optional), and the admin-only figures of its stored values.
Every existing dataset becomes a table with one numeric column named ``value`` on its own
bounds and grid (the dataset row keeps its first numeric column's bounds, as before).
``dataset_data`` is keyed by (dataset, column name); ``release.column_name`` records the
column a release reads (``value`` for every earlier release), and ``release_reserve()``
takes it as its last parameter.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04 23:50:00
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _load(name: str, filename: str) -> ModuleType:
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_PARAMS_BEFORE = """    p_max_pending_dataset integer,
    OUT outcome text,"""
_PARAMS_AFTER = """    p_max_pending_dataset integer,
    p_column varchar DEFAULT 'value',
    OUT outcome text,"""
_INSERT_BEFORE = """                         lease_token, lease_until, finished_at, expected_error, warnings)"""
_INSERT_AFTER = """                         lease_token, lease_until, finished_at, expected_error, warnings,
                         column_name)"""
_VALUES_BEFORE = """            coalesce(p_warnings, '[]'::jsonb))
    RETURNING release.seq INTO seq;"""
_VALUES_AFTER = """            coalesce(p_warnings, '[]'::jsonb), p_column)
    RETURNING release.seq INTO seq;"""
NEW_SIGNATURE = (
    "release_reserve(uuid, uuid, uuid, varchar, double precision[], numeric, numeric, "
    "numeric, numeric, varchar, varchar, jsonb, jsonb, varchar, bigint, integer, integer, "
    "integer, varchar)"
)


def _functions() -> tuple[str, str, str]:
    """(0011's reserve function, this one's, the old signature)."""
    m11 = _load("dpquant_migration_0011", "20261203_0011_publication_times.py")
    _, old, signature = m11._functions()
    for part in (_PARAMS_BEFORE, _INSERT_BEFORE, _VALUES_BEFORE):
        assert old.count(part) == 1, part
    new = (
        old.replace(_PARAMS_BEFORE, _PARAMS_AFTER)
        .replace(_INSERT_BEFORE, _INSERT_AFTER)
        .replace(_VALUES_BEFORE, _VALUES_AFTER)
    )
    return old, new, signature


def upgrade() -> None:
    op.create_table(
        "dataset_column",
        sa.Column(
            "dataset_id",
            sa.Uuid(),
            sa.ForeignKey("dataset.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("type", sa.String(16), nullable=False),
        sa.Column("lower", sa.Double(), nullable=True),
        sa.Column("upper", sa.Double(), nullable=True),
        sa.Column("granularity", sa.Double(), nullable=True),
        sa.Column("keys", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("n_outside", sa.BigInteger(), nullable=True),
        sa.Column("n_cells", sa.BigInteger(), nullable=True),
        sa.CheckConstraint(
            "type IN ('numeric', 'integer', 'categorical')", name="dataset_column_type"
        ),
        sa.CheckConstraint(
            "(type = 'categorical') = (lower IS NULL AND upper IS NULL AND granularity IS NULL)",
            name="dataset_column_bounds",
        ),
        sa.UniqueConstraint("dataset_id", "position", name="uq_dataset_column_position"),
    )
    op.execute(
        "INSERT INTO dataset_column (dataset_id, name, position, type, lower, upper, "
        "granularity, n_outside, n_cells) SELECT id, 'value', 0, 'numeric', lower, upper, "
        "granularity, n_outside, n_cells FROM dataset"
    )
    op.add_column(
        "dataset_data",
        sa.Column("column_name", sa.String(200), nullable=False, server_default="value"),
    )
    op.drop_constraint("pk_dataset_data", "dataset_data", type_="primary")
    op.create_primary_key("pk_dataset_data", "dataset_data", ["dataset_id", "column_name"])
    op.add_column(
        "release",
        sa.Column("column_name", sa.String(200), nullable=False, server_default="value"),
    )
    _, new, signature = _functions()
    op.execute(f"DROP FUNCTION {signature}")
    op.execute(new)


def downgrade() -> None:
    old, _, signature = _functions()
    op.execute(f"DROP FUNCTION {NEW_SIGNATURE}")
    op.execute(old)
    op.drop_column("release", "column_name")
    # a table's other columns have no place in the old schema: keep the first numeric one
    op.execute(
        "DELETE FROM dataset_data v USING dataset_column c WHERE c.dataset_id = v.dataset_id "
        "AND c.name = v.column_name AND c.position > (SELECT min(c2.position) FROM "
        "dataset_column c2 WHERE c2.dataset_id = c.dataset_id AND c2.type <> 'categorical')"
    )
    op.drop_constraint("pk_dataset_data", "dataset_data", type_="primary")
    op.create_primary_key("pk_dataset_data", "dataset_data", ["dataset_id"])
    op.drop_column("dataset_data", "column_name")
    op.drop_table("dataset_column")

"""privacy units: a dataset may name the column that identifies a person, and bound the rows
each person contributes

``dataset.privacy_unit`` (the unit column's name in uploads; NULL: each row is its own unit),
``max_rows_per_unit`` (k, 1 .. 10^4) and ``max_groups_per_unit`` (L, 1 .. 10^4), both 1 for
existing datasets (today's guarantee per row). ``unit_key``: a per-dataset random key; unit
ids are kept only as HMAC-SHA256 under it (never in clear). ``dataset_unit`` holds, per unit
hash, how many rows the stored values keep of it, so that appends keep every unit at k rows.
``rows_dropped`` and ``units`` (admin-only figures: they depend on the data) count the rows
the bounding dropped and the distinct units kept.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04 22:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("dataset", sa.Column("privacy_unit", sa.String(200), nullable=True))
    op.add_column(
        "dataset",
        sa.Column("max_rows_per_unit", sa.Integer(), nullable=False, server_default="1"),
    )
    op.add_column(
        "dataset",
        sa.Column("max_groups_per_unit", sa.Integer(), nullable=False, server_default="1"),
    )
    op.add_column("dataset", sa.Column("unit_key", sa.LargeBinary(), nullable=True))
    op.add_column("dataset", sa.Column("rows_dropped", sa.BigInteger(), nullable=True))
    op.add_column("dataset", sa.Column("units", sa.BigInteger(), nullable=True))
    op.create_check_constraint(
        "max_rows_per_unit", "dataset", "max_rows_per_unit BETWEEN 1 AND 10000"
    )
    op.create_check_constraint(
        "max_groups_per_unit", "dataset", "max_groups_per_unit BETWEEN 1 AND 10000"
    )
    op.create_check_constraint(
        "unit_bounds",
        "dataset",
        "privacy_unit IS NOT NULL OR (max_rows_per_unit = 1 AND max_groups_per_unit = 1)",
    )
    op.create_table(
        "dataset_unit",
        sa.Column(
            "dataset_id",
            sa.Uuid(),
            sa.ForeignKey("dataset.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("unit_hash", sa.LargeBinary(), primary_key=True),
        sa.Column("rows", sa.Integer(), nullable=False),
        sa.CheckConstraint("rows >= 1", name="dataset_unit_rows"),
    )


def downgrade() -> None:
    op.drop_table("dataset_unit")
    op.drop_constraint("unit_bounds", "dataset", type_="check")
    op.drop_constraint("max_groups_per_unit", "dataset", type_="check")
    op.drop_constraint("max_rows_per_unit", "dataset", type_="check")
    op.drop_column("dataset", "units")
    op.drop_column("dataset", "rows_dropped")
    op.drop_column("dataset", "unit_key")
    op.drop_column("dataset", "max_groups_per_unit")
    op.drop_column("dataset", "max_rows_per_unit")
    op.drop_column("dataset", "privacy_unit")

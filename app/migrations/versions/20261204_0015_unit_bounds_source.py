"""who bounded a privacy-unit dataset's rows: the server (per-unit counts kept) or the sender

``dataset.bounded_by``: ``server`` when the stored values came from row uploads, bounded in
PostgreSQL with per-unit counts in ``dataset_unit`` (appends keep every unit at k rows);
``sender`` when they came from a histogram that ``dpquant ingest`` bounded where the data
lives (the server has no per-unit counts, so appends are refused with 409
``unit_counts_unknown``); NULL without a privacy unit or values.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05 00:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("dataset", sa.Column("bounded_by", sa.String(16), nullable=True))
    op.create_check_constraint(
        "bounded_by", "dataset", "bounded_by IS NULL OR bounded_by IN ('server', 'sender')"
    )
    op.execute(
        "UPDATE dataset SET bounded_by = 'server' "
        "WHERE privacy_unit IS NOT NULL AND n IS NOT NULL"
    )


def downgrade() -> None:
    op.drop_constraint("bounded_by", "dataset", type_="check")
    op.drop_column("dataset", "bounded_by")

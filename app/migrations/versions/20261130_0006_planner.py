"""planner: a public size hint per dataset; expected error and warnings per release

Two changes:

1. ``dataset.size_hint``: an admin-declared, public approximate size (NULL = none). Under
   ``add_remove`` neighbours the true n is private, so the planner (quotes, ``method:
   "auto"``, expected errors) uses this figure and never n; ``CHECK (size_hint > 0)``.
2. ``release.expected_error`` (JSONB, NULL when unknown: one ``{quantile, mean, bound90}``
   object per quantile, in missed points) and ``release.warnings`` (JSONB array of strings):
   the a-priori figures of the release's method, computed from public figures at
   reservation and never changed afterwards.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30 10:45:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("dataset", sa.Column("size_hint", sa.BigInteger(), nullable=True))
    op.create_check_constraint("size_hint", "dataset", "size_hint IS NULL OR size_hint > 0")
    op.add_column(
        "release",
        sa.Column("expected_error", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )
    op.add_column(
        "release",
        sa.Column(
            "warnings",
            postgresql.JSONB(astext_type=sa.Text()),
            nullable=False,
            server_default=sa.text("'[]'::jsonb"),
        ),
    )


def downgrade() -> None:
    op.drop_column("release", "warnings")
    op.drop_column("release", "expected_error")
    op.drop_constraint("size_hint", "dataset", type_="check")
    op.drop_column("dataset", "size_hint")

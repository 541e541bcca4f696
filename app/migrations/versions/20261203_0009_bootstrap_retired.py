"""bootstrap keys: a key retired because the variable was unset can come back

A server started without ``DPQUANT_BOOTSTRAP_ADMIN_KEY`` revokes the bootstrap
key ("the variable is unset"), and a revoked key stayed revoked for good: a server
restarted with the same value logged "registered" while the key answered 401. A key an
admin revoked must stay revoked (it may have leaked), so the two revocations are told
apart: ``retired_at`` is set, beside ``revoked_at``, only when the server retired the key;
a start with the same value again restores such a key, never one an admin revoked.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03 12:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("api_key", sa.Column("retired_at", sa.DateTime(timezone=True), nullable=True))
    op.create_check_constraint(
        op.f("ck_api_key_retired_is_revoked_bootstrap"),
        "api_key",
        "retired_at IS NULL OR (bootstrap AND revoked_at IS NOT NULL)",
    )


def downgrade() -> None:
    op.drop_constraint(
        op.f("ck_api_key_retired_is_revoked_bootstrap"), "api_key", type_="check"
    )
    op.drop_column("api_key", "retired_at")

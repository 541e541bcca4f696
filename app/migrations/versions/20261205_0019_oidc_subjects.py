"""OpenID Connect: a token's subject is a principal like a key

* ``api_key.kind``: ``key`` (an API key) or ``oidc`` (an OpenID Connect subject, registered
  on its first request: ``name`` is the subject, ``key_hash`` a marker no key can hash to).
  A subject's row carries what a key's does for the ledger and the audit log (its id), its
  spending cap and its revocation; its role and datasets come from each token.
* ``audit_event.actor_subject``: the acting token's subject (NULL for keys).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05 02:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "api_key", sa.Column("kind", sa.String(8), nullable=False, server_default="key")
    )
    op.create_check_constraint("kind", "api_key", "kind IN ('key', 'oidc')")
    op.alter_column("api_key", "name", type_=sa.String(300))
    op.add_column("audit_event", sa.Column("actor_subject", sa.String(300), nullable=True))


def downgrade() -> None:
    op.drop_column("audit_event", "actor_subject")
    op.execute(
        "DO $$ BEGIN IF EXISTS (SELECT 1 FROM api_key WHERE kind = 'oidc') THEN "
        "RAISE EXCEPTION 'OIDC subjects hold ledger rows: downgrading would orphan them'; "
        "END IF; END $$"
    )
    op.alter_column("api_key", "name", type_=sa.String(200))
    op.drop_constraint("kind", "api_key", type_="check")
    op.drop_column("api_key", "kind")

"""ledger append-only: triggers reject UPDATE, DELETE and TRUNCATE on ledger_entry

The privacy ledger is the record of every epsilon ever spent; DESIGN.md section 3 requires
it to be append-only. The application only ever INSERTs, and from this revision on the
database itself refuses anything else, whoever connects: a row-level BEFORE UPDATE OR
DELETE trigger and a statement-level BEFORE TRUNCATE trigger raise SQLSTATE 55000
(object_not_in_prerequisite_state) with a message naming the table.

Dropping the whole schema (DROP TABLE / DROP SCHEMA, as `downgrade` to base does) is still
possible for the schema owner; that is an administrative act, not a ledger edit.

Revision ID: 5e1f0c2a9b7d
Revises: 0001
Create Date: 2026-11-29 17:45:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = '5e1f0c2a9b7d'
down_revision: str | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FUNCTION = "ledger_entry_append_only"


def upgrade() -> None:
    # Unqualified names resolve through search_path, so the function and triggers live in the
    # same schema as the table (tests run each session in its own schema).
    op.execute(
        f"""
        CREATE FUNCTION {FUNCTION}() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'ledger_entry is append-only: % is not allowed', TG_OP
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'add a grant or a debit row instead of changing history';
        END;
        $$
        """
    )
    op.execute(
        f"""
        CREATE TRIGGER ledger_entry_no_update_delete
        BEFORE UPDATE OR DELETE ON ledger_entry
        FOR EACH ROW EXECUTE FUNCTION {FUNCTION}()
        """
    )
    op.execute(
        f"""
        CREATE TRIGGER ledger_entry_no_truncate
        BEFORE TRUNCATE ON ledger_entry
        FOR EACH STATEMENT EXECUTE FUNCTION {FUNCTION}()
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS ledger_entry_no_truncate ON ledger_entry")
    op.execute("DROP TRIGGER IF EXISTS ledger_entry_no_update_delete ON ledger_entry")
    op.execute(f"DROP FUNCTION IF EXISTS {FUNCTION}()")

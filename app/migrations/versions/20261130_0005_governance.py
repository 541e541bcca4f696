"""governance: per-key budget caps defended by PostgreSQL, key expiry and rotation, an
append-only audit log, archivable datasets

Four changes:

1. ``api_key`` gains ``max_epsilon`` / ``max_delta`` (a key's cap over everything it spends,
   NULL = no cap), ``spent_epsilon`` / ``spent_delta`` (what it spent), ``expires_at``,
   ``last_used_at`` and ``rotated_at``. The spent columns are maintained by the ledger
   trigger (``ledger_entry_apply``, replaced here) in the transaction of every debit that
   names the key, and ``CHECK (spent <= max)`` (``ck_api_key_key_cap``) makes PostgreSQL
   refuse a debit that would take a key over its cap, whoever inserts it and at any
   isolation level, exactly like the dataset balance's ``no_overdraft``. A trigger
   (``api_key_guard``) refuses direct writes of the spent columns: only the ledger trigger
   (nesting depth >= 2) may change them. Existing debits are summed into them.
2. ``audit_event``: who did which admin action, when. Append-only like the ledger: row
   triggers refuse UPDATE and DELETE and a statement trigger refuses TRUNCATE.
3. ``dataset.archived_at``: an archived dataset keeps its ledger and releases but not its
   values; its name is free again, so the UNIQUE constraint on ``dataset.name`` becomes a
   partial unique index over the datasets that are not archived.

Downgrade: archived datasets are renamed ``<name> #<id>`` so the old UNIQUE constraint can be
restored; the audit log, caps, expiry and usage columns are dropped.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 10:05:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: ``ledger_entry_apply`` as revision 0003 created it (restored by the downgrade).
APPLY_0003 = """
CREATE OR REPLACE FUNCTION ledger_entry_apply() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.kind = 'grant' THEN
        INSERT INTO budget_balance AS b (dataset_id, granted_epsilon, granted_delta,
                                         spent_epsilon, spent_delta)
        VALUES (NEW.dataset_id, NEW.epsilon, NEW.delta, 0, 0)
        ON CONFLICT (dataset_id) DO UPDATE
        SET granted_epsilon = b.granted_epsilon + EXCLUDED.granted_epsilon,
            granted_delta = b.granted_delta + EXCLUDED.granted_delta;
    ELSE
        -- Not an upsert: PostgreSQL checks the CHECK constraint on the row proposed
        -- for insertion before it looks for a conflict.
        UPDATE budget_balance
        SET spent_epsilon = spent_epsilon + NEW.epsilon,
            spent_delta = spent_delta + NEW.delta
        WHERE dataset_id = NEW.dataset_id;
        IF NOT FOUND THEN
            -- Nothing was ever granted: any positive debit is an overdraft.
            INSERT INTO budget_balance (dataset_id, granted_epsilon, granted_delta,
                                        spent_epsilon, spent_delta)
            VALUES (NEW.dataset_id, 0, 0, NEW.epsilon, NEW.delta);
        END IF;
    END IF;
    RETURN NULL;
END;
$$
"""

#: The same, plus the debiting key's spent columns (checked against its cap by CHECK).
APPLY_0005 = """
CREATE OR REPLACE FUNCTION ledger_entry_apply() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.kind = 'grant' THEN
        INSERT INTO budget_balance AS b (dataset_id, granted_epsilon, granted_delta,
                                         spent_epsilon, spent_delta)
        VALUES (NEW.dataset_id, NEW.epsilon, NEW.delta, 0, 0)
        ON CONFLICT (dataset_id) DO UPDATE
        SET granted_epsilon = b.granted_epsilon + EXCLUDED.granted_epsilon,
            granted_delta = b.granted_delta + EXCLUDED.granted_delta;
    ELSE
        -- Not an upsert: PostgreSQL checks the CHECK constraint on the row proposed
        -- for insertion before it looks for a conflict.
        UPDATE budget_balance
        SET spent_epsilon = spent_epsilon + NEW.epsilon,
            spent_delta = spent_delta + NEW.delta
        WHERE dataset_id = NEW.dataset_id;
        IF NOT FOUND THEN
            -- Nothing was ever granted: any positive debit is an overdraft.
            INSERT INTO budget_balance (dataset_id, granted_epsilon, granted_delta,
                                        spent_epsilon, spent_delta)
            VALUES (NEW.dataset_id, 0, 0, NEW.epsilon, NEW.delta);
        END IF;
        -- The key's running total: ck_api_key_key_cap refuses a debit over its cap.
        IF NEW.api_key_id IS NOT NULL THEN
            UPDATE api_key
            SET spent_epsilon = spent_epsilon + NEW.epsilon,
                spent_delta = spent_delta + NEW.delta
            WHERE id = NEW.api_key_id;
        END IF;
    END IF;
    RETURN NULL;
END;
$$
"""

APPEND_ONLY = "audit_event_append_only"


def upgrade() -> None:
    # ------------------------------------------------------------------ api_key
    op.add_column("api_key", sa.Column("max_epsilon", sa.Numeric(), nullable=True))
    op.add_column("api_key", sa.Column("max_delta", sa.Numeric(), nullable=True))
    op.add_column(
        "api_key",
        sa.Column("spent_epsilon", sa.Numeric(), server_default=sa.text("0"), nullable=False),
    )
    op.add_column(
        "api_key",
        sa.Column("spent_delta", sa.Numeric(), server_default=sa.text("0"), nullable=False),
    )
    op.add_column("api_key", sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("api_key", sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("api_key", sa.Column("rotated_at", sa.DateTime(timezone=True), nullable=True))
    op.execute(
        """
        UPDATE api_key AS k
        SET spent_epsilon = s.epsilon, spent_delta = s.delta
        FROM (SELECT api_key_id, sum(epsilon) AS epsilon, sum(delta) AS delta
              FROM ledger_entry
              WHERE kind = 'debit' AND api_key_id IS NOT NULL
              GROUP BY api_key_id) AS s
        WHERE k.id = s.api_key_id
        """
    )
    op.create_check_constraint(
        op.f("ck_api_key_key_cap"),
        "api_key",
        "(max_epsilon IS NULL OR spent_epsilon <= max_epsilon) "
        "AND (max_delta IS NULL OR spent_delta <= max_delta)",
    )
    op.create_check_constraint(
        op.f("ck_api_key_key_spent_nonnegative"),
        "api_key",
        "spent_epsilon >= 0 AND spent_delta >= 0",
    )
    op.execute(
        """
        CREATE FUNCTION api_key_guard() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF pg_trigger_depth() < 2
               AND (NEW.spent_epsilon, NEW.spent_delta)
                   IS DISTINCT FROM (OLD.spent_epsilon, OLD.spent_delta) THEN
                RAISE EXCEPTION 'api_key.spent_* is written only by ledger_entry debits'
                    USING ERRCODE = 'object_not_in_prerequisite_state';
            END IF;
            RETURN NEW;
        END;
        $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER api_key_guard_spent
        BEFORE UPDATE ON api_key
        FOR EACH ROW EXECUTE FUNCTION api_key_guard()
        """
    )
    op.execute(APPLY_0005)

    # ------------------------------------------------------------------ audit_event
    op.create_table(
        "audit_event",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor_key_id", sa.Uuid(), nullable=True),
        sa.Column("actor_prefix", sa.String(length=16), nullable=True),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("target_type", sa.String(length=32), nullable=False),
        sa.Column("target_id", sa.String(length=64), nullable=True),
        sa.Column(
            "details",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["actor_key_id"], ["api_key.id"], name=op.f("fk_audit_event_actor_key_id_api_key")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_event")),
    )
    op.execute(
        f"""
        CREATE FUNCTION {APPEND_ONLY}() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'audit_event is append-only: % is not allowed', TG_OP
                USING ERRCODE = 'object_not_in_prerequisite_state';
        END;
        $$
        """
    )
    op.execute(
        f"""
        CREATE TRIGGER audit_event_no_update_delete
        BEFORE UPDATE OR DELETE ON audit_event
        FOR EACH ROW EXECUTE FUNCTION {APPEND_ONLY}()
        """
    )
    op.execute(
        f"""
        CREATE TRIGGER audit_event_no_truncate
        BEFORE TRUNCATE ON audit_event
        FOR EACH STATEMENT EXECUTE FUNCTION {APPEND_ONLY}()
        """
    )

    # ------------------------------------------------------------------ dataset
    op.add_column("dataset", sa.Column("archived_at", sa.DateTime(timezone=True), nullable=True))
    op.drop_constraint(op.f("uq_dataset_name"), "dataset", type_="unique")
    op.create_index(
        "uq_dataset_name_live",
        "dataset",
        ["name"],
        unique=True,
        postgresql_where=sa.text("archived_at IS NULL"),
    )


def downgrade() -> None:
    op.execute(
        "UPDATE dataset SET name = left(name, 150) || ' #' || id::text "
        "WHERE archived_at IS NOT NULL"
    )
    op.drop_index("uq_dataset_name_live", table_name="dataset")
    op.create_unique_constraint(op.f("uq_dataset_name"), "dataset", ["name"])
    op.drop_column("dataset", "archived_at")

    op.execute("DROP TRIGGER IF EXISTS audit_event_no_truncate ON audit_event")
    op.execute("DROP TRIGGER IF EXISTS audit_event_no_update_delete ON audit_event")
    op.execute(f"DROP FUNCTION IF EXISTS {APPEND_ONLY}()")
    op.drop_table("audit_event")

    op.execute(APPLY_0003)
    op.execute("DROP TRIGGER IF EXISTS api_key_guard_spent ON api_key")
    op.execute("DROP FUNCTION IF EXISTS api_key_guard()")
    op.drop_constraint(op.f("ck_api_key_key_spent_nonnegative"), "api_key", type_="check")
    op.drop_constraint(op.f("ck_api_key_key_cap"), "api_key", type_="check")
    for column in (
        "rotated_at",
        "last_used_at",
        "expires_at",
        "spent_delta",
        "spent_epsilon",
        "max_delta",
        "max_epsilon",
    ):
        op.drop_column("api_key", column)

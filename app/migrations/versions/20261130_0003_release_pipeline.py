"""release pipeline v2: balance rows the database defends, release states, bootstrap marker

Three changes, each enforced by PostgreSQL itself rather than by the code:

1. ``budget_balance``: one row per dataset with granted and spent (epsilon, delta), kept
   equal to the sums of the dataset's ledger rows by an AFTER INSERT trigger on
   ``ledger_entry`` (same transaction as the ledger row). ``CHECK (spent <= granted)`` makes
   an overdrawing debit fail whoever inserts it and whatever the isolation level: under
   READ COMMITTED concurrent debits serialise on the balance row and the later one sees the
   earlier one's total; under REPEATABLE READ or SERIALIZABLE the later one fails with a
   serialization error. The balance row itself refuses direct INSERT, UPDATE, DELETE and
   TRUNCATE (only the ledger trigger may write it).
2. ``release`` becomes a small state machine: ``status`` pending -> done | failed, with
   ``estimates`` set exactly when done, a lease for the worker that runs it, the number of
   mechanism runs started (``attempts``) and the failure reason. A trigger keeps a done
   release immutable, forbids any change to the priced parameters and forbids deletion.
3. ``api_key.bootstrap`` marks the key registered from ``DPQUANT_BOOTSTRAP_ADMIN_KEY``, so
   that changing or removing the variable revokes the old key.

Existing releases become ``done``; existing balances are summed from the ledger.

Revision ID: 0003
Revises: 5e1f0c2a9b7d
Create Date: 2026-11-30 09:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0003'
down_revision: str | None = '5e1f0c2a9b7d'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # ------------------------------------------------------------------ budget_balance
    op.create_table(
        'budget_balance',
        sa.Column('dataset_id', sa.Uuid(), nullable=False),
        sa.Column('granted_epsilon', sa.Numeric(), nullable=False),
        sa.Column('granted_delta', sa.Numeric(), nullable=False),
        sa.Column('spent_epsilon', sa.Numeric(), nullable=False),
        sa.Column('spent_delta', sa.Numeric(), nullable=False),
        sa.CheckConstraint(
            'spent_epsilon <= granted_epsilon AND spent_delta <= granted_delta',
            name=op.f('ck_budget_balance_no_overdraft'),
        ),
        sa.CheckConstraint(
            'spent_epsilon >= 0 AND spent_delta >= 0', name=op.f('ck_budget_balance_nonnegative')
        ),
        sa.ForeignKeyConstraint(
            ['dataset_id'], ['dataset.id'], name=op.f('fk_budget_balance_dataset_id_dataset')
        ),
        sa.PrimaryKeyConstraint('dataset_id', name=op.f('pk_budget_balance')),
    )
    op.execute(
        """
        INSERT INTO budget_balance (dataset_id, granted_epsilon, granted_delta,
                                    spent_epsilon, spent_delta)
        SELECT d.id,
               coalesce(sum(l.epsilon) FILTER (WHERE l.kind = 'grant'), 0),
               coalesce(sum(l.delta) FILTER (WHERE l.kind = 'grant'), 0),
               coalesce(sum(l.epsilon) FILTER (WHERE l.kind = 'debit'), 0),
               coalesce(sum(l.delta) FILTER (WHERE l.kind = 'debit'), 0)
        FROM dataset d LEFT JOIN ledger_entry l ON l.dataset_id = d.id
        GROUP BY d.id
        """
    )
    # Only the ledger trigger (nesting depth >= 2) may write a balance row.
    op.execute(
        """
        CREATE FUNCTION budget_balance_guard() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF pg_trigger_depth() < 2 THEN
                RAISE EXCEPTION 'budget_balance is written only by ledger_entry inserts: % refused', TG_OP
                    USING ERRCODE = 'object_not_in_prerequisite_state',
                          HINT = 'insert a grant or a debit into ledger_entry instead';
            END IF;
            IF TG_OP = 'DELETE' THEN
                RETURN OLD;
            END IF;
            RETURN NEW;
        END;
        $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER budget_balance_guard_rows
        BEFORE INSERT OR UPDATE OR DELETE ON budget_balance
        FOR EACH ROW EXECUTE FUNCTION budget_balance_guard()
        """
    )
    op.execute(
        """
        CREATE TRIGGER budget_balance_guard_truncate
        BEFORE TRUNCATE ON budget_balance
        FOR EACH STATEMENT EXECUTE FUNCTION budget_balance_guard()
        """
    )
    op.execute(
        """
        CREATE FUNCTION ledger_entry_apply() RETURNS trigger
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
    )
    op.execute(
        """
        CREATE TRIGGER ledger_entry_apply_balance
        AFTER INSERT ON ledger_entry
        FOR EACH ROW EXECUTE FUNCTION ledger_entry_apply()
        """
    )

    # ------------------------------------------------------------------ release states
    op.add_column('release', sa.Column('status', sa.String(length=16), nullable=True))
    op.add_column('release', sa.Column('failure', sa.String(length=32), nullable=True))
    op.add_column('release', sa.Column('attempts', sa.Integer(), nullable=True))
    op.add_column('release', sa.Column('lease_token', sa.Uuid(), nullable=True))
    op.add_column('release', sa.Column('lease_until', sa.DateTime(timezone=True), nullable=True))
    op.add_column('release', sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True))
    op.execute(
        "UPDATE release SET status = 'done', attempts = 1, finished_at = created_at"
    )
    op.alter_column('release', 'status', nullable=False)
    op.alter_column('release', 'attempts', nullable=False)
    op.alter_column('release', 'estimates', existing_type=sa.ARRAY(sa.Double()), nullable=True)
    op.create_check_constraint(
        op.f('ck_release_status'), 'release', "status IN ('pending', 'done', 'failed')"
    )
    op.create_check_constraint(
        op.f('ck_release_estimates_iff_done'),
        'release',
        "(status = 'done') = (estimates IS NOT NULL)",
    )
    op.create_check_constraint(
        op.f('ck_release_failure_iff_failed'),
        'release',
        "(status = 'failed') = (failure IS NOT NULL)",
    )
    op.create_index(
        'ix_release_pending', 'release', ['seq'], unique=False,
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.execute(
        """
        CREATE FUNCTION release_guard() RETURNS trigger
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
                NEW.request_hash, NEW.created_at)
               IS DISTINCT FROM
               (OLD.id, OLD.seq, OLD.dataset_id, OLD.api_key_id, OLD.method, OLD.quantiles,
                OLD.epsilon, OLD.delta, OLD.cost_epsilon, OLD.cost_delta,
                OLD.remaining_epsilon, OLD.remaining_delta, OLD.idempotency_key,
                OLD.request_hash, OLD.created_at) THEN
                RAISE EXCEPTION 'a release''s priced parameters never change'
                    USING ERRCODE = 'object_not_in_prerequisite_state';
            END IF;
            RETURN NEW;
        END;
        $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER release_guard_rows
        BEFORE UPDATE OR DELETE ON release
        FOR EACH ROW EXECUTE FUNCTION release_guard()
        """
    )
    op.execute(
        """
        CREATE TRIGGER release_guard_truncate
        BEFORE TRUNCATE ON release
        FOR EACH STATEMENT EXECUTE FUNCTION release_guard()
        """
    )

    # Wake-ups are the database's job, so no code path can forget one: a release becoming
    # runnable (inserted or resumed as pending) wakes the workers; a release becoming done or
    # failed wakes the requests waiting for it. Delivered at commit.
    op.execute(
        """
        CREATE FUNCTION release_notify() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.status = 'pending' AND (TG_OP = 'INSERT' OR OLD.status <> 'pending') THEN
                PERFORM pg_notify('dpquant_release_pending', NEW.id::text);
            ELSIF NEW.status <> 'pending' AND TG_OP = 'UPDATE' AND OLD.status = 'pending' THEN
                PERFORM pg_notify('dpquant_release_finished', NEW.id::text);
            END IF;
            RETURN NULL;
        END;
        $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER release_notify_state
        AFTER INSERT OR UPDATE OF status ON release
        FOR EACH ROW EXECUTE FUNCTION release_notify()
        """
    )

    # ------------------------------------------------------------------ bootstrap marker
    op.add_column(
        'api_key',
        sa.Column('bootstrap', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    )
    op.execute(
        "UPDATE api_key SET bootstrap = true "
        "WHERE name = 'bootstrap admin (DPQUANT_BOOTSTRAP_ADMIN_KEY)'"
    )


def downgrade() -> None:
    op.drop_column('api_key', 'bootstrap')
    op.execute("DROP TRIGGER IF EXISTS release_notify_state ON release")
    op.execute("DROP FUNCTION IF EXISTS release_notify()")
    op.execute("DROP TRIGGER IF EXISTS release_guard_truncate ON release")
    op.execute("DROP TRIGGER IF EXISTS release_guard_rows ON release")
    op.execute("DROP FUNCTION IF EXISTS release_guard()")
    op.drop_index('ix_release_pending', table_name='release')
    op.drop_constraint(op.f('ck_release_failure_iff_failed'), 'release', type_='check')
    op.drop_constraint(op.f('ck_release_estimates_iff_done'), 'release', type_='check')
    op.drop_constraint(op.f('ck_release_status'), 'release', type_='check')
    # Releases that never produced estimates cannot exist in the old schema: their debits
    # stay in the (append-only) ledger, the rows carry an empty estimate list.
    op.execute("UPDATE release SET estimates = '{}' WHERE estimates IS NULL")
    op.alter_column('release', 'estimates', existing_type=sa.ARRAY(sa.Double()), nullable=False)
    for column in ('finished_at', 'lease_until', 'lease_token', 'attempts', 'failure', 'status'):
        op.drop_column('release', column)
    op.execute("DROP TRIGGER IF EXISTS ledger_entry_apply_balance ON ledger_entry")
    op.execute("DROP FUNCTION IF EXISTS ledger_entry_apply()")
    op.execute("DROP TRIGGER IF EXISTS budget_balance_guard_truncate ON budget_balance")
    op.execute("DROP TRIGGER IF EXISTS budget_balance_guard_rows ON budget_balance")
    op.execute("DROP FUNCTION IF EXISTS budget_balance_guard()")
    op.drop_table('budget_balance')

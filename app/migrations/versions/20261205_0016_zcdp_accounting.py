"""zCDP accounting per table: a rho balance PostgreSQL defends like the (epsilon, delta) one

* ``dataset.accounting``: ``pure`` (epsilon and delta sum; every earlier dataset) or
  ``zcdp`` (releases debit rho; their (epsilon, delta) is stated at ``accounting_delta``).
* ``ledger_entry.rho``: the rho a grant adds or a debit spends (0 in pure tables). In a zCDP
  table a debit row keeps the query's (epsilon, delta) as asked, so API keys' caps keep
  capping the sum of what a key asked (basic composition: conservative).
* ``budget_balance``: ``granted_rho``, ``spent_rho`` and the table's ``accounting`` (copied by
  the trigger when the row is created; the row is written only by the trigger). The CHECK
  ``no_overdraft`` now reads: in a pure table spent (epsilon, delta) <= granted; in every
  table spent rho <= granted rho. Whoever inserts a debit, under any isolation level,
  PostgreSQL refuses the one that overdraws.
* ``release``: ``cost_rho``; ``remaining_rho`` (after this release, zCDP tables);
  ``remaining_epsilon`` and ``remaining_delta`` become NULL for zCDP tables (their (epsilon,
  delta) left is the conversion of the rho left, not a difference of sums).
* ``release_reserve()``: takes the plan's ``p_cost_rho`` and ``p_accounting`` (a plan made
  for the other accounting is sent back: ``replan``), checks the rho left, returns it.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05 01:00:00
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
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
        """    p_column varchar DEFAULT 'value',
    OUT outcome text,""",
        """    p_column varchar DEFAULT 'value',
    p_cost_rho numeric DEFAULT 0,
    p_accounting varchar DEFAULT 'pure',
    OUT outcome text,""",
    ),
    (
        """    OUT public_size bigint
)""",
        """    OUT public_size bigint,
    OUT left_rho numeric,
    OUT accounting varchar
)""",
    ),
    (
        """    SELECT ds.neighbors, ds.n, ds.size_hint, ds.archived_at, ds.values_uploaded_at,
           ds.frozen_at
    INTO d FROM dataset ds WHERE ds.id = p_dataset_id FOR UPDATE;""",
        """    SELECT ds.neighbors, ds.n, ds.size_hint, ds.archived_at, ds.values_uploaded_at,
           ds.frozen_at, ds.accounting
    INTO d FROM dataset ds WHERE ds.id = p_dataset_id FOR UPDATE;""",
    ),
    (
        """    neighbors := d.neighbors;""",
        """    neighbors := d.neighbors;
    accounting := d.accounting;""",
    ),
    (
        """    IF p_neighbors IS DISTINCT FROM neighbors OR p_public_size IS DISTINCT FROM public_size THEN""",
        """    IF p_neighbors IS DISTINCT FROM neighbors OR p_public_size IS DISTINCT FROM public_size
       OR p_accounting IS DISTINCT FROM accounting THEN""",
    ),
    (
        """    SELECT b.granted_epsilon - b.spent_epsilon, b.granted_delta - b.spent_delta
    INTO left_epsilon, left_delta
    FROM budget_balance b WHERE b.dataset_id = p_dataset_id;
    IF NOT FOUND THEN
        left_epsilon := 0;  -- nothing was ever granted
        left_delta := 0;
    END IF;
    IF left_epsilon < p_cost_epsilon OR left_delta < p_cost_delta THEN""",
        """    SELECT b.granted_epsilon - b.spent_epsilon, b.granted_delta - b.spent_delta,
           b.granted_rho - b.spent_rho
    INTO left_epsilon, left_delta, left_rho
    FROM budget_balance b WHERE b.dataset_id = p_dataset_id;
    IF NOT FOUND THEN
        left_epsilon := 0;  -- nothing was ever granted
        left_delta := 0;
        left_rho := 0;
    END IF;
    -- A pure table spends (epsilon, delta); a zCDP table spends rho (its rows keep the
    -- query's epsilon and delta for the keys' caps, but its balance is rho).
    IF (accounting = 'pure' AND (left_epsilon < p_cost_epsilon OR left_delta < p_cost_delta))
       OR left_rho < p_cost_rho THEN""",
    ),
    (
        """                         lease_token, lease_until, finished_at, expected_error, warnings,
                         column_name)""",
        """                         lease_token, lease_until, finished_at, expected_error, warnings,
                         column_name, cost_rho, remaining_rho)""",
    ),
    (
        """            p_delta, p_cost_epsilon, p_cost_delta, left_epsilon - p_cost_epsilon,
            left_delta - p_cost_delta, p_idempotency_key, p_request_hash, v_now,
            'pending', NULL, 0, NULL, NULL, NULL, p_expected_error,
            coalesce(p_warnings, '[]'::jsonb), p_column)""",
        """            p_delta, p_cost_epsilon, p_cost_delta,
            CASE WHEN accounting = 'pure' THEN left_epsilon - p_cost_epsilon END,
            CASE WHEN accounting = 'pure' THEN left_delta - p_cost_delta END,
            p_idempotency_key, p_request_hash, v_now,
            'pending', NULL, 0, NULL, NULL, NULL, p_expected_error,
            coalesce(p_warnings, '[]'::jsonb), p_column, p_cost_rho,
            CASE WHEN accounting = 'zcdp' THEN left_rho - p_cost_rho END)""",
    ),
    (
        """    INSERT INTO ledger_entry (dataset_id, kind, epsilon, delta, reason, release_id,
                              api_key_id, created_at)
    VALUES (p_dataset_id, 'debit', p_cost_epsilon, p_cost_delta, NULL, p_id, p_api_key_id,
            v_now);""",
        """    INSERT INTO ledger_entry (dataset_id, kind, epsilon, delta, rho, reason, release_id,
                              api_key_id, created_at)
    VALUES (p_dataset_id, 'debit', p_cost_epsilon, p_cost_delta, p_cost_rho, NULL, p_id,
            p_api_key_id, v_now);""",
    ),
)

OLD_SIGNATURE = (
    "release_reserve(uuid, uuid, uuid, varchar, double precision[], numeric, numeric, "
    "numeric, numeric, varchar, varchar, jsonb, jsonb, varchar, bigint, integer, integer, "
    "integer, varchar)"
)
NEW_SIGNATURE = OLD_SIGNATURE[:-1] + ", numeric, varchar)"

#: ``ledger_entry_apply``: the balance (with rho, and the table's accounting on creation)
#: and the debiting key's spent columns.
APPLY_0016 = """
CREATE OR REPLACE FUNCTION ledger_entry_apply() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_accounting varchar;
BEGIN
    SELECT ds.accounting INTO v_accounting FROM dataset ds WHERE ds.id = NEW.dataset_id;
    IF NEW.kind = 'grant' THEN
        INSERT INTO budget_balance AS b (dataset_id, granted_epsilon, granted_delta,
                                         spent_epsilon, spent_delta, granted_rho, spent_rho,
                                         accounting)
        VALUES (NEW.dataset_id, NEW.epsilon, NEW.delta, 0, 0, NEW.rho, 0, v_accounting)
        ON CONFLICT (dataset_id) DO UPDATE
        SET granted_epsilon = b.granted_epsilon + EXCLUDED.granted_epsilon,
            granted_delta = b.granted_delta + EXCLUDED.granted_delta,
            granted_rho = b.granted_rho + EXCLUDED.granted_rho;
    ELSE
        -- Not an upsert: PostgreSQL checks the CHECK constraint on the row proposed
        -- for insertion before it looks for a conflict.
        UPDATE budget_balance
        SET spent_epsilon = spent_epsilon + NEW.epsilon,
            spent_delta = spent_delta + NEW.delta,
            spent_rho = spent_rho + NEW.rho
        WHERE dataset_id = NEW.dataset_id;
        IF NOT FOUND THEN
            -- Nothing was ever granted: any positive debit is an overdraft.
            INSERT INTO budget_balance (dataset_id, granted_epsilon, granted_delta,
                                        spent_epsilon, spent_delta, granted_rho, spent_rho,
                                        accounting)
            VALUES (NEW.dataset_id, 0, 0, NEW.epsilon, NEW.delta, 0, NEW.rho, v_accounting);
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

NO_OVERDRAFT = (
    "(accounting = 'zcdp' OR (spent_epsilon <= granted_epsilon AND spent_delta <= "
    "granted_delta)) AND spent_rho <= granted_rho"
)


def _functions() -> tuple[str, str, str]:
    """(0014's reserve function, this one's, the old signature)."""
    m14 = _load("dpquant_migration_0014", "20261204_0014_table_columns.py")
    _, old, _ = m14._functions()
    new = old
    for before, after in _EDITS:
        assert new.count(before) == 1, before
        new = new.replace(before, after)
    return old, new, OLD_SIGNATURE


def upgrade() -> None:
    op.add_column(
        "dataset",
        sa.Column("accounting", sa.String(8), nullable=False, server_default="pure"),
    )
    op.add_column("dataset", sa.Column("accounting_delta", sa.Numeric(), nullable=True))
    op.create_check_constraint("accounting", "dataset", "accounting IN ('pure', 'zcdp')")
    op.create_check_constraint(
        "accounting_delta",
        "dataset",
        "(accounting = 'zcdp') = (accounting_delta IS NOT NULL) "
        "AND (accounting_delta IS NULL OR (accounting_delta > 0 AND accounting_delta < 1))",
    )
    op.add_column(
        "ledger_entry", sa.Column("rho", sa.Numeric(), nullable=False, server_default="0")
    )
    op.create_check_constraint("rho", "ledger_entry", "rho >= 0")
    for name in ("granted_rho", "spent_rho"):
        op.add_column(
            "budget_balance", sa.Column(name, sa.Numeric(), nullable=False, server_default="0")
        )
    op.add_column(
        "budget_balance",
        sa.Column("accounting", sa.String(8), nullable=False, server_default="pure"),
    )
    op.drop_constraint("no_overdraft", "budget_balance", type_="check")
    op.create_check_constraint("no_overdraft", "budget_balance", NO_OVERDRAFT)
    op.create_check_constraint("nonnegative_rho", "budget_balance", "spent_rho >= 0")
    op.add_column("release", sa.Column("cost_rho", sa.Numeric(), nullable=False,
                                       server_default="0"))  # fmt: skip
    op.add_column("release", sa.Column("remaining_rho", sa.Numeric(), nullable=True))
    op.alter_column("release", "remaining_epsilon", nullable=True)
    op.alter_column("release", "remaining_delta", nullable=True)
    op.execute(APPLY_0016)
    _, new, _ = _functions()
    op.execute(f"DROP FUNCTION {OLD_SIGNATURE}")
    op.execute(new)


def downgrade() -> None:
    old, _, _ = _functions()
    op.execute(f"DROP FUNCTION {NEW_SIGNATURE}")
    op.execute(old)
    m05 = _load("dpquant_migration_0005", "20261130_0005_governance.py")
    op.execute(m05.APPLY_0005)
    # zCDP tables have no place in the old schema: their releases keep their rows
    op.execute(
        "UPDATE release SET remaining_epsilon = 0, remaining_delta = 0 "
        "WHERE remaining_epsilon IS NULL OR remaining_delta IS NULL"
    )
    op.alter_column("release", "remaining_delta", nullable=False)
    op.alter_column("release", "remaining_epsilon", nullable=False)
    op.drop_column("release", "remaining_rho")
    op.drop_column("release", "cost_rho")
    op.drop_constraint("nonnegative_rho", "budget_balance", type_="check")
    op.drop_constraint("no_overdraft", "budget_balance", type_="check")
    # the guard refuses direct writes to the balance: lifted for this downgrade only
    op.execute("ALTER TABLE budget_balance DISABLE TRIGGER budget_balance_guard_rows")
    # a zCDP table's summed epsilon can exceed its target: the old CHECK cannot hold there
    op.execute(
        "UPDATE budget_balance SET granted_epsilon = greatest(granted_epsilon, spent_epsilon), "
        "granted_delta = greatest(granted_delta, spent_delta) WHERE accounting = 'zcdp'"
    )
    for name in ("accounting", "spent_rho", "granted_rho"):
        op.drop_column("budget_balance", name)
    op.execute("ALTER TABLE budget_balance ENABLE TRIGGER budget_balance_guard_rows")
    op.create_check_constraint(
        "no_overdraft",
        "budget_balance",
        "spent_epsilon <= granted_epsilon AND spent_delta <= granted_delta",
    )
    op.drop_constraint("rho", "ledger_entry", type_="check")
    op.drop_column("ledger_entry", "rho")
    op.drop_constraint("accounting_delta", "dataset", type_="check")
    op.drop_constraint("accounting", "dataset", type_="check")
    op.drop_column("dataset", "accounting_delta")
    op.drop_column("dataset", "accounting")

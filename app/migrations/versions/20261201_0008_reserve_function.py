"""the reservation as one statement: ``release_reserve()`` locks, checks, inserts and debits

Throughput. A reservation used to be a transaction of four round trips from the
web process (BEGIN with the dataset lock, the balance read with the inserts, the freeze,
COMMIT), each paying the client library's overhead, with the dataset row locked across
them. ``release_reserve()`` does the same work inside PostgreSQL in one call, in this order:

1. lock the dataset row (``FOR UPDATE``): every writer of its ledger serialises here;
2. compare the planning figures the caller priced the query with (the neighbour relation
   and the public size: n under swap, else the declared size hint) with the locked row's,
   and answer ``replan`` with the row's figures when they differ (the caller plans again);
3. with an ``Idempotency-Key``: a different body under the same key is
   ``idempotency_conflict``; the same body is ``replayed`` (a failed release that may run
   again is put back in the queue, no new debit);
4. ``dataset_archived``, ``no_values``;
5. the budget from the balance row: ``budget_exhausted``;
6. the calling key's cap, under the key row's lock: ``key_budget_exhausted``;
7. insert the release (``pending``) and its debit (the ledger trigger applies it to the
   balance row and the key's spent columns, whose CHECK constraints refuse an overdraft
   whatever this function checked), freeze the dataset, ``reserved``.

Refusals write nothing. Every statement in the function sees what was committed before it
(the service pins READ COMMITTED and a VOLATILE function takes a snapshot per statement),
so the checks after the lock read the latest budget. The commit may skip the WAL flush
(``synchronous_commit = off`` for this transaction): a reservation lost in a crash lost no
output, and the completion that stores the estimates follows it in the WAL and is flushed
before any answer leaves.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 21:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RESERVE = """
CREATE FUNCTION release_reserve(
    p_id uuid,
    p_dataset_id uuid,
    p_api_key_id uuid,
    p_method varchar,
    p_quantiles double precision[],
    p_epsilon numeric,
    p_delta numeric,
    p_cost_epsilon numeric,
    p_cost_delta numeric,
    p_idempotency_key varchar,
    p_request_hash varchar,
    p_expected_error jsonb,
    p_warnings jsonb,
    p_neighbors varchar,
    p_public_size bigint,
    p_max_runs integer,
    OUT outcome text,
    OUT release_id uuid,
    OUT seq bigint,
    OUT created_at timestamptz,
    OUT left_epsilon numeric,
    OUT left_delta numeric,
    OUT cap_epsilon numeric,
    OUT cap_delta numeric,
    OUT spent_epsilon numeric,
    OUT spent_delta numeric,
    OUT neighbors varchar,
    OUT public_size bigint
)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    d record;
    k record;
    earlier record;
    v_now timestamptz;
BEGIN
    SELECT ds.neighbors, ds.n, ds.size_hint, ds.archived_at, ds.values_uploaded_at,
           ds.frozen_at
    INTO d FROM dataset ds WHERE ds.id = p_dataset_id FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    neighbors := d.neighbors;
    public_size := CASE WHEN d.neighbors = 'swap' AND d.n IS NOT NULL THEN d.n
                        ELSE d.size_hint END;
    IF p_neighbors IS DISTINCT FROM neighbors OR p_public_size IS DISTINCT FROM public_size THEN
        outcome := 'replan';
        RETURN;
    END IF;

    IF p_idempotency_key IS NOT NULL THEN
        SELECT r.id, r.request_hash, r.status, r.attempts INTO earlier
        FROM release r
        WHERE r.api_key_id = p_api_key_id AND r.dataset_id = p_dataset_id
          AND r.idempotency_key = p_idempotency_key;
        IF FOUND THEN
            IF earlier.request_hash IS DISTINCT FROM p_request_hash THEN
                outcome := 'idempotency_conflict';
                RETURN;
            END IF;
            -- A replay is free; a failed release that may run again goes back in the queue
            -- (an archived dataset's values are gone: nothing to run it on).
            IF earlier.status = 'failed' AND earlier.attempts < p_max_runs
               AND d.archived_at IS NULL THEN
                UPDATE release
                SET status = 'pending', failure = NULL, lease_token = NULL,
                    lease_until = NULL, finished_at = NULL
                WHERE id = earlier.id AND status = 'failed';
            END IF;
            outcome := 'replayed';
            release_id := earlier.id;
            RETURN;
        END IF;
    END IF;

    IF d.archived_at IS NOT NULL THEN
        outcome := 'dataset_archived';
        RETURN;
    END IF;
    IF d.values_uploaded_at IS NULL THEN
        outcome := 'no_values';
        RETURN;
    END IF;

    SELECT b.granted_epsilon - b.spent_epsilon, b.granted_delta - b.spent_delta
    INTO left_epsilon, left_delta
    FROM budget_balance b WHERE b.dataset_id = p_dataset_id;
    IF NOT FOUND THEN
        left_epsilon := 0;  -- nothing was ever granted
        left_delta := 0;
    END IF;
    IF left_epsilon < p_cost_epsilon OR left_delta < p_cost_delta THEN
        outcome := 'budget_exhausted';
        RETURN;
    END IF;

    SELECT ak.max_epsilon, ak.max_delta, ak.spent_epsilon, ak.spent_delta INTO k
    FROM api_key ak WHERE ak.id = p_api_key_id FOR UPDATE;
    IF FOUND AND ((k.max_epsilon IS NOT NULL AND k.spent_epsilon + p_cost_epsilon > k.max_epsilon)
                  OR (k.max_delta IS NOT NULL AND k.spent_delta + p_cost_delta > k.max_delta)) THEN
        outcome := 'key_budget_exhausted';
        cap_epsilon := k.max_epsilon;
        cap_delta := k.max_delta;
        spent_epsilon := k.spent_epsilon;
        spent_delta := k.spent_delta;
        RETURN;
    END IF;

    v_now := clock_timestamp();
    INSERT INTO release (id, dataset_id, api_key_id, method, quantiles, estimates, epsilon,
                         delta, cost_epsilon, cost_delta, remaining_epsilon, remaining_delta,
                         idempotency_key, request_hash, created_at, status, failure, attempts,
                         lease_token, lease_until, finished_at, expected_error, warnings)
    VALUES (p_id, p_dataset_id, p_api_key_id, p_method, p_quantiles, NULL, p_epsilon,
            p_delta, p_cost_epsilon, p_cost_delta, left_epsilon - p_cost_epsilon,
            left_delta - p_cost_delta, p_idempotency_key, p_request_hash, v_now,
            'pending', NULL, 0, NULL, NULL, NULL, p_expected_error,
            coalesce(p_warnings, '[]'::jsonb))
    RETURNING release.seq INTO seq;
    INSERT INTO ledger_entry (dataset_id, kind, epsilon, delta, reason, release_id,
                              api_key_id, created_at)
    VALUES (p_dataset_id, 'debit', p_cost_epsilon, p_cost_delta, NULL, p_id, p_api_key_id,
            v_now);
    IF d.frozen_at IS NULL THEN
        -- Values never change once a run has been paid for.
        UPDATE dataset SET frozen_at = v_now WHERE id = p_dataset_id;
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    outcome := 'reserved';
    release_id := p_id;
    created_at := v_now;
END;
$$
"""

SIGNATURE = (
    "release_reserve(uuid, uuid, uuid, varchar, double precision[], numeric, numeric, "
    "numeric, numeric, varchar, varchar, jsonb, jsonb, varchar, bigint, integer)"
)


def upgrade() -> None:
    op.execute(RESERVE)


def downgrade() -> None:
    op.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")

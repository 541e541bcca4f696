-- release_reserve(): the reservation as one statement. It locks the dataset row, checks the
-- public figures the plan used, replays idempotent requests, checks the dataset budget, the
-- key cap and the queue caps, then inserts the pending release (with the column it reads)
-- and its debit. This file is
-- the function as the migrations leave it at head (tests/service/test_sql_rules.py checks
-- it against the migrated database and against the migration that installs it); a
-- migration that changes the function changes this file in the same commit.
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
    p_max_pending_key integer,
    p_max_pending_dataset integer,
    p_column varchar DEFAULT 'value',
    p_cost_rho numeric DEFAULT 0,
    p_accounting varchar DEFAULT 'pure',
    p_trace_parent varchar DEFAULT NULL,
    p_group_by varchar DEFAULT NULL,
    p_group_keys jsonb DEFAULT NULL,
    p_group_error jsonb DEFAULT NULL,
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
    OUT public_size bigint,
    OUT left_rho numeric,
    OUT accounting varchar
)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    d record;
    k record;
    earlier record;
    v_now timestamptz;
BEGIN
    SELECT ds.neighbors, ds.n, ds.size_hint, ds.archived_at, ds.values_uploaded_at,
           ds.frozen_at, ds.accounting, ds.restore_hold_since
    INTO d FROM dataset ds WHERE ds.id = p_dataset_id FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    neighbors := d.neighbors;
    accounting := d.accounting;
    public_size := CASE WHEN d.neighbors = 'swap' AND d.n IS NOT NULL THEN d.n
                        ELSE d.size_hint END;
    IF p_neighbors IS DISTINCT FROM neighbors OR p_public_size IS DISTINCT FROM public_size
       OR p_accounting IS DISTINCT FROM accounting THEN
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
            -- A replay is free and returns the release as it stands: a failed release is
            -- final (migration 0011).
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
    IF p_group_by IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM dataset_column c
        WHERE c.dataset_id = p_dataset_id AND c.name = p_group_by AND c.keys_stored IS NOT NULL
    ) THEN
        outcome := 'no_group_values';  -- values uploaded as a histogram: no per-key counts
        RETURN;
    END IF;
    IF d.restore_hold_since IS NOT NULL THEN
        -- restored from a backup: what was spent after it is not in this ledger
        outcome := 'budget_on_hold';
        RETURN;
    END IF;

    SELECT b.granted_epsilon - b.spent_epsilon, b.granted_delta - b.spent_delta,
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
       OR left_rho < p_cost_rho THEN
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

    -- The queue caps, under the dataset's and the key's row locks taken above.
    IF p_max_pending_key > 0 AND (
        SELECT count(*) FROM release r
        WHERE r.api_key_id = p_api_key_id AND r.status = 'pending'
    ) >= p_max_pending_key THEN
        outcome := 'too_many_pending_key';
        RETURN;
    END IF;
    IF p_max_pending_dataset > 0 AND (
        SELECT count(*) FROM release r
        WHERE r.dataset_id = p_dataset_id AND r.status = 'pending'
    ) >= p_max_pending_dataset THEN
        outcome := 'too_many_pending_dataset';
        RETURN;
    END IF;

    v_now := clock_timestamp();
    INSERT INTO release (id, dataset_id, api_key_id, method, quantiles, estimates, epsilon,
                         delta, cost_epsilon, cost_delta, remaining_epsilon, remaining_delta,
                         idempotency_key, request_hash, created_at, status, failure, attempts,
                         lease_token, lease_until, finished_at, expected_error, warnings,
                         column_name, cost_rho, remaining_rho, trace_parent,
                         group_by, group_keys, group_error)
    VALUES (p_id, p_dataset_id, p_api_key_id, p_method, p_quantiles, NULL, p_epsilon,
            p_delta, p_cost_epsilon, p_cost_delta,
            CASE WHEN accounting = 'pure' THEN left_epsilon - p_cost_epsilon END,
            CASE WHEN accounting = 'pure' THEN left_delta - p_cost_delta END,
            p_idempotency_key, p_request_hash, v_now,
            'pending', NULL, 0, NULL, NULL, NULL, p_expected_error,
            coalesce(p_warnings, '[]'::jsonb), p_column, p_cost_rho,
            CASE WHEN accounting = 'zcdp' THEN left_rho - p_cost_rho END, p_trace_parent,
            p_group_by, p_group_keys, p_group_error)
    RETURNING release.seq INTO seq;
    INSERT INTO ledger_entry (dataset_id, kind, epsilon, delta, rho, reason, release_id,
                              api_key_id, created_at)
    VALUES (p_dataset_id, 'debit', p_cost_epsilon, p_cost_delta, p_cost_rho, NULL, p_id,
            p_api_key_id, v_now);
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

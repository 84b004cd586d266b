-- Migration 0007 (otherwise as in 0006 and 0002): a job may carry its own max_attempts (its
-- handler's retry policy, given at enqueue; NULL: the site's, p_max_attempts) and an
-- operator's cancel_requested:
-- * feishu_inbox_enqueue takes p_max_attempts (its changed signature is dropped first:
--   CREATE OR REPLACE would add an overload);
-- * feishu_inbox_end_attempt's fail path: a cancelled job completes as Cancelled instead of
--   being retried; the job's own attempts come before the site's;
-- * feishu_inbox_claim clears cancel_requested.

DROP FUNCTION IF EXISTS feishu_inbox_enqueue(text, text, text, text, text, boolean, jsonb);

CREATE OR REPLACE FUNCTION feishu_inbox_enqueue(
    p_app text, p_event_id text, p_event_type text, p_dedupe text, p_key text,
    p_private boolean, p_payload jsonb, p_max_attempts integer
) RETURNS TABLE (job_id bigint, created boolean) LANGUAGE plpgsql AS $$
DECLARE
    v_head bigint;
    v_id bigint;
BEGIN
    -- enqueue_partition: lock (or create) the partition row. Enqueues into one partition
    -- serialise here, so the id (receipt sequence) taken next is in commit order within the
    -- partition. Locking an existing row is cheaper than rewriting it with ON CONFLICT DO
    -- UPDATE (15 percent more enqueues at 8 clients).
    SELECT p.head_id INTO v_head FROM {partition} p WHERE p.key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO {partition} AS p (key, head_id, head_state, head_due_at)
        VALUES (p_key, NULL, '{idle}', NULL)
        ON CONFLICT (key) DO UPDATE SET key = excluded.key
        RETURNING p.head_id INTO v_head;
    END IF;

    -- enqueue_job
    INSERT INTO {job} (app, event_id, event_type, dedupe_key, partition_key, private_message,
        payload, status, attempt, max_attempts, received_at, available_at, worker_id,
        lease_token, effects_in_flight, side_effect_started, effect_uncertain, cancel_requested,
        error_type, error_message, resolution)
    VALUES (p_app, p_event_id, p_event_type, p_dedupe, p_key, p_private, p_payload, '{queued}',
        0, p_max_attempts, now(), now(), '', '', 0, FALSE, FALSE, FALSE, '', '', '')
    ON CONFLICT (app, dedupe_key) DO NOTHING
    RETURNING id INTO v_id;

    IF v_id IS NULL THEN
        -- duplicate_of
        SELECT j.id INTO v_id FROM {job} j WHERE j.app = p_app AND j.dedupe_key = p_dedupe;
        RETURN QUERY SELECT v_id, FALSE;
        RETURN;
    END IF;
    IF v_head IS NULL THEN
        -- set_first_head
        UPDATE {partition} SET head_id = v_id, head_state = '{queued}', head_due_at = now()
        WHERE key = p_key;
    END IF;
    -- notify: a new head is claimable; a private message may supersede the chat's running
    -- job (SPEC §4), so the worker running it looks at once instead of at its next tick.
    IF v_head IS NULL OR p_private THEN
        PERFORM pg_notify('{channel}', left(p_key, 200));
    END IF;
    RETURN QUERY SELECT v_id, TRUE;
END
$$;

CREATE OR REPLACE FUNCTION feishu_inbox_end_attempt(
    p_id bigint, p_worker text, p_token text, p_key text, p_fail boolean,
    p_error_type text, p_error_message text, p_max_attempts integer, p_retry_in float8
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_status text;
    v_head bigint;
    v_head_state text;
    v_head_due timestamptz;
BEGIN
    -- lock_partitions
    PERFORM 1 FROM {partition} WHERE key = p_key FOR UPDATE;
    IF p_fail THEN
        -- fail_job
        UPDATE {job} SET
            status = CASE
                WHEN {effect_started} THEN '{unknown}'
                WHEN cancel_requested THEN '{completed}'
                WHEN attempt >= COALESCE(max_attempts, p_max_attempts) THEN '{failed}'
                ELSE '{retry_wait}' END,
            available_at = CASE
                WHEN {effect_started} OR cancel_requested
                     OR attempt >= COALESCE(max_attempts, p_max_attempts) THEN available_at
                ELSE now() + p_retry_in * interval '1 second' END,
            finished_at = now(),
            error_type = CASE WHEN NOT {effect_started} AND cancel_requested
                THEN 'Cancelled' ELSE p_error_type END,
            error_message = p_error_message,
            lease_token = '', lease_until = NULL
        WHERE id = p_id AND status = '{running}' AND worker_id = p_worker
          AND lease_token = p_token AND lease_until > now()
        RETURNING status INTO v_status;
    ELSE
        -- finish_job
        UPDATE {job} SET
            status = CASE WHEN {effect_open} THEN '{unknown}' ELSE '{completed}' END,
            error_type = CASE WHEN {effect_open} THEN 'UncertainEffect' ELSE p_error_type END,
            error_message = CASE WHEN {effect_open} THEN {uncertain_message} ELSE '' END,
            finished_at = now(), lease_token = '', lease_until = NULL
        WHERE id = p_id AND status = '{running}' AND worker_id = p_worker
          AND lease_token = p_token AND lease_until > now()
        RETURNING status INTO v_status;
    END IF;
    IF v_status IS NULL THEN
        RETURN NULL;  -- lease lost: nothing changed
    END IF;
    -- record_attempts
    INSERT INTO {attempt} (job_id, number, worker_id, started_at, ended_at, outcome, error_type,
                           error_message, lease_token)
    SELECT id, attempt, worker_id, COALESCE(claimed_at, now()), now(), status, error_type,
           error_message, p_token
    FROM {job} WHERE id = p_id;
    -- resync_head. Dynamic SQL is planned with the actual key: a cached generic plan cannot
    -- tell a chat with 200,000 waiting jobs from one with none, and walks the primary key
    -- through the whole backlog; a custom plan uses the partial index (partition_key, id).
    EXECUTE 'SELECT id, status, available_at FROM {job} WHERE partition_key = $1 '
            'AND NOT (status = ''{completed}'') ORDER BY partition_key, id LIMIT 1'
        INTO v_head, v_head_state, v_head_due USING p_key;
    UPDATE {partition} SET head_id = v_head, head_state = COALESCE(v_head_state, '{idle}'),
        head_due_at = v_head_due
    WHERE key = p_key;
    RETURN v_status;
END
$$;

CREATE OR REPLACE FUNCTION feishu_inbox_claim(
    p_worker text, p_token text, p_lease float8, p_limit integer
) RETURNS SETOF {job} LANGUAGE plpgsql AS $$
BEGIN
    -- claimable_heads, claim_partitions and claim_jobs in one statement; inside a function
    -- its plan is cached for the session.
    RETURN QUERY
    WITH picked AS (
        SELECT key, head_id FROM {partition}
        WHERE head_state IN {claimable} AND head_due_at <= now()
        ORDER BY head_id LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), part AS (
        UPDATE {partition} SET head_state = '{running}' FROM picked
        WHERE {partition}.key = picked.key
    )
    UPDATE {job} SET status = '{running}', attempt = {job}.attempt + 1, worker_id = p_worker,
        lease_token = p_token, lease_until = now() + p_lease * interval '1 second',
        claimed_at = now(), error_type = '', error_message = '', cancel_requested = FALSE
    FROM picked
    WHERE {job}.id = picked.head_id AND {job}.status IN {claimable}
    RETURNING {job}.*;
END
$$;

-- Migration 0015 (otherwise as in 0013): feishu_inbox_end_attempt in three statements
-- instead of five, the same steps in the same order. Each statement a PL/pgSQL function runs
-- costs an executor start and end whatever it does (about a seventh of the backend's CPU per
-- job after 0014); measured with the stored functions alone (pgbench, one client, commits not
-- flushed), a finish with its next claim took 0.92 of the time.
-- * The job's update and its history row are one statement: the row goes from the update's
--   RETURNING (the values the row has after it) into the attempt, where a second statement
--   read the row again by id. Nothing is recorded when the fence matched nothing (v_status
--   stays NULL, as before).
-- * The new head is read inside the partition's update, as a row subquery: no head leaves
--   the partition idle (the LEFT JOIN gives one row of NULLs). The head lookup is the same
--   query, with the same plan (tests/test_plans.py).
-- The lock order is unchanged: the partition row first, then the job's.

CREATE OR REPLACE FUNCTION feishu_inbox_end_attempt(
    p_id bigint, p_worker text, p_token text, p_key text, p_fail boolean,
    p_error_type text, p_error_message text, p_max_attempts integer, p_retry_in float8
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_status text;
BEGIN
    -- lock_partitions
    PERFORM 1 FROM {partition} WHERE key = p_key FOR UPDATE;
    IF p_fail THEN
        -- fail_job and record_attempts: one statement
        WITH ended AS (UPDATE {job} SET
            status = {status_after_fail_function},
            available_at = CASE WHEN {status_after_fail_function} = '{retry_wait}'
                THEN now() + p_retry_in * interval '1 second' ELSE available_at END,
            {settle_after_fail_function},
            finished_at = now(),
            error_type = CASE WHEN {status_after_fail_function} = '{completed}'
                THEN 'Cancelled' ELSE p_error_type END,
            error_message = p_error_message,
            lease_token = '', lease_until = NULL
        WHERE id = p_id AND status = '{running}' AND worker_id = p_worker
          AND lease_token = p_token AND lease_until > now()
        RETURNING id, attempt, worker_id, claimed_at, status, error_type, error_message)
        INSERT INTO {attempt} (job_id, number, worker_id, started_at, ended_at, outcome,
                               error_type, error_message, lease_token)
        SELECT id, attempt, worker_id, COALESCE(claimed_at, now()), now(), status, error_type,
               error_message, p_token
        FROM ended
        RETURNING outcome INTO v_status;
    ELSE
        -- finish_job and record_attempts: one statement
        WITH ended AS (UPDATE {job} SET
            status = CASE WHEN {effect_open} THEN '{unknown}' ELSE '{completed}' END,
            error_type = CASE WHEN {effect_open} THEN 'UncertainEffect' ELSE p_error_type END,
            error_message = CASE WHEN {effect_open} THEN {uncertain_message} ELSE '' END,
            finished_at = now(), lease_token = '', lease_until = NULL
        WHERE id = p_id AND status = '{running}' AND worker_id = p_worker
          AND lease_token = p_token AND lease_until > now()
        RETURNING id, attempt, worker_id, claimed_at, status, error_type, error_message)
        INSERT INTO {attempt} (job_id, number, worker_id, started_at, ended_at, outcome,
                               error_type, error_message, lease_token)
        SELECT id, attempt, worker_id, COALESCE(claimed_at, now()), now(), status, error_type,
               error_message, p_token
        FROM ended
        RETURNING outcome INTO v_status;
    END IF;
    IF v_status IS NULL THEN
        RETURN NULL;  -- lease lost: nothing changed
    END IF;
    -- resync_head: the first non-completed job of the whole partition, by definition of the
    -- head, so it needs no proof about the jobs before p_id: whatever they are (retry_wait,
    -- failed, unknown: still unresolved, the head goes back to them; cancelled or superseded
    -- private messages: completed, skipped; a replayed job moved to a new id; a job with steps
    -- or a schedule's job, which are ordinary jobs), the answer is the same as resync_head's in
    -- common.sql (tests/test_finishing.py forces each case). Static, so its plan is cached;
    -- the order matches the partial index (partition_key, id), whose first entry for the key
    -- is the answer. The key is written as a range of one value (>= and <=, the same rows as
    -- =): with `partition_key = p_key` the key is a constant of the ORDER BY, so the primary
    -- key's order serves it too, and a generic plan made while one chat holds nearly every
    -- row (statistics: one distinct key) walks the primary key through that chat's whole
    -- backlog to find another chat's head (bench/claim_backlog.py: 34 ms a job). A range
    -- leaves the primary key no such order, so every plan reads the partial index
    -- (tests/test_plans.py holds it with such statistics at 200,000 waiting jobs).
    UPDATE {partition} SET (head_id, head_state, head_due_at, head_priority) = (
        SELECT h.id, COALESCE(h.status, '{idle}'), h.available_at, COALESCE(h.priority, 0)
        FROM (SELECT) AS one LEFT JOIN LATERAL (
            SELECT j.id, j.status, j.available_at, j.priority
            FROM {job} j
            WHERE j.partition_key >= p_key AND j.partition_key <= p_key
              AND NOT (j.status = '{completed}')
            ORDER BY j.partition_key, j.id LIMIT 1
        ) AS h ON TRUE)
    WHERE key = p_key;
    RETURN v_status;
END
$$;

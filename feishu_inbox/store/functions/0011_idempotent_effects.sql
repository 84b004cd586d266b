-- Migration 0011 (otherwise as in 0007): idempotent effects (SPEC §3 Effects). Only the fail
-- path of feishu_inbox_end_attempt changes, with the same signature:
-- * an attempt whose every effect was idempotent fails to retry_wait, not unknown, when it
--   runs again inside the job's window (idempotent_until after now() + p_retry_in); then
--   nothing is in flight or uncertain any more (it re-issues them with the same keys);
-- * p_retry_in NULL is a final failure (retrying cannot help, e.g. Feishu refused the
--   request): failed when every effect started was idempotent and settled, else unknown.
-- The rule is schema.status_after(), the one SQLite's fail_job and lease expiry use too.

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

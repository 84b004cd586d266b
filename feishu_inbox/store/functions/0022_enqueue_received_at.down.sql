-- Back to 0007's feishu_inbox_enqueue(), which returns (job_id, created).

DROP FUNCTION IF EXISTS feishu_inbox_enqueue(text, text, text, text, text, boolean, jsonb, integer);

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

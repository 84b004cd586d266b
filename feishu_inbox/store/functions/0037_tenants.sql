-- Migration 0037: tenants (SPEC §9j). Every job belongs to a tenant ('' for none): Feishu's
-- header.tenant_key for an event, the tenant= its enqueuer declared for other work. Dedupe
-- keys are unique per (app, tenant, dedupe_key) (the constraint feishu_inbox_job_dedupe_tenant
-- replaces (app, dedupe_key)): feishu_inbox_enqueue() stores p_tenant in the same INSERT,
-- its ON CONFLICT names the new constraint's columns, and the duplicate it reports is the
-- tenant's. Its signature changes: dropped and created again, in the migration's transaction.
-- p_tenant defaults to '', so a process of the version before, still running while the
-- migration ran (a rolling deploy), keeps storing events as it did (tenant '').

DROP FUNCTION IF EXISTS feishu_inbox_enqueue(
    text, text, text, text, text, boolean, jsonb, integer, text);

CREATE FUNCTION feishu_inbox_enqueue(
    p_app text, p_event_id text, p_event_type text, p_dedupe text, p_key text,
    p_private boolean, p_payload jsonb, p_max_attempts integer,
    p_trace_parent text DEFAULT '', p_tenant text DEFAULT ''
) RETURNS TABLE (job_id bigint, created boolean, received_at timestamptz) LANGUAGE plpgsql AS $$
DECLARE
    v_head bigint;
    v_id bigint;
    v_received timestamptz;
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
        error_type, error_message, resolution, trace_parent, tenant)
    VALUES (p_app, p_event_id, p_event_type, p_dedupe, p_key, p_private, p_payload, '{queued}',
        0, p_max_attempts, now(), now(), '', '', 0, FALSE, FALSE, FALSE, '', '', '',
        p_trace_parent, p_tenant)
    ON CONFLICT (app, tenant, dedupe_key) DO NOTHING
    RETURNING id, {job}.received_at INTO v_id, v_received;

    IF v_id IS NULL THEN
        -- duplicate_of
        SELECT j.id, j.received_at INTO v_id, v_received
        FROM {job} j
        WHERE j.app = p_app AND j.tenant = p_tenant AND j.dedupe_key = p_dedupe;
        RETURN QUERY SELECT v_id, FALSE, v_received;
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
    RETURN QUERY SELECT v_id, TRUE, v_received;
END
$$;

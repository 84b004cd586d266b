"""PostgreSQL: enqueue and end-of-attempt as server-side functions (one round trip each).

They run the same steps as the portable path in ``ledger.py`` (which SQLite uses): lock the
partition row first, then recompute its head in a later statement. Inside a VOLATILE PL/pgSQL
function each statement takes a new snapshot under READ COMMITTED, so the head recomputation
sees every enqueue that committed before the lock was granted. The test suite runs on both
databases, which keeps the two paths equal.
"""

from django.db import migrations

J = "feishu_inbox_eventjob"
P = "feishu_inbox_partition"
A = "feishu_inbox_attempt"

HEAD_DYNAMIC = (
    f"FROM {J} WHERE partition_key = $1 AND NOT (status = ''completed'') "
    "ORDER BY partition_key, id LIMIT 1"
)
CLAIMABLE = "('queued', 'retry_wait')"

CREATE = f"""
CREATE OR REPLACE FUNCTION feishu_inbox_enqueue(
    p_app text, p_event_id text, p_event_type text, p_dedupe text, p_key text,
    p_private boolean, p_payload jsonb
) RETURNS TABLE (job_id bigint, created boolean) LANGUAGE plpgsql AS $$
DECLARE
    v_head bigint;
    v_id bigint;
BEGIN
    -- Lock (or create) the partition row: enqueues into one partition serialise here, so the
    -- id (receipt sequence) taken next is in commit order within the partition. Locking an
    -- existing row is cheaper than rewriting it with ON CONFLICT DO UPDATE (15 percent more enqueues at 8 clients).
    SELECT p.head_id INTO v_head FROM {P} p WHERE p.key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO {P} AS p (key, head_id, head_state, head_due_at)
        VALUES (p_key, NULL, 'idle', NULL)
        ON CONFLICT (key) DO UPDATE SET key = excluded.key
        RETURNING p.head_id INTO v_head;
    END IF;

    INSERT INTO {J} (app, event_id, event_type, dedupe_key, partition_key, private_message,
        payload, status, attempt, received_at, available_at, worker_id, lease_token,
        effects_in_flight, side_effect_started, effect_uncertain, error_type, error_message,
        resolution)
    VALUES (p_app, p_event_id, p_event_type, p_dedupe, p_key, p_private, p_payload, 'queued',
        0, now(), now(), '', '', 0, FALSE, FALSE, '', '', '')
    ON CONFLICT (app, dedupe_key) DO NOTHING
    RETURNING id INTO v_id;

    IF v_id IS NULL THEN
        SELECT j.id INTO v_id FROM {J} j WHERE j.app = p_app AND j.dedupe_key = p_dedupe;
        RETURN QUERY SELECT v_id, FALSE;
        RETURN;
    END IF;
    IF v_head IS NULL THEN
        UPDATE {P} SET head_id = v_id, head_state = 'queued', head_due_at = now()
        WHERE key = p_key;
        PERFORM pg_notify('feishu_inbox', left(p_key, 200));
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
    PERFORM 1 FROM {P} WHERE key = p_key FOR UPDATE;
    IF p_fail THEN
        UPDATE {J} SET
            status = CASE
                WHEN side_effect_started OR effects_in_flight > 0 OR effect_uncertain
                    THEN 'unknown'
                WHEN attempt >= p_max_attempts THEN 'failed'
                ELSE 'retry_wait' END,
            available_at = CASE
                WHEN side_effect_started OR effects_in_flight > 0 OR effect_uncertain
                     OR attempt >= p_max_attempts THEN available_at
                ELSE now() + p_retry_in * interval '1 second' END,
            finished_at = now(), error_type = p_error_type, error_message = p_error_message,
            lease_token = '', lease_until = NULL
        WHERE id = p_id AND status = 'running' AND worker_id = p_worker
          AND lease_token = p_token AND lease_until > now()
        RETURNING status INTO v_status;
    ELSE
        UPDATE {J} SET
            status = CASE WHEN effects_in_flight > 0 OR effect_uncertain
                          THEN 'unknown' ELSE 'completed' END,
            error_type = CASE WHEN effects_in_flight > 0 OR effect_uncertain
                              THEN 'UncertainEffect' ELSE p_error_type END,
            error_message = CASE WHEN effects_in_flight > 0 OR effect_uncertain
                THEN 'An effect was in flight or raised when the handler ended; check '
                     || 'whether it happened, then reconcile.'
                ELSE '' END,
            finished_at = now(), lease_token = '', lease_until = NULL
        WHERE id = p_id AND status = 'running' AND worker_id = p_worker
          AND lease_token = p_token AND lease_until > now()
        RETURNING status INTO v_status;
    END IF;
    IF v_status IS NULL THEN
        RETURN NULL;  -- lease lost: nothing changed
    END IF;
    INSERT INTO {A} (job_id, number, worker_id, started_at, ended_at, outcome, error_type,
                     error_message)
    SELECT id, attempt, worker_id, COALESCE(claimed_at, now()), now(), status, error_type,
           error_message
    FROM {J} WHERE id = p_id;
    -- Dynamic SQL is planned with the actual key: a cached generic plan cannot tell a chat
    -- with 200,000 waiting jobs from one with none, and walks the primary key through the
    -- whole backlog; a custom plan uses the partial index (partition_key, id).
    EXECUTE 'SELECT id, status, available_at {HEAD_DYNAMIC}'
        INTO v_head, v_head_state, v_head_due USING p_key;
    UPDATE {P} SET head_id = v_head, head_state = COALESCE(v_head_state, 'idle'),
        head_due_at = v_head_due
    WHERE key = p_key;
    RETURN v_status;
END
$$;
"""

CREATE += f"""
CREATE OR REPLACE FUNCTION feishu_inbox_claim(
    p_worker text, p_token text, p_lease float8, p_limit integer
) RETURNS SETOF {J} LANGUAGE plpgsql AS $$
BEGIN
    -- One statement; inside a function its plan is cached for the session.
    RETURN QUERY
    WITH picked AS (
        SELECT key, head_id FROM {P}
        WHERE head_state IN {CLAIMABLE} AND head_due_at <= now()
        ORDER BY head_id LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), part AS (
        UPDATE {P} SET head_state = 'running' FROM picked WHERE {P}.key = picked.key
    )
    UPDATE {J} SET status = 'running', attempt = {J}.attempt + 1, worker_id = p_worker,
        lease_token = p_token, lease_until = now() + p_lease * interval '1 second',
        claimed_at = now(), error_type = '', error_message = ''
    FROM picked
    WHERE {J}.id = picked.head_id AND {J}.status IN {CLAIMABLE}
    RETURNING {J}.*;
END
$$;
"""

DROP = """
DROP FUNCTION IF EXISTS feishu_inbox_claim(text, text, float8, integer);
DROP FUNCTION IF EXISTS feishu_inbox_enqueue(text, text, text, text, text, boolean, jsonb);
DROP FUNCTION IF EXISTS feishu_inbox_end_attempt(
    bigint, text, text, text, boolean, text, text, integer, float8);
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("feishu_inbox", "0001_ledger")]
    operations = [migrations.RunPython(create, drop, elidable=False)]

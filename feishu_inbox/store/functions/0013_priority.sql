-- Migration 0013 (otherwise as in 0012, 0011, 0010, 0007, 0006 and 0002): priority.
-- A job carries a priority (a django.tasks task's; 0 for Feishu events and schedules), and its
-- partition's row carries its head's (head_priority, 0 when idle). The claim takes due heads by
-- priority, highest first, then by receipt sequence, through the partial index
-- feishu_inbox_part_claimable (head_priority DESC, head_id): the same one index probe as
-- before, in index order, with no sort. A priority never reorders a partition: an ordered
-- partition's later jobs wait for its head whatever their priority.
-- * feishu_inbox_end_attempt: the head lookup also reads the new head's priority.
-- * feishu_inbox_claim: ORDER BY head_priority DESC, head_id (both branches), and planned
--   with sorts and sequential scans forbidden (its SET clauses). Every claim must read the
--   claimable index in order; but before autovacuum first analyses the tables (a new site's
--   first minutes, a benchmark) the planner's defaults expect a claimable partition or two,
--   and reading every due partition through feishu_inbox_part_due and sorting them then
--   looks cheaper: a claim cost a sort of every waiting chat (0.5 ms at 1,000 chats, growing
--   with the chats), and the session kept that plan. tests/test_plans.py holds both plans of
--   both claims on the index without statistics.
-- * feishu_inbox_claim_prefixed: the same order and SET clauses, and (as feishu_inbox_claim
--   since 0012) a branch with a literal LIMIT 1, so its cached generic plan is the custom one.
-- * feishu_inbox_finish_together: takes the queue prefixes of a `runworker --queue` worker
--   (NULL: every queue), so such a worker's finishes go together too.
-- The head is set elsewhere only by resync_head (common.sql) and, for an idle partition, by
-- feishu_inbox_enqueue's set_first_head: a new job's priority is 0 then (the column's
-- default), and a task's priority is set after it in the same transaction
-- (defer_and_rank_job and defer_and_rank_head in common.sql), so the enqueue is unchanged.

CREATE OR REPLACE FUNCTION feishu_inbox_end_attempt(
    p_id bigint, p_worker text, p_token text, p_key text, p_fail boolean,
    p_error_type text, p_error_message text, p_max_attempts integer, p_retry_in float8
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_status text;
    v_head bigint;
    v_head_state text;
    v_head_due timestamptz;
    v_head_priority smallint;
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
    SELECT j.id, j.status, j.available_at, j.priority
    INTO v_head, v_head_state, v_head_due, v_head_priority
    FROM {job} j
    WHERE j.partition_key >= p_key AND j.partition_key <= p_key
      AND NOT (j.status = '{completed}')
    ORDER BY j.partition_key, j.id LIMIT 1;
    UPDATE {partition} SET head_id = v_head, head_state = COALESCE(v_head_state, '{idle}'),
        head_due_at = v_head_due, head_priority = COALESCE(v_head_priority, 0)
    WHERE key = p_key;
    RETURN v_status;
END
$$;

CREATE OR REPLACE FUNCTION feishu_inbox_claim(
    p_worker text, p_token text, p_lease float8, p_limit integer
) RETURNS SETOF {job} LANGUAGE plpgsql
SET enable_sort = off SET enable_seqscan = off AS $$
BEGIN
    -- claimable_heads, claim_partitions and claim_jobs in one statement. The two branches
    -- differ only in their LIMIT.
    IF p_limit = 1 THEN
        RETURN QUERY
        WITH picked AS (
            SELECT key, head_id FROM {partition}
            WHERE head_state IN {claimable} AND head_due_at <= now()
            ORDER BY head_priority DESC, head_id LIMIT 1
            FOR UPDATE SKIP LOCKED
        ), part AS (
            UPDATE {partition} SET head_state = '{running}' FROM picked
            WHERE {partition}.key = picked.key
        )
        UPDATE {job} SET status = '{running}', attempt = {job}.attempt + 1,
            worker_id = p_worker, lease_token = p_token,
            lease_until = now() + p_lease * interval '1 second', claimed_at = now(),
            error_type = '', error_message = '', cancel_requested = FALSE
        FROM picked
        WHERE {job}.id = picked.head_id AND {job}.status IN {claimable}
        RETURNING {job}.*;
    ELSIF p_limit > 1 THEN
        RETURN QUERY
        WITH picked AS (
            SELECT key, head_id FROM {partition}
            WHERE head_state IN {claimable} AND head_due_at <= now()
            ORDER BY head_priority DESC, head_id LIMIT p_limit
            FOR UPDATE SKIP LOCKED
        ), part AS (
            UPDATE {partition} SET head_state = '{running}' FROM picked
            WHERE {partition}.key = picked.key
        )
        UPDATE {job} SET status = '{running}', attempt = {job}.attempt + 1,
            worker_id = p_worker, lease_token = p_token,
            lease_until = now() + p_lease * interval '1 second', claimed_at = now(),
            error_type = '', error_message = '', cancel_requested = FALSE
        FROM picked
        WHERE {job}.id = picked.head_id AND {job}.status IN {claimable}
        RETURNING {job}.*;
    END IF;
END
$$;

-- feishu_inbox_claim plus one predicate (marked below): a change to one belongs in the other.
CREATE OR REPLACE FUNCTION feishu_inbox_claim_prefixed(
    p_worker text, p_token text, p_lease float8, p_limit integer, p_prefixes text[]
) RETURNS SETOF {job} LANGUAGE plpgsql
SET enable_sort = off SET enable_seqscan = off AS $$
BEGIN
    -- claimable_heads_in_queues, claim_partitions and claim_jobs in one statement. The two
    -- branches differ only in their LIMIT.
    IF p_limit = 1 THEN
        RETURN QUERY
        WITH picked AS (
            SELECT p.key, p.head_id FROM {partition} p
            WHERE p.head_state IN {claimable} AND p.head_due_at <= now()
              -- the one difference from feishu_inbox_claim: the key starts with a prefix
              AND EXISTS (SELECT 1 FROM unnest(p_prefixes) AS q(prefix)
                          WHERE left(p.key, length(q.prefix)) = q.prefix)
            ORDER BY p.head_priority DESC, p.head_id LIMIT 1
            FOR UPDATE OF p SKIP LOCKED
        ), part AS (
            UPDATE {partition} SET head_state = '{running}' FROM picked
            WHERE {partition}.key = picked.key
        )
        UPDATE {job} SET status = '{running}', attempt = {job}.attempt + 1,
            worker_id = p_worker, lease_token = p_token,
            lease_until = now() + p_lease * interval '1 second', claimed_at = now(),
            error_type = '', error_message = '', cancel_requested = FALSE
        FROM picked
        WHERE {job}.id = picked.head_id AND {job}.status IN {claimable}
        RETURNING {job}.*;
    ELSIF p_limit > 1 THEN
        RETURN QUERY
        WITH picked AS (
            SELECT p.key, p.head_id FROM {partition} p
            WHERE p.head_state IN {claimable} AND p.head_due_at <= now()
              -- the one difference from feishu_inbox_claim: the key starts with a prefix
              AND EXISTS (SELECT 1 FROM unnest(p_prefixes) AS q(prefix)
                          WHERE left(p.key, length(q.prefix)) = q.prefix)
            ORDER BY p.head_priority DESC, p.head_id LIMIT p_limit
            FOR UPDATE OF p SKIP LOCKED
        ), part AS (
            UPDATE {partition} SET head_state = '{running}' FROM picked
            WHERE {partition}.key = picked.key
        )
        UPDATE {job} SET status = '{running}', attempt = {job}.attempt + 1,
            worker_id = p_worker, lease_token = p_token,
            lease_until = now() + p_lease * interval '1 second', claimed_at = now(),
            error_type = '', error_message = '', cancel_requested = FALSE
        FROM picked
        WHERE {job}.id = picked.head_id AND {job}.status IN {claimable}
        RETURNING {job}.*;
    END IF;
END
$$;

-- feishu_inbox_finish_together: the finishes of a worker's slots that ended together, and
-- each one's next claim, in one statement and one commit (the worker sends them together when
-- they end while another finish of its is being written). Each finish is fenced on its own,
-- by feishu_inbox_end_attempt: one whose lease was lost ends NULL, claims nothing and changes
-- nothing, and the others go on. Partition rows are locked in key order (as everywhere: the
-- lock order is partition, then job); the claims come after every finish, each with its own
-- token (p_new_tokens; '' claims nothing), so a worker whose reply was lost finds each
-- slot's job by its token (claimed_with). One row per finish, in the order given. p_prefixes:
-- the queue prefixes of a `runworker --queue` worker, whose claims take only those queues'
-- partitions (feishu_inbox_claim_prefixed); NULL for a worker of every queue.
DROP FUNCTION IF EXISTS feishu_inbox_finish_together(
    text, bigint[], text[], text[], text[], text[], float8);

CREATE OR REPLACE FUNCTION feishu_inbox_finish_together(
    p_worker text, p_ids bigint[], p_tokens text[], p_keys text[], p_error_types text[],
    p_new_tokens text[], p_lease float8, p_prefixes text[]
) RETURNS TABLE (finished_id bigint, ended_status text, claimed {job})
LANGUAGE plpgsql AS $$
DECLARE
    i integer;
    v_status text[] := array_fill(NULL::text, ARRAY[cardinality(p_ids)]);
BEGIN
    FOR i IN SELECT k.n FROM unnest(p_keys) WITH ORDINALITY AS k(key, n) ORDER BY k.key LOOP
        v_status[i] := feishu_inbox_end_attempt(p_ids[i], p_worker, p_tokens[i], p_keys[i],
            FALSE, p_error_types[i], '', 0, 0);
    END LOOP;
    FOR i IN 1 .. cardinality(p_ids) LOOP
        finished_id := p_ids[i];
        ended_status := v_status[i];
        claimed := NULL;
        IF v_status[i] IS NOT NULL AND p_new_tokens[i] <> '' THEN
            IF p_prefixes IS NULL THEN
                SELECT * INTO claimed
                FROM feishu_inbox_claim(p_worker, p_new_tokens[i], p_lease, 1);
            ELSE
                SELECT * INTO claimed
                FROM feishu_inbox_claim_prefixed(p_worker, p_new_tokens[i], p_lease, 1,
                                                 p_prefixes);
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;

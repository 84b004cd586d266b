-- Migration 0024 (otherwise as in 0022, 0015, 0013, 0012, 0011, 0010, 0007, 0006 and 0002):
-- ``runworker --exclude-queues``, a worker of every job but some queues' tasks (django-tasks'
-- db_worker has the flag; its users reach for it to keep a slow queue off the chats' workers).
-- * feishu_inbox_claim_prefixed takes p_excluding: FALSE, only the partitions whose key starts
--   with one of p_prefixes (``--queue``, as before); TRUE, only those whose key starts with none
--   of them. The predicate is the same one test on the partition row the claim reads anyway,
--   negated; the plan (the claimable index, in order, no sort) is unchanged
--   (tests/test_plans.py).
-- * feishu_inbox_finish_together takes p_excluding and passes it on.
-- feishu_inbox_claim, the unfiltered claim, is unchanged. Both signatures change, so the old
-- ones are dropped first (CREATE OR REPLACE would add an overload); p_excluding defaults to
-- FALSE, so a worker of the version before, still running while the migration ran (a rolling
-- deploy), keeps claiming as it did.

DROP FUNCTION IF EXISTS feishu_inbox_finish_together(
    text, bigint[], text[], text[], text[], text[], float8, text[]);
DROP FUNCTION IF EXISTS feishu_inbox_claim_prefixed(text, text, float8, integer, text[]);

-- feishu_inbox_claim plus one predicate (marked below): a change to one belongs in the other.
CREATE OR REPLACE FUNCTION feishu_inbox_claim_prefixed(
    p_worker text, p_token text, p_lease float8, p_limit integer, p_prefixes text[],
    p_excluding boolean DEFAULT FALSE
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
              -- (p_excluding: with none of them)
              AND EXISTS (SELECT 1 FROM unnest(p_prefixes) AS q(prefix)
                          WHERE left(p.key, length(q.prefix)) = q.prefix) <> p_excluding
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
              -- (p_excluding: with none of them)
              AND EXISTS (SELECT 1 FROM unnest(p_prefixes) AS q(prefix)
                          WHERE left(p.key, length(q.prefix)) = q.prefix) <> p_excluding
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

CREATE OR REPLACE FUNCTION feishu_inbox_finish_together(
    p_worker text, p_ids bigint[], p_tokens text[], p_keys text[], p_error_types text[],
    p_new_tokens text[], p_lease float8, p_prefixes text[],
    p_excluding boolean DEFAULT FALSE
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
                                                 p_prefixes, p_excluding);
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;

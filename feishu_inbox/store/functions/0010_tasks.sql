-- Migration 0010: a claim for a worker that runs some queues of django.tasks tasks only
-- (``runworker --queue``; feishu_inbox/tasks.py). A task's partition key starts with its queue
-- (``task:<queue>:``), so the filter is on the partition row the claim reads anyway.
-- feishu_inbox_claim (migration 0007) is unchanged: an unfiltered worker pays nothing for it.
-- This function is feishu_inbox_claim plus one predicate (marked below); a change to one
-- belongs in the other.

CREATE OR REPLACE FUNCTION feishu_inbox_claim_prefixed(
    p_worker text, p_token text, p_lease float8, p_limit integer, p_prefixes text[]
) RETURNS SETOF {job} LANGUAGE plpgsql AS $$
BEGIN
    -- claimable_heads_in_queues, claim_partitions and claim_jobs in one statement.
    RETURN QUERY
    WITH picked AS (
        SELECT p.key, p.head_id FROM {partition} p
        WHERE p.head_state IN {claimable} AND p.head_due_at <= now()
          -- the one difference from feishu_inbox_claim: the key starts with a prefix
          AND EXISTS (SELECT 1 FROM unnest(p_prefixes) AS q(prefix)
                      WHERE left(p.key, length(q.prefix)) = q.prefix)
        ORDER BY p.head_id LIMIT p_limit
        FOR UPDATE OF p SKIP LOCKED
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

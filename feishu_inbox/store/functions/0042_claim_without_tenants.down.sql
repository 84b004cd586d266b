-- Migration 0042's reverse: feishu_inbox_claim and feishu_inbox_claim_prefixed as 0039 left
-- them (0040 changed neither).

CREATE OR REPLACE FUNCTION feishu_inbox_claim(
    p_worker text, p_token text, p_lease float8, p_limit integer
) RETURNS SETOF {job} LANGUAGE plpgsql
SET enable_sort = off SET enable_seqscan = off AS $$
DECLARE
    v_tenant text;
BEGIN
    IF p_limit < 1 THEN
        RETURN;
    END IF;
    -- claimable_tenant: the first tenant with claimable heads, the claimable index's first
    -- entry (none: nothing to claim); another_tenant: one more. With several, the fair
    -- claim shares the slots between them; with one (a site without tenants), its heads are
    -- taken in index order, as before.
    SELECT head_tenant INTO v_tenant FROM {partition}
    WHERE head_state IN {claimable} ORDER BY head_tenant LIMIT 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM {partition}
               WHERE head_state IN {claimable} AND head_tenant > v_tenant) THEN
        RETURN QUERY SELECT * FROM feishu_inbox_claim_fair(p_worker, p_token, p_lease, p_limit,
                                                           NULL, FALSE);
        RETURN;
    END IF;
    -- claimable_heads (of the one tenant), claim_partitions and claim_jobs in one statement.
    -- The two branches differ only in their LIMIT.
    IF p_limit = 1 THEN
        RETURN QUERY
        WITH picked AS (
            SELECT key, head_id FROM {partition}
            WHERE head_state IN {claimable} AND head_tenant = v_tenant
              AND head_due_at <= now()
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
        WHERE {job}.id = (SELECT head_id FROM picked) AND {job}.status IN {claimable}
        RETURNING {job}.*;
    ELSE
        RETURN QUERY
        WITH picked AS (
            SELECT key, head_id FROM {partition}
            WHERE head_state IN {claimable} AND head_tenant = v_tenant
              AND head_due_at <= now()
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
        WHERE {job}.id = ANY (ARRAY(SELECT head_id FROM picked))
          AND {job}.status IN {claimable}
        RETURNING {job}.*;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION feishu_inbox_claim_prefixed(
    p_worker text, p_token text, p_lease float8, p_limit integer, p_prefixes text[],
    p_excluding boolean DEFAULT FALSE
) RETURNS SETOF {job} LANGUAGE plpgsql
SET enable_sort = off SET enable_seqscan = off AS $$
DECLARE
    v_tenant text;
BEGIN
    IF p_limit < 1 THEN
        RETURN;
    END IF;
    -- claimable_tenant: the first tenant with claimable heads, the claimable index's first
    -- entry (none: nothing to claim); another_tenant: one more. With several, the fair
    -- claim shares the slots between them; with one (a site without tenants), its heads are
    -- taken in index order, as before.
    SELECT head_tenant INTO v_tenant FROM {partition}
    WHERE head_state IN {claimable} ORDER BY head_tenant LIMIT 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM {partition}
               WHERE head_state IN {claimable} AND head_tenant > v_tenant) THEN
        RETURN QUERY SELECT * FROM feishu_inbox_claim_fair(p_worker, p_token, p_lease, p_limit,
                                                           p_prefixes, p_excluding);
        RETURN;
    END IF;
    -- claimable_heads_in_queues (of the one tenant), claim_partitions and claim_jobs in one
    -- statement. The two branches differ only in their LIMIT.
    IF p_limit = 1 THEN
        RETURN QUERY
        WITH picked AS (
            SELECT p.key, p.head_id FROM {partition} p
            WHERE p.head_state IN {claimable} AND p.head_tenant = v_tenant
              AND p.head_due_at <= now()
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
        WHERE {job}.id = (SELECT head_id FROM picked) AND {job}.status IN {claimable}
        RETURNING {job}.*;
    ELSE
        RETURN QUERY
        WITH picked AS (
            SELECT p.key, p.head_id FROM {partition} p
            WHERE p.head_state IN {claimable} AND p.head_tenant = v_tenant
              AND p.head_due_at <= now()
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
        WHERE {job}.id = ANY (ARRAY(SELECT head_id FROM picked))
          AND {job}.status IN {claimable}
        RETURNING {job}.*;
    END IF;
END
$$;

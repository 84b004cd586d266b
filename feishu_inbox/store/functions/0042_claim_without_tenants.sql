-- Migration 0042: a claim on a site without tenants reads the claimable index once. Each
-- claim first asked which tenant's heads come first (the claimable index's first live
-- entry): while another session holds a snapshot (an analytics query, a forgotten
-- transaction), every head claimed since stays in the index, dead but kept, before the live
-- ones, and that probe walked them all, heap visit by heap visit, as the claim's own
-- statement then walked them again. Now an index probe that starts past the heads of no
-- tenant says whether any head has one; where none has, the heads of none are claimed at
-- once, as before. Sites with tenants probe as before. Measured by bench/claim_blocks.py
-- (blocks of the partition table and its claimable index one claim of 10 reads; 1,000
-- chats, each one's next job enqueued as its last one finished, a REPEATABLE READ snapshot
-- held): 427 against 543 after 5,000 jobs since the snapshot began, 1,532 against 2,084
-- after 20,000, 2,915 against 4,044 after 40,000. A quarter less; what is left grows as
-- before: the claim's own walk, ordered by head_id, still meets every dead entry first.

CREATE OR REPLACE FUNCTION feishu_inbox_claim(
    p_worker text, p_token text, p_lease float8, p_limit integer
) RETURNS SETOF {job} LANGUAGE plpgsql
SET enable_sort = off SET enable_seqscan = off AS $$
DECLARE
    v_tenant text;
    v_several boolean := FALSE;
BEGIN
    IF p_limit < 1 THEN
        RETURN;
    END IF;
    -- (0042:) any_tenant: whether a claimable head has a tenant, an index probe that starts
    -- past the heads of none, whatever the index holds before them. None has (a site without
    -- tenants): the heads of none are taken in index order. Else claimable_tenant: the first
    -- tenant with claimable heads, the claimable index's first entry (none: nothing to
    -- claim); another_tenant: one more. With several, the fair claim shares the slots between
    -- them; with one, its heads are taken in index order, as before.
    IF EXISTS (SELECT 1 FROM {partition}
               WHERE head_state IN {claimable} AND head_tenant > '') THEN
        SELECT head_tenant INTO v_tenant FROM {partition}
        WHERE head_state IN {claimable} ORDER BY head_tenant LIMIT 1;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        v_several := v_tenant = '' OR EXISTS (
            SELECT 1 FROM {partition}
            WHERE head_state IN {claimable} AND head_tenant > v_tenant);
    ELSE
        v_tenant := '';
    END IF;
    IF v_several THEN
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
    v_several boolean := FALSE;
BEGIN
    IF p_limit < 1 THEN
        RETURN;
    END IF;
    -- (0042:) any_tenant: whether a claimable head has a tenant, an index probe that starts
    -- past the heads of none, whatever the index holds before them. None has (a site without
    -- tenants): the heads of none are taken in index order. Else claimable_tenant: the first
    -- tenant with claimable heads, the claimable index's first entry (none: nothing to
    -- claim); another_tenant: one more. With several, the fair claim shares the slots between
    -- them; with one, its heads are taken in index order, as before.
    IF EXISTS (SELECT 1 FROM {partition}
               WHERE head_state IN {claimable} AND head_tenant > '') THEN
        SELECT head_tenant INTO v_tenant FROM {partition}
        WHERE head_state IN {claimable} ORDER BY head_tenant LIMIT 1;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        v_several := v_tenant = '' OR EXISTS (
            SELECT 1 FROM {partition}
            WHERE head_state IN {claimable} AND head_tenant > v_tenant);
    ELSE
        v_tenant := '';
    END IF;
    IF v_several THEN
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

-- Migration 0040: the fair claim reads a bounded ring of tenants (SPEC §9j). 0039's
-- feishu_inbox_claim_fair probed every tenant with claimable heads on every claim (a loose
-- scan of the claimable index) and read each one's first due heads: with 1,000 tenants a
-- claim took 6.3 ms against 0.5 ms with one (bench/fair.py: 0.33-0.38 of one tenant's
-- throughput). Now, where every weight is 1 and every claimable head has priority 0 (the
-- uniform case: a new partial index, feishu_inbox_part_ranked, holds the heads of another
-- priority), a claim reads:
-- * the ring: the tenants in key order from the one after a cursor, round to the cursor,
--   until it has found p_limit tenants that run nothing and have a due head. Their first
--   heads have the share 1, the least there is, so they are the claim's (ties of share go
--   round the ring). The cursor is the tenant of the last claimed of the last attempts
--   ended; the tenants claimed since run, and the ring passes over them, so successive
--   claims of every worker go round the tenants (round-robin: a tenant with a due head is
--   reached within (tenants / slots claimed) claims, whatever the others' backlogs), with
--   no shared row to write;
-- * the running tenants whose first due head ranks first (p_limit of them).
-- Otherwise (a weight or a priority set) the ring goes round every tenant, as 0039's claim.
-- Either way each contender's heads are read up to a bound on the claim's last share, with
-- one more (a sentinel): all p_limit of them only when a sentinel ranks in the claim. The
-- claim is the one that ranking every due head gives: priority, share, then the ring's order
-- (the older head broke ties in 0039, which let one tenant's chat take every turn while its
-- heads were the oldest), running tenants after fresh ones, then the older head. A claim that
-- took nothing because every quota fell on heads another claimer held walks the due heads
-- past them (0039 came back empty then). The statements use generic plans
-- (plan_cache_mode): every step is an index probe with the parameters bound at run time, and
-- planning the big statement anew each call cost more than running it. Measured (one claim
-- of 8, 20,000 jobs over 1,000 chats, a quiet machine): 1 tenant 0.54 ms, 2 tenants 0.74 ms
-- (0039: 1.07), 1,000 tenants 0.59 ms (0039: 6.25).

CREATE OR REPLACE FUNCTION feishu_inbox_claim_fair(
    p_worker text, p_token text, p_lease float8, p_limit integer, p_prefixes text[],
    p_excluding boolean
) RETURNS SETOF {job} LANGUAGE plpgsql SET enable_sort = on SET enable_seqscan = off
SET jit = off SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_after text;
    v_first text;
    v_wanted integer := greatest(p_limit, 1);
    v_uniform boolean;
    v_count bigint;
BEGIN
    -- the ring's cursor: of the last 16 attempts ended (the history's newest rows, by its
    -- key), the tenant of the one claimed last (a batch's attempts are written in job order,
    -- and a slow job ends after the ones claimed after it); none: the ring starts at its
    -- first tenant. The tenants claimed since then run, and the ring passes over running
    -- tenants: it starts where the claims stopped. And the ring's first tenant.
    SELECT x.tenant INTO v_after FROM (
        SELECT j.tenant, a.started_at FROM {attempt} a JOIN {job} j ON j.id = a.job_id
        ORDER BY a.id DESC LIMIT 16
    ) x ORDER BY x.started_at DESC, x.tenant DESC LIMIT 1;
    SELECT p.head_tenant INTO v_first FROM {partition} p WHERE p.head_state IN {claimable}
    ORDER BY p.head_tenant LIMIT 1;
    -- uniform: every weight 1 and every claimable head of priority 0 (through the partial
    -- index feishu_inbox_part_ranked: empty on a site whose jobs all have priority 0). Then
    -- a fresh tenant's first head has the share 1, the least there is, whichever tenant's it
    -- is, and the ring's first p_limit fresh tenants are the claim's: the ring stops there.
    -- Otherwise a fresh tenant past them could come first (a task above 0, a weight above
    -- 1, or theirs below), and the ring goes round every tenant, as 0039's claim read them.
    v_uniform := NOT EXISTS (SELECT 1 FROM {tenant_weight} w WHERE w.weight <> 1)
        AND NOT EXISTS (SELECT 1 FROM {partition} p
                        WHERE p.head_state IN {claimable} AND p.head_priority <> 0);
    -- claimable_heads_fair, claim_partitions and claim_jobs in one statement:
    -- * ring: the tenants with claimable heads in key order, from the one after the cursor
    --   round to the cursor, one probe of the claimable index each (a loose index scan),
    --   until p_limit tenants with no running chat and a due head (eligible) are found (when
    --   uniform) or the ring is closed;
    -- * running: each tenant's running jobs, as its chats' running heads (a chat runs one
    --   job at a time), through the partial index feishu_inbox_part_running: as many
    --   entries as the workers' slots and buffers hold, whatever the idle chats;
    -- * contenders: the ring's eligible tenants, and the p_limit running tenants whose first
    --   due head ranks first (priority, share, the older head: a running tenant whose first
    --   head ranks after p_limit others' has no head in the claim);
    -- * candidates (read, not locked): each contender's first due heads in its own order
    --   (priority, then receipt), the k-th of tenant t with the share (running_t + k) /
    --   weight_t, ranked first by priority (across tenants too: a task above 0 runs before
    --   waiting chats, one below 0 after them, docs/tasks.md), then by share, then the ring's
    --   order (running tenants after the ring's), then the older head. capped: up to cap_t + 1
    --   heads of each, cap_t its count with a share of at most (p_limit + sum running + count
    --   of contenders) / sum weights, a bound on the p_limit-th share while the contenders
    --   have heads enough; the one past cap_t is a sentinel. Each tenant's heads rank in its
    --   own order, so when no sentinel ranks among the first p_limit, none past it would:
    --   those first p_limit are the claim's. Otherwise (a tenant of higher priority, or short
    --   of due heads) whole: p_limit heads of each, as read before the cap;
    -- * quotas: of those first p_limit, how many are each tenant's;
    -- * picked: each tenant's quota of its due heads in its own order, locked with SKIP
    --   LOCKED down its own range of the claimable index, as the plain claim walks it: the
    --   heads another claimer holds are passed over for the tenant's next ones, never
    --   dropped from the claim.
    -- A tenant's heads keep their order among themselves, and a chat has one head: no chat
    -- is ever reordered.
    RETURN QUERY
    WITH RECURSIVE ring (tenant, wrapped, pos, eligible, found) AS (
        SELECT s.tenant, s.wrapped, 1, e.eligible, e.eligible::integer
        FROM (
            SELECT COALESCE(n.tenant, CASE WHEN v_after IS NULL OR v_first <= v_after
                                           THEN v_first END) AS tenant,
                   n.tenant IS NULL AS wrapped
            FROM (SELECT 1) one
            LEFT JOIN LATERAL (SELECT p.head_tenant AS tenant FROM {partition} p
                               WHERE p.head_state IN {claimable} AND p.head_tenant > v_after
                               ORDER BY p.head_tenant LIMIT 1) n ON TRUE
            OFFSET 0
        ) s
        CROSS JOIN LATERAL (SELECT
            NOT EXISTS (SELECT 1 FROM {partition} p
                        WHERE p.head_state = '{running}' AND p.head_tenant = s.tenant)
            AND EXISTS (SELECT 1 FROM {partition} p
                        WHERE p.head_state IN {claimable} AND p.head_tenant = s.tenant
                          AND p.head_due_at <= now()
                          AND (p_prefixes IS NULL
                               OR EXISTS (SELECT 1 FROM unnest(p_prefixes) AS q(prefix)
                                          WHERE left(p.key, length(q.prefix)) = q.prefix)
                                  <> p_excluding)) AS eligible OFFSET 0) e
        WHERE s.tenant IS NOT NULL
        UNION ALL
        SELECT s.tenant, s.wrapped, r.pos + 1, e.eligible, r.found + e.eligible::integer
        FROM ring r
        CROSS JOIN LATERAL (
            SELECT COALESCE(n.tenant, CASE WHEN NOT r.wrapped AND v_first <= v_after
                                           THEN v_first END) AS tenant,
                   r.wrapped OR n.tenant IS NULL AS wrapped
            FROM (SELECT 1) one
            LEFT JOIN LATERAL (SELECT p.head_tenant AS tenant FROM {partition} p
                               WHERE p.head_state IN {claimable} AND p.head_tenant > r.tenant
                                 AND (NOT r.wrapped OR v_after IS NULL
                                      OR p.head_tenant <= v_after)
                               ORDER BY p.head_tenant LIMIT 1) n ON TRUE
            OFFSET 0
        ) s
        CROSS JOIN LATERAL (SELECT
            NOT EXISTS (SELECT 1 FROM {partition} p
                        WHERE p.head_state = '{running}' AND p.head_tenant = s.tenant)
            AND EXISTS (SELECT 1 FROM {partition} p
                        WHERE p.head_state IN {claimable} AND p.head_tenant = s.tenant
                          AND p.head_due_at <= now()
                          AND (p_prefixes IS NULL
                               OR EXISTS (SELECT 1 FROM unnest(p_prefixes) AS q(prefix)
                                          WHERE left(p.key, length(q.prefix)) = q.prefix)
                                  <> p_excluding)) AS eligible OFFSET 0) e
        WHERE (r.found < v_wanted OR NOT v_uniform) AND s.tenant IS NOT NULL
    ), running AS (
        SELECT p.head_tenant AS tenant, count(*) AS n FROM {partition} p
        WHERE p.head_state = '{running}' GROUP BY p.head_tenant
    ), contenders AS (
        SELECT r.tenant, r.pos FROM ring r WHERE r.eligible
        UNION ALL
        (SELECT rn.tenant, NULL::integer FROM running rn
         LEFT JOIN {tenant_weight} w ON w.tenant = rn.tenant
         CROSS JOIN LATERAL (
             SELECT p.head_priority, p.head_id FROM {partition} p
             WHERE p.head_state IN {claimable} AND p.head_tenant = rn.tenant
               AND p.head_due_at <= now()
               AND (p_prefixes IS NULL
                    OR EXISTS (SELECT 1 FROM unnest(p_prefixes) AS q(prefix)
                               WHERE left(p.key, length(q.prefix)) = q.prefix)
                       <> p_excluding)
             ORDER BY p.head_priority DESC, p.head_id LIMIT 1
         ) f
         ORDER BY f.head_priority DESC, (rn.n + 1) / COALESCE(w.weight, 1.0), f.head_id
         LIMIT p_limit)
    ), sized AS (
        SELECT t.tenant, t.pos, COALESCE(r.n, 0) AS n, COALESCE(w.weight, 1.0) AS weight
        FROM contenders t
        LEFT JOIN running r ON r.tenant = t.tenant
        LEFT JOIN {tenant_weight} w ON w.tenant = t.tenant
    ), capped AS (
        SELECT t.tenant, t.pos, h.head_priority, h.head_id, (t.n + h.rank) / t.weight AS share,
               h.rank > t.cap AS sentinel
        FROM (
            SELECT s.*, least(p_limit, greatest(1, ceil(
                       b.share * s.weight - s.n)))::integer AS cap
            FROM sized s
            CROSS JOIN (SELECT (p_limit + sum(x.n) + count(*)) / sum(x.weight) AS share
                        FROM sized x) b
        ) t
        CROSS JOIN LATERAL (
            SELECT c.head_priority, c.head_id,
                   row_number() OVER (ORDER BY c.head_priority DESC, c.head_id) AS rank
            FROM (
                SELECT p.head_priority, p.head_id FROM {partition} p
                WHERE p.head_state IN {claimable} AND p.head_tenant = t.tenant
                  AND p.head_due_at <= now()
                  AND (p_prefixes IS NULL
                       OR EXISTS (SELECT 1 FROM unnest(p_prefixes) AS q(prefix)
                                  WHERE left(p.key, length(q.prefix)) = q.prefix)
                          <> p_excluding)
                ORDER BY p.head_priority DESC, p.head_id LIMIT t.cap + 1
            ) c
        ) h
    ), capped_first AS (
        SELECT c.tenant, c.sentinel FROM capped c
        ORDER BY c.head_priority DESC, c.share, c.pos NULLS LAST, c.head_id LIMIT p_limit
    ), whole AS (
        SELECT t.tenant, t.pos, h.head_priority, h.head_id, (t.n + h.rank) / t.weight AS share
        FROM sized t
        CROSS JOIN LATERAL (
            SELECT c.head_priority, c.head_id,
                   row_number() OVER (ORDER BY c.head_priority DESC, c.head_id) AS rank
            FROM (
                SELECT p.head_priority, p.head_id FROM {partition} p
                WHERE p.head_state IN {claimable} AND p.head_tenant = t.tenant
                  AND p.head_due_at <= now()
                  AND (p_prefixes IS NULL
                       OR EXISTS (SELECT 1 FROM unnest(p_prefixes) AS q(prefix)
                                  WHERE left(p.key, length(q.prefix)) = q.prefix)
                          <> p_excluding)
                ORDER BY p.head_priority DESC, p.head_id LIMIT p_limit
            ) c
        ) h
        WHERE EXISTS (SELECT 1 FROM capped_first f WHERE f.sentinel)
    ), quotas AS (
        SELECT first.tenant, count(*) AS n
        FROM (SELECT f.tenant FROM capped_first f
              WHERE NOT EXISTS (SELECT 1 FROM capped_first x WHERE x.sentinel)
              UNION ALL
              (SELECT c.tenant FROM whole c
               ORDER BY c.head_priority DESC, c.share, c.pos NULLS LAST, c.head_id
               LIMIT p_limit)) first
        GROUP BY first.tenant
    ), picked AS (
        SELECT x.key, x.head_id
        FROM quotas q
        CROSS JOIN LATERAL (
            SELECT p.key, p.head_id FROM {partition} p
            WHERE p.head_state IN {claimable} AND p.head_tenant = q.tenant
              AND p.head_due_at <= now()
              AND (p_prefixes IS NULL
                   OR EXISTS (SELECT 1 FROM unnest(p_prefixes) AS q2(prefix)
                              WHERE left(p.key, length(q2.prefix)) = q2.prefix)
                      <> p_excluding)
            ORDER BY p.head_priority DESC, p.head_id LIMIT q.n
            FOR UPDATE OF p SKIP LOCKED
        ) x
    ), part AS (
        -- by key (an array, as the jobs below): a join here was planned (generic) as a hash
        -- of every partition's key
        UPDATE {partition} SET head_state = '{running}'
        WHERE {partition}.key = ANY (ARRAY(SELECT key FROM picked))
    )
    UPDATE {job} SET status = '{running}', attempt = {job}.attempt + 1,
        worker_id = p_worker, lease_token = p_token,
        lease_until = now() + p_lease * interval '1 second', claimed_at = now(),
        error_type = '', error_message = '', cancel_requested = FALSE
    WHERE {job}.id = ANY (ARRAY(SELECT head_id FROM picked))
      AND ({job}.status IN {claimable}) IS TRUE
    RETURNING {job}.*;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    IF v_count > 0 THEN
        RETURN;
    END IF;
    -- Nothing claimed: every quota fell on heads another claimer holds (the quotas are
    -- counted before the locks). Never empty while a due head is free: the due heads in
    -- the claimable index's order, past the locked ones.
    RETURN QUERY
    WITH picked AS (
        SELECT p.key, p.head_id FROM {partition} p
        WHERE p.head_state IN {claimable} AND p.head_due_at <= now()
          AND (p_prefixes IS NULL
               OR EXISTS (SELECT 1 FROM unnest(p_prefixes) AS q(prefix)
                          WHERE left(p.key, length(q.prefix)) = q.prefix) <> p_excluding)
        ORDER BY p.head_tenant, p.head_priority DESC, p.head_id LIMIT p_limit
        FOR UPDATE OF p SKIP LOCKED
    ), part AS (
        UPDATE {partition} SET head_state = '{running}'
        WHERE {partition}.key = ANY (ARRAY(SELECT key FROM picked))
    )
    UPDATE {job} SET status = '{running}', attempt = {job}.attempt + 1,
        worker_id = p_worker, lease_token = p_token,
        lease_until = now() + p_lease * interval '1 second', claimed_at = now(),
        error_type = '', error_message = '', cancel_requested = FALSE
    WHERE {job}.id = ANY (ARRAY(SELECT head_id FROM picked))
      AND ({job}.status IN {claimable}) IS TRUE
    RETURNING {job}.*;
END
$$;

-- Migration 0039: fair claims (SPEC §9j). The partition's row carries its head's tenant
-- (head_tenant, '' when idle or of none), set wherever its head is: feishu_inbox_enqueue's
-- set_first_head, the resync_head of feishu_inbox_end_attempt and feishu_inbox_end_attempts
-- (and common.sql's). The claimable index leads with it (head_tenant, head_priority DESC,
-- head_id), so that each claim learns in one or two probes whether one tenant or several
-- have claimable heads:
-- * one (every site without tenants, and a SaaS with one busy): its heads in index order,
--   the plain claim as before, plus `head_tenant = v_tenant`;
-- * several: feishu_inbox_claim_fair (new) gives the slots to the tenant with the fewest
--   running jobs per weight (TenantWeight, 1 without a row), head by head, each tenant's heads
--   in their own order. A light tenant's due head is claimed by the next claim of any worker
--   while the heavy tenant holds more than its share of running jobs: it never waits for
--   the heavy tenant's backlog (tests/ledger/test_fair_claims.py, bench/fair.py).
-- feishu_inbox_finish_together and feishu_inbox_finish_batch claim through feishu_inbox_claim
-- and feishu_inbox_claim_prefixed: unchanged.

CREATE OR REPLACE FUNCTION feishu_inbox_enqueue(
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
        UPDATE {partition} SET head_id = v_id, head_state = '{queued}', head_due_at = now(),
            head_tenant = p_tenant
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

CREATE OR REPLACE FUNCTION feishu_inbox_end_attempt(
    p_id bigint, p_worker text, p_token text, p_key text, p_fail boolean,
    p_error_type text, p_error_message text, p_max_attempts integer, p_retry_in float8
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_status text;
BEGIN
    -- lock_partitions
    PERFORM 1 FROM {partition} WHERE key = p_key FOR UPDATE;
    IF p_fail THEN
        -- fail_job and record_attempts: one statement
        WITH ended AS (UPDATE {job} SET
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
        RETURNING id, attempt, worker_id, claimed_at, status, error_type, error_message)
        INSERT INTO {attempt} (job_id, number, worker_id, started_at, ended_at, outcome,
                               error_type, error_message, lease_token)
        SELECT id, attempt, worker_id, COALESCE(claimed_at, now()), now(), status, error_type,
               error_message, p_token
        FROM ended
        RETURNING outcome INTO v_status;
    ELSE
        -- finish_job and record_attempts: one statement
        WITH ended AS (UPDATE {job} SET
            status = CASE WHEN {effect_open} THEN '{unknown}' ELSE '{completed}' END,
            error_type = CASE WHEN {effect_open} THEN 'UncertainEffect' ELSE p_error_type END,
            error_message = CASE WHEN {effect_open} THEN {uncertain_message} ELSE '' END,
            finished_at = now(), lease_token = '', lease_until = NULL
        WHERE id = p_id AND status = '{running}' AND worker_id = p_worker
          AND lease_token = p_token AND lease_until > now()
        RETURNING id, attempt, worker_id, claimed_at, status, error_type, error_message)
        INSERT INTO {attempt} (job_id, number, worker_id, started_at, ended_at, outcome,
                               error_type, error_message, lease_token)
        SELECT id, attempt, worker_id, COALESCE(claimed_at, now()), now(), status, error_type,
               error_message, p_token
        FROM ended
        RETURNING outcome INTO v_status;
    END IF;
    IF v_status IS NULL THEN
        RETURN NULL;  -- lease lost: nothing changed
    END IF;
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
    UPDATE {partition} SET (head_id, head_state, head_due_at, head_priority, head_tenant) = (
        SELECT h.id, COALESCE(h.status, '{idle}'), h.available_at, COALESCE(h.priority, 0),
               COALESCE(h.tenant, '')
        FROM (SELECT) AS one LEFT JOIN LATERAL (
            SELECT j.id, j.status, j.available_at, j.priority, j.tenant
            FROM {job} j
            WHERE j.partition_key >= p_key AND j.partition_key <= p_key
              AND NOT (j.status = '{completed}')
            ORDER BY j.partition_key, j.id LIMIT 1
        ) AS h ON TRUE)
    WHERE key = p_key;
    RETURN v_status;
END
$$;

CREATE OR REPLACE FUNCTION feishu_inbox_end_attempts(
    p_worker text, p_ids bigint[], p_tokens text[], p_keys text[], p_error_types text[]
) RETURNS text[] LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
DECLARE
    i integer;
    v_ids bigint[];
    v_status text[];
    v_keys text[];
BEGIN
    IF cardinality(p_ids) = 0 THEN
        RETURN '{}'::text[];
    END IF;
    IF cardinality(p_ids) <> (SELECT count(DISTINCT u.id) FROM unnest(p_ids) AS u(id)) THEN
        -- One job twice: its lease expired and this worker claimed it again within one
        -- batch. The arrays find a job's token by its id, so each finish is fenced at its
        -- own place instead, one by one, as before 0028: the stale one ends NULL.
        v_status := array_fill(NULL::text, ARRAY[cardinality(p_ids)]);
        FOR i IN SELECT k.n FROM unnest(p_keys) WITH ORDINALITY AS k(key, n) ORDER BY k.key LOOP
            v_status[i] := feishu_inbox_end_attempt(p_ids[i], p_worker, p_tokens[i],
                p_keys[i], FALSE, p_error_types[i], '', 0, 0);
        END LOOP;
        RETURN v_status;
    END IF;
    -- lock_partitions: every partition row, in key order (the ledger's one lock order),
    -- before any job row.
    PERFORM 1 FROM {partition} WHERE key = ANY (p_keys) ORDER BY key FOR UPDATE;
    -- finish_job and record_attempts for every finish, one statement: each job fenced by
    -- the token (and ended with the error type) at its own place in the arrays. A finish
    -- whose fence matches nothing changes nothing and records nothing; the others go on.
    -- The jobs are found by their ids only: the fence is one IS TRUE test (the same rows
    -- as the plain conditions), which no index can serve, so no plan walks the status
    -- index's entries of every running job, dead ones included, instead of the primary key.
    WITH ended AS (UPDATE {job} j SET
        status = CASE WHEN {effect_open} THEN '{unknown}' ELSE '{completed}' END,
        error_type = CASE WHEN {effect_open} THEN 'UncertainEffect'
            ELSE p_error_types[array_position(p_ids, j.id)] END,
        error_message = CASE WHEN {effect_open} THEN {uncertain_message} ELSE '' END,
        finished_at = now(), lease_token = '', lease_until = NULL
    WHERE j.id = ANY (p_ids)
      AND (j.status = '{running}' AND j.worker_id = p_worker
           AND j.lease_token = p_tokens[array_position(p_ids, j.id)]
           AND j.lease_until > now()) IS TRUE
    RETURNING j.id, j.attempt, j.worker_id, j.claimed_at, j.status, j.error_type,
              j.error_message, j.partition_key,
              p_tokens[array_position(p_ids, j.id)] AS lease_token
    ), recorded AS (
        INSERT INTO {attempt} (job_id, number, worker_id, started_at, ended_at, outcome,
                               error_type, error_message, lease_token)
        SELECT id, attempt, worker_id, COALESCE(claimed_at, now()), now(), status,
               error_type, error_message, lease_token
        FROM ended
    )
    SELECT array_agg(id), array_agg(status), array_agg(partition_key)
    INTO v_ids, v_status, v_keys
    FROM ended;
    -- resync_head of every finished partition, as feishu_inbox_end_attempt reads it (the
    -- first non-completed job of the partition, through the partial index
    -- feishu_inbox_job_unresolved: the key as a range of one value), in a statement of its
    -- own: its snapshot sees the finishes above.
    IF v_ids IS NOT NULL THEN
        UPDATE {partition} p SET (head_id, head_state, head_due_at, head_priority, head_tenant) = (
            SELECT h.id, COALESCE(h.status, '{idle}'), h.available_at, COALESCE(h.priority, 0),
                   COALESCE(h.tenant, '')
            FROM (SELECT) AS one LEFT JOIN LATERAL (
                SELECT j.id, j.status, j.available_at, j.priority, j.tenant
                FROM {job} j
                WHERE j.partition_key >= p.key AND j.partition_key <= p.key
                  AND NOT (j.status = '{completed}')
                ORDER BY j.partition_key, j.id LIMIT 1
            ) AS h ON TRUE)
        WHERE p.key = ANY (v_keys);
    END IF;
    -- Each finish's status at its place in p_ids (NULL: its fence matched nothing).
    RETURN ARRAY(SELECT v_status[array_position(v_ids, i.id)]
                 FROM unnest(p_ids) WITH ORDINALITY AS i(id, n) ORDER BY i.n);
END
$$;

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

CREATE OR REPLACE FUNCTION feishu_inbox_claim_fair(
    p_worker text, p_token text, p_lease float8, p_limit integer, p_prefixes text[],
    p_excluding boolean
) RETURNS SETOF {job} LANGUAGE plpgsql
SET enable_sort = on SET enable_seqscan = off SET jit = off AS $$
BEGIN
    -- claimable_heads_fair, claim_partitions and claim_jobs in one statement:
    -- * tenants: each tenant with claimable heads, one probe of the claimable index each
    --   (a loose index scan: the next tenant after the one found);
    -- * running: each tenant's running jobs, as its chats' running heads (a chat runs one
    --   job at a time), through the partial index feishu_inbox_part_running: as many
    --   entries as the workers' slots and buffers hold, whatever the idle chats;
    -- * candidates (read, not locked): each tenant's first p_limit due heads in its own
    --   order (priority, then receipt), the k-th of tenant t with the share
    --   (running_t + k) / weight_t;
    -- * quotas: of the p_limit candidates first by priority (across tenants too: a task
    --   above 0 runs before waiting chats, one below 0 after them, docs/tasks.md), then by
    --   share, then the older head, how many are each tenant's;
    -- * picked: each tenant's quota of its due heads in its own order, locked with SKIP
    --   LOCKED down its own range of the claimable index, as the plain claim walks it: the
    --   heads another claimer holds are passed over for the tenant's next ones, never
    --   dropped from the claim.
    -- A tenant's heads keep their order among themselves, and a chat has one head: no chat
    -- is ever reordered.
    -- Planned with sorts allowed (the shares are sorted; the callers forbid sorts) and no JIT:
    -- plans that carry enable_seqscan's penalty in their cost pass jit_above_cost, and
    -- compiling took 0.9 s a claim (auto_explain, 2 workers). The jobs are found by their ids
    -- only (the status test IS TRUE: no index serves it), as feishu_inbox_end_attempts finds
    -- its own.
    RETURN QUERY
    WITH RECURSIVE tenants (tenant) AS (
        (SELECT p.head_tenant FROM {partition} p WHERE p.head_state IN {claimable}
         ORDER BY p.head_tenant LIMIT 1)
        UNION ALL
        SELECT (SELECT p.head_tenant FROM {partition} p
                WHERE p.head_state IN {claimable} AND p.head_tenant > t.tenant
                ORDER BY p.head_tenant LIMIT 1)
        FROM tenants t WHERE t.tenant IS NOT NULL
    ), running AS (
        SELECT p.head_tenant AS tenant, count(*) AS n FROM {partition} p
        WHERE p.head_state = '{running}' GROUP BY p.head_tenant
    ), candidates AS (
        SELECT t.tenant, h.head_priority, h.head_id,
               (COALESCE(r.n, 0) + h.rank) / COALESCE(w.weight, 1.0) AS share
        FROM tenants t
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
        LEFT JOIN running r ON r.tenant = t.tenant
        LEFT JOIN {tenant_weight} w ON w.tenant = t.tenant
        WHERE t.tenant IS NOT NULL
    ), quotas AS (
        SELECT first.tenant, count(*) AS n
        FROM (SELECT c.tenant FROM candidates c
              ORDER BY c.head_priority DESC, c.share, c.head_id LIMIT p_limit) first
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
        UPDATE {partition} SET head_state = '{running}' FROM picked
        WHERE {partition}.key = picked.key
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

-- The PostgreSQL store's stored functions and row triggers AS THEY ARE NOW: every live one,
-- once, each exactly as the newest versioned file (functions/NNNN_*.sql) that defines it left
-- it, with that file's explanation. Read this file to know what the claim (or any other
-- function) is today; the versioned files are its history.
--
-- Migrations never load this file. A database gets its functions from the versioned files, in
-- migration order (store/migration.py, RunPostgresFunctions), so that an old database upgrades
-- (and migrates back) exactly as it always did. This file is rendered the same way
-- (queries.current_functions: queries.render with schema.SQL_NAMES).
--
-- The rule for changing a function (or a trigger): edit it here AND add a new versioned file
-- functions/NNNN_<what>.sql holding its new definition (with a reverse: a .down.sql, or the
-- earlier files loaded again) and a migration that loads it (RunPostgresFunctions). Never edit
-- an old versioned file: databases that ran it keep what it said. A new function is added in
-- both places the same way; a dropped one is removed here and dropped by a new versioned file.
-- tests/store/test_functions.py loads this file into a scratch schema and compares it with a
-- freshly migrated database, function by function (pg_get_functiondef: signature, result,
-- attributes and every character of the body) and trigger by trigger; a definition that
-- differs, or a function or trigger on one side only, fails it. (Comments inside a body are
-- part of it: they stay as the versioned file wrote them, old test paths included.)
--
-- (From 0002_postgres_functions.sql:) Each function runs the same steps as the SQLite store
-- (``sqlite.sql``), under the same query names, marked here as comments: lock the partition
-- row first, then recompute its head in a later statement. Inside a VOLATILE PL/pgSQL function
-- each statement takes a new snapshot under READ COMMITTED, so the head recomputation sees
-- every enqueue that committed before the lock was granted.


-- ---------------------------------------------------------------------------------------------
-- feishu_inbox_now_plus: as in 0005_clock.sql (migration 0005_clock_function).
--
-- feishu_inbox_now_plus(seconds): the database's clock plus that many seconds, so the queries
-- PostgreSQL and SQLite share (common.sql) read one clock expression. SQLite's store registers
-- a function of the same name on each connection. A single-SELECT STABLE SQL function:
-- PostgreSQL inlines it into the calling query.
CREATE OR REPLACE FUNCTION feishu_inbox_now_plus(p_seconds float8) RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT now() + p_seconds * interval '1 second'
$$;


-- ---------------------------------------------------------------------------------------------
-- feishu_inbox_enqueue: as in 0039_fair_claims.sql (migration 0039_fair_claims).
--
-- (0006:) feishu_inbox_enqueue also notifies for a private message, so the worker running its
-- chat's job looks for the newer message at once.
-- (0007:) a job may carry its own max_attempts (its handler's retry policy, given at enqueue;
-- NULL: the site's, p_max_attempts) and an operator's cancel_requested:
-- * feishu_inbox_enqueue takes p_max_attempts (its changed signature is dropped first:
--   CREATE OR REPLACE would add an overload).
-- (0013:) The head is set elsewhere only by resync_head (common.sql) and, for an idle
-- partition, by feishu_inbox_enqueue's set_first_head: a new job's priority is 0 then (the
-- column's default), and a task's priority is set after it in the same transaction
-- (defer_and_rank_job and defer_and_rank_head in common.sql), so the enqueue is unchanged.
-- (0022:) it also returns the job's received_at (the stored one, or the duplicate's).
-- (0025:) it stores p_trace_parent, the enqueuing caller's trace context (tracing.py).
-- (0037:) it stores p_tenant (SPEC §9j), and dedupe keys are unique per (app, tenant).
-- (0039:) set_first_head also sets the partition's head_tenant (the fair claim's).
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


-- ---------------------------------------------------------------------------------------------
-- feishu_inbox_end_attempt: as in 0039_fair_claims.sql (migration 0039_fair_claims); its
-- statements as 0015_end_attempt_statements.sql made them.
--
-- (0006:) feishu_inbox_end_attempt records the lease token on the attempt's history row, so a
-- worker that retries the end of its attempt after a lost reply can find that its first try
-- landed (common.sql: ended_with).
-- (0007:) feishu_inbox_end_attempt's fail path: a cancelled job completes as Cancelled instead
-- of being retried; the job's own attempts come before the site's.
-- (0011:) idempotent effects (SPEC §3 Effects). Only the fail path of feishu_inbox_end_attempt
-- changes, with the same signature:
-- * an attempt whose every effect was idempotent fails to retry_wait, not unknown, when it
--   runs again inside the job's window (idempotent_until after now() + p_retry_in); then
--   nothing is in flight or uncertain any more (it re-issues them with the same keys);
-- * p_retry_in NULL is a final failure (retrying cannot help, e.g. Feishu refused the
--   request): failed when every effect started was idempotent and settled, else unknown.
-- The rule is schema.status_after(), the one SQLite's fail_job and lease expiry use too.
-- (0012:) the partition's new head is read by a static statement, not by EXECUTE (parsed and
-- planned on every call). It is the same query as before, the first non-completed job of the
-- partition, relying on nothing about earlier jobs, written so that its generic plan reads
-- the partial index feishu_inbox_job_unresolved (partition_key, id) WHERE NOT completed
-- whatever the statistics say (tests/store/test_plans.py holds both plans at 200,000 waiting
-- jobs).
-- (0013:) the head lookup also reads the new head's priority.
-- (0015:) feishu_inbox_end_attempt in three statements instead of five, the same steps in the
-- same order. Each statement a PL/pgSQL function runs costs an executor start and end whatever
-- it does (about a seventh of the backend's CPU per job after 0014); measured with the stored
-- functions alone (pgbench, one client, commits not flushed), a finish with its next claim
-- took 0.92 of the time.
-- * The job's update and its history row are one statement: the row goes from the update's
--   RETURNING (the values the row has after it) into the attempt, where a second statement
--   read the row again by id. Nothing is recorded when the fence matched nothing (v_status
--   stays NULL, as before).
-- * The new head is read inside the partition's update, as a row subquery: no head leaves
--   the partition idle (the LEFT JOIN gives one row of NULLs). The head lookup is the same
--   query, with the same plan (tests/store/test_plans.py).
-- The lock order is unchanged: the partition row first, then the job's.
-- (0039:) the head lookup also reads the new head's tenant (head_tenant: the fair claim's).
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


-- ---------------------------------------------------------------------------------------------
-- feishu_inbox_claim: as in 0042_claim_without_tenants.sql (migration 0042_claim_without_tenants).
--
-- (0042:) on a site without tenants, one probe that starts past the heads of none replaces
-- the probe for the first tenant, which walked every dead entry a held snapshot keeps in
-- the claimable index (see 0042_claim_without_tenants.sql).
--
-- (0039:) two probes of the claimable index, which leads with the head's tenant now: with
-- several tenants claimable, feishu_inbox_claim_fair claims; with one, its heads as below
-- (the index read in the same order, `head_tenant = v_tenant` its first column). p_limit
-- below 1 claims nothing, as before; the second branch is every limit above 1.
--
-- (0033:) its jobs are updated by primary key (a scalar subquery, an array), never through
-- a join the status index may serve (see 0033_claim_by_id.sql).
--
-- (0007:) feishu_inbox_claim clears cancel_requested.
-- (0012:) a worker claims one job at a time (a finish claims its slot's next one), so LIMIT 1
-- is written as a literal in a branch of its own. Its cached generic plan is then the custom
-- plan (the partial index feishu_inbox_part_claimable, in head order): nothing to re-plan per
-- call. Other limits keep `LIMIT p_limit` (planned per call, as before; a generic plan there
-- guesses the limit and sequentially scans the partitions).
-- (0013:) priority. A job carries a priority (a django.tasks task's; 0 for Feishu events and
-- schedules), and its partition's row carries its head's (head_priority, 0 when idle). The
-- claim takes due heads by priority, highest first, then by receipt sequence, through the
-- partial index feishu_inbox_part_claimable (head_priority DESC, head_id): the same one index
-- probe as before, in index order, with no sort. A priority never reorders a partition: an
-- ordered partition's later jobs wait for its head whatever their priority.
-- * feishu_inbox_claim: ORDER BY head_priority DESC, head_id (both branches), and planned
--   with sorts and sequential scans forbidden (its SET clauses). Every claim must read the
--   claimable index in order; but before autovacuum first analyses the tables (a new site's
--   first minutes, a benchmark) the planner's defaults expect a claimable partition or two,
--   and reading every due partition through feishu_inbox_part_due and sorting them then
--   looks cheaper: a claim cost a sort of every waiting chat (0.5 ms at 1,000 chats, growing
--   with the chats), and the session kept that plan. tests/store/test_plans.py holds both
--   plans of both claims on the index without statistics.
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


-- ---------------------------------------------------------------------------------------------
-- feishu_inbox_claim_prefixed: as in 0042_claim_without_tenants.sql (migration
-- 0042_claim_without_tenants): the same probes and fair claim as feishu_inbox_claim's (0039,
-- 0042), the fair one in the queues.
-- (0033:) its jobs updated by primary key, as feishu_inbox_claim's.
--
-- (0010:) a claim for a worker that runs some queues of django.tasks tasks only
-- (``runworker --queue``; feishu_inbox/tasks/). A task's partition key starts with its queue
-- (``task:<queue>:``), so the filter is on the partition row the claim reads anyway.
-- feishu_inbox_claim is unchanged: an unfiltered worker pays nothing for it.
-- (0013:) the same order and SET clauses as feishu_inbox_claim, and (as feishu_inbox_claim
-- since 0012) a branch with a literal LIMIT 1, so its cached generic plan is the custom one.
--
-- (0024:) ``runworker --exclude-queues``: p_excluding TRUE takes only the partitions whose key
-- starts with none of the prefixes (every job but those queues' tasks). 0024 dropped the
-- signature without p_excluding first.
--
-- feishu_inbox_claim plus one predicate (marked below): a change to one belongs in the other.
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


-- ---------------------------------------------------------------------------------------------
-- feishu_inbox_claim_fair: as in 0040_fair_ring.sql (migration 0040_fair_ring); new in
-- 0039_fair_claims.sql: the claim while several tenants have claimable heads
-- (feishu_inbox_claim and feishu_inbox_claim_prefixed call it; p_prefixes NULL: every queue).
--
-- (0040:) where every weight is 1 and every claimable head has priority 0, a bounded ring of
-- tenants from a cursor (of the last attempts ended, the tenant of the one claimed last; the
-- ring passes over the running tenants) instead of every tenant with claimable heads: a claim
-- with 1,000 tenants cost 6.3 ms, now 0.6 ms, as with one. Otherwise every tenant, as before.
-- Ties of share go to the ring's order (the older head's before). Each contender's heads are
-- read up to a bound on the claim's last share. A claim that took nothing while heads were
-- locked walks past them. Generic plans (plan_cache_mode): planning the statement anew cost
-- more than running it.
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


-- ---------------------------------------------------------------------------------------------
-- feishu_inbox_finish_together: as in 0024_excluded_queues.sql (migration
-- 0024_excluded_queues); new in 0012_hot_path.sql: several finishes and their claims in one
-- statement. (0013:) it takes the queue prefixes of a `runworker --queue` worker (NULL: every
-- queue), so such a worker's finishes go together too (0013 dropped the signature without
-- p_prefixes first). (0024:) and p_excluding, for a `runworker --exclude-queues` worker, whose
-- claims take every partition but those queues' (0024 dropped the signature without it).
--
-- feishu_inbox_finish_together: the finishes of a worker's slots that ended together, and
-- each one's next claim, in one statement and one commit (the worker sends them together when
-- they end while another finish of its is being written). Each finish is fenced on its own,
-- by feishu_inbox_end_attempt: one whose lease was lost ends NULL, claims nothing and changes
-- nothing, and the others go on. Partition rows are locked in key order (as everywhere: the
-- lock order is partition, then job); the claims come after every finish, each with its own
-- token (p_new_tokens; '' claims nothing), so a worker whose reply was lost finds each
-- slot's job by its token (claimed_with). One row per finish, in the order given. p_prefixes:
-- the queue prefixes of a `runworker --queue` worker, whose claims take only those queues'
-- partitions (feishu_inbox_claim_prefixed), or with p_excluding every partition but those;
-- NULL for a worker of every queue.
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

-- ---------------------------------------------------------------------------------------------
-- feishu_inbox_end_attempts: as in 0039_fair_claims.sql (migration 0039_fair_claims); new in
-- 0028_finish_batch_sets.sql, with the setting of 0029_end_attempts_by_key.sql (migration
-- 0029_end_attempts_by_key); (0039:) its head lookup also reads the head's tenant. The
-- finishes of a worker's batch (feishu_inbox_finish_batch) in three statements whatever their
-- number, each fenced on its own as by feishu_inbox_end_attempt, in the same lock order and with the same history rows; their plans always generic (planned
-- with the arrays' values they were planned again on every call: a busy chat's batches of
-- one cost PostgreSQL about 200 µs more). Returns each finish's status at its place in p_ids.
-- (0029_end_attempts_by_key.sql:) planned with enable_seqscan off, as the claim is: generic
-- plans, costed for ten keys, scanned a small partition table whole (every partition's key
-- against every key of the batch) instead of reading its primary key.
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

-- ---------------------------------------------------------------------------------------------
-- feishu_inbox_finish_batch: as in 0028_finish_batch_sets.sql (migration 0028_finish_batch_sets);
-- new in 0027_finish_batch.sql: a worker's batch (runtime/batching.py). The finishes it
-- gathered over its flush window, of jobs of different partitions, and one claim of up to
-- p_limit next heads (the free places of its slots and of its small local buffer), in one
-- statement and one commit. Unlike feishu_inbox_finish_together (one claim of one job per
-- finish, each with its own token), the claim is one: one token, one LIMIT, one pass over the
-- claimable index. One row per finish, in the order given (claimed NULL), then one per claimed
-- job (finished_id NULL).
-- (0028:) the finishes as sets, through feishu_inbox_end_attempts, where 0027 ran
-- feishu_inbox_end_attempt (three statements) per finish. Each statement a PL/pgSQL function
-- runs costs an executor start and end, a snapshot and its locks whatever it does
-- (PostgreSQL's CPU per no-op job at 2 workers x 4 slots: 144-158 µs instead of 195-223).
CREATE OR REPLACE FUNCTION feishu_inbox_finish_batch(
    p_worker text, p_ids bigint[], p_tokens text[], p_keys text[], p_error_types text[],
    p_new_token text, p_limit integer, p_lease float8, p_prefixes text[],
    p_excluding boolean DEFAULT FALSE
) RETURNS TABLE (finished_id bigint, ended_status text, claimed {job})
LANGUAGE plpgsql AS $$
DECLARE
    i integer;
    v_status text[];
BEGIN
    -- Every finish, fenced on its own (a lost one ends NULL and changes nothing), partition
    -- rows locked before job rows.
    v_status := feishu_inbox_end_attempts(p_worker, p_ids, p_tokens, p_keys, p_error_types);
    FOR i IN 1 .. cardinality(p_ids) LOOP
        finished_id := p_ids[i];
        ended_status := v_status[i];
        claimed := NULL;
        RETURN NEXT;
    END LOOP;
    -- The claim comes last, in statements of its own (each sees the heads the finishes above
    -- made due), and never waits: it skips rows others hold, but not the ones locked above,
    -- so a finished partition's next job can be claimed in the same commit, never before it.
    IF p_limit > 0 THEN
        finished_id := NULL;
        ended_status := NULL;
        IF p_prefixes IS NULL THEN
            FOR claimed IN
                SELECT * FROM feishu_inbox_claim(p_worker, p_new_token, p_lease, p_limit)
            LOOP
                RETURN NEXT;
            END LOOP;
        ELSE
            FOR claimed IN
                SELECT * FROM feishu_inbox_claim_prefixed(p_worker, p_new_token, p_lease,
                                                         p_limit, p_prefixes, p_excluding)
            LOOP
                RETURN NEXT;
            END LOOP;
        END IF;
    END IF;
END
$$;


-- ---------------------------------------------------------------------------------------------
-- Row checks: feishu_inbox_job_check and feishu_inbox_partition_check, and their triggers, as
-- in 0014_row_checks.sql (migration 0014_row_checks), which also dropped the CHECK constraints
-- they replace.
--
-- On PostgreSQL the job's and the partition's CHECK constraints become row triggers that
-- check the same conditions and fail the same way (SQLSTATE 23514, check_violation, under the
-- constraint's name: Django raises IntegrityError as before).
--
-- Why: PostgreSQL keeps a CHECK constraint as the text of its expression tree and, for every
-- statement that writes the table, parses that text again, plans it and builds its executor
-- state (ExecRelCheck: stringToNode, expression_planner, ExecPrepareExpr), before checking a
-- single row. The job table's six checks are 6.5 KB of such text; a job writes its row three
-- times and its partition's row two or three times. Measured with the stored functions alone
-- (pgbench, one client, commits not flushed so that only CPU counts): those parses were
-- about a fifth of the backend's CPU per job; with these triggers an enqueue costs 0.78 and
-- a finish with its next claim 0.80 of what they did, within a few percent of no checks at
-- all. A PL/pgSQL trigger compiles once per session, and its conditions are simple
-- expressions whose plans stay cached.
--
-- The conditions are the constraints' (models.py), NULL passing as in a CHECK:
-- * feishu_inbox_job_status_valid: the status is one of the job statuses (0030: waiting too);
-- * feishu_inbox_job_lease_iff_running: a lease (until, token, worker) exactly while running;
-- * the PositiveIntegerField checks of attempt, effects_in_flight, replays, max_attempts;
-- * feishu_inbox_partition_head_iff_busy: a head exactly when the partition is not idle.
-- SQLite keeps the CHECK constraints: it compiles them into each prepared statement.
-- tests/store/test_row_checks.py holds every condition on both databases.

CREATE OR REPLACE FUNCTION feishu_inbox_job_check() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_failed text;
BEGIN
    IF NOT (NEW.status = ANY (ARRAY['{queued}', '{running}', '{retry_wait}', '{completed}',
                                    '{failed}', '{unknown}', '{waiting}'])) THEN
        v_failed := 'feishu_inbox_job_status_valid';
    ELSIF NOT (CASE WHEN NEW.status = '{running}'
                    THEN NEW.lease_until IS NOT NULL AND NEW.lease_token <> ''
                         AND NEW.worker_id <> ''
                    ELSE NEW.lease_until IS NULL AND NEW.lease_token = '' END) THEN
        v_failed := 'feishu_inbox_job_lease_iff_running';
    ELSIF NEW.attempt < 0 THEN
        v_failed := '{job}_attempt_check';
    ELSIF NEW.effects_in_flight < 0 THEN
        v_failed := '{job}_effects_in_flight_check';
    ELSIF NEW.replays < 0 THEN
        v_failed := '{job}_replays_check';
    ELSIF NEW.max_attempts < 0 THEN
        v_failed := '{job}_max_attempts_check';
    ELSE
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"',
        TG_TABLE_NAME, v_failed
        USING ERRCODE = 'check_violation', CONSTRAINT = v_failed, TABLE = TG_TABLE_NAME,
              SCHEMA = TG_TABLE_SCHEMA,
              DETAIL = format('Job %s: status %L, lease_until %s, lease_token %L, '
                              'worker_id %L, attempt %s.', NEW.id, NEW.status,
                              COALESCE(NEW.lease_until::text, 'NULL'), NEW.lease_token,
                              NEW.worker_id, NEW.attempt);
END
$$;

CREATE OR REPLACE FUNCTION feishu_inbox_partition_check() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF ((NEW.head_state = '{idle}') = (NEW.head_id IS NULL)) IS NOT FALSE THEN
        RETURN NEW;  -- NULL passes, as in a CHECK (head_state is NOT NULL anyway)
    END IF;
    RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"',
        TG_TABLE_NAME, 'feishu_inbox_partition_head_iff_busy'
        USING ERRCODE = 'check_violation', CONSTRAINT = 'feishu_inbox_partition_head_iff_busy',
              TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA,
              DETAIL = format('Partition %L: head_state %L, head_id %s.', NEW.key,
                              NEW.head_state, COALESCE(NEW.head_id::text, 'NULL'));
END
$$;

CREATE TRIGGER feishu_inbox_job_check BEFORE INSERT OR UPDATE ON {job}
    FOR EACH ROW EXECUTE FUNCTION feishu_inbox_job_check();
CREATE TRIGGER feishu_inbox_partition_check BEFORE INSERT OR UPDATE ON {partition}
    FOR EACH ROW EXECUTE FUNCTION feishu_inbox_partition_check();

-- ---------------------------------------------------------------------------------------------
-- feishu_inbox_member_moved: as in 0034_workflows.sql (migration 0034_workflows).
--
-- A member of a batch (a job whose batch_id is set) that moves into an ended state (completed,
-- failed) or out of one writes a batch event in its own transaction, and tells the workers
-- (NOTIFY, delivered at its commit). The workers fold the events into their batches and fire
-- the batches that are done (ledger/workflows.py). An insert, not the batch's count: two
-- batched finishes updating several batches' rows in opposite orders would deadlock.

CREATE OR REPLACE FUNCTION feishu_inbox_member_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {batch_event} (batch_id, delta)
    VALUES (NEW.batch_id,
            CASE WHEN NEW.status IN ('{completed}', '{failed}') THEN -1 ELSE 1 END);
    PERFORM pg_notify('{channel}', '{batches_notice}');
    RETURN NULL;
END
$$;

CREATE TRIGGER feishu_inbox_member_moved AFTER UPDATE OF status ON {job}
    FOR EACH ROW
    WHEN (NEW.batch_id IS NOT NULL
          AND (OLD.status IN ('{completed}', '{failed}'))
              <> (NEW.status IN ('{completed}', '{failed}')))
    EXECUTE FUNCTION feishu_inbox_member_moved();

-- The ledger's queries that SQLite runs differently from PostgreSQL; postgres.sql holds the
-- other side under the same names, and common.sql what both run as it is. A query that exists
-- in one file only says so, and why. What differs everywhere:
--   * SQLite has one writer at a time: every write runs in an IMMEDIATE transaction, so it
--     needs no row locks (no FOR UPDATE, no SKIP LOCKED) and nothing waits on a row;
--   * it has no stored functions: the PostgreSQL functions' steps are queries here, run one by
--     one in one transaction (their names are the comments inside the functions);
--   * now() and feishu_inbox_now_plus(seconds) are the host's UTC clock, registered by the
--     store on each connection (the database is a local file: one host, one clock).

-- enqueue_partition --
-- Lock (or create) the partition row; returns its head. Only on SQLite: PostgreSQL runs the
-- enqueue steps inside feishu_inbox_enqueue() (one round trip); here the IMMEDIATE
-- transaction already holds the only write lock.
INSERT INTO {partition} (key, head_id, head_state, head_due_at)
VALUES (%(partition_key)s, NULL, '{idle}', NULL)
ON CONFLICT (key) DO UPDATE SET key = excluded.key
RETURNING head_id

-- enqueue_job --
-- Take the receipt sequence (the id) under that lock; nothing when the dedupe key is stored.
-- Only on SQLite (PostgreSQL: inside feishu_inbox_enqueue()).
INSERT INTO {job} (app, event_id, event_type, dedupe_key, partition_key,
    private_message, payload, status, attempt, max_attempts, received_at, available_at,
    worker_id, lease_token, effects_in_flight, side_effect_started,
    effect_uncertain, cancel_requested, error_type, error_message, resolution, trace_parent,
    tenant)
VALUES (%(app)s, %(event_id)s, %(event_type)s, %(dedupe_key)s, %(partition_key)s,
    %(private_message)s, %(payload)s, '{queued}', 0, %(max_attempts)s, now(), now(),
    '', '', 0, FALSE, FALSE, FALSE, '', '', '', %(trace_parent)s, %(tenant)s)
ON CONFLICT (app, tenant, dedupe_key) DO NOTHING
RETURNING id, received_at

-- duplicate_of --
-- The job already stored under this dedupe key (the tenant's). Only on SQLite (PostgreSQL:
-- inside feishu_inbox_enqueue()).
SELECT id, received_at FROM {job}
WHERE app = %(app)s AND tenant = %(tenant)s AND dedupe_key = %(dedupe_key)s

-- set_first_head --
-- An idle partition gets the new job as its head: only then is there new claimable work.
-- Only on SQLite (PostgreSQL: inside feishu_inbox_enqueue()).
UPDATE {partition} SET head_id = %(job_id)s, head_state = '{queued}',
    (head_due_at, head_tenant) = (SELECT available_at, tenant FROM {job} WHERE id = %(job_id)s)
WHERE key = %(partition_key)s

-- claimable_tenant --
-- The first tenant with claimable heads (the partial index feishu_inbox_part_claimable's first
-- entry); none: nothing to claim. Only on SQLite (PostgreSQL: inside feishu_inbox_claim()).
SELECT head_tenant FROM {partition}
WHERE head_state IN {claimable} ORDER BY head_tenant LIMIT 1

-- another_tenant --
-- A tenant after it with claimable heads: several tenants share the slots (claimable_heads_fair).
-- Only on SQLite (PostgreSQL: inside feishu_inbox_claim()).
SELECT 1 AS found FROM {partition}
WHERE head_state IN {claimable} AND head_tenant > %(tenant)s LIMIT 1

-- claimable_heads --
-- The one claimable tenant's due heads, highest priority first, then lowest receipt sequence
-- (the partial index feishu_inbox_part_claimable's order). Only on SQLite (PostgreSQL:
-- feishu_inbox_claim(), with FOR UPDATE SKIP LOCKED; a single writer has nothing to skip).
SELECT key, head_id FROM {partition}
WHERE head_state IN {claimable} AND head_tenant = %(tenant)s AND head_due_at <= now()
ORDER BY head_priority DESC, head_id LIMIT %(limit)s

-- claimable_heads_fair --
-- While several tenants have claimable heads: the k-th due head of tenant t (in its own order:
-- priority, then receipt) has the share (running_t + k) / weight_t (running_t: its chats'
-- running heads), and the heads are claimed by priority (across tenants too), then the lowest
-- share, then the ring's order among tenants that run nothing (in key order from the one
-- after the cursor: of the last attempts ended, the tenant of the one claimed last), running
-- tenants after them, then the older head, as feishu_inbox_claim_fair does. Only in the queues of %(prefixes)s, or
-- (%(excluding)s) outside them: every partition with no prefixes and excluding. Only on
-- SQLite (PostgreSQL: feishu_inbox_claim_fair(), which reads a bounded ring of tenants; here
-- every due head is ranked, as few as an embedded ledger holds).
WITH running AS (
    SELECT head_tenant AS tenant, count(*) AS n FROM {partition}
    WHERE head_state = '{running}' GROUP BY head_tenant
), cursor AS (
    SELECT tenant FROM (
        SELECT j.tenant AS tenant, a.started_at AS started_at
        FROM {attempt} a JOIN {job} j ON j.id = a.job_id
        ORDER BY a.id DESC LIMIT 16
    ) ORDER BY started_at DESC, tenant DESC LIMIT 1
), ranked AS (
    SELECT {partition}.key AS key, head_id, head_priority, head_tenant,
           row_number() OVER (PARTITION BY head_tenant
                              ORDER BY head_priority DESC, head_id) AS rank
    FROM {partition}
    WHERE head_state IN {claimable} AND head_due_at <= now()
      AND EXISTS (SELECT 1 FROM {prefixes} q
                  WHERE substr({partition}.key, 1, length(q.prefix)) = q.prefix) <> %(excluding)s
)
SELECT ranked.key AS key, ranked.head_id AS head_id FROM ranked
LEFT JOIN running ON running.tenant = ranked.head_tenant
LEFT JOIN {tenant_weight} w ON w.tenant = ranked.head_tenant
WHERE ranked.rank <= %(limit)s
ORDER BY ranked.head_priority DESC,
         (COALESCE(running.n, 0) + ranked.rank) / COALESCE(w.weight, 1.0),
         running.n IS NOT NULL,
         CASE WHEN running.n IS NULL
              THEN COALESCE(ranked.head_tenant <= (SELECT tenant FROM cursor), 0) END,
         CASE WHEN running.n IS NULL THEN ranked.head_tenant END,
         ranked.head_id
LIMIT %(limit)s

-- claim_partitions --
-- Their partitions are running now. Only on SQLite (PostgreSQL: feishu_inbox_claim()).
UPDATE {partition} SET head_state = '{running}'
WHERE key IN {keys}

-- claim_jobs --
-- The heads run under a new lease. Only on SQLite (PostgreSQL: feishu_inbox_claim()). One
-- claim time for all of them, as PostgreSQL's now() (here a function called per row): the fair
-- claim's ring reads which was claimed last.
UPDATE {job} SET status = '{running}', attempt = attempt + 1,
    worker_id = %(worker_id)s, lease_token = %(token)s,
    lease_until = feishu_inbox_now_plus(%(lease_seconds)s),
    claimed_at = (SELECT now()), error_type = '', error_message = '', cancel_requested = FALSE
WHERE id IN {job_ids} AND status IN {claimable}
RETURNING {claimed_columns}

-- finish_job --
-- The handler returned: completed, or unknown when an effect is open or uncertain (fenced).
-- Only on SQLite (PostgreSQL: inside feishu_inbox_end_attempt()).
UPDATE {job} SET
    status = CASE WHEN {effect_open} THEN '{unknown}' ELSE '{completed}' END,
    error_type = CASE WHEN {effect_open} THEN 'UncertainEffect' ELSE %(error_type)s END,
    error_message = CASE WHEN {effect_open} THEN {uncertain_message} ELSE '' END,
    finished_at = now(), lease_token = '', lease_until = NULL
WHERE {fence}
RETURNING status

-- fail_job --
-- The handler raised: unknown if any effect started (unless all were idempotent and it runs
-- again inside their window), completed if an operator cancelled it, failed when the attempts
-- are spent (or %(retry_in)s is NULL: retrying cannot help), else retry in %(retry_in)s
-- seconds (fenced). Only on SQLite (PostgreSQL: inside feishu_inbox_end_attempt()).
UPDATE {job} SET
    status = {status_after_fail},
    available_at = CASE WHEN {status_after_fail} = '{retry_wait}'
        THEN feishu_inbox_now_plus(%(retry_in)s) ELSE available_at END,
    {settle_after_fail},
    finished_at = now(), error_type = {error_after_fail}, error_message = %(error_message)s,
    lease_token = '', lease_until = NULL
WHERE {fence}
RETURNING status

-- lock_partitions --
-- The partition rows, in key order. Differs from PostgreSQL: no FOR UPDATE, the IMMEDIATE
-- transaction already holds the only write lock.
SELECT key FROM {partition} WHERE key IN {keys} ORDER BY key

-- lock_free_partitions --
-- The same as lock_partitions: with one writer no row is ever held by another transaction.
SELECT key FROM {partition} WHERE key IN {keys} ORDER BY key

-- completed_past_retention --
-- One batch of completed jobs past retention, oldest first. Differs from PostgreSQL: no
-- SKIP LOCKED (one writer).
SELECT id FROM {job}
WHERE status = '{completed}' AND finished_at < feishu_inbox_now_plus(-%(seconds)s)
  -- a member of a batch not fired yet stays: its outcome and result are read when it fires
  AND (batch_id IS NULL
       OR NOT EXISTS (SELECT 1 FROM {batch} b WHERE b.id = batch_id AND b.state <> 'fired'))
ORDER BY finished_at LIMIT %(limit)s

-- idle_partitions --
-- Partition rows of chats with no job left. Differs from PostgreSQL: no SKIP LOCKED.
SELECT p.key FROM {partition} p
WHERE p.head_state = '{idle}'
  AND NOT EXISTS (SELECT 1 FROM {job} j WHERE j.partition_key = p.key)
LIMIT %(limit)s

-- next_job_id --
-- A new receipt sequence for a job a replay moves to the end of its partition. Differs from
-- PostgreSQL: the AUTOINCREMENT counter lives in sqlite_sequence (never reusing an id).
UPDATE sqlite_sequence SET seq = seq + 1 WHERE name = '{job}' RETURNING seq AS id

-- record_step --
-- A step's result, written fenced when its function returns. Differs from PostgreSQL: SQLite
-- has no data-modifying CTE, so mark_has_steps follows in the same transaction.
INSERT INTO {step} (job_id, name, attempt, started_at, finished_at, result)
SELECT id, %(name)s, attempt, feishu_inbox_now_plus(-%(took)s), now(), %(result)s
FROM {job} WHERE {fence}
ON CONFLICT (job_id, name) DO NOTHING
RETURNING id

-- mark_has_steps --
-- The job's has_steps flag, so later attempts read the memo. Only on SQLite (PostgreSQL sets
-- it in record_step's one statement).
UPDATE {job} SET has_steps = TRUE WHERE id = %(job_id)s AND NOT has_steps

-- claimable_heads_in_queues --
-- claimable_heads (of the one tenant), for a worker of some queues only (runworker --queue): only partitions whose
-- key starts with one of the prefixes; %(excluding)s (runworker --exclude-queues): only those
-- whose key starts with none of them. Only on SQLite (PostgreSQL:
-- feishu_inbox_claim_prefixed()). The key is qualified: json_each has a column named key.
SELECT {partition}.key, {partition}.head_id FROM {partition}
WHERE head_state IN {claimable} AND head_tenant = %(tenant)s AND head_due_at <= now()
  AND EXISTS (SELECT 1 FROM {prefixes} q
              WHERE substr({partition}.key, 1, length(q.prefix)) = q.prefix) <> %(excluding)s
ORDER BY head_priority DESC, head_id LIMIT %(limit)s

-- clock --
-- Differs from PostgreSQL (clock_timestamp(), not the transaction's start): the host's
-- clock, as now() is here.
SELECT now() AS now

-- lock_signal_key --
-- A signal and a wait of one key take turns. Differs from PostgreSQL: nothing to lock, the
-- write transaction (IMMEDIATE) is the only writer.
SELECT 1 AS locked

-- insert_wait --
-- A job's wait, open (or already delivered by a kept signal), until %(seconds)s from now
-- (NULL: no time limit). Differs from PostgreSQL: JSON is text, no casts.
INSERT INTO {wait} (job_id, name, key, until, state, hold_chat, payload, created_at, resolved_at,
                    partition_key, ask)
VALUES (%(job_id)s, %(name)s, %(key)s,
        CASE WHEN %(seconds)s IS NULL THEN NULL ELSE feishu_inbox_now_plus(%(seconds)s) END,
        %(state)s, %(hold_chat)s, %(payload)s, now(),
        CASE WHEN %(state)s = 'open' THEN NULL ELSE now() END, %(partition_key)s,
        %(ask)s)
ON CONFLICT (job_id, name) DO NOTHING
RETURNING id

-- resolve_wait --
-- The exactly-once gate: an open wait becomes delivered or timed_out by one conditional
-- update. Differs from PostgreSQL: JSON is text, no casts.
UPDATE {wait} SET state = %(state)s, payload = %(payload)s, resolved_at = now()
WHERE id = %(wait_id)s AND state = 'open'
RETURNING job_id

-- keep_signal --
-- A signal nobody waits for yet, kept %(seconds)s seconds. Differs from PostgreSQL: JSON is
-- text, the time from feishu_inbox_now_plus.
INSERT INTO {signal} (key, payload, sent_at, expires_at)
VALUES (%(key)s, %(payload)s, now(), feishu_inbox_now_plus(%(seconds)s))

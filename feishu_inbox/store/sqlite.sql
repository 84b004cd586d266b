-- The ledger's queries on SQLite. The same names are in postgres.sql; a query that exists in
-- one file only says so, and why, in its description. What differs everywhere:
--   * SQLite has one writer at a time: every write runs in an IMMEDIATE transaction, so it
--     needs no row locks (no FOR UPDATE, no SKIP LOCKED) and nothing waits on a row;
--   * it has no stored functions: the PostgreSQL functions' steps are queries here, run one by
--     one in one transaction (their names are the comments inside the functions);
--   * now() and feishu_inbox_now_plus(seconds) are the host's UTC clock, registered by the
--     store on each connection (the database is a local file: one host, one clock);
--   * a list parameter arrives as a JSON array, read with json_each().

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
    private_message, payload, status, attempt, received_at, available_at,
    worker_id, lease_token, effects_in_flight, side_effect_started,
    effect_uncertain, error_type, error_message, resolution)
VALUES (%(app)s, %(event_id)s, %(event_type)s, %(dedupe_key)s, %(partition_key)s,
    %(private_message)s, %(payload)s, '{queued}', 0, now(), now(),
    '', '', 0, FALSE, FALSE, '', '', '')
ON CONFLICT (app, dedupe_key) DO NOTHING
RETURNING id

-- duplicate_of --
-- The job already stored under this dedupe key. Only on SQLite (PostgreSQL: inside
-- feishu_inbox_enqueue()).
SELECT id FROM {job} WHERE app = %(app)s AND dedupe_key = %(dedupe_key)s

-- set_first_head --
-- An idle partition gets the new job as its head: only then is there new claimable work.
-- Only on SQLite (PostgreSQL: inside feishu_inbox_enqueue()).
UPDATE {partition} SET head_id = %(job_id)s, head_state = '{queued}',
    head_due_at = (SELECT available_at FROM {job} WHERE id = %(job_id)s)
WHERE key = %(partition_key)s

-- claimable_heads --
-- The lowest due claimable heads. Only on SQLite (PostgreSQL: feishu_inbox_claim(), with
-- FOR UPDATE SKIP LOCKED; a single writer has nothing to skip).
SELECT key, head_id FROM {partition}
WHERE head_state IN {claimable} AND head_due_at <= now()
ORDER BY head_id LIMIT %(limit)s

-- claim_partitions --
-- Their partitions are running now. Only on SQLite (PostgreSQL: feishu_inbox_claim()).
UPDATE {partition} SET head_state = '{running}'
WHERE key IN (SELECT value FROM json_each(%(keys)s))

-- claim_jobs --
-- The heads run under a new lease. Only on SQLite (PostgreSQL: feishu_inbox_claim()).
UPDATE {job} SET status = '{running}', attempt = attempt + 1,
    worker_id = %(worker_id)s, lease_token = %(token)s,
    lease_until = feishu_inbox_now_plus(%(lease_seconds)s),
    claimed_at = now(), error_type = '', error_message = ''
WHERE id IN (SELECT value FROM json_each(%(job_ids)s)) AND status IN {claimable}
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
-- The handler raised: unknown if any effect started, else retry later or failed when the
-- attempts are spent (fenced). Only on SQLite (PostgreSQL: inside feishu_inbox_end_attempt()).
UPDATE {job} SET
    status = CASE
        WHEN {effect_started} THEN '{unknown}'
        WHEN attempt >= %(max_attempts)s THEN '{failed}'
        ELSE '{retry_wait}' END,
    available_at = CASE
        WHEN {effect_started} OR attempt >= %(max_attempts)s THEN available_at
        ELSE feishu_inbox_now_plus(%(retry_in)s) END,
    finished_at = now(), error_type = %(error_type)s, error_message = %(error_message)s,
    lease_token = '', lease_until = NULL
WHERE {fence}
RETURNING status

-- lock_partitions --
-- The partition rows, in key order. Differs from PostgreSQL: no FOR UPDATE, the IMMEDIATE
-- transaction already holds the only write lock.
SELECT key FROM {partition} WHERE key IN (SELECT value FROM json_each(%(keys)s)) ORDER BY key

-- lock_free_partitions --
-- The same as lock_partitions: with one writer no row is ever held by another transaction.
SELECT key FROM {partition} WHERE key IN (SELECT value FROM json_each(%(keys)s)) ORDER BY key

-- resync_head --
-- Point a partition at its first non-completed job (the partial index (partition_key, id)).
UPDATE {partition} SET
    head_id = head.id,
    head_state = COALESCE(head.status, '{idle}'),
    head_due_at = head.available_at
FROM (SELECT NULL) AS anchor
LEFT JOIN (
    SELECT id, status, available_at FROM {job}
    WHERE partition_key = %(partition_key)s AND {unresolved}
    ORDER BY partition_key, id LIMIT 1
) AS head ON TRUE
WHERE key = %(partition_key)s

-- record_attempts --
-- A history row for each job's attempt that just ended (run after the job's update).
INSERT INTO {attempt} (job_id, number, worker_id, started_at, ended_at, outcome,
                       error_type, error_message)
SELECT id, attempt + %(number_offset)s, worker_id, COALESCE(claimed_at, now()), now(), status,
       error_type, error_message
FROM {job} WHERE id IN (SELECT value FROM json_each(%(job_ids)s))

-- expired_leases --
-- Running jobs whose lease passed, oldest first.
SELECT id, partition_key FROM {job}
WHERE status = '{running}' AND lease_until <= now()
ORDER BY id LIMIT %(limit)s

-- expire_lease_jobs --
-- SPEC §3 Lease expiry: unknown if an effect started, else retry now or failed.
UPDATE {job} SET
    status = CASE
        WHEN {effect_started} THEN '{unknown}'
        WHEN attempt >= %(max_attempts)s THEN '{failed}'
        ELSE '{retry_wait}' END,
    error_type = CASE
        WHEN {effect_started} THEN 'LeaseExpiredAfterSideEffect'
        ELSE 'LeaseExpired' END,
    error_message = 'The worker ' || worker_id || ' stopped renewing its lease.',
    available_at = now(),
    finished_at = now(),
    lease_token = '', lease_until = NULL
WHERE id IN (SELECT value FROM json_each(%(job_ids)s))
  AND status = '{running}' AND lease_until <= now()
RETURNING id, partition_key, status

-- renew --
-- Extend a lease (fenced); returns the new deadline.
UPDATE {job} SET lease_until = feishu_inbox_now_plus(%(lease_seconds)s)
WHERE {fence}
RETURNING lease_until

-- begin_effect --
-- Persist "an effect is in flight" before the effect starts (fenced).
UPDATE {job} SET effects_in_flight = effects_in_flight + 1, side_effect_started = TRUE
WHERE {fence}
RETURNING id

-- end_effect --
-- Record an effect as finished, or uncertain when it raised (fenced; one must be in flight).
UPDATE {job} SET effects_in_flight = effects_in_flight - 1,
                 effect_uncertain = (effect_uncertain OR %(uncertain)s)
WHERE {fence} AND effects_in_flight > 0
RETURNING id

-- hand_back --
-- Return a job that started no effect to the queue, due now, giving its attempt back (fenced).
UPDATE {job} SET
    status = CASE WHEN attempt > 1 THEN '{retry_wait}' ELSE '{queued}' END,
    attempt = attempt - 1, available_at = now(),
    error_type = 'HandedBack', error_message = 'The worker shut down.',
    lease_token = '', lease_until = NULL
WHERE {fence} AND NOT {effect_started}
RETURNING status

-- lease_state --
-- What a fenced call that matched nothing ran into.
SELECT status, worker_id, lease_token, lease_until <= now() AS expired
FROM {job} WHERE id = %(job_id)s

-- newer_private_waiting --
-- Is the next unresolved job of this partition a private message? (SPEC §4 supersede)
SELECT private_message FROM {job}
WHERE partition_key = %(partition_key)s AND id > %(job_id)s AND {unresolved}
ORDER BY partition_key, id LIMIT 1

-- job_partition --
-- The partition of a job.
SELECT partition_key FROM {job} WHERE id = %(job_id)s

-- job_status --
-- A job's status (to say why an operator action was refused).
SELECT status FROM {job} WHERE id = %(job_id)s

-- requeue --
-- failed → queued, attempt 0, due now.
UPDATE {job} SET status = '{queued}', attempt = 0, available_at = now(), finished_at = NULL,
    resolution = %(resolution)s
WHERE id = %(job_id)s AND status = %(from_status)s
RETURNING partition_key

-- reconcile_applied --
-- unknown → completed: the operator checked that the effect happened.
UPDATE {job} SET status = '{completed}', finished_at = now(), resolution = %(resolution)s
WHERE id = %(job_id)s AND status = %(from_status)s
RETURNING partition_key

-- reconcile_not_applied --
-- unknown → queued, attempt 0, effect flags cleared: the effect did not happen, run it again.
UPDATE {job} SET status = '{queued}', attempt = 0, available_at = now(), finished_at = NULL,
    effects_in_flight = 0, side_effect_started = FALSE, effect_uncertain = FALSE,
    resolution = %(resolution)s
WHERE id = %(job_id)s AND status = %(from_status)s
RETURNING partition_key

-- discard --
-- failed → completed, unblocking its partition.
UPDATE {job} SET status = '{completed}', finished_at = now(), resolution = %(resolution)s
WHERE id = %(job_id)s AND status = %(from_status)s
RETURNING partition_key

-- expire_unknown --
-- unknown → completed (UnknownExpired) after the unknown retention.
UPDATE {job} SET status = '{completed}', error_type = 'UnknownExpired',
    resolution = %(resolution)s
WHERE id = %(job_id)s AND status = %(from_status)s
RETURNING partition_key

-- unknown_past_retention --
-- Unknown jobs that ended longer ago than the unknown retention.
SELECT id FROM {job}
WHERE status = '{unknown}' AND finished_at < feishu_inbox_now_plus(-%(seconds)s)

-- completed_past_retention --
-- One batch of completed jobs past retention, oldest first. Differs from PostgreSQL: no
-- SKIP LOCKED (one writer).
SELECT id FROM {job}
WHERE status = '{completed}' AND finished_at < feishu_inbox_now_plus(-%(seconds)s)
ORDER BY finished_at LIMIT %(limit)s

-- delete_attempts --
-- The history of jobs about to be deleted.
DELETE FROM {attempt} WHERE job_id IN (SELECT value FROM json_each(%(job_ids)s))

-- delete_jobs --
-- Jobs past retention (their history deleted first).
DELETE FROM {job} WHERE id IN (SELECT value FROM json_each(%(job_ids)s))

-- idle_partitions --
-- Partition rows of chats with no job left. Differs from PostgreSQL: no SKIP LOCKED.
SELECT p.key FROM {partition} p
WHERE p.head_state = '{idle}'
  AND NOT EXISTS (SELECT 1 FROM {job} j WHERE j.partition_key = p.key)
LIMIT %(limit)s

-- delete_idle_partitions --
-- Delete those rows, if still idle.
DELETE FROM {partition}
WHERE head_state = '{idle}' AND key IN (SELECT value FROM json_each(%(keys)s))

-- next_wakeup --
-- The earliest time a claim may find work: a due head or a lease to expire.
SELECT MIN(t) AS wakeup FROM (
    SELECT MIN(head_due_at) AS t FROM {partition} WHERE head_state IN {claimable}
    UNION ALL
    SELECT MIN(lease_until) AS t FROM {job} WHERE status = '{running}'
) AS w

-- now --
-- The host's clock, as the ledger stores times.
SELECT now() AS now

-- count_unresolved --
-- Jobs per unresolved state.
SELECT status, COUNT(*) AS n FROM {job} WHERE {unresolved} GROUP BY status

-- count_completed --
-- Completed jobs, counted exactly (SQLite keeps no row estimate: see estimate_jobs).
SELECT COUNT(*) AS n FROM {job} WHERE status = '{completed}'

-- due_and_delayed --
-- Queued and retry-waiting jobs whose time has come, and those not yet due.
SELECT COALESCE(SUM(CASE WHEN available_at <= now() THEN 1 ELSE 0 END), 0) AS due,
       COALESCE(SUM(CASE WHEN available_at > now() THEN 1 ELSE 0 END), 0) AS delayed
FROM {job} WHERE status IN {claimable}

-- oldest_due --
-- The due time of the longest-waiting claimable head.
SELECT MIN(head_due_at) AS due_at FROM {partition}
WHERE head_state IN {claimable} AND head_due_at <= now()

-- blocked_and_running_partitions --
-- How many partitions are blocked (head failed or unknown) and how many are running.
SELECT head_state, COUNT(*) AS n FROM {partition}
WHERE head_state IN ('{failed}', '{unknown}', '{running}') GROUP BY head_state

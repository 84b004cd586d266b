-- The ledger's queries on PostgreSQL. The same names are in sqlite.sql; a query that exists in
-- one file only says so, and why, in its description. Placeholders ({job}, {queued}, …) come
-- from store/schema.py; parameters are named (%(job_id)s). Times are the database's clock.

-- enqueue --
-- Store an event once, in one round trip: feishu_inbox_enqueue() locks (or creates) the
-- partition row, takes the id under that lock and makes the job its partition's head if the
-- partition was idle (then NOTIFY). Only on PostgreSQL: SQLite runs the same steps one by one
-- (enqueue_partition, enqueue_job, duplicate_of, set_first_head).
SELECT job_id, created
FROM feishu_inbox_enqueue(%(app)s, %(event_id)s, %(event_type)s, %(dedupe_key)s,
                          %(partition_key)s, %(private_message)s, %(payload)s)

-- claim --
-- Claim up to %(limit)s due partition heads, lowest receipt sequence first, with row locks that
-- other claimers skip. Only on PostgreSQL: SQLite runs claimable_heads, claim_partitions and
-- claim_jobs.
SELECT {claimed_columns}
FROM feishu_inbox_claim(%(worker_id)s, %(token)s, %(lease_seconds)s, %(limit)s)

-- end_attempt --
-- The fenced end of an attempt (finish or fail) with its history row and the partition's new
-- head, in one round trip; NULL when the lease was lost. Only on PostgreSQL: SQLite runs
-- lock_partitions, finish_job or fail_job, record_attempts and resync_head.
SELECT feishu_inbox_end_attempt(%(job_id)s, %(worker_id)s, %(token)s, %(partition_key)s,
                                %(fail)s, %(error_type)s, %(error_message)s,
                                %(max_attempts)s, %(retry_in)s) AS status

-- finish_and_claim --
-- Finish a job and claim its worker's next heads in one statement: one round trip and one
-- commit per job. Nothing is claimed when the finish lost its lease (ended_status NULL).
-- Only on PostgreSQL: SQLite runs the finish and the claim in one transaction instead.
SELECT ended.ended_status, claimed.*
FROM (
    SELECT feishu_inbox_end_attempt(%(job_id)s, %(worker_id)s, %(token)s, %(partition_key)s,
                                    FALSE, %(error_type)s, '', 0, 0) AS ended_status
) ended
LEFT JOIN LATERAL (
    SELECT {claimed_columns}
    FROM feishu_inbox_claim(%(worker_id)s, %(new_token)s, %(lease_seconds)s,
                            CASE WHEN ended.ended_status IS NULL THEN 0 ELSE %(limit)s END)
) claimed ON TRUE

-- lock_partitions --
-- Lock partition rows in key order (the lock order is always partition, then job), waiting
-- for a holder.
SELECT key FROM {partition} WHERE key = ANY(%(keys)s) ORDER BY key FOR UPDATE

-- lock_free_partitions --
-- Lock the partition rows nobody holds, in key order; rows another transaction holds are
-- skipped (left for the next sweep).
SELECT key FROM {partition} WHERE key = ANY(%(keys)s) ORDER BY key FOR UPDATE SKIP LOCKED

-- resync_head --
-- Point a partition (its row locked) at its first non-completed job. The key is bound, not
-- correlated, and the order matches the partial index (partition_key, id): a correlated
-- subquery gets a generic plan that walks the primary key through the whole backlog.
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
-- %(number_offset)s is 1 when the attempt was handed back (its number was given back).
INSERT INTO {attempt} (job_id, number, worker_id, started_at, ended_at, outcome,
                       error_type, error_message)
SELECT id, attempt + %(number_offset)s, worker_id, COALESCE(claimed_at, now()), now(), status,
       error_type, error_message
FROM {job} WHERE id = ANY(%(job_ids)s)

-- notify --
-- Wake idle workers: a head became claimable (delivered at commit).
-- Only on PostgreSQL: SQLite workers poll.
SELECT pg_notify('{channel}', left(%(partition_key)s, 200))

-- expired_leases --
-- Running jobs whose lease passed, oldest first (an index probe on the running jobs' lease).
SELECT id, partition_key FROM {job}
WHERE status = '{running}' AND lease_until <= now()
ORDER BY id LIMIT %(limit)s

-- expire_lease_jobs --
-- SPEC §3 Lease expiry: unknown if an effect started, else retry now or failed when the
-- attempts are spent. Re-checks the expiry: a renewal may have landed since the probe.
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
WHERE id = ANY(%(job_ids)s) AND status = '{running}' AND lease_until <= now()
RETURNING id, partition_key, status

-- renew --
-- Extend a lease (fenced); returns the new deadline.
UPDATE {job} SET lease_until = now() + %(lease_seconds)s * interval '1 second'
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
-- What a fenced call that matched nothing ran into: the job's owner, token and whether its
-- lease has expired by the database's clock.
SELECT status, worker_id, lease_token, lease_until <= now() AS expired
FROM {job} WHERE id = %(job_id)s

-- newer_private_waiting --
-- Is the next unresolved job of this partition a private message? (SPEC §4 supersede)
SELECT private_message FROM {job}
WHERE partition_key = %(partition_key)s AND id > %(job_id)s AND {unresolved}
ORDER BY partition_key, id LIMIT 1

-- job_partition --
-- The partition of a job (an operator action locks it before the job).
SELECT partition_key FROM {job} WHERE id = %(job_id)s

-- job_status --
-- A job's status (to say why an operator action was refused).
SELECT status FROM {job} WHERE id = %(job_id)s

-- requeue --
-- failed → queued, attempt 0, due now (an operator's action; the precondition is a parameter).
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
WHERE status = '{unknown}' AND finished_at < now() - %(seconds)s * interval '1 second'

-- completed_past_retention --
-- One batch of completed jobs past retention, oldest first; rows another transaction holds
-- are skipped.
SELECT id FROM {job}
WHERE status = '{completed}' AND finished_at < now() - %(seconds)s * interval '1 second'
ORDER BY finished_at LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- delete_attempts --
-- The history of jobs about to be deleted.
DELETE FROM {attempt} WHERE job_id = ANY(%(job_ids)s)

-- delete_jobs --
-- Jobs past retention (their history deleted first).
DELETE FROM {job} WHERE id = ANY(%(job_ids)s)

-- idle_partitions --
-- Partition rows of chats with no job left. A row an enqueue holds is skipped; an enqueue
-- after the delete simply creates the row again.
SELECT p.key FROM {partition} p
WHERE p.head_state = '{idle}'
  AND NOT EXISTS (SELECT 1 FROM {job} j WHERE j.partition_key = p.key)
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- delete_idle_partitions --
-- Delete those rows, if still idle.
DELETE FROM {partition} WHERE head_state = '{idle}' AND key = ANY(%(keys)s)

-- next_wakeup --
-- The earliest time a claim may find work: a due head or a lease to expire.
SELECT MIN(t) AS wakeup FROM (
    SELECT MIN(head_due_at) AS t FROM {partition} WHERE head_state IN {claimable}
    UNION ALL
    SELECT MIN(lease_until) AS t FROM {job} WHERE status = '{running}'
) AS w

-- now --
-- The database's clock: one clock for every worker host.
SELECT now() AS now

-- count_unresolved --
-- Jobs per unresolved state (few; counted through the status index).
SELECT status, COUNT(*) AS n FROM {job} WHERE {unresolved} GROUP BY status

-- count_completed --
-- Completed jobs, counted exactly (only while the ledger is small: see estimate_jobs).
SELECT COUNT(*) AS n FROM {job} WHERE status = '{completed}'

-- estimate_jobs --
-- The planner's estimate of the job table's rows, so the dashboard never counts a huge ledger.
-- SQLite keeps no such estimate: there the store reports none and completed jobs are counted.
SELECT reltuples::bigint AS n FROM pg_class WHERE oid = '{job}'::regclass

-- due_and_delayed --
-- Queued and retry-waiting jobs whose time has come, and those not yet due.
SELECT COALESCE(SUM(CASE WHEN available_at <= now() THEN 1 ELSE 0 END), 0) AS due,
       COALESCE(SUM(CASE WHEN available_at > now() THEN 1 ELSE 0 END), 0) AS delayed
FROM {job} WHERE status IN {claimable}

-- oldest_due --
-- The due time of the longest-waiting claimable head (how far workers lag).
SELECT MIN(head_due_at) AS due_at FROM {partition}
WHERE head_state IN {claimable} AND head_due_at <= now()

-- blocked_and_running_partitions --
-- How many partitions are blocked (head failed or unknown) and how many are running.
SELECT head_state, COUNT(*) AS n FROM {partition}
WHERE head_state IN ('{failed}', '{unknown}', '{running}') GROUP BY head_state

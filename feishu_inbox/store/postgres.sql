-- The ledger's queries that PostgreSQL runs differently from SQLite; sqlite.sql holds the
-- other side under the same names, and common.sql what both run as it is. A query that exists
-- in one file only says so, and why. What differs everywhere:
--   * many workers on many hosts write at once: row locks, taken partition row first, and
--     FOR UPDATE SKIP LOCKED where a claimer or a sweeper must not wait on another;
--   * the hot operations (enqueue, claim, end of an attempt) are stored functions, one round
--     trip each with plans cached for the session (store/functions/, loaded by migrations);
--   * times are the server's clock, one for every host; NOTIFY wakes idle workers.

-- enqueue --
-- Store an event once, in one round trip: feishu_inbox_enqueue() locks (or creates) the
-- partition row, takes the id under that lock and makes the job its partition's head if the
-- partition was idle (then NOTIFY). Only on PostgreSQL: SQLite runs the same steps one by one
-- (enqueue_partition, enqueue_job, duplicate_of, set_first_head).
SELECT job_id, created, received_at
FROM feishu_inbox_enqueue(%(app)s, %(event_id)s, %(event_type)s, %(dedupe_key)s,
                          %(partition_key)s, %(private_message)s, %(payload)s,
                          %(max_attempts)s, %(trace_parent)s, %(tenant)s)

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

-- finish_together --
-- The finishes of several slots of one worker and each one's next claim, in one statement and
-- one commit (feishu_inbox_finish_together): each fenced on its own, a lost one NULL; the
-- claims of a `runworker --queue` worker only in its queues (%(prefixes)s; NULL: all), those
-- of a `runworker --exclude-queues` worker outside them (%(excluding)s). Only on PostgreSQL:
-- SQLite runs finish_and_claim for each, in one transaction.
SELECT f.finished_id, f.ended_status, c.*
FROM feishu_inbox_finish_together(%(worker_id)s, %(job_ids)s::bigint[], %(tokens)s::text[],
                                  %(partition_keys)s::text[], %(error_types)s::text[],
                                  %(new_tokens)s::text[], %(lease_seconds)s,
                                  %(prefixes)s::text[], %(excluding)s::boolean) f
LEFT JOIN LATERAL (
    SELECT {claimed_columns} FROM (SELECT (f.claimed).*) j WHERE j.id IS NOT NULL
) c ON TRUE

-- finish_batch --
-- A worker's batch (feishu_inbox_finish_batch): the finishes it gathered over its flush window,
-- each fenced on its own (a lost one NULL), and one claim of up to %(limit)s next heads with one
-- token, in one statement and one commit. Rows with a finished_id are the finishes, in their
-- order; the others the claimed jobs. Only on PostgreSQL: SQLite runs the finishes and the
-- claim one by one, in one transaction.
SELECT f.finished_id, f.ended_status, c.*
FROM feishu_inbox_finish_batch(%(worker_id)s, %(job_ids)s::bigint[], %(tokens)s::text[],
                               %(partition_keys)s::text[], %(error_types)s::text[],
                               %(new_token)s, %(limit)s, %(lease_seconds)s,
                               %(prefixes)s::text[], %(excluding)s::boolean) f
LEFT JOIN LATERAL (
    SELECT {claimed_columns} FROM (SELECT (f.claimed).*) j WHERE j.id IS NOT NULL
) c ON TRUE

-- lock_partitions --
-- Lock partition rows in key order (the lock order is always partition, then job), waiting
-- for a holder.
SELECT key FROM {partition} WHERE key IN {keys} ORDER BY key FOR UPDATE

-- lock_free_partitions --
-- Lock the partition rows nobody holds, in key order; rows another transaction holds are
-- skipped (left for the next sweep).
SELECT key FROM {partition} WHERE key IN {keys} ORDER BY key FOR UPDATE SKIP LOCKED

-- notify --
-- Wake idle workers: a head became claimable (delivered at commit).
-- Only on PostgreSQL: SQLite workers poll.
SELECT pg_notify('{channel}', left(%(partition_key)s, 200))

-- completed_past_retention --
-- One batch of completed jobs past retention, oldest first; rows another transaction holds
-- are skipped.
SELECT id FROM {job}
WHERE status = '{completed}' AND finished_at < feishu_inbox_now_plus(-%(seconds)s)
  -- a member of a batch not fired yet stays: its outcome and result are read when it fires
  AND (batch_id IS NULL
       OR NOT EXISTS (SELECT 1 FROM {batch} b WHERE b.id = batch_id AND b.state <> 'fired'))
ORDER BY finished_at LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- idle_partitions --
-- Partition rows of chats with no job left. A row an enqueue holds is skipped; an enqueue
-- after the delete simply creates the row again.
SELECT p.key FROM {partition} p
WHERE p.head_state = '{idle}'
  AND NOT EXISTS (SELECT 1 FROM {job} j WHERE j.partition_key = p.key)
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- estimate_jobs --
-- The planner's estimate of the job table's rows, so the dashboard never counts a huge ledger.
-- Only on PostgreSQL: SQLite keeps no such estimate; there completed jobs are counted.
SELECT reltuples::bigint AS n FROM pg_class WHERE oid = '{job}'::regclass

-- next_job_id --
-- A new receipt sequence for a job a replay moves to the end of its partition.
SELECT nextval(pg_get_serial_sequence('{job}', 'id')) AS id

-- record_step --
-- A step's result, written fenced when its function returns (SPEC §7), in one statement: the
-- row, and the job's has_steps flag so later attempts read the memo. Nothing when the lease is
-- lost, or the step is already recorded (a retry whose first try landed). Its times are
-- clock_timestamp(), not the transaction's now(): steps are ordered by when they started.
WITH fenced AS (
    SELECT id, attempt FROM {job} WHERE {fence}
), flagged AS (
    UPDATE {job} SET has_steps = TRUE
    WHERE id IN (SELECT id FROM fenced) AND NOT has_steps
)
INSERT INTO {step} (job_id, name, attempt, started_at, finished_at, result)
SELECT id, %(name)s, attempt, clock_timestamp() - %(took)s * interval '1 second',
       clock_timestamp(), %(result)s::jsonb
FROM fenced
ON CONFLICT (job_id, name) DO NOTHING
RETURNING id

-- claim_in_queues --
-- claim, for a worker of some queues only (runworker --queue): only partitions whose key
-- starts with one of %(prefixes)s; %(excluding)s (runworker --exclude-queues): only partitions
-- whose key starts with none of them. Only on PostgreSQL: SQLite runs claimable_heads_in_queues,
-- claim_partitions and claim_jobs. A separate function, so the unfiltered claim is untouched.
SELECT {claimed_columns}
FROM feishu_inbox_claim_prefixed(%(worker_id)s, %(token)s, %(lease_seconds)s, %(limit)s,
                                 %(prefixes)s::text[], %(excluding)s::boolean)

-- finish_and_claim_in_queues --
-- finish_and_claim, for a worker of some queues only, or of all but some (see
-- claim_in_queues). Only on
-- PostgreSQL: SQLite runs the finish and claimable_heads_in_queues in one transaction.
SELECT ended.ended_status, claimed.*
FROM (
    SELECT feishu_inbox_end_attempt(%(job_id)s, %(worker_id)s, %(token)s, %(partition_key)s,
                                    FALSE, %(error_type)s, '', 0, 0) AS ended_status
) ended
LEFT JOIN LATERAL (
    SELECT {claimed_columns}
    FROM feishu_inbox_claim_prefixed(%(worker_id)s, %(new_token)s, %(lease_seconds)s,
                                     CASE WHEN ended.ended_status IS NULL THEN 0
                                          ELSE %(limit)s END,
                                     %(prefixes)s::text[], %(excluding)s::boolean)
) claimed ON TRUE

-- clock --
-- The database's clock as it runs (now() is the transaction's start: a rate limit's bucket
-- read inside a caller's own transaction must still see time pass).
SELECT clock_timestamp() AS now

-- take_tokens --
-- One token from each of the buckets %(keys)s (rates %(rates)s per second, bursts %(bursts)s),
-- all or none, in one statement (ledger/buckets.py: take): lock the rows in key order, read
-- the clock once every lock is held (so a take that waited for one counts from then), then
-- refill, take (or count a refusal) and answer the wait: 0 when taken, else the seconds until
-- every bucket could give one (the longest refill or block), and how many rows were found (a
-- bucket seen for the first time has none yet: the caller creates it and takes again).
-- Only on PostgreSQL: SQLite, whose transactions are local, runs the same steps one by one.
WITH wanted AS (
    SELECT * FROM unnest(%(keys)s::text[], %(rates)s::float8[], %(bursts)s::float8[])
        AS w(key, rate, burst)
), locked AS (
    SELECT b.key, b.tokens, b.updated_at, b.blocked_until, w.rate, w.burst
    FROM {rate_bucket} b JOIN wanted w ON w.key = b.key
    ORDER BY b.key
    FOR UPDATE OF b
), stamp AS (
    -- after every lock: count(*) reads all of locked first; a bucket without its row yet
    -- changes nothing (complete is false: the caller creates it and takes again)
    SELECT clock_timestamp() AS now, count(*) AS found,
        count(*) = (SELECT count(*) FROM wanted) AS complete
    FROM locked
), levels AS (
    SELECT l.key, l.rate, l.burst, l.blocked_until, s.now,
        LEAST(l.burst, l.tokens + GREATEST(EXTRACT(EPOCH FROM s.now - l.updated_at), 0) * l.rate)
            AS level
    FROM locked l CROSS JOIN stamp s
), verdict AS (
    SELECT COALESCE(MAX(CASE
        WHEN blocked_until > now THEN EXTRACT(EPOCH FROM blocked_until - now)
        WHEN level >= 1 THEN 0
        ELSE (1 - level) / rate END), 0)::float8 AS wait
    FROM levels
), taken AS (
    UPDATE {rate_bucket} b SET
        tokens = l.level - CASE WHEN v.wait = 0 THEN 1 ELSE 0 END,
        updated_at = GREATEST(l.now, b.updated_at),
        rate = l.rate,
        burst = l.burst,
        taken = b.taken + CASE WHEN v.wait = 0 THEN 1 ELSE 0 END,
        refused = b.refused + CASE WHEN v.wait = 0 THEN 0 ELSE 1 END
    FROM levels l CROSS JOIN verdict v CROSS JOIN stamp s
    WHERE b.key = l.key AND s.complete
)
SELECT v.wait, s.found FROM verdict v CROSS JOIN stamp s

-- lock_signal_key --
-- A signal and a wait of one key take turns (a transaction-scoped advisory lock, released at
-- commit): a wait that finds no kept signal and a signal that finds no open wait can never
-- both miss each other.
SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 7483))

-- insert_wait --
-- A job's wait, open (or already delivered by a kept signal), until %(seconds)s from now
-- (NULL: no time limit). %(payload)s is JSON text.
INSERT INTO {wait} (job_id, name, key, until, state, hold_chat, payload, created_at, resolved_at,
                    partition_key, ask)
VALUES (%(job_id)s, %(name)s, %(key)s,
        CASE WHEN %(seconds)s::float8 IS NULL THEN NULL
             ELSE now() + %(seconds)s::float8 * interval '1 second' END,
        %(state)s, %(hold_chat)s, %(payload)s::jsonb, now(),
        CASE WHEN %(state)s = 'open' THEN NULL ELSE now() END, %(partition_key)s,
        %(ask)s::jsonb)
ON CONFLICT (job_id, name) DO NOTHING
RETURNING id

-- resolve_wait --
-- The exactly-once gate (SPEC §9e): an open wait becomes delivered (a signal's payload, JSON
-- text) or timed_out, by one conditional update; whoever comes second matches nothing.
UPDATE {wait} SET state = %(state)s, payload = %(payload)s::jsonb, resolved_at = now()
WHERE id = %(wait_id)s AND state = 'open'
RETURNING job_id

-- keep_signal --
-- A signal nobody waits for yet, kept %(seconds)s seconds for its waiter.
INSERT INTO {signal} (key, payload, sent_at, expires_at)
VALUES (%(key)s, %(payload)s::jsonb, now(), now() + %(seconds)s * interval '1 second')

-- dead_tuples --
-- The ledger's tables' dead and live row versions (the statistics collector's counts), and
-- when each was last vacuumed: a snapshot held open elsewhere keeps vacuum from removing what
-- the hot path leaves behind. Only on PostgreSQL: SQLite has no MVCC to vacuum.
SELECT relname AS table_name, n_dead_tup AS dead, n_live_tup AS live,
       EXTRACT(epoch FROM greatest(last_vacuum, last_autovacuum))::float AS vacuumed_at
FROM pg_stat_user_tables
WHERE relid IN ('{job}'::regclass, '{partition}'::regclass, '{attempt}'::regclass,
                '{maintenance}'::regclass, '{step}'::regclass, '{rate_bucket}'::regclass,
                '{wait}'::regclass, '{signal}'::regclass, '{schedule}'::regclass)
ORDER BY relname

-- oldest_snapshot --
-- What holds the vacuum horizon of this database back: the oldest transaction or snapshot
-- of any session on it (or a standby's hot_standby_feedback, a replication slot, a prepared
-- transaction), as its age in seconds (sessions only) and in transaction ids. A session of
-- another role shows its xmin only to a role with pg_read_all_stats (pg_monitor).
-- Only on PostgreSQL.
SELECT
  COALESCE((SELECT EXTRACT(epoch FROM max(clock_timestamp() - xact_start))::float
            FROM pg_stat_activity
            WHERE backend_xmin IS NOT NULL AND datname = current_database()
              AND pid <> pg_backend_pid()), 0) AS seconds,
  greatest(
    (SELECT max(age(backend_xmin)) FROM pg_stat_activity
     WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid()
       AND (datname = current_database() OR backend_type = 'walsender')),
    (SELECT max(age(xmin)) FROM pg_replication_slots WHERE xmin IS NOT NULL),
    (SELECT max(age(transaction)) FROM pg_prepared_xacts WHERE database = current_database()),
    0) AS xids

-- replication --
-- Where a commit acknowledged now would survive the primary's loss: the standbys streaming
-- from this server, how many of them confirm commits synchronously (and whether this session
-- waits for them), and how far the furthest behind has flushed (WAL bytes). A role without
-- pg_read_all_stats (pg_monitor) sees the standbys but not their state (NULLs).
-- Only on PostgreSQL.
SELECT
  pg_is_in_recovery() AS in_recovery,
  current_setting('synchronous_commit') AS synchronous_commit,
  current_setting('synchronous_standby_names') AS standby_names,
  (SELECT count(*) FROM pg_stat_replication) AS standbys,
  (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum'))
    AS sync_standbys,
  (SELECT count(*) FROM pg_stat_replication WHERE sync_state IS NULL) AS unreadable,
  CASE WHEN pg_is_in_recovery() THEN 0 ELSE
    (SELECT COALESCE(max(pg_wal_lsn_diff(pg_current_wal_lsn(), flush_lsn)), 0)::bigint
     FROM pg_stat_replication) END AS lag_bytes

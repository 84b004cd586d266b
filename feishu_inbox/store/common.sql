-- The ledger's queries that PostgreSQL and SQLite run as they are. What differs lives in
-- postgres.sql and sqlite.sql, under the same names side by side.
--
-- Placeholders ({job}, {queued}, {fence}, …) come from store/schema.py; parameters are named
-- (%(job_id)s). A list parameter is read through {job_ids} or {keys}: PostgreSQL binds an
-- array (unnest), SQLite binds no arrays, so its store sends a JSON array (json_each).
-- Both databases offer the same clock: now(), and feishu_inbox_now_plus(seconds), now plus
-- that many seconds (PostgreSQL: the server's clock, the function of migration 0005;
-- SQLite: the host's clock, registered by the store on each connection).

-- resync_head --
-- Point a partition (its row locked) at its first non-completed job. The key is bound, not
-- correlated, and the order matches the partial index (partition_key, id): a correlated
-- subquery gets a generic plan that walks the primary key through the whole backlog.
UPDATE {partition} SET
    head_id = head.id,
    head_state = COALESCE(head.status, '{idle}'),
    head_due_at = head.available_at,
    head_priority = COALESCE(head.priority, 0),
    head_tenant = COALESCE(head.tenant, '')
FROM (SELECT NULL) AS anchor
LEFT JOIN (
    SELECT id, status, available_at, priority, tenant FROM {job}
    WHERE partition_key = %(partition_key)s AND {unresolved}
    ORDER BY partition_key, id LIMIT 1
) AS head ON TRUE
WHERE key = %(partition_key)s

-- expired_leases --
-- Running jobs whose lease passed, oldest first: the running jobs through the status index
-- (status, id), as many as the workers' slots, each one's lease checked.
SELECT id, partition_key FROM {job}
WHERE status = '{running}' AND lease_until <= now()
ORDER BY id LIMIT %(limit)s

-- renew --
-- Extend a lease (fenced); returns the new deadline.
UPDATE {job} SET lease_until = feishu_inbox_now_plus(%(lease_seconds)s)
WHERE {fence}
RETURNING lease_until

-- begin_effect --
-- Persist "an effect is in flight" before the effect starts (fenced), unless a newer private
-- message supersedes this job (SPEC §4: entering an effect in a superseded job is refused).
-- The worker writes the count as a value (%(in_flight)s), not an increment: a retry after a
-- lost reply cannot count one effect twice (the lease holder is its job's only writer).
-- NULL increments it instead (a caller that does not count).
-- An idempotent effect (%(until_seconds)s: its window less the margin; NULL for an effect
-- without a key) narrows the job's window to its own deadline, and is refused once the job
-- re-issues effects past its window (a re-send might no longer be deduplicated): the job
-- then ends unknown. It returns the replay generation, part of the effect's key.
UPDATE {job} SET effects_in_flight = COALESCE(%(in_flight)s, effects_in_flight + 1),
    side_effect_started = TRUE,
    idempotent_until = {idempotent_until_after_begin},
    idempotent_since = CASE WHEN %(until_seconds)s IS NULL THEN idempotent_since
                            ELSE COALESCE(idempotent_since, now()) END,
    idempotent_effect = COALESCE(%(name)s, idempotent_effect),
    idempotent_window = COALESCE(%(window)s, idempotent_window)
WHERE {fence} AND NOT cancel_requested AND NOT ({superseded})
  AND (%(until_seconds)s IS NULL OR NOT side_effect_started OR idempotent_until IS NULL
       OR idempotent_until > now())
RETURNING id, replays

-- end_effect --
-- Record an effect as finished, or uncertain when it raised (fenced; one must be in flight).
-- A value, as in begin_effect (a retry changes nothing more), or NULL to decrement.
UPDATE {job} SET effects_in_flight = COALESCE(%(in_flight)s, effects_in_flight - 1),
                 effect_uncertain = (effect_uncertain OR %(uncertain)s)
WHERE {fence} AND effects_in_flight > COALESCE(%(in_flight)s - 1, 0)
RETURNING id

-- hand_back --
-- Return a job that started no effect to the queue, due in %(delay)s seconds, giving its
-- attempt back (fenced); one an operator cancelled meanwhile is completed instead. A job whose
-- every effect is idempotent, settled and inside its window (a retried job that has not
-- re-issued it yet) may go back too: it re-issues them with the same keys. Why it went back:
-- the worker shut down (HandedBack), or it waits for a rate limit (RateLimited).
UPDATE {job} SET
    status = CASE WHEN cancel_requested THEN '{completed}'
                  WHEN attempt > 1 THEN '{retry_wait}' ELSE '{queued}' END,
    attempt = attempt - 1, available_at = feishu_inbox_now_plus(%(delay)s),
    finished_at = CASE WHEN cancel_requested THEN now() ELSE finished_at END,
    error_type = CASE WHEN cancel_requested THEN 'Cancelled' ELSE %(error_type)s END,
    error_message = %(message)s,
    lease_token = '', lease_until = NULL
WHERE {fence} AND NOT ({effect_started} AND NOT (
    {reissuable_now} AND idempotent_until > feishu_inbox_now_plus(%(delay)s)))
RETURNING status

-- lease_state --
-- What a fenced call that matched nothing ran into: the job's owner, token, whether its
-- lease has expired by the database's clock, whether an operator cancelled it, and whether
-- its idempotency window has passed.
SELECT status, worker_id, lease_token, lease_until <= now() AS expired, cancel_requested,
       idempotent_until <= now() AS window_passed
FROM {job} WHERE id = %(job_id)s

-- job_partition --
-- The partition of a job (an operator action locks it before the job).
SELECT partition_key FROM {job} WHERE id = %(job_id)s

-- job_status --
-- A job's status (to say why an operator action was refused).
SELECT status FROM {job} WHERE id = %(job_id)s

-- run_again --
-- An operator's "run it again" (requeue a failed job; reconcile an unknown one as not
-- applied): queued, attempt 0, due now, effect flags cleared (a failed job has none). The
-- precondition is a parameter: the ledger says which state each action starts from.
-- Idempotent effects keep their keys (a re-send the operator was wrong about is still
-- deduplicated) and get a new window.
UPDATE {job} SET status = '{queued}', attempt = 0, available_at = now(), finished_at = NULL,
    effects_in_flight = 0, side_effect_started = FALSE, effect_uncertain = FALSE,
    idempotent_until = NULL, idempotent_since = NULL,
    cancel_requested = FALSE, error_type = '', error_message = '', resolution = %(resolution)s
WHERE id = %(job_id)s AND status IN {statuses}
RETURNING partition_key, status

-- mark_done --
-- An operator's "consider it done" (discard a failed job; reconcile an unknown one as
-- applied): completed, its partition unblocked. No effect is in flight or uncertain any more:
-- the operator settled it (side_effect_started stays, for the record).
UPDATE {job} SET status = '{completed}', finished_at = now(), resolution = %(resolution)s,
    effects_in_flight = 0, effect_uncertain = FALSE
WHERE id = %(job_id)s AND status IN {statuses}
RETURNING partition_key, status

-- expire_unknown --
-- unknown → completed (UnknownExpired) after the unknown retention. Its completed retention
-- starts now (finished_at), so its history stays as long as any completed job's.
UPDATE {job} SET status = '{completed}', finished_at = now(), error_type = 'UnknownExpired',
    error_message = %(message)s, resolution = %(resolution)s
WHERE id = %(job_id)s AND status IN {statuses}
RETURNING partition_key, status

-- cancel --
-- An operator's cancel: a job that has not run yet (queued, waiting to retry) or that waits
-- (SPEC §9e) completes now as Cancelled; a running one is asked to stop (its handler stops at its next checkpoint or
-- effect, and however its attempt ends it is not retried). Every right-hand side reads the
-- row as it was.
UPDATE {job} SET
    status = CASE WHEN status = '{running}' THEN status ELSE '{completed}' END,
    finished_at = CASE WHEN status = '{running}' THEN finished_at ELSE now() END,
    error_type = CASE WHEN status = '{running}' THEN error_type ELSE 'Cancelled' END,
    error_message = CASE WHEN status = '{running}' THEN error_message
                         WHEN status = '{waiting}' THEN 'Cancelled by an operator while it waited.'
                         ELSE 'Cancelled by an operator before it ran.' END,
    cancel_requested = (status = '{running}'),
    resolution = CASE WHEN status = '{running}' THEN resolution ELSE %(resolution)s END
WHERE id = %(job_id)s AND status IN {statuses}
RETURNING partition_key, status

-- replay_duplicate --
-- Another live job of the same event (its event id or dedupe key, of the same tenant: another
-- tenant's job of the same key is another event), which a replay must not run beside.
SELECT other.id FROM {job} other, {job} this
WHERE this.id = %(job_id)s AND other.app = this.app AND other.tenant = this.tenant
  AND other.id <> this.id
  AND (other.event_id = this.event_id OR other.dedupe_key = this.dedupe_key)
  AND NOT (other.status = '{completed}')
LIMIT 1

-- replay_later_ran --
-- Has a later job of the partition run (been claimed, or has a history: a job replayed before
-- this one, in the same batch or not)? Then a replay goes to the end, after it, and replayed
-- jobs keep their receipt order among themselves.
SELECT later.id FROM {job} later
WHERE later.partition_key = %(partition_key)s AND later.id > %(job_id)s
  AND (later.status <> '{queued}' OR later.attempt > 0
       OR EXISTS (SELECT 1 FROM {attempt} a WHERE a.job_id = later.id))
LIMIT 1

-- move_job --
-- Give a job a new receipt sequence (its id): it becomes the newest of its partition. Its
-- history moves with it; the foreign keys are checked at commit.
UPDATE {job} SET id = %(new_id)s WHERE id = %(job_id)s

-- move_attempts --
-- The moved job's history follows it.
UPDATE {attempt} SET job_id = %(new_id)s WHERE job_id = %(job_id)s

-- replay --
-- completed → queued, attempt 0, due now, effect flags and error cleared; its history stays.
-- A new replay generation: its idempotent effects get new keys, so they happen again.
UPDATE {job} SET status = '{queued}', attempt = 0, available_at = now(), finished_at = NULL,
    effects_in_flight = 0, side_effect_started = FALSE, effect_uncertain = FALSE,
    idempotent_until = NULL, idempotent_since = NULL, replays = replays + 1,
    cancel_requested = FALSE, error_type = '', error_message = '', resolution = %(resolution)s
WHERE id = %(job_id)s AND status = '{completed}'
RETURNING partition_key, status

-- job_signals --
-- For each running job of a worker: has an operator cancelled it, is it superseded (SPEC §4)?
-- The worker asks at least twice a second, in one statement for all its jobs.
SELECT j.id, j.cancel_requested,
    (%(interrupt_private)s AND j.private_message AND COALESCE(
        (SELECT private_message FROM {job}
         WHERE partition_key = j.partition_key AND id > j.id AND {unresolved}
         ORDER BY partition_key, id LIMIT 1), FALSE)) AS superseded
FROM {job} j
WHERE j.id IN {job_ids} AND j.status = '{running}'

-- unknown_past_retention --
-- Unknown jobs that ended longer ago than the unknown retention.
SELECT id FROM {job}
WHERE status = '{unknown}' AND finished_at < feishu_inbox_now_plus(-%(seconds)s)

-- next_wakeup --
-- The earliest time a claim may find work: a due head, a lease to expire or a wait's time.
SELECT MIN(t) AS wakeup FROM (
    SELECT MIN(head_due_at) AS t FROM {partition} WHERE head_state IN {claimable}
    UNION ALL
    SELECT MIN(lease_until) AS t FROM {job} WHERE status = '{running}'
    UNION ALL
    SELECT MIN(until) AS t FROM {wait} WHERE state = 'open'
) AS w

-- turn_behind --
-- The database's clock and the unresolved jobs after a turn's first message in its chat, in
-- receipt order (SPEC §9g): one round trip, through the partition's index of unresolved jobs.
SELECT clock.now AS now, j.id, j.event_type, j.payload, j.received_at, j.status
FROM (SELECT now() AS now) AS clock
LEFT JOIN (
    SELECT id, event_type, payload, received_at, status FROM {job}
    WHERE partition_key = %(partition_key)s AND id > %(job_id)s AND {unresolved}
    ORDER BY partition_key, id LIMIT %(limit)s
) AS j ON TRUE

-- now --
-- The database's clock: one clock for every worker host.
SELECT now() AS now

-- count_unresolved --
-- Jobs per unresolved state (few; counted through the status index).
SELECT status, COUNT(*) AS n FROM {job} WHERE {unresolved} GROUP BY status

-- count_completed --
-- Completed jobs, counted exactly (only while the ledger is small: see estimate_jobs).
SELECT COUNT(*) AS n FROM {job} WHERE status = '{completed}'

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

-- record_attempts --
-- A history row for each job's attempt that just ended (run after the job's update).
-- %(number_offset)s is 1 when the attempt was handed back (its number was given back);
-- %(token)s is the lease token of the worker that ended it ('' when its lease expired).
INSERT INTO {attempt} (job_id, number, worker_id, started_at, ended_at, outcome,
                       error_type, error_message, lease_token)
SELECT id, attempt + %(number_offset)s, worker_id, COALESCE(claimed_at, now()), now(), status,
       error_type, error_message, %(token)s
FROM {job} WHERE id IN {job_ids}

-- delete_attempts --
-- The history of jobs about to be deleted.
DELETE FROM {attempt} WHERE job_id IN {job_ids}

-- delete_jobs --
-- Jobs past retention (their history deleted first).
DELETE FROM {job} WHERE id IN {job_ids}

-- expire_lease_jobs --
-- SPEC §3 Lease expiry: unknown if an effect started (unless every effect it started is
-- idempotent and inside its window: then it re-issues them), completed if an operator
-- cancelled it, failed (WorkerCrashed) when its attempts are spent, else it runs again now.
-- Re-checks the expiry: a renewal may have landed since the probe.
UPDATE {job} SET
    status = {status_after_failure},
    error_type = CASE {status_after_failure}
        WHEN '{unknown}' THEN 'LeaseExpiredAfterSideEffect'
        WHEN '{completed}' THEN 'Cancelled'
        WHEN '{failed}' THEN 'WorkerCrashed'
        ELSE 'LeaseExpired' END,
    {settle_after_failure},
    error_message = 'The worker ' || worker_id || ' stopped renewing its lease (it crashed, '
        || 'was killed, or was paused past the lease) on attempt ' || attempt || '.',
    available_at = now(),
    finished_at = now(),
    lease_token = '', lease_until = NULL
WHERE id IN {job_ids} AND status = '{running}' AND lease_until <= now()
RETURNING id, partition_key, status

-- delete_idle_partitions --
-- Delete those rows, if still idle.
DELETE FROM {partition} WHERE head_state = '{idle}' AND key IN {keys}

-- ended_with --
-- How the attempt of this lease ended, if it did: a worker whose end-of-attempt write lost
-- its reply (the connection broke) retries it, finds the fence closed, and learns here that
-- its first try landed.
SELECT outcome AS status FROM {attempt}
WHERE job_id = %(job_id)s AND lease_token = %(token)s AND lease_token <> ''
ORDER BY id DESC LIMIT 1

-- claimed_with --
-- The jobs a claim with this token took: a claim whose reply was lost is retried with the
-- same token and finds them here instead of leaving them to lease expiry. A lease that has
-- expired meanwhile (not yet swept) is no longer the worker's to run.
SELECT {claimed_columns} FROM {job}
WHERE status = '{running}' AND worker_id = %(worker_id)s AND lease_token = %(token)s
  AND lease_until > now()

-- ensure_chore --
-- The row of a shared chore (the retention purge), due at once when new.
INSERT INTO {maintenance} (name, due_at, worker_id, last_result)
VALUES (%(name)s, now(), '', '')
ON CONFLICT (name) DO NOTHING

-- claim_chore --
-- Take a chore that is due: one worker wins and moves it %(interval)s seconds forward.
UPDATE {maintenance} SET due_at = feishu_inbox_now_plus(%(interval)s), worker_id = %(worker_id)s
WHERE name = %(name)s AND due_at <= now()
RETURNING name

-- record_chore --
-- What the chore's last run did (shown to operators).
UPDATE {maintenance} SET last_result = %(result)s WHERE name = %(name)s

-- job_steps --
-- The memoized steps of a job: a new attempt returns these results instead of running them.
SELECT name, result FROM {step} WHERE job_id = %(job_id)s

-- step_attempt --
-- Whether (and by which attempt) a step of this job is recorded.
SELECT attempt FROM {step} WHERE job_id = %(job_id)s AND name = %(name)s

-- forget_steps --
-- An operator's "from this step": it and every step that started after it, or at the same
-- instant, are forgotten; earlier ones stay memoized.
DELETE FROM {step}
WHERE job_id = %(job_id)s
  AND started_at >= (SELECT started_at FROM {step} WHERE job_id = %(job_id)s AND name = %(from_step)s)

-- delete_steps --
-- The steps of jobs about to be deleted (retention).
DELETE FROM {step} WHERE job_id IN {job_ids}

-- move_steps --
-- A replayed job's steps follow it to its new id.
UPDATE {step} SET job_id = %(new_id)s WHERE job_id = %(job_id)s

-- card_stream --
-- A streamed reply of a job's current replay generation (feishu/streams.py), or nothing.
SELECT s.card_id, s.element_id, s.message_id, s.sequence, s.text, s.marked, s.streaming,
       s.streaming_since, s.closed
FROM {card_stream} s JOIN {job} j ON j.id = s.job_id AND s.generation = j.replays
WHERE s.job_id = %(job_id)s AND s.name = %(name)s

-- save_card_stream --
-- A streamed reply's state, written fenced before each card operation leaves (and after the
-- card is created or sent): one statement, the same values when a retry repeats it.
INSERT INTO {card_stream} (job_id, generation, name, card_id, element_id, message_id, sequence,
                           text, marked, streaming, streaming_since, closed, attempt, updated_at)
SELECT id, replays, %(name)s, %(card_id)s, %(element_id)s, %(message_id)s, %(sequence)s,
       %(text)s, %(marked)s, %(streaming)s, %(streaming_since)s, %(closed)s, attempt, now()
FROM {job} WHERE {fence}
ON CONFLICT (job_id, generation, name) DO UPDATE SET
    card_id = excluded.card_id, element_id = excluded.element_id,
    message_id = excluded.message_id, sequence = excluded.sequence, text = excluded.text,
    marked = excluded.marked, streaming = excluded.streaming,
    streaming_since = excluded.streaming_since, closed = excluded.closed,
    attempt = excluded.attempt, updated_at = excluded.updated_at
RETURNING id

-- delete_card_streams --
-- The streamed replies of jobs about to be deleted (retention).
DELETE FROM {card_stream} WHERE job_id IN {job_ids}

-- forget_waits_of_key --
-- A replayed parent's waits for its children (SPEC §9f, their keys' prefix): its new run
-- spawns a new generation and waits for it afresh, whatever the wait's name.
DELETE FROM {wait} WHERE job_id = %(job_id)s AND key LIKE %(prefix)s

-- forget_step --
-- A replayed workflow job's result (SPEC §9f): its new run records its own.
DELETE FROM {step} WHERE job_id = %(job_id)s AND name = %(name)s

-- move_children --
-- A replayed parent's children follow it to its new id: its tree keeps every generation
-- (SPEC §9f; its earlier batches keep the old id, as history).
UPDATE {job} SET parent_id = %(new_id)s WHERE parent_id = %(job_id)s

-- move_card_streams --
-- A replayed job's streamed replies follow it to its new id (as history: a new generation
-- streams into a new card).
UPDATE {card_stream} SET job_id = %(new_id)s WHERE job_id = %(job_id)s

-- ensure_schedule --
-- The row of a declared schedule, created the first time anything looks at it. Its watermark
-- starts at %(now)s (a whole second): a schedule never catches up on occurrences from before it
-- was first seen.
INSERT INTO {schedule} (name, watermark, paused, last_fired_at, last_job_id, created_at)
VALUES (%(name)s, %(now)s, FALSE, NULL, NULL, %(now)s)
ON CONFLICT (name) DO NOTHING

-- schedule_states --
-- The watermark, paused flag and last job of these schedules (a tick, the admin, the CLI).
SELECT name, watermark, paused, last_fired_at, last_job_id FROM {schedule}
WHERE name IN {keys}

-- advance_schedule --
-- Compare-and-set of a schedule's watermark, from the value this worker read to the last
-- occurrence it is about to enqueue in the same transaction. Of the workers that read one
-- watermark exactly one matches (PostgreSQL: the others wait on the row lock, then find the
-- watermark moved; SQLite: one writer at a time); the rest enqueue nothing. Never backwards,
-- never while paused.
UPDATE {schedule} SET watermark = %(new)s, last_fired_at = %(now)s
WHERE name = %(name)s AND watermark = %(old)s AND %(new)s > watermark AND NOT paused
RETURNING name

-- record_schedule_job --
-- The schedule's last job (shown to operators with its state), in the transaction that
-- enqueued it.
UPDATE {schedule} SET last_job_id = %(job_id)s, last_fired_at = %(now)s
WHERE name = %(name)s

-- set_schedule_paused --
-- Pause or resume a schedule; nothing when it already is. The watermark stays where it was,
-- so a resumed schedule meets its missed occurrences and its catch-up policy decides.
UPDATE {schedule} SET paused = %(paused)s
WHERE name = %(name)s AND paused <> %(paused)s
RETURNING name

-- defer_and_rank_job --
-- A django.tasks task enqueued with run_after or a priority (feishu_inbox/tasks/), in its
-- enqueue's transaction: the job just stored waits until then (NULL: it is due now) and
-- carries its priority.
UPDATE {job} SET available_at = COALESCE(%(run_after)s, available_at), priority = %(priority)s
WHERE id = %(job_id)s AND status = '{queued}' AND attempt = 0

-- defer_and_rank_head --
-- ... and so does its partition, when that job is the partition's head (the claim reads the
-- head's due time and priority from the partition row).
UPDATE {partition} SET head_due_at = COALESCE(%(run_after)s, head_due_at),
    head_priority = %(priority)s
WHERE key = %(partition_key)s AND head_id = %(job_id)s

-- next_wakeup_in_queues --
-- next_wakeup, for a worker of some queues only (runworker --queue): due heads of the
-- partitions whose key starts with one of the prefixes (%(excluding)s, runworker
-- --exclude-queues: with none of them), a lease to expire or a wait's time.
SELECT MIN(t) AS wakeup FROM (
    SELECT MIN(p.head_due_at) AS t FROM {partition} p
    WHERE p.head_state IN {claimable}
      AND EXISTS (SELECT 1 FROM {prefixes} q WHERE substr(p.key, 1, length(q.prefix)) = q.prefix)
          <> %(excluding)s
    UNION ALL
    SELECT MIN(lease_until) AS t FROM {job} WHERE status = '{running}'
    UNION ALL
    SELECT MIN(until) AS t FROM {wait} WHERE state = 'open'
) AS w

-- partitions_of_jobs --
-- The partitions of these jobs (an operator's pause locks them before the jobs).
SELECT DISTINCT partition_key FROM {job} WHERE id IN {job_ids}

-- hold_jobs --
-- An operator paused them: due at %(until)s (far away, or now on resume). Queued and waiting
-- jobs only: a running one finishes, and its partition's next head is held then.
UPDATE {job} SET available_at = %(until)s
WHERE id IN {job_ids} AND status IN {claimable}
RETURNING id

-- enter_wait --
-- A running job starts to wait (SPEC §9e), fenced: `waiting`, its lease cleared and its
-- attempt given back (as hand_back). Refused (nothing matched) while an effect is in flight
-- or uncertain, or once an operator cancelled it. The effects this attempt finished were each
-- inside a recorded step (the handler API refuses a wait otherwise), so a resumed run repeats
-- none of them: the job may be claimed again, and its effect flags and window are cleared
-- (SPEC invariant 3, as waits reword it). An effect an earlier attempt started (an
-- idempotent one: any other leaves no later attempt) is no reason to refuse: this attempt ran
-- the same handler to the same wait without an effect outside a step, so that effect was
-- inside a step too, which this attempt either found recorded or ran again (the same key,
-- settled now: not uncertain). A job that gives its chat back moves to a partition of its
-- own (%(parked_key)s; NULL: it holds it).
UPDATE {job} SET status = '{waiting}', attempt = attempt - 1, available_at = now(),
    side_effect_started = FALSE, idempotent_until = NULL, idempotent_since = NULL,
    error_type = 'Waiting', error_message = %(message)s,
    lease_token = '', lease_until = NULL,
    partition_key = COALESCE(%(parked_key)s, partition_key)
WHERE {fence} AND NOT {effect_open} AND NOT cancel_requested
RETURNING status

-- job_wait --
-- A job's wait of this name (its memo): its state and payload, if the job ever waited so.
SELECT id, key, state, payload, until, partition_key, hold_chat, created_at, resolved_at
FROM {wait} WHERE job_id = %(job_id)s AND name = %(name)s

-- take_kept_signal --
-- The oldest unexpired signal kept for a key, taken (deleted) by the job that waits for it.
DELETE FROM {signal} WHERE id = (
    SELECT id FROM {signal} WHERE key = %(key)s AND expires_at > now() ORDER BY key, id LIMIT 1
)
RETURNING payload

-- waiter_of_key --
-- The open wait of a key that a signal resolves: the oldest, if several wait for it.
SELECT id, job_id, key, partition_key FROM {wait}
WHERE key = %(key)s AND state = 'open' ORDER BY id LIMIT 1

-- question_of_key --
-- The card question of a key (feishu_inbox.ask), whatever its state: a click decides an open
-- one, and a second or late click is told what became of it. The newest, if ever several.
SELECT id, job_id, key, partition_key, state, ask FROM {wait}
WHERE key = %(key)s AND ask IS NOT NULL ORDER BY id DESC LIMIT 1

-- open_wait_of_job --
-- The open wait of a job (a job waits for one thing at a time), for an operator's action.
SELECT id, job_id, key, partition_key FROM {wait}
WHERE job_id = %(job_id)s AND state = 'open' ORDER BY id DESC LIMIT 1

-- wait_by_id --
-- A wait, to resolve it (its key and chat tell what to lock first).
SELECT id, job_id, key, partition_key FROM {wait} WHERE id = %(wait_id)s

-- resume_job --
-- A waiting job whose wait was resolved goes back to its place in its chat (its receipt
-- sequence, its id, is unchanged): queued (retry_wait when it had attempts before), due now.
UPDATE {job} SET status = CASE WHEN attempt > 0 THEN '{retry_wait}' ELSE '{queued}' END,
    available_at = now(), error_type = '', error_message = '',
    partition_key = %(partition_key)s
WHERE id = %(job_id)s AND status = '{waiting}'
RETURNING partition_key

-- ensure_partition --
-- A resumed job's chat may have gone idle and been purged meanwhile: its row again.
INSERT INTO {partition} (key, head_id, head_state, head_due_at)
VALUES (%(partition_key)s, NULL, '{idle}', NULL)
ON CONFLICT (key) DO NOTHING

-- resync_head_unless_running --
-- resync_head, unless the chat's head is running: a job that resumes while a later job of its
-- chat runs (it gave the chat back) becomes the head when that one ends (its end's resync
-- finds it first), never beside it.
UPDATE {partition} SET
    head_id = head.id,
    head_state = COALESCE(head.status, '{idle}'),
    head_due_at = head.available_at,
    head_priority = COALESCE(head.priority, 0),
    head_tenant = COALESCE(head.tenant, '')
FROM (SELECT NULL) AS anchor
LEFT JOIN (
    SELECT id, status, available_at, priority, tenant FROM {job}
    WHERE partition_key = %(partition_key)s AND {unresolved}
    ORDER BY partition_key, id LIMIT 1
) AS head ON TRUE
WHERE key = %(partition_key)s AND head_state <> '{running}'

-- next_wait_deadline --
-- The earliest time an open wait times out.
SELECT MIN(until) AS until FROM {wait} WHERE state = 'open'

-- due_waits --
-- Open waits whose time came, oldest deadline first (each is then resolved in a transaction
-- of its own, whose conditional update lets one resolver win).
SELECT id FROM {wait} WHERE state = 'open' AND until <= now()
ORDER BY until LIMIT %(limit)s

-- purge_expired_signals --
-- Signals kept past their time, which no waiter took.
DELETE FROM {signal} WHERE expires_at <= now()

-- cancel_waits --
-- An operator cancelled a waiting job: its open waits close, so no signal is spent on it.
UPDATE {wait} SET state = 'cancelled', resolved_at = now()
WHERE job_id = %(job_id)s AND state = 'open'
RETURNING partition_key

-- restore_partition --
-- A cancelled job that had given its chat back returns to it (completed: its head is unmoved).
UPDATE {job} SET partition_key = %(partition_key)s WHERE id = %(job_id)s

-- delete_waits --
-- The waits of jobs about to be deleted (retention).
DELETE FROM {wait} WHERE job_id IN {job_ids}

-- move_waits --
-- A replayed job's waits follow it to its new id, as its steps do.
UPDATE {wait} SET job_id = %(new_id)s WHERE job_id = %(job_id)s

-- forget_waits --
-- An operator's "from this step": the waits that began with it or after it are forgotten too.
DELETE FROM {wait}
WHERE job_id = %(job_id)s
  AND created_at >= (SELECT started_at FROM {step} WHERE job_id = %(job_id)s AND name = %(from_step)s)

-- waits_of_jobs --
-- The latest wait of each of these jobs (admin, inbox list and show).
SELECT w.job_id, w.name, w.key, w.state, w.until, w.created_at, w.resolved_at,
       w.partition_key, w.hold_chat
FROM {wait} w
WHERE w.job_id IN {job_ids}
  AND w.id = (SELECT MAX(id) FROM {wait} x WHERE x.job_id = w.job_id)

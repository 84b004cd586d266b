"""The one place where table names, status strings and shared SQL fragments are spelled.

Python code imports the constants; the ``.sql`` files (queries and stored functions) name them
as ``{placeholders}`` that ``queries.render`` fills in from ``SQL_NAMES``. A name that is not
here is an error when the file is loaded, never a silent typo in production.
"""

from __future__ import annotations

from ..models import (
    Attempt,
    EventJob,
    Maintenance,
    Partition,
    PartitionState,
    Schedule,
    Status,
    Step,
)

JOB_TABLE = EventJob._meta.db_table
PARTITION_TABLE = Partition._meta.db_table
ATTEMPT_TABLE = Attempt._meta.db_table
MAINTENANCE_TABLE = Maintenance._meta.db_table
STEP_TABLE = Step._meta.db_table
SCHEDULE_TABLE = Schedule._meta.db_table
#: The LISTEN/NOTIFY channel a claimable head is announced on (PostgreSQL).
NOTIFY_CHANNEL = "feishu_inbox"
#: The NOTIFY payload saying a schedule was paused or resumed: workers look at their schedules
#: again at once. (Other payloads are partition keys, which the webhook's always give with a
#: colon; a site's own key spelled like this would only cost the workers one extra look.)
SCHEDULES_NOTICE = "feishu_inbox.schedules"

QUEUED = Status.QUEUED.value
RUNNING = Status.RUNNING.value
RETRY_WAIT = Status.RETRY_WAIT.value
COMPLETED = Status.COMPLETED.value
FAILED = Status.FAILED.value
UNKNOWN = Status.UNKNOWN.value
IDLE = PartitionState.IDLE.value

#: The columns a claim returns (``ledger.ClaimedJob.from_row`` reads them by name).
CLAIMED_COLUMNS = (
    "id, event_id, event_type, app, payload, private_message, attempt, partition_key, "
    "lease_until, has_steps"
)

#: SPEC §3 Effects: once any effect started the job is never retried automatically.
EFFECT_STARTED = "(side_effect_started OR effects_in_flight > 0 OR effect_uncertain)"
#: A job's attempts: its own (its handler's policy), else the site's (%(max_attempts)s).
ATTEMPTS_SPENT = "attempt >= COALESCE(max_attempts, %(max_attempts)s)"
STATUS_AFTER_FAILURE = (
    f"CASE WHEN {EFFECT_STARTED} THEN '{UNKNOWN}' WHEN cancel_requested THEN '{COMPLETED}' "
    f"WHEN {ATTEMPTS_SPENT} THEN '{FAILED}' ELSE '{RETRY_WAIT}' END"
)
#: Written exactly as the partial index's predicate: SQLite uses a partial index only when
#: the query's WHERE names its condition in the same textual form.
UNRESOLVED = f"NOT (status = '{COMPLETED}')"
#: Is the next unresolved job of the partition %(partition_key)s after %(job_id)s a private
#: message? (unqualified names: in a subquery they resolve to its own table).
NEXT_IS_PRIVATE = (
    f"(SELECT private_message FROM {JOB_TABLE} WHERE partition_key = %(partition_key)s "
    f"AND id > %(job_id)s AND {UNRESOLVED} ORDER BY partition_key, id LIMIT 1)"
)

SQL_NAMES: dict[str, str] = {
    # tables
    "job": JOB_TABLE,
    "partition": PARTITION_TABLE,
    "attempt": ATTEMPT_TABLE,
    "maintenance": MAINTENANCE_TABLE,
    "step": STEP_TABLE,
    "schedule": SCHEDULE_TABLE,
    "channel": NOTIFY_CHANNEL,
    # statuses (the partition's head_state uses the same words, plus idle)
    "queued": QUEUED,
    "running": RUNNING,
    "retry_wait": RETRY_WAIT,
    "completed": COMPLETED,
    "failed": FAILED,
    "unknown": UNKNOWN,
    "idle": IDLE,
    "claimable": f"('{QUEUED}', '{RETRY_WAIT}')",
    "unresolved": UNRESOLVED,
    "next_is_private": NEXT_IS_PRIVATE,
    # SPEC §4: a private job is superseded when the next unresolved job of its chat is a
    # private message too (and the site lets private messages interrupt).
    "superseded": (
        f"%(interrupt_private)s AND private_message AND COALESCE({NEXT_IS_PRIVATE}, FALSE)"
    ),
    "effect_started": EFFECT_STARTED,
    # A handler that returns with an effect in flight or uncertain ends `unknown`.
    "effect_open": "(effects_in_flight > 0 OR effect_uncertain)",
    # Every call of a lease holder: its job, still running, still its own, lease not expired.
    "fence": (
        f"id = %(job_id)s AND status = '{RUNNING}' AND worker_id = %(worker_id)s "
        "AND lease_token = %(token)s AND lease_until > now()"
    ),
    # Where an attempt that failed (or whose lease expired, or was handed back) leaves its
    # job (SPEC §3 Fail): an effect started → unknown; an operator cancelled it → completed;
    # its attempts spent → failed; else it runs again.
    "status_after_failure": STATUS_AFTER_FAILURE,
    "attempts_spent": ATTEMPTS_SPENT,
    "error_after_failure": (
        f"CASE WHEN {EFFECT_STARTED} THEN %(error_type)s WHEN cancel_requested THEN 'Cancelled' "
        "ELSE %(error_type)s END"
    ),
    "claimed_columns": CLAIMED_COLUMNS,
    "uncertain_message": (
        "'An effect was in flight or raised when the handler ended; check whether it "
        "happened, then reconcile.'"
    ),
}

"""The one place where table names, status strings and shared SQL fragments are spelled.

Python code imports the constants; the ``.sql`` files (queries and stored functions) name them
as ``{placeholders}`` that ``queries.render`` fills in from ``SQL_NAMES``. A name that is not
here is an error when the file is loaded, never a silent typo in production.
"""

from __future__ import annotations

from ..models import (
    Attempt,
    CardStream,
    EventJob,
    Maintenance,
    Partition,
    PartitionState,
    RateBucket,
    Schedule,
    Status,
    Step,
)
from ..tables.batches import Batch, BatchEvent
from ..tables.tenants import TenantWeight
from ..waiting import Signal, Wait

JOB_TABLE = EventJob._meta.db_table
PARTITION_TABLE = Partition._meta.db_table
ATTEMPT_TABLE = Attempt._meta.db_table
MAINTENANCE_TABLE = Maintenance._meta.db_table
STEP_TABLE = Step._meta.db_table
CARD_STREAM_TABLE = CardStream._meta.db_table
RATE_BUCKET_TABLE = RateBucket._meta.db_table
SCHEDULE_TABLE = Schedule._meta.db_table
WAIT_TABLE = Wait._meta.db_table
SIGNAL_TABLE = Signal._meta.db_table
BATCH_TABLE = Batch._meta.db_table
BATCH_EVENT_TABLE = BatchEvent._meta.db_table
TENANT_WEIGHT_TABLE = TenantWeight._meta.db_table
#: The LISTEN/NOTIFY channel a claimable head is announced on (PostgreSQL).
NOTIFY_CHANNEL = "feishu_inbox"
#: The NOTIFY payload saying a schedule was paused or resumed: workers look at their schedules
#: again at once. (Other payloads are partition keys, which the webhook's always give with a
#: colon; a site's own key spelled like this would only cost the workers one extra look.)
SCHEDULES_NOTICE = "feishu_inbox.schedules"
#: The NOTIFY payload a stopping worker sends so that its own listener wakes and ends at once
#: (other workers ignore it).
STOPPING_NOTICE = "feishu_inbox.stopping"
#: The NOTIFY payload of a batch member that ended (a row trigger sends it, SPEC §9f), or of a
#: batch closed: workers fold the batches' events and fire what is done at once.
BATCHES_NOTICE = "feishu_inbox.batches"

#: The prefix of a listener's probe (``listener.py``): a NOTIFY it sends itself, to learn that
#: notices reach it. Every listener ignores the others'.
PROBE_NOTICE = "feishu_inbox.probe:"

QUEUED = Status.QUEUED.value
RUNNING = Status.RUNNING.value
RETRY_WAIT = Status.RETRY_WAIT.value
COMPLETED = Status.COMPLETED.value
FAILED = Status.FAILED.value
UNKNOWN = Status.UNKNOWN.value
WAITING = Status.WAITING.value
IDLE = PartitionState.IDLE.value

#: The columns a claim returns (``ledger.ClaimedJob.from_row`` reads them by name).
CLAIMED_COLUMNS = (
    "id, event_id, event_type, app, payload, private_message, attempt, partition_key, "
    "lease_until, has_steps, received_at, available_at, trace_parent, priority, tenant"
)

#: SPEC §3 Effects: once any effect started the job is never retried automatically, unless
#: every effect it started is idempotent and still inside its window (``status_after``).
EFFECT_STARTED = "(side_effect_started OR effects_in_flight > 0 OR effect_uncertain)"
EFFECT_OPEN = "(effects_in_flight > 0 OR effect_uncertain)"
#: A job's attempts: its own (its handler's policy), else the site's (%(max_attempts)s).
ATTEMPTS_SPENT = "attempt >= COALESCE(max_attempts, %(max_attempts)s)"


def status_after(*, retry_at: str, spent: str = ATTEMPTS_SPENT, final: str = "FALSE") -> str:
    """Where an attempt that failed (or whose lease expired) leaves its job (SPEC §3 Fail,
    Lease expiry), as a CASE over the job's row as it was:

    - ``final`` (the handler said retrying cannot help, e.g. Feishu refused the request),
      every effect it started is idempotent and settled (none in flight or uncertain), and
      none was first started by an earlier attempt → failed. (A refusal of a re-sent key
      proves nothing about the first try, and what Feishu answers a repeated uuid is not
      documented: that job is unknown.)
    - an effect started, and the job will not run again within its idempotency window
      (``idempotent_until`` after ``retry_at``, the time it would run again), or will not run
      again at all (final, cancelled, attempts spent) → unknown;
    - an operator cancelled it → completed; attempts spent → failed; else retry_wait.

    Without an idempotent effect this is the rule of old: any effect started → unknown.
    """
    every_idempotent = (
        "(NOT side_effect_started OR (idempotent_until IS NOT NULL "
        "AND NOT COALESCE(idempotent_since < claimed_at, FALSE)))"
    )
    inside_window = f"COALESCE(idempotent_until > {retry_at}, FALSE)"
    return (
        f"CASE WHEN {final} AND NOT cancel_requested AND NOT {EFFECT_OPEN} "
        f"AND {every_idempotent} THEN '{FAILED}' "
        f"WHEN {EFFECT_STARTED} AND ({final} OR cancel_requested OR {spent} "
        f"OR NOT {inside_window}) THEN '{UNKNOWN}' "
        f"WHEN cancel_requested THEN '{COMPLETED}' "
        f"WHEN {spent} THEN '{FAILED}' ELSE '{RETRY_WAIT}' END"
    )


#: Lease expiry: the job would run again now.
STATUS_AFTER_FAILURE = status_after(retry_at="now()")
#: The handler failed (SQLite's fail_job): it runs again in %(retry_in)s seconds; NULL: final.
STATUS_AFTER_FAIL = status_after(
    retry_at="feishu_inbox_now_plus(%(retry_in)s)", final="(%(retry_in)s IS NULL)"
)
#: The same inside feishu_inbox_end_attempt() (PostgreSQL), from its parameters.
STATUS_AFTER_FAIL_FUNCTION = status_after(
    retry_at="now() + p_retry_in * interval '1 second'",
    spent="attempt >= COALESCE(max_attempts, p_max_attempts)",
    final="(p_retry_in IS NULL)",
)


def settle_if_retried(status: str) -> str:
    """Assignments for an attempt ending in ``status`` (a CASE): a job that runs again after
    an idempotent effect will re-issue it with the same key, so nothing is in flight or
    uncertain any more; ``side_effect_started`` and the window stay."""
    return (
        f"effects_in_flight = CASE WHEN {status} = '{RETRY_WAIT}' THEN 0 "
        "ELSE effects_in_flight END, "
        f"effect_uncertain = CASE WHEN {status} = '{RETRY_WAIT}' THEN FALSE "
        "ELSE effect_uncertain END"
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
    "card_stream": CARD_STREAM_TABLE,
    "rate_bucket": RATE_BUCKET_TABLE,
    "schedule": SCHEDULE_TABLE,
    "wait": WAIT_TABLE,
    "signal": SIGNAL_TABLE,
    "batch": BATCH_TABLE,
    "batch_event": BATCH_EVENT_TABLE,
    "tenant_weight": TENANT_WEIGHT_TABLE,
    "batches_notice": BATCHES_NOTICE,
    "channel": NOTIFY_CHANNEL,
    # statuses (the partition's head_state uses the same words, plus idle)
    "queued": QUEUED,
    "running": RUNNING,
    "retry_wait": RETRY_WAIT,
    "completed": COMPLETED,
    "failed": FAILED,
    "unknown": UNKNOWN,
    "waiting": WAITING,
    "idle": IDLE,
    "claimable": f"('{QUEUED}', '{RETRY_WAIT}')",
    "unresolved": UNRESOLVED,
    # SPEC §4: a private job is superseded when the next unresolved job of its chat is a
    # private message too (and the site lets private messages interrupt).
    "superseded": (
        f"%(interrupt_private)s AND private_message AND COALESCE({NEXT_IS_PRIVATE}, FALSE)"
    ),
    "effect_started": EFFECT_STARTED,
    # A handler that returns with an effect in flight or uncertain ends `unknown`.
    "effect_open": EFFECT_OPEN,
    # Every call of a lease holder: its job, still running, still its own, lease not expired.
    "fence": (
        f"id = %(job_id)s AND status = '{RUNNING}' AND worker_id = %(worker_id)s "
        "AND lease_token = %(token)s AND lease_until > now()"
    ),
    # Where an attempt that failed (or whose lease expired, or was handed back) leaves its
    # job (SPEC §3 Fail): an effect started → unknown; an operator cancelled it → completed;
    # its attempts spent → failed; else it runs again.
    "status_after_failure": STATUS_AFTER_FAILURE,
    "status_after_fail": STATUS_AFTER_FAIL,
    "status_after_fail_function": STATUS_AFTER_FAIL_FUNCTION,
    "settle_after_failure": settle_if_retried(STATUS_AFTER_FAILURE),
    "settle_after_fail": settle_if_retried(STATUS_AFTER_FAIL),
    "settle_after_fail_function": settle_if_retried(STATUS_AFTER_FAIL_FUNCTION),
    "attempts_spent": ATTEMPTS_SPENT,
    "error_after_fail": (
        f"CASE WHEN {STATUS_AFTER_FAIL} = '{COMPLETED}' THEN 'Cancelled' ELSE %(error_type)s END"
    ),
    # Every effect the job started may be re-issued now: idempotent, none in flight or
    # uncertain, inside the window (hand_back).
    "reissuable_now": (
        f"(NOT {EFFECT_OPEN} AND idempotent_until IS NOT NULL AND idempotent_until > now())"
    ),
    # An effect begins (begin_effect): %(until_seconds)s is its window less the margin, NULL
    # for an effect without an idempotency key. The job's window is the earliest deadline of
    # its idempotent effects, counted from each one's first start; an effect without a key
    # closes it for good (NULL while side_effect_started).
    "idempotent_until_after_begin": (
        "CASE WHEN %(until_seconds)s IS NULL "
        "OR (side_effect_started AND idempotent_until IS NULL) THEN NULL "
        "WHEN idempotent_until IS NULL "
        "OR idempotent_until > feishu_inbox_now_plus(%(until_seconds)s) "
        "THEN feishu_inbox_now_plus(%(until_seconds)s) ELSE idempotent_until END"
    ),
    "claimed_columns": CLAIMED_COLUMNS,
    "uncertain_message": (
        "'An effect was in flight or raised when the handler ended; check whether it "
        "happened, then reconcile.'"
    ),
}

"""The ledger tables.

``EventJob``   one row per stored event; its id is the receipt sequence.
``Partition``  one row per conversation: a mirror of its first non-completed job (the head),
               so a claim reads one small index instead of the backlog (DESIGN-NOTES).
``Attempt``    one row per ended attempt: the history an operator reads in admin.
``Step``       one row per memoized step of a job (SPEC §7).
``Maintenance``  chores the workers share (the retention purge), one row each.
``Schedule``   one row per declared schedule: its watermark and whether it is paused.
``CardStream`` one row per streamed reply of a job: its card, message, sequence and text.
``WorkerBeat`` one row per worker process: who it is and when it last said it was alive.

State changes happen only through ``ledger/rules.py`` (its SQL lives in ``store/``).
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

# The flow-control tables live in ``flow.py`` (this module is full); their names stay here.
from .tables.flow import (  # noqa: F401
    ConcurrencyKey,
    ConcurrencySlot,
    ConcurrencyWaiter,
    Pause,
    PauseKind,
    RateBucket,
)


class Status(models.TextChoices):
    QUEUED = "queued", "queued"
    RUNNING = "running", "running"
    RETRY_WAIT = "retry_wait", "retry wait"
    COMPLETED = "completed", "completed"
    FAILED = "failed", "failed"
    UNKNOWN = "unknown", "unknown"
    WAITING = "waiting", "waiting"  # SPEC §9e: no lease; resumed by a signal or its time


#: States that hold their partition until an operator acts.
BLOCKING = (Status.FAILED, Status.UNKNOWN)


class Resolution(models.TextChoices):
    NONE = "", "—"
    APPLIED = "applied", "reconciled: effect applied, marked done"
    NOT_APPLIED = "not_applied", "reconciled: effect not applied, run again"
    REQUEUED = "requeued", "requeued by an operator"
    DISCARDED = "discarded", "discarded by an operator"
    EXPIRED = "expired", "expired: unknown past UNKNOWN_RETENTION, never reconciled"
    CANCELLED = "cancelled", "cancelled by an operator"
    REPLAYED = "replayed", "replayed by an operator"


class EventJobQuerySet(models.QuerySet["EventJob"]):
    def running(self) -> EventJobQuerySet:
        return self.filter(status=Status.RUNNING)

    def completed(self) -> EventJobQuerySet:
        return self.filter(status=Status.COMPLETED)

    def unresolved(self) -> EventJobQuerySet:
        return self.exclude(status=Status.COMPLETED)

    def in_partition(self, key: str) -> EventJobQuerySet:
        return self.filter(partition_key=key)

    def of_tenant(self, tenant: str) -> EventJobQuerySet:
        """The jobs of one tenant (SPEC §9j; "": of none)."""
        return self.filter(tenant=tenant)


class EventJob(models.Model):
    id = models.BigAutoField(primary_key=True, help_text="Receipt sequence.")
    app = models.CharField(max_length=64, default="default")
    #: Whose job it is (SPEC §9j): Feishu's ``header.tenant_key`` for an event, the
    #: ``tenant=`` its enqueuer declared for other work; "" for none. Dedupe keys are unique
    #: per (app, tenant).
    tenant = models.CharField(max_length=64, blank=True, default="", db_default="")
    event_id = models.CharField(max_length=128)
    event_type = models.CharField(max_length=128)
    dedupe_key = models.CharField(max_length=255)
    partition_key = models.CharField(max_length=255)
    private_message = models.BooleanField(default=False)
    payload = models.JSONField(default=dict)

    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    attempt = models.PositiveIntegerField(default=0)
    received_at = models.DateTimeField()
    available_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    # Lease (fencing): set exactly while running.
    worker_id = models.CharField(max_length=128, blank=True, default="")
    lease_token = models.CharField(max_length=32, blank=True, default="")
    lease_until = models.DateTimeField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)

    # Effects (SPEC §3): once side_effect_started, never retried automatically.
    effects_in_flight = models.PositiveSmallIntegerField(default=0)
    side_effect_started = models.BooleanField(default=False)
    effect_uncertain = models.BooleanField(default=False)
    #: An operator cancelled the running job: its handler stops at the next checkpoint or
    #: effect, and however its attempt ends, it is not retried.
    cancel_requested = models.BooleanField(default=False, db_default=False)
    #: Whether a step of this job was ever recorded (SPEC §7): only then does a new attempt read
    #: the memoized results, so a job without steps pays nothing for them.
    has_steps = models.BooleanField(default=False, db_default=False)
    #: Idempotent effects (SPEC §3 Effects): the remote side deduplicates by a key the ledger
    #: gives the effect (``handlers.effect_key``: job id, event, replay generation, effect
    #: name). ``idempotent_until`` is the database time before which re-issuing every effect
    #: this run started is harmless: the earliest first start of its idempotent effects plus
    #: their window, less the safety margin; NULL once an effect without a key started (or
    #: none did). A failure, a crash or a lost lease before it sends the job to retry_wait.
    idempotent_until = models.DateTimeField(null=True, blank=True)
    #: When this run's first idempotent effect started (database clock), the name and window
    #: (seconds) of the latest one: the admin shows them with its key.
    idempotent_since = models.DateTimeField(null=True, blank=True)
    idempotent_effect = models.CharField(max_length=64, blank=True, default="", db_default="")
    idempotent_window = models.FloatField(null=True, blank=True)
    #: How many times an operator replayed this job: part of its effects' keys, so a replay
    #: sends again instead of being swallowed by the remote side's dedupe.
    replays = models.PositiveIntegerField(default=0, db_default=0)
    #: Attempts this job gets: its handler's retry policy when it was stored; None: the site's
    #: MAX_ATTEMPTS when an attempt ends (so raising it helps jobs already stored).
    max_attempts = models.PositiveIntegerField(null=True, blank=True)
    #: Higher runs first among the partitions' due heads (a django.tasks task's ``priority``,
    #: -100..100; Feishu events and schedule occurrences 0). It never reorders a partition:
    #: the partition's head carries its priority (Partition.head_priority).
    priority = models.SmallIntegerField(default=0, db_default=0)
    #: The trace context of whoever stored it (a W3C ``traceparent``; "" when nothing traced
    #: the enqueue): every attempt's span is its child (``tracing.py``).
    trace_parent = models.CharField(max_length=55, blank=True, default="", db_default="")
    #: Workflows (SPEC §9f): the job that spawned it, and the batch it counts in (a batch's,
    #: a chain link's, or a parent's wait for its children: ``batches.Batch``). Plain ids, no
    #: foreign keys: the hot path never checks them, and purging a parent leaves its children.
    parent_id = models.BigIntegerField(null=True, blank=True)
    batch_id = models.BigIntegerField(null=True, blank=True)

    error_type = models.CharField(max_length=128, blank=True, default="")
    error_message = models.TextField(blank=True, default="")
    resolution = models.CharField(
        max_length=16, choices=Resolution.choices, blank=True, default=Resolution.NONE
    )

    objects = EventJobQuerySet.as_manager()

    class Meta:
        verbose_name = "event job"
        ordering = ["id"]
        # On PostgreSQL, migration 0014 holds these CHECKs (and the positive counts') as a row
        # trigger with the same conditions and the same error, because PostgreSQL re-parses
        # each CHECK for every statement that writes the row (store/functions/
        # 0014_row_checks.sql). A change to one belongs in the other: on PostgreSQL a new
        # function file replacing the trigger, the constraint's own change in the state only
        # (SeparateDatabaseAndState); tests/store/test_row_checks.py fails until both agree.
        constraints = [
            models.UniqueConstraint(
                fields=["app", "dedupe_key", "tenant"], name="feishu_inbox_job_dedupe_tenant"
            ),
            models.CheckConstraint(
                condition=Q(status=Status.RUNNING, lease_until__isnull=False)
                & ~Q(lease_token="")
                & ~Q(worker_id="")
                | (~Q(status=Status.RUNNING) & Q(lease_until__isnull=True, lease_token="")),
                name="feishu_inbox_job_lease_iff_running",
            ),
            models.CheckConstraint(
                condition=Q(status__in=[s.value for s in Status]),
                name="feishu_inbox_job_status_valid",
            ),
        ]
        # Each index names the queries that read it (store/*.sql, admin). Claim and finish
        # change status, which the partial indexes' predicates name, so neither update is HOT.
        # The columns a running job's own updates change (renew's lease_until, the effect
        # and step counters, the idempotency window) are in no index, so those updates are
        # HOT when the row's page has room (tests/store/test_store.py holds the rule).
        indexes = [
            # Next non-completed job of a partition: resync_head and the head lookup of
            # feishu_inbox_end_attempt, next_is_private / newer_private_waiting (supersede).
            models.Index(
                fields=["partition_key", "id"],
                name="feishu_inbox_job_unresolved",
                condition=~Q(status=Status.COMPLETED),
            ),
            # completed_past_retention: the retention purge of completed jobs.
            models.Index(
                fields=["finished_at"],
                name="feishu_inbox_job_finished",
                condition=Q(status=Status.COMPLETED),
            ),
            # count_unresolved, due_and_delayed, the admin's status filter (newest first), and
            # expired_leases: the running jobs in id order, each lease checked (there are as
            # many as the workers' slots). Migration 0016 dropped an index on lease_until for
            # that scan: every renew changed it, so no renew could be HOT.
            models.Index(fields=["status", "id"], name="feishu_inbox_job_status"),
            # The admin's search by event id, replay_duplicate.
            models.Index(fields=["event_id"], name="feishu_inbox_job_event_id"),
            # Admin search by partition key prefix (PostgreSQL; LIKE 'x%' needs pattern ops).
            models.Index(
                fields=["partition_key"],
                name="feishu_inbox_job_part_prefix",
                opclasses=["varchar_pattern_ops"],
            ),
            # The admin's, ``inbox list``'s and the API's filter by tenant, newest first: only
            # the jobs that have a tenant are in it (a site without tenants pays nothing).
            models.Index(
                fields=["tenant", "id"], name="feishu_inbox_job_tenant", condition=~Q(tenant="")
            ),
            # The admin's "ended as" filter (a turn's endings, a stop, a cancel), newest
            # first: only the jobs that have an error type are in it. The column is in no
            # other index, and a job that runs and completes keeps it "" (no entry, and its
            # running updates stay HOT where they were).
            models.Index(
                fields=["error_type", "id"],
                name="feishu_inbox_job_error_type",
                condition=~Q(error_type=""),
            ),
            # Admin date hierarchy (bucket probes) and "newest first" by arrival.
            models.Index(fields=["received_at"], name="feishu_inbox_job_received"),
            # A workflow's tree (children of a parent) and a batch's members: only the jobs
            # that have one are in them.
            models.Index(
                fields=["parent_id", "id"],
                name="feishu_inbox_job_parent",
                condition=Q(parent_id__isnull=False),
            ),
            models.Index(
                fields=["batch_id", "id"],
                name="feishu_inbox_job_batch",
                condition=Q(batch_id__isnull=False),
            ),
        ]
        permissions = [
            ("requeue_eventjob", "Can requeue failed event jobs"),
            ("reconcile_eventjob", "Can reconcile unknown event jobs"),
            ("discard_eventjob", "Can discard failed event jobs"),
            ("cancel_eventjob", "Can cancel queued, waiting or running event jobs"),
            ("replay_eventjob", "Can replay completed event jobs"),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.event_type} [{self.status}]"


class PartitionState(models.TextChoices):
    IDLE = "idle", "idle"
    QUEUED = "queued", "queued"
    RUNNING = "running", "running"
    RETRY_WAIT = "retry_wait", "retry wait"
    FAILED = "failed", "failed"
    UNKNOWN = "unknown", "unknown"
    WAITING = "waiting", "waiting"


class Partition(models.Model):
    #: Found by equality only: on PostgreSQL migration 0012 drops the varchar_pattern_ops index
    #: Django adds beside this primary key (no query reads it; every head change paid for it).
    key = models.CharField(max_length=255, primary_key=True)
    #: id of the first non-completed job, or NULL when the partition is idle.
    head_id = models.BigIntegerField(null=True, blank=True)
    head_state = models.CharField(
        max_length=16, choices=PartitionState.choices, default=PartitionState.IDLE
    )
    head_due_at = models.DateTimeField(null=True, blank=True)
    #: The head's priority (0 when idle): the claim takes due heads by priority, then receipt.
    head_priority = models.SmallIntegerField(default=0, db_default=0)
    #: The head's tenant ("" when idle, or a job of none): the claim shares the workers
    #: between the tenants with due heads (SPEC §9j, fair claims).
    head_tenant = models.CharField(max_length=64, blank=True, default="", db_default="")

    class Meta:
        # A row trigger on PostgreSQL (migration 0014), as EventJob's checks.
        constraints = [
            models.CheckConstraint(
                condition=Q(head_state=PartitionState.IDLE, head_id__isnull=True)
                | (~Q(head_state=PartitionState.IDLE) & Q(head_id__isnull=False)),
                name="feishu_inbox_partition_head_iff_busy",
            ),
        ]
        indexes = [
            # The claim (feishu_inbox_claim, claim_prefixed; claimable_heads on SQLite): the
            # highest priority, then the lowest head, among one tenant's claimable partitions,
            # read in index order (cost ~ log(partitions), no sort); the tenants that have
            # claimable heads, one probe each (the fair claim, with several).
            models.Index(
                fields=["head_tenant", "-head_priority", "head_id"],
                name="feishu_inbox_part_claimable",
                condition=Q(head_state__in=[PartitionState.QUEUED, PartitionState.RETRY_WAIT]),
            ),
            # The fair claim's running count per tenant (feishu_inbox_claim_fair): the chats
            # that run now, as few as the workers' slots, however many chats are idle.
            models.Index(
                fields=["head_tenant"],
                name="feishu_inbox_part_running",
                condition=Q(head_state=PartitionState.RUNNING),
            ),
            # Whether a claimable head has a priority other than 0 (the fair claim then reads
            # every tenant: feishu_inbox_claim_fair): empty where every job has priority 0.
            models.Index(
                fields=["head_priority"],
                name="feishu_inbox_part_ranked",
                condition=Q(head_state__in=[PartitionState.QUEUED, PartitionState.RETRY_WAIT])
                & ~Q(head_priority=0),
            ),
            # Next wake-up: the earliest due time among claimable heads.
            models.Index(
                fields=["head_due_at"],
                name="feishu_inbox_part_due",
                condition=Q(head_state__in=[PartitionState.QUEUED, PartitionState.RETRY_WAIT]),
            ),
            # Blocked partitions (dashboard, stats).
            models.Index(
                fields=["head_state"],
                name="feishu_inbox_part_blocked",
                condition=Q(head_state__in=[PartitionState.FAILED, PartitionState.UNKNOWN]),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.key} [{self.head_state}]"


class Attempt(models.Model):
    """One ended attempt of a job (written when the attempt ends, in the same transaction)."""

    job = models.ForeignKey(EventJob, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveIntegerField()
    worker_id = models.CharField(max_length=128)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField()
    outcome = models.CharField(max_length=16, choices=Status.choices)
    error_type = models.CharField(max_length=128, blank=True, default="")
    error_message = models.TextField(blank=True, default="")
    #: The lease token of the claim this attempt ended (empty when its lease expired): a
    #: worker that retries the end of its attempt finds here that the first try landed.
    lease_token = models.CharField(max_length=32, blank=True, default="")

    class Meta:
        ordering = ["job_id", "number"]
        indexes = [models.Index(fields=["ended_at"], name="feishu_inbox_attempt_ended")]

    def __str__(self) -> str:
        return f"job #{self.job_id} attempt {self.number}: {self.outcome}"


class Step(models.Model):
    """A memoized step of a job (SPEC §7): written fenced when its function returns; a later
    attempt returns ``result`` instead of running the function again."""

    job = models.ForeignKey(EventJob, on_delete=models.CASCADE, related_name="steps")
    name = models.CharField(max_length=128)
    #: The attempt that ran it.
    attempt = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    result = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["job_id", "started_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["job", "name"], name="feishu_inbox_step_once")
        ]

    def __str__(self) -> str:
        return f"job #{self.job_id} step {self.name}"


class CardStream(models.Model):
    """A streamed reply of a job (``feishu/streams.py``, SPEC §9b): the CardKit card it writes
    into, the message that carries it, the last ``sequence`` used and the ``text`` sent with
    it. Each operation's sequence and text are written here (fenced) before the operation
    leaves, so a later attempt continues with a higher sequence and never shows less text."""

    job = models.ForeignKey(EventJob, on_delete=models.CASCADE, related_name="card_streams")
    #: The job's replay generation: a replayed job streams into a new card.
    generation = models.PositiveIntegerField(default=0)
    name = models.CharField(max_length=64)
    card_id = models.CharField(max_length=128)
    element_id = models.CharField(max_length=64)
    message_id = models.CharField(max_length=128, blank=True, default="")
    sequence = models.PositiveIntegerField(default=0)
    text = models.TextField(blank=True, default="")
    #: The text ends with the interruption marker (an attempt ended by an exception).
    marked = models.BooleanField(default=False)
    #: Streaming mode is on; since when (Feishu turns it off by itself 10 minutes later).
    streaming = models.BooleanField(default=True)
    streaming_since = models.DateTimeField(null=True, blank=True)
    #: The stream ended normally: the final text is on the card and streaming is off.
    closed = models.BooleanField(default=False)
    attempt = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["job_id", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "generation", "name"], name="feishu_inbox_card_stream_once"
            )
        ]

    def __str__(self) -> str:
        return f"job #{self.job_id} stream {self.name} (card {self.card_id})"


class Maintenance(models.Model):
    """A chore every worker may do but only one at a time, at most once per interval
    (the retention purge): a worker claims it by moving ``due_at`` forward."""

    name = models.CharField(max_length=64, primary_key=True)
    due_at = models.DateTimeField()
    worker_id = models.CharField(max_length=128, blank=True, default="")
    last_result = models.TextField(blank=True, default="")

    def __str__(self) -> str:
        return f"{self.name} (next at {self.due_at:%Y-%m-%d %H:%M:%S})"


#: The largest id a job can have (a signed 64-bit column): a database refuses a larger number
#: with its driver's error (SQLite: OverflowError) rather than find no job.
LARGEST_JOB_ID = 2**63 - 1


def job_id_from_text(text: str) -> int | None:
    """The job id an operator's text names (ASCII digits, 1 to ``LARGEST_JOB_ID``), or None.
    Never ``int()`` of thousands of digits, which Python itself refuses."""
    if not (text.isascii() and text.isdigit()):
        return None
    digits = text.lstrip("0")
    if not digits or len(digits) > len(str(LARGEST_JOB_ID)):
        return None
    number = int(digits)
    return number if number <= LARGEST_JOB_ID else None


def job_as_dict(job: EventJob, *, payload: bool = False) -> dict[str, object]:
    """A JSON-ready view of a job (CLI ``--json``, dashboard)."""
    data: dict[str, object] = {
        "id": job.pk,
        "app": job.app,
        "tenant": job.tenant,
        "event_id": job.event_id,
        "event_type": job.event_type,
        "dedupe_key": job.dedupe_key,
        "partition_key": job.partition_key,
        "private_message": job.private_message,
        "status": job.status,
        "attempt": job.attempt,
        "priority": job.priority,
        "received_at": job.received_at.isoformat(),
        "available_at": job.available_at.isoformat(),
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
        "worker_id": job.worker_id,
        "lease_until": job.lease_until.isoformat() if job.lease_until else None,
        "effects_in_flight": job.effects_in_flight,
        "side_effect_started": job.side_effect_started,
        "effect_uncertain": job.effect_uncertain,
        "cancel_requested": job.cancel_requested,
        "idempotent_effect": job.idempotent_effect,
        "idempotent_window": job.idempotent_window,
        "idempotent_since": job.idempotent_since.isoformat() if job.idempotent_since else None,
        "idempotent_until": job.idempotent_until.isoformat() if job.idempotent_until else None,
        "replays": job.replays,
        "max_attempts": job.max_attempts,
        "error_type": job.error_type,
        "error_message": job.error_message,
        "resolution": job.resolution,
    }
    if payload:
        data["payload"] = job.payload
    return data


class Schedule(models.Model):
    """The ledger's memory of one declared schedule (SPEC §8; ``schedules/`` declares them).

    ``watermark`` is the last occurrence enqueued, or skipped by the catch-up policy (at first,
    the second the schedule was first seen): every occurrence up to it is done, every later one
    is pending. Workers move it forward only, by compare-and-set, in the transaction that
    enqueues the occurrences (``scheduler.tick``).
    """

    name = models.CharField(max_length=64, primary_key=True)
    watermark = models.DateTimeField()
    paused = models.BooleanField(default=False)
    #: When the last job of this schedule was enqueued (an occurrence, a catch-up or run now).
    last_fired_at = models.DateTimeField(null=True, blank=True)
    #: That job (no foreign key: completed jobs are purged by retention, the row stays).
    last_job_id = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["name"]
        permissions = [
            ("pause_schedule", "Can pause schedules"),
            ("resume_schedule", "Can resume schedules"),
            ("run_schedule", "Can run a schedule now"),
        ]

    def __str__(self) -> str:
        return f"schedule {self.name}" + (" (paused)" if self.paused else "")


class FeishuConnection(models.Model):
    """One long connection of one ``feishu_connect`` process, as it last reported itself
    (every few seconds): the dashboard shows it, live or lost (``ledger/reports.py``)."""

    app = models.CharField(max_length=64)
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    #: connecting | connected | waiting (to connect again) | refused | stopped
    state = models.CharField(max_length=16)
    #: When it entered its state.
    since = models.DateTimeField()
    connected_at = models.DateTimeField(null=True, blank=True)
    last_event_at = models.DateTimeField(null=True, blank=True)
    last_pong_at = models.DateTimeField(null=True, blank=True)
    #: Events stored (or found stored) through it since the process started.
    events = models.BigIntegerField(default=0)
    #: Why it is not connected (no secret, no URL query).
    error = models.TextField(blank=True, default="")
    #: The process's last report: older than a few intervals means the process is gone.
    reported_at = models.DateTimeField()

    class Meta:
        ordering = ["app", "host", "pid"]
        constraints = [
            models.UniqueConstraint(fields=["app", "host", "pid"], name="one_row_per_connection")
        ]

    def __str__(self) -> str:
        return f"{self.app} on {self.host}:{self.pid} ({self.state})"


class WorkerBeat(models.Model):
    """A worker process's heartbeat (``ledger/workers.py``): written when it starts, every
    ``WORKER_BEAT_SECONDS`` while it runs, and when it stops. A worker whose beat is older than
    three intervals is lost (killed, its host gone); the row of a lost or stopped worker is
    deleted after ``WORKER_RETENTION``."""

    worker_id = models.CharField(max_length=128, primary_key=True)
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    version = models.CharField(max_length=32)
    #: Its slots, and how many ran a job at its last beat.
    concurrency = models.PositiveIntegerField()
    busy = models.PositiveIntegerField(default=0)
    #: The task queues it runs (``runworker --queue``), comma-separated; empty: every job.
    queues = models.CharField(max_length=255, blank=True, default="")
    #: The task queues it leaves out (``runworker --exclude-queues``), comma-separated.
    excluded_queues = models.CharField(max_length=255, blank=True, default="", db_default="")
    started_at = models.DateTimeField()
    last_beat_at = models.DateTimeField()
    #: When it stopped cleanly (None: it runs, or it was lost).
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-last_beat_at"]
        indexes = [models.Index(fields=["last_beat_at"], name="feishu_inbox_beat_last")]

    def __str__(self) -> str:
        return f"worker {self.worker_id}"

    @property
    def scope(self) -> str:
        """What it runs, in words."""
        if self.queues:
            return f"only tasks of {self.queues.replace(',', ', ')}"
        if self.excluded_queues:
            return f"every job but tasks of {self.excluded_queues.replace(',', ', ')}"
        return "every job"


from . import waiting as waiting  # noqa: E402  (Wait, Signal: SPEC §9e; this module is full)
from .tables import backfills as backfills  # noqa: E402  (Backfill, Export: SPEC §9i)
from .tables import batches as batches  # noqa: E402  (Batch, BatchEvent: SPEC §9f)
from .tables import tenants as tenants  # noqa: E402  (AppCredential, TenantWeight: SPEC §9j)
from .tables import turns as turns  # noqa: E402  (TurnCleanup: SPEC §9g)

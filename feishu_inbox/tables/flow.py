"""The flow-control tables (SPEC §9c), beside ``models.py``.

``RateBucket``        one rate limit's token bucket, shared by every worker.
``ConcurrencySlot``   a running job holding one of a concurrency key's slots.
``ConcurrencyKey``    one row per concurrency key: what its acquirers lock.
``ConcurrencyWaiter`` a job parked until a slot of its key is given back.
``Pause``             an operator's pause of a partition, an app, an event type or a queue.

Their rows change only through ``ledger/`` (limits, concurrency, pauses).
"""

from __future__ import annotations

from django.db import models


class RateBucket(models.Model):
    """One rate limit's token bucket (``ledger/limits.py``), shared by every worker: ``tokens``
    as of ``updated_at``, refilled at ``rate`` per second up to ``burst``; nothing is taken
    before ``blocked_until`` (Feishu answered 429 and named its reset time)."""

    key = models.CharField(max_length=255, primary_key=True)
    tokens = models.FloatField()
    rate = models.FloatField(help_text="Tokens per second.")
    burst = models.FloatField()
    updated_at = models.DateTimeField()
    blocked_until = models.DateTimeField(null=True, blank=True)
    #: Tokens taken, and times a caller found none (since the row was created).
    taken = models.BigIntegerField(default=0)
    refused = models.BigIntegerField(default=0)

    class Meta:
        ordering = ["key"]

    def __str__(self) -> str:
        return f"rate limit {self.key} ({self.rate:g}/s, burst {self.burst:g})"


class ConcurrencySlot(models.Model):
    """A running job holding one of a concurrency key's N slots (``ledger/concurrency.py``).
    It counts while its job is running under the same lease token and its lease lasts, so a
    slot of a crashed worker frees itself when the lease ends."""

    key = models.CharField(max_length=255)
    job_id = models.BigIntegerField()
    lease_token = models.CharField(max_length=64)
    acquired_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["key", "job_id"], name="one_slot_per_job_and_key")
        ]

    def __str__(self) -> str:
        return f"{self.key}: job #{self.job_id}"


class ConcurrencyKey(models.Model):
    """One row per concurrency key: what acquirers of the key lock, one at a time."""

    key = models.CharField(max_length=255, primary_key=True)
    limit = models.IntegerField()

    def __str__(self) -> str:
        return f"{self.key} (at most {self.limit} running)"


class ConcurrencyWaiter(models.Model):
    """A job parked until a slot of its concurrency key is given back (``ledger/concurrency.py``):
    the job that gives one back makes the oldest waiters due at once, instead of every waiter
    trying again every half second."""

    key = models.CharField(max_length=255)
    job_id = models.BigIntegerField()
    parked_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["key", "job_id"], name="one_wait_per_job_and_key")
        ]

    def __str__(self) -> str:
        return f"{self.key}: job #{self.job_id} waits"


class PauseKind(models.TextChoices):
    PARTITION = "partition", "partition (a chat)"
    APP = "app", "Feishu app"
    EVENT_TYPE = "event_type", "event type"
    QUEUE = "queue", "django.tasks queue"


class Pause(models.Model):
    """An operator's pause (``ledger/pauses.py``): jobs it matches are not claimed until it is
    resumed; running ones finish; later jobs of a held partition wait behind its head."""

    kind = models.CharField(max_length=16, choices=PauseKind.choices)
    value = models.CharField(max_length=255)
    since = models.DateTimeField()
    by = models.CharField(max_length=150, blank=True, default="")
    reason = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-since"]
        constraints = [models.UniqueConstraint(fields=["kind", "value"], name="one_pause_each")]
        permissions = [("pause_work", "Can pause work"), ("resume_work", "Can resume work")]

    def __str__(self) -> str:
        return f"paused {self.get_kind_display()} {self.value}"

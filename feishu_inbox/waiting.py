"""The waits' tables (SPEC §9e), beside ``models.py``.

``Wait``    one row per wait of a job (a sleep, or a wait for a signal by key): the memo that
            makes a resumed handler get the same outcome without waiting again.
``Signal``  a signal sent while nobody waited for its key, kept for the waiter to come.

Their rows change only through ``ledger/waits.py`` (its SQL lives in ``store/``).
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class WaitState(models.TextChoices):
    OPEN = "open", "open"
    DELIVERED = "delivered", "delivered"
    TIMED_OUT = "timed_out", "timed out"
    #: An operator cancelled its job while it waited: no signal or time resolves it.
    CANCELLED = "cancelled", "cancelled"


class Wait(models.Model):
    """A job's wait: open while the job waits; delivered (a signal's payload) or timed out
    (its time came) exactly once, by one conditional update of this row."""

    job = models.ForeignKey("feishu_inbox.EventJob", on_delete=models.CASCADE, related_name="waits")
    #: The wait's name in its job (``wait:1``, ``wait:2``… in the order the handler waits,
    #: unless the handler names it): a resumed handler finds its outcome by it.
    name = models.CharField(max_length=128)
    #: The chat (partition) the job waits in. A job that gives its chat back while it waits is
    #: moved out of it (its own partition key, ``parked_key``); it goes back here to resume.
    partition_key = models.CharField(max_length=255, blank=True, default="")
    #: The signal's key; "" for a sleep.
    key = models.CharField(max_length=255, blank=True, default="")
    #: When it times out (a sleep: when it ends); None: never.
    until = models.DateTimeField(null=True, blank=True)
    state = models.CharField(max_length=16, choices=WaitState.choices, default=WaitState.OPEN)
    #: The job keeps its chat while it waits (the chat's later jobs wait behind it).
    hold_chat = models.BooleanField(default=True)
    payload = models.JSONField(null=True, blank=True)
    #: A card question's rule (``feishu_inbox.ask``): ``{"choices": [...], "who": [...] or
    #: null}``, read by the card callback under the key's lock; null for other waits.
    ask = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["job_id", "id"]
        constraints = [
            models.UniqueConstraint(fields=["job", "name"], name="feishu_inbox_wait_once"),
        ]
        indexes = [
            # deliver_signal: the open wait of a key.
            models.Index(
                fields=["key"], name="feishu_inbox_wait_key", condition=Q(state=WaitState.OPEN)
            ),
            # question_of_key: a card question's wait, whatever its state (a late click).
            models.Index(
                fields=["key"], name="feishu_inbox_wait_question", condition=Q(ask__isnull=False)
            ),
            # due_waits and the worker's next wake-up: the earliest open deadline.
            models.Index(
                fields=["until"], name="feishu_inbox_wait_due", condition=Q(state=WaitState.OPEN)
            ),
        ]
        permissions = [("signal_wait", "Can signal or time out waiting jobs")]

    def __str__(self) -> str:
        return f"job #{self.job_id} wait {self.name} [{self.state}]"


class Signal(models.Model):
    """A signal nobody waited for yet, kept until ``expires_at`` for the first job that waits
    for its key (then deleted, in the waiter's transaction)."""

    key = models.CharField(max_length=255)
    payload = models.JSONField(null=True, blank=True)
    sent_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["key", "id"], name="feishu_inbox_signal_key")]

    def __str__(self) -> str:
        return f"signal {self.key}"

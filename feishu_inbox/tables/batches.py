"""The workflows' tables (SPEC §9f), beside ``models.py``.

``Batch``       a group of jobs whose end is awaited once: a batch with callbacks, a parent's
                wait for its children, or a chain's current link.
``BatchEvent``  a member's move into or out of an ended state, written by a row trigger on the
                job table in the member's own transaction; the workers fold them into their
                batch's count (``ledger/workflows.py``).

A member is a job whose ``batch_id`` names the batch. Its rows change only through
``ledger/workflows.py`` (its SQL lives in ``store/``).
"""

from __future__ import annotations

from django.db import models


class BatchKind(models.TextChoices):
    #: ``feishu_inbox.batch``: its callbacks run once when every member has ended.
    BATCH = "batch", "batch"
    #: ``feishu_inbox.wait_all`` / ``wait_any``: a parent waits for its children.
    CHILDREN = "children", "children of a waiting parent"
    #: ``feishu_inbox.chain``: one link at a time; the next starts when it completed.
    CHAIN = "chain", "chain"


class BatchState(models.TextChoices):
    #: Members may still be added (``Batch.add``); it cannot fire yet.
    OPEN = "open", "open"
    #: No member may be added; it fires when enough of them ended.
    CLOSED = "closed", "closed"
    #: Enough members ended: its firing is due (a worker fires it in a transaction of its own).
    READY = "ready", "ready"
    #: It fired: its callbacks were enqueued, its waiter resumed, or its chain moved on (or
    #: ended). Exactly once: one conditional update of this row decides it.
    FIRED = "fired", "fired"
    #: A chain whose link failed or was cancelled: held, visible, until that link runs again
    #: (requeued, or replayed).
    STOPPED = "stopped", "stopped"
    #: Its firing raised (a callback's task no longer importable, a result too deep for a
    #: payload): nothing of it happened; ``error`` says why. An operator fires it again.
    BROKEN = "broken", "broken"


class Batch(models.Model):
    kind = models.CharField(max_length=16, choices=BatchKind.choices)
    state = models.CharField(max_length=16, choices=BatchState.choices)
    #: ``all``: fires when every member ended; ``any``: when one did (``wait_any``).
    mode = models.CharField(max_length=8, default="all")
    #: Members, and those not ended yet (completed and failed are ended; unknown holds).
    total = models.PositiveIntegerField(default=0)
    pending = models.IntegerField(default=0)
    #: The job that made it (a parent, for its children's wait), if a job did.
    parent_id = models.BigIntegerField(null=True, blank=True)
    #: The parent's wait it resolves (``waiting.Wait``), for ``children``.
    wait_id = models.BigIntegerField(null=True, blank=True)
    #: ``success``, ``failure``, ``complete``: the job each callback enqueues (a ``JobSpec``'s
    #: fields), for ``batch``.
    callbacks = models.JSONField(default=dict, blank=True)
    #: A chain's links after the current one (``JobSpec`` fields each), and where it is.
    links = models.JSONField(default=list, blank=True)
    position = models.PositiveIntegerField(default=0)
    length = models.PositiveIntegerField(default=0)
    description = models.CharField(max_length=255, blank=True, default="")
    created_at = models.DateTimeField()
    closed_at = models.DateTimeField(null=True, blank=True)
    fired_at = models.DateTimeField(null=True, blank=True)
    #: The jobs its firing enqueued (callbacks; a chain's links, each in turn).
    fired_jobs = models.JSONField(default=list, blank=True)
    #: Why its firing broke (``BROKEN``).
    error = models.TextField(blank=True, default="")

    class Meta:
        verbose_name_plural = "batches"
        ordering = ["-id"]
        indexes = [
            models.Index(
                fields=["parent_id", "id"],
                name="feishu_inbox_batch_parent",
                condition=models.Q(parent_id__isnull=False),
            ),
            # Batches not fired yet: the admin's "open" filter and the batches-open gauge.
            models.Index(
                fields=["state", "id"],
                name="feishu_inbox_batch_state",
                condition=~models.Q(state="fired"),
            ),
            # A parent's wait's batch (await_children: one per wait, found by it).
            models.Index(
                fields=["wait_id"],
                name="feishu_inbox_batch_wait",
                condition=models.Q(wait_id__isnull=False),
            ),
            # Fired batches past retention (ledger/retention.py).
            models.Index(
                fields=["fired_at"],
                name="feishu_inbox_batch_fired",
                condition=models.Q(state="fired"),
            ),
        ]
        permissions = [("manage_workflow", "Can cancel a workflow or retry its failed members")]

    def __str__(self) -> str:
        return f"{self.kind} #{self.pk} ({self.state}, {self.pending} of {self.total} pending)"


class BatchEvent(models.Model):
    """A member ended (``delta`` -1) or was brought back to life (+1: requeued, reconciled
    to run again, replayed), or a batch was closed (0): what its worker folds next."""

    id = models.BigAutoField(primary_key=True)
    batch_id = models.BigIntegerField()
    delta = models.SmallIntegerField()

    def __str__(self) -> str:
        return f"batch #{self.batch_id}: {self.delta:+d}"

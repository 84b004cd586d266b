"""Conversation turns' table (SPEC §9g), beside ``models.py``.

``TurnCleanup``  an effect a running job asked for when it ends (``feishu_inbox.on_finish``:
                 its "typing" reaction removed): a job spec kept until the job it belongs to
                 has ended — completed, failed or ``unknown``, however that came about — and
                 then enqueued as a small job of its own, in the same transaction that deletes
                 this row (``ledger/turns.py``), so it runs once.

A turn's membership is not a table: it is a memoized step of the turn's job (``turn``), and
the messages it took in end ``completed`` with the error type ``Coalesced``.
"""

from __future__ import annotations

from django.db import models


class TurnCleanup(models.Model):
    """One cleanup effect waiting for its job to end."""

    #: The job it belongs to (a plain id, as the workflows' are: the hot path never checks it,
    #: and a purged job's cleanups still run).
    job_id = models.BigIntegerField(db_index=True)
    #: Its name within the job: a second ``on_finish`` of the same name is the same cleanup
    #: (a retried attempt registers it again).
    name = models.CharField(max_length=64)
    #: What it enqueues: a workflow job spec (``ledger.workflows.enqueue_spec``).
    spec = models.JSONField()
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["id"]
        verbose_name = "turn cleanup"
        constraints = [
            models.UniqueConstraint(fields=["job_id", "name"], name="feishu_inbox_cleanup_once"),
        ]

    def __str__(self) -> str:
        return f"{self.name} after job {self.job_id}"

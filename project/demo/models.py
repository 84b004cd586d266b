from __future__ import annotations

from django.db import models


class Reply(models.Model):
    """What the demo bot "sent": its effect writes here instead of calling Feishu."""

    job_id = models.BigIntegerField()
    chat = models.CharField(max_length=255)
    text = models.TextField()
    sent_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "replies"

    def __str__(self) -> str:
        return f"{self.chat}: {self.text[:40]}"

"""The outbound webhooks' tables (SPEC §9h), beside ``models.py``.

``WebhookEndpoint``  where a site sends its events: a URL, a ``whsec_`` secret (and the one it
                     replaced, during its grace period), the event types it subscribes to, its
                     own rate limit, whether it is enabled and why not, and its health.
``WebhookMessage``   one published event: its ``webhook-id`` (fixed at publish), event type,
                     ordering key and the exact body every delivery of it signs and sends.
``WebhookAttempt``   one try of one delivery (a message to an endpoint): what was sent (the
                     headers with their signature, never the secret) and what came back.

A delivery itself is a job of the ledger (``webhooks/delivery.py``); its rows change only
through ``feishu_inbox.webhooks``.
"""

from __future__ import annotations

from django.db import models


class WebhookEndpoint(models.Model):
    """A receiver of the site's events."""

    #: ``ep_…``: the endpoint's name in jobs, the CLI and the docs (never its URL).
    uid = models.CharField(max_length=40, unique=True)
    url = models.URLField(max_length=2000)
    description = models.CharField(max_length=255, blank=True, default="")
    #: The event types it receives; an empty list: every event type.
    event_types = models.JSONField(default=list, blank=True)
    #: ``whsec_…``: shown once, when it is made (``add_endpoint``, ``rotate_secret``).
    secret = models.CharField(max_length=128)
    #: The secret a rotation replaced, signed with too until ``previous_secret_until``.
    previous_secret = models.CharField(max_length=128, blank=True, default="")
    previous_secret_until = models.DateTimeField(null=True, blank=True)
    #: Requests per second at most, every worker together (None: no limit of its own).
    rate_limit = models.FloatField(null=True, blank=True)
    enabled = models.BooleanField(default=True)
    #: Why it is not enabled: an operator paused it, it answered 410, or it failed too long.
    disabled_reason = models.CharField(max_length=255, blank=True, default="")
    disabled_at = models.DateTimeField(null=True, blank=True)
    #: Health: consecutive failed attempts, since when every attempt failed, last answers.
    failure_streak = models.PositiveIntegerField(default=0)
    failing_since = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_failure_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["id"]
        verbose_name = "webhook endpoint"
        permissions = [("replay_webhook", "Can replay webhook deliveries")]

    def __str__(self) -> str:
        return self.uid

    @property
    def health(self) -> str:
        """In words: disabled, failing, healthy or new."""
        if not self.enabled:
            return "disabled"
        if self.failure_streak:
            return "failing"
        return "healthy" if self.last_success_at else "new"


class WebhookMessage(models.Model):
    """An event the site published; one delivery job per endpoint subscribed to it."""

    #: ``msg_…``: the ``webhook-id`` header of every delivery and resend of it.
    uid = models.CharField(max_length=40, unique=True)
    event_type = models.CharField(max_length=128)
    #: Its deliveries of one key reach each endpoint in publish order ("": no order).
    key = models.CharField(max_length=200, blank=True, default="")
    #: The JSON body, exactly as signed and sent.
    body = models.TextField()
    created_at = models.DateTimeField()
    #: Whose message it is (SPEC §9j): its delivery jobs (and a replay's) are this tenant's.
    tenant = models.CharField(max_length=64, blank=True, default="", db_default="")

    class Meta:
        ordering = ["-id"]
        verbose_name = "webhook message"
        indexes = [models.Index(fields=["created_at"], name="feishu_inbox_whmsg_created")]

    def __str__(self) -> str:
        return self.uid


class WebhookAttempt(models.Model):
    """One try of a message's delivery to an endpoint, and its answer."""

    message = models.ForeignKey(WebhookMessage, on_delete=models.CASCADE, related_name="attempts")
    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="attempts")
    #: The delivery job (None once retention purged it).
    job_id = models.BigIntegerField(null=True, blank=True)
    #: accepted, rejected, retried, gone, timed_out, failed (no answer).
    outcome = models.CharField(max_length=16)
    status_code = models.PositiveIntegerField(null=True, blank=True)
    #: The first KiB of the answer's body, as text.
    response = models.TextField(blank=True, default="")
    latency_ms = models.FloatField()
    #: The request's headers (``webhook-signature`` included; no secret is ever a header).
    request_headers = models.JSONField(default=dict)
    error = models.TextField(blank=True, default="")
    at = models.DateTimeField()

    class Meta:
        ordering = ["-id"]
        verbose_name = "webhook attempt"
        indexes = [
            models.Index(fields=["message", "endpoint"], name="feishu_inbox_whatt_delivery"),
            models.Index(fields=["endpoint", "at"], name="feishu_inbox_whatt_endpoint"),
        ]

    def __str__(self) -> str:
        return f"{self.message_id} → {self.endpoint_id}: {self.outcome}"

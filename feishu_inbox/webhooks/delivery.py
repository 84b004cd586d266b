"""A delivery as a job kind: one message to one endpoint, sent until it is settled.

Each attempt: the endpoint disabled → the job goes back held (no attempt spent), at its place
in its key's order; its rate limit → a token from the bucket every worker shares (a long wait
hands the job back, due when the bucket refills); then the request, inside an idempotent
effect whose key is the message's ``webhook-id``: the effect's start is written before the
request leaves, and a crash, a lost lease, a timeout or a lost answer sends the same id and
body again (a fresh timestamp and signature), never ``unknown``. Its answer decides:

- 2xx: accepted, the job completes;
- 410 Gone: the endpoint is disabled, and this delivery held with the others;
- any other 4xx but 408, 409, 425 and 429: rejected; the job completes with the error type
  ``WebhookDeliveryRejected`` (it is not retried) and the key's next message goes on;
- 429, 408, 409, 425, 5xx, a 3xx (redirects are not followed) or no answer: sent again after
  ``WEBHOOK_RETRY_SCHEDULE``'s next delay (or the receiver's ``Retry-After``), the last delay
  repeating; when every attempt has failed for ``WEBHOOK_DISABLE_AFTER``, the endpoint is
  disabled, ``endpoint_disabled`` is sent, and its deliveries are held.

Every attempt is a ``WebhookAttempt`` row (what was sent, what came back) and a metric.
"""

from __future__ import annotations

import email.utils
import time
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from .. import telemetry
from ..conf import checked_settings
from ..errors import Concluded, Deferred
from ..ledger import pauses
from ..ledger.kinds import JobKind
from ..ledger.limits import RateLimit
from ..ledger.retry import RetryAfter
from ..runtime import context
from ..runtime.handlers import effect
from ..runtime.limits import acquire
from ..tables.webhooks import WebhookAttempt, WebhookEndpoint, WebhookMessage
from . import endpoints, sending, signing
from .endpoints import PREFIX

#: The receiver deduplicates by webhook-id for as long as it keeps ids; the ledger may re-send
#: within this window (past the far-away date a held job is due at, so a held delivery is
#: re-sent when its endpoint is enabled, whenever that is).
WINDOW = timedelta(days=366 * 1000)
#: Answers retried rather than rejected (RFC 9110 and Standard Webhooks: the receiver may
#: accept the same request later).
RETRIED_4XX = frozenset({408, 409, 425, 429})
GONE = 410
#: The longest Retry-After honoured; a longer one counts as this.
LONGEST_RETRY_AFTER = 24 * 3600.0
#: Error types kept on a delivery job.
REJECTED, FAILED, THROTTLED = (
    "WebhookDeliveryRejected",
    "WebhookDeliveryFailed",
    "WebhookDeliveryThrottled",
)
ENDPOINT_DELETED = "WebhookEndpointDeleted"


class Resend(RetryAfter):
    """The attempt did not settle the delivery: it is sent again in ``seconds``."""

    def __init__(self, seconds: float, message: str, *, throttled: bool = False) -> None:
        super().__init__(seconds, message)
        self.error_type = THROTTLED if throttled else FAILED


def retry_delay(attempt: int, retry_after: str | None, schedule: Any) -> float:
    """Seconds before the next try after failed attempt number ``attempt`` (1, 2, …): the
    schedule's, or the receiver's ``Retry-After`` (seconds or an HTTP date) when it sent one."""
    delays = list(schedule)
    delay = float(delays[min(max(attempt, 1), len(delays)) - 1])
    asked = parse_retry_after(retry_after)
    return delay if asked is None else min(asked, LONGEST_RETRY_AFTER)


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - (now or timezone.now())).total_seconds())


def outcome_of(sent: sending.Sent) -> str:
    status = sent.status
    if status is None:
        return "timed_out" if sent.timed_out else "failed"
    if 200 <= status < 300:
        return "accepted"
    if status == GONE:
        return "gone"
    if status == 429:
        return "throttled"
    if 400 <= status < 500 and status not in RETRIED_4XX:
        return "rejected"
    return "retried"


def run(event: context.Event) -> None:
    """Deliver the job's message to its endpoint (see the module)."""
    conf = checked_settings()
    endpoint_uid, message_uid = event.payload["endpoint"], event.payload["message"]
    endpoint = WebhookEndpoint.objects.filter(uid=endpoint_uid).first()
    message = WebhookMessage.objects.filter(uid=message_uid).first()
    if endpoint is None or message is None:
        raise Concluded(ENDPOINT_DELETED, f"Endpoint {endpoint_uid} or its message is gone.")
    if not endpoint.enabled:
        _hold(endpoint, endpoint.disabled_reason or "disabled")
    if endpoint.rate_limit:
        limit = RateLimit("webhook:{webhook_endpoint}", endpoint.rate_limit)
        acquire([limit], webhook_endpoint=endpoint.uid)
    body = message.body.encode()
    with effect("deliver", idempotent_for=WINDOW):
        now = timezone.now()
        headers = signing.headers(
            message.uid, int(time.time()), body, endpoints.signing_secrets(endpoint, now)
        )
        sent = sending.post(
            endpoint.url,
            body,
            headers,
            timeout=conf.WEBHOOK_TIMEOUT_SECONDS,
            allow_private=conf.WEBHOOK_ALLOW_PRIVATE,
        )
    outcome = outcome_of(sent)
    at = timezone.now()
    with transaction.atomic():  # the attempt and the endpoint's health: one commit
        WebhookAttempt.objects.create(
            message=message,
            endpoint=endpoint,
            job_id=event.job_id,
            outcome=outcome,
            status_code=sent.status,
            response=sent.body,
            latency_ms=round(sent.seconds * 1000, 3),
            request_headers=headers,
            error=sent.error,
            at=at,
        )
        if outcome == "accepted":
            if endpoints.needs_success_written(endpoint, at):
                endpoints.succeeded(endpoint.pk, at)
        else:
            since = endpoints.failed(endpoint.pk, at)
    telemetry.WEBHOOK_ATTEMPTS.labels(outcome).inc()
    telemetry.WEBHOOK_SECONDS.labels(outcome).observe(sent.seconds)
    if outcome == "accepted":
        return
    if outcome == "gone":
        endpoints.disable(endpoint.uid, reason="gone", detail="it answered 410 Gone")
        _hold(endpoint, "it answered 410 Gone")
    if at - since >= conf.WEBHOOK_DISABLE_AFTER:
        why = f"every attempt failed since {since.isoformat(timespec='seconds')}"
        endpoints.disable(endpoint.uid, reason="failing", detail=why)
        if outcome != "rejected":
            _hold(endpoint, why)
    said = f"{sent.status or sent.error or 'no answer'}: {sent.body[:200]}".strip(": ")
    if outcome == "rejected":
        raise Concluded(REJECTED, f"The receiver rejected {message.uid}: {said}")
    delay = retry_delay(event.attempt, sent.retry_after, conf.WEBHOOK_RETRY_SCHEDULE)
    raise Resend(delay, f"{message.uid} was not accepted ({said})", throttled=sent.status == 429)


def _hold(endpoint: WebhookEndpoint, why: str) -> None:
    """Back, held with the endpoint's other deliveries, spending no attempt."""
    endpoints.hold(endpoint.uid, why)
    raise Deferred(
        pauses.seconds_until_held(), f"Endpoint {endpoint.uid} is disabled ({why}): held."
    )


def describe_error(error: BaseException) -> tuple[str, str]:
    if isinstance(error, Resend):
        return error.error_type, str(error)
    return type(error).__name__, str(error)


def timeout(event_type: str) -> float | None:
    """An attempt's bound: the request's own, and time for the ledger's writes around it."""
    return checked_settings().WEBHOOK_TIMEOUT_SECONDS + 30.0


#: Deliveries of outbound webhooks, as a kind of job (registered in ``AppConfig.ready``).
WEBHOOK_KIND = JobKind(
    "webhook",
    "outbound webhook deliveries",
    PREFIX,
    run=run,
    timeout=timeout,
    describe_error=describe_error,
    can_wait=False,
)

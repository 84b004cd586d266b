"""Replays: a delivery sent again, or every delivery of an endpoint in a time window.

A replay is the same message: the same ``webhook-id`` and body (a fresh timestamp and
signature), sent as a new delivery job at the end of its key's order on that endpoint. A
receiver that accepted it once and deduplicates on ``webhook-id`` ignores it: a replay is for
what a receiver rejected, lost on its side, or was never sent while a bug was being fixed.
A delivery of that message to that endpoint that is still pending is not replayed again (it
will be sent anyway); a disabled endpoint is refused (enable it: what it holds is sent).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction

from ..ledger import stats
from ..tables.webhooks import WebhookAttempt, WebhookMessage
from .endpoints import get
from .publishing import APP, enqueue_delivery
from .refusals import WebhookEndpointDisabled, WebhookEventInvalid


@dataclass
class Replayed:
    """What a replay did: the new jobs by message id, and the messages skipped (pending)."""

    jobs: dict[str, int] = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)


def _pending(message_uid: str, endpoint_uid: str) -> bool:
    return stats.unfinished_with_key_prefix(APP, f"{message_uid}:{endpoint_uid}")


def replay(message_uid: str, endpoint_uid: str) -> Replayed:
    """Send one message to one endpoint again."""
    endpoint = get(endpoint_uid)
    if not endpoint.enabled:
        raise WebhookEndpointDisabled(
            f"Endpoint {endpoint_uid} is disabled ({endpoint.disabled_reason}); a replay would "
            "only be held."
        )
    message = WebhookMessage.objects.filter(uid=message_uid).first()
    if message is None:
        raise WebhookEventInvalid(f"No webhook message {message_uid!r} (it may have been purged).")
    done = Replayed()
    with transaction.atomic():
        _one(message, endpoint_uid, done)
    return done


def _one(message: WebhookMessage, endpoint_uid: str, done: Replayed) -> None:
    if _pending(message.uid, endpoint_uid):
        done.pending.append(message.uid)
        return
    event_id = f"{message.uid}:{endpoint_uid}:replay-{secrets.token_hex(6)}"
    done.jobs[message.uid] = enqueue_delivery(
        message.uid, endpoint_uid, message.key, event_id=event_id, tenant=message.tenant
    )


def replay_window(endpoint_uid: str, since: datetime, until: datetime) -> Replayed:
    """Send again every message published in [since, until] that was delivered (or tried)
    to the endpoint, in publish order (so each key's stay in order)."""
    endpoint = get(endpoint_uid)
    if not endpoint.enabled:
        raise WebhookEndpointDisabled(
            f"Endpoint {endpoint_uid} is disabled ({endpoint.disabled_reason}); a replay would "
            "only be held."
        )
    tried = WebhookAttempt.objects.filter(endpoint=endpoint).values("message_id")
    messages = WebhookMessage.objects.filter(
        pk__in=tried, created_at__gte=since, created_at__lte=until
    ).order_by("id")
    done = Replayed()
    with transaction.atomic():
        for message in messages:
            _one(message, endpoint_uid, done)
    return done

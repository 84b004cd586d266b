"""``publish``: a message and one delivery job per subscribed endpoint, in the caller's
transaction.

A delivery job of endpoint ``ep`` is in the partition ``webhook:<ep>:<key>`` (a message
without a key: ``webhook:<ep>:~<msg id>``, a partition of its own), so an endpoint gets the
messages of one key one at a time, in publish order; its event type is ``webhook:<ep>``
(what the endpoint's pause holds); its payload names the message and the endpoint, whose body
and secret are read when it runs. An endpoint that is disabled gets its deliveries all the
same: they are held (a pause), sent when it is enabled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from ..conf import checked_settings
from ..ledger import rules as ledger
from ..ledger import tenants
from ..tables.webhooks import WebhookEndpoint, WebhookMessage
from . import signing
from .endpoints import PREFIX, event_type_of
from .refusals import WebhookEventInvalid, WebhookEventUnknown

#: The ledger's app of delivery jobs.
APP = "webhooks"
KEY_LIMIT = 200
TYPE_LIMIT = 128
#: A delivery never runs out of attempts: it is sent until accepted, rejected, or its
#: endpoint disabled (then held). The ledger's column holds this much.
ATTEMPTS = 1_000_000


@dataclass(frozen=True)
class Published:
    """A published message: its ``webhook-id`` and the endpoints it goes to."""

    message_id: str
    endpoints: tuple[str, ...]


def partition_key(endpoint_uid: str, key: str, message_uid: str) -> str:
    return f"{PREFIX}{endpoint_uid}:" + (key if key else f"~{message_uid}")


def body_of(event_type: str, payload: Any, at: str) -> str:
    """The JSON body every delivery of the message sends: Standard Webhooks' envelope."""
    try:
        return json.dumps(
            {"type": event_type, "timestamp": at, "data": payload},
            ensure_ascii=False,
            allow_nan=False,
            separators=(",", ":"),
        )
    except (TypeError, ValueError) as exc:
        raise WebhookEventInvalid(
            f"The payload of a {event_type!r} event is not JSON data ({exc}); nothing was "
            "published."
        ) from None


def check(event_type: object, key: object) -> str:
    if not isinstance(event_type, str) or not 0 < len(event_type) <= TYPE_LIMIT:
        raise WebhookEventInvalid(
            f"An event type is 1 to {TYPE_LIMIT} characters (got {event_type!r:.80})."
        )
    declared = checked_settings().WEBHOOK_EVENT_TYPES
    if declared and event_type not in declared:
        raise WebhookEventUnknown(
            f"{event_type!r} is not an event type of this site (WEBHOOK_EVENT_TYPES: "
            f"{', '.join(declared)}); nothing was published."
        )
    if key is not None and (not isinstance(key, str) or not 0 < len(key) <= KEY_LIMIT):
        raise WebhookEventInvalid(
            f"A key is a string of 1 to {KEY_LIMIT} characters, or None (got {key!r:.80})."
        )
    return event_type


def subscribed(event_type: str) -> list[WebhookEndpoint]:
    """The endpoints a message of this type goes to, enabled or not, in id order."""
    return [
        e
        for e in WebhookEndpoint.objects.order_by("id").only("id", "uid", "event_types")
        if not e.event_types or event_type in e.event_types
    ]


def publish(
    event_type: str, payload: Any, *, key: str | None = None, tenant: str | None = None
) -> Published:
    """Publish an event: one delivery per subscribed endpoint, inside the caller's
    transaction (nothing is sent if it rolls back). Deliveries of one ``key`` reach each
    endpoint in publish order; without a key they may overtake each other. ``tenant``: whose
    message it is (SPEC §9j; None: the enclosing ``feishu_inbox.tenant`` block's, or the
    running handler's job's)."""
    check(event_type, key)
    tenant = tenants.resolve(tenant, what=f"A webhook message of type {event_type!r}")
    now = timezone.now()
    body = body_of(event_type, payload, now.isoformat().replace("+00:00", "Z"))
    uid = signing.new_id("msg")
    with transaction.atomic():
        WebhookMessage.objects.create(
            uid=uid, event_type=event_type, key=key or "", body=body, created_at=now, tenant=tenant
        )
        endpoints = subscribed(event_type)
        for endpoint in endpoints:
            event_id = f"{uid}:{endpoint.uid}"
            enqueue_delivery(uid, endpoint.uid, key or "", event_id=event_id, tenant=tenant)
    return Published(uid, tuple(e.uid for e in endpoints))


def enqueue_delivery(
    message_uid: str, endpoint_uid: str, key: str, *, event_id: str, tenant: str
) -> int:
    """One delivery job (a replay's too) of the message's tenant; returns its id."""
    return ledger.enqueue(
        event_id=event_id,
        event_type=event_type_of(endpoint_uid),
        partition_key=partition_key(endpoint_uid, key, message_uid),
        payload={"message": message_uid, "endpoint": endpoint_uid},
        app=APP,
        max_attempts=ATTEMPTS,
        tenant=tenant,
    ).job_id

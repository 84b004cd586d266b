"""Outbound webhooks (SPEC §9h): signed, ordered, retried and throttled deliveries.

    from feishu_inbox import webhooks

    new = webhooks.add_endpoint("https://example.com/hooks", event_types=["order.paid"])
    new.secret            # whsec_…: readable this once, give it to the receiver
    with transaction.atomic():
        order.save()
        webhooks.publish("order.paid", {"id": order.pk}, key=f"order:{order.pk}")

The modules:

- ``endpoints``: endpoints added, changed, their secret rotated, enabled and disabled (the
  ``endpoint_disabled`` signal), their URL checked;
- ``publishing``: ``publish``, a message and one delivery job per subscribed endpoint;
- ``delivery``: a delivery as a job kind: held, throttled, sent, its answer acted on;
- ``sending``: one POST, bounded in time and in what it reads;
- ``signing``: Standard Webhooks' secrets, ids and signatures;
- ``replays``: one delivery, or an endpoint's in a time window, sent again;
- ``refusals``: the typed errors, each with its code and fix.

The tables are ``feishu_inbox.tables.webhooks``; docs/webhooks.md is the manual.
"""

from __future__ import annotations

from .endpoints import (
    NewEndpoint,
    add_endpoint,
    delete,
    disable,
    enable,
    endpoint_disabled,
    get,
    rotate_secret,
    update,
)
from .publishing import Published, publish
from .refusals import (
    WebhookDeliveryRejected,
    WebhookEndpointDisabled,
    WebhookEndpointInvalid,
    WebhookEndpointUnknown,
    WebhookError,
    WebhookEventInvalid,
    WebhookEventUnknown,
)
from .replays import Replayed, replay, replay_window

__all__ = [
    "NewEndpoint",
    "Published",
    "Replayed",
    "WebhookDeliveryRejected",
    "WebhookEndpointDisabled",
    "WebhookEndpointInvalid",
    "WebhookEndpointUnknown",
    "WebhookError",
    "WebhookEventInvalid",
    "WebhookEventUnknown",
    "add_endpoint",
    "delete",
    "disable",
    "enable",
    "endpoint_disabled",
    "get",
    "publish",
    "replay",
    "replay_window",
    "rotate_secret",
    "update",
]

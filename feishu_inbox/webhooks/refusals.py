"""The webhooks' refusals: each a code of ``errors.CATALOGUE`` with its fix."""

from __future__ import annotations

from ..errors import LedgerError


class WebhookError(LedgerError):
    """A webhook operation was refused; nothing changed."""

    code = "webhook_endpoint_invalid"


class WebhookEndpointInvalid(WebhookError):
    code = "webhook_endpoint_invalid"


class WebhookEndpointUnknown(WebhookError):
    code = "webhook_endpoint_unknown"


class WebhookEndpointDisabled(WebhookError):
    code = "webhook_endpoint_disabled"


class WebhookEventInvalid(WebhookError):
    code = "webhook_event_invalid"


class WebhookEventUnknown(WebhookError):
    code = "webhook_event_unknown"


class WebhookDeliveryRejected(WebhookError):
    code = "webhook_delivery_rejected"


#: Every refusal class (a test checks each one's code is catalogued).
REFUSALS = (
    WebhookError,
    WebhookEndpointInvalid,
    WebhookEndpointUnknown,
    WebhookEndpointDisabled,
    WebhookEventInvalid,
    WebhookEventUnknown,
    WebhookDeliveryRejected,
)

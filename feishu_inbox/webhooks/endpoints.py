"""Endpoints: added, changed, their secret rotated, enabled and disabled; their URL checked.

A disabled endpoint (by an operator, a 410 Gone, or failing for ``WEBHOOK_DISABLE_AFTER``)
holds its deliveries through the ledger's operator pause of its event type
(``webhook:<ep_id>``): held jobs stay the heads of their keys' partitions, so enabling it
sends what was held in order, and nothing is dropped.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from django.db import transaction
from django.db.models import F, Q
from django.dispatch import Signal
from django.utils import timezone

from .. import telemetry
from ..conf import checked_settings
from ..errors import LedgerError, PauseNotFound
from ..ledger import pauses
from ..models import PauseKind
from ..tables.webhooks import WebhookEndpoint
from . import signing
from .refusals import WebhookEndpointInvalid, WebhookEndpointUnknown, WebhookEventUnknown
from .sending import is_public

log = logging.getLogger("feishu_inbox.webhooks")

#: Sent when an endpoint is disabled by the ledger or an operator: ``endpoint`` (the row),
#: ``reason`` ("gone", "failing" or "operator") and ``detail`` (in words).
endpoint_disabled = Signal()

#: The prefix of a delivery job's event type: ``webhook:<ep_id>``.
PREFIX = "webhook:"
#: The pause's author, for a pause the ledger made.
BY = "webhooks"
#: Host names that are the machine itself, refused with private addresses.
LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")
URL_LIMIT = 2000


@dataclass(frozen=True)
class NewEndpoint:
    """What ``add_endpoint`` and ``rotate_secret`` return: the row and its secret, which is
    readable this once (it is never shown again: not by the admin, the CLI or a log)."""

    endpoint: WebhookEndpoint
    secret: str

    @property
    def uid(self) -> str:
        return self.endpoint.uid


def event_type_of(uid: str) -> str:
    return PREFIX + uid


def check_url(url: object, *, allow_private: bool | None = None) -> str:
    """The URL, or ``WebhookEndpointInvalid`` saying what is wrong with it."""
    if allow_private is None:
        allow_private = checked_settings().WEBHOOK_ALLOW_PRIVATE
    if not isinstance(url, str) or not url or len(url) > URL_LIMIT:
        raise WebhookEndpointInvalid(f"A webhook URL is a string of 1 to {URL_LIMIT} characters.")
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        _ = parts.port  # raises on a bad port
    except ValueError as exc:
        raise WebhookEndpointInvalid(f"The webhook URL is not a URL ({exc}).") from None
    if parts.scheme not in ("http", "https"):
        raise WebhookEndpointInvalid(
            f"A webhook URL must be http or https (got {parts.scheme or 'no scheme'!r})."
        )
    if not host:
        raise WebhookEndpointInvalid("The webhook URL has no host.")
    if parts.username is not None or parts.password is not None:
        raise WebhookEndpointInvalid(
            "The webhook URL carries credentials (user:password@): they would be stored and "
            "shown with it. Authenticate the receiver by the signature instead."
        )
    if parts.fragment:
        raise WebhookEndpointInvalid("The webhook URL has a #fragment, which is never sent.")
    if not allow_private:
        private = host in LOCAL_NAMES or host.endswith(".localhost")
        with contextlib.suppress(ValueError):  # a name: its addresses are checked at send
            private = private or not is_public(str(ipaddress.ip_address(host)))
        if private:
            raise WebhookEndpointInvalid(
                f"The webhook URL's host {host} is a private, loopback or link-local address: "
                "a webhook must not reach into the site's own network."
            )
    return url


def check_event_types(event_types: object) -> list[str]:
    if not isinstance(event_types, list | tuple) or not all(
        isinstance(t, str) and 0 < len(t) <= 128 for t in event_types
    ):
        raise WebhookEndpointInvalid(
            f"event_types must be a list of event type names (got {event_types!r}); an empty "
            "list subscribes to every event type."
        )
    declared = checked_settings().WEBHOOK_EVENT_TYPES
    unknown = sorted(set(event_types) - set(declared)) if declared else []
    if unknown:
        raise WebhookEventUnknown(
            f"The endpoint subscribes to event types the site does not declare: "
            f"{', '.join(unknown)} (WEBHOOK_EVENT_TYPES has {', '.join(declared)})."
        )
    return sorted(set(event_types))


def _listed(event_types: object) -> object:
    """A list of what was given; a string stays one (refused: a list was meant)."""
    if isinstance(event_types, str) or not hasattr(event_types, "__iter__"):
        return event_types
    return list(event_types)


def check_rate_limit(rate_limit: object) -> float | None:
    if rate_limit is None:
        return None
    if isinstance(rate_limit, bool) or not isinstance(rate_limit, int | float) or rate_limit <= 0:
        raise WebhookEndpointInvalid(
            f"rate_limit must be a number of requests per second > 0, or None (got {rate_limit!r})."
        )
    return float(rate_limit)


def add_endpoint(
    url: str,
    *,
    event_types: Iterable[str] = (),
    description: str = "",
    rate_limit: float | None = None,
    enabled: bool = True,
) -> NewEndpoint:
    """Store an endpoint with a new ``whsec_`` secret; the secret is readable this once."""
    types = check_event_types(_listed(event_types))
    endpoint = WebhookEndpoint(
        uid=signing.new_id("ep"),
        url=check_url(url),
        description=str(description)[:255],
        event_types=types,
        secret=signing.new_secret(),
        rate_limit=check_rate_limit(rate_limit),
        enabled=True,
        created_at=timezone.now(),
    )
    endpoint.save()
    log.info("webhook endpoint %s added (%d event types)", endpoint.uid, len(types))
    if not enabled:
        disable(endpoint.uid, reason="operator", detail="added disabled")
        endpoint.refresh_from_db()
    return NewEndpoint(endpoint, endpoint.secret)


def get(uid: str) -> WebhookEndpoint:
    found = WebhookEndpoint.objects.filter(uid=uid).first()
    if found is None:
        raise WebhookEndpointUnknown(f"No webhook endpoint {uid!r}.")
    return found


def update(
    uid: str,
    *,
    url: str | None = None,
    event_types: Iterable[str] | None = None,
    description: str | None = None,
    rate_limit: float | bool | None = False,
) -> WebhookEndpoint:
    """Change what is given (``rate_limit=None``: no limit of its own; False: unchanged)."""
    endpoint = get(uid)
    if url is not None:
        endpoint.url = check_url(url)
    if event_types is not None:
        endpoint.event_types = check_event_types(_listed(event_types))
    if description is not None:
        endpoint.description = str(description)[:255]
    if rate_limit is not False:
        endpoint.rate_limit = check_rate_limit(rate_limit)
    endpoint.save(update_fields=["url", "event_types", "description", "rate_limit"])
    return endpoint


def rotate_secret(uid: str, *, grace: timedelta | None = None) -> NewEndpoint:
    """A new secret; the old one signs too (a second signature) for ``grace`` (default
    ``WEBHOOK_ROTATION_GRACE``), so receivers can switch without losing a request."""
    grace = checked_settings().WEBHOOK_ROTATION_GRACE if grace is None else grace
    if not isinstance(grace, timedelta) or grace < timedelta(0):
        raise WebhookEndpointInvalid(f"grace must be a timedelta >= 0 (got {grace!r}).")
    new = signing.new_secret()
    with transaction.atomic():
        endpoint = WebhookEndpoint.objects.select_for_update().filter(uid=uid).first()
        if endpoint is None:
            raise WebhookEndpointUnknown(f"No webhook endpoint {uid!r}.")
        endpoint.previous_secret, endpoint.secret = endpoint.secret, new
        endpoint.previous_secret_until = timezone.now() + grace
        endpoint.save(update_fields=["secret", "previous_secret", "previous_secret_until"])
    log.info("webhook endpoint %s: secret rotated (the old one signs for %s more)", uid, grace)
    return NewEndpoint(endpoint, new)


def signing_secrets(endpoint: WebhookEndpoint, now: datetime) -> list[str]:
    """The secrets a request is signed with now: the current one, and the rotated one while
    its grace lasts."""
    found = [endpoint.secret]
    until = endpoint.previous_secret_until
    if endpoint.previous_secret and until is not None and until > now:
        found.append(endpoint.previous_secret)
    return found


def disable(uid: str, *, reason: str = "operator", detail: str = "") -> bool:
    """Disable the endpoint and hold its deliveries (in order). False: it was disabled."""
    now = timezone.now()
    words = detail or {"operator": "disabled by an operator"}.get(reason, reason)
    changed = WebhookEndpoint.objects.filter(uid=uid, enabled=True).update(
        enabled=False, disabled_reason=words[:255], disabled_at=now
    )
    if not changed:
        get(uid)  # unknown: refused
        hold(uid, words)
        return False
    hold(uid, words)
    endpoint = get(uid)
    telemetry.WEBHOOK_DISABLED.labels(reason).inc()
    log.warning("webhook endpoint %s disabled (%s): its deliveries are held", uid, words)
    endpoint_disabled.send(sender=WebhookEndpoint, endpoint=endpoint, reason=reason, detail=words)
    return True


def hold(uid: str, why: str) -> None:
    """The pause that holds the endpoint's deliveries (made again if an operator lifted it
    while the endpoint stays disabled)."""
    pauses.pause(PauseKind.EVENT_TYPE, event_type_of(uid), by=BY, reason=why[:500])


def enable(uid: str) -> int:
    """Enable the endpoint: its held deliveries are due now, each key's in order, and its
    failure span starts again. Returns how many deliveries were released."""
    get(uid)
    WebhookEndpoint.objects.filter(uid=uid).update(
        enabled=True, disabled_reason="", disabled_at=None, failing_since=None, failure_streak=0
    )
    try:
        released = pauses.resume(PauseKind.EVENT_TYPE, event_type_of(uid), by=BY).jobs
    except PauseNotFound:
        released = 0
    log.info("webhook endpoint %s enabled: %d held deliveries released", uid, released)
    return released


def delete(uid: str) -> None:
    """Delete the endpoint and its attempts. Deliveries still pending end when they run
    (``WebhookEndpointDeleted``), each key's next one going on."""
    endpoint = get(uid)
    with contextlib.suppress(PauseNotFound, LedgerError):
        pauses.resume(PauseKind.EVENT_TYPE, event_type_of(uid), by=BY)
    endpoint.delete()


# --- health, written by each attempt (``delivery.py``) --------------------------------------


#: A healthy endpoint's last success is written at most this often (one write per delivery
#: otherwise, on the hottest row of the table).
SUCCESS_RESOLUTION = timedelta(seconds=1)


def needs_success_written(endpoint: WebhookEndpoint, now: datetime) -> bool:
    """Whether a 2xx changes the endpoint's row as it was read when the attempt began (a
    healthy, busy endpoint's is not written again within ``SUCCESS_RESOLUTION``)."""
    last = endpoint.last_success_at
    return bool(endpoint.failure_streak) or last is None or last < now - SUCCESS_RESOLUTION


def succeeded(endpoint_id: int, now: datetime) -> None:
    """A 2xx: the streak ends; the last success is written when it ended a streak, or is at
    least ``SUCCESS_RESOLUTION`` old."""
    WebhookEndpoint.objects.filter(
        Q(failure_streak__gt=0)
        | Q(last_success_at__isnull=True)
        | Q(last_success_at__lt=now - SUCCESS_RESOLUTION),
        pk=endpoint_id,
    ).update(failure_streak=0, failing_since=None, last_success_at=now)


def failed(endpoint_id: int, now: datetime) -> datetime:
    """Count a failed attempt; returns since when every attempt has failed."""
    WebhookEndpoint.objects.filter(pk=endpoint_id, failing_since__isnull=True).update(
        failing_since=now
    )
    WebhookEndpoint.objects.filter(pk=endpoint_id).update(
        failure_streak=F("failure_streak") + 1, last_failure_at=now
    )
    since = (
        WebhookEndpoint.objects.filter(pk=endpoint_id)
        .values_list("failing_since", flat=True)
        .first()
    )
    return since or now

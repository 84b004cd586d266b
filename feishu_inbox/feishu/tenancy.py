"""Store (ISV) apps: one ``tenant_access_token`` per tenant, from the app's ``app_ticket``.

An app with ``"APP_TYPE": "store"`` in ``FEISHU_INBOX["APPS"]`` is installed by many
organisations. Feishu pushes it an ``app_ticket`` event about every hour (``store_ticket``
keeps the newest in the ledger; no job is made of it: the ticket is a secret); with the ticket
the app gets its ``app_access_token`` (``POST /open-apis/auth/v3/app_access_token``), and with
that a ``tenant_access_token`` per tenant (``POST /open-apis/auth/v3/tenant_access_token``
with the ``tenant_key``). Each token is kept in the ledger until it nears its expiry
(``STORE_TOKEN_MARGIN_SECONDS``) and fetched once per expiry across every worker
(``ledger/credentials.py``). ``openapi.call`` uses the running job's tenant's token, so
``reply``, ``send`` and streamed cards answer each tenant as itself without the handler
saying so.

Without a ticket (the first hour after the app is installed, or Feishu refused the stored one:
code 10012) the app cannot get a token: ``POST /open-apis/auth/v3/app_ticket/resend`` asks
Feishu to push one now (one worker asks, at most once a minute), and ``TicketMissing`` tells
the caller to wait: ``reply`` and ``send`` defer their job (no attempt spent, as a rate limit
does) instead of failing it.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta, timezone
from typing import Any

from ..conf import checked_settings
from ..errors import (
    ConfigurationError,
    Deferred,
    FeishuBusinessError,
    FeishuRateLimited,
    FeishuTransientError,
)
from ..ledger import credentials, tenants
from . import protocol

log = logging.getLogger("feishu_inbox.openapi")

APP_TICKET_EVENT = "app_ticket"
#: Feishu's code for a ticket it does not accept (expired, or another app's).
TICKET_INVALID_CODE = 10012
RATE_LIMITED_CODE = 99991400
#: A job that met a missing ticket runs again after this many seconds (Feishu pushes the
#: ticket within seconds of a resend request).
TICKET_WAIT_SECONDS = 5.0
#: A rate-limited token request is tried again after this long (Feishu names no reset).
RATE_LIMIT_WAIT = timedelta(seconds=10)
#: Feishu's code for an app token it does not accept (revoked, or rotated early).
APP_TOKEN_INVALID_CODE = 99991664


class TicketMissing(FeishuTransientError):
    """The store app has no ``app_ticket`` (yet): Feishu was asked to push one; try again in
    a few seconds. Nothing was sent."""


def is_store_app(app: str) -> bool:
    return (checked_settings().APPS.get(app) or {}).get("APP_TYPE") == "store"


def tenant_of(app: str, tenant: str | None) -> str | None:
    """The tenant whose token a call of a store app uses: ``tenant``, else the enclosing
    ``feishu_inbox.tenant`` block's (a running handler's: its job's); None for a self-built
    app (its one tenant's token, as before)."""
    if not is_store_app(app):
        return None
    found = tenant if tenant is not None else tenants.current()
    if not found:
        raise ConfigurationError(
            f"App {app!r} is a store app: a call needs the tenant it is for, and none is known.",
            fix="Call it from a handler of an event of that tenant, inside "
            "`with feishu_inbox.tenant(tenant_key):`, or pass tenant=.",
        )
    return found


def ready(creds: Any, client: Any, tenant: str) -> None:
    """Before an effect of a handler (``openapi.ready``): the tenant's token now, so that a
    missing ticket, or another worker's fetch of the token that outlasted the whole wait,
    defers the job (``Deferred``: no attempt spent, nothing sent) instead of failing it."""
    try:
        tenant_token(creds, client, tenant)
    except (TicketMissing, credentials.FetchBusy) as exc:  # nothing sent: no attempt spent
        raise Deferred(TICKET_WAIT_SECONDS, exc.message) from None


# --- the ticket ------------------------------------------------------------------------------


def store_ticket(app: str, body: dict[str, Any]) -> bool:
    """Keep an ``app_ticket`` event's ticket if it is the newest (True when kept). A ticket
    of another app than the settings' APP_ID is ignored."""
    event = body.get("event") if isinstance(body.get("event"), dict) else {}
    assert isinstance(event, dict)
    value, app_id = event.get("app_ticket"), event.get("app_id")
    expected = (checked_settings().APPS.get(app) or {}).get("APP_ID")
    if not isinstance(value, str) or not value or (expected and app_id != expected):
        log.warning("app %s: an app_ticket event without a ticket of this app; ignored", app)
        return False
    try:
        issued = float(body.get("ts") or "")
    except ValueError:
        issued = None
    kept = credentials.store_ticket(app, value, issued)
    log.info("app %s: %s an app_ticket", app, "stored" if kept else "kept a newer one than")
    return kept


# --- the tokens ------------------------------------------------------------------------------


def tenant_token(creds: Any, client: Any, tenant: str) -> str:
    """The tenant's ``tenant_access_token``, fetched (with the app's token) at most once per
    expiry across every worker; ``TicketMissing`` when there is no ticket to start from."""
    margin = checked_settings().STORE_TOKEN_MARGIN_SECONDS

    def fetch() -> tuple[str, float]:
        from lark_oapi.api.auth.v3 import (
            CreateTenantAccessTokenRequest,
            CreateTenantAccessTokenRequestBody,
        )

        for last_try in (False, True):
            app_token = app_access_token(creds, client)
            body = {"app_access_token": app_token, "tenant_key": tenant}
            request = (
                CreateTenantAccessTokenRequest.builder()
                .request_body(CreateTenantAccessTokenRequestBody(body))
                .build()
            )
            answer = _post(creds, client, request, f"the tenant token of tenant {tenant!r}")
            if answer.get("code") != APP_TOKEN_INVALID_CODE or last_try:
                break
            # the app token was revoked or rotated early: fetch it anew, once
            credentials.forget(creds.app, credentials.APP_TOKEN, "", app_token)
        return _token(creds, answer, "tenant_access_token", f"tenant {tenant!r}")

    return credentials.shared_token(
        creds.app, credentials.TENANT_TOKEN, tenant, fetch, margin=margin
    )


def app_access_token(creds: Any, client: Any) -> str:
    """The store app's ``app_access_token`` (from its newest ticket)."""
    margin = checked_settings().STORE_TOKEN_MARGIN_SECONDS

    def fetch() -> tuple[str, float]:
        from lark_oapi.api.auth.v3 import (
            CreateAppAccessTokenRequest,
            CreateAppAccessTokenRequestBody,
        )

        ticket = credentials.ticket(creds.app)
        if not ticket:
            raise _missing(creds, client, "no app_ticket was pushed yet")
        body = {"app_id": creds.app_id, "app_secret": creds.app_secret, "app_ticket": ticket}
        request = (
            CreateAppAccessTokenRequest.builder()
            .request_body(CreateAppAccessTokenRequestBody(body))
            .build()
        )
        answer = _post(creds, client, request, "the app token")
        if answer.get("code") == TICKET_INVALID_CODE:
            credentials.forget_ticket(creds.app, ticket)
            raise _missing(creds, client, "Feishu refused the stored app_ticket (code 10012)")
        return _token(creds, answer, "app_access_token", "the app")

    return credentials.shared_token(creds.app, credentials.APP_TOKEN, "", fetch, margin=margin)


def forget(creds: Any, tenant: str, token: str) -> None:
    """Feishu refused this tenant token (99991663): fetch it anew on the next call."""
    credentials.forget(creds.app, credentials.TENANT_TOKEN, tenant, token)


def _missing(creds: Any, client: Any, why: str) -> TicketMissing:
    """Ask Feishu to push the ticket again (one worker, at most once a minute)."""
    if credentials.claim_resend(creds.app):
        from lark_oapi.api.auth.v3 import ResendAppTicketRequest, ResendAppTicketRequestBody

        body = {"app_id": creds.app_id, "app_secret": creds.app_secret}
        request = ResendAppTicketRequest.builder().request_body(ResendAppTicketRequestBody(body))
        try:
            answer = _post(creds, client, request.build(), "a new app_ticket")
        except FeishuTransientError as exc:
            log.warning("app %s: asking Feishu for an app_ticket failed: %s", creds.app, exc)
        else:
            log.warning(
                "app %s: %s; asked Feishu to push a new app_ticket (code %s)",
                creds.app,
                why,
                answer.get("code"),
            )
    return TicketMissing(
        f"Store app {creds.app!r} has no app_ticket to get a token with ({why}); Feishu was "
        "asked to push one.",
        app=creds.app,
        fix="Nothing: the job waits for the ticket. If it lasts, check that the app's event "
        "URL (or long connection) receives the app_ticket event.",
    )


def _post(creds: Any, client: Any, request: Any, what: str) -> dict[str, Any]:
    """POST one auth request; its JSON answer (any code), or the typed error of a failure."""
    import requests
    from lark_oapi.core.model import RequestOption

    option = RequestOption.builder().headers({"Content-Type": "application/json; charset=utf-8"})
    try:
        raw = client.request(request, option.build()).raw
    except requests.RequestException as exc:
        raise FeishuTransientError(
            f"Could not get {what} for app {creds.app!r}: {type(exc).__name__}: {exc}",
            app=creds.app,
        ) from exc
    try:
        answer = json.loads(raw.content or b"")
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or raw.status_code >= 500:
        raise FeishuTransientError(
            f"Feishu's answer for {what} of app {creds.app!r} is unreadable (HTTP "
            f"{raw.status_code}).",
            app=creds.app,
            status=raw.status_code,
        )
    code, msg = answer.get("code"), str(answer.get("msg") or "")
    if raw.status_code == 429 or code == RATE_LIMITED_CODE:
        raise FeishuRateLimited(
            f"Feishu rate-limited the request for {what} of app {creds.app!r}: {msg}",
            app=creds.app,
            feishu_code=code,
            feishu_msg=msg,
            reset_at=datetime.now(timezone.utc) + RATE_LIMIT_WAIT,
        )
    return answer


def _token(creds: Any, answer: dict[str, Any], field: str, whose: str) -> tuple[str, float]:
    token, expire = answer.get(field), answer.get("expire")
    if answer.get("code") == 0 and isinstance(token, str) and token and isinstance(expire, int):
        return token, float(expire)
    code, msg = answer.get("code"), str(answer.get("msg") or "")
    raise FeishuBusinessError(
        f"Feishu refused the {field} of {whose} (app {creds.app!r}): code {code} {msg}",
        app=creds.app,
        feishu_code=code if isinstance(code, int) else None,
        feishu_msg=msg,
        fix=f"Check APP_ID, APP_SECRET and APP_TYPE of FEISHU_INBOX['APPS'][{creds.app!r}], "
        "and that the tenant installed the app.",
    )


def job_tenant(app: str, envelope: protocol.Envelope) -> str:
    """The tenant an event's job is stored with: a store app's event's ``tenant_key`` (whose
    token answers it); "" (explicitly none) for a self-built app, whose one organisation every
    event names. So a self-built app's event is deduplicated exactly as before tenants, across
    an upgrade too (a redelivery of an event stored by an older release is still a duplicate),
    and a site's own tenants (``tenant=``) are not confused with Feishu's."""
    return envelope.tenant_key if is_store_app(app) else ""

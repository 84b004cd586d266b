"""A store app's ticket and tokens, shared by every worker through the ledger (SPEC §9j).

Feishu pushes a store (ISV) app an ``app_ticket`` about every hour; with it the app gets its
``app_access_token``, and with that one ``tenant_access_token`` per tenant. Each lives about
two hours. The rows (``tables/tenants.py``) hold the newest of each, so that:

- a ticket is stored once per delivery and the newest wins (``store_ticket``): an older one
  delivered late, or again, never replaces a newer one;
- each token is fetched once per expiry across every process (``shared_token``): the worker
  that finds it stale takes the row's fetch lease by a conditional UPDATE (stale and no live
  lease), fetches, and writes the value under its lease; the others wait on the row, and a
  fetcher that died is replaced when its lease passes;
- a token Feishu calls invalid is forgotten once (``forget``: only while it still holds that
  value, so a token another worker already replaced stays);
- a missing ticket is asked for at most once per ``RESEND_SECONDS`` (``claim_resend``).

Each process also keeps what it read until it nears expiry, so a reply costs no query. Times
are this host's clock: a skewed host fetches a token early or once more, nothing worse (no
fencing depends on them). The values are secrets: nothing here logs them.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import F, Q
from django.utils import timezone

from ..errors import FeishuTransientError

#: The rows' kinds (``tables/tenants.py``).
TICKET, APP_TOKEN, TENANT_TOKEN = "ticket", "app", "tenant"
#: How long a fetcher holds a row's fetch lease: longer than a fetch (two requests, each
#: within the client's timeout) plus a whole wait (WAIT_SECONDS) for another worker's fetch
#: nested in it (a tenant's token needs the app's, which another worker may be fetching), so
#: that a lease never ends under a fetcher still waiting and a second worker fetches again.
FETCH_LEASE = timedelta(seconds=60)
#: A missing ticket is asked for again (``app_ticket/resend``) at most this often.
RESEND_SECONDS = 60.0
#: How long a worker waits for another's fetch of the same token before it gives up (a
#: transient failure: its job is retried).
WAIT_SECONDS = 35.0


class FetchBusy(FeishuTransientError):
    """Another worker has held the token's fetch for the whole wait (its fetch is slow, or it
    died holding the lease): nothing was sent; try again in a few seconds."""


@dataclass(frozen=True)
class Token:
    value: str
    expires_at: datetime


_cache: dict[tuple[str, str, str], Token] = {}
_cache_lock = threading.Lock()


def forget_cached() -> None:
    """Drop what this process read (tests)."""
    with _cache_lock:
        _cache.clear()


def _table() -> Any:
    """The rows' model, imported on first use (this module loads with the package, before
    Django's apps are ready)."""
    from ..tables.tenants import AppCredential

    return AppCredential


def _rows(app: str, kind: str, tenant: str = "") -> Q:
    return Q(app=app, kind=kind, tenant=tenant)


def _ensure(app: str, kind: str, tenant: str = "") -> None:
    _table().objects.bulk_create(
        [_table()(app=app, kind=kind, tenant=tenant, updated_at=timezone.now())],
        ignore_conflicts=True,
    )


# --- the ticket ------------------------------------------------------------------------------


def store_ticket(app: str, ticket: str, issued_at: float | None) -> bool:
    """Keep ``ticket`` as the app's, unless a newer one is kept (``issued_at``: Feishu's
    ``ts``; None: now). True when it was kept. One transaction, in the caller's if any."""
    issued = time.time() if issued_at is None else issued_at
    _ensure(app, TICKET)
    kept = (
        _table()
        .objects.filter(_rows(app, TICKET))
        .filter(Q(issued_at__isnull=True) | Q(issued_at__lte=issued))
        .update(
            value=ticket,
            issued_at=issued,
            fetches=F("fetches") + 1,
            fetching_until=None,  # a resend asked for is answered
            updated_at=timezone.now(),
        )
    )
    return kept == 1


def ticket(app: str) -> str:
    """The app's newest ticket, "" when none was ever pushed (or it was refused)."""
    found = _table().objects.filter(_rows(app, TICKET)).values_list("value", flat=True)
    return next(iter(found), "")


def claim_resend(app: str) -> bool:
    """True for the one caller (across processes) that should ask Feishu to push the ticket
    again now; the others within ``RESEND_SECONDS`` get False, and so does everyone once a
    ticket is stored (a caller that looked before it landed asks for none)."""
    _ensure(app, TICKET)
    now = timezone.now()
    return (
        _table()
        .objects.filter(_rows(app, TICKET), value="")
        .filter(Q(fetching_until__isnull=True) | Q(fetching_until__lte=now))
        .update(fetching_until=now + timedelta(seconds=RESEND_SECONDS), updated_at=now)
        == 1
    )


def forget_ticket(app: str, value: str) -> None:
    """Feishu refused this ticket (code 10012): drop it, so the next fetch asks for a new
    one (a newer ticket stored meanwhile stays)."""
    _table().objects.filter(_rows(app, TICKET), value=value).update(
        value="", updated_at=timezone.now()
    )


# --- tokens ----------------------------------------------------------------------------------


def shared_token(
    app: str,
    kind: str,
    tenant: str,
    fetch: Callable[[], tuple[str, float]],
    *,
    margin: float,
) -> str:
    """The app's (``kind`` "app") or the tenant's ("tenant") token, fetched by ``fetch`` (which
    returns the value and its lifetime in seconds) at most once per expiry across every
    process: when less than ``margin`` seconds of it are left, one worker fetches a new one
    and the others wait for it. ``fetch``'s exceptions reach the fetcher's caller."""
    key = (app, kind, tenant)
    cached = _cache.get(key)
    if cached is not None and _fresh(cached.expires_at, margin):
        return cached.value
    give_up = time.monotonic() + WAIT_SECONDS
    pause = 0.02
    _ensure(app, kind, tenant)
    while True:
        row = _table().objects.filter(_rows(app, kind, tenant)).first()
        if row is not None and row.value and _fresh(row.expires_at, margin):
            return _keep(key, row.value, row.expires_at)
        me = secrets.token_hex(8)
        now = timezone.now()
        stale = (
            Q(value="")
            | Q(expires_at__isnull=True)
            | Q(expires_at__lte=now + timedelta(seconds=margin))
        )
        free = Q(fetching_until__isnull=True) | Q(fetching_until__lte=now)
        took = (
            _table()
            .objects.filter(_rows(app, kind, tenant))
            .filter(stale & free)
            .update(fetching_by=me, fetching_until=now + FETCH_LEASE)
        )
        if took:
            return _fetch_under_lease(key, me, fetch)
        if time.monotonic() > give_up:
            raise FetchBusy(
                f"Another worker has been fetching the {kind} token of app {app!r}"
                + (f" for tenant {tenant!r}" if tenant else "")
                + f" for over {WAIT_SECONDS:g}s.",
                app=app,
            )
        time.sleep(pause)  # another worker fetches it: its value lands in the row
        pause = min(pause * 2, 0.25)


def _fetch_under_lease(
    key: tuple[str, str, str], me: str, fetch: Callable[[], tuple[str, float]]
) -> str:
    app, kind, tenant = key
    mine = _table().objects.filter(_rows(app, kind, tenant), fetching_by=me)
    try:
        value, lifetime = fetch()
    except BaseException:
        mine.update(fetching_until=None, fetching_by="")  # the next one tries at once
        raise
    expires_at = timezone.now() + timedelta(seconds=lifetime)
    mine.update(
        value=value,
        expires_at=expires_at,
        fetching_until=None,
        fetching_by="",
        fetches=F("fetches") + 1,
        updated_at=timezone.now(),
    )
    return _keep(key, value, expires_at)


def forget(app: str, kind: str, tenant: str, value: str) -> None:
    """Feishu refused ``value`` (revoked or rotated early): drop it here and in the ledger,
    unless the ledger already holds another (a worker fetched a new one meanwhile)."""
    with _cache_lock:
        cached = _cache.get((app, kind, tenant))
        if cached is not None and cached.value == value:
            del _cache[(app, kind, tenant)]
    _table().objects.filter(_rows(app, kind, tenant), value=value).update(
        value="", updated_at=timezone.now()
    )


def fetches(app: str) -> dict[tuple[str, str], int]:
    """(kind, tenant) -> how many times it was fetched (or stored: a ticket), for operators
    and tests; never the values."""
    rows = _table().objects.filter(app=app).values_list("kind", "tenant", "fetches")
    return {(kind, tenant): n for kind, tenant, n in rows}


def _fresh(expires_at: datetime | None, margin: float) -> bool:
    return expires_at is not None and expires_at - timedelta(seconds=margin) > timezone.now()


def _keep(key: tuple[str, str, str], value: str, expires_at: datetime | None) -> str:
    if expires_at is not None:
        with _cache_lock:
            _cache[key] = Token(value, expires_at)
    return value

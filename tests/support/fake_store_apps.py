"""The store (ISV) app endpoints of the fake Open API (``fake_feishu.py``), from Feishu's docs:

- ``POST /open-apis/auth/v3/app_ticket/resend`` ``{app_id, app_secret}``: ``{"code": 0}``; Feishu
  then pushes an ``app_ticket`` event (``on_resend``, set by the test, delivers it: the fake
  knows no site URL);
- ``POST /open-apis/auth/v3/app_access_token`` ``{app_id, app_secret, app_ticket}``: the app's
  token and ``expire``; a ticket the fake did not push, or not the newest, answers code 10012;
- ``POST /open-apis/auth/v3/tenant_access_token`` ``{app_access_token, tenant_key}``: that
  tenant's token and ``expire``; an unknown or expired app token answers 99991664.

As Feishu does, a token is answered again while more than 30 minutes of it are left, else a
new one (the old one stays valid until it expires). ``tenant_expire`` gives one tenant's tokens
a shorter life (a token that expires mid-run). Each tenant token is the tenant's: the messages
it sends are recorded with it (``Message.tenant_key``).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

RESEND_PATH = "/open-apis/auth/v3/app_ticket/resend"
APP_TOKEN_PATH = "/open-apis/auth/v3/app_access_token"
TENANT_TOKEN_PATH = "/open-apis/auth/v3/tenant_access_token"
PATHS = (RESEND_PATH, APP_TOKEN_PATH, TENANT_TOKEN_PATH)
TOKEN_REUSE_SECONDS = 30 * 60
TICKET_INVALID = 10012
APP_TOKEN_INVALID = 99991664


class StoreApps:
    """The store apps' side of the fake: tickets, app tokens, tenant tokens."""

    def __init__(self, apps: dict[str, str], lock: Any, token_expire: int) -> None:
        #: app_id -> app_secret of the apps that are store apps
        self.apps = apps
        self._lock = lock
        self.token_expire = token_expire
        #: tenant_key -> the lifetime (seconds) of its tokens, when not ``token_expire``
        self.tenant_expire: dict[str, float] = {}
        self.tickets: dict[str, str] = {}  # app_id -> the newest ticket pushed
        self.resends: dict[str, int] = {}
        self.app_token_requests: dict[str, int] = {}
        self.tenant_token_requests: dict[tuple[str, str], int] = {}
        self._app_tokens: dict[str, tuple[str, float]] = {}  # token -> (app_id, expires at)
        self._live_app_token: dict[str, str] = {}
        #: token -> (app_id, tenant_key, expires at)
        self.tenant_tokens: dict[str, tuple[str, str, float]] = {}
        self._live_tenant_token: dict[tuple[str, str], str] = {}
        #: Called (on a thread of its own) with the app id after a resend request: the test's
        #: way to push the ticket event to the site, as Feishu would.
        self.on_resend: Callable[[str], None] | None = None

    # --- scripting ---------------------------------------------------------------------------

    def push_ticket(self, app_id: str) -> dict[str, Any]:
        """A new ticket for the app, as the ``app_ticket`` event (schema 1.0) that carries it."""
        with self._lock:
            ticket = f"ticket-{secrets.token_hex(8)}"
            self.tickets[app_id] = ticket
        return {
            "ts": f"{time.time():.7f}",
            "uuid": secrets.token_hex(16),
            "token": "",
            "type": "event_callback",
            "event": {"app_id": app_id, "app_ticket": ticket, "type": "app_ticket"},
        }

    def tenant_of(self, token: str) -> str | None:
        with self._lock:
            found = self.tenant_tokens.get(token)
        return found[1] if found else None

    # --- the endpoints -----------------------------------------------------------------------

    def answer(self, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        body = body if isinstance(body, dict) else {}
        if path == RESEND_PATH:
            return self._resend(body)
        if path == APP_TOKEN_PATH:
            return self._app_token(body)
        return self._tenant_token(body)

    def _check_app(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
        app_id = body.get("app_id")
        if app_id not in self.apps:
            return 400, {"code": 10003, "msg": "invalid param: app_id not found"}
        if body.get("app_secret") != self.apps[app_id]:
            return 400, {"code": 10014, "msg": "app secret invalid"}
        return None

    def _resend(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            refused = self._check_app(body)
            if refused:
                return refused
            app_id = str(body["app_id"])
            self.resends[app_id] = self.resends.get(app_id, 0) + 1
        if self.on_resend is not None:
            threading.Thread(target=self.on_resend, args=(app_id,), daemon=True).start()
        return 200, {"code": 0, "msg": "success"}

    def _app_token(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            app_id = str(body.get("app_id"))
            self.app_token_requests[app_id] = self.app_token_requests.get(app_id, 0) + 1
            refused = self._check_app(body)
            if refused:
                return refused
            ticket = body.get("app_ticket")
            if not ticket or ticket != self.tickets.get(app_id):
                return 400, {"code": TICKET_INVALID, "msg": "app_ticket is invalid"}
            token, left = _reuse(self._live_app_token.get(app_id), self._app_tokens)
            if token is None:
                token, left = f"a-{secrets.token_hex(16)}", float(self.token_expire)
                self._app_tokens[token] = (app_id, time.time() + left)
                self._live_app_token[app_id] = token
            return 200, {"code": 0, "msg": "ok", "app_access_token": token, "expire": int(left)}

    def _tenant_token(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            found = self._app_tokens.get(str(body.get("app_access_token")))
            tenant = body.get("tenant_key")
            if not found or found[1] <= time.time():
                return 400, {"code": APP_TOKEN_INVALID, "msg": "app access token invalid"}
            app_id = found[0]
            key = (app_id, str(tenant))
            self.tenant_token_requests[key] = self.tenant_token_requests.get(key, 0) + 1
            if not isinstance(tenant, str) or not tenant:
                return 400, {"code": 99992402, "msg": "field validation failed: tenant_key"}
            live = self._live_tenant_token.get(key)
            left = self.tenant_tokens[live][2] - time.time() if live in self.tenant_tokens else 0
            if left <= TOKEN_REUSE_SECONDS:
                live = f"t-{secrets.token_hex(16)}"
                left = float(self.tenant_expire.get(tenant, self.token_expire))
                self.tenant_tokens[live] = (app_id, tenant, time.time() + left)
                self._live_tenant_token[key] = live
            assert live is not None
            return 200, {
                "code": 0,
                "msg": "ok",
                "tenant_access_token": live,
                "expire": int(left),
            }


def _reuse(token: str | None, tokens: dict[str, tuple[str, float]]) -> tuple[str | None, float]:
    """The live token and its seconds left, while more than 30 minutes are left."""
    if token is None or token not in tokens:
        return None, 0.0
    left = tokens[token][1] - time.time()
    return (token, left) if left > TOKEN_REUSE_SECONDS else (None, 0.0)

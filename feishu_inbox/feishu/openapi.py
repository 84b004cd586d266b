"""Feishu's Open API through the official SDK (``lark-oapi``): send and reply, idempotently.

    from feishu_inbox.feishu import openapi

    message_id = openapi.reply_message("default", parent_id, "Got it", uuid=key)
    message_id = openapi.send_message("default", "oc_123", {"text": "Hi"}, uuid=key)
    openapi.client("default").im.v1.chat.get(...)     # any other API: the configured client

An app's credentials are ``APP_ID`` and ``APP_SECRET`` in ``FEISHU_INBOX["APPS"][app]``, and its
``DOMAIN`` is "feishu" (default), "lark" or a base URL. One ``lark_oapi.Client`` per app and
process is built on first use and shared by every thread. The SDK keeps each app's tenant
access token in its process-wide cache until 10 minutes before it expires (Feishu's tokens live
2 hours); this module only makes sure that threads starting at once fetch it once
(``_ensure_token``) and that a token Feishu calls invalid is fetched anew once.

``uuid`` is the idempotency key: Feishu creates at most one message per uuid within an hour, so
a request sent again with the same uuid after a timeout or a dropped connection cannot produce a
second message. (Feishu does not document what it answers to such a repeat; the fake, and this
module, take it to be the first message, with code 0.) Failures are typed (``errors.py``):
``FeishuRateLimited`` (with ``reset_at``), ``FeishuTransientError`` (send again with the same
uuid), ``FeishuBusinessError`` (Feishu's code and msg; do not send again). Bad arguments raise
``InvalidMessage`` before any request.

``lark_oapi`` is imported on first use, never at Django start-up: importing it loads about
10,000 modules (2.3 s and +140 MB RSS on the development machine).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from .. import telemetry, tracing
from ..conf import checked_settings, openapi_base_url
from ..errors import (
    ConfigurationError,
    FeishuAPIError,
    FeishuBusinessError,
    FeishuRateLimited,
    FeishuTransientError,
    InvalidMessage,
)
from . import tenancy

if TYPE_CHECKING:
    import lark_oapi

log = logging.getLogger("feishu_inbox.openapi")

#: ``receive_id_type`` values of the send endpoint.
RECEIVE_ID_TYPES = ("chat_id", "open_id", "user_id", "union_id", "email")
#: ``msg_type`` values Feishu's message endpoints take.
MSG_TYPES = (
    "text",
    "post",
    "image",
    "file",
    "audio",
    "media",
    "sticker",
    "interactive",
    "share_chat",
    "share_user",
    "system",
)
#: Largest request body Feishu takes, in bytes of the JSON body: cards (``interactive``) and
#: rich text (``post``) 30 KB, text (and the other types, whose content is a key) 150 KB.
BODY_LIMITS = {"post": 30 * 1024, "interactive": 30 * 1024}
DEFAULT_BODY_LIMIT = 150 * 1024
#: Feishu's limit on ``uuid``.
UUID_MAX_LENGTH = 50
#: Seconds a call may take (connecting, then between bytes of the answer) before it fails as
#: ``FeishuTransientError``; the message endpoints answer in well under a second.
REQUEST_TIMEOUT = 10.0
#: When a rate-limited answer names no reset time (no ``x-ogw-ratelimit-reset`` nor
#: ``Retry-After``): Feishu's frequency windows are a second or a minute.
RATE_LIMIT_DEFAULT_WAIT = timedelta(seconds=10)
#: ``send_message`` and ``reply_message`` wait out a 429 whose reset comes within this many
#: seconds and send again (a 429 created nothing): a site's own effect around them then ends
#: done instead of ``unknown``. ``feishu_inbox.reply`` passes 0: it blocks the ledger's bucket
#: and hands the job back instead, so that every worker waits for the reset.
RATE_LIMIT_PATIENCE = 5.0
#: A reset time further away than this is taken as this (a garbled header parks nothing for
#: days; a limit still in force answers 429 again).
RATE_LIMIT_LONGEST_WAIT = timedelta(hours=1)
RATE_LIMITED_CODE = 99991400
JSON_CONTENT_TYPE = "application/json; charset=utf-8"
#: "Invalid access token": the token was revoked or rotated before its expiry.
TOKEN_INVALID_CODE = 99991663


@dataclass(frozen=True)
class Credentials:
    app: str
    app_id: str
    app_secret: str = field(repr=False)
    base_url: str = "https://open.feishu.cn"
    #: A store app (APP_TYPE "store"): its calls carry a tenant's token (``tenancy.py``).
    store: bool = False


def credentials(app: str) -> Credentials:
    """The app's Open API credentials from settings; ConfigurationError saying what is missing."""
    secrets = checked_settings().APPS.get(app)
    if secrets is None:
        raise ConfigurationError(
            f"No Feishu app {app!r} in FEISHU_INBOX['APPS'].",
            fix="Name an app of APPS, or add this one with its APP_ID and APP_SECRET.",
        )
    app_id, app_secret = secrets.get("APP_ID") or "", secrets.get("APP_SECRET") or ""
    if not (app_id and app_secret):
        missing = " and ".join(k for k in ("APP_ID", "APP_SECRET") if not secrets.get(k))
        raise ConfigurationError(
            f"Feishu app {app!r} has no {missing}: it cannot call the Open API.",
            fix="Copy the App ID and App Secret from the app's Credentials page in the Feishu "
            f"console into FEISHU_INBOX['APPS'][{app!r}].",
        )
    base_url = openapi_base_url(secrets.get("DOMAIN") or "feishu")
    return Credentials(app, app_id, app_secret, base_url, secrets.get("APP_TYPE") == "store")


_lock = threading.Lock()
_clients: dict[Credentials, Any] = {}
_token_locks: dict[str, threading.Lock] = {}


def client(app: str) -> lark_oapi.Client:
    """The configured ``lark_oapi.Client`` of this app, built once per process (and again only
    when the app's settings change); safe to share between threads. Use it for any Open API
    call this module does not wrap: the SDK adds the tenant access token to each request."""
    return _client(credentials(app))


def _client(creds: Credentials) -> lark_oapi.Client:
    found = _clients.get(creds)
    if found is None:
        with _lock:
            found = _clients.get(creds)
            if found is None:
                found = _clients[creds] = _build(creds)
                _token_locks.setdefault(creds.app_id, threading.Lock())
    return found


def _build(creds: Credentials) -> lark_oapi.Client:
    try:
        import lark_oapi
    except ImportError as exc:
        raise ConfigurationError(
            f"Feishu app {creds.app!r} has an APP_ID, but the Feishu SDK is not installed ({exc}).",
            fix="pip install lark-oapi (the openapi extra).",
        ) from exc
    builder = lark_oapi.Client.builder().app_id(creds.app_id).app_secret(creds.app_secret)
    if creds.store:  # each request carries the token of its tenant, given by call()
        builder = builder.app_type(lark_oapi.AppType.ISV).enable_set_token(True)
    return builder.domain(creds.base_url).timeout(REQUEST_TIMEOUT).build()


def ready(app: str) -> None:
    """Before a handler's effect: a store app's tenant token now (no ticket yet: Deferred)."""
    tenant = tenancy.tenant_of(app, None)
    if tenant is not None:
        creds = credentials(app)
        tenancy.ready(creds, _client(creds), tenant)


def sending_apps() -> list[str]:
    """The apps of FEISHU_INBOX["APPS"] with Open API credentials (APP_ID and APP_SECRET)."""
    apps = checked_settings().APPS
    return sorted(a for a, keys in apps.items() if keys.get("APP_ID") and keys.get("APP_SECRET"))


def warm_up() -> bool:
    """Import the SDK now, once per process, when some app has credentials (a worker calls it
    before it claims: importing ``lark_oapi`` takes seconds, better spent before a lease is
    running than inside a reply's effect). Returns whether it did; builds no client and makes
    no request."""
    if not sending_apps():
        return False
    try:
        import lark_oapi  # noqa: F401
        from lark_oapi.api.im.v1 import CreateMessageRequest  # noqa: F401
    except ImportError:  # check W008 names it; the first call raises ConfigurationError
        return False
    return True


def forget_clients() -> None:
    """Drop the built clients and the SDK's cached tokens of their apps (tests; a rotated
    secret is picked up without this, as a new client)."""
    with _lock:
        app_ids = {creds.app_id for creds in _clients}
        _clients.clear()
    for app_id in app_ids:
        _forget_token(app_id)


# --- the two message calls ----------------------------------------------------------------


def send_message(
    app: str,
    receive_id: str,
    content: dict[str, Any] | str,
    *,
    receive_id_type: str = "chat_id",
    msg_type: str = "text",
    uuid: str,
    rate_limit_patience: float = RATE_LIMIT_PATIENCE,
) -> str:
    """Send a message to a chat or a user (``POST /open-apis/im/v1/messages``); return its id.

    ``content`` is a dict (serialised to the JSON string Feishu wants) or a str: for
    ``msg_type="text"`` a str is the text itself (sent as ``{"text": content}``, even when it
    looks like JSON); for any other type a str is the content's JSON, sent as it is. ``uuid``
    (1 to 50 characters): a repeat within an hour creates no second message. A 429 whose
    reset comes within ``rate_limit_patience`` seconds is waited out and the message sent
    again; a later one raises ``FeishuRateLimited``.
    """
    problems = _common_problems(msg_type, uuid)
    if not isinstance(receive_id, str) or not receive_id:
        problems.append(f"receive_id must be a non-empty string (got {receive_id!r})")
    if receive_id_type not in RECEIVE_ID_TYPES:
        problems.append(
            f"receive_id_type must be one of {', '.join(RECEIVE_ID_TYPES)} "
            f"(got {receive_id_type!r})"
        )
    text = _content(content, msg_type, problems)
    body = {"receive_id": receive_id, "msg_type": msg_type, "content": text, "uuid": uuid}
    _check_size(body, msg_type, problems)
    if problems:
        raise InvalidMessage(problems)

    def request() -> Any:
        from lark_oapi.api.im.v1 import CreateMessageRequest, CreateMessageRequestBody

        return (
            CreateMessageRequest.builder()
            .receive_id_type(receive_id_type)
            .request_body(CreateMessageRequestBody(body))
            .build()
        )

    what = f"send a message to {receive_id_type} {receive_id}"
    return _message_id(app, what, request, rate_limit_patience)


def reply_message(
    app: str,
    message_id: str,
    content: dict[str, Any] | str,
    *,
    msg_type: str = "text",
    reply_in_thread: bool = False,
    uuid: str,
    rate_limit_patience: float = RATE_LIMIT_PATIENCE,
) -> str:
    """Reply to a message (``POST /open-apis/im/v1/messages/{message_id}/reply``); return the
    reply's id. ``content``, ``uuid`` and ``rate_limit_patience`` as for ``send_message``;
    ``reply_in_thread`` answers in the message's thread (topic) instead of the chat."""
    problems = _common_problems(msg_type, uuid)
    if not isinstance(message_id, str) or not message_id:
        problems.append(f"message_id must be a non-empty string (got {message_id!r})")
    if not isinstance(reply_in_thread, bool):
        problems.append(f"reply_in_thread must be True or False (got {reply_in_thread!r})")
    text = _content(content, msg_type, problems)
    body = {"content": text, "msg_type": msg_type, "reply_in_thread": reply_in_thread, "uuid": uuid}
    _check_size(body, msg_type, problems)
    if problems:
        raise InvalidMessage(problems)

    def request() -> Any:
        from lark_oapi.api.im.v1 import ReplyMessageRequest, ReplyMessageRequestBody

        return (
            ReplyMessageRequest.builder()
            .message_id(message_id)
            .request_body(ReplyMessageRequestBody(body))
            .build()
        )

    return _message_id(app, f"reply to message {message_id}", request, rate_limit_patience)


def _common_problems(msg_type: object, uuid: object) -> list[str]:
    problems = []
    if msg_type not in MSG_TYPES:
        problems.append(f"msg_type must be one of {', '.join(MSG_TYPES)} (got {msg_type!r})")
    if not isinstance(uuid, str) or not 1 <= len(uuid) <= UUID_MAX_LENGTH:
        problems.append(
            f"uuid must be a string of 1 to {UUID_MAX_LENGTH} characters (got {uuid!r}); "
            "it is what makes a repeat harmless"
        )
    return problems


def _content(content: object, msg_type: object, problems: list[str]) -> str:
    """The content as Feishu's JSON string; appends to ``problems`` what is wrong with it."""
    if msg_type == "text" and isinstance(content, str):
        content = {"text": content}
    if isinstance(content, str) and msg_type not in MSG_TYPES:
        return content  # the msg_type is the problem (already named); a str may be its text
    if isinstance(content, str):
        try:
            parsed = json.loads(content)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            problems.append(
                f"content of a {msg_type} message must be a dict or the JSON string of an object "
                f"(got {content[:80]!r})"
            )
        return content
    if not isinstance(content, dict):
        problems.append(f"content must be a dict or a str (got {type(content).__name__})")
        return ""
    if msg_type == "text" and not (isinstance(content.get("text"), str) and content["text"]):
        problems.append('content of a text message must have a non-empty "text"')
    try:
        return json.dumps(content, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        problems.append(f"content is not JSON-serialisable ({exc})")
        return ""


def _check_size(body: dict[str, Any], msg_type: str, problems: list[str]) -> None:
    limit = BODY_LIMITS.get(msg_type, DEFAULT_BODY_LIMIT)
    size = len(json.dumps(body, ensure_ascii=False).encode())
    if size > limit:
        problems.append(
            f"the request body is {size:,} bytes; Feishu takes at most {limit // 1024} KB "
            f"for a {msg_type} message"
        )


# --- calling, and what the answer means ---------------------------------------------------


def _message_id(app: str, what: str, make_request: Any, patience: float) -> str:
    data = call(app, what, make_request, rate_limit_patience=patience)
    message_id = data.get("message_id") if isinstance(data, dict) else None
    if not isinstance(message_id, str) or not message_id:  # sent again, the uuid gives its id
        raise FeishuTransientError(
            f"Feishu answered success to {what} (app {app!r}) without a message id.",
            app=app,
            status=200,
            maybe_applied=True,
        )
    return message_id


def call(
    app: str,
    what: str,
    make_request: Any,
    *,
    rate_limit_patience: float = 0.0,
    tenant: str | None = None,
) -> Any:
    """Make one Open API request (again once, with a fresh token, if Feishu calls the token
    invalid; again after a 429 whose reset comes within ``rate_limit_patience`` seconds of the
    first try); return the answer's ``data``, or raise the typed error for what went wrong.
    A store app's request carries ``tenant``'s token (None: the running job's tenant's)."""
    import requests
    from lark_oapi.core.exception import ObtainAccessTokenException, UnmarshalException
    from lark_oapi.core.model import RequestOption

    creds = credentials(app)
    c = _client(creds)
    store_tenant = tenancy.tenant_of(app, tenant)  # None: a self-built app
    token = ""
    patient_until = time.monotonic() + rate_limit_patience
    fresh_token = False
    while True:
        option = RequestOption.builder().headers({"Content-Type": JSON_CONTENT_TYPE})
        request = make_request()
        api = _api_name(request)
        span = tracing.span(
            f"feishu_inbox openapi {api}",
            kind="client",
            attributes={"feishu_inbox.app": app, "feishu_inbox.openapi.api": api},
        )
        with span as traced:
            started = time.monotonic()
            try:
                if store_tenant is None:
                    _ensure_token(creds, c)
                else:
                    token = tenancy.tenant_token(creds, c, store_tenant)
                    option = option.tenant_access_token(token)
                # Client.request (the SDK's generic call) keeps the raw answer (status, headers)
                # of one that is not JSON, a 500 page; im.v1.message.create raises ValueError.
                raw = c.request(request, option.build()).raw
            except ObtainAccessTokenException as exc:
                _count(app, api, "token_refused", started)
                raise _token_error(creds, exc) from exc
            except requests.RequestException as exc:
                _count(app, api, "transient", started)
                raise FeishuTransientError(
                    f"Could not {what} (app {app!r}): {type(exc).__name__}: {exc}",
                    app=app,
                    maybe_applied=True,
                ) from exc
            except (ValueError, UnmarshalException) as exc:  # "JSON" the SDK could not read
                _count(app, api, "transient", started)
                raise FeishuTransientError(
                    f"Feishu's answer to a request to {what} (app {app!r}) is unreadable: "
                    f"{type(exc).__name__}: {exc}",
                    app=app,
                    maybe_applied=True,
                ) from exc
            answer = _Answer.of(raw)
            _count(app, api, answer.result(), started)
            if answer.status is not None:
                traced.set("http.response.status_code", answer.status)
        if answer.code == TOKEN_INVALID_CODE and not fresh_token:
            log.warning("Feishu app %r: the tenant token was refused; fetching a new one", app)
            if store_tenant is None:  # revoked or rotated early: fetch a new one, once
                _forget_token(creds.app_id)
            else:
                tenancy.forget(creds, store_tenant, token)
            fresh_token = True
            continue
        if answer.result() == "rate_limited" and rate_limit_patience > 0:
            wait = max((answer.reset_at() - _now()).total_seconds(), 0.05)
            if time.monotonic() + wait <= patient_until:
                log.info(
                    "Feishu app %r: %s rate-limited (429); nothing was created, sending again "
                    "in %.2fs",
                    app,
                    api,
                    wait,
                )
                time.sleep(wait)  # the handler's own wait, as for any slow call; leases renew
                continue
        break
    error = answer.error(app, what)
    if error:
        raise error
    return answer.data


def _api_name(request: Any) -> str:
    """A request's method and path template ("POST /open-apis/im/v1/messages"): a metric's
    label, without ids (the SDK keeps ``:message_id`` in ``uri`` and the value in ``paths``)."""
    method = getattr(request.http_method, "name", str(request.http_method))
    return f"{method} {request.uri}"


def _count(app: str, api: str, result: str, started: float) -> None:
    tracing.annotate(feishu_inbox__openapi__result=result)
    telemetry.OPENAPI_REQUESTS.labels(app, api, result).inc()
    telemetry.OPENAPI_SECONDS.labels(api).observe(time.monotonic() - started)


def _ensure_token(creds: Credentials, c: Any) -> None:
    """Have the SDK's cache hold this app's tenant token, fetching it at most once at a time.

    The SDK's own check-then-fetch has no lock: N threads starting at once would fetch N
    tokens. Under this lock the first one fetches and the others find it cached. A token
    failure means no message request was made (``maybe_applied`` is False)."""
    import requests
    from lark_oapi.core.token import TokenManager

    with _token_locks[creds.app_id]:
        try:
            TokenManager.get_self_tenant_token(c.config)
        except (requests.RequestException, ValueError) as exc:  # ValueError: not JSON
            raise FeishuTransientError(
                f"Could not get a tenant access token for app {creds.app!r}: "
                f"{type(exc).__name__}: {exc}",
                app=creds.app,
            ) from exc


def _token_error(creds: Credentials, exc: Any) -> FeishuAPIError:
    """What the SDK's ObtainAccessTokenException (Feishu's code and msg) means."""
    what = f"Could not get a tenant access token for app {creds.app!r}"
    if exc.code == RATE_LIMITED_CODE:
        return FeishuRateLimited(
            f"{what}: rate limited ({exc.msg}).",
            app=creds.app,
            feishu_code=exc.code,
            feishu_msg=exc.msg,
            reset_at=_now() + RATE_LIMIT_DEFAULT_WAIT,
        )
    return FeishuBusinessError(
        f"{what}: code {exc.code} {exc.msg}",
        app=creds.app,
        feishu_code=exc.code,
        feishu_msg=exc.msg,
        fix=f"Check APP_ID, APP_SECRET and DOMAIN of FEISHU_INBOX['APPS'][{creds.app!r}] "
        "against the app's Credentials page in the Feishu console.",
    )


def _forget_token(app_id: str) -> None:
    """Make the SDK fetch this app's tenant token anew on its next call."""
    from lark_oapi.core.token import TokenManager

    # An empty value is a miss for the SDK; the key is the one TokenManager writes.
    TokenManager.cache.set(f"self_tenant_token:{app_id}", "", 0)


@dataclass(frozen=True)
class _Answer:
    status: int | None
    headers: dict[str, str]
    body: Any
    text: str

    @classmethod
    def of(cls, raw: Any) -> _Answer:
        content = raw.content or b""
        text = content.decode("utf-8", "replace")
        try:
            body = json.loads(text)
        except ValueError:
            body = None
        headers = {str(k).lower(): str(v) for k, v in (raw.headers or {}).items()}
        return cls(raw.status_code, headers, body, text)

    def result(self) -> str:
        """What the answer was, for the metrics: ok, rate_limited, transient or refused."""
        if self.status is not None and 200 <= self.status < 300 and self.code == 0:
            return "ok"
        if self.status == 429 or self.code == RATE_LIMITED_CODE:
            return "rate_limited"
        if self.status is None or self.status >= 500 or self.code is None:
            return "transient"
        return "refused"

    @property
    def code(self) -> int | None:
        code = self.body.get("code") if isinstance(self.body, dict) else None
        return code if isinstance(code, int) else None

    @property
    def data(self) -> Any:
        return self.body.get("data") if isinstance(self.body, dict) else None

    def error(self, app: str, what: str) -> FeishuAPIError | None:
        """The typed error this answer is, or None for a success."""
        status, code = self.status, self.code
        body = self.body if isinstance(self.body, dict) else {}
        if status is not None and 200 <= status < 300 and code == 0:
            return None
        msg = str(body.get("msg") or "") or self.text[:200].strip()
        error: dict[str, Any] = body["error"] if isinstance(body.get("error"), dict) else {}
        log_id = self.headers.get("x-tt-logid") or str(error.get("log_id") or "")
        details: dict[str, Any] = dict(
            app=app, status=status, feishu_code=code, feishu_msg=msg, log_id=log_id
        )
        said = f"HTTP {status}" + (f", code {code}" if code is not None else "") + f": {msg}"
        said += f" (log id {log_id})" if log_id else ""
        if status == 429 or code == RATE_LIMITED_CODE:
            reset_at = self.reset_at()
            return FeishuRateLimited(
                f"Feishu rate-limited the request to {what} (app {app!r}) until "
                f"{reset_at:%Y-%m-%d %H:%M:%S} UTC; {said}",
                reset_at=reset_at,
                **details,
            )
        if status is None or status >= 500 or (status < 300 and code is None):
            # A 2xx that is not Feishu's JSON: it may have been created; the uuid makes a
            # repeat harmless.
            return FeishuTransientError(
                f"Feishu failed to {what} (app {app!r}); {said}", maybe_applied=True, **details
            )
        hint = str(error.get("troubleshooter") or "")
        return FeishuBusinessError(
            f"Feishu refused to {what} (app {app!r}); {said}" + (f" {hint}" if hint else ""),
            **details,
        )

    def reset_at(self) -> datetime:
        """When the rate limit lifts: the answer's headers give it in seconds from now."""
        longest = RATE_LIMIT_LONGEST_WAIT.total_seconds()
        wait = RATE_LIMIT_DEFAULT_WAIT.total_seconds()
        for header in ("x-ogw-ratelimit-reset", "retry-after"):
            try:
                seconds = float(self.headers[header])
            except (KeyError, ValueError):
                continue
            if seconds >= 0:  # NaN compares False: skipped
                wait = min(seconds, longest)
                break
        return _now() + timedelta(seconds=wait)


def _now() -> datetime:
    return datetime.now(timezone.utc)

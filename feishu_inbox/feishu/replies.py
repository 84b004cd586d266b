"""Replying and sending from a handler, as idempotent effects (SPEC §3 Effects).

    @feishu_inbox.handler("im.message.receive_v1")
    def answer(event):
        text = feishu_inbox.step("think", llm, event.payload)
        feishu_inbox.reply(event, text)

Each call is an ``effect(name, idempotent_for=1 hour)`` whose key is the message's ``uuid``:
Feishu creates at most one message per uuid within an hour, so when the worker dies, the
connection drops or Feishu answers 5xx, the job runs again and sends again with the same uuid,
which cannot make a second message. What Feishu answers decides the rest (``feishu/openapi.py``):

- before the call, a token of each of Feishu's limits that apply (the chat's 5/s, the user's
  5/s, the app's 50/s: ``FEISHU_RATE_LIMITS``), kept in the ledger for every worker
  (``ledger/buckets.py``); a job that finds none waits, without spending an attempt;
- rate limited all the same (HTTP 429, code 99991400: someone else shares the limit): the
  chat's bucket is blocked until Feishu's reset, and the job waits for it, same uuid;
- 5xx, a dropped connection, a timeout: retried after the handler's backoff, same uuid;
- refused (a 4xx business error) or bad arguments: nothing was sent, the job ends ``failed``
  at once with Feishu's code and message (running it again cannot help);
- past the window (55 minutes after the first try, by default) a job that must send again
  ends ``unknown`` instead: Feishu would no longer recognise the uuid.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from ..conf import checked_settings
from ..errors import (
    Concluded,
    ConfigurationError,
    Deferred,
    FeishuBusinessError,
    FeishuRateLimited,
    InvalidMessage,
)
from ..ledger.idempotency import FEISHU_UUID_WINDOW, default_margin
from ..ledger.limits import Bucket, RateLimit
from ..runtime.context import Event, current
from ..runtime.handlers import effect
from ..runtime.limits import job_values, take
from ..runtime.writes import write
from . import openapi, tenancy

if TYPE_CHECKING:
    import lark_oapi

#: The longest one try can take from the effect's start until its request reaches Feishu: a
#: token fetch, then the request, each within the client's timeout. The margin is at least
#: this, so a re-send that starts inside the window arrives inside it.
SLOWEST_TRY = timedelta(seconds=2 * openapi.REQUEST_TIMEOUT)


def reply(
    event: Event,
    content: dict[str, Any] | str,
    msg_type: str = "text",
    *,
    reply_in_thread: bool = False,
    name: str = "reply",
    idempotent_for: timedelta = FEISHU_UUID_WINDOW,
    margin: timedelta | None = None,
) -> str:
    """Reply to the message of a message event (``im.message.receive_v1``); return the
    reply's message id. ``name`` tells two replies of one handler apart (each its own uuid);
    ``idempotent_for`` (at most Feishu's hour) and ``margin``: see ``ledger/idempotency.py``."""
    message_id = target_message(event)
    chat_id = job_values(event).get("chat_id")
    buckets = feishu_buckets(event.app, chat_id=chat_id if isinstance(chat_id, str) else None)

    def call(key: str) -> str:
        return openapi.reply_message(
            event.app,
            message_id,
            content,
            msg_type=msg_type,
            reply_in_thread=reply_in_thread,
            uuid=key,
            rate_limit_patience=0,  # a 429: the bucket is blocked, the job waits (_idempotent)
        )

    try:
        return _idempotent(event.app, name, idempotent_for, margin, call, buckets)
    except FeishuBusinessError as exc:
        if exc.feishu_code not in RECALLED_CODES or event.turn is None:
            raise
        return _recalled(event, exc, content, msg_type, name, chat_id)


#: Feishu's answers to a reply whose message was recalled (230011) or is gone (231003).
RECALLED_CODES = frozenset({230011, 231003})


def _recalled(
    event: Event,
    exc: FeishuBusinessError,
    content: dict[str, Any] | str,
    msg_type: str,
    name: str,
    chat_id: Any,
) -> str:
    """A turn's reply to a message recalled meanwhile: sent to the chat instead, or dropped
    (the turn ends ``Recalled``), by its handler's ``on_recalled_reply`` (SPEC §9g)."""
    ctx = current()
    policy = getattr(ctx.turn_spec, "on_recalled_reply", "drop")
    if policy == "send" and isinstance(chat_id, str) and chat_id:
        return send(event.app, chat_id, content, msg_type, name=f"{name}:chat"[:64])
    raise Concluded(
        "Recalled", f"The message a reply answered was recalled ({exc.feishu_code}): dropped."
    )


def send(
    app: str,
    receive_id: str,
    content: dict[str, Any] | str,
    msg_type: str = "text",
    *,
    receive_id_type: str = "chat_id",
    name: str = "send",
    idempotent_for: timedelta = FEISHU_UUID_WINDOW,
    margin: timedelta | None = None,
) -> str:
    """Send a message to a chat (or a user: ``receive_id_type``) as app ``app``; return its
    message id. ``name``, ``idempotent_for`` and ``margin`` as for ``reply``."""

    def call(key: str) -> str:
        return openapi.send_message(
            app,
            receive_id,
            content,
            receive_id_type=receive_id_type,
            msg_type=msg_type,
            uuid=key,
            rate_limit_patience=0,  # a 429: the bucket is blocked, the job waits (_idempotent)
        )

    to_chat = receive_id_type == "chat_id"
    buckets = feishu_buckets(
        app, chat_id=receive_id if to_chat else None, user_id=None if to_chat else receive_id
    )
    return _idempotent(app, name, idempotent_for, margin, call, buckets)


def feishu_buckets(
    app: str, *, chat_id: str | None = None, user_id: str | None = None
) -> list[Bucket]:
    """The buckets of Feishu's message limits a send to this chat or user takes a token of:
    the chat's (5/s, shared by every bot in it), the user's (5/s) and the app's (50/s), as
    ``FEISHU_RATE_LIMITS`` sets them."""
    rates = checked_settings().FEISHU_RATE_LIMITS
    found = []
    for kind, value, template in (
        ("chat", chat_id, "feishu:{app}:chat:{id}"),
        ("user", user_id, "feishu:{app}:user:{id}"),
        ("app", app, "feishu:{app}"),
    ):
        rate = rates.get(kind)
        if value and rate:
            # burst 1: tokens come evenly spaced, so that no second holds more than the rate
            # (a bucket's burst on top of its rate is what Feishu's per-second count refuses)
            limit = RateLimit(template, rate, burst=1)
            found.append(limit.bucket({"app": app, "id": value}))
    return found


def client(app: str = "default") -> lark_oapi.Client:
    """The app's configured ``lark_oapi.Client``, for any other Open API call. Wrap a call
    that changes something in ``feishu_inbox.effect()`` yourself."""
    return openapi.client(app)


def target_message(event: Event) -> str:
    """The message a reply answers: a turn's newest live message, else the event's own."""
    turn = event.turn
    last = turn.last if turn is not None else None
    return last.message_id if last is not None else _message_id(event)


def tenant_token(app: str = "default", tenant: str | None = None) -> str:
    """A store app's ``tenant_access_token`` for ``tenant`` (None: the running job's tenant's),
    shared by every worker: for a call through ``client(app)``, whose requests of a store app
    carry the token they are given (``RequestOption.builder().tenant_access_token(...)``)."""
    store_tenant = tenancy.tenant_of(app, tenant)
    if store_tenant is None:
        raise ConfigurationError(
            f"App {app!r} is not a store app: its client adds its own token to each request.",
            fix="Use client(app) as it is, or set APPS[app]['APP_TYPE'] = 'store'.",
        )
    return tenancy.tenant_token(openapi.credentials(app), openapi.client(app), store_tenant)


def _message_id(event: Event) -> str:
    message = event.payload.get("event", {}).get("message", {}) if event.payload else {}
    message_id = message.get("message_id") if isinstance(message, dict) else None
    if not isinstance(message_id, str) or not message_id:
        raise InvalidMessage(
            [f"event {event.event_id} ({event.event_type}) has no message to reply to"]
        )
    return message_id


def _idempotent(
    app: str,
    name: str,
    window: timedelta,
    margin: timedelta | None,
    call: Callable[[str], str],
    buckets: list[Bucket],
) -> str:
    openapi.credentials(app)  # no credentials: ConfigurationError, before any effect
    openapi.ready(app)  # a store app: its tenant's token (no ticket yet: Deferred)
    if margin is None and isinstance(window, timedelta):
        margin = max(default_margin(window), SLOWEST_TRY)
    refused: FeishuBusinessError | InvalidMessage | None = None
    limited: FeishuRateLimited | None = None
    message_id = ""
    ctx = current()
    take(ctx, buckets)  # a token of each of Feishu's limits, before the effect (or Deferred)
    with effect(name, idempotent_for=window, margin=margin, longest=FEISHU_UUID_WINDOW) as key:
        try:
            message_id = call(key)
        except (FeishuBusinessError, InvalidMessage) as exc:
            refused = exc  # nothing was sent: the effect ends settled, the job fails
        except FeishuRateLimited as exc:
            limited = exc  # nothing was sent either: settled, and sent again after the reset
    if refused is not None:
        raise refused
    if limited is not None:
        # Someone else shares the limit (another system, another bot in the chat): nothing
        # is taken from the chat's (or user's) bucket before Feishu's reset, and the job
        # waits for it without spending an attempt (handed back; the uuid holds for the
        # re-send). Feishu does not say which limit answered; the narrowest is blocked, and
        # the app's bucket keeps the app below its own.
        wait = max((limited.reset_at - datetime.now(timezone.utc)).total_seconds(), 0.05)
        narrowest = buckets[:1]
        write(ctx, "block the rate limit of", lambda _: block_buckets(narrowest, wait))
        raise Deferred(wait, f"Feishu answered 429 [{limited.code}] {limited.message}")
    return message_id


def block_buckets(buckets: list[Bucket], seconds: float) -> None:
    from ..ledger import buckets as ledger_buckets  # models: not at import time

    ledger_buckets.block(buckets, seconds)

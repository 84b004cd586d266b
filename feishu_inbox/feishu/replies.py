"""Replying and sending from a handler, as idempotent effects (SPEC §3 Effects).

    @feishu_inbox.handler("im.message.receive_v1")
    def answer(event):
        text = feishu_inbox.step("think", llm, event.payload)
        feishu_inbox.reply(event, text)

Each call is an ``effect(name, idempotent_for=1 hour)`` whose key is the message's ``uuid``:
Feishu creates at most one message per uuid within an hour, so when the worker dies, the
connection drops or Feishu answers 5xx, the job runs again and sends again with the same uuid,
which cannot make a second message. What Feishu answers decides the rest (``feishu/openapi.py``):

- rate limited (HTTP 429, code 99991400): ``RetryAt`` its reset time, same uuid;
- 5xx, a dropped connection, a timeout: retried after the handler's backoff, same uuid;
- refused (a 4xx business error) or bad arguments: nothing was sent, the job ends ``failed``
  at once with Feishu's code and message (running it again cannot help);
- past the window (55 minutes after the first try, by default) a job that must send again
  ends ``unknown`` instead: Feishu would no longer recognise the uuid.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..errors import FeishuBusinessError, FeishuRateLimited, InvalidMessage
from ..ledger.idempotency import FEISHU_UUID_WINDOW, default_margin
from ..ledger.retry import RetryAt
from ..runtime.context import Event
from ..runtime.handlers import effect
from . import openapi

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
    message_id = _message_id(event)

    def call(key: str) -> str:
        return openapi.reply_message(
            event.app,
            message_id,
            content,
            msg_type=msg_type,
            reply_in_thread=reply_in_thread,
            uuid=key,
        )

    return _idempotent(event.app, name, idempotent_for, margin, call)


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
            app, receive_id, content, receive_id_type=receive_id_type, msg_type=msg_type, uuid=key
        )

    return _idempotent(app, name, idempotent_for, margin, call)


def client(app: str = "default") -> lark_oapi.Client:
    """The app's configured ``lark_oapi.Client``, for any other Open API call. Wrap a call
    that changes something in ``feishu_inbox.effect()`` yourself."""
    return openapi.client(app)


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
) -> str:
    openapi.credentials(app)  # no credentials: ConfigurationError, before any effect
    if margin is None and isinstance(window, timedelta):
        margin = max(default_margin(window), SLOWEST_TRY)
    refused: FeishuBusinessError | InvalidMessage | None = None
    message_id = ""
    with effect(name, idempotent_for=window, margin=margin, longest=FEISHU_UUID_WINDOW) as key:
        try:
            message_id = call(key)
        except (FeishuBusinessError, InvalidMessage) as exc:
            refused = exc  # nothing was sent: the effect ends settled, the job fails
        except FeishuRateLimited as exc:  # not sent; the effect stays uncertain, the key holds
            raise RetryAt(exc.reset_at, f"[{exc.code}] {exc.message}") from exc
    if refused is not None:
        raise refused
    return message_id

"""Conversation turns on Feishu (SPEC §9g): what a message is, the "typing" reaction, the stop
button, and a reply to a message recalled meanwhile.

    @feishu_inbox.handler(
        "im.message.receive_v1",
        coalesce=feishu_inbox.Coalesce(quiet=0.6, max_wait=2.0, stop_commands=("/stop",)),
        stale_after=timedelta(minutes=30), on_stale="notice",
    )
    def answer(event):
        feishu_inbox.typing(event)                   # removed once the turn ends, however
        text = feishu_inbox.step("think", model, event.turn.text)
        with feishu_inbox.stream_reply(event, stop_button=True) as card:
            for piece in pieces(text):
                card.write(piece)                     # a safe point: /stop ends it here

- **Messages.** ``im.message.receive_v1`` events are a turn's messages: their text (a text
  message's ``text``; a rich text's words; ``[image]`` and the like for the rest), id, sender
  and ``create_time``. ``im.message.recalled_v1`` recalls one by its ``message_id``.
- **Typing.** ``typing(event)`` records the reaction's removal as the turn's cleanup
  (``on_finish``) *before* it adds the reaction, so no ending — a crash included — leaves one
  behind. The cleanup lists the message's reactions of that emoji and deletes the app's own:
  it removes a reaction whose add was answered or not, and running it twice removes nothing
  twice. A reaction is decoration: one Feishu refuses is logged, never the turn's failure.
- **Stop button.** A card button whose value names the running job, signed
  (``django.core.signing``: a click cannot name another job); the click is decided before
  Feishu gets its answer: the job is asked to stop (an operator's cancel), and its streamed
  card ends "stopped".
- **Recalled replies.** A reply to a message recalled meanwhile (Feishu's 230011, or 231003
  when it is gone) is sent to the chat instead, or dropped — the turn ends ``Recalled`` — by
  the handler's ``on_recalled_reply``.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from django.core import signing

from ..errors import Deferred, FeishuAPIError, FeishuBusinessError
from ..ledger.kinds import JobKind
from ..runtime import cleanups, turns
from ..runtime.context import Event, current
from ..runtime.turns import Message
from . import openapi, protocol
from .replies import RECALLED_CODES, reply, target_message

log = logging.getLogger("feishu_inbox.turns")

MESSAGE_EVENT = "im.message.receive_v1"
RECALL_EVENT = "im.message.recalled_v1"
#: Feishu's emoji for "typing" (its emoji list: "Typing").
TYPING = "Typing"
#: The cleanup kind that removes the app's reactions of one emoji from one message.
REACTION_PREFIX = "feishu_inbox.reaction."
REMOVE_REACTION = f"{REACTION_PREFIX}remove"
#: The stop button's callback value key, and its signature's salt.
STOP_MARKER = "feishu_inbox.stop"
_STOP_SALT = "feishu_inbox.turns.stop"
#: Shown for a message that is not text (its type in brackets).
_PLACEHOLDER = "[{}]"


class FeishuMessages:
    """Feishu's events as a turn's messages (``runtime.turns.MessageReader``)."""

    def message(self, job_id: int, event_id: str, event_type: str, payload: Any) -> Message | None:
        if event_type != MESSAGE_EVENT:
            return None
        event = _event(payload)
        message = event.get("message")
        if not isinstance(message, dict) or not isinstance(message.get("message_id"), str):
            return None
        sender = event.get("sender", {})
        sender_id = sender.get("sender_id", {}) if isinstance(sender, dict) else {}
        return Message(
            job_id=job_id,
            event_id=event_id or _header(payload).get("event_id", ""),
            message_id=message["message_id"],
            text=_text(message),
            sender=str(sender_id.get("open_id", "")) if isinstance(sender_id, dict) else "",
            sent_at=_first(_seconds(message.get("create_time")), self.sent_at(payload)),
            msg_type=str(message.get("message_type", "")),
        )

    def recalled(self, event_type: str, payload: Any) -> str | None:
        if event_type != RECALL_EVENT:
            return None
        message_id = _event(payload).get("message_id")
        return message_id if isinstance(message_id, str) and message_id else None

    def sent_at(self, payload: Any) -> float | None:
        return _seconds(_header(payload).get("create_time"))


def _event(payload: Any) -> dict[str, Any]:
    event = payload.get("event") if isinstance(payload, dict) else None
    return event if isinstance(event, dict) else {}


def _header(payload: Any) -> dict[str, Any]:
    header = payload.get("header") if isinstance(payload, dict) else None
    return header if isinstance(header, dict) else {}


def _seconds(milliseconds: Any) -> float | None:
    try:
        return int(milliseconds) / 1000.0
    except (TypeError, ValueError):
        return None


def _first(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)


def _text(message: dict[str, Any]) -> str:
    """A message's words: a text's ``text``, a rich text's text elements; else its type."""
    kind = str(message.get("message_type", ""))
    try:
        content = json.loads(message.get("content") or "{}")
    except (TypeError, ValueError):
        content = {}
    if not isinstance(content, dict):
        content = {}
    if kind == "text":
        text = content.get("text")
        return text if isinstance(text, str) else ""
    if kind == "post":
        words = [content.get("title") or ""]
        for line in content.get("content") or []:
            for element in line if isinstance(line, list) else []:
                if isinstance(element, dict) and isinstance(element.get("text"), str):
                    words.append(element["text"])
        return " ".join(w for w in words if w).strip()
    return _PLACEHOLDER.format(kind or "message")


def _notice(event: Event, text: str) -> None:
    """A stale message's notice: a reply (an idempotent effect, as any reply). One Feishu
    refuses (the message recalled meanwhile) was not sent: logged, and the message ends."""
    try:
        reply(event, text, name="stale-notice")
    except FeishuBusinessError as exc:
        log.warning("job %s: its late notice was refused: %s", event.job_id, exc)


def recall_keys(
    app: str, keys: protocol.EventKeys, envelope: protocol.Envelope
) -> protocol.EventKeys:
    """A recall's partition is its message's (a topic thread's, whose recall names no thread):
    so the turn that holds the message sees it behind itself."""
    from ..ledger import turns as ledger_turns

    message_id = envelope.event.get("message_id")
    if not isinstance(message_id, str) or not message_id:
        return keys
    found = ledger_turns.partition_of(app, f"message:{message_id}")
    prefix = f"{app}:"
    if found is None or not found.startswith(prefix):
        return keys
    return protocol.EventKeys(
        dedupe_key=keys.dedupe_key,
        partition_key=found[len(prefix) :],
        private_message=keys.private_message,
    )


turns.set_transport(FeishuMessages(), _notice)


# --- typing ----------------------------------------------------------------------------------


def typing(event: Event, emoji: str = TYPING) -> str:
    """Add ``emoji`` to the turn's newest message (an event's message) now, and remove it once
    the job ends, however it ends; returns the message id. A reaction Feishu refuses (the
    scope ``im:message.reactions:write_only`` missing, the message recalled) is logged.

    An add can land after the removal ran: Feishu may apply a request whose answer timed out,
    and a handler's thread abandoned at its timeout (or whose lease expired) may still be
    sending it. A second removal then runs once no such add can land (``_remove_job``): an
    add that timed out records it at once; the first removal records it when an attempt of
    the job ended while its thread could still run."""
    message_id = target_message(event)
    payload = {"message_id": message_id, "emoji": emoji, "job": event.job_id}
    cleanups.on_finish(
        cleanups.handler_spec(REMOVE_REACTION, payload, event.app, event.tenant),
        name=f"reaction:{emoji}:{message_id}"[:64],
    )
    current().ensure_alive()  # a lease lost since: the cleanup is recorded, nothing added
    try:
        add_reaction(event.app, message_id, emoji)
    except FeishuAPIError as exc:
        log.warning("job %s: the %s reaction was not added: %s", event.job_id, emoji, exc)
        if getattr(exc, "maybe_applied", False):  # Feishu may still apply it: look again
            _remove_later(event, payload, add_window())
    return message_id


def add_window() -> float:
    """Seconds within which an add sent now has landed or never will: its tries of the Open
    API (a token's and the add's, again once with a fresh token), each within the request
    timeout, and a margin for Feishu's own lag."""
    return 4 * openapi.REQUEST_TIMEOUT + 5.0


def add_reaction(app: str, message_id: str, emoji: str) -> str:
    """``POST /open-apis/im/v1/messages/:message_id/reactions``; the reaction's id."""

    def request() -> Any:
        from lark_oapi.api.im.v1 import (
            CreateMessageReactionRequest,
            CreateMessageReactionRequestBody,
        )

        body = CreateMessageReactionRequestBody({"reaction_type": {"emoji_type": emoji}})
        return (
            CreateMessageReactionRequest.builder().message_id(message_id).request_body(body).build()
        )

    data = openapi.call(app, f"add a reaction to message {message_id}", request)
    return str(data.get("reaction_id", "")) if isinstance(data, dict) else ""


def remove_reactions(app: str, message_id: str, emoji: str) -> int:
    """Delete the app's own ``emoji`` reactions on a message (listed, then each deleted);
    returns how many. A message recalled or gone has none left to remove."""
    from lark_oapi.api.im.v1 import DeleteMessageReactionRequest, ListMessageReactionRequest

    creds = openapi.credentials(app)
    mine: list[str] = []
    page_token = ""
    try:
        while True:

            def listing(token: str = page_token) -> Any:
                builder = (
                    ListMessageReactionRequest.builder()
                    .message_id(message_id)
                    .reaction_type(emoji)
                    .page_size(50)
                )
                return (builder.page_token(token) if token else builder).build()

            data = openapi.call(app, f"list the reactions of message {message_id}", listing) or {}
            for item in data.get("items") or []:
                operator = item.get("operator") or {}
                if operator.get("operator_type") == "app" and operator.get("operator_id") in (
                    creds.app_id,
                    None,
                    "",
                ):
                    mine.append(str(item.get("reaction_id")))
            page_token = str(data.get("page_token") or "")
            if not data.get("has_more") or not page_token:
                break
    except FeishuBusinessError as exc:
        if exc.feishu_code in RECALLED_CODES:
            return 0
        raise
    removed = 0
    for reaction_id in mine:

        def deleting(reaction_id: str = reaction_id) -> Any:
            return (
                DeleteMessageReactionRequest.builder()
                .message_id(message_id)
                .reaction_id(reaction_id)
                .build()
            )

        try:
            openapi.call(app, f"remove reaction {reaction_id} of message {message_id}", deleting)
            removed += 1
        except FeishuBusinessError as exc:  # removed meanwhile, or the message is gone
            log.info("reaction %s of message %s: %s", reaction_id, message_id, exc)
    return removed


def _remove_job(event: Event) -> None:
    """The cleanup job ``typing`` leaves: the app's reactions of one emoji removed. A late
    removal (``not_before``) waits until then (``Deferred``: no attempt spent). A first one
    whose turn had an attempt end while its handler's thread could still be sending the add
    (timed out, its lease expired) leaves a late one behind for when that add cannot land."""
    from ..ledger import turns as ledger_turns

    payload = event.payload
    not_before = payload.get("not_before")
    if isinstance(not_before, int | float) and time.time() < not_before:
        wait = not_before - time.time()
        raise Deferred(wait, f"Removing the reaction once a late add cannot land ({wait:.0f}s).")
    message_id, emoji = str(payload["message_id"]), str(payload["emoji"])
    removed = remove_reactions(event.app, message_id, emoji)
    log.info(
        "job %s: %d %s reaction(s) removed from message %s",
        event.job_id,
        removed,
        emoji,
        message_id,
    )
    turn_job = payload.get("job")
    if not_before is None and isinstance(turn_job, int) and not isinstance(turn_job, bool):
        wait = ledger_turns.abandoned_for(turn_job, add_window())
        if wait > 0:
            _remove_later(event, payload, wait)


def _remove_later(event: Event, payload: dict[str, Any], seconds: float) -> None:
    """A second removal of the same reactions, ``seconds`` from now: once the running job
    ends (its cleanup), a job that waits until then."""
    late = {**payload, "not_before": time.time() + seconds}
    cleanups.on_finish(
        cleanups.handler_spec(REMOVE_REACTION, late, event.app, event.tenant),
        name=f"reaction-late:{payload['emoji']}:{payload['message_id']}"[:64],
    )


#: Registered in ``AppConfig.ready``: the jobs that remove a turn's reactions.
REACTION_KIND = JobKind(
    "reaction", "reaction cleanups", REACTION_PREFIX, run=_remove_job, can_wait=False
)


# --- the stop button ---------------------------------------------------------------------------


def stop_value(job_id: int) -> dict[str, str]:
    """The callback value of a button that stops job ``job_id`` (signed)."""
    return {STOP_MARKER: signing.Signer(salt=_STOP_SALT).sign(str(job_id))}


def stop_button(job_id: int, label: str = "Stop") -> dict[str, Any]:
    """A card JSON 2.0 button that stops the running job ``job_id`` at its next safe point."""
    return {
        "tag": "button",
        "text": {"tag": "plain_text", "content": label},
        "type": "danger",
        "element_id": "feishu_inbox_stop",
        "behaviors": [{"type": "callback", "value": stop_value(job_id)}],
    }


def stop_click(envelope: protocol.Envelope) -> int | None:
    """The job a ``card.action.trigger`` on a stop button names (its signature checked), or
    None: not a stop button's click (a forged one is logged and is not one either)."""
    action = envelope.event.get("action")
    value = action.get("value") if isinstance(action, dict) else None
    signed = value.get(STOP_MARKER) if isinstance(value, dict) else None
    if not isinstance(signed, str):
        return None
    try:
        return int(signing.Signer(salt=_STOP_SALT).unsign(signed))
    except (signing.BadSignature, ValueError):
        log.warning("a stop button's click with a bad signature (event %s)", envelope.event_id)
        return None


def answer_stop(job_id: int) -> dict[str, Any]:
    """Stop the job (an operator's cancel: a running one stops at its next safe point), and
    the click's toast. The cancel is committed before Feishu gets the answer."""
    from django.db import DatabaseError

    from ..ledger import operators

    try:
        outcome = operators.cancel([job_id])
    except DatabaseError:
        log.exception("the stop of job %s could not be recorded", job_id)
        return {"toast": {"type": "error", "content": "Not stopped (unavailable): click again."}}
    if outcome.pending or outcome.done:
        return {"toast": {"type": "info", "content": "Stopping…"}}
    return {"toast": {"type": "info", "content": "Already finished."}}

"""Asking in a card (SPEC §9e): a question with buttons, answered durably.

    @feishu_inbox.handler("im.message.receive_v1")
    def clean_up(event):
        try:
            answer = feishu_inbox.ask(
                event,
                "Delete these 40 records?",
                choices=["Approve", "Reject"],
                timeout=timedelta(hours=4),
                who=["ou_alice", "ou_bob"],
            )
        except feishu_inbox.QuestionExpired:
            return  # the card says "expired"
        if answer.choice == "Approve":
            feishu_inbox.step("delete", delete_records)

What runs, and what each part promises:

1. The question's wait is recorded, open, with its rule (its choices and ``who``), before the
   card leaves: a click that comes before the job has even suspended finds it.
2. The card is created as a CardKit entity (a step: created once per job; a create whose
   answer was lost leaves an entity nobody sends) and sent as a reply to the event's message,
   an idempotent effect (its ``uuid``; a step: a resumed run never sends it again).
3. The job waits, holding no slot, lease or thread (``wait_for`` on the question's key), and
   by default gives its chat back meanwhile.
4. A click is decided by the webhook or the long connection before it answers Feishu
   (``questions.py``): stored once, then the job resumes, once.
5. The resumed run updates the card to show the decision (or, at the timeout, "expired"):
   a whole-card update of the entity (works for 14 days, not only the callback token's 30
   minutes) with a fixed ``sequence`` and ``uuid``, inside a step, so it happens once across
   crashes: a repeat is the same operation, which Feishu answers as done.

``ask`` returns an ``Answer`` (the choice, who clicked, when) or raises ``QuestionExpired``
(a ``WaitTimedOut``) after the card was marked expired. In an ``async def`` handler it returns
an awaitable. Like every wait, it is refused after an effect that ran outside a step.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ..errors import (
    Deferred,
    FeishuBusinessError,
    FeishuRateLimited,
    InvalidMessage,
    QuestionExpired,
    WaitTimedOut,
)
from ..ledger.idempotency import FEISHU_UUID_WINDOW, default_margin
from ..runtime import waits
from ..runtime.context import Event
from ..runtime.handlers import effect
from ..runtime.steps import step
from . import cardkit, openapi, replies
from .questions import button_value, question_key

#: A question's name (its steps and effects are named after it) and its choices.
NAME_LIMIT, CHOICE_LIMIT, MOST_CHOICES = 40, 64, 10
#: The element that holds the buttons (and, once decided, what was decided).
CHOICES_ELEMENT = "fi_ask_choices"
#: The sequence of the card's one update after its creation (the decision, or "expired").
UPDATE_SEQUENCE = 1
#: What the card shows once decided, and once expired (markdown).
DECIDED_TEXT = "**{label}** — chosen by <at id={open_id}></at> at {at:%Y-%m-%d %H:%M} UTC"
EXPIRED_TEXT = "*Expired: no answer in time.*"


@dataclass(frozen=True)
class Answer:
    """The decision of a question: the ``choice`` clicked, by whom (``open_id``; "" when an
    operator signalled it by hand), when (``at``), and the card (to update it later yourself:
    its next ``sequence`` is 2)."""

    choice: str
    open_id: str
    at: datetime | None
    card_id: str
    message_id: str


def ask(
    event: Event,
    card: str | Mapping[str, Any],
    *,
    choices: Iterable[str] | Mapping[str, str],
    timeout: timedelta | float | None,
    who: Iterable[str] | None = None,
    name: str = "ask",
    reply_in_thread: bool = False,
) -> Any:
    """Ask the question ``card`` in a reply to the message of ``event``, with a button per
    choice, wait for a click, and return the ``Answer``; raise ``QuestionExpired`` once
    ``timeout`` (a timedelta or seconds; None: never) passes first.

    ``card`` is markdown text, or a card JSON 2.0 (``{"schema": "2.0", "body": {...}}``) the
    buttons are added to. ``choices`` are the buttons' labels, or a mapping choice → label.
    ``who``: the open_ids allowed to answer (None: anyone who sees the card); a click by anyone
    else is answered "not yours" and changes nothing. ``name`` tells two questions of one
    handler apart."""
    labels = _labels(choices)
    allowed = _who(who)
    problems = []
    if not isinstance(name, str) or not 0 < len(name) <= NAME_LIMIT:
        problems.append(f"name must be 1 to {NAME_LIMIT} characters (got {name!r:.80})")
    base = _base_card(card, problems)
    if isinstance(labels, str):
        problems.append(labels)
    if isinstance(allowed, str):
        problems.append(allowed)
    if problems:
        raise InvalidMessage(problems)
    assert isinstance(labels, dict) and not isinstance(allowed, str)
    seconds = None if timeout is None else waits.as_seconds(timeout, "timeout")
    replies._message_id(event)  # no message to reply to: InvalidMessage, before any request
    openapi.credentials(event.app)  # no credentials: ConfigurationError, before any request
    openapi.ready(event.app)  # a store app: its tenant's token (no ticket yet: Deferred)
    key = question_key(event.app, event.event_id, name)
    question = _Question(event, base, labels, allowed, seconds, key, name, reply_in_thread)
    return waits.in_handler(question.run)


@dataclass(frozen=True)
class _Question:
    event: Event
    base: dict[str, Any]
    labels: dict[str, str]
    who: list[str] | None
    seconds: float | None
    key: str
    name: str
    reply_in_thread: bool

    def run(self) -> Answer:
        name = self.name
        rule = {"choices": list(self.labels), "who": self.who}
        wait_name, memo = waits.open_wait(
            key=self.key, seconds=self.seconds, name=f"ask:{name}", hold_chat=False, ask=rule
        )
        card_id = step(f"ask:{name}:entity", self._create)
        message_id = step(f"ask:{name}:sent", self._send, card_id)
        try:
            payload = waits.outcome(wait_name, memo)  # open: the job suspends here
        except WaitTimedOut as exc:
            step(f"ask:{name}:expired", self._show, card_id, EXPIRED_TEXT)
            raise QuestionExpired(
                f"Nobody answered the question {name!r} of job {self.event.job_id} in time; "
                "its card says it expired.",
                fix="Catch feishu_inbox.QuestionExpired to act on it, or give ask() a longer "
                "timeout.",
            ) from exc
        answer = _answer(payload, card_id, message_id)
        label = self.labels.get(answer.choice, answer.choice)
        shown = DECIDED_TEXT.format(label=label, open_id=answer.open_id, at=answer.at)
        if not answer.open_id or answer.at is None:  # an operator's signal, by hand
            shown = f"**{label}**"
        step(f"ask:{name}:shown", self._show, card_id, shown)
        return answer

    # --- the card ----------------------------------------------------------------------------

    def _create(self) -> str:
        return cardkit.create_card(self.event.app, self._card(self._buttons()))

    def _send(self, card_id: str) -> str:
        content = {"type": "card", "data": {"card_id": card_id}}
        return replies.reply(
            self.event,
            content,
            "interactive",
            reply_in_thread=self.reply_in_thread,
            name=f"ask:{self.name}",
        )

    def _show(self, card_id: str, text: str) -> bool:
        """The card with its buttons replaced by ``text``: one whole-card update, the card's
        first operation after its creation, so its ``sequence`` and ``uuid`` are fixed and a
        repeat (a crash before the step's record) is the same operation."""
        app = self.event.app
        card = self._card({"tag": "markdown", "content": text, "element_id": CHOICES_ELEMENT})
        uuid = f"fa-{card_id}-{UPDATE_SEQUENCE}"[:50]
        margin = max(default_margin(FEISHU_UUID_WINDOW), replies.SLOWEST_TRY)
        refused: FeishuBusinessError | None = None
        limited: FeishuRateLimited | None = None
        with effect(
            f"ask:{self.name}:card",
            idempotent_for=FEISHU_UUID_WINDOW,
            margin=margin,
            longest=FEISHU_UUID_WINDOW,
        ):
            try:
                cardkit.update_card(app, card_id, card, sequence=UPDATE_SEQUENCE, uuid=uuid)
            except FeishuBusinessError as exc:
                if exc.feishu_code != cardkit.SEQUENCE_NOT_INCREASING:
                    refused = exc
                # else: the card has seen this sequence, so this very update was applied
                # before (its uuid forgotten by now): done.
            except FeishuRateLimited as exc:
                limited = exc
        if refused is not None:
            raise refused
        if limited is not None:
            raise Deferred(1.0, f"CardKit answered 429 [{limited.code}] {limited}")
        return True

    def _buttons(self) -> dict[str, Any]:
        columns = []
        for n, (choice, label) in enumerate(self.labels.items()):
            button = {
                "tag": "button",
                "text": {"tag": "plain_text", "content": label},
                "type": "primary" if n == 0 else "default",
                "behaviors": [{"type": "callback", "value": button_value(self.key, choice)}],
            }
            columns.append({"tag": "column", "width": "auto", "elements": [button]})
        return {
            "tag": "column_set",
            "flex_mode": "flow",
            "element_id": CHOICES_ELEMENT,
            "columns": columns,
        }

    def _card(self, last: dict[str, Any]) -> dict[str, Any]:
        card = copy.deepcopy(self.base)
        card["body"]["elements"].append(last)
        return card


def _answer(payload: Any, card_id: str, message_id: str) -> Answer:
    """The decision as the click (``questions.py``) or an operator's signal delivered it."""
    if isinstance(payload, dict):
        at = payload.get("at")
        when = datetime.fromisoformat(at) if isinstance(at, str) else None
        return Answer(
            str(payload.get("choice", "")),
            str(payload.get("open_id") or ""),
            when,
            card_id,
            message_id,
        )
    return Answer("" if payload is None else str(payload), "", None, card_id, message_id)


def _labels(choices: Any) -> dict[str, str] | str:
    if isinstance(choices, Mapping):
        pairs = list(choices.items())
    elif isinstance(choices, Iterable) and not isinstance(choices, str | bytes):
        pairs = [(c, c) for c in choices]
    else:
        return f"choices must be a list of labels or a mapping choice → label (got {choices!r:.80})"
    if not 1 <= len(pairs) <= MOST_CHOICES:
        return f"a question has 1 to {MOST_CHOICES} choices (got {len(pairs)})"
    for choice, label in pairs:
        for what, text in (("choice", choice), ("label", label)):
            if not isinstance(text, str) or not 0 < len(text) <= CHOICE_LIMIT:
                return f"each {what} is 1 to {CHOICE_LIMIT} characters (got {text!r:.80})"
    labels = dict(pairs)
    if len(labels) < len(pairs):
        return "the choices must differ from each other"
    return labels


def _who(who: Any) -> list[str] | str | None:
    if who is None:
        return None
    if isinstance(who, str) or not isinstance(who, Iterable):
        return f"who must be a list of open_ids, or None for anyone (got {who!r:.80})"
    found = list(dict.fromkeys(who))
    if not found or not all(isinstance(w, str) and w for w in found):
        return f"who must name at least one open_id, each a non-empty string (got {who!r:.80})"
    return found


def _base_card(card: Any, problems: list[str]) -> dict[str, Any]:
    """The question as a card JSON 2.0 (a CardKit entity takes no other), buttons not yet."""
    if isinstance(card, str):
        if not card:
            problems.append("the question's text is empty")
        return {
            "schema": "2.0",
            "config": {"update_multi": True},
            "body": {"elements": [{"tag": "markdown", "content": card}]},
        }
    if not isinstance(card, Mapping) or card.get("schema") != "2.0":
        problems.append(
            "card must be markdown text or a card JSON 2.0 ({'schema': '2.0', 'body': "
            f"{{'elements': [...]}}}}), got {type(card).__name__}"
        )
        return {}
    base = copy.deepcopy(dict(card))
    body = base.setdefault("body", {})
    elements = body.setdefault("elements", []) if isinstance(body, dict) else None
    if not isinstance(elements, list):
        problems.append("the card's body.elements must be a list")
    return base


__all__ = ["Answer", "ask"]

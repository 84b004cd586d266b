"""The card callback's half of ``feishu_inbox.ask`` (SPEC §9e): a click on a question's button.

A question's buttons carry ``{"feishu_inbox.ask": <the wait's key>, "choice": <choice>}`` as
their callback ``value``. When a ``card.action.trigger`` carries one, the webhook or the long
connection decides it here, before it answers Feishu, in one transaction under the key's lock
(``ledger.waits.answer_question``): the first allowed click delivers its choice to the waiting
job, which resumes once; a second click, a late one or one by someone ``who=`` leaves out
changes nothing. Each is told so in a toast, within Feishu's 3 s:

- ``decided``          "Received: <choice>" (the click is stored; the job resumes);
- ``already_decided``  "Already decided.";
- ``expired``          "This question has expired." (timed out, cancelled, or gone);
- ``not_yours``        "This question is not yours to answer.";
- the database slower than the budget: "Received, not confirmed yet…". The click's
  transaction goes on after the answer and either commits (the job resumes once, the card
  shows the decision) or changes nothing (the person can click again): the exactly-once
  promise is the ledger's conditional update, not the answer's timing. A failure to reach the
  database says so ("Not recorded…: click again").

Every other click goes to the site's own ``@card_callback``.
"""

from __future__ import annotations

import hashlib
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import datetime, timezone
from typing import Any

from django.db import connections

from . import protocol

log = logging.getLogger("feishu_inbox.questions")

#: The key of a question button's callback value that names the wait it answers.
MARKER = "feishu_inbox.ask"
#: Keys are stored in a column of this length.
KEY_LIMIT = 255

#: The toast of each outcome (``ledger.waits.answer_question``), and of the two cases where the
#: outcome is not known within the budget.
TOASTS: dict[str, tuple[str, str]] = {
    "decided": ("success", "Received: {choice}"),
    "already_decided": ("info", "Already decided."),
    "expired": ("warning", "This question has expired."),
    "not_yours": ("warning", "This question is not yours to answer."),
    "not_a_choice": ("error", "That is not one of this question's choices."),
    "pending": (
        "info",
        "Received, not confirmed yet: if the card does not show the decision in a minute, "
        "click again.",
    ),
    "failed": ("error", "Not recorded (the service is unavailable): click again."),
}

#: Clicks are decided on threads of their own (each with its own database connection), so a
#: slow database never holds the answer past the budget.
_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="feishu-question")


def question_key(app: str, event_id: str, name: str) -> str:
    """The wait key of the question ``name`` asked by the job of ``event_id``: stable across
    the job's runs and replays (its event, not its row id), unique per app."""
    key = f"ask:{app}:{event_id}:{name}"
    if len(key) <= KEY_LIMIT:
        return key
    return "ask:" + hashlib.sha256(f"{app}\0{event_id}\0{name}".encode()).hexdigest()


def button_value(key: str, choice: str) -> dict[str, str]:
    """The callback value of a question's button."""
    return {MARKER: key, "choice": choice}


def click_of(envelope: protocol.Envelope) -> tuple[str, str, str] | None:
    """(key, choice, open_id) when this ``card.action.trigger`` clicked a question's button;
    None for any other card action (the site's callback answers it)."""
    action = envelope.event.get("action")
    value = action.get("value") if isinstance(action, dict) else None
    if not isinstance(value, dict) or MARKER not in value:
        return None
    key, choice = value.get(MARKER), value.get("choice")
    operator = envelope.event.get("operator")
    open_id = operator.get("open_id") if isinstance(operator, dict) else None
    if not isinstance(key, str) or not 0 < len(key) <= KEY_LIMIT or not isinstance(choice, str):
        return ("", "", "")  # ours, but malformed: answered "expired", nothing looked up
    return key, choice, open_id if isinstance(open_id, str) else ""


def toast(outcome: str, choice: str = "") -> dict[str, Any]:
    kind, text = TOASTS[outcome]
    return {"toast": {"type": kind, "content": text.format(choice=choice)}}


def answer_click(click: tuple[str, str, str], budget: float, event_id: str = "") -> dict[str, Any]:
    """Decide a click on a question's button and answer it within ``budget`` seconds."""
    key, choice, open_id = click
    if not key:
        return toast("expired")
    at = datetime.now(timezone.utc)
    started = time.monotonic()

    def decide() -> str:
        from ..ledger import waits

        try:
            return waits.answer_question(key, open_id=open_id, choice=choice, at=at)
        finally:
            connections.close_all()  # this thread's own connections

    future: Future[str] = _pool.submit(decide)
    try:
        outcome = future.result(timeout=max(budget, 0.0))
    except FutureTimeout:
        log.warning(
            "click on question %s (event %s) not decided within %.1fs; answered 'not "
            "confirmed yet' (its transaction goes on)",
            key,
            event_id,
            budget,
        )
        future.add_done_callback(lambda f: _late(f, key, event_id, started))
        return toast("pending")
    except Exception:
        log.exception("click on question %s (event %s) not recorded", key, event_id)
        return toast("failed")
    log.info("click on question %s by %s (event %s): %s", key, open_id, event_id, outcome)
    return toast(outcome, choice)


def _late(future: Future[str], key: str, event_id: str, started: float) -> None:
    took = time.monotonic() - started
    exc = future.exception()
    if exc is not None:
        log.error("late click on question %s (event %s) not recorded: %s", key, event_id, exc)
    else:
        log.info(
            "late click on question %s (event %s): %s after %.1fs",
            key,
            event_id,
            future.result(),
            took,
        )

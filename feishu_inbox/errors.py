"""Typed errors, and the catalogue of every code an operator or a caller can meet.

Each refusal has a stable ``code``, a ``message`` (what was wrong) and a ``fix`` (what to do).
Operators see the same words, code first, in admin messages, ``manage.py inbox`` output (and
its ``--json``) and the webhook's JSON errors. ``CATALOGUE`` is the one table of codes; the
README prints it, and a test keeps the two and the code in step.
"""

from __future__ import annotations

#: Error messages kept on a job are cut to this many characters.
ERROR_MESSAGE_LIMIT = 4000


def truncate(message: str) -> str:
    if len(message) <= ERROR_MESSAGE_LIMIT:
        return message
    return message[: ERROR_MESSAGE_LIMIT - 1] + "…"


#: code → (what it means, what to do). Webhook codes answer a delivery; the others refuse an
#: operation, and nothing changed.
CATALOGUE: dict[str, tuple[str, str]] = {
    # configuration and arguments
    "configuration": (
        "settings.FEISHU_INBOX, a handler or a schedule is invalid.",
        "Correct it; `python manage.py check` lists every problem.",
    ),
    "invalid_argument": (
        "An operation was called with arguments it cannot take (every problem is named).",
        "Fix the call; nothing was stored or changed.",
    ),
    # jobs and operators
    "not_found": (
        "There is no job with this id.",
        "Check the id (`python manage.py inbox list`); completed jobs are purged after "
        "COMPLETED_RETENTION.",
    ),
    "invalid_state": (
        "The job is not in a state this action applies to.",
        "Choose the action its state allows (see the README's operator table).",
    ),
    "not_requeueable": (
        "The job is live (queued, running, waiting to retry, failed or unknown): it cannot be "
        "replayed.",
        "Replay completed jobs only; cancel a queued or running one, requeue or discard a "
        "failed one, reconcile an unknown one.",
    ),
    "duplicate": (
        "Another live job holds the same event (its event id or dedupe key).",
        "Let that job finish, or cancel it, then replay.",
    ),
    "lease_lost": (
        "The worker no longer holds the job: its lease expired or another worker took it.",
        "Stop working on it; lease expiry recovers it. If this happens often, raise LEASE_SECONDS.",
    ),
    # webhook deliveries
    "method_not_allowed": ("Feishu delivers events with POST.", "Send a POST."),
    "too_large": ("The body is over MAX_BODY_BYTES.", "Raise MAX_BODY_BYTES if it is genuine."),
    "length_required": (
        "A chunked body reached a server that does not de-chunk it.",
        "Serve the webhook with gunicorn, or send a Content-Length.",
    ),
    "invalid_json": ("The body is not a JSON object.", "Check what is posting to the URL."),
    "too_deep": (
        "The JSON nests deeper than 64 levels.",
        "Nothing Feishu sends nests that deep: check the sender.",
    ),
    "missing_fields": (
        "The event has no usable id or type (or the URL verification no challenge).",
        "Check the sender.",
    ),
    "unknown_schema": (
        "Neither a schema 2.0 nor a 1.0 event envelope.",
        "Check the sender; Feishu sends one of the two.",
    ),
    "undecryptable": (
        "The body does not decrypt with the app's Encrypt Key.",
        "Copy the Encrypt Key from the app's Event Subscriptions page into APPS.",
    ),
    "not_encrypted": (
        "The app has an Encrypt Key but the body is plain.",
        "Set the same Encrypt Key in the Feishu console, or remove it from APPS.",
    ),
    "missing_signature": (
        "The X-Lark-Signature headers are missing.",
        "Only Feishu's signed deliveries are accepted when an Encrypt Key is set.",
    ),
    "bad_signature": (
        "The signature does not match the body.",
        "Check the app's Encrypt Key; a proxy must not change the body.",
    ),
    "stale_timestamp": (
        "The request timestamp is outside REPLAY_WINDOW_SECONDS of now.",
        "Check the server's clock (NTP).",
    ),
    "bad_token": (
        "The verification token is wrong.",
        "Copy the Verification Token from the Feishu console into APPS.",
    ),
    "unknown_app": ("No Feishu app of this name is configured.", "Add it to APPS."),
    "unstorable_payload": (
        "The database refuses this payload (a NUL character on PostgreSQL).",
        "Nothing to do: Feishu's redelivery could never store it either.",
    ),
    "database_unavailable": (
        "The database is down or locked past its timeout; the event was not stored.",
        "Nothing: Feishu redelivers. Check the database if it lasts.",
    ),
}


def meaning(code: str) -> str:
    return CATALOGUE[code][0]


def default_fix(code: str) -> str:
    return CATALOGUE[code][1]


class InboxError(Exception):
    """Base class: a stable ``code`` (in ``CATALOGUE``), a ``message`` and a ``fix``."""

    code = "invalid_argument"
    fix = ""

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = default_fix(self.code) if fix is None else fix

    def __str__(self) -> str:
        return f"{self.message} {self.fix}".strip()

    def described(self) -> str:
        """``[code] message — fix``, as the CLI and the admin show it."""
        return f"[{self.code}] {self.message}" + (f" — {self.fix}" if self.fix else "")

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message, "fix": self.fix}


class ConfigurationError(InboxError):
    code = "configuration"


class LedgerError(InboxError):
    """A ledger operation was refused; nothing changed. Its arguments were wrong, unless a
    subclass says otherwise."""

    code = "invalid_argument"


class JobNotFound(LedgerError):
    code = "not_found"


class InvalidState(LedgerError):
    """The job is not in a state this operation applies to (e.g. requeue of a running job)."""

    code = "invalid_state"


class NotRequeueable(InvalidState):
    """Replay of a live job: only completed jobs run again."""

    code = "not_requeueable"


class Duplicate(LedgerError):
    """Another live job holds the same event."""

    code = "duplicate"


class LeaseLost(LedgerError):
    """The caller no longer holds the job: its lease expired, or another worker took it over.

    A worker that gets this must stop working on the job at once: it may not start an effect,
    renew, finish or fail it.
    """

    code = "lease_lost"


class Superseded(BaseException):
    """Raised by ``checkpoint()`` (and by entering ``effect()``) when a newer private message
    waits in the same chat.

    A ``BaseException``, as ``asyncio.CancelledError`` is: a handler's broad
    ``except Exception`` cannot swallow it and go on to the effect the user replaced.
    """


class Cancelled(BaseException):
    """Raised by ``checkpoint()`` (and by entering ``effect()``) when an operator cancelled the
    running job. A ``BaseException`` for the same reason as ``Superseded``."""

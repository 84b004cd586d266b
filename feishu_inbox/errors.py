"""Typed errors. Each says what was wrong (``message``) and what to do (``fix``).

Operators see the same words in admin messages and in ``manage.py inbox`` output.
"""

from __future__ import annotations

#: Error messages kept on a job are cut to this many characters.
ERROR_MESSAGE_LIMIT = 4000


def truncate(message: str) -> str:
    if len(message) <= ERROR_MESSAGE_LIMIT:
        return message
    return message[: ERROR_MESSAGE_LIMIT - 1] + "…"


class InboxError(Exception):
    """Base class: a stable ``code``, a ``message`` and a ``fix``."""

    code = "inbox_error"
    fix = ""

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if fix is not None:
            self.fix = fix

    def __str__(self) -> str:
        return f"{self.message} {self.fix}".strip()


class ConfigurationError(InboxError):
    code = "configuration"
    fix = "Correct settings.FEISHU_INBOX; `python manage.py check` lists every problem."


class LedgerError(InboxError):
    """A ledger operation was refused; nothing changed."""

    code = "refused"


class JobNotFound(LedgerError):
    code = "not_found"
    fix = "Check the job id (`python manage.py inbox list`); completed jobs are purged."


class InvalidState(LedgerError):
    """The job is not in a state this operation applies to (e.g. requeue of a running job)."""

    code = "invalid_state"


class LeaseLost(LedgerError):
    """The caller no longer holds the job: its lease expired, or another worker took it over.

    A worker that gets this must stop working on the job at once: it may not start an effect,
    renew, finish or fail it.
    """

    code = "lease_lost"
    fix = (
        "Stop working on this job; it has been or will be recovered by lease expiry. "
        "If this happens often, raise the lease length or renew more often."
    )


class Superseded(BaseException):
    """Raised by ``checkpoint()`` (and by entering ``effect()``) when a newer private message
    waits in the same chat.

    A ``BaseException``, as ``asyncio.CancelledError`` is: a handler's broad
    ``except Exception`` cannot swallow it and go on to the effect the user replaced.
    """

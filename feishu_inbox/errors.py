"""Typed errors. Each says what was wrong (``message``) and what to do (``fix``).

Operators see the same words in admin messages and in ``manage.py inbox`` output.
"""

from __future__ import annotations


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


class Superseded(Exception):
    """Raised by ``checkpoint()`` when a newer private message waits in the same chat."""
